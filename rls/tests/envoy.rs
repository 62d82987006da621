//! End to end behind a real Envoy 1.40 (`make rls-deps` installs it from PyPI, pinned): an
//! upstream HTTP server, Envoy with `envoy.filters.http.ratelimit` and route actions (remote
//! address from `x-forwarded-for`, a request header, generic keys), on two listeners that differ
//! only in `failure_mode_deny`. Exact 200/429 counts per descriptor, the `x-ratelimit-*`
//! headers, shadow mode, unlimited, a reload mid-run and a malformed one, Redis down, and the
//! service down.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: user
    value: vip
    rate_limit: {unlimited: true}
  - key: generic_key
    value: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: generic_key
    value: free
    rate_limit: {unlimited: true}
  - key: generic_key
    value: reload
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("RLS_ENVOY") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
    assert!(
        p.exists(),
        "{} is missing: `make rls-deps` installs Envoy",
        p.display()
    );
    p
}

/// An HTTP/1.1 server answering 200 `ok` to every request, keeping connections open.
fn upstream() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match r.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

struct Envoy {
    child: Child,
    deny_port: u16,
    allow_port: u16,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listener(name: &str, port: u16, deny: bool) -> String {
    format!(
        r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/shadow"}}
                route: {{cluster: upstream, rate_limits: [{{actions: [{{generic_key: {{descriptor_value: shadow}}}}]}}]}}
              - match: {{prefix: "/free"}}
                route: {{cluster: upstream, rate_limits: [{{actions: [{{generic_key: {{descriptor_value: free}}}}]}}]}}
              - match: {{prefix: "/reload"}}
                route: {{cluster: upstream, rate_limits: [{{actions: [{{generic_key: {{descriptor_value: reload}}}}]}}]}}
              - match: {{prefix: "/"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{{remote_address: {{}}}}]
                  - actions: [{{request_headers: {{header_name: x-user, descriptor_key: user}}}}]
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: {deny}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
"#
    )
}

fn start_envoy(upstream: u16, rls: u16, dir: &std::path::Path) -> Envoy {
    let (deny_port, allow_port, admin) = (free_port(), free_port(), free_port());
    let cluster = |name: &str, port: u16, h2: bool| {
        let opts = if h2 {
            r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}"#
        } else {
            ""
        };
        format!(
            r#"
  - name: {name}
    type: STATIC
    connect_timeout: 1s{opts}
    load_assignment:
      cluster_name: {name}
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]
"#
        )
    };
    let config = format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nstatic_resources:\n  listeners:{}{}\n  clusters:{}{}",
        listener("deny", deny_port, true),
        listener("allow", allow_port, false),
        cluster("upstream", upstream, false),
        cluster("rls", rls, true),
    );
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let log = std::fs::File::create(dir.join("envoy.log")).unwrap();
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&path)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("envoy");
    let mut envoy = Envoy {
        child,
        deny_port,
        allow_port,
    };
    let log = || std::fs::read_to_string(dir.join("envoy.log")).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(s)) = envoy.child.try_wait() {
            panic!("envoy exited: {s}\n{}", log());
        }
        if TcpStream::connect(("127.0.0.1", admin)).is_ok()
            && http_get(admin, "/ready").0 == 200
            && TcpStream::connect(("127.0.0.1", deny_port)).is_ok()
            && TcpStream::connect(("127.0.0.1", allow_port)).is_ok()
        {
            return envoy;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Envoy not ready in 30 s:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One GET through Envoy: the status and the response's headers (names in lower case).
fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, BTreeMap<String, String>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, _) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

fn statuses(port: u16, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| get(port, path, headers).0).collect()
}

