//! Nothing any sequence of calls does leaves a key the module cannot read, or larger than its
//! bound: random sequences of every command (`RL.SETTLE` and `RL.ALL` among them) at extreme
//! parameters (the largest limits and costs, the longest and shortest windows, charges and
//! refunds of every size, clocks that jump and go back), run through the module's own pipelines
//! on the in-memory keyspace. After every call, a peek of each limit on its key must not answer
//! corrupt, and each key must be within its bound: a string of a tag and at most three numbers,
//! a sorted set of at most its limit of entries.
//!
//! No server: the pipelines are the module's code (`store::string`, `store::zset`,
//! `store::all`), the keyspace is the differential suites' (`harness::memory`).

mod harness;

use std::cell::RefCell;

use harness::memory::{Data, Keyspace, MemoryKey, SharedKey};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis_rate_limiter::command::fixed_window::FixedWindow;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
use redis_rate_limiter::command::sliding_window::SlidingWindow;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::command::{acquire, all, release, settle, sliding_log, throttle};
use redis_rate_limiter::store::Store;
use redis_rate_limiter::store::string::{self, FieldsLimiter};
use redis_rate_limiter::store::zset;

/// One limit: its `RL.ALL` keyword and parameters, and the key it lives on. Each key has one
/// limit for the whole sequence, so its bound is that limit's.
#[derive(Debug, Clone)]
struct Limit {
    keyword: &'static str,
    params: Vec<String>,
    key: &'static str,
}

/// The limits of a sequence: one per kind, with extreme parameters.
fn limits() -> impl Strategy<Value = Vec<Limit>> {
    let count = prop_oneof![
        Just("1".to_string()),
        Just("1000000000000000".to_string()),
        (1u64..50).prop_map(|n| n.to_string()),
    ];
    let log_limit = prop_oneof![
        Just("1".to_string()),
        Just("10000".to_string()),
        (1u64..300).prop_map(|n| n.to_string()),
    ];
    let rate = prop_oneof![
        Just("0.001".to_string()),
        Just("1000000000000000".to_string()),
        Just("1".to_string()),
        (1u32..100_000).prop_map(|n| (f64::from(n) / 100.0).to_string()),
    ];
    let window = prop_oneof![
        Just("0.001".to_string()),
        Just("10000000000".to_string()),
        Just("1".to_string()),
        (1u32..100_000).prop_map(|n| (f64::from(n) / 1000.0).to_string()),
    ];
    let period = prop_oneof![
        Just("1".to_string()),
        Just("0.000001".to_string()),
        Just("3600".to_string())
    ];
    (
        (count.clone(), rate.clone()),
        (count.clone(), rate.clone()),
        (count.clone(), window.clone()),
        (count.clone(), window.clone()),
        (count, count_text(), period),
        (log_limit.clone(), window.clone()),
        (log_limit, window),
    )
        .prop_map(|(tb, lb, fw, sw, gc, sl, cc)| {
            // A bucket must fill within 10^10 s, a GCRA's tolerance stay within 10^9 s: the
            // argument checks refuse the rest, which the sequences then answer with errors.
            vec![
                Limit {
                    keyword: "TOKENBUCKET",
                    params: vec![tb.0, tb.1],
                    key: "tb",
                },
                Limit {
                    keyword: "LEAKYBUCKET",
                    params: vec![lb.0, lb.1],
                    key: "lb",
                },
                Limit {
                    keyword: "FIXEDWINDOW",
                    params: vec![fw.0, fw.1],
                    key: "fw",
                },
                Limit {
                    keyword: "SLIDINGWINDOW",
                    params: vec![sw.0, sw.1],
                    key: "sw",
                },
                Limit {
                    keyword: "GCRA",
                    params: vec![gc.0, gc.1, gc.2],
                    key: "gc",
                },
                Limit {
                    keyword: "SLIDINGLOG",
                    params: vec![sl.0, sl.1],
                    key: "sl",
                },
                Limit {
                    keyword: "CONCURRENCY",
                    params: vec![cc.0, cc.1],
                    key: "cc",
                },
            ]
        })
}

fn count_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1".to_string()),
        Just("1000000000000000".to_string()),
        (1u64..50).prop_map(|n| n.to_string()),
    ]
}

/// What one step does.
#[derive(Debug, Clone)]
enum Call {
    /// The limit at this index, alone, with this cost.
    One(usize, u64),
    /// `RL.ALL` over these limits with this cost (and a lease id for a concurrency limit).
    All(Vec<usize>, u64),
    /// `RL.SETTLE` over these limits (not the concurrency limit) with this delta.
    Settle(Vec<usize>, i64),
    /// `RL.RELEASE` of one of a few lease ids.
    Release(u8),
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(1000),
        Just(1_000_000_000_000_000),
        0u64..100,
    ]
}

