//! RL.SLIDINGLOG on a real redis-server.

mod harness;

use std::thread;
use std::time::Duration;

use harness::*;
use redis::Value;

const SL: &str = "RL.SLIDINGLOG";
/// A test-clock time a day ahead of the real clock, so absolute expiries are in the future.
fn future() -> i64 {
    (now_us() / 1_000_000 + 86_400) * 1_000_000
}

fn sl(c: &mut redis::Connection, key: &str, args: &[&str]) -> Vec<i64> {
    let mut full = vec![SL, key];
    full.extend_from_slice(args);
    ints(&cmd(c, &full))
}

fn text(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect()
}

#[test]
fn three_per_ten_seconds_with_exact_time() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let t0 = future();
    set_clock(&mut c, t0);
    assert_eq!(sl(&mut c, "k", &["3", "10"]), [1, 2, 0, 10_000, 3]);
    advance_clock(&mut c, 1_000_000);
    assert_eq!(sl(&mut c, "k", &["3", "10"]), [1, 1, 0, 10_000, 3]);
    advance_clock(&mut c, 1_500_000);
    assert_eq!(sl(&mut c, "k", &["3", "10"]), [1, 0, 0, 10_000, 3]);
    advance_clock(&mut c, 500_000);
    // Full; the oldest (t0) leaves 7 s from now, the newest (t0 + 2.5 s) 9.5 s from now.
    assert_eq!(sl(&mut c, "k", &["3", "10"]), [0, 0, 7_000, 9_500, 3]);
    assert_eq!(
        sl(&mut c, "k", &["3", "10", "2"]),
        [0, 0, 8_000, 9_500, 3],
        "two free slots need the 2nd oldest (t0 + 1 s) gone"
    );
    assert_eq!(sl(&mut c, "k", &["3", "10", "4"]), [0, 0, -1, 9_500, 3]);
    advance_clock(&mut c, 7_000_000);
    assert_eq!(sl(&mut c, "k", &["3", "10"]), [1, 0, 0, 10_000, 3]);
    assert_eq!(
        sl(&mut c, "other", &["3", "10"]),
        [1, 2, 0, 10_000, 3],
        "another key is untouched"
    );
}

#[test]
fn admits_exactly_limit_in_any_window() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let t0 = future();
    let (limit, window_us) = (5usize, 1_000_000i64);
    let mut admitted = Vec::new();
    let mut denied = Vec::new();
    // Requests at uneven instants over 12 seconds: bursts, gaps, and exact window boundaries.
    let mut now = t0;
    for i in 0..600i64 {
        now += match i % 7 {
            0 => 0,
            1 => 1,
            2 => 37_003,
            3 => 1_000_000 - 37_004,
            4 => 211_111,
            5 => 5_000,
            _ => 999,
        };
        set_clock(&mut c, now);
        if sl(&mut c, "sweep", &["5", "1"])[0] == 1 {
            admitted.push(now);
        } else {
            denied.push(now);
        }
    }
    let in_window = |end: i64| {
        admitted
            .iter()
            .filter(|&&a| a <= end && end < a + window_us)
            .count()
    };
    // The busiest window of length 1 s ends at an admitted instant: check every one.
    let busiest = admitted.iter().map(|&a| in_window(a)).max().unwrap();
    assert_eq!(busiest, limit, "never more than the limit, and reached");
    // Exact, not conservative: every denial happened with a full window.
    for &d in &denied {
        assert_eq!(in_window(d), limit, "denied at {d} with room in the window");
    }
    assert!(admitted.len() > 50 && denied.len() > 50);
}

#[test]
fn retry_after_is_exact_to_the_millisecond() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    for (i, offset) in [0i64, 1, 123, 999, 1_000, 456_789].into_iter().enumerate() {
        let key = format!("r{i}");
        let t0 = future() + offset;
        set_clock(&mut c, t0);
        sl(&mut c, &key, &["2", "10", "1"]);
        advance_clock(&mut c, 3_333_333);
        sl(&mut c, &key, &["2", "10", "1"]);
        advance_clock(&mut c, 1_111);
        let denied = sl(&mut c, &key, &["2", "10", "1"]);
        assert_eq!(denied[0], 0);
        let retry = denied[2];
        assert!(retry > 0);
        let start = t0 + 3_333_333 + 1_111;
        set_clock(&mut c, start + (retry - 1) * 1000);
        assert_eq!(sl(&mut c, &key, &["2", "10"])[0], 0, "1 ms early: denied");
        set_clock(&mut c, start + retry * 1000);
        assert_eq!(
            sl(&mut c, &key, &["2", "10"])[0],
            1,
            "at retry_after: admitted"
        );
    }
}

