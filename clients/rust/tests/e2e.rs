//! The demo in headless Chromium, driven over WebDriver (chromedriver): apply a limit, send one
//! request and a burst, read the counters, the headers and the chart of the remaining count off
//! the page, peek, read the most-denied keys of the admin view, take a screenshot.
//! Needs the Debian packages `chromium` and `chromium-driver` (`make deps` installs them).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{Server, free_port};
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )?;
    // Read the head, then exactly Content-Length bytes (chromedriver keeps the connection
    // open), or chunks until the last one.
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::other("connection closed before the head"));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length = head.lines().find_map(|l| {
        l.strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
    });
    let chunked =
        head.contains("transfer-encoding: chunked") || head.contains("transfer-encoding:chunked");
    let mut body_raw = raw[head_end + 4..].to_vec();
    let complete = |b: &[u8]| match length {
        Some(n) => b.len() >= n,
        None if chunked => b.ends_with(b"0\r\n\r\n"),
        None => false,
    };
    while !complete(&body_raw) {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body_raw.extend_from_slice(&buf[..n]);
    }
    let rest = String::from_utf8_lossy(&body_raw).to_string();
    let rest = rest.as_str();
    let body = if chunked {
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    Ok((status, body))
}

struct Browser {
    port: u16,
    session: String,
    _driver: Proc,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        assert!(
            std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists(),
            "{CHROMIUM} and {CHROMEDRIVER} are needed: apt-get install chromium chromium-driver (make deps)"
        );
        let port = free_port();
        let driver = Proc(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver"),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while http(port, "GET", "/status", None).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1280,1700",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let (status, body) = http(port, "POST", "/session", Some(&caps)).unwrap();
        assert_eq!(status, 200, "new session: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let session = v["value"]["sessionId"].as_str().unwrap().to_string();
        Browser {
            port,
            session,
            _driver: driver,
            _profile: profile,
        }
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, text) = http(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body.as_ref(),
        )
        .unwrap();
        assert_eq!(status, 200, "{method} {path}: {text}");
        serde_json::from_str::<Value>(&text).unwrap()["value"].clone()
    }

    fn find(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    fn click(&self, css: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    fn fill(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.cmd("POST", &format!("/element/{id}/clear"), Some(json!({})));
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        );
    }

    fn text(&self, css: &str) -> String {
        let id = self.find(css);
        self.cmd("GET", &format!("/element/{id}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits until the element's text satisfies `ok`; returns it.
    fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let t = self.text(css);
            if ok(&t) {
                return t;
            }
            assert!(Instant::now() < deadline, "{css} stayed {t:?}");
            sleep(Duration::from_millis(50));
        }
    }

    /// Runs `script` in the page and returns its value.
    fn script(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Waits until `script`'s value satisfies `ok`; returns it.
    fn wait_script(&self, script: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let v = self.script(script);
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{script} stayed {v}");
            sleep(Duration::from_millis(50));
        }
    }

    /// The chart's points in order: (allowed, remaining).
    fn chart(&self) -> Vec<(bool, u64)> {
        let v = self.script(
            "return [...document.querySelectorAll('#chart circle.point')].map((c) => \
             [c.classList.contains('allowed'), c.classList.contains('denied'), \
             parseInt(c.getAttribute('data-remaining'), 10)])",
        );
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let allowed = p[0].as_bool().unwrap();
                assert_ne!(allowed, p[1].as_bool().unwrap(), "{p}");
                (allowed, p[2].as_u64().unwrap())
            })
            .collect()
    }

    fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let busy = self.cmd(
                "POST",
                "/execute/sync",
                Some(json!({"script": "return document.body.dataset.busy || '0'", "args": []})),
            );
            if busy == json!("0") {
                return;
            }
            assert!(Instant::now() < deadline, "requests never finished");
            sleep(Duration::from_millis(50));
        }
    }

    fn screenshot(&self, path: &PathBuf) {
        let b64 = self.cmd("GET", "/screenshot", None);
        let bytes = decode_base64(b64.as_str().unwrap());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(path, bytes).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
    }
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().filter(|&c| c != b'=').collect();
        let mut n = 0u32;
        for (i, &c) in data.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..data.len().saturating_sub(1)]);
    }
    out
}

fn start_demo(redis: &Server) -> (Proc, u16) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_ratelimit-demo"))
        .env("REDIS_URL", redis.url())
        .env("LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .spawn()
        .expect("demo binary");
    let proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while http(port, "GET", "/api/config", None).is_err() {
        assert!(Instant::now() < deadline, "demo did not start");
        sleep(Duration::from_millis(50));
    }
    (proc, port)
}

