//! The Lua twins share code by copy: every script carries the same `@common` block, and
//! `all.lua` carries a copy of each algorithm's `@limiter` block. `ratelimit.lua`, the Functions
//! library, is generated from them: the common block, every limiter block, and each script's
//! `@main` as the function of its command. These tests fail when a copy or the library has
//! drifted from its sources; `UPDATE_LUA=1 cargo test --test lua_blocks` rewrites them.

use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lua-reference")
}

/// `(name, text)` of every block, `-- @common` / `-- @limiter <name>` up to its `-- @end`.
fn blocks(source: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("\n-- @").map(|i| i + 1) {
        let line_end = rest[start..].find('\n').map_or(rest.len(), |e| start + e);
        let name = rest[start + 4..line_end].trim().to_string();
        if name == "main" || name == "end" {
            rest = &rest[line_end..];
            continue;
        }
        let end = rest[start..]
            .find("-- @end")
            .map(|e| start + e + "-- @end".len())
            .expect("@end");
        out.push((name, rest[start..end].to_string()));
        rest = &rest[end..];
    }
    out
}

/// The scripts that combine other scripts' limiter blocks (copies), with the blocks each leaves
/// out: `all.lua` every limiter but CL.THROTTLE's (redis-cell's reply and key format), and
/// `settle.lua` those RL.SETTLE settles (not CL.THROTTLE, not concurrency leases).
const COMBINING: [(&str, &[&str]); 2] = [
    ("all.lua", &["limiter throttle"]),
    ("settle.lua", &["limiter throttle", "limiter concurrency"]),
];

/// The Functions library's file in `lua-reference/`.
const LIBRARY: &str = "ratelimit.lua";

/// The command a script is the twin of, from its first line (`-- ..., the Lua twin of RL.X.`).
fn command_of(script: &str) -> String {
    let first = script.lines().next().unwrap_or_default();
    let (_, name) = first
        .split_once("twin of ")
        .expect("first line names the command");
    name.trim_start_matches("the module's ")
        .trim_end_matches('.')
        .to_string()
}

/// The text after `-- @main`.
fn main_block(script: &str) -> &str {
    let at = script.find("\n-- @main\n").expect("@main") + "\n-- @main\n".len();
    &script[at..]
}

/// `ratelimit.lua` as the scripts make it.
fn library() -> String {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "lua") && !p.ends_with(LIBRARY))
        .collect();
    paths.sort();
    let mut common = String::new();
    let mut limiters = String::new();
    // A limiter block shared by two scripts (acquire.lua and release.lua) goes in once.
    let mut seen: Vec<String> = Vec::new();
    let mut mains = String::new();
    let mut registrations = String::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        for (name, block) in blocks(&text) {
            if name == "common" {
                common = block;
            } else if !path.ends_with("all.lua") && !seen.contains(&name) {
                seen.push(name);
                limiters.push_str(&block);
                limiters.push_str("\n\n");
            }
        }
        let command = command_of(&text);
        let function = command.to_ascii_lowercase().replace('.', "_");
        let main = format!("{function}_main");
        mains.push_str(&format!(
            "-- {command}, as `lua-reference/{}`'s main.\nlocal function {main}(KEYS, ARGV)\n{}end\n\n",
            path.file_name().unwrap().to_string_lossy(),
            main_block(&text)
        ));
        registrations.push_str(&format!("redis.register_function('{function}', {main})\n"));
    }
    format!(
        "#!lua name=ratelimit\n\
-- The `ratelimit` Functions library (Redis 7+, Valkey): one function per command, named after it\n\
-- in lower case with `_` for the dot (`FCALL rl_tokenbucket 1 key 10 5`), with the scripts'\n\
-- arguments, replies, errors and stored bytes. Generated from the scripts in this directory by\n\
-- tests/lua_blocks.rs (UPDATE_LUA=1 cargo test --test lua_blocks); edit the scripts, not this.\n\
\n{common}\n\n{limiters}{mains}{registrations}"
    )
}

#[test]
fn the_functions_library_is_made_from_the_scripts() {
    let wanted = library();
    let path = dir().join(LIBRARY);
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    if found != wanted && std::env::var("UPDATE_LUA").is_ok() {
        std::fs::write(&path, &wanted).unwrap();
        return;
    }
    assert!(
        found == wanted,
        "{LIBRARY} is stale (UPDATE_LUA=1 cargo test --test lua_blocks)"
    );
    // One function per registered command.
    let mut functions: Vec<String> = wanted
        .lines()
        .filter_map(|l| l.strip_prefix("redis.register_function('"))
        .map(|l| l.split('\'').next().unwrap().to_string())
        .collect();
    functions.sort();
    let mut commands: Vec<String> = redis_rate_limiter::command::registry::DESCRIPTORS
        .iter()
        .map(|d| {
            d.name
                .to_str()
                .unwrap()
                .to_ascii_lowercase()
                .replace('.', "_")
        })
        .collect();
    commands.sort();
    assert_eq!(functions, commands);
}

#[test]
fn shared_lua_blocks_are_identical_copies() {
    let update = std::env::var("UPDATE_LUA").is_ok();
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut common: Option<String> = None;
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "lua")
                && !COMBINING.iter().any(|(c, _)| p.ends_with(c))
                && !p.ends_with(LIBRARY)
        })
        .collect();
    scripts.sort();
    assert!(!scripts.is_empty());
    for path in &scripts {
        let text = std::fs::read_to_string(path).unwrap();
        let found = blocks(&text);
        let c = found
            .iter()
            .find(|(n, _)| n == "common")
            .map(|(_, b)| b.clone());
        let c = c.unwrap_or_else(|| panic!("{} has no @common block", path.display()));
        match &common {
            None => common = Some(c),
            Some(first) => assert_eq!(
                &c,
                first,
                "@common of {} differs from {}",
                path.display(),
                scripts[0].display()
            ),
        }
        for (name, block) in found.into_iter().filter(|(n, _)| n.starts_with("limiter ")) {
            // A limiter block in two scripts is one block, copied.
            if let Some((_, first)) = sources.iter().find(|(n, _)| *n == name) {
                assert_eq!(&block, first, "{name} of {} differs", path.display());
                continue;
            }
            sources.push((name, block));
        }
    }
    let common = common.unwrap();

    let mut stale = Vec::new();
    for (script, leaves_out) in COMBINING {
        let path = dir().join(script);
        let mut text = std::fs::read_to_string(&path).unwrap();
        let mut stale_here = Vec::new();
        for (name, block) in blocks(&text.clone()) {
            let wanted = if name == "common" {
                common.clone()
            } else {
                sources
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_else(|| panic!("{script}: no source for {name}"))
            };
            if block != wanted {
                stale_here.push(name.clone());
                text = text.replacen(&block, &wanted, 1);
            }
        }
        for (name, _) in sources
            .iter()
            .filter(|(n, _)| !leaves_out.contains(&n.as_str()))
        {
            assert!(
                text.contains(&format!("-- @{name}\n")),
                "{script} lacks the block {name}"
            );
        }
        if update && !stale_here.is_empty() {
            std::fs::write(&path, &text).unwrap();
        }
        stale.extend(stale_here.into_iter().map(|n| format!("{script}: {n}")));
    }
    if update {
        return;
    }
    assert!(
        stale.is_empty(),
        "stale copies: {stale:?} (UPDATE_LUA=1 cargo test --test lua_blocks)"
    );
}
