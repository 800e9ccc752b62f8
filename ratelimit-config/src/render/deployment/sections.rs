//! The sections of a description, each read by its own function into its
//! own type; every problem is collected by the [`Reader`], at its place.

use serde_json::{Map, Value};

use crate::error::{excerpt, join, ConfigError};
use crate::field::{describe, unknown_keys};
use crate::model::Service;
use crate::render::kube::{COUNTER_HTTP_PORT, SERVICE_METRICS_PORT};
use crate::render::RESOURCE_NAME;

use super::description::{DescriptionError, Sources};
use super::types::{
    Deployment, Envoy, EnvoyGateway, FailStrategy, Istio, IstioMode, IstioPhase, Monitoring,
    RateLimitService, Redis, RedisTls, SecretRef, ServiceTls, Target, Workload, CLIENT_TLS_DIR,
    COUNTER_IMAGE, ENVOY_IMAGE, ENVOY_KEYS, GATEWAY_KEYS, ISTIO_KEYS, KEYS, MEMORY_STORE,
    MONITORING_KEYS, RATELIMIT_IMAGE, REDIS_IMAGE, REDIS_KEYS, REDIS_TLS_DIR, REDIS_TLS_KEYS,
    SECRET_KEYS, SERVICE_KEYS, SERVICE_TLS_DIR, SERVICE_TLS_KEYS, WORKLOAD_KEYS,
};

/// Collects a description's problems, each at its place.
pub(super) struct Reader<'a> {
    sources: &'a Sources,
    errors: Vec<DescriptionError>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(sources: &'a Sources) -> Self {
        Reader {
            sources,
            errors: Vec::new(),
        }
    }

    /// The problems found.
    pub(super) fn into_errors(self) -> Vec<DescriptionError> {
        self.errors
    }

    pub(super) fn push(&mut self, path: &str, message: impl std::fmt::Display) {
        self.errors.push(DescriptionError {
            place: self.sources.place(path),
            error: ConfigError {
                path: path.to_string(),
                message: message.to_string(),
            },
        });
    }

    pub(super) fn object<'v>(
        &mut self,
        v: Option<&'v Value>,
        path: &str,
        keys: &'static [&'static str],
    ) -> Option<&'v Map<String, Value>> {
        match v? {
            Value::Object(m) => {
                for (key, e) in unknown_keys(m, keys) {
                    self.push(&join(path, key), e);
                }
                Some(m)
            }
            Value::Null => None,
            other => {
                self.push(path, format!("must be a mapping, got {}", describe(other)));
                None
            }
        }
    }

    pub(super) fn string(
        &mut self,
        m: Option<&Map<String, Value>>,
        path: &str,
        key: &str,
    ) -> Option<String> {
        match m?.get(key)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Null => None,
            other => {
                self.push(
                    &join(path, key),
                    format!("must be a non-empty string, got {}", describe(other)),
                );
                None
            }
        }
    }

    fn port(&mut self, m: Option<&Map<String, Value>>, path: &str, key: &str, default: u32) -> u32 {
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => default,
            Some(v) => match v.as_u64().filter(|n| (1..=65_535).contains(n)) {
                Some(n) => u32::try_from(n).unwrap_or(default),
                None => {
                    self.push(
                        &join(path, key),
                        format!("must be a port from 1 to 65535, got {}", describe(v)),
                    );
                    default
                }
            },
        }
    }

    fn require<T>(&mut self, v: Option<T>, path: &str, why: &str) -> Option<T> {
        if v.is_none() {
            self.push(path, format!("missing: {why}"));
        }
        v
    }
}

/// A Kubernetes name (RFC 1123 label: lowercase letters, digits and `-`,
/// at most 63, starting and ending with a letter or digit).
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Checks a description for `target`.
pub fn deployment(
    v: &Value,
    sources: &Sources,
    target: Target,
) -> Result<Deployment, Vec<DescriptionError>> {
    let mut r = Reader::new(sources);
    let top = r.object(Some(v), "", KEYS);
    let section = |key: &str| top.and_then(|t| t.get(key));
    let general = general(&mut r, top, target);
    let mut service = service(&mut r, section("service"), target, general.kube);
    let cluster_domain = r
        .string(top, "", "cluster_domain")
        .unwrap_or_else(|| "cluster.local".into());
    if service.kind == Service::Counter {
        counter_domain(&mut r, general.domain.as_deref());
    }
    let redis = redis(&mut r, section("redis"), service.kind, target, general.kube);
    let memory = service.kind == Service::Counter && redis.url.as_deref() == Some(MEMORY_STORE);
    if service.replicas == 0 {
        service.replicas = if memory { 1 } else { 2 };
    }
    if memory && service.replicas > 1 {
        r.push(
            "service.replicas",
            format!(
                "{} replicas of a counter with the memory store (redis.url: memory) would each count alone: every tenant would get its limit from each; run 1, or give a Redis they share (redis.url)",
                service.replicas
            ),
        );
    }
    let workload = workload(&mut r, section("workload"), target, general.kube);
    let istio = istio(&mut r, section("istio"));
    let envoy_gateway = envoy_gateway(&mut r, section("envoy_gateway"), target);
    let envoy = envoy(&mut r, section("envoy"));
    let plugin = plugin(&mut r, section("plugin"));
    let monitoring = monitoring(&mut r, top);
    if target == Target::Envoy {
        distinct_ports(&mut r, &envoy, &service, monitoring.as_ref(), general.kube);
    }
    let errors = r.into_errors();
    match (errors.is_empty(), general.domain) {
        (true, Some(domain)) => Ok(Deployment {
            domain,
            namespace: general.namespace,
            image: general.image,
            sha256: general.sha256,
            fail_strategy: general.fail_strategy,
            cluster_domain,
            service,
            redis,
            workload,
            istio,
            envoy_gateway,
            envoy,
            plugin,
            monitoring,
        }),
        _ => Err(errors),
    }
}

