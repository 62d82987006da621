//! Keys written by release 0.1, which kept a limiter's numbers in a hash (one field per number):
//! every limiter of numbers reads them as they are, decides exactly as it does on the same state
//! in the string layout, leaves them untouched when it denies, and replaces them with the string
//! on its next write, in the module and in the Lua twins; replicas and the AOF carry keys of
//! both layouts through the change. Lease sets and sliding logs as every earlier version wrote
//! them (a lease is its id at its expiry, a log entry `<time>:<n>` at its time) are read and
//! carried on by the module and both Lua paths.

mod harness;

use harness::{Options, Server, cmd, ints, lua_script, pexpiretime, set_clock, stored};
use harness::{Stored, advance_clock, string_bytes};
use redis::Connection;

/// 2030, ahead of the real clock: no absolute expiry written here is already past.
const T0: i64 = 1_900_000_000_000_000;

struct Limiter {
    command: &'static str,
    script: &'static str,
    params: &'static [&'static str],
    /// The field names of the hash layout, in the order of the numbers in the string.
    fields: &'static [&'static str],
    /// A cost that a key in the generated state must deny.
    denied_cost: &'static str,
}

const LIMITERS: &[Limiter] = &[
    Limiter {
        command: "RL.TOKENBUCKET",
        script: "token_bucket.lua",
        params: &["10", "1"],
        fields: &["tokens", "ts"],
        denied_cost: "10",
    },
    Limiter {
        command: "RL.LEAKYBUCKET",
        script: "leaky_bucket.lua",
        params: &["10", "1"],
        fields: &["level", "ts"],
        denied_cost: "10",
    },
    Limiter {
        command: "RL.FIXEDWINDOW",
        script: "fixed_window.lua",
        params: &["10", "60"],
        fields: &["count", "start"],
        denied_cost: "10",
    },
    Limiter {
        command: "RL.SLIDINGWINDOW",
        script: "sliding_window.lua",
        params: &["10", "60"],
        fields: &["start", "cur", "prev"],
        denied_cost: "10",
    },
    Limiter {
        command: "RL.GCRA",
        script: "gcra.lua",
        params: &["4", "10", "1"],
        fields: &["tat"],
        denied_cost: "5",
    },
];

impl Limiter {
    fn call(&self, c: &mut Connection, key: &str, cost: &str) -> Vec<i64> {
        let mut args = vec![self.command, key];
        args.extend_from_slice(self.params);
        args.push(cost);
        ints(&cmd(c, &args))
    }

    fn eval(&self, c: &mut Connection, sha: &str, key: &str, cost: &str) -> Vec<i64> {
        let mut args = vec!["EVALSHA", sha, "1", key];
        args.extend_from_slice(self.params);
        args.push(cost);
        ints(&cmd(c, &args))
    }

    /// Three admitted calls on `key`, 50 ms apart: a state that is neither new nor full.
    fn warm_up(&self, c: &mut Connection, key: &str) {
        for _ in 0..3 {
            assert_eq!(self.call(c, key, "1")[0], 1, "{} warms up", self.command);
            advance_clock(c, 50_000);
        }
    }

    /// Rewrites the string at `from` as a hash at `to`, as release 0.1 stored the same numbers,
    /// with the same absolute expiry.
    fn write_legacy(&self, c: &mut Connection, from: &str, to: &str) {
        let value = String::from_utf8(string_bytes(c, from)).unwrap();
        // The numbers after the tag (release 0.1 wrote none).
        let numbers: Vec<&str> = value.split(' ').skip(1).collect();
        let mut hset = vec!["HSET", to];
        for (field, number) in self.fields.iter().zip(&numbers) {
            hset.extend([*field, *number]);
        }
        assert_eq!(hset.len(), 2 + 2 * numbers.len(), "{value}");
        cmd(c, &["DEL", to]).unwrap();
        cmd(c, &hset).unwrap();
        let at = pexpiretime(c, from).to_string();
        cmd(c, &["PEXPIREAT", to, &at]).unwrap();
    }
}

