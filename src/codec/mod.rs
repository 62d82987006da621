//! Bytes to values and back, shared by every layer above: error replies (`error`), numbers as
//! Redis and the Lua twins write them (`number`), command arguments (`args`), the last arguments
//! a limiter parsed (`remembered`), the checks on stored numbers (`stored`) and the thread that
//! keeps the caches (`owner`). Nothing here knows a command, a key or Redis.

pub mod args;
pub mod error;
pub mod number;
pub mod owner;
pub mod remembered;
pub mod stored;
