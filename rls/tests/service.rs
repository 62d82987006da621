//! The service over gRPC, as Envoy calls it, on a real Redis with the module: a request's
//! descriptors decided all or none, `hits_addend` as the cost, per-descriptor statuses, the
//! kinds of descriptor (unlimited, shadow mode, replaces, no match), each algorithm with its
//! parameters, Redis down under each failure setting, the health service and `/healthcheck`,
//! the metrics, a reload and a malformed reload, and `--check`.

mod common;

use common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const OK: i32 = 1;
const OVER: i32 = 2;

const SHOP: &str = r#"
domain: shop
descriptors:
  - key: route
    value: checkout
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: health
    rate_limit: {unlimited: true}
  - key: batch
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plan
    value: basic
    rate_limit: {name: basic, unit: minute, requests_per_unit: 1}
  - key: plan_override
    rate_limit:
      unit: minute
      requests_per_unit: 4
      replaces: [{name: basic}]
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra, burst: 2}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding_window}
  - key: sl
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
"#;

struct Fixture {
    redis: Redis,
    dir: ConfigDir,
    rls: Rls,
}

fn fixture(extra: &[(&str, &str)]) -> Fixture {
    let redis = Redis::start(true);
    let dir = ConfigDir::new(&[("shop.yaml", SHOP)]);
    let mut env = env_for(&dir, redis.port);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let rls = Rls::start(&env);
    Fixture { redis, dir, rls }
}

