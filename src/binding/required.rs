//! The module APIs the commands call, checked once at load: a server that lacks one refuses the
//! module, with the missing names in its log, rather than answering calls with an error after it
//! loaded fine. The optional ones are detected here too and said in the log: without
//! `CachedMicroseconds` the module reads the clock for every call (`Microseconds`, or without it
//! the same clock through the process), without the ACL category
//! APIs the commands are in no category, without `SetCommandInfo` they have no `COMMAND DOCS`.
//! The test clock's command filter APIs are checked when `TESTCLOCK` asks for them.

use redis_module::raw;

/// `(name, present)` of each API in the list.
macro_rules! presence {
    ($($name:ident),* $(,)?) => {
        [$(
            // SAFETY: plain reads of function pointers written once, at module load.
            (stringify!($name), unsafe { raw::$name }.is_some()),
        )*]
    };
}

/// Every API a command or the INFO section calls (the allocator's first: every allocation of
/// the module goes through it).
pub fn required() -> Vec<(&'static str, bool)> {
    presence!(
        RedisModule_Alloc,
        RedisModule_CreateCommand,
        RedisModule_OpenKey,
        RedisModule_GetSelectedDb,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_StringPtrLen,
        RedisModule_CreateString,
        RedisModule_FreeString,
        RedisModule_StringDMA,
        RedisModule_StringSet,
        RedisModule_HashGet,
        RedisModule_GetAbsExpire,
        RedisModule_SetAbsExpire,
        RedisModule_ZsetAdd,
        RedisModule_ZsetRem,
        RedisModule_ZsetScore,
        RedisModule_RegisterNumericConfig,
        RedisModule_LoadConfigs,
        RedisModule_SubscribeToServerEvent,
        RedisModule_ReplyWithSimpleString,
        RedisModule_ReplyWithStringBuffer,
        RedisModule_ZsetFirstInScoreRange,
        RedisModule_ZsetLastInScoreRange,
        RedisModule_ZsetRangePrev,
        RedisModule_ValueLength,
        RedisModule_Call,
        RedisModule_CallReplyType,
        RedisModule_CallReplyInteger,
        RedisModule_CallReplyLength,
        RedisModule_CallReplyArrayElement,
        RedisModule_CallReplyStringPtr,
        RedisModule_FreeCallReply,
        RedisModule_ZsetRangeCurrentElement,
        RedisModule_ZsetRangeNext,
        RedisModule_ZsetRangeEndReached,
        RedisModule_ZsetRangeStop,
        RedisModule_Replicate,
        RedisModule_SignalModifiedKey,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_GetUsedMemoryRatio,
        RedisModule_ReplyWithArray,
        RedisModule_ReplyWithError,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithStringBuffer,
        RedisModule_IsKeysPositionRequest,
        RedisModule_KeyAtPos,
        RedisModule_RegisterInfoFunc,
        RedisModule_InfoAddSection,
        RedisModule_InfoBeginDictField,
        RedisModule_InfoEndDictField,
        RedisModule_InfoAddFieldULongLong,
    )
    .to_vec()
}

/// APIs the module does without, and what it does instead.
pub fn optional() -> Vec<(&'static str, bool)> {
    presence!(
        RedisModule_CachedMicroseconds,
        RedisModule_Microseconds,
        RedisModule_AddACLCategory,
        RedisModule_SetCommandACLCategories,
        RedisModule_GetCommand,
        RedisModule_SetCommandInfo,
    )
    .to_vec()
}

/// The APIs of the test clock (`TESTCLOCK` load argument only).
pub fn test_clock() -> Vec<(&'static str, bool)> {
    presence!(
        RedisModule_RegisterCommandFilter,
        RedisModule_CommandFilterArgGet,
        RedisModule_CommandFilterArgReplace,
        RedisModule_CommandFilterArgInsert,
    )
    .to_vec()
}

/// The names that are missing, or `None` when all are there.
pub fn missing(apis: &[(&'static str, bool)]) -> Option<String> {
    let names: Vec<&str> = apis
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_names_are_listed_in_order() {
        assert_eq!(missing(&[("A", true), ("B", true)]), None);
        assert_eq!(
            missing(&[("A", false), ("B", true), ("C", false)]),
            Some("A, C".to_string())
        );
    }

    #[test]
    fn every_api_the_binding_calls_is_in_a_list() {
        // The binding's sources name each API they call through the `api!` macro or as a `raw::`
        // path: each must be checked at load.
        let listed: Vec<&str> = [required(), optional(), test_clock()]
            .concat()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/binding");
        let mut used = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            // The allocator reads `RedisModule_Alloc` only to tell whether it runs inside Redis
            // (and uses the system allocator when it does not).
            if path.ends_with("allocator.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, _) in text.match_indices("RedisModule_") {
                let name: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let before = &text[..i];
                if before.ends_with("api!(") || before.ends_with("raw::") {
                    used.push(name);
                }
            }
        }
        used.sort();
        used.dedup();
        assert!(!used.is_empty());
        for name in &used {
            assert!(
                listed.contains(&name.as_str()),
                "{name} is not checked at load"
            );
        }
    }
}
