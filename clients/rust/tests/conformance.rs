//! The conformance table (`clients/conformance/cases.json`), replayed through this crate against
//! a real server under the test clock, in the module, Functions and script modes: every call of
//! the client and every request through the HTTP layer must give exactly the answer the table
//! records (decisions, errors, status codes, response fields byte for byte, problem+json
//! bodies, counters, stored bytes). Every client of the module replays the same table
//! (`clients/go` too); the format is described in `clients/conformance/README.md`.
//!
//! `CONFORMANCE_CASE=<text>` replays only the cases whose name contains it.
//! `CONFORMANCE_RECORD=1` writes what this crate answers into the table instead of failing
//! (where a recorded expectation already matches, a range among it, it is kept); the table is
//! then reviewed and committed, and every other client must answer the same.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use common::{Server, free_port};
use http::{HeaderMap, Request};
use ratelimit_client::middleware::{
    ActualCost, HeaderFormat, KeySource, Policy, RateLimitLayer, ShadowDenials,
};
use ratelimit_client::{
    Algorithm, Batching, BreakerConfig, Client, Concurrency, Decision, Degraded, Error,
    FailurePolicy, Lease, Limiter, LocalAnswer, Mode, ModeChoice, Options, Reservation,
};
use redis::aio::ConnectionManager;
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tower::ServiceExt;

type Conn = ConnectionManager;

const MODES: [&str; 3] = ["module", "function", "script"];

/// The response fields the table records, when present.
const FIELDS: [&str; 9] = [
    "ratelimit-policy",
    "ratelimit",
    "ratelimit-partition",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "ratelimit-degraded",
    "retry-after",
    "content-type",
];

fn table_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conformance/cases.json")
}

/// The server of the replay: started with the module under the test clock and the Functions
/// library loaded; started again when a case stopped it.
struct Harness {
    server: Option<Server>,
}

impl Harness {
    fn server(&mut self) -> &Server {
        if self.server.is_none() {
            let s = Server::with_test_clock();
            let name: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(include_str!("../../../lua-reference/ratelimit.lua"))
                .query(&mut s.connect())
                .expect("FUNCTION LOAD");
            assert_eq!(name, "ratelimit");
            self.server = Some(s);
        }
        self.server.as_ref().unwrap()
    }

    /// An empty server at `start_us`: no keys, no counters, no cached scripts, RL.TOP empty with
    /// its default slots.
    fn reset(&mut self, start_us: i64) {
        let mut c = self.server().connect();
        for args in [
            vec!["FLUSHALL"],
            vec!["SCRIPT", "FLUSH"],
            vec!["CONFIG", "SET", "ratelimit.top-slots", "128"],
            vec!["RL.TOP", "RESET"],
            vec!["CONFIG", "RESETSTAT"],
        ] {
            let _: redis::Value = redis::cmd(args[0]).arg(&args[1..]).query(&mut c).unwrap();
        }
        let _: i64 = redis::cmd("RL.TESTCLOCK")
            .arg("SET")
            .arg(start_us)
            .query(&mut c)
            .unwrap();
    }
}

fn num(v: &Value, field: &str) -> f64 {
    v.get(field)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{field} missing in {v}"))
}

fn int(v: &Value, field: &str) -> u64 {
    v.get(field)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{field} missing in {v}"))
}

fn algorithm(v: &Value) -> Algorithm {
    match v["algorithm"].as_str().expect("algorithm") {
        "token_bucket" => Algorithm::TokenBucket {
            capacity: int(v, "capacity"),
            refill_per_sec: num(v, "refill_per_sec"),
        },
        "leaky_bucket" => Algorithm::LeakyBucket {
            capacity: int(v, "capacity"),
            leak_per_sec: num(v, "leak_per_sec"),
        },
        "fixed_window" => Algorithm::FixedWindow {
            limit: int(v, "limit"),
            window_sec: num(v, "window_sec"),
        },
        "sliding_window" => Algorithm::SlidingWindow {
            limit: int(v, "limit"),
            window_sec: num(v, "window_sec"),
        },
        "sliding_log" => Algorithm::SlidingLog {
            limit: int(v, "limit"),
            window_sec: num(v, "window_sec"),
        },
        "gcra" => Algorithm::Gcra {
            max_burst: int(v, "max_burst"),
            count_per_period: int(v, "count_per_period"),
            period_sec: num(v, "period_sec"),
        },
        "concurrency" => Algorithm::Concurrency(Concurrency {
            limit: int(v, "limit"),
            lease_sec: num(v, "lease_sec"),
        }),
        other => panic!("unknown algorithm {other}"),
    }
}

