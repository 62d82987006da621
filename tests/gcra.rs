//! RL.GCRA on a real redis-server.

mod harness;

use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const GCRA: &str = "RL.GCRA";
/// A test-clock instant ahead of the real clock (2030), so no absolute expiry is in the past.
const T0: i64 = 1_900_000_000_000_000;

fn g(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![GCRA, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

#[test]
fn burst_then_exactly_one_per_emission_interval() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    // max_burst 4: 5 at once; 10 per second: one every 100 ms after that.
    let burst: Vec<Vec<i64>> = (0..6).map(|_| g(&mut c, "k", &["4", "10", "1"])).collect();
    assert_eq!(burst[0], [1, 4, 0, 100, 5]);
    assert_eq!(burst[4], [1, 0, 0, 500, 5]);
    assert_eq!(burst[5], [0, 0, 100, 500, 5]);

    for interval in 0..20 {
        advance_clock(&mut c, 99_999);
        assert_eq!(
            g(&mut c, "k", &["4", "10", "1"]),
            [0, 0, 1, 401, 5],
            "1 us early, interval {interval}"
        );
        advance_clock(&mut c, 1);
        assert_eq!(g(&mut c, "k", &["4", "10", "1"]), [1, 0, 0, 500, 5]);
        assert_eq!(g(&mut c, "k", &["4", "10", "1"])[0], 0, "only one");
    }

    // Called every millisecond for 3 s at a sustained overload: exactly 30 admitted, evenly.
    let mut admitted_at = Vec::new();
    for ms in 1..=3000 {
        advance_clock(&mut c, 1_000);
        if g(&mut c, "k", &["4", "10", "1"])[0] == 1 {
            admitted_at.push(ms);
        }
    }
    assert_eq!(admitted_at, (1..=30).map(|i| i * 100).collect::<Vec<_>>());
}

#[test]
fn an_idle_limiter_refills_its_burst() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(g(&mut c, "k", &["2", "3", "0.3", "3"]), [1, 0, 0, 300, 3]);
    advance_clock(&mut c, 150_000);
    assert_eq!(
        g(&mut c, "k", &["2", "3", "0.3", "0"]),
        [1, 1, 0, 150, 3],
        "half of it back"
    );
    advance_clock(&mut c, 150_000);
    assert_eq!(g(&mut c, "k", &["2", "3", "0.3", "3"]), [1, 0, 0, 300, 3]);
    assert_eq!(
        g(&mut c, "k", &["2", "3", "0.3", "4"]),
        [0, 0, -1, 300, 3],
        "more than the burst: never"
    );
}

#[test]
fn stored_state_and_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0 + 1);
    g(&mut c, "k", &["4", "3", "1", "2"]);
    // 1/3 s rounds up to 333334 us; two of them.
    assert_eq!(string_bytes(&mut c, "k"), b"gcra 1900000000666669".to_vec());
    // The first millisecond at which tat is no longer ahead of now.
    assert_eq!(pexpiretime(&mut c, "k"), 1_900_000_000_667);
    advance_clock(&mut c, 1_000_000);
    g(&mut c, "k", &["4", "3", "1"]);
    assert_eq!(
        string_bytes(&mut c, "k"),
        b"gcra 1900000001333335".to_vec(),
        "a stale tat counts from now"
    );
}

#[test]
fn an_idle_key_expires_and_comes_back_fresh() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(g(&mut c, "idle", &["1", "10", "1", "2"])[0..2], [1, 0]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(
        ttl > 0 && ttl <= 201,
        "expires when fresh again (200 ms): {ttl}"
    );
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    assert_eq!(g(&mut c, "idle", &["1", "10", "1"]), [1, 1, 0, 100, 2]);
}

