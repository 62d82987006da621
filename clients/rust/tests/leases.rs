//! Concurrency leases through the client: the module, the scripts and the Functions library
//! decide alike and store the same bytes; a guard gives its slot back when dropped; renewals keep
//! a lease alive; the failure policies.

mod common;

use std::time::{Duration, Instant};

use common::{Server, advance_clock, free_port, set_clock};
use ratelimit_client::{
    Algorithm, Client, Concurrency, Decision, Degraded, FailurePolicy, Lease, Limiter, Mode,
    ModeChoice, Options,
};
use redis::aio::ConnectionManager;

const T0: i64 = 1_800_000_000_000_000;

fn three() -> Concurrency {
    Concurrency {
        limit: 3,
        lease_sec: 2.5,
    }
}

fn d(allowed: bool, remaining: u64, retry: i64, reset: u64, limit: u64) -> Decision {
    Decision {
        allowed,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
        limit,
    }
}

fn client(server: &Server, mode: ModeChoice) -> Client<ConnectionManager> {
    Client::connect(
        &server.url(),
        Options {
            mode,
            ..Options::default()
        },
    )
    .unwrap()
}

fn load_library(c: &mut redis::Connection) {
    let library = include_str!("../../../lua-reference/ratelimit.lua");
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query(c)
        .unwrap();
    assert_eq!(name, "ratelimit");
}

/// The key's sorted set (member, score) and its absolute expiry in ms.
fn stored(c: &mut redis::Connection, key: &str) -> (Vec<(String, String)>, i64) {
    let set: Vec<(String, String)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(c)
        .unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    (set, at)
}