fn options(case: &Value, mode: &str) -> Options {
    let o = &case["options"];
    let policy = match o["policy"].as_str().unwrap_or("fail_open") {
        "fail_open" => FailurePolicy::FailOpen,
        "fail_closed" => FailurePolicy::FailClosed,
        "local" => FailurePolicy::Local {
            instances: int(o, "instances") as u32,
        },
        other => panic!("unknown policy {other}"),
    };
    let defaults = Options::default();
    Options {
        policy,
        mode: match mode {
            "module" => ModeChoice::Module,
            "function" => ModeChoice::Function,
            _ => ModeChoice::Script,
        },
        timeout: o["timeout_ms"]
            .as_u64()
            .map_or(defaults.timeout, Duration::from_millis),
        fail_closed_retry_ms: o["fail_closed_retry_ms"]
            .as_u64()
            .unwrap_or(defaults.fail_closed_retry_ms),
        breaker: BreakerConfig {
            failures: o["breaker_failures"]
                .as_u64()
                .map_or(defaults.breaker.failures, |n| n as u32),
            cooldown: o["breaker_cooldown_ms"]
                .as_u64()
                .map_or(defaults.breaker.cooldown, Duration::from_millis),
        },
    }
}

/// The client of a case: its options, then its batches (`options.batching`) and deny cache
/// (`options.deny_cache`) when the case has them.
fn case_client(case: &Value, mode: &str, url: &str) -> Client<Conn> {
    let mut client = Client::connect(url, options(case, mode)).unwrap();
    let o = &case["options"];
    if let Some(b) = o.get("batching") {
        let mut batching = Batching::new();
        for k in b["hot_keys"].as_array().into_iter().flatten() {
            batching = batching.hot_key(k.as_str().unwrap());
        }
        if let Some(n) = b["detect_per_sec"].as_u64() {
            batching = batching.detect_per_sec(n as u32);
        }
        if let Some(n) = b["lease_ms"].as_u64() {
            batching = batching.lease(Duration::from_millis(n));
        }
        if let Some(n) = b["initial"].as_u64() {
            batching = batching.initial(n);
        }
        if let Some(n) = b["max_batch"].as_u64() {
            batching = batching.max_batch(n);
        }
        if let Some(n) = b["remaining_share"].as_u64() {
            batching = batching.remaining_share(n);
        }
        client = client.with_batching(batching);
    }
    if let Some(n) = o["deny_cache"]["entries"].as_u64() {
        client = client.with_deny_cache(n as usize);
    }
    client
}

/// What this crate implements of the features a case may require (`requires`).
const SUPPORTED: [&str; 3] = ["partial_grants", "batches", "deny_cache"];

fn mode_name(m: Option<Mode>) -> &'static str {
    match m {
        Some(Mode::Module) => "module",
        Some(Mode::Function) => "function",
        Some(Mode::Script) => "script",
        None => "none",
    }
}

fn decision(d: &Decision) -> Value {
    json!([
        u8::from(d.allowed),
        d.remaining,
        d.retry_after_ms,
        d.reset_after_ms,
        d.limit
    ])
}

fn decisions(ds: &[Decision]) -> Value {
    Value::Array(ds.iter().map(decision).collect())
}

/// `answered_locally` when the client answered without calling Redis.
fn local(obs: &mut Value, l: Option<LocalAnswer>) {
    if let Some(l) = l {
        obs["answered_locally"] = json!(l.as_str());
    }
}

fn error(e: &Error) -> Value {
    match e {
        Error::Rejected(m) => json!({"error": "rejected", "message": m}),
        Error::Unsupported(_) => json!({"error": "unsupported"}),
        Error::Unavailable => json!({"error": "unavailable"}),
        Error::Config(e) => panic!("configuration: {e}"),
    }
}

/// Adds `degraded` when the answer did not come from Redis; else checks that the run's mode
/// answered.
fn provenance(
    obs: &mut Value,
    degraded: Option<Degraded>,
    mode: Option<Mode>,
    run: &str,
    problems: &mut Vec<String>,
) {
    match degraded {
        Some(g) => {
            obs["degraded"] = json!(g.as_str());
        }
        None if mode_name(mode) != run => {
            problems.push(format!("answered by {} in {run} mode", mode_name(mode)));
        }
        None => {}
    }
}

/// A JSON reply of the admin connection: integers, strings, arrays, nil, errors.
fn reply_json(v: &redis::Value) -> Value {
    use redis::Value as R;
    match v {
        R::Nil => Value::Null,
        R::Int(i) => json!(i),
        R::BulkString(b) => json!(String::from_utf8_lossy(b)),
        R::SimpleString(s) => json!(s),
        R::Okay => json!("OK"),
        R::Array(items) | R::Set(items) => Value::Array(items.iter().map(reply_json).collect()),
        R::Double(f) => json!(f),
        R::Boolean(b) => json!(b),
        other => json!(format!("{other:?}")),
    }
}

/// A request of the table, sent through the router with its peer address.
struct HttpReply {
    status: u16,
    headers: Map<String, Value>,
    body: Option<String>,
    shadow_denials: Option<Vec<String>>,
}

