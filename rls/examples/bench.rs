//! `ShouldRateLimit` per second and its latency (p50, p99), with 1 and 4 descriptors a request,
//! straight over gRPC and through Envoy (HTTP/1.1 keep-alive), and the server calls a request
//! takes. Starts its own Redis with the module, the service and Envoy, on loopback only.
//!
//! `make bench-rls` (release build; Envoy from `make rls-deps`), or
//! `cargo run --release -p ratelimit-rls --example bench -- [seconds] [concurrency]`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONFIG: &str = r#"
domain: bench
descriptors:
  - key: d1
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: d2
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: d3
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: d4
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"#;

fn envoy_config(listen: u16, admin: u16, rls: u16, upstream: u16) -> String {
    let actions = |n: usize| {
        (1..=n)
            .map(|i| format!("{{actions: [{{request_headers: {{header_name: x-d{i}, descriptor_key: d{i}}}}}]}}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: l
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/one"}}
                route: {{cluster: upstream, rate_limits: [{one}]}}
              - match: {{prefix: "/four"}}
                route: {{cluster: upstream, rate_limits: [{four}]}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{cluster_name: upstream, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}
  - name: rls
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment: {{cluster_name: rls, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {rls}}}}}}}}}]}}]}}
"#,
        one = actions(1),
        four = actions(4)
    )
}

/// An HTTP/1.1 upstream answering 200 to everything, keeping connections open.
async fn upstream() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut have = Vec::new();
                loop {
                    let n = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    have.extend_from_slice(&buf[..n]);
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..end + 4);
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

struct Run {
    requests: u64,
    seconds: f64,
    latencies: Vec<Duration>,
    calls: u64,
}

impl Run {
    fn row(&mut self, what: &str) -> String {
        self.latencies.sort();
        let q = |p: f64| {
            let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
            self.latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        format!(
            "| {what} | {:.0} | {:.0} | {:.0} | {:.2} |",
            self.requests as f64 / self.seconds,
            q(0.50),
            q(0.99),
            self.calls as f64 / self.requests.max(1) as f64
        )
    }
}

async fn direct(rls: &Rls, descriptors: usize, concurrency: usize, seconds: f64) -> Run {
    // One call first: the connections made and the mode detected before the callers start.
    let warm: &[&[(&str, &str)]] = &[&[("d1", "warm")]];
    let r = rls
        .client()
        .await
        .should_rate_limit(request("bench", warm, 1))
        .await;
    assert_eq!(r.expect("answer").get_ref().overall_code, 1);
    let calls0 = rls.metric("ratelimit_rls_client_calls_total");
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let mut client = rls.client().await;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < until {
                let vals: Vec<(String, String)> = (1..=descriptors)
                    .map(|d| (format!("d{d}"), format!("t{t}-{}", i % 64)))
                    .collect();
                let entries: Vec<Vec<(&str, &str)>> = vals
                    .iter()
                    .map(|(k, v)| vec![(k.as_str(), v.as_str())])
                    .collect();
                let refs: Vec<&[(&str, &str)]> = entries.iter().map(|e| e.as_slice()).collect();
                let req = request("bench", &refs, 1);
                let start = Instant::now();
                let r = client.should_rate_limit(req).await.expect("answer");
                lat.push(start.elapsed());
                assert_eq!(r.get_ref().overall_code, 1);
                i += 1;
            }
            lat
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let took = started.elapsed().as_secs_f64().max(seconds);
    Run {
        requests: latencies.len() as u64,
        seconds: took,
        latencies,
        calls: rls.metric("ratelimit_rls_client_calls_total") - calls0,
    }
}

async fn through_envoy(
    rls: &Rls,
    port: u16,
    descriptors: usize,
    concurrency: usize,
    seconds: f64,
) -> Run {
    let path = if descriptors == 1 { "/one" } else { "/four" };
    // One request first: Envoy's connection to the service made before the callers start.
    let mut warm = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(
        &mut warm,
        format!("GET {path} HTTP/1.1\r\nhost: bench\r\nx-d1: warm\r\nx-d2: warm\r\nx-d3: warm\r\nx-d4: warm\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut warm, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let calls0 = rls.metric("ratelimit_rls_client_calls_total");
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            s.set_nodelay(true).unwrap();
            let mut lat = Vec::new();
            let mut buf = vec![0u8; 8192];
            let mut i = 0u64;
            while Instant::now() < until {
                let mut req = format!("GET {path} HTTP/1.1\r\nhost: bench\r\n");
                for d in 1..=descriptors {
                    req.push_str(&format!("x-d{d}: t{t}-{}\r\n", i % 64));
                }
                req.push_str("\r\n");
                let start = Instant::now();
                s.write_all(req.as_bytes()).await.unwrap();
                let mut have = Vec::new();
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "envoy closed the connection");
                    have.extend_from_slice(&buf[..n]);
                    if let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&have[..end]).to_string();
                        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if have.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                lat.push(start.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let took = started.elapsed().as_secs_f64().max(seconds);
    Run {
        requests: latencies.len() as u64,
        seconds: took,
        latencies,
        calls: rls.metric("ratelimit_rls_client_calls_total") - calls0,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let concurrency: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let redis = Redis::start(true);
    let dir = ConfigDir::new(&[("bench.yaml", CONFIG)]);
    let rls = Rls::start(&env_for(&dir, redis.port));
    let up = upstream().await;
    let (listen, admin) = (free_port(), free_port());
    let cfg = dir.root.path().join("envoy.yaml");
    std::fs::write(&cfg, envoy_config(listen, admin, rls.grpc_port, up)).unwrap();
    let envoy_bin = std::env::var_os("RLS_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/envoy")));
    let envoy = std::process::Command::new(envoy_bin)
        .arg("-c")
        .arg(&cfg)
        .args(["--concurrency", "1", "--disable-hot-restart", "-l", "error"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("envoy (make rls-deps)");
    // Killed when main returns or a run panics.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _envoy = Killed(envoy);
    eventually("Envoy ready", || {
        std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
            && http_get(admin, "/ready").0 == 200
    });
    println!(
        "{seconds} s a run, {concurrency} concurrent callers, on {}",
        server_binary().display()
    );
    println!();
    println!("| path | ShouldRateLimit/s | p50 µs | p99 µs | server calls per request |");
    println!("|---|---|---|---|---|");
    for d in [1, 4] {
        let mut r = direct(&rls, d, concurrency, seconds).await;
        println!("{}", r.row(&format!("gRPC, {d} descriptor(s)")));
    }
    for d in [1, 4] {
        let mut r = through_envoy(&rls, listen, d, concurrency, seconds).await;
        println!("{}", r.row(&format!("through Envoy, {d} descriptor(s)")));
    }
}
