//! A tower [`Layer`] for axum: limits per route class and plan, the IETF `RateLimit-Policy` and
//! `RateLimit` response fields (draft-ietf-httpapi-ratelimit-headers-11 by default, the next
//! revision's fields with [`HeaderFormat::Draft12`]), optionally the older `RateLimit-Limit` /
//! `-Remaining` / `-Reset`, 429 with `Retry-After` and a problem+json body, `RateLimit-Degraded`
//! when Redis could not decide, and counters per limit.
//!
//! A concurrency limit ([`Algorithm::Concurrency`]) counts requests in flight: its slot is taken
//! before the handler runs and given back when the response body has been sent or dropped (the
//! client went away); the lease's expiry frees it if the process dies first.
//!
//! A route whose true cost is known only once it has been served (tokens of a language model,
//! rows exported) reserves an estimate ([`Builder::estimate`]) before the handler runs; the
//! handler reports what it really cost by putting [`ActualCost`] into the response's extensions,
//! and the difference is refunded or charged (`RL.SETTLE`) before the response leaves, its
//! `RateLimit` field showing the state after settlement.
//!
//! A shadow policy ([`Policy::shadow`]) is a limit being rolled out: evaluated in a call of its
//! own once the enforced limits have admitted a request, shown in the response fields and
//! counted (`outcome="shadow_denied"`), but never refusing; the enforced limits decide and
//! consume as if it were not there.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use redis::aio::ConnectionLike;
use tower::{Layer, Service};

use crate::algorithm::Algorithm;
use crate::batch::Batching;
use crate::client::Client;
use crate::lease::Lease;
use crate::metrics::Metrics;
use crate::reservation::Reservation;
use crate::types::{Decision, Degraded, MultiOutcome};

/// What a request really cost, in the units of its route's limits: a handler inserts it into
/// its response's extensions (`(Extension(ActualCost(n)), body)` in axum) and the layer settles
/// the route's estimate with it. Without it the estimate stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActualCost(pub u64);

/// A named limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub name: String,
    pub algorithm: Algorithm,
    /// Evaluated and reported, never denying (see [`Policy::shadow`]).
    pub shadow: bool,
}

impl Policy {
    pub fn new(name: impl Into<String>, algorithm: Algorithm) -> Self {
        Policy {
            name: name.into(),
            algorithm,
            shadow: false,
        }
    }

    /// This policy in shadow mode, for rolling a new limit out: it is evaluated on the requests
    /// that the route's other (enforced) limits admit, each shadow policy in a call of its own
    /// after theirs, consuming as it would if it were enforced; its state is in the response's
    /// `RateLimit` fields and its answers in the counters (`outcome="shadow_denied"` for the
    /// requests it would have refused), but it never refuses a request, and the enforced limits
    /// decide and consume exactly as if it were not there. A request refused by an enforced
    /// limit is not counted against it (it is only peeked at, for the response fields).
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }
}

/// The shadow policies that would have refused the request, in the order of the route's
/// policies: put into the response's extensions by the layer when there is at least one, for
/// an outer layer to log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShadowDenials(pub Vec<String>);

/// The format of the IETF RateLimit response fields ([`Builder::header_format`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeaderFormat {
    /// draft-ietf-httpapi-ratelimit-headers-11 (the default until the RFC):
    /// `RateLimit-Policy: "per-minute";q=2;w=60` and `RateLimit: "per-minute";r=1;t=60`.
    #[default]
    Draft11,
    /// The fields of the draft's next revision as its editors' text describes them (pull request
    /// 166 of the working group's repository): `RateLimit-Policy` as in draft-11; `RateLimit`
    /// with `a` (available, draft-11's `r`), `w` (effective window, draft-11's `t`) and `c` (the
    /// units this request took from the policy: the route's estimate, 1 for a concurrency limit,
    /// 0 on a 429 or for a shadow policy that would have refused it), as in
    /// `"per-minute";a=1;w=60;c=1`; and `RateLimit-Partition`, one `"<name>";client_id` per
    /// policy (each quota is the caller's own; the caller's key itself is not sent). Receivers
    /// ignore parameters they do not know.
    Draft12,
}