async fn ask(f: &Fixture, req: RateLimitRequest) -> (i32, Vec<(i32, u32)>) {
    let r = f
        .rls
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect("answer");
    codes(r.get_ref())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_decided_all_or_none() {
    let f = fixture(&[]);
    let both: &[&[(&str, &str)]] = &[&[("route", "checkout")], &[("user", "ann")]];
    // route allows 3 a minute, user 5: three admitted, then route denies and user keeps 2.
    let want = [
        (OK, vec![(OK, 2), (OK, 4)]),
        (OK, vec![(OK, 1), (OK, 3)]),
        (OK, vec![(OK, 0), (OK, 2)]),
        (OVER, vec![(OVER, 0), (OK, 2)]),
        (OVER, vec![(OVER, 0), (OK, 2)]),
    ];
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&ask(&f, request("shop", both, 1)).await, w, "request {i}");
    }
    // The denied requests took nothing from user: two more alone, then it denies.
    let user: &[&[(&str, &str)]] = &[&[("user", "ann")]];
    assert_eq!(ask(&f, request("shop", user, 1)).await, (OK, vec![(OK, 1)]));
    assert_eq!(ask(&f, request("shop", user, 1)).await, (OK, vec![(OK, 0)]));
    assert_eq!(
        ask(&f, request("shop", user, 1)).await,
        (OVER, vec![(OVER, 0)])
    );
    // Another user has a counter of its own.
    assert_eq!(
        ask(&f, request("shop", &[&[("user", "bob")]], 1)).await,
        (OK, vec![(OK, 4)])
    );
    // One call to the server per request: 5 + 3 + 1.
    assert_eq!(f.rls.metric("ratelimit_rls_client_calls_total"), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_is_the_cost_and_statuses_carry_the_limit() {
    let f = fixture(&[]);
    let user: &[&[(&str, &str)]] = &[&[("user", "cy")]];
    assert_eq!(ask(&f, request("shop", user, 4)).await, (OK, vec![(OK, 1)]));
    assert_eq!(
        ask(&f, request("shop", user, 2)).await,
        (OVER, vec![(OVER, 1)])
    );
    assert_eq!(ask(&f, request("shop", user, 1)).await, (OK, vec![(OK, 0)]));
    // A descriptor's own hits_addend wins over the request's.
    let mut req = request("shop", &[&[("user", "dee")]], 1);
    req.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 3 });
    assert_eq!(ask(&f, req).await, (OK, vec![(OK, 2)]));

    let r = f
        .rls
        .client()
        .await
        .should_rate_limit(request("shop", &[&[("user", "eve")]], 1))
        .await
        .unwrap()
        .into_inner();
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().expect("current_limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (5, 2));
    assert_eq!(s.limit_remaining, 4);
    let reset = s
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset");
    assert!(
        (59..=60).contains(&reset.seconds) && (0..1_000_000_000).contains(&reset.nanos),
        "{reset:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_shadow_replaces_and_no_match() {
    let f = fixture(&[]);
    // Unlimited: OK with remaining u32::MAX and no limit, however often.
    for _ in 0..5 {
        let r = f
            .rls
            .client()
            .await
            .should_rate_limit(request("shop", &[&[("health", "x")]], 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(codes(&r), (OK, vec![(OK, u32::MAX)]));
        assert_eq!(r.statuses[0].current_limit, None);
    }
    // No match, and an unknown domain: OK, nothing counted.
    assert_eq!(
        ask(&f, request("shop", &[&[("nothing", "x")]], 1)).await,
        (OK, vec![(OK, 0)])
    );
    assert_eq!(
        ask(&f, request("elsewhere", &[&[("user", "x")]], 1)).await,
        (OK, vec![(OK, 0)])
    );
    // Shadow mode: over its limit, still OK, and counted as shadow_mode.
    let batch: &[&[(&str, &str)]] = &[&[("batch", "job")]];
    let got = [
        ask(&f, request("shop", batch, 1)).await,
        ask(&f, request("shop", batch, 1)).await,
        ask(&f, request("shop", batch, 1)).await,
        ask(&f, request("shop", batch, 1)).await,
    ];
    assert_eq!(
        got,
        [
            (OK, vec![(OK, 1)]),
            (OK, vec![(OK, 0)]),
            (OK, vec![(OK, 0)]),
            (OK, vec![(OK, 0)])
        ]
    );
    // A shadow limit beside an enforced one does not deny the request.
    let mixed: &[&[(&str, &str)]] = &[&[("batch", "job")], &[("route", "checkout")]];
    assert_eq!(
        ask(&f, request("shop", mixed, 1)).await,
        (OK, vec![(OK, 0), (OK, 2)])
    );
    let m = f.rls.metrics();
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_rate_limit_shadow_mode{domain="shop",key1="batch"}"#
        ),
        3
    );
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_rate_limit_over_limit{domain="shop",key1="batch"}"#
        ),
        3
    );
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_rate_limit_total_hits{domain="shop",key1="batch"}"#
        ),
        5
    );
    // replaces: plan_override (4) replaces basic (1) when both match.
    let both: &[&[(&str, &str)]] = &[&[("plan", "basic")], &[("plan_override", "t")]];
    let want = [(OK, vec![(OK, 0), (OK, 3)]), (OK, vec![(OK, 0), (OK, 2)])];
    for w in want {
        assert_eq!(ask(&f, request("shop", both, 1)).await, w);
    }
    // Alone, basic applies: 1 a minute.
    let basic: &[&[(&str, &str)]] = &[&[("plan", "basic")]];
    assert_eq!(
        ask(&f, request("shop", basic, 1)).await,
        (OK, vec![(OK, 0)])
    );
    assert_eq!(
        ask(&f, request("shop", basic, 1)).await,
        (OVER, vec![(OVER, 0)])
    );
    // requests_per_unit 0 denies without taking from the others.
    let closed: &[&[(&str, &str)]] = &[&[("closed", "x")], &[("user", "zed")]];
    assert_eq!(
        ask(&f, request("shop", closed, 1)).await,
        (OVER, vec![(OVER, 0), (OK, 5)])
    );
    // Bad requests: gRPC errors, counted.
    let mut client = f.rls.client().await;
    let empty = client
        .should_rate_limit(request("", &[&[("user", "x")]], 1))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    let none = client
        .should_rate_limit(request("shop", &[], 1))
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        f.rls
            .metric(r#"ratelimit_service_should_rate_limit_error{err_type="service_error"}"#),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_algorithm_with_its_parameters() {
    let f = fixture(&[]);
    // key, then the (code, remaining) of consecutive single requests
    let rows: &[(&str, &[(i32, u32)])] = &[
        // token bucket of 3, 1 a second back: 3 at once.
        ("tb", &[(OK, 2), (OK, 1), (OK, 0), (OVER, 0)]),
        // GCRA: burst 2 of 10 an hour.
        ("gcra", &[(OK, 1), (OK, 0), (OVER, 0)]),
        ("sw", &[(OK, 3), (OK, 2), (OK, 1), (OK, 0), (OVER, 0)]),
        ("sl", &[(OK, 1), (OK, 0), (OVER, 0)]),
    ];
    for (key, want) in rows {
        for (i, (code, remaining)) in want.iter().enumerate() {
            let got = ask(&f, request("shop", &[&[(key, "k")]], 1)).await;
            assert_eq!(got, (*code, vec![(*code, *remaining)]), "{key} request {i}");
        }
    }
    // A sliding log beside another limit: the other is not taken when the log denies.
    let pair: &[&[(&str, &str)]] = &[&[("sl", "k")], &[("user", "sl")]];
    assert_eq!(
        ask(&f, request("shop", pair, 1)).await,
        (OVER, vec![(OVER, 0), (OK, 5)])
    );
    // The kinds keep apart keys on the server.
    let keys = f.redis.cli(&["--scan", "--pattern", "rls:*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "rls:{shop}:gcra:gcra_k",
            "rls:{shop}:sl:sl_k",
            "rls:{shop}:sw:sw_k",
            "rls:{shop}:tb:tb_k"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_under_each_setting() {
    let user: &[&[(&str, &str)]] = &[&[("user", "down")]];
    // (RLS_FAILURE_POLICY, then the answer with Redis down: Ok(code) or Err(gRPC code))
    let rows: &[(&str, Result<i32, tonic::Code>)] = &[
        ("error", Err(tonic::Code::Unavailable)),
        ("open", Ok(OK)),
        ("closed", Ok(OVER)),
    ];
    for (policy, want) in rows {
        let mut f = fixture(&[("RLS_FAILURE_POLICY", policy)]);
        assert_eq!(
            ask(&f, request("shop", user, 1)).await,
            (OK, vec![(OK, 4)]),
            "{policy}"
        );
        f.redis.stop();
        let got = f
            .rls
            .client()
            .await
            .should_rate_limit(request("shop", user, 1))
            .await
            .map(|r| r.into_inner().overall_code)
            .map_err(|s| s.code());
        assert_eq!(&got, want, "{policy}");
        if policy == &"error" {
            assert_eq!(
                f.rls
                    .metric(r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#),
                1
            );
        }
        // Back: decided by Redis again (the breaker lets a call through after its cool-down).
        f.redis.restart();
        eventually("Redis answering again", || {
            let rt = tokio::runtime::Handle::current();
            let r = tokio::task::block_in_place(|| {
                rt.block_on(async {
                    f.rls
                        .client()
                        .await
                        .should_rate_limit(request("shop", user, 1))
                        .await
                })
            });
            matches!(r, Ok(r) if codes(r.get_ref()) == (OK, vec![(OK, 4)]))
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_live_configuration() {
    let f = fixture(&[]);
    // grpc.health.v1: serving, overall and for the service.
    let channel =
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", f.rls.grpc_port))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    assert_eq!(
        http_get(f.rls.http_port, "/healthcheck"),
        (200, "OK\n".to_string())
    );

    let user: &[&[(&str, &str)]] = &[&[("user", "ann")]];
    for _ in 0..6 {
        ask(&f, request("shop", user, 1)).await;
    }
    let m = f.rls.metrics();
    // 5 a minute, near limit from 4 (0.8 of 5): the 5th is near, the 6th over.
    let rows = [
        ("total_hits", 6),
        ("within_limit", 5),
        ("near_limit", 1),
        ("over_limit", 1),
        ("shadow_mode", 0),
    ];
    for (name, want) in rows {
        let series =
            format!("ratelimit_service_rate_limit_{name}{{domain=\"shop\",key1=\"user\"}}");
        assert_eq!(metric(&m, &series), want, "{series}\n{m}");
    }
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#
        ),
        6
    );
    assert_eq!(
        metric(
            &m,
            r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#
        ),
        6
    );
    assert_eq!(metric(&m, "ratelimit_service_config_load_success"), 1);
    assert_eq!(metric(&m, "ratelimit_service_config_load_error"), 0);

    // A change applies once loaded: user becomes 2 a minute (a new counter for bob).
    f.dir.write(
        "shop.yaml",
        &SHOP.replace("requests_per_unit: 5}", "requests_per_unit: 2}"),
    );
    eventually("the reload", || {
        f.rls.metric("ratelimit_service_config_load_success") == 2
    });
    let bob: &[&[(&str, &str)]] = &[&[("user", "bob")]];
    assert_eq!(ask(&f, request("shop", bob, 1)).await, (OK, vec![(OK, 1)]));
    // A malformed change: refused, the configuration in force stays, and it says so.
    f.dir.write("shop.yaml", "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n");
    eventually("the refusal", || {
        f.rls.metric("ratelimit_service_config_load_error") == 1
    });
    assert_eq!(ask(&f, request("shop", bob, 1)).await, (OK, vec![(OK, 0)]));
    assert_eq!(
        ask(&f, request("shop", bob, 1)).await,
        (OVER, vec![(OVER, 0)])
    );
    let (status, body) = http_get(f.rls.http_port, "/healthcheck");
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "OK\nconfiguration reload failed, the previous one is in force: shop.yaml: invalid rate limit unit 'fortnight' (at 'shop.user')\n"
    );
    assert!(
        f.rls.log().contains("error loading new configuration, keeping the one in force: shop.yaml: invalid rate limit unit 'fortnight' (at 'shop.user')"),
        "{}",
        f.rls.log()
    );
    // Fixed again: loaded, and the health answer is plain again.
    f.dir.write("shop.yaml", SHOP);
    eventually("the second reload", || {
        f.rls.metric("ratelimit_service_config_load_success") == 3
    });
    assert_eq!(
        http_get(f.rls.http_port, "/healthcheck"),
        (200, "OK\n".to_string())
    );
}

#[test]
fn check_flag_and_bad_environment() {
    let good = ConfigDir::new(&[("shop.yaml", SHOP)]);
    let bad = ConfigDir::new(&[("a.yaml", "domain: a\n"), ("b.yaml", "domain: a\n")]);
    let run = |dir: &ConfigDir, extra: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(rls_binary());
        cmd.env_clear()
            .env("RUNTIME_ROOT", dir.root.path().join("current"))
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .arg("--check");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    };
    let (code, out, _) = run(&good, &[]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        format!("{}: 1 domain(s), valid", good.config_dir().display())
    );
    assert_eq!(
        run(&bad, &[]),
        (
            Some(1),
            String::new(),
            "b.yaml: duplicate domain 'a' in config file".to_string()
        )
    );
    // The environment is checked first.
    let rows = [
        (
            "REDIS_TYPE",
            "MEMCACHE",
            "ratelimit-rls: REDIS_TYPE=MEMCACHE: expected SINGLE, SENTINEL or CLUSTER",
        ),
        (
            "REDIS_TYPE",
            "SENTINEL",
            "ratelimit-rls: REDIS_URL=/var/run/nutcracker/ratelimit.sock: expected the master's name and a list of sentinels, as <master name>,<sentinel1>,...,<sentineln>",
        ),
        (
            "GRPC_PORT",
            "http",
            "ratelimit-rls: GRPC_PORT=http: expected a port number",
        ),
        (
            "RLS_FAILURE_POLICY",
            "maybe",
            "ratelimit-rls: RLS_FAILURE_POLICY=maybe: expected error, open, closed or local:N (N instances, at least 1)",
        ),
    ];
    for (k, v, want) in rows {
        assert_eq!(
            run(&good, &[(k, v)]),
            (Some(2), String::new(), want.to_string()),
            "{k}={v}"
        );
    }
}

/// `REDIS_TYPE=CLUSTER` on a one-node cluster (every slot on one master) and
/// `REDIS_TYPE=SENTINEL` with a Sentinel watching a master: the same all-or-none decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_sentinel() {
    let both: &[&[(&str, &str)]] = &[&[("route", "checkout")], &[("user", "ann")]];
    let want = [
        (OK, vec![(OK, 2), (OK, 4)]),
        (OK, vec![(OK, 1), (OK, 3)]),
        (OK, vec![(OK, 0), (OK, 2)]),
        (OVER, vec![(OVER, 0), (OK, 2)]),
    ];
    let dir = ConfigDir::new(&[("shop.yaml", SHOP)]);

    let node = Redis::start_with(true, &["--cluster-enabled", "yes"]);
    assert_eq!(node.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]), "OK");
    eventually("the cluster up", || {
        node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
    });
    let mut env = env_for(&dir, node.port);
    env.push(("REDIS_TYPE".into(), "CLUSTER".into()));
    let rls = Rls::start(&env);
    let mut client = rls.client().await;
    for (i, w) in want.iter().enumerate() {
        let r = client
            .should_rate_limit(request("shop", both, 1))
            .await
            .unwrap();
        assert_eq!(&codes(r.get_ref()), w, "cluster request {i}");
    }
    assert_eq!(node.cli(&["EXISTS", "rls:{shop}:fw:user_ann"]), "1");
    drop(rls);

    let master = Redis::start(true);
    let sentinel = Redis::sentinel(master.port);
    eventually("the sentinel naming the master", || {
        sentinel
            .cli(&["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .ends_with(&master.port.to_string())
    });
    let mut env = env_for(&dir, master.port);
    env.push(("REDIS_TYPE".into(), "SENTINEL".into()));
    env.retain(|(k, _)| k != "REDIS_URL");
    env.push((
        "REDIS_URL".into(),
        format!("mymaster,127.0.0.1:{}", sentinel.port),
    ));
    let rls = Rls::start(&env);
    let mut client = rls.client().await;
    for (i, w) in want.iter().enumerate() {
        let r = client
            .should_rate_limit(request("shop", both, 1))
            .await
            .unwrap();
        assert_eq!(&codes(r.get_ref()), w, "sentinel request {i}");
    }
    assert_eq!(master.cli(&["EXISTS", "rls:{shop}:fw:user_ann"]), "1");
}

/// Without the module the client decides with the Lua twins (`all.lua` for several limits):
/// the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_module_the_twins_decide_alike() {
    let redis = Redis::start(false);
    let dir = ConfigDir::new(&[("shop.yaml", SHOP)]);
    let rls = Rls::start(&env_for(&dir, redis.port));
    let mut client = rls.client().await;
    let both: &[&[(&str, &str)]] = &[&[("route", "checkout")], &[("user", "ann")]];
    let want = [
        (OK, vec![(OK, 2), (OK, 4)]),
        (OK, vec![(OK, 1), (OK, 3)]),
        (OK, vec![(OK, 0), (OK, 2)]),
        (OVER, vec![(OVER, 0), (OK, 2)]),
    ];
    for (i, w) in want.iter().enumerate() {
        let r = client
            .should_rate_limit(request("shop", both, 1))
            .await
            .unwrap();
        assert_eq!(&codes(r.get_ref()), w, "request {i}");
    }
    // No module of ours on this server (Redis 8.2 lists modules of its own).
    let modules = redis.cli(&["MODULE", "LIST"]);
    assert!(!modules.lines().any(|l| l == "ratelimit"), "{modules}");
}

/// `RUNTIME_WATCH_ROOT=true` (the default): the root is a link, and pointing it at another
/// directory (as a deployment swaps a ConfigMap) loads that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_link_swapped_reloads() {
    let redis = Redis::start(true);
    let base = tempfile::tempdir().unwrap();
    for (name, rpu) in [("v1", 1), ("v2", 3)] {
        let dir = base.path().join(name).join("config");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("d.yaml"),
            format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"),
        )
        .unwrap();
    }
    let link = base.path().join("current");
    std::os::unix::fs::symlink(base.path().join("v1"), &link).unwrap();
    let env: Vec<(String, String)> = [
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("RUNTIME_ROOT", link.display().to_string()),
        ("USE_PROMETHEUS", "true".to_string()),
        ("RLS_RELOAD_INTERVAL_MS", "50".to_string()),
        ("RLS_REDIS_TIMEOUT_MS", "2000".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let rls = Rls::start(&env);
    let mut client = rls.client().await;
    let r = client
        .should_rate_limit(request("d", &[&[("k", "a")]], 1))
        .await
        .unwrap();
    assert_eq!(codes(r.get_ref()), (OK, vec![(OK, 0)]));
    let tmp = base.path().join("next");
    std::os::unix::fs::symlink(base.path().join("v2"), &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    eventually("the reload", || {
        rls.metric("ratelimit_service_config_load_success") == 2
    });
    let r = client
        .should_rate_limit(request("d", &[&[("k", "b")]], 1))
        .await
        .unwrap();
    assert_eq!(codes(r.get_ref()), (OK, vec![(OK, 2)]));
}
