//! `render` with TLS on the hop to the service (`service.tls`) and to
//! Redis (`redis.tls`) for every target and both services; what it refuses,
//! naming the field; the counter's systemd unit on a VM; and `check`'s
//! reading back of the hop's TLS from what render wrote.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use ratelimit_config::check::tls::{disagreements, read_deployed};
use ratelimit_config::render::deployment::{
    deployment, parse_assignment, read_description, set_path,
};
use ratelimit_config::render::{render, File, Target, Team};
use ratelimit_config::team_file::check_team_file;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The example rendered for `target` with `--set` assignments over
/// deploy/deployment.yaml (`vm`: without its namespace, as for a VM).
fn render_with(target: Target, vm: bool, sets: &[&str]) -> Result<Vec<File>, String> {
    let f = check_team_file(
        "limits.json",
        &std::fs::read_to_string(repo().join("e2e/limits.json")).unwrap(),
    );
    let (json, limits) = f.parsed.unwrap();
    let text = std::fs::read_to_string(repo().join("deploy/deployment.yaml")).unwrap();
    let (mut description, mut sources) = read_description("deployment.yaml", &text).unwrap();
    if vm {
        description.as_object_mut().unwrap().remove("namespace");
    }
    for s in sets {
        let (path, value) = parse_assignment(s).unwrap();
        set_path(&mut description, &path, value);
        sources.flags.insert(path.clone(), format!("--set {path}"));
    }
    let dep = deployment(&description, &sources, target).map_err(|errors| {
        errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let team = Team {
        source: "limits.json",
        json: &json,
        limits: &limits,
    };
    render(&team, &dep, target, &|p| sources.place(p))
        .map(|(files, _)| files)
        .map_err(|e| e.to_string())
}

fn file<'a>(files: &'a [File], name: &str) -> &'a str {
    &files
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} not rendered"))
        .text
}

const KUBE_TLS: &[&str] = &[
    "service.tls.server_secret=rl-server",
    "service.tls.client_secret=rl-client",
    "redis.url=rediss://redis.example.com:6380",
    "redis.tls.secret=redis-ca",
    "redis.tls.mutual=true",
];

const VM_TLS: &[&str] = &[
    "service.tls.cert=/etc/rl/server.crt",
    "service.tls.key=/etc/rl/server.key",
    "service.tls.client_ca=/etc/rl/ca.crt",
    "service.tls.ca=/etc/rl/ca.crt",
    "service.tls.client_cert=/etc/rl/envoy.crt",
    "service.tls.client_key=/etc/rl/envoy.key",
    "service.tls.client_sans=[envoy.example.com]",
    "redis.url=rediss://redis.example.com:6380",
    "redis.tls.ca=/etc/rl/redis-ca.crt",
];

fn with(base: &[&'static str], more: &[&'static str]) -> Vec<&'static str> {
    base.iter().chain(more).copied().collect()
}

/// What check reads back from `names` of `files`: its disagreements.
fn check_tls(files: &[File], names: &[&str]) -> Vec<String> {
    let mut all = ratelimit_config::check::tls::Deployed::default();
    for n in names {
        let d = read_deployed(n, file(files, n), "tenant_ratelimit");
        all.clusters.extend(d.clusters);
        all.services.extend(d.services);
    }
    assert!(
        !all.clusters.is_empty() && !all.services.is_empty(),
        "{names:?}"
    );
    disagreements(&all, "tenant_ratelimit")
}