#[test]
fn stored_entries_and_expiry() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let t = future() + 1;
    set_clock(&mut c, t);
    sl(&mut c, "k", &["10", "1.5", "2"]);
    sl(&mut c, "k", &["10", "1.5", "1"]);
    let ts = t.to_string();
    assert_eq!(
        text(&zset_bytes(&mut c, "k")),
        [
            format!("{ts}:0"),
            ts.clone(),
            format!("{ts}:1"),
            ts.clone(),
            format!("{ts}:2"),
            ts.clone()
        ]
    );
    // The newest entry leaves 1.5 s after t; the expiry rounds t up to the next millisecond.
    assert_eq!(pexpiretime(&mut c, "k"), (t + 999) / 1000 + 1_500);

    // 1.5 s later the old entries have left: an admitted call trims them.
    advance_clock(&mut c, 1_500_000);
    assert_eq!(sl(&mut c, "k", &["10", "1.5"]), [1, 9, 0, 1_500, 10]);
    let t2 = (t + 1_500_000).to_string();
    assert_eq!(text(&zset_bytes(&mut c, "k")), [format!("{t2}:0"), t2]);
}

#[test]
fn denial_and_peek_write_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, future());
    assert_eq!(sl(&mut c, "k", &["3", "10", "3"]), [1, 0, 0, 10_000, 3]);
    advance_clock(&mut c, 5_000_000);
    sl(&mut c, "k", &["5", "10", "1"]);
    // Now the first three entries are out of a 4 s window, but a denial must not trim them.
    let before = zset_bytes(&mut c, "k");
    let expiry = pexpiretime(&mut c, "k");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    assert_eq!(sl(&mut c, "k", &["1", "4", "1"]), [0, 0, 4_000, 4_000, 1]);
    assert_eq!(sl(&mut c, "k", &["1", "4", "2"]), [0, 0, -1, 4_000, 1]);
    assert_eq!(sl(&mut c, "k", &["1", "4", "0"]), [1, 0, 0, 4_000, 1]);
    assert_eq!(sl(&mut c, "k", &["9", "4", "0"]), [1, 8, 0, 4_000, 9]);
    assert_eq!(zset_bytes(&mut c, "k"), before);
    assert_eq!(pexpiretime(&mut c, "k"), expiry);
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(sl(&mut c, "fresh", &["3", "10", "0"]), [1, 3, 0, 0, 3]);
    assert_eq!(
        cmd(&mut c, &["EXISTS", "fresh"]),
        Ok(Value::Int(0)),
        "a peek creates nothing"
    );
}

#[test]
fn bad_arguments_get_clear_errors_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, future());
    sl(&mut c, "k", &["10", "5", "3"]);
    let before = zset_bytes(&mut c, "k");
    let arity = "ERR wrong number of arguments for 'rl.slidinglog' command";
    let window = "ERR window_sec must be greater than 0 and at most 10000000000";
    let cases: &[(&[&str], &str)] = &[
        (&["k"], arity),
        (&["k", "10"], arity),
        (&["k", "10", "5", "1", "1"], arity),
        (&["k", "ten", "5"], "ERR limit must be an integer"),
        (&["k", "1.5", "5"], "ERR limit must be an integer"),
        (&["k", "0", "5"], "ERR limit must be between 1 and 10000"),
        (
            &["k", "10001", "5"],
            "ERR limit must be between 1 and 10000",
        ),
        (&["k", "-3", "5"], "ERR limit must be between 1 and 10000"),
        (&["k", "10", "nan"], "ERR window_sec must be a number"),
        (&["k", "10", "inf"], "ERR window_sec must be a number"),
        (&["k", "10", ""], "ERR window_sec must be a number"),
        (&["k", "10", "0"], window),
        (&["k", "10", "-1"], window),
        (&["k", "10", "1e400"], window),
        (&["k", "10", "10000000001"], window),
        (
            &["k", "10", "0.0004"],
            "ERR window_sec must be at least 1 millisecond",
        ),
        (
            &["k", "10", "5", "-1"],
            "ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)",
        ),
        (
            &["k", "10000", "5", "1001"],
            "ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)",
        ),
        (&["k", "10", "5", "1.0"], "ERR cost must be an integer"),
    ];
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script("sliding_log.lua"))
        .query(&mut c)
        .unwrap();
    for (args, expected) in cases {
        let mut full = vec![SL];
        full.extend_from_slice(args);
        assert_eq!(cmd(&mut c, &full), Err(expected.to_string()), "{args:?}");
        let mut script = vec!["EVALSHA", &sha, "1"];
        script.extend_from_slice(args);
        assert_eq!(
            cmd(&mut c, &script),
            Err(expected.to_string()),
            "Lua {args:?}"
        );
    }
    assert_eq!(zset_bytes(&mut c, "k"), before);
}

