//! Durable admissions (`Client::with_durability`): an admitting write is acknowledged by the
//! replica (`WAIT`) before it admits. A replica frozen with SIGSTOP acknowledges nothing: each
//! short acknowledgement becomes what `ShortAck` says. Then a failover to a replica that fell
//! behind: what the plain client admitted is admitted again by the new master, what the durable
//! client admitted is not. With `aof`, the replicas' append-only files must have the write
//! (`WAITAOF`), where the server has the command.

mod common;

use std::time::Duration;

use common::Server;
use common::replicas::{
    caught_up, master, pair, replica_with, replication_field, signal, wait_for,
};
use ratelimit_client::{
    Algorithm, Client, Degraded, Durability, DurabilityStats, Error, FailurePolicy, Limiter,
    ModeChoice, Options, ShortAck,
};

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 0.0001,
    }
}

fn options() -> Options {
    Options {
        timeout: Duration::from_millis(1000),
        policy: FailurePolicy::FailClosed,
        mode: ModeChoice::Module,
        ..Options::default()
    }
}

fn durable(server: &Server, short: ShortAck) -> Client<redis::aio::ConnectionManager> {
    Client::connect(&server.url(), options())
        .unwrap()
        .with_durability(Durability {
            replicas: 1,
            timeout: Duration::from_millis(300),
            short,
            aof: false,
        })
        .unwrap()
}

#[tokio::test]
async fn admissions_wait_for_the_replica_and_a_frozen_one_is_short() {
    let (master, replica) = pair();
    let deny = durable(&master, ShortAck::Deny);
    for left in [9, 8, 7] {
        let o = deny.check("k", &bucket(), 1).await.unwrap();
        assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
        assert_eq!(o.decision.remaining, left);
    }
    assert_eq!(
        deny.durability_stats(),
        DurabilityStats {
            acknowledged: 3,
            short: 0
        }
    );

    signal(&replica, "STOP");
    // The master took the unit, the replica did not acknowledge it: denied, nothing admitted.
    let o = deny.check("k", &bucket(), 1).await.unwrap();
    assert!(!o.decision.allowed, "{o:?}");
    assert_eq!((o.decision.remaining, o.granted, o.degraded), (6, 0, None));
    assert_eq!(o.decision.retry_after_ms, 1000);
    assert_eq!(deny.durability_stats().short, 1);
    // RL.ALL alike: every limit answers the refusal, as by the first.
    let both = [("k".to_string(), bucket()), ("k2".to_string(), bucket())];
    let m = deny.check_all(&both, 1).await.unwrap();
    assert!(!m.allowed && m.denied_by == 1 && m.granted == 0, "{m:?}");
    assert!(m.decisions.iter().all(|d| !d.allowed));
    assert_eq!(deny.durability_stats().short, 2);

    let admit = durable(&master, ShortAck::Admit);
    let o = admit.check("k", &bucket(), 1).await.unwrap();
    assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
    assert_eq!(o.decision.remaining, 4);
    assert_eq!(
        admit.durability_stats(),
        DurabilityStats {
            acknowledged: 0,
            short: 1
        }
    );

    let policy = durable(&master, ShortAck::FailurePolicy);
    let o = policy.check("k", &bucket(), 1).await.unwrap();
    assert_eq!(o.degraded, Some(Degraded::FailClosed), "{o:?}");
    assert!(!o.decision.allowed);

    // A denial writes nothing to wait for: answered without WAIT, counted nowhere.
    let spent = durable(&master, ShortAck::Deny);
    let o = spent.check("k", &bucket(), 100).await.unwrap();
    assert!(!o.decision.allowed);
    assert_eq!(spent.durability_stats(), DurabilityStats::default());
    signal(&replica, "CONT");

    // A client that is not made by Client::connect, or a WAIT longer than the call's budget,
    // is refused.
    let too_long = Client::connect(&master.url(), options())
        .unwrap()
        .with_durability(Durability {
            replicas: 1,
            timeout: Duration::from_millis(1000),
            short: ShortAck::Deny,
            aof: false,
        });
    assert!(matches!(too_long, Err(Error::Unsupported(_))));
}

/// The units spent on `key` that the (new) master at `server` knows of.
async fn spent_on(server: &Server, key: &str) -> i64 {
    let c = Client::connect(&server.url(), options()).unwrap();
    let o = Limiter::new(c, bucket()).peek(key).await.unwrap();
    10 - o.decision.remaining as i64
}