#[test]
fn denial_and_cost_zero_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(g(&mut c, "fresh", &["4", "10", "1", "0"]), [1, 5, 0, 0, 5]);
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing"
    );

    assert_eq!(g(&mut c, "k", &["4", "10", "1", "5"]), [1, 0, 0, 500, 5]);
    let before = stored(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    assert_eq!(g(&mut c, "k", &["4", "10", "1"]), [0, 0, 100, 500, 5]);
    assert_eq!(g(&mut c, "k", &["4", "10", "1", "6"]), [0, 0, -1, 500, 5]);
    advance_clock(&mut c, 250_000);
    assert_eq!(g(&mut c, "k", &["4", "10", "1", "0"]), [1, 2, 0, 250, 5]);
    assert_eq!(g(&mut c, "k", &["4", "10", "1", "3"]), [0, 2, 50, 250, 5]);
    assert_eq!(stored(&mut c, "k"), before);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset
    );
    assert_eq!(g(&mut c, "k", &["4", "10", "1", "2"]), [1, 0, 0, 450, 5]);
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    g(&mut c, "k", &["4", "10", "1"]);
    let before = stored(&mut c, "k");
    let arity = "ERR wrong number of arguments for 'rl.gcra' command";
    let cases: &[(&[&str], &str)] = &[
        (&["k"], arity),
        (&["k", "4", "10"], arity),
        (&["k", "4", "10", "1", "1", "1"], arity),
        (&["k", "x", "10", "1"], "ERR max_burst must be an integer"),
        (&["k", "1.5", "10", "1"], "ERR max_burst must be an integer"),
        (
            &["k", "-1", "10", "1"],
            "ERR max_burst must be between 0 and 1000000000000000",
        ),
        (
            &["k", "4", "0", "1"],
            "ERR count_per_period must be between 1 and 1000000000000000",
        ),
        (
            &["k", "4", "1e3", "1"],
            "ERR count_per_period must be an integer",
        ),
        (&["k", "4", "10", "nan"], "ERR period_sec must be a number"),
        (&["k", "4", "10", "inf"], "ERR period_sec must be a number"),
        (
            &["k", "4", "10", "0"],
            "ERR period_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "4", "10", "-1"],
            "ERR period_sec must be greater than 0 and at most 1000000000000000",
        ),
        (
            &["k", "4", "10", "1", "-1"],
            "ERR cost must be between 0 and 1000000000000000",
        ),
        (&["k", "4", "10", "1", "one"], "ERR cost must be an integer"),
        (
            &["k", "4", "2000000", "1"],
            "ERR count_per_period / period_sec must be at most 1000000 per second",
        ),
        (
            &["k", "999", "1", "1e7"],
            "ERR (max_burst + 1) * period_sec / count_per_period must be at most 1000000000 seconds",
        ),
    ];
    for (args, expected) in cases {
        let mut full = vec![GCRA];
        full.extend_from_slice(args);
        assert_eq!(cmd(&mut c, &full), Err(expected.to_string()), "{args:?}");
    }
    assert_eq!(stored(&mut c, "k"), before);
}

#[test]
fn wrong_type_and_corrupt_state_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    cmd(&mut c, &["RPUSH", "list", "x"]).unwrap();
    assert_eq!(
        cmd(&mut c, &[GCRA, "list", "4", "10", "1"]),
        Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(
        cmd(&mut c, &["LRANGE", "list", "0", "-1"]),
        Ok(Value::Array(vec![Value::BulkString(b"x".to_vec())]))
    );
    let tat_err = "ERR corrupt rate limiter state: field 'tat' is not a valid timestamp";
    let corrupt: &[&[&str]] = &[
        &["tat", "abc"],
        &["tat", "-1"],
        &["tat", "1.5"],
        &["tat", "1e15"],
        &["tat", "inf"],
        &["tat", ""],
        &["tat", "8000000000000001"],
        &["other", "1"],
    ];
    for (i, fields) in corrupt.iter().enumerate() {
        let key = format!("bad{i}");
        let mut hset = vec!["HSET", key.as_str()];
        hset.extend_from_slice(fields);
        cmd(&mut c, &hset).unwrap();
        let before = stored(&mut c, &key);
        assert_eq!(
            cmd(&mut c, &[GCRA, &key, "4", "10", "1"]),
            Err(tat_err.to_string()),
            "{fields:?}"
        );
        assert_eq!(stored(&mut c, &key), before);
        assert_eq!(pexpiretime(&mut c, &key), -1);
    }
    let values: &[(&str, &str)] = &[
        ("", tat_err),
        ("x", tat_err),
        ("1.5", tat_err),
        ("-1", tat_err),
        ("1 1", tat_err),
        (" 1", tat_err),
        ("8000000000000001", tat_err),
    ];
    // The string layout: parts missing, extra or not numbers.
    assert_corrupt_values_reported(&mut c, GCRA, &["4", "10", "1"], values);
}

/// On Redis 7.2+ and Valkey a call decides at the time the server read as the call started, so
/// every call of one script decides at the script's instant (as the server judges its expiries);
/// Redis 7.0 has no such time for modules, and its calls read the clock each.
#[test]
fn the_calls_of_one_script_decide_at_its_start_where_the_server_keeps_that_time() {
    let s = Server::start();
    let mut c = s.connect();
    // Deny twice, some milliseconds of busy script apart (a loop: on 7.2+ and Valkey `TIME`
    // replies that same start time too, so the script cannot wait for it to move).
    let script = "redis.call('RL.GCRA', KEYS[1], 0, 1, 1000)
        local first = redis.call('RL.GCRA', KEYS[1], 0, 1, 1000)
        local x = 0
        for i = 1, 10000000 do x = x + i end
        local second = redis.call('RL.GCRA', KEYS[1], 0, 1, 1000)
        return {first[1], first[3], second[1], second[3]}";
    let got = ints(&cmd(&mut c, &["EVAL", script, "1", "frozen"]));
    assert_eq!((got[0], got[2]), (0, 0), "both denied: {got:?}");
    let (name, version) = server_identity(&mut c);
    if name == "redis" && version.starts_with("7.0.") {
        assert!(
            got[1] > got[3],
            "7.0 reads the clock for each call: {got:?}"
        );
    } else {
        assert_eq!(got[1], got[3], "{name} {version}: one instant: {got:?}");
        assert!(got[1] > 999_000, "{got:?}");
    }
}