/// A line `<prefix><seconds>` where the seconds are `full` or one less: the window opened at the
/// first request by the real clock, and a slow browser can take more than a second to get here.
fn has_seconds_line(text: &str, prefix: &str, full: u64) -> bool {
    has_line(text, &format!("{prefix}{full}")) || has_line(text, &format!("{prefix}{}", full - 1))
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn demo_page_in_headless_chromium() {
    let redis = Server::with_module();
    let (_demo, port) = start_demo(&redis);
    let b = Browser::start();
    b.cmd(
        "POST",
        "/url",
        Some(json!({"url": format!("http://127.0.0.1:{port}/")})),
    );
    b.wait_text("#config-status", |t| t == "current: TOKENBUCKET 5 1");

    // A fixed window of 3 per hour: nothing refills during the test.
    b.click("#algorithm option[value=FIXEDWINDOW]");
    assert_eq!(b.text("#p1-label"), "limit");
    assert_eq!(b.text("#p2-label"), "window (s)");
    b.fill("#p1", "3");
    b.fill("#p2", "3600");
    b.click("#apply");
    b.wait_text("#config-status", |t| t == "applied: FIXEDWINDOW 3 3600");

    b.click("#send-one");
    b.wait_text("#allowed-count", |t| t == "1");
    assert_eq!(b.text("#remaining"), "2");
    assert_eq!(b.text("#last-status"), "200");
    let headers = b.text("#headers");
    assert!(
        has_line(&headers, "ratelimit-policy: \"fixedwindow\";q=3;w=3600"),
        "{headers}"
    );
    assert!(
        has_seconds_line(&headers, "ratelimit: \"fixedwindow\";r=2;t=", 3600),
        "{headers}"
    );
    assert!(has_line(&headers, "ratelimit-remaining: 2"), "{headers}");

    b.fill("#burst-size", "5");
    b.click("#send-burst");
    b.wait_text("#denied-count", |t| t == "3");
    b.wait_idle();
    assert_eq!(b.text("#allowed-count"), "3");
    assert_eq!(b.text("#denied-count"), "3");
    assert_eq!(b.text("#remaining"), "0");
    assert_eq!(b.text("#last-status"), "429");
    let headers = b.text("#headers");
    assert!(
        has_seconds_line(&headers, "retry-after: ", 3600),
        "{headers}"
    );
    assert!(
        has_line(&headers, "content-type: application/problem+json"),
        "{headers}"
    );
    let log = b.text("#log");
    assert_eq!(
        log.lines().filter(|l| l.contains(" 429 ")).count(),
        3,
        "{log}"
    );
    assert_eq!(
        log.lines().filter(|l| l.contains(" 200 ")).count(),
        3,
        "{log}"
    );

    // The peek reads the state and consumes nothing.
    let key = "rl:{demo}:demo:fixedwindow";
    let before: String = redis::cmd("GET")
        .arg(key)
        .query(&mut redis.connect())
        .unwrap();
    b.click("#peek");
    let peek = b.wait_text("#peek-result", |t| !t.is_empty());
    let v: Value = serde_json::from_str(&peek).unwrap();
    assert_eq!(v["key"], json!(key));
    assert_eq!(v["remaining"], json!(0));
    assert_eq!(v["limit"], json!(3));
    assert_eq!(v["mode"], json!("Module"));
    let after: String = redis::cmd("GET")
        .arg(key)
        .query(&mut redis.connect())
        .unwrap();
    assert_eq!(before, after);
    // The stored `fw <count> <start>`: the window holds 3.
    assert_eq!(after.split(' ').nth(1), Some("3"), "{after}");

    // The chart: a point per response, in the order they came (the burst's in any order),
    // remaining against time, each allowed or denied.
    let mut points = b.chart();
    assert_eq!(points.len(), 6, "{points:?}");
    assert_eq!(points[0], (true, 2));
    points[1..].sort();
    assert_eq!(
        points,
        vec![
            (true, 2),
            (false, 0),
            (false, 0),
            (false, 0),
            (true, 0),
            (true, 1)
        ]
    );
    assert_eq!(b.text("#chart-summary"), "6 requests: 3 allowed, 3 denied");
    let line = b.script(
        "return document.querySelector('#chart polyline').getAttribute('points').split(' ').length",
    );
    assert_eq!(line, json!(6));

    // The admin view's most-denied keys (RL.TOP, polled by the page): the key, its 3 denials.
    let rows_js = "return [...document.querySelectorAll('#top tbody tr')].map((r) => \
                   [...r.querySelectorAll('td')].slice(0, 4).map((d) => d.textContent))";
    let rows = b.wait_script(rows_js, |v| v[0][1] == json!("3"));
    assert_eq!(rows, json!([[key, "3", "0", "RL.FIXEDWINDOW"]]));
    let (status, body) = http(port, "GET", "/admin/top", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let top: Value = serde_json::from_str(&body).unwrap();
    let entry = &top["entries"][0];
    assert_eq!(
        (
            top["entries"].as_array().unwrap().len(),
            &entry["key"],
            &entry["denied"],
            &entry["error"],
            &entry["command"]
        ),
        (
            1,
            &json!(key),
            &json!(3),
            &json!(0),
            &json!("RL.FIXEDWINDOW")
        )
    );
    let (first, last) = (
        entry["first_denied_ms"].as_i64().unwrap(),
        entry["last_denied_ms"].as_i64().unwrap(),
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        first <= last && last <= now_ms && now_ms - first < 120_000,
        "{first} {last} {now_ms}"
    );

    // Another user has a fresh limit, and a chart of its own.
    b.fill("#user", "someone-else");
    b.click("#send-one");
    b.wait_text("#allowed-count", |t| t == "4");
    assert_eq!(b.text("#remaining"), "2");
    assert_eq!(b.chart(), vec![(true, 2)]);
    assert_eq!(b.text("#chart-user"), "someone-else");
    // Back to the first user: its chart again, for the screenshot.
    b.fill("#user", "demo");
    assert_eq!(b.chart().len(), 6);
    assert_eq!(b.text("#chart-user"), "demo");
    // Still one key denied: the other user was admitted.
    let rows = b.wait_script(rows_js, |v| v.as_array().is_some_and(|a| a.len() == 1));
    assert_eq!(rows[0][0], json!(key));

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("demo-e2e.png");
    b.screenshot(&shot);
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);

    let (status, metrics) = http(port, "GET", "/metrics", None).unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics
            .contains("ratelimit_decisions_total{limit=\"fixedwindow\",outcome=\"allowed\"} 4\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ratelimit_decisions_total{limit=\"fixedwindow\",outcome=\"denied\"} 3\n"),
        "{metrics}"
    );
}
