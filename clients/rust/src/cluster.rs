//! A connection to a Redis Cluster that follows a failover the slot map alone would miss.
//!
//! Commands are routed by slot by redis-rs's cluster connection, which follows `MOVED`, `ASK`
//! and `READONLY` by itself, and reconnects to a node whose connection dropped. A master that
//! is frozen (stopped, or cut off without the connection closing) answers nothing, so no
//! redirection ever comes: each command to it times out, and the slot map that still names it
//! is never read again. Here a command that fails without an answer from Redis (an I/O error, a
//! timeout, or no answer before the caller gave up) drops the cluster connection, and a new one
//! is opened in the background, which reads the slots from the nodes again and so reaches the
//! replica that took over. The commands meanwhile fail at once (as they would have timed out),
//! so the client's failure policy answers them; none is sent twice.

use std::sync::{Arc, Mutex, MutexGuard};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

/// A Redis Cluster connection that reads the slots again after a command got no answer (see
/// [`crate::Client::cluster`]). Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct FollowingClusterConnection {
    shared: Arc<Shared>,
}

struct Shared {
    client: ClusterClient,
    current: Mutex<Current>,
}

struct Current {
    /// Counts the connections opened: a failure drops only the one it met.
    generation: u64,
    conn: Option<ClusterConnection>,
    /// Whether a new connection is being opened.
    opening: bool,
}

impl std::fmt::Debug for FollowingClusterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowingClusterConnection").finish()
    }
}

/// Whether an error came without an answer from Redis.
fn unanswered(e: &RedisError) -> bool {
    e.code().is_none()
}

/// Drops the connection of `generation` unless disarmed, and opens a new one: when the command
/// fails without an answer, or when the caller stops waiting for it.
struct Watch<'a> {
    shared: &'a Arc<Shared>,
    generation: u64,
    armed: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut cur = self.shared.current();
            if cur.generation == self.generation {
                cur.conn = None;
                reopen(self.shared, &mut cur);
            }
        }
    }
}

/// Opens a new connection in the background, unless one is being opened (or there is no
/// runtime to open it on: the next command does).
fn reopen(shared: &Arc<Shared>, cur: &mut Current) {
    if cur.opening {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    cur.opening = true;
    let shared = shared.clone();
    runtime.spawn(async move {
        let opened = shared.client.get_async_connection().await;
        let mut cur = shared.current();
        cur.opening = false;
        if let Ok(c) = opened {
            cur.generation += 1;
            cur.conn = Some(c);
        }
    });
}

impl Shared {
    fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl FollowingClusterConnection {
    /// Connects to the cluster now (the slots read from `client`'s nodes).
    pub async fn new(client: ClusterClient) -> redis::RedisResult<Self> {
        let conn = client.get_async_connection().await?;
        Ok(FollowingClusterConnection {
            shared: Arc::new(Shared {
                client,
                current: Mutex::new(Current {
                    generation: 1,
                    conn: Some(conn),
                    opening: false,
                }),
            }),
        })
    }

    /// The current connection and a watch on it; without one (the last failed to open), opens
    /// one in the background (a frozen node among the seeds can hold that for the connection
    /// timeout) and fails.
    fn connection(&self) -> redis::RedisResult<(Watch<'_>, ClusterConnection)> {
        let mut cur = self.shared.current();
        if let Some(c) = &cur.conn {
            let watch = Watch {
                shared: &self.shared,
                generation: cur.generation,
                armed: true,
            };
            return Ok((watch, c.clone()));
        }
        reopen(&self.shared, &mut cur);
        Err(RedisError::from((
            ErrorKind::Io,
            "reconnecting to the cluster (reading its slots again)",
        )))
    }
}

impl ConnectionLike for FollowingClusterConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut watch, mut c) = self.connection()?;
            let reply = c.req_packed_command(cmd).await;
            watch.armed = reply.as_ref().is_err_and(unanswered);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut watch, mut c) = self.connection()?;
            let reply = c.req_packed_commands(pipeline, offset, count).await;
            watch.armed = reply.as_ref().is_err_and(unanswered);
            reply
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
