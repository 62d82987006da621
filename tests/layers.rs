//! The layers of the source tree, checked on the source text: every file's references to other
//! files of its crate (`use` trees, and paths through `crate::`, `super::`, `self::` or a child
//! module) go only to the layers its own layer may use, and no files reference each other,
//! directly or around a circle. The layers and what each may use are read from the table in
//! `docs/architecture.md`, so the document and the tree cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file: its module path from the crate root (`["store", "zset"]`), and whether it
/// is a `mod.rs` or `lib.rs` (a module that has children in its folder).
#[derive(Debug, Clone)]
struct SourceFile {
    module: Vec<String>,
    path: PathBuf,
    text: String,
}

fn collect(dir: &Path, prefix: &[String], out: &mut Vec<SourceFile>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let mut module = prefix.to_vec();
            module.push(name);
            collect(&path, &module, out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut module = prefix.to_vec();
            if stem != "mod" && stem != "lib" {
                module.push(stem.to_string());
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let path = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            out.push(SourceFile { module, path, text });
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Punct(char),
    /// `::`
    PathSep,
}

/// The tokens of Rust source that matter for paths: identifiers and punctuation, with comments,
/// string, byte-string, C-string and character literals and lifetimes left out.
fn tokens(src: &str) -> Vec<Token> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let at = |i: usize| b.get(i).copied().unwrap_or('\0');
    while i < b.len() {
        let c = b[i];
        if c == '/' && at(i + 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if (c == 'r' || ((c == 'b' || c == 'c') && at(i + 1) == 'r'))
            && matches!(at(i + 1 + usize::from(c != 'r')), '"' | '#')
            && !at(i.wrapping_sub(1)).is_alphanumeric()
        {
            // A raw string: r"..." or r#"..."#, with a b or c before it.
            let mut j = i + 1 + usize::from(c != 'r');
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(Token::Ident(c.to_string()));
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' || (c == '$' && at(i + 1).is_alphabetic()) {
            let start = i;
            i += 1;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            // b"..", c"..": the prefix of a literal, not a name.
            if (word == "b" || word == "c") && at(i) == '"' {
                continue;
            }
            out.push(Token::Ident(word.trim_start_matches('$').to_string()));
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token::PathSep);
            i += 2;
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                i += 1;
            }
        } else {
            if !c.is_whitespace() {
                out.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// Expands a `use` tree starting at `tokens[i]` into whole paths; returns them and the index
/// after the tree.
fn use_tree(t: &[Token], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match t.get(i) {
            Some(Token::Ident(w)) if w == "as" => {
                // `x as y`: the name y is local; the path is what came before.
                i += 2;
                out.push(path);
                return i;
            }
            Some(Token::Ident(w)) => {
                path.push(w.clone());
                i += 1;
            }
            Some(Token::PathSep) => i += 1,
            Some(Token::Punct('{')) => {
                i += 1;
                loop {
                    match t.get(i) {
                        Some(Token::Punct('}')) => return i + 1,
                        Some(Token::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = use_tree(t, i, &path, out),
                    }
                }
            }
            Some(Token::Punct('*')) => {
                out.push(path);
                return i + 1;
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

/// A path as written in `file`, resolved to absolute module segments (the item's name may be
/// the last segment), or `None` for a path outside the crate.
fn absolute(file: &SourceFile, inline_depth: usize, path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut base: Vec<String> = file.module.clone();
    let mut rest = &path[1..];
    match first.as_str() {
        "crate" => base.clear(),
        "self" => {}
        "super" => {
            // Inside an inline module (`mod tests { .. }`) the first `super`s stay in the file.
            let mut supers: usize = 1;
            while rest.first().is_some_and(|s| s == "super") {
                supers += 1;
                rest = &rest[1..];
            }
            for _ in 0..supers.saturating_sub(inline_depth) {
                base.pop()?;
            }
        }
        _ => {
            // A child module declared by this file (`mod x;` makes `x::..` a path into it).
            if !child_modules(&file.text).contains(first) {
                return None;
            }
            rest = path;
        }
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

fn child_modules(text: &str) -> BTreeSet<String> {
    let t = tokens(text);
    let mut out = BTreeSet::new();
    for w in t.windows(3) {
        if let [Token::Ident(m), Token::Ident(name), Token::Punct(';')] = w
            && m == "mod"
        {
            out.insert(name.clone());
        }
    }
    out
}

/// The file a module path lands in: the deepest module of the path that is a file.
fn target(files: &[SourceFile], path: &[String]) -> Option<usize> {
    (0..=path.len())
        .rev()
        .find_map(|n| files.iter().position(|f| f.module == path[..n]))
}

/// Every file each file references (itself excluded).
fn references(files: &[SourceFile]) -> Vec<BTreeSet<usize>> {
    files
        .iter()
        .enumerate()
        .map(|(me, file)| {
            let t = tokens(&file.text);
            let mut paths: Vec<(usize, Vec<String>)> = Vec::new();
            // Inline modules open at these brace depths.
            let mut depth = 0usize;
            let mut inline: Vec<usize> = Vec::new();
            let mut i = 0;
            while i < t.len() {
                match &t[i] {
                    Token::Punct('{') => {
                        if i >= 2
                            && matches!((&t[i - 2], &t[i - 1]), (Token::Ident(m), Token::Ident(_)) if m == "mod")
                        {
                            inline.push(depth);
                        }
                        depth += 1;
                        i += 1;
                    }
                    Token::Punct('}') => {
                        depth = depth.saturating_sub(1);
                        if inline.last() == Some(&depth) {
                            inline.pop();
                        }
                        i += 1;
                    }
                    Token::Ident(w) if w == "use" => {
                        let mut found = Vec::new();
                        i = use_tree(&t, i + 1, &[], &mut found);
                        paths.extend(found.into_iter().map(|p| (inline.len(), p)));
                    }
                    Token::Ident(w) if matches!(t.get(i + 1), Some(Token::PathSep)) => {
                        // A qualified path in code: take it whole.
                        let preceded = i > 0 && t[i - 1] == Token::PathSep;
                        let mut path = vec![w.clone()];
                        let mut j = i + 1;
                        while let (Some(Token::PathSep), Some(Token::Ident(next))) =
                            (t.get(j), t.get(j + 1))
                        {
                            path.push(next.clone());
                            j += 2;
                        }
                        if !preceded {
                            paths.push((inline.len(), path));
                        }
                        i = j;
                    }
                    _ => i += 1,
                }
            }
            paths
                .iter()
                .filter_map(|(inline, p)| absolute(file, *inline, p))
                .filter_map(|p| target(files, &p))
                .filter(|&to| to != me)
                .collect()
        })
        .collect()
}

/// Files that reference each other around a circle (strongly connected components of more than
/// one file), each as its files' paths.
fn cycles(files: &[SourceFile], refs: &[BTreeSet<usize>]) -> Vec<Vec<String>> {
    // Kosaraju: finish order on the graph, then components on the reversed graph.
    let n = files.len();
    let mut order = Vec::new();
    let mut seen = vec![false; n];
    for start in 0..n {
        if seen[start] {
            continue;
        }
        let mut stack = vec![(start, refs[start].iter().copied().collect::<Vec<_>>())];
        seen[start] = true;
        while let Some((node, next)) = stack.last_mut() {
            if let Some(m) = next.pop() {
                if !seen[m] {
                    seen[m] = true;
                    stack.push((m, refs[m].iter().copied().collect()));
                }
            } else {
                order.push(*node);
                stack.pop();
            }
        }
    }
    let mut reverse = vec![Vec::new(); n];
    for (from, tos) in refs.iter().enumerate() {
        for &to in tos {
            reverse[to].push(from);
        }
    }
    let mut component = vec![usize::MAX; n];
    let mut out = Vec::new();
    for &start in order.iter().rev() {
        if component[start] != usize::MAX {
            continue;
        }
        let mut members = vec![start];
        component[start] = start;
        let mut k = 0;
        while k < members.len() {
            for &m in &reverse[members[k]] {
                if component[m] == usize::MAX {
                    component[m] = start;
                    members.push(m);
                }
            }
            k += 1;
        }
        if members.len() > 1 {
            let mut names: Vec<String> = members
                .iter()
                .map(|&m| files[m].path.display().to_string())
                .collect();
            names.sort();
            out.push(names);
        }
    }
    out
}

/// The layer table of docs/architecture.md for one crate: rows `| `layer` | may use |` between
/// the marker comment `<!-- layers: NAME -->` and the next blank line. A layer is a folder of
/// `src/` or a file at its root (without `.rs`); `lib` is the crate root.
fn layer_table(crate_name: &str) -> BTreeMap<String, BTreeSet<String>> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("docs/architecture.md");
    let marker = format!("<!-- layers: {crate_name} -->");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/architecture.md has no '{marker}'"));
    let mut table = BTreeMap::new();
    for line in doc[start + marker.len()..].lines().skip(1) {
        if line.trim().is_empty() {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let names = |cell: &str| -> BTreeSet<String> {
            cell.split(',')
                .map(|s| s.trim().trim_matches('`').trim_end_matches('/').to_string())
                .filter(|s| !s.is_empty() && s != "nothing" && !s.starts_with('-'))
                .collect()
        };
        if let [_, layer, uses, ..] = cells.as_slice() {
            let layer = layer.trim_matches('`').trim_end_matches('/').to_string();
            if layer.is_empty() || layer.starts_with('-') || layer == "layer" {
                continue;
            }
            table.insert(layer, names(uses));
        }
    }
    assert!(!table.is_empty(), "the table after '{marker}' is empty");
    table
}

fn layer_of(file: &SourceFile) -> String {
    file.module.first().cloned().unwrap_or_else(|| "lib".into())
}

fn check_crate(crate_name: &str, src: &Path) {
    let mut files = Vec::new();
    collect(src, &[], &mut files);
    assert!(files.len() > 3, "{}: no sources", src.display());
    let refs = references(&files);
    let circles = cycles(&files, &refs);
    assert!(
        circles.is_empty(),
        "{crate_name}: files that import each other: {circles:#?}"
    );
    let table = layer_table(crate_name);
    let mut wrong = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let layer = layer_of(file);
        let Some(allowed) = table.get(&layer) else {
            wrong.push(format!(
                "{}: layer '{layer}' is not in docs/architecture.md",
                file.path.display()
            ));
            continue;
        };
        for &to in &refs[i] {
            let other = layer_of(&files[to]);
            if other != layer && !allowed.contains(&other) && !allowed.contains("everything") {
                wrong.push(format!(
                    "{} ({layer}) uses {} ({other})",
                    file.path.display(),
                    files[to].path.display()
                ));
            }
        }
    }
    for layer in table.keys() {
        assert!(
            files.iter().any(|f| &layer_of(f) == layer),
            "{crate_name}: docs/architecture.md names a layer '{layer}' that is not in the tree"
        );
    }
    assert!(wrong.is_empty(), "{crate_name}: {wrong:#?}");
}

#[test]
fn the_module_imports_only_downward_and_in_no_circle() {
    check_crate("module", &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}

#[test]
fn the_rust_client_imports_only_downward_and_in_no_circle() {
    check_crate(
        "client",
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/rust/src"),
    );
}

#[test]
fn the_rate_limit_service_imports_only_downward_and_in_no_circle() {
    check_crate(
        "rls",
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("rls/src"),
    );
}

/// The checker itself: a circle, a path through a child module, an inline test module's `super`,
/// and references hidden in comments and strings.
#[test]
fn the_checker_sees_circles_and_ignores_comments_and_strings() {
    let file = |module: &[&str], text: &str| SourceFile {
        module: module.iter().map(|s| s.to_string()).collect(),
        path: PathBuf::from(module.join("/")),
        text: text.to_string(),
    };
    let files = vec![
        file(&[], "mod a; mod b; use a::X;"),
        file(
            &["a"],
            "use crate::b::{self, Y as Z};\n// crate::lib_only\npub struct X;",
        ),
        file(
            &["b"],
            "pub struct Y; fn f() { let _ = \"crate::a::X\"; let c = 'x'; super::a::X; }",
        ),
        file(
            &["c"],
            "#[cfg(test)] mod tests { use super::*; fn g<'a>(_: &'a str) { let _ = r#\"crate::a\"#; } }",
        ),
    ];
    let refs = references(&files);
    assert_eq!(refs[0], BTreeSet::from([1]));
    assert_eq!(refs[1], BTreeSet::from([2]));
    assert_eq!(refs[2], BTreeSet::from([1]));
    assert_eq!(refs[3], BTreeSet::new());
    assert_eq!(
        cycles(&files, &refs),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
}
