//! Partial grants (`UPTO n` in place of the cost) on a real server: the module and its Lua twins
//! (`EVALSHA` of the script, `FCALL` of the library) grant the same units at the same instant,
//! reply the same six integers and store the same bytes; racing clients are granted exactly the
//! limit between them; bad `UPTO` arguments are refused the same way and change nothing.

mod harness;

use std::sync::{Arc, Barrier};

use harness::{Server, cmd, ints, lua_script, set_clock, stored};
use redis::Connection;

/// A test-clock instant ahead of the real clock (2030), so no absolute expiry is in the past.
const T0: i64 = 1_900_000_000_000_000;

/// Every limiter that takes a cost: its command, its script, and parameters under which a fresh
/// key admits exactly 10 units at one instant and nothing more for a long while.
const TEN: &[(&str, &str, &[&str])] = &[
    ("RL.TOKENBUCKET", "token_bucket.lua", &["10", "0.001"]),
    ("RL.LEAKYBUCKET", "leaky_bucket.lua", &["10", "0.001"]),
    ("RL.FIXEDWINDOW", "fixed_window.lua", &["10", "1000"]),
    ("RL.SLIDINGWINDOW", "sliding_window.lua", &["10", "1000"]),
    ("RL.GCRA", "gcra.lua", &["9", "1", "1000"]),
    ("RL.SLIDINGLOG", "sliding_log.lua", &["10", "1000"]),
];

/// How a call is made: the module's command, or its twin by script or by function.
#[derive(Clone, Copy, Debug)]
enum Path {
    Module,
    Script,
    Function,
}

const PATHS: [Path; 3] = [Path::Module, Path::Script, Path::Function];

/// Loads every twin's script and the `ratelimit` library; returns the scripts' SHA-1s by name.
fn load_twins(c: &mut Connection) -> Vec<(String, String)> {
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(lua_script("ratelimit.lua"))
        .query(c)
        .expect("FUNCTION LOAD");
    TEN.iter()
        .map(|(_, script, _)| {
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(lua_script(script))
                .query(c)
                .expect("SCRIPT LOAD");
            (script.to_string(), sha)
        })
        .collect()
}

/// One call of `command` on `key` with `args`, by `path`.
fn call(
    c: &mut Connection,
    shas: &[(String, String)],
    path: Path,
    (command, script): (&str, &str),
    key: &str,
    args: &[&str],
) -> harness::Reply {
    let mut argv: Vec<String> = match path {
        Path::Module => vec![command.into(), key.into()],
        Path::Script => {
            let sha = &shas.iter().find(|(s, _)| s == script).expect("loaded").1;
            vec!["EVALSHA".into(), sha.clone(), "1".into(), key.into()]
        }
        Path::Function => {
            let function = command.to_ascii_lowercase().replace('.', "_");
            vec!["FCALL".into(), function, "1".into(), key.into()]
        }
    };
    argv.extend(args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    cmd(c, &argv)
}

fn with(params: &[&str], tail: &[&str]) -> Vec<String> {
    params.iter().chain(tail).map(|s| s.to_string()).collect()
}

#[test]
fn each_limiter_grants_what_is_left_up_to_n_on_every_path() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let shas = load_twins(&mut c);
    set_clock(&mut c, T0);
    for &(command, script, params) in TEN {
        let mut replies: Vec<Vec<Vec<i64>>> = Vec::new();
        let mut states = Vec::new();
        for path in PATHS {
            let key = format!("{command}:{path:?}");
            let mut run = |tail: &[&str]| {
                let args = with(params, tail);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ints(&call(&mut c, &shas, path, (command, script), &key, &args))
            };
            let steps = vec![
                run(&["UPTO", "3"]),
                run(&["upto", "5"]),
                run(&["UPTO", "4"]),
                run(&["UPTO", "1"]),
                // The denial of one unit, as a call with a cost of 1 gets it.
                run(&["1"]),
            ];
            // [allowed, remaining, retry_after_ms, granted] of each grant.
            let short: Vec<[i64; 4]> = steps[..4]
                .iter()
                .map(|r| {
                    assert_eq!(r.len(), 6, "{command} {path:?}: {r:?}");
                    [r[0], r[1], r[2], r[5]]
                })
                .collect();
            assert_eq!(
                short[..3],
                [[1, 7, 0, 3], [1, 2, 0, 5], [1, 0, 0, 2]],
                "{command} {path:?}: {steps:?}"
            );
            // Nothing left: a denial of one unit, granted 0.
            assert_eq!(steps[3][..5], steps[4][..], "{command} {path:?}");
            assert_eq!(short[3][..2], [0, 0], "{command} {path:?}");
            assert!(short[3][2] > 0, "{command} {path:?}: a wait");
            assert_eq!(short[3][3], 0, "{command} {path:?}");
            assert_eq!(steps[4].len(), 5, "a call with a cost has five fields");
            assert_eq!(steps[0][4], 10, "{command}: the limit");
            replies.push(steps);
            states.push((stored(&mut c, &key), harness::pexpiretime(&mut c, &key)));
        }
        assert_eq!(replies[0], replies[1], "{command}: module and script");
        assert_eq!(replies[0], replies[2], "{command}: module and function");
        assert_eq!(
            states[0], states[1],
            "{command}: stored by module and script"
        );
        assert_eq!(
            states[0], states[2],
            "{command}: stored by module and function"
        );
    }
}

