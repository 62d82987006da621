//! RL.LEAKYBUCKET on a real redis-server.

mod harness;

use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const LB: &str = "RL.LEAKYBUCKET";
const T0: i64 = 1_900_000_000_000_000;

fn lb(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![LB, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

#[test]
fn burst_up_to_capacity_then_exactly_what_drained() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let burst: Vec<Vec<i64>> = (0..12).map(|_| lb(&mut c, "k", &["10", "5"])).collect();
    assert_eq!(burst.iter().filter(|r| r[0] == 1).count(), 10);
    assert_eq!(burst[0], [1, 9, 0, 200, 10]);
    assert_eq!(burst[9], [1, 0, 0, 2000, 10]);
    assert_eq!(
        burst[10],
        [0, 0, 200, 2000, 10],
        "full: one unit drains in 200 ms"
    );
    assert_eq!(burst[11], [0, 0, 200, 2000, 10]);

    // 600 ms drain exactly 3.
    advance_clock(&mut c, 600_000);
    let after: Vec<Vec<i64>> = (0..4).map(|_| lb(&mut c, "k", &["10", "5"])).collect();
    assert_eq!(after[0], [1, 2, 0, 1600, 10]);
    assert_eq!(after[2], [1, 0, 0, 2000, 10]);
    assert_eq!(after[3], [0, 0, 200, 2000, 10]);

    // Exactly retry_after later the same call fits, one millisecond earlier it does not.
    advance_clock(&mut c, 199_000);
    assert_eq!(lb(&mut c, "k", &["10", "5"])[0..2], [0, 0]);
    advance_clock(&mut c, 1_000);
    assert_eq!(lb(&mut c, "k", &["10", "5"]), [1, 0, 0, 2000, 10]);

    // A cost above capacity never fits; a long idle time empties the bucket.
    assert_eq!(lb(&mut c, "k", &["10", "5", "11"]), [0, 0, -1, 2000, 10]);
    advance_clock(&mut c, 60_000_000);
    assert_eq!(lb(&mut c, "k", &["10", "5", "10"]), [1, 0, 0, 2000, 10]);
}

#[test]
fn denial_and_peek_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    assert_eq!(lb(&mut c, "fresh", &["10", "5", "0"]), [1, 10, 0, 0, 10]);
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing"
    );

    assert_eq!(lb(&mut c, "k", &["10", "5", "6"]), [1, 4, 0, 1200, 10]);
    let before = stored(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    assert_eq!(lb(&mut c, "k", &["10", "5", "5"]), [0, 4, 200, 1200, 10]);
    assert_eq!(lb(&mut c, "k", &["10", "5", "11"]), [0, 4, -1, 1200, 10]);
    assert_eq!(lb(&mut c, "k", &["10", "5", "0"]), [1, 4, 0, 1200, 10]);
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(lb(&mut c, "k", &["10", "5", "4"]), [1, 0, 0, 2000, 10]);
}

#[test]
fn stored_state_and_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0 + 1);
    lb(&mut c, "k", &["10", "5", "3"]);
    assert_eq!(string_bytes(&mut c, "k"), b"lb 3 1900000000000001".to_vec());
    // Empty again 600 ms after t; the expiry rounds t up to the next millisecond.
    assert_eq!(pexpiretime(&mut c, "k"), 1_900_000_000_001 + 600);

    advance_clock(&mut c, 100_001);
    assert_eq!(lb(&mut c, "k", &["10", "5", "1"]), [1, 6, 0, 700, 10]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"lb 3.4999950000000002 1900000000100002".to_vec()
    );
    assert_eq!(pexpiretime(&mut c, "k"), 1_900_000_000_101 + 700);

    // A clock that goes backwards (by less than the minute a stored time may be ahead) drains
    // nothing and keeps the later time; the waits count from it.
    set_clock(&mut c, T0 - 5_000_000);
    assert_eq!(lb(&mut c, "k", &["10", "5", "1"]), [1, 5, 0, 6_001, 10]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"lb 4.4999950000000002 1900000000100002".to_vec()
    );
}

#[test]
fn an_idle_key_expires_and_comes_back_empty() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(lb(&mut c, "idle", &["2", "10", "2"])[0..2], [1, 0]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(
        ttl > 0 && ttl <= 201,
        "expires when empty again (200 ms): {ttl}"
    );
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    assert_eq!(lb(&mut c, "idle", &["2", "10"]), [1, 1, 0, 100, 2]);
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    lb(&mut c, "k", &["10", "5", "3"]);
    let arity = "ERR wrong number of arguments for 'rl.leakybucket' command";
    let cases: &[(&[&str], &str)] = &[
        (&["k"], arity),
        (&["k", "10"], arity),
        (&["k", "10", "5", "1", "1"], arity),
        (&["k", "ten", "5"], "ERR capacity must be an integer"),
        (&["k", "1.5", "5"], "ERR capacity must be an integer"),
        (
            &["k", "0", "5"],
            "ERR capacity must be between 1 and 1000000000000000",
        ),
        (
            &["k", "1000000000000001", "5"],
            "ERR capacity must be between 1 and 1000000000000000",
        ),
        (&["k", "10", "nan"], "ERR leak_per_sec must be a number"),
        (&["k", "10", ""], "ERR leak_per_sec must be a number"),
        (
            &["k", "10", "0"],
            "ERR leak_per_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "10", "1e400"],
            "ERR leak_per_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "10", "5", "-1"],
            "ERR cost must be between 0 and 1000000000000000",
        ),
        (&["k", "10", "5", "1.0"], "ERR cost must be an integer"),
        (
            &["k", "1000", "1e-9"],
            "ERR capacity / leak_per_sec must be at most 10000000000 seconds",
        ),
    ];
    assert_errors_change_nothing(&mut c, LB, "k", cases);
}

#[test]
fn wrong_type_and_corrupt_state_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert_eq!(
        cmd(&mut c, &[LB, "list", "10", "5"]),
        Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(
        cmd(&mut c, &["LRANGE", "list", "0", "-1"]),
        Ok(Value::Array(vec![Value::BulkString(b"x".to_vec())]))
    );

    let level_err = "ERR corrupt rate limiter state: field 'level' is not a valid number";
    let ts_err = "ERR corrupt rate limiter state: field 'ts' is not a valid timestamp";
    let corrupt: &[(&[&str], &str)] = &[
        (&["level", "abc", "ts", "1"], level_err),
        (&["level", "-1", "ts", "1"], level_err),
        (&["level", "inf", "ts", "1"], level_err),
        (&["level", "1e999", "ts", "1"], level_err),
        (&["ts", "1"], level_err),
        (&["unrelated", "1"], level_err),
        (&["level", "1", "ts", "1.5"], ts_err),
        (&["level", "1", "ts", "-5"], ts_err),
        (&["level", "1", "ts", "9007199254740994"], ts_err),
        (&["level", "1"], ts_err),
    ];
    assert_corrupt_hashes_reported(&mut c, LB, &["10", "5"], corrupt);
    let values = &corrupt_amount_and_time(level_err, ts_err);
    // The string layout: parts missing, extra or not numbers.
    assert_corrupt_values_reported(&mut c, LB, &["10", "5"], values);
}
