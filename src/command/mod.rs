//! One file per command: its arguments, its stored fields and how they feed its pure core.
//! No I/O and no limiter math here.

pub mod sliding_log;
pub mod token_bucket;
