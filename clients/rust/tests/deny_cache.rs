//! The deny cache on a real server: a denied check is repeated in the process without calling
//! Redis (counted by `INFO commandstats`) until its `retry_after_ms` has passed on the process's
//! clock, and not a moment longer; a fixed number of entries.
//!
//! The server runs under the test clock, which stands still: its answers do not change while
//! the process's clock runs on, so what changes is only whether the client asks.

mod common;

use std::time::Duration;

use common::{Server, set_clock};
use ratelimit_client::{
    Algorithm, Client, Degraded, FailurePolicy, LocalAnswer, Mode, ModeChoice, Options,
};
use tokio::time::Instant;

const START_US: i64 = 1_800_000_000_000_000;

fn server() -> Server {
    let s = Server::with_test_clock();
    set_clock(&mut s.connect(), START_US);
    s
}

fn calls(s: &Server, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut s.connect())
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn client(s: &Server, entries: usize) -> Client<redis::aio::ConnectionManager> {
    Client::connect(
        &s.url(),
        Options {
            mode: ModeChoice::Module,
            ..Options::default()
        },
    )
    .unwrap()
    .with_deny_cache(entries)
}

#[tokio::test]
async fn a_denied_key_is_denied_again_without_calling_redis() {
    let s = server();
    let c = client(&s, 16);
    let fw = Algorithm::FixedWindow {
        limit: 2,
        window_sec: 3600.0,
    };
    for _ in 0..2 {
        assert!(c.check("k", &fw, 1).await.unwrap().decision.allowed);
    }
    let first = c.check("k", &fw, 1).await.unwrap();
    assert_eq!(
        (
            first.decision.allowed,
            first.decision.retry_after_ms,
            first.answered_locally
        ),
        (false, 3_600_000, None)
    );
    let started = Instant::now();
    for _ in 0..100 {
        let before = started.elapsed().as_millis() as i64;
        let o = c.check("k", &fw, 1).await.unwrap();
        let after = started.elapsed().as_millis() as i64;
        assert_eq!(
            (o.decision.allowed, o.answered_locally, o.mode, o.granted),
            (false, Some(LocalAnswer::DenyCache), Some(Mode::Module), 0)
        );
        // The waits count down on the process's clock: whole ms since the denied call was
        // sent, which was a round trip (here at most a second) before `started`.
        assert!(
            (3_600_000 - after - 1000..=3_600_000 - before).contains(&o.decision.retry_after_ms),
            "{o:?}"
        );
        assert_eq!(o.decision.retry_after_ms as u64, o.decision.reset_after_ms);
    }
    assert_eq!(calls(&s, "rl.fixedwindow"), 3);
    // Another cost, other parameters, another key or a peek ask Redis; each cost has its entry.
    let o = c.check("k", &fw, 2).await.unwrap();
    assert_eq!((o.decision.allowed, o.answered_locally), (false, None));
    assert_eq!(calls(&s, "rl.fixedwindow"), 4);
    for cost in [1, 2] {
        let o = c.check("k", &fw, cost).await.unwrap();
        assert_eq!(o.answered_locally, Some(LocalAnswer::DenyCache));
    }
    assert_eq!(calls(&s, "rl.fixedwindow"), 4);
    let other = Algorithm::FixedWindow {
        limit: 3,
        window_sec: 3600.0,
    };
    assert!(c.check("k", &other, 1).await.unwrap().decision.allowed);
    assert!(c.check("k2", &fw, 1).await.unwrap().decision.allowed);
    assert_eq!(c.check("k", &fw, 0).await.unwrap().answered_locally, None);
    assert_eq!(calls(&s, "rl.fixedwindow"), 7);
    // An entry is for its cost: after a denial of 2, a cost of 1 asks.
    let tb = Algorithm::TokenBucket {
        capacity: 3,
        refill_per_sec: 0.001,
    };
    assert!(c.check("b", &tb, 2).await.unwrap().decision.allowed);
    let o = c.check("b", &tb, 2).await.unwrap();
    assert_eq!((o.decision.allowed, o.answered_locally), (false, None));
    assert_eq!(
        c.check("b", &tb, 2).await.unwrap().answered_locally,
        Some(LocalAnswer::DenyCache)
    );
    assert!(c.check("b", &tb, 1).await.unwrap().decision.allowed);
    assert_eq!(calls(&s, "rl.tokenbucket"), 3);
    // A cost that can never be admitted (retry_after_ms -1) is not cached.
    for _ in 0..2 {
        let o = c.check("b", &tb, 4).await.unwrap();
        assert_eq!((o.decision.retry_after_ms, o.answered_locally), (-1, None));
    }
    assert_eq!(calls(&s, "rl.tokenbucket"), 5);
}

