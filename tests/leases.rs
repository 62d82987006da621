//! `RL.ACQUIRE` and `RL.RELEASE` on a real server under the test clock: exactly `limit` of 200
//! racing holders, and exactly `k` more after `k` releases; a lease that is never released frees
//! its slot at its expiry and not a microsecond before; a heartbeat keeps a lease; a lowered limit
//! waits for enough expiries; releases; errors that change nothing; keyspace events; `RL.ALL`
//! all or nothing with a concurrency limit; and a replica and the AOF that end with the same bytes
//! (what the shared table of `tests/conformance.rs` does not cover).

mod harness;

use harness::{
    Options, Server, advance_clock, assert_errors_change_nothing, calls_of, cmd, info_field, ints,
    pexpiretime, set_clock, stored, zset_bytes,
};
use redis::{Connection, Value};

const T0: i64 = 1_900_000_000_000_000;

fn acquire(c: &mut Connection, key: &str, limit: &str, lease: &str, id: &str) -> Vec<i64> {
    ints(&cmd(c, &["RL.ACQUIRE", key, limit, lease, id]))
}

fn release(c: &mut Connection, key: &str, id: &str) -> Value {
    cmd(c, &["RL.RELEASE", key, id]).expect("RL.RELEASE")
}

/// `clients` connections each acquire with an id of their own, all at once; how many got in.
fn racing_acquires(s: &Server, clients: usize, key: &str, limit: &str, prefix: &str) -> usize {
    let start = std::sync::Arc::new(std::sync::Barrier::new(clients));
    let workers: Vec<_> = (0..clients)
        .map(|i| {
            let mut c = s.connect();
            let start = std::sync::Arc::clone(&start);
            let (key, limit, id) = (key.to_string(), limit.to_string(), format!("{prefix}{i}"));
            std::thread::spawn(move || {
                start.wait();
                acquire(&mut c, &key, &limit, "60", &id)[0]
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .filter(|&a| a == 1)
        .count()
}

#[test]
fn two_hundred_racing_holders_get_exactly_the_limit_and_releases_let_exactly_as_many_in() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(racing_acquires(&s, 200, "jobs", "10", "first-"), 10);
    let holders: Vec<String> = zset_bytes(&mut c, "jobs")
        .chunks(2)
        .map(|e| String::from_utf8(e[0].clone()).unwrap())
        .collect();
    assert_eq!(holders.len(), 10, "{holders:?}");
    for id in holders.iter().take(3) {
        assert_eq!(release(&mut c, "jobs", id), Value::Int(1));
    }
    assert_eq!(racing_acquires(&s, 200, "jobs", "10", "second-"), 3);
    // Full again: the next one waits for the oldest lease, 60 s away.
    assert_eq!(
        acquire(&mut c, "jobs", "10", "60", "late"),
        [0, 0, 60_000, 60_000, 10]
    );
}

#[test]
fn a_lease_never_released_frees_its_slot_at_its_expiry_exactly() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(
        acquire(&mut c, "gpu", "1", "1.5", "crashed"),
        [1, 0, 0, 1500, 1]
    );
    assert_eq!(pexpiretime(&mut c, "gpu"), (T0 + 1_500_000) / 1000);
    set_clock(&mut c, T0 + 1_499_999);
    assert_eq!(acquire(&mut c, "gpu", "1", "1.5", "next"), [0, 0, 1, 1, 1]);
    set_clock(&mut c, T0 + 1_500_000);
    assert_eq!(
        acquire(&mut c, "gpu", "1", "1.5", "next"),
        [1, 0, 0, 1500, 1]
    );
    // The expired lease left with that write; the holder's own release now finds nothing.
    assert_eq!(
        zset_bytes(&mut c, "gpu"),
        [b"next".to_vec(), (T0 + 3_000_000).to_string().into_bytes()]
    );
    assert_eq!(release(&mut c, "gpu", "crashed"), Value::Int(0));
}

#[test]
fn a_heartbeat_keeps_a_lease_and_a_lowered_limit_waits_for_enough_expiries() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(acquire(&mut c, "w", "2", "1", "a"), [1, 1, 0, 1000, 2]);
    advance_clock(&mut c, 900_000);
    // Renewed: still one slot taken, now until T0 + 1.9 s.
    assert_eq!(acquire(&mut c, "w", "2", "1", "a"), [1, 1, 0, 1000, 2]);
    advance_clock(&mut c, 600_000);
    assert_eq!(acquire(&mut c, "w", "2", "1", "b"), [1, 0, 0, 1000, 2]);
    assert_eq!(acquire(&mut c, "w", "2", "1", "c"), [0, 0, 400, 1000, 2]);
    // Limit lowered to 1 while 2 are held: a slot opens when the later of the two ("b", at
    // T0 + 2.5 s) has expired, not at the first expiry.
    assert_eq!(acquire(&mut c, "w", "1", "1", "c"), [0, 0, 1000, 1000, 1]);
    advance_clock(&mut c, 400_000);
    assert_eq!(acquire(&mut c, "w", "1", "1", "c"), [0, 0, 600, 600, 1]);
    advance_clock(&mut c, 600_000);
    assert_eq!(acquire(&mut c, "w", "1", "1", "c"), [1, 0, 0, 1000, 1]);
}

#[test]
fn releases_free_only_live_leases_and_move_the_expiry_to_the_last_one() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    acquire(&mut c, "r", "5", "10", "long");
    acquire(&mut c, "r", "5", "2", "short");
    assert_eq!(pexpiretime(&mut c, "r"), (T0 + 10_000_000) / 1000);
    assert_eq!(release(&mut c, "r", "long"), Value::Int(1));
    assert_eq!(release(&mut c, "r", "long"), Value::Int(0));
    assert_eq!(release(&mut c, "r", "unknown"), Value::Int(0));
    assert_eq!(pexpiretime(&mut c, "r"), (T0 + 2_000_000) / 1000);
    assert_eq!(release(&mut c, "r", "short"), Value::Int(1));
    assert_eq!(cmd(&mut c, &["EXISTS", "r"]), Ok(Value::Int(0)));
    assert_eq!(release(&mut c, "missing", "a"), Value::Int(0));
    assert_eq!(cmd(&mut c, &["EXISTS", "missing"]), Ok(Value::Int(0)));
}

