//! The table of every limiter the module registers: for each, arguments that admit ten calls at
//! one instant, arguments that admit one then deny, a bad argument list, what the key holds, and
//! a way to corrupt it. The suites that check a promise for every command (conformance, ACL)
//! read it, so a command added to the module is added here once. `RL.RELEASE`, which decides
//! nothing, and `RL.SETTLE`, which always admits, have their own checks in `tests/leases.rs` and
//! `tests/settle.rs` (`NOT_LIMITERS`).

use std::sync::atomic::{AtomicUsize, Ordering};

use redis::{Connection, Value};

use super::cmd;

pub struct Case {
    pub command: &'static str,
    /// Parameters under which a fresh key admits exactly 10 calls at one instant.
    pub ten: &'static [&'static str],
    /// Parameters under which a fresh key admits its first call and denies the second.
    pub one: &'static [&'static str],
    /// A parameter list with a bad number.
    pub bad: &'static [&'static str],
    /// What the key holds once written (`string`, `zset`).
    pub kind: &'static str,
    /// Commands that put a corrupt value in `key` (`{key}` stands for it), and the error a call
    /// then gets.
    pub corrupt: &'static [&'static str],
    pub corrupt_error: &'static str,
    /// Parameters and cost of a mixed workload (admitted and denied calls, every 123 ms over
    /// five keys) for the replication check (`harness::replication`).
    pub workload: (&'static [&'static str], &'static str),
    /// The commands a replica runs for this command's writes (`INFO commandstats` names), and
    /// the one it runs exactly once per admitted call, where there is one.
    pub effects: &'static [&'static str],
    pub one_effect_per_write: Option<&'static str>,
    /// Whether a call can be a peek (a cost of 0): `RL.ACQUIRE` has no cost argument.
    pub peeks: bool,
}

/// Registered commands that are no limiter, so not in `CASES`.
pub const NOT_LIMITERS: &[&str] = &["RL.RELEASE", "RL.SETTLE"];

/// In parameters, `{id}` stands for a lease id of its own for every call.
const FRESH_ID: &str = "{id}";
static IDS: AtomicUsize = AtomicUsize::new(0);

const TOKENS_ERR: &str = "ERR corrupt rate limiter state: field 'tokens' is not a valid number";

