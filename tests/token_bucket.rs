//! RL.TOKENBUCKET on a real redis-server.

mod harness;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const TB: &str = "RL.TOKENBUCKET";

fn tb(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![TB, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

#[test]
fn seed_scenario_with_exact_time() {
    let s = Server::with_test_clock();
    let (mut a, mut b) = (s.connect(), s.connect());
    let replies: Vec<Vec<i64>> = (0..12)
        .map(|i| {
            tb(
                if i % 2 == 0 { &mut a } else { &mut b },
                "seed",
                &["10", "5"],
            )
        })
        .collect();
    assert_eq!(replies.iter().filter(|r| r[0] == 1).count(), 10);
    assert_eq!(replies[0], [1, 9, 0, 200, 10]);
    assert_eq!(replies[9], [1, 0, 0, 2000, 10]);
    assert_eq!(
        replies[10],
        [0, 0, 200, 2000, 10],
        "first denial: one token is 200 ms away"
    );
    assert_eq!(replies[11], [0, 0, 200, 2000, 10]);

    advance_clock(&mut a, 1_000_000);
    let after: Vec<Vec<i64>> = (0..8)
        .map(|i| {
            tb(
                if i % 2 == 0 { &mut a } else { &mut b },
                "seed",
                &["10", "5"],
            )
        })
        .collect();
    assert_eq!(after.iter().filter(|r| r[0] == 1).count(), 5);
    assert_eq!(after[4], [1, 0, 0, 2000, 10]);
    assert_eq!(after[5], [0, 0, 200, 2000, 10]);

    assert_eq!(
        tb(&mut b, "other", &["10", "5"]),
        [1, 9, 0, 200, 10],
        "another key is untouched"
    );
}

#[test]
fn seed_scenario_with_the_real_clock() {
    let s = Server::start();
    let (mut a, mut b) = (s.connect(), s.connect());
    let replies: Vec<Vec<i64>> = (0..12)
        .map(|i| {
            tb(
                if i % 2 == 0 { &mut a } else { &mut b },
                "seed",
                &["10", "5"],
            )
        })
        .collect();
    assert_eq!(replies.iter().filter(|r| r[0] == 1).count(), 10);
    let first_denial = &replies[10];
    assert_eq!(first_denial[0], 0);
    assert!(
        (150..=200).contains(&first_denial[2]),
        "retry_after about 200 ms: {first_denial:?}"
    );

    thread::sleep(Duration::from_millis(1000));
    let allowed = (0..8)
        .filter(|i| {
            tb(
                if i % 2 == 0 { &mut a } else { &mut b },
                "seed",
                &["10", "5"],
            )[0] == 1
        })
        .count();
    assert_eq!(allowed, 5);
    assert_eq!(tb(&mut a, "other", &["10", "5"])[1], 9);
}

#[test]
fn two_hundred_pipelined_calls_over_two_connections_admit_exactly_capacity() {
    let s = Server::with_test_clock();
    let start = Arc::new(Barrier::new(2));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let mut c = s.connect();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                let mut pipe = redis::pipe();
                for _ in 0..100 {
                    pipe.cmd(TB).arg("race2").arg(10).arg(5);
                }
                start.wait();
                let replies: Vec<Vec<i64>> = pipe.query(&mut c).expect("pipeline");
                replies.iter().map(|r| r[0]).sum::<i64>()
            })
        })
        .collect();
    let allowed: i64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    assert_eq!(allowed, 10);
}

#[test]
fn denial_consumes_and_writes_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    assert_eq!(tb(&mut c, "k", &["10", "5", "6"]), [1, 4, 0, 1200, 10]);
    let before = stored(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    assert_eq!(tb(&mut c, "k", &["10", "5", "5"]), [0, 4, 200, 1200, 10]);
    assert_eq!(
        tb(&mut c, "k", &["10", "5", "11"]),
        [0, 4, -1, 1200, 10],
        "never admissible"
    );
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(
        tb(&mut c, "k", &["10", "5", "4"]),
        [1, 0, 0, 2000, 10],
        "4 tokens were still there"
    );
}

