//! Concurrency leases: the guard that holds a slot, renews it and gives it back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::algorithm::{Algorithm, Concurrency};
use crate::client::{Client, Limiter, new_lease_id};
use crate::types::{Degraded, Error, MultiOutcome, Outcome};

/// The answer to [`Client::acquire`]: the outcome, and the lease when admitted.
pub struct LeaseOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub outcome: Outcome,
    /// `Some` exactly when admitted.
    pub lease: Option<Lease<C>>,
}

/// The answer to [`Client::acquire_all`]: the outcome of every limit, and the lease holding the
/// concurrency limits' slots when admitted.
pub struct MultiLeaseOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub outcome: MultiOutcome,
    /// `Some` when admitted with a cost above 0 and at least one concurrency limit.
    pub lease: Option<Lease<C>>,
}

/// Where the slots are held: on Redis, in the in-process semaphore (`FailurePolicy::Local`), or
/// nowhere (admitted by `FailOpen`); a renewal may add a place.
#[derive(Debug, Default)]
struct Held {
    redis: bool,
    local: bool,
    released: bool,
    last_renewal: Option<Outcome>,
}

struct Shared<C> {
    client: Client<C>,
    id: String,
    limits: Vec<(String, Concurrency)>,
    held: Mutex<Held>,
}

impl<C> Shared<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the lease released; where it was held.
    fn take(&self) -> (bool, bool) {
        let mut h = self.held();
        let places = (h.redis && !h.released, h.local && !h.released);
        h.released = true;
        places
    }

    fn release_local(&self) -> bool {
        let mut freed = false;
        for (key, _) in &self.limits {
            freed |= self.client.release_local(key, &self.id);
        }
        freed
    }

    async fn release_redis(&self) -> Result<bool, Error> {
        let (mut freed, mut error) = (false, None);
        for (key, _) in &self.limits {
            match self.client.release(key, &self.id).await {
                Ok(f) => freed |= f,
                Err(e) => error = error.or(Some(e)),
            }
        }
        error.map_or(Ok(freed), Err)
    }

    async fn renew(&self) -> Result<Outcome, Error> {
        let mut answer: Option<Outcome> = None;
        for (key, limit) in &self.limits {
            let o = self
                .client
                .decide_one(key, &Algorithm::Concurrency(*limit), 1, Some(&self.id))
                .await?;
            if o.decision.allowed {
                let mut h = self.held();
                match o.degraded {
                    None => h.redis = true,
                    Some(Degraded::Local) => h.local = true,
                    Some(_) => {}
                }
            }
            answer = Some(match answer {
                Some(a) if !a.decision.allowed => a,
                Some(a) if o.decision.allowed && a.decision.remaining <= o.decision.remaining => a,
                _ => o,
            });
        }
        let o = answer.expect("a lease holds at least one limit");
        self.held().last_renewal = Some(o);
        Ok(o)
    }
}

/// The task that renews a lease, and how it is told its interval, or to stop (`None`).
struct KeepAlive {
    every: watch::Sender<Option<Duration>>,
    task: JoinHandle<()>,
}

impl KeepAlive {
    /// Stops the renewals and waits for the task to end: a renewal on its way when this is called
    /// is answered (or past the client's timeout) before it returns, so none lands after it.
    async fn stop(self) {
        let _ = self.every.send(None);
        let _ = self.task.await;
    }
}

/// A slot held on one key (or one on each concurrency limit of [`Client::acquire_all`]) under
/// one lease id, until the lease expires or the guard gives it back: dropped (`RL.RELEASE` sent
/// from a task on the current tokio runtime) or [`Lease::release`]d.
pub struct Lease<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    shared: Arc<Shared<C>>,
    keep_alive: Option<KeepAlive>,
}

impl<C> std::fmt::Debug for LeaseOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseOutcome")
            .field("outcome", &self.outcome)
            .field("lease", &self.lease)
            .finish()
    }
}

impl<C> std::fmt::Debug for MultiLeaseOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLeaseOutcome")
            .field("outcome", &self.outcome)
            .field("lease", &self.lease)
            .finish()
    }
}

impl<C> std::fmt::Debug for Lease<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.shared.id)
            .field("limits", &self.shared.limits)
            .field("held", &*self.shared.held())
            .finish()
    }
}