#[test]
fn envoy_gateway_and_the_sidecar_get_the_clusters_tls_and_the_secrets_for_both_services() {
    for service in ["service.kind=counter", "service.kind=envoy-ratelimit"] {
        let sets = with(KUBE_TLS, &[service]);
        let eg = render_with(Target::EnvoyGateway, false, &sets).unwrap();
        let proxy = file(&eg, "envoyproxy.yaml");
        for want in [
            "name: envoy.transport_sockets.tls",
            "sni: ratelimit.my-api.svc.cluster.local",
            "filename: /etc/ratelimit-tls/client/ca.crt",
            "filename: /etc/ratelimit-tls/client/tls.crt",
            "secretName: rl-client",
            "mountPath: /etc/ratelimit-tls/client",
        ] {
            assert!(proxy.contains(want), "{service}: {want} not in\n{proxy}");
        }
        let svc = file(&eg, "ratelimit-service.yaml");
        let wants: &[&str] = if service.ends_with("counter") {
            &[
                "'--tls-cert'",
                "/etc/ratelimit-tls/server/tls.crt",
                "'--tls-client-ca'",
                "'--redis-ca'",
                "'--redis-cert'",
                "rediss://redis.example.com:6380",
                "secretName: rl-server",
                "secretName: redis-ca",
            ]
        } else {
            &[
                "GRPC_SERVER_USE_TLS",
                "GRPC_SERVER_TLS_CERT",
                "GRPC_CLIENT_TLS_CACERT",
                "REDIS_TLS\n",
                "REDIS_TLS_CACERT",
                "REDIS_TLS_CLIENT_CERT",
                "value: redis.example.com:6380",
                "secretName: rl-server",
            ]
        };
        for want in wants {
            assert!(svc.contains(want), "{service}: {want} not in\n{svc}");
        }
        assert_eq!(
            check_tls(&eg, &["envoyproxy.yaml", "ratelimit-service.yaml"]),
            Vec::<String>::new()
        );
        let sidecar = render_with(Target::Envoy, false, &sets).unwrap();
        let pod = file(&sidecar, "sidecar.yaml");
        assert!(pod.contains("secretName: rl-client") && pod.contains("secretName: rl-server"));
        assert_eq!(
            check_tls(&sidecar, &["envoy.yaml", "sidecar.yaml"]),
            Vec::<String>::new()
        );
        // One side without TLS: check names the disagreement.
        let plain = render_with(Target::EnvoyGateway, false, &[service]).unwrap();
        let mixed = vec![
            plain
                .iter()
                .find(|f| f.name == "envoyproxy.yaml")
                .unwrap()
                .clone(),
            eg.iter()
                .find(|f| f.name == "ratelimit-service.yaml")
                .unwrap()
                .clone(),
        ];
        let problems = check_tls(&mixed, &["envoyproxy.yaml", "ratelimit-service.yaml"]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("has no transport_socket, but")
                && problems[0].contains("serves gRPC over TLS only"),
            "{problems:?}"
        );
    }
}

#[test]
fn without_mutual_tls_envoy_presents_no_certificate_and_the_service_asks_none() {
    let eg = render_with(
        Target::EnvoyGateway,
        false,
        &with(
            KUBE_TLS,
            &["service.kind=counter", "service.tls.mutual=false"],
        ),
    )
    .unwrap();
    assert!(!file(&eg, "envoyproxy.yaml").contains("tls_certificates"));
    assert!(!file(&eg, "ratelimit-service.yaml").contains("--tls-client-ca"));
    assert_eq!(
        check_tls(&eg, &["envoyproxy.yaml", "ratelimit-service.yaml"]),
        Vec::<String>::new()
    );
}

#[test]
fn istio_shows_the_meshs_mutual_tls_and_takes_no_tls_of_ours() {
    let files = render_with(Target::Istio, false, &["service.kind=counter"]).unwrap();
    let pa = file(&files, "peerauthentication.yaml");
    assert!(pa.contains("kind: PeerAuthentication") && pa.contains("mode: STRICT"));
    assert!(file(&files, "kustomization.yaml").contains("peerauthentication.yaml"));
    let svc = file(&files, "ratelimit-service.yaml");
    assert!(svc.contains("sidecar.istio.io/inject: 'true'"), "{svc}");
    assert!(!files.iter().any(|f| f.text.contains("transport_socket:")));
    let e = render_with(
        Target::Istio,
        false,
        &[
            "service.tls.server_secret=srv",
            "service.tls.client_secret=cli",
        ],
    )
    .unwrap_err();
    assert!(
        e.contains("service.tls: under Istio the mesh's mutual TLS covers the hop"),
        "{e}"
    );
}

/// ExecStart's words, its quoting undone.
fn exec_start(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    line.split_whitespace()
        .map(|w| w.trim_matches('"').to_string())
        .collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == name)
        .map(|w| w[1].as_str())
        .collect()
}

