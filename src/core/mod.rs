//! Pure limiter cores: state in, time in (integer microseconds), decision and new state out.
//! Nothing here knows about Redis. Arithmetic is done in doubles, in the same order as the Lua
//! twins, so that both paths produce bit-identical results.

pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window;
pub mod token_bucket;

/// What a call asks of a limiter, apart from the limiter's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operation {
    /// Take this many units (a whole number, at least 1) if the limit allows it.
    Consume(f64),
    /// Report the state and write nothing (a call with cost 0).
    Peek,
    /// Take as many units as the limit allows now, at least 1 and at most this many (`UPTO n`):
    /// the storage pipelines decide it as consumptions (`store::grant`); a core never sees it.
    UpTo(f64),
}

impl Operation {
    /// The operation of a `cost` argument: 0 is a peek.
    pub fn from_cost(cost: f64) -> Operation {
        if cost == 0.0 {
            Operation::Peek
        } else {
            Operation::Consume(cost)
        }
    }

    /// The units it takes (0 for a peek, the most it may take for a partial grant), as the cores
    /// count a cost.
    pub fn units(self) -> f64 {
        match self {
            Operation::Consume(n) | Operation::UpTo(n) => n,
            Operation::Peek => 0.0,
        }
    }
}

/// The reply every `RL.*` command shares: `[allowed, remaining, retry_after_ms, reset_after_ms,
/// limit]`, and `granted` sixth for a partial grant (`UPTO n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub allowed: bool,
    pub remaining: i64,
    /// 0 when allowed; -1 when the cost can never be admitted.
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    pub limit: i64,
    /// The units a partial grant took (0 when denied); `None` for any other call.
    pub granted: Option<i64>,
}

/// A reply's fields in order, as sent: five, or six for a partial grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    all: [i64; 6],
    len: usize,
}

impl AsRef<[i64]> for Fields {
    fn as_ref(&self) -> &[i64] {
        self.all.get(..self.len).unwrap_or(&self.all)
    }
}

impl Reply {
    pub fn fields(&self) -> Fields {
        Fields {
            all: [
                i64::from(self.allowed),
                self.remaining,
                self.retry_after_ms,
                self.reset_after_ms,
                self.limit,
                self.granted.unwrap_or(0),
            ],
            len: if self.granted.is_some() { 6 } else { 5 },
        }
    }

    /// The five fields every reply has.
    pub fn to_array(&self) -> [i64; 5] {
        [
            i64::from(self.allowed),
            self.remaining,
            self.retry_after_ms,
            self.reset_after_ms,
            self.limit,
        ]
    }

    /// The same reply as a partial grant of `units`.
    pub fn granting(self, units: i64) -> Reply {
        Reply {
            granted: Some(units),
            ..self
        }
    }
}

/// The fewest old entries (out of the window, or expired leases) a write to a sorted set removes
/// when there are that many: a write removes at least as many as it adds, so a set of this
/// module never holds more than its limit of entries plus what it held before, and never more
/// than this many are removed by one call (a set left with many old entries, by a clock jump or
/// an earlier release, shrinks by this many per write).
pub const TRIM_AT_LEAST: i64 = 128;

/// How many old entries a write that adds `added` removes, of the `old` there are.
pub fn trim_count(old: i64, added: i64) -> i64 {
    let most = if added > TRIM_AT_LEAST {
        added
    } else {
        TRIM_AT_LEAST
    };
    if old < most { old.max(0) } else { most }
}

/// A number the core computed, as Redis returns a Lua number: truncated toward zero.
/// All values reaching here are bounded well inside i64 by argument validation.
pub(crate) fn lua_integer(x: f64) -> i64 {
    x as i64
}

pub mod sliding_log;
