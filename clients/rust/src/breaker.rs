//! A circuit breaker: after `failures` calls in a row that Redis did not answer, the breaker
//! opens and calls skip Redis for `cooldown`; then one trial call goes through (half open):
//! success closes it, failure opens it again.
//!
//! A failure counts only when Redis answered none of the client's calls since the failed call
//! began: a call that outlasts its deadline while Redis answers others (a burst on a busy
//! machine) was late, on a server that is there. A server that is down, frozen or too slow
//! answers no one, and `failures` calls open the breaker as ever.
//!
//! The breaker keeps when Redis last answered ([`Breaker::answer`]), the one note an answer
//! makes, which the deadlines read too ([`Breaker::last_answer`]): a call takes it when it
//! begins ([`Breaker::answered`]), and its failure counts only if it moved since
//! ([`Breaker::failure_since`]). The note moves only when it is a grain behind (1/128 of the
//! client's timeout, 1 ms at most), so that the calls of a busy client do not all write the one
//! shared word: it is never later than the last answer, and never more than a grain earlier.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failures in a row that open the breaker (at least 1): calls that Redis did not answer,
    /// while it answered none of the client's others.
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
    /// The state is `Closed { failures: 0 }`: a call is permitted, and an answer changes
    /// nothing, without the lock. Written under the lock only.
    clean: AtomicBool,
    /// When Redis last answered: nanoseconds after `epoch`, plus one (0: never), to within
    /// `grain` nanoseconds (never later).
    answered_at: AtomicU64,
    epoch: Instant,
    grain: u64,
}

/// A call on its way under the breaker, from [`Breaker::answered`]: the point it began at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Since(u64);

/// The longest a note of an answer lags behind it.
const MAX_GRAIN: Duration = Duration::from_millis(1);

