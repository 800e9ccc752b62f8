//! The files of each target. Every Kubernetes target also gets the
//! rate-limit service (`ratelimit-service.yaml`, its rules in
//! `ratelimit.yaml`; for ratelimit-counter, the team file `<domain>.json`),
//! its Redis (`redis.yaml`, unless `redis.url`),
//! NetworkPolicies (`networkpolicy.yaml`) and a `kustomization.yaml`
//! (`kubectl apply -k DIR`).

use serde_json::{json, Value};

use super::deployment::{Deployment, FailStrategy, Target};
use super::envoy::{bootstrap, bootstrap_fragment, stats_config, wasm_filter, Ports};
use super::kube::{
    client_tls_volume, counter_container, ingress_policy, kustomization, name_labels,
    ratelimit_service, redis, redis_policy, rules_configmap_name, service_env, service_tls_volumes,
    COUNTER_HTTP_PORT, NAME_LABEL, SERVICE_METRICS_PORT,
};
use super::monitoring::{
    monitors, prometheus_policy, SIDECAR_ENVOY_PORT_NAME, SIDECAR_SERVICE_PORT_NAME,
};
use super::{
    header, service_host, yaml_file, File, Plugin, Team, RESOURCE_NAME, ROOT_ID, STATIC_CLUSTER,
};
use crate::model::Service;

/// The label that has Istio inject its sidecar into a pod.
pub const ISTIO_INJECT_LABEL: &str = "sidecar.istio.io/inject";

/// Istio: mutual TLS required on the pods of the service (and of the Redis
/// `render` writes): the hop from the filter's sidecar is the mesh's
/// mutual TLS, with no certificate of ours.
fn peer_authentications(dep: &Deployment) -> Vec<Value> {
    let mut names = vec![dep.service.name.clone()];
    if dep.redis.url.is_none() {
        names.push(super::kube::redis_name(dep));
    }
    names
        .iter()
        .map(|name| {
            json!({
                "apiVersion": "security.istio.io/v1",
                "kind": "PeerAuthentication",
                "metadata": {"name": name, "namespace": namespace(dep)},
                "spec": {
                    "selector": {"matchLabels": {NAME_LABEL: name}},
                    "mtls": {"mode": "STRICT"}
                }
            })
        })
        .collect()
}

/// The ConfigMap of Istio's bootstrap override, and its one key (the file
/// name istio-agent reads: `/etc/istio/custom-bootstrap/custom_bootstrap.json`).
pub const ISTIO_BOOTSTRAP_CONFIGMAP: &str = "tenant-ratelimit-bootstrap";
pub const ISTIO_BOOTSTRAP_KEY: &str = "custom_bootstrap.json";
pub const ISTIO_BOOTSTRAP_ANNOTATION: &str = "sidecar.istio.io/bootstrapOverride";

