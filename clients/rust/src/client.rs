//! The connection side: module detection, the Lua fallback, timeouts, the failure policy and the
//! circuit breaker.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::Poll;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::{RedisError, Script, Value};

use crate::algorithm::{Algorithm, Concurrency};
use crate::batch::{BatchStats, Batches, Batching, Server, Step, signature};
use crate::breaker::Breaker;
use crate::cluster::FollowingClusterConnection;
use crate::deny::DenyCache;
use crate::durable::{Lane, Origin};
use crate::flight::Flight;
use crate::local::{LocalLeases, LocalLimiter};
use crate::sentinel::SentinelConnection;
use crate::types::{
    Decision, Degraded, Durability, DurabilityStats, Error, FailurePolicy, Mode, ModeChoice,
    MultiOutcome, Options, Outcome, Settlement, ShortAck, TopEntry,
};

/// The Functions library's name (`#!lua name=ratelimit`).
const LIBRARY: &str = "ratelimit";

/// The commands of the module, and their functions in the library (`RL.TOKENBUCKET` is
/// `rl_tokenbucket`).
const FUNCTIONS: [(&str, &str); 10] = [
    ("RL.TOKENBUCKET", "rl_tokenbucket"),
    ("RL.LEAKYBUCKET", "rl_leakybucket"),
    ("RL.FIXEDWINDOW", "rl_fixedwindow"),
    ("RL.SLIDINGWINDOW", "rl_slidingwindow"),
    ("RL.SLIDINGLOG", "rl_slidinglog"),
    ("RL.GCRA", "rl_gcra"),
    ("RL.ACQUIRE", "rl_acquire"),
    ("RL.RELEASE", "rl_release"),
    ("RL.ALL", "rl_all"),
    ("RL.SETTLE", "rl_settle"),
];

/// A command's function in the library: `RL.TOKENBUCKET` is `rl_tokenbucket`.
fn function_name(command: &str) -> &'static str {
    FUNCTIONS
        .iter()
        .find(|(c, _)| *c == command)
        .map_or("", |(_, f)| f)
}

/// A command of the mode in use on `keys`, before its other arguments: the module's `command`
/// (with the number of keys first when `numkeys`: `RL.ALL`, `RL.SETTLE`), or `EVALSHA` of its
/// twin `script`, or `FCALL` of its function. Sized once for a limiter's usual arguments.
fn command_for(
    mode: Mode,
    command: &'static str,
    script: impl FnOnce() -> &'static Script,
    keys: &[&str],
    numkeys: bool,
) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(8 + keys.len() * 4, 128);
    match mode {
        Mode::Module => {
            cmd.arg(command);
            if numkeys {
                cmd.arg(keys.len());
            }
        }
        Mode::Script => {
            cmd.arg("EVALSHA").arg(script().get_hash()).arg(keys.len());
        }
        Mode::Function => {
            cmd.arg("FCALL").arg(function_name(command)).arg(keys.len());
        }
    }
    cmd.arg(keys);
    cmd
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
/// One algorithm of each kind (its parameters do not matter): each has its own command and twin.
fn one_of_each() -> [Algorithm; 7] {
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
}

static SCRIPTS: LazyLock<Vec<(&'static str, Script)>> = LazyLock::new(|| {
    one_of_each()
        .iter()
        .map(|a| (a.command(), Script::new(a.script())))
        .collect()
});

fn script_for(algo: &Algorithm) -> &'static Script {
    // In the order of `SCRIPTS`.
    let i = match algo {
        Algorithm::TokenBucket { .. } => 0,
        Algorithm::LeakyBucket { .. } => 1,
        Algorithm::FixedWindow { .. } => 2,
        Algorithm::SlidingWindow { .. } => 3,
        Algorithm::SlidingLog { .. } => 4,
        Algorithm::Gcra { .. } => 5,
        Algorithm::Concurrency(_) => 6,
    };
    &SCRIPTS[i].1
}

struct Inner {
    options: Options,
    mode: AtomicU8,
    /// Whether the start-up is done: a request of this client's start-up was answered (the
    /// connection is made and the mode known).
    started: AtomicBool,
    /// The start-up, made once however many calls wait for it.
    start_up: Flight,
    /// The scripts this client loaded, by SHA1.
    scripts: Mutex<HashMap<&'static str, Arc<ScriptLoad>>>,
    /// The breaker, and when Redis last answered a request of this client.
    breaker: Breaker,
    local: LocalLimiter,
    leases: LocalLeases,
    /// Where the durable lane opens its connections ([`Client::connect`]'s URL, or
    /// [`Client::sentinel`]'s Sentinels).
    origin: Option<Origin>,
}

/// A script's loads (`SCRIPT LOAD`) by one client: one at a time, and one per `NOSCRIPT` however
/// many calls met it.
#[derive(Default)]
struct ScriptLoad {
    /// Loads this client completed.
    loads: AtomicU64,
    flight: Flight,
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
/// call need a common hash tag). Cloning is cheap and shares the breaker and mode, and the
/// batches and deny cache it has when cloned.
pub struct Client<C> {
    conn: C,
    inner: Arc<Inner>,
    batches: Option<Arc<Batches<Client<C>>>>,
    denies: Option<Arc<DenyCache>>,
    durable: Option<Arc<Lane>>,
}

impl<C: Clone> Clone for Client<C> {
    fn clone(&self) -> Self {
        Client {
            conn: self.conn.clone(),
            inner: self.inner.clone(),
            batches: self.batches.clone(),
            denies: self.denies.clone(),
            durable: self.durable.clone(),
        }
    }
}

impl Client<redis::aio::ConnectionManager> {
    /// A client for `url` (`redis://host:port`, `redis+unix:///path`). Connects lazily, so a
    /// server that is down at start is handled by the failure policy, and reconnects by itself.
    pub fn connect(url: &str, options: Options) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(Error::Config)?;
        // No response timeout of the connection's own: every request of the client has its
        // deadline ([`Client::bounded`]: time without an answer, up to 10 timeouts while Redis
        // answers others), which a second timer per request would cut short at one timeout.
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(None)
            .set_number_of_retries(0);
        let conn = client
            .get_connection_manager_lazy(config)
            .map_err(Error::Config)?;
        Ok(Client::with_origin(
            conn,
            options,
            Some(Origin::Url(client)),
        ))
    }

