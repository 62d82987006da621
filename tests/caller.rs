//! What a caller allowed the limiter commands, and nothing else, can and cannot do to the server:
//! every key stays within its bound however it is charged, nothing the module writes is
//! unreadable by it, several limits are written all or none also near `maxmemory`, every call's
//! work is bounded (its time at the largest arguments is in `make bench`), data the module did not write is neither deleted nor reinterpreted, and a
//! stored time no call could have written is an error (one a little ahead, as after a failover to
//! a server whose clock is behind, is carried on from, and the waits replied count from it).

mod harness;

use harness::{Server, cmd, info_field, ints, pexpiretime, set_clock, string_bytes, zset_bytes};
use redis::{Connection, Value};

const T0: i64 = 1_900_000_000_000_000;

/// The integers of a reply, nested arrays flattened.
fn flat(reply: &harness::Reply) -> Vec<i64> {
    fn walk(v: &Value, out: &mut Vec<i64>) {
        match v {
            Value::Int(i) => out.push(*i),
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            other => panic!("not an integer: {other:?}"),
        }
    }
    let mut out = Vec::new();
    walk(reply.as_ref().expect("a reply"), &mut out);
    out
}

fn zcard(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(c).unwrap()
}

#[test]
fn settlements_never_grow_a_sliding_log_past_its_limit() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // A charge larger than one call adds is refused, and writes nothing.
    assert_eq!(
        cmd(
            &mut c,
            &[
                "RL.SETTLE",
                "1",
                "st:log",
                "SLIDINGLOG",
                "10000",
                "10000000000",
                "DELTA",
                "10000"
            ]
        ),
        Err(
            "ERR DELTA must be between -1000 and 1000 for a sliding log (one entry per unit)"
                .into()
        )
    );
    assert_eq!(cmd(&mut c, &["EXISTS", "st:log"]), Ok(Value::Int(0)));
    // Charges fill the log up to its limit and no further: a log has no debt.
    for _ in 0..5 {
        let reply = cmd(
            &mut c,
            &[
                "RL.SETTLE",
                "1",
                "st:log",
                "SLIDINGLOG",
                "100",
                "10000000000",
                "DELTA",
                "1000",
            ],
        );
        assert_eq!(flat(&reply), [1, 0, 0, 10_000_000_000_000, 100]);
        assert_eq!(zcard(&mut c, "st:log"), 100);
    }
    // The largest log: 10 charges of 1,000 fill it, the next ones add nothing.
    for i in 1..=12 {
        cmd(
            &mut c,
            &[
                "RL.SETTLE",
                "1",
                "big",
                "SLIDINGLOG",
                "10000",
                "10000000000",
                "DELTA",
                "1000",
            ],
        )
        .unwrap();
        assert_eq!(zcard(&mut c, "big"), (i * 1000).min(10_000));
    }
    // A second on, a call with a window of 1 ms counts with ZCOUNT and removes 128 of the
    // entries that left its window, not all 10,000 (the time each call takes at the largest
    // arguments is measured by `make bench`).
    harness::advance_clock(&mut c, 1_000_000);
    assert_eq!(
        ints(&cmd(&mut c, &["RL.SLIDINGLOG", "big", "1", "0.001", "1"])),
        [1, 0, 0, 1, 1]
    );
    assert_eq!(zcard(&mut c, "big"), 10_000 - 128 + 1);
}

#[test]
fn settlements_keep_every_value_readable() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let huge = "1000000000000000";
    for _ in 0..3 {
        let reply = cmd(
            &mut c,
            &[
                "RL.SETTLE",
                "1",
                "swd",
                "SLIDINGWINDOW",
                "10",
                "10000000000",
                "DELTA",
                huge,
            ],
        );
        assert_eq!(flat(&reply)[4], 10);
        let reply = cmd(
            &mut c,
            &[
                "RL.SETTLE",
                "1",
                "fwd",
                "FIXEDWINDOW",
                "10",
                "10000000000",
                "DELTA",
                huge,
            ],
        );
        assert_eq!(flat(&reply)[4], 10);
    }
    // Each count stops at twice its limit, and every later call reads it (the sliding window's
    // windows are aligned to their length: this one started at 0).
    assert_eq!(string_bytes(&mut c, "swd"), b"sw 0 20 0".to_vec());
    assert_eq!(
        string_bytes(&mut c, "fwd"),
        b"fw 20 1900000000000000".to_vec()
    );
    assert_eq!(
        ints(&cmd(
            &mut c,
            &["RL.SLIDINGWINDOW", "swd", "10", "10000000000"]
        )),
        [0, 0, 13_600_000_000_000, 18_100_000_000_000, 10]
    );
    assert_eq!(
        flat(&cmd(
            &mut c,
            &[
                "RL.SETTLE",
                "1",
                "swd",
                "SLIDINGWINDOW",
                "10",
                "10000000000",
                "DELTA",
                "-15"
            ]
        )),
        [1, 5, 0, 18_100_000_000_000, 10]
    );
    assert_eq!(
        ints(&cmd(
            &mut c,
            &["RL.FIXEDWINDOW", "fwd", "10", "10000000000"]
        )),
        [0, 0, 10_000_000_000_000, 10_000_000_000_000, 10]
    );
    // The leaky bucket and the token bucket were bounded already: twice the capacity, one
    // capacity of debt.
    for key in ["lbd", "tbd"] {
        let algorithm = if key == "lbd" {
            "LEAKYBUCKET"
        } else {
            "TOKENBUCKET"
        };
        for _ in 0..3 {
            cmd(
                &mut c,
                &["RL.SETTLE", "1", key, algorithm, "10", "1", "DELTA", huge],
            )
            .unwrap();
        }
    }
    assert_eq!(
        string_bytes(&mut c, "lbd"),
        b"lb 20 1900000000000000".to_vec()
    );
    assert_eq!(
        string_bytes(&mut c, "tbd"),
        b"tb -10 1900000000000000".to_vec()
    );
}

