//! The Kubernetes objects every target shares: the rate-limit service
//! (envoyproxy/ratelimit, or ratelimit-counter with `service.kind: counter`)
//! as a Service, its Redis (unless `redis.url` names one of your own), the
//! NetworkPolicies that let only the proxies reach the service and only the
//! service reach Redis, and the kustomization that puts them together.

use serde_json::{json, Value};

use super::deployment::{
    redis_scheme, Deployment, SecretRef, CLIENT_TLS_DIR, MEMORY_STORE, REDIS_TLS_DIR,
    SERVICE_TLS_DIR,
};
use super::object;
use crate::model::Service;

/// The label every object of the rate-limit service carries, and its
/// pods are selected by.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";

pub fn redis_name(dep: &Deployment) -> String {
    format!("{}-redis", dep.service.name)
}

/// The rules' ConfigMap (kustomize's configMapGenerator writes it from
/// ratelimit.yaml, with a hash in its name so a change rolls the pods).
pub fn rules_configmap_name(dep: &Deployment) -> String {
    format!("{}-config", dep.service.name)
}

fn metadata(name: &str, dep: &Deployment, labels: Value) -> Value {
    let mut m = json!({"name": name});
    if let (Some(ns), Value::Object(o)) = (&dep.namespace, &mut m) {
        o.insert("namespace".into(), json!(ns));
    }
    if let (Value::Object(o), false) = (&mut m, labels.is_null()) {
        o.insert("labels".into(), labels);
    }
    m
}

/// Where the counter finds its team files: the ConfigMap's directory, one
/// `<domain>.json` in it.
pub const COUNTER_LIMITS_DIR: &str = "/etc/ratelimit-counter";
/// The counter's HTTP port (`/readyz`, `/healthz`, `/metrics`): the one the
/// Prometheus Operator scrapes too.
pub const COUNTER_HTTP_PORT: u32 = SERVICE_METRICS_PORT;

/// The rate-limit service's Prometheus endpoint (`PROMETHEUS_ADDR`), and
/// the name of its port (what the ServiceMonitor of `monitoring` scrapes).
pub const SERVICE_METRICS_PORT: u32 = 9090;
pub const SERVICE_METRICS_PORT_NAME: &str = "metrics";

/// The service's env that turns its Prometheus endpoint on.
fn prometheus_env() -> [Value; 2] {
    [
        json!({"name": "USE_PROMETHEUS", "value": "true"}),
        json!({"name": "PROMETHEUS_ADDR", "value": format!(":{SERVICE_METRICS_PORT}")}),
    ]
}

/// The team file's name in the counter's ConfigMap: it serves the domain
/// named so.
pub fn counter_limits_file(dep: &Deployment) -> String {
    format!("{}.json", dep.domain)
}

/// The counter's `--store`: `memory`, the URL given, or the Redis `render`
/// writes.
pub fn counter_store(dep: &Deployment) -> String {
    let scheme = if dep.redis.tls.is_some() {
        "rediss"
    } else {
        "redis"
    };
    match dep.redis.url.as_deref() {
        None => format!("redis://{}:6379", redis_name(dep)),
        Some(MEMORY_STORE) => MEMORY_STORE.to_string(),
        Some(u) if u.contains("://") => u.to_string(),
        Some(u) => format!("{scheme}://{u}"),
    }
}

/// The counter's TLS flags: gRPC (`service.tls`: its certificate, and for
/// mutual TLS the CA of Envoy's and the names allowed), then Redis
/// (`redis.tls`).
pub fn counter_tls_args(dep: &Deployment) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(t) = &dep.service.tls {
        args.extend([
            "--tls-cert".into(),
            t.cert.clone(),
            "--tls-key".into(),
            t.key.clone(),
        ]);
        if let Some(ca) = &t.client_ca {
            args.extend(["--tls-client-ca".into(), ca.clone()]);
            for san in &t.client_sans {
                args.extend(["--tls-client-san".into(), san.clone()]);
            }
        }
    }
    if let Some(t) = &dep.redis.tls {
        if let Some(ca) = &t.ca {
            args.extend(["--redis-ca".into(), ca.clone()]);
        }
        if let Some((cert, key)) = &t.client_cert {
            args.extend([
                "--redis-cert".into(),
                cert.clone(),
                "--redis-key".into(),
                key.clone(),
            ]);
        }
        if t.insecure_skip_verify {
            args.push("--redis-insecure-skip-verify".into());
        }
    }
    args
}

