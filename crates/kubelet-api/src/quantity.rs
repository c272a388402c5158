//! Parsing of Kubernetes resource quantities (`100m`, `64Mi`, `1.5G`, `2e3`).

/// Error for a quantity that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Parse a quantity into nano-units (exact for every suffix the API allows). `None` if invalid.
pub fn parse_nanos(s: &str) -> Option<i128> {
    let s = s.trim();
    let (num, mult_num, mult_den): (&str, i128, i128) = {
        let binary: [(&str, i128); 6] = [
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("Pi", 1 << 50),
            ("Ei", 1 << 60),
        ];
        let decimal: [(&str, i128, i128); 8] = [
            ("n", 1, 1_000_000_000),
            ("u", 1, 1_000_000),
            ("m", 1, 1_000),
            ("k", 1_000, 1),
            ("M", 1_000_000, 1),
            ("G", 1_000_000_000, 1),
            ("T", 1_000_000_000_000, 1),
            ("P", 1_000_000_000_000_000, 1),
        ];
        if let Some((suf, m)) = binary.iter().find(|(suf, _)| s.ends_with(suf)) {
            (&s[..s.len() - suf.len()], *m, 1)
        } else if let Some((suf, n, d)) = decimal.iter().find(|(suf, _, _)| s.ends_with(suf)) {
            (&s[..s.len() - suf.len()], *n, *d)
        } else if let Some(stripped) = s.strip_suffix('E') {
            (stripped, 1_000_000_000_000_000_000, 1)
        } else if let Some(idx) = s.find(['e', 'E']) {
            let exp: i32 = s[idx + 1..].parse().ok()?;
            let base = &s[..idx];
            if exp >= 0 {
                (base, 10i128.checked_pow(exp.unsigned_abs())?, 1)
            } else {
                (base, 1, 10i128.checked_pow(exp.unsigned_abs())?)
            }
        } else {
            (s, 1, 1)
        }
    };
    let (neg, num) = match num.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part.chars().all(|c| c.is_ascii_digit())
        || !frac_part.chars().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    // value = (int.frac) * mult_num / mult_den, in nano-units.
    let digits = format!("{int_part}{frac_part}");
    let mut value: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let frac_den = 10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    value = value.checked_mul(mult_num)?.checked_mul(1_000_000_000)?;
    let den = frac_den.checked_mul(mult_den)?;
    // Round up, as Kubernetes does for sub-nano precision.
    let v = (value + den - 1) / den;
    Some(if neg { -v } else { v })
}

/// A memory (or other byte) quantity in bytes, rounded up; negative values are rejected.
pub fn parse_bytes(s: &str) -> Result<i64, QuantityError> {
    scaled(s, 1)
}

/// A CPU quantity in millicores, rounded up; negative values are rejected.
pub fn parse_milli(s: &str) -> Result<i64, QuantityError> {
    scaled(s, 1000)
}

fn scaled(s: &str, per_unit: i128) -> Result<i64, QuantityError> {
    let err = || QuantityError(s.to_string());
    let nanos = parse_nanos(s).ok_or_else(err)?;
    if nanos < 0 {
        return Err(err());
    }
    let den = 1_000_000_000 / per_unit;
    i64::try_from((nanos + den - 1) / den).map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_api_suffixes() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("128974848"), Ok(128_974_848));
        assert_eq!(parse_bytes("129e6"), Ok(129_000_000));
        assert_eq!(parse_milli("100m"), Ok(100));
        assert_eq!(parse_milli("0.5"), Ok(500));
        assert_eq!(parse_milli("2"), Ok(2000));
        assert!(parse_bytes("12x").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1").is_err());
    }
}
