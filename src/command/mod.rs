//! One file per command: its arguments, its stored fields and how they feed its pure core.
//! No I/O and no limiter math here.

pub mod all;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod throttle;
pub mod token_bucket;
