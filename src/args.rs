//! Command-argument parsing: bytes in, typed parameters or a ready error message out.
//!
//! Messages are `&'static CStr` so the binding can reply without allocating; each one is
//! repeated word for word by the Lua twins.

use crate::error::ErrorReply;
use crate::number::{parse_decimal, parse_integer};

/// Largest integer argument (capacity, cost). Below 2^53, so every value is exact in a double.
pub const MAX_INTEGER_ARG: f64 = 1e15;
/// Largest rate argument.
pub const MAX_RATE_ARG: f64 = 1e15;
/// Longest time a bucket may take to go from empty to full; keeps every derived time well
/// inside exact-integer doubles and Redis expiry arithmetic.
pub const MAX_FILL_SECONDS: f64 = 1e10;

/// One integer argument with its own error messages.
pub struct IntegerArg {
    pub not_integer: ErrorReply,
    pub out_of_range: ErrorReply,
    pub min: f64,
    pub max: f64,
}

impl IntegerArg {
    pub fn parse(&self, raw: &[u8]) -> Result<f64, ErrorReply> {
        let v = parse_integer(raw).ok_or(self.not_integer)?;
        if v >= self.min && v <= self.max { Ok(v) } else { Err(self.out_of_range) }
    }
}

/// One positive rate argument (events per second).
pub struct RateArg {
    pub not_number: ErrorReply,
    pub out_of_range: ErrorReply,
}

impl RateArg {
    pub fn parse(&self, raw: &[u8]) -> Result<f64, ErrorReply> {
        let v = parse_decimal(raw).ok_or(self.not_number)?;
        if v > 0.0 && v <= MAX_RATE_ARG { Ok(v) } else { Err(self.out_of_range) }
    }
}

pub const COST: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR cost must be an integer"),
    out_of_range: ErrorReply(c"ERR cost must be between 0 and 1000000000000000"),
    min: 0.0,
    max: MAX_INTEGER_ARG,
};

/// Parameters of `RL.TOKENBUCKET key capacity refill_per_sec [cost]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucketArgs {
    pub capacity: f64,
    pub refill_per_sec: f64,
    pub cost: f64,
}

pub const TOKEN_BUCKET_ARITY: ErrorReply =
    ErrorReply(c"ERR wrong number of arguments for 'rl.tokenbucket' command");

/// Parses the arguments after the key.
pub fn token_bucket(args: &[&[u8]]) -> Result<TokenBucketArgs, ErrorReply> {
    const CAPACITY: IntegerArg = IntegerArg {
        not_integer: ErrorReply(c"ERR capacity must be an integer"),
        out_of_range: ErrorReply(c"ERR capacity must be between 1 and 1000000000000000"),
        min: 1.0,
        max: MAX_INTEGER_ARG,
    };
    const RATE: RateArg = RateArg {
        not_number: ErrorReply(c"ERR refill_per_sec must be a number"),
        out_of_range: ErrorReply(
            c"ERR refill_per_sec must be greater than 0 and at most 1000000000000000",
        ),
    };
    let (capacity, rate, cost) = match args {
        [c, r] => (c, r, None),
        [c, r, k] => (c, r, Some(k)),
        _ => return Err(TOKEN_BUCKET_ARITY),
    };
    let capacity = CAPACITY.parse(capacity)?;
    let refill_per_sec = RATE.parse(rate)?;
    let cost = match cost {
        Some(raw) => COST.parse(raw)?,
        None => 1.0,
    };
    if capacity / refill_per_sec > MAX_FILL_SECONDS {
        return Err(ErrorReply(
            c"ERR capacity / refill_per_sec must be at most 10000000000 seconds",
        ));
    }
    Ok(TokenBucketArgs { capacity, refill_per_sec, cost })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<TokenBucketArgs, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        token_bucket(&raw).map_err(|e| e.message())
    }

    #[test]
    fn token_bucket_arguments() {
        assert_eq!(
            parse(&["10", "5"]),
            Ok(TokenBucketArgs { capacity: 10.0, refill_per_sec: 5.0, cost: 1.0 })
        );
        assert_eq!(parse(&["10", "0.0166667", "0"]).map(|a| a.cost), Ok(0.0));
        assert_eq!(parse(&["10"]), Err("ERR wrong number of arguments for 'rl.tokenbucket' command"));
        assert_eq!(parse(&["1.5", "1"]), Err("ERR capacity must be an integer"));
        assert_eq!(parse(&["0", "1"]), Err("ERR capacity must be between 1 and 1000000000000000"));
        assert_eq!(
            parse(&["1000000000000001", "1e9"]),
            Err("ERR capacity must be between 1 and 1000000000000000")
        );
        assert_eq!(parse(&["10", "nan"]), Err("ERR refill_per_sec must be a number"));
        assert_eq!(
            parse(&["10", "-1"]),
            Err("ERR refill_per_sec must be greater than 0 and at most 1000000000000000")
        );
        assert_eq!(
            parse(&["10", "1e999"]),
            Err("ERR refill_per_sec must be greater than 0 and at most 1000000000000000")
        );
        assert_eq!(parse(&["10", "1", "-1"]), Err("ERR cost must be between 0 and 1000000000000000"));
        assert_eq!(parse(&["10", "1", "x"]), Err("ERR cost must be an integer"));
        assert_eq!(
            parse(&["100", "1e-9"]),
            Err("ERR capacity / refill_per_sec must be at most 10000000000 seconds")
        );
    }
}
