//! The client's list of algorithms against the module's command descriptors: the same commands,
//! the same `RL.ALL` keywords and parameter counts, so the two cannot drift apart.

use ratelimit_client::{Algorithm, Concurrency};
use redis_rate_limiter::command::registry::DESCRIPTORS;
use redis_rate_limiter::command::settle;

/// One of each algorithm the client knows.
fn every_algorithm() -> Vec<Algorithm> {
    vec![
        Algorithm::TokenBucket {
            capacity: 10,
            refill_per_sec: 1.0,
        },
        Algorithm::LeakyBucket {
            capacity: 10,
            leak_per_sec: 1.0,
        },
        Algorithm::FixedWindow {
            limit: 10,
            window_sec: 1.0,
        },
        Algorithm::SlidingWindow {
            limit: 10,
            window_sec: 1.0,
        },
        Algorithm::SlidingLog {
            limit: 10,
            window_sec: 1.0,
        },
        Algorithm::Gcra {
            max_burst: 1,
            count_per_period: 1,
            period_sec: 1.0,
        },
        Algorithm::Concurrency(Concurrency {
            limit: 10,
            lease_sec: 1.0,
        }),
    ]
}

#[test]
fn the_client_knows_every_limiter_the_module_registers() {
    let mut ours: Vec<&str> = every_algorithm().iter().map(Algorithm::command).collect();
    ours.sort();
    // RL.ALL combines the others; CL.THROTTLE is redis-cell's interface, for its own clients;
    // RL.RELEASE gives back what RL.ACQUIRE took (Client::release); RL.SETTLE adjusts what the
    // others took (Client::settle).
    let mut theirs: Vec<&str> = DESCRIPTORS
        .iter()
        .map(|d| d.name.to_str().unwrap())
        .filter(|n| !["RL.ALL", "CL.THROTTLE", "RL.RELEASE", "RL.SETTLE"].contains(n))
        .collect();
    theirs.sort();
    assert_eq!(ours, theirs);
}

#[test]
fn keywords_and_parameters_match_the_descriptors() {
    for a in every_algorithm() {
        let d = DESCRIPTORS
            .iter()
            .find(|d| d.name.to_str() == Ok(a.command()))
            .unwrap();
        // RL.ALL combines every algorithm of the client.
        assert_eq!(d.all_keyword, Some(a.keyword()), "{}", a.command());
        assert_eq!(a.params().len(), d.all_params(), "{}", a.command());
    }
}

/// `RL.SETTLE` settles every algorithm of the client but concurrency limits, which the client
/// refuses to settle.
#[test]
fn every_algorithm_but_concurrency_is_settled() {
    let mut ours: Vec<&str> = every_algorithm()
        .iter()
        .filter(|a| a.concurrency().is_none())
        .map(Algorithm::keyword)
        .collect();
    ours.sort();
    let mut theirs: Vec<&str> = settle::algorithms().map(|(_, k, _)| k).collect();
    theirs.sort();
    assert_eq!(ours, theirs);
}
