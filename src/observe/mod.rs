//! What calls came to, seen from the one place every command goes through (the binding's entry
//! point): per-command counters for `INFO ratelimit` (`stats`) and the most-denied keys of
//! `RL.TOP` (`top`). Nothing here knows a command's arguments or its key's contents.

pub mod stats;
pub mod top;