#[test]
fn several_limits_are_written_all_or_none_near_maxmemory() {
    let master = Server::with_test_clock();
    let replica = Server::with_test_clock();
    replica.replicate_from(&master);
    let mut c = master.connect();
    set_clock(&mut c, T0);
    cmd(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();
    let used: i64 = info_field(&mut c, "memory", "used_memory").parse().unwrap();
    // A little room: the first limit's write (1,000 entries, about 100 KB) alone passes it, so a
    // check per write would refuse the second after the first was written.
    cmd(
        &mut c,
        &["CONFIG", "SET", "maxmemory", &(used + 50_000).to_string()],
    )
    .unwrap();
    let all = [
        "RL.ALL",
        "2",
        "{p}a",
        "{p}b",
        "SLIDINGLOG",
        "10000",
        "600",
        "TOKENBUCKET",
        "1000000000",
        "1",
        "COST",
        "1000",
    ];
    assert_eq!(
        flat(&cmd(&mut c, &all)),
        [
            1,
            0,
            1,
            9_000,
            0,
            600_000,
            10_000,
            1,
            999_999_000,
            0,
            1_000_000,
            1_000_000_000
        ]
    );
    assert_eq!(zcard(&mut c, "{p}a"), 1000);
    assert_eq!(cmd(&mut c, &["EXISTS", "{p}b"]), Ok(Value::Int(1)));
    // Now over maxmemory: the next call is refused before anything is written.
    let before = (zset_bytes(&mut c, "{p}a"), string_bytes(&mut c, "{p}b"));
    let oom = "OOM command not allowed when used memory > 'maxmemory'.";
    assert_eq!(cmd(&mut c, &all), Err(oom.into()));
    let settle = [
        "RL.SETTLE",
        "2",
        "{p}a",
        "{p}b",
        "SLIDINGLOG",
        "10000",
        "600",
        "TOKENBUCKET",
        "1000000000",
        "1",
        "DELTA",
        "1000",
    ];
    assert_eq!(cmd(&mut c, &settle), Err(oom.into()));
    assert_eq!(
        (zset_bytes(&mut c, "{p}a"), string_bytes(&mut c, "{p}b")),
        before
    );
    // A peek of both still answers.
    let mut peek = all;
    peek[11] = "0";
    assert_eq!(flat(&cmd(&mut c, &peek))[0], 1);
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    // The replica got exactly what the master wrote.
    let mut r = replica.connect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while zcard(&mut r, "{p}a") != 1000 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        (zset_bytes(&mut r, "{p}a"), string_bytes(&mut r, "{p}b")),
        before
    );
}

