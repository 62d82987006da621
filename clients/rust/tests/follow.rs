//! The client follows a failover that Sentinel makes: a master with the module, one replica, one
//! Sentinel (the same server binary run with `--sentinel`), and `Client::sentinel`. A switch
//! (`SENTINEL FAILOVER`) turns the old master into a replica: the call that meets it fails with
//! `READONLY`, the next one reaches the new master. A master killed with SIGKILL: the calls are
//! answered by the failure policy until the Sentinel has promoted the replica, then reach it.
//! On a Redis Cluster (`Client::cluster`): a manual `CLUSTER FAILOVER` turns the master into a
//! replica that answers `MOVED`, which the next call follows; a frozen master (SIGSTOP) answers
//! nothing, and once its replica took over (`CLUSTER FAILOVER FORCE`) the calls reach it.
//! Either way the new master carries on from the state replicated to it, to the token.

mod common;

use std::time::{Duration, Instant};

use common::replicas::{
    ClusterWithReplica, MASTER, Sentinel, caught_up, force_failover, pair, role, signal, wait_for,
};
use common::{Server, cluster_port};
use ratelimit_client::{
    Algorithm, Client, Degraded, Error, FailurePolicy, FollowingClusterConnection, Limiter,
    ModeChoice, Options, SentinelConnection,
};

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 0.0001,
    }
}

fn options() -> Options {
    Options {
        timeout: Duration::from_millis(500),
        policy: FailurePolicy::FailClosed,
        mode: ModeChoice::Module,
        ..Options::default()
    }
}

/// A master and a replica with the module, in sync, and a Sentinel watching them.
fn setup() -> (Server, Server, Sentinel) {
    let (master, replica) = pair();
    let sentinel = Sentinel::start(master.port);
    (master, replica, sentinel)
}

