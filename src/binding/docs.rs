//! Command metadata that Redis tools read (`COMMAND DOCS`, `COMMAND INFO`, cluster clients):
//! summary, arity, arguments and key specs, set with `RedisModule_SetCommandInfo` where the server
//! has it (Redis 7.0+). Servers without it keep the first/last/step key positions given at
//! registration.

use std::ffi::{CStr, c_int};
use std::ptr;

use redis_module::raw::{self, RedisModuleCommandArg, RedisModuleCommandKeySpec, RedisModuleCtx};

/// One argument as `COMMAND DOCS` lists it.
pub struct Arg {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub optional: bool,
    /// Repeats (`limit [limit ...]`).
    pub multiple: bool,
}

#[derive(Clone, Copy)]
pub enum ArgKind {
    Key,
    Integer,
    Double,
    String,
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub enum Keys {
    /// One key at this argument index.
    One(c_int),
    /// `numkeys key [key ...]`: the count at this index, the keys right after it.
    Counted(c_int),
}

pub struct Doc {
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// As Redis counts it: negative means "at least".
    pub arity: c_int,
    pub keys: Keys,
    pub args: &'static [Arg],
}

pub const fn arg(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: false,
    }
}

pub const fn optional(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: true,
        multiple: false,
    }
}

fn key_spec(keys: Keys) -> RedisModuleCommandKeySpec {
    // SAFETY: an all-zero key spec is valid (null notes, zero flags, empty unions).
    let mut spec: RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = u64::from(
        raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE,
    );
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    match keys {
        Keys::One(pos) => {
            spec.bs.index.pos = pos;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            spec.fk.range.lastkey = 0;
            spec.fk.range.keystep = 1;
            spec.fk.range.limit = 0;
        }
        Keys::Counted(pos) => {
            spec.bs.index.pos = pos;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            spec.fk.keynum.keynumidx = 0;
            spec.fk.keynum.firstkey = 1;
            spec.fk.keynum.keystep = 1;
        }
    }
    spec
}

fn command_arg(a: &Arg) -> RedisModuleCommandArg {
    // SAFETY: an all-zero argument is valid (null strings, no sub-arguments).
    let mut out: RedisModuleCommandArg = unsafe { std::mem::zeroed() };
    out.name = a.name.as_ptr();
    out.type_ = match a.kind {
        ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        ArgKind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
        ArgKind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    };
    out.key_spec_index = if matches!(a.kind, ArgKind::Key) {
        0
    } else {
        -1
    };
    let mut flags = 0;
    if a.optional {
        flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
    }
    if a.multiple {
        flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
    }
    out.flags = flags as c_int;
    out
}

/// Sets the metadata of a registered command. Returns `Ok` without doing anything on servers
/// that lack the API; an error if the server rejects the metadata.
pub fn set(ctx: *mut RedisModuleCtx, name: &'static CStr, doc: &Doc) -> Result<(), String> {
    // SAFETY: plain reads of function pointers written at load time.
    let (Some(get_command), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Ok(());
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<RedisModuleCommandArg>(),
    };
    // Both lists end with an all-zero entry, as the API requires.
    // SAFETY: all-zero entries are the documented terminators.
    let mut key_specs = [key_spec(doc.keys), unsafe { std::mem::zeroed() }];
    let mut args: Vec<RedisModuleCommandArg> = doc.args.iter().map(command_arg).collect();
    args.push(unsafe { std::mem::zeroed() });
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: doc.summary.as_ptr(),
        complexity: doc.complexity.as_ptr(),
        since: c"1.0.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: doc.arity,
        key_specs: key_specs.as_mut_ptr(),
        args: args.as_mut_ptr(),
    };
    // SAFETY: load-time context, registered command name; Redis copies everything it keeps.
    let status = unsafe {
        let command = get_command(ctx, name.as_ptr());
        if command.is_null() {
            return Err(format!("{} is not registered", name.to_string_lossy()));
        }
        set_info(command, &info)
    };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!(
            "Redis rejected the metadata of {}",
            name.to_string_lossy()
        ))
    }
}

use ArgKind::{Double, Integer, Key};

