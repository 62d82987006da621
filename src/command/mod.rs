//! One file per command: its descriptor (`descriptor`), its arguments, its stored fields and how
//! they feed its pure core. No I/O and no limiter math here.

pub mod acquire;
pub mod all;
pub mod descriptor;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod release;
pub mod settle;
pub mod sliding_log;
pub mod sliding_window;
pub mod throttle;
pub mod token_bucket;
pub mod top;

use descriptor::Descriptor;

use crate::core::Reply;
use crate::error::ErrorReply;
use crate::pipeline::{FieldsLimiter, Limit, LimitOf, OpenStore, SettleOf};

/// Runs one call of a limiter on one key: parses the arguments after the key, opens the key
/// (only once they parse) and decides at `now_us`.
pub type RunOne = fn(&[&[u8]], &mut dyn OpenStore, i64) -> Result<Reply, ErrorReply>;

/// What `RL.ALL` gives every limit of a call once: the cost (`COST n`, default 1) and the lease
/// id (`LEASE id`) a concurrency limit takes its lease for.
#[derive(Debug, Clone, Copy)]
pub struct PerCall<'a> {
    pub cost: &'a [u8],
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
/// all read `REGISTRY`, so a command is added in one place.
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
    Ok(Box::new(LimitOf::<L, N>::parse(params, call.cost)?))
}

/// The entry of a limiter whose state is `N` numbers in one string.
pub const fn fields_entry<L: FieldsLimiter<N> + 'static, const N: usize>() -> Entry {
    Entry {
        descriptor: L::DESCRIPTOR,
        runner: Runner::OneKey {
            run: crate::pipeline::run::<L, N>,
            limit: build::<L, N>,
            settle: Some(build_settle::<L, N>),
        },
    }
}

/// Every command the module registers (but the test clock's), in registration order.
pub const REGISTRY: [Entry; 11] = [
    fields_entry::<token_bucket::TokenBucket, 2>(),
    fields_entry::<leaky_bucket::LeakyBucket, 2>(),
    fields_entry::<fixed_window::FixedWindow, 2>(),
    fields_entry::<sliding_window::SlidingWindow, 3>(),
    fields_entry::<gcra::Gcra, 1>(),
    sliding_log::ENTRY,
    acquire::ENTRY,
    release::ENTRY,
    throttle::ENTRY,
    all::ENTRY,
    settle::ENTRY,
];

/// The entry at `i` of the registry, for a place known when compiling (`const { entry(I) }`).
pub const fn entry(i: usize) -> Option<&'static Entry> {
    if i < REGISTRY.len() {
        Some(&REGISTRY[i])
    } else {
        None
    }
}

/// The descriptors of `REGISTRY`, in its order.
pub const DESCRIPTORS: [&Descriptor; REGISTRY.len()] = {
    let mut out = [REGISTRY[0].descriptor; REGISTRY.len()];
    let mut i = 0;
    while i < REGISTRY.len() {
        out[i] = REGISTRY[i].descriptor;
        i += 1;
    }
    out
};