#[test]
fn bad_arguments_wrong_types_and_corrupt_leases_are_errors_that_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    acquire(&mut c, "k", "2", "10", "a");
    let long = "x".repeat(129);
    assert_errors_change_nothing(
        &mut c,
        "RL.ACQUIRE",
        "k",
        &[
            (
                &["k", "2", "10"],
                "ERR wrong number of arguments for 'rl.acquire' command",
            ),
            (
                &["k", "2", "10", "a", "1"],
                "ERR wrong number of arguments for 'rl.acquire' command",
            ),
            (&["k", "x", "10", "a"], "ERR limit must be an integer"),
            (
                &["k", "0", "10", "a"],
                "ERR limit must be between 1 and 10000",
            ),
            (&["k", "2", "ten", "a"], "ERR lease_sec must be a number"),
            (
                &["k", "2", "1e8", "a"],
                "ERR lease_sec must be greater than 0 and at most 10000000",
            ),
            (
                &["k", "2", "0.0004", "a"],
                "ERR lease_sec must be at least 1 millisecond",
            ),
            (&["k", "2", "10", ""], "ERR lease_id must be 1 to 128 bytes"),
            (
                &["k", "2", "10", &long],
                "ERR lease_id must be 1 to 128 bytes",
            ),
        ],
    );
    assert_errors_change_nothing(
        &mut c,
        "RL.RELEASE",
        "k",
        &[
            (
                &["k"],
                "ERR wrong number of arguments for 'rl.release' command",
            ),
            (
                &["k", "a", "b"],
                "ERR wrong number of arguments for 'rl.release' command",
            ),
            (&["k", ""], "ERR lease_id must be 1 to 128 bytes"),
        ],
    );
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    cmd(&mut c, &["SET", "s", "x"]).unwrap();
    assert_errors_change_nothing(&mut c, "RL.RELEASE", "s", &[(&["s", "a"], wrongtype)]);
    // A lease id longer than any the module writes, and a score that is no time in µs.
    cmd(&mut c, &["ZADD", "bad", "1900000000000000", &long]).unwrap();
    cmd(&mut c, &["PEXPIRE", "bad", "100000000"]).unwrap();
    let member =
        "ERR corrupt rate limiter state: sorted set member is not a lease id of 1 to 128 bytes";
    let score = "ERR corrupt rate limiter state: sorted set score is not a valid timestamp";
    assert_errors_change_nothing(&mut c, "RL.RELEASE", "bad", &[(&["bad", "a"], member)]);
    assert_errors_change_nothing(
        &mut c,
        "RL.ACQUIRE",
        "bad",
        &[(&["bad", "5", "1", "a"], member)],
    );
    cmd(&mut c, &["ZADD", "own", "-1", "a"]).unwrap();
    cmd(&mut c, &["ZADD", "own", "1900000001000000", "b"]).unwrap();
    cmd(&mut c, &["PEXPIRE", "own", "100000000"]).unwrap();
    assert_errors_change_nothing(&mut c, "RL.RELEASE", "own", &[(&["own", "a"], score)]);
    assert_eq!(
        info_field(&mut c, "ratelimit", "ratelimit_rl_release"),
        "calls=4,allowed=0,denied=0,errors=4,args=1,wrongtype=1,corrupt=2,oom=0,internal=0"
    );
}

