//! The Rust snippets of `docs/client.md`, compiled: each ```rust block of the page must appear
//! here word for word (indented by four spaces), inside a function that the compiler checks and a
//! test runs against a real server.

mod common;

use common::Server;
use ratelimit_client::Batching;
use ratelimit_client::Client;
use ratelimit_client::Concurrency;
use ratelimit_client::middleware::ActualCost;
use ratelimit_client::middleware::HeaderFormat;
use ratelimit_client::middleware::{KeySource, Policy, RateLimitLayer};
use ratelimit_client::{Algorithm, FailurePolicy, Limiter, Options};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

// Kept as the page writes them, so not formatted.
#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_client(url: &str) -> Result {
    // --- docs/client.md, block 1 (its URL replaced by the test server's) ---
    let limiter = Limiter::open(
        url,
        Algorithm::TokenBucket { capacity: 10, refill_per_sec: 5.0 },
        Options { policy: FailurePolicy::Local { instances: 4 }, ..Options::default() },
    ).await?;
    let out = limiter.check("user:42").await?;   // cost 1; check_cost(key, n); peek(key) = cost 0
    if !out.decision.allowed { /* wait out.decision.retry_after_ms */ }
    if let Some(d) = out.degraded { /* Redis did not answer: FailOpen, FailClosed or Local */ }
    // ---
    assert!(out.decision.allowed && out.degraded.is_none());
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_leases(url: &str) -> Result {
    // --- docs/client.md, block 2 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    let exports = Concurrency { limit: 3, lease_sec: 30.0 };
    let out = client.acquire("exports:acme", &exports).await?;
    let Some(mut lease) = out.lease else {
        return Ok(()); // full: a slot frees in out.outcome.decision.retry_after_ms
    };
    lease.keep_alive(std::time::Duration::from_secs(10)); // renews while the work runs
    /* the work */
    lease.release().await?; // or drop it
    // ---
    assert_eq!(out.outcome.decision.remaining, 2);
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_reservations(url: &str) -> Result {
    // --- docs/client.md, block 3 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    let tokens = Algorithm::TokenBucket { capacity: 10_000, refill_per_sec: 100.0 };
    let out = client.reserve("tokens:acme", &tokens, 4000).await?; // checks and takes 4,000
    let Some(reservation) = out.reservation else {
        return Ok(()); // denied: retry in out.outcome.decision.retry_after_ms
    };
    let used = 1200; /* the work, which turned out to cost 1,200 */
    let settled = reservation.settle(used).await?; // RL.SETTLE ... DELTA -2800: 2,800 back
    let left = settled.decisions[0].remaining; // 8,800 (plus what refilled meanwhile)
    // ---
    assert_eq!(out.outcome.decision.remaining, 6000);
    assert!((8800..8900).contains(&left), "{left}");
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_middleware_settling(url: &str) -> Result {
    // --- docs/client.md, block 7 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    let layer = RateLimitLayer::builder(client)
        .route_class(|req| if req.uri.path() == "/complete" { "llm".into() } else { "api".into() })
        .limits("*", "llm", vec![Policy::new("tokens", Algorithm::TokenBucket { capacity: 10_000, refill_per_sec: 100.0 })])
        .estimate("llm", 4000) // reserved before the handler runs
        .build();
    let app: axum::Router = axum::Router::new()
        .route("/complete", axum::routing::post(|| async {
            let used = 1200; /* the model's answer and the tokens it used */
            (axum::Extension(ActualCost(used)), "the answer") // 2,800 refunded before it leaves
        }))
        .layer(layer);
    // ---
    use tower::ServiceExt;
    let mut req = http::Request::post("/complete").body(axum::body::Body::empty())?;
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 9))));
    let resp = app.oneshot(req).await?;
    assert_eq!(resp.status(), http::StatusCode::OK);
    let state = resp.headers()["ratelimit"].to_str()?;
    assert!(state.starts_with("\"tokens\";r=88"), "{state}");
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_middleware(url: &str) -> Result {
    // --- docs/client.md, block 6 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static("x-api-key")))
        .plan(|req| req.headers.get("x-plan").and_then(|v| v.to_str().ok()).unwrap_or("free").into())
        .route_class(|req| if req.uri.path().starts_with("/login") { "login".into() } else { "api".into() })
        .limits("free", "*", vec![Policy::new("per-minute", Algorithm::FixedWindow { limit: 60, window_sec: 60.0 })])
        .limits("pro", "*", vec![
            Policy::new("burst", Algorithm::TokenBucket { capacity: 20, refill_per_sec: 5.0 }),
            Policy::new("hourly", Algorithm::SlidingWindow { limit: 10_000, window_sec: 3600.0 }),
        ])
        .limits("*", "login", vec![Policy::new("login", Algorithm::Gcra { max_burst: 2, count_per_period: 1, period_sec: 10.0 })])
        .legacy_headers(true)
        .build();
    let metrics = layer.metrics();              // metrics.render_prometheus() for /metrics
    let app: axum::Router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(layer);
    // ---
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_top(url: &str) -> Result {
    // Two denials of one key, for the list to show.
    let mut c = redis::Client::open(url)?.get_connection()?;
    for _ in 0..3 {
        redis::cmd("RL.FIXEDWINDOW").arg(&["login:bob", "1", "60", "1"][..]).query::<redis::Value>(&mut c)?;
    }
    // --- docs/client.md, block 5 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    for e in client.top(10).await? {
        println!("{}: {} denials (at most {} too many), latest by {} at {} ms", e.key, e.denied, e.error, e.command, e.last_denied_ms);
    }
    // ---
    let top = client.top(10).await?;
    assert!(top.iter().any(|e| e.key == "login:bob" && e.denied == 2 && e.command == "RL.FIXEDWINDOW"), "{top:?}");
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_shadow_policies(url: &str) -> Result {
    // --- docs/client.md, block 8 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    let layer = RateLimitLayer::builder(client)
        .limits("*", "*", vec![
            Policy::new("per-minute", Algorithm::FixedWindow { limit: 60, window_sec: 60.0 }),
            // Being rolled out: evaluated, reported and counted, never refusing.
            Policy::new("burst", Algorithm::TokenBucket { capacity: 5, refill_per_sec: 1.0 }).shadow(),
        ])
        .build();
    let metrics = layer.metrics(); // ratelimit_decisions_total{limit="burst",outcome="shadow_denied"}
    let app: axum::Router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(layer);
    // ---
    use tower::ServiceExt;
    for _ in 0..7 {
        let mut req = http::Request::get("/").body(axum::body::Body::empty())?;
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 2], 9))));
        let resp = app.clone().oneshot(req).await?;
        assert_eq!(resp.status(), http::StatusCode::OK);
    }
    let (burst, minute) = (metrics.counts("burst"), metrics.counts("per-minute"));
    // Seven within a second or so: 5 admitted, 2 refused, or one more admitted after a refill.
    assert!(burst.shadow_denied >= 1 && burst.allowed + burst.shadow_denied == 7, "{burst:?}");
    assert_eq!((minute.allowed, minute.denied, burst.denied), (7, 0, 0));
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_hot_keys(url: &str) -> Result {
    // --- docs/client.md, block 4 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?
        .with_batching(Batching::new().hot_key("tenant:big")) // others once called 100 times a second
        .with_deny_cache(10_000); // entries, the least recently used evicted
    let limit = Algorithm::FixedWindow { limit: 100_000, window_sec: 60.0 };
    let out = client.check("tenant:big", &limit, 1).await?; // one UPTO 8: this and 7 more admitted here
    let again = client.check("tenant:big", &limit, 1).await?; // again.answered_locally: Some(Batch)
    let grant = client.check_upto("exports:acme", &limit, 500).await?; // grant.granted: 1 to 500
    let given_back = client.close().await; // on shutdown: the batches' unused units back to Redis
    // ---
    assert_eq!((out.decision.remaining, out.answered_locally), (99_999, None));
    assert_eq!(again.answered_locally, Some(ratelimit_client::LocalAnswer::Batch));
    assert_eq!((grant.granted, given_back), (500, 6));
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
async fn the_header_format(url: &str) -> Result {
    // --- docs/client.md, block 9 (its URL replaced by the test server's) ---
    let client = Client::open(url, Options::default()).await?;
    let layer = RateLimitLayer::builder(client)
        .limits("*", "*", vec![Policy::new("per-minute", Algorithm::FixedWindow { limit: 2, window_sec: 60.0 })])
        .header_format(HeaderFormat::Draft12) // HeaderFormat::Draft11 by default
        .build();
    let app: axum::Router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(layer);
    // ---
    use tower::ServiceExt;
    let field = |r: &http::Response<axum::body::Body>, name: &str| {
        r.headers().get(name).map(|v| v.to_str().unwrap().to_string())
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut req = http::Request::get("/").body(axum::body::Body::empty())?;
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 3], 9))));
        let resp = app.clone().oneshot(req).await?;
        assert_eq!(field(&resp, "ratelimit-policy").as_deref(), Some("\"per-minute\";q=2;w=60"));
        assert_eq!(field(&resp, "ratelimit-partition").as_deref(), Some("\"per-minute\";client_id"));
        seen.push((resp.status().as_u16(), field(&resp, "ratelimit").unwrap(), field(&resp, "retry-after")));
    }
    // The page's bytes; the window's rest is 60 s rounded up unless a second passed meanwhile.
    let w = |i: usize| if seen[i].1.contains(";w=59;") { 59 } else { 60 };
    let (w1, w2) = (w(1), w(2));
    assert_eq!(seen, [
        (200, "\"per-minute\";a=1;w=60;c=1".to_string(), None),
        (200, format!("\"per-minute\";a=0;w={w1};c=1"), None),
        (429, format!("\"per-minute\";a=0;w={w2};c=0"), Some(w2.to_string())),
    ]);
    Ok(())
}