#[test]
fn cost_zero_is_a_read_only_peek() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    assert_eq!(tb(&mut c, "fresh", &["10", "5", "0"]), [1, 10, 0, 0, 10]);
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing"
    );

    tb(&mut c, "k", &["10", "5", "3"]);
    let before = stored(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    advance_clock(&mut c, 100_000);
    assert_eq!(tb(&mut c, "k", &["10", "5", "0"]), [1, 7, 0, 500, 10]);
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
}

#[test]
fn stored_state_and_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, 1_900_000_000_000_001);
    tb(&mut c, "k", &["10", "5", "3"]);
    assert_eq!(string_bytes(&mut c, "k"), b"tb 7 1900000000000001".to_vec());
    // Full again 600 ms after t; the expiry rounds t up to the next millisecond.
    assert_eq!(pexpiretime(&mut c, "k"), 1_900_000_000_001 + 600);

    advance_clock(&mut c, 100_001);
    tb(&mut c, "k", &["10", "5", "1"]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"tb 6.5000049999999998 1900000000100002".to_vec()
    );
}

#[test]
fn an_idle_key_expires_and_comes_back_full() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(tb(&mut c, "idle", &["2", "10", "2"])[0..2], [1, 0]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(
        ttl > 0 && ttl <= 201,
        "expires when full again (200 ms): {ttl}"
    );
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    assert_eq!(tb(&mut c, "idle", &["2", "10"]), [1, 1, 0, 100, 2]);
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    tb(&mut c, "k", &["10", "5", "3"]);
    let cases: &[(&[&str], &str)] = &[
        (
            &["k"],
            "ERR wrong number of arguments for 'rl.tokenbucket' command",
        ),
        (
            &["k", "10"],
            "ERR wrong number of arguments for 'rl.tokenbucket' command",
        ),
        (
            &["k", "10", "5", "1", "1"],
            "ERR wrong number of arguments for 'rl.tokenbucket' command",
        ),
        (&["k", "ten", "5"], "ERR capacity must be an integer"),
        (&["k", "1.5", "5"], "ERR capacity must be an integer"),
        (
            &["k", "0", "5"],
            "ERR capacity must be between 1 and 1000000000000000",
        ),
        (
            &["k", "-3", "5"],
            "ERR capacity must be between 1 and 1000000000000000",
        ),
        (
            &["k", "99999999999999999999999", "5"],
            "ERR capacity must be between 1 and 1000000000000000",
        ),
        (&["k", "10", "nan"], "ERR refill_per_sec must be a number"),
        (&["k", "10", "inf"], "ERR refill_per_sec must be a number"),
        (&["k", "10", ""], "ERR refill_per_sec must be a number"),
        (
            &["k", "10", "0"],
            "ERR refill_per_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "10", "-1"],
            "ERR refill_per_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "10", "1e400"],
            "ERR refill_per_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "10", "5", "-1"],
            "ERR cost must be between 0 and 1000000000000000",
        ),
        (&["k", "10", "5", "1.0"], "ERR cost must be an integer"),
        (
            &["k", "1000", "1e-9"],
            "ERR capacity / refill_per_sec must be at most 10000000000 seconds",
        ),
    ];
    assert_errors_change_nothing(&mut c, TB, "k", cases);
}