impl HeaderFormat {
    /// `"draft-11"` or `"draft-12"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderFormat::Draft11 => "draft-11",
            HeaderFormat::Draft12 => "draft-12",
        }
    }
}

type PartsFn<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// Who a request is counted against.
#[derive(Clone)]
pub enum KeySource {
    /// The value of a header (an API key, a user id set by an authentication layer).
    Header(HeaderName),
    /// The client's IP: the peer address (axum's `ConnectInfo<SocketAddr>`), or, when the peer
    /// is one of `trusted_proxies`, the rightmost address in `X-Forwarded-For` that is not a
    /// trusted proxy. `X-Forwarded-For` from anyone else is ignored.
    ClientIp { trusted_proxies: Vec<IpAddr> },
    /// Anything computed from the request.
    Custom(PartsFn<Option<String>>),
}

impl KeySource {
    fn key(&self, parts: &Parts) -> Option<String> {
        match self {
            KeySource::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string),
            KeySource::ClientIp { trusted_proxies } => {
                client_ip(parts, trusted_proxies).map(|ip| ip.to_string())
            }
            KeySource::Custom(f) => f(parts),
        }
    }
}

fn client_ip(parts: &Parts, trusted: &[IpAddr]) -> Option<IpAddr> {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())?;
    if !trusted.contains(&peer) {
        return Some(peer);
    }
    let chain: Vec<IpAddr> = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .map(|s| s.parse::<IpAddr>().ok())
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default();
    Some(
        chain
            .iter()
            .rev()
            .find(|ip| !trusted.contains(ip))
            .copied()
            .unwrap_or(peer),
    )
}

type LimitsFn = Arc<dyn Fn(&str, &str) -> Vec<Policy> + Send + Sync>;

/// The middleware's settings; build with [`RateLimitLayer::builder`].
#[derive(Clone)]
pub struct Config {
    key: KeySource,
    route_class: PartsFn<String>,
    plan: PartsFn<String>,
    /// plan -> class -> policies.
    table: HashMap<String, HashMap<String, Arc<[Policy]>>>,
    limits_fn: Option<LimitsFn>,
    estimates: HashMap<String, u64>,
    legacy_headers: bool,
    header_format: HeaderFormat,
    prefix: String,
    keep_alive: Option<Duration>,
}

impl Config {
    /// The limits for `plan` and route `class`: from the function if one is set, else the
    /// table: (plan, class), then ("*", class), then (plan, "*"), then ("*", "*").
    /// Borrowed from the table: a shared count per request would be a cache line every core
    /// writes to.
    fn limits(&self, plan: &str, class: &str) -> Cow<'_, [Policy]> {
        if let Some(f) = &self.limits_fn {
            return Cow::Owned(f(plan, class));
        }
        for (p, c) in [(plan, class), ("*", class), (plan, "*"), ("*", "*")] {
            if let Some(v) = self.table.get(p).and_then(|classes| classes.get(c)) {
                return Cow::Borrowed(v);
            }
        }
        Cow::Borrowed(&[])
    }

    /// The units reserved for a request of route `class`: its estimate, else the one of
    /// `"*"`, else 1.
    fn estimate(&self, class: &str) -> u64 {
        self.estimates
            .get(class)
            .or_else(|| self.estimates.get("*"))
            .copied()
            .unwrap_or(1)
    }

    /// The response fields of `policies` (those shown, in the route's order) and their answers;
    /// `took(i)` says whether the request took units from the `i`-th of them (draft-12's `c`):
    /// the route's estimate from a rate limit, 1 from a concurrency limit.
    fn fields(
        &self,
        policies: &[Policy],
        outcome: &MultiOutcome,
        estimate: u64,
        took: impl Fn(usize) -> bool,
        headers: &mut HeaderMap,
    ) {
        match self.header_format {
            HeaderFormat::Draft11 => {
                rate_limit_headers(policies, outcome, self.legacy_headers, headers);
            }
            HeaderFormat::Draft12 => {
                let costs: Vec<u64> = policies
                    .iter()
                    .enumerate()
                    .map(|(i, p)| match (took(i), &p.algorithm) {
                        (false, _) => 0,
                        (true, Algorithm::Concurrency(_)) => 1,
                        (true, _) => estimate,
                    })
                    .collect();
                rate_limit_headers_as(
                    HeaderFormat::Draft12,
                    policies,
                    outcome,
                    &costs,
                    self.legacy_headers,
                    headers,
                );
            }
        }
    }
}

