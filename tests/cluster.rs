//! The module in a local 3-master Redis Cluster (one replica each), through the redis crate's
//! cluster client.

mod harness;

use std::thread::sleep;
use std::time::{Duration, Instant};

use harness::cluster::Cluster;
use harness::{cmd, info_field, skip_in_container};
use redis::Value;

/// The nodes announce the addresses they listen on, which the cluster client, `redis-cli
/// --cluster create` and the other nodes must all reach; containers listen on addresses of their
/// own, so the cluster runs on local servers only.
const CLUSTER_NEEDS_LOCAL: &str = "a cluster runs on local redis-server processes only";

fn decide(c: &mut redis::cluster::ClusterConnection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut command = redis::cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command.query(c)
}

fn allowed(reply: &redis::RedisResult<Value>) -> i64 {
    match reply {
        Ok(Value::Array(items)) => match items[0] {
            Value::Int(i) => i,
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn limits_hold_on_every_shard_multi_limits_need_one_slot_and_survive_a_failover() {
    if skip_in_container(CLUSTER_NEEDS_LOCAL) {
        return;
    }
    let cluster = Cluster::start(3, 1);
    let mut c = cluster.client();

    // 150 keys over all shards: each admits exactly its capacity (no refill during the test).
    for i in 0..150 {
        let key = format!("user:{i}");
        let admitted: i64 = (0..5)
            .map(|_| allowed(&decide(&mut c, &["RL.TOKENBUCKET", &key, "3", "0.001"])))
            .sum();
        assert_eq!(admitted, 3, "{key}");
    }
    let mut shards_used = 0;
    for n in &cluster.nodes {
        let mut nc = n.connect();
        if info_field(&mut nc, "replication", "role") == "master" {
            let keys: i64 = redis::cmd("DBSIZE").query(&mut nc).unwrap();
            assert!(keys > 0, "every master holds some of the keys");
            shards_used += 1;
        }
    }
    assert_eq!(shards_used, 3);

    // Several limits in one call: Redis refuses keys in different slots; hash tags put them in one.
    let cross = decide(
        &mut c,
        &[
            "RL.ALL",
            "2",
            "route:a",
            "client:b",
            "TOKENBUCKET",
            "5",
            "1",
            "TOKENBUCKET",
            "5",
            "1",
        ],
    );
    let err = cross.expect_err("keys in different slots");
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
    let same_slot = [
        "RL.ALL",
        "2",
        "{client:7}:route:a",
        "{client:7}:all",
        "TOKENBUCKET",
        "2",
        "0.001",
        "TOKENBUCKET",
        "5",
        "0.001",
    ];
    let admitted: i64 = (0..4).map(|_| allowed(&decide(&mut c, &same_slot))).sum();
    assert_eq!(admitted, 2);

    // Fail over the shard of one exhausted key: its limit is still exhausted on the new master.
    let key = "user:42";
    let (master, replica) = cluster.owners(key);
    let replica = replica.expect("the shard has a replica");
    {
        let mut m = cluster.nodes[master].connect();
        let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    }
    let mut r = cluster.nodes[replica].connect();
    cmd(&mut r, &["CLUSTER", "FAILOVER"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while info_field(&mut r, "replication", "role") != "master" {
        assert!(Instant::now() < deadline, "failover did not complete");
        sleep(Duration::from_millis(50));
    }
    cluster.wait_until_ok();
    assert_eq!(
        cluster.owners(key).0,
        replica,
        "the replica now serves the key"
    );
    let mut c = cluster.client();
    assert_eq!(
        allowed(&decide(&mut c, &["RL.TOKENBUCKET", key, "3", "0.001"])),
        0,
        "still exhausted"
    );
    assert_eq!(
        allowed(&decide(
            &mut c,
            &["RL.TOKENBUCKET", "user:43", "3", "0.001", "0"]
        )),
        1
    );
}

#[test]
fn command_getkeys_reports_key_positions() {
    if skip_in_container(CLUSTER_NEEDS_LOCAL) {
        return;
    }
    let cluster = Cluster::start(3, 0);
    let mut c = cluster.nodes[0].connect();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.TOKENBUCKET")
        .arg("k")
        .arg(1)
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["k"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.ALL")
        .arg(3)
        .arg("a")
        .arg("b")
        .arg("c")
        .arg("TOKENBUCKET")
        .arg(1)
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["a", "b", "c"]);
}
