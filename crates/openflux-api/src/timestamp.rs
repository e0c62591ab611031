//! Times as the API server accepts them.
//!
//! A custom resource's `format: date-time` field is checked by the API
//! server's own parser, which is looser than RFC 3339: it lower-cases the
//! value and splits it at `t`, takes any one character before the
//! fractional digits and any number of them, and offsets up to `±99:99`
//! (so `2024-01-01T00:00:00.1234567890123Z`, `2024-01-01T00:00:00x1Z` and
//! `2024-01-01t00:00:00z` are stored as written). A strict decoder fails on
//! each of those, and one object that fails to decode would fail every list
//! of its kind. So times written by others are read here by that parser's
//! rules ([`parse`]); a value even it would refuse reads as absent, never as
//! an error.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::civil::Date;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Deserializer};

/// The instant `text` names, read as the API server's `date-time` check
/// reads it; `None` where that check would refuse it, or where the instant
/// lies outside the years 0 to 9999 once its offset is applied.
///
/// Grammar (lower-cased first): `YYYY-MM-DD`, `t`, `HH:MM:SS` (hour up to
/// 23, minute and second up to 59), optionally any one character and one or
/// more digits (a fraction where that character is `.`; otherwise ignored),
/// then `z` or `±HH:MM` (any two digits each). A further `t` and what
/// follows it are ignored, as that check ignores them.
pub fn parse(text: &str) -> Option<Timestamp> {
    let lower = text.to_lowercase();
    let mut parts = lower.split('t');
    let date = parse_date(parts.next()?)?;
    let rest = parts.next()?;
    let (clock, rest) = split_at_char(rest, 8)?;
    let [h1, h2, b':', m1, m2, b':', s1, s2] = <[u8; 8]>::try_from(clock.as_bytes()).ok()? else {
        return None;
    };
    let hour = two_digits(h1, h2)?;
    let minute = two_digits(m1, m2)?;
    let second = two_digits(s1, s2)?;
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    // The zone is `z` or six characters at the end; a fraction before it.
    let (fraction, zone) = match rest.strip_suffix('z') {
        Some(fraction) => (fraction, 0),
        None => {
            let at = rest.len().checked_sub(6)?;
            if !rest.is_char_boundary(at) {
                return None;
            }
            let (fraction, zone) = rest.split_at(at);
            (fraction, parse_offset(zone)?)
        }
    };
    let nanos = parse_fraction(fraction)?;
    let local = date
        .at(hour as i8, minute as i8, second as i8, nanos)
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .ok()?
        .timestamp();
    within_years(local.checked_sub(SignedDuration::from_secs(zone)).ok()?)
}

/// `at` if it lies in the years 0 to 9999 (UTC): what a `date-time` field
/// can hold when it is written again.
fn within_years(at: Timestamp) -> Option<Timestamp> {
    let year = at.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).year();
    (0..=9999).contains(&year).then_some(at)
}

/// Reads an optional time with [`parse`]: a string it takes is the time;
/// anything else (a string it refuses, a number, null) is `None`. For
/// `#[serde(deserialize_with = ...)]` on fields others write.
pub fn optional<'de, D>(deserializer: D) -> Result<Option<Time>, D::Error>
where
    D: Deserializer<'de>,
{
    Ok(match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::String(text) => parse(&text).map(Time),
        _ => None,
    })
}

/// `YYYY-MM-DD`, a date of the calendar.
fn parse_date(text: &str) -> Option<Date> {
    let [y1, y2, y3, y4, b'-', m1, m2, b'-', d1, d2] =
        <[u8; 10]>::try_from(text.as_bytes()).ok()?
    else {
        return None;
    };
    let year = i16::from(two_digits(y1, y2)?) * 100 + i16::from(two_digits(y3, y4)?);
    Date::new(year, two_digits(m1, m2)? as i8, two_digits(d1, d2)? as i8).ok()
}

/// `±HH:MM` as seconds east of UTC (any two digits each, as the check takes).
fn parse_offset(zone: &str) -> Option<i64> {
    let [sign, h1, h2, b':', m1, m2] = <[u8; 6]>::try_from(zone.as_bytes()).ok()? else {
        return None;
    };
    let seconds = i64::from(two_digits(h1, h2)?) * 3600 + i64::from(two_digits(m1, m2)?) * 60;
    match sign {
        b'+' => Some(seconds),
        b'-' => Some(-seconds),
        _ => None,
    }
}

/// Nothing, or any one character and one or more digits: nanoseconds where
/// the character is `.` (digits past the ninth dropped), otherwise 0.
fn parse_fraction(text: &str) -> Option<i32> {
    let mut chars = text.chars();
    let Some(separator) = chars.next() else {
        return Some(0);
    };
    let digits = chars.as_str();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if separator == '\n' {
        return None;
    }
    if separator != '.' {
        return Some(0);
    }
    let mut nanos = 0i32;
    for position in 0..9 {
        let digit = digits.as_bytes().get(position).map_or(0, |b| b - b'0');
        nanos = nanos * 10 + i32::from(digit);
    }
    Some(nanos)
}