impl<C> Lease<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(
        client: Client<C>,
        id: String,
        limits: Vec<(String, Concurrency)>,
        degraded: Option<Degraded>,
    ) -> Self {
        let held = Held {
            redis: degraded.is_none(),
            local: degraded == Some(Degraded::Local),
            ..Held::default()
        };
        Lease {
            shared: Arc::new(Shared {
                client,
                id,
                limits,
                held: Mutex::new(held),
            }),
            keep_alive: None,
        }
    }

    /// The lease id (the sorted set's member).
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The key the slot is held on (the first, for a lease over several keys).
    pub fn key(&self) -> &str {
        &self.shared.limits[0].0
    }

    /// Whether any slot is held anywhere (`false` for a lease admitted by `FailOpen` and not
    /// renewed on Redis since).
    pub fn holds_slot(&self) -> bool {
        let h = self.shared.held();
        (h.redis || h.local) && !h.released
    }

    /// Extends the lease to now + `lease_sec` by sending `RL.ACQUIRE` again with the same id.
    /// A lease that had expired meanwhile takes a slot again if one is free; denied means the
    /// slot is lost (others hold every slot). Over several keys: the first denial, else the key
    /// with the fewest free slots. The failure policy answers as for [`Client::acquire`].
    pub async fn renew(&self) -> Result<Outcome, Error> {
        self.shared.renew().await
    }

    /// Renews every `every` from a task on the current tokio runtime until the lease is released
    /// or dropped (choose `every` well below `lease_sec`). Calling it again replaces the timer.
    /// A renewal is never cut short: the release waits for the one on its way, so that no
    /// renewal takes the slot back after it.
    pub fn keep_alive(&mut self, every: Duration) {
        if let Some(k) = &self.keep_alive {
            let _ = k.every.send(Some(every));
            return;
        }
        let (tx, mut rx) = watch::channel(Some(every));
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Some(every) = *rx.borrow_and_update() else {
                    return;
                };
                let mut timer = tokio::time::interval(every);
                timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                timer.tick().await;
                loop {
                    // A new interval, or the stop, before any further renewal.
                    tokio::select! {
                        biased;
                        changed = rx.changed() => match changed {
                            Ok(()) => break,
                            Err(_) => return,
                        },
                        _ = timer.tick() => {}
                    }
                    let _ = shared.renew().await;
                }
            }
        });
        self.keep_alive = Some(KeepAlive { every: tx, task });
    }

    /// The outcome of the latest renewal ([`Lease::renew`] or [`Lease::keep_alive`]).
    pub fn last_renewal(&self) -> Option<Outcome> {
        self.shared.held().last_renewal
    }

    /// Gives the slot back now: whether a live lease was released (`false` if it had expired,
    /// was admitted by `FailOpen`, or Redis could not answer: it then expires by itself). A
    /// renewal of the keep-alive on its way is waited for first, so none lands after the release.
    pub async fn release(mut self) -> Result<bool, Error> {
        if let Some(k) = self.keep_alive.take() {
            k.stop().await;
        }
        let (redis, local) = self.shared.take();
        let mut freed = local && self.shared.release_local();
        if redis {
            freed |= self.shared.release_redis().await?;
        }
        Ok(freed)
    }
}

impl<C> Drop for Lease<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        let keep_alive = self.keep_alive.take();
        if let Some(k) = keep_alive {
            // The release waits for the renewal on its way, as `release` does.
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let shared = self.shared.clone();
                    rt.spawn(async move {
                        k.stop().await;
                        let (redis, local) = shared.take();
                        if local {
                            shared.release_local();
                        }
                        if redis {
                            let _ = shared.release_redis().await;
                        }
                    });
                    return;
                }
                Err(_) => k.task.abort(),
            }
        }
        let (redis, local) = self.shared.take();
        if local {
            self.shared.release_local();
        }
        // Outside a runtime nothing can be sent: the lease expires by itself.
        if redis && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let shared = self.shared.clone();
            rt.spawn(async move {
                let _ = shared.release_redis().await;
            });
        }
    }
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Takes one of `limit.limit` slots of `key` for a new lease (`RL.ACQUIRE` with a fresh
    /// lease id). Admitted: the outcome and the [`Lease`], which gives the slot back when
    /// dropped or [released](Lease::release), and can be [renewed](Lease::renew). Denied: the
    /// outcome alone, `retry_after_ms` until a lease expires. When Redis cannot answer the
    /// failure policy decides: `FailOpen` admits with a lease that holds nothing, `FailClosed`
    /// denies, `Local` takes a slot of an in-process semaphore.
    pub async fn acquire(&self, key: &str, limit: &Concurrency) -> Result<LeaseOutcome<C>, Error> {
        self.acquire_as(key, limit, &new_lease_id()).await
    }

    /// [`Client::acquire`] with the caller's lease id (1 to 128 bytes, unique to the holder,
    /// such as a job id): a live lease of that id is renewed instead of taking a second slot.
    pub async fn acquire_as(
        &self,
        key: &str,
        limit: &Concurrency,
        id: &str,
    ) -> Result<LeaseOutcome<C>, Error> {
        let outcome = self
            .decide_one(key, &Algorithm::Concurrency(*limit), 1, Some(id))
            .await?;
        let lease = outcome.decision.allowed.then(|| {
            Lease::new(
                self.clone(),
                id.to_string(),
                vec![(key.to_string(), *limit)],
                outcome.degraded,
            )
        });
        Ok(LeaseOutcome { outcome, lease })
    }

    /// Several limits at once, concurrency limits among them (`RL.ALL ... LEASE id COST
    /// cost`): admitted only if every limit admits; then `cost` is consumed from the others and
    /// one slot of each concurrency limit is held by the returned lease (`None` if there is no
    /// concurrency limit). Cost 0 peeks and takes no slot.
    pub async fn acquire_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
    ) -> Result<MultiLeaseOutcome<C>, Error> {
        let held: Vec<(String, Concurrency)> = limits
            .iter()
            .filter_map(|(k, a)| a.concurrency().map(|c| (k.clone(), *c)))
            .collect();
        if held.is_empty() {
            let outcome = self.decide_all(limits, cost, None).await?;
            return Ok(MultiLeaseOutcome {
                outcome,
                lease: None,
            });
        }
        let id = new_lease_id();
        let outcome = self.decide_all(limits, cost, Some(&id)).await?;
        let lease = (outcome.allowed && cost > 0)
            .then(|| Lease::new(self.clone(), id, held, outcome.degraded));
        Ok(MultiLeaseOutcome { outcome, lease })
    }
}

impl<C> Limiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A slot of the limiter's concurrency limit (see [`Client::acquire`]); `Error::Unsupported`
    /// for the other algorithms.
    pub async fn acquire(&self, key: &str) -> Result<LeaseOutcome<C>, Error> {
        match self.algorithm.concurrency() {
            Some(c) => self.client.acquire(key, c).await,
            None => Err(Error::Unsupported("acquire takes a concurrency limit")),
        }
    }
}