#[test]
fn wrong_type_and_corrupt_state_are_reported_not_overwritten() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let now = future();
    set_clock(&mut c, now);
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    cmd(&mut c, &["SET", "str", "x"]).unwrap();
    assert_eq!(cmd(&mut c, &[SL, "str", "10", "5"]), Err(wrongtype.into()));
    cmd(&mut c, &["HSET", "hash", "tokens", "1"]).unwrap();
    assert_eq!(cmd(&mut c, &[SL, "hash", "10", "5"]), Err(wrongtype.into()));

    let score_err = "ERR corrupt rate limiter state: sorted set score is not a valid timestamp";
    let member_err = "ERR corrupt rate limiter state: sorted set member is not '<score>:<n>'";
    let ahead_err = "ERR corrupt rate limiter state: sorted set score is further ahead of the server's clock than any call writes";
    let leases = "WRONGTYPE the key holds RL.ACQUIRE state, not RL.SLIDINGLOG state";
    let ok = format!("{now}:0");
    let (minute, later) = (now + 60_000_000, now + 60_000_001);
    let (at_minute, past_minute) = (format!("{minute}:0"), format!("{later}:0"));
    let (minute, later) = (minute.to_string(), later.to_string());
    let corrupt: &[(&[&str], &str)] = &[
        (&["inf", "1:0"], score_err),
        (&["-inf", "1:0"], score_err),
        (&["-5", "1:0"], score_err),
        (&["1.5", "1:0"], score_err),
        (&["9007199254740994", "9007199254740994:0"], score_err),
        (&["100", "101:0"], member_err),
        (&["100", "100:"], member_err),
        (&["100", "100:-1"], member_err),
        (&["100", "+100:0"], member_err),
        (&["100", &"1:".repeat(100)], member_err),
        // A member without ':' is a lease id: the set is a lease set.
        (&["100", "x"], leases),
        (&["100", "100"], leases),
        // The newest entry is checked on every call, whatever is before it.
        (&["1", &ok, "2", "2:x"], member_err),
        // An entry a minute ahead of now is a clock that ran ahead; beyond, no call wrote it.
        (&[&later, &past_minute], ahead_err),
    ];
    for (i, (entries, expected)) in corrupt.iter().enumerate() {
        let key = format!("bad{i}");
        let mut zadd = vec!["ZADD", key.as_str()];
        zadd.extend_from_slice(entries);
        cmd(&mut c, &zadd).unwrap();
        // Every set the module writes has an expiry; these are given one too.
        cmd(&mut c, &["PEXPIRE", &key, "100000000"]).unwrap();
        let before = (zset_bytes(&mut c, &key), pexpiretime(&mut c, &key));
        assert_eq!(
            cmd(&mut c, &[SL, &key, "10", "5"]),
            Err(expected.to_string()),
            "{entries:?}"
        );
        assert_eq!(
            (zset_bytes(&mut c, &key), pexpiretime(&mut c, &key)),
            before,
            "left as it was"
        );
    }
    // A set without an expiry is not the module's, whatever its entries.
    cmd(&mut c, &["ZADD", "bare", &now.to_string(), &ok]).unwrap();
    assert_eq!(
        cmd(&mut c, &[SL, "bare", "10", "5"]),
        Err(
            "WRONGTYPE the key holds a sorted set without an expiry, which no rate limiter writes"
                .into()
        )
    );
    assert_eq!(
        zset_bytes(&mut c, "bare").len(),
        2,
        "one entry, left as it was"
    );
    // Well-formed entries written by someone else, with an expiry, are accepted and counted,
    // up to a minute ahead of now.
    cmd(&mut c, &["ZADD", "foreign", &now.to_string(), &ok]).unwrap();
    cmd(&mut c, &["ZADD", "foreign", &minute, &at_minute]).unwrap();
    cmd(&mut c, &["PEXPIRE", "foreign", "100000000"]).unwrap();
    assert_eq!(sl(&mut c, "foreign", &["10", "5"]), [1, 7, 0, 65_000, 10]);
}

