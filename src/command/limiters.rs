//! The limiters: every command that decides one limit on one key with the five-integer reply.
//! `RL.ALL` combines those with a keyword, `RL.SETTLE` settles those with a settlement.

use crate::command::descriptor::Descriptor;
use crate::command::{
    BuildLimit, BuildSettle, Entry, Runner, acquire, fields_entry, fixed_window, gcra,
    leaky_bucket, sliding_log, sliding_window, token_bucket,
};

/// In registration order.
pub const LIMITERS: [Entry; 7] = [
    fields_entry::<token_bucket::TokenBucket, 2>(&token_bucket::DESCRIPTOR),
    fields_entry::<leaky_bucket::LeakyBucket, 2>(&leaky_bucket::DESCRIPTOR),
    fields_entry::<fixed_window::FixedWindow, 2>(&fixed_window::DESCRIPTOR),
    fields_entry::<sliding_window::SlidingWindow, 3>(&sliding_window::DESCRIPTOR),
    fields_entry::<gcra::Gcra, 1>(&gcra::DESCRIPTOR),
    sliding_log::ENTRY,
    acquire::ENTRY,
];

/// The limiters `RL.ALL` combines: every one whose descriptor has a keyword, with how to build
/// one limit of it.
pub fn combined() -> impl Iterator<Item = (&'static Descriptor, &'static str, BuildLimit)> {
    LIMITERS
        .iter()
        .filter_map(|e| match (e.runner, e.descriptor.all_keyword) {
            (Runner::OneKey { limit, .. }, Some(keyword)) => Some((e.descriptor, keyword, limit)),
            _ => None,
        })
}

/// The limiters `RL.SETTLE` settles: every one `RL.ALL` combines that has a settlement.
pub fn settled() -> impl Iterator<Item = (&'static Descriptor, &'static str, BuildSettle)> {
    LIMITERS
        .iter()
        .filter_map(|e| match (e.runner, e.descriptor.all_keyword) {
            (
                Runner::OneKey {
                    settle: Some(settle),
                    ..
                },
                Some(keyword),
            ) => Some((e.descriptor, keyword, settle)),
            _ => None,
        })
}