#[test]
fn wrong_type_and_corrupt_state_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert_eq!(
        cmd(&mut c, &[TB, "list", "10", "5"]),
        Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(
        cmd(&mut c, &["LRANGE", "list", "0", "-1"]),
        Ok(Value::Array(vec![Value::BulkString(b"x".to_vec())]))
    );
    cmd(&mut c, &["ZADD", "zset", "1", "x"]).unwrap();
    assert!(
        cmd(&mut c, &[TB, "zset", "10", "5"])
            .unwrap_err()
            .starts_with("WRONGTYPE")
    );

    let tokens_err = "ERR corrupt rate limiter state: field 'tokens' is not a valid number";
    let ts_err = "ERR corrupt rate limiter state: field 'ts' is not a valid timestamp";
    let corrupt: &[(&[&str], &str)] = &[
        (&["tokens", "abc", "ts", "1"], tokens_err),
        (&["tokens", "-1e999", "ts", "1"], tokens_err),
        (&["tokens", "nan", "ts", "1"], tokens_err),
        (&["tokens", "1e999", "ts", "1"], tokens_err),
        (&["ts", "1"], tokens_err),
        (&["unrelated", "1"], tokens_err),
        (&["tokens", "1", "ts", "1.5"], ts_err),
        (&["tokens", "1", "ts", "-5"], ts_err),
        (&["tokens", "1", "ts", "99999999999999999999"], ts_err),
        (&["tokens", "1"], ts_err),
    ];
    assert_corrupt_hashes_reported(&mut c, TB, &["10", "5"], corrupt);
    // Negative tokens are a debt that RL.SETTLE charged (tests/settle.rs), not corrupt state.
    let mut values = corrupt_amount_and_time(tokens_err, ts_err);
    values.retain(|(v, _)| *v != "-1 1");
    values.push(("-1e999 1", tokens_err));
    let values = &values;
    // The string layout: parts missing, extra or not numbers.
    assert_corrupt_values_reported(&mut c, TB, &["10", "5"], values);
    assert_eq!(
        cmd(&mut c, &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
}

#[test]
fn command_metadata_for_cluster_and_acl() {
    let s = Server::start();
    let mut c = s.connect();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(TB)
        .arg("user:1")
        .arg(10)
        .arg(5)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["user:1"]);
    let info = format!("{:?}", cmd(&mut c, &["COMMAND", "INFO", TB]).unwrap());
    assert!(
        !info.contains("denyoom"),
        "denials and peeks must keep answering under OOM"
    );
    for flag in ["write", "fast"] {
        assert!(info.contains(flag), "flag {flag} in {info}");
    }
    assert!(info.contains("int(-4)"), "arity -4 in {info}");
    let docs = format!("{:?}", cmd(&mut c, &["COMMAND", "DOCS", TB]).unwrap());
    for word in ["Token bucket", "capacity", "refill_per_sec", "optional"] {
        assert!(docs.contains(word), "{word} in {docs}");
    }
    // An ACL user limited to keys "app:*" may use the command on those keys only.
    cmd(
        &mut c,
        &[
            "ACL",
            "SETUSER",
            "app",
            "on",
            "nopass",
            "~app:*",
            "+rl.tokenbucket",
        ],
    )
    .unwrap();
    cmd(&mut c, &["AUTH", "app", "x"]).unwrap();
    assert!(cmd(&mut c, &[TB, "app:1", "10", "5"]).is_ok());
    assert!(
        cmd(&mut c, &[TB, "other:1", "10", "5"])
            .unwrap_err()
            .starts_with("NOPERM")
    );
}

#[test]
fn module_load_arguments_are_validated() {
    let s = Server::with(Options {
        without_module: true,
        ..Options::default()
    });
    let mut c = s.connect();
    let path = s.module_file();
    assert!(cmd(&mut c, &["MODULE", "LOAD", &path, "BOGUS"]).is_err());
    assert!(s.log().contains("unknown argument 'BOGUS'"), "{}", s.log());
    cmd(&mut c, &["MODULE", "LOAD", &path]).expect("loads without arguments");
    // Without TESTCLOCK there is no test clock and TIME is the real TIME.
    assert!(
        cmd(&mut c, &["RL.TESTCLOCK", "GET"])
            .unwrap_err()
            .starts_with("ERR unknown command")
    );
    let time: Vec<String> = redis::cmd("TIME").query(&mut c).unwrap();
    let secs: i64 = time[0].parse().unwrap();
    assert!((secs - now_us() / 1_000_000).abs() <= 2);
}

#[test]
fn test_clock_routes_time_for_clients_and_scripts() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, 1_234_567_890_123_456);
    let time: Vec<String> = redis::cmd("TIME").query(&mut c).unwrap();
    assert_eq!(time, ["1234567890", "123456"]);
    let from_script: Vec<String> = redis::cmd("EVAL")
        .arg("return redis.call('TIME')")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(from_script, ["1234567890", "123456"]);
}