#[test]
fn an_unmoved_expiry_is_propagated_once() {
    // Calls at one instant add entries but keep the expiry: ZADD each time, PEXPIREAT once.
    // A later call that trims every entry deletes the key with its expiry, which is then set
    // and propagated again.
    let master = Server::with_test_clock();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.connect();
    let mut r = replica.connect();
    set_clock(&mut m, future());
    for remaining in [9, 8, 7] {
        assert_eq!(sl(&mut m, "k", &["10", "60"])[..2], [1, remaining]);
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(calls_of(&mut r, "zadd"), 3);
    assert_eq!(calls_of(&mut r, "pexpireat"), 1);
    assert_eq!(zset_bytes(&mut r, "k"), zset_bytes(&mut m, "k"));
    assert_eq!(pexpiretime(&mut r, "k"), pexpiretime(&mut m, "k"));

    advance_clock(&mut m, 61_000_000);
    assert_eq!(sl(&mut m, "k", &["10", "60"])[..2], [1, 9]);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(calls_of(&mut r, "zremrangebyrank"), 1);
    assert_eq!(calls_of(&mut r, "pexpireat"), 2);
    assert_eq!(zset_bytes(&mut r, "k"), zset_bytes(&mut m, "k"));
    let entries: i64 = redis::cmd("ZCARD").arg("k").query(&mut m).unwrap();
    assert_eq!(entries, 1);
    assert_eq!(pexpiretime(&mut r, "k"), pexpiretime(&mut m, "k"));
}

#[test]
fn an_idle_key_expires_when_its_newest_entry_leaves_the_window() {
    let s = Server::start();
    let mut c = s.connect();
    assert_eq!(sl(&mut c, "idle", &["2", "0.2", "2"])[0..2], [1, 0]);
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut c).unwrap();
    assert!(ttl > 0 && ttl <= 201, "expires after 200 ms: {ttl}");
    thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd(&mut c, &["EXISTS", "idle"]), Ok(Value::Int(0)));
    assert_eq!(sl(&mut c, "idle", &["2", "0.2"]), [1, 1, 0, 200, 2]);
}

#[test]
fn the_largest_limit_fits_in_one_call_on_both_paths() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, future());
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script("sliding_log.lua"))
        .query(&mut c)
        .unwrap();
    // One call adds at most 1,000 entries: the largest log fills in 10 calls at one instant.
    let too_many = "ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)";
    assert_eq!(
        cmd(&mut c, &[SL, "big:m", "10000", "60", "10000"]),
        Err(too_many.into())
    );
    assert_eq!(
        cmd(
            &mut c,
            &["EVALSHA", &sha, "1", "big:l", "10000", "60", "10000"]
        ),
        Err(too_many.into())
    );
    for i in 1..=10 {
        let a = cmd(&mut c, &[SL, "big:m", "10000", "60", "1000"]);
        let b = cmd(
            &mut c,
            &["EVALSHA", &sha, "1", "big:l", "10000", "60", "1000"],
        );
        assert_eq!(ints(&a), [1, 10_000 - i * 1000, 0, 60_000, 10_000]);
        assert_eq!(a, b);
    }
    assert_eq!(zset_bytes(&mut c, "big:m"), zset_bytes(&mut c, "big:l"));
    let denied = cmd(&mut c, &[SL, "big:m", "10000", "60"]);
    assert_eq!(ints(&denied), [0, 0, 60_000, 60_000, 10_000]);
    assert_eq!(
        denied,
        cmd(&mut c, &["EVALSHA", &sha, "1", "big:l", "10000", "60"])
    );
}