pub struct Builder<C> {
    client: Client<C>,
    config: Config,
    metrics: Arc<Metrics>,
    batching: Option<Batching>,
    deny_cache: Option<usize>,
}

/// Entries of the middleware's deny cache unless [`Builder::deny_cache_entries`] says otherwise.
pub const DENY_CACHE_ENTRIES: usize = 10_000;

impl<C> Builder<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Who requests are counted against (default: the client IP with no trusted proxy).
    pub fn key(mut self, key: KeySource) -> Self {
        self.config.key = key;
        self
    }

    /// The route class of a request (default: `"default"` for every request).
    pub fn route_class(mut self, f: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.config.route_class = Arc::new(f);
        self
    }

    /// The plan of the request's client, looked up on every request (default: `"default"`).
    pub fn plan(mut self, f: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.config.plan = Arc::new(f);
        self
    }

    /// The limits of `plan` on route `class` (`"*"` matches any); all of them apply at once.
    pub fn limits(mut self, plan: &str, class: &str, policies: Vec<Policy>) -> Self {
        self.config
            .table
            .entry(plan.to_string())
            .or_default()
            .insert(class.to_string(), policies.into());
        self
    }

    /// Limits computed per request from (plan, class), instead of the table.
    pub fn limits_fn(
        mut self,
        f: impl Fn(&str, &str) -> Vec<Policy> + Send + Sync + 'static,
    ) -> Self {
        self.config.limits_fn = Some(Arc::new(f));
        self
    }

    /// The units a request of route `class` (`"*"`: any class without its own) consumes from
    /// each of its limits before the handler runs (default 1). A handler that reports its true
    /// cost with [`ActualCost`] has the difference refunded or charged after it returns; with
    /// no report the estimate stands. An estimate of 0 admits while a limit is not in debt and
    /// charges everything afterwards (on a route with a concurrency limit it would only peek
    /// at it: keep at least 1 there).
    pub fn estimate(mut self, class: &str, units: u64) -> Self {
        self.config.estimates.insert(class.to_string(), units);
        self
    }

    /// Also send `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.config.legacy_headers = on;
        self
    }

    /// The format of the `RateLimit` fields (default [`HeaderFormat::Draft11`], until the RFC):
    /// [`HeaderFormat::Draft12`] writes `a`, `w` and `c` in `RateLimit` and adds
    /// `RateLimit-Partition`. The legacy fields, `Retry-After`, `RateLimit-Degraded` and the
    /// bodies are the same in both.
    pub fn header_format(mut self, format: HeaderFormat) -> Self {
        self.config.header_format = format;
        self
    }

    /// Prefix of the Redis keys (default `rl`): `rl:{client}:class:limit`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.config.prefix = prefix.to_string();
        self
    }

    /// Renew the concurrency leases of requests still in flight every `every` (default: never;
    /// a response that outlasts `lease_sec` then loses its slot to the next request).
    pub fn lease_keep_alive(mut self, every: Duration) -> Self {
        self.config.keep_alive = Some(every);
        self
    }

    /// Share counters with another layer or an exporter.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Take leased batches for hot keys (see [`Batching`]; the keys are
    /// `<prefix>:{<who>}:<class>:<policy>`): a hot key's requests are admitted in the process
    /// from units one partial grant took, and count `outcome="batch"`. Off by default (unless
    /// the client given to the builder batches already). Routes with a concurrency limit are
    /// never batched.
    pub fn batching(mut self, batching: Batching) -> Self {
        self.batching = Some(batching);
        self
    }

    /// The deny cache (on by default, [`DENY_CACHE_ENTRIES`] entries): a request denied by Redis
    /// with `retry_after_ms` R makes the same key's requests on the same route denied in the
    /// process, without calling Redis, until R has passed (`outcome="deny_cache"`). Off: every
    /// request asks Redis (a deny cache of the client given to the builder is not used either).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on.then_some(self.deny_cache.unwrap_or(DENY_CACHE_ENTRIES));
        self
    }

    /// The deny cache's entries at most, the least recently used evicted first (turns it on).
    pub fn deny_cache_entries(mut self, entries: usize) -> Self {
        self.deny_cache = Some(entries);
        self
    }

    pub fn build(self) -> RateLimitLayer<C> {
        let mut client = self.client;
        if let Some(b) = self.batching {
            client = client.with_batching(b);
        }
        client = match self.deny_cache {
            Some(n) => client.with_deny_cache(n),
            None => client.without_deny_cache(),
        };
        RateLimitLayer {
            shared: Arc::new(Shared {
                client,
                config: self.config,
                metrics: self.metrics,
            }),
        }
    }
}