/// The description's top-level settings (`cluster_domain` aside).
pub(super) struct General {
    pub(super) domain: Option<String>,
    pub(super) namespace: Option<String>,
    /// Whether Kubernetes objects are written: every target but plain
    /// Envoy, and plain Envoy given a namespace (its sidecar Deployment).
    pub(super) kube: bool,
    pub(super) image: Option<String>,
    pub(super) sha256: Option<String>,
    pub(super) fail_strategy: Option<FailStrategy>,
}

/// `domain`, `namespace`, `image`, `sha256`, `fail_strategy`: each
/// required where `target` needs it.
pub(super) fn general(
    r: &mut Reader<'_>,
    top: Option<&Map<String, Value>>,
    target: Target,
) -> General {
    let domain = r.string(top, "", "domain");
    let domain = r.require(
        domain,
        "domain",
        "the rate-limit service domain (domain: or --domain)",
    );
    let namespace = r.string(top, "", "namespace");
    let kube = target != Target::Envoy || namespace.is_some();
    let namespace = if target == Target::Envoy {
        namespace
    } else {
        r.require(
            namespace,
            "namespace",
            "the Kubernetes namespace (namespace: or --namespace)",
        )
    };
    if let Some(ns) = namespace.as_ref().filter(|n| !dns_label(n)) {
        r.push(
            "namespace",
            format!(
                "{} is not a Kubernetes namespace name (lowercase letters, digits, '-')",
                excerpt(ns)
            ),
        );
    }
    let image = r
        .string(top, "", "image")
        .map(|i| i.strip_prefix("oci://").unwrap_or(&i).to_string());
    let image = if kube {
        r.require(
            image,
            "image",
            "the filter's OCI image, as `make oci-push IMAGE=…` pushed it (image: or --image)",
        )
    } else {
        image
    };
    let sha256 = r.string(top, "", "sha256").and_then(|s| {
        let hex = s.strip_prefix("sha256:").unwrap_or(&s).to_string();
        if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            Some(hex.to_ascii_lowercase())
        } else {
            r.push(
                "sha256",
                format!("must be the image's manifest digest, 64 hex characters (with or without \"sha256:\"), got {}", excerpt(&s)),
            );
            None
        }
    });
    let fail_strategy = fail_strategy(r, top.and_then(|t| t.get("fail_strategy")), target);
    General {
        domain,
        namespace,
        kube,
        image,
        sha256,
        fail_strategy,
    }
}

/// `fail_strategy`: required for every target but plain Envoy.
fn fail_strategy(r: &mut Reader<'_>, v: Option<&Value>, target: Target) -> Option<FailStrategy> {
    let fail_strategy = match v {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_str().and_then(FailStrategy::from_name) {
            Some(f) => Some(f),
            None => {
                r.push(
                    "fail_strategy",
                    format!("must be \"open\" or \"closed\", got {}", describe(v)),
                );
                None
            }
        },
    };
    if target == Target::Envoy {
        fail_strategy
    } else {
        r.require(
            fail_strategy,
            "fail_strategy",
            "what requests get when the filter cannot run (its image missing, its configuration refused): \"open\" (passed, unlimited) or \"closed\" (refused) (fail_strategy: or --fail-strategy)",
        )
    }
}