pub const CASES: &[Case] = &[
    Case {
        command: "RL.TOKENBUCKET",
        ten: &["10", "0.001"],
        one: &["1", "0.001"],
        bad: &["x", "1"],
        kind: "string",
        corrupt: &["SET", "{key}", "1 2 3"],
        corrupt_error: "ERR corrupt rate limiter state: field 'ts' is not a valid timestamp",
        workload: (&["3", "2"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
    Case {
        command: "RL.LEAKYBUCKET",
        ten: &["10", "0.001"],
        one: &["1", "0.001"],
        bad: &["10", "nan"],
        kind: "string",
        corrupt: &["SET", "{key}", "-1 5"],
        corrupt_error: "ERR corrupt rate limiter state: field 'level' is not a valid number",
        workload: (&["3", "2"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
    Case {
        command: "RL.FIXEDWINDOW",
        ten: &["10", "1000"],
        one: &["1", "1000"],
        bad: &["0", "1000"],
        kind: "string",
        corrupt: &["SET", "{key}", "1"],
        corrupt_error: "ERR corrupt rate limiter state: field 'start' is not a valid timestamp",
        workload: (&["3", "0.7"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
    Case {
        command: "RL.SLIDINGWINDOW",
        ten: &["10", "1000"],
        one: &["1", "1000"],
        bad: &["10", "-1"],
        kind: "string",
        corrupt: &["SET", "{key}", "1 x 1"],
        corrupt_error: "ERR corrupt rate limiter state: field 'cur' is not a valid number",
        workload: (&["3", "0.7"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
    Case {
        command: "RL.GCRA",
        ten: &["9", "1", "1000"],
        one: &["0", "1", "1000"],
        bad: &["1", "0", "1"],
        kind: "string",
        corrupt: &["SET", "{key}", "1.5"],
        corrupt_error: "ERR corrupt rate limiter state: field 'tat' is not a valid timestamp",
        workload: (&["2", "3", "1"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
    Case {
        command: "RL.SLIDINGLOG",
        ten: &["10", "1000"],
        one: &["1", "1000"],
        bad: &["10001", "1"],
        kind: "zset",
        corrupt: &["ZADD", "{key}", "1.5", "1:0"],
        corrupt_error: "ERR corrupt rate limiter state: sorted set score is not a valid timestamp",
        workload: (&["5", "0.5"], "2"),
        effects: &["zadd", "zremrangebyrank", "pexpireat"],
        one_effect_per_write: None,
        peeks: true,
    },
    Case {
        command: "RL.ACQUIRE",
        ten: &["10", "1000", FRESH_ID],
        one: &["1", "1000", FRESH_ID],
        bad: &["10", "0.0001", FRESH_ID],
        kind: "zset",
        corrupt: &["ZADD", "{key}", "1.5", "job"],
        corrupt_error: "ERR corrupt rate limiter state: sorted set score is not a valid timestamp",
        workload: (&["3", "2", FRESH_ID], "1"),
        effects: &["zadd", "zremrangebyrank", "pexpireat"],
        one_effect_per_write: None,
        peeks: false,
    },
    Case {
        command: "CL.THROTTLE",
        ten: &["9", "1", "1000"],
        one: &["0", "1", "1000"],
        bad: &["-1", "1", "1"],
        kind: "string",
        corrupt: &["SET", "{key}", "abc"],
        corrupt_error: "ERR corrupt rate limiter state: the value is not a timestamp in nanoseconds",
        workload: (&["2", "3", "1"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
    Case {
        command: "RL.ALL",
        ten: &["TOKENBUCKET", "10", "0.001"],
        one: &["GCRA", "0", "1", "1000"],
        bad: &["TOKENBUCKET", "10", "x"],
        kind: "string",
        corrupt: &["SET", "{key}", "x"],
        corrupt_error: TOKENS_ERR,
        workload: (&["TOKENBUCKET", "3", "2"], "1"),
        effects: &["set"],
        one_effect_per_write: Some("set"),
        peeks: true,
    },
];

impl Case {
    /// The call on `key` with `params` and, if given, a cost (only where the command `peeks`,
    /// has a cost).
    pub fn argv(&self, key: &str, params: &[&str], cost: Option<&str>) -> Vec<String> {
        assert!(
            self.peeks || cost.is_none(),
            "{} takes no cost",
            self.command
        );
        let params: Vec<String> = params
            .iter()
            .map(|p| match *p {
                FRESH_ID => format!("lease-{}", IDS.fetch_add(1, Ordering::Relaxed)),
                p => p.to_string(),
            })
            .collect();
        let mut v: Vec<String> = vec![self.command.to_string()];
        if self.command == "RL.ALL" {
            v.extend(["1".to_string(), key.to_string()]);
            v.extend(params.iter().map(|p| p.to_string()));
            if let Some(cost) = cost {
                v.extend(["COST".to_string(), cost.to_string()]);
            }
        } else {
            v.push(key.to_string());
            v.extend(params.iter().map(|p| p.to_string()));
            v.extend(cost.map(str::to_string));
        }
        v
    }

    pub fn call(
        &self,
        c: &mut Connection,
        key: &str,
        params: &[&str],
        cost: Option<&str>,
    ) -> super::Reply {
        let argv = self.argv(key, params, cost);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        cmd(c, &argv)
    }

    /// Whether a reply admitted: `RL.*` and `RL.ALL` start with `allowed`, `CL.THROTTLE` with
    /// `limited`.
    pub fn admitted(&self, reply: &super::Reply) -> bool {
        let first = match reply {
            Ok(Value::Array(items)) => items.first(),
            other => panic!("{}: not a decision: {other:?}", self.command),
        };
        let Some(Value::Int(first)) = first else {
            panic!("{}: {reply:?}", self.command);
        };
        if self.command == "CL.THROTTLE" {
            *first == 0
        } else {
            *first == 1
        }
    }

    /// Writes the case's corrupt state; a sorted set also gets an expiry, as every set of the
    /// module has (one without is not the module's, a different error).
    pub fn corrupt(&self, c: &mut Connection, key: &str) {
        let argv: Vec<&str> = self
            .corrupt
            .iter()
            .map(|a| if *a == "{key}" { key } else { a })
            .collect();
        cmd(c, &argv).expect("corrupting a key");
        if self.kind == "zset" {
            cmd(c, &["PEXPIRE", key, "100000000"]).expect("an expiry");
        }
    }
}
