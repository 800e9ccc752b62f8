//! What an Envoy needs for the filter, whoever writes its bootstrap: the
//! filter itself, the rate-limit service's cluster (HTTP/2), and the
//! `stats_tags` that turn the per-group counters' names into labels.

use serde_json::{json, Value};

use super::deployment::{FailStrategy, ServiceTls};

/// The labels of the per-group counters
/// (`wasmcustom.tenant_ratelimit.group.<group>.<counter>`): `group` on
/// every one, `source` on the refusals. On /stats/prometheus:
/// `tenant_ratelimit_group_refused{group="gold",source="cache"}`.
pub fn stats_config() -> Value {
    json!({
        "stats_tags": [
            {"tag_name": "group", "regex": r"^wasmcustom\.tenant_ratelimit\.group\.(([^.]+)\.)"},
            {"tag_name": "source", "regex": r"^wasmcustom\.tenant_ratelimit\.group\.[^.]+\.(?:shadow_)?refused(\.(service|cache|bucket|sync|fallback))$"}
        ]
    })
}

/// An HTTP/2 cluster named `name` of one endpoint: STATIC for an IPv4
/// address, else STRICT_DNS.
pub fn cluster(name: &str, address: &str, port: u32, http2: bool) -> Value {
    let ip = address.parse::<std::net::IpAddr>().is_ok();
    let mut c = json!({
        "name": name,
        "type": if ip { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "1s",
    });
    if let Value::Object(m) = &mut c {
        if !ip {
            m.insert("dns_lookup_family".into(), json!("V4_PREFERRED"));
        }
        if http2 {
            m.insert(
                "typed_extension_protocol_options".into(),
                json!({
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}
                    }
                }),
            );
        }
        m.insert(
            "load_assignment".into(),
            json!({
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": address, "port_value": port
                }}}}]}]
            }),
        );
    }
    c
}

/// What to merge into a bootstrap (`envoy --config-yaml`, Envoy Gateway's
/// `spec.bootstrap` Merge, Istio's bootstrap override): the rate-limit
/// cluster, static (no xDS update removes or renames it), and the labels.
pub fn bootstrap_fragment(
    cluster_name: &str,
    address: &str,
    port: u32,
    tls: Option<&ServiceTls>,
) -> Value {
    let mut c = cluster(cluster_name, address, port, true);
    if let (Some(tls), Value::Object(m)) = (tls, &mut c) {
        let name = tls.sni.as_deref().unwrap_or(address);
        m.insert("transport_socket".into(), transport_socket(tls, name));
    }
    json!({
        "static_resources": {"clusters": [c]},
        "stats_config": stats_config(),
    })
}

/// The rate-limit cluster's TLS (`service.tls`): Envoy checks the
/// service's certificate against the CA and wants `name` among its SANs
/// (sent as SNI unless it is an IP address); for mutual TLS it presents
/// its own certificate. ALPN h2: gRPC servers may insist on it.
pub fn transport_socket(tls: &ServiceTls, name: &str) -> Value {
    let ip = name.parse::<std::net::IpAddr>().is_ok();
    let mut common = json!({
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": {"filename": tls.ca},
            "match_typed_subject_alt_names": [{
                "san_type": if ip { "IP_ADDRESS" } else { "DNS" },
                "matcher": {"exact": name}
            }]
        }
    });
    if let (Some((cert, key)), Value::Object(m)) = (&tls.client_cert, &mut common) {
        m.insert(
            "tls_certificates".into(),
            json!([{"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}]),
        );
    }
    let mut context = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
    });
    if let Value::Object(m) = &mut context {
        if !ip {
            m.insert("sni".into(), json!(name));
        }
        m.insert("common_tls_context".into(), common);
    }
    json!({"name": "envoy.transport_sockets.tls", "typed_config": context})
}

