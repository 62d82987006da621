//! The durable lane: connections of their own for admitting writes that must be acknowledged by
//! replicas (`WAIT n timeout` after the call). `WAIT` waits for the writes of the connection it
//! is sent on, and holds that connection until the replicas answer, so every durable call takes
//! an idle connection of the lane (or opens one) and puts it back when done: the client's shared
//! connection never waits.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};

use crate::sentinel::SentinelConnection;
use crate::types::{Durability, DurabilityStats};

/// Idle connections kept for the next durable calls; more are opened under load and closed
/// when they come back to a full lane.
const IDLE_KEPT: usize = 64;

/// Where the lane opens its connections: the client's URL, or the master the Sentinels name
/// now (asked again for every new connection, so the lane follows a failover too).
#[derive(Clone)]
pub(crate) enum Origin {
    Url(redis::Client),
    Sentinel(SentinelConnection),
}

pub(crate) struct Lane {
    origin: Origin,
    config: AsyncConnectionConfig,
    pub(crate) durability: Durability,
    idle: Mutex<Vec<MultiplexedConnection>>,
    acknowledged: AtomicU64,
    short: AtomicU64,
}

impl Lane {
    pub(crate) fn new(origin: Origin, durability: Durability, timeout: Duration) -> Self {
        Lane {
            origin,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
            durability,
            idle: Mutex::new(Vec::new()),
            acknowledged: AtomicU64::new(0),
            short: AtomicU64::new(0),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<MultiplexedConnection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection of the lane, or a new one.
    pub(crate) async fn take(&self) -> RedisResult<MultiplexedConnection> {
        let idle = self.idle().pop();
        match idle {
            Some(c) => Ok(c),
            None => match &self.origin {
                Origin::Url(client) => {
                    client
                        .get_multiplexed_async_connection_with_config(&self.config)
                        .await
                }
                Origin::Sentinel(s) => s.open_master().await,
            },
        }
    }

    /// Puts back a connection whose calls all answered (one that failed is dropped).
    pub(crate) fn put(&self, c: MultiplexedConnection) {
        let mut idle = self.idle();
        if idle.len() < IDLE_KEPT {
            idle.push(c);
        }
    }

    /// `WAIT replicas timeout` on `c`, after its write: whether enough replicas acknowledged it
    /// (counted either way).
    pub(crate) async fn acknowledged(&self, c: &mut MultiplexedConnection) -> RedisResult<bool> {
        let d = &self.durability;
        let ms = u64::try_from(d.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let acks: i64 = redis::cmd("WAIT")
            .arg(d.replicas)
            .arg(ms)
            .query_async(c)
            .await?;
        let enough = acks >= i64::from(d.replicas);
        let counter = if enough {
            &self.acknowledged
        } else {
            &self.short
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(enough)
    }

    pub(crate) fn stats(&self) -> DurabilityStats {
        DurabilityStats {
            acknowledged: self.acknowledged.load(Ordering::Relaxed),
            short: self.short.load(Ordering::Relaxed),
        }
    }
}