#[test]
fn every_call_does_a_bounded_amount_of_work() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // One call combines at most 4 sorted-set limits, which may add 1,000 entries between them.
    let logs = |n: usize, cost: &str| {
        let mut all: Vec<String> = vec!["RL.ALL".into(), n.to_string()];
        all.extend((0..n).map(|i| format!("{{w}}log{i}")));
        for _ in 0..n {
            all.extend(["SLIDINGLOG", "10000", "10000000000"].map(String::from));
        }
        all.extend(["COST".to_string(), cost.to_string()]);
        all
    };
    let call = |c: &mut Connection, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cmd(c, &args)
    };
    assert_eq!(
        call(&mut c, logs(5, "1")),
        Err("ERR a call combines at most 4 SLIDINGLOG and CONCURRENCY limits".into())
    );
    assert_eq!(
        call(&mut c, logs(4, "251")),
        Err("ERR one call adds or removes at most 1000 sliding-log entries: the cost (or UPTO) times the SLIDINGLOG limits is above it".into())
    );
    for _ in 0..10 {
        assert_eq!(flat(&call(&mut c, logs(4, "250")))[0], 1);
    }
    assert_eq!(zcard(&mut c, "{w}log3"), 10 * 250);

    // A lease set of 8,600 expired leases: an acquire removes 128 of them, not all.
    let mut zadd = vec!["ZADD".to_string(), "leases".to_string()];
    for i in 0..8_600 {
        zadd.extend([(T0 - 1_000_000 - i).to_string(), format!("old-{i}")]);
    }
    let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
    cmd(&mut c, &zadd).unwrap();
    cmd(&mut c, &["PEXPIRE", "leases", "100000000"]).unwrap();
    assert_eq!(
        ints(&cmd(&mut c, &["RL.ACQUIRE", "leases", "10", "60", "job"])),
        [1, 9, 0, 60_000, 10]
    );
    assert_eq!(zcard(&mut c, "leases"), 8_600 - 128 + 1);
}

#[test]
fn data_the_module_did_not_write_is_left_alone() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // A sorted set without an expiry is no limiter's.
    cmd(&mut c, &["ZADD", "K", "100", "alice", "200", "bob"]).unwrap();
    let not_ours =
        "WRONGTYPE the key holds a sorted set without an expiry, which no rate limiter writes";
    for call in [
        &["RL.ACQUIRE", "K", "10", "60", "job"][..],
        &["RL.RELEASE", "K", "alice"],
        &["RL.SLIDINGLOG", "K", "10", "60"],
    ] {
        assert_eq!(cmd(&mut c, call), Err(not_ours.into()), "{call:?}");
    }
    assert_eq!(
        zset_bytes(&mut c, "K"),
        [b"alice", &b"100"[..], b"bob", b"200"].map(|b| b.to_vec())
    );
    // Another limiter's state is named, not reinterpreted.
    cmd(&mut c, &["RL.TOKENBUCKET", "tb", "10", "1"]).unwrap();
    let tb = string_bytes(&mut c, "tb");
    assert_eq!(
        cmd(&mut c, &["RL.FIXEDWINDOW", "tb", "10", "60"]),
        Err("WRONGTYPE the key holds RL.TOKENBUCKET state, not RL.FIXEDWINDOW state".into())
    );
    assert_eq!(string_bytes(&mut c, "tb"), tb);
    cmd(&mut c, &["RL.GCRA", "g", "5", "1", "1"]).unwrap();
    let g = string_bytes(&mut c, "g");
    assert_eq!(
        cmd(&mut c, &["CL.THROTTLE", "g", "5", "1", "1"]),
        Err("WRONGTYPE the key holds RL.GCRA state, not CL.THROTTLE state".into())
    );
    assert_eq!(string_bytes(&mut c, "g"), g);
    // RL.GCRA's value from before values had tags: microseconds, which CL.THROTTLE would read
    // as nanoseconds of 1970.
    cmd(
        &mut c,
        &["SET", "old-g", &(T0 + 1_000_000).to_string(), "PX", "1000"],
    )
    .unwrap();
    assert_eq!(
        cmd(&mut c, &["CL.THROTTLE", "old-g", "5", "1", "1"]),
        Err("WRONGTYPE the key holds RL.GCRA state, not CL.THROTTLE state".into())
    );
    assert_eq!(
        ints(&cmd(&mut c, &["RL.GCRA", "old-g", "5", "1", "1"]))[0],
        1
    );
    assert_eq!(
        string_bytes(&mut c, "old-g"),
        format!("gcra {}", T0 + 2_000_000).into_bytes(),
        "tagged on its next write"
    );
    // And CL.THROTTLE's (redis-cell's) nanoseconds are not RL.GCRA's.
    cmd(&mut c, &["CL.THROTTLE", "cell", "5", "1", "1"]).unwrap();
    assert_eq!(
        cmd(&mut c, &["RL.GCRA", "cell", "5", "1", "1"]),
        Err("WRONGTYPE the key holds CL.THROTTLE state, not RL.GCRA state".into())
    );
    // A sliding log is not a lease set, nor the other way round.
    cmd(&mut c, &["RL.SLIDINGLOG", "log", "10", "60", "3"]).unwrap();
    let log = zset_bytes(&mut c, "log");
    assert_eq!(
        cmd(&mut c, &["RL.ACQUIRE", "log", "10", "60", "job"]),
        Err("WRONGTYPE the key holds RL.SLIDINGLOG state, not RL.ACQUIRE state".into())
    );
    assert_eq!(zset_bytes(&mut c, "log"), log);
    cmd(&mut c, &["RL.ACQUIRE", "jobs", "10", "60", "job"]).unwrap();
    assert_eq!(
        cmd(&mut c, &["RL.SLIDINGLOG", "jobs", "10", "60"]),
        Err("WRONGTYPE the key holds RL.ACQUIRE state, not RL.SLIDINGLOG state".into())
    );
    // A hash of release 0.1's layout with a field it never wrote is not upgraded.
    cmd(
        &mut c,
        &[
            "HSET",
            "h",
            "tokens",
            "3",
            "ts",
            &T0.to_string(),
            "note",
            "mine",
        ],
    )
    .unwrap();
    assert_eq!(
        cmd(&mut c, &["RL.TOKENBUCKET", "h", "10", "1"]),
        Err("WRONGTYPE the key holds a hash with fields no rate limiter writes".into())
    );
    let fields: i64 = redis::cmd("HLEN").arg("h").query(&mut c).unwrap();
    assert_eq!(fields, 3);
    // A value of this release without a tag keeps working, and is tagged when next written.
    cmd(
        &mut c,
        &["SET", "untagged", &format!("3 {T0}"), "PX", "10000"],
    )
    .unwrap();
    assert_eq!(
        ints(&cmd(&mut c, &["RL.TOKENBUCKET", "untagged", "10", "1"])),
        [1, 2, 0, 8_000, 10]
    );
    assert_eq!(
        string_bytes(&mut c, "untagged"),
        format!("tb 2 {T0}").into_bytes()
    );
}