/// Every port in `envoy.yaml`'s listeners, admin and clusters.
fn envoy_ports(envoy_yaml: &str) -> Vec<(String, u64)> {
    let v: Value = serde_yaml_like(envoy_yaml);
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<(String, u64)>) {
        match v {
            Value::Object(m) => {
                if let (Some(a), Some(p)) = (
                    m.get("address").and_then(Value::as_str),
                    m.get("port_value").and_then(Value::as_u64),
                ) {
                    out.push((a.to_string(), p));
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&v, &mut out);
    out
}

fn serde_yaml_like(text: &str) -> Value {
    let docs = ratelimit_config::yaml_in::documents(text).unwrap();
    ratelimit_config::yaml_in::convert(&docs[0]).value
}

#[test]
fn the_counter_on_a_vm_runs_from_a_systemd_unit_on_loopback_with_ports_of_its_own() {
    let files = render_with(Target::Envoy, true, &["service.kind=counter"]).unwrap();
    let unit = file(&files, "ratelimit-counter.service");
    let args = exec_start(unit);
    assert_eq!(args[0], "/usr/local/bin/ratelimit-counter");
    assert_eq!(flag(&args, "--limits"), ["/etc/ratelimit-counter/limits"]);
    assert!(unit.contains("EnvironmentFile=/etc/ratelimit-counter/ratelimit-counter.env"));
    let env = file(&files, "ratelimit-counter.env");
    assert!(
        env.contains("\nTRL_COUNTER_STORE=redis://127.0.0.1:6379\n"),
        "{env}"
    );
    let grpc = flag(&args, "--grpc-addr")[0];
    let http = flag(&args, "--http-addr")[0];
    assert!(grpc.starts_with("127.0.0.1:") && http.starts_with("127.0.0.1:"));
    // Envoy reaches the counter where it listens; every port is its own.
    let envoy = envoy_ports(file(&files, "envoy.yaml"));
    assert!(envoy.contains(&("127.0.0.1".into(), 8081)), "{envoy:?}");
    let mut ports: Vec<u64> = envoy
        .iter()
        .filter(|(_, p)| *p != 8081)
        .map(|(_, p)| *p)
        .collect();
    for a in [grpc, http] {
        ports.push(a.rsplit_once(':').unwrap().1.parse().unwrap());
    }
    let mut distinct = ports.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    // With TLS: the counter's flags, and Envoy's cluster with its certificate.
    let tls = render_with(
        Target::Envoy,
        true,
        &with(VM_TLS, &["service.kind=counter"]),
    )
    .unwrap();
    let args = exec_start(file(&tls, "ratelimit-counter.service"));
    assert_eq!(flag(&args, "--tls-cert"), ["/etc/rl/server.crt"]);
    assert_eq!(flag(&args, "--tls-client-ca"), ["/etc/rl/ca.crt"]);
    assert_eq!(flag(&args, "--tls-client-san"), ["envoy.example.com"]);
    assert_eq!(flag(&args, "--redis-ca"), ["/etc/rl/redis-ca.crt"]);
    assert!(file(&tls, "ratelimit-counter.env")
        .contains("TRL_COUNTER_STORE=rediss://redis.example.com:6380"));
    let fragment = file(&tls, "bootstrap-fragment.yaml");
    assert!(
        fragment.contains("filename: /etc/rl/envoy.crt")
            && fragment.contains("san_type: IP_ADDRESS")
    );
    assert_eq!(
        check_tls(
            &tls,
            &[
                "envoy.yaml",
                "ratelimit-counter.service",
                "ratelimit-counter.env"
            ]
        ),
        Vec::<String>::new()
    );
    // envoyproxy/ratelimit on a VM: no unit (docs/deploying.md runs it).
    let rl = render_with(Target::Envoy, true, &[]).unwrap();
    assert!(!rl.iter().any(|f| f.name.ends_with(".service")));
}

#[test]
fn bad_combinations_are_refused_naming_the_field() {
    let cases: &[(Target, bool, &[&str], &str)] = &[
        (
            Target::Envoy,
            true,
            &["service.kind=counter", "redis.url=rediss://r.example.com:6380"],
            "--set redis.url: redis.url: \"rediss://r.example.com:6380\" is Redis over TLS, and redis.tls is not set",
        ),
        (
            Target::EnvoyGateway,
            false,
            &["redis.url=rediss://r.example.com:6380"],
            "redis.url: \"rediss://r.example.com:6380\" is Redis over TLS, and redis.tls is not set: the service would not reach it; set redis.tls (true: Redis's certificate checked against the system's CAs; or its CA: redis.tls.secret",
        ),
        (
            Target::Envoy,
            true,
            &["service.kind=counter", "redis.url=redis://r:6379", "redis.tls=true"],
            "redis.tls: redis.url \"redis://r:6379\" is plaintext",
        ),
        (
            Target::EnvoyGateway,
            false,
            &["redis.tls=true"],
            "redis.tls: the Redis render writes serves no TLS",
        ),
        (
            Target::Envoy,
            true,
            &["redis.url=r:6380", "redis.tls.cert=/c.crt"],
            "redis.tls.key: missing: the private key of redis.tls.cert",
        ),
        (
            Target::Envoy,
            true,
            &[
                "service.tls.cert=/s.crt",
                "service.tls.key=/s.key",
                "service.tls.ca=/ca.crt",
                "service.tls.client_ca=/ca.crt",
                "service.tls.client_cert=/e.crt",
            ],
            "service.tls.client_key: missing: the private key of service.tls.client_cert",
        ),
        (
            Target::Envoy,
            true,
            &["service.tls.cert=/s.crt", "service.tls.ca=/ca.crt"],
            "service.tls.key: missing: the private key of service.tls.cert",
        ),
        (
            Target::Envoy,
            true,
            &[
                "service.tls.cert=/s.crt",
                "service.tls.key=/s.key",
                "service.tls.ca=/ca.crt",
                "service.tls.client_cert=/e.crt",
                "service.tls.client_key=/e.key",
            ],
            "service.tls.client_ca: missing: Envoy would send service.tls.client_cert to a service that asks for none",
        ),
        (
            Target::EnvoyGateway,
            false,
            &["service.tls.server_secret=s", "service.tls.client_secret=c", "service.tls.client_sans=[a, b]"],
            "service.tls.client_sans: envoyproxy/ratelimit accepts one client name (GRPC_CLIENT_TLS_SAN)",
        ),
        (
            Target::EnvoyGateway,
            false,
            &["service.tls.server_secret=s", "service.tls.cert=/s.crt"],
            "service.tls.cert: a file path: on Kubernetes the certificates come from Secrets",
        ),
        (
            Target::Envoy,
            true,
            &["service.tls.server_secret=s"],
            "service.tls.server_secret: a Kubernetes setting, and render writes for a VM here",
        ),
        (
            Target::Istio,
            false,
            &["service.kind=counter", "redis.url=memory", "service.replicas=2"],
            "--set service.replicas: service.replicas: 2 replicas of a counter with the memory store (redis.url: memory) would each count alone",
        ),
        (
            Target::Envoy,
            true,
            &["service.kind=counter", "envoy.app_port=9090"],
            "envoy.app_port: port 9090 is both envoy.app_port and the counter's HTTP port (9090: /readyz, /metrics)",
        ),
        (
            Target::Envoy,
            true,
            &["envoy.admin_port=8081"],
            "service.port: port 8081 is both envoy.admin_port and service.port",
        ),
    ];
    for (target, vm, sets, want) in cases {
        match render_with(*target, *vm, sets) {
            Ok(_) => panic!("{sets:?} rendered; expected {want}"),
            Err(e) => assert!(e.contains(want), "{sets:?}:\n{e}\nlacks\n{want}"),
        }
    }
    // The memory store's one replica is the default, and accepted.
    let ok = render_with(
        Target::Istio,
        false,
        &["service.kind=counter", "redis.url=memory"],
    )
    .unwrap();
    assert!(file(&ok, "ratelimit-service.yaml").contains("replicas: 1"));
}

#[test]
fn envoyproxy_ratelimit_takes_the_counters_url_forms_as_its_redis_type_and_url() {
    for (url, tls, want) in [
        (
            "rediss://r.example.com:6380",
            true,
            &[
                "REDIS_URL\n          value: r.example.com:6380",
                "REDIS_TLS\n",
            ][..],
        ),
        (
            "redis-cluster://a:7000,b:7001",
            false,
            &[
                "REDIS_TYPE\n          value: cluster",
                "REDIS_URL\n          value: 'a:7000,b:7001'",
            ][..],
        ),
        (
            "redis-sentinel://s1:26379,s2:26379/mymaster",
            false,
            &[
                "REDIS_TYPE\n          value: sentinel",
                "REDIS_URL\n          value: 'mymaster,s1:26379,s2:26379'",
            ][..],
        ),
    ] {
        let url_set = format!("redis.url={url}");
        let mut sets = vec![url_set.as_str()];
        if tls {
            sets.push("redis.tls=true");
        }
        let files = render_with(Target::EnvoyGateway, false, &sets).unwrap();
        let svc = file(&files, "ratelimit-service.yaml");
        for w in want {
            assert!(svc.contains(w), "{url}: {w:?} not in\n{svc}");
        }
    }
}
