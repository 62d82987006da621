//! Shadow policies in the HTTP layer on a real server with the test clock (time stands still, so
//! every header value is exact): evaluated, reported, never denying, and the enforced limits
//! beside them deciding and consuming exactly as without them.

mod common;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use common::{Server, set_clock};
use http::Request;
use ratelimit_client::middleware::{ActualCost, KeySource, Policy, RateLimitLayer, ShadowDenials};
use ratelimit_client::{Algorithm, Client, Concurrency, Options};
use redis::aio::ConnectionManager;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tower::ServiceExt;

fn started() -> (Server, Client<ConnectionManager>) {
    let server = Server::with_test_clock();
    set_clock(&mut server.connect(), 1_800_000_000_000_000);
    let client = Client::connect(&server.url(), Options::default()).unwrap();
    (server, client)
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    shadow_denials: Option<Vec<String>>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn limit_headers(&self) -> Vec<(&str, &str)> {
        [
            "ratelimit-policy",
            "ratelimit",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            "ratelimit-degraded",
            "retry-after",
        ]
        .iter()
        .filter_map(|n| self.header(n).map(|v| (*n, v)))
        .collect()
    }
}

async fn send(router: &Router, user: &str, used: Option<u64>) -> Reply {
    let mut b = Request::get("/").header("x-api-key", user);
    if let Some(n) = used {
        b = b.header("x-used", n.to_string());
    }
    send_req(router, b.body(Body::empty()).unwrap()).await
}

/// Sends `req` and reads the whole body (a lease is given back once it has been sent).
async fn send_req(router: &Router, req: Request<Body>) -> Reply {
    let resp = router.clone().oneshot(req).await.unwrap();
    let reply = Reply {
        status: resp.status().as_u16(),
        headers: resp
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect(),
        shadow_denials: resp
            .extensions()
            .get::<ShadowDenials>()
            .map(|d| d.0.clone()),
    };
    axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    reply
}

fn router(
    client: Client<ConnectionManager>,
    policies: Vec<Policy>,
    estimate: u64,
) -> (Router, RateLimitLayer<ConnectionManager>) {
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .route_class(|_| "api".into())
        .limits("*", "*", policies)
        .estimate("*", estimate)
        .legacy_headers(true)
        // The calls to Redis are counted: every request asks it.
        .deny_cache(false)
        .build();
    let handler = |headers: http::HeaderMap| async move {
        match headers
            .get("x-used")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            Some(n) => (axum::Extension(ActualCost(n)), "ok").into_response(),
            None => "ok".into_response(),
        }
    };
    let r = Router::new().route("/", get(handler)).layer(layer.clone());
    (r, layer)
}

fn fixed(name: &str, limit: u64, window_sec: f64) -> Policy {
    Policy::new(name, Algorithm::FixedWindow { limit, window_sec })
}

fn calls(server: &Server) -> Vec<String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connect())
        .unwrap();
    let mut v: Vec<String> = info
        .lines()
        .filter(|l| l.starts_with("cmdstat_rl.") && !l.starts_with("cmdstat_rl.testclock"))
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn dump(server: &Server, key: &str) -> Vec<u8> {
    redis::cmd("DUMP")
        .arg(key)
        .query(&mut server.connect())
        .unwrap()
}

