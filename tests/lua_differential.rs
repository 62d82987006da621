//! Differential suite, part 1: the Rust pipeline (arguments -> stored fields -> pure core ->
//! `%.17g` numbers) against the Lua twin run in an embedded Lua 5.1, both on in-memory keyspaces
//! with the same clock. Every step must give the same reply (or the same error) and leave both
//! keyspaces identical, byte for byte, expiry included.

mod harness;

use std::sync::atomic::{AtomicUsize, Ordering};

use harness::lua_script;
use std::cell::RefCell;

use harness::memory::{
    Data, Entry, Keyspace, LuaTwin, MemoryKey, NumberForm, ScriptReply, SharedKey,
};
use harness::scenarios::{ALL_FIELDS, AllStep, Corruption, Step, all_sequence};
use harness::scenarios::{LeaseStep, lease_sequence};
use harness::scenarios::{LogCorruption, LogStep, large_log_sequence, sliding_log_sequence};
use harness::scenarios::{corrupted_value, legacy_pairs, token_bucket_sequence};
use harness::scenarios::{gcra_sequence, throttle_sequence};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis_rate_limiter::command::all;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::sliding_log;
use redis_rate_limiter::command::throttle;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::store::Store;
use redis_rate_limiter::store::string::{self, FieldsLimiter};

const START_US: i64 = 1_700_000_000_000_000;

/// Generated cases alternate between the two ways servers convert Lua numbers passed to
/// `redis.call` (Redis 7.0's `%.17g`, the newer servers' shortest digits): the twins format
/// what they store themselves, so both must give the module's bytes.
#[derive(Default)]
struct FormsUsed([AtomicUsize; 2]);

impl FormsUsed {
    fn twin(&self, source: &str) -> LuaTwin {
        LuaTwin::with_form(source, self.next())
    }

    /// Two scripts on one keyspace, in one form.
    fn twins(&self, first: &str, second: &str) -> (LuaTwin, LuaTwin) {
        let form = self.next();
        let a = LuaTwin::with_form(first, form);
        let b = a.beside(second, form);
        (a, b)
    }

    fn next(&self) -> NumberForm {
        let case: usize = self.0.iter().map(|n| n.load(Ordering::Relaxed)).sum();
        let i = case % 2;
        self.0[i].fetch_add(1, Ordering::Relaxed);
        NumberForm::BOTH[i]
    }

    fn assert_both(&self) {
        let [g17, shortest] = [0, 1].map(|i| self.0[i].load(Ordering::Relaxed));
        assert!(
            g17 > 0 && shortest > 0,
            "cases per form: {g17} and {shortest}"
        );
    }
}
const KEY: &[u8] = b"limiter";

/// One call through the same pipeline the module runs, on the in-memory keyspace.
fn module_call<L: FieldsLimiter<N>, const N: usize>(
    space: &mut Keyspace,
    args: &[Vec<u8>],
) -> ScriptReply {
    let raw: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let parsed = string::parse::<L, N>(&raw).map_err(|e| e.message().to_string())?;
    let now = space.now_us;
    let mut key = MemoryKey {
        space,
        key: KEY.to_vec(),
    };
    string::apply::<L, _, N>(&mut key, &parsed, now)
        .map(|r| r.fields().as_ref().to_vec())
        .map_err(|e| e.message().to_string())
}

fn corrupt(space: &mut Keyspace, c: &Corruption, fields: &[&str]) {
    corrupt_key(space, KEY, c, fields);
}

fn put(space: &mut Keyspace, key: &[u8], data: Data, expire_at_ms: Option<i64>) {
    space
        .keys
        .insert(key.to_vec(), Entry { data, expire_at_ms });
}