/// `service:`: its kind, name, port and image (by default, the kind's).
pub(super) fn service(
    r: &mut Reader<'_>,
    v: Option<&Value>,
    target: Target,
    kube: bool,
) -> RateLimitService {
    let m = r.object(v, "service", SERVICE_KEYS);
    let name = r
        .string(m, "service", "name")
        .unwrap_or_else(|| "ratelimit".into());
    if !dns_label(&name) {
        r.push(
            "service.name",
            format!("{} is not a Kubernetes Service name", excerpt(&name)),
        );
    }
    let kind = match m.and_then(|s| s.get("kind")) {
        None | Some(Value::Null) => Service::default(),
        Some(v) => match v.as_str().and_then(Service::from_name) {
            Some(k) => k,
            None => {
                r.push(
                    "service.kind",
                    format!(
                        "must be \"envoy-ratelimit\" (envoyproxy/ratelimit) or \"counter\" (ratelimit-counter), got {}",
                        describe(v)
                    ),
                );
                Service::default()
            }
        },
    };
    let port = r.port(m, "service", "port", 8081);
    let image = r
        .string(m, "service", "image")
        .unwrap_or_else(|| match kind {
            Service::EnvoyRatelimit => RATELIMIT_IMAGE.into(),
            Service::Counter => COUNTER_IMAGE.into(),
        });
    if kind == Service::Counter && image.starts_with("envoyproxy/ratelimit") {
        r.push(
            "service.image",
            format!(
                "{} is envoyproxy/ratelimit's image, and service.kind is counter: give ratelimit-counter's (make counter-image builds {COUNTER_IMAGE}), or leave service.image out",
                excerpt(&image)
            ),
        );
    }
    let replicas = match m.and_then(|m| m.get("replicas")) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().filter(|n| (1..=1000).contains(n)) {
            Some(n) => u32::try_from(n).ok(),
            None => {
                r.push(
                    "service.replicas",
                    format!("must be a number from 1 to 1000, got {}", describe(v)),
                );
                None
            }
        },
    };
    // The counter's memory store takes one replica: the default then is 1
    // (set once `redis` is read).
    let replicas = replicas.unwrap_or(0);
    let tls = service_tls(r, m.and_then(|m| m.get("tls")), kind, target, kube);
    RateLimitService {
        kind,
        name,
        port,
        image,
        replicas,
        tls,
    }
}

/// The keys of a TLS section that are file paths, and those that name a
/// Kubernetes Secret: a VM takes the first, Kubernetes the second.
const SERVICE_TLS_FILES: &[&str] = &[
    "cert",
    "key",
    "client_ca",
    "ca",
    "client_cert",
    "client_key",
];
const SERVICE_TLS_SECRETS: &[&str] = &["server_secret", "client_secret", "mutual"];

/// `true`/`false` at `path` (None when not given).
fn boolean(
    r: &mut Reader<'_>,
    m: Option<&Map<String, Value>>,
    path: &str,
    key: &str,
) -> Option<bool> {
    match m?.get(key)? {
        Value::Bool(b) => Some(*b),
        Value::Null => None,
        other => {
            r.push(
                &join(path, key),
                format!("must be true or false, got {}", describe(other)),
            );
            None
        }
    }
}

/// Keys of `m` that this kind of place does not take: on Kubernetes the
/// certificates come from Secrets, on a VM from files.
fn misplaced(r: &mut Reader<'_>, m: &Map<String, Value>, path: &str, keys: &[&str], why: &str) {
    for k in keys {
        if m.get(*k).is_some_and(|v| !v.is_null()) {
            r.push(&join(path, k), why);
        }
    }
}