enum Step {
    Acquire(&'static str),
    Renew(&'static str),
    Release(&'static str),
    /// Drops the guard, then waits until the key holds this many entries.
    Drop(&'static str, usize),
    /// `RL.ALL` with cost 0 under a fresh id: takes nothing.
    Peek,
}

/// (clock advance in ms, step, the module's answer: decision or release reply).
fn steps() -> Vec<(i64, Step, Result<Decision, bool>)> {
    use Step::*;
    vec![
        (0, Acquire("a"), Ok(d(true, 2, 0, 2500, 3))),
        (100, Acquire("b"), Ok(d(true, 1, 0, 2500, 3))),
        (100, Acquire("c"), Ok(d(true, 0, 0, 2500, 3))),
        // Full: a slot frees when "a" expires, 2.3 s from now; all are gone 2.5 s from now.
        (0, Acquire("d"), Ok(d(false, 0, 2300, 2500, 3))),
        (0, Peek, Ok(d(false, 0, 2300, 2500, 3))),
        // "a" renewed to now + 2.5 s: "b" is now the first to expire.
        (300, Renew("a"), Ok(d(true, 0, 0, 2500, 3))),
        (0, Acquire("d"), Ok(d(false, 0, 2100, 2500, 3))),
        (0, Release("b"), Err(true)),
        (0, Release("b"), Err(false)),
        (0, Peek, Ok(d(true, 1, 0, 2500, 3))),
        (0, Acquire("d"), Ok(d(true, 0, 0, 2500, 3))),
        // "c" expires (2.2 s later): one slot free again without a release.
        (2_200, Acquire("e"), Ok(d(true, 0, 0, 2500, 3))),
        // "c" was trimmed by the acquire of "e": "a" and "e" are left.
        (0, Drop("d", 2), Err(true)),
        (0, Release("c"), Err(false)),
        (10_000, Acquire("f"), Ok(d(true, 2, 0, 2500, 3))),
        (1_234, Renew("f"), Ok(d(true, 2, 0, 2500, 3))),
    ]
}

/// Waits (at most 5 s) until `key` holds `n` leases: a dropped guard's release is sent from a
/// task.
async fn wait_leases(c: &mut redis::Connection, key: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let live: usize = redis::cmd("ZCARD").arg(key).query(c).unwrap();
        if live == n {
            return;
        }
        assert!(Instant::now() < deadline, "{key}: {live} leases, not {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn module_scripts_and_library_take_renew_and_release_identically() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, T0);
    load_library(&mut admin);
    let clients = [
        ("m", client(&server, ModeChoice::Module), Mode::Module),
        ("s", client(&server, ModeChoice::Script), Mode::Script),
        ("f", client(&server, ModeChoice::Function), Mode::Function),
    ];
    let mut leases: Vec<Vec<(&str, Lease<ConnectionManager>)>> = vec![vec![], vec![], vec![]];
    for (i, (advance_ms, step, expected)) in steps().into_iter().enumerate() {
        advance_clock(&mut admin, advance_ms * 1000);
        if i == 7 {
            // The scripts are reloaded with EVAL when the server forgot them.
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
        }
        for (n, (prefix, c, mode)) in clients.iter().enumerate() {
            let key = format!("lease:{prefix}");
            let got: Result<Decision, bool> = match step {
                Step::Acquire(id) => {
                    let o = c.acquire_as(&key, &three(), id).await.unwrap();
                    assert_eq!((o.outcome.mode, o.outcome.degraded), (Some(*mode), None));
                    assert_eq!(o.lease.is_some(), o.outcome.decision.allowed);
                    if let Some(l) = o.lease {
                        assert_eq!((l.id(), l.key()), (id, key.as_str()));
                        leases[n].push((id, l));
                    }
                    Ok(o.outcome.decision)
                }
                Step::Renew(id) => {
                    let l = &leases[n].iter().find(|(i, _)| *i == id).unwrap().1;
                    let o = l.renew().await.unwrap();
                    assert_eq!(l.last_renewal(), Some(o));
                    Ok(o.decision)
                }
                Step::Release(id) => {
                    let at = leases[n].iter().position(|(i, _)| *i == id);
                    match at {
                        Some(at) => Err(leases[n].remove(at).1.release().await.unwrap()),
                        None => Err(c.release(&key, id).await.unwrap()),
                    }
                }
                Step::Drop(id, left) => {
                    let at = leases[n].iter().position(|(i, _)| *i == id).unwrap();
                    drop(leases[n].remove(at));
                    wait_leases(&mut admin, &key, left).await;
                    Err(true)
                }
                Step::Peek => {
                    let limits = vec![(key.clone(), Algorithm::Concurrency(three()))];
                    let o = c.acquire_all(&limits, 0).await.unwrap();
                    assert!(o.lease.is_none());
                    assert_eq!(o.outcome.mode, Some(*mode));
                    Ok(o.outcome.decisions[0])
                }
            };
            assert_eq!(got, expected, "{mode:?} step {i}");
        }
        let m = stored(&mut admin, "lease:m");
        assert_eq!(stored(&mut admin, "lease:s"), m, "step {i}");
        assert_eq!(stored(&mut admin, "lease:f"), m, "step {i}");
    }
    // After the last step: the expired leases were trimmed when "f" was taken; "f" renewed to
    // now + 2.5 s (scores in Unix microseconds), the key expiring with it.
    let now = T0 + (100 + 100 + 300 + 2_200 + 10_000 + 1_234) * 1000;
    let expiry = now + 2_500_000;
    assert_eq!(
        stored(&mut admin, "lease:m"),
        (vec![("f".to_string(), expiry.to_string())], expiry / 1000)
    );
}

#[tokio::test]
async fn several_limits_with_a_lease_agree_in_every_mode() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, T0);
    load_library(&mut admin);
    let limits = |p: &str| {
        vec![
            (
                format!("{{{p}}}:inflight"),
                Algorithm::Concurrency(Concurrency {
                    limit: 2,
                    lease_sec: 30.0,
                }),
            ),
            (
                format!("{{{p}}}:minute"),
                Algorithm::FixedWindow {
                    limit: 3,
                    window_sec: 60.0,
                },
            ),
        ]
    };
    let mut answers = Vec::new();
    for (p, mode) in [
        ("m", ModeChoice::Module),
        ("s", ModeChoice::Script),
        ("f", ModeChoice::Function),
    ] {
        let c = client(&server, mode);
        let mut seen = Vec::new();
        let mut held = Vec::new();
        for _ in 0..3 {
            // Cost 2 from the window; one slot whatever the cost.
            let o = c.acquire_all(&limits(p), 2).await.unwrap();
            assert_eq!(o.lease.is_some(), o.outcome.allowed);
            seen.push((o.outcome.allowed, o.outcome.denied_by, o.outcome.decisions));
            held.extend(o.lease);
        }
        // One admitted: the window has 1 left; the second denied by the window, the lease
        // untaken; the third too.
        let mut c2 = server.connect();
        let live: usize = redis::cmd("ZCARD")
            .arg(format!("{{{p}}}:inflight"))
            .query(&mut c2)
            .unwrap();
        assert_eq!(live, 1);
        answers.push(seen);
        for l in held {
            assert!(l.release().await.unwrap());
        }
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);
    assert_eq!(
        answers[0],
        vec![
            (
                true,
                0,
                vec![d(true, 1, 0, 30_000, 2), d(true, 1, 0, 60_000, 3)]
            ),
            (
                false,
                2,
                vec![d(true, 1, 0, 30_000, 2), d(false, 1, 60_000, 60_000, 3)]
            ),
            (
                false,
                2,
                vec![d(true, 1, 0, 30_000, 2), d(false, 1, 60_000, 60_000, 3)]
            ),
        ]
    );
}

#[tokio::test]
async fn a_dropped_guard_gives_its_slot_back() {
    let server = Server::with_module();
    let mut admin = server.connect();
    let c = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    let two = Concurrency {
        limit: 2,
        lease_sec: 60.0,
    };
    let a = c.acquire("jobs", &two).await.unwrap();
    let b = c.acquire("jobs", &two).await.unwrap();
    assert_eq!(a.outcome.decision.remaining, 1);
    assert_eq!(b.outcome.decision.remaining, 0);
    let (a, b) = (a.lease.unwrap(), b.lease.unwrap());
    assert_ne!(a.id(), b.id());
    assert!(a.holds_slot());
    let full = c.acquire("jobs", &two).await.unwrap();
    assert!(full.lease.is_none());
    assert_eq!(
        (
            full.outcome.decision.allowed,
            full.outcome.decision.remaining
        ),
        (false, 0)
    );
    assert!(full.outcome.decision.retry_after_ms > 59_000);
    drop(a);
    wait_leases(&mut admin, "jobs", 1).await;
    let again = c.acquire("jobs", &two).await.unwrap();
    assert_eq!(
        (
            again.outcome.decision.allowed,
            again.outcome.decision.remaining
        ),
        (true, 0)
    );
    // Released explicitly: at once, and exactly once.
    let id = b.id().to_string();
    assert!(b.release().await.unwrap());
    assert!(!c.release("jobs", &id).await.unwrap());
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("jobs")
        .arg(0)
        .arg(-1)
        .query(&mut admin)
        .unwrap();
    assert_eq!(
        members,
        vec![again.lease.as_ref().unwrap().id().to_string()]
    );
    drop(again);
    wait_leases(&mut admin, "jobs", 0).await;
    let exists: i64 = redis::cmd("EXISTS").arg("jobs").query(&mut admin).unwrap();
    assert_eq!(exists, 0, "the key goes with its last lease");
    // The limiter form.
    let l = Limiter::new(c.clone(), Algorithm::Concurrency(two));
    let x = l.acquire("jobs").await.unwrap().lease.unwrap();
    assert!(l.check("jobs").await.is_err(), "a slot needs a lease");
    // A peek takes nothing.
    let p = l.peek("jobs").await.unwrap();
    assert_eq!((p.decision.allowed, p.decision.remaining), (true, 1));
    wait_leases(&mut admin, "jobs", 1).await;
    assert!(x.release().await.unwrap());
}

#[tokio::test]
async fn renewing_keeps_a_lease_alive() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, T0);
    let c = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    let one = Concurrency {
        limit: 1,
        lease_sec: 1.0,
    };
    let held = c.acquire("k", &one).await.unwrap().lease.unwrap();
    advance_clock(&mut admin, 800_000);
    let r = held.renew().await.unwrap();
    assert_eq!(r.decision, d(true, 0, 0, 1000, 1));
    advance_clock(&mut admin, 800_000);
    // Without the renewal it would have expired 600 ms ago.
    let other = c.acquire("k", &one).await.unwrap();
    assert_eq!(other.outcome.decision, d(false, 0, 200, 200, 1));
    advance_clock(&mut admin, 200_000);
    let other = c.acquire("k", &one).await.unwrap();
    assert_eq!(other.outcome.decision, d(true, 0, 0, 1000, 1));
    // The first lease is lost: its renewal is denied while the other holds the slot.
    let lost = held.renew().await.unwrap();
    assert_eq!(lost.decision, d(false, 0, 1000, 1000, 1));
}

#[tokio::test]
async fn keep_alive_renews_on_a_timer_until_released() {
    let server = Server::with_module();
    let mut admin = server.connect();
    let c = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    let short = Concurrency {
        limit: 1,
        lease_sec: 0.3,
    };
    let mut held = c.acquire("long-job", &short).await.unwrap().lease.unwrap();
    held.keep_alive(Duration::from_millis(50));
    // Four leases long.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let other = c.acquire("long-job", &short).await.unwrap();
    assert!(!other.outcome.decision.allowed, "{:?}", other.outcome);
    let r = held.last_renewal().expect("renewed");
    assert!(r.decision.allowed);
    assert!(held.release().await.unwrap());
    wait_leases(&mut admin, "long-job", 0).await;
    assert!(c.acquire("long-job", &short).await.unwrap().lease.is_some());
}

#[tokio::test]
async fn failure_policies_for_leases() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let four = Concurrency {
        limit: 4,
        lease_sec: 60.0,
    };
    let open = Client::connect(&url, Options::default()).unwrap();
    let o = open.acquire("k", &four).await.unwrap();
    assert_eq!(o.outcome.degraded, Some(Degraded::FailOpen));
    assert_eq!(o.outcome.decision, d(true, 4, 0, 0, 4));
    let lease = o.lease.unwrap();
    assert!(!lease.holds_slot(), "fail-open admits without a slot");
    assert!(!lease.release().await.unwrap());

