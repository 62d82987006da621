//! The HTTP layer on a real server with the test clock (time stands still, so every header value
//! is exact).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use axum::routing::get;
use common::{Server, advance_clock, free_port, set_clock};
use http::{Request, StatusCode};
use ratelimit_client::middleware::{ActualCost, KeySource, Policy, RateLimitLayer};
use ratelimit_client::{Algorithm, Client, Concurrency, FailurePolicy, Options};
use redis::aio::ConnectionManager;
use tokio::sync::Semaphore;
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
        // The test clock moves the server's time, not the process's: every request asks Redis.
        .deny_cache(false)
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
        "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n\
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

/// `RateLimitLayer::render_prometheus`: the counters, then the breaker's state, which opens
/// after three calls Redis did not answer; every series the clients' alert rules
/// (docs/monitoring/client_alerts.yml) select is there.
#[tokio::test]
async fn the_layer_exports_the_breaker_and_every_series_the_client_alerts_use() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let client = Client::connect(&url, Options::default()).unwrap();
    let (router, layer) = app(client, false);
    let r = send(&router, get_req("/", "erin", None)).await;
    assert_eq!(r.header("ratelimit-degraded"), Some("fail-open"));
    assert!(!layer.client().breaker_open());
    let text = layer.render_prometheus();
    assert!(text.ends_with(
        "# HELP ratelimit_breaker_open Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers without asking it.\n\
         # TYPE ratelimit_breaker_open gauge\n\
         ratelimit_breaker_open 0\n"
    ), "{text}");
    assert!(text.starts_with(&layer.metrics().render_prometheus()));
    for _ in 0..2 {
        send(&router, get_req("/", "erin", None)).await;
    }
    assert!(layer.client().breaker_open());
    let text = layer.render_prometheus();
    assert!(text.ends_with("ratelimit_breaker_open 1\n"), "{text}");
    assert!(
        text.contains("ratelimit_decisions_total{limit=\"per-minute\",outcome=\"degraded\"} 3\n"),
        "{text}"
    );

    // The series the rules select, with their label matchers, each among those lines.
    let rules = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/monitoring/client_alerts.yml"),
    )
    .unwrap();
    let selector = regex::Regex::new(r"\b(ratelimit_[a-z_]+)(\{([^}]*)\})?").unwrap();
    let mut checked = 0;
    for expr in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
    {
        for m in selector.captures_iter(expr) {
            let name = &m[1];
            let labels: Vec<String> = m
                .get(3)
                .map(|l| {
                    l.as_str()
                        .split(',')
                        .map(|kv| kv.trim().to_string())
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                text.lines().any(|line| line.starts_with(name)
                    && line[name.len()..].starts_with([' ', '{'])
                    && labels.iter().all(|kv| line.contains(kv.as_str()))),
                "{name} {labels:?} not exported:\n{text}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2, "{rules}");
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

/// A body that never ends: a line every 20 ms until the connection drops it.
struct Drip(tokio::time::Interval);

impl http_body::Body for Drip {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.0.poll_tick(cx).map(|_| {
            Some(Ok(http_body::Frame::data(axum::body::Bytes::from_static(
                b"tick\n",
            ))))
        })
    }
}

/// Requests in flight, counted by a concurrency limit of 3 per API key.
fn inflight_layer(client: Client<ConnectionManager>) -> RateLimitLayer<ConnectionManager> {
    RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits(
            "*",
            "*",
            vec![Policy::new(
                "inflight",
                Algorithm::Concurrency(Concurrency {
                    limit: 3,
                    lease_sec: 30.0,
                }),
            )],
        )
        .build()
}

async fn zcard(server: &Server, key: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(key)
        .query(&mut server.connect())
        .unwrap()
}

/// Waits (at most 5 s) until `key` holds `n` leases: the release is sent from a task.
async fn wait_leases(server: &Server, key: &str, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while zcard(server, key).await != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{key}: {} leases, not {n}",
            zcard(server, key).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_concurrency_limit_counts_requests_in_flight() {
    let (server, client) = started();
    let layer = inflight_layer(client);
    // `/work` with `x-wait` waits for a permit of `gate` (after adding one to `entered`);
    // `/stream` never ends.
    let entered = Arc::new(Semaphore::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let (e, g) = (entered.clone(), gate.clone());
    let router = Router::new()
        .route(
            "/work",
            get(move |headers: http::HeaderMap| {
                let (e, g) = (e.clone(), g.clone());
                async move {
                    if headers.contains_key("x-wait") {
                        e.add_permits(1);
                        g.acquire().await.unwrap().forget();
                    }
                    "done"
                }
            }),
        )
        .route(
            "/stream",
            get(|| async {
                let every = tokio::time::interval(std::time::Duration::from_millis(20));
                axum::response::Response::new(Body::new(Drip(every)))
            }),
        )
        .layer(layer.clone());
    let key = "rl:{alice}:default:inflight";
    let waiting = || {
        Request::get("/work")
            .header("x-api-key", "alice")
            .header("x-wait", "1")
            .body(Body::empty())
            .unwrap()
    };
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..3 {
        let (r, tx) = (router.clone(), done_tx.clone());
        tokio::spawn(async move { tx.send(send(&r, waiting()).await).unwrap() });
    }
    entered.acquire_many(3).await.unwrap().forget();
    assert_eq!(zcard(&server, key).await, 3);

    // The fourth is refused while three are in flight.
    let r = send(&router, get_req("/work", "alice", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"inflight\";q=3;qu=\"concurrent-requests\""
            ),
            ("ratelimit", "\"inflight\";r=0;t=30"),
            ("retry-after", "30"),
            ("content-type", "application/problem+json"),
        ]
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.body).unwrap(),
        serde_json::json!({
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "rate limit 'inflight' exceeded; retry in 30 s",
            "limit": "inflight",
            "retry_after": 30,
        })
    );
    // Another key has its own slots.
    let r = send(&router, get_req("/work", "bob", None)).await;
    assert_eq!(r.header("ratelimit"), Some("\"inflight\";r=2;t=30"));

    // One response finishes: its slot comes back, and the next request is admitted.
    gate.add_permits(1);
    let finished = done.recv().await.unwrap();
    assert_eq!(
        (finished.status, finished.body.as_str()),
        (StatusCode::OK, "done")
    );
    wait_leases(&server, key, 2).await;
    let r = send(&router, get_req("/work", "alice", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"inflight\";q=3;qu=\"concurrent-requests\""
            ),
            ("ratelimit", "\"inflight\";r=0;t=30"),
            ("content-type", "text/plain; charset=utf-8"),
        ]
    );
    wait_leases(&server, key, 2).await;

    // A response body dropped before its end (the client went away) gives the slot back.
    let resp = router
        .clone()
        .oneshot(get_req("/stream", "alice", None))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(zcard(&server, key).await, 3);
    drop(resp);
    wait_leases(&server, key, 2).await;

    // The same over a real connection that the client closes mid-response.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(axum::serve(listener, router.clone()).into_future());
    let head = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        write!(
            s,
            "GET /stream HTTP/1.1\r\nHost: {addr}\r\nx-api-key: alice\r\n\r\n"
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("tick") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed early");
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).to_ascii_lowercase()
        // The connection closes here, mid-response.
    })
    .await
    .unwrap();
    assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
    assert!(
        head.contains("\r\nratelimit: \"inflight\";r=0;t=30\r\n"),
        "{head}"
    );
    wait_leases(&server, key, 2).await;
    let r = send(&router, get_req("/work", "alice", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some("\"inflight\";r=0;t=30"));
    serving.abort();

    // The last two finish; the key goes with its last lease.
    gate.add_permits(2);
    for _ in 0..2 {
        assert_eq!(done.recv().await.unwrap().status, StatusCode::OK);
    }
    wait_leases(&server, key, 0).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query(&mut server.connect())
        .unwrap();
    assert_eq!(exists, 0);
    let c = layer.metrics().counts("inflight");
    assert_eq!((c.allowed, c.denied, c.degraded), (8, 1, 0));
}

#[tokio::test]
async fn a_concurrency_limit_and_a_rate_limit_in_one_call() {
    let (server, client) = started();
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits(
            "*",
            "*",
            vec![
                Policy::new(
                    "inflight",
                    Algorithm::Concurrency(Concurrency {
                        limit: 2,
                        lease_sec: 10.0,
                    }),
                ),
                per_minute(),
            ],
        )
        .build();
    let router = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = send(&router, get_req("/", "frank", None)).await;
        // Each response is over before the next request: its slot is given back meanwhile.
        wait_leases(&server, "rl:{frank}:default:inflight", 0).await;
        let headers: Vec<(String, String)> = r
            .limit_headers()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        seen.push((r.status.as_u16(), headers));
    }
    let policy = (
        "ratelimit-policy",
        "\"inflight\";q=2;qu=\"concurrent-requests\", \"per-minute\";q=2;w=60",
    );
    let owned = |v: Vec<(&str, &str)>| -> Vec<(String, String)> {
        v.into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        seen,
        vec![
            (
                200,
                owned(vec![
                    policy,
                    (
                        "ratelimit",
                        "\"inflight\";r=1;t=10, \"per-minute\";r=1;t=60"
                    ),
                    ("content-type", "text/plain; charset=utf-8"),
                ])
            ),
            (
                200,
                owned(vec![
                    policy,
                    (
                        "ratelimit",
                        "\"inflight\";r=1;t=10, \"per-minute\";r=0;t=60"
                    ),
                    ("content-type", "text/plain; charset=utf-8"),
                ])
            ),
            (
                429,
                owned(vec![
                    policy,
                    ("ratelimit", "\"inflight\";r=2;t=0, \"per-minute\";r=0;t=60"),
                    ("retry-after", "60"),
                    ("content-type", "application/problem+json"),
                ])
            ),
        ]
    );
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connect())
        .unwrap();
    assert!(info.contains("cmdstat_rl.all:calls=3,"), "{info}");
    assert!(info.contains("cmdstat_rl.release:calls=2,"), "{info}");
}