/// `service.tls`: on Kubernetes two Secrets (the service's, Envoy's) and
/// `mutual`; on a VM the files. Every half-given pair is refused, naming
/// the missing half.
fn service_tls(
    r: &mut Reader<'_>,
    v: Option<&Value>,
    kind: Service,
    target: Target,
    kube: bool,
) -> Option<ServiceTls> {
    let path = "service.tls";
    let m = r.object(v, path, SERVICE_TLS_KEYS)?;
    if target == Target::Istio {
        r.push(
            path,
            "under Istio the mesh's mutual TLS covers the hop from the sidecar to the service (render writes a PeerAuthentication STRICT for the service's pods: peerauthentication.yaml); leave service.tls out",
        );
        return None;
    }
    let sni = r.string(Some(m), path, "sni");
    let client_sans = match m.get("client_sans") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(|x| x.as_str().is_some_and(|s| !s.is_empty())) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        Some(other) => {
            r.push(
                "service.tls.client_sans",
                format!(
                    "must be a list of client names (DNS names or IP addresses), got {}",
                    describe(other)
                ),
            );
            Vec::new()
        }
    };
    if kind == Service::EnvoyRatelimit && client_sans.len() > 1 {
        r.push(
            "service.tls.client_sans",
            "envoyproxy/ratelimit accepts one client name (GRPC_CLIENT_TLS_SAN): give one",
        );
    }
    let tls = if kube {
        misplaced(
            r,
            m,
            path,
            SERVICE_TLS_FILES,
            "a file path: on Kubernetes the certificates come from Secrets (service.tls.server_secret, mounted in the service's pods; service.tls.client_secret, mounted in Envoy's; each with tls.crt, tls.key, ca.crt)",
        );
        let server = r.string(Some(m), path, "server_secret");
        let server = r.require(
            server,
            "service.tls.server_secret",
            "the Secret of the service's certificate (tls.crt, tls.key; ca.crt: the CA of Envoy's certificate, for mutual TLS)",
        );
        let client = r.string(Some(m), path, "client_secret");
        let client = r.require(
            client,
            "service.tls.client_secret",
            "the Secret mounted in Envoy's pods (ca.crt: the CA of the service's certificate; tls.crt, tls.key: Envoy's certificate, for mutual TLS)",
        );
        let mutual = boolean(r, Some(m), path, "mutual").unwrap_or(true);
        let (server, client) = (server?, client?);
        let file = |dir: &str, f: &str| format!("{dir}/{f}");
        ServiceTls {
            cert: file(SERVICE_TLS_DIR, "tls.crt"),
            key: file(SERVICE_TLS_DIR, "tls.key"),
            client_ca: mutual.then(|| file(SERVICE_TLS_DIR, "ca.crt")),
            ca: file(CLIENT_TLS_DIR, "ca.crt"),
            client_cert: mutual.then(|| {
                (
                    file(CLIENT_TLS_DIR, "tls.crt"),
                    file(CLIENT_TLS_DIR, "tls.key"),
                )
            }),
            sni,
            client_sans,
            server_secret: Some(server),
            client_secret: Some(client),
        }
    } else {
        misplaced(
            r,
            m,
            path,
            SERVICE_TLS_SECRETS,
            "a Kubernetes setting, and render writes for a VM here (no namespace): give the files (service.tls.cert, key, ca; for mutual TLS client_ca, client_cert, client_key)",
        );
        let cert = r.string(Some(m), path, "cert");
        let cert = r.require(
            cert,
            "service.tls.cert",
            "the service's certificate chain (PEM)",
        );
        let key = r.string(Some(m), path, "key");
        let key = r.require(
            key,
            "service.tls.key",
            "the private key of service.tls.cert (PEM)",
        );
        let ca = r.string(Some(m), path, "ca");
        let ca = r.require(
            ca,
            "service.tls.ca",
            "the CA (PEM) Envoy checks the service's certificate with",
        );
        let client_ca = r.string(Some(m), path, "client_ca");
        let client_cert = r.string(Some(m), path, "client_cert");
        let client_key = r.string(Some(m), path, "client_key");
        let pair = match (client_cert, client_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (Some(_), None) => {
                r.push(
                    "service.tls.client_key",
                    "missing: the private key of service.tls.client_cert (PEM)",
                );
                None
            }
            (None, Some(_)) => {
                r.push(
                    "service.tls.client_cert",
                    "missing: the certificate of service.tls.client_key (PEM)",
                );
                None
            }
            (None, None) => None,
        };
        match (&client_ca, &pair) {
            (Some(_), None) if !m.contains_key("client_cert") && !m.contains_key("client_key") => {
                r.push(
                    "service.tls.client_cert",
                    "missing: with service.tls.client_ca the service refuses a client without a certificate that CA signed: give Envoy's (service.tls.client_cert and service.tls.client_key)",
                )
            }
            (None, Some(_)) => r.push(
                "service.tls.client_ca",
                "missing: Envoy would send service.tls.client_cert to a service that asks for none: give the CA that signed it (the service then requires it)",
            ),
            _ => {}
        }
        if !client_sans.is_empty() && client_ca.is_none() {
            r.push(
                "service.tls.client_sans",
                "needs mutual TLS (service.tls.client_ca): without a client certificate there is no client name to check",
            );
        }
        let (cert, key, ca) = (cert?, key?, ca?);
        ServiceTls {
            cert,
            key,
            client_ca,
            ca,
            client_cert: pair,
            sni,
            client_sans,
            server_secret: None,
            client_secret: None,
        }
    };
    if kube && tls.client_ca.is_none() && !tls.client_sans.is_empty() {
        r.push(
            "service.tls.client_sans",
            "needs mutual TLS (service.tls.mutual: true): without a client certificate there is no client name to check",
        );
    }
    Some(tls)
}

/// The counter serves a domain from the file `<domain>.json` of its
/// ConfigMap: the domain must be a ConfigMap key.
pub(super) fn counter_domain(r: &mut Reader<'_>, domain: Option<&str>) {
    let Some(d) = domain else { return };
    if !d
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        r.push(
            "domain",
            format!(
                "{}: the counter reads the team file of a domain from <domain>.json in a ConfigMap, whose keys take letters, digits, '-', '_' and '.' only",
                excerpt(d)
            ),
        );
    }
}

