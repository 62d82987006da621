//! Calls made to hurt the server or to mislead a caller, answered alike by the module and by both
//! Lua paths (`EVALSHA` of the twin's script, `FCALL` of the `ratelimit` library) on a real
//! server under the test clock:
//!
//! - `UPTO n` stands in for the cost only, never for a missing parameter;
//! - a number argument is at most 64 bytes (`MAX_NUMBER_LEN`): a longer one is refused as not a
//!   number, however long, and one of exactly 64 bytes is read as its value;
//! - a twin given far more arguments than any valid call allocates no more than for a valid one
//!   (it reads the same bounded part of them as the module);
//! - a sorted set that is not a lease set (a leaderboard, a job queue scored in seconds), even
//!   with an expiry, is refused by every lease command and left as it was;
//! - a denial's `retry_after` is a promise: from any state the limiter accepts, written under
//!   any parameters, the same call made exactly `retry_after` later is admitted.

mod harness;

use harness::{Reply, Server, advance_clock, call, cmd, ints, lua_script, set_clock, zset_bytes};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::{Connection, Value};

/// 2030, ahead of the real clock: no absolute expiry written here is already past.
const T0: i64 = 1_900_000_000_000_000;

/// How a command is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Module,
    Script,
    Function,
}

const VIAS: [Via; 3] = [Via::Module, Via::Script, Via::Function];

/// Every command with a twin: its script and its function.
const TWINS: &[(&str, &str, &str)] = &[
    ("RL.TOKENBUCKET", "token_bucket.lua", "rl_tokenbucket"),
    ("RL.LEAKYBUCKET", "leaky_bucket.lua", "rl_leakybucket"),
    ("RL.FIXEDWINDOW", "fixed_window.lua", "rl_fixedwindow"),
    ("RL.SLIDINGWINDOW", "sliding_window.lua", "rl_slidingwindow"),
    ("RL.SLIDINGLOG", "sliding_log.lua", "rl_slidinglog"),
    ("RL.GCRA", "gcra.lua", "rl_gcra"),
    ("CL.THROTTLE", "throttle.lua", "cl_throttle"),
    ("RL.ACQUIRE", "acquire.lua", "rl_acquire"),
    ("RL.RELEASE", "release.lua", "rl_release"),
    ("RL.ALL", "all.lua", "rl_all"),
    ("RL.SETTLE", "settle.lua", "rl_settle"),
];

/// A server with the module (and its test clock), every twin script loaded and the library.
struct Paths {
    server: Server,
    shas: Vec<(&'static str, String)>,
}

impl Paths {
    fn start() -> Paths {
        let server = Server::with_test_clock();
        let mut c = server.connect();
        let shas = TWINS
            .iter()
            .map(|(command, script, _)| {
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(lua_script(script))
                    .query(&mut c)
                    .expect("SCRIPT LOAD");
                (*command, sha)
            })
            .collect();
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(lua_script("ratelimit.lua"))
            .query(&mut c)
            .expect("FUNCTION LOAD");
        Paths { server, shas }
    }

    fn connect(&self) -> Connection {
        self.server.connect()
    }

