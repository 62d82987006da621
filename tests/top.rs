//! `RL.TOP` and `ratelimit.top-slots` on a real server: exact counts for a known sequence (RL.ALL
//! counts the key of the limit that denied), the heaviest keys among far more keys than slots
//! with counts within the stated bound, RESET, the config at run time, in redis.conf and as a
//! load argument, bad values refused, a replica that starts empty, an application user that
//! gets NOPERM, and one key name in two databases kept apart (`WITHDB` shows them).

mod harness;

use harness::{Options, Server, cmd, ints, set_clock};
use redis::{Connection, Value};

const T0: i64 = 1_900_000_000_000_000;
const T0_MS: i64 = T0 / 1000;

/// One entry as `(key, denied, error, command, first_denied_ms, last_denied_ms)`.
type Row = (String, i64, i64, String, i64, i64);

fn top(c: &mut Connection, args: &[&str]) -> Vec<Row> {
    let mut argv = vec!["RL.TOP"];
    argv.extend_from_slice(args);
    let Ok(Value::Array(entries)) = cmd(c, &argv) else {
        panic!("RL.TOP {args:?}");
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("{other:?}"),
    };
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("{other:?}"),
    };
    entries
        .iter()
        .map(|e| match e {
            Value::Array(f) if f.len() == 6 => (
                text(&f[0]),
                int(&f[1]),
                int(&f[2]),
                text(&f[3]),
                int(&f[4]),
                int(&f[5]),
            ),
            other => panic!("{other:?}"),
        })
        .collect()
}

fn row(key: &str, denied: i64, error: i64, command: &str, first: i64, last: i64) -> Row {
    (key.into(), denied, error, command.into(), first, last)
}

/// Denies `key` `n` times (a bucket of one that never refills, after its first call).
fn deny(c: &mut Connection, key: &str, n: usize) {
    cmd(c, &["RL.TOKENBUCKET", key, "1", "0.000001"]).unwrap();
    for _ in 0..n {
        cmd(c, &["RL.TOKENBUCKET", key, "1", "0.000001"]).unwrap();
    }
}

#[test]
fn a_known_sequence_gives_exact_counts_and_reset_clears_them() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    deny(&mut c, "tenant:a", 3);
    set_clock(&mut c, T0 + 5_000);
    deny(&mut c, "tenant:b", 1);
    cmd(&mut c, &["RL.GCRA", "tenant:g", "0", "1", "3600"]).unwrap();
    cmd(&mut c, &["RL.GCRA", "tenant:g", "0", "1", "3600"]).unwrap();
    // RL.ALL counts the key of the limit that denied: the second one.
    let all = [
        "RL.ALL",
        "2",
        "tenant:c",
        "tenant:b",
        "FIXEDWINDOW",
        "9",
        "60",
        "TOKENBUCKET",
        "1",
        "0.000001",
    ];
    cmd(&mut c, &all).unwrap();
    // An admitted call counts nothing.
    cmd(&mut c, &["RL.TOKENBUCKET", "tenant:d", "10", "1"]).unwrap();
    assert_eq!(
        top(&mut c, &[]),
        [
            row("tenant:a", 3, 0, "RL.TOKENBUCKET", T0_MS, T0_MS),
            row("tenant:b", 2, 0, "RL.ALL", T0_MS + 5, T0_MS + 5),
            row("tenant:g", 1, 0, "RL.GCRA", T0_MS + 5, T0_MS + 5),
        ]
    );
    assert_eq!(top(&mut c, &["1"]).len(), 1);
    assert_eq!(cmd(&mut c, &["RL.TOP", "RESET"]), Ok(Value::Okay));
    assert_eq!(top(&mut c, &[]), Vec::<Row>::new());
    assert_eq!(
        cmd(&mut c, &["RL.TOP", "0"]),
        Err("ERR count must be an integer between 1 and 1000, or RESET".to_string())
    );
}

