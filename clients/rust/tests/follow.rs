//! The client follows a failover that Sentinel makes: a master with the module, one replica, one
//! Sentinel (the same server binary run with `--sentinel`), and `Client::sentinel`. A switch
//! (`SENTINEL FAILOVER`) turns the old master into a replica: the call that meets it fails with
//! `READONLY`, the next one reaches the new master. A master killed with SIGKILL: the calls are
//! answered by the failure policy until the Sentinel has promoted the replica, then reach it.
//! Either way the new master carries on from the state replicated to it, to the token.

mod common;

use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{Opts, Server, free_port, server_binary};
use ratelimit_client::{
    Algorithm, Client, Degraded, Error, FailurePolicy, Limiter, ModeChoice, Options,
    SentinelConnection,
};

const MASTER: &str = "rl";

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

struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(master_port: u16) -> Sentinel {
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
        // Ready when it has found the replica through the master's INFO and reads the
        // replica's own INFO (a replica it has not read yet is no candidate: NOGOODSLAVE).
        wait_for("the Sentinel to see the replica", || {
            let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(MASTER)
                .query(&mut s.connect()?)?;
            Ok(replicas.iter().any(|fields| {
                let field = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|kv| kv[0] == name)
                        .map(|kv| kv[1].as_str())
                };
                field("flags") == Some("slave")
                    && field("master-link-status") == Some("ok")
                    && field("info-refresh").and_then(|ms| ms.parse::<u64>().ok()) < Some(5000)
            }))
        });
        s
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection()
    }

    fn master_port(&self) -> u16 {
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

fn wait_for(what: &str, mut ready: impl FnMut() -> redis::RedisResult<bool>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(ready(), Ok(true)) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(50));
    }
}

fn role(server: &Server) -> String {
    let r: Vec<redis::Value> = redis::cmd("ROLE").query(&mut server.connect()).unwrap();
    match r.first() {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("ROLE: {other:?}"),
    }
}

/// A master and a replica with the module, in sync, and a Sentinel watching them.
fn setup() -> (Server, Server, Sentinel) {
    let module = Opts {
        module: true,
        ..Opts::default()
    };
    let master = Server::start_with(module, &["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = Server::start_with(
        module,
        &[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--repl-diskless-sync-delay",
            "0",
        ],
    );
    wait_for("the replica to sync", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.connect())?;
        Ok(info.contains("master_link_status:up"))
    });
    let sentinel = Sentinel::start(master.port);
    (master, replica, sentinel)
}

fn replication_field(server: &Server, name: &str) -> Option<u64> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut server.connect())
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// Three tokens of ten taken through the Sentinels, and the replica caught up with them (its
/// offset at the master's: a `WAIT` on another connection than the client's would not wait).
async fn spend_three(client: &Client<SentinelConnection>, master: &Server, replica: &Server) {
    for left in [9, 8, 7] {
        let o = client.check("k", &bucket(), 1).await.unwrap();
        assert!(o.decision.allowed && o.degraded.is_none(), "{o:?}");
        assert_eq!(o.decision.remaining, left);
    }
    let written = replication_field(master, "master_repl_offset").unwrap();
    wait_for("the replica to catch up", || {
        Ok(replication_field(replica, "slave_repl_offset") >= Some(written))
    });
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
        Ok(sentinel.master_port() == replica.port && role(&master) == "slave")
    });
    assert_eq!(role(&replica), "master");

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
    assert_eq!(role(&replica), "master");
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