fn ratelimit_headers(h: &BTreeMap<String, String>) -> Vec<(String, String)> {
    h.iter()
        .filter(|(k, _)| k.starts_with("x-ratelimit-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[test]
fn behind_envoy() {
    let mut redis = Redis::start(true);
    let dir = ConfigDir::new(&[("edge.yaml", EDGE)]);
    let mut rls = Rls::start(&env_for(&dir, redis.port));
    let up = upstream();
    let envoy = start_envoy(up, rls.grpc_port, dir.root.path());
    let deny = envoy.deny_port;
    let allow = envoy.allow_port;

    // Per IP 4 a minute and per user 6, both descriptors of each request decided together.
    let a1 = [("x-forwarded-for", "10.0.0.1"), ("x-user", "ann")];
    let first = get(deny, "/", &a1);
    assert_eq!(first.0, 200);
    assert_eq!(
        ratelimit_headers(&first.1),
        vec![
            (
                "x-ratelimit-limit".to_string(),
                "4, 4;w=60, 6;w=60".to_string()
            ),
            ("x-ratelimit-remaining".to_string(), "3".to_string()),
            ("x-ratelimit-reset".to_string(), "60".to_string()),
        ],
        "{:?}",
        first.1
    );
    assert_eq!(statuses(deny, "/", &a1, 5), [200, 200, 200, 429, 429]);
    let denied = get(deny, "/", &a1);
    assert_eq!(denied.0, 429);
    let h = ratelimit_headers(&denied.1);
    assert_eq!(
        h[0],
        (
            "x-ratelimit-limit".to_string(),
            "4, 4;w=60, 6;w=60".to_string()
        )
    );
    assert_eq!(h[1], ("x-ratelimit-remaining".to_string(), "0".to_string()));
    // ann took 4 of her 6 (the denied requests took nothing): 2 more from another address.
    let a2 = [("x-forwarded-for", "10.0.0.2"), ("x-user", "ann")];
    assert_eq!(statuses(deny, "/", &a2, 3), [200, 200, 429]);
    // 10.0.0.2 took 2 of its 4 (the last request, denied by ann's limit, took nothing).
    let b2 = [("x-forwarded-for", "10.0.0.2"), ("x-user", "bob")];
    assert_eq!(statuses(allow, "/", &b2, 3), [200, 200, 429]);
    // The counters on the server: one per address and per user.
    let mut keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "rls:*"])
        .lines()
        .map(String::from)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "rls:{edge}:fw:remote_address_10.0.0.1",
            "rls:{edge}:fw:remote_address_10.0.0.2",
            "rls:{edge}:fw:user_ann",
            "rls:{edge}:fw:user_bob",
        ]
    );
    // Unlimited, by value (vip) and by generic key.
    let vip = [("x-forwarded-for", "10.0.0.3"), ("x-user", "vip")];
    assert_eq!(statuses(deny, "/", &vip, 4), [200, 200, 200, 200]);
    assert_eq!(statuses(deny, "/free", &[], 8), [200; 8]);
    // Shadow mode: 1 a minute, never denied, counted.
    assert_eq!(statuses(deny, "/shadow", &[], 3), [200, 200, 200]);
    let m = rls.metrics();
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_rate_limit_shadow_mode{domain="edge",key1="generic_key_shadow"}"#
        ),
        2
    );
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="remote_address"}"#
        ),
        4
    );
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"}"#
        ),
        1
    );

    // A reload mid-run: 2 a minute, then 5 (the 2 taken still count), then a malformed file
    // that leaves 5 in force.
    assert_eq!(statuses(deny, "/reload", &[], 3), [200, 200, 429]);
    dir.write(
        "edge.yaml",
        &EDGE.replace("requests_per_unit: 2}", "requests_per_unit: 5}"),
    );
    eventually("the reload", || {
        rls.metric("ratelimit_service_config_load_success") == 2
    });
    assert_eq!(statuses(deny, "/reload", &[], 4), [200, 200, 200, 429]);
    dir.write("edge.yaml", "domain: edge\ndescriptors:\n  - key: generic_key\n    value: reload\n    rate_limit: {unit: minute}\n    descriptor: []\n");
    eventually("the refusal", || {
        rls.metric("ratelimit_service_config_load_error") == 1
    });
    assert_eq!(statuses(deny, "/reload", &[], 1), [429]);
    assert_eq!(statuses(deny, "/free", &[], 1), [200]);
    assert!(
        http_get(rls.http_port, "/healthcheck")
            .1
            .contains("edge.yaml: config error, unknown key 'descriptor'")
    );

    // Redis down: the service's call fails (as envoyproxy/ratelimit's does), and Envoy's
    // failure_mode_deny decides: 500 on the denying listener, 200 on the other.
    redis.stop();
    let c3 = [("x-forwarded-for", "10.0.0.9"), ("x-user", "cat")];
    assert_eq!(statuses(deny, "/", &c3, 2), [500, 500]);
    assert_eq!(statuses(allow, "/", &c3, 2), [200, 200]);
    redis.restart();
    eventually("Redis answering again", || get(deny, "/", &c3).0 == 200);

    // The service down: the same two answers.
    rls.stop();
    assert_eq!(statuses(deny, "/", &c3, 2), [500, 500]);
    assert_eq!(statuses(allow, "/", &c3, 2), [200, 200]);
    drop(envoy);
}
