//! The replication check, run for every command of the table (`tests/conformance.rs`): mixed
//! calls (admitted, denied, peeks) on a master under the test clock; then the replica holds the
//! same state and absolute expiry, ran only the propagated effects and never the limiter command,
//! and a denial or a peek sent it nothing at all.

use redis::Connection;

use super::cases::Case;
use super::{Server, advance_clock, calls_of, info_field, pexpiretime, set_clock, stored};

/// 2030: ahead of the real clock, so no absolute expiry written here is already past.
const START_US: i64 = 1_900_000_000_000_000;

/// The check for one command of the table.
pub struct ReplicationCheck<'a> {
    pub case: &'a Case,
}

impl ReplicationCheck<'_> {
    pub fn run(&self) {
        let case = self.case;
        let (params, cost) = case.workload;
        let master = Server::with_test_clock();
        let replica = Server::start();
        replica.replicate_from(&master);
        let mut m = master.connect();
        let mut r = replica.connect();
        set_clock(&mut m, START_US);
        let mut writes: u64 = 0;
        for i in 0..50 {
            let key = format!("k{}", i % 5);
            let cost = if i % 7 == 0 && case.peeks { "0" } else { cost };
            let reply = case.call(&mut m, &key, params, case.peeks.then_some(cost));
            if cost != "0" && case.admitted(&reply) {
                writes += 1;
            }
            advance_clock(&mut m, 123_457);
        }
        // The admitted call on "spent" below.
        writes += 1;

        let offset = info_field(&mut m, "replication", "master_repl_offset");
        let admitted = case.call(&mut m, "spent", case.one, None);
        assert!(case.admitted(&admitted), "{}: {admitted:?}", case.command);
        let after_write = info_field(&mut m, "replication", "master_repl_offset");
        assert_ne!(
            offset, after_write,
            "{}: a write is propagated",
            case.command
        );
        let denied = case.call(&mut m, "spent", case.one, None);
        assert!(!case.admitted(&denied), "{}: {denied:?}", case.command);
        if case.peeks {
            case.call(&mut m, "spent", case.one, Some("0")).unwrap();
        }
        assert_eq!(
            info_field(&mut m, "replication", "master_repl_offset"),
            after_write,
            "{}: a denial and a peek propagate nothing",
            case.command
        );

        let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
        for key in ["k0", "k1", "k2", "k3", "k4", "spent"] {
            let on_master = stored(&mut m, key);
            assert_eq!(
                on_master.0, case.kind,
                "{}: {key} was written",
                case.command
            );
            assert_eq!(stored(&mut r, key), on_master, "{}: {key}", case.command);
            assert_eq!(pexpiretime(&mut r, key), pexpiretime(&mut m, key), "{key}");
        }
        for effect in case.effects {
            assert!(
                calls_of(&mut r, effect) > 0,
                "{}: the replica ran no {effect}",
                case.command
            );
        }
        if let Some(effect) = case.one_effect_per_write {
            assert_eq!(
                calls_of(&mut r, effect),
                writes,
                "{}: one {effect} per admitted call",
                case.command
            );
            let commands = info_field_lines(&mut r, "commandstats");
            let others: Vec<&String> = commands
                .iter()
                .filter(|l| !l.starts_with(&format!("cmdstat_{effect}:")))
                .filter(|l| is_write_command(&mut r, l))
                .collect();
            assert!(
                others.is_empty(),
                "{}: the replica wrote more than {effect}: {others:?}",
                case.command
            );
            assert!(is_write_command(&mut r, &format!("cmdstat_{effect}:")));
        }
        let own = case.command.to_lowercase();
        assert_eq!(calls_of(&mut r, &own), 0, "the replica ran {own} itself");
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