fn delta() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(1_000_000_000_000_000i64),
        Just(-1_000_000_000_000_000),
        Just(1000),
        Just(-1000),
        -100i64..100,
    ]
}

fn call() -> impl Strategy<Value = Call> {
    let subset = prop::sample::subsequence((0..7).collect::<Vec<usize>>(), 1..=4);
    let settled = prop::sample::subsequence((0..6).collect::<Vec<usize>>(), 1..=4);
    prop_oneof![
        6 => (0..7usize, cost()).prop_map(|(i, c)| Call::One(i, c)),
        2 => (subset, cost()).prop_map(|(s, c)| Call::All(s, c)),
        3 => (settled, delta()).prop_map(|(s, d)| Call::Settle(s, d)),
        1 => (0u8..3).prop_map(Call::Release),
    ]
}

/// Time steps: none, a little, a window's worth, a jump, and backwards by up to the minute a
/// stored time may be ahead of the clock (further back, what was written in between is corrupt
/// state by definition: `tests/caller.rs` shows those errors).
fn time_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        3 => 0..2_000_000i64,
        1 => 0..100_000_000_000i64,
        1 => Just(10_000_000_000_000_000i64),
        1 => -60_000_000..0i64,
    ]
}

fn strs(v: &[String]) -> Vec<&[u8]> {
    v.iter().map(|s| s.as_bytes()).collect()
}

/// The call's command and arguments (after the command name), as a client sends them.
fn argv(limits: &[Limit], call: &Call) -> (String, Vec<String>) {
    let lease = |i: u8| format!("lease-{i}");
    match call {
        Call::One(i, cost) => {
            let l = &limits[*i];
            let mut args = vec![l.key.to_string()];
            args.extend(l.params.iter().cloned());
            if l.keyword == "CONCURRENCY" {
                args.push(lease((*cost % 3) as u8));
                return ("RL.ACQUIRE".into(), args);
            }
            args.push(cost.to_string());
            (format!("RL.{}", l.keyword), args)
        }
        Call::All(chosen, cost) => {
            let mut args = vec![chosen.len().to_string()];
            args.extend(chosen.iter().map(|&i| limits[i].key.to_string()));
            for &i in chosen {
                args.push(limits[i].keyword.to_string());
                args.extend(limits[i].params.iter().cloned());
            }
            if chosen.iter().any(|&i| limits[i].keyword == "CONCURRENCY") {
                args.extend(["LEASE".to_string(), lease((*cost % 3) as u8)]);
            }
            args.extend(["COST".to_string(), cost.to_string()]);
            ("RL.ALL".into(), args)
        }
        Call::Settle(chosen, delta) => {
            let mut args = vec![chosen.len().to_string()];
            args.extend(chosen.iter().map(|&i| limits[i].key.to_string()));
            for &i in chosen {
                args.push(limits[i].keyword.to_string());
                args.extend(limits[i].params.iter().cloned());
            }
            args.extend(["DELTA".to_string(), delta.to_string()]);
            ("RL.SETTLE".into(), args)
        }
        Call::Release(i) => ("RL.RELEASE".into(), vec!["cc".into(), lease(*i)]),
    }
}

/// Runs one command through the module's pipelines; `Err` is the error reply's text.
fn run(space: &RefCell<Keyspace>, command: &str, args: &[String]) -> Result<(), String> {
    let raw = strs(args);
    let msg = |e: redis_rate_limiter::codec::error::ErrorReply| e.message().to_string();
    let now = space.borrow().now_us;
    let (key, rest) = raw.split_first().ok_or("no key")?;
    let one = |f: &mut dyn FnMut(&mut MemoryKey) -> Result<(), String>| {
        let mut s = space.borrow_mut();
        let mut k = MemoryKey {
            space: &mut s,
            key: key.to_vec(),
        };
        f(&mut k)
    };
    fn fields<L: FieldsLimiter<N>, const N: usize>(
        k: &mut MemoryKey,
        rest: &[&[u8]],
        now: i64,
    ) -> Result<(), String> {
        let request = string::parse::<L, N>(rest).map_err(|e| e.message().to_string())?;
        string::apply::<L, _, N>(k, &request, now)
            .map(|_| ())
            .map_err(|e| e.message().to_string())
    }
    match command {
        "RL.TOKENBUCKET" => one(&mut |k| fields::<TokenBucket, 2>(k, rest, now)),
        "RL.LEAKYBUCKET" => one(&mut |k| fields::<LeakyBucket, 2>(k, rest, now)),
        "RL.FIXEDWINDOW" => one(&mut |k| fields::<FixedWindow, 2>(k, rest, now)),
        "RL.SLIDINGWINDOW" => one(&mut |k| fields::<SlidingWindow, 3>(k, rest, now)),
        "RL.GCRA" => one(&mut |k| fields::<Gcra, 1>(k, rest, now)),
        "RL.SLIDINGLOG" => one(&mut |k| {
            let request = sliding_log::parse_call(rest).map_err(msg)?;
            zset::apply(k, &request, now).map(|_| ()).map_err(msg)
        }),
        "RL.ACQUIRE" => one(&mut |k| {
            let request = acquire::parse(rest).map_err(msg)?;
            zset::acquire(k, &request, now).map(|_| ()).map_err(msg)
        }),
        "RL.RELEASE" => one(&mut |k| {
            let id = release::parse(rest).map_err(msg)?;
            zset::release(k, id, now).map(|_| ()).map_err(msg)
        }),
        "CL.THROTTLE" => one(&mut |k| {
            let request = throttle::parse(rest).map_err(msg)?;
            throttle::apply(k, &request, now).map(|_| ()).map_err(msg)
        }),
        "RL.ALL" | "RL.SETTLE" => {
            let parse = if command == "RL.ALL" {
                all::parse
            } else {
                settle::parse
            };
            let mut call = parse(&raw).map_err(msg)?;
            let mut open: Vec<SharedKey> = call
                .keys
                .iter()
                .map(|k| SharedKey::open(space, k))
                .collect();
            let mut stores: Vec<&mut dyn Store> =
                open.iter_mut().map(|k| k as &mut dyn Store).collect();
            redis_rate_limiter::store::all::apply_all(&mut call.limits, &mut stores, now, call.upto)
                .map(|_| ())
                .map_err(msg)
        }
        other => Err(format!("unknown command {other}")),
    }
}

