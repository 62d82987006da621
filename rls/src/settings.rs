//! Every environment variable the service reads, with its default: envoyproxy/ratelimit's names
//! where they apply, and `RLS_*` for what is ours.

use std::path::PathBuf;
use std::time::Duration;

/// How Redis is reached (`REDIS_TYPE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisType {
    /// One server at a URL.
    Single(String),
    /// The master named by a set of Sentinels (`REDIS_URL=master,host:port,host:port`).
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    /// A Redis Cluster, some of whose nodes are listed (`REDIS_URL=host:port,host:port`).
    Cluster(Vec<String>),
}

/// What a decision is when Redis cannot answer (`RLS_FAILURE_POLICY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnRedisFailure {
    /// The call fails (gRPC `UNAVAILABLE`), and Envoy's `failure_mode_deny` decides, as with
    /// envoyproxy/ratelimit (the default).
    Error,
    /// Admitted.
    Open,
    /// Denied.
    Closed,
    /// Decided by in-process buckets sized for `n` instances (the client's `Local` policy).
    Local(u32),
}

#[derive(Clone, Debug)]
pub struct Settings {
    /// `GRPC_HOST`:`GRPC_PORT` (0.0.0.0:8081).
    pub grpc_addr: String,
    /// `HOST`:`PORT` (0.0.0.0:8080): `/healthcheck`.
    pub http_addr: String,
    /// `USE_PROMETHEUS` (false), `PROMETHEUS_ADDR` (:9090), `PROMETHEUS_PATH` (/metrics).
    pub prometheus: Option<(String, String)>,
    /// `RUNTIME_ROOT` (/srv/runtime_data/current), `RUNTIME_SUBDIRECTORY` (empty),
    /// `RUNTIME_APPDIRECTORY` (config).
    pub runtime_root: PathBuf,
    pub config_dir: PathBuf,
    /// `RUNTIME_IGNOREDOTFILES` (false).
    pub ignore_dot_files: bool,
    /// `RUNTIME_WATCH_ROOT` (true): a change of the root (a link swapped to a new directory)
    /// reloads; false: only changes inside the configuration directory.
    pub watch_root: bool,
    /// `RLS_RELOAD_INTERVAL_MS` (250): how often the files are looked at.
    pub reload_interval: Duration,
    pub redis: RedisType,
    /// `NEAR_LIMIT_RATIO` (0.8).
    pub near_limit_ratio: f64,
    /// `CACHE_KEY_PREFIX` (empty), before every counter key.
    pub key_prefix: String,
    /// `SHADOW_MODE` (false): every limit as if it had `shadow_mode: true`.
    pub global_shadow_mode: bool,
    /// `RLS_FAILURE_POLICY`: `error` (default), `open`, `closed`, `local:N`.
    pub on_failure: OnRedisFailure,
    /// `RLS_REDIS_TIMEOUT_MS` (100): one call to Redis.
    pub redis_timeout: Duration,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn boolean(name: &str, default: bool) -> Result<bool, String> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "t" | "yes" => Ok(true),
            "false" | "0" | "f" | "no" => Ok(false),
            _ => Err(format!("{name}={v}: expected true or false")),
        },
    }
}

