//! The connection side: module detection, the Lua fallback, timeouts, the failure policy and the
//! circuit breaker.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use crate::algorithm::{Algorithm, Concurrency};
use crate::breaker::Breaker;
use crate::local::{LocalLeases, LocalLimiter};
use crate::types::{
    Decision, Degraded, Error, FailurePolicy, Mode, ModeChoice, MultiOutcome, Options, Outcome,
    Settlement, TopEntry,
};

/// The Functions library's name (`#!lua name=ratelimit`).
const LIBRARY: &str = "ratelimit";

/// A command's function in the library: `RL.TOKENBUCKET` is `rl_tokenbucket`.
fn function_name(command: &str) -> String {
    command.to_ascii_lowercase().replace('.', "_")
}

const MODE_UNKNOWN: u8 = 0;
const MODE_MODULE: u8 = 1;
const MODE_SCRIPT: u8 = 2;
const MODE_FUNCTION: u8 = 3;

static ALL_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua-reference/all.lua")));
static RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua-reference/release.lua")));
static SETTLE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua-reference/settle.lua")));
static SCRIPTS: LazyLock<Vec<(&'static str, Script)>> = LazyLock::new(|| {
    [
        Algorithm::TokenBucket {
            capacity: 1,
            refill_per_sec: 1.0,
        },
        Algorithm::LeakyBucket {
            capacity: 1,
            leak_per_sec: 1.0,
        },
        Algorithm::FixedWindow {
            limit: 1,
            window_sec: 1.0,
        },
        Algorithm::SlidingWindow {
            limit: 1,
            window_sec: 1.0,
        },
        Algorithm::SlidingLog {
            limit: 1,
            window_sec: 1.0,
        },
        Algorithm::Gcra {
            max_burst: 1,
            count_per_period: 1,
            period_sec: 1.0,
        },
        Algorithm::Concurrency(Concurrency {
            limit: 1,
            lease_sec: 1.0,
        }),
    ]
    .iter()
    .map(|a| (a.command(), Script::new(a.script())))
    .collect()
});

fn script_for(algo: &Algorithm) -> &'static Script {
    let name = algo.command();
    &SCRIPTS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a script per algorithm")
        .1
}

struct Inner {
    options: Options,
    mode: AtomicU8,
    breaker: Breaker,
    local: LocalLimiter,
    leases: LocalLeases,
}

/// A lease id unique to this call: a random per-process prefix (seeded by the standard
/// library's hasher keys, the time and the process id), then a counter.
pub(crate) fn new_lease_id() -> String {
    static PREFIX: LazyLock<u64> = LazyLock::new(|| {
        let mut h = RandomState::new().build_hasher();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.finish()
    });
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}-{:x}-{n:x}", *PREFIX, std::process::id())
}

/// A connection to Redis (or Redis Cluster) that decides with the module or the scripts.
///
/// `C` is any async redis connection: [`redis::aio::ConnectionManager`] (what
/// [`Client::connect`] makes), a multiplexed connection, or
/// [`redis::cluster_async::ClusterConnection`] (keys are routed by slot; several keys in one
/// call need a common hash tag). Cloning is cheap and shares the breaker and mode.
#[derive(Clone)]
pub struct Client<C> {
    conn: C,
    inner: Arc<Inner>,
}

impl Client<redis::aio::ConnectionManager> {
    /// A client for `url` (`redis://host:port`, `redis+unix:///path`). Connects lazily, so a
    /// server that is down at start is handled by the failure policy, and reconnects by itself.
    pub fn connect(url: &str, options: Options) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(Error::Config)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_number_of_retries(0);
        let conn = client
            .get_connection_manager_lazy(config)
            .map_err(Error::Config)?;
        Ok(Client::new(conn, options))
    }

    /// [`Client::connect`], then detects the mode at once (within the timeout). If Redis is
    /// unreachable now, the mode is detected on the first call that reaches it.
    pub async fn open(url: &str, options: Options) -> Result<Self, Error> {
        let client = Client::connect(url, options)?;
        client.detect().await;
        Ok(client)
    }
}

