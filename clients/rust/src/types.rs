//! What every part of the client shares: decisions and outcomes, the modes, the options and
//! failure policies, and the errors.

use std::time::Duration;

use redis::RedisError;

use crate::breaker::BreakerConfig;

/// One limit's answer: the five fields every `RL.*` command replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub remaining: u64,
    /// 0 when allowed; -1 when the cost can never be admitted.
    pub retry_after_ms: i64,
    pub reset_after_ms: u64,
    pub limit: u64,
}

/// How decisions are made on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The module's `RL.*` commands.
    Module,
    /// `EVALSHA` of the `lua-reference/` scripts (EVAL on `NOSCRIPT`).
    Script,
    /// `FCALL` of the `ratelimit` Functions library (`lua-reference/ratelimit.lua`), loaded on
    /// the server beforehand.
    Function,
}

/// Which [`Mode`] to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModeChoice {
    /// The module if `COMMAND INFO rl.all` knows it, else the Functions library if
    /// `FUNCTION LIST` has it, else the scripts (detected on the first call that reaches Redis).
    #[default]
    Auto,
    Module,
    Script,
    Function,
}

/// What to answer when Redis cannot (timeout, connection error, breaker open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit everything.
    FailOpen,
    /// Deny everything.
    FailClosed,
    /// An in-process token bucket per key, with the limit and the rate divided by the expected
    /// number of instances sharing the limit; for a concurrency limit, an in-process counting
    /// semaphore per key with the limit divided alike and the same lease expiry.
    Local { instances: u32 },
}

/// A durable client's admissions: each admitting write is acknowledged by `replicas` replicas
/// (`WAIT replicas timeout` on a connection of its own, after the call) before it admits
/// (see [`Client::with_durability`](crate::Client::with_durability)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durability {
    /// Replicas that must acknowledge the write.
    pub replicas: u32,
    /// How long `WAIT` waits for them (below the client's own timeout, which bounds the call
    /// and the `WAIT` together).
    pub timeout: std::time::Duration,
    /// What an admission that fewer replicas acknowledged becomes.
    pub short: ShortAck,
    /// Whether the replicas must have the write in their append-only file too (`WAITAOF 0
    /// replicas timeout`: fsynced, so a replica that restarts keeps it), not only in memory.
    /// Replicas without `appendonly yes` never acknowledge it. A server without `WAITAOF`
    /// (before Redis 7.2) gets `WAIT`.
    pub aof: bool,
}

/// What a durable client does with an admission fewer replicas acknowledged than it asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShortAck {
    /// Deny it (the units stay spent on the master: under-admission, never over).
    Deny,
    /// Admit it, and count it in [`DurabilityStats::short`].
    Admit,
    /// Answer it with the failure policy, as if Redis had not answered.
    FailurePolicy,
}

/// What a durable client's admissions met so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurabilityStats {
    /// Admissions acknowledged by enough replicas.
    pub acknowledged: u64,
    /// Admissions fewer replicas acknowledged in time (then answered as [`ShortAck`] says).
    pub short: u64,
}

/// Set on an outcome that did not come from Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Degraded {
    FailOpen,
    FailClosed,
    Local,
}

impl Degraded {
    pub fn as_str(self) -> &'static str {
        match self {
            Degraded::FailOpen => "fail-open",
            Degraded::FailClosed => "fail-closed",
            Degraded::Local => "local",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Budget of one call to Redis, module detection included.
    pub timeout: Duration,
    pub policy: FailurePolicy,
    pub breaker: BreakerConfig,
    pub mode: ModeChoice,
    /// `retry_after_ms` reported by [`FailurePolicy::FailClosed`].
    pub fail_closed_retry_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_millis(100),
            policy: FailurePolicy::FailOpen,
            breaker: BreakerConfig::default(),
            mode: ModeChoice::Auto,
            fail_closed_retry_ms: 1000,
        }
    }
}