/// The Secrets the service's container mounts (`service.tls.server_secret`,
/// `redis.tls.secret`): the pod's volumes and the container's mounts.
pub fn service_tls_volumes(dep: &Deployment) -> (Vec<Value>, Vec<Value>) {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let secrets = [
        (
            "service-tls",
            dep.service
                .tls
                .as_ref()
                .and_then(|t| t.server_secret.as_ref()),
            SERVICE_TLS_DIR,
        ),
        (
            "redis-tls",
            dep.redis.tls.as_ref().and_then(|t| t.secret.as_ref()),
            REDIS_TLS_DIR,
        ),
    ];
    for (name, secret, dir) in secrets {
        if let Some(secret) = secret {
            volumes.push(json!({"name": name, "secret": {"secretName": secret}}));
            mounts.push(json!({"name": name, "mountPath": dir, "readOnly": true}));
        }
    }
    (volumes, mounts)
}

/// The Secret Envoy's container mounts for `service.tls` (the CA of the
/// service's certificate, and Envoy's own): its volume and mount.
pub fn client_tls_volume(dep: &Deployment) -> Option<(Value, Value)> {
    let secret = dep.service.tls.as_ref()?.client_secret.as_ref()?;
    Some((
        json!({"name": CLIENT_TLS_VOLUME, "secret": {"secretName": secret}}),
        json!({"name": CLIENT_TLS_VOLUME, "mountPath": CLIENT_TLS_DIR, "readOnly": true}),
    ))
}

/// The name of the volume of `service.tls.client_secret` in Envoy's pods.
pub const CLIENT_TLS_VOLUME: &str = "ratelimit-client-tls";

/// Appends `mounts` to a container's `volumeMounts`.
fn add_mounts(container: &mut Value, mounts: Vec<Value>) {
    if mounts.is_empty() {
        return;
    }
    if let Some(Value::Array(m)) = container.get_mut("volumeMounts") {
        m.extend(mounts);
    }
}

/// The counter's container: its team files from the ConfigMap, its store,
/// gRPC on `grpc_host`, HTTP (probes, metrics) on every address at
/// `http_port` (named `http_name`); the Redis password from the Secret.
pub fn counter_container(
    dep: &Deployment,
    descriptor_key: &str,
    grpc_host: &str,
    (http_name, http_port): (&str, u32),
    volume: &str,
) -> Value {
    let mut args: Vec<String> = [
        "--limits",
        COUNTER_LIMITS_DIR,
        "--store",
        &counter_store(dep),
        "--descriptor-key",
        descriptor_key,
        "--grpc-addr",
        &format!("{grpc_host}:{}", dep.service.port),
        "--http-addr",
        &format!("0.0.0.0:{http_port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(counter_tls_args(dep));
    let mut c = json!({
        "name": "counter",
        "image": dep.service.image,
        "command": ["/bin/ratelimit-counter"],
        "args": args,
    });
    if let (Some(SecretRef { name: secret, key }), Value::Object(m)) = (&dep.redis.auth, &mut c) {
        m.insert(
            "env".into(),
            json!([{"name": "REDIS_AUTH", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}]),
        );
    }
    if let Value::Object(m) = &mut c {
        m.insert(
            "ports".into(),
            json!([{"name": http_name, "containerPort": http_port}]),
        );
        m.insert(
            "readinessProbe".into(),
            json!({"httpGet": {"path": "/readyz", "port": http_name}, "periodSeconds": 5}),
        );
        m.insert(
            "livenessProbe".into(),
            json!({"httpGet": {"path": "/healthz", "port": http_name}, "periodSeconds": 10, "failureThreshold": 3}),
        );
        m.insert(
            "resources".into(),
            json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}}),
        );
        m.insert(
            "volumeMounts".into(),
            json!([{"name": volume, "mountPath": COUNTER_LIMITS_DIR, "readOnly": true}]),
        );
    }
    add_mounts(&mut c, service_tls_volumes(dep).1);
    c
}

