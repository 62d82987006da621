//! A cold client under a burst: a fresh client made with the documented constructors and the
//! default options, 200 concurrent first calls on one key of capacity 50, in module, function
//! and script mode (the scripts flushed first), while a CPU burner keeps every core busy. Exactly
//! 50 are admitted, none is answered by the failure policy, and the server counts one `COMMAND
//! INFO`, at most one `FUNCTION LIST` and at most one `SCRIPT LOAD` per round. The same through
//! the HTTP middleware: 200 concurrent first requests over real HTTP.
//!
//! `RL_COLD_ROUNDS` sets the rounds per mode and constructor (3 by default), `RL_COLD_HTTP_ROUNDS`
//! the middleware's per mode (2 by default); `make test-rust-cold` runs 400 of each: 20 rounds of
//! 20, reported per 20.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use common::Server;
use ratelimit_client::middleware::{KeySource, Policy, RateLimitLayer};
use ratelimit_client::{Algorithm, Client, Degraded, Limiter, Mode, Options};
use redis::aio::ConnectionManager;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const CALLERS: usize = 200;
const CAPACITY: u64 = 50;

fn bucket() -> Algorithm {
    // No token comes back during a round.
    Algorithm::TokenBucket {
        capacity: CAPACITY,
        refill_per_sec: 0.0001,
    }
}

/// Rounds per mode: of the calls per constructor (`RL_COLD_ROUNDS`), of the middleware
/// (`RL_COLD_HTTP_ROUNDS`).
fn rounds(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Spinning threads, one per core, until dropped.
struct Burner {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Burner {
    fn start() -> Burner {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x: u64 = 1;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        }
                        std::hint::black_box(x);
                    }
                })
            })
            .collect();
        Burner { stop, threads }
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Module,
    Function,
    Script,
}

impl Setup {
    fn mode(self) -> Mode {
        match self {
            Setup::Module => Mode::Module,
            Setup::Function => Mode::Function,
            Setup::Script => Mode::Script,
        }
    }