struct Shared<C> {
    client: Client<C>,
    config: Config,
    metrics: Arc<Metrics>,
}

/// The layer; clone it freely.
pub struct RateLimitLayer<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<C> RateLimitLayer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub fn builder(client: Client<C>) -> Builder<C> {
        Builder {
            client,
            config: Config {
                key: KeySource::ClientIp {
                    trusted_proxies: Vec::new(),
                },
                route_class: Arc::new(|_| "default".to_string()),
                plan: Arc::new(|_| "default".to_string()),
                table: HashMap::new(),
                limits_fn: None,
                estimates: HashMap::new(),
                legacy_headers: false,
                header_format: HeaderFormat::Draft11,
                prefix: "rl".to_string(),
                keep_alive: None,
            },
            metrics: Arc::new(Metrics::default()),
            batching: None,
            deny_cache: Some(DENY_CACHE_ENTRIES),
        }
    }

    /// The client the layer decides with (its batches and deny cache included): flush or close
    /// it on shutdown to give back what the batches hold.
    pub fn client(&self) -> &Client<C> {
        &self.shared.client
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// What to serve on `/metrics`: the layer's counters ([`Metrics::render_prometheus`]), then
    /// `ratelimit_breaker_open`, 1 while the client's circuit breaker is open (Redis failed
    /// repeatedly and the failure policy answers without asking it), else 0
    /// (`docs/monitoring/client_alerts.yml` alerts on it).
    pub fn render_prometheus(&self) -> String {
        let mut out = self.shared.metrics.render_prometheus();
        out.push_str(
            "# HELP ratelimit_breaker_open Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers without asking it.\n\
             # TYPE ratelimit_breaker_open gauge\n",
        );
        out.push_str(if self.shared.client.breaker_open() {
            "ratelimit_breaker_open 1\n"
        } else {
            "ratelimit_breaker_open 0\n"
        });
        out
    }
}

impl<S, C> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

pub struct RateLimit<S, C> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `prefix:{who}:class:name`: the caller's part in braces, so that every limit of one caller
/// is in one cluster slot.
fn redis_key(prefix: &str, who: &str, class: &str, name: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + who.len() + class.len() + name.len() + 5);
    for (part, after) in [(prefix, ":{"), (who, "}:"), (class, ":"), (name, "")] {
        k.push_str(part);
        k.push_str(after);
    }
    k
}

