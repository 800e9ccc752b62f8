//! What a checked description holds: the top-level settings and one type
//! per section, the keys each section takes, and the names of its closed
//! sets.

use serde_json::{Map, Value};

use crate::model::Service;

/// What `render` writes for. The command line's `--target` takes these by
/// the names [`Target::name`] gives (clap's kebab-case of each variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    Istio,
    EnvoyGateway,
    Envoy,
}

impl Target {
    /// Every target, in the order `--help` lists them.
    pub fn all() -> &'static [Target] {
        <Target as clap::ValueEnum>::value_variants()
    }

    /// Its name on the command line and in what it writes (`envoy-gateway`).
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

/// What happens to requests when the filter cannot run (its module cannot
/// be fetched, or it refuses its configuration): Istio's `failStrategy`,
/// Envoy Gateway's `failOpen`. `--fail-strategy` and the description's
/// `fail_strategy` take the same names (`open`, `closed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailStrategy {
    /// The filter is left out: requests pass, nothing is limited.
    Open,
    /// Requests are refused (Istio: 403; Envoy Gateway: 500, or 503 for a
    /// refused configuration).
    Closed,
}

impl FailStrategy {
    /// Its name in a description and on the command line.
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The strategy a description names, if it names one.
    pub fn from_name(s: &str) -> Option<FailStrategy> {
        <FailStrategy as clap::ValueEnum>::from_str(s, false).ok()
    }
}

/// A deployment description, checked: its top-level settings, then one
/// section per part of what `render` writes, each read by its own function
/// (a section's sub-section, like `redis.auth_secret`, too).
#[derive(Clone, Debug)]
pub struct Deployment {
    pub domain: String,
    pub namespace: Option<String>,
    /// The OCI image (the compat variant `make oci-push` pushes), without
    /// a scheme.
    pub image: Option<String>,
    /// Its manifest digest, 64 hex characters.
    pub sha256: Option<String>,
    pub fail_strategy: Option<FailStrategy>,
    pub cluster_domain: String,
    /// `service:`
    pub service: RateLimitService,
    /// `redis:`
    pub redis: Redis,
    /// `workload:`
    pub workload: Workload,
    /// `istio:`
    pub istio: Istio,
    /// `envoy_gateway:`
    pub envoy_gateway: EnvoyGateway,
    /// `envoy:`
    pub envoy: Envoy,
    /// Plugin settings over the defaults `generate` writes.
    pub plugin: Map<String, Value>,
    /// `monitoring.prometheus_operator`: the monitors, and the metrics
    /// ports they scrape.
    pub monitoring: Option<Monitoring>,
}

/// `service:`, the rate-limit service `render` deploys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitService {
    /// `service.kind`: which rate-limit service counts (envoyproxy/ratelimit
    /// by default, or ratelimit-counter).
    pub kind: Service,
    /// Its Kubernetes Service (and Deployment) name.
    pub name: String,
    /// Its gRPC port.
    pub port: u32,
    pub image: String,
    /// `service.replicas`: how many replicas of its Deployment (2; 1 for
    /// the counter's memory store, which takes no more).
    pub replicas: u32,
    /// `service.tls`: TLS on the hop from the filter's Envoy to the service.
    pub tls: Option<ServiceTls>,
}

/// Where `render` mounts the Secrets of `service.tls` and `redis.tls`.
pub const SERVICE_TLS_DIR: &str = "/etc/ratelimit-tls/server";
pub const CLIENT_TLS_DIR: &str = "/etc/ratelimit-tls/client";
pub const REDIS_TLS_DIR: &str = "/etc/ratelimit-tls/redis";

/// `service.tls`: the hop from the filter's Envoy to the rate-limit
/// service over TLS, as files on each side: given (a VM) or where the
/// Secrets are mounted (Kubernetes: `server_secret` in the service's pods,
/// `client_secret` in Envoy's, each with `tls.crt`, `tls.key`, `ca.crt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceTls {
    /// The service's certificate chain and key.
    pub cert: String,
    pub key: String,
    /// Mutual TLS: the CA the service checks Envoy's certificate with.
    pub client_ca: Option<String>,
    /// The CA Envoy checks the service's certificate with.
    pub ca: String,
    /// Mutual TLS: Envoy's certificate chain and key.
    pub client_cert: Option<(String, String)>,
    /// The name Envoy sends (SNI) and wants among the service's SANs;
    /// None: the service's address.
    pub sni: Option<String>,
    /// The client names the service accepts (among Envoy's SANs).
    pub client_sans: Vec<String>,
    /// Kubernetes: the Secrets mounted in the service's pods and Envoy's.
    pub server_secret: Option<String>,
    pub client_secret: Option<String>,
}

