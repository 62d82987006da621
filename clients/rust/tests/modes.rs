//! The module and the Lua twins give the same decisions through the client.

mod common;

use common::{Server, advance_clock, set_clock};
use ratelimit_client::{
    Algorithm, Client, Decision, Limiter, Mode, ModeChoice, MultiOutcome, Options,
};

fn algorithms() -> Vec<Algorithm> {
    vec![
        Algorithm::TokenBucket {
            capacity: 5,
            refill_per_sec: 2.5,
        },
        Algorithm::LeakyBucket {
            capacity: 4,
            leak_per_sec: 1.5,
        },
        Algorithm::FixedWindow {
            limit: 5,
            window_sec: 2.0,
        },
        Algorithm::SlidingWindow {
            limit: 5,
            window_sec: 2.0,
        },
        Algorithm::SlidingLog {
            limit: 4,
            window_sec: 1.5,
        },
        Algorithm::Gcra {
            max_burst: 3,
            count_per_period: 2,
            period_sec: 1.0,
        },
    ]
}

/// (clock advance in microseconds, cost): bursts, pauses, peeks, a cost above the limit.
const STEPS: &[(i64, u64)] = &[
    (0, 1),
    (0, 1),
    (0, 2),
    (1, 1),
    (0, 1),
    (0, 0),
    (250_000, 1),
    (1, 3),
    (400_000, 1),
    (0, 9),
    (999_999, 2),
    (0, 1),
    (0, 1),
    (0, 1),
    (3_000_000, 0),
    (0, 4),
    (0, 1),
    (700_000, 1),
    (0, 1),
    (0, 1),
];

#[tokio::test]
async fn module_and_scripts_decide_identically_under_the_test_clock() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, 1_800_000_000_000_000);
    let module = Client::connect(&server.url(), Options::default()).unwrap();
    let script = Client::connect(
        &server.url(),
        Options {
            mode: ModeChoice::Script,
            ..Options::default()
        },
    )
    .unwrap();
    for (n, algo) in algorithms().into_iter().enumerate() {
        let (mut allowed, mut denied) = (0, 0);
        for (i, &(advance, cost)) in STEPS.iter().enumerate() {
            advance_clock(&mut admin, advance);
            if i == 10 {
                // The scripts are reloaded with EVAL when the server forgot them.
                let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
            }
            let a = module.check(&format!("m:{n}"), &algo, cost).await.unwrap();
            let b = script.check(&format!("s:{n}"), &algo, cost).await.unwrap();
            assert_eq!(a.mode, Some(Mode::Module));
            assert_eq!(b.mode, Some(Mode::Script));
            assert_eq!((a.degraded, b.degraded), (None, None));
            assert_eq!(a.decision, b.decision, "{algo:?} step {i}");
            if cost > 0 {
                if a.decision.allowed {
                    allowed += 1
                } else {
                    denied += 1
                }
            }
        }
        assert!(allowed >= 5 && denied >= 3, "{algo:?}: {allowed} {denied}");
    }
}

#[tokio::test]
async fn several_limits_at_once_agree_in_both_modes() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, 1_800_000_000_000_000);
    let module = Client::connect(&server.url(), Options::default()).unwrap();
    let script = Client::connect(
        &server.url(),
        Options {
            mode: ModeChoice::Script,
            ..Options::default()
        },
    )
    .unwrap();
    let limits = |p: &str| {
        vec![
            (
                format!("{{{p}}}:route"),
                Algorithm::TokenBucket {
                    capacity: 3,
                    refill_per_sec: 0.1,
                },
            ),
            (
                format!("{{{p}}}:client"),
                Algorithm::FixedWindow {
                    limit: 100,
                    window_sec: 1.0,
                },
            ),
            (
                format!("{{{p}}}:log"),
                Algorithm::SlidingLog {
                    limit: 5,
                    window_sec: 10.0,
                },
            ),
        ]
    };
    let mut outcomes: Vec<MultiOutcome> = Vec::new();
    for _ in 0..4 {
        let a = module.check_all(&limits("m"), 1).await.unwrap();
        let b = script.check_all(&limits("s"), 1).await.unwrap();
        assert_eq!(a.mode, Some(Mode::Module));
        assert_eq!(b.mode, Some(Mode::Script));
        assert_eq!(
            (a.allowed, a.denied_by, &a.decisions),
            (b.allowed, b.denied_by, &b.decisions)
        );
        outcomes.push(a);
    }
    let last = &outcomes[3];
    assert_eq!((last.allowed, last.denied_by), (false, 1));
    assert_eq!(
        last.decisions,
        vec![
            Decision {
                allowed: false,
                remaining: 0,
                retry_after_ms: 10_000,
                reset_after_ms: 30_000,
                limit: 3
            },
            Decision {
                allowed: true,
                remaining: 97,
                retry_after_ms: 0,
                reset_after_ms: 1_000,
                limit: 100
            },
            // Three entries from the admitted calls; nothing was taken by the fourth.
            Decision {
                allowed: true,
                remaining: 2,
                retry_after_ms: 0,
                reset_after_ms: 10_000,
                limit: 5
            },
        ]
    );
    advance_clock(&mut admin, 10_000_000);
    let a = module.check_all(&limits("m"), 1).await.unwrap();
    let b = script.check_all(&limits("s"), 1).await.unwrap();
    assert!(a.allowed);
    assert_eq!(a.decisions, b.decisions);
}