fn load_script(c: &mut Connection, name: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script(name))
        .query(c)
        .unwrap()
}

#[test]
fn a_release_0_1_hash_is_read_kept_on_denial_and_replaced_on_write() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    for l in LIMITERS {
        set_clock(&mut c, T0);
        let sha = load_script(&mut c, l.script);
        let (reference, module, twin) = (
            format!("{}:string", l.command),
            format!("{}:hash", l.command),
            format!("{}:hash-lua", l.command),
        );
        l.warm_up(&mut c, &reference);
        l.write_legacy(&mut c, &reference, &module);
        l.write_legacy(&mut c, &reference, &twin);
        let legacy = stored(&mut c, &module);
        let legacy_expiry = pexpiretime(&mut c, &module);
        assert_eq!(legacy.0, "hash");

        // A denial: the same reply as on the string layout, and the hash stays as it was.
        let denied = l.call(&mut c, &reference, l.denied_cost);
        assert_eq!(denied[0], 0, "{}: {denied:?}", l.command);
        assert_eq!(
            l.call(&mut c, &module, l.denied_cost),
            denied,
            "{}",
            l.command
        );
        assert_eq!(
            l.eval(&mut c, &sha, &twin, l.denied_cost),
            denied,
            "{}",
            l.command
        );
        for key in [&module, &twin] {
            assert_eq!(
                stored(&mut c, key),
                legacy,
                "{key}: a denial writes nothing"
            );
            assert_eq!(pexpiretime(&mut c, key), legacy_expiry, "{key}");
        }

        // An admitted call: the same reply, and the key becomes the string the reference holds.
        advance_clock(&mut c, 20_000);
        let admitted = l.call(&mut c, &reference, "1");
        assert_eq!(admitted[0], 1, "{}: {admitted:?}", l.command);
        assert_eq!(l.call(&mut c, &module, "1"), admitted, "{}", l.command);
        assert_eq!(l.eval(&mut c, &sha, &twin, "1"), admitted, "{}", l.command);
        let now_stored = stored(&mut c, &reference);
        assert_eq!(now_stored.0, "string");
        for key in [&module, &twin] {
            assert_eq!(
                stored(&mut c, key),
                now_stored,
                "{key} is rewritten as a string"
            );
            assert_eq!(
                pexpiretime(&mut c, key),
                pexpiretime(&mut c, &reference),
                "{key}"
            );
        }
    }
}

#[test]
fn replicas_and_the_aof_carry_both_layouts_through_the_upgrade() {
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
    let mut keys = Vec::new();
    for l in LIMITERS {
        let reference = format!("{}:string", l.command);
        l.warm_up(&mut m, &reference);
        for n in 0..2 {
            let key = format!("{}:hash{n}", l.command);
            l.write_legacy(&mut m, &reference, &key);
            keys.push(key);
        }
        keys.push(reference);
        // The first hash of each limiter is upgraded by a write; the second stays a hash.
        assert_eq!(l.call(&mut m, &format!("{}:hash0", l.command), "1")[0], 1);
    }
    let snapshot = |c: &mut Connection| -> Vec<(String, Stored, i64)> {
        keys.iter()
            .map(|k| (k.clone(), stored(c, k), pexpiretime(c, k)))
            .collect()
    };
    let before = snapshot(&mut m);
    let kinds: Vec<&str> = before
        .iter()
        .map(|(_, (kind, _), _)| kind.as_str())
        .collect();
    assert_eq!(
        kinds,
        ["string", "hash", "string"].repeat(LIMITERS.len()),
        "{before:?}"
    );
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.connect();
    assert_eq!(snapshot(&mut r), before, "the replica holds both layouts");
    drop((m, r));

    // Restarted from the AOF: both layouts come back as they were, and the remaining hashes
    // still upgrade on their next write.
    let dir = master.stop();
    let master = Server::start_in(dir, opts);
    let mut m = master.connect();
    assert_eq!(snapshot(&mut m), before, "the AOF replays both layouts");
    set_clock(&mut m, T0 + 1_000_000);
    for l in LIMITERS {
        let key = format!("{}:hash1", l.command);
        assert_eq!(l.call(&mut m, &key, "1")[0], 1, "{}", l.command);
        assert_eq!(stored(&mut m, &key).0, "string", "{key}");
    }
}