#[test]
fn the_heaviest_of_far_more_keys_than_slots_are_listed_within_the_bound() {
    let s = Server::with(Options {
        test_clock: true,
        extra: vec!["top-slots".into(), "20".into()],
        ..Options::default()
    });
    let mut c = s.connect();
    set_clock(&mut c, T0);
    assert_eq!(
        cmd(&mut c, &["CONFIG", "GET", "ratelimit.top-slots"]),
        Ok(Value::Array(vec![
            Value::BulkString(b"ratelimit.top-slots".to_vec()),
            Value::BulkString(b"20".to_vec()),
        ]))
    );
    // 1,000 keys denied once each; 3 keys denied 100, 90 and 80 times, spread among them.
    let mut pipe = redis::pipe();
    let mut total = 0;
    for i in 0..1000 {
        let light = format!("light:{i}");
        for _ in 0..2 {
            pipe.cmd("RL.TOKENBUCKET")
                .arg(&light)
                .arg(1)
                .arg(0.000001)
                .ignore();
        }
        total += 1;
        for (h, n) in [(0, 100), (1, 90), (2, 80)] {
            if i % 10 == 0 && i / 10 < n {
                pipe.cmd("RL.TOKENBUCKET")
                    .arg(format!("heavy:{h}"))
                    .arg(1)
                    .arg(0.000001)
                    .ignore();
            }
        }
    }
    pipe.query::<()>(&mut c).unwrap();
    // Each heavy key's first call was admitted.
    total += 99 + 89 + 79;
    let bound = total / 20;
    let listed = top(&mut c, &["3"]);
    let keys: Vec<&str> = listed.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(keys, ["heavy:0", "heavy:1", "heavy:2"]);
    for ((_, denied, error, ..), real) in listed.iter().zip([99, 89, 79]) {
        assert!(*denied >= real && denied - error <= real, "{listed:?}");
        assert!(*error <= bound, "{listed:?} bound {bound}");
    }
}

#[test]
fn the_config_changes_at_run_time_and_loads_from_redis_conf() {
    let s = Server::with(Options {
        test_clock: true,
        extra: vec!["--ratelimit.top-slots".into(), "2".into()],
        ..Options::default()
    });
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let slots = |c: &mut Connection| -> String {
        let v: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("ratelimit.top-slots")
            .query(c)
            .unwrap();
        v[1].clone()
    };
    assert_eq!(slots(&mut c), "2");
    deny(&mut c, "a", 3);
    deny(&mut c, "b", 2);
    deny(&mut c, "c", 1);
    // Two slots: "c" took the place of "b" and inherited its count as its error; of equal
    // counts, the most recently counted is listed first.
    assert_eq!(
        top(&mut c, &[]),
        [
            row("c", 3, 2, "RL.TOKENBUCKET", T0_MS, T0_MS),
            row("a", 3, 0, "RL.TOKENBUCKET", T0_MS, T0_MS),
        ]
    );
    for bad in ["-1", "10001", "100000", "x"] {
        assert!(
            cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", bad]).is_err(),
            "{bad}"
        );
    }
    assert_eq!(slots(&mut c), "2");
    // Shrinking keeps the heaviest; 0 turns tracking off and empties the list.
    cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", "1"]).unwrap();
    assert_eq!(top(&mut c, &[]).len(), 1);
    cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", "0"]).unwrap();
    deny(&mut c, "a", 1);
    assert_eq!(top(&mut c, &[]), Vec::<Row>::new());
    cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", "5"]).unwrap();
    deny(&mut c, "z", 1);
    assert_eq!(top(&mut c, &[]).len(), 1);
    assert_eq!(slots(&mut c), "5");
}

