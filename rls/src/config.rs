//! envoyproxy/ratelimit's YAML configuration: read, checked and built into descriptor trees,
//! and the lookup of a request's descriptor in them.
//!
//! Every file of the configuration directory is one domain. A malformed file is refused whole
//! with a [`ConfigError`] led by the file's name and naming the entry (`domain.key_value`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use ratelimit_client::Algorithm;
use serde_yaml::Value;

/// A unit of `rate_limit`, as Envoy's `RateLimitResponse.RateLimit.Unit` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit a name stands for, in any case (`minute`, `MINUTE`).
    pub fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// Seconds in the unit: a month is 30 days and a year 365, as envoyproxy/ratelimit counts them.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The number of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a proto number (`None` for UNKNOWN and numbers no unit has).
    pub fn from_proto(n: i32) -> Option<Unit> {
        Some(match n {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// How a limit counts, chosen per descriptor with `algorithm:` (our addition to the format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `requests_per_unit` per window of one `unit` (the default, as envoyproxy/ratelimit).
    FixedWindow,
    /// A bucket of `burst` tokens (default `requests_per_unit`) refilled at
    /// `requests_per_unit` per `unit`.
    TokenBucket,
    /// GCRA: `requests_per_unit` per `unit`, `burst` at once (default `requests_per_unit`).
    Gcra,
    /// The weighted count of the current and the previous window.
    SlidingWindow,
    /// Every admission kept for one `unit`: exact, memory grows with the limit.
    SlidingLog,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "fixed_window" => Kind::FixedWindow,
            "token_bucket" => Kind::TokenBucket,
            "gcra" => Kind::Gcra,
            "sliding_window" => Kind::SlidingWindow,
            "sliding_log" => Kind::SlidingLog,
            _ => return None,
        })
    }

    /// The short tag of the kind in counter keys (`fw`), so that a change of algorithm never
    /// reads another kind's state.
    pub fn tag(self) -> &'static str {
        match self {
            Kind::FixedWindow => "fw",
            Kind::TokenBucket => "tb",
            Kind::Gcra => "gcra",
            Kind::SlidingWindow => "sw",
            Kind::SlidingLog => "sl",
        }
    }
}

/// One limit of the configuration (or of a request's own override).
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// The descriptor's path from its domain, `domain.key_value.key` (the anchor's stat key).
    pub full_key: String,
    pub requests_per_unit: u32,
    /// `None` when unlimited.
    pub unit: Option<Unit>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    pub name: String,
    pub replaces: Vec<String>,
    pub kind: Kind,
    /// `burst` (token bucket, GCRA); `None` means `requests_per_unit`.
    pub burst: Option<u32>,
}

impl Limit {
    /// The client's algorithm for this limit; `None` when nothing can ever be admitted
    /// (`requests_per_unit: 0`) or the limit is unlimited.
    pub fn algorithm(&self) -> Option<Algorithm> {
        let unit = self.unit?;
        if self.unlimited || self.requests_per_unit == 0 {
            return None;
        }
        let n = u64::from(self.requests_per_unit);
        let secs = unit.seconds() as f64;
        let burst = u64::from(self.burst.unwrap_or(self.requests_per_unit));
        Some(match self.kind {
            Kind::FixedWindow => Algorithm::FixedWindow {
                limit: n,
                window_sec: secs,
            },
            Kind::SlidingWindow => Algorithm::SlidingWindow {
                limit: n,
                window_sec: secs,
            },
            Kind::SlidingLog => Algorithm::SlidingLog {
                limit: n,
                window_sec: secs,
            },
            Kind::TokenBucket => Algorithm::TokenBucket {
                capacity: burst,
                refill_per_sec: n as f64 / secs,
            },
            Kind::Gcra => Algorithm::Gcra {
                max_burst: burst - 1,
                count_per_period: n,
                period_sec: secs,
            },
        })
    }
}

/// A configuration file refused: `file: what, at which entry`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err(file: &str, text: impl fmt::Display) -> ConfigError {
    ConfigError(format!("{file}: {text}"))
}

/// The keys envoyproxy/ratelimit accepts, and ours (`algorithm`, `burst`).
const KNOWN_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "algorithm",
    "burst",
];

