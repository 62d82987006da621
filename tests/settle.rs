//! `RL.SETTLE` on a real server under the test clock: the reserve-then-settle example, refunds,
//! charges and debts per algorithm with exact replies (and the next call's exact wait), a missing
//! key, `DELTA 0`, 200 clients reserving and settling at once keeping the exact total, errors that
//! change nothing, and a replica and the AOF that end with the same bytes.

mod harness;

use harness::{
    Options, Server, advance_clock, assert_errors_change_nothing, calls_of, cmd, info_field, ints,
    pexpiretime, set_clock, stored, zset_bytes,
};
use redis::{Connection, Value};

const T0: i64 = 1_900_000_000_000_000;

/// A reply as one list of integers (RL.SETTLE's: five per limit).
fn flat(reply: &harness::Reply) -> Vec<i64> {
    let Ok(Value::Array(items)) = reply else {
        panic!("{reply:?}");
    };
    let mut out = Vec::new();
    for item in items {
        match item {
            Value::Int(i) => out.push(*i),
            inner @ Value::Array(_) => out.extend(ints(&Ok(inner.clone()))),
            other => panic!("{other:?}"),
        }
    }
    out
}

fn run(c: &mut Connection, line: &str) -> Vec<i64> {
    let args: Vec<&str> = line.split(' ').collect();
    flat(&cmd(c, &args))
}

/// Each line and the reply it must get, in order, on one server whose clock stands at `T0`
/// (`+N` lines move it on by N µs).
fn script(lines: &[(&str, &[i64])]) -> (Server, Connection) {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    for (line, expected) in lines {
        if let Some(us) = line.strip_prefix('+') {
            advance_clock(&mut c, us.parse().unwrap());
            continue;
        }
        assert_eq!(run(&mut c, line), *expected, "{line}");
    }
    (s, c)
}

#[test]
fn the_token_budget_example_holds() {
    let (_s, mut c) = script(&[
        (
            "RL.TOKENBUCKET llm 10000 100 4000",
            &[1, 6000, 0, 40000, 10000],
        ),
        (
            "RL.SETTLE 1 llm TOKENBUCKET 10000 100 DELTA -2800",
            &[1, 8800, 0, 12000, 10000],
        ),
        (
            "RL.SETTLE 1 llm TOKENBUCKET 10000 100 DELTA -5000",
            &[1, 10000, 0, 0, 10000],
        ),
        (
            "RL.SETTLE 1 llm TOKENBUCKET 10000 100 DELTA 10500",
            &[1, 0, 0, 105000, 10000],
        ),
        (
            "RL.TOKENBUCKET llm 10000 100 1",
            &[0, 0, 5010, 105000, 10000],
        ),
        ("+5009999", &[]),
        ("RL.TOKENBUCKET llm 10000 100 1", &[0, 0, 1, 99991, 10000]),
        ("+1", &[]),
        ("RL.TOKENBUCKET llm 10000 100 1", &[1, 0, 0, 100000, 10000]),
    ]);
    // The debt is stored as negative tokens; module and twin read it back alike.
    assert_eq!(
        stored(&mut c, "llm").1[0],
        b"tb 0 1900000005010000".to_vec()
    );
}