/// `redis.tls`: the hop from the service to Redis over TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// The CA Redis's certificate is checked with (None: the system's).
    pub ca: Option<String>,
    /// Mutual TLS: the service's certificate chain and key.
    pub client_cert: Option<(String, String)>,
    /// Redis's certificate not checked (the counter: not at all;
    /// envoyproxy/ratelimit: its name only).
    pub insecure_skip_verify: bool,
    /// Kubernetes: the Secret mounted in the service's pods.
    pub secret: Option<String>,
}

/// `redis:`, the Redis the service counts in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redis {
    /// `host:port` of a Redis of your own; None: `render` writes one. For
    /// the counter also `redis://…`, `redis-cluster://…`, or `memory` (one
    /// replica counting in its own memory, no Redis).
    pub url: Option<String>,
    /// `redis.auth_secret`: the Secret holding its password: the service's
    /// `REDIS_AUTH`, and `--requirepass` of the Redis `render` writes.
    pub auth: Option<SecretRef>,
    /// The image of the Redis `render` writes.
    pub image: String,
    /// `redis.tls`
    pub tls: Option<RedisTls>,
}

/// A key of a Kubernetes Secret (`{name, key}` in a description).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    pub name: String,
    pub key: String,
}

/// `workload:`, what the filter runs in front of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub name: Option<String>,
    /// Its pods' labels (default: `app: <name>`).
    pub labels: Vec<(String, String)>,
    /// The application's image (plain Envoy's sidecar Deployment runs it).
    pub image: Option<String>,
}

/// `istio:`, the WasmPlugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Istio {
    pub phase: IstioPhase,
    pub mode: IstioMode,
    /// `istio.name`: the WasmPlugin's `metadata.name` (`tenant-ratelimit`).
    pub name: String,
    /// `istio.priority`: its `priority` (none: Istio's default, 0); of two
    /// WasmPlugins in one phase, the higher runs first.
    pub priority: Option<i32>,
}

/// `istio.phase`: where in Istio's filter chain the WasmPlugin runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IstioPhase {
    Authn,
    Authz,
    Stats,
    UnspecifiedPhase,
}

impl IstioPhase {
    pub const ALL: [IstioPhase; 4] = [
        IstioPhase::Authn,
        IstioPhase::Authz,
        IstioPhase::Stats,
        IstioPhase::UnspecifiedPhase,
    ];

    /// Its name in a description and in the WasmPlugin (`STATS`).
    pub const fn name(self) -> &'static str {
        match self {
            IstioPhase::Authn => "AUTHN",
            IstioPhase::Authz => "AUTHZ",
            IstioPhase::Stats => "STATS",
            IstioPhase::UnspecifiedPhase => "UNSPECIFIED_PHASE",
        }
    }
}

/// `istio.mode`: the traffic the WasmPlugin runs on (Istio's WorkloadMode
/// of its `match[].mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IstioMode {
    /// A sidecar's inbound (the default).
    Server,
    /// An ingress gateway's (Istio counts a gateway's listeners as CLIENT),
    /// or a sidecar's outbound.
    Client,
    /// Both.
    ClientAndServer,
}

impl IstioMode {
    pub const ALL: [IstioMode; 3] = [
        IstioMode::Server,
        IstioMode::Client,
        IstioMode::ClientAndServer,
    ];

    /// Its name in a description and in the WasmPlugin (`SERVER`).
    pub const fn name(self) -> &'static str {
        match self {
            IstioMode::Server => "SERVER",
            IstioMode::Client => "CLIENT",
            IstioMode::ClientAndServer => "CLIENT_AND_SERVER",
        }
    }
}

/// `envoy_gateway:`, where the filter runs under Envoy Gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyGateway {
    /// The HTTPRoute the filter runs on.
    pub route: Option<String>,
    /// The Gateway whose proxies get the rate-limit cluster.
    pub gateway: Option<String>,
    /// Where Envoy Gateway runs those proxies.
    pub proxy_namespace: String,
}

/// `envoy:`, plain Envoy's bootstrap (and its sidecar Deployment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envoy {
    pub listen_port: u32,
    pub admin_port: u32,
    pub app_port: u32,
    pub image: String,
    pub wasm_path: String,
    /// Where Envoy reaches the rate-limit service.
    pub service_address: String,
    /// `envoy.routes`: (route name, path prefix) of the named routes the
    /// complete bootstrap carries before its catch-all route `app`, so
    /// that a team file's per-route limits apply.
    pub routes: Vec<(String, String)>,
}

