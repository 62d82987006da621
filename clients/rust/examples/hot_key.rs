//! `make bench-hot`: one hot key through the HTTP middleware, unbatched, with the deny cache,
//! batched, and both, from one process of 64 tasks and from 4 processes of 16, side by side
//! (below the limit also the floors: no limit at all, and no limit with the draft headers):
//! requests per second and client-side latency, server calls per admitted and per denied
//! request, and what was admitted against the exact limit.
//!
//! ```text
//! hot_key --server <redis-server> --module <libredis_rate_limiter.so> [--seconds 3] [--rounds 3]
//! ```
//!
//! It starts its own redis-server with the module (no test clock), and for each run starts the
//! worker processes (this binary with `--worker`), which load the middleware as fast as their
//! tasks can for the same few seconds, close their client (giving back what batches hold) and
//! print their counts; server calls are `INFO commandstats` of the run.
//!
//! Scenarios:
//! - below: a token bucket far above the offered load (every request admitted);
//! - above: a fixed window of 20,000 per hour, offered far more (the exact limit is 20,000);
//! - flood: a fixed window of 1 per second, used up when the run starts: one request a second is
//!   admitted, every other one denied with retry_after_ms the rest of the second; server calls
//!   are also counted from the run's second second on (the steady state, after the first
//!   denials came back).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use http::Request;
use ratelimit_client::middleware::{KeySource, Policy, RateLimitLayer, rate_limit_headers};
use ratelimit_client::{
    Algorithm, Batching, Client, Decision, FailurePolicy, MultiOutcome, Options,
};
use serde_json::{Value, json};
use tower::ServiceExt;

const KEY: &str = "rl:{hot}:default:hot";
const ABOVE_LIMIT: u64 = 20_000;
const MAX_BATCH: u64 = 1024;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn algorithm(scenario: &str) -> Algorithm {
    match scenario {
        "below" => Algorithm::TokenBucket {
            capacity: 1_000_000_000_000,
            refill_per_sec: 1_000_000_000_000.0,
        },
        "above" => Algorithm::FixedWindow {
            limit: ABOVE_LIMIT,
            window_sec: 3600.0,
        },
        _ => Algorithm::FixedWindow {
            limit: 1,
            window_sec: 1.0,
        },
    }
}

/// Latencies in a log-linear histogram: 16 buckets per power of two of nanoseconds.
fn bucket(ns: u64) -> usize {
    let ns = ns.max(1);
    let exp = 63 - ns.leading_zeros() as usize;
    let mantissa = if exp >= 4 {
        ((ns >> (exp - 4)) & 15) as usize
    } else {
        0
    };
    exp * 16 + mantissa
}

/// The upper bound of a bucket, in nanoseconds.
fn bucket_top(b: usize) -> f64 {
    let (exp, mantissa) = (b / 16, b % 16);
    (1u64 << exp) as f64 * (1.0 + (mantissa as f64 + 1.0) / 16.0)
}

fn percentile(hist: &BTreeMap<usize, u64>, p: f64) -> f64 {
    let total: u64 = hist.values().sum();
    let want = ((total as f64) * p).ceil() as u64;
    let mut seen = 0;
    for (b, n) in hist {
        seen += n;
        if seen >= want {
            return bucket_top(*b);
        }
    }
    0.0
}

