//! RL.SLIDINGWINDOW on a real redis-server.

mod harness;

use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const SW: &str = "RL.SLIDINGWINDOW";
/// A multiple of 10 s: the start of a 10 s window.
const W0: i64 = 1_900_000_000_000_000;
const W: i64 = 10_000_000;

fn sw(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![SW, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

#[test]
fn the_previous_window_weighs_by_the_part_still_covered() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, W0 + 1_000_000);
    let a: Vec<Vec<i64>> = (0..11).map(|_| sw(&mut c, "k", &["10", "10"])).collect();
    assert_eq!(a.iter().filter(|r| r[0] == 1).count(), 10);
    assert_eq!(a[9], [1, 0, 0, 19_000, 10]);
    // Full: room again 1 s into the next window, when 10 weigh 9.
    assert_eq!(a[10], [0, 0, 10_000, 19_000, 10]);

    // 25% into window B the previous 10 weigh 7.5: exactly 2 more fit.
    set_clock(&mut c, W0 + W + W / 4);
    let b: Vec<Vec<i64>> = (0..3).map(|_| sw(&mut c, "k", &["10", "10"])).collect();
    assert_eq!(b[0], [1, 1, 0, 17_500, 10]);
    assert_eq!(b[1], [1, 0, 0, 17_500, 10]);
    assert_eq!(b[2], [0, 0, 500, 17_500, 10]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"sw 1900000010000000 2 10".to_vec()
    );
}

#[test]
fn retry_after_is_the_first_millisecond_that_admits() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    // Within the window: the previous count's weight falls to 7 at 30%.
    set_clock(&mut c, W0);
    sw(&mut c, "k", &["10", "10", "10"]);
    set_clock(&mut c, W0 + W + W / 4);
    assert_eq!(sw(&mut c, "k", &["10", "10", "2"]), [1, 0, 0, 17_500, 10]);
    assert_eq!(sw(&mut c, "k", &["10", "10"]), [0, 0, 500, 17_500, 10]);
    advance_clock(&mut c, 499_000);
    assert_eq!(sw(&mut c, "k", &["10", "10"]), [0, 0, 1, 17_001, 10]);
    advance_clock(&mut c, 1_000);
    assert_eq!(sw(&mut c, "k", &["10", "10"]), [1, 0, 0, 17_000, 10]);

    // Into the next window: 8 weigh 7 one eighth into it, 5 s + 1.25 s away.
    set_clock(&mut c, W0 + W / 2);
    assert_eq!(sw(&mut c, "n", &["10", "10", "8"]), [1, 2, 0, 15_000, 10]);
    assert_eq!(
        sw(&mut c, "n", &["10", "10", "3"]),
        [0, 2, 6_250, 15_000, 10]
    );
    advance_clock(&mut c, 6_249_000);
    assert_eq!(sw(&mut c, "n", &["10", "10", "3"]), [0, 2, 1, 8_751, 10]);
    advance_clock(&mut c, 1_000);
    assert_eq!(sw(&mut c, "n", &["10", "10", "3"]), [1, 0, 0, 18_750, 10]);

    assert_eq!(sw(&mut c, "n", &["10", "10", "11"]), [0, 0, -1, 18_750, 10]);
}

#[test]
fn denial_and_peek_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, W0);
    assert_eq!(sw(&mut c, "fresh", &["10", "10", "0"]), [1, 10, 0, 0, 10]);
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing"
    );

    assert_eq!(sw(&mut c, "k", &["10", "10", "6"]), [1, 4, 0, 20_000, 10]);
    let before = stored(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    // 6 weigh 5 a sixth into the next window.
    assert_eq!(
        sw(&mut c, "k", &["10", "10", "5"]),
        [0, 4, 11_667, 20_000, 10]
    );
    assert_eq!(sw(&mut c, "k", &["10", "10", "11"]), [0, 4, -1, 20_000, 10]);
    assert_eq!(sw(&mut c, "k", &["10", "10", "0"]), [1, 4, 0, 20_000, 10]);
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(sw(&mut c, "k", &["10", "10", "4"]), [1, 0, 0, 20_000, 10]);
}

