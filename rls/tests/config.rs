//! The configuration format: what envoyproxy/ratelimit's own configuration tests check (the
//! lookup of each kind of descriptor, wildcards, unlimited, replaces, shadow mode, detailed
//! metrics, and every malformed file it refuses, with its message), as cases of our own, plus
//! the `algorithm` and `burst` keys that are ours.

use ratelimit_client::Algorithm;
use ratelimit_rls::config::{Config, File, Kind, Unit};

fn load(name: &str, text: &str) -> Result<Config, String> {
    Config::load(&[File {
        name: name.into(),
        text: text.into(),
    }])
    .map_err(|e| e.0)
}

const BASIC: &str = r#"
# A service with per-route and per-client limits.
domain: shop
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: client
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: client
        value: partner
        rate_limit: {unit: second, requests_per_unit: 50}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: minute, requests_per_unit: 300}
  - key: remote_address
    value: 10.0.0.2
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 1}
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: region
        value: eu
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: health
    rate_limit: {unlimited: true}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: week, requests_per_unit: 70}
  - key: path
    value: /api/*
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: path
    value: /v*/items/*/price
    rate_limit: {unit: year, requests_per_unit: 4}
  - key: batch
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 2}
"#;

#[test]
fn lookups_follow_the_anchor() {
    let c = load("basic.yaml", BASIC).unwrap();
    // entries of the request, then Some((requests_per_unit, unit, stats key, counter)) or None
    type Row<'a> = (
        &'a [(&'a str, &'a str)],
        Option<(u32, Unit, &'a str, &'a str)>,
    );
    let rows: &[Row] = &[
        // A level without a limit of its own, and a value that names nothing.
        (&[("route", "checkout")], None),
        (&[("route", "home")], None),
        (&[], None),
        // Key only below a key and value; a value of its own overrides it.
        (
            &[("route", "checkout"), ("client", "abc")],
            Some((
                5,
                Unit::Second,
                "shop.route_checkout.client",
                "route_checkout.client_abc",
            )),
        ),
        (
            &[("route", "checkout"), ("client", "partner")],
            Some((
                50,
                Unit::Second,
                "shop.route_checkout.client_partner",
                "route_checkout.client_partner",
            )),
        ),
        // Key only at the top; a value's own limit; a value with no limit lets it through.
        (
            &[("remote_address", "10.9.9.9")],
            Some((
                20,
                Unit::Minute,
                "shop.remote_address",
                "remote_address_10.9.9.9",
            )),
        ),
        (
            &[("remote_address", "10.0.0.1")],
            Some((
                300,
                Unit::Minute,
                "shop.remote_address_10.0.0.1",
                "remote_address_10.0.0.1",
            )),
        ),
        (&[("remote_address", "10.0.0.2")], None),
        (
            &[("user", "ann")],
            Some((1, Unit::Hour, "shop.user", "user_ann")),
        ),
        // The limit counts at the request's last entry only; a deeper entry the tree lacks
        // matches nothing.
        (
            &[("plan", "free")],
            Some((15, Unit::Day, "shop.plan_free", "plan_free")),
        ),
        (
            &[("plan", "free"), ("region", "eu")],
            Some((
                25,
                Unit::Day,
                "shop.plan_free.region_eu",
                "plan_free.region_eu",
            )),
        ),
        (&[("plan", "free"), ("region", "us")], None),
        // More entries than the tree is deep.
        (&[("user", "ann"), ("device", "x")], None),
        // detailed_metric: the stat key is the request's own entries.
        (
            &[("tenant", "acme")],
            Some((70, Unit::Week, "shop.tenant_acme", "tenant_acme")),
        ),
        // Wildcards: trailing, and in the middle.
        (
            &[("path", "/api/a/b")],
            Some((3, Unit::Month, "shop.path_/api/*", "path_/api/a/b")),
        ),
        (
            &[("path", "/api/")],
            Some((3, Unit::Month, "shop.path_/api/*", "path_/api/")),
        ),
        (&[("path", "/apx")], None),
        (
            &[("path", "/v2/items/7/price")],
            Some((
                4,
                Unit::Year,
                "shop.path_/v*/items/*/price",
                "path_/v2/items/7/price",
            )),
        ),
        (&[("path", "/v2/items/7/cost")], None),
        // Another domain, and a domain that is not configured.
        (&[("user", "ann")], None),
    ];
    for (i, (entries, want)) in rows.iter().enumerate() {
        let domain = if i + 1 == rows.len() { "other" } else { "shop" };
        let got = c.lookup(domain, entries).map(|m| {
            (
                m.limit.requests_per_unit,
                m.limit.unit.unwrap(),
                m.stats_key.clone(),
                m.counter.clone(),
            )
        });
        let want = want.map(|(n, u, k, c)| (n, u, k.to_string(), c.to_string()));
        assert_eq!(got, want, "row {i}: {entries:?}");
    }
    let user = c.lookup("shop", &[("user", "ann")]).unwrap();
    assert_eq!(user.limit.name, "per_user");
    let health = c.lookup("shop", &[("health", "x")]).unwrap();
    assert!(health.limit.unlimited);
    assert_eq!(health.limit.unit, None);
    assert_eq!(health.limit.algorithm(), None);
    let batch = c.lookup("shop", &[("batch", "x")]).unwrap();
    assert!(batch.limit.shadow_mode);
    assert!(!user.limit.shadow_mode);
}

#[test]
fn units_are_the_anchors() {
    // name as written, then seconds and the proto number
    let rows = [
        ("second", 1, 1),
        ("MINUTE", 60, 2),
        ("Hour", 3_600, 3),
        ("day", 86_400, 4),
        ("month", 2_592_000, 5),
        ("year", 31_536_000, 6),
        ("week", 604_800, 7),
    ];
    for (name, secs, proto) in rows {
        let u = Unit::parse(name).unwrap();
        assert_eq!((u.seconds(), u.proto()), (secs, proto), "{name}");
        assert_eq!(Unit::from_proto(proto), Some(u));
    }
    assert_eq!(Unit::parse("fortnight"), None);
    assert_eq!(Unit::from_proto(0), None);
}

#[test]
fn replaces_and_share_threshold() {
    let text = r#"
domain: d
descriptors:
  - key: a
    rate_limit: {name: wide, unit: second, requests_per_unit: 10}
  - key: b
    rate_limit:
      unit: second
      requests_per_unit: 20
      replaces: [{name: wide}]
  - key: f
    value: files*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;
    let c = load("r.yaml", text).unwrap();
    let b = c.lookup("d", &[("b", "x")]).unwrap();
    assert_eq!(b.limit.replaces, vec!["wide".to_string()]);
    // Every value the pattern matches shares one counter.
    let f1 = c.lookup("d", &[("f", "files/a")]).unwrap();
    let f2 = c.lookup("d", &[("f", "files/b")]).unwrap();
    assert_eq!(
        (f1.counter.as_str(), f2.counter.as_str()),
        ("f_files*", "f_files*")
    );
}

#[test]
fn algorithms_and_their_parameters() {
    let text = r#"
domain: d
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
  - key: tb_burst
    rate_limit: {unit: minute, requests_per_unit: 30, algorithm: token_bucket, burst: 5}
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: gcra, burst: 2}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: sl
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_log}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
"#;
    let c = load("a.yaml", text).unwrap();
    let algo = |k: &str| c.lookup("d", &[(k, "v")]).unwrap().limit.algorithm();
    let rows: &[(&str, Option<Algorithm>)] = &[
        (
            "fw",
            Some(Algorithm::FixedWindow {
                limit: 60,
                window_sec: 60.0,
            }),
        ),
        (
            "tb",
            Some(Algorithm::TokenBucket {
                capacity: 10,
                refill_per_sec: 10.0,
            }),
        ),
        (
            "tb_burst",
            Some(Algorithm::TokenBucket {
                capacity: 5,
                refill_per_sec: 0.5,
            }),
        ),
        (
            "gcra",
            Some(Algorithm::Gcra {
                max_burst: 1,
                count_per_period: 4,
                period_sec: 1.0,
            }),
        ),
        (
            "sw",
            Some(Algorithm::SlidingWindow {
                limit: 100,
                window_sec: 3600.0,
            }),
        ),
        (
            "sl",
            Some(Algorithm::SlidingLog {
                limit: 3,
                window_sec: 1.0,
            }),
        ),
        // Nothing is ever admitted: decided without a call.
        ("zero", None),
    ];
    for (k, want) in rows {
        assert_eq!(&algo(k), want, "{k}");
    }
    assert_eq!(
        c.lookup("d", &[("fw", "v")]).unwrap().limit.kind,
        Kind::FixedWindow
    );
}

#[test]
fn malformed_files_are_refused_naming_file_and_entry() {
    // file name, its text, then the whole message
    let rows: &[(&str, &str, &str)] = &[
        (
            "empty_domain.yaml",
            "domain: ''\n",
            "empty_domain.yaml: config file cannot have empty domain",
        ),
        (
            "no_domain.yaml",
            "descriptors: []\n",
            "no_domain.yaml: config file cannot have empty domain",
        ),
        (
            "empty_key.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: v\n",
            "empty_key.yaml: descriptor has empty key (under 'd.a')",
        ),
        (
            "duplicate_key.yaml",
            "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
            "duplicate_key.yaml: duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "bad_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "bad_unit.yaml: invalid rate limit unit 'fortnight' (at 'd.k')",
        ),
        (
            "no_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
            "no_unit.yaml: invalid rate limit unit '' (at 'd.k')",
        ),
        (
            "unknown_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n",
            "unknown_unit.yaml: invalid rate limit unit 'unknown' (at 'd.k')",
        ),
        (
            "unlimited_with_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day}\n",
            "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited (at 'd.k')",
        ),
        (
            "replaces_self.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: n, unit: day, requests_per_unit: 1, replaces: [{name: n}]}\n",
            "replaces_self.yaml: replaces should not contain name of same descriptor ('n' at 'd.k')",
        ),
        (
            "replaces_empty.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: n, unit: day, requests_per_unit: 1, replaces: [{name: ''}]}\n",
            "replaces_empty.yaml: should not have an empty replaces entry (at 'd.k')",
        ),
        (
            "misspelled_key.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day, requests_per_unit: 1}\n",
            "misspelled_key.yaml: config error, unknown key 'ratelimit'",
        ),
        (
            "misspelled_key2.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, request_per_unit: 1}\n",
            "misspelled_key2.yaml: config error, unknown key 'request_per_unit'",
        ),
        (
            "non_string_key.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    0.25: x\n",
            "non_string_key.yaml: config error, key is not of type string: 0.25",
        ),
        (
            "non_map_list.yaml",
            "domain: d\ndescriptors:\n  - a\n",
            "non_map_list.yaml: config error, yaml file contains list of type other than map: a",
        ),
        (
            "share_threshold.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "share_threshold.yaml: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v' at 'd.k_v'",
        ),
        (
            "bad_algorithm.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, algorithm: leaky}\n",
            "bad_algorithm.yaml: unknown algorithm 'leaky' at 'd.k' (fixed_window, token_bucket, gcra, sliding_window, sliding_log)",
        ),
        (
            "burst_fixed.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, burst: 3}\n",
            "burst_fixed.yaml: 'burst' at 'd.k' applies to token_bucket and gcra only",
        ),
        (
            "burst_zero.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, algorithm: gcra, burst: 0}\n",
            "burst_zero.yaml: 'burst' at 'd.k' must be at least 1",
        ),
        (
            "negative.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n",
            "negative.yaml: 'requests_per_unit' of 'd.k' must be a whole number from 0 to 4294967295, not -1",
        ),
        (
            "flag.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
            "flag.yaml: 'shadow_mode' of 'd.k' must be true or false, not maybe",
        ),
        (
            "not_a_map.yaml",
            "- domain: d\n",
            "not_a_map.yaml: error loading config file: the file is not a mapping of domain and descriptors",
        ),
    ];
    for (name, text, want) in rows {
        assert_eq!(load(name, text).err().as_deref(), Some(*want), "{name}");
    }
    // Bad YAML: the parser's own words after the file's name.
    let bad = load("bad_yaml.yaml", "domain: d\ndescriptors:\n  - key: [\n").unwrap_err();
    assert!(
        bad.starts_with("bad_yaml.yaml: error loading config file: "),
        "{bad}"
    );
    // Two files with one domain: the second one is named.
    let twice = Config::load(&[
        File {
            name: "a.yaml".into(),
            text: "domain: d\n".into(),
        },
        File {
            name: "b.yaml".into(),
            text: "domain: d\n".into(),
        },
    ])
    .unwrap_err();
    assert_eq!(twice.0, "b.yaml: duplicate domain 'd' in config file");
}

#[test]
fn keys_without_effect_load_with_a_warning() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    metadata: {a: 1}\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
    let c = load("q.yaml", text).unwrap();
    assert_eq!(
        c.warnings,
        vec![
            "q.yaml: 'quota_mode' of 'd.k' is accepted but has no effect here".to_string(),
            "q.yaml: 'metadata' of 'd.k' is accepted but has no effect here".to_string(),
        ]
    );
}

#[test]
fn a_directory_loads_every_file_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.yaml"), "domain: two\n").unwrap();
    std::fs::write(dir.path().join("a.yaml"), "domain: one\n").unwrap();
    std::fs::write(dir.path().join(".hidden.yaml"), "domain: three\n").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/c.yaml"), "domain: four\n").unwrap();
    let names = |ignore| {
        ratelimit_rls::config::read_dir(dir.path(), ignore)
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(true), vec!["a.yaml", "b.yaml", "sub/c.yaml"]);
    assert_eq!(
        names(false),
        vec![".hidden.yaml", "a.yaml", "b.yaml", "sub/c.yaml"]
    );
    let files = ratelimit_rls::config::read_dir(dir.path(), false).unwrap();
    assert_eq!(Config::load(&files).unwrap().domains(), 4);
}