#[test]
fn load_arguments_and_loadex_configs_set_the_slots_and_bad_ones_refuse_to_load() {
    let s = Server::with(Options {
        without_module: true,
        ..Options::default()
    });
    let mut c = s.connect();
    let path = s.module_file();
    assert!(cmd(&mut c, &["MODULE", "LOAD", &path, "top-slots", "many"]).is_err());
    assert!(
        s.log()
            .contains("top-slots must be an integer between 0 and 10000, not 'many'"),
        "{}",
        s.log()
    );
    assert!(
        cmd(
            &mut c,
            &[
                "MODULE",
                "LOADEX",
                &path,
                "CONFIG",
                "ratelimit.top-slots",
                "10001"
            ]
        )
        .is_err()
    );
    cmd(
        &mut c,
        &[
            "MODULE",
            "LOADEX",
            &path,
            "CONFIG",
            "ratelimit.top-slots",
            "9",
        ],
    )
    .expect("loads with the config");
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("ratelimit.top-slots")
        .query(&mut c)
        .unwrap();
    assert_eq!(v, ["ratelimit.top-slots", "9"]);
}

#[test]
fn a_replica_starts_empty_and_applications_get_noperm() {
    let master = Server::with_test_clock();
    let mut m = master.connect();
    set_clock(&mut m, T0);
    deny(&mut m, "k", 2);
    assert_eq!(top(&mut m, &[]).len(), 1);
    let replica = Server::start();
    replica.replicate_from(&master);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.connect();
    assert_eq!(cmd(&mut r, &["EXISTS", "k"]), Ok(Value::Int(1)));
    assert_eq!(top(&mut r, &[]), Vec::<Row>::new());

    // Redis 7.0 has no module ACL categories: there the app user is granted a limiter by name.
    let (name, version) = harness::server_identity(&mut m);
    let grant = if name == "redis" && version.starts_with("7.0.") {
        "+rl.tokenbucket"
    } else {
        "+@ratelimit"
    };
    assert_eq!(
        cmd(&mut m, &["ACL", "SETUSER", "app", "on", ">pw", "~*", grant]),
        Ok(Value::Okay)
    );
    let mut app = master.connect();
    cmd(&mut app, &["AUTH", "app", "pw"]).unwrap();
    assert!(matches!(
        cmd(&mut app, &["RL.TOKENBUCKET", "k2", "1", "1"]),
        Ok(Value::Array(_))
    ));
    // Servers word it differently ("User app has" or "this user has").
    let refused = cmd(&mut app, &["RL.TOP"]).unwrap_err();
    assert!(
        refused.starts_with("NOPERM ")
            && refused.ends_with("no permissions to run the 'rl.top' command"),
        "{refused}"
    );
}

/// `ratelimit_top_slots`, `ratelimit_top_keys` and `ratelimit_top_bytes` of `INFO ratelimit_top`.
fn top_info(c: &mut Connection) -> (u64, u64, u64) {
    let field = |c: &mut Connection, name: &str| -> u64 {
        let v = harness::info_field(c, "ratelimit_top", &format!("ratelimit_top_{name}"));
        v.parse().unwrap_or_else(|_| panic!("{name}: {v:?}"))
    };
    (field(c, "slots"), field(c, "keys"), field(c, "bytes"))
}

fn used_memory(c: &mut Connection) -> i64 {
    harness::info_field(c, "memory", "used_memory")
        .parse()
        .unwrap()
}

fn config_get(c: &mut Connection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    v[1].clone()
}

/// Denials of `n` distinct keys of `len` bytes (`tag`, then digits) that never exist: a cost
/// above the capacity is denied and writes nothing. In pipelines of 100 calls.
fn deny_distinct(c: &mut Connection, tag: &str, n: usize, len: usize) {
    for first in (0..n).step_by(100) {
        let mut pipe = redis::pipe();
        for i in first..(first + 100).min(n) {
            let mut key = format!("{tag}{i:08}:").into_bytes();
            key.resize(len.max(key.len()), b'x');
            pipe.cmd("RL.TOKENBUCKET")
                .arg(key)
                .arg(1)
                .arg(1)
                .arg(2)
                .ignore();
        }
        pipe.query::<()>(c).unwrap();
    }
}

