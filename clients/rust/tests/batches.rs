//! Leased batches for hot keys, on a real server under the test clock (the server's time stands
//! still, so a fixed window never ends and a bucket never refills unless a test moves it): no
//! process admits more than Redis granted it, whatever the race; what a batch does not use goes
//! back exactly (on lease end, flush, close and drop); batch sizes follow the stated rule.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Server, free_port, set_clock};
use ratelimit_client::{
    Algorithm, BatchStats, Batching, Client, Decision, Degraded, FailurePolicy, LocalAnswer, Mode,
    ModeChoice, Options,
};
use redis::aio::ConnectionManager;

const START_US: i64 = 1_800_000_000_000_000;

fn server() -> Server {
    let s = Server::with_test_clock();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(include_str!("../../../lua-reference/ratelimit.lua"))
        .query(&mut s.connect())
        .unwrap();
    set_clock(&mut s.connect(), START_US);
    s
}

/// `INFO commandstats` calls of `command` (lower case) since the last `CONFIG RESETSTAT`.
fn calls(s: &Server, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut s.connect())
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// What `algo` has left on `key` (a peek through the module).
fn left(s: &Server, key: &str, algo: &Algorithm) -> u64 {
    let reply: Vec<i64> = redis::cmd(algo.command())
        .arg(key)
        .arg(algo.params())
        .arg(0)
        .query(&mut s.connect())
        .unwrap();
    reply[1] as u64
}

/// Polls (at most 10 s) until `f` holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn options(mode: ModeChoice) -> Options {
    Options {
        mode,
        // Generous: a call the deadline cut would be answered by the policy, not by Redis.
        timeout: Duration::from_secs(5),
        policy: FailurePolicy::FailClosed,
        ..Options::default()
    }
}

fn fixed(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window_sec: 3600.0,
    }
}

fn d(allowed: bool, remaining: u64, retry: i64, reset: u64, limit: u64) -> Decision {
    Decision {
        allowed,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
        limit,
    }
}

