//! CL.THROTTLE on a real redis-server: redis-cell's reply, rounding and stored format.

mod harness;

use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const CL: &str = "CL.THROTTLE";
/// A test-clock instant ahead of the real clock (2030), so no absolute expiry is in the past.
const T0: i64 = 1_900_000_000_000_000;
const T0_NS: i64 = T0 * 1000;
const T0_MS: i64 = T0 / 1000;

fn th(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![CL, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

fn get(c: &mut redis::Connection, key: &str) -> Reply {
    cmd(c, &["GET", key])
}

fn bulk(s: String) -> Reply {
    Ok(Value::BulkString(s.into_bytes()))
}

#[test]
fn readme_example() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(
        th(&mut c, "user123", &["15", "30", "60", "1"]),
        [0, 16, 15, -1, 2]
    );
    assert_eq!(
        th(&mut c, "user123", &["15", "30", "60"]),
        [0, 16, 14, -1, 4]
    );
    // redis-cell's format: the theoretical arrival time in unix nanoseconds, as digits.
    assert_eq!(
        get(&mut c, "user123"),
        bulk((T0_NS + 4_000_000_000).to_string())
    );
    assert_eq!(pexpiretime(&mut c, "user123"), T0_MS + 4_000);
}

#[test]
fn redis_cell_reference_sequence() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    // Limit 5, one per second: redis-cell's own limiter test, in its reply units.
    let cases: &[(i64, &str, [i64; 5])] = &[
        (0, "6", [1, 5, 5, -1, 0]),
        (0, "1", [0, 5, 4, -1, 1]),
        (0, "1", [0, 5, 3, -1, 2]),
        (0, "1", [0, 5, 2, -1, 3]),
        (0, "1", [0, 5, 1, -1, 4]),
        (0, "1", [0, 5, 0, -1, 5]),
        (0, "1", [1, 5, 0, 1, 5]),
        (3000, "1", [0, 5, 2, -1, 3]),
        (3100, "1", [0, 5, 1, -1, 4]),
        (4000, "1", [0, 5, 1, -1, 4]),
        (8000, "1", [0, 5, 4, -1, 1]),
        (9500, "1", [0, 5, 4, -1, 1]),
        (9500, "0", [0, 5, 4, -1, 1]),
        (9500, "2", [0, 5, 2, -1, 3]),
        (9500, "5", [1, 5, 2, 3, 3]),
    ];
    for (i, (at_ms, quantity, expected)) in cases.iter().enumerate() {
        set_clock(&mut c, T0 + at_ms * 1000);
        assert_eq!(
            th(&mut c, "foo", &["4", "1", "1", quantity]),
            expected,
            "case {i}"
        );
    }
}

#[test]
fn burst_then_exactly_one_per_emission_interval() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let burst: Vec<Vec<i64>> = (0..6).map(|_| th(&mut c, "k", &["4", "10", "1"])).collect();
    assert_eq!(burst[4], [0, 5, 0, -1, 1]);
    assert_eq!(burst[5], [1, 5, 0, 1, 1]);
    let mut admitted_at = Vec::new();
    for ms in 1..=2000 {
        advance_clock(&mut c, 1_000);
        if th(&mut c, "k", &["4", "10", "1"])[0] == 0 {
            admitted_at.push(ms);
        }
    }
    assert_eq!(admitted_at, (1..=20).map(|i| i * 100).collect::<Vec<_>>());
}