/// `redis:`: the URL (which `kind` of service takes which form), the
/// password's Secret, the image.
pub(super) fn redis(
    r: &mut Reader<'_>,
    v: Option<&Value>,
    kind: Service,
    target: Target,
    kube: bool,
) -> Redis {
    let m = r.object(v, "redis", REDIS_KEYS);
    let url = r.string(m, "redis", "url");
    match (&url, kind) {
        (Some(u), Service::EnvoyRatelimit) if u == MEMORY_STORE => r.push(
            "redis.url",
            format!(
                "{} is for the counter (service.kind: counter); envoyproxy/ratelimit takes host:port",
                excerpt(u)
            ),
        ),
        (Some(u), _) if u.contains("://") && redis_scheme(u).is_none() => r.push(
            "redis.url",
            format!(
                "{}: the scheme must be one of {}",
                excerpt(u),
                REDIS_SCHEMES.join(", ")
            ),
        ),
        (Some(u), Service::Counter) if u == MEMORY_STORE && target == Target::Envoy && kube => {
            r.push(
                "redis.url",
                "memory: each replica of the sidecar Deployment would count alone; give a Redis every replica shares",
            )
        }
        _ => {}
    }
    let auth = secret_ref(
        r,
        m.and_then(|m| m.get("auth_secret")),
        "redis.auth_secret",
        "the name of the Secret holding the Redis password",
        "password",
    );
    let image = r
        .string(m, "redis", "image")
        .unwrap_or_else(|| REDIS_IMAGE.into());
    let tls = redis_tls(r, m.and_then(|m| m.get("tls")), kube);
    match (url.as_deref(), &tls) {
        (None, Some(_)) => r.push(
            "redis.tls",
            "the Redis render writes serves no TLS: give redis.url, a Redis of your own that does",
        ),
        (Some(MEMORY_STORE), Some(_)) => r.push(
            "redis.tls",
            "redis.url is memory: there is no Redis to reach over TLS",
        ),
        (Some(u), None) if redis_scheme(u).is_some_and(|(_, tls)| tls) => r.push(
            "redis.url",
            format!(
                "{} is Redis over TLS, and redis.tls is not set: the service would not reach it; set redis.tls (true: Redis's certificate checked against the system's CAs; or its CA: {})",
                excerpt(u),
                if kube { "redis.tls.secret, a Secret with ca.crt" } else { "redis.tls.ca, a file" }
            ),
        ),
        (Some(u), Some(_)) if redis_scheme(u).is_some_and(|(_, tls)| !tls) => r.push(
            "redis.tls",
            format!(
                "redis.url {} is plaintext: write it rediss://…, rediss-cluster://… or rediss-sentinel://… for TLS",
                excerpt(u)
            ),
        ),
        _ => {}
    }
    Redis {
        url,
        auth,
        image,
        tls,
    }
}

/// The forms of `redis.url` with a scheme: what the counter's `--store`
/// takes (and `render` turns into envoyproxy/ratelimit's REDIS_TYPE and
/// REDIS_URL).
pub const REDIS_SCHEMES: &[&str] = &[
    "redis://",
    "rediss://",
    "redis-cluster://",
    "rediss-cluster://",
    "redis-sentinel://",
    "rediss-sentinel://",
];

/// A URL's scheme without `s` (`redis`, `redis-cluster`, `redis-sentinel`),
/// and whether it is TLS; None for another scheme or none.
pub fn redis_scheme(url: &str) -> Option<(&'static str, bool)> {
    let (scheme, _) = url.split_once("://")?;
    Some(match scheme {
        "redis" => ("redis", false),
        "rediss" => ("redis", true),
        "redis-cluster" => ("redis-cluster", false),
        "rediss-cluster" => ("redis-cluster", true),
        "redis-sentinel" => ("redis-sentinel", false),
        "rediss-sentinel" => ("redis-sentinel", true),
        _ => return None,
    })
}

/// `redis.tls`: `true` (the system's CAs), or its CA, client certificate
/// and key (files on a VM; on Kubernetes a Secret mounted in the service's
/// pods: `ca.crt`, and with `mutual`, `tls.crt` and `tls.key`).
fn redis_tls(r: &mut Reader<'_>, v: Option<&Value>, kube: bool) -> Option<RedisTls> {
    let path = "redis.tls";
    let m = match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return None,
        Some(Value::Bool(true)) => return Some(RedisTls::default()),
        other => r.object(other, path, REDIS_TLS_KEYS)?,
    };
    let insecure_skip_verify = boolean(r, Some(m), path, "insecure_skip_verify").unwrap_or(false);
    if kube {
        misplaced(
            r,
            m,
            path,
            &["ca", "cert", "key"],
            "a file path: on Kubernetes Redis's certificates come from a Secret (redis.tls.secret: ca.crt; with redis.tls.mutual, tls.crt and tls.key), mounted in the service's pods",
        );
        let secret = r.string(Some(m), path, "secret");
        let mutual = boolean(r, Some(m), path, "mutual").unwrap_or(false);
        if mutual && secret.is_none() {
            r.push(
                "redis.tls.secret",
                "missing: redis.tls.mutual needs the Secret holding the service's certificate (tls.crt, tls.key)",
            );
        }
        let file = |f: &str| format!("{REDIS_TLS_DIR}/{f}");
        return Some(RedisTls {
            ca: secret.as_ref().map(|_| file("ca.crt")),
            client_cert: (mutual && secret.is_some()).then(|| (file("tls.crt"), file("tls.key"))),
            insecure_skip_verify,
            secret,
        });
    }
    misplaced(
        r,
        m,
        path,
        &["secret", "mutual"],
        "a Kubernetes setting, and render writes for a VM here (no namespace): give the files (redis.tls.ca; for mutual TLS redis.tls.cert and redis.tls.key)",
    );
    let ca = r.string(Some(m), path, "ca");
    let cert = r.string(Some(m), path, "cert");
    let key = r.string(Some(m), path, "key");
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (Some(_), None) => {
            r.push(
                "redis.tls.key",
                "missing: the private key of redis.tls.cert (PEM)",
            );
            None
        }
        (None, Some(_)) => {
            r.push(
                "redis.tls.cert",
                "missing: the certificate of redis.tls.key (PEM)",
            );
            None
        }
        (None, None) => None,
    };
    Some(RedisTls {
        ca,
        client_cert,
        insecure_skip_verify,
        secret: None,
    })
}