/// The entry lasts exactly the `retry_after_ms` Redis answered, from the moment the denied call
/// was sent: before, no call; after, the next check asks Redis again.
#[tokio::test]
async fn an_entry_expires_after_exactly_retry_after() {
    let s = server();
    let c = client(&s, 16);
    // One unit, back in 700 ms: the server's clock stands still, so it says 700 every time.
    let tb = Algorithm::TokenBucket {
        capacity: 1,
        refill_per_sec: 1.0 / 0.7,
    };
    let limits = [("k".to_string(), tb.clone())];
    assert!(c.check("k", &tb, 1).await.unwrap().decision.allowed);
    let before = Instant::now();
    let o = c.check("k", &tb, 1).await.unwrap();
    let after = Instant::now();
    assert_eq!(
        (o.decision.allowed, o.decision.retry_after_ms),
        (false, 700)
    );
    let until = c.denied_until(&limits, 1).expect("an entry");
    let r = Duration::from_millis(700);
    assert!(
        before + r <= until && until <= after + r,
        "{:?}",
        until - before
    );
    // Half way: answered in the process.
    tokio::time::sleep_until(before + Duration::from_millis(350)).await;
    let asked = Instant::now();
    let o = c.check("k", &tb, 1).await.unwrap();
    if asked < until {
        assert_eq!(o.answered_locally, Some(LocalAnswer::DenyCache));
        assert_eq!(calls(&s, "rl.tokenbucket"), 2);
    }
    // From `until` on: Redis is asked, denies again, and a new entry starts.
    tokio::time::sleep_until(until).await;
    let o = c.check("k", &tb, 1).await.unwrap();
    assert_eq!(
        (
            o.decision.allowed,
            o.decision.retry_after_ms,
            o.answered_locally
        ),
        (false, 700, None)
    );
    assert!(c.denied_until(&limits, 1).unwrap() >= until + r);
    assert_eq!(calls(&s, "rl.tokenbucket"), 3);
}

#[tokio::test]
async fn a_fixed_number_of_entries_the_least_recently_used_evicted() {
    let s = server();
    let c = client(&s, 2);
    let fw = Algorithm::FixedWindow {
        limit: 1,
        window_sec: 3600.0,
    };
    for key in ["a", "b", "c"] {
        for _ in 0..2 {
            c.check(key, &fw, 1).await.unwrap();
        }
    }
    assert_eq!((c.deny_cache_len(), c.deny_cache_capacity()), (2, Some(2)));
    assert_eq!(calls(&s, "rl.fixedwindow"), 6);
    // "a" was evicted: asked again (and cached again, evicting "b"); "c" is still cached.
    assert_eq!(c.check("a", &fw, 1).await.unwrap().answered_locally, None);
    assert_eq!(
        c.check("c", &fw, 1).await.unwrap().answered_locally,
        Some(LocalAnswer::DenyCache)
    );
    assert_eq!(c.check("b", &fw, 1).await.unwrap().answered_locally, None);
    assert_eq!(calls(&s, "rl.fixedwindow"), 8);
    for i in 0..1000 {
        c.check(&format!("many:{i}"), &fw, 1).await.unwrap();
        c.check(&format!("many:{i}"), &fw, 1).await.unwrap();
    }
    assert_eq!(c.deny_cache_len(), 2);
}

/// A refund elsewhere makes the key admit sooner than the entry says: the cache keeps denying
/// (for at most the wait Redis gave), never admitting more than Redis would.
#[tokio::test]
async fn the_cache_may_deny_longer_than_redis_never_admit_more() {
    let s = server();
    let c = client(&s, 16);
    let fw = Algorithm::FixedWindow {
        limit: 1,
        window_sec: 3600.0,
    };
    c.check("k", &fw, 1).await.unwrap();
    assert!(!c.check("k", &fw, 1).await.unwrap().decision.allowed);
    let _: redis::Value = redis::cmd("RL.SETTLE")
        .arg(1)
        .arg("k")
        .arg("FIXEDWINDOW")
        .arg(fw.params())
        .arg("DELTA")
        .arg(-1)
        .query(&mut s.connect())
        .unwrap();
    let o = c.check("k", &fw, 1).await.unwrap();
    assert_eq!(
        (o.decision.allowed, o.answered_locally),
        (false, Some(LocalAnswer::DenyCache))
    );
    // A client without the cache sees the refund.
    let plain = Client::connect(&s.url(), Options::default()).unwrap();
    assert!(plain.check("k", &fw, 1).await.unwrap().decision.allowed);
}

