//! `ratelimit-counter`: tenant-ratelimit's own rate-limit service. Serves
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` from the
//! team files themselves, counting in memory or in Redis.

mod health;
mod limits;
mod metrics;
mod service;
mod teams;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ratelimit_counter::{bounds, decide, fleet, proto, store};

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
    /// The longest tenant (descriptor value of --descriptor-key) read, in
    /// bytes: the filter's max_tenant_length. A call with a longer one is
    /// refused (INVALID_ARGUMENT).
    #[arg(long, env = "TRL_COUNTER_MAX_TENANT_LENGTH", default_value_t = bounds::DEFAULT_MAX_TENANT_LENGTH)]
    max_tenant_length: usize,
    /// After SIGTERM, how long the calls under way may take; then every
    /// connection still open (gRPC, HTTP, TLS) is closed and the process
    /// exits. Keep it inside the pod's termination grace period.
    #[arg(long, env = "TRL_COUNTER_DRAIN_TIMEOUT_MS", default_value_t = 10_000)]
    drain_timeout_ms: u64,
    /// The most gRPC connections open at once; more wait in the backlog.
    #[arg(long, env = "TRL_COUNTER_GRPC_MAX_CONNECTIONS", default_value_t = 256)]
    grpc_max_connections: usize,
    /// The most HTTP connections (/metrics, /healthz, /readyz) open at once.
    #[arg(long, env = "TRL_COUNTER_HTTP_MAX_CONNECTIONS", default_value_t = 64)]
    http_max_connections: usize,
    /// The most concurrent HTTP/2 streams (calls) per connection, both ports;
    /// a client's streams beyond it are refused.
    #[arg(long, env = "TRL_COUNTER_MAX_STREAMS", default_value_t = 128)]
    max_streams: u32,
    /// A new connection's first bytes (and on HTTP/1 each request's
    /// headers) must arrive within this; else it is closed.
    #[arg(long, env = "TRL_COUNTER_HEADER_TIMEOUT_MS", default_value_t = 5_000)]
    header_timeout_ms: u64,
    /// A whole gRPC call (its message read, decided, answered) within this,
    /// else DEADLINE_EXCEEDED / CANCELLED and its bytes released.
    #[arg(long, env = "TRL_COUNTER_CALL_TIMEOUT_MS", default_value_t = 5_000)]
    call_timeout_ms: u64,
    /// The most bytes of unfinished gRPC messages one connection holds;
    /// a call past it is refused (RESOURCE_EXHAUSTED).
    #[arg(long, env = "TRL_COUNTER_MAX_CONNECTION_BYTES", default_value_t = 8 << 20)]
    max_connection_bytes: usize,
    /// The most bytes of unfinished gRPC messages all connections hold.
    #[arg(long, env = "TRL_COUNTER_MAX_TOTAL_BYTES", default_value_t = 64 << 20)]
    max_total_bytes: usize,
    /// The region this counter serves (with --regions): the global groups'
    /// checks (`"regions": "global"`) are decided against the region's
    /// allocation, held in this counter's Redis and moved by
    /// `ratelimit-counter rebalance`. Without it, a global group counts to
    /// its whole limit, as any other.
    #[arg(long, env = "TRL_COUNTER_REGION", requires = "regions")]
    region: Option<String>,
    /// The number of regions a global limit is shared by (with --region;
    /// the rebalancer's --region flags): before the rebalancer wrote a
    /// tenant's allocation, each region holds the limit / this, rounded
    /// down.
    #[arg(long, env = "TRL_COUNTER_REGIONS", requires = "region", value_parser = clap::value_parser!(u64).range(1..))]
    regions: Option<u64>,
    /// The fleet's size, answered to the filter (its local fallback gives
    /// each Envoy 1/N of every limit): the Envoys that called for the
    /// domain within this many milliseconds. With a Redis store, every
    /// replica's callers.
    #[arg(long, env = "TRL_COUNTER_FLEET_INTERVAL_MS", default_value_t = fleet::DEFAULT_INTERVAL_MS)]
    fleet_interval_ms: u64,
}

/// `ratelimit-counter rebalance`: moves global limits' allocations
/// between regions, toward each region's share of the demand.
#[derive(Parser, Debug)]
#[command(
    name = "ratelimit-counter rebalance",
    bin_name = "ratelimit-counter rebalance"
)]
struct RebalanceArgs {
    /// A region and its Redis: NAME=redis://HOST:PORT (one per region;
    /// each region's counters run with --region NAME and --regions, the
    /// number of these flags).
    #[arg(long = "region", required = true)]
    regions: Vec<String>,
    /// How often the allocations are moved.
    #[arg(long, default_value_t = 2_000)]
    period_ms: u64,
    /// The demand's time constant: each region's demand is its hits
    /// (admitted and refused) per second, averaged exponentially over
    /// about this long.
    #[arg(long, default_value_t = 60_000)]
    demand_ms: u64,
    /// A tenant's limit no counter used for this long is no longer
    /// rebalanced (its allocations stay).
    #[arg(long, default_value_t = 600_000)]
    idle_ms: u64,
    /// Each Redis call's deadline; a region that does not answer within it
    /// is unreachable for the period (it keeps its allocations).
    #[arg(long, default_value_t = 500)]
    store_timeout_ms: u64,
    /// How far the counters' clocks may be from the rebalancer's: within
    /// this of a window's turn, a lowering keeps both windows' counts.
    #[arg(long, default_value_t = 1_000)]
    clock_margin_ms: u64,
    /// HTTP listen address: /metrics, /healthz.
    #[arg(long, default_value = "127.0.0.1:8090")]
    http_addr: SocketAddr,
    /// The team files (as the counter's --limits): the metrics name each
    /// tenant's group. Without it, the group label is empty.
    #[arg(long)]
    limits: Option<PathBuf>,
    /// The domain of a single team file.
    #[arg(long)]
    domain: Option<String>,
    /// The descriptor key that carries the tenant.
    #[arg(long, default_value = "tenant")]
    descriptor_key: String,
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
    if std::env::args_os().nth(1).is_some_and(|a| a == "rebalance") {
        let args = RebalanceArgs::parse_from(std::env::args_os().skip(1));
        return match rebalance(args).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ratelimit-counter rebalance: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
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
    match limits::raise_open_files() {
        Some((soft, hard)) if soft < 1_024 => eprintln!(
            "ratelimit-counter: open files limited to {soft} (hard limit {hard}): connections may be refused"
        ),
        _ => {}
    }
    let limits = limits::Limits {
        grpc_max_connections: args.grpc_max_connections,
        http_max_connections: args.http_max_connections,
        max_streams: args.max_streams.max(1),
        header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        call_timeout: Duration::from_millis(args.call_timeout_ms.max(1)),
        connection_bytes: args.max_connection_bytes,
        total_bytes: args.max_total_bytes,
    };
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
    if let (Some(region), Some(regions)) = (&args.region, args.regions) {
        // The allocation and the count in one script: one Redis.
        if !matches!(store.name(), "redis" | "redis-sentinel") {
            return Err(format!(
                "--region {region}: a region's counter counts in one Redis (redis:// or redis-sentinel://), not the {} store",
                store.name()
            ));
        }
        ratelimit_counter::regions::serve_regions(regions);
        eprintln!("ratelimit-counter: region {region}, one of {regions}: global groups admit against its allocation");
    }
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
        bounds: bounds::Bounds {
            descriptor_key: args.descriptor_key.clone(),
            max_tenant_length: args.max_tenant_length,
        },
        fleet: fleet::Fleet::new(args.fleet_interval_ms.max(1)),
    });
    // What this replica heard of the fleet, pooled in the store.
    let fleet_sync = {
        let state = state.clone();
        tokio::spawn(async move { state.sync_fleet().await })
    };
    // The store's health: calls fail at once while its connection is
    // known down, and it is retried in the background.
    let store_watch = {
        let (store, metrics) = (store.clone(), metrics.clone());
        tokio::spawn(async move {
            store
                .watch(Duration::from_millis(100), |down| {
                    metrics
                        .limits
                        .store_down
                        .store(u64::from(down), std::sync::atomic::Ordering::Relaxed);
                })
                .await;
        })
    };

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
    let header_timeout = limits.header_timeout;
    let http_incoming = Box::pin(limits::accept(
        http_listener,
        limits.http_max_connections,
        &limits,
        move |tcp, _| limits::first_byte(tcp, header_timeout),
    ));
    let http = tokio::spawn(limits::serve_http(
        http_incoming,
        service::http_app(state.clone()),
        limits.clone(),
        stopped(stop_rx.clone()),
    ));
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_streams)
        .initial_stream_window_size(limits::STREAM_WINDOW)
        .initial_connection_window_size(limits::CONNECTION_WINDOW)
        .timeout(limits.call_timeout)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(limits.header_timeout))
        .add_service(health_service)
        .add_service(service::rate_limit_server(state.clone()));
    let grpc = match &tls {
        Some(tls) => tokio::spawn(router.serve_with_incoming_shutdown(
            tls::incoming(grpc_listener, tls.clone(), &limits),
            stopped(stop_rx.clone()),
        )),
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            limits::accept(
                grpc_listener,
                limits.grpc_max_connections,
                &limits,
                move |tcp, _| limits::first_byte(tcp, header_timeout),
            ),
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
    store_watch.abort();
    fleet_sync.abort();
    // The drain's deadline: calls under way finish within it; then the
    // connections still open (a body never finished, an idle HTTP/2 peer
    // that does not read) are closed as the process exits.
    let drain = Duration::from_millis(args.drain_timeout_ms);
    let drained = tokio::time::timeout(drain, async {
        let _ = grpc.await;
        let _ = http.await;
    })
    .await;
    if drained.is_err() {
        eprintln!(
            "ratelimit-counter: drain deadline ({} ms) passed: closing the connections still open",
            args.drain_timeout_ms
        );
    }
    Ok(())
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

/// `ratelimit-counter rebalance`: the rebalancer, and its /metrics.
async fn rebalance(args: RebalanceArgs) -> Result<(), String> {
    use ratelimit_counter::regions::rebalance as rb;
    let mut regions = Vec::new();
    for r in &args.regions {
        let Some((name, url)) = r
            .split_once('=')
            .filter(|(n, u)| !n.is_empty() && !u.is_empty())
        else {
            return Err(format!("--region {r}: expected NAME=redis://HOST:PORT"));
        };
        if regions.iter().any(|g: &rb::Region| g.name == name) {
            return Err(format!("--region {name} given twice"));
        }
        redis::Client::open(url).map_err(|e| format!("--region {name}: {e}"))?;
        regions.push(rb::Region {
            name: name.to_string(),
            url: url.to_string(),
        });
    }
    let teams = match &args.limits {
        Some(path) => {
            let source = teams::Source {
                path: path.clone(),
                domain: args.domain.clone(),
                descriptor_key: args.descriptor_key.clone(),
            };
            let teams = Arc::new(teams::Teams::default());
            teams.load_at_start(&source, &metrics::Metrics::default())?;
            Some(teams)
        }
        None => None,
    };
    let metrics = Arc::new(rb::Metrics::default());
    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .map_err(|e| format!("HTTP address {}: {e}", args.http_addr))?;
    let app = {
        let metrics = metrics.clone();
        axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let m = metrics.clone();
                    async move { m.render() }
                }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
    };
    eprintln!(
        "ratelimit-counter rebalance: {} regions ({}), every {} ms; HTTP on {}",
        regions.len(),
        regions
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.period_ms,
        listener.local_addr().map_or(args.http_addr, |a| a)
    );
    let http = tokio::spawn(async move { axum::serve(listener, app).await });
    let clock_file = std::env::var_os("TRL_COUNTER_TEST_CLOCK_FILE").map(PathBuf::from);
    let opts = rb::Options {
        regions,
        period: Duration::from_millis(args.period_ms.max(10)),
        demand_ms: args.demand_ms,
        idle_ms: args.idle_ms,
        timeout: Duration::from_millis(args.store_timeout_ms.max(1)),
        clock_margin_ms: args.clock_margin_ms,
    };
    let group_of = move |domain: &str, tenant: &str| {
        let served = teams.as_ref()?.get(domain)?;
        let (_, g) = served.domain.limits.group_index_for(tenant)?;
        Some(g.name.clone())
    };
    tokio::select! {
        () = rb::run(opts, metrics, move || now_ms(clock_file.as_deref()), group_of) => {}
        () = shutdown_signal() => {}
    }
    http.abort();
    Ok(())
}