#[test]
fn stored_state_and_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, W0 + 3);
    sw(&mut c, "k", &["10", "10", "3"]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"sw 1900000000000000 3 0".to_vec()
    );
    // Two windows after the current one started, nothing stored weighs anything.
    assert_eq!(pexpiretime(&mut c, "k"), W0 / 1000 + 20_000);

    set_clock(&mut c, W0 + W + W / 4);
    assert_eq!(sw(&mut c, "k", &["10", "10"]), [1, 6, 0, 17_500, 10]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"sw 1900000010000000 1 3".to_vec()
    );
    assert_eq!(pexpiretime(&mut c, "k"), (W0 + W) / 1000 + 20_000);

    // A clock that went backwards keeps the stored window, as at its beginning: 3 + 1 + 1.
    set_clock(&mut c, W0 + W / 2);
    assert_eq!(sw(&mut c, "k", &["10", "10"]), [1, 5, 0, 25_000, 10]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"sw 1900000010000000 2 3".to_vec()
    );

    // Two windows on, everything is forgotten.
    set_clock(&mut c, W0 + 3 * W);
    assert_eq!(sw(&mut c, "k", &["10", "10", "0"]), [1, 10, 0, 0, 10]);
}

#[test]
fn an_idle_key_expires_and_comes_back_fresh() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(sw(&mut c, "idle", &["2", "0.1", "2"])[0..3], [1, 0, 0]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(ttl > 100 && ttl <= 201, "expires two windows on: {ttl}");
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    let r = sw(&mut c, "idle", &["2", "0.1"]);
    assert_eq!(r[0..3], [1, 1, 0]);
    assert!(r[3] > 100 && r[3] <= 200, "{r:?}");
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    sw(&mut c, "k", &["5", "10", "3"]);
    let arity = "ERR wrong number of arguments for 'rl.slidingwindow' command";
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
    assert_errors_change_nothing(&mut c, SW, "k", cases);
}

#[test]
fn wrong_type_and_corrupt_state_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert_eq!(
        cmd(&mut c, &[SW, "list", "5", "10"]),
        Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(
        cmd(&mut c, &["LRANGE", "list", "0", "-1"]),
        Ok(Value::Array(vec![Value::BulkString(b"x".to_vec())]))
    );

    let start_err = "ERR corrupt rate limiter state: field 'start' is not a valid timestamp";
    let cur_err = "ERR corrupt rate limiter state: field 'cur' is not a valid number";
    let prev_err = "ERR corrupt rate limiter state: field 'prev' is not a valid number";
    let corrupt: &[(&[&str], &str)] = &[
        (&["start", "1.5", "cur", "1", "prev", "1"], start_err),
        (&["start", "-5", "cur", "1", "prev", "1"], start_err),
        (
            &["start", "9007199254740994", "cur", "1", "prev", "1"],
            start_err,
        ),
        (&["cur", "1", "prev", "1"], start_err),
        (&["unrelated", "1"], start_err),
        (&["start", "1", "cur", "abc", "prev", "1"], cur_err),
        (&["start", "1", "cur", "-1", "prev", "1"], cur_err),
        (&["start", "1", "cur", "1e300", "prev", "1"], cur_err),
        (&["start", "1", "prev", "1"], cur_err),
        (&["start", "1", "cur", "1", "prev", "inf"], prev_err),
        (
            &["start", "1", "cur", "1", "prev", "2000000000000001"],
            prev_err,
        ),
        (&["start", "1", "cur", "1"], prev_err),
    ];
    assert_corrupt_hashes_reported(&mut c, SW, &["5", "10"], corrupt);
    let values: &[(&str, &str)] = &[
        ("", start_err),
        ("x", start_err),
        ("1.5 1 1", start_err),
        (" 1 1 1", start_err),
        ("1 abc 1", cur_err),
        ("1 -1 1", cur_err),
        ("1 1", prev_err),
        ("1 1 nan", prev_err),
        ("1 1 1 1", prev_err),
        ("1 1  1", prev_err),
    ];
    // The string layout: parts missing, extra or not numbers.
    assert_corrupt_values_reported(&mut c, SW, &["5", "10"], values);
}
