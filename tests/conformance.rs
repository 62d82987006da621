//! What every command promises, checked for every command of one table (`harness::cases`, which
//! the ACL suite reads too), on whichever server the suite runs on: a denial and a peek write
//! nothing; a key of another type gets `WRONGTYPE` and stored state that is not the module's gets
//! the corrupt error, both leaving the key as it was; INFO counts admitted, denied and errors by
//! kind exactly; `COMMAND INFO` and `COMMAND DOCS` say what the command's descriptor says; 200
//! racing clients on a fresh key admit exactly the limit; keyspace events name the write and the
//! expiry (a sorted set's only when it moved); a replica gets the effects, never the command, and
//! ends with the same bytes and expiries. The files per command keep only what is particular to each.

mod harness;

use std::sync::{Arc, Barrier};

use harness::cases::{CASES, NOT_LIMITERS};
use harness::{Options, Server, Stored, cmd, info_field, pexpiretime, set_clock, stored};
use redis::{Connection, Value};
use redis_rate_limiter::command::registry::DESCRIPTORS;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const T0: i64 = 1_900_000_000_000_000;

fn state(c: &mut Connection, key: &str) -> (Stored, i64) {
    (stored(c, key), pexpiretime(c, key))
}

fn dirty(c: &mut Connection) -> String {
    info_field(c, "persistence", "rdb_changes_since_last_save")
}

#[test]
fn the_table_covers_every_registered_command() {
    let described: Vec<&str> = DESCRIPTORS
        .iter()
        .map(|d| d.name.to_str().unwrap())
        .collect();
    let mut covered: Vec<&str> = CASES.iter().map(|c| c.command).collect();
    covered.extend(NOT_LIMITERS);
    covered.sort();
    let mut all = described.clone();
    all.sort();
    assert_eq!(covered, all);
}

#[test]
fn denials_and_peeks_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    for case in CASES {
        let key = format!("{}:k", case.command);
        assert!(case.admitted(&case.call(&mut c, &key, case.one, None)));
        let before = state(&mut c, &key);
        assert_eq!(before.0.0, case.kind, "{}", case.command);
        assert!(before.1 > 0, "{}: written with an expiry", case.command);
        let d = dirty(&mut c);
        assert!(!case.admitted(&case.call(&mut c, &key, case.one, None)));
        if case.peeks {
            case.call(&mut c, &key, case.one, Some("0")).unwrap();
        }
        assert_eq!(state(&mut c, &key), before, "{}", case.command);
        assert_eq!(dirty(&mut c), d, "{}: nothing was written", case.command);
        if !case.peeks {
            continue;
        }
        // A peek on a fresh key creates nothing.
        let fresh = format!("{}:fresh", case.command);
        assert!(case.admitted(&case.call(&mut c, &fresh, case.one, Some("0"))));
        assert_eq!(cmd(&mut c, &["EXISTS", &fresh]), Ok(Value::Int(0)));
    }
}

#[test]
fn wrong_types_and_corrupt_state_are_reported_and_left_alone() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    for case in CASES {
        let list = format!("{}:list", case.command);
        cmd(&mut c, &["RPUSH", &list, "x"]).unwrap();
        assert_eq!(
            case.call(&mut c, &list, case.ten, None),
            Err(WRONGTYPE.to_string()),
            "{}",
            case.command
        );
        assert_eq!(stored(&mut c, &list).0, "list");

        let key = format!("{}:corrupt", case.command);
        case.corrupt(&mut c, &key);
        let before = state(&mut c, &key);
        assert_eq!(
            case.call(&mut c, &key, case.ten, None),
            Err(case.corrupt_error.to_string()),
            "{}",
            case.command
        );
        assert_eq!(state(&mut c, &key), before, "{}", case.command);
        if case.kind != "zset" {
            assert_eq!(before.1, -1, "{}: no expiry was given", case.command);
        }
    }
}

#[test]
fn info_counts_each_outcome_and_each_kind_of_error() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    for case in CASES {
        let key = format!("{}:k", case.command);
        assert!(case.admitted(&case.call(&mut c, &key, case.one, None)));
        assert!(!case.admitted(&case.call(&mut c, &key, case.one, None)));
        assert!(case.call(&mut c, &key, case.bad, None).is_err());
        let list = format!("{}:list", case.command);
        cmd(&mut c, &["RPUSH", &list, "x"]).unwrap();
        assert!(case.call(&mut c, &list, case.ten, None).is_err());
        let corrupt = format!("{}:corrupt", case.command);
        case.corrupt(&mut c, &corrupt);
        assert!(case.call(&mut c, &corrupt, case.ten, None).is_err());
    }
    cmd(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    for case in CASES {
        let oom = case.call(&mut c, &format!("{}:new", case.command), case.ten, None);
        assert!(oom.unwrap_err().starts_with("OOM"), "{}", case.command);
    }
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    for case in CASES {
        let field = format!(
            "ratelimit_{}",
            case.command.to_ascii_lowercase().replace('.', "_")
        );
        assert_eq!(
            info_field(&mut c, "ratelimit", &field),
            "calls=6,allowed=1,denied=1,errors=4,args=1,wrongtype=1,corrupt=1,oom=1,internal=0",
            "{}",
            case.command
        );
    }
}