#[test]
fn a_key_written_by_redis_cell_is_read_as_it_would_be() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // As redis-cell leaves it: nanoseconds, with a relative TTL.
    let tat = (T0_NS + 10_000_000_000).to_string();
    cmd(&mut c, &["SET", "cell", &tat, "PX", "10000"]).unwrap();
    assert_eq!(th(&mut c, "cell", &["15", "30", "60"]), [0, 16, 10, -1, 12]);
    assert_eq!(
        get(&mut c, "cell"),
        bulk((T0_NS + 12_000_000_000).to_string())
    );
    assert_eq!(pexpiretime(&mut c, "cell"), T0_MS + 12_000);

    // Nanoseconds below the microsecond are kept; the expiry rounds up to the millisecond.
    let tat = (T0_NS + 1_000_000_789).to_string();
    cmd(&mut c, &["SET", "ns", &tat]).unwrap();
    assert_eq!(th(&mut c, "ns", &["15", "30", "60"]), [0, 16, 14, -1, 3]);
    assert_eq!(get(&mut c, "ns"), bulk((T0_NS + 3_000_000_789).to_string()));
    assert_eq!(pexpiretime(&mut c, "ns"), T0_MS + 3_001);

    // A value left from long ago counts as a new key.
    cmd(&mut c, &["SET", "old", "1500000000000000000"]).unwrap();
    assert_eq!(th(&mut c, "old", &["15", "30", "60"]), [0, 16, 15, -1, 2]);
    assert_eq!(
        get(&mut c, "old"),
        bulk((T0_NS + 2_000_000_000).to_string())
    );
    assert_eq!(pexpiretime(&mut c, "old"), T0_MS + 2_000);

    // A shorter value (not rewritten in place) is replaced, its expiry too.
    cmd(&mut c, &["SET", "short", "5", "EX", "100000"]).unwrap();
    assert_eq!(th(&mut c, "short", &["15", "30", "60"]), [0, 16, 15, -1, 2]);
    assert_eq!(
        get(&mut c, "short"),
        bulk((T0_NS + 2_000_000_000).to_string())
    );
    assert_eq!(pexpiretime(&mut c, "short"), T0_MS + 2_000);
}

#[test]
fn quantity_zero_and_denials_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(
        th(&mut c, "fresh", &["15", "30", "60", "0"]),
        [0, 16, 16, -1, 0]
    );
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing (redis-cell would write the key)"
    );

    assert_eq!(
        th(&mut c, "k", &["15", "30", "60", "16"]),
        [0, 16, 0, -1, 32]
    );
    let value = get(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    assert_eq!(th(&mut c, "k", &["15", "30", "60"]), [1, 16, 0, 2, 32]);
    assert_eq!(
        th(&mut c, "k", &["15", "30", "60", "17"]),
        [1, 16, 0, -1, 32],
        "more than the limit: never"
    );
    advance_clock(&mut c, 5_000_000);
    assert_eq!(
        th(&mut c, "k", &["15", "30", "60", "0"]),
        [0, 16, 2, -1, 27]
    );
    assert_eq!(th(&mut c, "k", &["15", "30", "60", "3"]), [1, 16, 2, 1, 27]);
    assert_eq!(get(&mut c, "k"), value);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset
    );
    assert_eq!(
        th(&mut c, "k", &["15", "30", "60", "2"]),
        [0, 16, 0, -1, 31]
    );
}

#[test]
fn an_idle_key_expires_and_comes_back_fresh() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(th(&mut c, "idle", &["1", "10", "1", "2"])[0..3], [0, 2, 0]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(
        ttl > 0 && ttl <= 201,
        "expires when fresh again (200 ms): {ttl}"
    );
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    assert_eq!(th(&mut c, "idle", &["1", "10", "1"]), [0, 2, 1, -1, 1]);
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    th(&mut c, "k", &["15", "30", "60"]);
    let before = get(&mut c, "k");
    let arity = "ERR wrong number of arguments for 'cl.throttle' command";
    let cases: &[(&[&str], &str)] = &[
        (&["k"], arity),
        (&["k", "15", "30"], arity),
        (&["k", "15", "30", "60", "1", "1"], arity),
        (&["k", "x", "30", "60"], "ERR max_burst must be an integer"),
        (
            &["k", "-1", "30", "60"],
            "ERR max_burst must be between 0 and 1000000000000000",
        ),
        (
            &["k", "15", "0", "60"],
            "ERR count_per_period must be between 1 and 1000000000000000",
        ),
        (&["k", "15", "30", "1.5"], "ERR period must be an integer"),
        (
            &["k", "15", "30", "0"],
            "ERR period must be between 1 and 1000000000000000",
        ),
        (
            &["k", "15", "30", "60", "x"],
            "ERR quantity must be an integer",
        ),
        (
            &["k", "15", "30", "60", "-1"],
            "ERR quantity must be between 0 and 1000000000000000",
        ),
        (
            &["k", "0", "2000000", "1"],
            "ERR count_per_period / period must be at most 1000000 per second",
        ),
        (
            &["k", "999", "1", "2000000"],
            "ERR (max_burst + 1) * period / count_per_period must be at most 1000000000 seconds",
        ),
    ];
    for (args, expected) in cases {
        let mut full = vec![CL];
        full.extend_from_slice(args);
        assert_eq!(cmd(&mut c, &full), Err(expected.to_string()), "{args:?}");
    }
    assert_eq!(get(&mut c, "k"), before);
}