fn header(v: String) -> HeaderValue {
    // The string's buffer becomes the value's, without a copy.
    HeaderValue::try_from(v).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// Policy names go into structured-field strings: keep them to safe characters.
fn push_sf_string(out: &mut String, name: &str) {
    out.extend(name.chars().map(|c| {
        if c.is_ascii_graphic() && c != '"' && c != '\\' {
            c
        } else {
            '_'
        }
    }));
}

/// The response fields for these policies and decisions, in the default format
/// ([`HeaderFormat::Draft11`]). A concurrency limit's policy has the quota unit
/// `qu="concurrent-requests"` and no window.
pub fn rate_limit_headers(
    policies: &[Policy],
    outcome: &MultiOutcome,
    legacy: bool,
    headers: &mut HeaderMap,
) {
    rate_limit_headers_as(
        HeaderFormat::Draft11,
        policies,
        outcome,
        &[],
        legacy,
        headers,
    );
}

/// The response fields for these policies and decisions in `format`. `costs` are the units the
/// request took from each policy, in the same order (draft-12's `c`; a missing one is 0; unused
/// by draft-11).
pub fn rate_limit_headers_as(
    format: HeaderFormat,
    policies: &[Policy],
    outcome: &MultiOutcome,
    costs: &[u64],
    legacy: bool,
    headers: &mut HeaderMap,
) {
    use crate::text::push_u64;
    let draft12 = format == HeaderFormat::Draft12;
    // Each field written into one string, without the formatter.
    let mut policy = String::with_capacity(48 * policies.len());
    let mut state = String::with_capacity(40 * policies.len());
    let mut partition = String::with_capacity(if draft12 { 24 * policies.len() } else { 0 });
    for (i, (p, d)) in policies.iter().zip(&outcome.decisions).enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
            if draft12 {
                partition.push_str(", ");
            }
        }
        policy.push('"');
        push_sf_string(&mut policy, &p.name);
        policy.push_str("\";q=");
        push_u64(&mut policy, d.limit);
        match p.algorithm {
            Algorithm::Concurrency(_) => policy.push_str(";qu=\"concurrent-requests\""),
            _ => {
                policy.push_str(";w=");
                push_u64(&mut policy, p.algorithm.window_secs());
            }
        }
        state.push('"');
        push_sf_string(&mut state, &p.name);
        state.push_str(if draft12 { "\";a=" } else { "\";r=" });
        push_u64(&mut state, d.remaining);
        state.push_str(if draft12 { ";w=" } else { ";t=" });
        push_u64(&mut state, ceil_secs(d.reset_after_ms));
        if draft12 {
            state.push_str(";c=");
            push_u64(&mut state, costs.get(i).copied().unwrap_or(0));
            partition.push('"');
            push_sf_string(&mut partition, &p.name);
            partition.push_str("\";client_id");
        }
    }
    headers.insert(RATELIMIT_POLICY, header(policy));
    headers.insert(RATELIMIT, header(state));
    if draft12 {
        headers.insert(RATELIMIT_PARTITION, header(partition));
    }
    if legacy && let Some(d) = tightest(policies, outcome) {
        headers.insert(RATELIMIT_LIMIT, header(d.limit.to_string()));
        headers.insert(RATELIMIT_REMAINING, header(d.remaining.to_string()));
        headers.insert(
            RATELIMIT_RESET,
            header(ceil_secs(d.reset_after_ms).to_string()),
        );
    }
    if let Some(g) = outcome.degraded {
        headers.insert(RATELIMIT_DEGRADED, HeaderValue::from_static(g.as_str()));
    }
}

// The fields' names, made once (a `&str` name is parsed and checked on every insert).
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_PARTITION: HeaderName = HeaderName::from_static("ratelimit-partition");
const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
const RATELIMIT_DEGRADED: HeaderName = HeaderName::from_static("ratelimit-degraded");

