//! Go duration strings as Flux accepts them (`1m`, `30s`, `1h30m`, `1.5s`).

use std::time::Duration;

/// A duration string that does not match `^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a Go duration such as 30s, 1m or 1h30m")]
pub struct InvalidDuration(pub String);

/// Parses a Go duration made of `<number><unit>` parts, units `ms`, `s`, `m`, `h`.
pub fn parse(input: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(input.to_string());
    if input.is_empty() {
        return Err(invalid());
    }
    let mut total = 0f64;
    let mut rest = input;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number = &rest[..number_len];
        if !valid_number(number) {
            return Err(invalid());
        }
        let value: f64 = number.parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let (unit_seconds, unit_len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else {
            return Err(invalid());
        };
        total += value * unit_seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

/// `[0-9]+(\.[0-9]+)?`
fn valid_number(number: &str) -> bool {
    let mut parts = number.splitn(2, '.');
    let int = parts.next().unwrap_or_default();
    let frac = parts.next();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(int) && frac.is_none_or(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flux_intervals() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1m30s500ms"), Ok(Duration::from_millis(90_500)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_what_the_crd_pattern_rejects() {
        for bad in [
            "", "1", "s", "1d", "-1s", "1.s", ".5s", "1 m", "1m ", "1us", "1.2.3s", "m1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