/// One request waits in its handler until `gate` opens; the others answer at once.
fn waiting_router(layer: RateLimitLayer<ConnectionManager>, gate: Arc<Semaphore>) -> Router {
    Router::new()
        .route(
            "/",
            get(move |headers: http::HeaderMap| {
                let gate = gate.clone();
                async move {
                    if headers.contains_key("x-wait") {
                        gate.acquire().await.unwrap().forget();
                    }
                    "ok"
                }
            }),
        )
        .layer(layer)
}

fn one_in_flight(lease_sec: f64) -> Vec<Policy> {
    vec![Policy::new(
        "inflight",
        Algorithm::Concurrency(Concurrency {
            limit: 1,
            lease_sec,
        }),
    )]
}

#[tokio::test]
async fn a_lease_outlasts_its_expiry_while_kept_alive() {
    let server = Server::with_module();
    let client = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits("*", "*", one_in_flight(0.3))
        .lease_keep_alive(std::time::Duration::from_millis(50))
        .build();
    let gate = Arc::new(Semaphore::new(0));
    let router = waiting_router(layer, gate.clone());
    let r = router.clone();
    let slow = tokio::spawn(async move {
        let req = Request::get("/")
            .header("x-api-key", "gina")
            .header("x-wait", "1")
            .body(Body::empty())
            .unwrap();
        send(&r, req).await
    });
    wait_leases(&server, "rl:{gina}:default:inflight", 1).await;
    // Four times the lease later the slow request still holds its slot.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let r = send(&router, get_req("/", "gina", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    gate.add_permits(1);
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    wait_leases(&server, "rl:{gina}:default:inflight", 0).await;
    let r = send(&router, get_req("/", "gina", None)).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn the_local_fallback_counts_requests_in_flight_too() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let client = Client::connect(
        &url,
        Options {
            policy: FailurePolicy::Local { instances: 1 },
            ..Options::default()
        },
    )
    .unwrap();
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits("*", "*", one_in_flight(30.0))
        .build();
    let gate = Arc::new(Semaphore::new(0));
    let router = waiting_router(layer.clone(), gate.clone());
    let r = router.clone();
    let slow = tokio::spawn(async move {
        let req = Request::get("/")
            .header("x-api-key", "hal")
            .header("x-wait", "1")
            .body(Body::empty())
            .unwrap();
        send(&r, req).await
    });
    // The slow request is in its handler once the layer has counted it.
    while layer.metrics().counts("inflight").allowed == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let r = send(&router, get_req("/", "hal", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"inflight\";q=1;qu=\"concurrent-requests\""
            ),
            ("ratelimit", "\"inflight\";r=0;t=30"),
            ("ratelimit-degraded", "local"),
            ("retry-after", "30"),
            ("content-type", "application/problem+json"),
        ]
    );
    gate.add_permits(1);
    let done = slow.await.unwrap();
    assert_eq!(done.status, StatusCode::OK);
    assert_eq!(done.header("ratelimit"), Some("\"inflight\";r=0;t=30"));
    // The local slot came back with the response, at once.
    let r = send(&router, get_req("/", "hal", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit-degraded"), Some("local"));
    let c = layer.metrics().counts("inflight");
    assert_eq!((c.allowed, c.denied, c.degraded), (2, 1, 3));
}

/// A model's token budget per API key (10,000 tokens refilling 100/s), 4,000 reserved per
/// `/complete`; the handler reports what it used from the `x-used` header, or nothing. `/agent`
/// also counts requests in flight (two at once).
fn token_budget(client: Client<ConnectionManager>) -> (Router, RateLimitLayer<ConnectionManager>) {
    let tokens = || {
        Policy::new(
            "tokens",
            Algorithm::TokenBucket {
                capacity: 10_000,
                refill_per_sec: 100.0,
            },
        )
    };
    let inflight = Policy::new(
        "inflight",
        Algorithm::Concurrency(Concurrency {
            limit: 2,
            lease_sec: 30.0,
        }),
    );
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .route_class(|p| p.uri.path().trim_start_matches('/').to_string())
        .limits("*", "complete", vec![tokens()])
        .limits("*", "agent", vec![inflight, tokens()])
        .estimate("complete", 4000)
        .estimate("agent", 4000)
        // The test clock moves the server's time, not the process's: every request asks Redis.
        .deny_cache(false)
        .build();
    let handler = |headers: http::HeaderMap| async move {
        let used = headers
            .get("x-used")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        match used {
            Some(n) => (axum::Extension(ActualCost(n)), "done").into_response(),
            None => "done".into_response(),
        }
    };
    let router = Router::new()
        .route("/complete", get(handler))
        .route("/agent", get(handler))
        .layer(layer.clone());
    (router, layer)
}

fn used(path: &str, key: &str, tokens: Option<u64>) -> Request<Body> {
    let mut b = Request::get(path).header("x-api-key", key);
    if let Some(n) = tokens {
        b = b.header("x-used", n.to_string());
    }
    b.body(Body::empty()).unwrap()
}

fn settle_calls(server: &Server) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connect())
        .unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_rl.settle:"))
        .map(|l| l.split(',').next().unwrap().to_string())
}