#[test]
fn every_algorithm_refunds_charges_and_pays_back_a_debt_exactly() {
    let (_s, mut c) = script(&[
        // Leaky bucket: a refund never below 0, a charge above capacity (to twice it at most).
        ("RL.LEAKYBUCKET lb 10 1 4", &[1, 6, 0, 4000, 10]),
        (
            "RL.SETTLE 1 lb LEAKYBUCKET 10 1 DELTA -1",
            &[1, 7, 0, 3000, 10],
        ),
        (
            "RL.SETTLE 1 lb LEAKYBUCKET 10 1 DELTA 15",
            &[1, 0, 0, 18000, 10],
        ),
        ("RL.LEAKYBUCKET lb 10 1 1", &[0, 0, 9000, 18000, 10]),
        (
            "RL.SETTLE 1 lb LEAKYBUCKET 10 1 DELTA 100",
            &[1, 0, 0, 20000, 10],
        ),
        (
            "RL.SETTLE 1 lb LEAKYBUCKET 10 1 DELTA -100",
            &[1, 10, 0, 0, 10],
        ),
        // Fixed window: the current window's count; after it ended a refund does nothing and a
        // charge opens a new window.
        ("RL.FIXEDWINDOW fw 5 10 3", &[1, 2, 0, 10000, 5]),
        (
            "RL.SETTLE 1 fw FIXEDWINDOW 5 10 DELTA -2",
            &[1, 4, 0, 10000, 5],
        ),
        (
            "RL.SETTLE 1 fw FIXEDWINDOW 5 10 DELTA 6",
            &[1, 0, 0, 10000, 5],
        ),
        ("RL.FIXEDWINDOW fw 5 10", &[0, 0, 10000, 10000, 5]),
        // Sliding window: the current window's counter.
        ("RL.SLIDINGWINDOW sw 10 10 4", &[1, 6, 0, 20000, 10]),
        (
            "RL.SETTLE 1 sw SLIDINGWINDOW 10 10 DELTA -1",
            &[1, 7, 0, 20000, 10],
        ),
        (
            "RL.SETTLE 1 sw SLIDINGWINDOW 10 10 DELTA 20",
            &[1, 0, 0, 20000, 10],
        ),
        // The window's count stops at twice its limit (3 + 20 is 20): it is paid back a
        // window and a half on.
        ("RL.SLIDINGWINDOW sw 10 10", &[0, 0, 15500, 20000, 10]),
        // GCRA: the theoretical arrival time moves by whole emission intervals.
        ("RL.GCRA g 4 1 1", &[1, 4, 0, 1000, 5]),
        ("RL.SETTLE 1 g GCRA 4 1 1 DELTA 2", &[1, 2, 0, 3000, 5]),
        ("RL.SETTLE 1 g GCRA 4 1 1 DELTA -10", &[1, 5, 0, 0, 5]),
        ("RL.SETTLE 1 g GCRA 4 1 1 DELTA -1", &[1, 5, 0, 0, 5]),
        ("RL.SETTLE 1 g GCRA 4 1 1 DELTA 20", &[1, 0, 0, 10000, 5]),
        ("RL.GCRA g 4 1 1", &[0, 0, 6000, 10000, 5]),
        // Sliding log: a charge adds entries at the call time, a refund removes the newest.
        ("RL.SLIDINGLOG sl 3 10 2", &[1, 1, 0, 10000, 3]),
        ("+1000000", &[]),
        (
            "RL.SETTLE 1 sl SLIDINGLOG 3 10 DELTA 1",
            &[1, 0, 0, 10000, 3],
        ),
        (
            "RL.SETTLE 1 sl SLIDINGLOG 3 10 DELTA -2",
            &[1, 2, 0, 9000, 3],
        ),
    ]);
    assert_eq!(
        zset_bytes(&mut c, "sl"),
        [b"1900000000000000:0".to_vec(), b"1900000000000000".to_vec()]
    );
    assert_eq!(pexpiretime(&mut c, "sl"), T0 / 1000 + 10_000);
    // Refunding more than there is empties the log, and the key goes with its last entry.
    assert_eq!(
        run(&mut c, "RL.SETTLE 1 sl SLIDINGLOG 3 10 DELTA -5"),
        [1, 3, 0, 0, 3]
    );
    assert_eq!(cmd(&mut c, &["EXISTS", "sl"]), Ok(Value::Int(0)));
    // Ten seconds on, the fixed window has ended: a refund does nothing, a charge opens one.
    advance_clock(&mut c, 9_000_000);
    assert_eq!(
        run(&mut c, "RL.SETTLE 1 fw FIXEDWINDOW 5 10 DELTA -3"),
        [1, 5, 0, 0, 5]
    );
    assert_eq!(
        run(&mut c, "RL.SETTLE 1 fw FIXEDWINDOW 5 10 DELTA 2"),
        [1, 3, 0, 10000, 5]
    );
}

