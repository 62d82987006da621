//! Masters, replicas and Sentinels for the failover tests: a master and a replica with the
//! module, in sync; a Sentinel (the same server binary run with `--sentinel`) watching them.

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
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut server.try_connect().ok()?)
        .ok()?;
    info.lines()
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

/// A master with the module, ready for replicas (no delay before a diskless sync).
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
    let port = upstream_port.to_string();
    let replica = Server::start_with(
        Opts {
            module: true,
            ..Opts::default()
        },
        &[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--repl-diskless-sync-delay",
            "0",
        ],
    );
    wait_for("the replica to sync", || {
        redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut replica.connect())
            .is_ok_and(|i| i.contains("master_link_status:up"))
    });
    // Online for the master too, or WAIT skips it; and streaming: after a diskless sync the
    // master holds the stream back until the replica's first acknowledgement (up to a second
    // later), so a write that reaches the replica shows it flows.
    wait_for("the master to count the replica online", || {
        redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut master.connect())
            .is_ok_and(|i| i.contains("state=online"))
    });
    let _: () = redis::cmd("SET")
        .arg("warm-up")
        .arg(1)
        .query(&mut master.connect())
        .unwrap();
    caught_up(master, &replica);
    replica
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
    /// A Sentinel watching the master at `master_port` (quorum 1, down after 400 ms), ready
    /// when it has read the replica's own INFO (a replica it has not read is no candidate).
    pub fn start(master_port: u16) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {MASTER} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {MASTER} 400\n\
                 sentinel failover-timeout {MASTER} 4000\n",
                dir = dir.path().display()
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
