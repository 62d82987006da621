//! The client on a 3-master Redis Cluster (the module on every node, and the scripts): keys are
//! routed by slot, and several limits with one hash tag go in one call; reservations settle on
//! every shard.

mod common;

use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{Opts, Server};
use ratelimit_client::{Algorithm, Client, Concurrency, Mode, ModeChoice, Options};

struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    fn start(module: bool) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::start(Opts {
                    module,
                    cluster: true,
                    ..Opts::default()
                })
            })
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &nodes {
            let mut c = n.connect();
            loop {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster never became ok");
                sleep(Duration::from_millis(50));
            }
        }
        Cluster { nodes }
    }

    async fn client(&self, mode: ModeChoice) -> Client<redis::cluster_async::ClusterConnection> {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        let conn = redis::cluster::ClusterClient::new(urls)
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        Client::new(
            conn,
            Options {
                mode,
                timeout: Duration::from_secs(2),
                ..Options::default()
            },
        )
    }

    fn dbsizes(&self) -> Vec<i64> {
        self.nodes
            .iter()
            .map(|n| redis::cmd("DBSIZE").query(&mut n.connect()).unwrap())
            .collect()
    }
}

async fn every_key_admits_exactly_its_capacity(cluster: &Cluster, mode: ModeChoice, expect: Mode) {
    let client = cluster.client(mode).await;
    let algo = Algorithm::TokenBucket {
        capacity: 3,
        refill_per_sec: 0.0001,
    };
    for k in 0..60 {
        let key = format!("user:{k}");
        let mut allowed = 0;
        for _ in 0..5 {
            let o = client.check(&key, &algo, 1).await.unwrap();
            assert_eq!((o.degraded, o.mode), (None, Some(expect)));
            allowed += u32::from(o.decision.allowed);
        }
        assert_eq!(allowed, 3, "{key}");
    }
    let sizes = cluster.dbsizes();
    assert_eq!(sizes.iter().sum::<i64>(), 60);
    assert!(
        sizes.iter().all(|&n| n > 0),
        "keys on every shard: {sizes:?}"
    );

    // Several limits in one call: one hash tag puts them in one slot.
    let limits = |who: &str| {
        vec![
            (
                format!("{{{who}}}:route"),
                Algorithm::FixedWindow {
                    limit: 2,
                    window_sec: 3600.0,
                },
            ),
            (
                format!("{{{who}}}:global"),
                Algorithm::Gcra {
                    max_burst: 9,
                    count_per_period: 1,
                    period_sec: 3600.0,
                },
            ),
        ]
    };
    for who in ["a", "b", "c", "d", "e", "f"] {
        let seen: Vec<(bool, usize)> = {
            let mut v = Vec::new();
            for _ in 0..3 {
                let o = client.check_all(&limits(who), 1).await.unwrap();
                assert_eq!(o.mode, Some(expect));
                v.push((o.allowed, o.denied_by));
            }
            v
        };
        assert_eq!(seen, vec![(true, 0), (true, 0), (false, 1)], "{who}");
    }
    // Keys without a common tag in one call: Redis refuses (CROSSSLOT), nothing is degraded.
    let err = client
        .check_all(
            &[
                ("x1".to_string(), limits("x")[0].1.clone()),
                ("x2".to_string(), limits("x")[1].1.clone()),
            ],
            1,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("rejected by redis: "), "{err}");

    // Leases on every shard: taken, refused when full, given back by release and on drop (the
    // key goes with its last lease).
    let two = Concurrency {
        limit: 2,
        lease_sec: 3600.0,
    };
    for k in 0..12 {
        let key = format!("jobs:{k}");
        let mut seen = Vec::new();
        let mut held = Vec::new();
        for _ in 0..3 {
            let o = client.acquire(&key, &two).await.unwrap();
            let d = o.outcome.decision;
            seen.push((o.outcome.mode, d.allowed, d.remaining));
            held.extend(o.lease);
        }
        assert_eq!(
            seen,
            vec![
                (Some(expect), true, 1),
                (Some(expect), true, 0),
                (Some(expect), false, 0)
            ],
            "{key}"
        );
        let dropped = held.pop().unwrap();
        assert!(held.pop().unwrap().release().await.unwrap());
        drop(dropped);
    }
    // A concurrency limit and a rate limit under one hash tag, in one call.
    let both = vec![
        (
            "{job}:inflight".to_string(),
            Algorithm::Concurrency(Concurrency {
                limit: 1,
                lease_sec: 3600.0,
            }),
        ),
        (
            "{job}:route".to_string(),
            Algorithm::FixedWindow {
                limit: 10,
                window_sec: 3600.0,
            },
        ),
    ];
    let first = client.acquire_all(&both, 1).await.unwrap();
    let second = client.acquire_all(&both, 1).await.unwrap();
    assert_eq!(
        (
            first.outcome.allowed,
            second.outcome.allowed,
            second.outcome.denied_by
        ),
        (true, false, 1)
    );
    assert!(first.lease.unwrap().release().await.unwrap());
    // Reservations settled on every shard: 6 reserved, 2 used; then 10 more charged, 2 of debt.
    let bucket = Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 0.0001,
    };
    for k in 0..12 {
        let key = format!("budget:{k}");
        let o = client.reserve(&key, &bucket, 6).await.unwrap();
        assert_eq!(
            (o.outcome.mode, o.outcome.decision.remaining),
            (Some(expect), 4)
        );
        let s = o.reservation.unwrap().settle(2).await.unwrap();
        assert_eq!((s.mode, s.decisions[0].remaining), (Some(expect), 8));
        let s = client
            .settle(&[(key.clone(), bucket.clone())], 10)
            .await
            .unwrap();
        assert_eq!(s.decisions[0].remaining, 0);
        assert!(
            !client
                .check(&key, &bucket, 1)
                .await
                .unwrap()
                .decision
                .allowed
        );
    }
    // Two limits under one hash tag, reserved and settled in one call each.
    let two = vec![
        ("{llm}:minute".to_string(), bucket.clone()),
        (
            "{llm}:day".to_string(),
            Algorithm::FixedWindow {
                limit: 100,
                window_sec: 86_400.0,
            },
        ),
    ];
    let o = client.reserve_all(&two, 5).await.unwrap();
    let s = o.reservation.unwrap().settle(1).await.unwrap();
    assert_eq!(
        s.decisions.iter().map(|d| d.remaining).collect::<Vec<_>>(),
        vec![9, 99]
    );
    // 60 buckets, 12 keys of the multi-limit calls, the route's window, 12 budgets and the two
    // settled together; no lease key is left.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.dbsizes().iter().sum::<i64>() != 87 {
        assert!(Instant::now() < deadline, "{:?}", cluster.dbsizes());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn module_on_a_three_master_cluster() {
    let cluster = Cluster::start(true);
    every_key_admits_exactly_its_capacity(&cluster, ModeChoice::Auto, Mode::Module).await;
}

#[tokio::test]
async fn scripts_on_a_three_master_cluster_without_the_module() {
    let cluster = Cluster::start(false);
    every_key_admits_exactly_its_capacity(&cluster, ModeChoice::Auto, Mode::Script).await;
}