#[tokio::test]
async fn a_smaller_actual_cost_is_refunded() {
    let (server, client) = started();
    let (router, layer) = token_budget(client);
    // 4,000 reserved, 1,200 used: 2,800 back before the response leaves.
    let r = send(&router, used("/complete", "alice", Some(1200))).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "done"));
    assert_eq!(
        r.limit_headers(),
        vec![
            ("ratelimit-policy", "\"tokens\";q=10000;w=100"),
            ("ratelimit", "\"tokens\";r=8800;t=12"),
            ("content-type", "text/plain; charset=utf-8"),
        ]
    );
    // The next request sees the refund: 8,800 - 4,000.
    let r = send(&router, used("/complete", "alice", Some(4000))).await;
    assert_eq!(r.header("ratelimit"), Some("\"tokens\";r=4800;t=52"));
    let c = layer.metrics().counts("tokens");
    assert_eq!(
        (c.allowed, c.denied, c.refunded, c.charged),
        (2, 0, 2800, 0)
    );
    // The second reported its estimate: nothing to settle.
    assert_eq!(
        settle_calls(&server).as_deref(),
        Some("cmdstat_rl.settle:calls=1")
    );
    assert!(layer.metrics().render_prometheus().ends_with(
        "ratelimit_settled_units_total{limit=\"tokens\",direction=\"refunded\"} 2800\n\
         ratelimit_settled_units_total{limit=\"tokens\",direction=\"charged\"} 0\n"
    ));
}