/// Keys the anchor accepts whose effect this service does not have: accepted so that a
/// configuration loads unchanged, and named in a warning at load.
const IGNORED_KEYS: &[&str] = &["quota_mode", "value_to_metric", "metadata"];

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// The keys of `children` with a `*` in them, in file order, split on `*`.
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<Limit>>,
    share_threshold: bool,
}

/// A loaded configuration: the descriptor tree of each domain.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
    /// Warnings of the load (keys accepted without effect).
    pub warnings: Vec<String>,
}

/// What a request's descriptor matched.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched {
    pub limit: Arc<Limit>,
    /// The stats key: the limit's `full_key`, or with `detailed_metric` the request's own
    /// entries (`domain.key_value.key_value`).
    pub stats_key: String,
    /// The counter's identity: the request's entries, each `key_value` (a wildcard entry with
    /// `share_threshold` keeps its pattern, so all values it matches share one counter).
    pub counter: String,
}

/// One configuration file's text, named as errors name it.
pub struct File {
    pub name: String,
    pub text: String,
}

impl Config {
    /// Builds the configuration of a set of files; the first malformed one refuses all.
    pub fn load(files: &[File]) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for file in files {
            config.load_file(file)?;
        }
        Ok(config)
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    fn load_file(&mut self, file: &File) -> Result<(), ConfigError> {
        let name = file.name.as_str();
        let root: Value = serde_yaml::from_str(&file.text)
            .map_err(|e| err(name, format!("error loading config file: {e}")))?;
        let Value::Mapping(map) = &root else {
            return Err(err(
                name,
                "error loading config file: the file is not a mapping of domain and descriptors",
            ));
        };
        check_keys(name, "", map)?;
        let domain = match map.get("domain") {
            None | Some(Value::Null) => String::new(),
            Some(v) => scalar(name, "domain", "", v)?,
        };
        if domain.is_empty() {
            return Err(err(name, "config file cannot have empty domain"));
        }
        if self.domains.contains_key(&domain) {
            return Err(err(
                name,
                format!("duplicate domain '{domain}' in config file"),
            ));
        }
        let mut node = Node::default();
        let descriptors = list(name, &domain, map.get("descriptors"))?;
        load_descriptors(self, name, &domain, &mut node, descriptors)?;
        self.domains.insert(domain, node);
        Ok(())
    }

    /// The limit a request's descriptor (its entries, `(key, value)` in order) matches in
    /// `domain`, as envoyproxy/ratelimit looks it up: at each level `key_value` exactly, else
    /// the first wildcard value that matches, else `key` alone; the limit counts only at the
    /// request's last entry, and the walk stops at a level with no descriptors below it.
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut node = self.domains.get(domain)?;
        let mut found = None;
        let mut counter = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let mut via_pattern = None;
            let mut next = node.children.get(&exact);
            if next.is_none() {
                for (pattern, parts) in &node.wildcards {
                    if wildcard_match(parts, &exact) {
                        next = node.children.get(pattern);
                        via_pattern = Some(pattern.as_str());
                        break;
                    }
                }
            }
            if next.is_none() {
                next = node.children.get(*key);
            }
            if i > 0 {
                counter.push('.');
            }
            match (via_pattern, next) {
                (Some(pattern), Some(n)) if n.share_threshold => counter.push_str(pattern),
                _ => counter.push_str(&exact),
            }
            let Some(next) = next else { break };
            if i + 1 == entries.len() {
                found = next.limit.clone();
            }
            if next.children.is_empty() {
                break;
            }
            node = next;
        }
        let limit = found?;
        let stats_key = if limit.detailed_metric {
            let mut k = domain.to_string();
            for (key, value) in entries {
                k.push('.');
                k.push_str(key);
                if !value.is_empty() {
                    k.push('_');
                    k.push_str(value);
                }
            }
            k
        } else {
            limit.full_key.clone()
        };
        Some(Matched {
            limit,
            stats_key,
            counter,
        })
    }
}

/// Whether `value` matches a pattern split on `*`, each `*` standing for any characters.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