/// A `{name, key}` mapping at `path`: `name` required (`what` says what
/// the Secret holds), `key` by default `default_key`.
fn secret_ref(
    r: &mut Reader<'_>,
    v: Option<&Value>,
    path: &str,
    what: &str,
    default_key: &str,
) -> Option<SecretRef> {
    let s = r.object(v, path, SECRET_KEYS)?;
    let name = r.string(Some(s), path, "name");
    let name = r.require(name, &join(path, "name"), what)?;
    let key = r
        .string(Some(s), path, "key")
        .unwrap_or_else(|| default_key.into());
    Some(SecretRef { name, key })
}

/// `workload:`: name, labels (by default `app: <name>`), image; what
/// `target` needs of it is required.
pub(super) fn workload(
    r: &mut Reader<'_>,
    v: Option<&Value>,
    target: Target,
    kube: bool,
) -> Workload {
    let m = r.object(v, "workload", WORKLOAD_KEYS);
    let name = r.string(m, "workload", "name");
    let labels = match m.and_then(|w| w.get("labels")) {
        Some(Value::Object(m)) if !m.is_empty() => m
            .iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k.clone(), s.clone())),
                other => {
                    r.push(
                        &join("workload.labels", k),
                        format!("must be a string, got {}", describe(other)),
                    );
                    None
                }
            })
            .collect(),
        None | Some(Value::Null) => name
            .iter()
            .map(|n| ("app".to_string(), n.clone()))
            .collect(),
        Some(other) => {
            r.push(
                "workload.labels",
                format!("must be a mapping of labels, got {}", describe(other)),
            );
            Vec::new()
        }
    };
    let image = r.string(m, "workload", "image");
    match target {
        Target::Istio => {
            r.require(
                name.as_ref(),
                "workload.name",
                "the workload the filter runs in front of (its pods get the WasmPlugin and the stats annotation) (workload: name: or --set workload.name=NAME)",
            );
        }
        Target::Envoy if kube => {
            r.require(
                name.as_ref(),
                "workload.name",
                "the Deployment of the application Envoy runs in front of (workload: name: or --set workload.name=NAME)",
            );
            r.require(
                image.as_ref(),
                "workload.image",
                "the application's container image (the sidecar Deployment runs it beside Envoy) (workload: image: or --set workload.image=IMAGE)",
            );
        }
        _ => {}
    }
    Workload {
        name,
        labels,
        image,
    }
}

/// `istio:`: phase, mode, name, priority.
pub(super) fn istio(r: &mut Reader<'_>, v: Option<&Value>) -> Istio {
    let m = r.object(v, "istio", ISTIO_KEYS);
    let phase = r.string(m, "istio", "phase");
    // After Istio's authorization: the client's own tenant header never
    // reaches the filter on a request an AuthorizationPolicy refuses
    // (docs/security.md).
    let phase = one_of(
        r,
        phase,
        "istio.phase",
        &IstioPhase::ALL,
        IstioPhase::name,
        "",
    )
    .unwrap_or(IstioPhase::Stats);
    let mode = r.string(m, "istio", "mode");
    // A sidecar's inbound only: with no match Istio runs the filter on the
    // workload's outbound listeners too, limiting its own calls.
    let mode = one_of(
        r,
        mode,
        "istio.mode",
        &IstioMode::ALL,
        IstioMode::name,
        " (SERVER: a sidecar's inbound; CLIENT: an ingress gateway)",
    )
    .unwrap_or(IstioMode::Server);
    let name = r
        .string(m, "istio", "name")
        .unwrap_or_else(|| RESOURCE_NAME.into());
    if !dns_label(&name) {
        r.push(
            "istio.name",
            format!(
                "{} is not a Kubernetes name (lowercase letters, digits, '-')",
                excerpt(&name)
            ),
        );
    }
    let priority = match m.and_then(|m| m.get("priority")) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                r.push(
                    "istio.priority",
                    format!(
                        "must be an integer from {} to {} (of two WasmPlugins in one phase, the higher runs first), got {}",
                        i32::MIN,
                        i32::MAX,
                        describe(v)
                    ),
                );
                None
            }
        },
    };
    Istio {
        phase,
        mode,
        name,
        priority,
    }
}