impl HttpReply {
    fn json(&self) -> Value {
        let mut o = json!({"status": self.status, "headers": self.headers});
        if let Some(b) = &self.body {
            o["body"] = json!(b);
        }
        if let Some(d) = &self.shadow_denials {
            o["shadow_denials"] = json!(d);
        }
        o
    }
}

/// Requests held in their handler: each waits for its gate (`finish`) after adding a permit to
/// `entered`.
#[derive(Default)]
struct Gates {
    by_name: Mutex<HashMap<String, Arc<(Semaphore, Semaphore)>>>,
}

impl Gates {
    fn get(&self, name: &str) -> Arc<(Semaphore, Semaphore)> {
        self.by_name
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new((Semaphore::new(0), Semaphore::new(0))))
            .clone()
    }
}

/// A body that never ends: a line every 20 ms until it is dropped (the client went away).
struct Drip(tokio::time::Interval);

impl http_body::Body for Drip {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.0.poll_tick(cx).map(|_| {
            Some(Ok(http_body::Frame::data(axum::body::Bytes::from_static(
                b"tick\n",
            ))))
        })
    }
}

/// The handler of every route: `ok`, the actual cost from `x-used`, held while `x-hold` names
/// a gate, and `/stream` never ends.
fn router(layer: RateLimitLayer<Conn>, gates: Arc<Gates>) -> Router {
    let handler = move |uri: http::Uri, headers: HeaderMap| {
        let gates = gates.clone();
        async move {
            if let Some(name) = headers.get("x-hold").and_then(|v| v.to_str().ok()) {
                let g = gates.get(name);
                g.0.add_permits(1);
                g.1.acquire().await.unwrap().forget();
            }
            let mut resp = if uri.path() == "/stream" {
                let every = tokio::time::interval(Duration::from_millis(20));
                axum::response::Response::new(Body::new(Drip(every)))
            } else {
                "ok".into_response()
            };
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            if let Some(n) = headers
                .get("x-used")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
            {
                resp.extensions_mut().insert(ActualCost(n));
            }
            resp
        }
    };
    Router::new().fallback(handler).layer(layer)
}

fn layer(case: &Value, client: Client<Conn>) -> RateLimitLayer<Conn> {
    let l = &case["layer"];
    let limits = &case["limits"];
    let mut b = RateLimitLayer::builder(client);
    if let Some(h) = l["key"]["header"].as_str() {
        b = b.key(KeySource::Header(
            http::HeaderName::from_bytes(h.as_bytes()).unwrap(),
        ));
    } else if let Some(proxies) = l["key"]["client_ip"].as_array() {
        b = b.key(KeySource::ClientIp {
            trusted_proxies: proxies
                .iter()
                .map(|p| p.as_str().unwrap().parse().unwrap())
                .collect(),
        });
    }
    if let Some(h) = l["plan"]["header"].as_str() {
        let (h, default) = (
            h.to_string(),
            l["plan"]["default"]
                .as_str()
                .unwrap_or("default")
                .to_string(),
        );
        b = b.plan(move |p| {
            p.headers
                .get(h.as_str())
                .and_then(|v| v.to_str().ok())
                .unwrap_or(&default)
                .to_string()
        });
    }
    match &l["route_class"] {
        Value::String(s) if s == "path" => {
            b = b.route_class(|p| p.uri.path().trim_start_matches('/').to_string());
        }
        Value::Object(o) => {
            let prefixes: Vec<(String, String)> = o["prefixes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p[0].as_str().unwrap().to_string(),
                        p[1].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let default = o["default"].as_str().unwrap_or("default").to_string();
            b = b.route_class(move |p| {
                prefixes
                    .iter()
                    .find(|(prefix, _)| p.uri.path().starts_with(prefix.as_str()))
                    .map_or(default.clone(), |(_, c)| c.clone())
            });
        }
        Value::Null => {}
        other => panic!("route_class {other}"),
    }
    for entry in l["limits"].as_array().unwrap() {
        let policies = entry["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let name = p["name"].as_str().unwrap();
                let a = algorithm(&limits[p["limit"].as_str().unwrap()]);
                let policy = Policy::new(name, a);
                if p["shadow"].as_bool().unwrap_or(false) {
                    policy.shadow()
                } else {
                    policy
                }
            })
            .collect();
        b = b.limits(
            entry["plan"].as_str().unwrap(),
            entry["class"].as_str().unwrap(),
            policies,
        );
    }
    if let Some(e) = l["estimates"].as_object() {
        for (class, units) in e {
            b = b.estimate(class, units.as_u64().unwrap());
        }
    }
    // The deny cache counts down on the process's clock, which the test clock does not move: off
    // unless the case turns it on.
    let format = match l["header_format"].as_str() {
        None | Some("draft-11") => HeaderFormat::Draft11,
        Some("draft-12") => HeaderFormat::Draft12,
        Some(other) => panic!("header_format {other}"),
    };
    b.legacy_headers(l["legacy_headers"].as_bool().unwrap_or(false))
        .header_format(format)
        .deny_cache(l["deny_cache"].as_bool().unwrap_or(false))
        .build()
}