/// The filter as an entry of an HTTP connection manager's `http_filters`
/// (before the router): its configuration as a literal block of pretty
/// JSON, so that `check` points at its lines.
pub fn wasm_filter(plugin: &Value, wasm_path: &str, fail: Option<FailStrategy>) -> Value {
    let configuration = serde_json::to_string_pretty(plugin).unwrap_or_default() + "\n";
    let mut config = json!({
        "name": super::ROOT_ID,
        "root_id": super::ROOT_ID,
        "configuration": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": configuration
        },
        "vm_config": {
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": wasm_path}}
        }
    });
    if let (Some(fail), Value::Object(m)) = (fail, &mut config) {
        m.insert(
            "failure_policy".into(),
            json!(match fail {
                FailStrategy::Open => "FAIL_OPEN",
                FailStrategy::Closed => "FAIL_CLOSED",
            }),
        );
    }
    json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": config
        }
    })
}

/// The access log of refused and shadow-refused requests (the filter sets
/// its filter state only for those), one JSON object a line.
pub fn access_log() -> Value {
    json!([{
        "name": "envoy.access_loggers.file",
        "filter": {"extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                "expression": "'wasm.tenant_ratelimit_verdict' in filter_state"
            }
        }},
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": "/dev/stdout",
            "log_format": {"json_format": {
                "time": "%START_TIME%",
                "status": "%RESPONSE_CODE%",
                "method": "%REQ(:METHOD)%",
                "path": "%REQ(:PATH)%",
                "tenant": "%FILTER_STATE(wasm.tenant_ratelimit_tenant:PLAIN)%",
                "group": "%FILTER_STATE(wasm.tenant_ratelimit_group:PLAIN)%",
                "verdict": "%FILTER_STATE(wasm.tenant_ratelimit_verdict:PLAIN)%",
                "source": "%FILTER_STATE(wasm.tenant_ratelimit_source:PLAIN)%"
            }}
        }
    }])
}

/// Where a complete bootstrap listens and what it fronts.
pub struct Ports<'a> {
    pub listen: u32,
    pub admin: u32,
    pub app: u32,
    /// (name, path prefix) of the named routes before the catch-all one.
    pub routes: &'a [(String, String)],
    /// The port of a listener serving `/stats/prometheus` from the admin.
    pub metrics: Option<u32>,
}

/// The name of the complete bootstrap's catch-all route: every request no
/// named route matches (a team file's route limits name other routes).
pub const CATCH_ALL_ROUTE: &str = "app";

/// A complete bootstrap: a listener on every address in front of the app
/// on 127.0.0.1, admin on loopback only (it can stop Envoy), the filter,
/// the rate-limit cluster and the labels (`fragment` merged in).
pub fn bootstrap(filter: &Value, fragment: &Value, ports: &Ports<'_>) -> Value {
    // Every route has a name: it is what a team file's `routes` and the
    // filter's `route_name` see.
    let mut routes: Vec<Value> = ports
        .routes
        .iter()
        .map(|(name, prefix)| {
            json!({"name": name, "match": {"prefix": prefix}, "route": {"cluster": "app"}})
        })
        .collect();
    routes.push(
        json!({"name": CATCH_ALL_ROUTE, "match": {"prefix": "/"}, "route": {"cluster": "app"}}),
    );
    let mut clusters = vec![cluster("app", "127.0.0.1", ports.app, false)];
    if let Some(c) = fragment
        .pointer("/static_resources/clusters")
        .and_then(Value::as_array)
    {
        clusters.extend(c.iter().cloned());
    }
    let mut listeners = Vec::new();
    if let Some(port) = ports.metrics {
        listeners.push(super::monitoring::stats_listener(port));
        clusters.push(cluster(
            super::monitoring::ADMIN_CLUSTER,
            "127.0.0.1",
            ports.admin,
            false,
        ));
    }
    let mut boot = json!({
        "node": {"id": "tenant-ratelimit", "cluster": "tenant-ratelimit"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ports.admin}}},
        "stats_config": fragment.get("stats_config").cloned().unwrap_or(Value::Null),
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": ports.listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "access_log": access_log(),
                        "route_config": {
                            "name": "local",
                            "virtual_hosts": [{
                                "name": "all",
                                "domains": ["*"],
                                "routes": routes
                            }]
                        },
                        "http_filters": [
                            filter,
                            {
                                "name": "envoy.filters.http.router",
                                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                            }
                        ]
                    }
                }]}]
            }],
            "clusters": clusters
        }
    });
    if let Some(Value::Array(l)) = boot.pointer_mut("/static_resources/listeners") {
        l.extend(listeners);
    }
    boot
}
