//! RL.ALL on a real redis-server: several limits in one call, all or none.

mod harness;

use harness::*;
use redis::{Connection, Value};

fn all(c: &mut Connection, args: &[&str]) -> Reply {
    let mut full = vec!["RL.ALL"];
    full.extend_from_slice(args);
    cmd(c, &full)
}

/// `[allowed, denied_by, [..5], [..5], ...]` as nested vectors.
fn shape(reply: &Reply) -> (i64, i64, Vec<Vec<i64>>) {
    let Ok(Value::Array(items)) = reply else {
        panic!("not an array: {reply:?}")
    };
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    };
    let nested = items[2..].iter().map(|v| ints(&Ok(v.clone()))).collect();
    (int(&items[0]), int(&items[1]), nested)
}

const LOGIN: [&str; 9] = [
    "2",
    "route:login:ip1",
    "client:ip1",
    "TOKENBUCKET",
    "3",
    "1",
    "TOKENBUCKET",
    "5",
    "1",
];
const SEARCH: [&str; 9] = [
    "2",
    "route:search:ip1",
    "client:ip1",
    "TOKENBUCKET",
    "3",
    "1",
    "TOKENBUCKET",
    "5",
    "1",
];

#[test]
fn a_route_limit_and_a_client_limit_consume_together_or_not_at_all() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    assert_eq!(
        shape(&all(&mut c, &LOGIN)),
        (1, 0, vec![vec![1, 2, 0, 1000, 3], vec![1, 4, 0, 1000, 5]])
    );
    all(&mut c, &LOGIN).unwrap();
    assert_eq!(
        shape(&all(&mut c, &LOGIN)),
        (1, 0, vec![vec![1, 0, 0, 3000, 3], vec![1, 2, 0, 3000, 5]])
    );

    // The route limit is spent: denied by limit 1; the client limit reports its unconsumed state.
    let before = (
        stored(&mut c, "route:login:ip1"),
        stored(&mut c, "client:ip1"),
    );
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    assert_eq!(
        shape(&all(&mut c, &LOGIN)),
        (
            0,
            1,
            vec![vec![0, 0, 1000, 3000, 3], vec![1, 2, 0, 3000, 5]]
        )
    );
    assert_eq!(
        (
            stored(&mut c, "route:login:ip1"),
            stored(&mut c, "client:ip1")
        ),
        before
    );
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );

    // Another route for the same client: two more, then the client limit denies (limit 2).
    all(&mut c, &SEARCH).unwrap();
    all(&mut c, &SEARCH).unwrap();
    assert_eq!(
        shape(&all(&mut c, &SEARCH)),
        (
            0,
            2,
            vec![vec![1, 1, 0, 2000, 3], vec![0, 0, 1000, 5000, 5]]
        )
    );
    assert_eq!(
        string_bytes(&mut c, "route:search:ip1")
            .split(|&b| b == b' ')
            .nth(1),
        Some(&b"1"[..]),
        "the route kept its token"
    );

    advance_clock(&mut c, 1_000_000);
    assert_eq!(
        shape(&all(&mut c, &LOGIN)).0,
        1,
        "one token back on both after a second"
    );
}

#[test]
fn cost_applies_to_every_limit() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let r = all(
        &mut c,
        &[
            "2",
            "a",
            "b",
            "TOKENBUCKET",
            "10",
            "1",
            "tokenbucket",
            "4",
            "1",
            "COST",
            "3",
        ],
    );
    assert_eq!(
        shape(&r),
        (1, 0, vec![vec![1, 7, 0, 3000, 10], vec![1, 1, 0, 3000, 4]])
    );
    let r = all(
        &mut c,
        &[
            "2",
            "a",
            "b",
            "TOKENBUCKET",
            "10",
            "1",
            "TOKENBUCKET",
            "4",
            "1",
            "cost",
            "0",
        ],
    );
    assert_eq!(
        shape(&r),
        (1, 0, vec![vec![1, 7, 0, 3000, 10], vec![1, 1, 0, 3000, 4]]),
        "cost 0 peeks"
    );
}

