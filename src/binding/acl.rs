//! ACL categories: every limiter command is in the module's category `ratelimit`, so that
//! `ACL SETUSER app on >pw ~rl:* +@ratelimit` lets an application call exactly the limiters.
//!
//! The category APIs exist from Redis 7.2 (and in every Valkey); on Redis 7.0 the module loads
//! without categories. Both must be called during module load.

use std::ffi::{CString, c_int};

use redis_module::Context;
use redis_module::raw::{self, RedisModuleCommand, RedisModuleCtx};

use crate::command::descriptor::Descriptor;

/// The module's own ACL category.
pub const CATEGORY: &str = "ratelimit";

type GetCommand =
    unsafe extern "C" fn(*mut RedisModuleCtx, *const std::ffi::c_char) -> *mut RedisModuleCommand;
type SetCategories =
    unsafe extern "C" fn(*mut RedisModuleCommand, *const std::ffi::c_char) -> c_int;

/// What the server offers: the two calls that put a command in categories, or nothing (7.0).
pub struct Categories(Option<(GetCommand, SetCategories)>);

/// Adds the `ratelimit` category, where the server can. Call once, before `assign`.
pub fn add_category(ctx: &Context) -> Result<Categories, String> {
    // SAFETY: plain reads of function pointers written at module load.
    let apis = unsafe {
        (
            raw::RedisModule_AddACLCategory,
            raw::RedisModule_SetCommandACLCategories,
            raw::RedisModule_GetCommand,
        )
    };
    let (Some(add), Some(set), Some(get)) = apis else {
        ctx.log_notice(
            "ratelimit: this server has no module ACL categories (Redis 7.2+ and Valkey have \
             them): the commands are in no ACL category, not even @ratelimit; grant them by \
             name (+rl.tokenbucket ...) or with +@all",
        );
        return Ok(Categories(None));
    };
    let name = CString::new(CATEGORY).map_err(|e| e.to_string())?;
    // SAFETY: load-time context; the name is NUL-terminated and Redis copies it.
    if unsafe { add(ctx.ctx, name.as_ptr()) } != raw::REDISMODULE_OK as c_int {
        let err = std::io::Error::last_os_error();
        // Redis keeps a module's categories after MODULE UNLOAD, so loading the module again
        // finds its category already there.
        if err.raw_os_error() == Some(libc::EBUSY) {
            ctx.log_notice(&format!(
                "ratelimit: ACL category '{CATEGORY}' already exists (an earlier load of this \
                 module added it); the commands join it"
            ));
        } else {
            return Err(format!(
                "could not add the ACL category '{CATEGORY}': {err}"
            ));
        }
    }
    Ok(Categories(Some((get, set))))
}

impl Categories {
    /// Puts a registered limiter command in its categories.
    pub fn assign(&self, ctx: *mut RedisModuleCtx, cmd: &Descriptor) -> Result<(), String> {
        let Some((get, set)) = self.0 else {
            return Ok(());
        };
        let categories = CString::new(categories_for(cmd.flags)).map_err(|e| e.to_string())?;
        let name = cmd.name.to_string_lossy();
        // SAFETY: load-time context and a registered command's name; Redis parses the
        // categories string and keeps only the resulting bits.
        let status = unsafe {
            let command = get(ctx, cmd.name.as_ptr());
            if command.is_null() {
                return Err(format!("{name} is not registered"));
            }
            set(command, categories.as_ptr())
        };
        if status == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(format!(
                "the server refused the ACL categories '{}' of {name}",
                categories.to_string_lossy()
            ))
        }
    }
}

/// The categories of a limiter command: the ones Redis derives from the same flags for its own
/// commands (no server derives them for module commands, and setting categories replaces any),
/// then the module's category.
fn categories_for(flags: &std::ffi::CStr) -> String {
    let flags = flags.to_bytes();
    let has = |flag: &[u8]| flags.split(|b| *b == b' ').any(|f| f == flag);
    let mut categories: Vec<&str> = Vec::new();
    if has(b"write") {
        categories.push("write");
    }
    if has(b"readonly") {
        categories.push("read");
    }
    if has(b"admin") {
        categories.extend(["admin", "dangerous"]);
    }
    if has(b"pubsub") {
        categories.push("pubsub");
    }
    // As Redis says of its own: if it is not fast, it is slow.
    categories.push(if has(b"fast") { "fast" } else { "slow" });
    categories.push(CATEGORY);
    categories.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_the_flags() {
        assert_eq!(categories_for(c"write fast"), "write fast ratelimit");
        assert_eq!(
            categories_for(c"write fast getkeys-api"),
            "write fast ratelimit"
        );
        assert_eq!(categories_for(c"write"), "write slow ratelimit");
        assert_eq!(categories_for(c"readonly fast"), "read fast ratelimit");
    }
}