/// What `render` adds for the Prometheus Operator (`monitoring:`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Monitoring {
    /// Where Prometheus runs: the NetworkPolicies admit it to the metrics ports.
    pub prometheus_namespace: String,
    /// Plain Envoy: the port of the listener that serves `/stats/prometheus`
    /// (admin stays on 127.0.0.1).
    pub envoy_metrics_port: u32,
}

/// The keys of a description, with what each takes.
pub const KEYS: &[&str] = &[
    "domain",
    "namespace",
    "image",
    "sha256",
    "fail_strategy",
    "service",
    "cluster_domain",
    "redis",
    "workload",
    "istio",
    "envoy_gateway",
    "envoy",
    "monitoring",
    "plugin",
];
pub(super) const SERVICE_KEYS: &[&str] = &["kind", "name", "port", "image", "replicas", "tls"];
pub(super) const SERVICE_TLS_KEYS: &[&str] = &[
    "server_secret",
    "client_secret",
    "mutual",
    "cert",
    "key",
    "client_ca",
    "ca",
    "client_cert",
    "client_key",
    "sni",
    "client_sans",
];
pub(super) const REDIS_KEYS: &[&str] = &["url", "auth_secret", "image", "tls"];
pub(super) const REDIS_TLS_KEYS: &[&str] = &[
    "secret",
    "mutual",
    "ca",
    "cert",
    "key",
    "insecure_skip_verify",
];
pub(super) const SECRET_KEYS: &[&str] = &["name", "key"];
pub(super) const WORKLOAD_KEYS: &[&str] = &["name", "labels", "image"];
pub(super) const ISTIO_KEYS: &[&str] = &["phase", "mode", "name", "priority"];
pub(super) const GATEWAY_KEYS: &[&str] = &["route", "gateway", "proxy_namespace"];
pub(super) const ENVOY_KEYS: &[&str] = &[
    "listen_port",
    "admin_port",
    "app_port",
    "image",
    "wasm_path",
    "service_address",
    "routes",
];
pub(super) const MONITORING_KEYS: &[&str] = &[
    "prometheus_operator",
    "prometheus_namespace",
    "envoy_metrics_port",
];
/// The keys of each section of a description that takes a fixed set (the
/// ones `render --help` lists; `plugin` takes the filter's configuration).
pub const SECTION_KEYS: &[(&str, &[&str])] = &[
    ("service", SERVICE_KEYS),
    ("service.tls", SERVICE_TLS_KEYS),
    ("redis", REDIS_KEYS),
    ("redis.tls", REDIS_TLS_KEYS),
    ("redis.auth_secret", SECRET_KEYS),
    ("workload", WORKLOAD_KEYS),
    ("istio", ISTIO_KEYS),
    ("envoy_gateway", GATEWAY_KEYS),
    ("envoy", ENVOY_KEYS),
    ("monitoring", MONITORING_KEYS),
];
/// The settings that take one of a fixed set of names, with those names.
pub const SETTING_VALUES: &[(&str, &[&str])] =
    &[("istio.phase", PHASES), ("istio.mode", ISTIO_MODES)];
/// `istio.phase`: the names of [`IstioPhase`].
pub const PHASES: &[&str] = &[
    IstioPhase::Authn.name(),
    IstioPhase::Authz.name(),
    IstioPhase::Stats.name(),
    IstioPhase::UnspecifiedPhase.name(),
];
/// `istio.mode`: the names of [`IstioMode`].
pub const ISTIO_MODES: &[&str] = &[
    IstioMode::Server.name(),
    IstioMode::Client.name(),
    IstioMode::ClientAndServer.name(),
];

/// The images of the parts `render` writes, as the project runs them.
pub const RATELIMIT_IMAGE: &str = "envoyproxy/ratelimit:3fb70258";
/// The counter's image as `make counter-image` tags it (this version).
pub const COUNTER_IMAGE: &str = concat!("tenant-ratelimit-counter:", env!("CARGO_PKG_VERSION"));
/// `redis.url` of a counter that counts in its own memory.
pub const MEMORY_STORE: &str = "memory";
pub const REDIS_IMAGE: &str = "redis:7-alpine";
pub const ENVOY_IMAGE: &str = "envoyproxy/envoy:v1.40.0";