/// `Corruption` on one key of a string-of-numbers limiter (or of its earlier hash layout).
fn corrupt_key(space: &mut Keyspace, key: &[u8], c: &Corruption, fields: &[&str]) {
    space.expire_due();
    let now = space.now_us;
    let entry = space.keys.get(key).cloned();
    let expiry = entry.as_ref().and_then(|e| e.expire_at_ms);
    match (c, entry.map(|e| e.data)) {
        (Corruption::DeleteKey, _) => {
            space.keys.remove(key);
        }
        (Corruption::MakeString, _) => put(space, key, Data::Str(b"x".to_vec()), None),
        (Corruption::MakeZset, _) => {
            put(space, key, Data::Zset(vec![(1.0, b"a".to_vec())]), None);
        }
        (Corruption::ToLegacyHash, Some(Data::Str(v))) => {
            let pairs = legacy_pairs(&String::from_utf8_lossy(&v), fields);
            let h = pairs
                .into_iter()
                .map(|(f, v)| (f.into_bytes(), v.into_bytes()))
                .collect();
            put(space, key, Data::Hash(h), expiry);
        }
        (Corruption::ToLegacyHash, _) => {}
        (Corruption::SetField(f, v), Some(Data::Hash(mut h))) => {
            h.insert(f.as_bytes().to_vec(), v.as_bytes().to_vec());
            put(space, key, Data::Hash(h), expiry);
        }
        (Corruption::SetFieldAhead(f, o), Some(Data::Hash(mut h))) => {
            h.insert(f.as_bytes().to_vec(), (now + o).to_string().into_bytes());
            put(space, key, Data::Hash(h), expiry);
        }
        (Corruption::ExtraHashField, Some(Data::Hash(mut h))) => {
            h.insert(b"extra".to_vec(), b"1".to_vec());
            put(space, key, Data::Hash(h), expiry);
        }
        (
            Corruption::ExtraHashField | Corruption::SetFieldAhead(..) | Corruption::Retag(_),
            None,
        ) => {}
        (Corruption::SetField(f, v), None) => {
            let h = [(f.as_bytes().to_vec(), v.as_bytes().to_vec())]
                .into_iter()
                .collect();
            put(space, key, Data::Hash(h), None);
        }
        (Corruption::DeleteField(f), Some(Data::Hash(mut h))) => {
            h.remove(f.as_bytes());
            if h.is_empty() {
                space.keys.remove(key);
            } else {
                put(space, key, Data::Hash(h), expiry);
            }
        }
        (
            Corruption::SetField(..)
            | Corruption::DeleteField(_)
            | Corruption::SetFieldAhead(..)
            | Corruption::Retag(_),
            Some(Data::Str(v)),
        ) => {
            if let Some(new) = corrupted_value(&String::from_utf8_lossy(&v), c, fields, now) {
                put(space, key, Data::Str(new.into_bytes()), expiry);
            }
        }
        (
            Corruption::SetField(..)
            | Corruption::DeleteField(_)
            | Corruption::SetFieldAhead(..)
            | Corruption::Retag(_)
            | Corruption::ExtraHashField,
            _,
        ) => {}
    }
}

