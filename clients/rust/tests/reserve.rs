//! Reserve, then settle, through the client: an estimate consumed up front, the difference with
//! the actual cost refunded or charged (into debt) by `RL.SETTLE`; the module, the scripts and the
//! Functions library answer alike and store the same bytes; the failure policies.

mod common;

use common::{Server, advance_clock, free_port, set_clock};
use ratelimit_client::{
    Algorithm, Client, Concurrency, Decision, Degraded, Error, FailurePolicy, Limiter, Mode,
    ModeChoice, Options, Reservation,
};
use redis::aio::ConnectionManager;

const T0: i64 = 1_800_000_000_000_000;

fn d(allowed: bool, remaining: u64, retry: i64, reset: u64, limit: u64) -> Decision {
    Decision {
        allowed,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
        limit,
    }
}

fn client(server: &Server, mode: ModeChoice) -> Client<ConnectionManager> {
    Client::connect(
        &server.url(),
        Options {
            mode,
            ..Options::default()
        },
    )
    .unwrap()
}

fn load_library(c: &mut redis::Connection) {
    let library = include_str!("../../../lua-reference/ratelimit.lua");
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query(c)
        .unwrap();
    assert_eq!(name, "ratelimit");
}

/// What a key holds, whatever its type, and its absolute expiry in ms.
fn stored(c: &mut redis::Connection, key: &str) -> (String, Vec<String>, i64) {
    let kind: String = redis::cmd("TYPE").arg(key).query(c).unwrap();
    let mut value: Vec<String> = match kind.as_str() {
        "string" => vec![redis::cmd("GET").arg(key).query(c).unwrap()],
        "hash" => redis::cmd("HGETALL").arg(key).query(c).unwrap(),
        "zset" => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(c)
            .unwrap(),
        "none" => Vec::new(),
        other => panic!("{key}: unexpected type {other}"),
    };
    if kind == "hash" {
        let mut pairs: Vec<(String, String)> = value
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect();
        pairs.sort();
        value = pairs.into_iter().flat_map(|(f, v)| [f, v]).collect();
    }
    let ttl: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    (kind, value, ttl)
}

fn budget() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 10_000,
        refill_per_sec: 100.0,
    }
}

/// The token budget of a language model: 10,000 tokens refilling 100/s, the clock standing
/// still. 4,000 reserved, 1,200 used: 2,800 back; 5,000 more back stops at the capacity; 10,500
/// charged leaves 500 of debt, so one token is 501 tokens (5.01 s) away.
#[tokio::test]
async fn a_token_budget_reserved_refunded_capped_and_charged_into_debt() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    load_library(&mut admin);
    for (prefix, mode) in [
        ("m", ModeChoice::Module),
        ("s", ModeChoice::Script),
        ("f", ModeChoice::Function),
    ] {
        set_clock(&mut admin, T0);
        let c = client(&server, mode);
        let key = format!("budget:{prefix}");
        let o = c.reserve(&key, &budget(), 4000).await.unwrap();
        assert_eq!(o.outcome.decision, d(true, 6000, 0, 40_000, 10_000));
        let r = o.reservation.expect("admitted");
        assert_eq!((r.estimate(), r.degraded()), (4000, None));
        let s = r.settle(1200).await.unwrap();
        assert_eq!(s.decisions, vec![d(true, 8800, 0, 12_000, 10_000)]);
        assert_eq!(s.degraded, None);
        let limits = vec![(key.clone(), budget())];
        let s = c.settle(&limits, -5000).await.unwrap();
        assert_eq!(s.decisions, vec![d(true, 10_000, 0, 0, 10_000)]);
        let s = c.settle(&limits, 10_500).await.unwrap();
        assert_eq!(s.decisions, vec![d(true, 0, 0, 105_000, 10_000)]);
        let denied = c.check(&key, &budget(), 1).await.unwrap();
        assert_eq!(denied.decision, d(false, 0, 5010, 105_000, 10_000));
        // DELTA 0 reports and writes nothing.
        let before = stored(&mut admin, &key);
        let s = c.settle(&limits, 0).await.unwrap();
        assert_eq!(s.decisions, vec![d(true, 0, 0, 105_000, 10_000)]);
        assert_eq!(stored(&mut admin, &key), before);
        // 5.01 s later the debt is paid and one token is back.
        advance_clock(&mut admin, 5_010_000);
        let o = c.check(&key, &budget(), 1).await.unwrap();
        assert_eq!(o.decision, d(true, 0, 0, 100_000, 10_000));
    }
    let m = stored(&mut admin, "budget:m");
    assert_eq!(stored(&mut admin, "budget:s"), m);
    assert_eq!(stored(&mut admin, "budget:f"), m);
}

