//! The monitoring of docs/monitoring.md, end to end: `INFO ratelimit_counters` (one number per
//! line), the script shipped for redis_exporter's `-script` (docs/monitoring/redis_exporter.lua)
//! run by the server itself, and Debian's `prometheus-redis-exporter` running it against a real
//! server: after a known sequence of calls, every series it exports for the module is checked
//! with its exact value, and every series the alert rules (docs/monitoring/alerts.yml) and the
//! Grafana dashboard (docs/monitoring/dashboard.json) select must be among them. The rules must
//! pass `promtool check rules`. Where the exporter or promtool is not installed (`make deps`
//! installs both) the test that needs it says so and returns.

mod harness;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use harness::{Server, Target, cmd, info_field, ints};
use redis::{Connection, Value};
use redis_rate_limiter::command::registry::DESCRIPTORS;

/// The counters of every command, in the order INFO lists them.
const COUNTERS: [&str; 9] = [
    "calls",
    "allowed",
    "denied",
    "errors",
    "args",
    "wrongtype",
    "corrupt",
    "oom",
    "internal",
];

/// The gauge redis_exporter 1.45 makes of the script's pairs.
const SCRIPT_METRIC: &str = "redis_script_values";

/// The third key, as RL.TOP lists it, and as the script writes it in a label.
const ODD_KEY: &str = "tb:c é%";
const ODD_LABEL: &str = "tb:c %C3%A9%25";

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring")
}

fn read(name: &str) -> String {
    let path = monitoring_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn bucket(c: &mut Connection, key: &str, capacity: &str) -> i64 {
    // Refilling one token in 1000 s: nothing comes back during the test.
    ints(&cmd(c, &["RL.TOKENBUCKET", key, capacity, "0.001"]))[0]
}

/// On a fresh server: `tb:a` 5 admitted then 3 denied, `tb:b` 1 then 2, `tb:c é%` 1 then 1, a
/// bad argument and a wrong type: RL.TOKENBUCKET 15 calls, 7 admitted, 6 denied, 2 errors.
fn make_calls(c: &mut Connection) {
    let admitted: Vec<i64> = (0..8).map(|_| bucket(c, "tb:a", "5")).collect();
    assert_eq!(admitted, [1, 1, 1, 1, 1, 0, 0, 0]);
    let admitted: Vec<i64> = (0..3).map(|_| bucket(c, "tb:b", "1")).collect();
    assert_eq!(admitted, [1, 0, 0]);
    let admitted: Vec<i64> = (0..2).map(|_| bucket(c, ODD_KEY, "1")).collect();
    assert_eq!(admitted, [1, 0]);
    assert_eq!(
        cmd(c, &["RL.TOKENBUCKET", "tb:a", "x", "1"]),
        Err("ERR capacity must be an integer".to_string())
    );
    cmd(c, &["LPUSH", "plain", "v"]).unwrap();
    let wrong = cmd(c, &["RL.TOKENBUCKET", "plain", "5", "1"]).unwrap_err();
    assert!(wrong.starts_with("WRONGTYPE "), "{wrong}");
}

/// What the module counts after `make_calls`: every command's counters (RL.TOKENBUCKET's as
/// above, every other 0), in INFO's order.
fn expected_counters() -> Vec<(String, u64)> {
    let token_bucket = [15, 7, 6, 2, 1, 1, 0, 0, 0];
    let mut out = Vec::new();
    for d in DESCRIPTORS {
        let command = d.info_name();
        for (i, counter) in COUNTERS.iter().enumerate() {
            let value = if command == "rl_tokenbucket" {
                token_bucket[i]
            } else {
                0
            };
            out.push((format!("ratelimit_{command}_{counter}"), value));
        }
    }
    out
}

/// Every pair the script returns after `make_calls`: the counters, `INFO ratelimit_top` (128
/// slots of 184 bytes, 3 keys) and the three denied keys with their denials.
fn expected_script_pairs() -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = expected_counters().into_iter().collect();
    out.insert("ratelimit_top_slots".into(), 128);
    out.insert("ratelimit_top_keys".into(), 3);
    out.insert("ratelimit_top_bytes".into(), 23552);
    out.insert("ratelimit_top_denied:tb:a".into(), 3);
    out.insert("ratelimit_top_denied:tb:b".into(), 2);
    out.insert(format!("ratelimit_top_denied:{ODD_LABEL}"), 1);
    out
}