#[tokio::test]
async fn a_shadow_limit_that_would_deny_lets_requests_through() {
    let (server, client) = started();
    let (r, layer) = router(
        client,
        vec![fixed("hourly", 5, 3600.0), fixed("burst", 2, 60.0).shadow()],
        1,
    );
    let mut replies = Vec::new();
    for _ in 0..6 {
        replies.push(send(&r, "alice", None).await);
    }
    assert_eq!(
        replies.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![200, 200, 200, 200, 200, 429]
    );
    let policy = "\"hourly\";q=5;w=3600, \"burst\";q=2;w=60";
    assert_eq!(
        replies[0].limit_headers(),
        vec![
            ("ratelimit-policy", policy),
            ("ratelimit", "\"hourly\";r=4;t=3600, \"burst\";r=1;t=60"),
            ("ratelimit-limit", "5"),
            ("ratelimit-remaining", "4"),
            ("ratelimit-reset", "3600"),
        ]
    );
    // The third would have been refused by "burst": it goes through, its fields as computed,
    // the legacy fields still the enforced limit's.
    assert_eq!(
        replies[2].limit_headers(),
        vec![
            ("ratelimit-policy", policy),
            ("ratelimit", "\"hourly\";r=2;t=3600, \"burst\";r=0;t=60"),
            ("ratelimit-limit", "5"),
            ("ratelimit-remaining", "2"),
            ("ratelimit-reset", "3600"),
        ]
    );
    assert_eq!(
        replies
            .iter()
            .map(|r| r.shadow_denials.clone())
            .collect::<Vec<_>>(),
        [None, None, Some(1), Some(1), Some(1), None]
            .map(|d| d.map(|_| vec!["burst".to_string()]))
            .to_vec()
    );
    // Refused by the enforced limit: "burst" only peeked at, for the fields.
    assert_eq!(
        replies[5].limit_headers(),
        vec![
            ("ratelimit-policy", policy),
            ("ratelimit", "\"hourly\";r=0;t=3600, \"burst\";r=0;t=60"),
            ("ratelimit-limit", "5"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "3600"),
            ("retry-after", "3600"),
        ]
    );
    let m = layer.metrics();
    let (h, b) = (m.counts("hourly"), m.counts("burst"));
    assert_eq!(
        (h.allowed, h.denied, h.shadow_denied, h.shadow),
        (5, 1, 0, false)
    );
    assert_eq!(
        (b.allowed, b.denied, b.shadow_denied, b.shadow),
        (2, 0, 3, true)
    );
    assert!(m.render_prometheus().ends_with(
        "ratelimit_decisions_total{limit=\"burst\",outcome=\"allowed\"} 2\n\
         ratelimit_decisions_total{limit=\"burst\",outcome=\"denied\"} 0\n\
         ratelimit_decisions_total{limit=\"burst\",outcome=\"degraded\"} 0\n\
         ratelimit_decisions_total{limit=\"burst\",outcome=\"shadow_denied\"} 3\n\
         ratelimit_decisions_total{limit=\"hourly\",outcome=\"allowed\"} 5\n\
         ratelimit_decisions_total{limit=\"hourly\",outcome=\"denied\"} 1\n\
         ratelimit_decisions_total{limit=\"hourly\",outcome=\"degraded\"} 0\n"
    ));
    // Each limit in its own call: 6 for "hourly", 5 checks and 1 peek for "burst"; the stored
    // counts are 5 and 2 (the shadow limit consumed only what it admitted).
    assert_eq!(calls(&server), vec!["cmdstat_rl.fixedwindow:calls=12"]);
    let count = |key: &str| -> String {
        let v: String = redis::cmd("GET")
            .arg(key)
            .query(&mut server.connect())
            .unwrap();
        // The window's tag, then its count.
        v.split(' ').nth(1).unwrap().to_string()
    };
    assert_eq!(count("rl:{alice}:api:hourly"), "5");
    assert_eq!(count("rl:{alice}:api:burst"), "2");
}

/// Two enforced limits in one `RL.ALL` and a shadow limit that denies from the second request
/// on: statuses, the enforced limits' fields and their stored bytes are those of the same route
/// without the shadow limit.
#[tokio::test]
async fn enforced_limits_beside_a_shadow_limit_behave_as_without_it() {
    let (server, client) = started();
    let enforced = || {
        vec![
            Policy::new(
                "burst",
                Algorithm::TokenBucket {
                    capacity: 3,
                    refill_per_sec: 0.5,
                },
            ),
            Policy::new(
                "hourly",
                Algorithm::SlidingWindow {
                    limit: 100,
                    window_sec: 3600.0,
                },
            ),
        ]
    };
    let mut with = enforced();
    with.insert(1, fixed("new", 1, 60.0).shadow());
    let (plain, plain_layer) = router(client.clone(), enforced(), 1);
    let (shadowed, layer) = router(client, with, 1);
    for n in 0..5 {
        let a = send(&plain, "bob", None).await;
        let b = send(&shadowed, "carol", None).await;
        assert_eq!(a.status, b.status, "request {n}");
        assert_eq!(
            a.header("retry-after"),
            b.header("retry-after"),
            "request {n}"
        );
        for h in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
            assert_eq!(a.header(h), b.header(h), "request {n}: {h}");
        }
        // The shadow limit's field sits between the enforced ones.
        let (state, shadow_state) = (a.header("ratelimit").unwrap(), b.header("ratelimit"));
        let (first, second) = state.split_once(", ").unwrap();
        // Admitted by the first request (which took its only unit), then would-be refusals
        // while the enforced limits admit, then peeks once they refuse.
        assert_eq!(
            shadow_state,
            Some(format!("{first}, \"new\";r=0;t=60, {second}").as_str()),
            "request {n}"
        );
        assert_eq!(
            b.shadow_denials,
            (n > 0 && a.status == 200).then(|| vec!["new".to_string()])
        );
    }
    let c = layer.metrics().counts("new");
    assert_eq!((c.allowed, c.shadow_denied, c.denied), (1, 2, 0));
    for limit in ["burst", "hourly"] {
        assert_eq!(
            layer.metrics().counts(limit),
            plain_layer.metrics().counts(limit)
        );
        assert_eq!(
            dump(&server, &format!("rl:{{bob}}:api:{limit}")),
            dump(&server, &format!("rl:{{carol}}:api:{limit}")),
            "{limit}"
        );
    }
    assert_eq!(
        (
            plain_layer.metrics().counts("burst").allowed,
            plain_layer.metrics().counts("burst").denied
        ),
        (3, 2)
    );
    // Both routes: 5 RL.ALL each; the shadow limit 3 checks and 2 peeks of its own.
    assert_eq!(
        calls(&server),
        vec![
            "cmdstat_rl.all:calls=10".to_string(),
            "cmdstat_rl.fixedwindow:calls=5".to_string()
        ]
    );
}

