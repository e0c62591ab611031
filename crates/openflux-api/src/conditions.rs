//! Status conditions the way Flux writes them: a `Ready` condition (kstatus
//! compatible) with a reason, a message for people, the `observedGeneration`
//! it speaks for, and a `lastTransitionTime` that moves only when the status
//! flips between `True` and `False`.
//!
//! Plain functions of their inputs; the clock is an argument, so a status
//! computed twice from the same facts is the same status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The `status` of a condition that holds.
pub const TRUE: &str = "True";
/// The `status` of a condition that does not hold.
pub const FALSE: &str = "False";

/// The time to stamp a transition happening now with.
pub fn now() -> Time {
    Time(Timestamp::now())
}

/// The condition of `type_` in `conditions`, if there is one.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// A condition of `type_`. It keeps the `lastTransitionTime` of `previous`
/// (the condition of that type the object has now) when the status is the
/// same, and takes `now` when the status changed or there was none.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    let status = if ok { TRUE } else { FALSE };
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation,
        last_transition_time,
    }
}

/// The `Ready` condition, following [`condition`].
pub fn ready(
    ok: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    condition(
        crate::READY,
        ok,
        reason,
        message,
        observed_generation,
        previous,
        now,
    )
}

/// Puts `new` into `conditions`: in the place of the condition of its type,
/// keeping that one's `lastTransitionTime` when the status did not change, or
/// at the end. Returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(current) => {
            let mut new = new;
            if current.status == new.status {
                new.last_transition_time = current.last_transition_time.clone();
            }
            let changed = *current != new;
            *current = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let first = ready(true, "A", "m", Some(1), None, &at(10));
        assert_eq!(first.last_transition_time, at(10));
        assert_eq!(
            (first.type_.as_str(), first.status.as_str()),
            ("Ready", TRUE)
        );
        let same = ready(true, "B", "n", Some(2), Some(&first), &at(20));
        assert_eq!(same.last_transition_time, at(10));
        assert_eq!((same.reason.as_str(), same.message.as_str()), ("B", "n"));
        assert_eq!(same.observed_generation, Some(2));
        let flipped = ready(false, "C", "o", Some(2), Some(&same), &at(30));
        assert_eq!(flipped.status, FALSE);
        assert_eq!(flipped.last_transition_time, at(30));
    }

    #[test]
    fn set_replaces_in_place_and_reports_changes() {
        let mut list = vec![condition("Reconciling", true, "R", "r", None, None, &at(1))];
        assert!(set(&mut list, ready(true, "A", "m", Some(1), None, &at(5))));
        assert_eq!(list.len(), 2);
        // The same facts later: nothing changes, not even the time.
        assert!(!set(
            &mut list,
            ready(true, "A", "m", Some(1), None, &at(9))
        ));
        assert_eq!(find(&list, "Ready").unwrap().last_transition_time, at(5));
        assert!(set(
            &mut list,
            ready(false, "B", "x", Some(2), None, &at(9))
        ));
        let ready_now = find(&list, "Ready").unwrap();
        assert_eq!(
            (
                ready_now.status.as_str(),
                ready_now.last_transition_time.clone()
            ),
            (FALSE, at(9))
        );
        assert_eq!(list[0].type_, "Reconciling", "order is kept");
        assert!(find(&list, "Stalled").is_none());
    }
}