#[test]
fn implausible_state_is_an_error_and_a_little_skew_is_carried_on_from() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let year = 365 * 86_400_000_000i64;
    // A window that would start a year from now.
    cmd(&mut c, &["SET", "fw", &format!("5 {}", T0 + year)]).unwrap();
    assert_eq!(
        cmd(&mut c, &["RL.FIXEDWINDOW", "fw", "10", "60"]),
        Err("ERR corrupt rate limiter state: field 'start' is ahead of the server's clock by more than 60 seconds".into())
    );
    assert_eq!(pexpiretime(&mut c, "fw"), -1, "left as it was");
    // A bucket last updated an hour from now.
    cmd(&mut c, &["SET", "tb", &format!("0 {}", T0 + 3_600_000_000)]).unwrap();
    let ts_ahead = "ERR corrupt rate limiter state: field 'ts' is ahead of the server's clock by more than 60 seconds";
    assert_eq!(
        cmd(&mut c, &["RL.TOKENBUCKET", "tb", "10", "1"]),
        Err(ts_ahead.into())
    );
    // A debt deeper than any capacity.
    cmd(&mut c, &["SET", "debt", &format!("-1e308 {T0}")]).unwrap();
    assert_eq!(
        cmd(&mut c, &["RL.TOKENBUCKET", "debt", "10", "1"]),
        Err("ERR corrupt rate limiter state: field 'tokens' is not a valid number".into())
    );
    // Up to a minute ahead (a master whose clock ran ahead of this one): the bucket refills
    // from that time, and the waits replied count from it, exactly.
    for (ahead, expected) in [(60_000_000, Ok(())), (60_000_001, Err(ts_ahead))] {
        cmd(&mut c, &["SET", "skew", &format!("tb 0 {}", T0 + ahead)]).unwrap();
        let reply = cmd(&mut c, &["RL.TOKENBUCKET", "skew", "10", "1"]);
        match expected {
            Ok(()) => assert_eq!(ints(&reply), [0, 0, 61_000, 70_000, 10]),
            Err(e) => assert_eq!(reply, Err(e.into())),
        }
    }
    cmd(
        &mut c,
        &["SET", "skew", &format!("tb 0 {}", T0 + 30_000_000)],
    )
    .unwrap();
    set_clock(&mut c, T0 + 1_000_000);
    assert_eq!(
        ints(&cmd(&mut c, &["RL.TOKENBUCKET", "skew", "10", "1"])),
        [0, 0, 30_000, 39_000, 10]
    );
    set_clock(&mut c, T0 + 30_999_999);
    assert_eq!(
        ints(&cmd(&mut c, &["RL.TOKENBUCKET", "skew", "10", "1"])),
        [0, 0, 1, 9_001, 10]
    );
    set_clock(&mut c, T0 + 31_000_000);
    assert_eq!(
        ints(&cmd(&mut c, &["RL.TOKENBUCKET", "skew", "10", "1"])),
        [1, 0, 0, 10_000, 10],
        "admitted once the wait replied has passed"
    );
}
