//! Per-command counters for the module's INFO section.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::Reply;
use crate::error::ErrorReply;

#[derive(Debug, Default)]
pub struct CommandStats {
    pub calls: AtomicU64,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub errors: AtomicU64,
}

/// Adds one. Redis runs commands one at a time (module threads only with the global lock), so a
/// plain load and store is enough and avoids a locked read-modify-write on the hot path.
fn bump(counter: &AtomicU64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

impl CommandStats {
    pub const fn new() -> Self {
        Self {
            calls: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    pub fn record(&self, outcome: &Result<Reply, ErrorReply>) {
        self.record_decision(outcome.as_ref().map(|r| r.allowed).ok());
    }

    /// `Some(allowed)` for a decision, `None` for an error reply.
    pub fn record_decision(&self, allowed: Option<bool>) {
        bump(&self.calls);
        match allowed {
            Some(true) => bump(&self.allowed),
            Some(false) => bump(&self.denied),
            None => bump(&self.errors),
        }
    }

    /// `[calls, allowed, denied, errors]`.
    pub fn snapshot(&self) -> [(&'static str, u64); 4] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("calls", get(&self.calls)),
            ("allowed", get(&self.allowed)),
            ("denied", get(&self.denied)),
            ("errors", get(&self.errors)),
        ]
    }
}
