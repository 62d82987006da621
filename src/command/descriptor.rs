//! What a command is, in one place: its name, flags, keys, arity, `COMMAND DOCS` metadata, its
//! keyword inside `RL.ALL`, its arity error and its INFO counters. Registration, ACL categories,
//! `COMMAND DOCS`, `RL.ALL`'s parser and the INFO section all read it (`crate::binding`), so a
//! command cannot be registered without any of them. No Redis types here.

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::observe::stats::CommandStats;

/// One argument as `COMMAND DOCS` lists it.
#[derive(Debug)]
pub struct Arg {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub optional: bool,
    /// Repeats (`limit [limit ...]`).
    pub multiple: bool,
    /// Given once per call inside `RL.ALL` (as `LEASE id`), not among the limit's parameters.
    pub per_call: bool,
    /// The word that comes before the value (`UPTO n`), if any.
    pub token: Option<&'static CStr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Key,
    Integer,
    Double,
    String,
    /// A keyword alone (`WITHDB`).
    PureToken,
}

/// Where a command's keys are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// One key at this argument index.
    One(i32),
    /// `numkeys key [key ...]`: the count at this index, the keys right after it.
    Counted(i32),
    /// No key (the test clock).
    None,
}

pub const fn arg(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: false,
        per_call: false,
        token: None,
    }
}

/// A required argument that `RL.ALL` takes once per call rather than per limit.
pub const fn per_call(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: false,
        per_call: true,
        token: None,
    }
}

pub const fn optional(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: true,
        multiple: false,
        per_call: false,
        token: None,
    }
}

pub const fn repeated(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: true,
        per_call: false,
        token: None,
    }
}

/// The optional last argument of every limiter.
pub const COST_ARG: Arg = optional(c"cost", ArgKind::Integer);

/// A partial grant in place of the cost (`UPTO n`): as many units as are left, at most `n`.
pub const UPTO_ARG: Arg = Arg {
    token: Some(c"UPTO"),
    ..optional(c"upto", ArgKind::Integer)
};

#[derive(Debug)]
pub struct Descriptor {
    /// The command's name, upper case (`RL.TOKENBUCKET`); registered in lower case, as Redis
    /// names its own commands.
    pub name: &'static CStr,
    /// Redis command flags (`write fast`); ACL categories follow from them.
    pub flags: &'static CStr,
    pub keys: Keys,
    /// As Redis counts it (the command name included): negative means "at least".
    pub arity: i32,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// The arguments after the command name.
    pub args: &'static [Arg],
    /// The reply to a call with too few or too many arguments, worded as Redis words its own.
    pub arity_error: ErrorReply,
    /// The keyword of this limiter inside `RL.ALL` (its parameters are the required arguments
    /// after the key), or `None` where `RL.ALL` cannot combine it.
    pub all_keyword: Option<&'static str>,
    /// The counters of `INFO ratelimit`.
    pub stats: &'static CommandStats,
}

impl Descriptor {
    /// `first, last, step` key positions for registration (`0, 0, 0` where the keys are counted,
    /// the getkeys API then names them).
    pub fn key_range(&self) -> (i32, i32, i32) {
        match self.keys {
            Keys::One(pos) => (pos, pos, 1),
            Keys::Counted(_) | Keys::None => (0, 0, 0),
        }
    }

    /// How many parameters follow the keyword inside `RL.ALL`: the required arguments after
    /// the key, but those given once per call.
    pub fn all_params(&self) -> usize {
        self.args
            .iter()
            .filter(|a| !a.optional && !a.per_call && a.kind != ArgKind::Key)
            .count()
    }

    /// The INFO field of this command: `rl_tokenbucket`.
    pub fn info_name(&self) -> String {
        self.name
            .to_string_lossy()
            .to_ascii_lowercase()
            .replace('.', "_")
    }

    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags
            .to_str()
            .is_ok_and(|f| f.split(' ').any(|x| x == flag))
    }
}
