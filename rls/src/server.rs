//! The listeners: gRPC (`ShouldRateLimit` and `grpc.health.v1.Health`) on `GRPC_HOST:GRPC_PORT`,
//! `/healthcheck` on `HOST:PORT`, and the metrics on `PROMETHEUS_ADDR` with `USE_PROMETHEUS`.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use ratelimit_client::{Client, FailurePolicy, Options};
use redis::aio::ConnectionLike;

use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::service::{Service, State};
use crate::settings::{OnRedisFailure, RedisType, Settings};
use crate::watch::{Watcher, load, signature};

fn options(settings: &Settings) -> Options {
    Options {
        timeout: settings.redis_timeout,
        policy: match settings.on_failure {
            // `Error`: the answer is not used; the call fails instead.
            OnRedisFailure::Error | OnRedisFailure::Open => FailurePolicy::FailOpen,
            OnRedisFailure::Closed => FailurePolicy::FailClosed,
            OnRedisFailure::Local(instances) => FailurePolicy::Local { instances },
        },
        ..Options::default()
    }
}

/// Runs the service until SIGTERM or SIGINT.
pub async fn run(settings: Settings) -> Result<(), String> {
    let opts = options(&settings);
    match settings.redis.clone() {
        RedisType::Single(url) => {
            let client = Client::open(&url, opts)
                .await
                .map_err(|e| format!("REDIS_URL: {e}"))?;
            serve(settings, client).await
        }
        RedisType::Sentinel { master, sentinels } => {
            let urls: Vec<&str> = sentinels.iter().map(String::as_str).collect();
            let client =
                Client::sentinel(&urls, &master, opts).map_err(|e| format!("REDIS_URL: {e}"))?;
            serve(settings, client).await
        }
        RedisType::Cluster(nodes) => {
            let urls: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let client = Client::cluster(&urls, opts)
                .await
                .map_err(|e| format!("REDIS_URL: {e}"))?;
            serve(settings, client).await
        }
    }
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

async fn serve<C>(settings: Settings, client: Client<C>) -> Result<(), String>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let seen = signature(
        &settings.runtime_root,
        &settings.config_dir,
        settings.watch_root,
    );
    let config = load(&settings.config_dir, settings.ignore_dot_files).map_err(|e| e.0)?;
    for w in &config.warnings {
        eprintln!("warning: {w}");
    }
    eprintln!(
        "configuration loaded: {} domain(s) from {}",
        config.domains(),
        settings.config_dir.display()
    );
    let state = Arc::new(State::new(config));
    let metrics = Arc::new(Metrics::default());
    metrics.config_loaded(true);
    let client_metrics = Arc::new(ratelimit_client::metrics::Metrics::default());
    let limiter = Arc::new(Limiter::new(client));
    let service = Service {
        state: state.clone(),
        limiter: limiter.clone(),
        metrics: metrics.clone(),
        client_metrics: client_metrics.clone(),
        key_prefix: settings.key_prefix.clone(),
        near_limit_ratio: settings.near_limit_ratio,
        global_shadow_mode: settings.global_shadow_mode,
        on_failure: settings.on_failure,
    };

    let watcher = Watcher {
        root: settings.runtime_root.clone(),
        dir: settings.config_dir.clone(),
        ignore_dot_files: settings.ignore_dot_files,
        watch_root: settings.watch_root,
        interval: settings.reload_interval,
    };
    tokio::spawn(watcher.run(state.clone(), metrics.clone(), seen));

    let http = tokio::net::TcpListener::bind(&settings.http_addr)
        .await
        .map_err(|e| format!("HOST:PORT {}: {e}", settings.http_addr))?;
    let health_state = state.clone();
    let app = Router::new().route(
        "/healthcheck",
        get(move || {
            let state = health_state.clone();
            async move {
                match state.last_error() {
                    None => (StatusCode::OK, "OK\n".to_string()),
                    Some(e) => (
                        StatusCode::OK,
                        format!(
                            "OK\nconfiguration reload failed, the previous one is in force: {e}\n"
                        ),
                    ),
                }
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(http, app)
            .with_graceful_shutdown(shutdown())
            .await;
    });

    if let Some((addr, path)) = &settings.prometheus {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("PROMETHEUS_ADDR {addr}: {e}"))?;
        let (m, cm, l) = (metrics.clone(), client_metrics.clone(), limiter.clone());
        let app = Router::new().route(
            path,
            get(move || {
                let (m, cm, l) = (m.clone(), cm.clone(), l.clone());
                async move {
                    let mut body = m.render();
                    body.push_str("# TYPE ratelimit_rls_client_calls_total counter\n");
                    body.push_str(&format!("ratelimit_rls_client_calls_total {}\n", l.calls()));
                    body.push_str(&cm.render_prometheus());
                    body
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown())
                .await;
        });
    }

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<Service<C>>>()
        .await;
    let grpc_addr: std::net::SocketAddr = tokio::net::lookup_host(&settings.grpc_addr)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("GRPC_HOST:GRPC_PORT {}: not an address", settings.grpc_addr))?;
    let listener = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .map_err(|e| format!("GRPC_HOST:GRPC_PORT {}: {e}", settings.grpc_addr))?;
    eprintln!(
        "serving gRPC on {}, /healthcheck on {}",
        settings.grpc_addr, settings.http_addr
    );
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown(),
        )
        .await
        .map_err(|e| format!("gRPC server: {e}"))
}