fn is_unavailable(e: &RedisError) -> bool {
    // An answer, returned to the caller as it is: an error about the call itself (ERR ...,
    // WRONGTYPE, CROSSSLOT), or a refusal that asking again cannot fix and that failing open
    // would hide: the user may not run the command (NOPERM) or is not authenticated (NOAUTH,
    // WRONGPASS), the server is full (OOM), the address is a replica (READONLY, as after a
    // failover that moved the master elsewhere). Anything else (I/O, timeouts, LOADING,
    // CLUSTERDOWN, MASTERDOWN, TRYAGAIN...) means Redis could not decide.
    !matches!(
        e.code(),
        Some(
            "ERR"
                | "WRONGTYPE"
                | "CROSSSLOT"
                | "NOPERM"
                | "NOAUTH"
                | "WRONGPASS"
                | "OOM"
                | "READONLY"
        )
    )
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn decision(v: &Value) -> Option<Decision> {
    let Value::Array(items) = v else {
        return None;
    };
    if items.len() != 5 {
        return None;
    }
    Some(Decision {
        allowed: int(&items[0])? == 1,
        remaining: u64::try_from(int(&items[1])?).ok()?,
        retry_after_ms: int(&items[2])?,
        reset_after_ms: u64::try_from(int(&items[3])?).ok()?,
        limit: u64::try_from(int(&items[4])?).ok()?,
    })
}

fn multi(v: &Value, n: usize) -> Option<(bool, usize, Vec<Decision>)> {
    let Value::Array(items) = v else {
        return None;
    };
    if items.len() != n + 2 {
        return None;
    }
    let decisions = items[2..]
        .iter()
        .map(decision)
        .collect::<Option<Vec<_>>>()?;
    Some((
        int(&items[0])? == 1,
        usize::try_from(int(&items[1])?).ok()?,
        decisions,
    ))
}

fn decisions(v: &Value, n: usize) -> Option<Vec<Decision>> {
    let Value::Array(items) = v else {
        return None;
    };
    if items.len() != n {
        return None;
    }
    items.iter().map(decision).collect()
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn top_entries(v: &Value) -> Option<Vec<TopEntry>> {
    let Value::Array(items) = v else {
        return None;
    };
    items
        .iter()
        .map(|e| match e {
            Value::Array(f) if f.len() == 6 => Some(TopEntry {
                key: text(&f[0])?,
                denied: u64::try_from(int(&f[1])?).ok()?,
                error: u64::try_from(int(&f[2])?).ok()?,
                command: text(&f[3])?,
                first_denied_ms: int(&f[4])?,
                last_denied_ms: int(&f[5])?,
            }),
            _ => None,
        })
        .collect()
}

fn unexpected(v: &Value) -> RedisError {
    RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{v:?}"),
    ))
}

enum Failure {
    Rejected(String),
    Unavailable,
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub fn new(conn: C, options: Options) -> Self {
        let mode = match options.mode {
            ModeChoice::Auto => MODE_UNKNOWN,
            ModeChoice::Module => MODE_MODULE,
            ModeChoice::Script => MODE_SCRIPT,
            ModeChoice::Function => MODE_FUNCTION,
        };
        Client {
            conn,
            inner: Arc::new(Inner {
                options,
                mode: AtomicU8::new(mode),
                breaker: Breaker::new(options.breaker),
                local: LocalLimiter::default(),
                leases: LocalLeases::default(),
            }),
        }
    }

    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// The mode in use, once known (after the first call that reached Redis in `Auto`).
    pub fn mode(&self) -> Option<Mode> {
        match self.inner.mode.load(Ordering::Relaxed) {
            MODE_MODULE => Some(Mode::Module),
            MODE_SCRIPT => Some(Mode::Script),
            MODE_FUNCTION => Some(Mode::Function),
            _ => None,
        }
    }

