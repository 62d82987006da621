//! RL.FIXEDWINDOW on a real redis-server.

mod harness;

use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const FW: &str = "RL.FIXEDWINDOW";
const T0: i64 = 1_900_000_000_000_000;

fn fw(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![FW, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

fn burst(c: &mut redis::Connection, key: &str, n: usize) -> Vec<Vec<i64>> {
    (0..n).map(|_| fw(c, key, &["5", "10"])).collect()
}

fn admitted(replies: &[Vec<i64>]) -> usize {
    replies.iter().filter(|r| r[0] == 1).count()
}

#[test]
fn boundary_burst_admits_twice_the_limit_across_the_boundary() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // The first call opens a 10 s window at T0.
    assert_eq!(fw(&mut c, "k", &["5", "10"]), [1, 4, 0, 10_000, 5]);

    // Its last millisecond: the rest of the limit, then a denial until the end.
    advance_clock(&mut c, 9_999_000);
    let end_of_first = burst(&mut c, "k", 5);
    assert_eq!(admitted(&end_of_first), 4);
    assert_eq!(end_of_first[3], [1, 0, 0, 1, 5]);
    assert_eq!(end_of_first[4], [0, 0, 1, 1, 5]);

    // Right at the boundary a new window opens with the whole limit.
    advance_clock(&mut c, 1_000);
    let start_of_second = burst(&mut c, "k", 6);
    assert_eq!(admitted(&start_of_second), 5);
    assert_eq!(start_of_second[0], [1, 4, 0, 10_000, 5]);
    assert_eq!(start_of_second[4], [1, 0, 0, 10_000, 5]);
    assert_eq!(start_of_second[5], [0, 0, 10_000, 10_000, 5]);
    // 9 admitted within 1 ms, 2 x limit within one window length.
    assert_eq!(admitted(&end_of_first) + admitted(&start_of_second), 9);
    assert_eq!(string_bytes(&mut c, "k"), b"fw 5 1900000010000000".to_vec());
}

#[test]
fn the_window_ends_by_its_stored_start_not_by_the_ttl() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(fw(&mut c, "k", &["2", "1", "2"]), [1, 0, 0, 1000, 2]);
    // Whatever happens to the TTL, the window ends 1 s after its start.
    cmd(&mut c, &["PERSIST", "k"]).unwrap();
    advance_clock(&mut c, 999_999);
    assert_eq!(fw(&mut c, "k", &["2", "1"]), [0, 0, 1, 1, 2]);
    advance_clock(&mut c, 1);
    assert_eq!(fw(&mut c, "k", &["2", "1"]), [1, 1, 0, 1000, 2]);

    // A clock that went backwards (by less than the minute a stored time may be ahead) stays
    // in the current window.
    set_clock(&mut c, T0);
    assert_eq!(fw(&mut c, "k", &["2", "1"]), [1, 0, 0, 2000, 2]);
    assert_eq!(fw(&mut c, "k", &["2", "1"]), [0, 0, 2000, 2000, 2]);
    assert_eq!(string_bytes(&mut c, "k"), b"fw 2 1900000001000000".to_vec());
}

#[test]
fn denial_and_peek_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    assert_eq!(fw(&mut c, "fresh", &["5", "10", "0"]), [1, 5, 0, 0, 5]);
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing"
    );

    assert_eq!(fw(&mut c, "k", &["5", "10", "3"]), [1, 2, 0, 10_000, 5]);
    let before = stored(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    advance_clock(&mut c, 2_500_000);
    assert_eq!(fw(&mut c, "k", &["5", "10", "3"]), [0, 2, 7_500, 7_500, 5]);
    assert_eq!(fw(&mut c, "k", &["5", "10", "6"]), [0, 2, -1, 7_500, 5]);
    assert_eq!(fw(&mut c, "k", &["5", "10", "0"]), [1, 2, 0, 7_500, 5]);
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(fw(&mut c, "k", &["5", "10", "2"]), [1, 0, 0, 7_500, 5]);
}

#[test]
fn stored_state_and_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0 + 1);
    fw(&mut c, "k", &["5", "10", "3"]);
    assert_eq!(string_bytes(&mut c, "k"), b"fw 3 1900000000000001".to_vec());
    // The window's end, rounded up to the next millisecond.
    assert_eq!(pexpiretime(&mut c, "k"), 1_900_000_000_001 + 10_000);
    advance_clock(&mut c, 4_000_000);
    assert_eq!(fw(&mut c, "k", &["5", "10", "1"]), [1, 1, 0, 6_000, 5]);
    assert_eq!(pexpiretime(&mut c, "k"), 1_900_000_000_001 + 10_000);
    // Window lengths are rounded to whole milliseconds.
    assert_eq!(fw(&mut c, "r", &["5", "0.0015"]), [1, 4, 0, 2, 5]);
    assert_eq!(fw(&mut c, "r2", &["5", "0.0005"]), [1, 4, 0, 1, 5]);
}