fn check_keys(file: &str, at: &str, map: &serde_yaml::Mapping) -> Result<(), ConfigError> {
    let place = |at: &str| {
        if at.is_empty() {
            String::new()
        } else {
            format!(" at '{at}'")
        }
    };
    for (k, v) in map {
        let Value::String(k) = k else {
            return Err(err(
                file,
                format!(
                    "config error, key is not of type string: {}{}",
                    show(k),
                    place(at)
                ),
            ));
        };
        if !KNOWN_KEYS.contains(&k.as_str()) {
            return Err(err(
                file,
                format!("config error, unknown key '{k}'{}", place(at)),
            ));
        }
        if k == "metadata" {
            continue;
        }
        match v {
            Value::Sequence(items) => {
                for item in items {
                    let Value::Mapping(m) = item else {
                        return Err(err(
                            file,
                            format!(
                                "config error, yaml file contains list of type other than map: {}{}",
                                show(item),
                                place(at)
                            ),
                        ));
                    };
                    check_keys(file, at, m)?;
                }
            }
            Value::Mapping(m) => check_keys(file, at, m)?,
            _ => {}
        }
    }
    Ok(())
}

fn show(v: &Value) -> String {
    serde_yaml::to_string(v)
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A scalar as text (`value: 123` is the string `123`, as the anchor reads it).
fn scalar(file: &str, field: &str, at: &str, v: &Value) -> Result<String, ConfigError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Ok(String::new()),
        other => Err(err(
            file,
            format!("'{field}' of '{at}' must be a string, not {}", show(other)),
        )),
    }
}

fn flag(file: &str, field: &str, at: &str, v: Option<&Value>) -> Result<bool, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(err(
            file,
            format!(
                "'{field}' of '{at}' must be true or false, not {}",
                show(other)
            ),
        )),
    }
}

fn number(
    file: &str,
    field: &str,
    at: &str,
    v: Option<&Value>,
) -> Result<Option<u32>, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                err(
                    file,
                    format!(
                        "'{field}' of '{at}' must be a whole number from 0 to 4294967295, not {n}"
                    ),
                )
            }),
        Some(other) => Err(err(
            file,
            format!(
                "'{field}' of '{at}' must be a whole number, not {}",
                show(other)
            ),
        )),
    }
}

fn list<'a>(file: &str, at: &str, v: Option<&'a Value>) -> Result<&'a [Value], ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Sequence(items)) => Ok(items),
        Some(other) => Err(err(
            file,
            format!(
                "'descriptors' of '{at}' must be a list, not {}",
                show(other)
            ),
        )),
    }
}

fn load_descriptors(
    config: &mut Config,
    file: &str,
    parent: &str,
    node: &mut Node,
    descriptors: &[Value],
) -> Result<(), ConfigError> {
    for d in descriptors {
        let Value::Mapping(d) = d else {
            return Err(err(
                file,
                format!("descriptor of '{parent}' is not a mapping"),
            ));
        };
        let key = match d.get("key") {
            Some(v) => scalar(file, "key", parent, v)?,
            None => String::new(),
        };
        if key.is_empty() {
            return Err(err(
                file,
                format!("descriptor has empty key (under '{parent}')"),
            ));
        }
        let value = match d.get("value") {
            Some(v) => scalar(file, "value", parent, v)?,
            None => String::new(),
        };
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let path = format!("{parent}.{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(err(
                file,
                format!("duplicate descriptor composite key '{path}'"),
            ));
        }
        for ignored in IGNORED_KEYS {
            if d.contains_key(*ignored) {
                config.warnings.push(format!(
                    "{file}: '{ignored}' of '{path}' is accepted but has no effect here"
                ));
            }
        }
        let shadow_mode = flag(file, "shadow_mode", &path, d.get("shadow_mode"))?;
        let detailed_metric = flag(file, "detailed_metric", &path, d.get("detailed_metric"))?;
        let share_threshold = flag(file, "share_threshold", &path, d.get("share_threshold"))?;
        if share_threshold && !final_key.contains('*') {
            return Err(err(
                file,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}' at '{path}'"
                ),
            ));
        }
        let limit = match d.get("rate_limit") {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(rl)) => Some(Arc::new(rate_limit(
                file,
                &path,
                rl,
                shadow_mode,
                detailed_metric,
            )?)),
            Some(other) => {
                return Err(err(
                    file,
                    format!(
                        "'rate_limit' of '{path}' must be a mapping, not {}",
                        show(other)
                    ),
                ));
            }
        };
        let mut child = Node {
            limit,
            share_threshold,
            ..Node::default()
        };
        let below = list(file, &path, d.get("descriptors"))?;
        load_descriptors(config, file, &path, &mut child, below)?;
        if final_key.contains('*') {
            let parts = final_key.split('*').map(str::to_string).collect();
            node.wildcards.push((final_key.clone(), parts));
        }
        node.children.insert(final_key, child);
    }
    Ok(())
}