/// A call through the module (0), the twin's script (1) or the library's function (2).
fn via(c: &mut Connection, path: usize, command: &str, sha: &str, args: &[&str]) -> Vec<i64> {
    let function = command.to_ascii_lowercase().replace('.', "_");
    let mut argv: Vec<&str> = match path {
        0 => vec![command],
        1 => vec!["EVALSHA", sha, "1"],
        _ => vec!["FCALL", &function, "1"],
    };
    argv.extend_from_slice(args);
    match cmd(c, &argv) {
        Ok(redis::Value::Int(n)) => vec![n],
        reply => ints(&reply),
    }
}

#[test]
fn lease_sets_and_sliding_logs_of_earlier_versions_keep_working() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, T0);
    let acquire = load_script(&mut c, "acquire.lua");
    let release = load_script(&mut c, "release.lua");
    let log_script = load_script(&mut c, "sliding_log.lua");
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(lua_script("ratelimit.lua"))
        .query(&mut c)
        .unwrap();
    let at = |us: i64| us.to_string();
    for path in 0..3 {
        // Two leases taken before the upgrade, expiring in 20 s and 30 s, and the set's expiry
        // at the later one, as `ZADD` and `PEXPIREAT` replicated them.
        let gpu = format!("gpu:{path}");
        cmd(
            &mut c,
            &[
                "ZADD",
                &gpu,
                &at(T0 + 20_000_000),
                "job-1",
                &at(T0 + 30_000_000),
                "job-2",
            ],
        )
        .unwrap();
        cmd(&mut c, &["PEXPIREAT", &gpu, &at((T0 + 30_000_000) / 1000)]).unwrap();
        assert_eq!(
            via(
                &mut c,
                path,
                "RL.ACQUIRE",
                &acquire,
                &[&gpu, "3", "30", "job-3"]
            ),
            [1, 0, 0, 30_000, 3]
        );
        assert_eq!(pexpiretime(&mut c, &gpu), (T0 + 30_000_000) / 1000);
        // Full: a slot frees when job-1 expires.
        assert_eq!(
            via(
                &mut c,
                path,
                "RL.ACQUIRE",
                &acquire,
                &[&gpu, "3", "30", "job-4"]
            ),
            [0, 0, 20_000, 30_000, 3]
        );
        assert_eq!(
            via(&mut c, path, "RL.RELEASE", &release, &[&gpu, "job-1"]),
            [1]
        );
        assert_eq!(
            via(
                &mut c,
                path,
                "RL.ACQUIRE",
                &acquire,
                &[&gpu, "3", "30", "job-4"]
            ),
            [1, 0, 0, 30_000, 3]
        );

        // A sliding log of 60 s with two entries of one call 10 s ago and one 5 s ago.
        let log = format!("log:{path}");
        let (t1, t2) = (T0 - 10_000_000, T0 - 5_000_000);
        let (m1, m2, m3) = (format!("{t1}:0"), format!("{t1}:1"), format!("{t2}:0"));
        cmd(
            &mut c,
            &["ZADD", &log, &at(t1), &m1, &at(t1), &m2, &at(t2), &m3],
        )
        .unwrap();
        cmd(&mut c, &["PEXPIREAT", &log, &at((t2 + 60_000_000) / 1000)]).unwrap();
        assert_eq!(
            via(
                &mut c,
                path,
                "RL.SLIDINGLOG",
                &log_script,
                &[&log, "4", "60"]
            ),
            [1, 0, 0, 60_000, 4]
        );
        // Full: the entries of 10 s ago leave the window in 50 s.
        assert_eq!(
            via(
                &mut c,
                path,
                "RL.SLIDINGLOG",
                &log_script,
                &[&log, "4", "60"]
            ),
            [0, 0, 50_000, 60_000, 4]
        );
        assert_eq!(pexpiretime(&mut c, &log), (T0 + 60_000_000) / 1000);
    }
}