/// After a call: every limit's key answers a peek without a corrupt-state error, and holds no
/// more than its bound.
fn check(space: &RefCell<Keyspace>, limits: &[Limit]) -> Result<(), TestCaseError> {
    space.borrow_mut().expire_due();
    for l in limits {
        let (command, mut args) = argv(std::slice::from_ref(l), &Call::One(0, 0));
        if l.keyword == "CONCURRENCY" {
            // An RL.ALL peek of the concurrency limit (COST 0 takes no slot).
            let mut all = vec!["1".to_string(), l.key.to_string(), l.keyword.to_string()];
            all.extend(l.params.iter().cloned());
            all.extend(["LEASE", "peek", "COST", "0"].map(String::from));
            args = all;
            let r = run(space, "RL.ALL", &args);
            prop_assert!(
                !matches!(&r, Err(e) if e.contains("corrupt")),
                "{} {:?}: {:?}",
                command,
                args,
                r
            );
        } else {
            let r = run(space, &command, &args);
            prop_assert!(
                !matches!(&r, Err(e) if e.contains("corrupt")),
                "{} {:?}: {:?}",
                command,
                args,
                r
            );
        }
        let s = space.borrow();
        match s.keys.get(l.key.as_bytes()).map(|e| &e.data) {
            None => {}
            Some(Data::Str(v)) => {
                // A tag and at most three numbers of at most 25 bytes each.
                prop_assert!(v.len() <= 8 + 3 * 26, "{}: {:?}", l.key, v);
            }
            Some(Data::Zset(z)) => {
                let limit: usize = l.params[0].parse().unwrap_or(0);
                prop_assert!(
                    z.len() <= limit,
                    "{} holds {} entries, limit {}",
                    l.key,
                    z.len(),
                    limit
                );
            }
            Some(Data::Hash(_)) => prop_assert!(false, "{}: a hash", l.key),
        }
    }
    Ok(())
}

#[test]
fn no_sequence_of_calls_leaves_a_key_unreadable_or_past_its_bound() {
    let steps = prop::collection::vec((time_step(), call()), 20..120);
    let mut runner = TestRunner::new(Config {
        cases: harness::scaled(300),
        failure_persistence: None,
        ..Config::default()
    });
    let (calls, decided) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    let result = runner.run(&(limits(), steps), |(limits, steps)| {
        let space = RefCell::new(Keyspace {
            now_us: 1_800_000_000_000_000,
            ..Keyspace::default()
        });
        // The latest time the clock showed: it never goes back by more than the skew from it.
        let mut latest = space.borrow().now_us;
        for (dt, call) in &steps {
            {
                let mut s = space.borrow_mut();
                s.now_us = (s.now_us + dt)
                    .max(latest - 60_000_000)
                    .clamp(0, 7_000_000_000_000_000);
                latest = latest.max(s.now_us);
                s.expire_due();
            }
            let (command, args) = argv(&limits, call);
            let r = run(&space, &command, &args);
            prop_assert!(
                !matches!(&r, Err(e) if e.contains("corrupt")),
                "{} {:?}: {:?}",
                command,
                args,
                r
            );
            calls.set(calls.get() + 1);
            decided.set(decided.get() + usize::from(r.is_ok()));
            check(&space, &limits)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (calls, decided) = (calls.get(), decided.get());
    println!("{calls} calls, {decided} answered with a decision");
    assert!(
        decided * 2 > calls,
        "too few calls were decided: {decided} of {calls}"
    );
}
