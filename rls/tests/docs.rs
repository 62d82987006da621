//! docs/rls.md as code: its YAML block is the example configuration `make rls` reads (which
//! loads and decides as the page says), its environment block runs `--check` as it is (the root
//! moved to a copy of the example), and every variable the service reads is in its table.

use std::path::Path;

use ratelimit_rls::config::{Config, Unit, read_dir};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The code blocks of a page with their language.
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```")
            && !lang.is_empty()
        {
            let mut body = String::new();
            for l in lines.by_ref() {
                if l == "```" {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            out.push((lang.to_string(), body));
        }
    }
    out
}

fn page() -> String {
    std::fs::read_to_string(root().join("docs/rls.md")).unwrap()
}

#[test]
fn the_yaml_block_is_the_example_and_decides_as_described() {
    let example = root().join("rls/examples/config/config.yaml");
    let yaml: Vec<String> = blocks(&page())
        .into_iter()
        .filter(|(l, _)| l == "yaml")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(yaml, vec![std::fs::read_to_string(&example).unwrap()]);
    let files = read_dir(example.parent().unwrap(), false).unwrap();
    let c = Config::load(&files).unwrap();
    let rpu = |entries: &[(&str, &str)]| {
        c.lookup("front", entries)
            .map(|m| (m.limit.requests_per_unit, m.limit.unit, m.limit.unlimited))
    };
    // descriptor, then (requests_per_unit, unit, unlimited) or None
    type Row<'a> = (&'a [(&'a str, &'a str)], Option<(u32, Option<Unit>, bool)>);
    let rows: &[Row] = &[
        (
            &[("remote_address", "10.1.1.1")],
            Some((100, Some(Unit::Minute), false)),
        ),
        (
            &[
                ("source_cluster", "edge"),
                ("destination_cluster", "orders"),
            ],
            Some((50, Some(Unit::Second), false)),
        ),
        (
            &[
                ("source_cluster", "edge"),
                ("destination_cluster", "billing"),
            ],
            Some((5, Some(Unit::Second), false)),
        ),
        (
            &[
                ("source_cluster", "edge"),
                ("destination_cluster", "static"),
            ],
            Some((0, None, true)),
        ),
        (
            &[
                ("source_cluster", "other"),
                ("destination_cluster", "billing"),
            ],
            None,
        ),
        (
            &[("partner", "acme")],
            Some((20, Some(Unit::Second), false)),
        ),
        (
            &[("client_id", "blocked")],
            Some((0, Some(Unit::Minute), false)),
        ),
        (&[("client_id", "other")], None),
        (&[("api_key", "k1")], Some((1000, Some(Unit::Hour), false))),
        (
            &[("path", "/search/books")],
            Some((2, Some(Unit::Second), false)),
        ),
        (&[("path", "/cart")], None),
    ];
    for (entries, want) in rows {
        assert_eq!(&rpu(entries), want, "{entries:?}");
    }
    let partner = c.lookup("front", &[("partner", "acme")]).unwrap();
    assert_eq!(partner.limit.replaces, vec!["billing".to_string()]);
    let key = c.lookup("front", &[("api_key", "k1")]).unwrap();
    assert!(key.limit.shadow_mode);
    assert_eq!(key.stats_key, "front.api_key_k1");
    let search = c.lookup("front", &[("path", "/search/books")]).unwrap();
    assert_eq!(
        search.limit.algorithm(),
        Some(ratelimit_client::Algorithm::TokenBucket {
            capacity: 10,
            refill_per_sec: 2.0
        })
    );
    assert_eq!(
        c.lookup("front", &[("client_id", "blocked")])
            .unwrap()
            .limit
            .algorithm(),
        None
    );
}

#[test]
fn the_environment_block_runs_as_it_is() {
    let sh: Vec<String> = blocks(&page())
        .into_iter()
        .filter(|(l, _)| l == "sh")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(sh.len(), 1);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::copy(
        root().join("rls/examples/config/config.yaml"),
        config.join("config.yaml"),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-rls"));
    cmd.env_clear().arg("--check");
    for line in sh[0].lines() {
        let (k, v) = line.split_once('=').expect("KEY=value");
        cmd.env(
            k,
            if k == "RUNTIME_ROOT" {
                dir.path().to_str().unwrap()
            } else {
                v
            },
        );
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{}: 1 domain(s), valid", config.display())
    );
}

#[test]
fn every_variable_read_is_in_the_table() {
    let settings = std::fs::read_to_string(root().join("rls/src/settings.rs")).unwrap();
    let page = page();
    let mut names = Vec::new();
    for part in settings.split('"').skip(1).step_by(2) {
        if part.len() > 3 && part.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            names.push(part.to_string());
        }
    }
    for skip in ["SINGLE", "SENTINEL", "CLUSTER"] {
        names.retain(|n| n != skip);
    }
    assert!(names.len() >= 20, "{names:?}");
    for n in names {
        assert!(
            page.contains(&format!("`{n}`")),
            "docs/rls.md does not name `{n}`"
        );
    }
}