#[test]
fn bad_calls_get_clear_errors() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let cases: &[(&[&str], &str)] = &[
        (&["1"], "ERR wrong number of arguments for 'rl.all' command"),
        (
            &["1", "a", "TOKENBUCKET"],
            "ERR wrong number of arguments for 'rl.all' command",
        ),
        (
            &["0", "a", "TOKENBUCKET", "1", "1"],
            "ERR numkeys must be an integer between 1 and 16",
        ),
        (
            &["x", "a", "TOKENBUCKET", "1", "1"],
            "ERR numkeys must be an integer between 1 and 16",
        ),
        (
            &["9", "a", "b", "c", "d"],
            "ERR wrong number of arguments for 'rl.all' command",
        ),
        (
            &["1", "a", "BUCKET", "1", "1"],
            "ERR unknown algorithm, expected one of: TOKENBUCKET LEAKYBUCKET FIXEDWINDOW SLIDINGWINDOW GCRA SLIDINGLOG CONCURRENCY",
        ),
        (
            &["1", "a", "TOKENBUCKET", "1", "1", "TOKENBUCKET"],
            "ERR the number of limits must equal numkeys",
        ),
        (
            &["1", "a", "TOKENBUCKET", "1"],
            "ERR wrong number of arguments for 'rl.all' command",
        ),
        (
            &["2", "a", "b", "TOKENBUCKET", "1", "1"],
            "ERR the number of limits must equal numkeys",
        ),
        (
            &[
                "2",
                "a",
                "a",
                "TOKENBUCKET",
                "1",
                "1",
                "TOKENBUCKET",
                "1",
                "1",
            ],
            "ERR each limit needs its own key",
        ),
        (
            &["1", "a", "TOKENBUCKET", "0", "1"],
            "ERR capacity must be between 1 and 1000000000000000",
        ),
        (
            &["1", "a", "TOKENBUCKET", "1", "1", "COST", "x"],
            "ERR cost must be an integer",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(all(&mut c, args), Err(expected.to_string()), "{args:?}");
    }
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert!(
        all(
            &mut c,
            &[
                "2",
                "a",
                "list",
                "TOKENBUCKET",
                "1",
                "1",
                "TOKENBUCKET",
                "1",
                "1"
            ]
        )
        .unwrap_err()
        .starts_with("WRONGTYPE")
    );
    assert_eq!(
        cmd(&mut c, &["EXISTS", "a"]),
        Ok(Value::Int(0)),
        "nothing written when a later key is bad"
    );
}

#[test]
fn keys_are_declared_for_cluster_routing_and_acl() {
    let s = Server::start();
    let mut c = s.connect();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.ALL")
        .arg(2)
        .arg("route:1")
        .arg("client:1")
        .arg("TOKENBUCKET")
        .arg(1)
        .arg(1)
        .arg("TOKENBUCKET")
        .arg(1)
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["route:1", "client:1"]);
    // Only keys: numkeys names the keys, and one that names more than the arguments after it
    // reports none (it used to report the words that followed as keys).
    for call in [
        &["RL.ALL", "5", "k1", "TOKENBUCKET", "5", "1"][..],
        &["RL.ALL", "16", "k1", "TOKENBUCKET", "5", "1"],
        &[
            "RL.SETTLE",
            "7",
            "k1",
            "TOKENBUCKET",
            "5",
            "1",
            "DELTA",
            "1",
        ],
    ] {
        let mut argv = vec!["COMMAND", "GETKEYS"];
        argv.extend(call);
        assert_eq!(
            cmd(&mut c, &argv),
            Err("ERR Invalid arguments specified for command".to_string()),
            "{call:?}"
        );
    }
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "RL.SETTLE", "2", "a", "b", "GCRA", "1", "1", "1"])
        .arg(&["TOKENBUCKET", "5", "1", "DELTA", "-1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["a", "b"]);
}

/// A call with far more limits than keys is refused at the first limit too many, before the
/// others are read: within the per-call budget (SLOWLOG), where reading 100,000 limits took
/// tens of milliseconds. The twins refuse it with the same error.
#[test]
fn far_more_limits_than_keys_are_refused_before_they_are_read() {
    let s = Server::start();
    let mut c = s.connect();
    let all_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script("all.lua"))
        .query(&mut c)
        .unwrap();
    let settle_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script("settle.lua"))
        .query(&mut c)
        .unwrap();
    let mut limits: Vec<&str> = Vec::new();
    for _ in 0..100_000 {
        limits.extend(["TOKENBUCKET", "10", "5"]);
    }
    let count = Err("ERR the number of limits must equal numkeys".to_string());
    cmd(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]).unwrap();
    for (command, tail) in [("RL.ALL", &[][..]), ("RL.SETTLE", &["DELTA", "1"][..])] {
        cmd(&mut c, &["SLOWLOG", "RESET"]).unwrap();
        let argv: Vec<&str> = [&[command, "1", "k"][..], &limits, tail].concat();
        assert_eq!(cmd(&mut c, &argv), count, "{command}");
        let log: Vec<Vec<Value>> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(1)
            .query(&mut c)
            .unwrap();
        let Value::Int(us) = log[0][2] else {
            panic!("{log:?}");
        };
        assert!(us < 10_000, "{command} took {us} µs");
        eprintln!("{command} 1 k + 100,000 limits: {us} µs");
        let sha = if command == "RL.ALL" {
            &all_sha
        } else {
            &settle_sha
        };
        let twin: Vec<&str> = [&["EVALSHA", sha.as_str(), "1", "k"][..], &limits, tail].concat();
        assert_eq!(cmd(&mut c, &twin), count, "{command}'s twin");
    }
    assert_eq!(cmd(&mut c, &["EXISTS", "k"]), Ok(Value::Int(0)));
}

#[test]
fn both_keys_reach_the_replica_as_effects() {
    let master = Server::with_test_clock();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.connect();
    for _ in 0..4 {
        all(&mut m, &LOGIN).unwrap();
        advance_clock(&mut m, 250_000);
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.connect();
    for key in ["route:login:ip1", "client:ip1"] {
        assert_eq!(stored(&mut r, key), stored(&mut m, key));
        assert_eq!(stored(&mut m, key).0, "string");
        assert_eq!(pexpiretime(&mut r, key), pexpiretime(&mut m, key));
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut r)
        .unwrap();
    assert!(!stats.contains("rl.all"), "{stats}");
}
