//! The Redis side, and the only place that calls the module API: module load (`load`), the one
//! entry point of every command (`entry`), the command handlers (`commands`), a key as a `Store`
//! (`key`) with the one applier of every `Effect`, and thin wrappers over the C API (`api`).

mod acl;
pub(crate) mod allocator;
pub(crate) mod api;
mod clock;
mod commands;
mod config;
mod docs;
mod entry;
mod info;
mod key;
mod load;
mod required;

pub use load::{on_load, on_unload};