#[test]
fn a_grant_up_to_more_than_the_limit_takes_the_whole_limit_once() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let shas = load_twins(&mut c);
    set_clock(&mut c, T0);
    for &(command, script, params) in TEN {
        for path in PATHS {
            let key = format!("{command}:{path:?}");
            let mut run = |tail: &[&str]| {
                let args = with(params, tail);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ints(&call(&mut c, &shas, path, (command, script), &key, &args))
            };
            // A cost above the limit is never admitted; a grant up to it takes all there is.
            assert_eq!(run(&["11"])[..3], [0, 10, -1], "{command} {path:?}");
            let all = run(&["UPTO", "1000"]);
            assert_eq!((all[0], all[1], all[5]), (1, 0, 10), "{command} {path:?}");
            // A peek after it: nothing left, nothing granted, nothing written.
            assert_eq!(run(&["0"])[..2], [1, 0], "{command} {path:?}");
        }
    }
}

#[test]
fn bad_upto_arguments_are_refused_alike_and_change_nothing() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let shas = load_twins(&mut c);
    set_clock(&mut c, T0);
    let cases: &[(&[&str], &str)] = &[
        (
            &["UPTO", "0"],
            "ERR UPTO must be between 1 and 1000000000000000",
        ),
        (
            &["UPTO", "-2"],
            "ERR UPTO must be between 1 and 1000000000000000",
        ),
        (
            &["UPTO", "1000000000000001"],
            "ERR UPTO must be between 1 and 1000000000000000",
        ),
        (&["UPTO", "1.5"], "ERR UPTO must be an integer"),
        (&["UPTO", "x"], "ERR UPTO must be an integer"),
        (&["UPTO", ""], "ERR UPTO must be an integer"),
    ];
    for &(command, script, params) in TEN {
        let arity = format!(
            "ERR wrong number of arguments for '{}' command",
            command.to_ascii_lowercase()
        );
        let log = command == "RL.SLIDINGLOG";
        let mut all: Vec<(Vec<String>, String)> = cases
            .iter()
            .map(|(tail, e)| {
                let e = if log && e.contains("between") {
                    "ERR UPTO must be between 1 and 1000 for a sliding log (one entry per unit)"
                } else {
                    e
                };
                (with(params, tail), e.to_string())
            })
            .collect();
        // A cost and UPTO together: one argument too many.
        all.push((with(params, &["2", "UPTO", "3"]), arity.clone()));
        // UPTO without its count stands where the cost does; the count without parameters.
        all.push((
            with(params, &["UPTO"]),
            "ERR cost must be an integer".into(),
        ));
        all.push((vec!["UPTO".into(), "3".into()], arity.clone()));
        if log {
            all.push((
                with(params, &["UPTO", "1001"]),
                "ERR UPTO must be between 1 and 1000 for a sliding log (one entry per unit)".into(),
            ));
        }
        for (args, error) in &all {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            for path in PATHS {
                let key = format!("{command}:{path:?}");
                let reply = call(&mut c, &shas, path, (command, script), &key, &args);
                let text = reply.expect_err("an error");
                // A script's error carries where it was raised after the message.
                assert!(
                    text.starts_with(error.as_str()),
                    "{command} {path:?} {args:?}: {text}"
                );
                let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut c).unwrap();
                assert_eq!(exists, 0, "{command} {path:?} {args:?} wrote");
            }
        }
    }
}