    /// `command` with its keys and the arguments after them, through `via`.
    fn run(
        &self,
        c: &mut Connection,
        via: Via,
        command: &str,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Reply {
        let numkeys = keys.len().to_string();
        let counted = matches!(command, "RL.ALL" | "RL.SETTLE");
        let (_, _, function) = TWINS
            .iter()
            .find(|(name, ..)| *name == command)
            .expect("a command with a twin");
        let sha = &self
            .shas
            .iter()
            .find(|(name, _)| *name == command)
            .expect("its script")
            .1;
        let mut argv: Vec<&[u8]> = match via {
            Via::Module if counted => vec![command.as_bytes(), numkeys.as_bytes()],
            Via::Module => vec![command.as_bytes()],
            Via::Script => vec![b"EVALSHA", sha.as_bytes(), numkeys.as_bytes()],
            Via::Function => vec![b"FCALL", function.as_bytes(), numkeys.as_bytes()],
        };
        argv.extend(keys.iter().map(|k| k.as_bytes()));
        argv.extend_from_slice(args);
        call(c, &argv)
    }

    fn run_str(
        &self,
        c: &mut Connection,
        via: Via,
        command: &str,
        keys: &[&str],
        args: &[&str],
    ) -> Reply {
        let raw: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.run(c, via, command, keys, &raw)
    }
}

fn exists(c: &mut Connection, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS").arg(key).query(c).expect("EXISTS");
    n == 1
}

/// The limiters that take `UPTO n` in place of their cost, with valid parameters.
const UPTO_LIMITERS: &[(&str, &[&str])] = &[
    ("RL.TOKENBUCKET", &["100", "10"]),
    ("RL.LEAKYBUCKET", &["100", "10"]),
    ("RL.FIXEDWINDOW", &["100", "60"]),
    ("RL.SLIDINGWINDOW", &["100", "60"]),
    ("RL.SLIDINGLOG", &["100", "60"]),
    ("RL.GCRA", &["99", "100", "60"]),
];

#[test]
fn upto_stands_in_for_the_cost_and_never_for_a_missing_parameter() {
    let p = Paths::start();
    let mut c = p.connect();
    set_clock(&mut c, T0);
    for via in VIAS {
        for (command, params) in UPTO_LIMITERS {
            let arity = format!(
                "ERR wrong number of arguments for '{}' command",
                command.to_ascii_lowercase()
            );
            // Any one parameter left out (the probe's `RL.FIXEDWINDOW api 100 UPTO 5`), and all
            // but one: never admitted, never written.
            for missing in 0..params.len() {
                let key = format!("{via:?}:{command}:missing{missing}");
                let mut args: Vec<&str> = params.to_vec();
                args.remove(missing);
                args.extend(["UPTO", "5"]);
                assert_eq!(
                    p.run_str(&mut c, via, command, &[&key], &args),
                    Err(arity.clone()),
                    "{via:?} {command} {args:?}"
                );
                assert!(
                    !exists(&mut c, &key),
                    "{via:?} {command} {args:?} wrote its key"
                );
            }
            // A cost and UPTO: one argument too many, as before.
            let key = format!("{via:?}:{command}:both");
            let mut args: Vec<&str> = params.to_vec();
            args.extend(["1", "UPTO", "5"]);
            assert_eq!(
                p.run_str(&mut c, via, command, &[&key], &args),
                Err(arity.clone())
            );
            assert!(!exists(&mut c, &key));
            // The parameters and UPTO: a grant of 5 of the 100.
            let key = format!("{via:?}:{command}:whole");
            let mut args: Vec<&str> = params.to_vec();
            args.extend(["upto", "5"]);
            let reply = ints(&p.run_str(&mut c, via, command, &[&key], &args));
            assert_eq!(
                (reply[0], reply[1], reply[5]),
                (1, 95, 5),
                "{via:?} {command}: {reply:?}"
            );
        }
    }
}

/// `value` written with leading zeros (after its sign) to `len` bytes.
fn padded(value: &str, len: usize) -> String {
    let (sign, digits) = match value.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", value),
    };
    format!(
        "{sign}{}{digits}",
        "0".repeat(len - sign.len() - digits.len())
    )
}

/// A call: its command, its keys, its arguments, and the indexes of its numeric arguments.
type NumericCall = (
    &'static str,
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<usize>,
);

/// A call through a twin: its command, its script, its keys and its arguments.
type TwinCall<'a> = (&'a str, &'a str, Vec<&'a str>, Vec<&'a [u8]>);

/// Calls whose every numeric argument is checked.
fn numeric_calls() -> Vec<NumericCall> {
    vec![
        (
            "RL.TOKENBUCKET",
            vec!["k"],
            vec!["10", "5", "2"],
            vec![0, 1, 2],
        ),
        (
            "RL.LEAKYBUCKET",
            vec!["k"],
            vec!["10", "5", "2"],
            vec![0, 1, 2],
        ),
        (
            "RL.FIXEDWINDOW",
            vec!["k"],
            vec!["10", "60", "2"],
            vec![0, 1, 2],
        ),
        (
            "RL.SLIDINGWINDOW",
            vec!["k"],
            vec!["10", "60", "2"],
            vec![0, 1, 2],
        ),
        (
            "RL.SLIDINGLOG",
            vec!["k"],
            vec!["10", "60", "2"],
            vec![0, 1, 2],
        ),
        (
            "RL.GCRA",
            vec!["k"],
            vec!["9", "10", "60", "2"],
            vec![0, 1, 2, 3],
        ),
        (
            "RL.TOKENBUCKET",
            vec!["k"],
            vec!["10", "5", "UPTO", "3"],
            vec![3],
        ),
        (
            "CL.THROTTLE",
            vec!["k"],
            vec!["9", "10", "60", "2"],
            vec![0, 1, 2, 3],
        ),
        ("RL.ACQUIRE", vec!["k"], vec!["3", "30", "job"], vec![0, 1]),
        (
            "RL.ALL",
            vec!["k", "l"],
            vec![
                "TOKENBUCKET",
                "10",
                "5",
                "GCRA",
                "9",
                "10",
                "60",
                "COST",
                "2",
            ],
            vec![1, 2, 4, 5, 6, 8],
        ),
        (
            "RL.SETTLE",
            vec!["k"],
            vec!["FIXEDWINDOW", "10", "60", "DELTA", "-2"],
            vec![1, 2, 4],
        ),
    ]
}

#[test]
fn a_number_is_at_most_64_bytes_whatever_it_holds() {
    let p = Paths::start();
    let mut c = p.connect();
    set_clock(&mut c, T0);
    let mut case = 0;
    for via in VIAS {
        for (command, keys, args, numeric) in numeric_calls() {
            for &at in &numeric {
                let mut keyed = |suffix: &str| -> Vec<String> {
                    case += 1;
                    keys.iter()
                        .map(|k| format!("{k}:{case}:{suffix}"))
                        .collect()
                };
                let with = |value: String| -> Vec<String> {
                    let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
                    a[at] = value;
                    a
                };
                let mut run = |keys: Vec<String>, a: Vec<String>| -> Reply {
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let a: Vec<&[u8]> = a.iter().map(|s| s.as_bytes()).collect();
                    p.run(&mut c, via, command, &keys, &a)
                };
                let plain = run(keyed("plain"), with(args[at].to_string()));
                let wide = run(keyed("64"), with(padded(args[at], 64)));
                let not_a_number = run(keyed("x"), with("x".to_string()));
                let too_long = run(keyed("65"), with(padded(args[at], 65)));
                assert!(plain.is_ok(), "{via:?} {command} {args:?}: {plain:?}");
                assert_eq!(wide, plain, "{via:?} {command} argument {at} in 64 bytes");
                assert!(
                    not_a_number.is_err(),
                    "{via:?} {command} {at}: {not_a_number:?}"
                );
                assert_eq!(
                    too_long, not_a_number,
                    "{via:?} {command} argument {at} in 65 bytes"
                );
            }
        }
    }
    // However long: 16 MiB of zeros and a 5, refused as `x` is, on every path.
    let huge = padded("5", 16 << 20);
    for via in VIAS {
        let refused = p.run(
            &mut c,
            via,
            "RL.TOKENBUCKET",
            &["huge"],
            &[huge.as_bytes(), b"5"],
        );
        assert_eq!(
            refused,
            Err("ERR capacity must be an integer".to_string()),
            "{via:?}"
        );
        let refused = p.run(
            &mut c,
            via,
            "RL.GCRA",
            &["huge"],
            &[b"9", b"10", huge.as_bytes()],
        );
        assert_eq!(
            refused,
            Err("ERR period_sec must be a number".to_string()),
            "{via:?}"
        );
        assert!(!exists(&mut c, "huge"));
    }
}

/// The kilobytes a twin's script allocates in one call (its collector stopped meanwhile), and
/// its reply: the script's text run as a function inside one that measures it.
fn allocated_kb(c: &mut Connection, script: &str, keys: &[&str], args: &[&[u8]]) -> (i64, Reply) {
    let measured = format!(
        "collectgarbage('stop')\n\
         local before = collectgarbage('count')\n\
         local reply = (function()\n{}\nend)()\n\
         local kb = collectgarbage('count') - before\n\
         collectgarbage('restart')\n\
         if type(reply) == 'table' and reply.err then reply = 'error: ' .. reply.err end\n\
         if type(reply) == 'table' then reply = 'array' end\n\
         return {{math.floor(kb), reply}}",
        lua_script(script)
    );
    let numkeys = keys.len().to_string();
    let mut argv: Vec<&[u8]> = vec![b"EVAL", measured.as_bytes(), numkeys.as_bytes()];
    argv.extend(keys.iter().map(|k| k.as_bytes()));
    argv.extend_from_slice(args);
    match call(c, &argv) {
        Ok(Value::Array(v)) => match v.as_slice() {
            [Value::Int(kb), Value::BulkString(reply)] => {
                let reply = String::from_utf8_lossy(reply).into_owned();
                (
                    *kb,
                    reply
                        .strip_prefix("error: ")
                        .map_or(Ok(Value::Nil), |e| Err(e.to_string())),
                )
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_twin_given_a_million_arguments_allocates_what_it_does_for_a_few() {
    let p = Paths::start();
    let mut c = p.connect();
    set_clock(&mut c, T0);
    const MANY: usize = 1_000_000;
    let filler = vec![&b"x"[..]; MANY];
    let calls: Vec<TwinCall> = vec![
        (
            "RL.TOKENBUCKET",
            "token_bucket.lua",
            vec!["k"],
            [&[&b"10"[..], b"5"][..], &filler, &[b"UPTO", b"3"]].concat(),
        ),
        (
            "RL.GCRA",
            "gcra.lua",
            vec!["k"],
            [&[&b"9"[..], b"10"][..], &filler, &[b"UPTO", b"3"]].concat(),
        ),
        (
            "RL.SLIDINGLOG",
            "sliding_log.lua",
            vec!["k"],
            [&[&b"10"[..]][..], &filler, &[b"UPTO", b"3"]].concat(),
        ),
        (
            "CL.THROTTLE",
            "throttle.lua",
            vec!["k"],
            [&[&b"9"[..], b"10", b"60"][..], &filler].concat(),
        ),
        (
            "RL.ACQUIRE",
            "acquire.lua",
            vec!["k"],
            [&[&b"3"[..], b"30", b"job"][..], &filler].concat(),
        ),
        (
            "RL.RELEASE",
            "release.lua",
            vec!["k"],
            [&[&b"job"[..]][..], &filler].concat(),
        ),
        (
            "RL.ALL",
            "all.lua",
            vec!["k"],
            [
                &[&b"TOKENBUCKET"[..], b"10", b"5"][..],
                &filler,
                &[b"COST", b"1"],
            ]
            .concat(),
        ),
        (
            "RL.SETTLE",
            "settle.lua",
            vec!["k"],
            [
                &[&b"TOKENBUCKET"[..], b"10", b"5"][..],
                &filler,
                &[b"DELTA", b"1"],
            ]
            .concat(),
        ),
    ];
    for (command, script, keys, args) in calls {
        let (kb, reply) = allocated_kb(&mut c, script, &keys, &args);
        // The same error as the module's, which reads a bounded part of the arguments.
        let module = p.run(&mut c, Via::Module, command, &keys, &args);
        assert!(module.is_err(), "{command}: {module:?}");
        assert_eq!(reply, module, "{command}");
        // A copy of the arguments alone would be a table of a million slots: 16 MB.
        assert!(
            kb < 1024,
            "{command}: {kb} KB allocated for {MANY} arguments"
        );
    }
}

/// Sorted sets of other applications that carry an expiry.
fn foreign_sets(c: &mut Connection, prefix: &str) -> Vec<String> {
    let sets: [(&str, &[(&str, &str)]); 3] = [
        // A leaderboard.
        ("leaderboard", &[("100", "alice"), ("200", "bob")]),
        // Delayed jobs scored in Unix seconds, and in Unix milliseconds.
        (
            "jobs-s",
            &[("1899999990", "job:1"), ("1900000100", "job:2")],
        ),
        (
            "jobs-ms",
            &[("1899999990000", "job:1"), ("1900000100000", "job:2")],
        ),
    ];
    sets.iter()
        .map(|(name, members)| {
            let key = format!("{prefix}:{name}");
            for (score, member) in *members {
                cmd(c, &["ZADD", &key, score, member]).expect("ZADD");
            }
            cmd(c, &["PEXPIRE", &key, "3600000"]).expect("PEXPIRE");
            key
        })
        .collect()
}

#[test]
fn a_sorted_set_that_is_not_a_lease_set_is_refused_and_left_as_it_was() {
    let p = Paths::start();
    let mut c = p.connect();
    set_clock(&mut c, T0);
    let refused = "WRONGTYPE the key holds a sorted set whose scores are not lease expiries (Unix microseconds from 2020 on), which no rate limiter writes";
    for via in VIAS {
        for key in foreign_sets(&mut c, &format!("{via:?}")) {
            let before = zset_bytes(&mut c, &key);
            let expiry = harness::pexpiretime(&mut c, &key);
            let calls: [(&str, Vec<&str>); 4] = [
                ("RL.ACQUIRE", vec!["5", "30", "job-7"]),
                ("RL.RELEASE", vec!["alice"]),
                ("RL.ALL", vec!["CONCURRENCY", "5", "30", "LEASE", "job-7"]),
                (
                    "RL.ALL",
                    vec!["CONCURRENCY", "5", "30", "LEASE", "job-7", "COST", "0"],
                ),
            ];
            for (command, args) in calls {
                assert_eq!(
                    p.run_str(&mut c, via, command, &[&key], &args),
                    Err(refused.to_string()),
                    "{via:?} {command} {key}"
                );
            }
            // Nor is it a sliding log (its members are not `<time>:<n>`).
            let log = p.run_str(&mut c, via, "RL.SLIDINGLOG", &[&key], &["5", "60"]);
            assert!(
                log.as_ref()
                    .is_err_and(|e| e.starts_with("WRONGTYPE") || e.starts_with("ERR corrupt")),
                "{via:?} {key}: {log:?}"
            );
            assert_eq!(zset_bytes(&mut c, &key), before, "{via:?} {key} changed");
            assert_eq!(
                harness::pexpiretime(&mut c, &key),
                expiry,
                "{via:?} {key}'s expiry moved"
            );
        }
    }
}

/// One limiter of the promise: its command, how its parameters are drawn, and its `RL.ALL` /
/// `RL.SETTLE` keyword where it has one.
#[derive(Debug, Clone)]
struct Promised {
    command: &'static str,
    settle: Option<&'static str>,
}

const PROMISED: &[Promised] = &[
    Promised {
        command: "RL.TOKENBUCKET",
        settle: Some("TOKENBUCKET"),
    },
    Promised {
        command: "RL.LEAKYBUCKET",
        settle: Some("LEAKYBUCKET"),
    },
    Promised {
        command: "RL.FIXEDWINDOW",
        settle: Some("FIXEDWINDOW"),
    },
    Promised {
        command: "RL.SLIDINGWINDOW",
        settle: Some("SLIDINGWINDOW"),
    },
    Promised {
        command: "RL.SLIDINGLOG",
        settle: Some("SLIDINGLOG"),
    },
    Promised {
        command: "RL.GCRA",
        settle: Some("GCRA"),
    },
    Promised {
        command: "CL.THROTTLE",
        settle: None,
    },
    Promised {
        command: "RL.ACQUIRE",
        settle: None,
    },
];

/// One step that builds state: a call (a cost, or an acquire with its own lease id), or a
/// settlement, under the parameters of the moment, then the clock moved on.
#[derive(Debug, Clone)]
enum Step {
    Call { params: Vec<String>, cost: u64 },
    Settle { params: Vec<String>, delta: i64 },
}

/// Parameters of `command`, from small to large: `(limit-like, time-like)` each drawn.
fn params_of(command: &'static str) -> BoxedStrategy<Vec<String>> {
    let limit = prop_oneof![1u64..5, 5u64..50, Just(1000u64)];
    match command {
        "RL.TOKENBUCKET" | "RL.LEAKYBUCKET" => (
            limit,
            prop_oneof![Just(0.5f64), Just(10.0), Just(100.0), 0.01f64..5.0],
        )
            .prop_map(|(l, r)| vec![l.to_string(), format!("{r}")])
            .boxed(),
        "RL.FIXEDWINDOW" | "RL.SLIDINGWINDOW" | "RL.SLIDINGLOG" => (
            limit.prop_map(|l| l.min(300)),
            prop_oneof![Just(1.0f64), Just(60.0), 0.01f64..10.0],
        )
            .prop_map(|(l, w)| vec![l.to_string(), format!("{w:.3}")])
            .boxed(),
        "RL.GCRA" => (
            limit,
            prop_oneof![Just(1u64), Just(10), 1u64..100],
            prop_oneof![Just(1u64), Just(60), 1u64..10],
        )
            .prop_map(|(b, n, s)| vec![(b - 1).to_string(), n.to_string(), s.to_string()])
            .boxed(),
        // Whole-millisecond emission intervals: CL.THROTTLE replies whole seconds rounded as
        // redis-cell rounds them, which is exact when the clock moves in whole milliseconds.
        "CL.THROTTLE" => (
            0u64..20,
            prop_oneof![Just(1u64), Just(10), Just(100), Just(1000)],
            prop_oneof![Just(1u64), Just(10), Just(60)],
        )
            .prop_map(|(b, n, s)| vec![b.to_string(), n.to_string(), s.to_string()])
            .boxed(),
        "RL.ACQUIRE" => (1u64..6, prop_oneof![Just(1u64), Just(30), 1u64..100])
            .prop_map(|(l, s)| vec![l.to_string(), s.to_string()])
            .boxed(),
        other => panic!("{other}"),
    }
}

fn step_of(p: &'static Promised) -> BoxedStrategy<(Step, i64)> {
    let call =
        (params_of(p.command), 0u64..30).prop_map(|(params, cost)| Step::Call { params, cost });
    let pause = prop_oneof![Just(0i64), 1i64..2_000, 1_000i64..5_000_000];
    match p.settle {
        Some(_) => {
            let settle = (params_of(p.command), -2000i64..2000)
                .prop_map(|(params, delta)| Step::Settle { params, delta });
            (prop_oneof![2 => call, 1 => settle], pause).boxed()
        }
        None => (call, pause).boxed(),
    }
}

/// The reply's admission and its wait in microseconds (`None`: never, or admitted).
fn verdict(command: &str, reply: &Reply) -> (bool, Option<i64>) {
    let r = ints(reply);
    if command == "CL.THROTTLE" {
        let limited = r[0] == 1;
        (!limited, (limited && r[3] >= 0).then(|| r[3] * 1_000_000))
    } else {
        let allowed = r[0] == 1;
        (allowed, (!allowed && r[2] >= 0).then(|| r[2] * 1000))
    }
}

fn call_args(p: &Promised, params: &[String], cost: u64, id: usize) -> Vec<String> {
    let mut a: Vec<String> = params.to_vec();
    if p.command == "RL.ACQUIRE" {
        a.push(format!("holder-{id}"));
    } else {
        a.push(cost.to_string());
    }
    a
}

#[test]
fn a_denials_retry_after_is_a_time_after_which_the_same_call_is_admitted() {
    let paths = Paths::start();
    let conn = std::cell::RefCell::new(paths.connect());
    let case = std::cell::Cell::new(0usize);
    for p in PROMISED {
        // Cases that ended in a denial with a wait, whose promise was checked.
        let checked = std::cell::Cell::new(0u32);
        let cases = harness::scaled(40);
        let strategy = (
            proptest::collection::vec(step_of(p), 1..8),
            params_of(p.command),
            // The cost of the last call, in percent of the limit: mostly a denial to check.
            50u64..=100,
        );
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&strategy, |(steps, params, percent)| {
                // The limit of these parameters (a GCRA's and CL.THROTTLE's is max_burst + 1).
                let mut limit: u64 = params[0].parse().unwrap_or(1);
                if matches!(p.command, "RL.GCRA" | "CL.THROTTLE") {
                    limit += 1;
                }
                let cost = (limit * percent).div_ceil(100).max(1);
                let mut c = conn.borrow_mut();
                let c = &mut *c;
                for via in VIAS {
                    case.set(case.get() + 1);
                    let key = format!("promise:{}", case.get());
                    set_clock(c, T0);
                    let mut id = 0usize;
                    for (step, pause) in &steps {
                        id += 1;
                        // Out-of-range parameter pairs are refused; the state is then what it was.
                        let _ = match step {
                            Step::Call { params, cost } => {
                                let a = call_args(p, params, *cost, id);
                                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                                paths.run_str(c, via, p.command, &[&key], &a)
                            }
                            Step::Settle { params, delta } => {
                                let mut a = vec![p.settle.unwrap_or_default().to_string()];
                                a.extend(params.iter().cloned());
                                a.extend(["DELTA".to_string(), delta.to_string()]);
                                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                                paths.run_str(c, via, "RL.SETTLE", &[&key], &a)
                            }
                        };
                        let pause = if p.command == "CL.THROTTLE" {
                            pause / 1000 * 1000
                        } else {
                            *pause
                        };
                        advance_clock(c, pause);
                    }
                    // The call under the parameters of now, and again after exactly its wait.
                    let a = call_args(p, &params, cost, 0);
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    let first = paths.run_str(c, via, p.command, &[&key], &a);
                    if first.is_err() {
                        continue;
                    }
                    let (admitted, wait) = verdict(p.command, &first);
                    let Some(wait) = wait else {
                        continue;
                    };
                    prop_assert!(!admitted);
                    checked.set(checked.get() + 1);
                    advance_clock(c, wait);
                    let again = paths.run_str(c, via, p.command, &[&key], &a);
                    prop_assert!(
                        verdict(p.command, &again).0,
                        "{via:?} {}: {a:?} told {first:?}, then after {wait} us {again:?}",
                        p.command
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{}: {e}", p.command));
        // Not a vacuous pass: many generated cases end in a denial to check (about 40% of the
        // runs of the three paths together, here; at least a twelfth, or the generator changed).
        assert!(
            checked.get() >= cases / 4,
            "{}: only {} of {} cases (x3 paths) ended in a denial with a wait",
            p.command,
            checked.get(),
            cases
        );
    }
}