/// The one of `all` that `given` names (None when it is not given); a
/// name not among them is reported at `path`, with `hint` after the names.
fn one_of<T: Copy>(
    r: &mut Reader<'_>,
    given: Option<String>,
    path: &str,
    all: &[T],
    name: fn(T) -> &'static str,
    hint: &str,
) -> Option<T> {
    let given = given?;
    let found = all.iter().copied().find(|t| name(*t) == given);
    if found.is_none() {
        let names: Vec<&str> = all.iter().map(|t| name(*t)).collect();
        r.push(
            path,
            format!(
                "must be one of {}{hint}, got {}",
                names.join(", "),
                excerpt(&given)
            ),
        );
    }
    found
}

/// `envoy_gateway:`: route and gateway, required for that target.
pub(super) fn envoy_gateway(r: &mut Reader<'_>, v: Option<&Value>, target: Target) -> EnvoyGateway {
    let m = r.object(v, "envoy_gateway", GATEWAY_KEYS);
    let route = r.string(m, "envoy_gateway", "route");
    let gateway = r.string(m, "envoy_gateway", "gateway");
    if target == Target::EnvoyGateway {
        r.require(
            route.as_ref(),
            "envoy_gateway.route",
            "the HTTPRoute the filter runs on",
        );
        r.require(
            gateway.as_ref(),
            "envoy_gateway.gateway",
            "the Gateway whose proxies get the rate-limit cluster (its EnvoyProxy)",
        );
    }
    let proxy_namespace = r
        .string(m, "envoy_gateway", "proxy_namespace")
        .unwrap_or_else(|| "envoy-gateway-system".into());
    EnvoyGateway {
        route,
        gateway,
        proxy_namespace,
    }
}

/// `envoy:`: ports, image, the module's path, the service's address, and
/// the named routes.
pub(super) fn envoy(r: &mut Reader<'_>, v: Option<&Value>) -> Envoy {
    let m = r.object(v, "envoy", ENVOY_KEYS);
    let listen_port = r.port(m, "envoy", "listen_port", 8000);
    let admin_port = r.port(m, "envoy", "admin_port", 9901);
    let app_port = r.port(m, "envoy", "app_port", 8080);
    let image = r
        .string(m, "envoy", "image")
        .unwrap_or_else(|| ENVOY_IMAGE.into());
    let wasm_path = r
        .string(m, "envoy", "wasm_path")
        .unwrap_or_else(|| "/etc/envoy-wasm/plugin.wasm".into());
    let service_address = r
        .string(m, "envoy", "service_address")
        .unwrap_or_else(|| "127.0.0.1".into());
    let routes = envoy_routes(r, m.and_then(|e| e.get("routes")));
    Envoy {
        listen_port,
        admin_port,
        app_port,
        image,
        wasm_path,
        service_address,
        routes,
    }
}

/// Plain Envoy: Envoy, the app and the rate-limit service share one
/// machine (or one pod): every port `render` has them listen on must be
/// its own. A clash is refused, naming both settings.
fn distinct_ports(
    r: &mut Reader<'_>,
    envoy: &Envoy,
    service: &RateLimitService,
    monitoring: Option<&Monitoring>,
    kube: bool,
) {
    let mut ports: Vec<(String, u32)> = vec![
        ("envoy.listen_port".into(), envoy.listen_port),
        ("envoy.admin_port".into(), envoy.admin_port),
        ("envoy.app_port".into(), envoy.app_port),
        ("service.port".into(), service.port),
    ];
    if let Some(m) = monitoring {
        ports.push(("monitoring.envoy_metrics_port".into(), m.envoy_metrics_port));
    }
    match service.kind {
        Service::Counter => ports.push((
            format!("the counter's HTTP port ({COUNTER_HTTP_PORT}: /readyz, /metrics)"),
            COUNTER_HTTP_PORT,
        )),
        Service::EnvoyRatelimit if kube => {
            ports.push(("envoyproxy/ratelimit's HTTP port (8090)".into(), 8090));
            ports.push(("envoyproxy/ratelimit's debug port (6070)".into(), 6070));
            if monitoring.is_some() {
                ports.push((
                    format!("envoyproxy/ratelimit's metrics port ({SERVICE_METRICS_PORT})"),
                    SERVICE_METRICS_PORT,
                ));
            }
        }
        Service::EnvoyRatelimit => {}
    }
    for (i, (field, port)) in ports.iter().enumerate() {
        if let Some((other, _)) = ports.iter().take(i).find(|(_, p)| p == port) {
            // Blame a setting, not a fixed port.
            let path = if field.contains(' ') { other } else { field };
            r.push(
                path,
                format!("port {port} is both {other} and {field}: every port render has listen beside Envoy must be its own"),
            );
        }
    }
}