fn labels(pairs: &[(String, String)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

fn namespace(dep: &Deployment) -> &str {
    dep.namespace.as_deref().unwrap_or("default")
}

/// What `ratelimit-service.yaml` says of the service.
fn service_comment(dep: &Deployment) -> &'static [&'static str] {
    match dep.service.kind {
        Service::EnvoyRatelimit => &[
            "envoyproxy/ratelimit as a Service shared by the proxies, with its rules",
            "(ratelimit.yaml, in the ConfigMap the kustomization generates). Its HTTP",
            "port (/healthcheck, and /json, which spends quota as a gRPC call does)",
            "serves the kubelet's probe only: see networkpolicy.yaml.",
        ],
        Service::Counter => &[
            "ratelimit-counter as a Service shared by the proxies. It reads the team file",
            "itself (<domain>.json, in the ConfigMap the kustomization generates; a change",
            "is read again, a bad file keeps the last good one). Its HTTP port serves",
            "/readyz, /healthz and /metrics, nothing that spends quota.",
        ],
    }
}

/// The service, its Redis, their policies and the kustomization, for a
/// target whose proxies are `proxies` (NetworkPolicy peers); with
/// `monitoring`, the monitors of the proxies' pods (`proxy_pods`, their
/// labels) and of the service.
fn shared(
    team: &Team<'_>,
    dep: &Deployment,
    target: Target,
    (proxies, proxy_pods): (Vec<Value>, Value),
    own: &[&str],
    (rules, descriptor_key): (&File, &str),
) -> Vec<File> {
    let svc = &dep.service.name;
    let mut service_docs = ratelimit_service(dep, descriptor_key);
    let mut redis_docs = redis(dep);
    if target == Target::Istio {
        // The mesh's mutual TLS covers the hops to the service and to
        // Redis only if their pods have a sidecar (peerauthentication.yaml).
        for d in service_docs.iter_mut().chain(redis_docs.iter_mut()) {
            if let Some(Value::Object(l)) = d.pointer_mut("/spec/template/metadata/labels") {
                l.insert(ISTIO_INJECT_LABEL.into(), json!("true"));
            }
        }
    }
    let mut files = vec![
        rules.clone(),
        yaml_file(
            "ratelimit-service.yaml",
            &header(team, target, service_comment(dep)),
            &service_docs,
        ),
    ];
    let mut resources: Vec<&str> = own.to_vec();
    resources.push("ratelimit-service.yaml");
    if dep.redis.url.is_none() {
        files.push(yaml_file(
            "redis.yaml",
            &header(
                team,
                target,
                &[
                    "The Redis the rate-limit service counts in: persistence on (an append-only",
                    "file, fsync every second), so a restart does not start every window again.",
                ],
            ),
            &redis_docs,
        ));
        resources.push("redis.yaml");
    }
    let mut policies = vec![ingress_policy(
        dep,
        &format!("{svc}-from-proxies"),
        name_labels(svc),
        proxies,
        &[dep.service.port],
    )];
    policies.extend(redis_policy(dep, name_labels(svc)));
    if let Some(m) = &dep.monitoring {
        policies.push(prometheus_policy(
            dep,
            m,
            &format!("{svc}-metrics-from-prometheus"),
            name_labels(svc),
            &[match dep.service.kind {
                Service::EnvoyRatelimit => SERVICE_METRICS_PORT,
                Service::Counter => COUNTER_HTTP_PORT,
            }],
        ));
        files.push(monitors(team, dep, target, proxy_pods));
        resources.push("monitors.yaml");
    }
    files.push(yaml_file(
        "networkpolicy.yaml",
        &header(
            team,
            target,
            &[
                "Only the proxies reach the rate-limit service, and only on its gRPC port;",
                "only the service reaches Redis. Whoever reaches either can spend or reset",
                "any tenant's quota. NetworkPolicies need a network plugin that enforces them.",
            ],
        ),
        &policies,
    ));
    resources.push("networkpolicy.yaml");
    let k = kustomization(
        dep,
        &resources,
        &[(rules_configmap_name(dep), vec![rules.name.as_str()])],
    );
    files.push(yaml_file(
        "kustomization.yaml",
        &header(
            team,
            target,
            &[
                "kubectl apply -k <this directory>. The namespace is part of what is rendered",
                "(the rate-limit cluster's name, the Service's DNS name): change it with",
                "`render --namespace`, not here.",
            ],
        ),
        &[k],
    ));
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

fn fail_comment(target: Target) -> [&'static str; 6] {
    match target {
        Target::Istio => [
            "failStrategy: what requests get when the filter cannot run (the image",
            "cannot be fetched or fails its sha256, or the filter refuses its configuration):",
            "  FAIL_CLOSE  Istio puts a deny-all filter in its place: every request 403;",
            "  FAIL_OPEN   the filter is left out: every request passes, unlimited, and",
            "              nothing in the response says so.",
            "When the rate-limit service fails, the filter's on_failure decides.",
        ],
        _ => [
            "failOpen: what requests get when the filter cannot run:",
            "  false  image missing or digest mismatch: every request 500 (the route is",
            "         replaced by a direct response); configuration refused: every request 503;",
            "  true   the route serves without the filter: every request passes, unlimited,",
            "         and nothing in the response says so.",
            "When the rate-limit service fails, the filter's on_failure decides.",
        ],
    }
}

/// Istio: the WasmPlugin on the workload's pods, pulling the OCI image;
/// the rate-limit cluster is Istio's outbound cluster of the Service; the
/// per-group labels come from a bootstrap override (a ConfigMap the pods
/// name in an annotation: workload-patch.yaml).
pub fn istio(team: &Team<'_>, dep: &Deployment, p: &Plugin, rules: &File) -> Vec<File> {
    let ns = namespace(dep);
    let mut spec = json!({
        "selector": {"matchLabels": labels(&dep.workload.labels)},
        "url": format!("oci://{}", dep.image.as_deref().unwrap_or_default()),
    });
    if let (Some(hex), Value::Object(m)) = (&dep.sha256, &mut spec) {
        m.insert("sha256".into(), json!(hex));
    }
    if let Value::Object(m) = &mut spec {
        m.insert("imagePullPolicy".into(), json!("IfNotPresent"));
        m.insert("phase".into(), json!(dep.istio.phase.name()));
        if let Some(priority) = dep.istio.priority {
            m.insert("priority".into(), json!(priority));
        }
        // Without a match Istio runs it on inbound and outbound listeners
        // alike: a sidecar would limit its workload's own calls too.
        m.insert("match".into(), json!([{"mode": dep.istio.mode.name()}]));
        m.insert("pluginName".into(), json!(ROOT_ID));
        m.insert(
            "failStrategy".into(),
            json!(match dep.fail_strategy {
                Some(FailStrategy::Closed) => "FAIL_CLOSE",
                _ => "FAIL_OPEN",
            }),
        );
        m.insert("pluginConfig".into(), p.json.clone());
    }
    let plugin = json!({
        "apiVersion": "extensions.istio.io/v1alpha1",
        "kind": "WasmPlugin",
        "metadata": {"name": dep.istio.name, "namespace": ns},
        "spec": spec,
    });
    let mut comment: Vec<&str> = vec![
        "The filter as a WasmPlugin on the pods of the workload (selector), pulled by",
        "istio-agent from the OCI image (url), checked against sha256: the image",
        "manifest's digest, 64 hex characters (make oci prints it).",
        "",
        "phase: STATS by default (istio.phase), after Istio's authentication and",
        "authorization: a request an AuthorizationPolicy refuses never reaches the filter,",
        "so with RequestAuthentication's outputClaimToHeaders the tenant header it reads",
        "is the verified claim's, not the client's own. In AUTHZ or AUTHN the filter runs",
        "before the AuthorizationPolicy: see docs/security.md, \"The tenant must come",
        "from something the client cannot forge\".",
        "",
        "match: SERVER by default (istio.mode), the sidecar's inbound traffic only:",
        "without a match Istio runs it on the workload's outbound listeners too, and",
        "its own calls carrying the tenant header would be limited (and counted again",
        "by the callee's sidecar). On an ingress gateway use CLIENT (istio.mode=CLIENT).",
        "A sidecar's inbound route is always named \"default\": per-route limits need",
        "the gateway, where routes carry the VirtualService's http[].name",
        "(docs/deploying.md#route-names).",
        "",
        "rate_limit_service.cluster is Istio's outbound cluster of the rate-limit Service:",
        "outbound|<port>||<service>.<namespace>.svc.<cluster domain>. A Sidecar resource",
        "that limits the workload's egress must let it reach that Service, or the",
        "cluster is missing and every request passes unlimited (counted in",
        "tenant_ratelimit_rls_dispatch_failed, and logged once a minute).",
        "",
    ];
    comment.extend(fail_comment(Target::Istio));
    let override_json = serde_json::to_string_pretty(&json!({"stats_config": stats_config()}))
        .unwrap_or_default()
        + "\n";
    let configmap = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ISTIO_BOOTSTRAP_CONFIGMAP, "namespace": ns},
        "data": {ISTIO_BOOTSTRAP_KEY: override_json},
    });
    let workload = dep.workload.name.as_deref().unwrap_or_default();
    let patch = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": workload, "namespace": ns},
        "spec": {"template": {"metadata": {"annotations": {
            ISTIO_BOOTSTRAP_ANNOTATION: ISTIO_BOOTSTRAP_CONFIGMAP
        }}}}
    });
    let proxies = vec![json!({"podSelector": {"matchLabels": labels(&dep.workload.labels)}})];
    let mut files = vec![
        yaml_file("wasmplugin.yaml", &header(team, Target::Istio, &comment), &[plugin]),
        yaml_file(
            "stats-bootstrap.yaml",
            &header(
                team,
                Target::Istio,
                &[
                    "The per-group counters' labels (group, source) for the workload's sidecars:",
                    "stats_tags merged into the bootstrap istio-agent writes (Istio's bootstrap",
                    "override: the pods name this ConfigMap in the annotation",
                    "sidecar.istio.io/bootstrapOverride, workload-patch.yaml). Without it the",
                    "counters are still there, with the group in their names.",
                ],
            ),
            &[configmap],
        ),
        yaml_file(
            "workload-patch.yaml",
            &header(
                team,
                Target::Istio,
                &[
                    "The annotation that gives the workload's sidecars stats-bootstrap.yaml.",
                    "Not a resource of the kustomization (the workload is yours): apply it with",
                    &format!("  kubectl -n {ns} patch deployment {workload} --patch-file workload-patch.yaml"),
                    "or add it to your workload's own kustomization as a patch. The pods restart.",
                ],
            ),
            &[patch],
        ),
    ];
    files.push(yaml_file(
        "peerauthentication.yaml",
        &header(
            team,
            Target::Istio,
            &[
                "The hop from the workload's sidecar to the rate-limit service (and the",
                "service's to Redis) is the mesh's mutual TLS: the service's pods (and Redis's)",
                "get a sidecar (the sidecar.istio.io/inject label of ratelimit-service.yaml),",
                "and these PeerAuthentications refuse any connection to them that is not mutual",
                "TLS from the mesh. Istio's own certificates, rotated by istiod: render writes no",
                "transport_socket and takes no service.tls under Istio.",
            ],
        ),
        &peer_authentications(dep),
    ));
    files.extend(shared(
        team,
        dep,
        Target::Istio,
        (proxies, labels(&dep.workload.labels)),
        &[
            "wasmplugin.yaml",
            "stats-bootstrap.yaml",
            "peerauthentication.yaml",
        ],
        (rules, &p.config.descriptor_key),
    ));
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

