//! Parsing of Kubernetes resource quantities (`100m`, `64Mi`, `1.5G`, `2e3`).

/// Error for a quantity that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Parse a quantity into its value scaled by `scale` (1 for bytes, 1000 for milli-CPU), rounded
/// up, as the API server's `Quantity.ScaledValue`/`MilliValue` do.
pub fn parse_scaled(s: &str, scale: f64) -> Result<i64, QuantityError> {
    let err = || QuantityError(s.to_string());
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| err())?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| err())?;
            10f64.powi(exp)
        }
        _ => return Err(err()),
    };
    let v = value * mult * scale;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok(v.ceil() as i64)
}

/// A memory (or other byte) quantity in bytes.
pub fn parse_bytes(s: &str) -> Result<i64, QuantityError> {
    parse_scaled(s, 1.0)
}

/// A CPU quantity in millicores.
pub fn parse_milli(s: &str) -> Result<i64, QuantityError> {
    parse_scaled(s, 1000.0)
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