#[test]
fn several_limits_settle_at_once_and_missing_keys_only_take_charges() {
    let (_s, mut c) = script(&[
        (
            "RL.SETTLE 2 a b TOKENBUCKET 10 1 SLIDINGLOG 5 60 DELTA 3",
            &[1, 7, 0, 3000, 10, 1, 2, 0, 60000, 5],
        ),
        (
            "RL.SETTLE 1 nothing TOKENBUCKET 10 1 DELTA -5",
            &[1, 10, 0, 0, 10],
        ),
        (
            "RL.SETTLE 1 nothing SLIDINGLOG 5 60 DELTA -5",
            &[1, 5, 0, 0, 5],
        ),
        ("RL.SETTLE 1 nothing GCRA 1 1 1 DELTA -5", &[1, 2, 0, 0, 2]),
    ]);
    assert_eq!(cmd(&mut c, &["EXISTS", "nothing"]), Ok(Value::Int(0)));
    assert_eq!(cmd(&mut c, &["ZCARD", "b"]), Ok(Value::Int(3)));
    // DELTA 0 reports and writes nothing.
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    let before = (stored(&mut c, "a"), stored(&mut c, "b"));
    assert_eq!(
        run(
            &mut c,
            "RL.SETTLE 2 a b TOKENBUCKET 10 1 SLIDINGLOG 5 60 DELTA 0"
        ),
        [1, 7, 0, 3000, 10, 1, 2, 0, 60000, 5]
    );
    assert_eq!((stored(&mut c, "a"), stored(&mut c, "b")), before);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
}

#[test]
fn two_hundred_clients_reserving_and_settling_at_once_keep_the_exact_total() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let start = std::sync::Arc::new(std::sync::Barrier::new(200));
    let workers: Vec<_> = (0..200)
        .map(|i| {
            let mut conn = s.connect();
            let start = std::sync::Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                // Reserve 100, use i % 50.
                let reserved = run(&mut conn, "RL.TOKENBUCKET budget 1000000 1 100");
                assert_eq!(reserved[0], 1);
                let delta = (i % 50) - 100;
                run(
                    &mut conn,
                    &format!("RL.SETTLE 1 budget TOKENBUCKET 1000000 1 DELTA {delta}"),
                )
            })
        })
        .collect();
    for w in workers {
        assert_eq!(w.join().expect("worker")[0], 1);
    }
    let used: i64 = (0..200).map(|i| i % 50).sum();
    assert_eq!(used, 4900);
    assert_eq!(
        run(&mut c, "RL.TOKENBUCKET budget 1000000 1 0"),
        [1, 1_000_000 - used, 0, used * 1000, 1_000_000]
    );
}

#[test]
fn bad_calls_are_errors_that_change_nothing() {
    let (_s, mut c) = script(&[("RL.TOKENBUCKET k 10 1 3", &[1, 7, 0, 3000, 10])]);
    let arity = "ERR wrong number of arguments for 'rl.settle' command";
    let missing = "ERR wrong number of arguments for 'rl.settle' command: numkeys limits and DELTA n must follow the keys";
    assert_errors_change_nothing(
        &mut c,
        "RL.SETTLE",
        "k",
        &[
            (&["1", "k", "TOKENBUCKET", "10", "1", "DELTA"], arity),
            (&["5", "k", "a", "b", "c", "d", "e"], missing),
            (
                &["2", "k", "j", "TOKENBUCKET", "10", "1", "DELTA", "1"],
                missing,
            ),
            (&["1", "k", "GCRA", "10", "1", "DELTA", "1"], arity),
            (
                &["1", "k", "TOKENBUCKET", "10", "1", "COST", "1"],
                "ERR the call must end with DELTA n",
            ),
            (
                &["1", "k", "TOKENBUCKET", "10", "1", "DELTA", "x"],
                "ERR DELTA must be an integer",
            ),
            (
                &[
                    "1",
                    "k",
                    "TOKENBUCKET",
                    "10",
                    "1",
                    "DELTA",
                    "1000000000000001",
                ],
                "ERR DELTA must be between -1000000000000000 and 1000000000000000",
            ),
            (
                &["1", "k", "TOKENBUCKET", "0", "1", "DELTA", "1"],
                "ERR capacity must be between 1 and 1000000000000000",
            ),
            (
                &["1", "k", "CONCURRENCY", "1", "1", "DELTA", "1"],
                "ERR unknown algorithm, expected one of: TOKENBUCKET LEAKYBUCKET FIXEDWINDOW SLIDINGWINDOW GCRA SLIDINGLOG",
            ),
            (
                &[
                    "2",
                    "k",
                    "k",
                    "TOKENBUCKET",
                    "10",
                    "1",
                    "GCRA",
                    "1",
                    "1",
                    "1",
                    "DELTA",
                    "1",
                ],
                "ERR each limit needs its own key",
            ),
        ],
    );
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert_errors_change_nothing(
        &mut c,
        "RL.SETTLE",
        "k",
        &[(
            &[
                "2",
                "k",
                "list",
                "TOKENBUCKET",
                "10",
                "1",
                "TOKENBUCKET",
                "10",
                "1",
                "DELTA",
                "-1",
            ],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        )],
    );
    cmd(&mut c, &["SET", "bad", "x 1"]).unwrap();
    assert_errors_change_nothing(
        &mut c,
        "RL.SETTLE",
        "k",
        &[(
            &[
                "2",
                "k",
                "bad",
                "TOKENBUCKET",
                "10",
                "1",
                "TOKENBUCKET",
                "10",
                "1",
                "DELTA",
                "2",
            ],
            "ERR corrupt rate limiter state: field 'tokens' is not a valid number",
        )],
    );
    assert_eq!(stored(&mut c, "bad").1, [b"x 1".to_vec()]);
    assert_eq!(
        info_field(&mut c, "ratelimit", "ratelimit_rl_settle"),
        "calls=11,allowed=0,denied=0,errors=11,args=9,wrongtype=1,corrupt=1,oom=0,internal=0"
    );
}

