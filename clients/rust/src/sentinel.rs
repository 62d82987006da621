//! A connection to the master that a set of Sentinels name, which follows it across failovers.
//!
//! It asks the Sentinels (`SENTINEL GET-MASTER-ADDR-BY-NAME`, each in turn) where the master is,
//! checks with `ROLE` that the address answers as a master, and sends every command there on one
//! multiplexed connection. When that connection fails (an I/O error, a timeout) or answers
//! `READONLY` (the master became a replica: a switch moved it), the connection is dropped and
//! the next command asks the Sentinels again. The command that met the failure still fails, so
//! the client's failure policy (or its `READONLY` error) answers it; no command is sent twice.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

/// A connection to the master named `master` by a set of Sentinels (see [`crate::Client::sentinel`]).
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    sentinels: Vec<redis::Client>,
    master: String,
    config: AsyncConnectionConfig,
    /// The master's connection and its generation (a failure forgets only the connection it met).
    current: tokio::sync::Mutex<(u64, Option<MultiplexedConnection>)>,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master", &self.shared.master)
            .field("sentinels", &self.shared.sentinels.len())
            .finish()
    }
}

fn unavailable(detail: String) -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "no master reachable through the Sentinels",
        detail,
    ))
}

/// Whether an error means the connection no longer reaches the master.
fn lost(e: &RedisError) -> bool {
    e.code() == Some("READONLY") || e.code().is_none()
}

impl SentinelConnection {
    /// Sentinels at `sentinels` (`redis://host:port` each), watching the master named `master`;
    /// `timeout` bounds each connection and each answer. Connects on the first command.
    pub fn new(sentinels: &[&str], master: &str, timeout: Duration) -> redis::RedisResult<Self> {
        if sentinels.is_empty() {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "no Sentinel address given",
            )));
        }
        let sentinels = sentinels
            .iter()
            .map(|url| redis::Client::open(*url))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(SentinelConnection {
            shared: Arc::new(Shared {
                sentinels,
                master: master.to_string(),
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout)),
                current: tokio::sync::Mutex::new((0, None)),
            }),
        })
    }

    /// The master's address the Sentinels name now (`host:port`), asking them in turn.
    pub async fn master_address(&self) -> redis::RedisResult<(String, u16)> {
        let mut last = String::from("no Sentinel answered");
        for s in &self.shared.sentinels {
            let answer = async {
                let mut c = s
                    .get_multiplexed_async_connection_with_config(&self.shared.config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.shared.master)
                    .query_async::<Option<(String, u16)>>(&mut c)
                    .await
            };
            match answer.await {
                Ok(Some(addr)) => return Ok(addr),
                Ok(None) => last = format!("no master named '{}'", self.shared.master),
                Err(e) => last = e.to_string(),
            }
        }
        Err(unavailable(last))
    }

    /// A new connection to the master the Sentinels name now, checked with `ROLE`.
    pub(crate) async fn open_master(&self) -> redis::RedisResult<MultiplexedConnection> {
        let (host, port) = self.master_address().await?;
        let client = redis::Client::open(format!("redis://{host}:{port}"))?;
        let mut c = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut c).await?;
        match role.first() {
            Some(Value::BulkString(r)) if r.as_slice() == b"master" => Ok(c),
            _ => Err(unavailable(format!(
                "{host}:{port}, named by the Sentinels, is not a master yet"
            ))),
        }
    }

    async fn connection(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        let mut cur = self.shared.current.lock().await;
        if let Some(c) = &cur.1 {
            return Ok((cur.0, c.clone()));
        }
        let c = self.open_master().await?;
        cur.0 += 1;
        cur.1 = Some(c.clone());
        Ok((cur.0, c))
    }

    /// Drops the connection of generation `generation` if it is still the current one.
    async fn forget(&self, generation: u64) {
        let mut cur = self.shared.current.lock().await;
        if cur.0 == generation {
            cur.1 = None;
        }
    }

    /// Drops the current connection; the next command asks the Sentinels again.
    pub async fn reset(&self) {
        self.shared.current.lock().await.1 = None;
    }
}

fn is_quit(cmd: &Cmd) -> bool {
    matches!(
        cmd.args_iter().next(),
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"QUIT")
    )
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            // The client closes a connection that answered READONLY with QUIT: here that is
            // forgetting it, so the next command asks the Sentinels.
            if is_quit(cmd) {
                self.reset().await;
                return Ok(Value::Okay);
            }
            let (generation, mut c) = self.connection().await?;
            let reply = c.req_packed_command(cmd).await;
            if let Err(e) = &reply
                && lost(e)
            {
                self.forget(generation).await;
            }
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
            let (generation, mut c) = self.connection().await?;
            let reply = c.req_packed_commands(pipeline, offset, count).await;
            let readonly = |v: &Value| matches!(v, Value::ServerError(e) if e.code() == "READONLY");
            let gone = match &reply {
                Err(e) => lost(e),
                Ok(values) => values.iter().any(readonly),
            };
            if gone {
                self.forget(generation).await;
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