#[test]
fn command_info_and_docs_say_what_the_descriptor_says() {
    let s = Server::start();
    let mut c = s.connect();
    for d in DESCRIPTORS {
        let name = d.name.to_str().unwrap().to_ascii_lowercase();
        let info: Vec<Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(&name)
            .query(&mut c)
            .unwrap();
        let Some(Value::Array(entry)) = info.first() else {
            panic!("{name}: {info:?}");
        };
        assert_eq!(
            entry.get(1),
            Some(&Value::Int(i64::from(d.arity))),
            "{name}"
        );
        let flags: Vec<String> = match entry.get(2) {
            Some(Value::Array(f)) => f
                .iter()
                .map(|v| match v {
                    Value::SimpleString(s) => s.clone(),
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{name}: {other:?}"),
        };
        for flag in d.flags.to_str().unwrap().split(' ') {
            let shown = if flag == "getkeys-api" {
                "movablekeys"
            } else {
                flag
            };
            assert!(
                flags.iter().any(|f| f == shown),
                "{name}: {flag} in {flags:?}"
            );
        }
        let (first, last, step) = d.key_range();
        assert_eq!(
            entry.get(3..6),
            Some(
                &[
                    Value::Int(first.into()),
                    Value::Int(last.into()),
                    Value::Int(step.into())
                ][..]
            ),
            "{name}"
        );
        let docs: Value = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(&name)
            .query(&mut c)
            .unwrap();
        let text = format!("{docs:?}");
        assert!(text.contains(d.summary.to_str().unwrap()), "{name}: {text}");
        for arg in d.args {
            assert!(
                text.contains(arg.name.to_str().unwrap()),
                "{name} documents {:?}: {text}",
                arg.name
            );
        }
    }
}

#[test]
fn two_hundred_racing_clients_admit_exactly_the_limit() {
    let s = Server::with(Options {
        test_clock: true,
        ..Options::default()
    });
    let mut c = s.connect();
    set_clock(&mut c, T0);
    for case in CASES {
        let start = Arc::new(Barrier::new(200));
        let workers: Vec<_> = (0..200)
            .map(|_| {
                let mut conn = s.connect();
                let start = Arc::clone(&start);
                // One call each (a lease id of its own, where the command takes one).
                let argv = case.argv(&format!("{}:race", case.command), case.ten, None);
                std::thread::spawn(move || {
                    start.wait();
                    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                    cmd(&mut conn, &argv)
                })
            })
            .collect();
        let admitted = workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .filter(|r| case.admitted(r))
            .count();
        assert_eq!(admitted, 10, "{}", case.command);
    }
}

#[test]
fn keyspace_events_name_the_write_and_the_expiry_of_a_string_always_of_a_set_when_it_moved() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    cmd(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]).unwrap();
    let mut sub = s.connect();
    let mut events = sub.as_pubsub();
    events.psubscribe("__keyspace@0__:*").unwrap();
    events.subscribe("step").unwrap();
    // The events of one call: everything published before a marker sent after it.
    let mut events_of = |c: &mut Connection, argv: &[String]| -> Vec<String> {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let reply = cmd(c, &argv);
        cmd(c, &["PUBLISH", "step", "end"]).unwrap();
        let mut seen = Vec::new();
        loop {
            let m = events.get_message().unwrap();
            if m.get_channel_name() == "step" {
                return seen;
            }
            seen.push(m.get_payload::<String>().unwrap());
            assert!(reply.is_ok(), "{argv:?}: {reply:?}");
        }
    };
    let mut moved_and_not = (0, 0);
    for case in CASES {
        let write = if case.kind == "zset" { "zadd" } else { "set" };
        let key = format!("{}:events", case.command);
        let first = case.argv(&key, case.ten, None);
        assert_eq!(
            events_of(&mut c, &first),
            [write, "expire"],
            "{}",
            case.command
        );
        // At the same instant the expiry moves for some limiters and not for others. A string
        // is written as `SET ... PXAT` is, so it names its expiry every time; a sorted set only
        // when it moved (its `PEXPIREAT` is a command of its own).
        let before = pexpiretime(&mut c, &key);
        let seen = events_of(&mut c, &first);
        let moved = pexpiretime(&mut c, &key) != before;
        if case.kind != "zset" {
            moved_and_not.0 += usize::from(moved);
            moved_and_not.1 += usize::from(!moved);
            assert_eq!(seen, [write, "expire"], "{}", case.command);
        } else if !moved {
            moved_and_not.1 += 1;
            assert_eq!(seen, [write], "{}: unmoved expiry", case.command);
        } else {
            moved_and_not.0 += 1;
            assert_eq!(seen, [write, "expire"], "{}", case.command);
        }
        if case.peeks {
            let peek = case.argv(&key, case.ten, Some("0"));
            assert_eq!(
                events_of(&mut c, &peek),
                Vec::<String>::new(),
                "{} peek",
                case.command
            );
        }
        let full = format!("{}:full", case.command);
        events_of(&mut c, &case.argv(&full, case.one, None));
        let denied = case.argv(&full, case.one, None);
        assert_eq!(
            events_of(&mut c, &denied),
            Vec::<String>::new(),
            "{} denial",
            case.command
        );
    }
    assert!(
        moved_and_not.0 > 0 && moved_and_not.1 > 0,
        "{moved_and_not:?}"
    );
}

#[test]
fn every_command_reaches_a_replica_as_its_effects_only() {
    for case in CASES {
        harness::replication::ReplicationCheck { case }.run();
    }
}
