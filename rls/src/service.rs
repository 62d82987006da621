//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: a request's descriptors
//! looked up in the configuration, decided through the [`Limiter`], and answered with one status
//! per descriptor (`current_limit`, `limit_remaining`, `duration_until_reset`) so that Envoy's
//! `x-ratelimit-*` headers work.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratelimit_client::Decision;
use redis::aio::ConnectionLike;
use tonic::{Request, Response, Status};

use crate::config::{Config, Kind, Limit, Matched, Unit};
use crate::limiter::{Item, Limiter};
use crate::metrics::Metrics;
use crate::settings::OnRedisFailure;

/// The configuration in force, and what the last load said.
#[derive(Debug, Default)]
pub struct State {
    config: RwLock<Arc<Config>>,
    /// The error of the last load, while the configuration before it stays in force.
    last_error: RwLock<Option<String>>,
}

impl State {
    pub fn new(config: Config) -> Self {
        State {
            config: RwLock::new(Arc::new(config)),
            last_error: RwLock::new(None),
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn replace(&self, config: Config) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        *self.last_error.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub fn refuse(&self, error: String) {
        *self.last_error.write().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

pub struct Service<C> {
    pub state: Arc<State>,
    pub limiter: Arc<Limiter<C>>,
    pub metrics: Arc<Metrics>,
    pub client_metrics: Arc<ratelimit_client::metrics::Metrics>,
    pub key_prefix: String,
    pub near_limit_ratio: f64,
    pub global_shadow_mode: bool,
    pub on_failure: OnRedisFailure,
}

/// One descriptor of a request, as it is decided.
enum Slot {
    /// Matched no limit.
    None,
    /// Matched an unlimited one.
    Unlimited,
    /// A limit, at this index among the items.
    Item(usize, Matched),
}

fn limit_override(domain: &str, entries: &[(&str, &str)], rpu: u32, unit: Unit) -> Matched {
    let mut key = domain.to_string();
    for (k, v) in entries {
        key.push('.');
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(v);
        }
    }
    let counter = entries
        .iter()
        .map(|(k, v)| format!("{k}_{v}"))
        .collect::<Vec<_>>()
        .join(".");
    Matched {
        limit: Arc::new(Limit {
            full_key: key.clone(),
            requests_per_unit: rpu,
            unit: Some(unit),
            unlimited: false,
            shadow_mode: false,
            detailed_metric: false,
            name: String::new(),
            replaces: Vec::new(),
            kind: Kind::FixedWindow,
            burst: None,
        }),
        stats_key: key,
        counter: format!("override_{rpu}_{}:{counter}", unit.proto()),
    }
}

fn status(limit: &Limit, d: &Decision, over: bool) -> DescriptorStatus {
    let reset_ms = d.reset_after_ms;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(RateLimit {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.map_or(0, Unit::proto),
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(PbDuration {
            seconds: (reset_ms / 1000) as i64,
            nanos: ((reset_ms % 1000) * 1_000_000) as i32,
        }),
        ..DescriptorStatus::default()
    }
}

impl<C> Service<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The answer to one request, or the error the call fails with.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if req.domain.is_empty() {
            self.metrics.error("service_error");
            return Err(Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if req.descriptors.is_empty() {
            self.metrics.error("service_error");
            return Err(Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        let config = self.state.config();
        let request_cost = u64::from(req.hits_addend.max(1));
        let mut slots = Vec::with_capacity(req.descriptors.len());
        let mut matched: Vec<(Matched, u64)> = Vec::new();
        for d in &req.descriptors {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let cost = d.hits_addend.as_ref().map_or(request_cost, |h| h.value);
            let found = match d.limit.as_ref() {
                Some(o) => Unit::from_proto(o.unit)
                    .map(|u| limit_override(&req.domain, &entries, o.requests_per_unit, u)),
                None => config.lookup(&req.domain, &entries),
            };
            match found {
                None => slots.push(Slot::None),
                Some(m) if m.limit.unlimited => {
                    slots.push(Slot::Unlimited);
                    matched.push((m, 0));
                }
                Some(m) => {
                    slots.push(Slot::Item(matched.len(), m.clone()));
                    matched.push((m, cost));
                }
            }
        }
        // A limit named in another matched limit's `replaces` is not applied.
        let replaced: Vec<&str> = matched
            .iter()
            .flat_map(|(m, _)| m.limit.replaces.iter().map(String::as_str))
            .collect();
        let mut items = Vec::new();
        let mut at = Vec::with_capacity(slots.len());
        for slot in &mut slots {
            if let Slot::Item(_, m) = slot
                && !m.limit.name.is_empty()
                && replaced.contains(&m.limit.name.as_str())
            {
                *slot = Slot::None;
            }
            match slot {
                Slot::Item(i, m) => {
                    at.push(Some(items.len()));
                    items.push(Item {
                        limit: m.limit.clone(),
                        key: format!(
                            "{}rls:{{{}}}:{}:{}",
                            self.key_prefix,
                            req.domain,
                            m.limit.kind.tag(),
                            m.counter
                        ),
                        cost: matched[*i].1,
                        shadow: m.limit.shadow_mode || self.global_shadow_mode,
                    });
                }
                _ => at.push(None),
            }
        }
        let decided = if items.is_empty() {
            None
        } else {
            match self.limiter.decide(&items).await {
                Ok(d) => Some(d),
                Err(e) => {
                    self.metrics.error("redis_error");
                    return Err(Status::internal(format!("redis error: {e}")));
                }
            }
        };
        if let Some(d) = &decided
            && d.degraded
            && self.on_failure == OnRedisFailure::Error
        {
            self.metrics.error("redis_error");
            return Err(Status::unavailable("redis did not answer"));
        }
        let mut statuses = Vec::with_capacity(slots.len());
        let mut over_any = false;
        for (slot, at) in slots.iter().zip(at) {
            let s = match (slot, at, &decided) {
                (Slot::Unlimited, _, _) => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                (Slot::Item(_, m), Some(i), Some(d)) => {
                    let decision = &d.decisions[i];
                    let item = &items[i];
                    let over = !decision.allowed;
                    self.count(m, item, decision);
                    self.client_metrics
                        .record_answer_of(m, item, decision, d.degraded);
                    let shadowed = over && item.shadow;
                    if over && !shadowed {
                        over_any = true;
                    }
                    // A descriptor's own shadow_mode answers OK; SHADOW_MODE keeps the
                    // descriptor's code and only the overall answer is OK.
                    status(&m.limit, decision, over && !m.limit.shadow_mode)
                }
                _ => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                },
            };
            statuses.push(s);
        }
        Ok(RateLimitResponse {
            overall_code: if over_any { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..RateLimitResponse::default()
        })
    }

    /// The anchor's per-descriptor stats of one decision.
    fn count(&self, m: &Matched, item: &Item, d: &Decision) {
        let limit = u64::from(m.limit.requests_per_unit);
        let near = (limit as f64 * self.near_limit_ratio).floor() as u64;
        let cost = item.cost;
        self.metrics.add(&m.stats_key, |c| {
            c.total_hits += cost;
            if d.allowed {
                c.within_limit += cost;
                let after = d.limit.saturating_sub(d.remaining);
                let before = after.saturating_sub(cost);
                if after > near {
                    c.near_limit += if before >= near { cost } else { after - near };
                }
            } else {
                c.over_limit += cost;
                if item.shadow {
                    c.shadow_mode += cost;
                }
            }
        });
    }
}

/// The client's own counters, per stat key.
trait RecordAnswer {
    fn record_answer_of(&self, m: &Matched, item: &Item, d: &Decision, degraded: bool);
}

impl RecordAnswer for ratelimit_client::metrics::Metrics {
    fn record_answer_of(&self, m: &Matched, item: &Item, d: &Decision, degraded: bool) {
        if item.shadow {
            self.record_shadow(&m.stats_key, d.allowed, degraded);
        } else {
            self.record(&m.stats_key, d.allowed, degraded);
        }
    }
}

#[tonic::async_trait]
impl<C> RateLimitService for Service<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let answer = self.decide(request.get_ref()).await;
        self.metrics.request(started.elapsed());
        answer.map(Response::new)
    }
}