/// A `CONFIG SET` of several configs that fails is rolled back by the server, which then sets
/// the old values again: `RL.TOP` is resized only once the server has kept a new value (its
/// config-change event), so a failed one leaves it whole.
#[test]
fn a_config_set_that_fails_leaves_rl_top_as_it_was() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    for i in 0..20 {
        deny(&mut c, &format!("k{i:02}"), 1);
    }
    assert_eq!(top(&mut c, &["100"]).len(), 20);
    let before = top(&mut c, &["100"]);
    // Refused while setting: a bad value after ours, or before it.
    for args in [
        ["ratelimit.top-slots", "5", "maxmemory-policy", "bogus"],
        ["maxmemory-policy", "bogus", "ratelimit.top-slots", "5"],
    ] {
        let mut argv = vec!["CONFIG", "SET"];
        argv.extend(args);
        let refused = cmd(&mut c, &argv).unwrap_err();
        assert!(
            refused.starts_with(
                "ERR CONFIG SET failed (possibly related to argument 'maxmemory-policy')"
            ),
            "{refused}"
        );
        assert_eq!(config_get(&mut c, "ratelimit.top-slots"), "128");
        assert_eq!(top(&mut c, &["100"]), before, "{args:?}");
        assert_eq!(top_info(&mut c).0, 128);
    }
    // Refused while applying: a port another socket holds.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let refused = cmd(
        &mut c,
        &["CONFIG", "SET", "ratelimit.top-slots", "5", "port", &port],
    )
    .unwrap_err();
    assert!(refused.starts_with("ERR CONFIG SET failed"), "{refused}");
    assert_eq!(config_get(&mut c, "ratelimit.top-slots"), "128");
    assert_eq!(top(&mut c, &["100"]), before);
    // Accepted: applied, with the other config.
    assert_eq!(
        cmd(
            &mut c,
            &[
                "CONFIG",
                "SET",
                "ratelimit.top-slots",
                "5",
                "maxmemory-policy",
                "allkeys-lru"
            ]
        ),
        Ok(Value::Okay)
    );
    assert_eq!(config_get(&mut c, "ratelimit.top-slots"), "5");
    assert_eq!(config_get(&mut c, "maxmemory-policy"), "allkeys-lru");
    // All counted once at one instant: the most recently counted are kept, and listed first.
    assert_eq!(top(&mut c, &["100"]), before[..5]);
    assert_eq!(before[0].0, "k19");
    assert_eq!(top_info(&mut c).0, 5);
    assert_eq!(top_info(&mut c).1, 5);
}