#[test]
fn a_release_names_its_writes_in_keyspace_events() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    cmd(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]).unwrap();
    acquire(&mut c, "e", "3", "10", "a");
    acquire(&mut c, "e", "3", "1", "b");
    acquire(&mut c, "e", "3", "5", "c");
    set_clock(&mut c, T0 + 2_000_000);
    let mut sub = s.connect();
    let mut events = sub.as_pubsub();
    events.psubscribe("__keyspace@0__:e").unwrap();
    events.subscribe("step").unwrap();
    let mut events_of = |c: &mut Connection, argv: &[&str]| -> Vec<String> {
        cmd(c, argv).unwrap();
        cmd(c, &["PUBLISH", "step", "end"]).unwrap();
        let mut seen = Vec::new();
        loop {
            let m = events.get_message().unwrap();
            if m.get_channel_name() == "step" {
                return seen;
            }
            seen.push(m.get_payload::<String>().unwrap());
        }
    };
    // "b" has expired and goes with the release; the key now ends with "c".
    assert_eq!(
        events_of(&mut c, &["RL.RELEASE", "e", "a"]),
        ["zremrangebyrank", "zrem", "expire"]
    );
    assert_eq!(
        events_of(&mut c, &["RL.RELEASE", "e", "a"]),
        Vec::<String>::new()
    );
    assert_eq!(
        events_of(&mut c, &["RL.RELEASE", "e", "c"]),
        ["zrem", "del"]
    );
}

/// `RL.ALL`'s reply as one list: the two integers, then each limit's five.
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

#[test]
fn rl_all_takes_a_lease_only_when_every_limit_admits() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let call = |c: &mut Connection, id: &str, cost: &str| {
        flat(&cmd(
            c,
            &[
                "RL.ALL",
                "2",
                "rate",
                "slots",
                "TOKENBUCKET",
                "2",
                "0.001",
                "CONCURRENCY",
                "5",
                "30",
                "LEASE",
                id,
                "COST",
                cost,
            ],
        ))
    };
    assert_eq!(
        call(&mut c, "j1", "1"),
        [1, 0, 1, 1, 0, 1_000_000, 2, 1, 4, 0, 30_000, 5]
    );
    assert_eq!(
        call(&mut c, "j2", "0"),
        [1, 0, 1, 1, 0, 1_000_000, 2, 1, 4, 0, 30_000, 5]
    );
    call(&mut c, "j2", "1");
    // The bucket is empty: denied by it, and no lease is taken for j3.
    let denied = call(&mut c, "j3", "1");
    assert_eq!(&denied[..2], [0, 1]);
    assert_eq!(&denied[7..], [1, 3, 0, 30_000, 5]);
    assert_eq!(cmd(&mut c, &["ZCARD", "slots"]), Ok(Value::Int(2)));
    assert_eq!(
        cmd(
            &mut c,
            &[
                "RL.ALL",
                "1",
                "slots",
                "CONCURRENCY",
                "5",
                "30",
                "COST",
                "1"
            ]
        ),
        Err("ERR a CONCURRENCY limit needs LEASE lease_id".to_string())
    );
}

#[test]
fn a_replica_and_the_aof_end_with_the_same_leases() {
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
    let keys = ["p0", "p1", "p2"];
    let mut writes = 0;
    for i in 0..90 {
        let key = keys[i % 3];
        let id = format!("id{}", i % 7);
        let lease = ["0.3", "1", "2.5"][i % 3];
        if i % 4 == 3 {
            if release(&mut m, key, &id) == Value::Int(1) {
                writes += 1;
            }
        } else if acquire(&mut m, key, "3", lease, &id)[0] == 1 {
            writes += 1;
        }
        advance_clock(&mut m, 87_654);
    }
    assert!(writes > 30, "{writes} writes");
    let snapshot = |c: &mut Connection| -> Vec<(String, harness::Stored, i64)> {
        keys.iter()
            .map(|k| (k.to_string(), stored(c, k), pexpiretime(c, k)))
            .collect()
    };
    let before = snapshot(&mut m);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.connect();
    assert_eq!(snapshot(&mut r), before);
    for effect in ["zadd", "zrem", "zremrangebyrank", "pexpireat"] {
        assert!(calls_of(&mut r, effect) > 0, "the replica ran no {effect}");
    }
    for own in ["rl.acquire", "rl.release"] {
        assert_eq!(calls_of(&mut r, own), 0, "the replica ran {own} itself");
    }
    drop((m, r));
    let dir = master.stop();
    let master = Server::start_in(dir, opts);
    let mut m = master.connect();
    assert_eq!(snapshot(&mut m), before, "the AOF replays the same leases");
}
