//! A request's limits decided through the rate-limiter client: the enforced ones together, all
//! or none, in one server call where they can share one (`RL.ALL`, or `all.lua`); the shadow
//! ones each on its own, as envoyproxy/ratelimit counts them whatever the others decide.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_client::{Algorithm, Client, Decision, Error, MultiOutcome};
use redis::aio::ConnectionLike;

use crate::config::Limit;

/// One limit of a request, ready to decide.
#[derive(Clone, Debug)]
pub struct Item {
    pub limit: Arc<Limit>,
    /// The counter's key on the server.
    pub key: String,
    pub cost: u64,
    /// Decided on its own and never denying.
    pub shadow: bool,
}

/// What deciding a request's items came to: one decision per item, in order.
#[derive(Debug)]
pub struct Decided {
    pub decisions: Vec<Decision>,
    /// Some answer came from the client's failure policy (Redis did not answer).
    pub degraded: bool,
}

/// The most limits one `RL.ALL` takes.
const MAX_PER_CALL: usize = 16;

pub struct Limiter<C> {
    client: Client<C>,
    calls: AtomicU64,
}

/// A decision that nothing can ever change: `requests_per_unit: 0`.
fn never() -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_after_ms: -1,
        reset_after_ms: 0,
        limit: 0,
    }
}

impl<C> Limiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub fn new(client: Client<C>) -> Self {
        Limiter {
            client,
            calls: AtomicU64::new(0),
        }
    }

    pub fn client(&self) -> &Client<C> {
        &self.client
    }

    /// Calls made to the client so far (each one server call, or one failure-policy answer).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    async fn all(&self, limits: &[(String, Algorithm)], cost: u64) -> Result<MultiOutcome, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.client.check_all(limits, cost).await
    }

    /// Decides `items`. The enforced ones are checked together, all or none: a request one of
    /// them denies takes nothing from the others. They go in one call when they take the same
    /// cost and number at most 16; otherwise in steps of that shape, and once a step denies,
    /// the steps after it only look (cost 0). A sliding log (which `RL.ALL` cannot hold) is
    /// its own step, before the others: when it denies, nothing else is taken; when it admits
    /// and a later step denies, its entry stays.
    pub async fn decide(&self, items: &[Item]) -> Result<Decided, Error> {
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        let mut degraded = false;
        let mut steps: Vec<(u64, Vec<usize>)> = Vec::new();
        let mut logs: Vec<usize> = Vec::new();
        let mut shadows: Vec<usize> = Vec::new();
        let mut algos: Vec<Option<Algorithm>> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let algo = item.limit.algorithm();
            match &algo {
                None => decisions[i] = Some(never()),
                Some(_) if item.shadow => shadows.push(i),
                Some(Algorithm::SlidingLog { .. }) => logs.push(i),
                Some(_) => match steps
                    .iter_mut()
                    .find(|(c, ix)| *c == item.cost && ix.len() < MAX_PER_CALL)
                {
                    Some((_, ix)) => ix.push(i),
                    None => steps.push((item.cost, vec![i])),
                },
            }
            algos.push(algo);
        }
        let mut ordered: Vec<(u64, Vec<usize>)> =
            logs.into_iter().map(|i| (items[i].cost, vec![i])).collect();
        ordered.extend(steps);
        let steps = ordered;
        let mut denied = decisions.iter().any(|d| d.is_some());
        for (cost, ix) in steps {
            let limits: Vec<(String, Algorithm)> = ix
                .iter()
                .filter_map(|&i| algos[i].clone().map(|a| (items[i].key.clone(), a)))
                .collect();
            let out = self.all(&limits, if denied { 0 } else { cost }).await?;
            degraded |= out.degraded.is_some();
            if !out.allowed && !denied {
                denied = true;
            }
            for (&i, d) in ix.iter().zip(out.decisions.iter()) {
                decisions[i] = Some(*d);
            }
        }
        for i in shadows {
            if let Some(a) = &algos[i] {
                self.calls.fetch_add(1, Ordering::Relaxed);
                let o = self.client.check(&items[i].key, a, items[i].cost).await?;
                degraded |= o.degraded.is_some();
                decisions[i] = Some(o.decision);
            }
        }
        Ok(Decided {
            decisions: decisions
                .into_iter()
                .map(|d| d.unwrap_or_else(never))
                .collect(),
            degraded,
        })
    }
}
