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
        if v >= self.min && v <= self.max {
            Ok(v)
        } else {
            Err(self.out_of_range)
        }
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
        if v > 0.0 && v <= MAX_RATE_ARG {
            Ok(v)
        } else {
            Err(self.out_of_range)
        }
    }
}

pub const COST: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR cost must be an integer"),
    out_of_range: ErrorReply(c"ERR cost must be between 0 and 1000000000000000"),
    min: 0.0,
    max: MAX_INTEGER_ARG,
};
