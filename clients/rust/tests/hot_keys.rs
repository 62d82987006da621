//! The HTTP layer with leased batches and the deny cache, on a real server under the test clock:
//! the response fields are those one call per request would give (remaining = what Redis had
//! before the batch's grant less what this process admitted from it since), the counters say
//! which answers were made in the process (`outcome="batch"`, `outcome="deny_cache"`), and
//! every failure policy answers as without them.

mod common;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::{Server, free_port, set_clock};
use http::Request;
use ratelimit_client::middleware::{KeySource, Policy, RateLimitLayer};
use ratelimit_client::{Algorithm, Batching, Client, FailurePolicy, ModeChoice, Options};
use redis::aio::ConnectionManager;
use std::time::Duration;
use tower::ServiceExt;

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

fn client(url: &str, policy: FailurePolicy) -> Client<ConnectionManager> {
    Client::connect(
        url,
        Options {
            mode: ModeChoice::Module,
            policy,
            ..Options::default()
        },
    )
    .unwrap()
}

fn per_window(limit: u64, window_sec: f64) -> Policy {
    Policy::new("window", Algorithm::FixedWindow { limit, window_sec })
}

fn app(layer: &RateLimitLayer<ConnectionManager>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone())
}

/// Status, `RateLimit`, `RateLimit-Remaining`, `Retry-After` and `RateLimit-Degraded`.
async fn send(router: &Router, who: &str) -> (u16, String, String, String, String) {
    let req = Request::get("/")
        .header("x-api-key", who)
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .map_or(String::new(), |v| v.to_str().unwrap().to_string())
    };
    (
        resp.status().as_u16(),
        h("ratelimit"),
        h("ratelimit-remaining"),
        h("retry-after"),
        h("ratelimit-degraded"),
    )
}

fn builder(
    client: Client<ConnectionManager>,
    policy: Policy,
) -> ratelimit_client::middleware::Builder<ConnectionManager> {
    RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits("*", "*", vec![policy])
        .legacy_headers(true)
}

#[tokio::test]
async fn batched_requests_carry_the_fields_one_call_each_would() {
    let s = server();
    let layer = builder(
        client(&s.url(), FailurePolicy::FailOpen),
        per_window(100, 3600.0),
    )
    .batching(
        Batching::new()
            .hot_key("rl:{alice}:default:window")
            .initial(4)
            .lease(Duration::from_secs(600)),
    )
    .build();
    let router = app(&layer);
    for who in ["alice", "bob"] {
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(send(&router, who).await);
        }
        let expected: Vec<_> = (94..100)
            .rev()
            .map(|r| {
                (
                    200,
                    format!("\"window\";r={r};t=3600"),
                    r.to_string(),
                    String::new(),
                    String::new(),
                )
            })
            .collect();
        assert_eq!(seen, expected, "{who}");
    }
    // alice: a grant of 4 (1 call, 3 answered from it), then of 8 (1 call, 1 answered); bob:
    // a call per request.
    assert_eq!(calls(&s, "rl.fixedwindow"), 2 + 6);
    let m = layer.metrics();
    assert_eq!(
        m.render_prometheus()
            .lines()
            .filter(|l| l.starts_with("ratelimit_decisions_total"))
            .collect::<Vec<_>>(),
        vec![
            "ratelimit_decisions_total{limit=\"window\",outcome=\"allowed\"} 12",
            "ratelimit_decisions_total{limit=\"window\",outcome=\"denied\"} 0",
            "ratelimit_decisions_total{limit=\"window\",outcome=\"degraded\"} 0",
            "ratelimit_decisions_total{limit=\"window\",outcome=\"batch\"} 4",
        ]
    );
    assert_eq!(m.counts("window").batch, 4);
    // On shutdown the batch's 6 unused units go back: Redis counts exactly what was admitted.
    assert_eq!(layer.client().close().await, 6);
    let left: Vec<i64> = redis::cmd("RL.FIXEDWINDOW")
        .arg("rl:{alice}:default:window")
        .arg(100)
        .arg(3600)
        .arg(0)
        .query(&mut s.connect())
        .unwrap();
    assert_eq!(left[1], 94);
}

