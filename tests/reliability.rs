//! Reliability on real servers: restarts from AOF and RDB, replica promotion, panics, random
//! argument vectors.

mod harness;

use harness::*;
use redis::{Connection, Value};

/// A key, its value (whatever its type) and its absolute expiry.
type KeyState = (String, Value, i64);

/// Every key's value and absolute expiry, sorted by key.
fn snapshot(c: &mut Connection) -> Vec<KeyState> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let kind: String = redis::cmd("TYPE").arg(&k).query(c).unwrap();
            let value = match kind.as_str() {
                "hash" => cmd(c, &["HGETALL", &k]),
                "zset" => cmd(c, &["ZRANGE", &k, "0", "-1", "WITHSCORES"]),
                "string" => cmd(c, &["GET", &k]),
                other => panic!("unexpected type {other} of {k}"),
            }
            .unwrap();
            let at = pexpiretime(c, &k);
            (k, value, at)
        })
        .collect()
}

/// One call of each limiter command on `key` (all commands of the module), with a varying cost.
fn mixed_calls(i: u64, key: &str) -> Vec<Vec<String>> {
    let cost = (i % 4).to_string();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let mut calls = vec![
        s(&["RL.TOKENBUCKET", &format!("tb:{key}"), "5", "0.5", &cost]),
        s(&["RL.LEAKYBUCKET", &format!("lb:{key}"), "5", "0.5", &cost]),
        s(&["RL.FIXEDWINDOW", &format!("fw:{key}"), "5", "2.5", &cost]),
        s(&["RL.SLIDINGWINDOW", &format!("sw:{key}"), "5", "2.5", &cost]),
        s(&["RL.SLIDINGLOG", &format!("sl:{key}"), "5", "2.5", &cost]),
        s(&["RL.GCRA", &format!("gcra:{key}"), "3", "2", "1", &cost]),
        s(&["CL.THROTTLE", &format!("cl:{key}"), "3", "2", "1", &cost]),
    ];
    if i.is_multiple_of(5) {
        let route = format!("{{{key}}}:route:{}", i % 7);
        let client = format!("{{{key}}}:all");
        calls.push(s(&[
            "RL.ALL",
            "2",
            &route,
            &client,
            "TOKENBUCKET",
            "20",
            "2",
            "SLIDINGWINDOW",
            "5",
            "2.5",
        ]));
    }
    calls
}

/// A mixed workload over many keys with time moving: admitted, denied, peeking and multi-limit
/// calls of every command. Returns the number of calls made.
fn workload(c: &mut Connection, start: i64, rounds: u64) -> usize {
    set_clock(c, start);
    let mut calls = 0;
    for i in 0..rounds {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for call in mixed_calls(i, &format!("user:{}", i % 97)) {
            pipe.cmd(&call[0]).arg(&call[1..]);
            calls += 1;
        }
        let _: Vec<Value> = pipe.query(c).unwrap();
        advance_clock(c, 7_919 * (i as i64 % 13));
    }
    calls
}

#[test]
fn state_survives_restart_from_aof_and_from_rdb() {
    let opts = Options {
        test_clock: true,
        extra: vec!["--appendonly".into(), "yes".into()],
        ..Options::default()
    };
    let server = Server::with(opts.clone());
    let mut c = server.connect();
    // Far ahead of the real clock, so no key expires by the real clock during the test.
    workload(&mut c, now_us() + 86_400_000_000, 400);
    let dirty: i64 = info_field(&mut c, "persistence", "rdb_changes_since_last_save")
        .parse()
        .unwrap();
    assert!(
        dirty > 1000,
        "module writes mark the dataset dirty ({dirty})"
    );
    let before = snapshot(&mut c);
    assert!(before.len() > 90);
    cmd(&mut c, &["SAVE"]).unwrap();
    drop(c);
    let dir = server.stop();

    // Restart from the AOF.
    let server = Server::start_in(dir, opts);
    let mut c = server.connect();
    assert_eq!(snapshot(&mut c), before, "state reloaded from the AOF");
    drop(c);
    let dir = server.stop();

    // Restart from the RDB alone.
    let server = Server::start_in(
        dir,
        Options {
            test_clock: true,
            ..Options::default()
        },
    );
    let mut c = server.connect();
    assert_eq!(info_field(&mut c, "persistence", "aof_enabled"), "0");
    assert_eq!(snapshot(&mut c), before, "state reloaded from the RDB");
}

#[test]
fn a_replica_ends_byte_identical_after_ten_thousand_mixed_calls() {
    let master = Server::with_test_clock();
    let replica = Server::with_test_clock();
    replica.replicate_from(&master);
    let mut m = master.connect();
    let calls = workload(&mut m, now_us() + 86_400_000_000, 1_500);
    assert!(calls >= 10_000, "{calls} calls");
    let _: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut m).unwrap();
    let mut r = replica.connect();
    let on_master = snapshot(&mut m);
    assert!(on_master.len() > 150, "{} keys", on_master.len());
    assert_eq!(snapshot(&mut r), on_master);
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut r)
        .unwrap();
    // Strings of numbers and CL.THROTTLE: SET; the sliding log: ZADD and PEXPIREAT.
    for effect in ["cmdstat_set:", "cmdstat_zadd:", "cmdstat_pexpireat:"] {
        assert!(stats.contains(effect), "{effect} in {stats}");
    }
    assert!(
        !stats.contains("cmdstat_rl."),
        "the replica received effects, not commands: {stats}"
    );
}