/// `envoy.routes`: route name → path prefix.
fn envoy_routes(r: &mut Reader<'_>, v: Option<&Value>) -> Vec<(String, String)> {
    match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => {
            let mut routes = Vec::new();
            for (name, prefix) in m {
                match prefix.as_str() {
                    Some(p) if p.starts_with('/') && !name.is_empty() => {
                        routes.push((name.clone(), p.to_string()));
                    }
                    _ => r.push(
                        &join("envoy.routes", name),
                        format!(
                            "must be the route's path prefix, starting with '/', got {}",
                            describe(prefix)
                        ),
                    ),
                }
            }
            routes
        }
        Some(other) => {
            r.push(
                "envoy.routes",
                format!(
                    "must be a mapping of route name to path prefix (e.g. {{export: /export}}), got {}",
                    describe(other)
                ),
            );
            Vec::new()
        }
    }
}

/// `plugin:`: the filter's settings, but none that `render` sets itself.
pub(super) fn plugin(r: &mut Reader<'_>, v: Option<&Value>) -> Map<String, Value> {
    let plugin = match v {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            r.push(
                "plugin",
                format!(
                    "must be a mapping of plugin settings, got {}",
                    describe(other)
                ),
            );
            Map::new()
        }
    };
    for (key, why) in [
        ("domain", "it is the description's domain"),
        ("limits", "it is the team file"),
    ] {
        if plugin.contains_key(key) {
            r.push(&join("plugin", key), format!("set by render: {why}"));
        }
    }
    let service = plugin.get("rate_limit_service").and_then(Value::as_object);
    if service.is_some_and(|s| s.contains_key("service")) {
        r.push(
            "plugin.rate_limit_service.service",
            "set by render: the service it deploys (service.kind, or --service)",
        );
    }
    if service.is_some_and(|s| s.contains_key("cluster")) {
        r.push(
            "plugin.rate_limit_service.cluster",
            "set by render: the rate-limit cluster of the target (from service, namespace and cluster_domain)",
        );
    }
    plugin
}

/// `monitoring:`: None unless `prometheus_operator` is true.
pub(super) fn monitoring(
    r: &mut Reader<'_>,
    top: Option<&Map<String, Value>>,
) -> Option<Monitoring> {
    let m = r.object(
        top.and_then(|t| t.get("monitoring")),
        "monitoring",
        MONITORING_KEYS,
    );
    let on = match m.and_then(|m| m.get("prometheus_operator")) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            r.push(
                "monitoring.prometheus_operator",
                format!("must be true or false, got {}", describe(other)),
            );
            false
        }
    };
    let namespace = r
        .string(m, "monitoring", "prometheus_namespace")
        .unwrap_or_else(|| "monitoring".into());
    if !dns_label(&namespace) {
        r.push(
            "monitoring.prometheus_namespace",
            format!(
                "{} is not a Kubernetes namespace name (lowercase letters, digits, '-')",
                excerpt(&namespace)
            ),
        );
    }
    let port = r.port(m, "monitoring", "envoy_metrics_port", 9902);
    on.then_some(Monitoring {
        prometheus_namespace: namespace,
        envoy_metrics_port: port,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]
mod monitoring_tests {
    use super::super::read_description;
    use super::*;

    fn read(text: &str) -> Result<Deployment, Vec<DescriptionError>> {
        let (v, sources) = read_description("deployment.yaml", text).unwrap();
        deployment(&v, &sources, Target::Envoy)
    }

    #[test]
    fn monitoring_is_off_unless_the_operator_is_named() {
        assert_eq!(read("domain: d\n").unwrap().monitoring, None);
        let off = read("domain: d\nmonitoring: {prometheus_operator: false}\n").unwrap();
        assert_eq!(off.monitoring, None);
        let on = read("domain: d\nmonitoring: {prometheus_operator: true}\n").unwrap();
        assert_eq!(
            on.monitoring,
            Some(Monitoring {
                prometheus_namespace: "monitoring".into(),
                envoy_metrics_port: 9902
            })
        );
    }

    #[test]
    fn a_bad_monitoring_setting_names_its_line_and_field() {
        let text = "domain: d\nmonitoring:\n  prometheus_operator: \"yes\"\n  prometheus_namespace: Obs\n  envoy_metrics_port: 0\n  interval: 30s\n";
        let errors: Vec<String> = read(text)
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect();
        let all = errors.join("\n");
        for want in [
            "deployment.yaml:3:24: monitoring.prometheus_operator: must be true or false, got string \"yes\"",
            "deployment.yaml:4:25: monitoring.prometheus_namespace: \"Obs\" is not a Kubernetes namespace name",
            "deployment.yaml:5:23: monitoring.envoy_metrics_port: must be a port from 1 to 65535",
            "monitoring.interval: unknown key",
        ] {
            assert!(all.contains(want), "{want}\nnot in\n{all}");
        }
    }
}