    /// [`Client::connect`], then detects the mode at once (within the timeout). If Redis is
    /// unreachable now, the mode is detected on the first call that reaches it.
    pub async fn open(url: &str, options: Options) -> Result<Self, Error> {
        let client = Client::connect(url, options)?;
        client.detect().await;
        Ok(client)
    }
}

impl Client<FollowingClusterConnection> {
    /// A client for the Redis Cluster whose nodes include `urls` (`redis://host:port` each):
    /// keys are routed by slot, and the routing follows `MOVED` and a failover, even of a master
    /// that froze (see [`FollowingClusterConnection`]); several keys in one call need a common
    /// hash tag. The client's timeout bounds each call; connects at once.
    pub async fn cluster(urls: &[&str], options: Options) -> Result<Self, Error> {
        let client = ClusterClient::builder(urls.iter().copied())
            .connection_timeout(options.timeout)
            .response_timeout(options.timeout)
            .build()
            .map_err(Error::Config)?;
        let conn = FollowingClusterConnection::new(client.clone())
            .await
            .map_err(Error::Config)?;
        Ok(Client::with_origin(
            conn,
            options,
            Some(Origin::Cluster(Box::new(client))),
        ))
    }
}

impl Client<SentinelConnection> {
    /// A client for the master named `master` by the Sentinels at `sentinels`
    /// (`redis://host:port` each): it follows the master across failovers, asking the Sentinels
    /// again when the connection fails or answers `READONLY` (see [`SentinelConnection`]). The
    /// call that meets the failover is answered by the failure policy (or fails with
    /// `READONLY`); the calls after it reach the new master. Connects lazily.
    pub fn sentinel(sentinels: &[&str], master: &str, options: Options) -> Result<Self, Error> {
        let conn =
            SentinelConnection::new(sentinels, master, options.timeout).map_err(Error::Config)?;
        let origin = Origin::Sentinel(conn.clone());
        Ok(Client::with_origin(conn, options, Some(origin)))
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

/// What a call takes: a cost, or a partial grant of at most `n` units (`UPTO n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    Cost(u64),
    Upto(u64),
}

impl Take {
    /// The words that end a limiter's command: the cost, or `UPTO n`.
    fn write(self, cmd: &mut redis::Cmd) {
        match self {
            Take::Cost(n) => cmd.arg(n),
            Take::Upto(n) => cmd.arg("UPTO").arg(n),
        };
    }

    /// The units at most taken.
    pub(crate) fn units(self) -> u64 {
        match self {
            Take::Cost(n) | Take::Upto(n) => n,
        }
    }
}

/// A limiter's reply: five integers, and a sixth (`granted`) for a partial grant. For a cost the
/// units taken are the cost when admitted (`cost`), else 0.
fn decision(v: &Value, take: Take) -> Option<(Decision, u64)> {
    let Value::Array(items) = v else {
        return None;
    };
    let fields = match take {
        Take::Cost(_) => 5,
        Take::Upto(_) => 6,
    };
    if items.len() != fields {
        return None;
    }
    let d = Decision {
        allowed: int(&items[0])? == 1,
        remaining: u64::try_from(int(&items[1])?).ok()?,
        retry_after_ms: int(&items[2])?,
        reset_after_ms: u64::try_from(int(&items[3])?).ok()?,
        limit: u64::try_from(int(&items[4])?).ok()?,
    };
    let granted = match take {
        Take::Cost(n) => {
            if d.allowed {
                n
            } else {
                0
            }
        }
        Take::Upto(_) => u64::try_from(int(&items[5])?).ok()?,
    };
    Some((d, granted))
}

/// `RL.ALL`'s reply: allowed, denied_by, then one reply per limit; the units granted (the same
/// in every inner reply of a partial grant).
type Multi = (bool, usize, Vec<Decision>, u64);

fn multi(v: &Value, n: usize, take: Take) -> Option<Multi> {
    let Value::Array(items) = v else {
        return None;
    };
    if items.len() != n + 2 {
        return None;
    }
    let replies = items[2..]
        .iter()
        .map(|i| decision(i, take))
        .collect::<Option<Vec<_>>>()?;
    let allowed = int(&items[0])? == 1;
    let granted = match take {
        Take::Cost(c) => {
            if allowed {
                c
            } else {
                0
            }
        }
        Take::Upto(_) => replies.first().map_or(0, |r| r.1),
    };
    Some((
        allowed,
        usize::try_from(int(&items[1])?).ok()?,
        replies.into_iter().map(|r| r.0).collect(),
        granted,
    ))
}

fn decisions(v: &Value, n: usize) -> Option<Vec<Decision>> {
    let Value::Array(items) = v else {
        return None;
    };
    if items.len() != n {
        return None;
    }
    items
        .iter()
        .map(|i| decision(i, Take::Cost(0)).map(|r| r.0))
        .collect()
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

/// The most a request waits, in timeouts, while Redis answers the client's other requests
/// ([`Client::bounded`]).
const WAIT_FACTOR: u32 = 10;

enum Failure {
    Rejected(String),
    Unavailable,
}

/// A call on its way under the breaker: dropped before [`Pending::ended`] (its caller gave up),
/// the breaker learns nothing from it ([`Breaker::neutral`]: a trial call lets the next one try).
struct Pending<'a>(Option<&'a Breaker>);

impl Pending<'_> {
    fn ended(mut self) {
        self.0 = None;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.0 {
            b.neutral();
        }
    }
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub fn new(conn: C, options: Options) -> Self {
        Client::with_origin(conn, options, None)
    }