/// Calls of `command` in `INFO commandstats` (0 before the first).
fn calls_of(c: &mut redis::Connection, command: &str) -> i64 {
    let stat = info_field(c, "commandstats", &format!("cmdstat_{command}"));
    stat.split(',')
        .find_map(|kv| kv.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn reads_far_from_both_ends_ask_the_sorted_set_index() {
    // A call walks at most 32 entries from either end of the set; past that it counts and
    // finds entries with ZCOUNT and ZREVRANGE, which Redis answers in O(log n).
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let t0 = future();
    set_clock(&mut c, t0);
    assert_eq!(
        sl(&mut c, "k", &["1000", "10", "600"]),
        [1, 400, 0, 10_000, 1000]
    );
    let (zcount, zrevrange) = (calls_of(&mut c, "zcount"), calls_of(&mut c, "zrevrange"));

    // 600 entries at one instant: a call at that instant numbers its entries after all 600.
    assert_eq!(
        sl(&mut c, "k", &["1000", "10", "1"]),
        [1, 399, 0, 10_000, 1000]
    );
    let t = t0.to_string();
    let score: Option<String> = redis::cmd("ZSCORE")
        .arg("k")
        .arg(format!("{t}:600"))
        .query(&mut c)
        .unwrap();
    assert_eq!(score, Some(t.clone()));
    assert_eq!(calls_of(&mut c, "zcount"), zcount + 1, "the tie count");

    // 1 s later, 500 entries are 100 too many: the one that must leave is 500th from the newest
    // and 101st from the oldest.
    advance_clock(&mut c, 1_000_000);
    set_clock(&mut c, t0 + 1_000_000);
    assert_eq!(
        sl(&mut c, "k", &["1000", "10", "500"]),
        [0, 399, 9_000, 9_000, 1000]
    );
    assert_eq!(
        calls_of(&mut c, "zrevrange"),
        zrevrange + 1,
        "the decisive entry"
    );

    // After the window, all 601 entries have left but a peek trims nothing: counting what is
    // still in the window asks ZCOUNT.
    set_clock(&mut c, t0 + 10_000_000);
    assert_eq!(sl(&mut c, "k", &["1000", "10", "0"]), [1, 1000, 0, 0, 1000]);
    assert_eq!(calls_of(&mut c, "zcount"), zcount + 2, "the window count");
    let len: i64 = redis::cmd("ZCARD").arg("k").query(&mut c).unwrap();
    assert_eq!(len, 601, "a peek trims nothing");
    // An admitted call removes as many old entries as it adds, and at least 128: the 601 are
    // gone after five calls (601 = 4 x 128 + 89), each call's work bounded.
    let mut lens = Vec::new();
    for i in 1..=5 {
        assert_eq!(
            sl(&mut c, "k", &["1000", "10", "1"]),
            [1, 1000 - i, 0, 10_000, 1000]
        );
        let len: i64 = redis::cmd("ZCARD").arg("k").query(&mut c).unwrap();
        lens.push(len);
    }
    assert_eq!(lens, [474, 347, 220, 93, 5]);
}

#[test]
fn entries_between_the_newest_and_the_decisive_one_are_counted_unread() {
    // A call reads the newest entry, and on a denial the one whose departure makes room; a
    // corrupt entry elsewhere is counted by its score and not reported.
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let now = future();
    set_clock(&mut c, now);
    let t = now.to_string();
    // "0:x" sorts before every member of the form "<score>:<n>" at its score.
    cmd(&mut c, &["ZADD", "k", &t, "0:x", &t, &format!("{t}:9")]).unwrap();
    cmd(&mut c, &["PEXPIRE", "k", "100000000"]).unwrap();
    assert_eq!(sl(&mut c, "k", &["3", "10"]), [1, 0, 0, 10_000, 3]);
    assert_eq!(
        cmd(&mut c, &[SL, "k", "3", "10"]),
        Err("ERR corrupt rate limiter state: sorted set member is not '<score>:<n>'".into()),
        "a denial reads the oldest of the window: the corrupt one"
    );
}