/// `processes` clients of their own (as so many processes would have), `tasks` tasks each,
/// sending `requests` checks of one unit in all on a hot key of `limit`; then every client is
/// closed. The admissions, and every client's stats.
async fn race(
    s: &Server,
    mode: ModeChoice,
    limit: u64,
    requests: u64,
    processes: usize,
    tasks: usize,
) -> (u64, Vec<BatchStats>) {
    let algo = fixed(limit);
    let clients: Vec<Client<ConnectionManager>> = (0..processes)
        .map(|_| {
            Client::connect(&s.url(), options(mode))
                .unwrap()
                .with_batching(Batching::new().hot_key("hot"))
        })
        .collect();
    let next = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for c in &clients {
        for _ in 0..tasks {
            let (c, algo, next, admitted) =
                (c.clone(), algo.clone(), next.clone(), admitted.clone());
            handles.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let o = c.check("hot", &algo, 1).await.unwrap();
                    assert_eq!(o.degraded, None, "{o:?}");
                    if o.decision.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut stats = Vec::new();
    for c in &clients {
        c.close().await;
        stats.push(c.batch_stats());
    }
    (admitted.load(Ordering::Relaxed), stats)
}

/// Checks what a race admitted against the limit and the server's count.
fn exact(s: &Server, limit: u64, admitted: u64, stats: &[BatchStats], max_batch: u64) {
    // Never more than the limit: every admission spent a unit Redis granted.
    assert!(admitted <= limit, "over-admitted: {admitted} of {limit}");
    // Redis counts exactly the admissions: every unit not used went back.
    let counted = limit - left(s, "hot", &fixed(limit));
    assert_eq!(counted, admitted, "{stats:?}");
    for st in stats {
        assert_eq!(st.held, 0);
        assert_eq!(
            st.lapsed, 0,
            "a fixed window's return within it never lapses"
        );
        assert_eq!(st.granted, st.used + st.returned, "{st:?}");
    }
    // Under-admission: at most what the batches held when the requests ran out.
    let under = limit - admitted;
    assert!(
        under <= stats.len() as u64 * max_batch,
        "under-admitted {under}: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_racing_requests_admit_no_more_than_the_limit() {
    let s = server();
    // 4 clients ("processes") of 16 tasks, 10,000 requests on a limit of 1,000.
    let (admitted, stats) = race(&s, ModeChoice::Module, 1000, 10_000, 4, 16).await;
    exact(&s, 1000, admitted, &stats, 1024);
    let answered: u64 = stats.iter().map(|st| st.answered).sum();
    let refills: u64 = stats.iter().map(|st| st.refills).sum();
    // Batches answered most admissions without a call.
    assert!(answered > admitted / 2, "{stats:?}");
    assert!(refills < admitted / 4, "{stats:?}");
    eprintln!("admitted {admitted} of 1000; {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_in_the_function_and_script_modes() {
    let s = server();
    for (i, mode) in [ModeChoice::Function, ModeChoice::Script]
        .into_iter()
        .enumerate()
    {
        let _: () = redis::cmd("DEL")
            .arg("hot")
            .query(&mut s.connect())
            .unwrap();
        let (admitted, stats) = race(&s, mode, 300, 1500, 2, 8).await;
        exact(&s, 300, admitted, &stats, 1024);
        assert!(stats.iter().all(|st| st.refills > 0), "{i}: {stats:?}");
    }
    assert!(calls(&s, "fcall") > 0 && calls(&s, "evalsha") > 0);
    assert_eq!(calls(&s, "rl.fixedwindow"), 2, "only the peeks");
}

/// Batch sizes, one request at a time on a limit of 100 (B from 2, at most a quarter of what
/// remains): 2, 4, 8, 16, then capped by what remains: 17, 13, 10, 7, 5, 4, 3, 2, 2; then one
/// call per request, the last 7 units and the denials.
#[tokio::test]
async fn batch_sizes_grow_then_follow_what_remains() {
    let s = server();
    let algo = fixed(100);
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(
            Batching::new()
                .hot_key("hot")
                .initial(2)
                .max_batch(64)
                .remaining_share(4)
                .lease(Duration::from_secs(600)),
        );
    let mut grants = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..110 {
        let before = c.batch_stats().granted;
        let o = c.check("hot", &algo, 1).await.unwrap();
        let g = c.batch_stats().granted - before;
        if g > 0 {
            grants.push(g);
        }
        answers.push((o.decision.allowed, o.decision.remaining, o.answered_locally));
    }
    assert_eq!(grants, vec![2, 4, 8, 16, 17, 13, 10, 7, 5, 4, 3, 2, 2]);
    let st = c.batch_stats();
    assert_eq!(
        (st.refills, st.granted, st.used, st.answered, st.held),
        (13, 93, 93, 80, 0)
    );
    // Every answer's remaining is what Redis had before the grant less what was admitted since:
    // 99, 98, ... as one call per request would have said.
    let remaining: Vec<u64> = answers.iter().map(|a| a.1).collect();
    let expected: Vec<u64> = (0..100).rev().chain(std::iter::repeat_n(0, 10)).collect();
    assert_eq!(remaining, expected);
    assert_eq!(answers.iter().filter(|a| a.0).count(), 100);
    assert_eq!(answers[0].2, None, "the first took the batch");
    assert_eq!(answers[1].2, Some(LocalAnswer::Batch));
    assert_eq!(answers[93].2, None, "one call per request near the end");
    // 13 grants, 7 calls for the last units and 10 denials.
    assert_eq!(calls(&s, "rl.fixedwindow"), 30);
    assert_eq!(left(&s, "hot", &algo), 0);

    // Far from the limit, B doubles up to max_batch: 2 + 4 + ... + 64 = 126 requests in 6
    // grants, the 127th takes a 7th of 64.
    let big = fixed(1_000_000);
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(
            Batching::new()
                .hot_key("big")
                .initial(2)
                .max_batch(64)
                .lease(Duration::from_secs(600)),
        );
    let limits = [("big".to_string(), big.clone())];
    for _ in 0..126 {
        assert!(c.check("big", &big, 1).await.unwrap().decision.allowed);
    }
    assert_eq!(c.batch_stats().refills, 6);
    assert_eq!(c.batch_size(&limits), Some(64));
    c.check("big", &big, 1).await.unwrap();
    let st = c.batch_stats();
    assert_eq!((st.refills, st.granted, st.held), (7, 190, 63));
    assert_eq!(c.batch_size(&limits), Some(64));
    // A batch that ends with units unused halves B: flush gives back the 63.
    assert_eq!(c.flush().await, 63);
    assert_eq!(c.batch_size(&limits), Some(32));
    assert_eq!(left(&s, "big", &big), 1_000_000 - 127);
}

/// A batch gives back what it did not use when its lease ends: exactly, for a fixed window and
/// for a token bucket with room below its capacity; a sliding window's units lapse.
#[tokio::test]
async fn what_a_batch_did_not_use_goes_back_when_its_lease_ends() {
    let s = server();
    let fw = fixed(1000);
    let tb = Algorithm::TokenBucket {
        capacity: 1000,
        refill_per_sec: 0.001,
    };
    let sw = Algorithm::SlidingWindow {
        limit: 1000,
        window_sec: 3600.0,
    };
    // Half the bucket used already: a refill while the batch is held has room below capacity.
    let _: Vec<i64> = redis::cmd("RL.TOKENBUCKET")
        .arg("tb")
        .arg(tb.params())
        .arg(500)
        .query(&mut s.connect())
        .unwrap();
    let lease = Duration::from_secs(1);
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(Batching::new().hot_keys_where(|_| true).lease(lease));
    let started = Instant::now();
    for (key, algo) in [("fw", &fw), ("tb", &tb), ("sw", &sw)] {
        for _ in 0..3 {
            assert!(c.check(key, algo, 1).await.unwrap().decision.allowed);
        }
    }
    if started.elapsed() < lease {
        // Batches of 8: 5 held in each.
        assert_eq!(c.batch_stats().held, 15);
        assert_eq!(left(&s, "fw", &fw), 992);
    }
    until("the leases end", || c.batch_stats().held == 0).await;
    let st = c.batch_stats();
    until("the returns", || {
        let st = c.batch_stats();
        st.returned + st.lapsed == st.granted - 9
    })
    .await;
    // Exactly what was used stays counted, but for the sliding window, whose units lapse.
    let st2 = c.batch_stats();
    assert_eq!(left(&s, "fw", &fw), 997, "{st:?}");
    assert_eq!(left(&s, "tb", &tb), 497);
    assert_eq!(left(&s, "sw", &sw), 997 - st2.lapsed);
    assert!(st2.lapsed >= 5, "{st2:?}");
}

#[tokio::test]
async fn close_and_drop_give_back_what_batches_hold() {
    let s = server();
    let algo = fixed(1000);
    let batching = Batching::new().hot_key("k").lease(Duration::from_secs(600));
    let a = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(batching.clone());
    let b = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(batching);
    for _ in 0..2 {
        a.check("k", &algo, 1).await.unwrap();
    }
    let b2 = b.clone();
    b.check("k", &algo, 1).await.unwrap();
    b2.check("k", &algo, 1).await.unwrap();
    assert_eq!(left(&s, "k", &algo), 1000 - 16, "two batches of 8");
    // close: given back before it returns; later calls go to Redis one by one.
    assert_eq!(a.close().await, 6);
    assert_eq!(left(&s, "k", &algo), 1000 - 10);
    let o = a.check("k", &algo, 1).await.unwrap();
    assert_eq!((o.answered_locally, o.decision.remaining), (None, 989));
    assert_eq!(a.batch_stats().refills, 1);
    // drop: the last clone gone, given back from a task.
    drop(b);
    assert_eq!(left(&s, "k", &algo), 989, "a clone still holds them");
    drop(b2);
    until("the drop's return", || left(&s, "k", &algo) == 995).await;
}

/// Several limits checked together are batched as one plan (`RL.ALL ... UPTO n`) and given
/// back to each in one `RL.SETTLE`.
#[tokio::test]
async fn plans_of_several_limits_are_batched_together() {
    let s = server();
    let tb = Algorithm::TokenBucket {
        capacity: 10_000,
        refill_per_sec: 0.001,
    };
    let fw = fixed(50);
    let plan = vec![("t".to_string(), tb.clone()), ("u".to_string(), fw.clone())];
    let _: Vec<i64> = redis::cmd("RL.TOKENBUCKET")
        .arg("t")
        .arg(tb.params())
        .arg(5000)
        .query(&mut s.connect())
        .unwrap();
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(
            Batching::new()
                .hot_key("u")
                .hot_key("v")
                .initial(4)
                .lease(Duration::from_secs(600)),
        );
    let mut seen = Vec::new();
    for _ in 0..60 {
        let o = c.check_all(&plan, 1).await.unwrap();
        seen.push((o.allowed, o.decisions[1].remaining));
    }
    assert_eq!(seen.iter().filter(|x| x.0).count(), 50);
    assert_eq!(
        seen.iter().map(|x| x.1).collect::<Vec<_>>(),
        (0..50)
            .rev()
            .chain(std::iter::repeat_n(0, 10))
            .collect::<Vec<_>>()
    );
    // Grants of 4, 5, 5, 4, 4, 3, 3, 2, 2, 2, 2 (a quarter... an eighth of what remains), then
    // one call per request from 14 left.
    let st = c.batch_stats();
    assert_eq!((st.refills, st.granted, st.answered), (11, 36, 25));
    assert_eq!(calls(&s, "rl.all"), 35);
    assert_eq!(left(&s, "t", &tb), 4950);
    // A plan's batch half used, then flushed: both limits get their units back.
    let other = vec![("t".to_string(), tb.clone()), ("v".to_string(), fixed(50))];
    c.check_all(&other, 1).await.unwrap();
    assert_eq!(left(&s, "t", &tb), 4946);
    assert_eq!(c.flush().await, 3);
    assert_eq!(left(&s, "t", &tb), 4949);
    assert_eq!(left(&s, "v", &fixed(50)), 49);
}

/// Without a declaration a key is batched once this process calls it `detect_per_sec` times
/// in a second.
#[tokio::test]
async fn a_key_called_often_is_detected_hot() {
    let s = server();
    let algo = fixed(100_000);
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(Batching::new().detect_per_sec(20));
    for _ in 0..19 {
        c.check("k", &algo, 1).await.unwrap();
    }
    assert_eq!(c.batch_stats().refills, 0);
    let o = c.check("k", &algo, 1).await.unwrap();
    assert_eq!((c.batch_stats().refills, o.decision.remaining), (1, 99_980));
    let o = c.check("k", &algo, 1).await.unwrap();
    assert_eq!(o.answered_locally, Some(LocalAnswer::Batch));
    assert_eq!(calls(&s, "rl.fixedwindow"), 20);
    // Calls of other costs and peeks: a peek is never batched.
    let o = c.check("k", &algo, 0).await.unwrap();
    // 19 + 8 taken on the server, 6 of them still in the batch.
    assert_eq!(
        (o.answered_locally, o.decision.remaining),
        (None, 100_000 - 27)
    );
    c.close().await;
}

/// With batches on, Redis unreachable: each policy answers as without them, and no batch is
/// formed; a batch taken before Redis went away is spent, then the policy answers.
#[tokio::test]
async fn failure_policies_with_batches() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let algo = fixed(100);
    for (policy, allowed, degraded) in [
        (FailurePolicy::FailOpen, true, Degraded::FailOpen),
        (FailurePolicy::FailClosed, false, Degraded::FailClosed),
        (FailurePolicy::Local { instances: 4 }, true, Degraded::Local),
    ] {
        let c = Client::connect(
            &url,
            Options {
                policy,
                ..Options::default()
            },
        )
        .unwrap()
        .with_batching(Batching::new().hot_key("k"));
        for _ in 0..3 {
            let o = c.check("k", &algo, 1).await.unwrap();
            assert_eq!((o.decision.allowed, o.degraded), (allowed, Some(degraded)));
            assert_eq!(o.answered_locally, None);
        }
        let st = c.batch_stats();
        assert_eq!((st.granted, st.held), (0, 0), "{policy:?}");
    }
    let local = Client::connect(
        &url,
        Options {
            policy: FailurePolicy::Local { instances: 4 },
            ..Options::default()
        },
    )
    .unwrap()
    .with_batching(Batching::new().hot_key("k"));
    let admitted = futures_count(&local, &algo, 40).await;
    assert_eq!(admitted, 25, "the local share, 100 / 4");

    let mut s = server();
    let c = Client::connect(
        &s.url(),
        Options {
            policy: FailurePolicy::FailClosed,
            ..Options::default()
        },
    )
    .unwrap()
    .with_batching(Batching::new().hot_key("k").lease(Duration::from_secs(600)));
    let o = c.check("k", &algo, 1).await.unwrap();
    assert_eq!(
        (o.decision, o.mode),
        (d(true, 99, 0, 3_600_000, 100), Some(Mode::Module))
    );
    s.kill();
    for i in 0..7 {
        let o = c.check("k", &algo, 1).await.unwrap();
        assert_eq!(
            (o.decision.allowed, o.decision.remaining, o.answered_locally),
            (true, 98 - i, Some(LocalAnswer::Batch))
        );
    }
    let o = c.check("k", &algo, 1).await.unwrap();
    assert_eq!(
        (o.decision.allowed, o.degraded),
        (false, Some(Degraded::FailClosed))
    );
}

async fn futures_count(c: &Client<ConnectionManager>, algo: &Algorithm, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        if c.check("k", algo, 1).await.unwrap().decision.allowed {
            admitted += 1;
        }
    }
    admitted
}

fn signal(server: &Server, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(sig)
        .arg(server.pid().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// A request cancelled while its refill is in flight (a client gone away): the grant still
/// makes its batch, the unit the request would have used goes back, and the next refill waits
/// for that one.
#[tokio::test]
async fn a_request_cancelled_during_its_refill_loses_nothing() {
    let s = server();
    let algo = fixed(1000);
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(Batching::new().hot_key("k").lease(Duration::from_secs(600)));
    assert!(c.detect().await.is_some());
    signal(&s, "-STOP");
    let task = {
        let (c, algo) = (c.clone(), algo.clone());
        tokio::spawn(async move { c.check("k", &algo, 1).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // Another caller meanwhile waits for the refill in flight.
    let waiter = {
        let (c, algo) = (c.clone(), algo.clone());
        tokio::spawn(async move { c.check("k", &algo, 1).await })
    };
    signal(&s, "-CONT");
    let o = waiter.await.unwrap().unwrap();
    assert_eq!(o.answered_locally, Some(LocalAnswer::Batch));
    until("the cancelled request's unit back", || {
        c.batch_stats().returned == 1
    })
    .await;
    assert_eq!(left(&s, "k", &algo), 1000 - 7);
    let st = c.batch_stats();
    assert_eq!(
        (st.refills, st.granted, st.used, st.returned, st.held),
        (1, 8, 1, 1, 6)
    );
    assert_eq!(c.close().await, 6);
    assert_eq!(left(&s, "k", &algo), 999);
}

/// The table holds a fixed number of keys: the least recently used one leaves, its batch given
/// back.
#[tokio::test]
async fn an_evicted_key_gives_its_batch_back() {
    let s = server();
    let algo = fixed(1000);
    let c = Client::connect(&s.url(), options(ModeChoice::Module))
        .unwrap()
        .with_batching(
            Batching::new()
                .hot_keys_where(|_| true)
                .max_keys(2)
                .lease(Duration::from_secs(600)),
        );
    for key in ["a", "b"] {
        c.check(key, &algo, 1).await.unwrap();
    }
    c.check("a", &algo, 1).await.unwrap();
    assert_eq!(c.batch_stats().held, 13);
    // "b" is the least recently used: "c" takes its place.
    c.check("c", &algo, 1).await.unwrap();
    until("b's return", || c.batch_stats().returned == 7).await;
    assert_eq!(left(&s, "b", &algo), 999);
    assert_eq!(left(&s, "a", &algo), 992);
    let limits = |k: &str| [(k.to_string(), algo.clone())];
    assert_eq!(c.batch_size(&limits("b")), None);
    assert_eq!(c.batch_size(&limits("a")), Some(8));
    assert_eq!(c.batch_stats().held, 6 + 7);
}