fn two_digits(a: u8, b: u8) -> Option<u8> {
    (a.is_ascii_digit() && b.is_ascii_digit()).then(|| (a - b'0') * 10 + (b - b'0'))
}

/// `text` split after its first `n` characters.
fn split_at_char(text: &str, n: usize) -> Option<(&str, &str)> {
    let at = text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
    (text[..at].chars().count() == n).then(|| text.split_at(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(text: &str) -> String {
        parse(text).map(|t| t.to_string()).unwrap_or_default()
    }

    #[test]
    fn reads_what_the_api_server_stores() {
        let rows = [
            ("2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
            ("2024-01-01T00:00:00.5Z", "2024-01-01T00:00:00.5Z"),
            (
                "2024-01-01T00:00:00.1234567890123Z",
                "2024-01-01T00:00:00.123456789Z",
            ),
            ("2024-01-01T00:00:00x1Z", "2024-01-01T00:00:00Z"),
            ("2024-01-01T00:00:00z", "2024-01-01T00:00:00Z"),
            ("2024-01-01t00:00:00Z", "2024-01-01T00:00:00Z"),
            ("2024-01-01T01:30:00+01:30", "2024-01-01T00:00:00Z"),
            ("2024-01-01T00:00:00-00:30", "2024-01-01T00:30:00Z"),
            ("2024-01-01T00:00:00+99:99", "2023-12-27T19:21:00Z"),
            ("2024-01-01T00:00:00éZ1", ""),
            ("2024-01-01T00:00:00é1Z", "2024-01-01T00:00:00Z"),
            ("2024-01-01T00:00:00ZtAnything", "2024-01-01T00:00:00Z"),
        ];
        for (text, want) in rows {
            assert_eq!(at(text), want, "{text}");
        }
    }

    #[test]
    fn refuses_what_the_api_server_refuses() {
        for text in [
            "",
            "2024-01-01T00:00:00+0000",
            "2024-01-01T00:00:00",
            "2024-01-01 00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-02-30T00:00:00Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00.1a2Z",
            "24-01-01T00:00:00Z",
            "0000-01-01T00:00:00+00:01",
            "2024-01-01T00:00:00\n1Z",
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }

    #[test]
    fn a_field_that_cannot_be_read_is_absent() {
        #[derive(Deserialize)]
        struct Spec {
            #[serde(default, deserialize_with = "optional")]
            at: Option<Time>,
        }
        for (json, some) in [
            (r#"{"at": "2024-01-01T00:00:00.1234567890123Z"}"#, true),
            (r#"{"at": "yesterday"}"#, false),
            (r#"{"at": 17}"#, false),
            (r#"{"at": null}"#, false),
            (r#"{}"#, false),
        ] {
            let spec: Spec = serde_json::from_str(json).unwrap();
            assert_eq!(spec.at.is_some(), some, "{json}");
        }
    }

    proptest! {
        /// Every form the API server's check takes is read, and reads as
        /// the instant its parts name.
        #[test]
        fn every_accepted_form_is_read(
            year in 0i16..=9999, month in 1i8..=12, day in 1i8..=28,
            hour in 0i8..=23, minute in 0i8..=59, second in 0i8..=59,
            fraction in proptest::option::of(("[.x:é]", "[0-9]{1,20}")),
            zone in proptest::option::of((any::<bool>(), 0u8..=23, 0u8..=59)),
            t in "[tT]", z in "[zZ]",
        ) {
            let (fraction, nanos) = match &fraction {
                None => (String::new(), 0),
                Some((sep, digits)) => {
                    let nanos = if sep == "." {
                        format!("{digits:0<9}")[..9].parse::<i32>().unwrap()
                    } else {
                        0
                    };
                    (format!("{sep}{digits}"), nanos)
                }
            };
            let (zone_text, east) = match zone {
                None => (z, 0i64),
                Some((west, h, m)) => {
                    let sign = if west { '-' } else { '+' };
                    let secs = i64::from(h) * 3600 + i64::from(m) * 60;
                    (format!("{sign}{h:02}:{m:02}"), if west { -secs } else { secs })
                }
            };
            let text = format!(
                "{year:04}-{month:02}-{day:02}{t}{hour:02}:{minute:02}:{second:02}{fraction}{zone_text}"
            );
            let want = Date::new(year, month, day)
                .unwrap()
                .at(hour, minute, second, nanos)
                .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
                .unwrap()
                .timestamp()
                .checked_sub(SignedDuration::from_secs(east))
                .ok()
                .and_then(within_years);
            prop_assert_eq!(parse(&text), want, "{}", text);
        }

        /// Nothing panics, whatever the text.
        #[test]
        fn any_text_is_read_or_refused(text in "\\PC{0,40}") {
            let _ = parse(&text);
        }
    }
}
