//! `RL.ACQUIRE key limit lease_sec lease_id`; state: a sorted set of leases, one member per lease
//! id at score its expiry (Unix microseconds). Inside `RL.ALL` it is the `CONCURRENCY limit
//! lease_sec` limit, with the id given once per call as `LEASE id`.

use std::ffi::CStr;

use crate::codec::args::{COST, IntegerArg};
use crate::codec::error::ErrorReply;
use crate::codec::number::{floor, parse_decimal};
use crate::command::descriptor::ArgKind::{Double, Integer, Key, String};
use crate::command::descriptor::{Descriptor, Keys, arg, per_call};
use crate::command::{Entry, PerCall, Runner};
use crate::core::{Operation, Reply, concurrency, lua_integer};
use crate::observe::stats::CommandStats;
use crate::store::zset::{self, AcquireRequest, LeaseLimit, MAX_ID_LEN, MAX_SET_LIMIT};
use crate::store::{Limit, OpenStore};

/// Largest `limit`: every lease is one sorted-set entry, as for the sliding log.
pub const MAX_LIMIT: f64 = MAX_SET_LIMIT;
/// Longest lease in seconds.
pub const MAX_LEASE_SECONDS: f64 = concurrency::MAX_LEASE_US / 1e6;

pub const NAME: &CStr = c"RL.ACQUIRE";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY_ERROR: ErrorReply =
    ErrorReply(c"ERR wrong number of arguments for 'rl.acquire' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::OneKey {
        run,
        limit: build_limit,
        settle: None,
    },
};

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    flags: c"write fast",
    keys: Keys::One(1),
    arity: 5,
    summary: c"Concurrency limit: takes or renews one of limit leases for lease_id, for lease_sec",
    complexity: c"O(log N + E) where N is the number of leases in the key and E the expired ones",
    args: &[
        arg(c"key", Key),
        arg(c"limit", Integer),
        arg(c"lease_sec", Double),
        per_call(c"lease_id", String),
    ],
    arity_error: ARITY_ERROR,
    all_keyword: Some("CONCURRENCY"),
    stats: &STATS,
};

const LIMIT: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR limit must be an integer"),
    out_of_range: ErrorReply(c"ERR limit must be between 1 and 10000"),
    min: 1.0,
    max: MAX_LIMIT,
};
const LEASE_NOT_NUMBER: ErrorReply = ErrorReply(c"ERR lease_sec must be a number");
const LEASE_OUT_OF_RANGE: ErrorReply =
    ErrorReply(c"ERR lease_sec must be greater than 0 and at most 10000000");
const LEASE_TOO_SHORT: ErrorReply = ErrorReply(c"ERR lease_sec must be at least 1 millisecond");
pub const BAD_ID: ErrorReply = ErrorReply(c"ERR lease_id must be 1 to 128 bytes");
/// `RL.ALL` with a `CONCURRENCY` limit but no `LEASE id`.
pub const NO_LEASE: ErrorReply = ErrorReply(c"ERR a CONCURRENCY limit needs LEASE lease_id");

/// A lease id argument: 1 to 128 bytes, any bytes.
pub fn lease_id(raw: &[u8]) -> Result<&[u8], ErrorReply> {
    if raw.is_empty() || raw.len() > MAX_ID_LEN {
        return Err(BAD_ID);
    }
    Ok(raw)
}

/// `limit lease_sec`, as the command and `RL.ALL` take them.
pub fn parse_params(limit: &[u8], lease: &[u8]) -> Result<concurrency::Params, ErrorReply> {
    let limit = LIMIT.parse(limit)?;
    let lease_sec = parse_decimal(lease).ok_or(LEASE_NOT_NUMBER)?;
    if !(lease_sec > 0.0 && lease_sec <= MAX_LEASE_SECONDS) {
        return Err(LEASE_OUT_OF_RANGE);
    }
    // Millisecond resolution, rounded half up; 0.0004 rounds to nothing.
    let lease_ms = floor(lease_sec * 1000.0 + 0.5);
    if lease_ms < 1.0 {
        return Err(LEASE_TOO_SHORT);
    }
    Ok(concurrency::Params {
        limit: lua_integer(limit),
        lease_ms,
        lease_us: lease_ms * 1000.0,
    })
}

