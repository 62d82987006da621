//! A local Redis Cluster: masters and replicas on loopback ports, the module loaded everywhere,
//! slots assigned by `redis-cli --cluster create`.

use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::{Options, Server, info_field};

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A port below 55535 whose cluster bus port (+10000) is free too.
pub(super) fn cluster_port() -> u16 {
    let _ = NEXT_PORT.compare_exchange(
        0,
        20_000 + (std::process::id() % 500) as u16 * 20,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    loop {
        let p = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
        assert!(p < 55_000, "no free port pair left");
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(p) && free(p + 10_000) {
            return p;
        }
    }
}

pub struct Cluster {
    pub nodes: Vec<Server>,
    replicas: usize,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each.
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        let nodes: Vec<Server> = (0..masters * (1 + replicas))
            .map(|_| {
                Server::with(Options {
                    cluster: true,
                    ..Options::default()
                })
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed (make test installs it)");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster {
            nodes,
            replicas: masters * replicas,
        };
        cluster.wait_until_ok();
        cluster
    }

    /// Waits until every node sees the whole cluster as healthy, replicas included.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &self.nodes {
            let mut c = n.connect();
            let healthy = |c: &mut redis::Connection| {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(c).unwrap();
                let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(c).unwrap();
                let replicas = nodes
                    .lines()
                    .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("slave")))
                    .count();
                info.contains("cluster_state:ok") && replicas == self.replicas
            };
            while info_field(&mut c, "cluster", "cluster_enabled") != "1" || !healthy(&mut c) {
                assert!(Instant::now() < deadline, "cluster never became ok");
                sleep(Duration::from_millis(50));
            }
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect()
    }

    pub fn client(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// The node serving `key` as master, and one of its replicas if any.
    pub fn owners(&self, key: &str) -> (usize, Option<usize>) {
        let mut c = self.nodes[0].connect();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .unwrap();
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
        let index_of = |port: &str| {
            self.nodes
                .iter()
                .position(|n| port.starts_with(&format!("127.0.0.1:{}@", n.port)))
        };
        let mut master_id = String::new();
        let mut master = None;
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if !f[2].contains("master") {
                continue;
            }
            for range in &f[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<i64>(), hi.parse::<i64>())
                    && (lo..=hi).contains(&slot)
                {
                    master_id = f[0].to_string();
                    master = index_of(f[1]);
                }
            }
        }
        let replica = nodes
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f[3] == master_id)
            .and_then(|f| index_of(f[1]));
        assert!(master.is_some(), "no owner for slot {slot} in\n{nodes}");
        (master.unwrap_or(0), replica)
    }
}