fn algorithms() -> Vec<Algorithm> {
    vec![
        Algorithm::TokenBucket {
            capacity: 10,
            refill_per_sec: 2.0,
        },
        Algorithm::LeakyBucket {
            capacity: 10,
            leak_per_sec: 2.0,
        },
        Algorithm::FixedWindow {
            limit: 10,
            window_sec: 5.0,
        },
        Algorithm::SlidingWindow {
            limit: 10,
            window_sec: 5.0,
        },
        Algorithm::SlidingLog {
            limit: 10,
            window_sec: 5.0,
        },
        Algorithm::Gcra {
            max_burst: 9,
            count_per_period: 2,
            period_sec: 1.0,
        },
    ]
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Reserves; an admitted reservation replaces (drops unsettled) the one held.
    Reserve(u64),
    /// Settles the reservation held, if any, with this actual cost.
    Settle(u64),
    /// `Client::settle` with this delta.
    Delta(i64),
    Check(u64),
}

/// (clock advance in microseconds, operation).
const OPS: &[(i64, Op)] = &[
    (0, Op::Reserve(6)),
    (0, Op::Settle(2)),
    (100_000, Op::Reserve(5)),
    (0, Op::Settle(9)),
    (0, Op::Check(1)),
    (0, Op::Reserve(1)),
    (500_000, Op::Delta(0)),
    (0, Op::Delta(-3)),
    (0, Op::Check(2)),
    (1, Op::Reserve(4)),
    (0, Op::Settle(4)),
    (0, Op::Reserve(3)),
    (0, Op::Reserve(0)),
    (2_000_000, Op::Settle(25)),
    (0, Op::Check(1)),
    (0, Op::Reserve(0)),
    (3_000_000, Op::Check(1)),
    (250_000, Op::Delta(7)),
    (0, Op::Check(0)),
    (10_000_000, Op::Delta(-100)),
    (0, Op::Check(0)),
    (0, Op::Reserve(10)),
    (0, Op::Settle(0)),
    (0, Op::Reserve(11)),
];

/// The token bucket's answers to `OPS` (10 tokens, 2/s): `None` where there was no reservation
/// to settle. The debt stops at one capacity (-10 tokens), and a cost of 0 waits for it too.
fn token_bucket_answers() -> Vec<Option<Decision>> {
    [
        Some(d(true, 4, 0, 3000, 10)),
        // 4 back.
        Some(d(true, 8, 0, 1000, 10)),
        Some(d(true, 3, 0, 3401, 10)),
        // 4 more: 0.8 of debt, 1.8 tokens (0.9 s) from the next.
        Some(d(true, 0, 0, 5400, 10)),
        Some(d(false, 0, 901, 5400, 10)),
        Some(d(false, 0, 901, 5400, 10)),
        Some(d(true, 0, 0, 4900, 10)),
        Some(d(true, 3, 0, 3401, 10)),
        Some(d(true, 1, 0, 4400, 10)),
        Some(d(false, 1, 1400, 4400, 10)),
        None,
        Some(d(false, 1, 900, 4400, 10)),
        Some(d(true, 1, 0, 4400, 10)),
        // 5.2 tokens, 25 charged: the debt stops at 10.
        Some(d(true, 0, 0, 10_000, 10)),
        Some(d(false, 0, 5500, 10_000, 10)),
        Some(d(false, 0, 5000, 10_000, 10)),
        Some(d(false, 0, 2500, 7000, 10)),
        Some(d(true, 0, 0, 10_000, 10)),
        Some(d(false, 0, 5000, 10_000, 10)),
        // Refunds stop at the capacity.
        Some(d(true, 10, 0, 0, 10)),
        Some(d(true, 10, 0, 0, 10)),
        Some(d(true, 0, 0, 5000, 10)),
        Some(d(true, 10, 0, 0, 10)),
        Some(d(false, 10, -1, 0, 10)),
    ]
    .to_vec()
}

