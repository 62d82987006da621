//! The HTTP layer on a real server with the test clock (time stands still, so every header value
//! is exact).

mod common;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use common::{Server, advance_clock, free_port, set_clock};
use http::{Request, StatusCode};
use ratelimit_client::middleware::{KeySource, Policy, RateLimitLayer};
use ratelimit_client::{Algorithm, Client, FailurePolicy, Options};
use redis::aio::ConnectionManager;
use tower::ServiceExt;

fn per_minute() -> Policy {
    Policy::new(
        "per-minute",
        Algorithm::FixedWindow {
            limit: 2,
            window_sec: 60.0,
        },
    )
}

fn app(
    client: Client<ConnectionManager>,
    legacy: bool,
) -> (Router, RateLimitLayer<ConnectionManager>) {
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .plan(|p| {
            p.headers
                .get("x-plan")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("free")
                .to_string()
        })
        .route_class(|p| {
            if p.uri.path().starts_with("/login") {
                "login".into()
            } else {
                "api".into()
            }
        })
        .limits("free", "*", vec![per_minute()])
        .limits(
            "pro",
            "*",
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
            ],
        )
        .limits(
            "*",
            "login",
            vec![Policy::new(
                "login",
                Algorithm::Gcra {
                    max_burst: 0,
                    count_per_period: 1,
                    period_sec: 2.5,
                },
            )],
        )
        .legacy_headers(legacy)
        .build();
    let router = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", get(|| async { "welcome" }))
        .route("/open", get(|| async { "open" }))
        .layer(layer.clone());
    (router, layer)
}

struct Reply {
    status: StatusCode,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The rate-limit related headers, in a fixed order.
    fn limit_headers(&self) -> Vec<(&str, &str)> {
        [
            "ratelimit-policy",
            "ratelimit",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            "ratelimit-degraded",
            "retry-after",
            "content-type",
        ]
        .iter()
        .filter_map(|n| self.header(n).map(|v| (*n, v)))
        .collect()
    }
}

async fn send(router: &Router, req: Request<Body>) -> Reply {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn get_req(path: &str, key: &str, plan: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path).header("x-api-key", key);
    if let Some(p) = plan {
        b = b.header("x-plan", p);
    }
    b.body(Body::empty()).unwrap()
}

fn started() -> (Server, Client<ConnectionManager>) {
    let server = Server::with_test_clock();
    set_clock(&mut server.connect(), 1_800_000_000_000_000);
    let client = Client::connect(&server.url(), Options::default()).unwrap();
    (server, client)
}

#[tokio::test]
async fn one_limit_headers_and_429() {
    let (server, client) = started();
    let (router, layer) = app(client, true);
    let r = send(&router, get_req("/", "alice", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "ok");
    assert_eq!(
        r.limit_headers(),
        vec![
            ("ratelimit-policy", "\"per-minute\";q=2;w=60"),
            ("ratelimit", "\"per-minute\";r=1;t=60"),
            ("ratelimit-limit", "2"),
            ("ratelimit-remaining", "1"),
            ("ratelimit-reset", "60"),
            ("content-type", "text/plain; charset=utf-8"),
        ]
    );
    advance_clock(&mut server.connect(), 20_500_000);
    let r = send(&router, get_req("/", "alice", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some("\"per-minute\";r=0;t=40"));
    let r = send(&router, get_req("/", "alice", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.limit_headers(),
        vec![
            ("ratelimit-policy", "\"per-minute\";q=2;w=60"),
            ("ratelimit", "\"per-minute\";r=0;t=40"),
            ("ratelimit-limit", "2"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "40"),
            ("retry-after", "40"),
            ("content-type", "application/problem+json"),
        ]
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.body).unwrap(),
        serde_json::json!({
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "rate limit 'per-minute' exceeded; retry in 40 s",
            "limit": "per-minute",
            "retry_after": 40,
        })
    );
    // Another key has its own limit; the keys are in Redis under a hash tag.
    let r = send(&router, get_req("/", "bob", None)).await;
    assert_eq!(r.header("ratelimit"), Some("\"per-minute\";r=1;t=60"));
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query::<Vec<String>>(&mut server.connect())
        .map(|mut v| {
            v.sort();
            v
        })
        .unwrap();
    assert_eq!(
        keys,
        vec!["rl:{alice}:api:per-minute", "rl:{bob}:api:per-minute"]
    );
    assert_eq!(
        layer.metrics().render_prometheus(),
        "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, and degraded (made without Redis).\n\
         # TYPE ratelimit_decisions_total counter\n\
         ratelimit_decisions_total{limit=\"per-minute\",outcome=\"allowed\"} 3\n\
         ratelimit_decisions_total{limit=\"per-minute\",outcome=\"denied\"} 1\n\
         ratelimit_decisions_total{limit=\"per-minute\",outcome=\"degraded\"} 0\n"
    );
}

#[tokio::test]
async fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
    let (server, client) = started();
    let (router, _) = app(client, false);
    // GCRA, one per 2.5 s and no burst: the second call waits 2.5 s -> "3".
    let r = send(&router, get_req("/login", "carol", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.limit_headers(),
        vec![
            ("ratelimit-policy", "\"login\";q=1;w=3"),
            ("ratelimit", "\"login\";r=0;t=3"),
            ("content-type", "text/plain; charset=utf-8"),
        ]
    );
    let r = send(&router, get_req("/login", "carol", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("3"));
    // 2.4 s later the wait is 100 ms: still "1", never "0".
    advance_clock(&mut server.connect(), 2_400_000);
    let r = send(&router, get_req("/login", "carol", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("ratelimit"), Some("\"login\";r=0;t=1"));
    advance_clock(&mut server.connect(), 100_000);
    let r = send(&router, get_req("/login", "carol", None)).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn plan_with_two_limits_uses_one_call_for_both() {
    let (server, client) = started();
    let (router, layer) = app(client, true);
    let mut rs = Vec::new();
    for _ in 0..4 {
        rs.push(send(&router, get_req("/", "dave", Some("pro"))).await);
    }
    assert_eq!(
        rs.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>(),
        vec![200, 200, 200, 429]
    );
    assert_eq!(
        rs[2].limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"burst\";q=3;w=6, \"hourly\";q=100;w=3600"
            ),
            ("ratelimit", "\"burst\";r=0;t=6, \"hourly\";r=97;t=7200"),
            ("ratelimit-limit", "3"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "6"),
            ("content-type", "text/plain; charset=utf-8"),
        ]
    );
    // Denied by "burst"; nothing was taken from "hourly".
    assert_eq!(
        rs[3].limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"burst\";q=3;w=6, \"hourly\";q=100;w=3600"
            ),
            ("ratelimit", "\"burst\";r=0;t=6, \"hourly\";r=97;t=7200"),
            ("ratelimit-limit", "3"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "6"),
            ("retry-after", "2"),
            ("content-type", "application/problem+json"),
        ]
    );
    let m = layer.metrics();
    assert_eq!(
        (m.counts("burst").allowed, m.counts("burst").denied),
        (3, 1)
    );
    assert_eq!(
        (m.counts("hourly").allowed, m.counts("hourly").denied),
        (3, 0)
    );
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connect())
        .unwrap();
    assert!(info.contains("cmdstat_rl.all:calls=4,"), "{info}");
}

