//! The replication check every limiter's suite runs: mixed calls (admitted, denied, peeks) on a
//! master under the test clock; then the replica holds the same state and absolute expiry, ran
//! only the propagated effects and never the limiter command, and a denial or a peek sent it
//! nothing at all.

use std::fmt::Debug;

use redis::Connection;

use super::{Server, advance_clock, calls_of, cmd, info_field, ints, pexpiretime, set_clock};

/// 2030: ahead of the real clock, so no absolute expiry written here is already past.
const START_US: i64 = 1_900_000_000_000_000;

pub struct ReplicationCheck<'a, S> {
    /// The limiter command.
    pub command: &'a str,
    /// Parameters of the mixed calls; every 7th call appends cost 0 (a peek), the others `cost`.
    pub params: &'a [&'a str],
    pub cost: &'a str,
    /// Parameters under which a key's first call is admitted and the next one denied.
    pub deny_params: &'a [&'a str],
    /// The first element of a denial's reply (0 for `RL.*`, 1 for `CL.THROTTLE`).
    pub denied_flag: i64,
    /// The commands the replica must have run, as named by `INFO commandstats`.
    pub effects: &'a [&'a str],
    /// A key's stored state; the default value means "not written".
    pub state: fn(&mut Connection, &str) -> S,
    /// When set, the one command the replica runs, exactly once per admitted call that
    /// consumes (limiters whose state is one string: `set`).
    pub one_effect_per_write: Option<&'a str>,
}

impl<S: PartialEq + Debug + Default> ReplicationCheck<'_, S> {
    pub fn run(&self) {
        let master = Server::with_test_clock();
        let replica = Server::start();
        replica.replicate_from(&master);
        let mut m = master.connect();
        let mut r = replica.connect();
        set_clock(&mut m, START_US);
        let mut writes: u64 = 0;
        for i in 0..50 {
            let key = format!("k{}", i % 5);
            let cost = if i % 7 == 0 { "0" } else { self.cost };
            let reply = self.call(&mut m, &key, self.params, Some(cost));
            if cost != "0" && reply.first() != Some(&self.denied_flag) {
                writes += 1;
            }
            advance_clock(&mut m, 123_457);
        }
        // The admitted call on "spent" below.
        writes += 1;

        let offset = info_field(&mut m, "replication", "master_repl_offset");
        let admitted = self.call(&mut m, "spent", self.deny_params, None);
        assert_ne!(admitted.first(), Some(&self.denied_flag), "{admitted:?}");
        let after_write = info_field(&mut m, "replication", "master_repl_offset");
        assert_ne!(offset, after_write, "a write is propagated");
        let denied = self.call(&mut m, "spent", self.deny_params, None);
        assert_eq!(denied.first(), Some(&self.denied_flag), "{denied:?}");
        self.call(&mut m, "spent", self.deny_params, Some("0"));
        assert_eq!(
            info_field(&mut m, "replication", "master_repl_offset"),
            after_write,
            "a denial and a peek propagate nothing"
        );

        let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
        for key in ["k0", "k1", "k2", "k3", "k4", "spent"] {
            let on_master = (self.state)(&mut m, key);
            assert_ne!(on_master, S::default(), "{key} was written");
            assert_eq!((self.state)(&mut r, key), on_master, "{key}");
            assert_eq!(pexpiretime(&mut r, key), pexpiretime(&mut m, key), "{key}");
        }
        for effect in self.effects {
            assert!(calls_of(&mut r, effect) > 0, "the replica ran no {effect}");
        }
        if let Some(effect) = self.one_effect_per_write {
            assert_eq!(
                calls_of(&mut r, effect),
                writes,
                "one {effect} per admitted call"
            );
            let commands = info_field_lines(&mut r, "commandstats");
            let others: Vec<&String> = commands
                .iter()
                .filter(|l| !l.starts_with(&format!("cmdstat_{effect}:")))
                .filter(|l| is_write_command(&mut r, l))
                .collect();
            assert!(
                others.is_empty(),
                "the replica wrote more than {effect}: {others:?}"
            );
            assert!(is_write_command(&mut r, &format!("cmdstat_{effect}:")));
        }
        let own = self.command.to_lowercase();
        assert_eq!(calls_of(&mut r, &own), 0, "the replica ran {own} itself");
    }

    fn call(&self, c: &mut Connection, key: &str, params: &[&str], cost: Option<&str>) -> Vec<i64> {
        let mut args = vec![self.command, key];
        args.extend_from_slice(params);
        args.extend(cost);
        ints(&cmd(c, &args))
    }
}

/// The `cmdstat_...` lines of a server's `INFO commandstats`.
fn info_field_lines(c: &mut Connection, section: &str) -> Vec<String> {
    let info: String = redis::cmd("INFO").arg(section).query(c).expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .map(str::to_string)
        .collect()
}

/// Whether the command of a `cmdstat_<name>[|<sub>]:...` line writes (its `COMMAND INFO` flags
/// say `write`): what a replica runs besides reads and connection handling.
fn is_write_command(c: &mut Connection, line: &str) -> bool {
    let name = line
        .trim_start_matches("cmdstat_")
        .split([':', '|'])
        .next()
        .unwrap_or_default();
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query(c)
        .expect("COMMAND INFO");
    let Some(redis::Value::Array(entry)) = info.first() else {
        return false;
    };
    match entry.get(2) {
        Some(redis::Value::Array(flags)) => flags.iter().any(|f| {
            matches!(f, redis::Value::SimpleString(s) if s == "write")
                || matches!(f, redis::Value::BulkString(b) if b == b"write")
        }),
        _ => false,
    }
}