    let closed = Client::connect(
        &url,
        Options {
            policy: FailurePolicy::FailClosed,
            ..Options::default()
        },
    )
    .unwrap();
    let o = closed.acquire("k", &four).await.unwrap();
    assert_eq!(o.outcome.degraded, Some(Degraded::FailClosed));
    assert_eq!(o.outcome.decision, d(false, 0, 1000, 1000, 4));
    assert!(o.lease.is_none());

    // Two instances share the limit: two slots here, given back exactly on drop.
    let local = Client::connect(
        &url,
        Options {
            policy: FailurePolicy::Local { instances: 2 },
            ..Options::default()
        },
    )
    .unwrap();
    let a = local.acquire("k", &four).await.unwrap();
    let b = local.acquire("k", &four).await.unwrap();
    let c = local.acquire("k", &four).await.unwrap();
    let seen: Vec<(bool, u64, u64)> = [&a, &b, &c]
        .iter()
        .map(|o| {
            assert_eq!(o.outcome.degraded, Some(Degraded::Local));
            let x = o.outcome.decision;
            (x.allowed, x.remaining, x.limit)
        })
        .collect();
    assert_eq!(seen, vec![(true, 1, 2), (true, 0, 2), (false, 0, 2)]);
    assert!(c.outcome.decision.retry_after_ms > 59_000);
    let a = a.lease.unwrap();
    assert!(a.holds_slot());
    let renewed = a.renew().await.unwrap();
    assert_eq!(
        (
            renewed.degraded,
            renewed.decision.allowed,
            renewed.decision.remaining
        ),
        (Some(Degraded::Local), true, 0)
    );
    drop(a);
    let d2 = local.acquire("k", &four).await.unwrap();
    assert_eq!(
        (d2.outcome.decision.allowed, d2.outcome.decision.remaining),
        (true, 0)
    );
    assert!(b.lease.unwrap().release().await.unwrap());
    let e = local.acquire("k", &four).await.unwrap();
    assert_eq!(e.outcome.decision.remaining, 0);
}