/// envoyproxy/ratelimit's REDIS_TYPE and REDIS_URL for `redis.url`: a
/// `host:port`, or the counter's forms (`rediss://H:P`,
/// `redis-cluster://H:P,H:P`, `redis-sentinel://H:P,H:P/MASTER`).
pub fn ratelimit_redis(dep: &Deployment) -> (&'static str, String) {
    let Some(url) = dep.redis.url.as_deref() else {
        return ("single", format!("{}:6379", redis_name(dep)));
    };
    let Some((kind, _)) = redis_scheme(url) else {
        return ("single", url.to_string());
    };
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    // No credentials in the URL: envoyproxy/ratelimit takes REDIS_AUTH.
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    match kind {
        "redis-cluster" => ("cluster", rest.to_string()),
        "redis-sentinel" => {
            let mut parts = rest.split('/');
            let hosts = parts.next().unwrap_or_default();
            let master = parts.next().unwrap_or_default();
            ("sentinel", format!("{master},{hosts}"))
        }
        _ => (
            "single",
            rest.split('/').next().unwrap_or_default().to_string(),
        ),
    }
}

/// envoyproxy/ratelimit's TLS settings: gRPC (`service.tls`) and Redis
/// (`redis.tls`), as its `src/settings/settings.go` names them.
pub fn ratelimit_tls_env(dep: &Deployment) -> Vec<Value> {
    let mut env = Vec::new();
    let mut set = |name: &str, value: &str| env.push(json!({"name": name, "value": value}));
    if let Some(t) = &dep.service.tls {
        set("GRPC_SERVER_USE_TLS", "true");
        set("GRPC_SERVER_TLS_CERT", &t.cert);
        set("GRPC_SERVER_TLS_KEY", &t.key);
        if let Some(ca) = &t.client_ca {
            set("GRPC_CLIENT_TLS_CACERT", ca);
            if let Some(san) = t.client_sans.first() {
                set("GRPC_CLIENT_TLS_SAN", san);
            }
        }
    }
    if let Some(t) = &dep.redis.tls {
        set("REDIS_TLS", "true");
        if let Some(ca) = &t.ca {
            set("REDIS_TLS_CACERT", ca);
        }
        if let Some((cert, key)) = &t.client_cert {
            set("REDIS_TLS_CLIENT_CERT", cert);
            set("REDIS_TLS_CLIENT_KEY", key);
        }
        if t.insecure_skip_verify {
            set("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true");
        }
    }
    env
}

/// `{"app.kubernetes.io/name": name}`.
pub fn name_labels(name: &str) -> Value {
    object([(NAME_LABEL, json!(name))])
}

/// The env of the service's container: Redis (with its password from the
/// Secret when there is one), no statsd, the rules from the mounted
/// ConfigMap. `grpc_host`: where it listens for the proxies.
pub fn service_env(dep: &Deployment, grpc_host: &str, http_port: u32) -> Vec<Value> {
    let (redis_type, redis_url) = ratelimit_redis(dep);
    let mut env = vec![
        json!({"name": "HOST", "value": "0.0.0.0"}),
        json!({"name": "PORT", "value": http_port.to_string()}),
        json!({"name": "GRPC_HOST", "value": grpc_host}),
        json!({"name": "GRPC_PORT", "value": dep.service.port.to_string()}),
        json!({"name": "DEBUG_HOST", "value": "127.0.0.1"}),
        json!({"name": "DEBUG_PORT", "value": "6070"}),
        json!({"name": "REDIS_SOCKET_TYPE", "value": "tcp"}),
    ];
    if redis_type != "single" {
        env.push(json!({"name": "REDIS_TYPE", "value": redis_type}));
    }
    env.push(json!({"name": "REDIS_URL", "value": redis_url}));
    if let Some(SecretRef { name: secret, key }) = &dep.redis.auth {
        env.push(json!({"name": "REDIS_AUTH", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}));
    }
    env.extend([
        json!({"name": "REDIS_TIMEOUT", "value": "1s"}),
        json!({"name": "USE_STATSD", "value": "false"}),
        json!({"name": "RUNTIME_ROOT", "value": "/data"}),
        json!({"name": "RUNTIME_SUBDIRECTORY", "value": "ratelimit"}),
        json!({"name": "RUNTIME_WATCH_ROOT", "value": "false"}),
        json!({"name": "LOG_LEVEL", "value": "info"}),
    ]);
    env.extend(ratelimit_tls_env(dep));
    if dep.monitoring.is_some() {
        env.extend(prometheus_env());
    }
    env
}