/// Three tokens of ten taken through the Sentinels, and the replica caught up with them (its
/// offset at the master's: a `WAIT` on another connection than the client's would not wait).
async fn spend_three(client: &Client<SentinelConnection>, master: &Server, replica: &Server) {
    for left in [9, 8, 7] {
        let o = client.check("k", &bucket(), 1).await.unwrap();
        assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
        assert_eq!(o.decision.remaining, left);
    }
    caught_up(master, replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_switch_is_followed() {
    let (master, replica, sentinel) = setup();
    let client = Client::sentinel(&[&sentinel.url()], MASTER, options()).unwrap();
    spend_three(&client, &master, &replica).await;

    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER)
        .query(&mut sentinel.connect().unwrap())
        .unwrap();
    // The Sentinel promotes the replica, then turns the old master into its replica.
    wait_for("the old master to become a replica", || {
        sentinel.master_port() == replica.port && role(&master).as_deref() == Some("slave")
    });
    assert_eq!(role(&replica).as_deref(), Some("master"));

    // The Sentinel closed the old master's client connections when it reconfigured it
    // (`CLIENT KILL TYPE normal`, so that clients ask again): the failure policy answers.
    let o = client.check("k", &bucket(), 1).await.unwrap();
    assert_eq!(o.degraded, Some(Degraded::FailClosed), "{o:?}");
    // The next call asks the Sentinels and reaches the new master, which holds the 7 tokens.
    let o = client.check("k", &bucket(), 1).await.unwrap();
    assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
    assert_eq!(o.decision.remaining, 6);
    let direct = Client::connect(&replica.url(), options()).unwrap();
    let peek = Limiter::new(direct, bucket()).peek("k").await.unwrap();
    assert_eq!(
        peek.decision.remaining, 6,
        "the new master's own count: {peek:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_followed_through_the_sentinels() {
    let (mut master, replica, sentinel) = setup();
    let client = Client::sentinel(&[&sentinel.url()], MASTER, options()).unwrap();
    spend_three(&client, &master, &replica).await;

    master.kill();
    // The connection is gone: the failure policy answers until the Sentinel promotes the replica
    // (about 0.4 s to see the master down, then the election and the promotion).
    let o = client.check("k", &bucket(), 1).await.unwrap();
    assert_eq!(o.degraded, Some(Degraded::FailClosed), "{o:?}");
    assert!(!o.decision.allowed);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answered_by_policy = 1;
    let o = loop {
        let o = client.check("k", &bucket(), 1).await.unwrap();
        if o.degraded.is_none() {
            break o;
        }
        assert_eq!(o.degraded, Some(Degraded::FailClosed), "{o:?}");
        answered_by_policy += 1;
        assert!(
            Instant::now() < deadline,
            "the client never reached the new master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(o.decision.allowed, "{o:?}");
    assert_eq!(o.decision.remaining, 6, "{o:?}");
    assert_eq!(sentinel.master_port(), replica.port);
    assert_eq!(role(&replica).as_deref(), Some("master"));
    println!("answered by the failure policy: {answered_by_policy} calls, 100 ms apart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_turned_replica_answers_readonly_and_the_next_call_asks_the_sentinels() {
    // An operator's switch by hand: the replica promoted, the master made its replica (its
    // client connections stay open), the Sentinel told the new address.
    let (master, replica, sentinel) = setup();
    let client = Client::sentinel(&[&sentinel.url()], MASTER, options()).unwrap();
    spend_three(&client, &master, &replica).await;

    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.connect())
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(replica.port)
        .query(&mut master.connect())
        .unwrap();
    let mut s = sentinel.connect().unwrap();
    let _: () = redis::cmd("SENTINEL")
        .arg("REMOVE")
        .arg(MASTER)
        .query(&mut s)
        .unwrap();
    let _: () = redis::cmd("SENTINEL")
        .arg("MONITOR")
        .arg(MASTER)
        .arg("127.0.0.1")
        .arg(replica.port)
        .arg(1)
        .query(&mut s)
        .unwrap();
    assert_eq!(sentinel.master_port(), replica.port);

    // The connection still reaches the old master: READONLY, an error and never the policy.
    match client.check("k", &bucket(), 1).await {
        Err(Error::Rejected(m)) => assert!(m.starts_with("READONLY"), "{m}"),
        other => panic!("expected READONLY: {other:?}"),
    }
    let o = client.check("k", &bucket(), 1).await.unwrap();
    assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
    assert_eq!(o.decision.remaining, 6);
    assert!(!client.breaker_open());
}

/// A cluster whose first master has a replica, a client of it, and three tokens of ten taken
/// from a key of that master, the replica caught up with them.
async fn cluster_spent_three() -> (ClusterWithReplica, Client<FollowingClusterConnection>) {
    let port = cluster_port();
    let cluster = ClusterWithReplica::start(port, port);
    let urls = cluster.urls(port);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::cluster(&urls, options()).await.unwrap();
    for left in [9, 8, 7] {
        let o = client.check("k", &bucket(), 1).await.unwrap();
        assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
        assert_eq!(o.decision.remaining, left);
    }
    caught_up(&cluster.master, &cluster.replica);
    (cluster, client)
}

/// The next calls on `k`: the one that meets the failover may be answered by the policy, then
/// the new master answers from where the old one was.
async fn carries_on(client: &Client<FollowingClusterConnection>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let o = loop {
        let o = client.check("k", &bucket(), 1).await.unwrap();
        if o.degraded.is_none() {
            break o;
        }
        assert_eq!(o.degraded, Some(Degraded::FailClosed));
        assert!(
            Instant::now() < deadline,
            "the client never reached the new master"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(o.decision.allowed, "{o:?}");
    assert_eq!(o.decision.remaining, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_is_followed_through_moved() {
    let (cluster, client) = cluster_spent_three().await;
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut cluster.replica.connect())
        .unwrap();
    wait_for("the replica to take over", || {
        role(&cluster.replica).as_deref() == Some("master")
            && role(&cluster.master).as_deref() == Some("slave")
    });
    // The old master, a replica now, redirects: the first call follows the MOVED itself.
    let o = client.check("k", &bucket(), 1).await.unwrap();
    assert!(o.degraded.is_none(), "{o:?}");
    assert_eq!(o.decision.remaining, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_cluster_master_is_followed_once_its_replica_took_over() {
    let (cluster, client) = cluster_spent_three().await;
    signal(&cluster.master, "STOP");
    force_failover(&cluster.replica);
    carries_on(&client).await;
    signal(&cluster.master, "CONT");
}