    /// Whether the circuit breaker is open (or half open).
    pub fn breaker_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Detects the mode now if not known yet (within the timeout). `None` if Redis is unreachable.
    pub async fn detect(&self) -> Option<Mode> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(self.inner.options.timeout, self.resolve_mode(&mut conn))
            .await
            .ok()?
            .ok()
    }

    async fn resolve_mode(&self, conn: &mut C) -> Result<Mode, RedisError> {
        if let Some(m) = self.mode() {
            return Ok(m);
        }
        let info: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("rl.all")
            .query_async(conn)
            .await?;
        let loaded = match &info {
            Value::Array(items) => matches!(items.first(), Some(v) if *v != Value::Nil),
            other => return Err(unexpected(other)),
        };
        let (code, mode) = if loaded {
            (MODE_MODULE, Mode::Module)
        } else if self.has_library(conn).await? {
            (MODE_FUNCTION, Mode::Function)
        } else {
            (MODE_SCRIPT, Mode::Script)
        };
        self.inner.mode.store(code, Ordering::Relaxed);
        Ok(mode)
    }

    /// Whether the `ratelimit` Functions library is loaded. A server that refuses to say (an
    /// error reply, such as `NOPERM` for `FUNCTION`) is taken to have none: the scripts decide
    /// alike.
    async fn has_library(&self, conn: &mut C) -> Result<bool, RedisError> {
        let listed: Result<Value, RedisError> = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(LIBRARY)
            .query_async(conn)
            .await;
        match listed {
            Ok(Value::Array(libraries)) => Ok(!libraries.is_empty()),
            Ok(other) => Err(unexpected(&other)),
            Err(e) if e.code().is_some() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One limit's command: the parameters, then the cost, or for a concurrency limit the
    /// lease id (`RL.ACQUIRE` takes no cost).
    async fn call_one(
        &self,
        key: &str,
        algo: &Algorithm,
        cost: u64,
        lease: Option<&str>,
    ) -> Result<(Decision, Mode), RedisError> {
        let mut conn = self.conn.clone();
        let mode = self.resolve_mode(&mut conn).await?;
        let mut args = algo.params();
        match (algo, lease) {
            (Algorithm::Concurrency(_), Some(id)) => args.push(id.to_string()),
            _ => args.push(cost.to_string()),
        }
        let reply: Value = match mode {
            Mode::Module => {
                redis::cmd(algo.command())
                    .arg(key)
                    .arg(&args)
                    .query_async(&mut conn)
                    .await?
            }
            Mode::Script => {
                script_for(algo)
                    .key(key)
                    .arg(&args)
                    .invoke_async(&mut conn)
                    .await?
            }
            Mode::Function => {
                redis::cmd("FCALL")
                    .arg(function_name(algo.command()))
                    .arg(1)
                    .arg(key)
                    .arg(&args)
                    .query_async(&mut conn)
                    .await?
            }
        };
        Ok((decision(&reply).ok_or_else(|| unexpected(&reply))?, mode))
    }

    /// `RL.RELEASE key lease_id` (or its twins): 1 if a live lease was released.
    async fn call_release(&self, key: &str, id: &str) -> Result<i64, RedisError> {
        let mut conn = self.conn.clone();
        let mode = self.resolve_mode(&mut conn).await?;
        let reply: Value = match mode {
            Mode::Module => {
                redis::cmd("RL.RELEASE")
                    .arg(key)
                    .arg(id)
                    .query_async(&mut conn)
                    .await?
            }
            Mode::Script => {
                RELEASE_SCRIPT
                    .key(key)
                    .arg(id)
                    .invoke_async(&mut conn)
                    .await?
            }
            Mode::Function => {
                redis::cmd("FCALL")
                    .arg(function_name("RL.RELEASE"))
                    .arg(1)
                    .arg(key)
                    .arg(id)
                    .query_async(&mut conn)
                    .await?
            }
        };
        int(&reply).ok_or_else(|| unexpected(&reply))
    }

    async fn call_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
        lease: Option<&str>,
    ) -> Result<((bool, usize, Vec<Decision>), Mode), RedisError> {
        let mut conn = self.conn.clone();
        let mode = self.resolve_mode(&mut conn).await?;
        let mut args: Vec<String> = Vec::new();
        for (_, algo) in limits {
            args.push(algo.keyword().to_string());
            args.extend(algo.params());
        }
        if let Some(id) = lease {
            args.push("LEASE".into());
            args.push(id.to_string());
        }
        args.push("COST".into());
        args.push(cost.to_string());
        let keys: Vec<&str> = limits.iter().map(|(k, _)| k.as_str()).collect();
        let reply: Value = match mode {
            Mode::Module => {
                redis::cmd("RL.ALL")
                    .arg(keys.len())
                    .arg(&keys)
                    .arg(&args)
                    .query_async(&mut conn)
                    .await?
            }
            Mode::Script => {
                let mut inv = ALL_SCRIPT.prepare_invoke();
                for k in &keys {
                    inv.key(*k);
                }
                for a in &args {
                    inv.arg(a);
                }
                inv.invoke_async(&mut conn).await?
            }
            Mode::Function => {
                redis::cmd("FCALL")
                    .arg(function_name("RL.ALL"))
                    .arg(keys.len())
                    .arg(&keys)
                    .arg(&args)
                    .query_async(&mut conn)
                    .await?
            }
        };
        Ok((
            multi(&reply, limits.len()).ok_or_else(|| unexpected(&reply))?,
            mode,
        ))
    }

    /// `RL.SETTLE numkeys key... ALGORITHM params... DELTA delta` (or its twins).
    async fn call_settle(
        &self,
        limits: &[(String, Algorithm)],
        delta: i64,
    ) -> Result<(Vec<Decision>, Mode), RedisError> {
        let mut conn = self.conn.clone();
        let mode = self.resolve_mode(&mut conn).await?;
        let mut args: Vec<String> = Vec::new();
        for (_, algo) in limits {
            args.push(algo.keyword().to_string());
            args.extend(algo.params());
        }
        args.push("DELTA".into());
        args.push(delta.to_string());
        let keys: Vec<&str> = limits.iter().map(|(k, _)| k.as_str()).collect();
        let reply: Value = match mode {
            Mode::Module => {
                redis::cmd("RL.SETTLE")
                    .arg(keys.len())
                    .arg(&keys)
                    .arg(&args)
                    .query_async(&mut conn)
                    .await?
            }
            Mode::Script => {
                let mut inv = SETTLE_SCRIPT.prepare_invoke();
                for k in &keys {
                    inv.key(*k);
                }
                for a in &args {
                    inv.arg(a);
                }
                inv.invoke_async(&mut conn).await?
            }
            Mode::Function => {
                redis::cmd("FCALL")
                    .arg(function_name("RL.SETTLE"))
                    .arg(keys.len())
                    .arg(&keys)
                    .arg(&args)
                    .query_async(&mut conn)
                    .await?
            }
        };
        Ok((
            decisions(&reply, limits.len()).ok_or_else(|| unexpected(&reply))?,
            mode,
        ))
    }

    /// Runs `fut` under the timeout and the breaker.
    async fn guarded<T>(
        &self,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, Failure> {
        if !self.inner.breaker.permit() {
            return Err(Failure::Unavailable);
        }
        match tokio::time::timeout(self.inner.options.timeout, fut).await {
            Ok(Ok(v)) => {
                self.inner.breaker.success();
                Ok(v)
            }
            Ok(Err(e)) if !is_unavailable(&e) => {
                self.inner.breaker.success();
                if e.code() == Some("READONLY") {
                    self.reconnect().await;
                }
                Err(Failure::Rejected(match (e.code(), e.detail()) {
                    (Some(code), Some(detail)) => format!("{code} {detail}"),
                    _ => e.to_string(),
                }))
            }
            Ok(Err(_)) | Err(_) => {
                self.inner.breaker.failure();
                Err(Failure::Unavailable)
            }
        }
    }

    /// The address answered as a replica (`READONLY`: a failover moved the master). Closes this
    /// connection (`QUIT`), so that the next call connects anew to whatever the address names
    /// then. `Client::connect`'s connection reconnects when a command finds it closed: the `PING`
    /// after the `QUIT` is that command, so the next call waits for the new connection instead
    /// of failing on the old one.
    async fn reconnect(&self) {
        let mut conn = self.conn.clone();
        let (quit, ping) = (redis::cmd("QUIT"), redis::cmd("PING"));
        let timeout = self.inner.options.timeout;
        let _ = tokio::time::timeout(timeout, quit.query_async::<()>(&mut conn)).await;
        let _ = tokio::time::timeout(timeout, ping.query_async::<()>(&mut conn)).await;
    }

    fn degraded_one(
        &self,
        key: &str,
        algo: &Algorithm,
        cost: u64,
        lease: Option<&str>,
    ) -> (Decision, Degraded) {
        let o = &self.inner.options;
        match o.policy {
            FailurePolicy::FailOpen => (
                Decision {
                    allowed: true,
                    remaining: algo.limit(),
                    retry_after_ms: 0,
                    reset_after_ms: 0,
                    limit: algo.limit(),
                },
                Degraded::FailOpen,
            ),
            FailurePolicy::FailClosed => (
                Decision {
                    allowed: false,
                    remaining: 0,
                    retry_after_ms: o.fail_closed_retry_ms as i64,
                    reset_after_ms: o.fail_closed_retry_ms,
                    limit: algo.limit(),
                },
                Degraded::FailClosed,
            ),
            FailurePolicy::Local { instances } => match algo {
                Algorithm::Concurrency(c) => (
                    self.inner.leases.acquire(
                        key,
                        lease.unwrap_or_default(),
                        c,
                        instances,
                        cost > 0,
                    ),
                    Degraded::Local,
                ),
                _ => (
                    self.inner.local.check(key, algo, instances, cost),
                    Degraded::Local,
                ),
            },
        }
    }

    /// Checks (and on admission consumes) `cost` units of `algo` on `key`. A concurrency limit is
    /// only peeked at here (cost 0, through `RL.ALL`); its slots are taken with
    /// [`Client::acquire`] (`Error::Unsupported` for a cost above 0).
    pub async fn check(&self, key: &str, algo: &Algorithm, cost: u64) -> Result<Outcome, Error> {
        if algo.concurrency().is_none() {
            return self.decide_one(key, algo, cost, None).await;
        }
        let o = self
            .check_all(&[(key.to_string(), algo.clone())], cost)
            .await?;
        Ok(Outcome {
            decision: o.decisions[0],
            degraded: o.degraded,
            mode: o.mode,
        })
    }

    /// One limit: Redis, or the failure policy when Redis cannot answer. `lease` is the lease id
    /// of a concurrency limit.
    pub(crate) async fn decide_one(
        &self,
        key: &str,
        algo: &Algorithm,
        cost: u64,
        lease: Option<&str>,
    ) -> Result<Outcome, Error> {
        match self.guarded(self.call_one(key, algo, cost, lease)).await {
            Ok((decision, mode)) => Ok(Outcome {
                decision,
                degraded: None,
                mode: Some(mode),
            }),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => {
                let (decision, degraded) = self.degraded_one(key, algo, cost, lease);
                Ok(Outcome {
                    decision,
                    degraded: Some(degraded),
                    mode: None,
                })
            }
        }
    }

    /// Checks several limits at once: admitted only if every limit admits, and then `cost` is
    /// consumed from all of them (`RL.ALL`, or `all.lua`). One limit alone uses its own command.
    /// Concurrency limits are only peeked at here (cost 0); their slots are taken with
    /// [`Client::acquire_all`] (`Error::Unsupported` for a cost above 0).
    pub async fn check_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
    ) -> Result<MultiOutcome, Error> {
        if !limits.iter().any(|(_, a)| a.concurrency().is_some()) {
            return self.decide_all(limits, cost, None).await;
        }
        if cost > 0 {
            return Err(Error::Unsupported(
                "concurrency limits take a lease: Client::acquire_all",
            ));
        }
        self.decide_all(limits, 0, Some(&new_lease_id())).await
    }

    /// Several limits in one call (one alone with its own command, except a concurrency limit
    /// peeked at with cost 0, which only `RL.ALL` can do).
    pub(crate) async fn decide_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
        lease: Option<&str>,
    ) -> Result<MultiOutcome, Error> {
        if let [(key, algo)] = limits
            && (cost > 0 || algo.concurrency().is_none())
        {
            let o = self.decide_one(key, algo, cost, lease).await?;
            return Ok(MultiOutcome {
                allowed: o.decision.allowed,
                denied_by: usize::from(!o.decision.allowed),
                decisions: vec![o.decision],
                degraded: o.degraded,
                mode: o.mode,
            });
        }
        if limits.is_empty() || limits.len() > 16 {
            return Err(Error::Unsupported("between 1 and 16 limits per call"));
        }
        match self.guarded(self.call_all(limits, cost, lease)).await {
            Ok(((allowed, denied_by, decisions), mode)) => Ok(MultiOutcome {
                allowed,
                denied_by,
                decisions,
                degraded: None,
                mode: Some(mode),
            }),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => Ok(self.degraded_all(limits, cost, lease)),
        }
    }

    fn degraded_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
        lease: Option<&str>,
    ) -> MultiOutcome {
        let mut degraded = Degraded::FailOpen;
        // Peek first so that a denial consumes from none of the limits.
        let peeks: Vec<Decision> = limits
            .iter()
            .map(|(k, a)| {
                let (d, g) = self.degraded_one(k, a, 0, lease);
                degraded = g;
                d
            })
            .collect();
        let denier = peeks.iter().zip(limits).position(|(d, (_, a))| {
            match (degraded, a) {
                (Degraded::FailClosed, _) => true,
                // One slot whatever the cost; none taken by a peek.
                (_, Algorithm::Concurrency(_)) => cost > 0 && !d.allowed,
                _ => d.remaining < cost,
            }
        });
        let decisions = match denier {
            Some(i) => {
                let mut ds = peeks;
                ds[i] = self.degraded_one(&limits[i].0, &limits[i].1, cost, lease).0;
                ds
            }
            None => limits
                .iter()
                .map(|(k, a)| self.degraded_one(k, a, cost, lease).0)
                .collect(),
        };
        MultiOutcome {
            allowed: denier.is_none(),
            denied_by: denier.map_or(0, |i| i + 1),
            decisions,
            degraded: Some(degraded),
            mode: None,
        }
    }

    /// Gives back `id`'s slot of `key` (`RL.RELEASE`): whether a live lease was released. `false`
    /// too when Redis cannot answer (the lease then expires by itself). Idempotent.
    pub async fn release(&self, key: &str, id: &str) -> Result<bool, Error> {
        match self.guarded(self.call_release(key, id)).await {
            Ok(n) => Ok(n == 1),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => Ok(false),
        }
    }

    /// Frees `id`'s slot of `key` in the in-process semaphore of the `Local` policy.
    pub(crate) fn release_local(&self, key: &str, id: &str) -> bool {
        self.inner.leases.release(key, id)
    }

    /// Adjusts what was consumed from every limit by `delta` units in one call (`RL.SETTLE ...
    /// DELTA delta`): below 0 gives `-delta` units back (never above the limit), above 0 takes
    /// `delta` more without asking whether they are left (a limit may go into debt, and then
    /// denies until it is paid back), 0 only reports. The answer is every limit's state
    /// afterwards. When Redis cannot answer nothing is adjusted, and the decisions are those of
    /// the failure policy for a cost of 0.
    pub async fn settle(
        &self,
        limits: &[(String, Algorithm)],
        delta: i64,
    ) -> Result<Settlement, Error> {
        if limits.iter().any(|(_, a)| a.concurrency().is_some()) {
            return Err(Error::Unsupported("concurrency limits are not settled"));
        }
        if limits.is_empty() || limits.len() > 16 {
            return Err(Error::Unsupported("between 1 and 16 limits per call"));
        }
        match self.guarded(self.call_settle(limits, delta)).await {
            Ok((decisions, mode)) => Ok(Settlement {
                decisions,
                degraded: None,
                mode: Some(mode),
            }),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => {
                let mut degraded = Degraded::FailOpen;
                let decisions = limits
                    .iter()
                    .map(|(k, a)| {
                        let (d, g) = self.degraded_one(k, a, 0, None);
                        degraded = g;
                        d
                    })
                    .collect();
                Ok(Settlement {
                    decisions,
                    degraded: Some(degraded),
                    mode: None,
                })
            }
        }
    }

    /// The `count` keys with the most denials on the server, most first (`RL.TOP count`, count
    /// from 1 to 1,000), as the module counts them: every limiter command's denials, in a
    /// fixed number of slots (`ratelimit.top-slots`; 0 turns counting off and the list is
    /// empty). Only the module keeps this list: in the Script and Function modes the answer is
    /// `Error::Unsupported`. An operator's call: the command is outside the `ratelimit` ACL
    /// category, so an application's user gets `Error::Rejected` (`NOPERM`). Not covered by
    /// the failure policy: `Error::Unavailable` when Redis does not answer in time. Each
    /// server counts its own keys: on a cluster, ask every master through a client of its own.
    pub async fn top(&self, count: usize) -> Result<Vec<TopEntry>, Error> {
        self.call_top(Some(count)).await
    }

    /// Clears the list of [`Client::top`] (`RL.TOP RESET`).
    pub async fn reset_top(&self) -> Result<(), Error> {
        self.call_top(None).await.map(|_| ())
    }

    /// `RL.TOP count`, or `RL.TOP RESET` without a count, in module mode only.
    async fn call_top(&self, count: Option<usize>) -> Result<Vec<TopEntry>, Error> {
        let asked = async {
            let mut conn = self.conn.clone();
            let mode = self.resolve_mode(&mut conn).await?;
            if mode != Mode::Module {
                return Ok(None);
            }
            let mut cmd = redis::cmd("RL.TOP");
            match count {
                Some(n) => cmd.arg(n),
                None => cmd.arg("RESET"),
            };
            let reply: Value = cmd.query_async(&mut conn).await?;
            match count {
                Some(_) => top_entries(&reply)
                    .ok_or_else(|| unexpected(&reply))
                    .map(Some),
                None => Ok(Some(Vec::new())),
            }
        };
        match self.guarded(asked).await {
            Ok(Some(entries)) => Ok(entries),
            Ok(None) => Err(Error::Unsupported(
                "the most-denied keys are counted by the module only (RL.TOP)",
            )),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => Err(Error::Unavailable),
        }
    }

    /// Settles where a reservation was charged: Redis (`None`), the in-process buckets of the
    /// `Local` policy, or nowhere (admitted by `FailOpen`: the policy's answer, nothing sent).
    pub(crate) async fn settle_charged(
        &self,
        limits: &[(String, Algorithm)],
        delta: i64,
        charged: Option<Degraded>,
    ) -> Result<Settlement, Error> {
        match (charged, self.inner.options.policy) {
            (None, _) => self.settle(limits, delta).await,
            (Some(Degraded::Local), FailurePolicy::Local { instances }) => Ok(Settlement {
                decisions: limits
                    .iter()
                    .map(|(k, a)| self.inner.local.adjust(k, a, instances, delta))
                    .collect(),
                degraded: Some(Degraded::Local),
                mode: None,
            }),
            (Some(degraded), _) => Ok(Settlement {
                decisions: limits
                    .iter()
                    .map(|(k, a)| self.degraded_one(k, a, 0, None).0)
                    .collect(),
                degraded: Some(degraded),
                mode: None,
            }),
        }
    }
}

