//! The durable lane: connections of their own for admitting writes that must be acknowledged by
//! replicas (`WAIT n timeout` after the call). `WAIT` waits for the writes of the connection it
//! is sent on, and holds that connection until the replicas answer, so every durable call takes
//! an idle connection of the lane (or opens one) and puts it back when done: the client's shared
//! connection never waits. On a cluster the lane's connections are cluster connections of their
//! own, and `WAIT` goes to the master that holds the key's slot, the node the call went to.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::sentinel::SentinelConnection;
use crate::types::{Durability, DurabilityStats};

/// Idle connections kept for the next durable calls; more are opened under load and closed
/// when they come back to a full lane.
const IDLE_KEPT: usize = 64;

/// Where the lane opens its connections: the client's URL, the master the Sentinels name now
/// (asked again for every new connection, so the lane follows a failover too), or a cluster's
/// nodes.
#[derive(Clone)]
pub(crate) enum Origin {
    Url(redis::Client),
    Sentinel(SentinelConnection),
    Cluster(Box<ClusterClient>),
}

/// A connection of the lane: to one server, or to a cluster (routed by key, as the client's).
#[derive(Clone)]
pub(crate) enum LaneConnection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for LaneConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            LaneConnection::Single(c) => c.req_packed_command(cmd),
            LaneConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            LaneConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            LaneConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            LaneConnection::Single(c) => c.get_db(),
            LaneConnection::Cluster(c) => c.get_db(),
        }
    }
}

pub(crate) struct Lane {
    origin: Origin,
    config: AsyncConnectionConfig,
    pub(crate) durability: Durability,
    idle: Arc<Mutex<Vec<LaneConnection>>>,
    acknowledged: AtomicU64,
    short: AtomicU64,
    /// Set when the server answered that it has no `WAITAOF`: `WAIT` from then on.
    no_waitaof: AtomicBool,
}

fn lock(idle: &Mutex<Vec<LaneConnection>>) -> std::sync::MutexGuard<'_, Vec<LaneConnection>> {
    idle.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lane {
    pub(crate) fn new(origin: Origin, durability: Durability, timeout: Duration) -> Self {
        Lane {
            origin,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
            durability,
            idle: Arc::default(),
            acknowledged: AtomicU64::new(0),
            short: AtomicU64::new(0),
            no_waitaof: AtomicBool::new(false),
        }
    }

    /// An idle connection of the lane, or a new one.
    pub(crate) async fn take(&self) -> RedisResult<LaneConnection> {
        let idle = lock(&self.idle).pop();
        match idle {
            Some(c) => Ok(c),
            None => match &self.origin {
                Origin::Url(client) => client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
                    .map(LaneConnection::Single),
                Origin::Sentinel(s) => s.open_master().await.map(LaneConnection::Single),
                Origin::Cluster(client) => {
                    // Opened by a task of its own, which puts it with the idle ones: a frozen
                    // node among the seeds can hold the opening for the connection timeout,
                    // and a caller that stops waiting must not throw the work away.
                    let (client, idle) = (client.clone(), self.idle.clone());
                    let opening = tokio::spawn(async move {
                        let c = client.get_async_connection().await?;
                        lock(&idle).push(LaneConnection::Cluster(c));
                        Ok::<(), redis::RedisError>(())
                    });
                    opening.await.map_err(|e| {
                        redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "opening a cluster connection failed",
                            e.to_string(),
                        ))
                    })??;
                    lock(&self.idle).pop().ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "the new cluster connection was taken by another call",
                        ))
                    })
                }
            },
        }
    }

    /// Puts back a connection whose calls all answered (one that failed is dropped).
    pub(crate) fn put(&self, c: LaneConnection) {
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_KEPT {
            idle.push(c);
        }
    }

    /// `WAIT replicas timeout` (or `WAITAOF 0 replicas timeout`) on `c`, after its write to
    /// `key`: whether enough replicas acknowledged it (counted either way). On a cluster, to
    /// the master of `key`'s slot: if the slot moved between the write and the `WAIT`, the new
    /// master has seen no write from this connection and answers at once
    /// (docs/reliability.md).
    pub(crate) async fn acknowledged(
        &self,
        c: &mut LaneConnection,
        key: &str,
    ) -> RedisResult<bool> {
        let aof = self.durability.aof && !self.no_waitaof.load(Ordering::Relaxed);
        let acks = match self.wait(c, key, aof).await {
            // A server before WAITAOF: the write is still this connection's last, so WAIT
            // waits for it as well.
            Err(e)
                if aof && e.code() == Some("ERR") && e.to_string().contains("unknown command") =>
            {
                self.no_waitaof.store(true, Ordering::Relaxed);
                self.wait(c, key, false).await?
            }
            other => other?,
        };
        let enough = acks >= i64::from(self.durability.replicas);
        let counter = if enough {
            &self.acknowledged
        } else {
            &self.short
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(enough)
    }

    /// How many replicas acknowledged this connection's last write, by `WAIT` or `WAITAOF`.
    async fn wait(&self, c: &mut LaneConnection, key: &str, aof: bool) -> RedisResult<i64> {
        let d = &self.durability;
        let ms = u64::try_from(d.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut wait = redis::cmd(if aof { "WAITAOF" } else { "WAIT" });
        if aof {
            wait.arg(0);
        }
        wait.arg(d.replicas).arg(ms);
        let reply: Value = match c {
            LaneConnection::Single(c) => wait.query_async(c).await?,
            LaneConnection::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.route_command(wait, routing).await?
            }
        };
        if aof {
            // [fsynced locally, replicas that fsynced]
            let (_, replicas): (i64, i64) = redis::from_redis_value(reply)?;
            Ok(replicas)
        } else {
            Ok(redis::from_redis_value(reply)?)
        }
    }

    pub(crate) fn stats(&self) -> DurabilityStats {
        DurabilityStats {
            acknowledged: self.acknowledged.load(Ordering::Relaxed),
            short: self.short.load(Ordering::Relaxed),
        }
    }
}
