//! Failure policies: a closed port, a hung server (SIGSTOP), a server killed mid-run.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Opts, Server, free_port};
use ratelimit_client::{
    Algorithm, BreakerConfig, Decision, Degraded, FailurePolicy, Limiter, Mode, Options,
};

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
