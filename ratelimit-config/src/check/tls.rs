//! `check --deployed`: the TLS of the hop from the filter's Envoy to the
//! rate-limit service, read back from what is deployed on each side, and
//! every disagreement named. A side that speaks TLS to a side that does
//! not fails every call, and the filter then fails open: nothing is
//! limited, and nothing else says why.
//!
//! Envoy's side: the rate-limit cluster (the plugin's
//! `rate_limit_service.cluster`) in a bootstrap, a fragment, an Envoy
//! Gateway EnvoyProxy's bootstrap or a ConfigMap holding one. The service's
//! side: a Deployment's container (ratelimit-counter's flags and
//! environment, envoyproxy/ratelimit's GRPC_SERVER_* environment) or the
//! counter's systemd unit and environment file.

use serde_json::Value;

use crate::yaml_in;

/// The rate-limit cluster's TLS, as Envoy's side deploys it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTls {
    pub file: String,
    /// A `transport_socket` of `envoy.transport_sockets.tls`.
    pub tls: bool,
    /// It presents a client certificate (mutual TLS).
    pub client_cert: bool,
}

/// The service's TLS, as its side deploys it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceTls {
    pub file: String,
    /// Which service: `ratelimit-counter` or `envoyproxy/ratelimit`.
    pub service: &'static str,
    /// It serves gRPC over TLS.
    pub tls: bool,
    /// It requires a client certificate.
    pub client_ca: bool,
}

/// What one deployed file says of either side.
#[derive(Debug, Default)]
pub struct Deployed {
    pub clusters: Vec<ClusterTls>,
    pub services: Vec<ServiceTls>,
}

/// Reads `text` (YAML or JSON documents, a systemd unit, an environment
/// file) for the cluster named `cluster` and for a rate-limit service.
pub fn read_deployed(file: &str, text: &str, cluster: &str) -> Deployed {
    let mut out = Deployed::default();
    if text
        .lines()
        .any(|l| l.trim_start().starts_with("ExecStart="))
        || file.ends_with(".env")
    {
        out.services.extend(systemd(file, text));
        return out;
    }
    if let Ok(docs) = yaml_in::documents(text) {
        for d in &docs {
            walk(&yaml_in::convert(d).value, file, cluster, &mut out, 0);
        }
    }
    out
}

fn walk(v: &Value, file: &str, cluster: &str, out: &mut Deployed, depth: u32) {
    if depth > 64 {
        return;
    }
    match v {
        Value::Object(m) => {
            if m.get("name").and_then(Value::as_str) == Some(cluster)
                && (m.contains_key("load_assignment") || m.contains_key("type"))
            {
                out.clusters.push(cluster_tls(file, v));
            }
            if let Some(Value::Array(cs)) = m.get("containers") {
                out.services
                    .extend(cs.iter().filter_map(|c| container(file, c)));
            }
            for x in m.values() {
                walk(x, file, cluster, out, depth + 1);
            }
        }
        Value::Array(a) => a
            .iter()
            .for_each(|x| walk(x, file, cluster, out, depth + 1)),
        // A bootstrap held as text: an EnvoyProxy's bootstrap.value, a
        // ConfigMap's envoy.yaml.
        Value::String(s) if s.contains("static_resources") => {
            if let Ok(docs) = yaml_in::documents(s) {
                for d in &docs {
                    walk(&yaml_in::convert(d).value, file, cluster, out, depth + 1);
                }
            }
        }
        _ => {}
    }
}

fn cluster_tls(file: &str, c: &Value) -> ClusterTls {
    let socket = c.get("transport_socket");
    let tls = socket
        .and_then(|s| s.get("name"))
        .and_then(Value::as_str)
        .is_some_and(|n| n == "envoy.transport_sockets.tls")
        || socket
            .and_then(|s| s.pointer("/typed_config/@type"))
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("UpstreamTlsContext"));
    let common = socket.and_then(|s| s.pointer("/typed_config/common_tls_context"));
    let has = |key: &str| {
        common
            .and_then(|c| c.get(key))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    ClusterTls {
        file: file.to_string(),
        tls,
        client_cert: tls && (has("tls_certificates") || has("tls_certificate_sds_secret_configs")),
    }
}