#[tokio::test]
async fn client_ip_honours_only_trusted_proxies() {
    let (server, client) = started();
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::ClientIp {
            trusted_proxies: vec!["10.0.0.1".parse().unwrap()],
        })
        .limits("*", "*", vec![per_minute()])
        .build();
    let router = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let req = |peer: &str, xff: Option<&str>| {
        let mut b = Request::get("/");
        if let Some(x) = xff {
            b = b.header("x-forwarded-for", x);
        }
        let mut r = b.body(Body::empty()).unwrap();
        r.extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        r
    };
    // Through the trusted proxy: the rightmost untrusted address.
    send(&router, req("10.0.0.1:5000", Some("9.9.9.9, 1.2.3.4"))).await;
    // An untrusted peer's X-Forwarded-For is ignored.
    send(&router, req("5.6.7.8:5000", Some("1.2.3.4"))).await;
    // The proxy itself listed last is skipped.
    send(&router, req("10.0.0.1:5000", Some("4.3.2.1, 10.0.0.1"))).await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connect())
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "rl:{1.2.3.4}:default:per-minute",
            "rl:{4.3.2.1}:default:per-minute",
            "rl:{5.6.7.8}:default:per-minute",
        ]
    );
}

#[tokio::test]
async fn degraded_responses_say_so() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    for (policy, status, state, degraded) in [
        (
            FailurePolicy::FailOpen,
            200,
            "\"per-minute\";r=2;t=0",
            "fail-open",
        ),
        (
            FailurePolicy::FailClosed,
            429,
            "\"per-minute\";r=0;t=1",
            "fail-closed",
        ),
        (
            FailurePolicy::Local { instances: 2 },
            200,
            "\"per-minute\";r=0;t=60",
            "local",
        ),
    ] {
        let client = Client::connect(
            &url,
            Options {
                policy,
                ..Options::default()
            },
        )
        .unwrap();
        let (router, layer) = app(client, false);
        let r = send(&router, get_req("/", "erin", None)).await;
        assert_eq!(r.status.as_u16(), status, "{policy:?}");
        assert_eq!(r.header("ratelimit"), Some(state), "{policy:?}");
        assert_eq!(r.header("ratelimit-degraded"), Some(degraded));
        let c = layer.metrics().counts("per-minute");
        assert_eq!(c.degraded, 1);
        assert_eq!(c.allowed + c.denied, 1);
    }
}

#[tokio::test]
async fn routes_without_limits_pass_untouched() {
    let (_server, client) = started();
    let layer = RateLimitLayer::builder(client)
        .route_class(|p| p.uri.path().trim_start_matches('/').to_string())
        .limits("*", "limited", vec![per_minute()])
        .build();
    let router = Router::new()
        .route("/open", get(|| async { "open" }))
        .layer(layer);
    let r = send(&router, Request::get("/open").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("ratelimit-policy"), None);
}