#[test]
fn a_replica_and_the_aof_end_with_the_same_settled_state() {
    let opts = Options {
        test_clock: true,
        extra: vec!["--appendonly".into(), "yes".into()],
        ..Options::default()
    };
    let master = Server::with(opts.clone());
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.connect();
    set_clock(&mut m, T0);
    let limits = [
        ("tb", "TOKENBUCKET 20 5", "RL.TOKENBUCKET tb 20 5 4"),
        ("lb", "LEAKYBUCKET 20 5", "RL.LEAKYBUCKET lb 20 5 4"),
        ("fw", "FIXEDWINDOW 20 2", "RL.FIXEDWINDOW fw 20 2 4"),
        ("sw", "SLIDINGWINDOW 20 2", "RL.SLIDINGWINDOW sw 20 2 4"),
        ("g", "GCRA 19 5 1", "RL.GCRA g 19 5 1 4"),
        ("sl", "SLIDINGLOG 20 2", "RL.SLIDINGLOG sl 20 2 4"),
    ];
    for i in 0..60i64 {
        let (key, limit, reserve) = limits[(i % 6) as usize];
        run(&mut m, reserve);
        // Each key is refunded and charged in turn, and ends with a charge.
        let sign = if (i / 6) % 2 == 0 { 1 } else { -1 };
        let delta = sign * [-3, 2, -1, 7, 0, -9][(i % 6) as usize] * (1 + i % 4);
        run(&mut m, &format!("RL.SETTLE 1 {key} {limit} DELTA {delta}"));
        advance_clock(&mut m, 123_457);
    }
    let snapshot = |c: &mut Connection| -> Vec<(harness::Stored, i64)> {
        limits
            .iter()
            .map(|(k, _, _)| (stored(c, k), pexpiretime(c, k)))
            .collect()
    };
    let before = snapshot(&mut m);
    assert!(before.iter().all(|(s, _)| !s.1.is_empty()), "{before:?}");
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.connect();
    assert_eq!(snapshot(&mut r), before);
    for effect in ["set", "zadd", "zremrangebyrank"] {
        assert!(calls_of(&mut r, effect) > 0, "the replica ran no {effect}");
    }
    assert_eq!(
        calls_of(&mut r, "rl.settle"),
        0,
        "the replica ran rl.settle"
    );
    drop((m, r));
    let dir = master.stop();
    let master = Server::start_in(dir, opts);
    let mut m = master.connect();
    assert_eq!(snapshot(&mut m), before, "the AOF replays the same state");
}
