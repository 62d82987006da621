//! Differential suite, part 1: the Rust pipeline (arguments -> stored fields -> pure core ->
//! `%.17g` fields) against the Lua twin run in an embedded Lua 5.1, both on in-memory keyspaces
//! with the same clock. Every step must give the same reply (or the same error) and leave both
//! keyspaces identical, byte for byte, expiry included.

mod harness;

use std::sync::atomic::{AtomicUsize, Ordering};

use harness::lua_script;
use harness::memory::{Data, Entry, Keyspace, LuaTwin, MemoryKey, ScriptReply};
use harness::scenarios::{
    Corruption, LogCorruption, LogStep, Step, sliding_log_sequence, token_bucket_sequence,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis_rate_limiter::command::sliding_log;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::pipeline::{self, HashLimiter};

const START_US: i64 = 1_700_000_000_000_000;
const KEY: &[u8] = b"limiter";

/// One call through the same pipeline the module runs, on the in-memory keyspace.
fn module_call<L: HashLimiter<N>, const N: usize>(
    space: &mut Keyspace,
    args: &[Vec<u8>],
) -> ScriptReply {
    let raw: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let parsed = L::parse(&raw).map_err(|e| e.message().to_string())?;
    let now = space.now_us;
    let mut key = MemoryKey {
        space,
        key: KEY.to_vec(),
    };
    pipeline::apply::<L, _, N>(&mut key, &parsed, now)
        .map(|r| r.to_array().to_vec())
        .map_err(|e| e.message().to_string())
}

fn corrupt(space: &mut Keyspace, c: &Corruption) {
    space.expire_due();
    match c {
        Corruption::SetField(f, v) => match space.keys.get_mut(KEY).map(|e| &mut e.data) {
            Some(Data::Hash(h)) => {
                h.insert(f.as_bytes().to_vec(), v.as_bytes().to_vec());
            }
            Some(Data::Str(_) | Data::Zset(_)) => {}
            None => {
                let h = [(f.as_bytes().to_vec(), v.as_bytes().to_vec())]
                    .into_iter()
                    .collect();
                space.keys.insert(
                    KEY.to_vec(),
                    Entry {
                        data: Data::Hash(h),
                        expire_at_ms: None,
                    },
                );
            }
        },
        Corruption::DeleteField(f) => {
            if let Some(Data::Hash(h)) = space.keys.get_mut(KEY).map(|e| &mut e.data) {
                h.remove(f.as_bytes());
                if h.is_empty() {
                    space.keys.remove(KEY);
                }
            }
        }
        Corruption::DeleteKey => {
            space.keys.remove(KEY);
        }
        Corruption::MakeString => {
            space.keys.insert(
                KEY.to_vec(),
                Entry {
                    data: Data::Str(b"x".to_vec()),
                    expire_at_ms: None,
                },
            );
        }
    }
}

/// Runs generated sequences through both paths; returns the number of calls compared.
fn differential<L: HashLimiter<N>, const N: usize>(
    script: &str,
    strategy: impl Strategy<Value = Vec<Step>>,
    cases: u32,
) -> usize {
    let source = lua_script(script);
    let steps_run = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |steps| {
        let lua = LuaTwin::new(&source);
        let mut model = Keyspace {
            now_us: START_US,
            ..Keyspace::default()
        };
        lua.space.borrow_mut().now_us = START_US;
        for (i, step) in steps.iter().enumerate() {
            let now = (model.now_us + step.dt_us).clamp(0, 8_000_000_000_000_000);
            model.now_us = now;
            lua.space.borrow_mut().now_us = now;
            model.expire_due();
            lua.space.borrow_mut().expire_due();
            if let Some(c) = &step.corrupt {
                corrupt(&mut model, c);
                corrupt(&mut lua.space.borrow_mut(), c);
            }
            let args: Vec<Vec<u8>> = step.args.iter().map(|a| a.as_bytes().to_vec()).collect();
            let ours = module_call::<L, N>(&mut model, &args);
            let theirs = lua.eval(KEY, &args);
            prop_assert_eq!(&ours, &theirs, "step {} {:?} at {}", i, step, now);
            model.expire_due();
            lua.space.borrow_mut().expire_due();
            prop_assert_eq!(
                &model.keys,
                &lua.space.borrow().keys,
                "stored state after step {}",
                i
            );
        }
        steps_run.fetch_add(steps.len(), Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{script}: module and Lua twin differ: {e}");
    }
    steps_run.into_inner()
}

#[test]
fn token_bucket_matches_its_lua_twin() {
    let steps =
        differential::<TokenBucket, 2>("token_bucket.lua", token_bucket_sequence(50..250), 800);
    println!("token bucket: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

/// One `RL.SLIDINGLOG` call through the module's sorted-set pipeline, on the in-memory keyspace.
fn sliding_log_call(space: &mut Keyspace, args: &[Vec<u8>]) -> ScriptReply {
    let raw: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let parsed = sliding_log::parse(&raw).map_err(|e| e.message().to_string())?;
    let now = space.now_us;
    let mut key = MemoryKey {
        space,
        key: KEY.to_vec(),
    };
    sliding_log::apply(&mut key, &parsed, now)
        .map(|r| r.to_array().to_vec())
        .map_err(|e| e.message().to_string())
}

fn corrupt_log(space: &mut Keyspace, c: &LogCorruption) {
    space.expire_due();
    let now = space.now_us;
    let zadd = |space: &mut Keyspace, score: String, member: String| {
        let argv = [
            b"ZADD".to_vec(),
            KEY.to_vec(),
            score.into_bytes(),
            member.into_bytes(),
        ];
        // On a string key this is WRONGTYPE for both paths alike.
        let _ = space.command(&argv);
    };
    match c {
        LogCorruption::AddRaw(s, m) => zadd(space, s.to_string(), m.to_string()),
        LogCorruption::AddAt(offset, i) => {
            let t = now + offset;
            zadd(space, t.to_string(), format!("{t}:{i}"));
        }
        LogCorruption::PopOldest | LogCorruption::PopNewest => {
            if let Some(Data::Zset(z)) = space.keys.get_mut(KEY).map(|e| &mut e.data) {
                if matches!(c, LogCorruption::PopOldest) {
                    z.remove(0);
                } else {
                    z.pop();
                }
                if z.is_empty() {
                    space.keys.remove(KEY);
                }
            }
        }
        LogCorruption::DeleteKey => {
            space.keys.remove(KEY);
        }
        LogCorruption::MakeString => {
            space.keys.insert(
                KEY.to_vec(),
                Entry {
                    data: Data::Str(b"x".to_vec()),
                    expire_at_ms: None,
                },
            );
        }
    }
}

/// Runs generated sliding-log sequences through both paths; returns the number of calls compared.
fn sliding_log_differential(strategy: impl Strategy<Value = Vec<LogStep>>, cases: u32) -> usize {
    let source = lua_script("sliding_log.lua");
    let steps_run = AtomicUsize::new(0);
    // Outcomes seen: admitted, denied, never admissible, argument errors, corrupt state.
    let seen: [AtomicUsize; 5] = Default::default();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |steps| {
        let lua = LuaTwin::new(&source);
        let mut model = Keyspace {
            now_us: START_US,
            ..Keyspace::default()
        };
        lua.space.borrow_mut().now_us = START_US;
        for (i, step) in steps.iter().enumerate() {
            let now = (model.now_us + step.dt_us).clamp(0, 8_000_000_000_000_000);
            model.now_us = now;
            lua.space.borrow_mut().now_us = now;
            model.expire_due();
            lua.space.borrow_mut().expire_due();
            if let Some(c) = &step.corrupt {
                corrupt_log(&mut model, c);
                corrupt_log(&mut lua.space.borrow_mut(), c);
            }
            let args: Vec<Vec<u8>> = step.args.iter().map(|a| a.as_bytes().to_vec()).collect();
            let ours = sliding_log_call(&mut model, &args);
            let theirs = lua.eval(KEY, &args);
            prop_assert_eq!(&ours, &theirs, "step {} {:?} at {}", i, step, now);
            let kind = match &ours {
                Ok(r) if r[0] == 1 => 0,
                Ok(r) if r[2] >= 0 => 1,
                Ok(_) => 2,
                Err(e) if e.contains("corrupt") || e.starts_with("WRONGTYPE") => 4,
                Err(_) => 3,
            };
            seen[kind].fetch_add(1, Ordering::Relaxed);
            model.expire_due();
            lua.space.borrow_mut().expire_due();
            prop_assert_eq!(
                &model.keys,
                &lua.space.borrow().keys,
                "stored state after step {}",
                i
            );
        }
        steps_run.fetch_add(steps.len(), Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = result {
        panic!("sliding_log.lua: module and Lua twin differ: {e}");
    }
    let seen = seen.map(AtomicUsize::into_inner);
    println!("sliding log outcomes [admitted, denied, never, bad args, bad state]: {seen:?}");
    assert!(
        seen.iter().all(|&n| n > 0),
        "every outcome is exercised: {seen:?}"
    );
    steps_run.into_inner()
}

#[test]
fn sliding_log_matches_its_lua_twin() {
    let steps = sliding_log_differential(sliding_log_sequence(50..250), 800);
    println!("sliding log: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}
