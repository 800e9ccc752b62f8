//! `ratelimit-counter`: tenant-ratelimit's own rate-limit service. Serves
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` from the
//! team files themselves, counting in memory or in Redis.

mod health;
mod metrics;
mod service;
mod teams;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ratelimit_counter::{decide, proto, store};

/// tenant-ratelimit's rate-limit service: envoy.service.ratelimit.v3 over
/// gRPC, from the team files, with fixed, sliding and calendar windows.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A team file (its domain: --domain, else the file's name without
    /// .json), or a directory of them (each NAME.json serves domain NAME:
    /// a mounted ConfigMap). Re-read when it changes; a bad file keeps the
    /// last good one. At start, a path that is missing or unreadable, an
    /// empty directory, or no file that parses: the counter exits, saying why.
    #[arg(long, env = "TRL_COUNTER_LIMITS")]
    limits: PathBuf,
    /// The domain of a single team file.
    #[arg(long)]
    domain: Option<String>,
    /// The descriptor key that carries the tenant (the filter's and
    /// generate's descriptor_key).
    #[arg(long, default_value = "tenant")]
    descriptor_key: String,
    #[command(flatten)]
    store: store::StoreOptions,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// HTTP listen address: /metrics, /healthz, /readyz.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Every Redis call fails after this long.
    #[arg(long, default_value_t = 100)]
    store_timeout_ms: u64,
    /// gRPC over TLS: the server's certificate chain (PEM), with
    /// --tls-key. Re-read when it changes (a rotation needs no restart).
    /// Without it, gRPC is plaintext (keep it on loopback).
    #[arg(long, env = "TRL_COUNTER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "TRL_COUNTER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: the CA (PEM) that signs the clients' certificates; a
    /// client without a certificate it signed is refused.
    #[arg(long, env = "TRL_COUNTER_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// With --tls-client-ca: a client name allowed (a DNS name or an IP
    /// address among the SANs of its certificate); repeat the flag for more
    /// (in the environment: comma-separated). Without it, any certificate
    /// the CA signed.
    #[arg(
        long,
        env = "TRL_COUNTER_TLS_CLIENT_SAN",
        value_delimiter = ',',
        requires = "tls_client_ca"
    )]
    tls_client_san: Vec<String>,
    /// How often the team files (and the TLS files) are checked for changes.
    #[arg(long, default_value_t = 1_000)]
    reload_interval_ms: u64,
}

/// The time, Unix milliseconds. Tests move it with TRL_COUNTER_TEST_CLOCK_FILE,
/// a file holding an offset in milliseconds (read on every call).
pub fn now_ms(clock_file: Option<&std::path::Path>) -> u64 {
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let offset = clock_file
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(0);
    real.saturating_add_signed(offset)
}

/// mimalloc, not glibc's malloc: a call allocates its decoded message,
/// keys and answer, and glibc's allocator was about a seventh of the
/// counter's CPU under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratelimit-counter: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let metrics = Arc::new(metrics::Metrics::default());
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(tls::Tls::load(
            tls::Files {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
                client_sans: args.tls_client_san.clone(),
            },
            metrics.clone(),
        )?)),
        _ => None,
    };

    let source = teams::Source {
        path: args.limits.clone(),
        domain: args.domain.clone(),
        descriptor_key: args.descriptor_key.clone(),
    };
    let teams = Arc::new(teams::Teams::default());
    teams.load_at_start(&source, &metrics)?;
    let deadline = Duration::from_millis(args.store_timeout_ms.max(1));
    let store = Arc::new(store::connect(&args.store, deadline).await?);
    if let Err(e) = store.ping().await {
        // Not fatal: the counter runs, not ready, each call failing with
        // this reason, until the store answers.
        eprintln!(
            "ratelimit-counter: store {}: {e}; not ready until it answers",
            args.store.shown()
        );
    }
    let clock_file = std::env::var_os("TRL_COUNTER_TEST_CLOCK_FILE").map(PathBuf::from);
    let state = Arc::new(service::State {
        teams: teams.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        clock_file,
    });

    // Reload the team files, and sweep the memory store.
    let reloader = {
        let (teams, metrics, store, state, tls) = (
            teams.clone(),
            metrics.clone(),
            store.clone(),
            state.clone(),
            tls.clone(),
        );
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(args.reload_interval_ms.max(10)));
            loop {
                tick.tick().await;
                teams.reload(&source, &metrics);
                store.sweep(state.now());
                if let Some(tls) = &tls {
                    tls.reload();
                }
            }
        })
    };

    let (mut health, health_service) = health::server(state.clone()).await;
    // The health's watchers follow readiness (a `Check` reads it live).
    let health_sync = tokio::spawn(health::follow_readiness(
        health.clone(),
        state.clone(),
        Duration::from_millis(args.reload_interval_ms.max(10)),
    ));

    let grpc_listener = tokio::net::TcpListener::bind(args.grpc_addr)
        .await
        .map_err(|e| format!("gRPC address {}: {e}", args.grpc_addr))?;
    let http_listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .map_err(|e| format!("HTTP address {}: {e}", args.http_addr))?;
    eprintln!(
        "ratelimit-counter: gRPC{} on {}, HTTP on {}, store {}",
        match (&tls, &args.tls_client_ca) {
            (None, _) => "",
            (Some(_), None) => " (TLS)",
            (Some(_), Some(_)) => " (mutual TLS)",
        },
        grpc_listener.local_addr().map_or(args.grpc_addr, |a| a),
        http_listener.local_addr().map_or(args.http_addr, |a| a),
        store.name()
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let http = tokio::spawn(service::serve_http(
        http_listener,
        state.clone(),
        stopped(stop_rx.clone()),
    ));
    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(service::rate_limit_server(state.clone()));
    let grpc = match &tls {
        Some(tls) => tokio::spawn(router.serve_with_incoming_shutdown(
            tls::incoming(grpc_listener, tls.clone()),
            stopped(stop_rx.clone()),
        )),
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            tokio_stream_listener(grpc_listener),
            stopped(stop_rx.clone()),
        )),
    };

    shutdown_signal().await;
    eprintln!("ratelimit-counter: stopping; finishing the calls under way");
    health_sync.abort();
    let _ = health_sync.await;
    health::stopping(&mut health).await;
    let _ = stop_tx.send(true);
    reloader.abort();
    let _ = grpc.await;
    let _ = http.await;
    Ok(())
}

fn tokio_stream_listener(l: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true))
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
