//! One file per command: its arguments, its stored fields and how they feed its pure core.
//! No I/O and no limiter math here.

pub mod all;
pub mod token_bucket;

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_window;