    fn with_origin(conn: C, options: Options, origin: Option<Origin>) -> Self {
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
                started: AtomicBool::new(false),
                start_up: Flight::default(),
                scripts: Mutex::new(HashMap::new()),
                breaker: Breaker::new(options.breaker, options.timeout),
                local: LocalLimiter::default(),
                leases: LocalLeases::default(),
                origin,
            }),
            batches: None,
            denies: None,
            durable: None,
        }
    }

    /// This client without batches nor deny cache, sharing the connection, mode and breaker.
    fn plain(&self) -> Self {
        Client {
            conn: self.conn.clone(),
            inner: self.inner.clone(),
            batches: None,
            denies: None,
            durable: self.durable.clone(),
        }
    }

    /// This client (and the clones made from it afterwards) admitting only what `durability`'s
    /// replicas acknowledged: every call that may write (a cost above 0, a partial grant, a
    /// lease) runs on a connection of its own followed by `WAIT replicas timeout`, and an
    /// admission fewer replicas acknowledged in time becomes what [`ShortAck`] says. Denials
    /// are answered at once. For a client made by [`Client::connect`], [`Client::sentinel`] or
    /// [`Client::cluster`] (the lane opens its connections to the same URL, to the master the
    /// Sentinels name, or to the cluster, where `WAIT` goes to the key's master);
    /// `durability.timeout` must be below the client's timeout, which bounds the call and the
    /// `WAIT` together. See docs/reliability.md for what `WAIT`
    /// does not promise.
    pub fn with_durability(mut self, durability: Durability) -> Result<Self, Error> {
        let Some(origin) = self.inner.origin.clone() else {
            return Err(Error::Unsupported(
                "durable admissions need a client made by Client::connect, Client::sentinel or Client::cluster",
            ));
        };
        if durability.replicas == 0 {
            return Err(Error::Unsupported(
                "durable admissions need at least 1 replica",
            ));
        }
        if durability.timeout >= self.inner.options.timeout {
            return Err(Error::Unsupported(
                "the WAIT timeout must be below the client's timeout",
            ));
        }
        let timeout = self.inner.options.timeout;
        self.durable = Some(Arc::new(Lane::new(origin, durability, timeout)));
        Ok(self)
    }

    /// What the durable admissions met so far (all zero without durability).
    pub fn durability_stats(&self) -> DurabilityStats {
        self.durable
            .as_ref()
            .map_or_else(DurabilityStats::default, |l| l.stats())
    }

    /// The durable lane, for a call that may write (a cost above 0, a partial grant, a lease).
    fn lane_for(&self, take: Take, lease: Option<&str>) -> Option<&Lane> {
        let writes = take != Take::Cost(0) || lease.is_some();
        self.durable.as_deref().filter(|_| writes)
    }

    /// Whether an admission fewer replicas acknowledged is denied (`ShortAck::Deny`) rather
    /// than admitted; `Err`: the failure policy answers it.
    fn short_ack_denies(lane: &Lane) -> Result<bool, RedisError> {
        match lane.durability.short {
            ShortAck::Admit => Ok(false),
            ShortAck::Deny => Ok(true),
            ShortAck::FailurePolicy => Err(RedisError::from((
                redis::ErrorKind::Io,
                "fewer replicas acknowledged the write than asked",
            ))),
        }
    }

    /// `d` turned into the refusal of an admission the replicas did not acknowledge.
    fn refuse(&self, d: &mut Decision) {
        d.allowed = false;
        d.retry_after_ms =
            i64::try_from(self.inner.options.fail_closed_retry_ms).unwrap_or(i64::MAX);
    }

    /// This client (and the clones made from it afterwards) taking leased batches for hot keys,
    /// as `batching` says: a hot key's checks take several units with one partial grant and
    /// admit from them without calling Redis, giving back what they did not use when the
    /// batch's lease ends (see [`Batching`] and docs/clients.md). Replaces any batches this
    /// client had (without giving back what they hold: [`Client::flush`] first).
    pub fn with_batching(mut self, batching: Batching) -> Self {
        self.batches = Some(Batches::new(self.plain(), batching));
        self
    }

    /// This client without batches (those of other clones carry on).
    pub fn without_batching(mut self) -> Self {
        self.batches = None;
        self
    }

    /// This client (and the clones made from it afterwards) with a deny cache of at most
    /// `entries` entries, the least recently used evicted first: after Redis denies a check
    /// with `retry_after_ms` R, the same check (same keys, algorithms, parameters and cost) is
    /// denied without calling Redis until R has passed on the monotonic
    /// clock ([`Outcome::answered_locally`] `DenyCache`, the waits counted down). When R has
    /// passed, one check asks Redis again while the others are still denied from the entry, for
    /// at most the client's timeout. It may deny for up to R (and that timeout) what Redis would
    /// admit sooner (another process's refund, a raised limit), never admit what Redis would
    /// deny. Off by default.
    pub fn with_deny_cache(mut self, entries: usize) -> Self {
        self.denies = Some(Arc::new(DenyCache::new(
            entries,
            self.inner.options.timeout,
        )));
        self
    }

    /// This client without a deny cache.
    pub fn without_deny_cache(mut self) -> Self {
        self.denies = None;
        self
    }

    /// Whether this client has a deny cache, and its number of entries at most.
    pub fn deny_cache_capacity(&self) -> Option<usize> {
        self.denies.as_ref().map(|d| d.capacity())
    }

    /// Entries in the deny cache now.
    pub fn deny_cache_len(&self) -> usize {
        self.denies.as_ref().map_or(0, |d| d.len())
    }

    /// When the deny cache's entry for these limits at this cost expires, if it has one.
    pub fn denied_until(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
    ) -> Option<tokio::time::Instant> {
        self.denies.as_ref()?.until(&signature(limits), cost)
    }

    /// What the batches did so far (all zero without batches).
    pub fn batch_stats(&self) -> BatchStats {
        self.batches
            .as_ref()
            .map_or_else(BatchStats::default, |b| b.stats())
    }

    /// The size the next batch of these limits starts from (B), while they are tracked.
    pub fn batch_size(&self, limits: &[(String, Algorithm)]) -> Option<u64> {
        self.batches.as_ref()?.size(&signature(limits))
    }

    /// Gives back at once what every batch holds (`RL.SETTLE ... DELTA -n`), and waits for the
    /// answers: the units given back. The keys are batched again on their next calls.
    pub async fn flush(&self) -> u64 {
        match &self.batches {
            Some(b) => b.flush().await,
            None => 0,
        }
    }

    /// Stops the batches of this client and of every clone sharing them (their checks go to
    /// Redis one by one from now on), and gives back what they hold: the units given back.
    /// Call it before the process ends; dropping the last clone gives them back too, from a
    /// task of the current runtime, without waiting.
    pub async fn close(&self) -> u64 {
        match &self.batches {
            Some(b) => b.close().await,
            None => 0,
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

    /// Makes the client's start-up now if not made yet: connects and detects the mode, each
    /// request within the timeout. `None` if Redis is unreachable.
    pub async fn detect(&self) -> Option<Mode> {
        self.start_up().await.ok()
    }

    /// The client's start-up, before a call's own command and outside its deadline: the
    /// connection and the mode (`COMMAND INFO`, then `FUNCTION LIST`; a `PING` when the mode is
    /// forced), once per client however many calls wait for it. Each request has the client's
    /// timeout, so a server that is down or does not answer fails the start-up within it, and
    /// every call waiting for it with it; a server that answers is never a failure, however long
    /// the start-up took in all (a burst of first calls on a loaded machine).
    async fn start_up(&self) -> Result<Mode, RedisError> {
        let started = || self.started();
        if let Some(m) = started() {
            return Ok(m);
        }
        let mut conn = self.conn.clone();
        self.inner
            .start_up
            .run(started, async {
                let mode = match self.mode() {
                    Some(m) => {
                        let ping = redis::cmd("PING");
                        let _: Value = self.bounded(pin!(ping.query_async(&mut conn))).await?;
                        m
                    }
                    None => self.resolve_mode(&mut conn).await?,
                };
                self.inner.started.store(true, Ordering::Release);
                Ok(mode)
            })
            .await
    }

    /// The mode, once the client's start-up is done.
    fn started(&self) -> Option<Mode> {
        if self.inner.started.load(Ordering::Acquire) {
            self.mode()
        } else {
            None
        }
    }

    /// `fut`, one request, within the client's timeout. At the deadline the runtime polls its
    /// sockets once more before the request fails (a yield lets it): a reply that has arrived
    /// but is not read yet (the timer and the socket became ready in the same turn of a busy
    /// runtime) is taken. And while Redis answers the client's other requests (this one's waits
    /// behind theirs, or was read after theirs), the request waits on: it fails once Redis has
    /// answered none of them for a whole timeout, at most [`WAIT_FACTOR`] timeouts after it was
    /// sent. A server that is down or frozen answers none, and the request fails at its
    /// timeout.
    ///
    /// The request comes pinned by the caller, so that its future is stored once.
    async fn bounded<T, F>(&self, mut fut: Pin<&mut F>) -> Result<T, RedisError>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        let budget = self.inner.options.timeout;
        let sent = tokio::time::Instant::now();
        let latest = sent + budget * WAIT_FACTOR;
        let mut until = sent + budget;
        loop {
            if let Ok(got) = tokio::time::timeout_at(until, fut.as_mut()).await {
                return self.answered(got);
            }
            tokio::task::yield_now().await;
            let polled = std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
                Poll::Ready(got) => Poll::Ready(Some(got)),
                Poll::Pending => Poll::Ready(None),
            })
            .await;
            if let Some(got) = polled {
                return self.answered(got);
            }
            let now = tokio::time::Instant::now();
            match self.last_answer() {
                Some(at) if at + budget > now && now < latest => until = (at + budget).min(latest),
                _ => {
                    return Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "no answer within the client's timeout",
                    )));
                }
            }
        }
    }

    /// `got`, noted as an answer of Redis if it is one: a reply, or an error about the call
    /// itself (not one saying Redis cannot serve now: `LOADING`, `TRYAGAIN`...). The one note
    /// of an answer, for the deadlines and the breaker alike ([`Breaker::answer`]): it closes a
    /// breaker that is not closed.
    fn answered<T>(&self, got: Result<T, RedisError>) -> Result<T, RedisError> {
        let reply = match &got {
            Ok(_) => true,
            Err(e) => !is_unavailable(e),
        };
        if reply {
            self.inner.breaker.answer(Instant::now());
        }
        got
    }

    /// When Redis last answered a request of this client (at most a grain earlier: see
    /// [`Breaker::answer`]).
    fn last_answer(&self) -> Option<tokio::time::Instant> {
        self.inner
            .breaker
            .last_answer()
            .map(tokio::time::Instant::from_std)
    }

    /// This client's loads of `script`.
    fn script_load(&self, script: &'static Script) -> Arc<ScriptLoad> {
        self.inner
            .scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(script.get_hash())
            .or_default()
            .clone()
    }

    /// `SCRIPT LOAD` of `script`, unless a load completed since `seen` loads (a call that met
    /// `NOSCRIPT` waits for the load another call started, and does not send one of its own).
    async fn load_script<K: ConnectionLike + Send>(
        &self,
        conn: &mut K,
        script: &'static Script,
        load: &ScriptLoad,
        seen: u64,
    ) -> Result<(), RedisError> {
        let loaded = || (load.loads.load(Ordering::Acquire) > seen).then_some(());
        load.flight
            .run(loaded, async {
                self.bounded(pin!(script.load_async(conn))).await?;
                load.loads.fetch_add(1, Ordering::AcqRel);
                Ok(())
            })
            .await
    }

    async fn resolve_mode<K: ConnectionLike + Send>(
        &self,
        conn: &mut K,
    ) -> Result<Mode, RedisError> {
        if let Some(m) = self.mode() {
            return Ok(m);
        }
        let info: Value = self
            .bounded(pin!(
                redis::cmd("COMMAND")
                    .arg("INFO")
                    .arg("rl.all")
                    .query_async(conn)
            ))
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
    async fn has_library<K: ConnectionLike + Send>(
        &self,
        conn: &mut K,
    ) -> Result<bool, RedisError> {
        let listed: Result<Value, RedisError> = self
            .bounded(pin!(
                redis::cmd("FUNCTION")
                    .arg("LIST")
                    .arg("LIBRARYNAME")
                    .arg(LIBRARY)
                    .query_async(conn)
            ))
            .await;
        match listed {
            Ok(Value::Array(libraries)) => Ok(!libraries.is_empty()),
            Ok(other) => Err(unexpected(&other)),
            Err(e) if e.code().is_some() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One limit's command: the parameters, then the cost (or `UPTO n`), or for a concurrency
    /// limit the lease id (`RL.ACQUIRE` takes no cost).
    async fn call_one(
        &self,
        key: &str,
        algo: &Algorithm,
        take: Take,
        lease: Option<&str>,
    ) -> Result<(Decision, u64, Mode), RedisError> {
        if let Some(lane) = self.lane_for(take, lease) {
            return Box::pin(self.call_one_durable(lane, key, algo, take, lease)).await;
        }
        let mut conn = self.conn.clone();
        self.send_one(&mut conn, key, algo, take, lease).await
    }

    /// [`Client::call_one`] on a connection of the durable lane, followed by `WAIT`.
    async fn call_one_durable(
        &self,
        lane: &Lane,
        key: &str,
        algo: &Algorithm,
        take: Take,
        lease: Option<&str>,
    ) -> Result<(Decision, u64, Mode), RedisError> {
        let mut conn = lane.take().await?;
        let (mut d, mut granted, mode) = self.send_one(&mut conn, key, algo, take, lease).await?;
        if d.allowed && !lane.acknowledged(&mut conn, key).await? && Self::short_ack_denies(lane)? {
            self.refuse(&mut d);
            granted = 0;
        }
        lane.put(conn);
        Ok((d, granted, mode))
    }

    /// One limit's command on `conn`.
    async fn send_one<K: ConnectionLike + Send>(
        &self,
        conn: &mut K,
        key: &str,
        algo: &Algorithm,
        take: Take,
        lease: Option<&str>,
    ) -> Result<(Decision, u64, Mode), RedisError> {
        let mode = match self.mode() {
            Some(m) => m,
            None => Box::pin(self.resolve_mode(conn)).await?,
        };
        // The parameters are written into the command as it is built: no string per argument.
        let mut cmd = command_for(mode, algo.command(), || script_for(algo), &[key], false);
        algo.write_params(&mut cmd);
        let take = match (algo, lease) {
            (Algorithm::Concurrency(_), Some(id)) => {
                cmd.arg(id);
                Take::Cost(1)
            }
            _ => {
                take.write(&mut cmd);
                take
            }
        };
        let reply: Value = cmd.query_async(conn).await?;
        let (d, granted) = decision(&reply, take).ok_or_else(|| unexpected(&reply))?;
        Ok((d, granted, mode))
    }

    /// `RL.RELEASE key lease_id` (or its twins): 1 if a live lease was released.
    async fn call_release(&self, key: &str, id: &str) -> Result<i64, RedisError> {
        let mut conn = self.conn.clone();
        let mode = self.resolve_mode(&mut conn).await?;
        let mut cmd = command_for(mode, "RL.RELEASE", || &RELEASE_SCRIPT, &[key], false);
        cmd.arg(id);
        let reply: Value = cmd.query_async(&mut conn).await?;
        int(&reply).ok_or_else(|| unexpected(&reply))
    }

    async fn call_all(
        &self,
        limits: &[(String, Algorithm)],
        take: Take,
        lease: Option<&str>,
    ) -> Result<(Multi, Mode), RedisError> {
        if let Some(lane) = self.lane_for(take, lease) {
            let mut conn = lane.take().await?;
            let (mut m, mode) = self.send_all(&mut conn, limits, take, lease).await?;
            let first = limits.first().map_or("", |(k, _)| k.as_str());
            if m.0 && !lane.acknowledged(&mut conn, first).await? && Self::short_ack_denies(lane)? {
                // Denied as by the first limit, every limit answering the same refusal.
                m.2.iter_mut().for_each(|d| self.refuse(d));
                (m.0, m.1, m.3) = (false, 1, 0);
            }
            lane.put(conn);
            return Ok((m, mode));
        }
        let mut conn = self.conn.clone();
        self.send_all(&mut conn, limits, take, lease).await
    }

    /// `command` (`RL.ALL`, `RL.SETTLE`) or its twin on the keys of `limits`, then each limit's
    /// keyword and parameters.
    fn limits_command(
        mode: Mode,
        command: &'static str,
        script: impl FnOnce() -> &'static Script,
        limits: &[(String, Algorithm)],
    ) -> redis::Cmd {
        let keys: Vec<&str> = limits.iter().map(|(k, _)| k.as_str()).collect();
        let mut cmd = command_for(mode, command, script, &keys, true);
        for (_, algo) in limits {
            cmd.arg(algo.keyword());
            algo.write_params(&mut cmd);
        }
        cmd
    }

    /// `RL.ALL` (or its twins) on `conn`.
    async fn send_all<K: ConnectionLike + Send>(
        &self,
        conn: &mut K,
        limits: &[(String, Algorithm)],
        take: Take,
        lease: Option<&str>,
    ) -> Result<(Multi, Mode), RedisError> {
        let mode = match self.mode() {
            Some(m) => m,
            None => Box::pin(self.resolve_mode(conn)).await?,
        };
        let mut cmd = Self::limits_command(mode, "RL.ALL", || &ALL_SCRIPT, limits);
        if let Some(id) = lease {
            cmd.arg("LEASE").arg(id);
        }
        match take {
            Take::Cost(n) => cmd.arg("COST").arg(n),
            Take::Upto(n) => cmd.arg("UPTO").arg(n),
        };
        let reply: Value = cmd.query_async(conn).await?;
        Ok((
            multi(&reply, limits.len(), take).ok_or_else(|| unexpected(&reply))?,
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
        let mut cmd = Self::limits_command(mode, "RL.SETTLE", || &SETTLE_SCRIPT, limits);
        cmd.arg("DELTA").arg(delta);
        let reply: Value = cmd.query_async(&mut conn).await?;
        Ok((
            decisions(&reply, limits.len()).ok_or_else(|| unexpected(&reply))?,
            mode,
        ))
    }

    /// Runs `call()` under the breaker and the timeout ([`Client::bounded`]), after the client's
    /// start-up. In script mode (`script` is the one the call runs then) a `NOSCRIPT` (the
    /// script never loaded, a flush, a restart, a failover) loads `script` (once however many
    /// calls met it), outside the deadline as the start-up is, and sends the call again. One
    /// async function from the breaker to the request: each level would copy the call's
    /// future once more.
    async fn guarded<T, Fut>(
        &self,
        script: Option<&'static Script>,
        call: impl Fn() -> Fut,
    ) -> Result<T, Failure>
    where
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let breaker = &self.inner.breaker;
        if !breaker.permit() {
            return Err(Failure::Unavailable);
        }
        let since = breaker.answered();
        // Dropped before it ends (its caller gave up), the call tells nothing about Redis.
        let pending = Pending(Some(breaker));
        let got: Result<T, RedisError> = 'call: {
            // The start-up and a script's load are boxed: a call's future stays as small as the
            // command's own (every await of an async fn makes its future as large as the
            // largest).
            let mode = match self.started() {
                Some(m) => m,
                None => match Box::pin(self.start_up()).await {
                    Ok(m) => m,
                    Err(e) => break 'call Err(e),
                },
            };
            let script = script
                .filter(|_| mode == Mode::Script)
                .map(|s| (s, self.script_load(s)));
            let mut reloads = 0;
            loop {
                let seen = script
                    .as_ref()
                    .map_or(0, |(_, l)| l.loads.load(Ordering::Acquire));
                match self.bounded(pin!(call())).await {
                    Err(e)
                        if reloads < 2
                            && e.kind()
                                == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                            && let Some((s, load)) = &script =>
                    {
                        reloads += 1;
                        let mut conn = self.conn.clone();
                        let loaded = self.load_script(&mut conn, s, load, seen);
                        if let Err(e) = Box::pin(loaded).await {
                            break 'call Err(e);
                        }
                    }
                    got => break 'call got,
                }
            }
        };
        pending.ended();
        // An answer (a rejection included) was noted by `bounded` as it came: a success.
        match got {
            Ok(v) => Ok(v),
            Err(e) if !is_unavailable(&e) => {
                if e.code() == Some("READONLY") {
                    Box::pin(self.reconnect()).await;
                }
                Err(Failure::Rejected(match (e.code(), e.detail()) {
                    (Some(code), Some(detail)) => format!("{code} {detail}"),
                    _ => e.to_string(),
                }))
            }
            Err(_) => {
                // Counted only if Redis answered none of the client's calls since this one
                // began (a call late behind others that were answered is not a server gone).
                breaker.failure_since(since);
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
        let (d, _, g) = self.degraded_take(key, algo, Take::Cost(cost), lease);
        (d, g)
    }

    /// The failure policy's answer for one limit, with the units it grants.
    fn degraded_take(
        &self,
        key: &str,
        algo: &Algorithm,
        take: Take,
        lease: Option<&str>,
    ) -> (Decision, u64, Degraded) {
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
                take.units(),
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
                0,
                Degraded::FailClosed,
            ),
            FailurePolicy::Local { instances } => match (algo, take) {
                (Algorithm::Concurrency(c), _) => {
                    let d = self.inner.leases.acquire(
                        key,
                        lease.unwrap_or_default(),
                        c,
                        instances,
                        take.units() > 0,
                    );
                    (d, u64::from(d.allowed), Degraded::Local)
                }
                (_, Take::Cost(cost)) => {
                    let d = self.inner.local.check(key, algo, instances, cost);
                    (d, if d.allowed { cost } else { 0 }, Degraded::Local)
                }
                (_, Take::Upto(n)) => {
                    let (d, g) = self.inner.local.grant(key, algo, instances, n);
                    (d, g, Degraded::Local)
                }
            },
        }
    }

    /// Checks (and on admission consumes) `cost` units of `algo` on `key`. A concurrency limit is
    /// only peeked at here (cost 0, through `RL.ALL`); its slots are taken with
    /// [`Client::acquire`] (`Error::Unsupported` for a cost above 0).
    ///
    /// With [batches](Client::with_batching) or the [deny cache](Client::with_deny_cache) on, a
    /// check of a cost above 0 may be answered without calling Redis
    /// ([`Outcome::answered_locally`]).
    pub async fn check(&self, key: &str, algo: &Algorithm, cost: u64) -> Result<Outcome, Error> {
        if algo.concurrency().is_none() {
            if cost > 0 && (self.batches.is_some() || self.denies.is_some()) {
                let limits = [(key.to_string(), algo.clone())];
                return Box::pin(self.decide_hot(&limits, cost))
                    .await
                    .map(MultiOutcome::single);
            }
            return self.decide_one(key, algo, cost, None).await;
        }
        let o = self
            .check_all(&[(key.to_string(), algo.clone())], cost)
            .await?;
        Ok(o.single())
    }

    /// A partial grant (`UPTO n`): as many units of `algo` on `key` as are left now, at least 1
    /// and at most `n`, taken in one call; [`Outcome::granted`] says how many (0 when denied:
    /// nothing was left, and the decision is the denial of one unit). Give back what goes unused
    /// with [`Client::settle`] (a negative delta). `n` from 1 to 10^15 (1,000 for a sliding log);
    /// not for a concurrency limit (`Error::Unsupported`). Batches and the deny cache are not
    /// used. When Redis cannot answer: `FailOpen` grants `n` (nothing taken), `FailClosed`
    /// denies, `Local` grants what its in-process bucket has, at most `n`.
    pub async fn check_upto(&self, key: &str, algo: &Algorithm, n: u64) -> Result<Outcome, Error> {
        if algo.concurrency().is_some() {
            return Err(Error::Unsupported(
                "a concurrency limit is not granted in part (a lease is one slot)",
            ));
        }
        if n == 0 {
            return Err(Error::Unsupported("UPTO n takes n of at least 1"));
        }
        self.decide_take(key, algo, Take::Upto(n), None).await
    }

    /// A partial grant of several limits at once (`RL.ALL ... UPTO n`): every limit is granted
    /// the same units, the fewest any of them has left, at most `n`
    /// ([`MultiOutcome::granted`]; 0 when denied, as a cost of 1 would be). One limit alone uses
    /// its own command. Concurrency limits are refused (`Error::Unsupported`).
    pub async fn check_all_upto(
        &self,
        limits: &[(String, Algorithm)],
        n: u64,
    ) -> Result<MultiOutcome, Error> {
        if limits.iter().any(|(_, a)| a.concurrency().is_some()) {
            return Err(Error::Unsupported(
                "a concurrency limit is not granted in part (a lease is one slot)",
            ));
        }
        if n == 0 {
            return Err(Error::Unsupported("UPTO n takes n of at least 1"));
        }
        self.decide_all_take(limits, Take::Upto(n), None).await
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
        self.decide_take(key, algo, Take::Cost(cost), lease).await
    }

    async fn decide_take(
        &self,
        key: &str,
        algo: &Algorithm,
        take: Take,
        lease: Option<&str>,
    ) -> Result<Outcome, Error> {
        let call = || self.call_one(key, algo, take, lease);
        match self.guarded(Some(script_for(algo)), call).await {
            Ok((decision, granted, mode)) => Ok(Outcome {
                decision,
                degraded: None,
                mode: Some(mode),
                granted,
                answered_locally: None,
            }),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => {
                let (decision, granted, degraded) = self.degraded_take(key, algo, take, lease);
                Ok(Outcome {
                    decision,
                    degraded: Some(degraded),
                    mode: None,
                    granted,
                    answered_locally: None,
                })
            }
        }
    }

    /// Checks several limits at once: admitted only if every limit admits, and then `cost` is
    /// consumed from all of them (`RL.ALL`, or `all.lua`). One limit alone uses its own command.
    /// Concurrency limits are only peeked at here (cost 0); their slots are taken with
    /// [`Client::acquire_all`] (`Error::Unsupported` for a cost above 0). Batches and the deny
    /// cache apply as for [`Client::check`].
    pub async fn check_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
    ) -> Result<MultiOutcome, Error> {
        if !limits.iter().any(|(_, a)| a.concurrency().is_some()) {
            if cost > 0
                && (1..=16).contains(&limits.len())
                && (self.batches.is_some() || self.denies.is_some())
            {
                return self.decide_hot(limits, cost).await;
            }
            // Boxed, as in `decide_hot`: the hot path's future stays small.
            return Box::pin(self.decide_all(limits, cost, None)).await;
        }
        if cost > 0 {
            return Err(Error::Unsupported(
                "concurrency limits take a lease: Client::acquire_all",
            ));
        }
        Box::pin(self.decide_all(limits, 0, Some(&new_lease_id()))).await
    }

    /// Several limits in one call (one alone with its own command, except a concurrency limit
    /// peeked at with cost 0, which only `RL.ALL` can do).
    pub(crate) async fn decide_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
        lease: Option<&str>,
    ) -> Result<MultiOutcome, Error> {
        self.decide_all_take(limits, Take::Cost(cost), lease).await
    }

    pub(crate) async fn decide_all_take(
        &self,
        limits: &[(String, Algorithm)],
        take: Take,
        lease: Option<&str>,
    ) -> Result<MultiOutcome, Error> {
        if let [(key, algo)] = limits
            && (take.units() > 0 || algo.concurrency().is_none())
        {
            let o = self.decide_take(key, algo, take, lease).await?;
            return Ok(MultiOutcome {
                allowed: o.decision.allowed,
                denied_by: usize::from(!o.decision.allowed),
                decisions: vec![o.decision],
                degraded: o.degraded,
                mode: o.mode,
                granted: o.granted,
                answered_locally: None,
            });
        }
        if limits.is_empty() || limits.len() > 16 {
            return Err(Error::Unsupported("between 1 and 16 limits per call"));
        }
        let call = || self.call_all(limits, take, lease);
        match self.guarded(Some(&*ALL_SCRIPT), call).await {
            Ok(((allowed, denied_by, decisions, granted), mode)) => Ok(MultiOutcome {
                allowed,
                denied_by,
                decisions,
                degraded: None,
                mode: Some(mode),
                granted,
                answered_locally: None,
            }),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => Ok(self.degraded_all_take(limits, take, lease)),
        }
    }

    /// The failure policy's answer for several limits, for a cost.
    pub(crate) fn degraded_all(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
        lease: Option<&str>,
    ) -> MultiOutcome {
        self.degraded_all_take(limits, Take::Cost(cost), lease)
    }

    fn degraded_all_take(
        &self,
        limits: &[(String, Algorithm)],
        take: Take,
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
        // A partial grant takes what the fewest left allow, at most n (as RL.ALL ... UPTO n).
        let cost = match take {
            Take::Cost(c) => c,
            Take::Upto(n) if degraded == Degraded::Local => peeks
                .iter()
                .map(|d| d.remaining)
                .min()
                .unwrap_or(0)
                .min(n)
                .max(1),
            Take::Upto(n) => n,
        };
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
            granted: if denier.is_none() { cost } else { 0 },
            answered_locally: None,
        }
    }

    /// The failure policy's answer for a cost, as a call to Redis that failed would get it.
    pub(crate) fn degraded_for(&self, limits: &[(String, Algorithm)], cost: u64) -> MultiOutcome {
        match limits {
            [(key, algo)] => {
                let (d, granted, degraded) = self.degraded_take(key, algo, Take::Cost(cost), None);
                MultiOutcome {
                    allowed: d.allowed,
                    denied_by: usize::from(!d.allowed),
                    decisions: vec![d],
                    degraded: Some(degraded),
                    mode: None,
                    granted,
                    answered_locally: None,
                }
            }
            _ => self.degraded_all(limits, cost, None),
        }
    }

    /// A partial grant of at most `n` units for a batch: `None` when Redis cannot answer (no
    /// failure policy applied).
    pub(crate) async fn try_grant(
        &self,
        limits: &[(String, Algorithm)],
        n: u64,
    ) -> Result<Option<MultiOutcome>, Error> {
        let got = match limits {
            [(key, algo)] => self
                .guarded(Some(script_for(algo)), || {
                    self.call_one(key, algo, Take::Upto(n), None)
                })
                .await
                .map(|(d, granted, mode)| MultiOutcome {
                    allowed: d.allowed,
                    denied_by: usize::from(!d.allowed),
                    decisions: vec![d],
                    degraded: None,
                    mode: Some(mode),
                    granted,
                    answered_locally: None,
                }),
            _ => self
                .guarded(Some(&*ALL_SCRIPT), || {
                    self.call_all(limits, Take::Upto(n), None)
                })
                .await
                .map(
                    |((allowed, denied_by, decisions, granted), mode)| MultiOutcome {
                        allowed,
                        denied_by,
                        decisions,
                        degraded: None,
                        mode: Some(mode),
                        granted,
                        answered_locally: None,
                    },
                ),
        };
        match got {
            Ok(o) => Ok(Some(o)),
            Err(Failure::Rejected(m)) => Err(Error::Rejected(m)),
            Err(Failure::Unavailable) => Ok(None),
        }
    }

    /// A check of a cost above 0 on limits without a concurrency one, with batches or the deny
    /// cache on: the batch first, then the deny cache, then a new batch (a hot key) or a call
    /// of its own.
    async fn decide_hot(
        &self,
        limits: &[(String, Algorithm)],
        cost: u64,
    ) -> Result<MultiOutcome, Error> {
        let sig = signature(limits);
        let mut refill = false;
        if let Some(b) = &self.batches {
            match b.try_local(&sig, limits, cost) {
                Step::Answer(o) => return Ok(cooperate(o).await),
                Step::Refill => refill = true,
                Step::Plain => {}
            }
        }
        let denies = self.denies.as_deref();
        if let Some(o) = denies.and_then(|d| d.lookup(&sig, cost)) {
            return Ok(cooperate(o).await);
        }
        // The calls to Redis are boxed: their state would make every answer's future as large,
        // and it is copied whole when the future is made.
        if refill && let Some(b) = &self.batches {
            if let Some(o) = Box::pin(b.refill(&sig, limits, cost, self.denies.as_ref())).await? {
                return Ok(o);
            }
            // The refill that came first may have been denied meanwhile.
            if let Some(o) = denies.and_then(|d| d.lookup(&sig, cost)) {
                return Ok(o);
            }
        }
        let sent = tokio::time::Instant::now();
        let o = Box::pin(self.decide_all(limits, cost, None)).await?;
        if let Some(d) = denies {
            d.record(&sig, cost, &o, sent);
        }
        if let Some(b) = &self.batches {
            b.observe(&sig, &o);
        }
        Ok(o)
    }

    /// Gives back `id`'s slot of `key` (`RL.RELEASE`): whether a live lease was released. `false`
    /// too when Redis cannot answer (the lease then expires by itself). Idempotent.
    pub async fn release(&self, key: &str, id: &str) -> Result<bool, Error> {
        match self
            .guarded(Some(&*RELEASE_SCRIPT), || self.call_release(key, id))
            .await
        {
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
        match self
            .guarded(Some(&*SETTLE_SCRIPT), || self.call_settle(limits, delta))
            .await
        {
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
        let asked = || async {
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
        match self.guarded(None, asked).await {
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

/// An answer made without I/O still spends the task's scheduling budget, so that a task checking
/// in a loop lets the runtime's other tasks (the connection's among them) run.
async fn cooperate(o: MultiOutcome) -> MultiOutcome {
    tokio::task::coop::consume_budget().await;
    o
}

impl<C> Server for Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn timeout(&self) -> std::time::Duration {
        self.options().timeout
    }

    async fn try_grant(
        &self,
        limits: &[(String, Algorithm)],
        n: u64,
    ) -> Result<Option<MultiOutcome>, Error> {
        Client::try_grant(self, limits, n).await
    }

    async fn settle(
        &self,
        limits: &[(String, Algorithm)],
        delta: i64,
    ) -> Result<Settlement, Error> {
        Client::settle(self, limits, delta).await
    }

    fn degraded_for(&self, limits: &[(String, Algorithm)], cost: u64) -> MultiOutcome {
        Client::degraded_for(self, limits, cost)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command's function is its name in lowercase with `_` for `.`, and every algorithm
    /// finds its own twin.
    #[test]
    fn functions_and_scripts_of_the_commands() {
        for (command, function) in FUNCTIONS {
            assert_eq!(
                function,
                command.to_ascii_lowercase().replace('.', "_"),
                "{command}"
            );
            assert_eq!(function_name(command), function);
        }
        for (command, script) in SCRIPTS.iter() {
            let algo = one_of_each()
                .into_iter()
                .find(|a| a.command() == *command)
                .expect("an algorithm per script");
            assert_eq!(script_for(&algo).get_hash(), script.get_hash(), "{command}");
        }
    }
}
