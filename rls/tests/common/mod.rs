//! Real processes for the service's tests: a Redis server (with this tree's module, or
//! without), the `ratelimit-rls` binary with an environment and a configuration directory, a
//! gRPC client for it, and plain HTTP GETs. Everything started here is killed on drop.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// The module built in this workspace, next to the test binary (or `RL_MODULE`).
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("RL_MODULE") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let candidate = dir.join("libredis_rate_limiter.so");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "libredis_rate_limiter.so not found next to {}",
        exe.display()
    );
}

/// `RL_REDIS_SERVER`, or Debian's `redis-server`.
pub fn server_binary() -> PathBuf {
    std::env::var_os("RL_REDIS_SERVER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

fn wait_port(port: u16, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on {port}: {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        sleep(Duration::from_millis(20));
    }
}

pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    _dir: tempfile::TempDir,
    module: bool,
}

impl Redis {
    pub fn start(module: bool) -> Redis {
        Self::on_port(free_port(), module)
    }

    pub fn on_port(port: u16, module: bool) -> Redis {
        Self::launch(port, module, &[])
    }

    /// A server with more arguments (`--cluster-enabled yes`).
    pub fn start_with(module: bool, extra: &[&str]) -> Redis {
        Self::launch(free_port(), module, extra)
    }

    /// A Sentinel watching the master on `master_port` as `mymaster`.
    pub fn sentinel(master_port: u16) -> Redis {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sentinel");
        wait_port(port, "sentinel", &mut child);
        Redis {
            child: Some(child),
            port,
            _dir: dir,
            module: false,
        }
    }

    fn launch(port: u16, module: bool, extra: &[&str]) -> Redis {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(server_binary());
        cmd.args(extra);
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if module {
            cmd.arg("--loadmodule").arg(module_path());
        }
        let mut child = cmd.spawn().expect("redis-server");
        wait_port(port, "redis-server", &mut child);
        Redis {
            child: Some(child),
            port,
            _dir: dir,
            module,
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let again = Redis::on_port(self.port, self.module);
        *self = again;
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A configuration directory laid out as envoyproxy/ratelimit reads it:
/// `<root>/<subdirectory>/config/*.yaml`.
pub struct ConfigDir {
    pub root: tempfile::TempDir,
}

impl ConfigDir {
    pub fn new(files: &[(&str, &str)]) -> ConfigDir {
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(root.path().join("current/ratelimit/config")).unwrap();
        let dir = ConfigDir { root };
        for (name, text) in files {
            dir.write(name, text);
        }
        dir
    }

    pub fn config_dir(&self) -> PathBuf {
        self.root.path().join("current/ratelimit/config")
    }

    /// Writes a file by a rename, as a deployment swaps it in.
    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.root.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config_dir().join(name)).unwrap();
    }
}

pub struct Rls {
    child: Option<Child>,
    pub grpc_port: u16,
    pub http_port: u16,
    pub prom_port: u16,
    pub log: PathBuf,
    _logdir: tempfile::TempDir,
}

/// The binary cargo built for the tests, or (for the bench, an example) the one beside it.
pub fn rls_binary() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_ratelimit-rls") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("exe path");
            let dir = exe.parent().and_then(Path::parent).expect("target dir");
            dir.join("ratelimit-rls")
        }
    }
}

/// The environment of a service for `redis_port` reading `dir`, with Prometheus on.
pub fn env_for(dir: &ConfigDir, redis_port: u16) -> Vec<(String, String)> {
    [
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("REDIS_URL", format!("127.0.0.1:{redis_port}")),
        (
            "RUNTIME_ROOT",
            dir.root.path().join("current").display().to_string(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_string()),
        ("USE_PROMETHEUS", "true".to_string()),
        ("RLS_RELOAD_INTERVAL_MS", "50".to_string()),
        // A loaded machine answers late now and then: a generous bound, never reached when
        // the server is down (refused at once).
        ("RLS_REDIS_TIMEOUT_MS", "2000".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

impl Rls {
    pub fn start(env: &[(String, String)]) -> Rls {
        let (grpc_port, http_port, prom_port) = (free_port(), free_port(), free_port());
        let logdir = tempfile::tempdir().unwrap();
        let log = logdir.path().join("rls.log");
        let mut cmd = Command::new(rls_binary());
        cmd.env_clear()
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc_port.to_string())
            .env("HOST", "127.0.0.1")
            .env("PORT", http_port.to_string())
            .env("PROMETHEUS_ADDR", format!("127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("ratelimit-rls");
        wait_port(grpc_port, "ratelimit-rls", &mut child);
        Rls {
            child: Some(child),
            grpc_port,
            http_port,
            prom_port,
            log,
            _logdir: logdir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc_port))
            .await
            .expect("gRPC connect")
    }

    pub fn metrics(&self) -> String {
        http_get(self.prom_port, "/metrics").1
    }

    /// The value of one series of the scrape (`name{labels}` as written), or 0 when absent.
    pub fn metric(&self, series: &str) -> u64 {
        metric(&self.metrics(), series)
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn metric(scrape: &str, series: &str) -> u64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
}

/// `GET path` (HTTP/1.1, the connection closed after it): the status and the body.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: hits,
    }
}

/// (overall code, per descriptor (code, remaining)): 1 is OK, 2 OVER_LIMIT.
pub fn codes(r: &RateLimitResponse) -> (i32, Vec<(i32, u32)>) {
    (
        r.overall_code,
        r.statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect(),
    )
}

/// Waits until `f` holds (a reload seen, a counter reached), within a generous deadline.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(20));
    }
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