#[test]
fn wrong_type_and_corrupt_values_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    cmd(&mut c, &["HSET", "hash", "tat", "1"]).unwrap();
    cmd(&mut c, &["RPUSH", "list", "1"]).unwrap();
    for key in ["hash", "list"] {
        assert_eq!(
            cmd(&mut c, &[CL, key, "15", "30", "60"]),
            Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
        );
    }
    let corrupt = "ERR corrupt rate limiter state: the value is not a timestamp in nanoseconds";
    for (i, value) in [
        "abc",
        "-5",
        "1.5",
        "",
        "1e18",
        " 1",
        "9200000000000000000",
        "18446744073709551616",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("bad{i}");
        cmd(&mut c, &["SET", &key, value]).unwrap();
        assert_eq!(
            cmd(&mut c, &[CL, &key, "15", "30", "60"]),
            Err(corrupt.to_string()),
            "{value:?}"
        );
        assert_eq!(get(&mut c, &key), bulk(value.to_string()));
        assert_eq!(pexpiretime(&mut c, &key), -1);
    }
}

/// The stored value, `None` when the key is absent.
fn stored(c: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(c).unwrap()
}

#[test]
fn values_rewritten_in_place_reach_the_replica() {
    // A microsecond apart the value keeps its length and the expiry (whole ms) mostly stays:
    // rewritten in place, its expiry set again each time, and still the same on the replica.
    let master = Server::with_test_clock();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.connect();
    let mut r = replica.connect();
    set_clock(&mut m, T0);
    for i in 0..5 {
        assert_eq!(
            th(&mut m, "fast", &["1000", "1000000", "1"])[..3],
            [0, 1001, 1000 - i]
        );
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(
        stored(&mut m, "fast"),
        Some((T0_NS + 5_000).to_string().into_bytes())
    );
    assert_eq!(stored(&mut r, "fast"), stored(&mut m, "fast"));
    assert_eq!(pexpiretime(&mut r, "fast"), pexpiretime(&mut m, "fast"));
    assert_eq!(pexpiretime(&mut m, "fast"), T0_MS + 1);
}

#[test]
fn large_parameters_create_a_key_with_the_right_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // 100 a year, all at once if need be: one every 315360 s.
    assert_eq!(
        th(&mut c, "yearly", &["99", "100", "31536000"]),
        [0, 100, 99, -1, 315_360]
    );
    assert_eq!(
        get(&mut c, "yearly"),
        bulk((T0_NS + 315_360_000_000_000).to_string())
    );
    assert_eq!(pexpiretime(&mut c, "yearly"), T0_MS + 315_360_000);
    // At the bound: a tolerance of 1e9 s.
    assert_eq!(
        th(&mut c, "bound", &["999", "1", "1000000", "1000"]),
        [0, 1000, 0, -1, 1_000_000_000]
    );
    assert_eq!(
        get(&mut c, "bound"),
        bulk((T0_NS + 1_000_000_000_000_000_000).to_string())
    );
    assert_eq!(pexpiretime(&mut c, "bound"), T0_MS + 1_000_000_000_000);
    assert_eq!(
        th(&mut c, "bound", &["999", "1", "1000000"]),
        [1, 1000, 0, 1_000_000, 1_000_000_000]
    );
}
