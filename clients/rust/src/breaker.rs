//! A circuit breaker: after `failures` consecutive failures the breaker opens and calls skip
//! Redis for `cooldown`; then one trial call goes through (half open): success closes it, failure
//! opens it again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub failures: u32,
    /// How long calls skip Redis once open.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(1),
        }
    }
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// Whether this call may go to Redis.
    pub(crate) fn permit(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *s {
            State::Closed { .. } => true,
            State::Open { until } if Instant::now() >= until => {
                *s = State::HalfOpen;
                true
            }
            State::Open { .. } | State::HalfOpen => false,
        }
    }

    pub(crate) fn success(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Closed { failures: 0 };
    }

    pub(crate) fn failure(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let open = State::Open {
            until: Instant::now() + self.config.cooldown,
        };
        *s = match *s {
            State::Closed { failures } if failures + 1 < self.config.failures.max(1) => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            _ => open,
        };
    }

    pub(crate) fn is_open(&self) -> bool {
        !matches!(
            *self.state.lock().unwrap_or_else(|e| e.into_inner()),
            State::Closed { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_and_half_opens_after_cooldown() {
        let b = Breaker::new(BreakerConfig {
            failures: 2,
            cooldown: Duration::from_millis(50),
        });
        assert!(b.permit());
        b.failure();
        assert!(!b.is_open());
        assert!(b.permit());
        b.failure();
        assert!(b.is_open());
        assert!(!b.permit());
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.permit(), "one trial after the cooldown");
        assert!(!b.permit(), "only one trial at a time");
        b.failure();
        assert!(!b.permit());
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.permit());
        b.success();
        assert!(!b.is_open());
        assert!(b.permit());
    }
}