/// Envoy Gateway: the EnvoyExtensionPolicy on the HTTPRoute (Envoy
/// Gateway pulls the image and hands the module to its proxies), and the
/// EnvoyProxy whose bootstrap Merge adds the rate-limit cluster and the
/// labels; the Gateway names that EnvoyProxy (gateway-patch.yaml).
pub fn envoy_gateway(team: &Team<'_>, dep: &Deployment, p: &Plugin, rules: &File) -> Vec<File> {
    let ns = namespace(dep);
    let route = dep.envoy_gateway.route.as_deref().unwrap_or_default();
    let gateway = dep.envoy_gateway.gateway.as_deref().unwrap_or_default();
    let mut image = json!({"url": dep.image.as_deref().unwrap_or_default()});
    if let (Some(hex), Value::Object(m)) = (&dep.sha256, &mut image) {
        m.insert("sha256".into(), json!(hex));
    }
    let policy = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyExtensionPolicy",
        "metadata": {"name": RESOURCE_NAME, "namespace": ns},
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route}],
            "wasm": [{
                "name": RESOURCE_NAME,
                "rootID": ROOT_ID,
                "failOpen": dep.fail_strategy == Some(FailStrategy::Open),
                "code": {"type": "Image", "image": image},
                "config": p.json.clone(),
            }]
        }
    });
    let mut comment: Vec<&str> = vec![
        "The filter on the HTTPRoute. Envoy Gateway pulls the OCI image itself (url,",
        "checked against sha256: the image manifest's digest, 64 hex characters, as",
        "make oci prints it) and hands the module to its proxies over its own server.",
        "rate_limit_service.cluster names the static cluster of envoyproxy.yaml.",
        "",
    ];
    comment.extend(fail_comment(Target::EnvoyGateway));
    let fragment = bootstrap_fragment(
        STATIC_CLUSTER,
        &service_host(dep),
        dep.service.port,
        dep.service.tls.as_ref(),
    );
    let mut proxy = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyProxy",
        "metadata": {"name": RESOURCE_NAME, "namespace": ns},
        "spec": {"bootstrap": {"type": "Merge", "value": crate::yaml_out::document(&fragment)}}
    });
    // service.tls: the proxies mount the CA of the service's certificate
    // (and their own) where the cluster's transport_socket reads them.
    if let (Some((volume, mount)), Some(Value::Object(spec))) =
        (client_tls_volume(dep), proxy.get_mut("spec"))
    {
        spec.insert(
            "provider".into(),
            json!({"type": "Kubernetes", "kubernetes": {"envoyDeployment": {
                "pod": {"volumes": [volume]},
                "container": {"volumeMounts": [mount]}
            }}}),
        );
    }
    let patch = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": gateway, "namespace": ns},
        "spec": {"infrastructure": {"parametersRef": {
            "group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": RESOURCE_NAME
        }}}
    });
    let proxy_pods = json!({
        "app.kubernetes.io/component": "proxy",
        "app.kubernetes.io/managed-by": "envoy-gateway",
        "gateway.envoyproxy.io/owning-gateway-name": gateway,
        "gateway.envoyproxy.io/owning-gateway-namespace": ns
    });
    let proxies = vec![json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": dep.envoy_gateway.proxy_namespace}},
        "podSelector": {"matchLabels": proxy_pods}
    })];
    let mut files = vec![
        yaml_file(
            "envoyextensionpolicy.yaml",
            &header(team, Target::EnvoyGateway, &comment),
            &[policy],
        ),
        yaml_file(
            "envoyproxy.yaml",
            &header(
                team,
                Target::EnvoyGateway,
                &[
                    "What the Gateway's proxies need, merged into the bootstrap Envoy Gateway",
                    "writes (spec.bootstrap type Merge: lists are appended, nothing of Envoy",
                    "Gateway's own is replaced):",
                    "- the static cluster the filter calls the rate-limit service through",
                    "  (HTTP/2): Envoy Gateway creates no cluster for a Wasm filter's own calls;",
                    "  a static one has a name no xDS update removes or renames;",
                    "- the per-group counters' labels (group, source);",
                    "- with service.tls, the cluster's TLS (transport_socket) and the Secret",
                    "  of its certificates mounted in the proxies (provider).",
                    "A Gateway takes one EnvoyProxy (gateway-patch.yaml names this one); if yours",
                    "has one with a bootstrap already, merge these lines into it.",
                ],
            ),
            &[proxy],
        ),
        yaml_file(
            "gateway-patch.yaml",
            &header(
                team,
                Target::EnvoyGateway,
                &[
                    "The Gateway's proxies get envoyproxy.yaml. Not a resource of the",
                    "kustomization (the Gateway is yours): apply it with",
                    &format!("  kubectl -n {ns} patch gateway {gateway} --type merge --patch-file gateway-patch.yaml"),
                    "(or set spec.parametersRef of its GatewayClass). Envoy Gateway redeploys",
                    "the proxies.",
                ],
            ),
            &[patch],
        ),
    ];
    files.extend(shared(
        team,
        dep,
        Target::EnvoyGateway,
        (proxies, proxy_pods),
        &["envoyextensionpolicy.yaml", "envoyproxy.yaml"],
        (rules, &p.config.descriptor_key),
    ));
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