fn http_request(r: &Value) -> Request<Body> {
    let mut b = Request::get(r["path"].as_str().unwrap_or("/"));
    if let Some(h) = r["headers"].as_object() {
        for (name, v) in h {
            b = b.header(name.as_str(), v.as_str().unwrap());
        }
    }
    if let Some(n) = r["used"].as_u64() {
        b = b.header("x-used", n.to_string());
    }
    if let Some(h) = r["hold"].as_str() {
        b = b.header("x-hold", h);
    }
    let mut req = b.body(Body::empty()).unwrap();
    let peer = r["peer"].as_str().unwrap_or("127.0.0.1");
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(peer.parse().unwrap(), 40_000)));
    req
}

/// Sends a request; a streamed response is read up to its first frame, then dropped (the
/// client went away).
async fn send(router: Router, req: Request<Body>, stream: bool) -> HttpReply {
    let resp = router.oneshot(req).await.unwrap();
    let mut headers = Map::new();
    for name in FIELDS {
        if let Some(v) = resp.headers().get(name) {
            headers.insert(name.to_string(), json!(v.to_str().unwrap()));
        }
    }
    let shadow_denials = resp
        .extensions()
        .get::<ShadowDenials>()
        .map(|d| d.0.clone());
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let text = if stream {
        let frame =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)).await;
        assert!(matches!(frame, Some(Ok(_))), "the stream sent nothing");
        drop(body);
        None
    } else {
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        Some(String::from_utf8(bytes.to_vec()).unwrap())
    };
    HttpReply {
        status,
        headers,
        body: text,
        shadow_denials,
    }
}

/// What one mode's run of a case holds between steps.
struct Run<'a> {
    case: &'a Value,
    mode: &'static str,
    client: Client<Conn>,
    admin: redis::Connection,
    leases: HashMap<String, Lease<Conn>>,
    reservations: HashMap<String, Reservation<Conn>>,
    router: Option<(Router, RateLimitLayer<Conn>)>,
    gates: Arc<Gates>,
    held: HashMap<String, tokio::task::JoinHandle<HttpReply>>,
    problems: Vec<String>,
}