/// The test clock is a write: a read-only replica and a read-only script refuse it (and the
/// `TIME` it stands in for), and its time is never before 0 or past 9 * 10^15 µs.
#[test]
fn the_test_clock_runs_only_where_writes_may_and_refuses_negative_times() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, 5_000_000);
    let range = Err(
        "ERR the test clock's time must be between 0 and 9000000000000000 (Unix microseconds)"
            .to_string(),
    );
    for args in [
        &["SET", "-1"][..],
        &["SET", "9000000000000001"],
        &["SET", "-9000000000000000"],
        &["ADVANCE", "-5000001"],
        &["ADVANCE", "8999999995000001"],
        &["ADVANCE", "-99999999999999999999"],
    ] {
        let mut argv = vec!["RL.TESTCLOCK"];
        argv.extend(args);
        assert_eq!(cmd(&mut c, &argv), range, "{args:?}");
        assert_eq!(
            cmd(&mut c, &["RL.TESTCLOCK", "GET"]),
            Ok(Value::Int(5_000_000))
        );
    }
    // Backwards is a clock step, down to 0.
    assert_eq!(
        cmd(&mut c, &["RL.TESTCLOCK", "ADVANCE", "-5000000"]),
        Ok(Value::Int(0))
    );
    assert_eq!(
        cmd(&mut c, &["RL.TESTCLOCK", "SET", "9000000000000000"]),
        Ok(Value::Int(9_000_000_000_000_000))
    );
    set_clock(&mut c, 1_234_567_890_123_456);

    let Ok(Value::Array(info)) = cmd(&mut c, &["COMMAND", "INFO", "rl.testclock"]) else {
        panic!("COMMAND INFO");
    };
    let Value::Array(fields) = &info[0] else {
        panic!("{info:?}");
    };
    let flags: Vec<String> = redis::from_redis_value_ref(&fields[2]).unwrap();
    assert_eq!(flags, ["write", "module", "fast"]);
    // Read-only scripts: EVAL_RO, and a script flagged no-writes.
    for (command, script) in [
        ("EVAL_RO", "return redis.call('TIME')"),
        ("EVAL_RO", "return redis.call('RL.TESTCLOCK', 'GET')"),
        ("EVAL", "#!lua flags=no-writes\nreturn redis.call('TIME')"),
    ] {
        let refused = cmd(&mut c, &[command, script, "0"]).unwrap_err();
        assert!(
            refused.starts_with("ERR Write commands are not allowed from read-only scripts."),
            "{command} {script}: {refused}"
        );
    }
    // A read-only replica.
    let replica = Server::with_test_clock();
    replica.replicate_from(&s);
    let mut r = replica.connect();
    let readonly = Err("READONLY You can't write against a read only replica.".to_string());
    assert_eq!(cmd(&mut r, &["RL.TESTCLOCK", "SET", "1"]), readonly);
    assert_eq!(cmd(&mut r, &["TIME"]), readonly);
    // Its master still reads and moves it.
    let time: Vec<String> = redis::cmd("TIME").query(&mut c).unwrap();
    assert_eq!(time, ["1234567890", "123456"]);
}

#[test]
fn out_of_memory_refuses_writes_but_answers_denials_and_peeks() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    tb(&mut c, "k", &["10", "5", "9"]);
    let before = stored(&mut c, "k");
    cmd(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let oom = Err("OOM command not allowed when used memory > 'maxmemory'.".to_string());
    assert_eq!(
        cmd(&mut c, &[TB, "k", "10", "5", "1"]),
        oom,
        "an admitted call must write"
    );
    assert_eq!(cmd(&mut c, &[TB, "new", "10", "5"]), oom);
    assert_eq!(
        tb(&mut c, "k", &["10", "5", "0"]),
        [1, 1, 0, 1800, 10],
        "a peek still answers"
    );
    assert_eq!(
        tb(&mut c, "k", &["10", "5", "5"]),
        [0, 1, 800, 1800, 10],
        "a denial still answers"
    );
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(cmd(&mut c, &["EXISTS", "new"]), Ok(Value::Int(0)));
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    assert_eq!(tb(&mut c, "k", &["10", "5", "1"]), [1, 0, 0, 2000, 10]);
}
