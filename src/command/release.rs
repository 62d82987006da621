//! `RL.RELEASE key lease_id`: frees the lease `RL.ACQUIRE` took for `lease_id`. Replies 1 when a
//! live lease was released, 0 when there was none (an unknown id, or one whose lease had already
//! expired); releasing twice is harmless.

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::command::acquire::lease_id;
use crate::command::descriptor::ArgKind::{Key, String};
use crate::command::descriptor::{Descriptor, Keys, arg};
use crate::command::{Entry, Runner};
use crate::observe::stats::CommandStats;

pub const NAME: &CStr = c"RL.RELEASE";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY_ERROR: ErrorReply =
    ErrorReply(c"ERR wrong number of arguments for 'rl.release' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::Release,
};

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    flags: c"write fast",
    keys: Keys::One(1),
    arity: 3,
    summary:
        c"Frees the lease RL.ACQUIRE took for lease_id; 1 if a live lease was released, else 0",
    complexity: c"O(log N + E) where N is the number of leases in the key and E the expired ones",
    args: &[arg(c"key", Key), arg(c"lease_id", String)],
    arity_error: ARITY_ERROR,
    all_keyword: None,
    stats: &STATS,
};

/// Arguments after the key: the lease id.
pub fn parse<'a>(args: &[&'a [u8]]) -> Result<&'a [u8], ErrorReply> {
    let [id] = args else {
        return Err(ARITY_ERROR);
    };
    lease_id(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let p = |v: &[&'static str]| {
            let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
            parse(&raw).map(<[u8]>::to_vec).map_err(|e| e.message())
        };
        assert_eq!(p(&["job-1"]), Ok(b"job-1".to_vec()));
        let arity = "ERR wrong number of arguments for 'rl.release' command";
        assert_eq!(p(&[]), Err(arity));
        assert_eq!(p(&["a", "b"]), Err(arity));
        assert_eq!(p(&[""]), Err("ERR lease_id must be 1 to 128 bytes"));
    }
}
