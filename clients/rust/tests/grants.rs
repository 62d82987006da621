//! Partial grants (`UPTO n`) through the client, in the module, Functions and script modes,
//! under the test clock (every number exact), and answered by each failure policy.

mod common;

use common::{Server, free_port, set_clock};
use ratelimit_client::{
    Algorithm, Client, Concurrency, Decision, Degraded, Error, FailurePolicy, Mode, ModeChoice,
    Options,
};

const START_US: i64 = 1_800_000_000_000_000;

fn d(allowed: bool, remaining: u64, retry: i64, reset: u64, limit: u64) -> Decision {
    Decision {
        allowed,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
        limit,
    }
}

/// A server with the module under the test clock and the Functions library loaded.
fn server() -> Server {
    let s = Server::with_test_clock();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(include_str!("../../../lua-reference/ratelimit.lua"))
        .query(&mut s.connect())
        .unwrap();
    s
}

fn reset(s: &Server) {
    let mut c = s.connect();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    set_clock(&mut c, START_US);
}

const MODES: [(ModeChoice, Mode); 3] = [
    (ModeChoice::Module, Mode::Module),
    (ModeChoice::Function, Mode::Function),
    (ModeChoice::Script, Mode::Script),
];

#[tokio::test]
async fn grants_in_every_mode() {
    let s = server();
    let fw = Algorithm::FixedWindow {
        limit: 10,
        window_sec: 60.0,
    };
    let tb = Algorithm::TokenBucket {
        capacity: 100,
        refill_per_sec: 10.0,
    };
    let fw5 = Algorithm::FixedWindow {
        limit: 5,
        window_sec: 60.0,
    };
    for (choice, mode) in MODES {
        reset(&s);
        let c = Client::connect(
            &s.url(),
            Options {
                mode: choice,
                ..Options::default()
            },
        )
        .unwrap();
        let got = |o: ratelimit_client::Outcome| {
            assert_eq!(
                (o.mode, o.degraded, o.answered_locally),
                (Some(mode), None, None)
            );
            (o.decision, o.granted)
        };
        assert_eq!(
            got(c.check_upto("api", &fw, 4).await.unwrap()),
            (d(true, 6, 0, 60_000, 10), 4)
        );
        assert_eq!(
            got(c.check_upto("api", &fw, 8).await.unwrap()),
            (d(true, 0, 0, 60_000, 10), 6),
            "only 6 were left"
        );
        assert_eq!(
            got(c.check_upto("api", &fw, 8).await.unwrap()),
            (d(false, 0, 60_000, 60_000, 10), 0),
            "the denial of one unit"
        );
        // What went unused goes back.
        let back = c
            .settle(&[("api".to_string(), fw.clone())], -3)
            .await
            .unwrap();
        assert_eq!(back.decisions, vec![d(true, 3, 0, 60_000, 10)]);
        // A plain check still grants its cost.
        assert_eq!(
            got(c.check("api", &fw, 2).await.unwrap()),
            (d(true, 1, 0, 60_000, 10), 2)
        );
        assert_eq!(
            got(c.check("api", &fw, 2).await.unwrap()),
            (d(false, 1, 60_000, 60_000, 10), 0)
        );
        // Several limits: the fewest left, granted to all.
        let plan = vec![
            ("tenant:7".to_string(), tb.clone()),
            ("user:42".to_string(), fw5.clone()),
        ];
        let o = c.check_all_upto(&plan, 8).await.unwrap();
        assert_eq!(
            (
                o.allowed,
                o.denied_by,
                o.granted,
                o.mode,
                o.decisions.clone()
            ),
            (
                true,
                0,
                5,
                Some(mode),
                vec![d(true, 95, 0, 500, 100), d(true, 0, 0, 60_000, 5)]
            )
        );
        let o = c.check_all_upto(&plan, 8).await.unwrap();
        assert_eq!(
            (o.allowed, o.denied_by, o.granted, o.decisions.clone()),
            (
                false,
                2,
                0,
                vec![d(true, 95, 0, 500, 100), d(false, 0, 60_000, 60_000, 5)]
            )
        );
        // One limit alone goes through its own command.
        let o = c.check_all_upto(&plan[..1], 1_000).await.unwrap();
        assert_eq!(
            (o.granted, o.decisions[0]),
            (95, d(true, 0, 0, 10_000, 100))
        );
    }
    let calls: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut s.connect())
        .unwrap();
    assert!(calls.contains("cmdstat_rl.all:calls=2,"), "{calls}");
}