/// Every algorithm through one sequence of reservations, settlements (refunds, charges into
/// debt, reports, a drop) and checks under the test clock: the three modes give the same
/// decisions and store the same bytes after every step.
#[tokio::test]
async fn module_scripts_and_library_reserve_and_settle_identically() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, T0);
    load_library(&mut admin);
    let clients = [
        ("m", client(&server, ModeChoice::Module), Mode::Module),
        ("s", client(&server, ModeChoice::Script), Mode::Script),
        ("f", client(&server, ModeChoice::Function), Mode::Function),
    ];
    for (n, algo) in algorithms().into_iter().enumerate() {
        let mut held: Vec<Option<Reservation<ConnectionManager>>> = vec![None, None, None];
        let (mut refused, mut settled) = (0, 0);
        for (i, &(advance, op)) in OPS.iter().enumerate() {
            advance_clock(&mut admin, advance);
            if i == 13 {
                // The settle script is reloaded with EVAL when the server forgot it.
                let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
            }
            let mut answers: Vec<(Vec<Decision>, bool)> = Vec::new();
            for (k, (prefix, c, mode)) in clients.iter().enumerate() {
                let key = format!("{prefix}:{n}");
                let answer = match op {
                    Op::Reserve(estimate) => {
                        let o = c.reserve(&key, &algo, estimate).await.unwrap();
                        assert_eq!((o.outcome.mode, o.outcome.degraded), (Some(*mode), None));
                        assert_eq!(o.reservation.is_some(), o.outcome.decision.allowed);
                        let admitted = o.reservation.is_some();
                        if admitted {
                            held[k] = o.reservation;
                        }
                        (vec![o.outcome.decision], admitted)
                    }
                    Op::Settle(actual) => match held[k].take() {
                        Some(r) => {
                            let s = r.settle(actual).await.unwrap();
                            assert_eq!((s.mode, s.degraded), (Some(*mode), None));
                            (s.decisions, true)
                        }
                        None => (Vec::new(), false),
                    },
                    Op::Delta(delta) => {
                        let s = c
                            .settle(&[(key.clone(), algo.clone())], delta)
                            .await
                            .unwrap();
                        assert_eq!((s.mode, s.degraded), (Some(*mode), None));
                        (s.decisions, true)
                    }
                    Op::Check(cost) => {
                        let o = c.check(&key, &algo, cost).await.unwrap();
                        assert_eq!(o.mode, Some(*mode));
                        (vec![o.decision], o.decision.allowed)
                    }
                };
                answers.push(answer);
            }
            if n == 0 {
                let expected = token_bucket_answers()[i];
                assert_eq!(answers[0].0.first().copied(), expected, "step {i} ({op:?})");
            }
            assert_eq!(answers[1], answers[0], "{algo:?} step {i} ({op:?}): script");
            assert_eq!(
                answers[2], answers[0],
                "{algo:?} step {i} ({op:?}): function"
            );
            if matches!(op, Op::Settle(_) | Op::Delta(_)) && answers[0].1 {
                settled += 1;
                assert!(
                    answers[0]
                        .0
                        .iter()
                        .all(|d| d.allowed && d.retry_after_ms == 0)
                );
            } else if !answers[0].1 {
                refused += 1;
            }
            let m = stored(&mut admin, &format!("m:{n}"));
            assert_eq!(
                stored(&mut admin, &format!("s:{n}")),
                m,
                "{algo:?} step {i}"
            );
            assert_eq!(
                stored(&mut admin, &format!("f:{n}")),
                m,
                "{algo:?} step {i}"
            );
        }
        assert!(settled >= 6, "{algo:?}: {settled} settlements");
        assert!(refused >= 3, "{algo:?}: {refused} refusals");
    }
}

