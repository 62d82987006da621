//! Failure policies: a closed port, a hung server (SIGSTOP), a server killed mid-run; the
//! breaker's rule (a failure counts only when Redis answered none of the client's calls since
//! the failed call began), and a trial call given up by its caller.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Opts, Server, free_port};
use ratelimit_client::{
    Algorithm, BreakerConfig, Client, Decision, Degraded, FailurePolicy, Limiter, Mode, ModeChoice,
    Options,
};
use redis::aio::ConnectionManager;

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 0.0001,
    }
}

fn options(policy: FailurePolicy) -> Options {
    Options {
        policy,
        ..Options::default()
    }
}

fn closed_url() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

#[tokio::test]
async fn closed_port_fail_open() {
    let l = Limiter::connect(&closed_url(), bucket(), options(FailurePolicy::FailOpen)).unwrap();
    for _ in 0..5 {
        let o = l.check("k").await.unwrap();
        assert_eq!(o.degraded, Some(Degraded::FailOpen));
        assert_eq!(o.mode, None);
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 10,
                retry_after_ms: 0,
                reset_after_ms: 0,
                limit: 10
            }
        );
    }
    assert!(l.client().breaker_open());
}

#[tokio::test]
async fn closed_port_fail_closed() {
    let l = Limiter::connect(&closed_url(), bucket(), options(FailurePolicy::FailClosed)).unwrap();
    let o = l.check("k").await.unwrap();
    assert_eq!(o.degraded, Some(Degraded::FailClosed));
    assert_eq!(
        o.decision,
        Decision {
            allowed: false,
            remaining: 0,
            retry_after_ms: 1000,
            reset_after_ms: 1000,
            limit: 10
        }
    );
}