#[test]
fn a_promoted_replica_continues_each_limit() {
    let master = Server::with_test_clock();
    let replica = Server::with_test_clock();
    replica.replicate_from(&master);
    let mut m = master.connect();
    let start = now_us() + 86_400_000_000;
    set_clock(&mut m, start);
    for _ in 0..7 {
        cmd(&mut m, &["RL.TOKENBUCKET", "k", "10", "1"]).unwrap();
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    drop(m);
    drop(master);

    let mut r = replica.connect();
    cmd(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    set_clock(&mut r, start + 2_000_000);
    // 3 left at the failover, 2 refilled since: 5, not a fresh 10.
    assert_eq!(
        ints(&cmd(&mut r, &["RL.TOKENBUCKET", "k", "10", "1", "0"])),
        [1, 5, 0, 5000, 10]
    );
    assert_eq!(
        ints(&cmd(&mut r, &["RL.TOKENBUCKET", "k", "10", "1", "5"]))[0..2],
        [1, 0]
    );
    assert_eq!(
        ints(&cmd(&mut r, &["RL.TOKENBUCKET", "k", "10", "1"]))[0],
        0
    );
}

#[test]
fn a_panic_inside_a_command_is_an_error_reply_not_a_crash() {
    let mut s = Server::with_test_clock();
    let mut c = s.connect();
    assert_eq!(
        cmd(&mut c, &["RL.TESTCLOCK", "PANIC"]),
        Err("ERR internal error in the rate limiter module (see the server log)".to_string())
    );
    assert_eq!(
        cmd(&mut c, &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
    assert!(s.is_running());
    assert_eq!(ints(&cmd(&mut c, &["RL.TOKENBUCKET", "k", "1", "1"]))[0], 1);
}

/// A small deterministic generator (xorshift) for argument vectors.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn arg(&mut self) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "",
            "0",
            "1",
            "-1",
            "10",
            "5",
            "0.5",
            "1e15",
            "1e16",
            "1e308",
            "1e-320",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "+inf",
            "infinity",
            "1.5",
            ".5",
            "5.",
            "-0",
            "+0",
            "0x10",
            " 1",
            "1 ",
            "1e",
            "e1",
            "99999999999999999999999999",
            "-99999999999999999999",
            "TOKENBUCKET",
            "COST",
            "tokenbucket",
            "9007199254740993",
            "4294967296",
            "18446744073709551616",
        ];
        match self.below(10) {
            0..=5 => WORDS[self.below(WORDS.len() as u64) as usize]
                .as_bytes()
                .to_vec(),
            6 => (0..self.below(40)).map(|_| self.below(256) as u8).collect(),
            7 => vec![b'9'; 1 + self.below(5000) as usize],
            8 => self.below(1 << 40).to_string().into_bytes(),
            _ => format!(
                "{}",
                (self.next() as f64) / (self.below(1000) as f64 + 0.5) - 1e9
            )
            .into_bytes(),
        }
    }
}

#[test]
fn random_argument_vectors_get_well_formed_replies_and_the_server_stays_up() {
    let mut s = Server::with_test_clock();
    let mut c = s.connect();
    let commands: &[&str] = &["RL.TOKENBUCKET", "RL.ALL"];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut sent, mut errors, mut decisions) = (0usize, 0usize, 0usize);
    for batch in 0..100 {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for _ in 0..1_000 {
            let name = commands[rng.below(commands.len() as u64) as usize];
            let cmd = pipe.cmd(name);
            for _ in 0..rng.below(12) {
                cmd.arg(rng.arg());
            }
        }
        let replies: Vec<Value> = pipe.query(&mut c).expect("the server answers every call");
        assert_eq!(replies.len(), 1_000, "batch {batch}");
        for r in &replies {
            match r {
                Value::ServerError(_) => errors += 1,
                Value::Array(items) if !items.is_empty() => decisions += 1,
                other => panic!("unexpected reply {other:?}"),
            }
        }
        sent += replies.len();
        advance_clock(&mut c, 1_000_003);
    }
    println!("{sent} random calls: {errors} errors, {decisions} decisions");
    assert_eq!(sent, 100_000);
    assert!(decisions > 0 && errors > 0);
    assert!(s.is_running());
    assert_eq!(
        cmd(&mut c, &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
    let errors_counted: u64 = info_field(&mut c, "ratelimit", "ratelimit_rl_tokenbucket")
        .split(',')
        .find_map(|kv| kv.strip_prefix("errors=").map(|v| v.parse().unwrap()))
        .unwrap();
    assert!(errors_counted > 0);
}

/// Per command, arguments whose first call creates a key that expires about 4 s later.
const FOUR_SECOND_KEYS: &[(&str, &[&str])] = &[
    ("RL.TOKENBUCKET", &["100", "0.25"]),
    ("RL.LEAKYBUCKET", &["100", "0.25"]),
    ("RL.FIXEDWINDOW", &["100", "4"]),
    ("RL.SLIDINGWINDOW", &["100", "2"]),
    ("RL.SLIDINGLOG", &["100", "4"]),
    ("RL.GCRA", &["100", "1", "4"]),
    ("CL.THROTTLE", &["100", "1", "4"]),
];

/// Creates `n` keys per command (pipelined), reports `MEMORY USAGE` per key for each (what every
/// allocator answers alike; `used_memory` deltas are not comparable across them), then checks
/// that all of them expire on their own.
fn keys_are_counted_and_expire(n: usize) {
    let s = Server::start();
    let mut c = s.connect();
    for (command, args) in FOUR_SECOND_KEYS {
        let keys_before: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        for chunk in 0..n.div_ceil(10_000) {
            let mut pipe = redis::pipe();
            for i in chunk * 10_000..((chunk + 1) * 10_000).min(n) {
                pipe.cmd(command)
                    .arg(format!("{command}:{i}"))
                    .arg(*args)
                    .ignore();
            }
            let () = pipe.query(&mut c).unwrap();
        }
        let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        assert!(
            (keys - keys_before) as usize > n * 9 / 10,
            "{command}: {keys} keys"
        );
        let sample: Vec<i64> = (0..n)
            .step_by((n / 100).max(1))
            .map(|i| {
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(format!("{command}:{i}"))
                    .query::<Option<i64>>(&mut c)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{command}:{i} is gone already"))
            })
            .collect();
        let per_key = sample.iter().sum::<i64>() as f64 / sample.len() as f64;
        println!("{n} {command} keys: {per_key:.0} bytes of MEMORY USAGE per key");
        assert!(
            per_key > 40.0 && per_key < 400.0,
            "{command}: {per_key} bytes per key"
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        if keys == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{keys} keys left after their TTLs"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn twenty_thousand_keys_per_command_are_small_and_all_expire() {
    keys_are_counted_and_expire(20_000);
}

/// `make soak`: the same with a million keys per command.
#[test]
#[ignore = "soak: run with make soak"]
fn a_million_keys_per_command_are_small_and_all_expire() {
    keys_are_counted_and_expire(1_000_000);
}

/// Each command with arguments that admit on a fresh key, and the same with cost 0 (a peek).
const EVERY_COMMAND: &[(&[&str], &[&str])] = &[
    (
        &["RL.TOKENBUCKET", "k1", "5", "1"],
        &["RL.TOKENBUCKET", "k1", "5", "1", "0"],
    ),
    (
        &["RL.LEAKYBUCKET", "k2", "5", "1"],
        &["RL.LEAKYBUCKET", "k2", "5", "1", "0"],
    ),
    (
        &["RL.FIXEDWINDOW", "k3", "5", "1"],
        &["RL.FIXEDWINDOW", "k3", "5", "1", "0"],
    ),
    (
        &["RL.SLIDINGWINDOW", "k4", "5", "1"],
        &["RL.SLIDINGWINDOW", "k4", "5", "1", "0"],
    ),
    (
        &["RL.SLIDINGLOG", "k5", "5", "1"],
        &["RL.SLIDINGLOG", "k5", "5", "1", "0"],
    ),
    (
        &["RL.GCRA", "k6", "4", "1", "1"],
        &["RL.GCRA", "k6", "4", "1", "1", "0"],
    ),
    (
        &["CL.THROTTLE", "k7", "4", "1", "1"],
        &["CL.THROTTLE", "k7", "4", "1", "1", "0"],
    ),
    (
        &[
            "RL.ALL",
            "2",
            "{k}8",
            "{k}9",
            "TOKENBUCKET",
            "5",
            "1",
            "GCRA",
            "4",
            "1",
            "1",
        ],
        &[
            "RL.ALL",
            "2",
            "{k}8",
            "{k}9",
            "TOKENBUCKET",
            "5",
            "1",
            "GCRA",
            "4",
            "1",
            "1",
            "COST",
            "0",
        ],
    ),
];

#[test]
fn over_maxmemory_every_command_refuses_writes_and_still_answers_peeks() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    cmd(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let oom = "OOM command not allowed when used memory > 'maxmemory'.";
    for (admit, peek) in EVERY_COMMAND {
        assert_eq!(cmd(&mut c, admit), Err(oom.to_string()), "{admit:?}");
        assert!(cmd(&mut c, peek).is_ok(), "{peek:?}");
    }
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(keys, 0, "nothing was written");
    cmd(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    for (admit, _) in EVERY_COMMAND {
        assert!(cmd(&mut c, admit).is_ok(), "{admit:?}");
    }
}