/// A [`Client`] bound to one algorithm and its parameters.
#[derive(Clone)]
pub struct Limiter<C> {
    pub(crate) client: Client<C>,
    pub(crate) algorithm: Algorithm,
}

impl Limiter<redis::aio::ConnectionManager> {
    /// A limiter on `url` (see [`Client::connect`]).
    pub fn connect(url: &str, algorithm: Algorithm, options: Options) -> Result<Self, Error> {
        Ok(Limiter::new(Client::connect(url, options)?, algorithm))
    }

    /// A limiter on `url` that detects the mode at once (see [`Client::open`]).
    pub async fn open(url: &str, algorithm: Algorithm, options: Options) -> Result<Self, Error> {
        Ok(Limiter::new(Client::open(url, options).await?, algorithm))
    }
}

impl<C> Limiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub fn new(client: Client<C>, algorithm: Algorithm) -> Self {
        Limiter { client, algorithm }
    }

    pub fn client(&self) -> &Client<C> {
        &self.client
    }

    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// One unit.
    pub async fn check(&self, key: &str) -> Result<Outcome, Error> {
        self.client.check(key, &self.algorithm, 1).await
    }

    pub async fn check_cost(&self, key: &str, cost: u64) -> Result<Outcome, Error> {
        self.client.check(key, &self.algorithm, cost).await
    }

    /// The current state, consuming nothing (cost 0).
    pub async fn peek(&self, key: &str) -> Result<Outcome, Error> {
        self.client.check(key, &self.algorithm, 0).await
    }
}