#[tokio::test]
async fn a_larger_actual_cost_is_charged_into_debt() {
    let (server, client) = started();
    let (router, layer) = token_budget(client);
    // 4,000 reserved, 14,000 used: 10,000 more, 4,000 of debt.
    let r = send(&router, used("/complete", "bob", Some(14_000))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some("\"tokens\";r=0;t=140"));
    // The next 4,000 are 8,000 tokens (80 s) away.
    let r = send(&router, used("/complete", "bob", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.limit_headers(),
        vec![
            ("ratelimit-policy", "\"tokens\";q=10000;w=100"),
            ("ratelimit", "\"tokens\";r=0;t=140"),
            ("retry-after", "80"),
            ("content-type", "application/problem+json"),
        ]
    );
    advance_clock(&mut server.connect(), 79_990_000);
    let r = send(&router, used("/complete", "bob", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    advance_clock(&mut server.connect(), 10_000);
    let r = send(&router, used("/complete", "bob", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some("\"tokens\";r=0;t=100"));
    let c = layer.metrics().counts("tokens");
    assert_eq!(
        (c.allowed, c.denied, c.refunded, c.charged),
        (2, 2, 0, 10_000)
    );
}

#[tokio::test]
async fn without_a_report_the_estimate_stands() {
    let (server, client) = started();
    let (router, layer) = token_budget(client);
    let r = send(&router, used("/complete", "carol", None)).await;
    assert_eq!(r.header("ratelimit"), Some("\"tokens\";r=6000;t=40"));
    let r = send(&router, used("/complete", "carol", None)).await;
    assert_eq!(r.header("ratelimit"), Some("\"tokens\";r=2000;t=80"));
    let r = send(&router, used("/complete", "carol", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("20"));
    assert_eq!(settle_calls(&server), None);
    let c = layer.metrics().counts("tokens");
    assert_eq!((c.refunded, c.charged), (0, 0));
}

/// With a concurrency limit on the route: the slot is taken as usual and only the token budget
/// is settled.
#[tokio::test]
async fn a_route_with_a_concurrency_limit_settles_its_other_limits() {
    let (server, client) = started();
    let (router, _) = token_budget(client);
    let r = send(&router, used("/agent", "dave", Some(1000))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.limit_headers(),
        vec![
            (
                "ratelimit-policy",
                "\"inflight\";q=2;qu=\"concurrent-requests\", \"tokens\";q=10000;w=100"
            ),
            ("ratelimit", "\"inflight\";r=1;t=30, \"tokens\";r=9000;t=10"),
            ("content-type", "text/plain; charset=utf-8"),
        ]
    );
    wait_leases(&server, "rl:{dave}:agent:inflight", 0).await;
    let r = send(&router, used("/agent", "dave", None)).await;
    assert_eq!(
        r.header("ratelimit"),
        Some("\"inflight\";r=1;t=30, \"tokens\";r=5000;t=50")
    );
}

/// Redis unreachable, `Local` policy: the in-process bucket is settled alike.
#[tokio::test]
async fn the_local_fallback_settles_its_own_buckets() {
    let client = Client::connect(
        &format!("redis://127.0.0.1:{}", free_port()),
        Options {
            policy: FailurePolicy::Local { instances: 1 },
            ..Options::default()
        },
    )
    .unwrap();
    let (router, layer) = token_budget(client);
    let r = send(&router, used("/complete", "erin", Some(1000))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit-degraded"), Some("local"));
    let state = r.header("ratelimit").unwrap();
    assert!(state.starts_with("\"tokens\";r=9000;t="), "{state}");
    let r = send(&router, used("/complete", "erin", Some(12_000))).await;
    assert_eq!(r.header("ratelimit"), Some("\"tokens\";r=0;t=130"));
    let r = send(&router, used("/complete", "erin", None)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // 3,000 of debt: 4,000 more is 70 s away (a few ms of refill aside).
    assert_eq!(r.header("retry-after"), Some("70"));
    let c = layer.metrics().counts("tokens");
    assert_eq!((c.refunded, c.charged, c.degraded), (3000, 8000, 3));
}