#[test]
fn info_counters_has_one_number_per_line() {
    let server = Server::start();
    let mut c = server.connect();
    make_calls(&mut c);
    let info: String = redis::cmd("INFO")
        .arg("ratelimit_counters")
        .query(&mut c)
        .unwrap();
    let lines: Vec<&str> = info.lines().filter(|l| !l.is_empty()).collect();
    let mut expected = vec!["# ratelimit_counters".to_string()];
    for (name, value) in expected_counters() {
        expected.push(format!("{name}:{value}"));
    }
    assert_eq!(lines, expected);
    assert_eq!(lines.len(), 1 + DESCRIPTORS.len() * 9);
    // The sections there were stay as they were.
    assert_eq!(
        info_field(&mut c, "ratelimit_limits", "ratelimit_rl_tokenbucket"),
        "calls=15,allowed=7,denied=6,errors=2,args=1,wrongtype=1,corrupt=0,oom=0,internal=0"
    );
    assert_eq!(
        info_field(&mut c, "ratelimit_top", "ratelimit_top_keys"),
        "3"
    );
    // `INFO ratelimit` (the module's name) holds all three sections, in this order.
    let all: String = redis::cmd("INFO").arg("ratelimit").query(&mut c).unwrap();
    let headers: Vec<&str> = all.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(
        headers,
        [
            "# ratelimit_limits",
            "# ratelimit_top",
            "# ratelimit_counters"
        ]
    );
}

/// The script's reply as (name, value) pairs, every element a bulk string as redis_exporter
/// requires.
fn script_pairs(reply: Value) -> BTreeMap<String, u64> {
    let Value::Array(items) = reply else {
        panic!("not an array: {reply:?}");
    };
    assert_eq!(items.len() % 2, 0, "{items:?}");
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("not a bulk string: {other:?}"),
    };
    let mut out = BTreeMap::new();
    for pair in items.chunks(2) {
        let value = text(&pair[1]);
        let parsed = value.parse().unwrap_or_else(|_| panic!("{value}"));
        assert_eq!(out.insert(text(&pair[0]), parsed), None, "{pair:?}");
    }
    out
}

