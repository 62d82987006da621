//! The Rust client's cost per call: the client's check of one token bucket (`Client::check`) next
//! to the bare `RL.TOKENBUCKET` sent through the same redis-rs `ConnectionManager`, and next to
//! the floor (the bare command within `tokio::time::timeout` of the client's timeout: what a
//! deadline costs with the runtime's own timer), one call at a time and with 64 concurrent
//! callers, in blocks of each in turn. One line per measurement, as the Go, Python and Node.js
//! benches of `benches/clients/` print them:
//!
//! ```text
//! client-cost lang=rust mode=<sequential|concurrent64> what=<raw|floor|client> p50_us=.. p99_us=.. calls_per_s=.. client_cpu_us_per_call=..
//! ```
//!
//! `make bench-clients` runs it with the others:
//!
//! ```text
//! client_cost --server <redis-server> --module <libredis_rate_limiter.so> [--calls 100000] [--block 1000]
//! ```
//!
//! It starts its own redis-server with the module on a free port, pinned to the second core while
//! the bench pins itself to the first (`taskset`, where there is one), and stops it at the end.
//! The client runs on a current-thread runtime, so that its CPU per call is one core's.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_client::{Algorithm, Client, ModeChoice, Options};

const CALLERS: usize = 64;
/// Never empties during a run: every check is admitted.
const BUCKET: Algorithm = Algorithm::TokenBucket {
    capacity: 1_000_000_000,
    refill_per_sec: 1_000_000.0,
};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// This process's user and system CPU time.
fn cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(server: &str, module: &str, port: u16) -> Server {
    let mut cmd = if std::path::Path::new("/usr/bin/taskset").exists() {
        let mut c = Command::new("taskset");
        c.args(["-c", "1", server]);
        c
    } else {
        Command::new(server)
    };
    let child = cmd
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--loadmodule", module])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{server}: {e}"));
    Server(child)
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    calls: u64,
    wall: Duration,
    cpu: Duration,
}

impl Tally {
    fn line(&mut self, mode: &str, what: &str) -> String {
        self.latencies.sort_unstable();
        let at = |q: f64| {
            let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
            self.latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        format!(
            "client-cost lang=rust mode={mode} what={what} p50_us={:.1} p99_us={:.1} calls_per_s={:.0} client_cpu_us_per_call={:.2}",
            at(0.50),
            at(0.99),
            self.calls as f64 / self.wall.as_secs_f64(),
            self.cpu.as_secs_f64() * 1e6 / self.calls as f64
        )
    }
}

async fn raw(conn: &mut redis::aio::ConnectionManager, key: &str) {
    let _: Vec<i64> = redis::cmd("RL.TOKENBUCKET")
        .arg(key)
        .arg(1_000_000_000u64)
        .arg(1_000_000u64)
        .query_async(conn)
        .await
        .expect("RL.TOKENBUCKET");
}

/// Calls that ended past their deadline (the floor's timeout, or the client's failure policy):
/// on a machine too busy for the figures, reported at the end.
static LATE: AtomicU64 = AtomicU64::new(0);

/// The bare command within the runtime's own deadline: the floor of a call with a timeout.
async fn floor(conn: &mut redis::aio::ConnectionManager, key: &str, timeout: Duration) {
    if tokio::time::timeout(timeout, raw(conn, key)).await.is_err() {
        LATE.fetch_add(1, Ordering::Relaxed);
    }
}

async fn checked(client: &Client<redis::aio::ConnectionManager>, key: &str) {
    let out = client.check(key, &BUCKET, 1).await.expect("check");
    if out.degraded.is_some() {
        LATE.fetch_add(1, Ordering::Relaxed);
    }
}

/// `n` calls of `what` one at a time, each timed.
async fn sequential(
    what: &str,
    n: usize,
    conn: &redis::aio::ConnectionManager,
    client: &Client<redis::aio::ConnectionManager>,
    tally: &mut Tally,
) {
    let mut conn = conn.clone();
    let (w0, c0) = (Instant::now(), cpu());
    for _ in 0..n {
        let t = Instant::now();
        match what {
            "raw" => raw(&mut conn, "bench:seq").await,
            "floor" => floor(&mut conn, "bench:seq", client.options().timeout).await,
            _ => checked(client, "bench:seq").await,
        }
        tally.latencies.push(t.elapsed());
    }
    tally.wall += w0.elapsed();
    tally.cpu += cpu() - c0;
    tally.calls += n as u64;
}

/// `n` calls of `what` by 64 concurrent callers, each timed.
async fn concurrent(
    what: &'static str,
    n: usize,
    conn: &redis::aio::ConnectionManager,
    client: &Client<redis::aio::ConnectionManager>,
    tally: &mut Tally,
) {
    let (w0, c0) = (Instant::now(), cpu());
    let per = n / CALLERS;
    let mut tasks = Vec::with_capacity(CALLERS);
    for i in 0..CALLERS {
        let (mut conn, client) = (conn.clone(), client.clone());
        let key = Arc::new(format!("bench:c{i}"));
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                match what {
                    "raw" => raw(&mut conn, &key).await,
                    "floor" => floor(&mut conn, &key, client.options().timeout).await,
                    _ => checked(&client, &key).await,
                }
                took.push(t.elapsed());
            }
            took
        }));
    }
    for t in tasks {
        tally.latencies.extend(t.await.expect("caller"));
    }
    tally.wall += w0.elapsed();
    tally.cpu += cpu() - c0;
    tally.calls += (per * CALLERS) as u64;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let server = arg(&args, "--server").unwrap_or_else(|| "redis-server".into());
    let module = arg(&args, "--module").expect("--module <libredis_rate_limiter.so>");
    let calls: usize = arg(&args, "--calls").map_or(100_000, |v| v.parse().expect("--calls"));
    let block: usize = arg(&args, "--block").map_or(1000, |v| v.parse().expect("--block"));
    if std::path::Path::new("/usr/bin/taskset").exists() {
        let me = std::process::id().to_string();
        let _ = Command::new("taskset")
            .args(["-p", "-c", "0", &me])
            .stdout(Stdio::null())
            .status();
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let _server = start(&server, &module, port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let url = format!("redis://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let conn = loop {
            match redis::Client::open(url.as_str())
                .expect("url")
                .get_connection_manager()
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => panic!("{url}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let options = Options {
            mode: ModeChoice::Module,
            ..Options::default()
        };
        let client = Client::new(conn.clone(), options);
        // Warm both paths up.
        let mut warm = Tally::default();
        for what in ["raw", "floor", "client"] {
            sequential(what, block, &conn, &client, &mut warm).await;
        }
        for (mode, n) in [("sequential", calls / 4), ("concurrent64", calls)] {
            let mut tallies = [
                ("raw", Tally::default()),
                ("floor", Tally::default()),
                ("client", Tally::default()),
            ];
            let mut done = 0;
            while done < n {
                let b = block.max(CALLERS).min(n - done);
                for (what, tally) in &mut tallies {
                    if mode == "sequential" {
                        sequential(what, b, &conn, &client, tally).await;
                    } else {
                        concurrent(what, b, &conn, &client, tally).await;
                    }
                }
                done += b;
            }
            for (what, tally) in &mut tallies {
                println!("{}", tally.line(mode, what));
            }
        }
        let late = LATE.load(Ordering::Relaxed);
        if late > 0 {
            eprintln!(
                "client-cost lang=rust: {late} floor or client calls ended past their deadline \
                 (the floor's timeout, the client's failure policy); the machine is too busy for \
                 these figures"
            );
        }
    });
}
