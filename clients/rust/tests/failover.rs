//! The failover bench: how many requests a Sentinel failover admits beyond the limit, with and
//! without durable admissions, counted against an exact ledger kept outside Redis.
//!
//! Each round: a master and a replica with the module, the replica fed through a proxy that
//! delays the replication stream by `FAILOVER_LAG_MS` (10 by default: a replica that lags, as
//! over a network; on loopback alone a replica is never behind), and a Sentinel. One task per
//! limit (each algorithm, and `RL.ALL` over two) takes units through `Client::sentinel`, a key
//! at a time: every answer from Redis is written in the ledger, and a key is left for the next
//! once denied. After 300 ms the master is killed (SIGKILL; what the proxy still held is lost,
//! as it would be on the wire). The failure policy (fail closed) answers until the Sentinel has
//! promoted the replica and the client reached it; the tasks go on 200 ms more. Then every key
//! of the round is taken to its end on the new master, and a key's over-admission is what the
//! ledger admitted beyond what a fresh key admits.
//!
//! `FAILOVER_ROUNDS` rounds per mode (2 in `make test`, 20 in `make failover`, which prints the
//! table with `--nocapture`). The short run asserts that durable admissions lose nothing.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::replicas::{MASTER, Sentinel, master, replica_of, signal};
use ratelimit_client::{
    Algorithm, Client, Durability, FailurePolicy, ModeChoice, Options, ShortAck,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CAPACITY: u64 = 20;
const LONG: f64 = 3600.0;

/// The limits under load: a name, and the limits one request takes.
fn plans() -> Vec<(&'static str, Vec<Algorithm>)> {
    vec![
        (
            "tokenbucket",
            vec![Algorithm::TokenBucket {
                capacity: CAPACITY,
                refill_per_sec: 0.0001,
            }],
        ),
        (
            "leakybucket",
            vec![Algorithm::LeakyBucket {
                capacity: CAPACITY,
                leak_per_sec: 0.0001,
            }],
        ),
        (
            "fixedwindow",
            vec![Algorithm::FixedWindow {
                limit: CAPACITY,
                window_sec: LONG,
            }],
        ),
        (
            "slidingwindow",
            vec![Algorithm::SlidingWindow {
                limit: CAPACITY,
                window_sec: LONG,
            }],
        ),
        (
            "slidinglog",
            vec![Algorithm::SlidingLog {
                limit: CAPACITY,
                window_sec: LONG,
            }],
        ),
        (
            "gcra",
            vec![Algorithm::Gcra {
                max_burst: CAPACITY - 1,
                count_per_period: 1,
                period_sec: LONG,
            }],
        ),
        (
            "all",
            vec![
                Algorithm::TokenBucket {
                    capacity: CAPACITY,
                    refill_per_sec: 0.0001,
                },
                Algorithm::FixedWindow {
                    limit: CAPACITY * 2,
                    window_sec: LONG,
                },
            ],
        ),
    ]
}

fn limits(plan: &[Algorithm], key: &str) -> Vec<(String, Algorithm)> {
    plan.iter()
        .enumerate()
        .map(|(i, a)| (format!("{{{key}}}:{i}"), a.clone()))
        .collect()
}

/// A proxy for the replication stream: what the master sends reaches the replica `lag` later
/// (the replica's acknowledgements go back at once); what it holds when the master dies is lost.
async fn lagging_proxy(master_port: u16, lag: Duration) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepting = tokio::spawn(async move {
        while let Ok((replica, _)) = listener.accept().await {
            let Ok(master) = TcpStream::connect(("127.0.0.1", master_port)).await else {
                continue;
            };
            // As Redis's own sockets: no Nagle delay on small writes (an ACK, a GETACK).
            let _ = (master.set_nodelay(true), replica.set_nodelay(true));
            let (mut from_master, mut to_master) = master.into_split();
            let (mut from_replica, mut to_replica) = replica.into_split();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
            let delivering = tokio::spawn(async move {
                while let Some((due, bytes)) = rx.recv().await {
                    tokio::time::sleep_until(due.into()).await;
                    if to_replica.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = from_master.read(&mut buf).await {
                    if n == 0 || tx.send((Instant::now() + lag, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                // The master is gone: what it sent and the replica has not received yet is lost.
                delivering.abort();
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_replica, &mut to_master).await;
            });
        }
    });
    (port, accepting)
}

struct Round {
    /// Per plan: units admitted beyond the limit.
    over: Vec<u64>,
    admitted: u64,
    /// From the kill to the first answer from the new master.
    unavailable: Duration,
    /// Answers of the failure policy (and errors) meanwhile.
    by_policy: u64,
    /// Microseconds of each admitted call before the kill.
    latencies: Vec<u64>,
}

async fn round(durable: bool, freeze: bool, lag: Duration) -> Round {
    let mut master = master();
    let (proxy, accepting) = lagging_proxy(master.port, lag).await;
    let replica = replica_of(&master, proxy);
    let sentinel = Sentinel::start(master.port);
    let options = Options {
        timeout: Duration::from_millis(500),
        policy: FailurePolicy::FailClosed,
        mode: ModeChoice::Module,
        ..Options::default()
    };
    let mut client = Client::sentinel(&[&sentinel.url()], MASTER, options).unwrap();
    if durable {
        client = client
            .with_durability(Durability {
                replicas: 1,
                timeout: Duration::from_millis(100),
                short: ShortAck::Deny,
            })
            .unwrap();
    }
    let plans = plans();
    // What a fresh key of each plan admits.
    let mut fresh = Vec::new();
    let on_master = Client::connect(&master.url(), options).unwrap();
    for (name, plan) in &plans {
        fresh.push(take_to_the_end(&on_master, &limits(plan, &format!("{name}:fresh"))).await);
    }

    let ledger: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let killed: Arc<Mutex<Option<Instant>>> = Arc::default();
    let back: Arc<Mutex<Option<Instant>>> = Arc::default();
    let by_policy = Arc::new(AtomicU64::new(0));
    let latencies: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for (p, (name, plan)) in plans.iter().enumerate() {
        let (client, plan, name) = (client.clone(), plan.clone(), name.to_string());
        let (ledger, stop, killed, back, by_policy, latencies) = (
            ledger.clone(),
            stop.clone(),
            killed.clone(),
            back.clone(),
            by_policy.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{name}:{n}");
                let l = limits(&plan, &key);
                ledger
                    .lock()
                    .unwrap()
                    .entry(format!("{p} {key}"))
                    .or_insert(0);
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let sent = Instant::now();
                    match client.check_all(&l, 1).await {
                        Ok(o) if o.degraded.is_none() => {
                            // A call sent once the master was dead: the new master answered.
                            let dead = *killed.lock().unwrap();
                            if dead.is_some_and(|at| sent > at) {
                                back.lock().unwrap().get_or_insert_with(Instant::now);
                            } else if dead.is_none() && o.allowed {
                                let us = sent.elapsed().as_micros() as u64;
                                latencies.lock().unwrap().push(us);
                            }
                            if !o.allowed {
                                break;
                            }
                            *ledger
                                .lock()
                                .unwrap()
                                .entry(format!("{p} {key}"))
                                .or_insert(0) += 1;
                        }
                        _ => {
                            by_policy.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                n += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    by_policy.store(0, Ordering::Relaxed);
    if freeze {
        // Frozen, not dead: its connections stay open and unanswered until the Sentinel has
        // promoted the replica (then it is killed, as an operator would fence it).
        signal(&master, "STOP");
    } else {
        master.kill();
    }
    let at = Instant::now();
    *killed.lock().unwrap() = Some(at);
    let deadline = Instant::now() + Duration::from_secs(30);
    while back.lock().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the client never reached the new master"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    master.kill();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(sentinel.master_port(), replica.port);
    let unavailable = back.lock().unwrap().map_or(Duration::ZERO, |b| b - at);

    // Every key of the round taken to its end on the new master (a plain client: with no
    // replica left, a durable one would deny them all).
    let on_new_master = Client::connect(&replica.url(), options).unwrap();
    let mut over = vec![0u64; plans.len()];
    let mut admitted = 0;
    let entries: Vec<(String, u64)> = ledger.lock().unwrap().drain().collect();
    for (entry, before) in entries {
        let (p, key) = entry.split_once(' ').unwrap();
        let p: usize = p.parse().unwrap();
        let total = before + take_to_the_end(&on_new_master, &limits(&plans[p].1, key)).await;
        admitted += total;
        over[p] += total.saturating_sub(fresh[p]);
    }
    accepting.abort();
    Round {
        over,
        admitted,
        unavailable,
        by_policy: by_policy.load(Ordering::Relaxed),
        latencies: std::mem::take(&mut *latencies.lock().unwrap()),
    }
}

/// Takes units of `l` until Redis denies one: how many it admitted.
async fn take_to_the_end(
    client: &Client<redis::aio::ConnectionManager>,
    l: &[(String, Algorithm)],
) -> u64 {
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no answer from Redis for {l:?}");
        match client.check_all(l, 1).await {
            Ok(o) if o.degraded.is_none() => {
                if !o.allowed {
                    return n;
                }
                n += 1;
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

fn percentile(sorted: &[u64], p: usize) -> u64 {
    sorted[(sorted.len() - 1) * p / 100]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_across_sentinel_failovers() {
    let rounds: usize = std::env::var("FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let lag = Duration::from_millis(
        std::env::var("FAILOVER_LAG_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    let names: Vec<&str> = plans().iter().map(|(n, _)| *n).collect();
    println!(
        "Sentinel failovers (the master killed with SIGKILL, or frozen with SIGSTOP), replication \
         lagging {} ms, {rounds} rounds of each; over-admission per round (min / median / max), \
         every round's sum",
        lag.as_millis()
    );
    println!(
        "| master | mode | {} | total | admitted | unavailable ms (median / max) | policy answers (median) | admitted call µs (p50 / p99) |",
        names.join(" | ")
    );
    println!(
        "|---|---|{}---:|---:|---:|---:|---:|",
        "---:|".repeat(names.len())
    );
    for (freeze, durable) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut results = Vec::new();
        for _ in 0..rounds {
            results.push(round(durable, freeze, lag).await);
        }
        let mut cells = Vec::new();
        for p in 0..names.len() {
            let mut v: Vec<u64> = results.iter().map(|r| r.over[p]).collect();
            v.sort_unstable();
            cells.push(format!(
                "{} / {} / {} ({})",
                v[0],
                percentile(&v, 50),
                v[v.len() - 1],
                v.iter().sum::<u64>()
            ));
        }
        let total: u64 = results.iter().flat_map(|r| r.over.iter()).sum();
        let admitted: u64 = results.iter().map(|r| r.admitted).sum();
        let mut down: Vec<u64> = results
            .iter()
            .map(|r| r.unavailable.as_millis() as u64)
            .collect();
        down.sort_unstable();
        let mut policy: Vec<u64> = results.iter().map(|r| r.by_policy).collect();
        policy.sort_unstable();
        let mut calls: Vec<u64> = results.iter().flat_map(|r| r.latencies.clone()).collect();
        calls.sort_unstable();
        println!(
            "| {} | {} | {} | {total} | {admitted} | {} / {} | {} | {} / {} |",
            if freeze { "SIGSTOP" } else { "SIGKILL" },
            if durable { "durable (WAIT 1)" } else { "plain" },
            cells.join(" | "),
            percentile(&down, 50),
            down[down.len() - 1],
            percentile(&policy, 50),
            percentile(&calls, 50),
            percentile(&calls, 99),
        );
        if durable {
            assert_eq!(
                total, 0,
                "durable admissions were admitted again after a failover"
            );
        }
    }
}