/// One worker process: `tasks` tasks sending requests through the middleware until the run
/// ends; prints its counts as one JSON line.
async fn worker(args: &[String]) {
    let url = arg(args, "--url").unwrap_or_default();
    let scenario = arg(args, "--scenario").unwrap_or_default();
    let variant = arg(args, "--variant").unwrap_or_default();
    let tasks: usize = arg(args, "--tasks")
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let start_ms: u64 = arg(args, "--start-unix-ms")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let seconds: f64 = arg(args, "--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let client = Client::connect(
        &url,
        Options {
            // Generous: an answer of the policy would not be Redis's.
            timeout: Duration::from_secs(2),
            policy: FailurePolicy::FailClosed,
            ..Options::default()
        },
    )
    .unwrap_or_else(|e| panic!("{url}: {e}"));
    client.detect().await;
    // "no limit": the route has no limit, the layer lets it through untouched (its floor);
    // "headers only" adds the draft headers to that (the floor with the output a limit owes).
    let class = if variant == "no limit" || variant == "headers only" {
        "other"
    } else {
        "*"
    };
    let mut b = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .limits("*", class, vec![Policy::new("hot", algorithm(&scenario))])
        .deny_cache(variant.ends_with("deny cache"));
    if variant.starts_with("batched") {
        // Detected hot: 100 calls a second from this process, the default.
        b = b.batching(Batching::new());
    }
    let layer = b.build();
    let router = if variant == "headers only" {
        // The floor of any limited route: no limit, but the handler's response carries the
        // draft headers an admitted request gets (written by the middleware's own function).
        // Made once and only read (a shared count per request would be a cost of its own).
        static FIELDS: OnceLock<(Vec<Policy>, MultiOutcome)> = OnceLock::new();
        FIELDS.get_or_init(|| {
            let decision = Decision {
                allowed: true,
                remaining: 999_999_999,
                retry_after_ms: 0,
                reset_after_ms: 1,
                limit: 1_000_000_000,
            };
            let outcome = MultiOutcome {
                allowed: true,
                denied_by: 0,
                decisions: vec![decision],
                degraded: None,
                mode: None,
                granted: 1,
                answered_locally: None,
            };
            (vec![Policy::new("hot", algorithm(&scenario))], outcome)
        });
        Router::new().route(
            "/",
            get(|| async {
                let mut response = "ok".into_response();
                if let Some((policies, outcome)) = FIELDS.get() {
                    rate_limit_headers(policies, outcome, false, response.headers_mut());
                }
                response
            }),
        )
    } else {
        Router::new().route("/", get(|| async { "ok" }))
    };
    let router = router.layer(layer.clone());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now_ms))).await;
    let cpu_at_start = process_cpu_us();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let (admitted, denied, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (router, admitted, denied, other) = (
            router.clone(),
            admitted.clone(),
            denied.clone(),
            other.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut hist: BTreeMap<usize, u64> = BTreeMap::new();
            while Instant::now() < end {
                let req = Request::get("/")
                    .header("x-api-key", "hot")
                    .body(Body::empty())
                    .unwrap_or_default();
                let t = Instant::now();
                let status = match router.clone().oneshot(req).await {
                    Ok(r) => r.status().as_u16(),
                    Err(e) => match e {},
                };
                *hist
                    .entry(bucket(t.elapsed().as_nanos() as u64))
                    .or_default() += 1;
                match status {
                    200 => admitted.fetch_add(1, Ordering::Relaxed),
                    429 => denied.fetch_add(1, Ordering::Relaxed),
                    _ => other.fetch_add(1, Ordering::Relaxed),
                };
            }
            hist
        }));
    }
    let mut hist: BTreeMap<usize, u64> = BTreeMap::new();
    for h in handles {
        if let Ok(part) = h.await {
            for (b, n) in part {
                *hist.entry(b).or_default() += n;
            }
        }
    }
    let cpu_us = process_cpu_us().saturating_sub(cpu_at_start);
    let stats = layer.client().batch_stats();
    let returned = layer.client().close().await;
    let counts = layer.metrics().counts("hot");
    let out = json!({
        "admitted": admitted.load(Ordering::Relaxed),
        "denied": denied.load(Ordering::Relaxed),
        "other": other.load(Ordering::Relaxed),
        "degraded": counts.degraded,
        "batch": counts.batch,
        "deny_cache": counts.deny_cache,
        "held_at_end": stats.held,
        "returned_at_end": returned,
        "lapsed": stats.lapsed + (stats.held - returned),
        "refills": stats.refills,
        "cpu_us": cpu_us,
        "hist": hist.into_iter().map(|(b, n)| json!([b, n])).collect::<Vec<_>>(),
    });
    println!("{out}");
}

struct Redis {
    child: Child,
    port: u16,
    _dir: std::path::PathBuf,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis(server: &str, module: &str) -> Redis {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let dir = std::env::temp_dir().join(format!("hot-key-bench-{port}"));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let child = Command::new(server)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--dir", &dir.display().to_string()])
        .args(["--loadmodule", module])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{server}: {e}"));
    let r = Redis {
        child,
        port,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_cmd(&r, &["PING"]).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    r
}

fn redis_cmd(r: &Redis, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))?.get_connection()?;
    redis::cmd(args[0]).arg(&args[1..]).query(&mut c)
}