/// Two limits under one hash tag: reserved and settled together in every mode; a denial takes
/// nothing from either.
#[tokio::test]
async fn several_limits_reserve_and_settle_in_one_call() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, T0);
    load_library(&mut admin);
    let limits = |p: &str| {
        vec![
            (format!("{{{p}}}:tokens"), budget()),
            (
                format!("{{{p}}}:minute"),
                Algorithm::FixedWindow {
                    limit: 12_000,
                    window_sec: 60.0,
                },
            ),
        ]
    };
    for (prefix, mode, used) in [
        ("m", ModeChoice::Module, "rl.settle"),
        ("s", ModeChoice::Script, "evalsha"),
        ("f", ModeChoice::Function, "fcall"),
    ] {
        let c = client(&server, mode);
        let o = c.reserve_all(&limits(prefix), 4000).await.unwrap();
        assert_eq!((o.outcome.allowed, o.outcome.denied_by), (true, 0));
        assert_eq!(
            o.outcome.decisions,
            vec![
                d(true, 6000, 0, 40_000, 10_000),
                d(true, 8000, 0, 60_000, 12_000)
            ]
        );
        let r = o.reservation.unwrap();
        assert_eq!(r.limits(), limits(prefix).as_slice());
        let s = r.settle(1000).await.unwrap();
        assert_eq!(
            s.decisions,
            vec![
                d(true, 9000, 0, 10_000, 10_000),
                d(true, 11_000, 0, 60_000, 12_000)
            ],
            "{mode:?}"
        );
        // 9,500 is more than the bucket holds: denied by it, nothing taken from either.
        let o = c.reserve_all(&limits(prefix), 9500).await.unwrap();
        assert_eq!((o.outcome.allowed, o.outcome.denied_by), (false, 1));
        assert!(o.reservation.is_none());
        assert_eq!(o.outcome.decisions[0], d(false, 9000, 5000, 10_000, 10_000));
        // 6,000 more than the 1,000 reserved: the bucket down to 2,000, the window to 4,000.
        let o = c.reserve_all(&limits(prefix), 1000).await.unwrap();
        let s = o.reservation.unwrap().settle(7000).await.unwrap();
        assert_eq!(
            s.decisions,
            vec![
                d(true, 2000, 0, 80_000, 10_000),
                d(true, 4000, 0, 60_000, 12_000)
            ],
            "{mode:?}"
        );
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut admin)
            .unwrap();
        assert!(stats.contains(&format!("cmdstat_{used}:")), "{stats}");
    }
    for key in ["tokens", "minute"] {
        let m = stored(&mut admin, &format!("{{m}}:{key}"));
        assert_eq!(stored(&mut admin, &format!("{{s}}:{key}")), m);
        assert_eq!(stored(&mut admin, &format!("{{f}}:{key}")), m);
    }
}

/// Dropped unsettled, the estimate stays charged and nothing is sent; denied, there is no
/// reservation and nothing is taken.
#[tokio::test]
async fn a_dropped_reservation_keeps_the_estimate_and_a_denied_one_takes_nothing() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, T0);
    let l = Limiter::connect(&server.url(), budget(), Options::default()).unwrap();
    let o = l.reserve("k", 4000).await.unwrap();
    assert_eq!(o.outcome.decision.remaining, 6000);
    drop(o.reservation.unwrap());
    assert_eq!(l.peek("k").await.unwrap().decision.remaining, 6000);
    let o = l.reserve("k", 7000).await.unwrap();
    assert!(o.reservation.is_none());
    assert_eq!(o.outcome.decision, d(false, 6000, 10_000, 40_000, 10_000));
    assert_eq!(l.peek("k").await.unwrap().decision.remaining, 6000);
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut admin)
        .unwrap();
    assert!(!stats.contains("cmdstat_rl.settle"), "{stats}");
    // Settled with the estimate itself: DELTA 0, a report.
    let r = l.reserve("k", 1000).await.unwrap().reservation.unwrap();
    let s = r.settle(1000).await.unwrap();
    assert_eq!(s.decisions, vec![d(true, 5000, 0, 50_000, 10_000)]);
}

