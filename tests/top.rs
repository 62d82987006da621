//! `RL.TOP` and `ratelimit.top-slots` on a real server: exact counts for a known sequence (RL.ALL
//! counts the key of the limit that denied), the heaviest keys among far more keys than slots
//! with counts within the stated bound, RESET, the config at run time, in redis.conf and as a
//! load argument, bad values refused, a replica that starts empty, and an application user that
//! gets NOPERM.

mod harness;

use harness::{Options, Server, cmd, set_clock};
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
        Err("ERR count must be an integer between 1 and 100000, or RESET".to_string())
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
    // Two slots: "c" took the place of "b" and inherited its count as its error.
    assert_eq!(
        top(&mut c, &[]),
        [
            row("a", 3, 0, "RL.TOKENBUCKET", T0_MS, T0_MS),
            row("c", 3, 2, "RL.TOKENBUCKET", T0_MS, T0_MS),
        ]
    );
    for bad in ["-1", "100001", "x"] {
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
            .contains("top-slots must be an integer between 0 and 100000, not 'many'"),
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
                "100001"
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
