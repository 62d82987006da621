//! Masters, replicas and Sentinels for the failover tests: a master and a replica with the
//! module, in sync; a Sentinel (the same server binary run with `--sentinel`) watching them; a
//! Redis Cluster whose first master has a replica.

use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::{Opts, Server, free_port, server_binary};

/// The name the Sentinels know the master by.
pub const MASTER: &str = "rl";

pub fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(20));
    }
}

/// A numeric field of `INFO replication`.
pub fn replication_field(server: &Server, name: &str) -> Option<u64> {
    replication_info(server)?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `master` or `slave`; `None` when the server did not answer (a Sentinel reconfiguring it
/// closes its client connections, the one asking included).
pub fn role(server: &Server) -> Option<String> {
    let r: Vec<redis::Value> = redis::cmd("ROLE")
        .query(&mut server.try_connect().ok()?)
        .ok()?;
    match r.first() {
        Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

pub fn signal(server: &Server, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(server.pid().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until `replica` has every write `master` made so far.
pub fn caught_up(master: &Server, replica: &Server) {
    let written = replication_field(master, "master_repl_offset").unwrap();
    wait_for("the replica to catch up", || {
        replication_field(replica, "slave_repl_offset") >= Some(written)
    });
}

/// A master with the module, ready for replicas (no delay before a diskless sync), on a free
/// port (another one if that port is taken before the server binds it).
pub fn master() -> Server {
    Server::start_with(
        Opts {
            module: true,
            ..Opts::default()
        },
        &["--repl-diskless-sync-delay", "0"],
    )
}

/// A replica with the module of `master`, reaching it at `upstream_port` (the master's, or a
/// proxy's in front of it), in sync and streaming.
pub fn replica_of(master: &Server, upstream_port: u16) -> Server {
    replica_with(master, upstream_port, &[])
}

/// [`replica_of`] with more arguments for the replica (`--appendonly yes`...).
pub fn replica_with(master: &Server, upstream_port: u16, extra: &[&str]) -> Server {
    let port = upstream_port.to_string();
    let mut args = vec![
        "--replicaof",
        "127.0.0.1",
        &port,
        "--repl-diskless-sync-delay",
        "0",
    ];
    args.extend_from_slice(extra);
    let replica = Server::start_with(
        Opts {
            module: true,
            ..Opts::default()
        },
        &args,
    );
    streaming(master, &replica);
    replica
}

/// Waits until `replica` is in sync with `master` and the stream flows: online for the master
/// too, or WAIT skips it; and streaming: after a diskless sync the master holds the stream back
/// until the replica's first acknowledgement (up to a second later), so a write that reaches
/// the replica shows it flows. (The write's key is in the slots of a cluster's first master.)
fn streaming(master: &Server, replica: &Server) {
    wait_for("the replica to sync", || {
        replication_info(replica).is_some_and(|i| i.contains("master_link_status:up"))
    });
    wait_for("the master to count the replica online", || {
        replication_info(master).is_some_and(|i| i.contains("state=online"))
    });
    let _: () = redis::cmd("SET")
        .arg("warm-up")
        .arg(1)
        .query(&mut master.connect())
        .unwrap();
    caught_up(master, replica);
}

/// A master and one replica, both with the module, in sync.
pub fn pair() -> (Server, Server) {
    let master = master();
    let replica = replica_of(&master, master.port);
    (master, replica)
}

pub struct Sentinel {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// A Sentinel watching the master at `master_port` (quorum 1, down after 400 ms, failover
    /// timeout 4 s), ready when it has read the replica's own INFO (a replica it has not read is
    /// no candidate).
    pub fn start(master_port: u16) -> Sentinel {
        Sentinel::with_failover_timeout(master_port, Duration::from_secs(4))
    }

    /// [`Sentinel::start`] with another failover timeout. It is also how long the Sentinel leaves
    /// a replica that names another address than the master's (a proxy's in front of it) before
    /// it points the replica at the master itself.
    pub fn with_failover_timeout(master_port: u16, failover_timeout: Duration) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {MASTER} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {MASTER} 400\n\
                 sentinel failover-timeout {MASTER} {timeout}\n",
                dir = dir.path().display(),
                timeout = failover_timeout.as_millis()
            ),
        )
        .unwrap();
        let child = Command::new(server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Sentinel {
            child,
            port,
            _dir: dir,
        };
        wait_for("the Sentinel to see the replica", || s.replica_ready());
        s
    }

    fn replica_ready(&self) -> bool {
        let Ok(mut c) = self.connect() else {
            return false;
        };
        let Ok(replicas) = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(MASTER)
            .query::<Vec<Vec<String>>>(&mut c)
        else {
            return false;
        };
        replicas.iter().any(|fields| {
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0] == name)
                    .map(|kv| kv[1].as_str())
            };
            field("flags") == Some("slave")
                && field("master-link-status") == Some("ok")
                && field("info-refresh").and_then(|ms| ms.parse::<u64>().ok()) < Some(5000)
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn connect(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection()
    }

    /// The master's port the Sentinel names now.
    pub fn master_port(&self) -> u16 {
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER)
            .query(&mut self.connect().unwrap())
            .unwrap();
        port
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of three masters with the module: the first holds slots 0 to 16381 (every
/// key the tests use but a few) and has a replica; the other two hold one slot each, so that
/// they vote when the replica asks to take over (`CLUSTER FAILOVER FORCE`).
pub struct ClusterWithReplica {
    pub master: Server,
    pub replica: Server,
    pub voters: Vec<Server>,
}

/// The slots of the cluster's first master.
pub const MASTER_SLOTS: u16 = 16382;

/// The text `CLUSTER <what>` answers (`INFO`, `NODES`), `None` when the node did not answer.
fn cluster_text(server: &Server, what: &str) -> Option<String> {
    redis::from_redis_value(cluster_cmd(server, &[what]).ok()?).ok()
}

fn cluster_cmd(server: &Server, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::cmd("CLUSTER");
    for a in args {
        c.arg(*a);
    }
    c.query(&mut server.try_connect()?)
}

impl ClusterWithReplica {
    /// The master listens on `master_port`; the cluster and its clients reach it at
    /// `announced_port` (its own, or a proxy's in front of it), and so does its replica.
    pub fn start(master_port: u16, announced_port: u16) -> ClusterWithReplica {
        let node = |port: Option<u16>, extra: &[&str]| {
            Server::start_with(
                Opts {
                    module: true,
                    cluster: true,
                    port,
                    ..Opts::default()
                },
                extra,
            )
        };
        let announced = announced_port.to_string();
        let bus = (master_port + 10_000).to_string();
        let master = node(
            Some(master_port),
            &[
                "--cluster-announce-port",
                &announced,
                "--cluster-announce-bus-port",
                &bus,
                "--repl-diskless-sync-delay",
                "0",
            ],
        );
        let voters: Vec<Server> = (0..2).map(|_| node(None, &[])).collect();
        let replica = node(None, &["--repl-diskless-sync-delay", "0"]);
        let last = (MASTER_SLOTS - 1).to_string();
        cluster_cmd(&master, &["ADDSLOTSRANGE", "0", &last]).unwrap();
        for (i, v) in voters.iter().enumerate() {
            let slot = (MASTER_SLOTS + i as u16).to_string();
            cluster_cmd(v, &["ADDSLOTS", &slot]).unwrap();
        }
        for other in voters.iter().chain([&replica]) {
            cluster_cmd(&master, &["MEET", "127.0.0.1", &other.port.to_string()]).unwrap();
        }
        let id = |s: &Server| -> String {
            redis::from_redis_value(cluster_cmd(s, &["MYID"]).unwrap()).unwrap()
        };
        let master_id = id(&master);
        let all = [&master, &replica, &voters[0], &voters[1]];
        wait_for("the cluster to form", || {
            all.iter().all(|s| {
                cluster_text(s, "INFO").is_some_and(|i| {
                    i.contains("cluster_state:ok") && i.contains("cluster_known_nodes:4")
                })
            })
        });
        cluster_cmd(&replica, &["REPLICATE", &master_id]).unwrap();
        let replica_id = id(&replica);
        wait_for("every node to know the replica", || {
            all.iter().all(|s| {
                cluster_text(s, "NODES").is_some_and(|nodes| {
                    nodes.lines().any(|l| {
                        l.starts_with(&replica_id) && l.contains("slave") && l.contains(&master_id)
                    })
                })
            })
        });
        streaming(&master, &replica);
        ClusterWithReplica {
            master,
            replica,
            voters,
        }
    }

    /// The nodes a client starts from: the master's announced address, the others'.
    pub fn urls(&self, announced_port: u16) -> Vec<String> {
        std::iter::once(format!("redis://127.0.0.1:{announced_port}"))
            .chain(
                [&self.replica, &self.voters[0], &self.voters[1]]
                    .iter()
                    .map(|s| s.url()),
            )
            .collect()
    }
}

/// `CLUSTER FAILOVER FORCE` on a cluster's `replica` (its master is dead or frozen: no
/// handshake with it, the other masters vote), until it is a master.
pub fn force_failover(replica: &Server) {
    cluster_cmd(replica, &["FAILOVER", "FORCE"]).unwrap();
    wait_for("the replica to take over", || {
        role(replica).as_deref() == Some("master")
    });
}

fn replication_info(server: &Server) -> Option<String> {
    redis::cmd("INFO")
        .arg("replication")
        .query(&mut server.try_connect().ok()?)
        .ok()
}
