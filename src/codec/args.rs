//! Command-argument parsing: bytes in, typed parameters or a ready error message out.
//!
//! Messages are `&'static CStr` so the binding can reply without allocating; each one is
//! repeated word for word by the Lua twins.

use crate::codec::error::ErrorReply;
use crate::codec::number::{floor, parse_decimal, parse_integer};

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

/// Longest window a windowed limiter accepts, in seconds.
pub const MAX_WINDOW_SECONDS: f64 = 1e10;

/// One window-length argument in seconds, with millisecond resolution.
pub struct WindowArg {
    pub not_number: ErrorReply,
    pub out_of_range: ErrorReply,
}

impl WindowArg {
    /// The window in whole milliseconds (rounded to nearest): at least 1, at most
    /// `MAX_WINDOW_SECONDS` seconds.
    pub fn parse(&self, raw: &[u8]) -> Result<f64, ErrorReply> {
        let v = parse_decimal(raw).ok_or(self.not_number)?;
        if v > MAX_WINDOW_SECONDS {
            return Err(self.out_of_range);
        }
        let window_ms = floor(v * 1000.0 + 0.5);
        if window_ms >= 1.0 {
            Ok(window_ms)
        } else {
            Err(self.out_of_range)
        }
    }
}

/// The arguments of a bucket (`capacity rate [cost]`): each bucket names its rate differently.
pub struct BucketArgs {
    pub capacity: IntegerArg,
    pub rate: RateArg,
    /// `capacity / rate` above `MAX_FILL_SECONDS`.
    pub too_slow: ErrorReply,
}

impl BucketArgs {
    /// `(capacity, rate, cost)`, cost 1 when absent.
    pub fn parse(&self, args: &[&[u8]], arity: ErrorReply) -> Result<(f64, f64, f64), ErrorReply> {
        let (capacity, rate, cost) = match args {
            [c, r] => (c, r, None),
            [c, r, k] => (c, r, Some(k)),
            _ => return Err(arity),
        };
        let capacity = self.capacity.parse(capacity)?;
        let rate = self.rate.parse(rate)?;
        let cost = match cost {
            Some(raw) => COST.parse(raw)?,
            None => 1.0,
        };
        if capacity / rate > MAX_FILL_SECONDS {
            return Err(self.too_slow);
        }
        Ok((capacity, rate, cost))
    }
}

/// The keyword of a partial grant, in place of a limiter's cost: `UPTO n`.
pub const UPTO: &[u8] = b"UPTO";

/// `UPTO n` for a limiter whose cost is at most `max`.
pub const fn upto_arg(out_of_range: ErrorReply, max: f64) -> IntegerArg {
    IntegerArg {
        not_integer: ErrorReply(c"ERR UPTO must be an integer"),
        out_of_range,
        min: 1.0,
        max,
    }
}

/// `UPTO n` of every limiter of numbers.
pub const UPTO_ARG: IntegerArg = upto_arg(
    ErrorReply(c"ERR UPTO must be between 1 and 1000000000000000"),
    MAX_INTEGER_ARG,
);

/// A limiter's arguments after the key with a trailing `UPTO n` (any case) taken off, and `n`
/// checked by `arg`; the arguments as they are when they do not end so.
pub fn split_upto<'a, 'b>(
    args: &'a [&'b [u8]],
    arg: &IntegerArg,
) -> Result<(&'a [&'b [u8]], Option<f64>), ErrorReply> {
    match args {
        [rest @ .., keyword, n] if keyword.eq_ignore_ascii_case(UPTO) => {
            Ok((rest, Some(arg.parse(n)?)))
        }
        _ => Ok((args, None)),
    }
}

/// `params` and then `last` as one argument list (at most 8 in all), for `f`; `arity` when
/// they are more.
pub fn with_last<T>(
    params: &[&[u8]],
    last: &[u8],
    arity: ErrorReply,
    f: impl FnOnce(&[&[u8]]) -> Result<T, ErrorReply>,
) -> Result<T, ErrorReply> {
    let mut buf: [&[u8]; 8] = [&[]; 8];
    let mut n = 0;
    for (slot, arg) in buf.iter_mut().zip(params.iter().copied().chain([last])) {
        *slot = arg;
        n += 1;
    }
    if n != params.len() + 1 {
        return Err(arity);
    }
    f(buf.get(..n).unwrap_or_default())
}