/// Runs generated sequences through both paths; returns the number of calls compared.
fn differential<L: FieldsLimiter<N>, const N: usize>(
    script: &str,
    strategy: impl Strategy<Value = Vec<Step>>,
    cases: u32,
) -> usize {
    let source = lua_script(script);
    let steps_run = AtomicUsize::new(0);
    let forms = FormsUsed::default();
    let mut runner = TestRunner::new(Config {
        cases: harness::scaled(cases),
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |steps| {
        let lua = forms.twin(&source);
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
                corrupt(&mut model, c, step.fields);
                corrupt(&mut lua.space.borrow_mut(), c, step.fields);
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
    forms.assert_both();
    steps_run.into_inner()
}

#[test]
fn token_bucket_matches_its_lua_twin() {
    let steps =
        differential::<TokenBucket, 2>("token_bucket.lua", token_bucket_sequence(50..250), 800);
    println!("token bucket: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

/// One `RL.ALL` call through the module's pipeline on the in-memory keyspace, flattened as the
/// Lua reply is: `[allowed, denied_by, reply 1..., reply 2..., ...]`.
/// An `RL.SETTLE` call (`settle`) is flattened as its reply is: `[reply 1..., reply 2..., ...]`.
fn module_all_call(
    space: &RefCell<Keyspace>,
    keys: &[Vec<u8>],
    words: &[Vec<u8>],
    settle: bool,
) -> ScriptReply {
    let mut args: Vec<&[u8]> = Vec::new();
    let numkeys = keys.len().to_string();
    args.push(numkeys.as_bytes());
    args.extend(keys.iter().map(Vec::as_slice));
    args.extend(words.iter().map(Vec::as_slice));
    let parse = if settle {
        redis_rate_limiter::command::settle::parse
    } else {
        all::parse
    };
    let mut call = parse(&args).map_err(|e| e.message().to_string())?;
    let mut open: Vec<SharedKey> = keys.iter().map(|k| SharedKey::open(space, k)).collect();
    let mut stores: Vec<&mut dyn Store> = open.iter_mut().map(|k| k as &mut dyn Store).collect();
    let now = space.borrow().now_us;
    let r =
        redis_rate_limiter::store::all::apply_all(&mut call.limits, &mut stores, now, call.upto)
            .map_err(|e| e.message().to_string())?;
    let mut out = if settle {
        Vec::new()
    } else {
        vec![i64::from(r.allowed), r.denied_by as i64]
    };
    for reply in &r.replies {
        out.extend(reply.fields().as_ref());
    }
    Ok(out)
}

#[test]
fn all_limits_match_their_lua_twin() {
    let (source, settle_source) = (lua_script("all.lua"), lua_script("settle.lua"));
    let steps_run = AtomicUsize::new(0);
    // Settlements and settlements refused (bad arguments or state); refunds, charges, and
    // charges that left a limit with nothing (most of them in debt).
    let (settled, settle_errors) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (refunds, charges, spent) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let forms = FormsUsed::default();
    // How many calls were admitted, and denied by a limit other than the first (the case where
    // an admitting limit must report its unconsumed state): the generator must reach both.
    let (admitted, denied_later) = (AtomicUsize::new(0), AtomicUsize::new(0));
    // Admitted calls with a sliding log among their limits, and calls a sliding log denied.
    let (log_admitted, log_denied) = (AtomicUsize::new(0), AtomicUsize::new(0));
    // The same for a concurrency limit.
    let (lease_admitted, lease_denied) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut runner = TestRunner::new(Config {
        cases: harness::scaled(1000),
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&all_sequence(50..250), |steps: Vec<AllStep>| {
        let (lua, settling) = forms.twins(&source, &settle_source);
        let model = RefCell::new(Keyspace {
            now_us: START_US,
            ..Keyspace::default()
        });
        lua.space.borrow_mut().now_us = START_US;
        for (i, step) in steps.iter().enumerate() {
            let now = (model.borrow().now_us + step.dt_us).clamp(0, 8_000_000_000_000_000);
            model.borrow_mut().now_us = now;
            lua.space.borrow_mut().now_us = now;
            model.borrow_mut().expire_due();
            lua.space.borrow_mut().expire_due();
            let keys: Vec<Vec<u8>> = (0..step.numkeys)
                .map(|k| format!("k{k}").into_bytes())
                .collect();
            if let Some((k, c)) = &step.corrupt {
                corrupt_key(&mut model.borrow_mut(), &keys[*k], c, ALL_FIELDS);
                corrupt_key(&mut lua.space.borrow_mut(), &keys[*k], c, ALL_FIELDS);
            }
            let words: Vec<Vec<u8>> = step.words.iter().map(|a| a.as_bytes().to_vec()).collect();
            let ours = module_all_call(&model, &keys, &words, step.settle);
            let twin = if step.settle { &settling } else { &lua };
            let theirs = twin.eval_keys(&keys, &words);
            prop_assert_eq!(&ours, &theirs, "step {} {:?} at {}", i, step, now);
            if step.settle {
                let n = if ours.is_ok() {
                    &settled
                } else {
                    &settle_errors
                };
                n.fetch_add(1, Ordering::Relaxed);
                let delta: i64 = step.words.last().and_then(|d| d.parse().ok()).unwrap_or(0);
                if let Ok(replies) = &ours {
                    if delta < 0 {
                        refunds.fetch_add(1, Ordering::Relaxed);
                    } else if delta > 0 {
                        charges.fetch_add(1, Ordering::Relaxed);
                        if replies.chunks(5).any(|r| r[1] == 0) {
                            spent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                model.borrow_mut().expire_due();
                lua.space.borrow_mut().expire_due();
                prop_assert_eq!(
                    &model.borrow().keys,
                    &lua.space.borrow().keys,
                    "stored state after step {}",
                    i
                );
                continue;
            }
            match ours.as_deref() {
                Ok([1, ..]) => admitted.fetch_add(1, Ordering::Relaxed),
                Ok([0, k, ..]) if *k > 1 => denied_later.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            // The n-th keyword of a well-formed call is the n-th limit's algorithm.
            let keywords: Vec<String> = step
                .words
                .iter()
                .filter(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
                .map(|w| w.to_ascii_uppercase())
                .collect();
            for (keyword, admitted, denied) in [
                ("SLIDINGLOG", &log_admitted, &log_denied),
                ("CONCURRENCY", &lease_admitted, &lease_denied),
            ] {
                match ours.as_deref() {
                    Ok([1, ..]) if keywords.iter().any(|k| k == keyword) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok([0, k, ..])
                        if keywords.get(*k as usize - 1).is_some_and(|w| w == keyword) =>
                    {
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
            model.borrow_mut().expire_due();
            lua.space.borrow_mut().expire_due();
            prop_assert_eq!(
                &model.borrow().keys,
                &lua.space.borrow().keys,
                "stored state after step {}",
                i
            );
        }
        steps_run.fetch_add(steps.len(), Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = result {
        panic!("RL.ALL and all.lua differ: {e}");
    }
    forms.assert_both();
    let steps = steps_run.into_inner();
    let (admitted, denied_later) = (admitted.into_inner(), denied_later.into_inner());
    println!(
        "RL.ALL: {steps} generated calls compared, {admitted} admitted, {denied_later} denied by a later limit"
    );
    assert!(steps >= 100_000, "only {steps} calls compared");
    assert!(
        admitted > steps / 10 && denied_later > steps / 100,
        "{admitted} admitted, {denied_later} denied later"
    );
    let (log_admitted, log_denied) = (log_admitted.into_inner(), log_denied.into_inner());
    println!("RL.ALL with a sliding log: {log_admitted} admitted, {log_denied} denied by it");
    // These run at about 3% and 1% of the calls (over 1,000 sequences, about 150,000 calls); the
    // bounds only say the generator reaches both, with room for chance.
    assert!(
        log_admitted > steps / 100 && log_denied > steps / 300,
        "{log_admitted} admitted with a sliding log, {log_denied} denied by one"
    );
    let (settled, settle_errors) = (settled.into_inner(), settle_errors.into_inner());
    let (refunds, charges, spent) = (
        refunds.into_inner(),
        charges.into_inner(),
        spent.into_inner(),
    );
    println!(
        "RL.SETTLE: {settled} settlements ({refunds} refunds, {charges} charges, {spent} leaving nothing), {settle_errors} errors"
    );
    assert!(
        settled > steps / 25 && settle_errors > steps / 200,
        "{settled} settlements, {settle_errors} errors"
    );
    assert!(
        refunds > steps / 100 && charges > steps / 100 && spent > steps / 300,
        "{refunds} refunds, {charges} charges, {spent} leaving nothing"
    );
    let (lease_admitted, lease_denied) = (lease_admitted.into_inner(), lease_denied.into_inner());
    println!(
        "RL.ALL with a concurrency limit: {lease_admitted} admitted, {lease_denied} denied by it"
    );
    assert!(
        lease_admitted > steps / 100 && lease_denied > steps / 300,
        "{lease_admitted} admitted with a concurrency limit, {lease_denied} denied by one"
    );
}

#[test]
fn leaky_bucket_matches_its_lua_twin() {
    use harness::scenarios::leaky_bucket_sequence;
    use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
    let steps =
        differential::<LeakyBucket, 2>("leaky_bucket.lua", leaky_bucket_sequence(50..250), 800);
    println!("leaky bucket: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

#[test]
fn fixed_window_matches_its_lua_twin() {
    use harness::scenarios::fixed_window_sequence;
    use redis_rate_limiter::command::fixed_window::FixedWindow;
    let steps =
        differential::<FixedWindow, 2>("fixed_window.lua", fixed_window_sequence(50..250), 800);
    println!("fixed window: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

#[test]
fn sliding_window_matches_its_lua_twin() {
    use harness::scenarios::sliding_window_sequence;
    use redis_rate_limiter::command::sliding_window::SlidingWindow;
    let steps = differential::<SlidingWindow, 3>(
        "sliding_window.lua",
        sliding_window_sequence(50..250),
        740,
    );
    println!("sliding window: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

#[test]
fn gcra_matches_its_lua_twin() {
    let steps = differential::<Gcra, 1>("gcra.lua", gcra_sequence(50..250), 800);
    println!("gcra: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

/// One `CL.THROTTLE` call through the module's code path, on the in-memory keyspace.
fn throttle_call(space: &mut Keyspace, args: &[Vec<u8>]) -> ScriptReply {
    let raw: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let parsed = throttle::parse(&raw).map_err(|e| e.message().to_string())?;
    let now = space.now_us;
    let mut key = MemoryKey {
        space,
        key: KEY.to_vec(),
    };
    throttle::apply(&mut key, &parsed, now)
        .map(|r| r.to_array().to_vec())
        .map_err(|e| e.message().to_string())
}

/// `scenarios::string_corruption` applied to a string-backed key.
fn corrupt_string(space: &mut Keyspace, c: &Corruption) {
    space.expire_due();
    let data = match c {
        Corruption::SetField(_, v) => Data::Str(v.as_bytes().to_vec()),
        Corruption::SetFieldAhead(_, o) => Data::Str(
            (i128::from(space.now_us) * 1000 + i128::from(*o))
                .to_string()
                .into_bytes(),
        ),
        Corruption::Retag(_) | Corruption::ExtraHashField => return,
        Corruption::MakeString => {
            Data::Hash([(b"x".to_vec(), b"1".to_vec())].into_iter().collect())
        }
        Corruption::DeleteField(_) | Corruption::DeleteKey => {
            space.keys.remove(KEY);
            return;
        }
        Corruption::ToLegacyHash | Corruption::MakeZset => Data::Zset(vec![(1.0, b"a".to_vec())]),
    };
    space.keys.insert(
        KEY.to_vec(),
        Entry {
            data,
            expire_at_ms: None,
        },
    );
}

#[test]
fn throttle_matches_its_lua_twin() {
    let source = lua_script("throttle.lua");
    let steps_run = AtomicUsize::new(0);
    let forms = FormsUsed::default();
    let admitted = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 800,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&throttle_sequence(50..250), |steps| {
        let lua = forms.twin(&source);
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
                corrupt_string(&mut model, c);
                corrupt_string(&mut lua.space.borrow_mut(), c);
            }
            let args: Vec<Vec<u8>> = step.args.iter().map(|a| a.as_bytes().to_vec()).collect();
            let ours = throttle_call(&mut model, &args);
            let theirs = lua.eval(KEY, &args);
            prop_assert_eq!(&ours, &theirs, "step {} {:?} at {}", i, step, now);
            if matches!(&ours, Ok(r) if r.first() == Some(&0)) {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
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
        panic!("throttle.lua: module and Lua twin differ: {e}");
    }
    forms.assert_both();
    let (steps, admitted) = (steps_run.into_inner(), admitted.into_inner());
    println!("throttle: {steps} generated calls compared, {admitted} admitted");
    assert!(steps >= 100_000, "only {steps} calls compared");
    assert!(
        admitted >= steps / 10,
        "too few admitted calls: {admitted} of {steps}"
    );
}

/// One `RL.SLIDINGLOG` call through the module's sorted-set pipeline, on the in-memory keyspace.
fn sliding_log_call(space: &mut Keyspace, args: &[Vec<u8>]) -> ScriptReply {
    let raw: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let parsed = sliding_log::parse_call(&raw).map_err(|e| e.message().to_string())?;
    let now = space.now_us;
    let mut key = MemoryKey {
        space,
        key: KEY.to_vec(),
    };
    redis_rate_limiter::store::zset::apply(&mut key, &parsed, now)
        .map(|r| r.fields().as_ref().to_vec())
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
    // A set the corruption creates gets an expiry, as the module's sets have (`Persist` takes it
    // away).
    let keep = |space: &mut Keyspace| {
        if let Some(e) = space.keys.get_mut(KEY)
            && e.expire_at_ms.is_none()
        {
            e.expire_at_ms = Some(now.div_euclid(1000) + 60_000);
        }
    };
    match c {
        LogCorruption::AddRaw(s, m) => {
            zadd(space, s.to_string(), m.to_string());
            keep(space);
        }
        LogCorruption::AddAt(offset, i) => {
            let t = now + offset;
            zadd(space, t.to_string(), format!("{t}:{i}"));
            keep(space);
        }
        LogCorruption::AddOld(n) => {
            for i in 0..i64::from(*n) {
                let t = (now - 20_000_000_000 - i).max(0);
                zadd(space, t.to_string(), format!("{t}:{i}"));
            }
            keep(space);
        }
        LogCorruption::Persist => {
            if let Some(e) = space.keys.get_mut(KEY)
                && matches!(e.data, Data::Zset(_))
            {
                e.expire_at_ms = None;
            }
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
/// `all_outcomes`: every kind of outcome must have been seen.
fn sliding_log_differential(
    strategy: impl Strategy<Value = Vec<LogStep>>,
    cases: u32,
    all_outcomes: bool,
) -> (usize, usize) {
    let source = lua_script("sliding_log.lua");
    let steps_run = AtomicUsize::new(0);
    // The most entries a log held after a call.
    let largest = AtomicUsize::new(0);
    let forms = FormsUsed::default();
    // Outcomes seen: admitted, denied, never admissible, argument errors, corrupt state.
    let seen: [AtomicUsize; 5] = Default::default();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |steps| {
        let lua = forms.twin(&source);
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
            if let Some(Data::Zset(z)) = model.keys.get(KEY).map(|e| &e.data) {
                largest.fetch_max(z.len(), Ordering::Relaxed);
            }
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
    if all_outcomes {
        assert!(
            seen.iter().all(|&n| n > 0),
            "every outcome is exercised: {seen:?}"
        );
    } else {
        assert!(seen[0] > 0 && seen[1] > 0, "admitted and denied: {seen:?}");
    }
    forms.assert_both();
    (steps_run.into_inner(), largest.into_inner())
}

#[test]
fn sliding_log_matches_its_lua_twin() {
    let (steps, _) = sliding_log_differential(sliding_log_sequence(50..250), 800, true);
    println!("sliding log: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}

#[test]
fn sliding_log_matches_its_lua_twin_on_the_largest_logs() {
    let (steps, largest) = sliding_log_differential(large_log_sequence(15..30), 3, false);
    println!("large sliding logs: {steps} generated calls compared, up to {largest} entries");
    assert!(steps >= 48, "only {steps} calls compared");
    assert!(largest >= 9_000, "the largest log held {largest} entries");
}

/// One `RL.ACQUIRE` or `RL.RELEASE` call through the module's lease pipeline, on the in-memory
/// keyspace.
fn lease_call(space: &mut Keyspace, step: &LeaseStep) -> ScriptReply {
    let raw: Vec<&[u8]> = step.args.iter().map(|a| a.as_bytes()).collect();
    let now = space.now_us;
    let mut key = MemoryKey {
        space,
        key: KEY.to_vec(),
    };
    let message = |e: redis_rate_limiter::codec::error::ErrorReply| e.message().to_string();
    if step.release {
        let id = redis_rate_limiter::command::release::parse(&raw).map_err(message)?;
        redis_rate_limiter::store::zset::release(&mut key, id, now)
            .map(|released| vec![i64::from(released)])
            .map_err(message)
    } else {
        let request = redis_rate_limiter::command::acquire::parse(&raw).map_err(message)?;
        redis_rate_limiter::store::zset::acquire(&mut key, &request, now)
            .map(|r| r.to_array().to_vec())
            .map_err(message)
    }
}

#[test]
fn leases_match_their_lua_twins() {
    let (acquire, release) = (lua_script("acquire.lua"), lua_script("release.lua"));
    let steps_run = AtomicUsize::new(0);
    let forms = FormsUsed::default();
    // Outcomes seen: admitted, denied, released, released nothing, bad args, bad state.
    let seen: [AtomicUsize; 6] = Default::default();
    let mut runner = TestRunner::new(Config {
        cases: harness::scaled(800),
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&lease_sequence(50..250), |steps| {
        let (acquiring, releasing) = forms.twins(&acquire, &release);
        let space = &acquiring.space;
        let mut model = Keyspace {
            now_us: START_US,
            ..Keyspace::default()
        };
        space.borrow_mut().now_us = START_US;
        for (i, step) in steps.iter().enumerate() {
            let now = (model.now_us + step.dt_us).clamp(0, 8_000_000_000_000_000);
            model.now_us = now;
            space.borrow_mut().now_us = now;
            model.expire_due();
            space.borrow_mut().expire_due();
            if let Some(c) = &step.corrupt {
                corrupt_log(&mut model, c);
                corrupt_log(&mut space.borrow_mut(), c);
            }
            let ours = lease_call(&mut model, step);
            let args: Vec<Vec<u8>> = step.args.iter().map(|a| a.as_bytes().to_vec()).collect();
            let twin = if step.release { &releasing } else { &acquiring };
            let theirs = twin.eval(KEY, &args);
            prop_assert_eq!(&ours, &theirs, "step {} {:?} at {}", i, step, now);
            let kind = match (&ours, step.release) {
                (Ok(r), false) if r[0] == 1 => 0,
                (Ok(_), false) => 1,
                (Ok(r), true) if r[0] == 1 => 2,
                (Ok(_), true) => 3,
                (Err(e), _) if e.contains("corrupt") || e.starts_with("WRONGTYPE") => 5,
                (Err(_), _) => 4,
            };
            seen[kind].fetch_add(1, Ordering::Relaxed);
            model.expire_due();
            space.borrow_mut().expire_due();
            prop_assert_eq!(
                &model.keys,
                &space.borrow().keys,
                "stored state after step {}",
                i
            );
        }
        steps_run.fetch_add(steps.len(), Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = result {
        panic!("acquire.lua / release.lua: module and Lua twins differ: {e}");
    }
    let seen = seen.map(AtomicUsize::into_inner);
    println!(
        "leases [admitted, denied, released, released nothing, bad args, bad state]: {seen:?}"
    );
    assert!(
        seen.iter().all(|&n| n > 100),
        "every outcome is exercised: {seen:?}"
    );
    forms.assert_both();
    let steps = steps_run.into_inner();
    println!("leases: {steps} generated calls compared");
    assert!(steps >= 100_000, "only {steps} calls compared");
}