/// A key name longer than 64 bytes is kept as its first 64 and its hash: `RL.TOP`'s memory is
/// the same fixed figure whatever the names, reported in INFO, and denials (which never check
/// memory) allocate nothing: with `maxmemory` just above the data, they neither evict it nor
/// make writes fail.
#[test]
fn rl_top_memory_is_fixed_reported_and_never_grown_by_denials() {
    let s = Server::start();
    let mut c = s.connect();
    assert!(cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", "100000"]).is_err());
    let slots = redis_rate_limiter::observe::stats::MAX_TOP_SLOTS;
    let bytes = redis_rate_limiter::observe::top::Top::bytes_for(slots) as u64;
    let off = used_memory(&mut c);
    cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", "0"]).unwrap();
    let none = used_memory(&mut c);
    assert_eq!(top_info(&mut c), (0, 0, 0));
    cmd(
        &mut c,
        &["CONFIG", "SET", "ratelimit.top-slots", &slots.to_string()],
    )
    .unwrap();
    assert_eq!(top_info(&mut c), (slots as u64, 0, bytes));
    // What INFO reports is what the server counts (up to the allocator's rounding).
    let reserved = used_memory(&mut c) - none;
    assert!(
        reserved >= bytes as i64 && reserved < bytes as i64 + (1 << 20),
        "{reserved} for {bytes} reported (the default 128 slots took {})",
        off - none
    );

    // 20,000 denials on distinct 8 KiB keys: the slots fill, the bytes stay.
    cmd(&mut c, &["SET", "warm", "1"]).unwrap();
    deny_distinct(&mut c, "warmup:", 200, 8192);
    let start = used_memory(&mut c);
    deny_distinct(&mut c, "long:", 20_000, 8192);
    assert_eq!(top_info(&mut c), (slots as u64, slots as u64, bytes));
    let grown = used_memory(&mut c) - start;
    assert!(grown < 1 << 20, "used_memory grew by {grown}");
    assert_eq!(cmd(&mut c, &["DBSIZE"]), Ok(Value::Int(1)));
    // Listed as the first 64 bytes, `...` and 16 hex digits.
    let listed = top(&mut c, &["1000"]);
    assert_eq!(listed.len(), 1000);
    for (key, denied, error, ..) in &listed {
        let (kept, hash) = key.split_at(64);
        assert!(kept.starts_with("long:") && kept.ends_with('x'), "{key}");
        assert_eq!(hash.len(), 19, "{key}");
        assert!(hash.starts_with("...") && hash[3..].bytes().all(|b| b.is_ascii_hexdigit()));
        // Each key denied once, over the count of the one it replaced (at most 20,200 / 10,000).
        assert_eq!((*denied - error, *error <= 2), (1, true), "{key}");
    }

    // Under maxmemory just above what is used: denials evict nothing and writes still pass.
    for i in 0..1000 {
        cmd(&mut c, &["SET", &format!("data:{i}"), &"v".repeat(100)]).unwrap();
    }
    let limit = used_memory(&mut c) + (4 << 20);
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", &limit.to_string()]).unwrap();
    for policy in ["allkeys-lru", "noeviction"] {
        cmd(&mut c, &["CONFIG", "SET", "maxmemory-policy", policy]).unwrap();
        deny_distinct(&mut c, &format!("{policy}:"), 30_000, 8192);
        assert_eq!(cmd(&mut c, &["DBSIZE"]), Ok(Value::Int(1001)), "{policy}");
        assert_eq!(harness::info_field(&mut c, "stats", "evicted_keys"), "0");
        assert_eq!(
            harness::ints(&cmd(&mut c, &["RL.TOKENBUCKET", "write", "10", "1"]))[0],
            1,
            "{policy}: a write is admitted"
        );
        cmd(&mut c, &["DEL", "write"]).unwrap();
    }
    assert_eq!(top_info(&mut c).2, bytes);
    let (name, version) = harness::server_identity(&mut c);
    eprintln!(
        "{name} {version}: {slots} slots: {bytes} bytes reported, used_memory +{reserved} when \
         set, {grown:+} over 20,000 denials on 8 KiB names"
    );
}

/// No call on `RL.TOP` takes more than 10 ms of server time (SLOWLOG) at the largest values it
/// accepts: a list of 1,000 from a full table of long names, and resizes of a full table to
/// every size class, down and up.
#[test]
fn listing_and_resizing_stay_within_ten_milliseconds() {
    let s = Server::start();
    let mut c = s.connect();
    let max = redis_rate_limiter::observe::stats::MAX_TOP_SLOTS;
    cmd(
        &mut c,
        &["CONFIG", "SET", "ratelimit.top-slots", &max.to_string()],
    )
    .unwrap();
    cmd(&mut c, &["CONFIG", "SET", "slowlog-max-len", "16"]).unwrap();
    // Counts from 1 to 3, so there are several buckets, then a full table of long names.
    let mut fresh = 0;
    let mut fill = |c: &mut Connection| {
        for round in 0..3 {
            deny_distinct(c, &format!("r{fresh}:"), max - round * max / 3, 104);
        }
        fresh += 1;
        assert_eq!(top_info(c).1, top_info(c).0);
    };
    let mut worst: Vec<(String, i64)> = Vec::new();
    let mut timed = |c: &mut Connection, argv: &[&str]| {
        cmd(c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]).unwrap();
        cmd(c, &["SLOWLOG", "RESET"]).unwrap();
        assert!(cmd(c, argv).is_ok(), "{argv:?}");
        cmd(c, &["CONFIG", "SET", "slowlog-log-slower-than", "-1"]).unwrap();
        let log: Vec<(i64, i64, i64, Vec<String>)> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(16)
            .query::<Vec<Value>>(c)
            .unwrap()
            .iter()
            .map(|e| {
                redis::from_redis_value_ref::<(i64, i64, i64, Vec<String>)>(&match e {
                    Value::Array(f) => Value::Array(f[..4].to_vec()),
                    other => panic!("{other:?}"),
                })
                .unwrap()
            })
            .collect();
        let us = log
            .iter()
            .find(|e| e.3 == argv)
            .map(|e| e.2)
            .unwrap_or_else(|| panic!("{argv:?} not in {log:?}"));
        assert!(us < 10_000, "{argv:?} took {us} µs");
        worst.push((argv.join(" "), us));
    };
    fill(&mut c);
    timed(&mut c, &["RL.TOP", "1000"]);
    timed(&mut c, &["RL.TOP"]);
    for target in [
        max - 1,
        max,
        max / 2 + 1,
        max,
        max / 2 - 1,
        max,
        1,
        max,
        0,
        max,
    ] {
        if top_info(&mut c).1 < top_info(&mut c).0 {
            fill(&mut c);
        }
        timed(
            &mut c,
            &["CONFIG", "SET", "ratelimit.top-slots", &target.to_string()],
        );
    }
    fill(&mut c);
    timed(&mut c, &["RL.TOP", "RESET"]);
    let (name, version) = harness::server_identity(&mut c);
    eprintln!("{name} {version}: server time (µs) {worst:?}");
}