/// The limit that decided: the one that denied, else the enforced one with the fewest units
/// left (shadow policies never decide; with no enforced policy there is none).
fn tightest<'a>(policies: &[Policy], outcome: &'a MultiOutcome) -> Option<&'a Decision> {
    if outcome.denied_by > 0 {
        return outcome.decisions.get(outcome.denied_by - 1);
    }
    policies
        .iter()
        .zip(&outcome.decisions)
        .filter(|(p, _)| !p.shadow)
        .map(|(_, d)| d)
        .min_by_key(|d| d.remaining)
}

fn problem(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

fn too_many(policies: &[Policy], outcome: &MultiOutcome) -> Response<Body> {
    let i = outcome.denied_by.max(1) - 1;
    let d = outcome.decisions[i];
    let name = &policies[i].name;
    let wait_ms = if d.retry_after_ms >= 0 {
        d.retry_after_ms as u64
    } else {
        d.reset_after_ms
    };
    let secs = ceil_secs(wait_ms).max(1);
    let mut r = problem(
        StatusCode::TOO_MANY_REQUESTS,
        serde_json::json!({
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": format!("rate limit '{name}' exceeded; retry in {secs} s"),
            "limit": name,
            "retry_after": secs,
        }),
    );
    r.headers_mut()
        .insert(RETRY_AFTER, header(secs.to_string()));
    r
}

/// A response body that holds the request's leases (its enforced limits' and its shadow
/// limits') until it has been sent to the end (or failed), or is dropped: the connection closed
/// before.
struct LeasedBody<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    inner: Body,
    leases: Vec<Lease<C>>,
}

impl<C> HttpBody for LeasedBody<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = frame {
            this.leases.clear();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Settles the request's estimate with its actual cost on every limit but the concurrency ones,
/// and puts the state after settlement into `outcome` for the response fields. A settlement that
/// could not be made where the estimate was taken (Redis did not answer) leaves `outcome` as it
/// was, and a refusal leaves the response alone: the estimate then stands. A reservation made
/// by the `Local` policy is settled in its in-process buckets.
async fn settle<C>(
    shared: &Shared<C>,
    policies: &[Policy],
    limits: &[(String, Algorithm)],
    estimate: u64,
    actual: u64,
    outcome: &mut MultiOutcome,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let settled: Vec<usize> = (0..limits.len())
        .filter(|&i| limits[i].1.concurrency().is_none())
        .collect();
    // Admitted by `FailOpen`: nothing was taken, nothing to settle.
    if settled.is_empty() || !matches!(outcome.degraded, None | Some(Degraded::Local)) {
        return;
    }
    let reservation = Reservation::new(
        shared.client.clone(),
        settled.iter().map(|&i| limits[i].clone()).collect(),
        estimate,
        outcome.degraded,
    );
    let Ok(s) = reservation.settle(actual).await else {
        return;
    };
    if s.degraded != outcome.degraded {
        return;
    }
    let delta = i64::try_from(i128::from(actual) - i128::from(estimate)).unwrap_or(0);
    for (&i, d) in settled.iter().zip(s.decisions) {
        outcome.decisions[i] = d;
        shared.metrics.record_settled(&policies[i].name, delta);
    }
}

/// A Redis key and its limit.
type Limit = (String, Algorithm);

/// One call for `limits`: `RL.ALL ... LEASE` with a lease when a concurrency limit is among
/// them, else a plain check.
async fn decide<C>(
    client: &Client<C>,
    limits: &[(String, Algorithm)],
    cost: u64,
) -> Result<(MultiOutcome, Option<Lease<C>>), crate::types::Error>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if limits.iter().any(|(_, a)| a.concurrency().is_some()) {
        // Boxed: a lease's call would make the future of every request as large.
        Box::pin(client.acquire_all(limits, cost))
            .await
            .map(|o| (o.outcome, o.lease))
    } else {
        client.check_all(limits, cost).await.map(|o| (o, None))
    }
}