#[test]
fn the_script_returns_every_counter_and_the_most_denied_keys() {
    let server = Server::start();
    let mut c = server.connect();
    let script = read("redis_exporter.lua");
    // Before any call: every counter 0, nothing denied.
    let fresh = script_pairs(cmd(&mut c, &["EVAL", &script, "0", "0"]).unwrap());
    let mut expected: BTreeMap<String, u64> = expected_counters()
        .into_iter()
        .map(|(n, _)| (n, 0))
        .collect();
    expected.insert("ratelimit_top_slots".into(), 128);
    expected.insert("ratelimit_top_keys".into(), 0);
    expected.insert("ratelimit_top_bytes".into(), 23552);
    assert_eq!(fresh, expected);

    make_calls(&mut c);
    // As redis_exporter calls it (`EVAL script 0 0`), and read-only (on a replica, or a user
    // allowed EVAL_RO only): RL.TOP writes no key, so a script may call it either way.
    let pairs = script_pairs(cmd(&mut c, &["EVAL", &script, "0", "0"]).unwrap());
    assert_eq!(pairs, expected_script_pairs());
    let read_only = script_pairs(cmd(&mut c, &["EVAL_RO", &script, "0", "0"]).unwrap());
    assert_eq!(read_only, pairs);

    // A user with only what docs/monitoring.md grants the exporter.
    cmd(
        &mut c,
        &[
            "ACL", "SETUSER", "script", "on", ">pw", "-@all", "+eval", "+info", "+rl.top",
        ],
    )
    .unwrap();
    let mut exporter = server.connect();
    cmd(&mut exporter, &["AUTH", "script", "pw"]).unwrap();
    let as_exporter = script_pairs(cmd(&mut exporter, &["EVAL", &script, "0", "0"]).unwrap());
    assert_eq!(as_exporter, pairs);

    // A user refused RL.TOP gets the counters alone.
    cmd(
        &mut c,
        &[
            "ACL", "SETUSER", "counters", "on", ">pw", "-@all", "+eval", "+info",
        ],
    )
    .unwrap();
    let mut counters_only = server.connect();
    cmd(&mut counters_only, &["AUTH", "counters", "pw"]).unwrap();
    let mut without_top = pairs.clone();
    without_top.retain(|name, _| !name.starts_with("ratelimit_top_denied:"));
    assert_eq!(without_top.len(), pairs.len() - 3);
    assert_eq!(
        script_pairs(cmd(&mut counters_only, &["EVAL", &script, "0", "0"]).unwrap()),
        without_top
    );

    // Without the module the script returns nothing rather than failing the scrape. (The user
    // goes first: while an ACL user names one of the module's commands, Valkey 8.1 and 9.1
    // refuse MODULE UNLOAD and Redis 8.2 crashes on it, docs/monitoring.md.)
    cmd(&mut c, &["ACL", "DELUSER", "script"]).unwrap();
    cmd(&mut c, &["MODULE", "UNLOAD", "ratelimit"]).unwrap();
    assert_eq!(
        cmd(&mut c, &["EVAL", &script, "0", "0"]),
        Ok(Value::Array(Vec::new()))
    );
}

/// A process killed and reaped when dropped (also when the test fails).
struct Exporter {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Exporter {
    fn start(binary: &Path, server: &Server) -> Exporter {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = match &server.target {
            Target::Unix(_) => format!("redis://127.0.0.1:{}", server.port),
            Target::Tcp { host, port } => format!("redis://{host}:{port}"),
        };
        let log = server.dir.path().join("exporter.log");
        let child = Command::new(binary)
            .args([
                "-redis.addr",
                &addr,
                "-script",
                monitoring_dir()
                    .join("redis_exporter.lua")
                    .to_str()
                    .unwrap(),
                "-web.listen-address",
                &format!("127.0.0.1:{port}"),
                "-redis-only-metrics",
                "-redis.user",
                "exporter",
                "-redis.password",
                "pw",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        Exporter { child, port, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /metrics`, waiting up to 10 s for the exporter to listen.
    fn metrics(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match http_get(self.port, "/metrics") {
                Ok(body) => return body,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)),
                        "no /metrics ({e}); exporter log:\n{}",
                        self.log()
                    );
                    sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other(format!("no header end: {response}")));
    };
    if !head.starts_with("HTTP/1.0 200 ") && !head.starts_with("HTTP/1.1 200 ") {
        return Err(std::io::Error::other(head.to_string()));
    }
    Ok(body.to_string())
}

/// One series of the exposition format: its name, its labels, its value as written.
#[derive(Debug)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: String,
}

/// The series of a `/metrics` body (text format 0.0.4: `name{a="b",c="d"} value`, label values
/// with `\\`, `\"` and `\n` escaped).
fn parse_metrics(body: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in body.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{line}"));
        let name = line[..name_end].to_string();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices();
            let mut label = String::new();
            let mut value = String::new();
            let mut in_value = false;
            let mut end = None;
            while let Some((i, ch)) = chars.next() {
                if in_value {
                    match ch {
                        '\\' => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, other)) => value.push(other),
                            None => panic!("{line}"),
                        },
                        '"' => {
                            labels.insert(std::mem::take(&mut label), std::mem::take(&mut value));
                            in_value = false;
                        }
                        _ => value.push(ch),
                    }
                } else {
                    match ch {
                        '}' => {
                            end = Some(i);
                            break;
                        }
                        '=' => {
                            assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                            in_value = true;
                        }
                        ',' => {}
                        _ => label.push(ch),
                    }
                }
            }
            let end = end.unwrap_or_else(|| panic!("{line}"));
            rest = &inner[end + 1..];
        }
        out.push(Series {
            name,
            labels,
            value: rest.trim().to_string(),
        });
    }
    out
}

/// A selector of a PromQL expression: the metric's name and its label matchers.
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// The selectors of `redis_*` series in a PromQL expression.
fn selectors(expr: &str) -> Vec<Selector> {
    let series = regex::Regex::new(r"\b(redis_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?").unwrap();
    let matcher =
        regex::Regex::new(r#"([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)""#).unwrap();
    series
        .captures_iter(expr)
        .map(|s| Selector {
            name: s[1].to_string(),
            matchers: s.get(2).map_or_else(Vec::new, |m| {
                matcher
                    .captures_iter(m.as_str())
                    .map(|c| {
                        (
                            c[1].to_string(),
                            c[2].to_string(),
                            c[3].replace("\\\\", "\\"),
                        )
                    })
                    .collect()
            }),
        })
        .collect()
}

fn selects(selector: &Selector, series: &Series) -> bool {
    if series.name != selector.name {
        return false;
    }
    selector.matchers.iter().all(|(label, op, value)| {
        // Added by Prometheus when it scrapes, and a Grafana variable in the dashboard.
        if label == "instance" {
            return true;
        }
        let actual = series.labels.get(label).map_or("", String::as_str);
        match op.as_str() {
            "=" => actual == value,
            "!=" => actual != value,
            _ => {
                let re = regex::Regex::new(&format!("^(?:{value})$")).unwrap();
                re.is_match(actual) == (op == "=~")
            }
        }
    })
}

/// The `expr:` lines of the alert rules (each on one line, as the file says).
fn rule_exprs() -> Vec<String> {
    read("alerts.yml")
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr: "))
        .map(str::to_string)
        .collect()
}

/// The `"expr"` strings of the dashboard's targets, unescaped.
fn dashboard_exprs() -> Vec<String> {
    let json = read("dashboard.json");
    let mut out = Vec::new();
    for part in json.split("\"expr\": \"").skip(1) {
        let mut expr = String::new();
        let mut chars = part.chars();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => expr.push(chars.next().unwrap()),
                '"' => break,
                _ => expr.push(ch),
            }
        }
        out.push(expr);
    }
    out
}