/// The CPU time of this process, user and system, all threads (from /proc, 100 ticks a second).
fn process_cpu_us() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, from the third (state): utime and stime are the 14th
    // and 15th.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks * 10_000
}

/// One section of `INFO`, as text (empty if the server did not answer).
fn info(r: &Redis, section: &str) -> String {
    match redis_cmd(r, &["INFO", section]) {
        Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        _ => String::new(),
    }
}

/// The server's CPU time, user and system, from `INFO cpu`.
fn server_cpu_us(r: &Redis) -> u64 {
    let secs: f64 = info(r, "cpu")
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum();
    (secs * 1e6) as u64
}

/// Calls of the limiter commands (and returns) since the last `CONFIG RESETSTAT`.
fn server_calls(r: &Redis) -> u64 {
    info(r, "commandstats")
        .lines()
        .filter(|l| l.starts_with("cmdstat_rl."))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

struct Row {
    scenario: &'static str,
    processes: usize,
    tasks: usize,
    variant: &'static str,
    requests: u64,
    rps: f64,
    admitted: u64,
    /// What one exact decision per request would admit (none for the flood, whose windows
    /// open when requests come).
    exact: Option<u64>,
    counted: Option<u64>,
    held_at_end: u64,
    lapsed: u64,
    calls: u64,
    /// Calls from the run's second second to its end.
    steady_calls: u64,
    denied: u64,
    degraded: u64,
    p50_us: f64,
    p99_us: f64,
    /// CPU time per request of the workers and the server together: what the requests/s come
    /// down to once the cores are busy, without the machine's moments in it.
    cpu_us: f64,
}

fn run(
    r: &Redis,
    scenario: &'static str,
    variant: &'static str,
    processes: usize,
    tasks: usize,
    seconds: f64,
) -> Row {
    let algo = algorithm(scenario);
    let _ = redis_cmd(r, &["FLUSHALL"]);
    if scenario == "flood" {
        // The key used up before the run: every request is denied for about an hour.
        let params = algo.params();
        let _ = redis_cmd(r, &[algo.command(), KEY, &params[0], &params[1], "1"]);
    }
    let _ = redis_cmd(r, &["CONFIG", "RESETSTAT"]);
    let server_cpu_before = server_cpu_us(r);
    let exe = std::env::current_exe().expect("this binary");
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        + 1500;
    let children: Vec<Child> = (0..processes)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--worker",
                    "--url",
                    &format!("redis://127.0.0.1:{}", r.port),
                ])
                .args(["--scenario", scenario, "--variant", variant])
                .args([
                    "--tasks",
                    &tasks.to_string(),
                    "--seconds",
                    &seconds.to_string(),
                ])
                .args(["--start-unix-ms", &start.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("a worker")
        })
        .collect();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    std::thread::sleep(Duration::from_millis((start + 1000).saturating_sub(now_ms)));
    let calls_after_one_second = server_calls(r);
    let outs: Vec<Value> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("a worker's output");
            let text = String::from_utf8_lossy(&out.stdout);
            serde_json::from_str(text.lines().last().unwrap_or("{}"))
                .unwrap_or_else(|e| panic!("worker: {e}: {text}"))
        })
        .collect();
    let calls = server_calls(r);
    let server_cpu = server_cpu_us(r).saturating_sub(server_cpu_before);
    let sum = |f: &str| outs.iter().map(|o| o[f].as_u64().unwrap_or(0)).sum::<u64>();
    let mut hist: BTreeMap<usize, u64> = BTreeMap::new();
    for o in &outs {
        for pair in o["hist"].as_array().into_iter().flatten() {
            let (b, n) = (pair[0].as_u64().unwrap_or(0), pair[1].as_u64().unwrap_or(0));
            *hist.entry(b as usize).or_default() += n;
        }
    }
    let (admitted, denied) = (sum("admitted"), sum("denied"));
    let requests = admitted + denied + sum("other");
    let (exact, counted) = match scenario {
        "below" => (Some(requests), None),
        "above" => {
            let params = algo.params();
            let left = match redis_cmd(r, &[algo.command(), KEY, &params[0], &params[1], "0"]) {
                Ok(redis::Value::Array(v)) => match v.get(1) {
                    Some(redis::Value::Int(n)) => *n as u64,
                    _ => 0,
                },
                _ => 0,
            };
            (Some(ABOVE_LIMIT.min(requests)), Some(ABOVE_LIMIT - left))
        }
        _ => (None, None),
    };
    Row {
        scenario,
        processes,
        tasks,
        variant,
        requests,
        rps: requests as f64 / seconds,
        admitted,
        exact,
        counted,
        held_at_end: sum("held_at_end"),
        lapsed: sum("lapsed"),
        calls,
        steady_calls: calls.saturating_sub(calls_after_one_second),
        denied,
        degraded: sum("degraded"),
        p50_us: percentile(&hist, 0.50) / 1000.0,
        p99_us: percentile(&hist, 0.99) / 1000.0,
        cpu_us: (sum("cpu_us") + server_cpu) as f64 / requests.max(1) as f64,
    }
}

