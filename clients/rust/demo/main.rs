//! Demo web server: a page to fire single requests or bursts at a rate-limited endpoint, switch
//! the algorithm and its parameters, watch the headers and a chart of the remaining count over
//! time, peek at a key's state, and list the most-denied keys (`RL.TOP`).
//!
//! `REDIS_URL` (default `redis://127.0.0.1:6379`), `LISTEN` (default `127.0.0.1:8080`),
//! `ADMIN_REDIS_URL` (default `REDIS_URL`): the connection of the admin view's list of the
//! most-denied keys, whose command an application's user may not run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ratelimit_client::metrics::Metrics;
use ratelimit_client::middleware::{KeySource, Policy, RateLimitLayer};
use ratelimit_client::{Algorithm, Client, Options};
use redis::aio::ConnectionManager;
use serde_json::{Value, json};

#[derive(Clone)]
struct App {
    policy: Arc<RwLock<Policy>>,
    client: Client<ConnectionManager>,
    /// An operator's connection, for `RL.TOP`.
    admin: Client<ConnectionManager>,
    metrics: Arc<Metrics>,
}

fn policy_of(algorithm: Algorithm) -> Policy {
    Policy::new(algorithm.keyword().to_lowercase(), algorithm)
}

fn user(headers: &HeaderMap) -> String {
    headers
        .get("x-demo-user")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .unwrap_or("demo")
        .to_string()
}

fn algorithm_from(v: &Value) -> Result<Algorithm, String> {
    let name = v["algorithm"].as_str().unwrap_or("");
    let num = |k: &str| -> Result<f64, String> {
        v[k].as_f64()
            .or_else(|| v[k].as_str().and_then(|s| s.trim().parse().ok()))
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("parameter {k} must be a number"))
    };
    let int = |k: &str| num(k).map(|x| x as u64);
    Ok(match name {
        "TOKENBUCKET" => Algorithm::TokenBucket {
            capacity: int("p1")?,
            refill_per_sec: num("p2")?,
        },
        "LEAKYBUCKET" => Algorithm::LeakyBucket {
            capacity: int("p1")?,
            leak_per_sec: num("p2")?,
        },
        "FIXEDWINDOW" => Algorithm::FixedWindow {
            limit: int("p1")?,
            window_sec: num("p2")?,
        },
        "SLIDINGWINDOW" => Algorithm::SlidingWindow {
            limit: int("p1")?,
            window_sec: num("p2")?,
        },
        "SLIDINGLOG" => Algorithm::SlidingLog {
            limit: int("p1")?,
            window_sec: num("p2")?,
        },
        "GCRA" => Algorithm::Gcra {
            max_burst: int("p1")?,
            count_per_period: int("p2")?,
            period_sec: num("p3")?,
        },
        other => return Err(format!("unknown algorithm {other:?}")),
    })
}

fn config_json(p: &Policy) -> Value {
    let params = p.algorithm.params();
    json!({
        "algorithm": p.algorithm.keyword(),
        "name": p.name,
        "p1": params.first(),
        "p2": params.get(1),
        "p3": params.get(2),
    })
}

async fn get_config(State(app): State<App>) -> Json<Value> {
    let p = app.policy.read().unwrap_or_else(|e| e.into_inner()).clone();
    Json(config_json(&p))
}

async fn set_config(State(app): State<App>, Json(body): Json<Value>) -> Response {
    let algorithm = match algorithm_from(&body) {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({"error": e}))).into_response(),
    };
    // Validate with Redis before switching: a peek on a scratch key.
    if let Err(e) = app.client.check("rl:demo:validate", &algorithm, 0).await {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": e.to_string()})),
        )
            .into_response();
    }
    let p = policy_of(algorithm);
    *app.policy.write().unwrap_or_else(|e| e.into_inner()) = p.clone();
    Json(config_json(&p)).into_response()
}

async fn peek(State(app): State<App>, Query(q): Query<HashMap<String, String>>) -> Response {
    let who = q.get("user").cloned().unwrap_or_else(|| "demo".into());
    let p = app.policy.read().unwrap_or_else(|e| e.into_inner()).clone();
    let key = format!("rl:{{{who}}}:demo:{}", p.name);
    match app.client.check(&key, &p.algorithm, 0).await {
        Ok(o) => Json(json!({
            "key": key,
            "algorithm": p.algorithm.keyword(),
            "remaining": o.decision.remaining,
            "limit": o.decision.limit,
            "reset_after_ms": o.decision.reset_after_ms,
            "mode": o.mode.map(|m| format!("{m:?}")),
            "degraded": o.degraded.map(|d| d.as_str()),
        }))
        .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

/// The most-denied keys, most first: `{"entries": [{key, denied, error, command,
/// first_denied_ms, last_denied_ms}, ...]}`, or `{"error": ...}` (no module, no permission).
async fn top(State(app): State<App>, Query(q): Query<HashMap<String, String>>) -> Response {
    let count = q
        .get("count")
        .and_then(|c| c.parse().ok())
        .unwrap_or(10usize)
        .clamp(1, 100);
    match app.admin.top(count).await {
        Ok(entries) => Json(json!({
            "entries": entries
                .iter()
                .map(|e| json!({
                    "key": e.key,
                    "denied": e.denied,
                    "error": e.error,
                    "command": e.command,
                    "first_denied_ms": e.first_denied_ms,
                    "last_denied_ms": e.last_denied_ms,
                }))
                .collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn prometheus(State(app): State<App>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render_prometheus(),
    )
        .into_response()
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let client = Client::open(&url, Options::default())
        .await
        .expect("REDIS_URL");
    let mode = client.mode();
    let admin_url = std::env::var("ADMIN_REDIS_URL").unwrap_or_else(|_| url.clone());
    let admin = Client::connect(&admin_url, Options::default()).expect("ADMIN_REDIS_URL");
    let metrics = Arc::new(Metrics::default());
    let app = App {
        policy: Arc::new(RwLock::new(policy_of(Algorithm::TokenBucket {
            capacity: 5,
            refill_per_sec: 1.0,
        }))),
        client: client.clone(),
        admin,
        metrics: metrics.clone(),
    };
    let current = app.policy.clone();
    let layer = RateLimitLayer::builder(client)
        .key(KeySource::Custom(Arc::new(|p| Some(user(&p.headers)))))
        .route_class(|_| "demo".into())
        .limits_fn(move |_, _| vec![current.read().unwrap_or_else(|e| e.into_inner()).clone()])
        .legacy_headers(true)
        // The page shows the server's every decision (and RL.TOP counts every denial).
        .deny_cache(false)
        .metrics(metrics)
        .build();
    let router = Router::new()
        .route(
            "/api/resource",
            get(|| async { Json(json!({"ok": true})) }).layer(layer),
        )
        .route("/", get(|| async { Html(include_str!("index.html")) }))
        .route("/api/config", get(get_config).post(set_config))
        .route("/admin/peek", get(peek))
        .route("/admin/top", get(top))
        .route("/metrics", get(prometheus))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .expect("LISTEN address");
    println!(
        "demo on http://{} (redis {url}, mode {mode:?})",
        listener.local_addr().expect("local address")
    );
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("server");
}