#[tokio::test]
async fn concurrency_limits_are_not_settled_and_bad_parameters_are_rejected() {
    let server = Server::with_module();
    let c = Client::connect(&server.url(), Options::default()).unwrap();
    let slots = Concurrency {
        limit: 2,
        lease_sec: 10.0,
    };
    assert!(matches!(
        c.reserve("k", &Algorithm::Concurrency(slots), 1).await,
        Err(Error::Unsupported(_))
    ));
    let mixed = vec![
        ("{a}:1".to_string(), budget()),
        ("{a}:2".to_string(), Algorithm::Concurrency(slots)),
    ];
    assert!(matches!(
        c.reserve_all(&mixed, 1).await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        c.settle(&mixed, 1).await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(c.settle(&[], 1).await, Err(Error::Unsupported(_))));
    let bad = vec![(
        "k".to_string(),
        Algorithm::TokenBucket {
            capacity: 0,
            refill_per_sec: 1.0,
        },
    )];
    let err = c.settle(&bad, -1).await.unwrap_err().to_string();
    assert!(err.starts_with("rejected by redis: ERR "), "{err}");
    assert!(!c.breaker_open());
}

fn on_closed_port(policy: FailurePolicy) -> Client<ConnectionManager> {
    Client::connect(
        &format!("redis://127.0.0.1:{}", free_port()),
        Options {
            policy,
            ..Options::default()
        },
    )
    .unwrap()
}

#[tokio::test]
async fn failure_policies_reserve_and_settle() {
    // FailOpen: admitted, nothing taken anywhere, the settlement sends nothing.
    let c = on_closed_port(FailurePolicy::FailOpen);
    let o = c.reserve("k", &budget(), 4000).await.unwrap();
    assert_eq!(o.outcome.degraded, Some(Degraded::FailOpen));
    let r = o.reservation.unwrap();
    assert_eq!(r.degraded(), Some(Degraded::FailOpen));
    let s = r.settle(9000).await.unwrap();
    assert_eq!(s.decisions, vec![d(true, 10_000, 0, 0, 10_000)]);
    assert_eq!((s.degraded, s.mode), (Some(Degraded::FailOpen), None));

    // FailClosed: denied, no reservation.
    let c = on_closed_port(FailurePolicy::FailClosed);
    let o = c.reserve("k", &budget(), 4000).await.unwrap();
    assert_eq!(o.outcome.decision, d(false, 0, 1000, 1000, 10_000));
    assert!(o.reservation.is_none());

    // Local, two instances: 100 tokens here, refilling one per 10,000 s (nothing refills
    // during the test). The in-process bucket is settled as Redis would be.
    let c = on_closed_port(FailurePolicy::Local { instances: 2 });
    let slow = Algorithm::TokenBucket {
        capacity: 200,
        refill_per_sec: 0.0002,
    };
    let o = c.reserve("k", &slow, 40).await.unwrap();
    assert_eq!(o.outcome.degraded, Some(Degraded::Local));
    assert_eq!(o.outcome.decision.remaining, 60);
    let s = o.reservation.unwrap().settle(10).await.unwrap();
    assert_eq!((s.degraded, s.mode), (Some(Degraded::Local), None));
    assert_eq!(
        (
            s.decisions[0].allowed,
            s.decisions[0].remaining,
            s.decisions[0].limit
        ),
        (true, 90, 100)
    );
    // 50 reserved, 100 used: 50 more, 10 of debt; one token is 11 tokens (110,000 s) away.
    let r = c
        .reserve("k", &slow, 50)
        .await
        .unwrap()
        .reservation
        .unwrap();
    assert_eq!(r.settle(100).await.unwrap().decisions[0].remaining, 0);
    let o = c.check("k", &slow, 1).await.unwrap();
    assert!(!o.decision.allowed);
    let retry = o.decision.retry_after_ms;
    assert!((109_999_000..=110_000_000).contains(&retry), "{retry}");
    let o = c.reserve("k", &slow, 1).await.unwrap();
    assert!(o.reservation.is_none());
    // Several limits: each local bucket settled.
    let window = Algorithm::FixedWindow {
        limit: 400,
        window_sec: 1_000_000.0,
    };
    let two = vec![
        ("{u}:a".to_string(), slow.clone()),
        ("{u}:b".to_string(), window),
    ];
    let o = c.reserve_all(&two, 30).await.unwrap();
    let s = o.reservation.unwrap().settle(5).await.unwrap();
    assert_eq!(
        s.decisions.iter().map(|d| d.remaining).collect::<Vec<_>>(),
        vec![95, 195]
    );
}

/// Reserved on Redis, which then goes away: the settlement is lost (the estimate stands on
/// Redis) and answered by the policy; the local buckets are left as they were.
#[tokio::test]
async fn a_settlement_redis_cannot_answer_is_degraded() {
    let mut server = Server::with_module();
    let c = Client::connect(
        &server.url(),
        Options {
            policy: FailurePolicy::Local { instances: 1 },
            ..Options::default()
        },
    )
    .unwrap();
    let r = c.reserve("k", &budget(), 4000).await.unwrap();
    assert_eq!(r.outcome.degraded, None);
    let r = r.reservation.unwrap();
    server.kill();
    let s = r.settle(100).await.unwrap();
    assert_eq!((s.degraded, s.mode), (Some(Degraded::Local), None));
    assert_eq!(s.decisions[0].remaining, 10_000);
}