#[test]
fn redis_exporter_exports_the_counters_and_the_top_keys() {
    let Some(binary) = on_path("prometheus-redis-exporter") else {
        eprintln!(
            "skipped: prometheus-redis-exporter is not installed (make deps installs Debian's)"
        );
        return;
    };
    let server = Server::start();
    let mut c = server.connect();
    make_calls(&mut c);
    // The user docs/monitoring.md gives the exporter.
    cmd(
        &mut c,
        &[
            "ACL",
            "SETUSER",
            "exporter",
            "on",
            ">pw",
            "-@all",
            "+client|setname",
            "+info",
            "+eval",
            "+rl.top",
        ],
    )
    .unwrap();
    let mut exporter = Exporter::start(&binary, &server);
    let body = exporter.metrics();
    let series = parse_metrics(&body);

    let value = |name: &str| -> Vec<&str> {
        series
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value.as_str())
            .collect()
    };
    assert_eq!(
        value("redis_up"),
        ["1"],
        "exporter log:\n{}",
        exporter.log()
    );
    let scripted: BTreeMap<String, u64> = series
        .iter()
        .filter(|s| s.name == SCRIPT_METRIC)
        .map(|s| {
            assert_eq!(s.labels.keys().collect::<Vec<_>>(), ["key"], "{s:?}");
            (s.labels["key"].clone(), s.value.parse().unwrap())
        })
        .collect();
    assert_eq!(
        scripted,
        expected_script_pairs(),
        "exporter log:\n{}",
        exporter.log()
    );
    assert!(
        body.contains("\nredis_script_values{key=\"ratelimit_rl_tokenbucket_denied\"} 6\n"),
        "{body}"
    );
    // Nothing of INFO ratelimit reaches the exporter but through the script (1.45 exports the
    // INFO fields it knows by name, and none of a module's).
    let leaked: Vec<&Series> = series
        .iter()
        .filter(|s| s.name != SCRIPT_METRIC && s.name.contains("ratelimit"))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");

    // Every series the rules and the dashboard select is among those exported.
    for (file, exprs, count) in [
        ("alerts.yml", rule_exprs(), 5),
        ("dashboard.json", dashboard_exprs(), 12),
    ] {
        assert_eq!(exprs.len(), count, "{file}: {exprs:?}");
        for expr in &exprs {
            let used = selectors(expr);
            assert!(!used.is_empty(), "{file}: no redis_ series in {expr}");
            for selector in &used {
                assert!(
                    series.iter().any(|s| selects(selector, s)),
                    "{file}: nothing exported matches {selector:?} of {expr}"
                );
            }
        }
    }
}

