//! What a caught panic said: a reconcile that panics (a defect) is turned
//! into a failed reconcile carrying this message, so the controller that
//! runs every reconcile goes on and the log says what went wrong.

use std::any::Any;

/// The message of a panic's payload (`panic!` with a literal or with
/// formatting), or a placeholder for any other payload.
pub fn message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panics_message_is_read_whatever_its_form() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        assert_eq!(message(&*caught(|| panic!("a literal"))), "a literal");
        assert_eq!(
            message(&*caught(|| panic!("formatted {}", 7))),
            "formatted 7"
        );
        assert_eq!(
            message(&*caught(|| std::panic::panic_any(7u8))),
            "a panic without a message"
        );
    }
}