/// Plain Envoy: the filter (http-filter.yaml), what to merge into a
/// bootstrap (bootstrap-fragment.yaml: the rate-limit cluster and the
/// labels), a complete bootstrap that uses both (envoy.yaml), the service's
/// rules; with a namespace, also the sidecar pattern for Kubernetes.
pub fn envoy(team: &Team<'_>, dep: &Deployment, p: &Plugin, rules: &File) -> Vec<File> {
    let filter = wasm_filter(&p.json, &dep.envoy.wasm_path, dep.fail_strategy);
    let fragment = bootstrap_fragment(
        STATIC_CLUSTER,
        &dep.envoy.service_address,
        dep.service.port,
        dep.service.tls.as_ref(),
    );
    let ports = Ports {
        listen: dep.envoy.listen_port,
        admin: dep.envoy.admin_port,
        app: dep.envoy.app_port,
        routes: &dep.envoy.routes,
        metrics: dep.monitoring.as_ref().map(|m| m.envoy_metrics_port),
    };
    let t = Target::Envoy;
    let mut files = vec![
        yaml_file(
            "http-filter.yaml",
            &header(
                team,
                t,
                &[
                    "The filter, as one entry of your HTTP connection manager's http_filters,",
                    "before the router. Its configuration is the plugin configuration (JSON);",
                    "wasm_path is where the .wasm is (make build; or the OCI image's plugin.wasm).",
                ],
            ),
            std::slice::from_ref(&filter),
        ),
        yaml_file(
            "bootstrap-fragment.yaml",
            &header(
                team,
                t,
                &[
                    "Merge into your bootstrap: envoy -c yours.yaml --config-yaml \"$(cat bootstrap-fragment.yaml)\"",
                    "(or paste): the rate-limit service's cluster (HTTP/2), which the filter's",
                    "rate_limit_service.cluster names, and the per-group counters' labels.",
                ],
            ),
            std::slice::from_ref(&fragment),
        ),
        yaml_file(
            "envoy.yaml",
            &header(
                team,
                t,
                &[
                    "A complete bootstrap: a listener on every address in front of the app on",
                    "127.0.0.1, admin on 127.0.0.1 only (it can stop Envoy), the filter",
                    "(http-filter.yaml), the rate-limit cluster and labels (bootstrap-fragment.yaml),",
                    "and an access log of the refused requests.",
                ],
            ),
            &[bootstrap(&filter, &fragment, &ports)],
        ),
        rules.clone(),
    ];
    if dep.namespace.is_some() {
        files.extend(sidecar(team, dep, rules, &p.config.descriptor_key));
    } else if dep.service.kind == Service::Counter {
        files.extend(super::vm::counter_unit(team, dep, &p.config.descriptor_key));
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

/// The sidecar pattern: the application's pod runs Envoy with the filter
/// in front of the app, and the rate-limit service beside it on 127.0.0.1;
/// every replica counts in one shared Redis. The filter comes from the OCI
/// image as an image volume (Kubernetes 1.35+).
fn sidecar(team: &Team<'_>, dep: &Deployment, rules: &File, descriptor_key: &str) -> Vec<File> {
    let t = Target::Envoy;
    let name = dep.workload.name.as_deref().unwrap_or_default();
    let pod_labels = labels(&dep.workload.labels);
    let admin = dep.envoy.admin_port;
    let wasm_dir = dep
        .envoy
        .wasm_path
        .rsplit_once('/')
        .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d })
        .to_string();
    let reference = match &dep.sha256 {
        Some(hex) => format!("{}@sha256:{hex}", dep.image.as_deref().unwrap_or_default()),
        None => dep.image.clone().unwrap_or_default(),
    };
    let ready = format!("exec 3<>/dev/tcp/127.0.0.1/{admin} && printf 'GET /ready HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && grep -q LIVE <&3");
    let drain = format!("exec 3<>/dev/tcp/127.0.0.1/{admin} && printf 'POST /drain_listeners?graceful HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n' >&3 && grep -q OK <&3 && sleep 10");
    let mut deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace(dep), "labels": pod_labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "app",
                            "image": dep.workload.image,
                            "ports": [{"name": "app", "containerPort": dep.envoy.app_port}],
                            "lifecycle": {"preStop": {"sleep": {"seconds": 12}}}
                        },
                        {
                            "name": "envoy",
                            "image": dep.envoy.image,
                            "args": ["envoy", "-c", "/etc/envoy/envoy.yaml", "--drain-time-s", "10",
                                     "--drain-strategy", "immediate", "--disable-hot-restart"],
                            "ports": [{"name": "http", "containerPort": dep.envoy.listen_port}],
                            "readinessProbe": {"exec": {"command": ["bash", "-c", ready]}, "periodSeconds": 5},
                            "lifecycle": {"preStop": {"exec": {"command": ["bash", "-c", drain]}}},
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                            "volumeMounts": [
                                {"name": "envoy-config", "mountPath": "/etc/envoy", "readOnly": true},
                                {"name": "filter", "mountPath": wasm_dir, "readOnly": true}
                            ]
                        },
                        service_container(dep, descriptor_key)
                    ],
                    "volumes": [
                        {"name": "envoy-config", "configMap": {"name": "envoy-config"}},
                        {"name": "filter", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}},
                        {"name": "ratelimit-config", "configMap": {"name": rules_configmap_name(dep)}}
                    ]
                }
            }
        }
    });
    if let Some(m) = &dep.monitoring {
        sidecar_metrics(&mut deployment, m.envoy_metrics_port);
    }
    sidecar_tls(&mut deployment, dep);
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace(dep), "labels": pod_labels},
        "spec": {"selector": pod_labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    });
    let mut policies = vec![ingress_policy(
        dep,
        &format!("{name}-envoy-only"),
        pod_labels.clone(),
        Vec::new(),
        &[dep.envoy.listen_port],
    )];
    policies.extend(redis_policy(dep, pod_labels.clone()));
    if let Some(m) = &dep.monitoring {
        policies.push(prometheus_policy(
            dep,
            m,
            &format!("{name}-metrics-from-prometheus"),
            pod_labels.clone(),
            &[m.envoy_metrics_port, SERVICE_METRICS_PORT],
        ));
    }
    let mut files = vec![
        yaml_file(
            "sidecar.yaml",
            &header(
                team,
                t,
                &[
                    "The sidecar pattern: the application's pod runs Envoy with the filter in",
                    "front of the app (which listens on 127.0.0.1) and the rate-limit service",
                    "beside it on 127.0.0.1; every replica counts in the one shared Redis. The",
                    "filter is the OCI image's plugin.wasm, mounted as an image volume",
                    "(Kubernetes 1.35 and later). Envoy drains on preStop within the grace period.",
                ],
            ),
            &[deployment, service],
        ),
        yaml_file(
            "networkpolicy.yaml",
            &header(
                team,
                t,
                &[
                    "The pods take connections on Envoy's listener only (the rate-limit service's",
                    "HTTP port, whose /json spends quota, serves the kubelet's probe only); only",
                    "they reach Redis. Whoever reaches the service or Redis can spend or reset any",
                    "tenant's quota. NetworkPolicies need a network plugin that enforces them.",
                ],
            ),
            &policies,
        ),
    ];
    let mut resources = vec!["sidecar.yaml"];
    if dep.redis.url.is_none() {
        files.push(yaml_file(
            "redis.yaml",
            &header(
                team,
                t,
                &[
                    "The Redis the rate-limit service counts in: persistence on (an append-only",
                    "file, fsync every second), so a restart does not start every window again.",
                ],
            ),
            &redis(dep),
        ));
        resources.push("redis.yaml");
    }
    resources.push("networkpolicy.yaml");
    if dep.monitoring.is_some() {
        files.push(monitors(team, dep, t, pod_labels.clone()));
        resources.push("monitors.yaml");
    }
    let k = kustomization(
        dep,
        &resources,
        &[
            ("envoy-config".to_string(), vec!["envoy.yaml"]),
            (rules_configmap_name(dep), vec![rules.name.as_str()]),
        ],
    );
    files.push(yaml_file(
        "kustomization.yaml",
        &header(
            team,
            t,
            &[
                "kubectl apply -k <this directory>: the sidecar Deployment, its ConfigMaps",
                &format!(
                    "(envoy.yaml, {}), Redis and the NetworkPolicies.",
                    rules.name
                ),
            ],
        ),
        &[k],
    ));
    files
}

