//! One file per command: its descriptor (`descriptor`), its arguments, its stored fields and how
//! they feed its pure core and its storage pipeline; `registry` lists them. No I/O and no limiter
//! math here.

pub mod acquire;
pub mod all;
pub mod descriptor;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod limiters;
pub mod registry;
pub mod release;
pub mod settle;
pub mod sliding_log;
pub mod sliding_window;
pub mod throttle;
pub mod token_bucket;
pub mod top;

use crate::codec::error::ErrorReply;
use crate::command::descriptor::Descriptor;
use crate::core::Reply;
use crate::store::string::{FieldsLimiter, LimitOf, SettleOf};
use crate::store::{Limit, OpenStore};

/// Runs one call of a limiter on one key: parses the arguments after the key, opens the key
/// (only once they parse) and decides at `now_us`.
pub type RunOne = fn(&[&[u8]], &mut dyn OpenStore, i64) -> Result<Reply, ErrorReply>;

/// What `RL.ALL` gives every limit of a call once: the cost (`COST n`, default 1) or a partial
/// grant in its place (`UPTO n`, checked), and the lease id (`LEASE id`) a concurrency limit takes
/// its lease for.
#[derive(Debug, Clone, Copy)]
pub struct PerCall<'a> {
    pub cost: &'a [u8],
    pub upto: Option<f64>,
    pub lease: Option<&'a [u8]>,
}

/// Builds one limit of `RL.ALL` from its parameters (without the per-call arguments).
pub type BuildLimit = fn(&[&[u8]], &PerCall<'_>) -> Result<Box<dyn Limit>, ErrorReply>;

/// Builds one limit of `RL.SETTLE` from its parameters (without the cost) and the call's delta
/// (negative refunds, positive charges).
pub type BuildSettle = fn(&[&[u8]], f64) -> Result<Box<dyn Limit>, ErrorReply>;

/// How a command runs.
#[derive(Clone, Copy)]
pub enum Runner {
    /// A limiter on one key with the five-integer reply; `RL.ALL` combines it when its
    /// descriptor has a keyword, and `RL.SETTLE` settles it where it has `settle`.
    OneKey {
        run: RunOne,
        limit: BuildLimit,
        settle: Option<BuildSettle>,
    },
    /// `CL.THROTTLE`: one key, redis-cell's reply.
    Throttle,
    /// `RL.RELEASE`: one key, an integer reply.
    Release,
    /// `RL.ALL`.
    All,
    /// `RL.SETTLE`.
    Settle,
}

/// A command: what it is and how it runs. Registration, ACL, `COMMAND DOCS`, `INFO` and `RL.ALL`
/// all read `registry::REGISTRY`, so a command is added in one place.
#[derive(Clone, Copy)]
pub struct Entry {
    pub descriptor: &'static Descriptor,
    pub runner: Runner,
}

fn build_settle<L: FieldsLimiter<N> + 'static, const N: usize>(
    params: &[&[u8]],
    delta: f64,
) -> Result<Box<dyn Limit>, ErrorReply> {
    Ok(Box::new(SettleOf::<L, N>::parse(params, delta)?))
}

fn build<L: FieldsLimiter<N> + 'static, const N: usize>(
    params: &[&[u8]],
    call: &PerCall<'_>,
) -> Result<Box<dyn Limit>, ErrorReply> {
    Ok(Box::new(match call.upto {
        Some(n) => LimitOf::<L, N>::parse_upto(params, n)?,
        None => LimitOf::<L, N>::parse(params, call.cost)?,
    }))
}

/// The entry of a limiter whose state is `N` numbers in one string.
pub const fn fields_entry<L: FieldsLimiter<N> + 'static, const N: usize>(
    descriptor: &'static Descriptor,
) -> Entry {
    Entry {
        descriptor,
        runner: Runner::OneKey {
            run: crate::store::string::run::<L, N>,
            limit: build::<L, N>,
            settle: Some(build_settle::<L, N>),
        },
    }
}