fn rate_limit(
    file: &str,
    path: &str,
    rl: &serde_yaml::Mapping,
    shadow_mode: bool,
    detailed_metric: bool,
) -> Result<Limit, ConfigError> {
    let unlimited = flag(file, "unlimited", path, rl.get("unlimited"))?;
    let unit_text = match rl.get("unit") {
        Some(v) => scalar(file, "unit", path, v)?,
        None => String::new(),
    };
    let unit = Unit::parse(&unit_text);
    if unlimited {
        if unit.is_some() {
            return Err(err(
                file,
                format!("should not specify rate limit unit when unlimited (at '{path}')"),
            ));
        }
    } else if unit.is_none() {
        return Err(err(
            file,
            format!("invalid rate limit unit '{unit_text}' (at '{path}')"),
        ));
    }
    let requests_per_unit =
        number(file, "requests_per_unit", path, rl.get("requests_per_unit"))?.unwrap_or(0);
    let name = match rl.get("name") {
        Some(v) => scalar(file, "name", path, v)?,
        None => String::new(),
    };
    let mut replaces = Vec::new();
    match rl.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(items)) => {
            for item in items {
                let r = match item.as_mapping().and_then(|m| m.get("name")) {
                    Some(v) => scalar(file, "name", path, v)?,
                    None => String::new(),
                };
                if r.is_empty() {
                    return Err(err(
                        file,
                        format!("should not have an empty replaces entry (at '{path}')"),
                    ));
                }
                if r == name {
                    return Err(err(
                        file,
                        format!(
                            "replaces should not contain name of same descriptor ('{name}' at '{path}')"
                        ),
                    ));
                }
                replaces.push(r);
            }
        }
        Some(other) => {
            return Err(err(
                file,
                format!("'replaces' of '{path}' must be a list, not {}", show(other)),
            ));
        }
    }
    let kind = match rl.get("algorithm") {
        None | Some(Value::Null) => Kind::FixedWindow,
        Some(v) => {
            let a = scalar(file, "algorithm", path, v)?;
            Kind::parse(&a).ok_or_else(|| {
                err(
                    file,
                    format!(
                        "unknown algorithm '{a}' at '{path}' (fixed_window, token_bucket, gcra, sliding_window, sliding_log)"
                    ),
                )
            })?
        }
    };
    let burst = number(file, "burst", path, rl.get("burst"))?;
    if let Some(b) = burst {
        if !matches!(kind, Kind::TokenBucket | Kind::Gcra) {
            return Err(err(
                file,
                format!("'burst' at '{path}' applies to token_bucket and gcra only"),
            ));
        }
        if b == 0 {
            return Err(err(file, format!("'burst' at '{path}' must be at least 1")));
        }
    }
    if unlimited && (rl.contains_key("algorithm") || burst.is_some()) {
        return Err(err(
            file,
            format!("an unlimited descriptor takes no algorithm or burst (at '{path}')"),
        ));
    }
    Ok(Limit {
        full_key: path.to_string(),
        requests_per_unit,
        unit: if unlimited { None } else { unit },
        unlimited,
        shadow_mode,
        detailed_metric,
        name,
        replaces,
        kind,
        burst,
    })
}

/// The files of a directory, recursively, in name order; dot files left out when asked.
pub fn read_dir(dir: &std::path::Path, ignore_dot_files: bool) -> std::io::Result<Vec<File>> {
    let mut out = BTreeMap::new();
    walk(dir, dir, ignore_dot_files, &mut out)?;
    Ok(out
        .into_iter()
        .map(|(name, text)| File { name, text })
        .collect())
}

fn walk(
    root: &std::path::Path,
    dir: &std::path::Path,
    ignore_dot_files: bool,
    out: &mut BTreeMap<String, String>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if ignore_dot_files && name.starts_with('.') {
            continue;
        }
        // Kubernetes mounts a ConfigMap as `..data` and `..2024_...` folders beside links to
        // them: follow the links, skip the `..` folders themselves.
        if name.starts_with("..") {
            continue;
        }
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() {
            walk(root, &path, ignore_dot_files, out)?;
        } else if meta.is_file() {
            let text = std::fs::read_to_string(&path)?;
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.insert(rel.display().to_string(), text);
        }
    }
    Ok(())
}