#[tokio::test]
async fn a_denied_client_is_answered_from_the_deny_cache() {
    let s = server();
    for on in [true, false] {
        let _: () = redis::cmd("FLUSHALL").query(&mut s.connect()).unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut s.connect())
            .unwrap();
        let b = builder(
            client(&s.url(), FailurePolicy::FailOpen),
            per_window(2, 60.0),
        );
        // On by default.
        let layer = if on {
            b.build()
        } else {
            b.deny_cache(false).build()
        };
        let router = app(&layer);
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(send(&router, "carol").await);
        }
        let denied = (
            429,
            "\"window\";r=0;t=60".to_string(),
            "0".to_string(),
            "60".to_string(),
            String::new(),
        );
        assert_eq!(seen[0].0, 200);
        assert_eq!(seen[1].1, "\"window\";r=0;t=60");
        assert_eq!(seen[2..], [denied.clone(), denied.clone(), denied]);
        assert_eq!(calls(&s, "rl.fixedwindow"), if on { 3 } else { 5 });
        let c = layer.metrics().counts("window");
        assert_eq!(
            (c.allowed, c.denied, c.deny_cache, c.batch),
            (2, 3, if on { 2 } else { 0 }, 0)
        );
        let text = layer.metrics().render_prometheus();
        assert_eq!(
            text.contains("ratelimit_decisions_total{limit=\"window\",outcome=\"deny_cache\"} 2\n"),
            on
        );
        assert!(!text.contains("outcome=\"batch\""));
    }
}

/// A hot key nearing its limit: batches while an eighth of what remains is more than one
/// unit (grants of 2, 2, 2), then one call per request, then the deny cache.
#[tokio::test]
async fn batches_then_calls_then_the_deny_cache() {
    let s = server();
    let layer = builder(
        client(&s.url(), FailurePolicy::FailOpen),
        per_window(20, 60.0),
    )
    .batching(Batching::new().hot_keys_where(|k| k.contains("{dave}")))
    .build();
    let router = app(&layer);
    let mut seen = Vec::new();
    for _ in 0..30 {
        seen.push(send(&router, "dave").await);
    }
    let remaining: Vec<String> = seen.iter().map(|r| r.2.clone()).collect();
    let expected: Vec<String> = (0..20)
        .rev()
        .chain(std::iter::repeat_n(0, 10))
        .map(|r| r.to_string())
        .collect();
    assert_eq!(remaining, expected);
    assert_eq!(seen.iter().filter(|r| r.0 == 200).count(), 20);
    assert!(seen[20..].iter().all(|r| r.0 == 429 && r.3 == "60"));
    // 3 grants, 14 calls for the last units, 1 denial; 9 denials from the cache.
    assert_eq!(calls(&s, "rl.fixedwindow"), 18);
    let c = layer.metrics().counts("window");
    assert_eq!((c.allowed, c.denied, c.batch, c.deny_cache), (20, 10, 3, 9));
}

/// Redis unreachable, batches and deny cache on: each policy answers as without them (its
/// denials are not cached, no batch is taken), `RateLimit-Degraded` says so.
#[tokio::test]
async fn every_failure_policy_with_batches_and_the_deny_cache() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    for (policy, statuses, degraded, remaining) in [
        (
            FailurePolicy::FailOpen,
            [200, 200, 200],
            "fail-open",
            ["4", "4", "4"],
        ),
        (
            FailurePolicy::FailClosed,
            [429, 429, 429],
            "fail-closed",
            ["0", "0", "0"],
        ),
        (
            FailurePolicy::Local { instances: 2 },
            [200, 200, 429],
            "local",
            ["1", "0", "0"],
        ),
    ] {
        let layer = builder(client(&url, policy), per_window(4, 60.0))
            .batching(Batching::new().hot_keys_where(|_| true))
            .build();
        let router = app(&layer);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(send(&router, "erin").await);
        }
        assert_eq!(
            seen.iter().map(|r| r.0).collect::<Vec<_>>(),
            statuses,
            "{policy:?}"
        );
        assert!(seen.iter().all(|r| r.4 == degraded), "{seen:?}");
        assert_eq!(
            seen.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
            remaining
        );
        let c = layer.metrics().counts("window");
        assert_eq!((c.degraded, c.batch, c.deny_cache), (3, 0, 0), "{policy:?}");
        assert_eq!(layer.client().batch_stats().granted, 0);
    }
}