impl Breaker {
    /// A breaker for calls with `timeout` (the grain of its note of answers is 1/128 of it).
    pub(crate) fn new(config: BreakerConfig, timeout: Duration) -> Breaker {
        let grain = (timeout / 128).min(MAX_GRAIN);
        Breaker {
            config,
            state: Mutex::new(State::Closed { failures: 0 }),
            clean: AtomicBool::new(true),
            answered_at: AtomicU64::new(0),
            epoch: Instant::now(),
            grain: u64::try_from(grain.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, s: &mut State, to: State) {
        self.clean.store(
            matches!(to, State::Closed { failures: 0 }),
            Ordering::Release,
        );
        *s = to;
    }

    /// Whether this call may go to Redis.
    pub(crate) fn permit(&self) -> bool {
        if self.clean.load(Ordering::Acquire) {
            return true;
        }
        let mut s = self.lock();
        match *s {
            State::Closed { .. } => true,
            State::Open { until } if Instant::now() >= until => {
                self.set(&mut s, State::HalfOpen);
                true
            }
            State::Open { .. } | State::HalfOpen => false,
        }
    }

    /// The last answer so far, for a call that begins now.
    pub(crate) fn answered(&self) -> Since {
        Since(self.answered_at.load(Ordering::Acquire))
    }

    /// Redis answered a request at `at` (a decision, or a rejection: an error about the call
    /// itself; not an error saying it cannot serve now).
    pub(crate) fn answer(&self, at: Instant) {
        let n = u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX - 1)
            + 1;
        // Written only a grain after the last note: a load of the shared word, most answers.
        let noted = self.answered_at.load(Ordering::Relaxed);
        if noted == 0 || n >= noted.saturating_add(self.grain) {
            // Sequentially consistent with `failure_since`: either that failure sees this
            // answer, or this answer sees the breaker unclean and takes the lock after it.
            self.answered_at.fetch_max(n, Ordering::SeqCst);
        }
        if self.clean.load(Ordering::SeqCst) {
            return;
        }
        let mut s = self.lock();
        self.set(&mut s, State::Closed { failures: 0 });
    }

    /// When Redis last answered (never later than the answer, at most a grain earlier).
    pub(crate) fn last_answer(&self) -> Option<Instant> {
        match self.answered_at.load(Ordering::Acquire) {
            0 => None,
            n => Some(self.epoch + Duration::from_nanos(n - 1)),
        }
    }

    /// Redis did not answer a call begun at `since`. While the breaker is closed, counted only
    /// if Redis answered no call since then; a trial call's failure (half open) opens it again.
    pub(crate) fn failure_since(&self, since: Since) {
        let mut s = self.lock();
        if let State::Closed { failures } = *s {
            self.clean.store(false, Ordering::SeqCst);
            if self.answered_at.load(Ordering::SeqCst) != since.0 {
                self.clean.store(failures == 0, Ordering::Release);
                return;
            }
        }
        let next = match *s {
            State::Closed { failures } if failures + 1 < self.config.failures.max(1) => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            _ => State::Open {
                until: Instant::now() + self.config.cooldown,
            },
        };
        self.set(&mut s, next);
    }

    /// A call that ended without telling anything about Redis (its caller dropped it): a
    /// trial call (half open) lets the next call be the trial.
    pub(crate) fn neutral(&self) {
        let mut s = self.lock();
        if matches!(*s, State::HalfOpen) {
            let now = Instant::now();
            self.set(&mut s, State::Open { until: now });
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        !matches!(*self.lock(), State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(100);

    #[test]
    fn opens_after_failures_and_half_opens_after_cooldown() {
        let b = Breaker::new(
            BreakerConfig {
                failures: 2,
                cooldown: Duration::from_millis(50),
            },
            TIMEOUT,
        );
        assert!(b.permit());
        b.failure_since(b.answered());
        assert!(!b.is_open());
        assert!(b.permit());
        b.failure_since(b.answered());
        assert!(b.is_open());
        assert!(!b.permit());
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.permit(), "one trial after the cooldown");
        assert!(!b.permit(), "only one trial at a time");
        b.failure_since(b.answered());
        assert!(!b.permit());
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.permit());
        b.answer(Instant::now());
        assert!(!b.is_open());
        assert!(b.permit());
    }

    /// Failures count only with no answer since the failed call began.
    #[test]
    fn counts_failures_with_no_answer_since() {
        let b = Breaker::new(
            BreakerConfig {
                failures: 2,
                cooldown: Duration::from_secs(3600),
            },
            TIMEOUT,
        );
        // Begun before an answer: not counted, however many.
        let before = b.answered();
        b.answer(Instant::now());
        for _ in 0..5 {
            b.failure_since(before);
        }
        assert!(!b.is_open());
        assert!(b.permit());
        // Two calls begin, Redis answers neither: the second failure opens it.
        let (x, y) = (b.answered(), b.answered());
        b.failure_since(x);
        assert!(!b.is_open());
        b.failure_since(y);
        assert!(b.is_open());
        assert!(!b.permit());
        // Open, every failure counts (a call begun before it opened included).
        b.failure_since(before);
        assert!(b.is_open());
    }

    /// A trial call that its caller dropped lets the next call be the trial.
    #[test]
    fn a_neutral_trial_lets_the_next_call_try() {
        let b = Breaker::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_millis(20),
            },
            TIMEOUT,
        );
        b.failure_since(b.answered());
        assert!(b.is_open());
        std::thread::sleep(Duration::from_millis(30));
        assert!(b.permit());
        assert!(!b.permit());
        b.neutral();
        assert!(b.permit(), "the next call is the trial");
        assert!(!b.permit());
        b.answer(Instant::now());
        assert!(!b.is_open());
        // Closed: neutral changes nothing.
        b.neutral();
        assert!(!b.is_open());
        assert!(b.permit());
    }

    /// The note of answers moves once a grain behind, never later than an answer, and a
    /// failure counts only while it has not moved since the call began.
    #[test]
    fn answers_are_noted_to_within_a_grain() {
        let b = Breaker::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_secs(3600),
            },
            Duration::from_millis(1280),
        );
        assert_eq!(b.grain, 1_000_000, "1 ms at most");
        assert_eq!(
            Breaker::new(BreakerConfig::default(), TIMEOUT).grain,
            781_250
        );
        assert_eq!(b.last_answer(), None);
        // The first answer is noted, however soon.
        let first = b.answered();
        b.answer(b.epoch);
        assert_eq!(b.last_answer(), Some(b.epoch));
        assert_ne!(b.answered(), first);
        let t0 = b.epoch + Duration::from_millis(10);
        b.answer(t0);
        assert_eq!(b.last_answer(), Some(t0));
        let since = b.answered();
        // Within the grain: not written.
        b.answer(t0 + Duration::from_micros(999));
        assert_eq!(b.last_answer(), Some(t0));
        assert_eq!(b.answered(), since);
        // A grain later: written.
        let t1 = t0 + Duration::from_millis(1);
        b.answer(t1);
        assert_eq!(b.last_answer(), Some(t1));
        // Never moved back by an answer noted late.
        b.answer(t0 + Duration::from_millis(5));
        b.answer(t0 + Duration::from_millis(2));
        assert_eq!(b.last_answer(), Some(t0 + Duration::from_millis(5)));
        // A failure of the call begun at `since`: answers came since, not counted.
        b.failure_since(since);
        assert!(!b.is_open());
        // One begun now with no answer after: counted (1 failure opens this breaker).
        b.failure_since(b.answered());
        assert!(b.is_open());
    }
}