/// `MODULE UNLOAD` frees what the module allocated: after five cycles of load, a full `RL.TOP`
/// of long names and unload, the server's memory is where the first cycle left it.
#[test]
fn module_unload_frees_what_the_module_allocated() {
    if harness::skip_in_container("reads the server's memory across module loads") {
        return;
    }
    let s = Server::start();
    let mut c = s.connect();
    let module = s.module_file();
    let max = redis_rate_limiter::observe::stats::MAX_TOP_SLOTS.to_string();
    let (mut loaded, mut unloaded) = (Vec::new(), Vec::new());
    for cycle in 0..5 {
        cmd(&mut c, &["CONFIG", "SET", "ratelimit.top-slots", &max]).unwrap();
        deny_distinct(&mut c, &format!("c{cycle}:"), 5000, 1024);
        assert_eq!(top_info(&mut c).1, 5000);
        loaded.push(used_memory(&mut c));
        assert_eq!(
            cmd(&mut c, &["MODULE", "UNLOAD", "ratelimit"]),
            Ok(Value::Okay)
        );
        unloaded.push(used_memory(&mut c));
        assert_eq!(cmd(&mut c, &["MODULE", "LOAD", &module]), Ok(Value::Okay));
    }
    let (name, version) = harness::server_identity(&mut c);
    eprintln!("{name} {version}: used_memory loaded {loaded:?}, unloaded {unloaded:?}");
    let bytes = redis_rate_limiter::observe::top::Top::bytes_for(
        redis_rate_limiter::observe::stats::MAX_TOP_SLOTS,
    ) as i64;
    for (l, u) in loaded.iter().zip(&unloaded) {
        assert!(l - u >= bytes, "unloading freed {} of {bytes}", l - u);
    }
    for figures in [&loaded, &unloaded] {
        let drift = figures[4] - figures[0];
        assert!(drift.abs() < 1 << 20, "{figures:?}");
    }
    assert_eq!(config_get(&mut c, "ratelimit.top-slots"), "128");
}

