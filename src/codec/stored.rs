//! Checks applied to stored numbers when they are read back, by the module and the Lua twins
//! alike. A field that fails a check is reported, never repaired or overwritten.

use crate::codec::args::MAX_INTEGER_ARG;
use crate::codec::number::{parse_decimal, parse_integer};

/// Stored timestamps are integer microseconds below 2^53, exact in a double.
pub const MAX_TIMESTAMP_US: f64 = 9_007_199_254_740_992.0;

/// How far ahead of this server's clock a stored time may be and still be read: a master whose
/// clock ran ahead of this one's (before a failover) wrote it. A time ahead by less is read as
/// now (where a limiter never stores a time ahead of its clock) or as it is; a time ahead by more
/// no call wrote, and is corrupt state.
pub const SKEW_US: f64 = 60_000_000.0;

/// The most a count reaches: a settlement charges a window up to twice the largest limit.
pub const MAX_COUNT: f64 = 2e15;

/// A non-negative decimal no larger than any count a limiter stores (`MAX_COUNT`): a bucket's
/// level, a window's count.
pub fn amount(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_decimal(raw?)?;
    (v >= 0.0 && v <= MAX_COUNT).then_some(v)
}

/// A decimal of either sign within the largest capacity: a token bucket's tokens, negative for
/// a debt (`RL.SETTLE`), which is never deeper than a capacity.
pub fn balance(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_decimal(raw?)?;
    (v >= -MAX_INTEGER_ARG && v <= MAX_INTEGER_ARG).then_some(v)
}

/// A stored time of a limiter that never stores one ahead of its clock (a bucket's last update,
/// a window's start), as a call at `now_us` reads it: as it is up to `SKEW_US` ahead of now (a
/// master whose clock ran ahead wrote it: the limiter carries on from it, and the waits it
/// replies count from it), `None` (corrupt) when further ahead.
pub fn within_skew(t: f64, now_us: i64) -> Option<f64> {
    if t > now_us as f64 + SKEW_US {
        None
    } else {
        Some(t)
    }
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
        assert_eq!(balance(Some(b"-1e15")), Some(-1e15));
        assert_eq!(balance(Some(b"-1.0000000000000002e15")), None);
        assert_eq!(balance(Some(b"-1e308")), None);
        assert_eq!(amount(Some(b"2e15")), Some(2e15));
        assert_eq!(amount(Some(b"2.0000000000000002e15")), None);
        let now = 1_800_000_000_000_000;
        assert_eq!(within_skew(1.7e15, now), Some(1.7e15));
        assert_eq!(within_skew(1.8e15 + SKEW_US, now), Some(1.8e15 + SKEW_US));
        assert_eq!(within_skew(1.8e15 + SKEW_US + 1.0, now), None);
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