#[tokio::test]
async fn what_is_not_granted_in_part() {
    let s = server();
    reset(&s);
    let c = Client::open(&s.url(), Options::default()).await.unwrap();
    let slots = Algorithm::Concurrency(Concurrency {
        limit: 3,
        lease_sec: 10.0,
    });
    assert!(matches!(
        c.check_upto("k", &slots, 2).await,
        Err(Error::Unsupported(_))
    ));
    let fw = Algorithm::FixedWindow {
        limit: 10,
        window_sec: 60.0,
    };
    assert!(matches!(
        c.check_all_upto(&[("a".into(), fw.clone()), ("b".into(), slots)], 2)
            .await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        c.check_upto("k", &fw, 0).await,
        Err(Error::Unsupported(_))
    ));
    let log = Algorithm::SlidingLog {
        limit: 10,
        window_sec: 60.0,
    };
    match c.check_upto("log", &log, 1001).await {
        Err(Error::Rejected(m)) => assert_eq!(
            m,
            "ERR UPTO must be between 1 and 1000 for a sliding log (one entry per unit)"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn each_failure_policy_grants_its_way() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let fw = Algorithm::FixedWindow {
        limit: 10,
        window_sec: 60.0,
    };
    let client = |policy| {
        Client::connect(
            &url,
            Options {
                policy,
                ..Options::default()
            },
        )
        .unwrap()
    };
    let open = client(FailurePolicy::FailOpen)
        .check_upto("k", &fw, 5)
        .await
        .unwrap();
    assert_eq!(
        (open.decision, open.granted, open.degraded),
        (d(true, 10, 0, 0, 10), 5, Some(Degraded::FailOpen))
    );
    let closed = client(FailurePolicy::FailClosed)
        .check_upto("k", &fw, 5)
        .await
        .unwrap();
    assert_eq!(
        (closed.decision, closed.granted, closed.degraded),
        (d(false, 0, 1000, 1000, 10), 0, Some(Degraded::FailClosed))
    );
    // Two instances: a local bucket of 5.
    let local = client(FailurePolicy::Local { instances: 2 });
    let first = local.check_upto("k", &fw, 8).await.unwrap();
    assert_eq!(
        (
            first.decision.allowed,
            first.decision.remaining,
            first.granted
        ),
        (true, 0, 5)
    );
    let second = local.check_upto("k", &fw, 8).await.unwrap();
    assert_eq!((second.decision.allowed, second.granted), (false, 0));
    // "k" is empty: a plan with it is denied by it, and nothing is taken from the other.
    let plan = [("b".to_string(), fw.clone()), ("k".to_string(), fw.clone())];
    let all = local.check_all_upto(&plan, 3).await.unwrap();
    assert_eq!(
        (all.allowed, all.denied_by, all.granted, all.degraded),
        (false, 2, 0, Some(Degraded::Local)),
    );
    assert_eq!(all.decisions[0].remaining, 5);
    let plan = [("c".to_string(), fw.clone()), ("d".to_string(), fw)];
    let all = local.check_all_upto(&plan, 3).await.unwrap();
    assert_eq!(
        (
            all.allowed,
            all.granted,
            all.decisions[0].remaining,
            all.decisions[1].remaining
        ),
        (true, 3, 2, 2)
    );
}
