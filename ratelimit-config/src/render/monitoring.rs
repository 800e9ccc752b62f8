//! What `render` writes for the Prometheus Operator
//! (`monitoring.prometheus_operator: true`): `monitors.yaml`, a PodMonitor
//! for the proxies (Envoy's `/stats/prometheus`) and a ServiceMonitor for
//! the rate-limit service (its Prometheus endpoint, which this setting turns
//! on), with the job names the example alerts and dashboard read (`envoy`,
//! `ratelimit`); and the NetworkPolicy rules that let Prometheus reach those
//! ports. Plain Envoy keeps its admin on 127.0.0.1: its bootstrap gets a
//! listener that serves `/stats/prometheus` alone, from the admin.

use serde_json::{json, Value};

use super::deployment::{Deployment, Monitoring, Target};
use super::kube::{ingress_policy, name_labels, SERVICE_METRICS_PORT_NAME};
use super::{header, yaml_file, File, Team, RESOURCE_NAME};

/// The sidecar pod's ports (plain Envoy): Envoy's stats listener and the
/// service's endpoint beside it.
pub const SIDECAR_ENVOY_PORT_NAME: &str = "envoy-metrics";
pub const SIDECAR_SERVICE_PORT_NAME: &str = "rl-metrics";
/// Istio's sidecar: the istio-proxy container's port 15090.
pub const ISTIO_ENVOY_PORT_NAME: &str = "http-envoy-prom";
/// Envoy Gateway's proxies: the envoy container's port 19001.
pub const EG_ENVOY_PORT_NAME: &str = "metrics";
/// The scrape jobs of `deploy/prometheus/alerts.yml` and the dashboard.
pub const ENVOY_JOB: &str = "envoy";
pub const SERVICE_JOB: &str = "ratelimit";
/// Envoy's Prometheus path, on its admin (and on plain Envoy's stats listener).
pub const ENVOY_STATS_PATH: &str = "/stats/prometheus";
const INTERVAL: &str = "30s";

/// One scrape endpoint: `port` (a port name) and `path`, its job named.
fn endpoint(port: &str, path: &str, job: &str) -> Value {
    json!({
        "port": port,
        "path": path,
        "interval": INTERVAL,
        "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": job}]
    })
}

fn metadata(dep: &Deployment, name: &str) -> Value {
    json!({"name": name, "namespace": dep.namespace.as_deref().unwrap_or("default")})
}

fn pod_monitor(
    dep: &Deployment,
    name: &str,
    selector: Value,
    namespaces: Option<&str>,
    endpoints: Vec<Value>,
) -> Value {
    let mut spec = json!({"selector": {"matchLabels": selector}});
    if let (Some(ns), Value::Object(m)) = (namespaces, &mut spec) {
        m.insert("namespaceSelector".into(), json!({"matchNames": [ns]}));
    }
    if let Value::Object(m) = &mut spec {
        m.insert("podMetricsEndpoints".into(), Value::Array(endpoints));
    }
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(dep, name),
        "spec": spec
    })
}

/// The shared rate-limit service's ServiceMonitor (Istio, Envoy Gateway).
fn service_monitor(dep: &Deployment) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(dep, &dep.service.name),
        "spec": {
            "selector": {"matchLabels": name_labels(&dep.service.name)},
            "endpoints": [endpoint(SERVICE_METRICS_PORT_NAME, "/metrics", SERVICE_JOB)]
        }
    })
}

/// `monitors.yaml` for `target`; `proxies`: the labels of the proxies' pods.
pub fn monitors(team: &Team<'_>, dep: &Deployment, target: Target, proxies: Value) -> File {
    let envoy_name = format!("{RESOURCE_NAME}-envoy");
    let (docs, lines): (Vec<Value>, &[&str]) = match target {
        Target::Istio => (
            vec![
                pod_monitor(
                    dep,
                    &envoy_name,
                    proxies,
                    None,
                    vec![endpoint(ISTIO_ENVOY_PORT_NAME, ENVOY_STATS_PATH, ENVOY_JOB)],
                ),
                service_monitor(dep),
            ],
            &[
                "The Prometheus Operator's scrapes: the workload's sidecars (istio-proxy's",
                "port 15090, /stats/prometheus; Istio keeps the wasmcustom counters) as job",
                "envoy, and the rate-limit service's Prometheus endpoint as job ratelimit,",
                "the jobs deploy/prometheus/alerts.yml and the dashboard read.",
            ],
        ),
        Target::EnvoyGateway => (
            vec![
                pod_monitor(
                    dep,
                    &envoy_name,
                    proxies,
                    Some(&dep.envoy_gateway.proxy_namespace),
                    vec![endpoint(EG_ENVOY_PORT_NAME, ENVOY_STATS_PATH, ENVOY_JOB)],
                ),
                service_monitor(dep),
            ],
            &[
                "The Prometheus Operator's scrapes: the Gateway's proxies in the proxy",
                "namespace (port 19001, /stats/prometheus) as job envoy, and the rate-limit",
                "service's Prometheus endpoint as job ratelimit, the jobs",
                "deploy/prometheus/alerts.yml and the dashboard read.",
            ],
        ),
        Target::Envoy => (
            vec![pod_monitor(
                dep,
                RESOURCE_NAME,
                proxies,
                None,
                vec![
                    endpoint(SIDECAR_ENVOY_PORT_NAME, ENVOY_STATS_PATH, ENVOY_JOB),
                    endpoint(SIDECAR_SERVICE_PORT_NAME, "/metrics", SERVICE_JOB),
                ],
            )],
            &[
                "The Prometheus Operator's scrapes of the sidecar pods: Envoy's stats",
                "listener (/stats/prometheus only; its admin stays on 127.0.0.1) as job envoy,",
                "and the rate-limit service beside it as job ratelimit, the jobs",
                "deploy/prometheus/alerts.yml and the dashboard read.",
            ],
        ),
    };
    yaml_file("monitors.yaml", &header(team, target, lines), &docs)
}

/// The NetworkPolicy that lets Prometheus (its namespace) reach `ports` of
/// the pods `selected`, and nothing else.
pub fn prometheus_policy(
    dep: &Deployment,
    m: &Monitoring,
    name: &str,
    selected: Value,
    ports: &[u32],
) -> Value {
    ingress_policy(
        dep,
        name,
        selected,
        vec![json!({"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": m.prometheus_namespace
        }}})],
        ports,
    )
}

/// Plain Envoy's stats listener on `port`: `/stats/prometheus` (and
/// nothing else) from the admin on 127.0.0.1:`admin`.
pub fn stats_listener(port: u32) -> Value {
    json!({
        "name": "prometheus",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "prometheus",
                "route_config": {
                    "name": "prometheus",
                    "virtual_hosts": [{
                        "name": "prometheus",
                        "domains": ["*"],
                        "routes": [{
                            "name": "prometheus",
                            "match": {"path": ENVOY_STATS_PATH},
                            "route": {"cluster": ADMIN_CLUSTER}
                        }]
                    }]
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        }]}]
    })
}

/// The cluster of Envoy's own admin, which the stats listener forwards to.
pub const ADMIN_CLUSTER: &str = "admin";