/// `clients` connections ask for grants of 1 to 7 units in turn, all released at once, until
/// they are denied; returns what each was granted in all.
fn racing_grants(s: &Server, clients: usize, argv: &[String], count_at: usize) -> Vec<i64> {
    let start = Arc::new(Barrier::new(clients));
    let workers: Vec<_> = (0..clients)
        .map(|i| {
            let mut c = s.connect();
            let start = Arc::clone(&start);
            let argv = argv.to_vec();
            std::thread::spawn(move || {
                start.wait();
                let mut total = 0;
                for round in 0.. {
                    let mut argv = argv.clone();
                    argv[count_at] = (1 + (i + round) % 7).to_string();
                    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                    let r = ints(&cmd(&mut c, &argv));
                    assert_eq!(r[0] == 1, r[5] > 0, "{r:?}");
                    if r[0] == 0 {
                        break;
                    }
                    total += r[5];
                }
                total
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect()
}

#[test]
fn racing_clients_are_granted_exactly_the_limit_between_them() {
    // Limits of 500 that regain less than one unit while the test runs.
    let limits: &[(&str, &str, &[&str])] = &[
        ("RL.TOKENBUCKET", "token_bucket.lua", &["500", "0.0001"]),
        ("RL.LEAKYBUCKET", "leaky_bucket.lua", &["500", "0.0001"]),
        ("RL.FIXEDWINDOW", "fixed_window.lua", &["500", "100000"]),
        ("RL.SLIDINGWINDOW", "sliding_window.lua", &["500", "100000"]),
        ("RL.GCRA", "gcra.lua", &["499", "1", "100000"]),
        ("RL.SLIDINGLOG", "sliding_log.lua", &["500", "100000"]),
    ];
    let s = Server::start();
    let mut c = s.connect();
    let shas = load_twins(&mut c);
    for &(command, script, params) in limits {
        for path in PATHS {
            let key = format!("race:{command}:{path:?}");
            let head: Vec<String> = match path {
                Path::Module => vec![command.into(), key.clone()],
                Path::Script => {
                    let sha = &shas.iter().find(|(s, _)| s == script).unwrap().1;
                    vec!["EVALSHA".into(), sha.clone(), "1".into(), key.clone()]
                }
                Path::Function => vec![
                    "FCALL".into(),
                    command.to_ascii_lowercase().replace('.', "_"),
                    "1".into(),
                    key.clone(),
                ],
            };
            let mut argv = head;
            argv.extend(with(params, &["UPTO", "1"]));
            let count_at = argv.len() - 1;
            let granted = racing_grants(&s, 16, &argv, count_at);
            assert_eq!(
                granted.iter().sum::<i64>(),
                500,
                "{command} {path:?}: {granted:?}"
            );
        }
    }
}

/// `RL.ALL` on `keys` with `words` after them, by `path`.
fn all_call(
    c: &mut Connection,
    sha: &str,
    path: Path,
    keys: &[String],
    words: &[&str],
) -> harness::Reply {
    let mut argv: Vec<String> = match path {
        Path::Module => vec!["RL.ALL".into()],
        Path::Script => vec!["EVALSHA".into(), sha.into()],
        Path::Function => vec!["FCALL".into(), "rl_all".into()],
    };
    argv.push(keys.len().to_string());
    argv.extend(keys.iter().cloned());
    argv.extend(words.iter().map(|w| w.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    cmd(c, &argv)
}

/// An `RL.ALL` reply flattened: `allowed, denied_by`, then each limit's integers.
fn flat(reply: &harness::Reply) -> Vec<i64> {
    fn walk(v: &redis::Value, out: &mut Vec<i64>) {
        match v {
            redis::Value::Int(i) => out.push(*i),
            redis::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            other => panic!("{other:?}"),
        }
    }
    let mut out = Vec::new();
    walk(reply.as_ref().expect("a reply"), &mut out);
    out
}

#[test]
fn every_limit_of_rl_all_is_granted_the_fewest_any_has_left() {
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let _ = load_twins(&mut c);
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script("all.lua"))
        .query(&mut c)
        .unwrap();
    set_clock(&mut c, T0);
    let limits = [
        "TOKENBUCKET",
        "100",
        "0.001",
        "FIXEDWINDOW",
        "7",
        "1000",
        "SLIDINGLOG",
        "9",
        "1000",
        "GCRA",
        "19",
        "1",
        "1000",
    ];
    let mut results = Vec::new();
    for path in PATHS {
        let keys: Vec<String> = (0..4).map(|i| format!("all:{path:?}:{i}")).collect();
        let mut run = |tail: &[&str]| {
            let words: Vec<&str> = limits.iter().chain(tail).copied().collect();
            flat(&all_call(&mut c, &sha, path, &keys, &words))
        };
        // [allowed, denied_by, then per limit: allowed, remaining, retry, reset, limit, granted].
        let first = run(&["UPTO", "4"]);
        let second = run(&["upto", "5"]);
        let third = run(&["UPTO", "5"]);
        let denied = run(&["UPTO", "5"]);
        let remaining = |r: &[i64]| -> Vec<i64> { (0..4).map(|k| r[2 + 6 * k + 1]).collect() };
        let granted = |r: &[i64]| -> Vec<i64> { (0..4).map(|k| r[2 + 6 * k + 5]).collect() };
        assert_eq!(first[..2], [1, 0], "{path:?}: {first:?}");
        assert_eq!(granted(&first), [4, 4, 4, 4], "{path:?}");
        assert_eq!(remaining(&first), [96, 3, 5, 16], "{path:?}");
        // The window has 3 left: every limit is granted 3.
        assert_eq!(granted(&second), [3, 3, 3, 3], "{path:?}: {second:?}");
        assert_eq!(remaining(&second), [93, 0, 2, 13], "{path:?}");
        // Nothing left in the window: denied by it (limit 2) as a cost of 1 is, nothing taken.
        assert_eq!(third[..2], [0, 2], "{path:?}: {third:?}");
        assert_eq!(granted(&third), [0, 0, 0, 0], "{path:?}");
        assert_eq!(remaining(&third), [93, 0, 2, 13], "{path:?}");
        assert_eq!(third, denied, "{path:?}: a denial changes nothing");
        let stored: Vec<_> = keys.iter().map(|k| stored(&mut c, k)).collect();
        results.push((vec![first, second, third], stored));
    }
    assert_eq!(results[0], results[1], "module and script");
    assert_eq!(results[0], results[2], "module and function");
}

#[test]
fn racing_rl_all_grants_add_up_to_the_tightest_limit() {
    let s = Server::start();
    let mut c = s.connect();
    let _ = load_twins(&mut c);
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua_script("all.lua"))
        .query(&mut c)
        .unwrap();
    for path in PATHS {
        let keys: Vec<String> = (0..2).map(|i| format!("race:all:{path:?}:{i}")).collect();
        let mut argv: Vec<String> = match path {
            Path::Module => vec!["RL.ALL".into()],
            Path::Script => vec!["EVALSHA".into(), sha.clone()],
            Path::Function => vec!["FCALL".into(), "rl_all".into()],
        };
        argv.push("2".into());
        argv.extend(keys.iter().cloned());
        for w in [
            "SLIDINGLOG",
            "300",
            "100000",
            "TOKENBUCKET",
            "1000",
            "0.0001",
            "UPTO",
            "1",
        ] {
            argv.push(w.into());
        }
        let count_at = argv.len() - 1;
        let start = Arc::new(Barrier::new(16));
        let workers: Vec<_> = (0..16)
            .map(|i| {
                let mut c = s.connect();
                let start = Arc::clone(&start);
                let argv = argv.clone();
                std::thread::spawn(move || {
                    start.wait();
                    let mut total = 0;
                    for round in 0.. {
                        let mut argv = argv.clone();
                        argv[count_at] = (1 + (i + round) % 7).to_string();
                        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                        let r = flat(&cmd(&mut c, &argv));
                        // Both limits granted the same.
                        assert_eq!(r[7], r[13], "{r:?}");
                        if r[0] == 0 {
                            assert_eq!(r[7], 0);
                            break;
                        }
                        total += r[7];
                    }
                    total
                })
            })
            .collect();
        let granted: i64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(granted, 300, "{path:?}");
        // The bucket gave exactly what the log did.
        let peek = flat(&cmd(
            &mut c,
            &["RL.TOKENBUCKET", &keys[1], "1000", "0.0001", "0"],
        ));
        assert_eq!(peek[1], 700, "{path:?}: {peek:?}");
    }
}