/// Arguments after the key.
pub fn parse<'a>(args: &[&'a [u8]]) -> Result<AcquireRequest<'a>, ErrorReply> {
    let [limit, lease, id] = args else {
        return Err(ARITY_ERROR);
    };
    let params = parse_params(limit, lease)?;
    Ok(AcquireRequest {
        params,
        op: Operation::Consume(1.0),
        id: lease_id(id)?,
    })
}

/// One `RL.ACQUIRE` call: the arguments after the key, then its key.
pub fn run(args: &[&[u8]], key: &mut dyn OpenStore, now_us: i64) -> Result<Reply, ErrorReply> {
    let request = parse(args)?;
    zset::acquire(key.open()?, &request, now_us)
}

/// A partial grant with a concurrency limit: a lease is one slot, never a part of one.
pub const UPTO_LEASE: ErrorReply =
    ErrorReply(c"ERR UPTO is not given with a CONCURRENCY limit (a lease is one slot)");

/// `RL.ALL`'s concurrency limit: one lease whatever the cost (`COST 0` is a peek), for the
/// call's `LEASE id`.
pub fn build_limit(params: &[&[u8]], call: &PerCall<'_>) -> Result<Box<dyn Limit>, ErrorReply> {
    if call.upto.is_some() {
        return Err(UPTO_LEASE);
    }
    let [limit, lease] = params else {
        return Err(ARITY_ERROR);
    };
    let params = parse_params(limit, lease)?;
    let cost = COST.parse(call.cost)?;
    let id = lease_id(call.lease.ok_or(NO_LEASE)?)?;
    Ok(Box::new(LeaseLimit::new(
        params,
        Operation::from_cost(cost),
        id,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(v: &[&str]) -> Result<(i64, f64, Vec<u8>), &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        parse(&raw)
            .map(|a| (a.params.limit, a.params.lease_ms, a.id.to_vec()))
            .map_err(|e| e.message())
    }

    #[test]
    fn arguments() {
        assert_eq!(
            parse_str(&["10", "1.5", "job-1"]),
            Ok((10, 1500.0, b"job-1".to_vec()))
        );
        assert_eq!(parse_str(&["1", "0.0005", "x"]).map(|a| a.1), Ok(1.0));
        assert_eq!(parse_str(&["10000", "1e7", "x"]).map(|a| a.1), Ok(1e10));
        let arity = "ERR wrong number of arguments for 'rl.acquire' command";
        assert_eq!(parse_str(&["10", "1"]), Err(arity));
        assert_eq!(parse_str(&["10", "1", "a", "b"]), Err(arity));
        assert_eq!(
            parse_str(&["x", "1", "a"]),
            Err("ERR limit must be an integer")
        );
        for bad in ["0", "10001", "-1"] {
            assert_eq!(
                parse_str(&[bad, "1", "a"]),
                Err("ERR limit must be between 1 and 10000"),
                "{bad}"
            );
        }
        assert_eq!(
            parse_str(&["1", "x", "a"]),
            Err("ERR lease_sec must be a number")
        );
        for bad in ["0", "-1", "10000000.001", "inf"] {
            assert_eq!(
                parse_str(&["1", bad, "a"]),
                Err(if bad == "inf" {
                    "ERR lease_sec must be a number"
                } else {
                    "ERR lease_sec must be greater than 0 and at most 10000000"
                }),
                "{bad}"
            );
        }
        assert_eq!(
            parse_str(&["1", "0.0004", "a"]),
            Err("ERR lease_sec must be at least 1 millisecond")
        );
        assert_eq!(
            parse_str(&["1", "1", ""]),
            Err("ERR lease_id must be 1 to 128 bytes")
        );
        let long = "x".repeat(129);
        assert_eq!(
            parse_str(&["1", "1", &long]),
            Err("ERR lease_id must be 1 to 128 bytes")
        );
        assert_eq!(
            parse_str(&["1", "1", &long[..128]]).map(|a| a.2.len()),
            Ok(128)
        );
    }
}
