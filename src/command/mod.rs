//! One file per command: its descriptor (`descriptor`), its arguments, its stored fields and how
//! they feed its pure core. No I/O and no limiter math here.

pub mod all;
pub mod descriptor;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod throttle;
pub mod token_bucket;

use descriptor::Descriptor;

/// Every command the module registers (but the test clock's), in registration order.
pub const DESCRIPTORS: [&Descriptor; 8] = [
    &token_bucket::DESCRIPTOR,
    &leaky_bucket::DESCRIPTOR,
    &fixed_window::DESCRIPTOR,
    &sliding_window::DESCRIPTOR,
    &gcra::DESCRIPTOR,
    &sliding_log::DESCRIPTOR,
    &throttle::DESCRIPTOR,
    &all::DESCRIPTOR,
];