/// An answer the client made without a call to Redis for it (see [`Batching`](crate::Batching)
/// and [`Client::with_deny_cache`](crate::Client::with_deny_cache)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAnswer {
    /// Admitted from units a partial grant took earlier for this key (a leased batch).
    Batch,
    /// Denied again, within the `retry_after_ms` of an earlier denial of this key.
    DenyCache,
}

impl LocalAnswer {
    /// The metrics' outcome label: `batch`, `deny_cache`.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalAnswer::Batch => "batch",
            LocalAnswer::DenyCache => "deny_cache",
        }
    }
}

/// The answer for one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    /// `Some` when Redis was not asked or did not answer in time.
    pub degraded: Option<Degraded>,
    /// The mode that answered (`None` when degraded; for a local answer, the mode of the call it
    /// comes from).
    pub mode: Option<Mode>,
    /// The units taken: the cost when admitted and 0 when denied; for a partial grant
    /// ([`Client::check_upto`](crate::Client::check_upto)) the units granted, 1 to `n`. An
    /// answer of `FailOpen` grants what was asked (nothing is taken anywhere).
    pub granted: u64,
    /// `Some` when the client answered from a batch or its deny cache, without calling Redis.
    pub answered_locally: Option<LocalAnswer>,
}

/// The answer for several limits checked at once (`RL.ALL`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiOutcome {
    pub allowed: bool,
    /// 1-based position of the first limit that denied, 0 when allowed.
    pub denied_by: usize,
    pub decisions: Vec<Decision>,
    pub degraded: Option<Degraded>,
    pub mode: Option<Mode>,
    /// The units taken from every limit (see [`Outcome::granted`]).
    pub granted: u64,
    /// `Some` when the client answered from a batch or its deny cache, without calling Redis.
    pub answered_locally: Option<LocalAnswer>,
}

impl MultiOutcome {
    /// The answer for one limit, from an answer for exactly one.
    pub(crate) fn single(self) -> Outcome {
        Outcome {
            decision: self.decisions.first().copied().unwrap_or(Decision {
                allowed: self.allowed,
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
                limit: 0,
            }),
            degraded: self.degraded,
            mode: self.mode,
            granted: self.granted,
            answered_locally: self.answered_locally,
        }
    }
}

/// The state of every limit after a settlement (`RL.SETTLE`), in the order of the limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// One per limit: `allowed` true, `retry_after_ms` 0, `remaining` 0 while in debt.
    pub decisions: Vec<Decision>,
    /// `Some` when Redis was not asked or did not answer in time: the decisions are then the
    /// failure policy's.
    pub degraded: Option<Degraded>,
    /// The mode that answered (`None` when degraded).
    pub mode: Option<Mode>,
}

/// One of the keys with the most denials on a server (`RL.TOP`), as the module counts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopEntry {
    /// The key (bytes that are not UTF-8 replaced by U+FFFD).
    pub key: String,
    /// Denials counted for the key: at least `denied - error`, at most `denied`.
    pub denied: u64,
    /// The most by which `denied` may overcount (what the slot held when the key took it over).
    pub error: u64,
    /// The command of the latest denial (`RL.TOKENBUCKET`, `RL.ALL`).
    pub command: String,
    /// When the key's slot was taken, and its latest denial (Unix milliseconds, by the module's
    /// clock).
    pub first_denied_ms: i64,
    pub last_denied_ms: i64,
}

#[derive(Debug)]
pub enum Error {
    /// Redis answered with an error about the call itself (bad parameters, wrong key type).
    Rejected(String),
    /// The combination cannot be checked in one call, or the mode cannot answer it.
    Unsupported(&'static str),
    /// Redis did not answer, for a call that has no failure policy ([`Client::top`]).
    Unavailable,
    /// The URL could not be parsed.
    Config(RedisError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Rejected(m) => write!(f, "rejected by redis: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
            Error::Unavailable => write!(f, "redis did not answer"),
            Error::Config(e) => write!(f, "bad configuration: {e}"),
        }
    }
}

impl std::error::Error for Error {}
