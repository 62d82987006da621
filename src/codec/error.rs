//! Error replies. Every message is a static C string so that replying never allocates, and each
//! one is repeated word for word by the Lua twins.

use std::ffi::CStr;

/// An error reply, already formatted for the client (`ERR ...`, `WRONGTYPE ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReply(pub &'static CStr);

impl ErrorReply {
    pub fn message(&self) -> &'static str {
        self.0.to_str().unwrap_or("ERR invalid error message")
    }
}

pub const WRONGTYPE: ErrorReply =
    ErrorReply(c"WRONGTYPE Operation against a key holding the wrong kind of value");