fn ratio(calls: u64, n: u64) -> String {
    if n == 0 {
        "-".into()
    } else if calls == 0 {
        "0".into()
    } else if calls <= n {
        format!("1/{:.0}", n as f64 / calls as f64)
    } else {
        format!("{:.1}", calls as f64 / n as f64)
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--worker") {
        worker(&args).await;
        return;
    }
    let server = arg(&args, "--server").unwrap_or_else(|| "redis-server".into());
    let module = arg(&args, "--module").expect("--module <libredis_rate_limiter.so>");
    // The server changes to its --dir before it loads the module.
    let module = std::fs::canonicalize(&module)
        .unwrap_or_else(|e| panic!("{module}: {e}"))
        .display()
        .to_string();
    let seconds: f64 = arg(&args, "--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let rounds: usize = arg(&args, "--rounds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let r = start_redis(&server, &module);
    let version = info(&r, "server")
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_string))
        .unwrap_or_default();
    println!(
        "one hot key through the middleware, {seconds} s per run, redis-server {version} on 127.0.0.1 \
         (module mode), policy fail-closed, timeout 2 s; batches: defaults (detected at 100 calls/s, \
         lease 200 ms, 8 to {MAX_BATCH} units, at most 1/8 of what remains); below the limit, the \
         run of median requests/s of {rounds} interleaved rounds\n"
    );
    println!(
        "| scenario | processes × tasks | variant | requests | requests/s | CPU µs / request | p50 µs | p99 µs | admitted | exact | over | under | Redis counted | server calls | calls / admitted | calls / denied |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for scenario in ["below", "above", "flood"] {
        for (processes, tasks) in [(1, 64), (4, 16)] {
            let variants: &[&'static str] = if scenario == "below" {
                &[
                    "no limit",
                    "headers only",
                    "unbatched",
                    "deny cache",
                    "batched",
                    "batched + deny cache",
                ]
            } else {
                &["unbatched", "deny cache", "batched", "batched + deny cache"]
            };
            // Below the limit the rows are compared for throughput: its variants run in
            // `rounds` interleaved rounds, and each keeps the round of its median requests/s.
            let rounds = if scenario == "below" { rounds } else { 1 };
            let mut runs: Vec<Vec<Row>> = variants.iter().map(|_| Vec::new()).collect();
            for _ in 0..rounds {
                for (&variant, done) in variants.iter().zip(runs.iter_mut()) {
                    done.push(run(&r, scenario, variant, processes, tasks, seconds));
                }
            }
            for mut done in runs {
                done.sort_by(|a, b| a.rps.total_cmp(&b.rps));
                let row = done.swap_remove(done.len() / 2);
                let (over, under) = match row.exact {
                    Some(e) => (
                        row.admitted.saturating_sub(e).to_string(),
                        e.saturating_sub(row.admitted),
                    ),
                    None => ("-".to_string(), 0),
                };
                println!(
                    "| {} | {} × {} | {} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.scenario,
                    row.processes,
                    row.tasks,
                    row.variant,
                    row.requests,
                    row.rps,
                    row.cpu_us,
                    row.p50_us,
                    row.p99_us,
                    row.admitted,
                    row.exact.map_or("-".into(), |e| e.to_string()),
                    over,
                    match row.exact {
                        None => "-".into(),
                        Some(_) if under > 0 => format!(
                            "{under} (held at the end {}, lapsed {})",
                            row.held_at_end, row.lapsed
                        ),
                        Some(_) => "0".into(),
                    },
                    row.counted.map_or("-".into(), |c| c.to_string()),
                    row.calls,
                    ratio(row.calls, row.admitted),
                    ratio(row.calls, row.denied),
                );
                if row.degraded > 0 {
                    println!("  ({} answers of the failure policy)", row.degraded);
                }
                rows.push(row);
            }
        }
    }
    // The goals.
    println!();
    let find = |s: &str, p: usize, v: &str| {
        rows.iter()
            .find(|r| r.scenario == s && r.processes == p && r.variant == v)
    };
    for p in [1, 4] {
        if let (Some(b), Some(u)) = (find("below", p, "batched"), find("below", p, "unbatched")) {
            println!(
                "below, {p} process(es): batched {:.0} requests/s = {:.1}x unbatched ({:.0}); server calls per admitted request {} (goal at most 1/32)",
                b.rps,
                b.rps / u.rps.max(1.0),
                u.rps,
                ratio(b.calls, b.admitted)
            );
            for floor in ["no limit", "headers only"] {
                if let Some(f) = find("below", p, floor) {
                    println!(
                        "below, {p} process(es): {floor} {:.0} requests/s = {:.1}x unbatched; batched reaches {:.0}% of it",
                        f.rps,
                        f.rps / u.rps.max(1.0),
                        100.0 * b.rps / f.rps.max(1.0)
                    );
                }
            }
            // CPU per request, workers and server: the throughput ratio once the cores are
            // busy, steadier than requests/s.
            let per = |v: &str| find("below", p, v).map_or(0.0, |r| r.cpu_us);
            let unbatched_cpu = per("unbatched");
            println!(
                "below, {p} process(es), CPU µs per request (workers and server): unbatched {:.2}, batched {:.2} ({:.1}x fewer), no limit {:.2} ({:.1}x), headers only {:.2} ({:.1}x)",
                unbatched_cpu,
                per("batched"),
                unbatched_cpu / per("batched").max(1e-9),
                per("no limit"),
                unbatched_cpu / per("no limit").max(1e-9),
                per("headers only"),
                unbatched_cpu / per("headers only").max(1e-9),
            );
        }
        for v in ["deny cache", "batched + deny cache"] {
            if let Some(f) = find("flood", p, v) {
                println!(
                    "flood, {p} process(es), {v}: {} server calls for {} denials ({} admitted); after the first second {:.2} calls per process per second, retry_after at most 1 s (goal at most 1 per retry_after per process)",
                    f.calls,
                    f.denied,
                    f.admitted,
                    f.steady_calls as f64 / p as f64 / (seconds - 1.0).max(0.001)
                );
            }
        }
    }
    let worst_over = rows
        .iter()
        .filter_map(|r| r.exact.map(|e| r.admitted.saturating_sub(e)))
        .max()
        .unwrap_or(0);
    let miscounted = rows
        .iter()
        .filter(|r| r.counted.is_some_and(|c| c != r.admitted))
        .count();
    let degraded: u64 = rows.iter().map(|r| r.degraded).sum();
    println!(
        "over-admitted in the worst run: {worst_over} (goal 0); runs where Redis's count differs from the admissions after close: {miscounted}; answers of the failure policy: {degraded}"
    );
    let bound = 4 * MAX_BATCH;
    for r in rows.iter().filter(|r| r.scenario == "above") {
        let under = r.exact.unwrap_or(0).saturating_sub(r.admitted);
        if under > bound {
            println!(
                "above, {} × {}, {}: under-admitted {under}, above the bound of processes × max_batch",
                r.processes, r.tasks, r.variant
            );
        }
    }
}