/// envoyproxy/ratelimit as a shared Deployment and Service, for the
/// proxies of a mesh or a gateway. Its HTTP port (8080: `/healthcheck`,
/// and `/json`, which spends quota like a gRPC call) is for the kubelet's
/// probe only: the NetworkPolicy lets nothing else reach it.
pub fn ratelimit_service(dep: &Deployment, descriptor_key: &str) -> Vec<Value> {
    if dep.service.kind == Service::Counter {
        return counter_service(dep, descriptor_key);
    }
    let name = &dep.service.name;
    let labels = name_labels(name);
    let (tls_volumes, tls_mounts) = service_tls_volumes(dep);
    let mut mounts =
        vec![json!({"name": "config", "mountPath": "/data/ratelimit/config", "readOnly": true})];
    mounts.extend(tls_mounts);
    let mut volumes =
        vec![json!({"name": "config", "configMap": {"name": rules_configmap_name(dep)}})];
    volumes.extend(tls_volumes);
    let mut deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name, dep, labels.clone()),
        "spec": {
            "replicas": dep.service.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{
                        "name": "ratelimit",
                        "image": dep.service.image,
                        "command": ["/bin/ratelimit"],
                        "env": service_env(dep, "0.0.0.0", 8080),
                        "ports": [
                            {"name": "http", "containerPort": 8080},
                            {"name": "grpc", "containerPort": dep.service.port}
                        ],
                        "readinessProbe": {"httpGet": {"path": "/healthcheck", "port": "http"}, "periodSeconds": 5},
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                        "volumeMounts": mounts
                    }],
                    "volumes": volumes
                }
            }
        }
    });
    let mut service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, dep, labels.clone()),
        "spec": {
            "selector": labels,
            "ports": [{"name": "grpc", "port": dep.service.port, "targetPort": "grpc", "appProtocol": "grpc"}]
        }
    });
    if dep.monitoring.is_some() {
        add_metrics_port(&mut deployment, &mut service);
    }
    vec![deployment, service]
}

/// ratelimit-counter as a shared Deployment and Service: two replicas
/// counting in one Redis (one with `redis.url: memory`), its team file
/// from the ConfigMap the kustomization generates. Its HTTP port serves the
/// kubelet's probes and `/metrics`, nothing that spends quota.
fn counter_service(dep: &Deployment, descriptor_key: &str) -> Vec<Value> {
    let name = &dep.service.name;
    let labels = name_labels(name);
    let mut container = counter_container(
        dep,
        descriptor_key,
        "0.0.0.0",
        ("http", COUNTER_HTTP_PORT),
        "limits",
    );
    if let Some(Value::Array(p)) = container.get_mut("ports") {
        p.push(json!({"name": "grpc", "containerPort": dep.service.port}));
    }
    let mut volumes =
        vec![json!({"name": "limits", "configMap": {"name": rules_configmap_name(dep)}})];
    volumes.extend(service_tls_volumes(dep).0);
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name, dep, labels.clone()),
        "spec": {
            "replicas": dep.service.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": volumes
                }
            }
        }
    });
    let mut ports = vec![
        json!({"name": "grpc", "port": dep.service.port, "targetPort": "grpc", "appProtocol": "grpc"}),
    ];
    if dep.monitoring.is_some() {
        ports.push(json!({"name": SERVICE_METRICS_PORT_NAME, "port": COUNTER_HTTP_PORT, "targetPort": "http"}));
    }
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, dep, labels.clone()),
        "spec": {"selector": labels, "ports": ports}
    });
    vec![deployment, service]
}

