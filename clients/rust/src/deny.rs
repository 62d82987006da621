//! The deny cache: after Redis denied a key with `retry_after_ms` R, the same call (the same
//! limits, keys, parameters and cost) is denied in the process until R has passed by the
//! monotonic clock, without a call to Redis.
//!
//! It can only deny more than Redis would, never admit: what changes the key meanwhile (another
//! process refunding, a limit raised, a window ending sooner by the server's clock than by this
//! one) is seen at most R later. Entries are counted from the moment the denied call was sent, so
//! an entry never outlives the server's own R. When it expires, one check asks Redis (a probe)
//! while the others are still answered from it, for at most the client's timeout: a key denied
//! again costs one call per R, not one per caller waiting at that moment.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lru::Lru;
use crate::types::{LocalAnswer, MultiOutcome};

struct Denied {
    /// A check is asking Redis since the entry expired, until `until` (moved on by the timeout).
    probing: bool,
    /// When the denied call was sent.
    sent: Instant,
    until: Instant,
    outcome: MultiOutcome,
}

/// A fixed number of denials, the least recently used evicted first.
pub(crate) struct DenyCache {
    entries: Mutex<Lru<Denied>>,
    capacity: usize,
    /// How long one probe may take (the client's timeout).
    probe: Duration,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize, probe: Duration) -> Self {
        DenyCache {
            entries: Mutex::new(Lru::new(capacity)),
            capacity: capacity.max(1),
            probe,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The denial standing for `sig` at `cost`, its waits counted down to now (at least 1 ms).
    /// The first check after the entry expired gets `None` and asks Redis: the entry answers the
    /// others until that answer is recorded or the probe's time is up (then it is dropped).
    pub(crate) fn lookup(&self, sig: &str, cost: u64) -> Option<MultiOutcome> {
        let now = Instant::now();
        let key = entry_key(sig, cost);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let d = entries.get_mut(&key)?;
        if now >= d.until {
            if d.probing {
                entries.remove(&key);
            } else {
                d.probing = true;
                d.until = now + self.probe;
            }
            return None;
        }
        // Whole milliseconds gone since the denial (rounded down): the waits are rounded up.
        let gone = u64::try_from(now.duration_since(d.sent).as_millis()).unwrap_or(u64::MAX);
        let mut o = d.outcome.clone();
        for x in &mut o.decisions {
            if x.retry_after_ms > 0 {
                x.retry_after_ms =
                    (x.retry_after_ms - i64::try_from(gone).unwrap_or(i64::MAX)).max(1);
            }
            x.reset_after_ms = x.reset_after_ms.saturating_sub(gone);
        }
        o.granted = 0;
        o.answered_locally = Some(LocalAnswer::DenyCache);
        Some(o)
    }

    /// Remembers a denial that Redis answered (not one of the failure policy, nor one answered
    /// locally) whose wait is known and above 0; `sent` is when its call was sent. An admission
    /// by Redis (a probe's answer) drops the entry if it leaves the cost; if it leaves less (the
    /// next check would be denied, its wait unknown), the next check probes again, the others
    /// still answered from the entry meanwhile.
    pub(crate) fn record(&self, sig: &str, cost: u64, o: &MultiOutcome, sent: Instant) {
        if o.degraded.is_some() || o.answered_locally.is_some() {
            return;
        }
        if o.allowed {
            let key = entry_key(sig, cost);
            let left = o.decisions.iter().map(|d| d.remaining).min().unwrap_or(0);
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if left >= cost {
                entries.remove(&key);
            } else if let Some(d) = entries.get_mut(&key) {
                d.probing = false;
                d.until = Instant::now();
            }
            return;
        }
        let Some(d) = o.decisions.get(o.denied_by.max(1) - 1) else {
            return;
        };
        let Ok(wait) = u64::try_from(d.retry_after_ms) else {
            return; // -1: never admitted at this cost; not cached
        };
        if wait == 0 {
            return;
        }
        let until = sent + Duration::from_millis(wait);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(
            &entry_key(sig, cost),
            Denied {
                probing: false,
                sent,
                until,
                outcome: o.clone(),
            },
        );
    }

    /// When the entry of `sig` at `cost` expires (or its probe's time is up), if there is one.
    pub(crate) fn until(&self, sig: &str, cost: u64) -> Option<Instant> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get_mut(&entry_key(sig, cost)).map(|d| d.until)
    }
}

/// One entry per call: the limits' signature and the cost.
fn entry_key(sig: &str, cost: u64) -> String {
    format!("{sig}cost {cost}")
}
