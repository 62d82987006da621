//! `Client::top`: the most-denied keys that the module counts (`RL.TOP`), on a real server with
//! the test clock, so that counts and times are exact.

mod common;

use common::{Server, advance_clock, set_clock};
use ratelimit_client::{Algorithm, Client, Error, ModeChoice, Options, TopEntry};

const T0_US: i64 = 1_800_000_000_000_000;
const T0_MS: i64 = 1_800_000_000_000;

fn window(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window_sec: 3600.0,
    }
}

fn entry(key: &str, denied: u64, command: &str, first: i64, last: i64) -> TopEntry {
    TopEntry {
        key: key.to_string(),
        denied,
        error: 0,
        command: command.to_string(),
        first_denied_ms: first,
        last_denied_ms: last,
    }
}

#[tokio::test]
async fn the_most_denied_keys_with_exact_counts_and_times() {
    let server = Server::with_test_clock();
    let mut c = server.connect();
    set_clock(&mut c, T0_US);
    let client = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    assert_eq!(client.top(10).await.unwrap(), vec![]);
    // "a": 2 admitted, then 3 denied, the last 1.5 s after the first.
    for i in 0..5 {
        if i == 4 {
            advance_clock(&mut c, 1_500_000);
        }
        let o = client.check("a", &window(2), 1).await.unwrap();
        assert_eq!(o.decision.allowed, i < 2);
    }
    // "b": 1 admitted, 1 denied.
    advance_clock(&mut c, 500_000);
    for _ in 0..2 {
        client.check("b", &window(1), 1).await.unwrap();
    }
    // RL.ALL: "{t}d" is full, so it refuses twice and "{t}c" is never charged; the denials
    // count "{t}d".
    client.check("{t}d", &window(1), 1).await.unwrap();
    let both = [
        ("{t}c".to_string(), window(5)),
        ("{t}d".to_string(), window(1)),
    ];
    for _ in 0..2 {
        let o = client.check_all(&both, 1).await.unwrap();
        assert_eq!((o.allowed, o.denied_by), (false, 2));
    }
    // Peeks never deny.
    client.check("a", &window(2), 0).await.unwrap();
    assert_eq!(
        client.top(10).await.unwrap(),
        vec![
            entry("a", 3, "RL.FIXEDWINDOW", T0_MS, T0_MS + 1500),
            entry("{t}d", 2, "RL.ALL", T0_MS + 2000, T0_MS + 2000),
            entry("b", 1, "RL.FIXEDWINDOW", T0_MS + 2000, T0_MS + 2000),
        ]
    );
    assert_eq!(
        client.top(1).await.unwrap(),
        vec![entry("a", 3, "RL.FIXEDWINDOW", T0_MS, T0_MS + 1500)]
    );
    client.reset_top().await.unwrap();
    assert_eq!(client.top(10).await.unwrap(), vec![]);
    client.check("b", &window(1), 1).await.unwrap();
    assert_eq!(
        client.top(10).await.unwrap(),
        vec![entry("b", 1, "RL.FIXEDWINDOW", T0_MS + 2000, T0_MS + 2000)]
    );
    // No slots: nothing counted, an empty list.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("ratelimit.top-slots")
        .arg(0)
        .query(&mut c)
        .unwrap();
    client.check("b", &window(1), 1).await.unwrap();
    assert_eq!(client.top(10).await.unwrap(), vec![]);
    // A count the module refuses.
    let e = client.top(0).await.unwrap_err();
    assert!(
        matches!(&e, Error::Rejected(m) if m.starts_with("ERR count")),
        "{e}"
    );
}

/// More keys than slots: the list keeps the heaviest, and an evicted key's successor carries the
/// count it took over as `error`.
#[tokio::test]
async fn a_key_that_takes_over_a_slot_says_by_how_much_it_may_overcount() {
    let server = Server::with_test_clock();
    let mut c = server.connect();
    set_clock(&mut c, T0_US);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("ratelimit.top-slots")
        .arg(2)
        .query(&mut c)
        .unwrap();
    let client = Client::open(&server.url(), Options::default())
        .await
        .unwrap();
    for (key, denials) in [("x", 3), ("y", 2), ("z", 1)] {
        for _ in 0..=denials {
            client.check(key, &window(1), 1).await.unwrap();
        }
    }
    let top = client.top(10).await.unwrap();
    assert_eq!(top.len(), 2, "{top:?}");
    // "z" took over the lightest slot ("y", 2): counted 3, of which up to 2 may be "y"'s; of two
    // equal counts, the key denied last is listed first.
    assert_eq!(
        (top[0].key.as_str(), top[0].denied, top[0].error),
        ("z", 3, 2)
    );
    assert_eq!(top[1], entry("x", 3, "RL.FIXEDWINDOW", T0_MS, T0_MS));
}

#[tokio::test]
async fn only_the_module_counts_and_only_operators_may_ask() {
    let server = Server::with_module();
    for mode in [ModeChoice::Script, ModeChoice::Function] {
        let client = Client::open(
            &server.url(),
            Options {
                mode,
                ..Options::default()
            },
        )
        .await
        .unwrap();
        assert!(
            matches!(client.top(10).await, Err(Error::Unsupported(_))),
            "{mode:?}"
        );
        assert!(matches!(
            client.reset_top().await,
            Err(Error::Unsupported(_))
        ));
    }
    // An application's user: the limiters (the `ratelimit` category where the server has
    // module categories, Redis 7.4 on; the command itself before), not RL.TOP.
    let user = |limiters: &str| {
        redis::cmd("ACL")
            .arg(
                &[
                    "SETUSER", "app", "on", ">secret", "~*", limiters, "+command",
                ][..],
            )
            .query::<()>(&mut server.connect())
    };
    if user("+@ratelimit").is_err() {
        user("+rl.fixedwindow").unwrap();
    }
    let app = Client::open(
        &format!("redis://app:secret@127.0.0.1:{}", server.port),
        Options::default(),
    )
    .await
    .unwrap();
    let o = app.check("k", &window(1), 1).await.unwrap();
    assert!(o.decision.allowed);
    let e = app.top(10).await.unwrap_err();
    assert!(
        matches!(&e, Error::Rejected(m) if m.starts_with("NOPERM")),
        "{e}"
    );
    // Unreachable: no failure policy answers for it.
    let down = Client::connect(
        &format!("redis://127.0.0.1:{}", common::free_port()),
        Options {
            mode: ModeChoice::Module,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(matches!(down.top(10).await, Err(Error::Unavailable)));
}