#[tokio::test]
async fn a_route_of_shadow_limits_alone_never_denies() {
    let (_server, client) = started();
    let (r, layer) = router(client, vec![fixed("trial", 1, 60.0).shadow()], 1);
    for n in 0..3 {
        let reply = send(&r, "dave", None).await;
        assert_eq!(reply.status, 200);
        // No enforced limit: no legacy fields.
        assert_eq!(
            reply.limit_headers(),
            vec![
                ("ratelimit-policy", "\"trial\";q=1;w=60"),
                ("ratelimit", "\"trial\";r=0;t=60"),
            ],
            "request {n}"
        );
    }
    let c = layer.metrics().counts("trial");
    assert_eq!((c.allowed, c.shadow_denied, c.denied), (1, 2, 0));
}

/// Estimates and actual costs: a shadow limit that admitted is settled like the enforced one;
/// one that would have refused consumed nothing and is not settled.
#[tokio::test]
async fn a_shadow_limit_is_settled_when_it_admitted() {
    let (server, client) = started();
    let bucket = |name: &str, capacity: u64| {
        Policy::new(
            name,
            Algorithm::TokenBucket {
                capacity,
                refill_per_sec: 100.0,
            },
        )
    };
    let (r, layer) = router(
        client,
        vec![bucket("tokens", 10_000), bucket("tighter", 5000).shadow()],
        4000,
    );
    let mut states = Vec::new();
    for _ in 0..3 {
        let reply = send(&r, "erin", Some(1000)).await;
        assert_eq!(reply.status, 200);
        states.push(reply.header("ratelimit").unwrap().to_string());
    }
    assert_eq!(
        states,
        vec![
            "\"tokens\";r=9000;t=10, \"tighter\";r=4000;t=10",
            "\"tokens\";r=8000;t=20, \"tighter\";r=3000;t=20",
            // 3,000 left: 4,000 would have been refused; nothing taken, nothing settled.
            "\"tokens\";r=7000;t=30, \"tighter\";r=3000;t=20",
        ]
    );
    let m = layer.metrics();
    let (t, s) = (m.counts("tokens"), m.counts("tighter"));
    assert_eq!((t.allowed, t.refunded), (3, 9000));
    assert_eq!((s.allowed, s.shadow_denied, s.refunded), (2, 1, 6000));
    assert_eq!(
        calls(&server),
        vec![
            "cmdstat_rl.settle:calls=5".to_string(),
            "cmdstat_rl.tokenbucket:calls=6".to_string()
        ]
    );
}

async fn leases(server: &Server, key: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(key)
        .query(&mut server.connect())
        .unwrap()
}

/// A shadow concurrency limit of 1: the second request in flight would have been refused and
/// goes through; the first one's slot is held until its response has been sent.
#[tokio::test]
async fn a_shadow_concurrency_limit_holds_a_slot_when_it_has_one() {
    let (server, client) = started();
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits(
            "*",
            "*",
            vec![
                fixed("hourly", 100, 3600.0),
                Policy::new(
                    "inflight",
                    Algorithm::Concurrency(Concurrency {
                        limit: 1,
                        lease_sec: 30.0,
                    }),
                )
                .shadow(),
            ],
        )
        .build();
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let r = Router::new()
        .route(
            "/",
            get(move |headers: http::HeaderMap| {
                let gate = g.clone();
                async move {
                    if headers.contains_key("x-wait") {
                        gate.acquire().await.unwrap().forget();
                    }
                    "ok"
                }
            }),
        )
        .layer(layer.clone());
    let req = |wait: bool| {
        let mut b = Request::get("/").header("x-api-key", "frank");
        if wait {
            b = b.header("x-wait", "1");
        }
        b.body(Body::empty()).unwrap()
    };
    let key = "rl:{frank}:default:inflight";
    let held = {
        let r = r.clone();
        let first = req(true);
        tokio::spawn(async move { send_req(&r, first).await })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while leases(&server, key).await != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first never got its slot"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let second = send_req(&r, req(false)).await;
    assert_eq!(second.status, 200);
    assert_eq!(
        second.limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"hourly\";q=100;w=3600, \"inflight\";q=1;qu=\"concurrent-requests\""
            ),
            ("ratelimit", "\"hourly\";r=98;t=3600, \"inflight\";r=0;t=30"),
        ]
    );
    assert_eq!(second.shadow_denials, Some(vec!["inflight".to_string()]));
    assert_eq!(leases(&server, key).await, 1);
    gate.add_permits(1);
    let first = held.await.unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit"),
        Some("\"hourly\";r=99;t=3600, \"inflight\";r=0;t=30")
    );
    assert_eq!(first.shadow_denials, None);
    // Given back once the first response was sent (from a task: a round trip later).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while leases(&server, key).await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let third = send_req(&r, req(false)).await;
    assert_eq!(
        third.header("ratelimit"),
        Some("\"hourly\";r=97;t=3600, \"inflight\";r=0;t=30")
    );
    assert_eq!(third.shadow_denials, None);
    let c = layer.metrics().counts("inflight");
    assert_eq!((c.allowed, c.shadow_denied, c.denied), (2, 1, 0));
}
