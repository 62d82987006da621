//! ACL categories: every limiter command is in the module's category `ratelimit`, so that
//! `ACL SETUSER app on >pw ~rl:* +@ratelimit` lets an application call exactly the limiters;
//! the operator command `RL.TOP` is in `@admin` and `@dangerous`, as the server's own admin
//! commands are, so `-@admin` denies it.
//!
//! The category APIs exist from Redis 7.2 (and in every Valkey); on Redis 7.0 the module loads
//! without categories (and `RL.TOP` is denied by name: `-rl.top`). Both must be called during
//! module load.
//!
//! A server may already have a category named `ratelimit`: the one an earlier load of this
//! module added (the server keeps a module's categories after `MODULE UNLOAD`, with no command
//! in it), or one of its own or of another module, holding other commands. The commands join it
//! either way; the log says which, naming the other commands, since `+@ratelimit` grants them
//! too.

use std::ffi::{CString, c_int};

use redis_module::Context;
use redis_module::raw::{self, RedisModuleCommand, RedisModuleCtx};

use super::api;
use crate::command::descriptor::Descriptor;
use crate::command::registry::DESCRIPTORS;

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
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(format!(
                "could not add the ACL category '{CATEGORY}': {err}"
            ));
        }
        // The category exists: say whose it is.
        match api::call_acl_cat(ctx.ctx, c"ratelimit") {
            Ok(commands) => log_existing(ctx, &others(&commands)),
            Err(_) => ctx.log_warning(&format!(
                "ratelimit: ACL category '{CATEGORY}' already exists and could not be listed; \
                 the commands join it, and +@{CATEGORY} grants whatever else it holds"
            )),
        }
    }
    Ok(Categories(Some((get, set))))
}

/// The commands of an `ACL CAT ratelimit` reply that are not this module's (lower case, as the
/// server lists them).
fn others(commands: &[String]) -> Vec<String> {
    commands
        .iter()
        .filter(|c| {
            !DESCRIPTORS
                .iter()
                .any(|d| d.name.to_bytes().eq_ignore_ascii_case(c.as_bytes()))
        })
        .cloned()
        .collect()
}

/// The log line for a category `ratelimit` found at load, holding `others`.
fn log_existing(ctx: &Context, others: &[String]) {
    if others.is_empty() {
        ctx.log_notice(&format!(
            "ratelimit: ACL category '{CATEGORY}' already exists and holds no command (as an \
             earlier load of this module leaves it: the server keeps a module's categories after \
             MODULE UNLOAD); the commands join it"
        ));
    } else {
        ctx.log_warning(&format!(
            "ratelimit: this server already has an ACL category '{CATEGORY}' holding commands that \
             are not this module's: {}; the commands join it, so +@{CATEGORY} grants those \
             commands too: grant this module's commands by name instead (+rl.tokenbucket ...)",
            others.join(" ")
        ));
    }
}

impl Categories {
    /// Puts a registered limiter command in its categories.
    pub fn assign(&self, ctx: *mut RedisModuleCtx, cmd: &Descriptor) -> Result<(), String> {
        self.set_categories(ctx, cmd, &categories_for(cmd.flags, true))
    }

    /// Puts a registered operator command (`RL.TOP`) in the server's categories its flags name
    /// (`admin`: `@admin` and `@dangerous`), outside the module's.
    pub fn assign_operator(
        &self,
        ctx: *mut RedisModuleCtx,
        cmd: &Descriptor,
    ) -> Result<(), String> {
        self.set_categories(ctx, cmd, &categories_for(cmd.flags, false))
    }

    fn set_categories(
        &self,
        ctx: *mut RedisModuleCtx,
        cmd: &Descriptor,
        categories: &str,
    ) -> Result<(), String> {
        let Some((get, set)) = self.0 else {
            return Ok(());
        };
        let categories = CString::new(categories).map_err(|e| e.to_string())?;
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

/// The categories of a command: the ones Redis derives from the same flags for its own commands
/// (no server derives them for module commands, and setting categories replaces any), then, for
/// a limiter, the module's category.
fn categories_for(flags: &std::ffi::CStr, limiter: bool) -> String {
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
    if limiter {
        categories.push(CATEGORY);
    }
    categories.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_the_flags() {
        assert_eq!(categories_for(c"write fast", true), "write fast ratelimit");
        assert_eq!(
            categories_for(c"write fast getkeys-api", true),
            "write fast ratelimit"
        );
        assert_eq!(categories_for(c"write", true), "write slow ratelimit");
        assert_eq!(
            categories_for(c"readonly fast", true),
            "read fast ratelimit"
        );
        assert_eq!(
            categories_for(crate::command::top::DESCRIPTOR.flags, false),
            "admin dangerous slow"
        );
    }

    #[test]
    fn the_commands_of_an_existing_category_that_are_not_the_modules() {
        let listed = |v: &[&str]| others(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(listed(&[]), Vec::<String>::new());
        assert_eq!(
            listed(&["rl.tokenbucket", "cl.throttle"]),
            Vec::<String>::new()
        );
        assert_eq!(
            listed(&["gcra", "rl.all", "gcrasetvalue"]),
            ["gcra", "gcrasetvalue"]
        );
    }
}
