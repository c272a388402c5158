//! Durations written the way Go writes them (`3m0s`, `1.5s`, `250ms`), so messages, flags and
//! configuration files read like the kubelet's.

use std::time::Duration;

/// Format a duration the way Go's `time.Duration.String` does (`3m0s`, `1.5s`, `250ms`), so
/// health messages read like the kubelet's.
pub fn format_go(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs_nanos = u128::from(total_secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos());
    let secs = trim_fraction(secs_nanos, 1_000_000_000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{secs}s"));
    out
}

/// `value / unit` with the fraction written out and trailing zeros trimmed.
fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let frac = format!("{frac:0width$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// Why a Go duration did not parse; the messages read like Go's `time.ParseDuration`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a duration at all (empty, a lone `.`, out of range).
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    /// A number without a unit (`"10"`).
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    /// A unit other than `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`.
    #[error("time: unknown unit {unit:?} in duration {input:?}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole input.
        input: String,
    },
}

/// Parse a Go duration (`300ms`, `1m30s`, `1.5h`, `0`), as Go's `time.ParseDuration`.
/// Returns (negative, magnitude).
pub fn parse_go(s: &str) -> Result<(bool, Duration), DurationError> {
    let bad = || DurationError::Invalid(s.to_string());
    let t = s.trim();
    let (neg, mut rest) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if rest == "0" {
        return Ok((neg, Duration::ZERO));
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(s.to_string()))?;
        let num = &rest[..num_len];
        if num.is_empty() || num == "." {
            return Err(bad());
        }
        let v: f64 = num.parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let mult = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(DurationError::UnknownUnit {
                    unit: unit.to_string(),
                    input: s.to_string(),
                });
            }
        };
        total += v * mult;
    }
    if !total.is_finite() || total > 1e12 {
        return Err(bad());
    }
    Ok((neg, Duration::from_secs_f64(total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_formatted_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(15), "15ns"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(180), "3m0s"),
            (Duration::from_secs(181), "3m1s"),
            (Duration::from_secs(3723), "1h2m3s"),
            (Duration::from_secs(3600), "1h0m0s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go(d), want, "{d:?}");
        }
    }

    #[test]
    fn durations_are_parsed_like_go() {
        for (s, secs) in [
            ("0", 0.0),
            ("300ms", 0.3),
            ("1m30s", 90.0),
            ("1.5h", 5400.0),
            ("10us", 0.00001),
        ] {
            let (neg, d) = parse_go(s).expect("valid");
            assert!(!neg);
            assert!((d.as_secs_f64() - secs).abs() < 1e-9, "{s}");
        }
        assert_eq!(parse_go("-1m"), Ok((true, Duration::from_secs(60))));
        for bad in ["", "5", "1x", "m", "1..5s", "five"] {
            assert!(parse_go(bad).is_err(), "{bad}");
        }
        for d in [
            Duration::from_millis(250),
            Duration::from_secs(181),
            Duration::from_secs(3723),
        ] {
            assert_eq!(parse_go(&format_go(d)), Ok((false, d)));
        }
    }
}