/// `service.tls` and `redis.tls` in the sidecar pod: the Secrets as its
/// volumes, Envoy's mounted in Envoy's container (the service's container
/// mounts its own).
fn sidecar_tls(deployment: &mut Value, dep: &Deployment) {
    let mut volumes = service_tls_volumes(dep).0;
    let client = client_tls_volume(dep);
    if let Some((volume, _)) = &client {
        volumes.push(volume.clone());
    }
    if let Some(Value::Array(v)) = deployment.pointer_mut("/spec/template/spec/volumes") {
        v.extend(volumes);
    }
    if let (Some((_, mount)), Some(Value::Array(containers))) = (
        client,
        deployment.pointer_mut("/spec/template/spec/containers"),
    ) {
        for c in containers.iter_mut() {
            if c.get("name").and_then(Value::as_str) == Some("envoy") {
                if let Some(Value::Array(m)) = c.get_mut("volumeMounts") {
                    m.push(mount.clone());
                }
            }
        }
    }
}

/// The rate-limit service's container in the sidecar pod, on 127.0.0.1
/// beside Envoy; its HTTP port (the kubelet's probes) on the pod's address.
fn service_container(dep: &Deployment, descriptor_key: &str) -> Value {
    match dep.service.kind {
        Service::EnvoyRatelimit => {
            let mut mounts = vec![
                json!({"name": "ratelimit-config", "mountPath": "/data/ratelimit/config", "readOnly": true}),
            ];
            mounts.extend(service_tls_volumes(dep).1);
            json!({
                "name": "ratelimit",
                "image": dep.service.image,
                "command": ["/bin/ratelimit"],
                "env": service_env(dep, "127.0.0.1", 8090),
                "ports": [{"name": "rl-health", "containerPort": 8090}],
                "readinessProbe": {"httpGet": {"path": "/healthcheck", "port": "rl-health"}, "periodSeconds": 5},
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "volumeMounts": mounts
            })
        }
        // Its one HTTP port serves the probes and /metrics: the port the
        // PodMonitor names.
        Service::Counter => counter_container(
            dep,
            descriptor_key,
            "127.0.0.1",
            (SIDECAR_SERVICE_PORT_NAME, COUNTER_HTTP_PORT),
            "ratelimit-config",
        ),
    }
}

/// The sidecar pod's metrics ports: Envoy's stats listener, and the
/// service's Prometheus endpoint (turned on in its env; the counter's is
/// its HTTP port, there already).
fn sidecar_metrics(deployment: &mut Value, envoy_port: u32) {
    let Some(Value::Array(containers)) = deployment.pointer_mut("/spec/template/spec/containers")
    else {
        return;
    };
    for c in containers.iter_mut() {
        let port = match c.get("name").and_then(Value::as_str) {
            Some("envoy") => json!({"name": SIDECAR_ENVOY_PORT_NAME, "containerPort": envoy_port}),
            Some("ratelimit") => {
                json!({"name": SIDECAR_SERVICE_PORT_NAME, "containerPort": SERVICE_METRICS_PORT})
            }
            _ => continue,
        };
        if let Some(Value::Array(p)) = c.get_mut("ports") {
            p.push(port);
        }
    }
}
