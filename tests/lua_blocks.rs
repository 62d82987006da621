//! The Lua twins share code by copy: every script carries the same `@common` block, and
//! `all.lua` carries a copy of each algorithm's `@limiter` block. This test fails when a copy has
//! drifted from its source; `UPDATE_LUA=1 cargo test --test lua_blocks` rewrites the copies.

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

#[test]
fn shared_lua_blocks_are_identical_copies() {
    let update = std::env::var("UPDATE_LUA").is_ok();
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut common: Option<String> = None;
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "lua") && !p.ends_with("all.lua"))
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
        sources.extend(found.into_iter().filter(|(n, _)| n.starts_with("limiter ")));
    }
    let common = common.unwrap();

    let all_path = dir().join("all.lua");
    let mut all = std::fs::read_to_string(&all_path).unwrap();
    let mut stale = Vec::new();
    for (name, block) in blocks(&all.clone()) {
        let wanted = if name == "common" {
            common.clone()
        } else {
            sources
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| b.clone())
                .unwrap_or_else(|| panic!("all.lua: no source for {name}"))
        };
        if block != wanted {
            stale.push(name.clone());
            all = all.replacen(&block, &wanted, 1);
        }
    }
    // RL.ALL combines every limiter but CL.THROTTLE (redis-cell's reply and key format).
    let combined = |n: &str| n != "limiter throttle";
    for (name, _) in sources.iter().filter(|(n, _)| combined(n)) {
        assert!(
            all.contains(&format!("-- @{name}\n")),
            "all.lua lacks the block {name}"
        );
    }
    if update && !stale.is_empty() {
        std::fs::write(&all_path, &all).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "stale copies in all.lua: {stale:?} (UPDATE_LUA=1 cargo test --test lua_blocks)"
    );
}
