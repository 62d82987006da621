//! Checks applied to stored numbers when they are read back, by the module and the Lua twins
//! alike. A field that fails a check is reported, never repaired or overwritten.

use crate::codec::number::{parse_decimal, parse_integer};

/// Stored timestamps are integer microseconds below 2^53, exact in a double.
pub const MAX_TIMESTAMP_US: f64 = 9_007_199_254_740_992.0;

/// A finite, non-negative decimal.
pub fn amount(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_decimal(raw?)?;
    (v >= 0.0 && v < f64::INFINITY).then_some(v)
}

/// A finite decimal of either sign: a token bucket's tokens, negative for a debt (`RL.SETTLE`).
pub fn balance(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_decimal(raw?)?;
    v.is_finite().then_some(v)
}

/// An integer timestamp in microseconds, `0 <= ts <= 2^53`.
pub fn timestamp(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_integer(raw?)?;
    (v >= 0.0 && v <= MAX_TIMESTAMP_US).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_number_checks() {
        assert_eq!(balance(Some(b"-500")), Some(-500.0));
        assert_eq!(balance(Some(b"1e999")), None);
        assert_eq!(amount(Some(b"4.5")), Some(4.5));
        assert_eq!(amount(Some(b"-0")), Some(0.0));
        for bad in [&b"-1"[..], b"1e999", b"abc", b"", b"nan"] {
            assert_eq!(amount(Some(bad)), None);
        }
        assert_eq!(amount(None), None);
        assert_eq!(timestamp(Some(b"1700000000000000")), Some(1.7e15));
        // 2^53 + 1 reads as 2^53 (round to even), as strtod does.
        assert_eq!(timestamp(Some(b"9007199254740993")), Some(MAX_TIMESTAMP_US));
        for bad in [&b"9007199254740994"[..], b"1.5", b"-5", b"1e3"] {
            assert_eq!(timestamp(Some(bad)), None);
        }
    }
}