    /// The command that decides in this mode, as `INFO commandstats` names it.
    fn decider(self) -> &'static str {
        match self {
            Setup::Module => "rl.tokenbucket",
            Setup::Function => "fcall",
            Setup::Script => "evalsha",
        }
    }

    fn server(self) -> Server {
        match self {
            Setup::Module => Server::with_module(),
            Setup::Function => {
                let s = Server::without_module();
                let library = include_str!("../../../lua-reference/ratelimit.lua");
                let name: String = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg(library)
                    .query(&mut s.connect())
                    .unwrap();
                assert_eq!(name, "ratelimit");
                s
            }
            Setup::Script => Server::without_module(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Start {
    /// `Limiter::open`: connects and detects the mode before the burst.
    Open,
    /// `Limiter::connect`: the burst's calls connect and detect.
    Connect,
}

/// Calls of each command since the last `CONFIG RESETSTAT`, and how many of them failed or were
/// rejected (`INFO commandstats`).
fn commandstats(c: &mut redis::Connection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            let errors = field("failed_calls=") + field("rejected_calls=");
            Some((name.to_string(), (field("calls="), errors)))
        })
        .collect()
}

/// Resets the counts, and for the scripts flushes them: the server knows none.
fn prepare(c: &mut redis::Connection, setup: Setup) {
    if setup == Setup::Script {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(c).unwrap();
    }
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(c).unwrap();
}

struct Round {
    breaker_open: bool,
    admitted: usize,
    degraded: usize,
    /// From the start of the burst to its first and last decisions.
    first: Duration,
    last: Duration,
    stats: HashMap<String, (u64, u64)>,
}

impl Round {
    fn count(&self, command: &str) -> u64 {
        self.stats.get(command).map_or(0, |s| s.0)
    }

    /// Calls of `command` answered with an error (`NOSCRIPT`).
    fn errors(&self, command: &str) -> u64 {
        self.stats.get(command).map_or(0, |s| s.1)
    }

    /// What the client sent to start: detection, loads and fallbacks.
    fn startup(&self) -> String {
        [
            "command|info",
            "function|list",
            "function|load",
            "script|load",
            "eval",
        ]
        .iter()
        .map(|c| format!("{c}={}", self.count(c)))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// Starts `CALLERS` tasks on `rt` that get ready (`prepare`: an HTTP client connects), wait for
/// the go, then make one call each; the decisions, and when each came.
async fn burst<P, PFut, R, F, Fut>(
    rt: &tokio::runtime::Handle,
    prepare: P,
    call: F,
) -> (Vec<(bool, bool)>, Duration, Duration)
where
    P: Fn() -> PFut,
    PFut: Future<Output = R> + Send + 'static,
    R: Send + 'static,
    F: Fn(R) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (bool, bool)> + Send + 'static,
{
    let (go, ready) = watch::channel(false);
    let (set, mut all_set) = tokio::sync::mpsc::channel::<()>(CALLERS);
    let mut tasks = Vec::with_capacity(CALLERS);
    for _ in 0..CALLERS {
        let mut ready = ready.clone();
        let (prepared, call, set) = (prepare(), call.clone(), set.clone());
        tasks.push(rt.spawn(async move {
            let r = prepared.await;
            set.send(()).await.unwrap();
            ready.wait_for(|g| *g).await.unwrap();
            let got = call(r).await;
            (got, Instant::now())
        }));
    }
    for _ in 0..CALLERS {
        all_set.recv().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let start = Instant::now();
    go.send(true).unwrap();
    let mut answers = Vec::with_capacity(CALLERS);
    let (mut first, mut last) = (Duration::MAX, Duration::ZERO);
    for t in tasks {
        let (got, at) = t.await.unwrap();
        let took = at.saturating_duration_since(start);
        first = first.min(took);
        last = last.max(took);
        answers.push(got);
    }
    (answers, first, last)
}

async fn client_round(server: &Server, setup: Setup, start: Start, key: &str) -> Round {
    let mut admin = server.connect();
    prepare(&mut admin, setup);
    let limiter = match start {
        Start::Open => Limiter::open(&server.url(), bucket(), Options::default())
            .await
            .unwrap(),
        Start::Connect => Limiter::connect(&server.url(), bucket(), Options::default()).unwrap(),
    };
    let key = key.to_string();
    let here = tokio::runtime::Handle::current();
    let (answers, first, last) = burst(
        &here,
        || {
            let (l, k) = (limiter.clone(), key.clone());
            async move { (l, k) }
        },
        move |(l, k)| async move {
            let o = l.check(&k).await.unwrap();
            if o.degraded.is_none() {
                assert_eq!(o.mode, Some(setup.mode()));
            }
            (o.decision.allowed, o.degraded.is_some())
        },
    )
    .await;
    Round {
        breaker_open: limiter.client().breaker_open(),
        admitted: answers.iter().filter(|a| a.0).count(),
        degraded: answers.iter().filter(|a| a.1).count(),
        first,
        last,
        stats: commandstats(&mut admin),
    }
}

/// One GET on `s`, a connection of its own; the status code.
async fn get(mut s: tokio::net::TcpStream, addr: std::net::SocketAddr) -> u16 {
    s.write_all(
        format!("GET / HTTP/1.1\r\nHost: {addr}\r\nx-api-key: alice\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    let head = String::from_utf8_lossy(&got);
    head.strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head}"))
}

/// `clients` runs the HTTP clients: a runtime of its own, apart from the application's.
async fn middleware_round(
    server: &Server,
    setup: Setup,
    round: usize,
    clients: &tokio::runtime::Handle,
) -> Round {
    let mut admin = server.connect();
    prepare(&mut admin, setup);
    let client = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    let layer: RateLimitLayer<ConnectionManager> = RateLimitLayer::builder(client)
        .key(KeySource::Header(http::HeaderName::from_static(
            "x-api-key",
        )))
        .prefix(&format!("cold{round}"))
        .limits("*", "*", vec![Policy::new("burst", bucket())])
        .build();
    let app: Router = Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(axum::serve(listener, app).into_future());
    // The clients connect first: the burst is of requests, not of connections.
    let (answers, first, last) = burst(
        clients,
        || async move { tokio::net::TcpStream::connect(addr).await.unwrap() },
        move |s| async move {
            let status = get(s, addr).await;
            assert!(status == 200 || status == 429, "status {status}");
            (status == 200, false)
        },
    )
    .await;
    serving.abort();
    let counts = layer.metrics().counts("burst");
    assert_eq!(
        counts.allowed + counts.denied,
        CALLERS as u64,
        "{setup:?} middleware"
    );
    Round {
        breaker_open: layer.client().breaker_open(),
        admitted: answers.iter().filter(|a| a.0).count(),
        degraded: usize::try_from(counts.degraded).unwrap(),
        first,
        last,
        stats: commandstats(&mut admin),
    }
}

/// Prints the round's figures; then asserts what every round must show.
fn check(setup: Setup, what: &str, r: &Round, exact_calls: bool) {
    let line = format!(
        "cold {setup:?} {what}: admitted={} degraded={} breaker_open={} first={:?} last={:?} {}={} ({} errors) {}",
        r.admitted,
        r.degraded,
        r.breaker_open,
        r.first,
        r.last,
        setup.decider(),
        r.count(setup.decider()),
        r.errors(setup.decider()),
        r.startup()
    );
    eprintln!("{line}");
    assert_eq!((r.admitted, r.degraded), (CAPACITY as usize, 0), "{line}");
    assert!(!r.breaker_open, "{line}");
    assert!(r.count("command|info") <= 1, "{line}");
    assert_eq!(r.count("eval"), 0, "{line}");
    assert_eq!(r.count("function|load"), 0, "{line}");
    match setup {
        Setup::Module => {
            assert_eq!(r.count("function|list"), 0, "{line}");
            assert_eq!(r.count("script|load"), 0, "{line}");
        }
        Setup::Function => {
            assert!(r.count("function|list") <= 1, "{line}");
            assert_eq!(r.count("script|load"), 0, "{line}");
        }
        Setup::Script => {
            assert!(r.count("function|list") <= 1, "{line}");
            // One script decides: the token bucket's.
            assert_eq!(r.count("script|load"), 1, "{line}");
        }
    }
    if exact_calls {
        // One answered command per call: a call that met `NOSCRIPT` sends its `EVALSHA` again
        // once the script is loaded.
        let answered = r.count(setup.decider()) - r.errors(setup.decider());
        assert_eq!(answered, CALLERS as u64, "{line}");
        if setup != Setup::Script {
            assert_eq!(r.errors(setup.decider()), 0, "{line}");
        }
    }
}

/// One mode at a time: each test keeps every core busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn cold_burst(setup: Setup) {
    let _serial = SERIAL.lock().await;
    let server = setup.server();
    let n = rounds("RL_COLD_ROUNDS", 3);
    let _burner = Burner::start();
    let mut failed = Vec::new();
    // Every round's figures are printed, the failures listed at the end.
    let mut judge = |setup, what: &str, r: &Round, exact| {
        let judged = std::panic::AssertUnwindSafe(|| check(setup, what, r, exact));
        if let Err(e) = std::panic::catch_unwind(judged) {
            failed.push(e.downcast_ref::<String>().cloned().unwrap_or_default());
        }
    };
    let mut round = 0;
    for start in [Start::Open, Start::Connect] {
        for i in 0..n {
            round += 1;
            let r = client_round(&server, setup, start, &format!("cold:{round}")).await;
            judge(setup, &format!("{start:?} round {}", i + 1), &r, true);
            if (i + 1) % 20 == 0 {
                eprintln!("cold {setup:?} {start:?}: rounds {}-{} done", i - 18, i + 1);
            }
        }
    }
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for i in 0..rounds("RL_COLD_HTTP_ROUNDS", 2) {
        round += 1;
        let r = middleware_round(&server, setup, round, clients.handle()).await;
        // The deny cache answers some of the denials without calling Redis.
        judge(setup, &format!("middleware round {}", i + 1), &r, false);
        if (i + 1) % 20 == 0 {
            eprintln!(
                "cold {setup:?} middleware: rounds {}-{} done",
                i - 18,
                i + 1
            );
        }
    }
    clients.shutdown_background();
    assert!(
        failed.is_empty(),
        "{} rounds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_client_admits_exactly_the_limit_in_module_mode() {
    cold_burst(Setup::Module).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_client_admits_exactly_the_limit_in_function_mode() {
    cold_burst(Setup::Function).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_client_admits_exactly_the_limit_in_script_mode() {
    cold_burst(Setup::Script).await;
}

/// The documented start with Redis down: `Limiter::open` returns, every call is answered by
/// the failure policy within the deadline (the breaker opens after 3), and once a server is up
/// on the address the calls are decided by it, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_start_works_while_redis_is_down() {
    let _serial = SERIAL.lock().await;
    let port = common::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let t = Instant::now();
    let limiter = Limiter::open(&url, bucket(), Options::default())
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(limiter.client().mode(), None);
    for i in 0..6 {
        let t = Instant::now();
        let o = limiter.check("k").await.unwrap();
        // The deadline is 100 ms; a loaded machine's margin on top.
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "call {i}: {:?}",
            t.elapsed()
        );
        assert_eq!(o.degraded, Some(Degraded::FailOpen), "call {i}");
        assert!(o.decision.allowed);
    }
    assert!(limiter.client().breaker_open());
    let server = Server::start(common::Opts {
        module: true,
        port: Some(port),
        ..common::Opts::default()
    });
    // The breaker lets a trial call through after its cooldown (1 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let o = limiter.check("k").await.unwrap();
        if o.degraded.is_none() {
            break o;
        }
        assert!(Instant::now() < deadline, "never decided by Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(first.mode, Some(Mode::Module));
    assert_eq!(limiter.client().mode(), Some(Mode::Module));
    assert_eq!(first.decision.remaining, CAPACITY - 1);
    for left in (0..CAPACITY - 1).rev() {
        let o = limiter.check("k").await.unwrap();
        assert_eq!((o.degraded, o.decision.allowed), (None, true));
        assert_eq!(o.decision.remaining, left);
    }
    let o = limiter.check("k").await.unwrap();
    assert_eq!((o.degraded, o.decision.allowed), (None, false));
    assert!(!limiter.client().breaker_open());
    drop(server);
}
