//! Stored state as hash fields: the exact bytes both the module and the Lua twins write and the
//! checks both apply when reading them back. A field that fails a check is reported, never
//! repaired or overwritten.

use crate::core::token_bucket;
use crate::error::ErrorReply;
use crate::number::{parse_decimal, parse_integer};

/// Stored timestamps are integer microseconds below 2^53, exact in a double.
pub const MAX_TIMESTAMP_US: f64 = 9_007_199_254_740_992.0;

pub const CORRUPT_TOKENS: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'tokens' is not a valid number");
pub const CORRUPT_TS: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'ts' is not a valid timestamp");

/// A finite, non-negative decimal.
fn amount(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_decimal(raw?)?;
    (v >= 0.0 && v < f64::INFINITY).then_some(v)
}

/// An integer timestamp in microseconds, `0 <= ts <= 2^53`.
fn timestamp(raw: Option<&[u8]>) -> Option<f64> {
    let v = parse_integer(raw?)?;
    (v >= 0.0 && v <= MAX_TIMESTAMP_US).then_some(v)
}

pub const TOKEN_BUCKET_FIELDS: [&std::ffi::CStr; 2] = [c"tokens", c"ts"];

/// Reads `[tokens, ts]` of an existing token-bucket hash.
pub fn decode_token_bucket(fields: [Option<&[u8]>; 2]) -> Result<token_bucket::State, ErrorReply> {
    let tokens = amount(fields[0]).ok_or(CORRUPT_TOKENS)?;
    let ts_us = timestamp(fields[1]).ok_or(CORRUPT_TS)?;
    Ok(token_bucket::State { tokens, ts_us })
}

/// The values to store for `TOKEN_BUCKET_FIELDS`, in order.
pub fn encode_token_bucket(state: &token_bucket::State) -> [f64; 2] {
    [state.tokens, state.ts_us]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_state_checks() {
        let ok = decode_token_bucket([Some(b"4.5"), Some(b"1700000000000000")]);
        assert_eq!(ok, Ok(token_bucket::State { tokens: 4.5, ts_us: 1.7e15 }));
        assert_eq!(decode_token_bucket([None, Some(b"1")]), Err(CORRUPT_TOKENS));
        assert_eq!(decode_token_bucket([Some(b"-1"), Some(b"1")]), Err(CORRUPT_TOKENS));
        assert_eq!(decode_token_bucket([Some(b"1e999"), Some(b"1")]), Err(CORRUPT_TOKENS));
        assert_eq!(decode_token_bucket([Some(b"abc"), Some(b"1")]), Err(CORRUPT_TOKENS));
        assert_eq!(decode_token_bucket([Some(b"1"), Some(b"1.5")]), Err(CORRUPT_TS));
        assert_eq!(decode_token_bucket([Some(b"1"), None]), Err(CORRUPT_TS));
        assert_eq!(decode_token_bucket([Some(b"1"), Some(b"9007199254740993")]), Ok(
            token_bucket::State { tokens: 1.0, ts_us: MAX_TIMESTAMP_US }
        ));
        assert_eq!(decode_token_bucket([Some(b"1"), Some(b"9007199254740994")]), Err(CORRUPT_TS));
    }
}