/// The service's Prometheus endpoint as a port of its container and of
/// its Service (what the ServiceMonitor names).
fn add_metrics_port(deployment: &mut Value, service: &mut Value) {
    if let Some(Value::Array(p)) = deployment.pointer_mut("/spec/template/spec/containers/0/ports")
    {
        p.push(json!({"name": SERVICE_METRICS_PORT_NAME, "containerPort": SERVICE_METRICS_PORT}));
    }
    if let Some(Value::Array(p)) = service.pointer_mut("/spec/ports") {
        p.push(json!({"name": SERVICE_METRICS_PORT_NAME, "port": SERVICE_METRICS_PORT, "targetPort": SERVICE_METRICS_PORT_NAME}));
    }
}

/// The Redis the service counts in: one replica with persistence (an
/// append-only file, fsync every second, on a volume), so a restart loses
/// at most about a second of increments instead of starting every window
/// again; with a password from the Secret when one is given.
pub fn redis(dep: &Deployment) -> Vec<Value> {
    let name = redis_name(dep);
    let labels = name_labels(&name);
    let mut args = vec![
        json!("redis-server"),
        json!("--appendonly"),
        json!("yes"),
        json!("--appendfsync"),
        json!("everysec"),
        json!("--save"),
        json!(""),
    ];
    let mut container = json!({
        "name": "redis",
        "image": dep.redis.image,
    });
    let probe = if let Some(SecretRef { name: secret, key }) = &dep.redis.auth {
        args.extend([json!("--requirepass"), json!("$(REDIS_PASSWORD)")]);
        if let Value::Object(c) = &mut container {
            c.insert(
                "env".into(),
                json!([{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}]),
            );
        }
        json!([
            "sh",
            "-c",
            "REDISCLI_AUTH=\"$REDIS_PASSWORD\" redis-cli ping | grep -q PONG"
        ])
    } else {
        json!(["redis-cli", "ping"])
    };
    if let Value::Object(c) = &mut container {
        c.insert("args".into(), Value::Array(args));
        c.insert(
            "ports".into(),
            json!([{"name": "redis", "containerPort": 6379}]),
        );
        c.insert(
            "readinessProbe".into(),
            json!({"exec": {"command": probe}, "periodSeconds": 5}),
        );
        c.insert(
            "resources".into(),
            json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}),
        );
        c.insert(
            "volumeMounts".into(),
            json!([{"name": "data", "mountPath": "/data"}]),
        );
    }
    let statefulset = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(&name, dep, labels.clone()),
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container]}
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(&name, dep, labels.clone()),
        "spec": {
            "selector": labels,
            "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}]
        }
    });
    vec![statefulset, service]
}

/// A NetworkPolicy: the pods of `selected` take connections on `ports`
/// only from `from` (and, as every NetworkPolicy allows, from their node:
/// the kubelet's probes).
pub fn ingress_policy(
    dep: &Deployment,
    name: &str,
    selected: Value,
    from: Vec<Value>,
    ports: &[u32],
) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"protocol": "TCP", "port": p}))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, dep, Value::Null),
        "spec": {
            "podSelector": {"matchLabels": selected},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": from, "ports": ports}]
        }
    })
}

/// Only the service's pods (`service_pods`) reach Redis, and only on its
/// port; none when Redis is not rendered (`redis.url`).
pub fn redis_policy(dep: &Deployment, service_pods: Value) -> Option<Value> {
    if dep.redis.url.is_some() {
        return None;
    }
    let name = redis_name(dep);
    Some(ingress_policy(
        dep,
        &format!("{name}-from-{}", dep.service.name),
        name_labels(&name),
        vec![json!({"podSelector": {"matchLabels": service_pods}})],
        &[6379],
    ))
}

/// The kustomization of a target's directory: its resources, and the
/// ConfigMaps generated from its files (`(name, [file…])`).
pub fn kustomization(
    dep: &Deployment,
    resources: &[&str],
    generated: &[(String, Vec<&str>)],
) -> Value {
    let mut k = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
    });
    if let (Some(ns), Value::Object(m)) = (&dep.namespace, &mut k) {
        m.insert("namespace".into(), json!(ns));
        m.insert("resources".into(), json!(resources));
        if !generated.is_empty() {
            let gens: Vec<Value> = generated
                .iter()
                .map(|(name, files)| json!({"name": name, "files": files}))
                .collect();
            m.insert("configMapGenerator".into(), Value::Array(gens));
        }
    }
    k
}