/// A crash report may be written from another thread while a command runs, so the module's part
/// of it has the counters (atomics) and leaves out what `RL.TOP` holds, which only Redis's own
/// one-at-a-time callbacks touch; `INFO` itself still shows both.
#[test]
fn a_crash_report_has_the_counters_and_leaves_out_what_rl_top_holds() {
    let mut server = Server::with(Options {
        extra: vec!["--enable-debug-command".into(), "yes".into()],
        ..Options::default()
    });
    let mut c = server.connect();
    deny(&mut c, "crashed", 2);
    let (slots, keys, _) = top_info(&mut c);
    assert_eq!((slots, keys), (128, 1));
    assert!(cmd(&mut c, &["DEBUG", "SEGFAULT"]).is_err());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.is_running() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!server.is_running());
    let log = server.log();
    let report = log
        .split("------ MODULES INFO OUTPUT ------")
        .nth(1)
        .unwrap_or_else(|| panic!("no module info in the crash report:\n{log}"));
    assert!(
        report.contains(
            "ratelimit_rl_tokenbucket:calls=3,allowed=1,denied=2,errors=0,args=0,wrongtype=0,\
             corrupt=0,oom=0,internal=0"
        ),
        "{report}"
    );
    assert!(
        report.contains("ratelimit_rl_tokenbucket_denied:2"),
        "{report}"
    );
    assert!(!report.contains("ratelimit_top"), "{report}");
}

#[test]
fn rl_top_keeps_one_name_in_two_databases_apart() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let deny = |c: &mut Connection, db: &str, times: usize| {
        cmd(c, &["SELECT", db]).expect("SELECT");
        for _ in 0..times {
            let r = ints(&cmd(c, &["RL.TOKENBUCKET", "api", "1", "0.001", "5"]));
            assert_eq!(r[0], 0);
        }
    };
    deny(&mut c, "0", 3);
    deny(&mut c, "1", 2);
    deny(&mut c, "0", 1);
    let entry = |v: &Value| -> Vec<String> {
        match v {
            Value::Array(fields) => fields
                .iter()
                .map(|f| match f {
                    Value::Int(i) => i.to_string(),
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    };
    let list = |c: &mut Connection, args: &[&str]| -> Vec<Vec<String>> {
        match cmd(c, args) {
            Ok(Value::Array(entries)) => entries.iter().map(entry).collect(),
            other => panic!("{other:?}"),
        }
    };
    let t0_ms = (T0 / 1000).to_string();
    let with_db = list(&mut c, &["RL.TOP", "10", "WITHDB"]);
    assert_eq!(
        with_db,
        vec![
            vec!["api", "0", "4", "0", "RL.TOKENBUCKET", &t0_ms, &t0_ms],
            vec!["api", "1", "2", "0", "RL.TOKENBUCKET", &t0_ms, &t0_ms],
        ]
    );
    assert_eq!(list(&mut c, &["RL.TOP", "withdb"]), with_db);
    // Without WITHDB the entries are as before (six fields), still one per database.
    let plain = list(&mut c, &["RL.TOP"]);
    assert_eq!(
        plain,
        vec![
            vec!["api", "4", "0", "RL.TOKENBUCKET", &t0_ms, &t0_ms],
            vec!["api", "2", "0", "RL.TOKENBUCKET", &t0_ms, &t0_ms],
        ]
    );
    assert_eq!(
        cmd(&mut c, &["RL.TOP", "10", "RESET"]),
        Err("ERR the only option after count is WITHDB".to_string())
    );
    assert_eq!(
        cmd(&mut c, &["RL.TOP", "10", "WITHDB", "x"]),
        Err("ERR wrong number of arguments for 'rl.top' command".to_string())
    );
}
