//! Command metadata that Redis tools read (`COMMAND DOCS`, `COMMAND INFO`, cluster clients):
//! summary, arity, arguments and key specs from the command's descriptor, set with
//! `RedisModule_SetCommandInfo` where the server has it (Redis 7.0+). Servers without it keep the
//! first/last/step key positions given at registration.

use std::ffi::{CStr, c_int};
use std::ptr;

use redis_module::raw::{self, RedisModuleCommandArg, RedisModuleCommandKeySpec, RedisModuleCtx};

use crate::command::descriptor::{Arg, ArgKind, Descriptor, Keys};

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
        Keys::None => {}
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
    out.token = a.token.map_or(ptr::null(), CStr::as_ptr);
    out.type_ = match a.kind {
        ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        ArgKind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
        ArgKind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        ArgKind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
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
pub fn set(ctx: *mut RedisModuleCtx, doc: &Descriptor) -> Result<(), String> {
    let name = doc.name;
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
    // A command without keys has an empty list (the terminator alone).
    let first = match doc.keys {
        Keys::None => unsafe { std::mem::zeroed() },
        keys => key_spec(keys),
    };
    let mut key_specs = [first, unsafe { std::mem::zeroed() }];
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