#[test]
fn an_idle_key_expires_and_comes_back_fresh() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(fw(&mut c, "idle", &["2", "0.2", "2"]), [1, 0, 0, 200, 2]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(ttl > 0 && ttl <= 201, "expires at the window's end: {ttl}");
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    assert_eq!(fw(&mut c, "idle", &["2", "0.2"]), [1, 1, 0, 200, 2]);
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    fw(&mut c, "k", &["5", "10", "3"]);
    let arity = "ERR wrong number of arguments for 'rl.fixedwindow' command";
    let window = "ERR window_sec must be between 0.001 and 10000000000 (it is rounded to whole milliseconds)";
    let cases: &[(&[&str], &str)] = &[
        (&["k"], arity),
        (&["k", "5"], arity),
        (&["k", "5", "10", "1", "1"], arity),
        (&["k", "five", "10"], "ERR limit must be an integer"),
        (&["k", "5.5", "10"], "ERR limit must be an integer"),
        (
            &["k", "0", "10"],
            "ERR limit must be between 1 and 1000000000000000",
        ),
        (
            &["k", "1000000000000001", "10"],
            "ERR limit must be between 1 and 1000000000000000",
        ),
        (&["k", "5", "ten"], "ERR window_sec must be a number"),
        (&["k", "5", "inf"], "ERR window_sec must be a number"),
        (&["k", "5", ""], "ERR window_sec must be a number"),
        (&["k", "5", "0"], window),
        (&["k", "5", "-1"], window),
        (&["k", "5", "0.0004"], window),
        (&["k", "5", "10000000000.001"], window),
        (&["k", "5", "1e400"], window),
        (
            &["k", "5", "10", "-1"],
            "ERR cost must be between 0 and 1000000000000000",
        ),
        (&["k", "5", "10", "1.0"], "ERR cost must be an integer"),
    ];
    assert_errors_change_nothing(&mut c, FW, "k", cases);
}

#[test]
fn wrong_type_and_corrupt_state_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert_eq!(
        cmd(&mut c, &[FW, "list", "5", "10"]),
        Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(
        cmd(&mut c, &["LRANGE", "list", "0", "-1"]),
        Ok(Value::Array(vec![Value::BulkString(b"x".to_vec())]))
    );

    let count_err = "ERR corrupt rate limiter state: field 'count' is not a valid number";
    let start_err = "ERR corrupt rate limiter state: field 'start' is not a valid timestamp";
    let corrupt: &[(&[&str], &str)] = &[
        (&["count", "abc", "start", "1"], count_err),
        (&["count", "-1", "start", "1"], count_err),
        (&["count", "nan", "start", "1"], count_err),
        (&["count", "1e999", "start", "1"], count_err),
        (&["start", "1"], count_err),
        (&["unrelated", "1"], count_err),
        (&["count", "1", "start", "1.5"], start_err),
        (&["count", "1", "start", "-5"], start_err),
        (&["count", "1", "start", "99999999999999999999"], start_err),
        (&["count", "1"], start_err),
    ];
    assert_corrupt_hashes_reported(&mut c, FW, &["5", "10"], corrupt);
    let values = &corrupt_amount_and_time(count_err, start_err);
    // The string layout: parts missing, extra or not numbers.
    assert_corrupt_values_reported(&mut c, FW, &["5", "10"], values);
}

#[test]
fn every_admitted_call_propagates_one_set_with_an_absolute_expiry() {
    // One `SET key value PXAT ms` per admitted call, nothing else: the replicas end with the
    // same value and the same absolute expiry, inside one window and across windows.
    let master = Server::with_test_clock();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.connect();
    let mut r = replica.connect();
    set_clock(&mut m, T0);
    for remaining in (5..10).rev() {
        assert_eq!(fw(&mut m, "k", &["10", "60"])[..2], [1, remaining]);
        advance_clock(&mut m, 1_000_000);
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(stored(&mut r, "k"), stored(&mut m, "k"));
    assert_eq!(pexpiretime(&mut r, "k"), pexpiretime(&mut m, "k"));
    assert_eq!(calls_of(&mut r, "set"), 5);
    assert_eq!(calls_of(&mut r, "hset") + calls_of(&mut r, "pexpireat"), 0);

    // The next window moves the expiry: the same one command carries it.
    advance_clock(&mut m, 60_000_000);
    assert_eq!(fw(&mut m, "k", &["10", "60"])[..2], [1, 9]);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(calls_of(&mut r, "set"), 6);
    assert_eq!(stored(&mut r, "k"), stored(&mut m, "k"));
    assert_eq!(pexpiretime(&mut r, "k"), pexpiretime(&mut m, "k"));
    assert_eq!(pexpiretime(&mut r, "k"), (T0 + 65_000_000) / 1000 + 60_000);
}