const COST: Arg = optional(c"cost", Integer);

const TOKEN_BUCKET: Doc = Doc {
    summary: c"Token bucket: admits cost if that many tokens are left; refills continuously",
    complexity: c"O(1)",
    arity: -4,
    keys: Keys::One(1),
    args: &[
        arg(c"key", Key),
        arg(c"capacity", Integer),
        arg(c"refill_per_sec", Double),
        COST,
    ],
};

const ALL: Doc = Doc {
    summary: c"Checks several limits at once; admits only if all admit, consuming from all or none",
    complexity: c"O(N) where N is the number of limits",
    arity: -6,
    keys: Keys::Counted(1),
    args: &[
        arg(c"numkeys", Integer),
        Arg {
            name: c"key",
            kind: Key,
            optional: false,
            multiple: true,
        },
        Arg {
            name: c"limit",
            kind: ArgKind::String,
            optional: false,
            multiple: true,
        },
        optional(c"cost", Integer),
    ],
};

const LEAKY_BUCKET: Doc = Doc {
    summary: c"Leaky bucket (policing): admits cost if the level stays within capacity; drains continuously",
    complexity: c"O(1)",
    arity: -4,
    keys: Keys::One(1),
    args: &[arg(c"key", Key), arg(c"capacity", Integer), arg(c"leak_per_sec", Double), COST],
};

const FIXED_WINDOW: Doc = Doc {
    summary: c"Fixed window counter: at most limit per window, the window opening at the first admitted call",
    complexity: c"O(1)",
    arity: -4,
    keys: Keys::One(1),
    args: &[arg(c"key", Key), arg(c"limit", Integer), arg(c"window_sec", Double), COST],
};

const SLIDING_WINDOW: Doc = Doc {
    summary:
        c"Sliding window counter: the previous window weighted by its overlap plus the current one",
    complexity: c"O(1)",
    arity: -4,
    keys: Keys::One(1),
    args: &[
        arg(c"key", Key),
        arg(c"limit", Integer),
        arg(c"window_sec", Double),
        COST,
    ],
};

const SLIDING_LOG: Doc = Doc {
    summary:
        c"Sliding log: exactly at most limit in any window, one sorted-set entry per admitted unit",
    complexity: c"O(N) where N is the number of entries in the key (at most limit)",
    arity: -4,
    keys: Keys::One(1),
    args: &[
        arg(c"key", Key),
        arg(c"limit", Integer),
        arg(c"window_sec", Double),
        COST,
    ],
};

const GCRA: Doc = Doc {
    summary: c"GCRA: max_burst + 1 at once, then evenly spaced at count_per_period per period",
    complexity: c"O(1)",
    arity: -5,
    keys: Keys::One(1),
    args: &[
        arg(c"key", Key),
        arg(c"max_burst", Integer),
        arg(c"count_per_period", Integer),
        arg(c"period_sec", Double),
        COST,
    ],
};

const THROTTLE: Doc = Doc {
    summary: c"redis-cell compatible GCRA throttle: [limited, limit, remaining, retry_after_s, reset_after_s]",
    complexity: c"O(1)",
    arity: -5,
    keys: Keys::One(1),
    args: &[
        arg(c"key", Key),
        arg(c"max_burst", Integer),
        arg(c"count_per_period", Integer),
        arg(c"period", Integer),
        optional(c"quantity", Integer),
    ],
};

/// The metadata of each command, by name.
pub fn doc_for(name: &CStr) -> Option<&'static Doc> {
    match name.to_bytes() {
        b"RL.TOKENBUCKET" => Some(&TOKEN_BUCKET),
        b"RL.LEAKYBUCKET" => Some(&LEAKY_BUCKET),
        b"RL.FIXEDWINDOW" => Some(&FIXED_WINDOW),
        b"RL.SLIDINGWINDOW" => Some(&SLIDING_WINDOW),
        b"RL.SLIDINGLOG" => Some(&SLIDING_LOG),
        b"RL.GCRA" => Some(&GCRA),
        b"CL.THROTTLE" => Some(&THROTTLE),
        b"RL.ALL" => Some(&ALL),
        _ => None,
    }
}