#[tokio::test]
async fn closed_port_local_fallback_divides_the_limit() {
    let l = Limiter::connect(
        &closed_url(),
        bucket(),
        options(FailurePolicy::Local { instances: 3 }),
    )
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let o = l.check("k").await.unwrap();
        assert_eq!(o.degraded, Some(Degraded::Local));
        assert_eq!(o.decision.limit, 3);
        seen.push((o.decision.allowed, o.decision.remaining));
    }
    assert_eq!(
        seen,
        vec![(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
    );
    // Another key has its own local bucket.
    let o = l.check("other").await.unwrap();
    assert_eq!((o.decision.allowed, o.decision.remaining), (true, 2));
}

fn signal(server: &Server, sig: &str) {
    let pid = server.pid();
    let ok = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// A server that stops answering costs the timeout only until the breaker opens; then calls
/// are answered at once, and after the cooldown one trial call finds the server back.
#[tokio::test]
async fn breaker_spares_the_timeout_on_a_hung_server() {
    let server = Server::with_module();
    let l = Limiter::connect(
        &server.url(),
        bucket(),
        Options {
            policy: FailurePolicy::FailOpen,
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig {
                failures: 3,
                cooldown: Duration::from_millis(500),
            },
            ..Options::default()
        },
    )
    .unwrap();
    let o = l.check("k").await.unwrap();
    assert_eq!((o.degraded, o.decision.remaining), (None, 9));
    signal(&server, "-STOP");
    for i in 0..3 {
        let t = Instant::now();
        let o = l.check("k").await.unwrap();
        let took = t.elapsed();
        assert_eq!(o.degraded, Some(Degraded::FailOpen), "call {i}");
        assert!(
            took >= Duration::from_millis(95) && took < Duration::from_millis(1000),
            "call {i} took {took:?}"
        );
    }
    assert!(l.client().breaker_open());
    for _ in 0..20 {
        let t = Instant::now();
        let o = l.check("k").await.unwrap();
        assert_eq!(o.degraded, Some(Degraded::FailOpen));
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    }
    signal(&server, "-CONT");
    tokio::time::sleep(Duration::from_millis(550)).await;
    // The trial call may meet the replies to the timed-out calls on the connection; within a
    // few cooldowns the client is back on Redis.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let o = l.check("k").await.unwrap();
        if o.degraded.is_none() {
            assert_eq!(o.mode, Some(Mode::Module));
            assert!(!o.decision.allowed || o.decision.remaining < 9);
            break;
        }
        assert!(Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!l.client().breaker_open());
}

/// A burst on a frozen server: the calls that Redis answers none of are failures all, and the
/// breaker opens at their deadline, as many failures as `failures` (here 3 of 10 at once).
#[tokio::test]
async fn a_burst_on_a_frozen_server_opens_the_breaker_at_its_deadline() {
    let server = Server::with_module();
    let l = Limiter::connect(
        &server.url(),
        bucket(),
        Options {
            policy: FailurePolicy::FailOpen,
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig {
                failures: 3,
                cooldown: Duration::from_secs(3600),
            },
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(l.check("k").await.unwrap().degraded, None);
    signal(&server, "-STOP");
    let t = Instant::now();
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move { l.check("k").await.unwrap().degraded })
        })
        .collect();
    for call in burst {
        assert_eq!(call.await.unwrap(), Some(Degraded::FailOpen));
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(95) && took < Duration::from_millis(1000),
        "{took:?}"
    );
    assert!(l.client().breaker_open());
    let t = Instant::now();
    assert_eq!(
        l.check("k").await.unwrap().degraded,
        Some(Degraded::FailOpen)
    );
    assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    signal(&server, "-CONT");
}

/// The client notes when Redis last answered to within a grain (1/128 of the timeout, 1 ms at
/// most), never later than the answer: on a server that froze right after an answer, each call
/// sent at once ends at its own timeout, not after it (an answer is never taken for later than
/// it came), and the failures open the breaker, `failures` of them.
#[tokio::test]
async fn calls_right_after_an_answer_on_a_frozen_server_end_at_their_timeout() {
    let server = Server::with_module();
    let timeout = Duration::from_millis(200);
    let l = Limiter::connect(
        &server.url(),
        bucket(),
        Options {
            policy: FailurePolicy::FailOpen,
            timeout,
            breaker: BreakerConfig {
                failures: 3,
                cooldown: Duration::from_secs(3600),
            },
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(l.check("k").await.unwrap().degraded, None);
    signal(&server, "-STOP");
    for i in 0..3 {
        assert!(!l.client().breaker_open(), "call {i}");
        let t = Instant::now();
        let o = l.check("k").await.unwrap();
        let took = t.elapsed();
        assert_eq!(o.degraded, Some(Degraded::FailOpen), "call {i}");
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(150),
            "call {i} took {took:?}"
        );
    }
    assert!(l.client().breaker_open());
    signal(&server, "-CONT");
}

/// A connection whose commands on keys that start with `late:` reach the server `delay_ms`
/// after they were sent (bytes on a slow link: a task of their own carries them), while every
/// other command goes at once: calls that outlast their deadline while Redis answers others.
#[derive(Clone)]
struct LateKeys {
    inner: ConnectionManager,
    delay_ms: Arc<AtomicU64>,
}

impl redis::aio::ConnectionLike for LateKeys {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        let late = matches!(
            cmd.args_iter().nth(1),
            Some(redis::Arg::Simple(key)) if key.starts_with(b"late:")
        );
        if delay == 0 || !late {
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

/// Calls that fail while Redis answered another call since they began are late, not a server
/// gone: however many, they do not open the breaker (nor does the rest of the burst skip
/// Redis). The same failures with no answer meanwhile open it, `failures` of them as ever.
#[tokio::test]
async fn failures_overlapping_answered_calls_do_not_open_the_breaker() {
    let server = Server::with_module();
    let manager = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let conn = LateKeys {
        inner: manager,
        delay_ms: Default::default(),
    };
    let client = Client::new(
        conn.clone(),
        Options {
            policy: FailurePolicy::FailOpen,
            mode: ModeChoice::Module,
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig {
                failures: 3,
                cooldown: Duration::from_secs(3600),
            },
            ..Options::default()
        },
    );
    let check = |key: &str| {
        let (c, key) = (client.clone(), key.to_string());
        tokio::spawn(async move { c.check(&key, &bucket(), 1).await.unwrap().degraded })
    };
    assert_eq!(check("k").await.unwrap(), None);
    // Longer than a call waits on after Redis's last answer (a timeout).
    conn.delay_ms.store(600, Ordering::SeqCst);
    for round in 0..3 {
        // Five calls whose commands are on their way for 600 ms, then one that Redis answers
        // within their deadline: the five fail after the answer, one after the other.
        let late: Vec<_> = (0..5)
            .map(|i| check(&format!("late:{round}:{i}")))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(check("k").await.unwrap(), None, "round {round}");
        for call in late {
            assert_eq!(
                call.await.unwrap(),
                Some(Degraded::FailOpen),
                "round {round}"
            );
        }
        assert!(!client.breaker_open(), "round {round}: the breaker opened");
    }
    // Their commands did reach Redis, late: the server was there.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut admin = server.connect();
    let keys: Vec<String> = redis::cmd("KEYS").arg("late:*").query(&mut admin).unwrap();
    assert_eq!(keys.len(), 15);
    // Three late calls and no answer meanwhile: three failures, the breaker opens.
    let late: Vec<_> = (0..3).map(|i| check(&format!("late:alone:{i}"))).collect();
    for call in late {
        assert_eq!(call.await.unwrap(), Some(Degraded::FailOpen));
    }
    assert!(client.breaker_open());
    let t = Instant::now();
    assert_eq!(check("k").await.unwrap(), Some(Degraded::FailOpen));
    assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
}

/// The deadline is time without an answer: a call whose reply comes late while Redis answers
/// the client's other calls waits on, up to 10 timeouts after it was sent; with no other answer
/// it ends at its timeout.
#[tokio::test]
async fn a_call_late_behind_answered_calls_waits_on_up_to_ten_timeouts() {
    let server = Server::with_module();
    let manager = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let conn = LateKeys {
        inner: manager,
        delay_ms: Default::default(),
    };
    let client = Client::new(
        conn.clone(),
        Options {
            policy: FailurePolicy::FailOpen,
            mode: ModeChoice::Module,
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig {
                failures: 1,
                cooldown: Duration::from_secs(3600),
            },
            ..Options::default()
        },
    );
    assert_eq!(
        client.check("k", &bucket(), 1).await.unwrap().degraded,
        None
    );
    // One late call, `others` calls answered 30 ms apart meanwhile: how it ended, and when.
    let late_call = |key: &'static str, delay: u64, others: bool| {
        let (client, conn) = (client.clone(), conn.clone());
        async move {
            conn.delay_ms.store(delay, Ordering::SeqCst);
            let t = Instant::now();
            let late = {
                let client = client.clone();
                tokio::spawn(async move {
                    let o = client.check(key, &bucket(), 1).await.unwrap();
                    (o.degraded, o.decision.remaining, t.elapsed())
                })
            };
            while others && !late.is_finished() {
                let o = client.check("k", &bucket(), 0).await.unwrap();
                assert_eq!(o.degraded, None);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            late.await.unwrap()
        }
    };
    let (degraded, remaining, took) = late_call("late:1", 300, true).await;
    assert_eq!((degraded, remaining), (None, 9), "{took:?}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    // Ended before its reply came (2 s), after 10 timeouts.
    let (degraded, _, took) = late_call("late:2", 2000, true).await;
    assert_eq!(degraded, Some(Degraded::FailOpen), "{took:?}");
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    // Redis answered others since it began: not counted (the breaker opens at 1 failure).
    assert!(!client.breaker_open());
    // No other answer: ended at its timeout, before its reply came (300 ms).
    let (degraded, _, took) = late_call("late:3", 300, false).await;
    assert_eq!(degraded, Some(Degraded::FailOpen), "{took:?}");
    assert!(took >= Duration::from_millis(95), "{took:?}");
    assert!(client.breaker_open());
    conn.delay_ms.store(0, Ordering::SeqCst);
}

/// A trial call (the breaker half open) that its caller gave up on tells nothing about Redis:
/// the next call is the trial, and finds the server back.
#[tokio::test]
async fn a_trial_call_given_up_by_its_caller_lets_the_next_call_try() {
    let server = Server::with_module();
    let l = Limiter::connect(
        &server.url(),
        bucket(),
        Options {
            policy: FailurePolicy::FailOpen,
            timeout: Duration::from_millis(100),
            breaker: BreakerConfig {
                failures: 1,
                cooldown: Duration::from_millis(200),
            },
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(l.check("k").await.unwrap().degraded, None);
    signal(&server, "-STOP");
    assert_eq!(
        l.check("k").await.unwrap().degraded,
        Some(Degraded::FailOpen)
    );
    assert!(l.client().breaker_open());
    tokio::time::sleep(Duration::from_millis(250)).await;
    // The trial, given up after 20 ms (a caller's own timeout, an HTTP client gone away).
    let gave_up = tokio::time::timeout(Duration::from_millis(20), l.check("k")).await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    signal(&server, "-CONT");
    // The next call is the trial: Redis decides it (its reply may follow the replies to the
    // calls given up on the connection, so within a few tries, with no cooldown between).
    let mut decided = None;
    for _ in 0..5 {
        let o = l.check("k").await.unwrap();
        if o.degraded.is_none() {
            decided = Some(o);
            break;
        }
    }
    let o = decided.expect("never decided by Redis after the trial was given up");
    assert_eq!(o.mode, Some(Mode::Module));
    assert!(!l.client().breaker_open());
}

/// The server dies mid-run: the local fallback takes over at once, and the client goes back
/// to Redis when a server is up again on the same port.
#[tokio::test]
async fn server_killed_mid_run_local_fallback_then_recovery() {
    let port = free_port();
    let mut server = Server::start(Opts {
        module: true,
        port: Some(port),
        ..Opts::default()
    });
    let l = Limiter::connect(
        &server.url(),
        bucket(),
        Options {
            policy: FailurePolicy::Local { instances: 2 },
            breaker: BreakerConfig {
                failures: 1,
                cooldown: Duration::from_millis(200),
            },
            ..Options::default()
        },
    )
    .unwrap();
    for expect in [9, 8, 7] {
        let o = l.check("k").await.unwrap();
        assert_eq!(o.degraded, None);
        assert_eq!(o.decision.remaining, expect);
    }
    server.kill();
    let mut seen = Vec::new();
    for _ in 0..7 {
        let o = l.check("k").await.unwrap();
        assert_eq!(o.degraded, Some(Degraded::Local));
        seen.push((o.decision.allowed, o.decision.remaining, o.decision.limit));
    }
    assert_eq!(
        seen,
        vec![
            (true, 4, 5),
            (true, 3, 5),
            (true, 2, 5),
            (true, 1, 5),
            (true, 0, 5),
            (false, 0, 5),
            (false, 0, 5)
        ]
    );
    let _server = Server::start(Opts {
        module: true,
        port: Some(port),
        ..Opts::default()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = l.check("k").await.unwrap();
        if o.degraded.is_none() {
            // A fresh server without persistence: a new bucket.
            assert_eq!(o.decision.remaining, 9);
            break;
        }
        assert!(Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn server_killed_mid_run_fail_closed() {
    let mut server = Server::with_module();
    let l = Limiter::connect(&server.url(), bucket(), options(FailurePolicy::FailClosed)).unwrap();
    assert!(l.check("k").await.unwrap().decision.allowed);
    server.kill();
    let o = l.check("k").await.unwrap();
    assert_eq!(o.degraded, Some(Degraded::FailClosed));
    assert!(!o.decision.allowed);
}

/// What a refusal that retrying cannot fix looks like: an error naming it, never a fail-open
/// answer, and the breaker stays closed (the server answered).
async fn assert_refused(l: &Limiter<redis::aio::ConnectionManager>, code: &str) {
    for _ in 0..3 {
        match l.check("k").await {
            Err(ratelimit_client::Error::Rejected(m)) => {
                assert!(m.starts_with(code), "{code}: {m}")
            }
            other => panic!("{code}: {other:?}"),
        }
    }
    assert!(!l.client().breaker_open(), "{code} tripped the breaker");
}

fn module_mode() -> Options {
    Options {
        policy: FailurePolicy::FailOpen,
        mode: ratelimit_client::ModeChoice::Module,
        ..Options::default()
    }
}

fn connections_received(c: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn after_a_failover_readonly_is_an_error_and_the_client_reconnects() {
    // The client's address stops being a master (REPLICAOF), then is one again (as a name that a
    // failover points at the new master): the READONLY call is an error, not a fail-open, and
    // the client connects anew, so the next call goes to whatever the address names now.
    let a = Server::with_module();
    let b = Server::with_module();
    let mut admin = a.connect();
    let l = Limiter::connect(&a.url(), bucket(), module_mode()).unwrap();
    assert!(l.check("k").await.unwrap().decision.allowed);
    let before = connections_received(&mut admin);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(b.port)
        .query(&mut admin)
        .unwrap();
    match l.check("k").await {
        Err(ratelimit_client::Error::Rejected(m)) => assert!(m.starts_with("READONLY"), "{m}"),
        other => panic!("READONLY: {other:?}"),
    }
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut admin)
        .unwrap();
    let after = l.check("k2").await.unwrap();
    assert!(
        after.decision.allowed && after.degraded.is_none(),
        "{after:?}"
    );
    assert!(!l.client().breaker_open());
    // One new connection: the client's (the admin connection was counted before).
    assert_eq!(connections_received(&mut admin), before + 1);
}

#[tokio::test]
async fn acl_refusals_and_missing_auth_are_errors_not_fail_open() {
    let s = Server::with_module();
    let mut c = s.connect();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "reader", "on", ">pw", "~*", "+get"][..])
        .query(&mut c)
        .unwrap();
    let url = format!("redis://reader:pw@127.0.0.1:{}", s.port);
    let l = Limiter::connect(&url, bucket(), module_mode()).unwrap();
    assert_refused(&l, "NOPERM").await;

    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "secret"][..])
        .query(&mut c)
        .unwrap();
    let l = Limiter::connect(&s.url(), bucket(), module_mode()).unwrap();
    assert_refused(&l, "NOAUTH").await;
}

#[tokio::test]
async fn out_of_memory_and_a_read_only_replica_are_errors_not_fail_open() {
    let master = Server::with_module();
    let replica = Server::with_module();
    let mut r = replica.connect();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut r)
        .unwrap();
    let l = Limiter::connect(&replica.url(), bucket(), module_mode()).unwrap();
    assert_refused(&l, "READONLY").await;

    let mut m = master.connect();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "noeviction"][..])
        .query(&mut m)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"][..])
        .query(&mut m)
        .unwrap();
    let l = Limiter::connect(&master.url(), bucket(), module_mode()).unwrap();
    assert_refused(&l, "OOM").await;
}