#[tokio::test]
async fn a_failover_to_a_lagging_replica_admits_again_only_what_was_not_durable() {
    let (mut master, replica) = pair();
    let plain = Client::connect(&master.url(), options()).unwrap();
    let durable = durable(&master, ShortAck::Deny);
    let mut admitted = [0i64; 2];
    for (i, c) in [&plain, &durable].into_iter().enumerate() {
        for _ in 0..3 {
            let key = ["plain", "durable"][i];
            if c.check(key, &bucket(), 1).await.unwrap().decision.allowed {
                admitted[i] += 1;
            }
        }
    }
    caught_up(&master, &replica);

    // The replica is cut off (pointed at a closed port, as a partition would leave it, its data
    // kept): the master goes on alone, then dies with what it did not send.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(common::free_port())
        .query(&mut replica.connect())
        .unwrap();
    wait_for("the master to lose its replica", || {
        replication_field(&master, "connected_slaves") == Some(0)
    });
    for (i, c) in [&plain, &durable].into_iter().enumerate() {
        for _ in 0..4 {
            let key = ["plain", "durable"][i];
            if c.check(key, &bucket(), 1).await.unwrap().decision.allowed {
                admitted[i] += 1;
            }
        }
    }
    master.kill();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.connect())
        .unwrap();

    assert_eq!(admitted, [7, 3]);
    // What the new master will admit again: the admissions it never heard of.
    let over = [
        admitted[0] - spent_on(&replica, "plain").await,
        admitted[1] - spent_on(&replica, "durable").await,
    ];
    assert_eq!(
        over,
        [4, 0],
        "over-admission after the failover: plain, durable"
    );
    assert_eq!(durable.durability_stats().short, 4);
}

#[tokio::test]
async fn aof_admissions_wait_for_the_append_only_files_where_the_server_has_waitaof() {
    // Two replicas: one writes an append-only file (fsynced on every write), one does not.
    let master = master();
    let with_aof = replica_with(
        &master,
        master.port,
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    // After its full sync a replica rewrites its file, and acknowledges nothing fsynced until
    // that is done.
    wait_for("the replica's append-only file", || {
        redis::cmd("INFO")
            .arg("persistence")
            .query::<String>(&mut with_aof.connect())
            .is_ok_and(|i| {
                [
                    "aof_enabled:1",
                    "aof_rewrite_in_progress:0",
                    "aof_rewrite_scheduled:0",
                ]
                .iter()
                .all(|f| i.contains(f))
            })
    });
    let _without = replica_with(&master, master.port, &[]);
    let waitaof: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("WAITAOF")
        .query(&mut master.connect())
        .unwrap();
    let has_waitaof =
        matches!(&waitaof, redis::Value::Array(a) if a.first() != Some(&redis::Value::Nil));
    let aof = |replicas, timeout: Duration| {
        // The client's own timeout stays above the wait's.
        let options = Options {
            timeout: timeout + Duration::from_secs(1),
            ..options()
        };
        Client::connect(&master.url(), options)
            .unwrap()
            .with_durability(Durability {
                replicas,
                timeout,
                short: ShortAck::Deny,
                aof: true,
            })
            .unwrap()
    };
    // One replica's file has it: admitted, by WAITAOF or (before 7.2) WAIT. The replica may
    // report its file's offset only with its next acknowledgement (once a second), so this wait
    // may take that long; it ends as soon as the acknowledgement comes.
    let one = aof(1, Duration::from_secs(3));
    let o = one.check("one", &bucket(), 1).await.unwrap();
    assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
    assert_eq!(
        one.durability_stats(),
        DurabilityStats {
            acknowledged: 1,
            short: 0
        }
    );
    // Both replicas' files: only one has a file, so WAITAOF falls short and the admission is
    // denied; WAIT counts both replicas' memory and admits.
    let two = aof(2, Duration::from_millis(300));
    let o = two.check("two", &bucket(), 1).await.unwrap();
    assert_eq!(o.decision.allowed, !has_waitaof, "{o:?}");
    assert_eq!(
        two.durability_stats(),
        if has_waitaof {
            DurabilityStats {
                acknowledged: 0,
                short: 1,
            }
        } else {
            DurabilityStats {
                acknowledged: 1,
                short: 0,
            }
        }
    );
}