impl Run<'_> {
    fn algorithm(&self, name: &Value) -> Algorithm {
        let name = name.as_str().expect("a limit's name");
        algorithm(
            self.case["limits"]
                .get(name)
                .unwrap_or_else(|| panic!("no limit {name}")),
        )
    }

    fn limits(&self, v: &Value) -> Vec<(String, Algorithm)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_str().unwrap().to_string(), self.algorithm(&p[1])))
            .collect()
    }

    fn concurrency(&self, name: &Value) -> Concurrency {
        *self
            .algorithm(name)
            .concurrency()
            .expect("a concurrency limit")
    }

    /// Replays one step; the observation to compare with its `expect`.
    async fn step(&mut self, op: &str, arg: &Value) -> Value {
        let mode = self.mode;
        match op {
            "check" | "peek" => {
                let key = arg["key"].as_str().unwrap();
                let a = self.algorithm(&arg["limit"]);
                let got = if op == "peek" {
                    Limiter::new(self.client.clone(), a).peek(key).await
                } else {
                    let cost = arg["cost"].as_u64().unwrap_or(1);
                    self.client.check(key, &a, cost).await
                };
                match got {
                    Ok(o) => {
                        let mut obs = json!({"decision": decision(&o.decision)});
                        provenance(&mut obs, o.degraded, o.mode, mode, &mut self.problems);
                        local(&mut obs, o.answered_locally);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "check_all" => {
                let limits = self.limits(&arg["limits"]);
                let cost = arg["cost"].as_u64().unwrap_or(1);
                match self.client.check_all(&limits, cost).await {
                    Ok(o) => {
                        let mut obs = json!({"allowed": o.allowed, "denied_by": o.denied_by, "decisions": decisions(&o.decisions)});
                        provenance(&mut obs, o.degraded, o.mode, mode, &mut self.problems);
                        local(&mut obs, o.answered_locally);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "check_upto" => {
                let key = arg["key"].as_str().unwrap();
                let a = self.algorithm(&arg["limit"]);
                match self
                    .client
                    .check_upto(key, &a, arg["upto"].as_u64().unwrap())
                    .await
                {
                    Ok(o) => {
                        let mut obs =
                            json!({"decision": decision(&o.decision), "granted": o.granted});
                        provenance(&mut obs, o.degraded, o.mode, mode, &mut self.problems);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "check_all_upto" => {
                let limits = self.limits(&arg["limits"]);
                match self
                    .client
                    .check_all_upto(&limits, arg["upto"].as_u64().unwrap())
                    .await
                {
                    Ok(o) => {
                        let mut obs = json!({"allowed": o.allowed, "denied_by": o.denied_by, "decisions": decisions(&o.decisions), "granted": o.granted});
                        provenance(&mut obs, o.degraded, o.mode, mode, &mut self.problems);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "flush" => json!({"returned": self.client.flush().await}),
            "close" => json!({"returned": self.client.close().await}),
            "acquire" => {
                let key = arg["key"].as_str().unwrap();
                let c = self.concurrency(&arg["limit"]);
                let got = match arg["id"].as_str() {
                    Some(id) => self.client.acquire_as(key, &c, id).await,
                    None => self.client.acquire(key, &c).await,
                };
                match got {
                    Ok(o) => {
                        let mut obs = json!({"decision": decision(&o.outcome.decision)});
                        provenance(
                            &mut obs,
                            o.outcome.degraded,
                            o.outcome.mode,
                            mode,
                            &mut self.problems,
                        );
                        self.hold_lease(arg, o.outcome.decision.allowed, o.lease, &mut obs);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "acquire_all" => {
                let limits = self.limits(&arg["limits"]);
                let cost = arg["cost"].as_u64().unwrap_or(1);
                match self.client.acquire_all(&limits, cost).await {
                    Ok(o) => {
                        let out = &o.outcome;
                        let mut obs = json!({"allowed": out.allowed, "denied_by": out.denied_by, "decisions": decisions(&out.decisions)});
                        provenance(&mut obs, out.degraded, out.mode, mode, &mut self.problems);
                        let takes = out.allowed && cost > 0;
                        self.hold_lease(arg, takes, o.lease, &mut obs);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "renew" => {
                let name = arg.as_str().unwrap();
                let Some(lease) = self.leases.get(name) else {
                    return json!({"no_lease": true});
                };
                match lease.renew().await {
                    Ok(o) => {
                        if lease.last_renewal() != Some(o) {
                            self.problems.push("last_renewal is not the renewal".into());
                        }
                        let mut obs = json!({"decision": decision(&o.decision)});
                        provenance(&mut obs, o.degraded, o.mode, mode, &mut self.problems);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "release" => {
                let name = arg.as_str().unwrap();
                let Some(lease) = self.leases.remove(name) else {
                    return json!({"no_lease": true});
                };
                match lease.release().await {
                    Ok(b) => json!({"released": b}),
                    Err(e) => error(&e),
                }
            }
            "release_id" => {
                let (key, id) = (arg["key"].as_str().unwrap(), arg["id"].as_str().unwrap());
                match self.client.release(key, id).await {
                    Ok(b) => json!({"released": b}),
                    Err(e) => error(&e),
                }
            }
            "reserve" => {
                let key = arg["key"].as_str().unwrap();
                let a = self.algorithm(&arg["limit"]);
                let estimate = arg["estimate"].as_u64().unwrap();
                match self.client.reserve(key, &a, estimate).await {
                    Ok(o) => {
                        let mut obs = json!({"decision": decision(&o.outcome.decision)});
                        provenance(
                            &mut obs,
                            o.outcome.degraded,
                            o.outcome.mode,
                            mode,
                            &mut self.problems,
                        );
                        self.hold_reservation(arg, o.outcome.decision.allowed, o.reservation);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "reserve_all" => {
                let limits = self.limits(&arg["limits"]);
                let estimate = arg["estimate"].as_u64().unwrap();
                match self.client.reserve_all(&limits, estimate).await {
                    Ok(o) => {
                        let out = &o.outcome;
                        let mut obs = json!({"allowed": out.allowed, "denied_by": out.denied_by, "decisions": decisions(&out.decisions)});
                        provenance(&mut obs, out.degraded, out.mode, mode, &mut self.problems);
                        self.hold_reservation(arg, out.allowed, o.reservation);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "settle" => {
                let name = arg["reservation"].as_str().unwrap();
                let Some(r) = self.reservations.remove(name) else {
                    return json!({"no_reservation": true});
                };
                match r.settle(arg["actual"].as_u64().unwrap()).await {
                    Ok(s) => {
                        let mut obs = json!({"decisions": decisions(&s.decisions)});
                        provenance(&mut obs, s.degraded, s.mode, mode, &mut self.problems);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "settle_delta" => {
                let limits = self.limits(&arg["limits"]);
                match self
                    .client
                    .settle(&limits, arg["delta"].as_i64().unwrap())
                    .await
                {
                    Ok(s) => {
                        let mut obs = json!({"decisions": decisions(&s.decisions)});
                        provenance(&mut obs, s.degraded, s.mode, mode, &mut self.problems);
                        obs
                    }
                    Err(e) => error(&e),
                }
            }
            "top" => match self.client.top(arg.as_u64().unwrap() as usize).await {
                Ok(entries) => json!({"entries": entries
                    .iter()
                    .map(|e| json!([e.key, e.denied, e.error, e.command, e.first_denied_ms, e.last_denied_ms]))
                    .collect::<Vec<_>>()}),
                Err(e) => error(&e),
            },
            "reset_top" => match self.client.reset_top().await {
                Ok(()) => json!({}),
                Err(e) => error(&e),
            },
            "redis" => {
                let args: Vec<String> = arg
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| match a {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                let got: redis::RedisResult<redis::Value> =
                    redis::cmd(&args[0]).arg(&args[1..]).query(&mut self.admin);
                match got {
                    Ok(v) => json!({"reply": reply_json(&v)}),
                    Err(e) => {
                        json!({"error": format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))})
                    }
                }
            }
            "request" => {
                let req = http_request(arg);
                let stream = arg["stream"].as_bool().unwrap_or(false);
                let router = self.router.as_ref().expect("a case with a layer").0.clone();
                if let Some(hold) = arg["hold"].as_str() {
                    let gate = self.gates.get(hold);
                    let task = tokio::spawn(send(router, req, false));
                    // In the handler, or answered without reaching it.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while gate.0.available_permits() == 0 && !task.is_finished() {
                        assert!(
                            Instant::now() < deadline,
                            "{hold} never reached its handler"
                        );
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    self.held.insert(hold.to_string(), task);
                    return Value::Null;
                }
                send(router, req, stream).await.json()
            }
            "finish" => {
                let name = arg.as_str().unwrap();
                self.gates.get(name).1.add_permits(1);
                let task = self.held.remove(name).expect("a held request");
                task.await.unwrap().json()
            }
            "wait_leases" => {
                let key = arg["key"].as_str().unwrap();
                let want = arg["count"].as_u64().unwrap();
                let deadline = Instant::now() + Duration::from_secs(5);
                loop {
                    let n: u64 = redis::cmd("ZCARD").arg(key).query(&mut self.admin).unwrap();
                    if n == want {
                        return Value::Null;
                    }
                    if Instant::now() > deadline {
                        return json!({"leases": n});
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            "metrics" => {
                let layer = &self.router.as_ref().expect("a case with a layer").1;
                json!(layer.metrics().render_prometheus())
            }
            "keys" => {
                let mut keys: Vec<String> =
                    redis::cmd("KEYS").arg("*").query(&mut self.admin).unwrap();
                keys.sort();
                json!(keys)
            }
            "calls" => {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut self.admin)
                    .unwrap();
                let mut counts = Map::new();
                for c in arg[mode].as_array().into_iter().flatten() {
                    let c = c.as_str().unwrap();
                    let prefix = format!("cmdstat_{c}:calls=");
                    let n: u64 = info
                        .lines()
                        .find_map(|l| l.strip_prefix(prefix.as_str()))
                        .and_then(|rest| rest.split(',').next())
                        .map_or(0, |n| n.parse().unwrap());
                    counts.insert(c.to_string(), json!(n));
                }
                Value::Object(counts)
            }
            other => panic!("unknown step {other}"),
        }
    }

    fn hold_lease(
        &mut self,
        arg: &Value,
        admitted: bool,
        lease: Option<Lease<Conn>>,
        obs: &mut Value,
    ) {
        if lease.is_some() != admitted {
            self.problems.push(format!(
                "a lease {} an admission",
                if admitted { "missing with" } else { "without" }
            ));
        }
        if let Some(l) = lease {
            if !l.holds_slot() {
                obs["holds_slot"] = json!(false);
            }
            let name = arg["lease"]
                .as_str()
                .or(arg["id"].as_str())
                .expect("a name for the lease")
                .to_string();
            if let Some(id) = arg["id"].as_str()
                && (l.id() != id || l.key() != arg["key"].as_str().unwrap_or(l.key()))
            {
                self.problems
                    .push(format!("lease {} on {}", l.id(), l.key()));
            }
            self.leases.insert(name, l);
        }
    }

    fn hold_reservation(&mut self, arg: &Value, admitted: bool, r: Option<Reservation<Conn>>) {
        if r.is_some() != admitted {
            self.problems
                .push("a reservation without an admission, or none with one".into());
        }
        if let Some(r) = r {
            let name = arg["reservation"]
                .as_str()
                .expect("a name for the reservation");
            self.reservations.insert(name.to_string(), r);
        }
    }
}

/// `expect` matches `got`: equal, where a `[min, max]` stands for a number in that range.
fn matches(expect: &Value, got: &Value) -> bool {
    match (expect, got) {
        (Value::Array(r), Value::Number(n)) if r.len() == 2 && r.iter().all(Value::is_number) => {
            let (n, lo, hi) = (
                n.as_f64().unwrap(),
                r[0].as_f64().unwrap(),
                r[1].as_f64().unwrap(),
            );
            lo <= n && n <= hi
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| matches(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, x)| b.get(k).is_some_and(|y| matches(x, y)))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => expect == got,
    }
}

/// A step's expectation in `mode`: its own when the table gives one per mode.
fn expectation<'a>(step: &'a Value, mode: &str) -> &'a Value {
    let e = &step["expect"];
    match e.as_object() {
        Some(o) if MODES.iter().any(|m| o.contains_key(*m)) => &e[mode],
        _ => e,
    }
}

const OPS: [&str; 28] = [
    "check",
    "peek",
    "check_all",
    "check_upto",
    "check_all_upto",
    "flush",
    "close",
    "acquire",
    "acquire_all",
    "renew",
    "release",
    "release_id",
    "reserve",
    "reserve_all",
    "settle",
    "settle_delta",
    "top",
    "reset_top",
    "redis",
    "request",
    "finish",
    "wait_leases",
    "metrics",
    "keys",
    "calls",
    "stop_redis",
    "advance_only",
    "note",
];

fn step_op(step: &Value) -> &'static str {
    OPS.iter()
        .find(|op| step.get(**op).is_some())
        .copied()
        .unwrap_or_else(|| panic!("a step without an operation: {step}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_of_the_conformance_table() {
    let path = table_path();
    let mut table: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the table")).expect("JSON");
    let record = std::env::var_os("CONFORMANCE_RECORD").is_some_and(|v| v == "1");
    let only = std::env::var("CONFORMANCE_CASE").ok();
    let start_us = table["clock_start_us"].as_i64().unwrap();
    let mut harness = Harness { server: None };
    let mut failures: Vec<String> = Vec::new();
    let mut replayed = 0;
    let cases = table["cases"].as_array().unwrap().clone();
    for (ci, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let missing: Vec<&str> = case["requires"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|r| !SUPPORTED.contains(r))
            .collect();
        assert!(missing.is_empty(), "{name} requires {missing:?}");
        replayed += 1;
        let modes: Vec<&'static str> = match case["modes"].as_array() {
            Some(m) => MODES
                .into_iter()
                .filter(|x| m.iter().any(|y| y == x))
                .collect(),
            None => MODES.to_vec(),
        };
        // observations[step][mode]
        let steps = case["steps"].as_array().unwrap();
        let mut observed: Vec<BTreeMap<&str, Value>> = vec![BTreeMap::new(); steps.len()];
        for mode in modes.iter().copied() {
            eprintln!("{name} [{mode}]");
            harness.reset(start_us);
            let server_url = harness.server().url();
            let url = if case["redis"] == "unreachable" {
                format!("redis://127.0.0.1:{}", free_port())
            } else {
                server_url
            };
            let client = case_client(case, mode, &url);
            let gates = Arc::new(Gates::default());
            let router = case.get("layer").map(|_| {
                let l = layer(case, client.clone());
                (router(l.clone(), gates.clone()), l)
            });
            let mut run = Run {
                case,
                mode,
                client,
                admin: harness.server().connect(),
                leases: HashMap::new(),
                reservations: HashMap::new(),
                router,
                gates,
                held: HashMap::new(),
                problems: Vec::new(),
            };
            for (si, step) in steps.iter().enumerate() {
                if let Some(us) = step["advance_us"].as_i64()
                    && us != 0
                {
                    let _: i64 = redis::cmd("RL.TESTCLOCK")
                        .arg("ADVANCE")
                        .arg(us)
                        .query(&mut run.admin)
                        .unwrap();
                }
                let op = step_op(step);
                let obs = match op {
                    "stop_redis" => {
                        if let Some(mut s) = harness.server.take() {
                            s.kill();
                        }
                        Value::Null
                    }
                    "advance_only" | "note" => Value::Null,
                    _ => run.step(op, &step[op]).await,
                };
                for p in run.problems.drain(..) {
                    failures.push(format!("{name} [{mode}] step {si} ({op}): {p}"));
                }
                let expect = expectation(step, mode);
                let fine = if expect.is_null() {
                    obs.is_null()
                } else {
                    matches(expect, &obs)
                };
                if !fine && !record {
                    failures.push(format!(
                        "{name} [{mode}] step {si} ({op}): expected {expect}, got {obs}"
                    ));
                }
                observed[si].insert(mode, obs);
            }
            // Requests still held are let go before the next run.
            let held: Vec<String> = run.held.keys().cloned().collect();
            for h in held {
                run.gates.get(&h).1.add_permits(1);
                let _ = run.held.remove(&h).unwrap().await;
            }
        }
        if record {
            let steps = table["cases"][ci]["steps"].as_array_mut().unwrap();
            for (si, by_mode) in observed.into_iter().enumerate() {
                let step = &mut steps[si];
                let kept = by_mode.iter().all(|(m, obs)| {
                    let e = expectation(step, m);
                    if e.is_null() {
                        obs.is_null()
                    } else {
                        matches(e, obs)
                    }
                });
                if kept {
                    continue;
                }
                let first = by_mode.values().next().cloned().unwrap_or(Value::Null);
                let expect = if by_mode.values().all(|o| *o == first) {
                    first
                } else {
                    Value::Object(
                        by_mode
                            .into_iter()
                            .map(|(m, o)| (m.to_string(), o))
                            .collect(),
                    )
                };
                let o = step.as_object_mut().unwrap();
                if expect.is_null() {
                    o.remove("expect");
                } else {
                    o.insert("expect".into(), expect);
                }
            }
        }
    }
    if record {
        std::fs::write(&path, emit(&table)).unwrap();
        eprintln!("recorded {}", path.display());
    }
    assert!(replayed > 0, "no case matched");
    assert!(
        failures.is_empty(),
        "{} mismatch(es):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Keys in this order first, the others after them in byte order.
const KEY_ORDER: [&str; 79] = [
    "format",
    "clock_start_us",
    "name",
    "about",
    "requires",
    "modes",
    "redis",
    "options",
    "policy",
    "instances",
    "key",
    "plan",
    "route_class",
    "algorithm",
    "max_burst",
    "limit",
    "limits",
    "layer",
    "estimates",
    "legacy_headers",
    "header_format",
    "steps",
    "advance_us",
    "check",
    "peek",
    "check_all",
    "check_upto",
    "check_all_upto",
    "acquire",
    "acquire_all",
    "renew",
    "release",
    "release_id",
    "reserve",
    "reserve_all",
    "settle",
    "settle_delta",
    "flush",
    "close",
    "top",
    "reset_top",
    "request",
    "finish",
    "wait_leases",
    "metrics",
    "keys",
    "calls",
    "stop_redis",
    "advance_only",
    "path",
    "peer",
    "headers",
    "id",
    "lease",
    "cost",
    "upto",
    "estimate",
    "reservation",
    "actual",
    "delta",
    "used",
    "hold",
    "stream",
    "class",
    "policies",
    "expect",
    "note",
    "status",
    "body",
    "shadow_denials",
    "allowed",
    "denied_by",
    "decision",
    "decisions",
    "granted",
    "degraded",
    "answered_locally",
    "returned",
    "holds_slot",
];

fn ordered(o: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut v: Vec<(&String, &Value)> = o.iter().collect();
    v.sort_by_key(|(k, _)| {
        (
            KEY_ORDER
                .iter()
                .position(|x| x == k)
                .unwrap_or(KEY_ORDER.len()),
            k.to_string(),
        )
    });
    v
}

/// One line, keys in the table's order.
fn compact(v: &Value) -> String {
    match v {
        Value::Object(o) => {
            let parts: Vec<String> = ordered(o)
                .into_iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), compact(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(compact).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// The table as it is kept: a case's fields one per line, its limits, layer fields and steps
/// one per line, everything below on that line.
fn emit(table: &Value) -> String {
    let mut out = String::from("{\n");
    let top = ordered(table.as_object().unwrap());
    for (i, (k, v)) in top.iter().enumerate() {
        let sep = if i + 1 < top.len() { "," } else { "" };
        if *k == "cases" {
            out.push_str("  \"cases\": [\n");
            let cases = v.as_array().unwrap();
            for (ci, case) in cases.iter().enumerate() {
                out.push_str("    {\n");
                let fields = ordered(case.as_object().unwrap());
                for (fi, (fk, fv)) in fields.iter().enumerate() {
                    let fsep = if fi + 1 < fields.len() { "," } else { "" };
                    let key = Value::String(fk.to_string());
                    match (fk.as_str(), fv) {
                        ("limits" | "layer", Value::Object(o)) => {
                            out.push_str(&format!("      {key}: {{\n"));
                            let items = ordered(o);
                            for (li, (lk, lv)) in items.iter().enumerate() {
                                let lsep = if li + 1 < items.len() { "," } else { "" };
                                out.push_str(&format!(
                                    "        {}: {}{lsep}\n",
                                    Value::String(lk.to_string()),
                                    compact(lv)
                                ));
                            }
                            out.push_str(&format!("      }}{fsep}\n"));
                        }
                        ("steps", Value::Array(a)) => {
                            out.push_str(&format!("      {key}: [\n"));
                            for (si, s) in a.iter().enumerate() {
                                let ssep = if si + 1 < a.len() { "," } else { "" };
                                out.push_str(&format!("        {}{ssep}\n", compact(s)));
                            }
                            out.push_str(&format!("      ]{fsep}\n"));
                        }
                        _ => out.push_str(&format!("      {key}: {}{fsep}\n", compact(fv))),
                    }
                }
                let csep = if ci + 1 < cases.len() { "," } else { "" };
                out.push_str(&format!("    }}{csep}\n"));
            }
            out.push_str(&format!("  ]{sep}\n"));
        } else {
            out.push_str(&format!(
                "  {}: {}{sep}\n",
                Value::String(k.to_string()),
                compact(v)
            ));
        }
    }
    out.push_str("}\n");
    out
}
