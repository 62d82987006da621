//! Reserve, then settle: an estimate is checked and consumed up front, and the difference with
//! the true cost is charged or refunded once the work is done (`RL.SETTLE`).

use redis::aio::ConnectionLike;

use crate::algorithm::Algorithm;
use crate::client::{Client, Limiter};
use crate::types::{Degraded, Error, MultiOutcome, Outcome, Settlement};

/// The answer to [`Client::reserve`]: the outcome, and the reservation when admitted.
pub struct ReservationOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub outcome: Outcome,
    /// `Some` exactly when admitted.
    pub reservation: Option<Reservation<C>>,
}

/// The answer to [`Client::reserve_all`]: the outcome of every limit, and the reservation
/// covering them all when admitted.
pub struct MultiReservationOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub outcome: MultiOutcome,
    /// `Some` exactly when admitted.
    pub reservation: Option<Reservation<C>>,
}

/// An estimate consumed from one or several limits, to be settled with the true cost.
/// Dropped unsettled, the estimate stays charged (nothing is sent).
pub struct Reservation<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    client: Client<C>,
    limits: Vec<(String, Algorithm)>,
    estimate: u64,
    /// Where the estimate was consumed: on Redis (`None`), in the `Local` buckets, or nowhere
    /// (`FailOpen`).
    charged: Option<Degraded>,
}

impl<C> Reservation<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(
        client: Client<C>,
        limits: Vec<(String, Algorithm)>,
        estimate: u64,
        charged: Option<Degraded>,
    ) -> Self {
        Reservation {
            client,
            limits,
            estimate,
            charged,
        }
    }

    /// The units consumed when the reservation was made.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// The limits the reservation covers, in the order of the settlement's decisions.
    pub fn limits(&self) -> &[(String, Algorithm)] {
        &self.limits
    }

    /// `None` when the estimate was consumed on Redis; `Local` in the in-process buckets of
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local); `FailOpen` when nothing was
    /// consumed anywhere.
    pub fn degraded(&self) -> Option<Degraded> {
        self.charged
    }

    /// Settles with the true cost: `actual - estimate` is refunded (below 0) or charged (above
    /// 0, with no admission check: a limit may go into debt, denying until it is paid back) on
    /// every limit, in one `RL.SETTLE ... DELTA actual-estimate` call; `actual == estimate` sends
    /// `DELTA 0`, which only reports. The answer is every limit's state afterwards.
    ///
    /// A reservation made by the `Local` policy is settled in its in-process buckets alike (even
    /// once Redis is back); one admitted by `FailOpen` sends nothing and answers as `FailOpen`.
    /// When Redis cannot answer the settlement is lost (the estimate stands) and the decisions
    /// are the failure policy's for a cost of 0.
    pub async fn settle(self, actual: u64) -> Result<Settlement, Error> {
        let delta = i64::try_from(i128::from(actual) - i128::from(self.estimate))
            .map_err(|_| Error::Unsupported("a settlement between -2^63 and 2^63-1 units"))?;
        self.client
            .settle_charged(&self.limits, delta, self.charged)
            .await
    }
}

impl<C> std::fmt::Debug for Reservation<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("limits", &self.limits)
            .field("estimate", &self.estimate)
            .field("degraded", &self.charged)
            .finish()
    }
}

impl<C> std::fmt::Debug for ReservationOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservationOutcome")
            .field("outcome", &self.outcome)
            .field("reservation", &self.reservation)
            .finish()
    }
}

impl<C> std::fmt::Debug for MultiReservationOutcome<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiReservationOutcome")
            .field("outcome", &self.outcome)
            .field("reservation", &self.reservation)
            .finish()
    }
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Checks and on admission consumes `estimate` units of `algo` on `key`, as
    /// [`Client::check`] does, for work whose true cost is known only afterwards. Admitted: the
    /// outcome and the [`Reservation`], whose [`settle`](Reservation::settle) charges or refunds
    /// the difference once the cost is known; dropped unsettled, the estimate stays charged.
    /// Denied: the outcome alone. Concurrency limits are not settled (`Error::Unsupported`).
    pub async fn reserve(
        &self,
        key: &str,
        algo: &Algorithm,
        estimate: u64,
    ) -> Result<ReservationOutcome<C>, Error> {
        if algo.concurrency().is_some() {
            return Err(Error::Unsupported(
                "concurrency limits are not settled: Client::acquire",
            ));
        }
        let outcome = self.decide_one(key, algo, estimate, None).await?;
        let reservation = outcome.decision.allowed.then(|| {
            Reservation::new(
                self.clone(),
                vec![(key.to_string(), algo.clone())],
                estimate,
                outcome.degraded,
            )
        });
        Ok(ReservationOutcome {
            outcome,
            reservation,
        })
    }

    /// [`Client::reserve`] over several limits at once, as [`Client::check_all`]: admitted only
    /// if every limit admits, and then `estimate` is consumed from all of them; the reservation
    /// settles them all in one call.
    pub async fn reserve_all(
        &self,
        limits: &[(String, Algorithm)],
        estimate: u64,
    ) -> Result<MultiReservationOutcome<C>, Error> {
        if limits.iter().any(|(_, a)| a.concurrency().is_some()) {
            return Err(Error::Unsupported(
                "concurrency limits are not settled: Client::acquire_all",
            ));
        }
        let outcome = self.decide_all(limits, estimate, None).await?;
        let reservation = outcome
            .allowed
            .then(|| Reservation::new(self.clone(), limits.to_vec(), estimate, outcome.degraded));
        Ok(MultiReservationOutcome {
            outcome,
            reservation,
        })
    }
}

impl<C> Limiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Reserves `estimate` units, settled later with the true cost (see [`Client::reserve`]).
    pub async fn reserve(&self, key: &str, estimate: u64) -> Result<ReservationOutcome<C>, Error> {
        self.client.reserve(key, &self.algorithm, estimate).await
    }
}