#[tokio::test]
async fn the_snippets_of_the_client_page_are_these_and_they_run() {
    let this = include_str!("doc_snippets.rs");
    let page = include_str!("../../../docs/client.md");
    let blocks: Vec<&str> = page
        .split("```rust\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 9, "the page's Rust blocks");
    for block in blocks {
        // `use` lines are this file's imports; the rest is the body of a function.
        let (uses, body): (Vec<&str>, Vec<&str>) =
            block.lines().partition(|l| l.starts_with("use "));
        for u in uses {
            assert!(this.lines().any(|l| l == u), "not imported here: {u}");
        }
        let body = body.join("\n");
        let indented: String = body
            .trim_start_matches('\n')
            .replace("\"redis://127.0.0.1:6379\"", "url")
            .replace("    \"redis://127.0.0.1:6379\",\n", "    url,\n")
            .lines()
            .map(|l| {
                if l.is_empty() {
                    String::new()
                } else {
                    format!("    {l}")
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert!(this.contains(&indented), "not compiled here:\n{indented}");
    }
    let server = Server::with_module();
    the_client(&server.url()).await.unwrap();
    the_leases(&server.url()).await.unwrap();
    the_reservations(&server.url()).await.unwrap();
    the_hot_keys(&server.url()).await.unwrap();
    the_middleware_settling(&server.url()).await.unwrap();
    the_middleware(&server.url()).await.unwrap();
    the_top(&server.url()).await.unwrap();
    the_shadow_policies(&server.url()).await.unwrap();
    the_header_format(&server.url()).await.unwrap();
}