fn addr(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host:port` as a URL for the client, with `REDIS_AUTH` and `REDIS_TLS` applied.
fn redis_url(address: &str, socket: &str, auth: Option<&str>, tls: bool) -> String {
    if address.contains("://") {
        return address.to_string();
    }
    if socket == "unix" {
        return format!("redis+unix://{address}");
    }
    let scheme = if tls { "rediss" } else { "redis" };
    match auth {
        Some(a) if a.contains(':') => format!("{scheme}://{a}@{address}"),
        Some(a) => format!("{scheme}://:{a}@{address}"),
        None => format!("{scheme}://{address}"),
    }
}

impl Settings {
    /// The settings of the environment, or the variable that is wrong and why.
    pub fn from_env() -> Result<Settings, String> {
        let port = |name: &str, default: &str| -> Result<String, String> {
            let v = var(name).unwrap_or_else(|| default.to_string());
            v.parse::<u16>()
                .map(|_| v.clone())
                .map_err(|_| format!("{name}={v}: expected a port number"))
        };
        let grpc_addr = addr(
            &var("GRPC_HOST").unwrap_or_else(|| "0.0.0.0".into()),
            &port("GRPC_PORT", "8081")?,
        );
        let http_addr = addr(
            &var("HOST").unwrap_or_else(|| "0.0.0.0".into()),
            &port("PORT", "8080")?,
        );
        let prometheus = if boolean("USE_PROMETHEUS", false)? {
            let a = var("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
            let a = if a.starts_with(':') {
                format!("0.0.0.0{a}")
            } else {
                a
            };
            Some((
                a,
                var("PROMETHEUS_PATH").unwrap_or_else(|| "/metrics".into()),
            ))
        } else {
            None
        };
        let runtime_root = PathBuf::from(
            var("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into()),
        );
        let mut config_dir = runtime_root.clone();
        if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
            config_dir.push(sub);
        }
        config_dir.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));

        let socket = var("REDIS_SOCKET_TYPE").unwrap_or_else(|| "unix".into());
        if socket != "unix" && socket != "tcp" {
            return Err(format!("REDIS_SOCKET_TYPE={socket}: expected tcp or unix"));
        }
        let auth = var("REDIS_AUTH");
        let tls = boolean("REDIS_TLS", false)?;
        let url = var("REDIS_URL").unwrap_or_else(|| "/var/run/nutcracker/ratelimit.sock".into());
        let kind = var("REDIS_TYPE").unwrap_or_else(|| "SINGLE".into());
        let redis = match kind.to_ascii_uppercase().as_str() {
            "SINGLE" => RedisType::Single(redis_url(&url, &socket, auth.as_deref(), tls)),
            "SENTINEL" => {
                let mut parts = url.split(',').map(str::trim);
                let master = parts.next().unwrap_or_default().to_string();
                let sentinels: Vec<String> = parts
                    .map(|s| redis_url(s, "tcp", var("REDIS_SENTINEL_AUTH").as_deref(), tls))
                    .collect();
                if master.is_empty() || sentinels.is_empty() {
                    return Err(format!(
                        "REDIS_URL={url}: expected the master's name and a list of sentinels, as <master name>,<sentinel1>,...,<sentineln>"
                    ));
                }
                RedisType::Sentinel { master, sentinels }
            }
            "CLUSTER" => RedisType::Cluster(
                url.split(',')
                    .map(|s| redis_url(s.trim(), "tcp", auth.as_deref(), tls))
                    .collect(),
            ),
            _ => {
                return Err(format!(
                    "REDIS_TYPE={kind}: expected SINGLE, SENTINEL or CLUSTER"
                ));
            }
        };
        let near_limit_ratio = match var("NEAR_LIMIT_RATIO") {
            None => 0.8,
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("NEAR_LIMIT_RATIO={v}: expected a number from 0 to 1"))?,
        };
        let on_failure = match var("RLS_FAILURE_POLICY").as_deref() {
            None | Some("error") => OnRedisFailure::Error,
            Some("open") => OnRedisFailure::Open,
            Some("closed") => OnRedisFailure::Closed,
            Some(v) => match v.strip_prefix("local:").and_then(|n| n.parse::<u32>().ok()) {
                Some(n) if n > 0 => OnRedisFailure::Local(n),
                _ => {
                    return Err(format!(
                        "RLS_FAILURE_POLICY={v}: expected error, open, closed or local:N (N instances, at least 1)"
                    ));
                }
            },
        };
        let millis = |name: &str, default: u64| -> Result<Duration, String> {
            match var(name) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| format!("{name}={v}: expected milliseconds, at least 1")),
            }
        };
        Ok(Settings {
            grpc_addr,
            http_addr,
            prometheus,
            runtime_root,
            config_dir,
            ignore_dot_files: boolean("RUNTIME_IGNOREDOTFILES", false)?,
            watch_root: boolean("RUNTIME_WATCH_ROOT", true)?,
            reload_interval: millis("RLS_RELOAD_INTERVAL_MS", 250)?,
            redis,
            near_limit_ratio,
            key_prefix: var("CACHE_KEY_PREFIX").unwrap_or_default(),
            global_shadow_mode: boolean("SHADOW_MODE", false)?,
            on_failure,
            redis_timeout: millis("RLS_REDIS_TIMEOUT_MS", 100)?,
        })
    }
}
