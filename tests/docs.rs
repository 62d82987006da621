//! Every `$ redis-cli ...   # -> reply` line of `docs/*.md` is run and must reply what it says,
//! on a server with the module loaded (functions loaded by an example stay for the next ones).
//! Each code block starts on an empty server with the test clock at a whole minute; a
//! `$ sleep <seconds>` line moves the clock on by exactly that much. `UPDATE_DOCS=1 cargo test
//! --test docs` writes the replies in (the text after them, in parentheses, is prose: check it).
//!
//! Replies are written on one line: integers separated by spaces, a nested array in brackets
//! (`1 0 [1 2 0 10000 3] [1 99 0 60000 100]`), strings in double quotes.

mod harness;

use std::path::{Path, PathBuf};

use harness::{Server, advance_clock, cmd, set_clock};
use redis::Value;

const T0: i64 = 1_800_000_000_000_000;

fn render(v: &Value, nested: bool) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::BulkString(b) => format!("\"{}\"", String::from_utf8_lossy(b)),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::Nil => "(nil)".to_string(),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(|i| render(i, true)).collect();
            if nested {
                format!("[{}]", inner.join(" "))
            } else {
                inner.join(" ")
            }
        }
        other => format!("{other:?}"),
    }
}

/// `(command, claimed reply, start of the reply, end of the reply)` of a `$ redis-cli` line.
fn parse(line: &str) -> Option<(&str, &str, usize, usize)> {
    let rest = line.strip_prefix("$ redis-cli ")?;
    let arrow = line.find("# -> ")?;
    let command = rest.get(..arrow - "$ redis-cli ".len())?.trim();
    let start = arrow + "# -> ".len();
    let end = line[start..].find("  (").map_or(line.len(), |i| start + i);
    Some((command, line[start..end].trim_end(), start, end))
}

/// The words of a command line; `"$(cat path)"` (a path from the repository's root) is that
/// file's text, as the shell would pass it.
fn arguments(command: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut words = command.split_whitespace();
    while let Some(w) = words.next() {
        if w == "\"$(cat" {
            let path = words.next().unwrap_or_default().trim_end_matches(")\"");
            out.push(std::fs::read_to_string(root.join(path)).unwrap());
        } else {
            out.push(w.to_string());
        }
    }
    out
}

fn docs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_example_in_the_docs_replies_as_shown() {
    let update = std::env::var("UPDATE_DOCS").is_ok();
    let s = Server::with_test_clock();
    let mut c = s.connect();
    let mut checked = 0;
    let mut wrong = Vec::new();
    let mut failed = Vec::new();
    for path in docs() {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out: Vec<String> = Vec::new();
        let mut in_block = false;
        for line in text.lines() {
            let mut line = line.to_string();
            if line.starts_with("```") {
                in_block = !in_block;
                if in_block {
                    cmd(&mut c, &["FLUSHALL"]).unwrap();
                    set_clock(&mut c, T0);
                }
            } else if in_block && let Some(seconds) = line.strip_prefix("$ sleep ") {
                let us = (seconds.trim().parse::<f64>().unwrap() * 1e6).round() as i64;
                advance_clock(&mut c, us);
            } else if in_block && line.starts_with("$ redis-cli ") {
                let Some((command, claimed, start, end)) = parse(&line) else {
                    panic!("{}: no `# -> reply` on: {line}", path.display());
                };
                let args = arguments(command);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let got = match cmd(&mut c, &args) {
                    Ok(v) => render(&v, false),
                    Err(e) => format!("(error) {e}"),
                };
                checked += 1;
                // An error is shown only where the page means to show one.
                if got.starts_with("(error)") && !claimed.starts_with("(error)") {
                    failed.push(format!("{}: {command}: {got}", path.display()));
                }
                if got != claimed {
                    wrong.push(format!(
                        "{}: {command}: shows {claimed}, replies {got}",
                        path.display()
                    ));
                    line = format!("{}{got}{}", &line[..start], &line[end..]);
                }
            }
            out.push(line);
        }
        if update {
            let mut new = out.join("\n");
            new.push('\n');
            std::fs::write(&path, new).unwrap();
        }
    }
    assert!(checked >= 20, "only {checked} examples found");
    assert!(
        failed.is_empty(),
        "examples that fail:\n{}",
        failed.join("\n")
    );
    assert!(
        update || wrong.is_empty(),
        "{} examples are stale (UPDATE_DOCS=1 cargo test --test docs):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