/// `promtool <verb> rules <file>`, which must succeed: its output.
fn run_promtool(promtool: &Path, verb: &str, file: &Path) -> String {
    let out = Command::new(promtool)
        .args([verb, "rules"])
        .arg(file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = on_path("promtool") else {
        eprintln!("skipped: promtool is not installed (make deps installs Debian's prometheus)");
        return;
    };
    let stdout = run_promtool(&promtool, "check", &monitoring_dir().join("alerts.yml"));
    assert!(stdout.contains("SUCCESS: 5 rules found"), "{stdout}");

    // Each alert fires, with its labels and annotations, on the series the unit tests feed it,
    // and not on their neighbours (a denied key named like a counter among them).
    let tests = monitoring_dir().join("alerts_test.yml");
    let stdout = run_promtool(&promtool, "test", &tests);
    assert_eq!(
        stdout.lines().map(str::trim).collect::<Vec<_>>(),
        [
            format!("Unit Testing:  {}", tests.display()).as_str(),
            "SUCCESS",
            ""
        ]
    );

    // The rules on the clients' own series (the Rust client's tests check that its layer
    // exports what they use).
    let stdout = run_promtool(
        &promtool,
        "check",
        &monitoring_dir().join("client_alerts.yml"),
    );
    assert!(stdout.contains("SUCCESS: 2 rules found"), "{stdout}");
    let tests = monitoring_dir().join("client_alerts_test.yml");
    let stdout = run_promtool(&promtool, "test", &tests);
    assert_eq!(
        stdout.lines().map(str::trim).collect::<Vec<_>>(),
        [
            format!("Unit Testing:  {}", tests.display()).as_str(),
            "SUCCESS",
            ""
        ]
    );
}

/// The selectors checked above are what the rules mean: a wrong name or matcher would match
/// nothing.
#[test]
fn selectors_are_read_as_written() {
    let s = selectors(
        r#"sum(rate(redis_script_values{instance=~"$instance", key=~"ratelimit_(rl|cl)_.+_calls"}[5m])) / redis_up"#,
    );
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[0].name, "redis_script_values");
    assert_eq!(
        s[0].matchers,
        [
            ("instance".into(), "=~".into(), "$instance".into()),
            (
                "key".into(),
                "=~".into(),
                "ratelimit_(rl|cl)_.+_calls".into()
            )
        ]
    );
    assert_eq!(s[1].name, "redis_up");
    let series = |key: &str| Series {
        name: "redis_script_values".into(),
        labels: [("key".to_string(), key.to_string())].into(),
        value: "1".into(),
    };
    assert!(selects(&s[0], &series("ratelimit_cl_throttle_calls")));
    assert!(!selects(&s[0], &series("ratelimit_top_denied:x_calls")));
    assert!(!selects(&s[0], &series("ratelimit_rl_tokenbucket_calls2")));
    let parsed = parse_metrics("# HELP x\nredis_script_values{key=\"a\\\"b\"} 3\nredis_up 1\n");
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[0].labels["key"], "a\"b");
    assert_eq!(
        (parsed[1].name.as_str(), parsed[1].value.as_str()),
        ("redis_up", "1")
    );
}