impl<S, C, B> Service<Request<B>> for RateLimit<S, C>
where
    S: Service<Request<B>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone waits for readiness; the ready one serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let cfg = &shared.config;
            let who = cfg
                .key
                .key(&parts)
                .unwrap_or_else(|| "anonymous".to_string());
            let class = (cfg.route_class)(&parts);
            let plan = (cfg.plan)(&parts);
            let policies = cfg.limits(&plan, &class);
            let req = Request::from_parts(parts, body);
            if policies.is_empty() {
                return inner.call(req).await;
            }
            let limits: Vec<(String, Algorithm)> = policies
                .iter()
                .map(|p| {
                    (
                        redis_key(&cfg.prefix, &who, &class, &p.name),
                        p.algorithm.clone(),
                    )
                })
                .collect();
            let estimate = cfg.estimate(&class);
            // Without shadow policies (the usual route) nothing to sort out.
            let (enforced, shadows): (Vec<usize>, Vec<usize>) = if policies.iter().any(|p| p.shadow)
            {
                (0..policies.len()).partition(|&i| !policies[i].shadow)
            } else {
                (Vec::new(), Vec::new())
            };
            // Without shadow policies (the usual route) the enforced ones are all of them.
            let (e_policies, e_limits): (Cow<[Policy]>, Cow<[Limit]>) = if shadows.is_empty() {
                (Cow::Borrowed(&policies[..]), Cow::Borrowed(&limits[..]))
            } else {
                (
                    enforced.iter().map(|&i| policies[i].clone()).collect(),
                    enforced.iter().map(|&i| limits[i].clone()).collect(),
                )
            };
            let decided = if e_limits.is_empty() {
                Ok((
                    MultiOutcome {
                        allowed: true,
                        denied_by: 0,
                        decisions: Vec::new(),
                        degraded: None,
                        mode: None,
                        granted: estimate,
                        answered_locally: None,
                    },
                    None,
                ))
            } else {
                decide(&shared.client, &e_limits, estimate).await
            };
            let (mut outcome, lease) = match decided {
                Ok(o) => o,
                Err(e) => {
                    return Ok(problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        serde_json::json!({
                            "type": "about:blank",
                            "title": "Internal Server Error",
                            "status": 500,
                            "detail": format!("rate limiter: {e}"),
                        }),
                    ));
                }
            };
            for (i, p) in e_policies.iter().enumerate() {
                let denied_here = !outcome.allowed && outcome.denied_by == i + 1;
                if outcome.allowed || denied_here {
                    shared.metrics.record_answer(
                        &p.name,
                        outcome.allowed,
                        outcome.degraded.is_some(),
                        outcome.answered_locally,
                    );
                }
            }
            let mut leases: Vec<Lease<C>> = lease.into_iter().collect();
            // Each shadow policy's answer: (index, outcome, whether it consumed).
            let mut shadowed: Vec<(usize, MultiOutcome, bool)> = Vec::new();
            let mut denials = Vec::new();
            if outcome.allowed {
                for &i in &shadows {
                    let one = std::slice::from_ref(&limits[i]);
                    // A shadow limit that Redis refuses is left out; it never fails a request.
                    let Ok((o, l)) = Box::pin(decide(&shared.client, one, estimate)).await else {
                        continue;
                    };
                    let name = &policies[i].name;
                    shared
                        .metrics
                        .record_shadow(name, o.allowed, o.degraded.is_some());
                    if let Some(l) = o.answered_locally {
                        shared.metrics.record_local(name, l);
                    }
                    if !o.allowed {
                        denials.push(name.clone());
                    }
                    leases.extend(l);
                    let consumed = o.allowed;
                    shadowed.push((i, o, consumed));
                }
            } else if !shadows.is_empty() {
                let s_limits: Vec<(String, Algorithm)> =
                    shadows.iter().map(|&i| limits[i].clone()).collect();
                if let Ok(o) = Box::pin(shared.client.check_all(&s_limits, 0)).await {
                    for (&i, d) in shadows.iter().zip(&o.decisions) {
                        let one = MultiOutcome {
                            allowed: d.allowed,
                            denied_by: usize::from(!d.allowed),
                            decisions: vec![*d],
                            degraded: o.degraded,
                            mode: o.mode,
                            granted: 0,
                            answered_locally: None,
                        };
                        shadowed.push((i, one, false));
                    }
                }
            }
            if let Some(every) = cfg.keep_alive {
                for l in &mut leases {
                    l.keep_alive(every);
                }
            }
            let mut resp = if outcome.allowed {
                // Should the handler fail or the request be cancelled, the leases are dropped
                // here and the estimate stands.
                let resp = inner.call(req).await?;
                if let Some(&ActualCost(actual)) = resp.extensions().get::<ActualCost>()
                    && actual != estimate
                {
                    // Boxed, as the other calls a request rarely makes (shadows, leases).
                    Box::pin(settle(
                        &shared,
                        &e_policies,
                        &e_limits,
                        estimate,
                        actual,
                        &mut outcome,
                    ))
                    .await;
                    for (i, o, consumed) in &mut shadowed {
                        if *consumed {
                            let (p, l) = (&policies[*i..=*i], &limits[*i..=*i]);
                            Box::pin(settle(&shared, p, l, estimate, actual, o)).await;
                        }
                    }
                }
                if leases.is_empty() {
                    resp
                } else {
                    resp.map(|inner| Body::new(LeasedBody { inner, leases }))
                }
            } else {
                too_many(&e_policies, &outcome)
            };
            // The fields list every policy answered for, in the route's order: without shadow
            // policies, those of the one call.
            // Every enforced limit took its units when the request was admitted (one call, all
            // or nothing), none when it was refused.
            let admitted = outcome.allowed;
            if shadowed.is_empty() {
                cfg.fields(
                    &e_policies,
                    &outcome,
                    estimate,
                    |_| admitted,
                    resp.headers_mut(),
                );
                return Ok(resp);
            }
            // (index, answer, whether the request took units from it): a shadow limit took them
            // when it admitted the request, and only then.
            let mut answers: Vec<(usize, Decision, bool)> = enforced
                .iter()
                .copied()
                .zip(outcome.decisions.iter().copied())
                .map(|(i, d)| (i, d, admitted))
                .collect();
            let mut degraded = outcome.degraded;
            for (i, o, consumed) in &shadowed {
                answers.push((*i, o.decisions[0], admitted && *consumed));
                degraded = degraded.or(o.degraded);
            }
            answers.sort_by_key(|(i, _, _)| *i);
            let denier = (outcome.denied_by > 0).then(|| enforced[outcome.denied_by - 1]);
            let shown: Vec<Policy> = answers
                .iter()
                .map(|(i, _, _)| policies[*i].clone())
                .collect();
            let took: Vec<bool> = answers.iter().map(|(_, _, t)| *t).collect();
            let all = MultiOutcome {
                allowed: outcome.allowed,
                denied_by: denier
                    .and_then(|d| answers.iter().position(|(i, _, _)| *i == d))
                    .map_or(0, |p| p + 1),
                decisions: answers.into_iter().map(|(_, d, _)| d).collect(),
                degraded,
                mode: outcome.mode,
                granted: outcome.granted,
                answered_locally: outcome.answered_locally,
            };
            cfg.fields(&shown, &all, estimate, |i| took[i], resp.headers_mut());
            if !denials.is_empty() {
                resp.extensions_mut().insert(ShadowDenials(denials));
            }
            Ok(resp)
        })
    }
}
