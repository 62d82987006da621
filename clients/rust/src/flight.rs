//! One attempt at a time at a step every call needs before its own command (the client's
//! start-up: connecting and detecting the mode; a script's `SCRIPT LOAD`): the first caller makes
//! it, and the callers that come while it runs wait for its end and take its result, however
//! many they are.

use std::sync::Mutex;

use redis::RedisError;

#[derive(Default)]
pub(crate) struct Flight {
    /// Held by the caller making the attempt; the others queue on it.
    turn: tokio::sync::Mutex<()>,
    /// Attempts that ended so far, and the error of the latest if it failed.
    ended: Mutex<(u64, Option<RedisError>)>,
}

impl Flight {
    fn ended(&self) -> (u64, Option<RedisError>) {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `done()`'s value, or else `step`'s, run by one caller at a time. A caller that waited
    /// behind an attempt that failed gets that attempt's error without trying again: a server
    /// that does not answer costs every waiter the one attempt, not one attempt per caller before
    /// it. An attempt whose caller went away (its future dropped) ended nothing: the next caller
    /// in the queue makes its own.
    pub(crate) async fn run<T>(
        &self,
        done: impl Fn() -> Option<T>,
        step: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, RedisError> {
        if let Some(v) = done() {
            return Ok(v);
        }
        let seen = self.ended().0;
        let _turn = self.turn.lock().await;
        if let Some(v) = done() {
            return Ok(v);
        }
        let (n, latest) = self.ended();
        if n != seen
            && let Some(e) = latest
        {
            return Err(e);
        }
        let got = step.await;
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) =
            (n + 1, got.as_ref().err().cloned());
        got
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    fn failed() -> RedisError {
        RedisError::from((redis::ErrorKind::Io, "no answer"))
    }

    #[tokio::test]
    async fn the_waiters_take_the_one_attempts_result() {
        let flight = Arc::new(Flight::default());
        let done = Arc::new(AtomicU32::new(0));
        let attempts = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (flight, done, attempts) = (flight.clone(), done.clone(), attempts.clone());
            tasks.push(tokio::spawn(async move {
                let check = || (done.load(Ordering::SeqCst) > 0).then_some(7);
                flight
                    .run(check, async {
                        attempts.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        done.store(1, Ordering::SeqCst);
                        Ok(7)
                    })
                    .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), 7);
        }
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_attempt_fails_its_waiters_and_the_next_caller_tries_again() {
        let flight = Arc::new(Flight::default());
        let attempts = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (flight, attempts) = (flight.clone(), attempts.clone());
            tasks.push(tokio::spawn(async move {
                flight
                    .run(|| None::<u8>, async {
                        attempts.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Err::<u8, _>(failed())
                    })
                    .await
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap().is_err());
        }
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        // A caller after the failure makes an attempt of its own.
        let again = flight
            .run(|| None, async {
                attempts.fetch_add(1, Ordering::SeqCst);
                Ok(1)
            })
            .await;
        assert_eq!(again.unwrap(), 1);
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_abandoned_attempt_is_made_again_by_the_next_waiter() {
        let flight = Arc::new(Flight::default());
        let first = {
            let flight = flight.clone();
            tokio::spawn(async move {
                flight
                    .run(|| None::<u8>, async {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        Ok(1)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = {
            let flight = flight.clone();
            tokio::spawn(async move { flight.run(|| None, async { Ok(2) }).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.abort();
        assert_eq!(second.await.unwrap().unwrap(), 2);
    }
}