/// Two real servers, one with the module and one without, on the real clock: parameters whose
/// refill over the test's duration is far below one unit, so time cannot change a decision.
#[tokio::test]
async fn detects_the_module_and_falls_back_to_scripts_on_a_plain_server() {
    let with = Server::with_module();
    let without = Server::without_module();
    for algo in [
        Algorithm::TokenBucket {
            capacity: 4,
            refill_per_sec: 0.0001,
        },
        Algorithm::FixedWindow {
            limit: 4,
            window_sec: 3600.0,
        },
        Algorithm::SlidingLog {
            limit: 4,
            window_sec: 3600.0,
        },
        Algorithm::Gcra {
            max_burst: 3,
            count_per_period: 1,
            period_sec: 10_000.0,
        },
    ] {
        let a = Limiter::connect(&with.url(), algo.clone(), Options::default()).unwrap();
        let b = Limiter::connect(&without.url(), algo.clone(), Options::default()).unwrap();
        assert_eq!(a.client().detect().await, Some(Mode::Module));
        assert_eq!(b.client().detect().await, Some(Mode::Script));
        let mut seen = Vec::new();
        for _ in 0..6 {
            let x = a.check("k").await.unwrap();
            let y = b.check("k").await.unwrap();
            assert_eq!((x.mode, y.mode), (Some(Mode::Module), Some(Mode::Script)));
            assert_eq!(
                (x.decision.allowed, x.decision.remaining, x.decision.limit),
                (y.decision.allowed, y.decision.remaining, y.decision.limit),
                "{algo:?}"
            );
            seen.push((x.decision.allowed, x.decision.remaining));
        }
        assert_eq!(
            seen,
            vec![
                (true, 3),
                (true, 2),
                (true, 1),
                (true, 0),
                (false, 0),
                (false, 0)
            ],
            "{algo:?}"
        );
        // A peek consumes nothing.
        let p = a.peek("other").await.unwrap();
        assert_eq!((p.decision.allowed, p.decision.remaining), (true, 4));
        let p = b.peek("other").await.unwrap();
        assert_eq!((p.decision.allowed, p.decision.remaining), (true, 4));
        let _: () = redis::cmd("FLUSHALL").query(&mut with.connect()).unwrap();
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut without.connect())
            .unwrap();
    }
}

#[tokio::test]
async fn open_detects_the_mode_at_once() {
    let with = Server::with_module();
    let without = Server::without_module();
    let algo = Algorithm::FixedWindow {
        limit: 1,
        window_sec: 1.0,
    };
    let a = Limiter::open(&with.url(), algo.clone(), Options::default())
        .await
        .unwrap();
    let b = Limiter::open(&without.url(), algo.clone(), Options::default())
        .await
        .unwrap();
    assert_eq!(a.client().mode(), Some(Mode::Module));
    assert_eq!(b.client().mode(), Some(Mode::Script));
    let lazy = Limiter::connect(&with.url(), algo, Options::default()).unwrap();
    assert_eq!(lazy.client().mode(), None);
    lazy.check("k").await.unwrap();
    assert_eq!(lazy.client().mode(), Some(Mode::Module));
}

#[tokio::test]
async fn bad_parameters_are_reported_not_degraded() {
    let server = Server::with_module();
    let l = Limiter::connect(
        &server.url(),
        Algorithm::TokenBucket {
            capacity: 0,
            refill_per_sec: 1.0,
        },
        Options::default(),
    )
    .unwrap();
    let err = l.check("k").await.unwrap_err().to_string();
    assert_eq!(
        err,
        "rejected by redis: ERR capacity must be between 1 and 1000000000000000"
    );
    assert!(!l.client().breaker_open());
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

#[tokio::test]
async fn the_functions_library_decides_as_the_module_and_is_detected_when_loaded() {
    let server = Server::with_test_clock();
    let mut admin = server.connect();
    set_clock(&mut admin, 1_800_000_000_000_000);
    load_library(&mut admin);
    let module = Client::connect(&server.url(), Options::default()).unwrap();
    let function = Client::connect(
        &server.url(),
        Options {
            mode: ModeChoice::Function,
            ..Options::default()
        },
    )
    .unwrap();
    for (n, algo) in algorithms().into_iter().enumerate() {
        for (i, &(advance, cost)) in STEPS.iter().enumerate() {
            advance_clock(&mut admin, advance);
            let a = module.check(&format!("m:{n}"), &algo, cost).await.unwrap();
            let b = function
                .check(&format!("f:{n}"), &algo, cost)
                .await
                .unwrap();
            assert_eq!((a.mode, b.mode), (Some(Mode::Module), Some(Mode::Function)));
            assert_eq!((a.degraded, b.degraded), (None, None));
            assert_eq!(a.decision, b.decision, "{algo:?} step {i}");
        }
    }
    let limits = |p: &str| {
        vec![
            (format!("{{{p}}}:a"), algorithms()[0].clone()),
            (format!("{{{p}}}:b"), algorithms()[4].clone()),
        ]
    };
    for _ in 0..7 {
        let a = module.check_all(&limits("m"), 1).await.unwrap();
        let b = function.check_all(&limits("f"), 1).await.unwrap();
        assert_eq!(b.mode, Some(Mode::Function));
        assert_eq!(
            (a.allowed, a.denied_by, &a.decisions),
            (b.allowed, b.denied_by, &b.decisions)
        );
    }

    // Without the module, `Auto` takes the library when it is loaded, else the scripts.
    let bare = Server::without_module();
    let plain = Client::connect(&bare.url(), Options::default()).unwrap();
    assert_eq!(plain.detect().await, Some(Mode::Script));
    let mut c = bare.connect();
    load_library(&mut c);
    let auto = Client::connect(&bare.url(), Options::default()).unwrap();
    assert_eq!(auto.detect().await, Some(Mode::Function));
    let o = auto.check("k", &algorithms()[0], 1).await.unwrap();
    assert_eq!((o.mode, o.decision.allowed), (Some(Mode::Function), true));
}