#[tokio::test]
async fn several_limits_and_failure_policies() {
    let s = server();
    let c = client(&s, 16);
    let fw = Algorithm::FixedWindow {
        limit: 1,
        window_sec: 60.0,
    };
    let tb = Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 1.0,
    };
    let plan = [("a".to_string(), tb.clone()), ("b".to_string(), fw.clone())];
    assert!(c.check_all(&plan, 1).await.unwrap().allowed);
    let denied = c.check_all(&plan, 1).await.unwrap();
    assert_eq!((denied.allowed, denied.denied_by), (false, 2));
    let again = c.check_all(&plan, 1).await.unwrap();
    assert_eq!(
        (again.allowed, again.denied_by, again.answered_locally),
        (false, 2, Some(LocalAnswer::DenyCache))
    );
    assert_eq!(again.decisions[0].remaining, 9);
    assert_eq!(calls(&s, "rl.all"), 2);
    // The failure policy's denials are not cached: each check asks (and the breaker decides).
    let url = format!("redis://127.0.0.1:{}", common::free_port());
    let closed = Client::connect(
        &url,
        Options {
            policy: FailurePolicy::FailClosed,
            ..Options::default()
        },
    )
    .unwrap()
    .with_deny_cache(16);
    for _ in 0..2 {
        let o = closed.check("k", &fw, 1).await.unwrap();
        assert_eq!(
            (o.decision.allowed, o.degraded, o.answered_locally),
            (false, Some(Degraded::FailClosed), None)
        );
    }
    assert_eq!(closed.deny_cache_len(), 0);
    // Off by default.
    let plain = Client::connect(&s.url(), Options::default()).unwrap();
    assert_eq!(plain.deny_cache_capacity(), None);
    assert!(!plain.check("b", &fw, 1).await.unwrap().decision.allowed);
    assert_eq!(plain.deny_cache_len(), 0);
}

/// When an entry expires, one check asks Redis; the checks that come meanwhile are still
/// answered from the entry (a key denied again costs one call, not one per caller).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_entry_is_probed_by_one_check() {
    let s = server();
    let c = client(&s, 16);
    // One unit a second: each denial holds for a second, longer than the 32 checks take even on
    // a loaded machine.
    let tb = Algorithm::TokenBucket {
        capacity: 1,
        refill_per_sec: 1.0,
    };
    let limits = [("k".to_string(), tb.clone())];
    assert!(c.check("k", &tb, 1).await.unwrap().decision.allowed);
    assert!(!c.check("k", &tb, 1).await.unwrap().decision.allowed);
    assert_eq!(calls(&s, "rl.tokenbucket"), 2);
    for round in 1..=2 {
        let until = c.denied_until(&limits, 1).unwrap();
        tokio::time::sleep_until(until).await;
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let (c, tb) = (c.clone(), tb.clone());
            tasks.push(tokio::spawn(
                async move { c.check("k", &tb, 1).await.unwrap() },
            ));
        }
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert!(answers.iter().all(|o| !o.decision.allowed));
        // The server's clock stands still: Redis denies the probe again, for a second more.
        assert_eq!(calls(&s, "rl.tokenbucket"), 2 + round);
        assert_eq!(
            answers
                .iter()
                .filter(|o| o.answered_locally.is_none())
                .count(),
            1
        );
    }
}

/// A probe admitted with nothing left after it (the window reopened for one request): the next
/// check probes again, and its denial is kept; the others meanwhile are answered from the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_admitted_with_nothing_left_is_followed_by_one_more() {
    let s = server();
    let c = client(&s, 16);
    let fw = Algorithm::FixedWindow {
        limit: 1,
        window_sec: 0.4,
    };
    let limits = [("k".to_string(), fw.clone())];
    assert!(c.check("k", &fw, 1).await.unwrap().decision.allowed);
    assert!(!c.check("k", &fw, 1).await.unwrap().decision.allowed);
    // The server's window ends; the process's entry when its 400 ms have passed.
    common::advance_clock(&mut s.connect(), 400_000);
    tokio::time::sleep_until(c.denied_until(&limits, 1).unwrap()).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, fw) = (c.clone(), fw.clone());
        tasks.push(tokio::spawn(
            async move { c.check("k", &fw, 1).await.unwrap() },
        ));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(answers.iter().filter(|o| o.decision.allowed).count(), 1);
    // The probe admitted, then at most one more call, denied and kept.
    let asked = answers
        .iter()
        .filter(|o| o.answered_locally.is_none())
        .count();
    assert!((1..=2).contains(&asked), "{asked}");
    assert_eq!(calls(&s, "rl.fixedwindow"), 2 + asked as u64);
    // The second probe now, if none of the 32 came after the first one's answer.
    let o = c.check("k", &fw, 1).await.unwrap();
    assert!(!o.decision.allowed);
    let o = c.check("k", &fw, 1).await.unwrap();
    assert_eq!(
        (o.decision.allowed, o.answered_locally),
        (false, Some(LocalAnswer::DenyCache))
    );
    assert_eq!(calls(&s, "rl.fixedwindow"), 4);
}