/// A connection whose `RL.ACQUIRE`s, once `delay_ms` is set, reach the server that long after
/// they were sent, whatever the caller does meanwhile (bytes on their way on a slow link: a
/// task of their own carries them). Every other command goes at once.
#[derive(Clone)]
struct SlowAcquires {
    inner: ConnectionManager,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl redis::aio::ConnectionLike for SlowAcquires {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let delay = self.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
        let acquire = matches!(
            cmd.args_iter().next(),
            Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"RL.ACQUIRE")
        );
        if delay == 0 || !acquire {
            return self.inner.req_packed_command(cmd);
        }
        let (mut conn, cmd) = (self.inner.clone(), cmd.clone());
        let on_its_way = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            conn.req_packed_command(&cmd).await
        });
        Box::pin(async move {
            on_its_way
                .await
                .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "lost")))?
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// A release returns only when no renewal of the lease can land after it: the keep-alive's
/// renewal already on its way when the lease is released (or dropped, as the middleware's
/// leases are) is waited for, so it cannot take the slot back afterwards.
#[tokio::test]
async fn a_renewal_on_its_way_does_not_take_the_slot_back_after_the_release() {
    let server = Server::with_module();
    let manager = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let slow = SlowAcquires {
        inner: manager,
        delay_ms: Default::default(),
    };
    let client = Client::new(
        slow.clone(),
        Options {
            mode: ModeChoice::Module,
            timeout: Duration::from_secs(2),
            ..Options::default()
        },
    );
    let one = Concurrency {
        limit: 1,
        lease_sec: 30.0,
    };
    let mut released = client
        .acquire("released", &one)
        .await
        .unwrap()
        .lease
        .unwrap();
    let mut dropped = client
        .acquire("dropped", &one)
        .await
        .unwrap()
        .lease
        .unwrap();
    slow.delay_ms
        .store(300, std::sync::atomic::Ordering::SeqCst);
    // Each keep-alive's first renewal leaves at 50 ms and reaches the server 300 ms later.
    released.keep_alive(Duration::from_millis(50));
    dropped.keep_alive(Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(released.release().await.unwrap());
    drop(dropped);
    // Past the renewals' arrival: the slots stay free.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut admin = server.connect();
    for key in ["released", "dropped"] {
        let live: usize = redis::cmd("ZCARD").arg(key).query(&mut admin).unwrap();
        assert_eq!(live, 0, "{key}: the slot was taken back after the release");
    }
    slow.delay_ms.store(0, std::sync::atomic::Ordering::SeqCst);
    let again = client.acquire("released", &one).await.unwrap();
    assert_eq!(again.outcome.decision.remaining, 0);
    assert!(again.lease.is_some());
}