/// The strings of a container's `command` and `args`.
fn strings(c: &Value, key: &str) -> Vec<String> {
    c.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The value of env `name` set (a literal or from a Secret) in a container.
fn env_set(c: &Value, name: &str) -> Option<String> {
    let env = c.get("env")?.as_array()?;
    let e = env
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?;
    Some(
        e.get("value")
            .and_then(Value::as_str)
            .unwrap_or("(from elsewhere)")
            .to_string(),
    )
}

fn container(file: &str, c: &Value) -> Option<ServiceTls> {
    let mut argv = strings(c, "command");
    argv.extend(strings(c, "args"));
    let flag = |f: &str| {
        argv.iter()
            .any(|a| a == f || a.starts_with(&format!("{f}=")))
    };
    if argv.iter().any(|a| a.ends_with("ratelimit-counter")) {
        return Some(ServiceTls {
            file: file.to_string(),
            service: "ratelimit-counter",
            tls: flag("--tls-cert") || env_set(c, "TRL_COUNTER_TLS_CERT").is_some(),
            client_ca: flag("--tls-client-ca") || env_set(c, "TRL_COUNTER_TLS_CLIENT_CA").is_some(),
        });
    }
    let ratelimit = argv.iter().any(|a| a.ends_with("/bin/ratelimit"))
        || env_set(c, "REDIS_SOCKET_TYPE").is_some();
    ratelimit.then(|| ServiceTls {
        file: file.to_string(),
        service: "envoyproxy/ratelimit",
        tls: env_set(c, "GRPC_SERVER_USE_TLS").is_some_and(|v| v.eq_ignore_ascii_case("true")),
        client_ca: env_set(c, "GRPC_CLIENT_TLS_CACERT").is_some_and(|v| !v.is_empty()),
    })
}

/// The counter's systemd unit (its ExecStart) or environment file.
fn systemd(file: &str, text: &str) -> Option<ServiceTls> {
    let mut s = ServiceTls {
        file: file.to_string(),
        service: "ratelimit-counter",
        ..ServiceTls::default()
    };
    let mut counter = file.ends_with(".env");
    for line in text.lines().map(str::trim) {
        if let Some(exec) = line.strip_prefix("ExecStart=") {
            let words: Vec<&str> = exec.split_whitespace().collect();
            counter |= words
                .first()
                .is_some_and(|w| w.ends_with("ratelimit-counter"));
            s.tls |= words
                .iter()
                .any(|w| w.trim_matches('"').starts_with("--tls-cert"));
            s.client_ca |= words
                .iter()
                .any(|w| w.trim_matches('"').starts_with("--tls-client-ca"));
        } else if let Some((k, v)) = line.split_once('=') {
            let set = !v.trim().is_empty();
            s.tls |= k.trim() == "TRL_COUNTER_TLS_CERT" && set;
            s.client_ca |= k.trim() == "TRL_COUNTER_TLS_CLIENT_CA" && set;
        }
    }
    counter.then_some(s)
}

/// Each disagreement between the two sides, as a message (empty: they
/// agree, or a side is missing: see [`missing_side`]). The counter's
/// environment file and unit count as one side.
pub fn disagreements(d: &Deployed, cluster: &str) -> Vec<String> {
    let mut out = Vec::new();
    let services = merged(&d.services);
    for c in &d.clusters {
        for s in &services {
            let svc = format!("{} in {}", s.service, s.file);
            let envoy = format!("{}: the rate-limit cluster {cluster:?}", c.file);
            match (c.tls, s.tls) {
                (true, false) => out.push(format!(
                    "{envoy} speaks TLS (transport_socket), but {svc} serves plaintext gRPC: every call fails and the filter fails open; give the service its certificate (render with service.tls)"
                )),
                (false, true) => out.push(format!(
                    "{envoy} has no transport_socket, but {svc} serves gRPC over TLS only: every call fails and the filter fails open; render both sides with the same service.tls"
                )),
                (true, true) if s.client_ca && !c.client_cert => out.push(format!(
                    "{envoy} presents no client certificate (common_tls_context.tls_certificates), but {svc} requires one (mutual TLS): every call is refused and the filter fails open"
                )),
                (true, true) if !s.client_ca && c.client_cert => out.push(format!(
                    "{envoy} presents a client certificate, but {svc} asks for none: anyone who reaches its port is served; give it the CA of Envoy's certificate (service.tls.client_ca, or service.tls.mutual)"
                )),
                _ => {}
            }
        }
    }
    out
}

/// A side `check --deployed` did not find, named (None: both found).
pub fn missing_side(d: &Deployed, cluster: &str) -> Option<String> {
    match (d.clusters.is_empty(), d.services.is_empty()) {
        (true, _) => Some(format!(
            "--deployed: no Envoy cluster named {cluster:?} (the filter's rate_limit_service.cluster) in the files given: give Envoy's bootstrap, bootstrap-fragment.yaml or envoyproxy.yaml"
        )),
        (_, true) => Some(
            "--deployed: no rate-limit service in the files given: give its Deployment (ratelimit-service.yaml, sidecar.yaml) or the counter's ratelimit-counter.service and .env".into(),
        ),
        _ => None,
    }
}

/// The services found, the counter's unit and environment file as one.
fn merged(services: &[ServiceTls]) -> Vec<ServiceTls> {
    let (systemd, kube): (Vec<&ServiceTls>, Vec<&ServiceTls>) = services
        .iter()
        .partition(|s| s.file.ends_with(".service") || s.file.ends_with(".env"));
    let mut out: Vec<ServiceTls> = kube.into_iter().cloned().collect();
    if let Some(first) = systemd.first() {
        out.push(ServiceTls {
            file: systemd
                .iter()
                .map(|s| s.file.as_str())
                .collect::<Vec<_>>()
                .join(" and "),
            service: first.service,
            tls: systemd.iter().any(|s| s.tls),
            client_ca: systemd.iter().any(|s| s.client_ca),
        });
    }
    out
}
