//! The filter's plugin configuration: the JSON that Envoy hands to the wasm
//! filter (`configuration`), parsed and validated once per VM. Unknown keys
//! are errors, never silent defaults.

use serde_json::{Map, Value};

use crate::json_text::duplicate_keys;
use crate::model::{Group, TeamLimits, Unit};
use crate::validate::{
    describe, excerpt, header_name_problem, join, parse_team_limits, positive_u32, starts_with_bom,
    ConfigError, Errors, Warning, BOM_MESSAGE,
};

// Every default of the plugin configuration, written once: the parser
// takes them for a key left out, `generate` writes them out, and the CLI's
// flags default to them.
pub const DEFAULT_TIMEOUT_MS: u32 = 20;
pub const DEFAULT_FAILURE_MODE_DENY: bool = false;
pub const DEFAULT_STATUS_ON_ERROR: u16 = 500;
pub const DEFAULT_MISSING_TENANT: MissingTenant = MissingTenant::Allow;
pub const DEFAULT_DESCRIPTOR_KEY: &str = "tenant";
pub const DEFAULT_HEADERS: HeaderMode = HeaderMode::DraftVersion03;
pub const DEFAULT_LOCAL_ENABLED: bool = true;
pub const DEFAULT_MODE: Mode = Mode::Exact;
pub const DEFAULT_SHADOW: bool = false;
/// `near_limit_ratio` when it is left out (the rate-limit service's own
/// default), in millionths.
pub const DEFAULT_NEAR_LIMIT_PPM: u32 = 800_000;
/// `near_limit_ratio` is kept in millionths: an integer comparison, so 0.8
/// of 100 is exactly 80.
pub const PPM: u32 = 1_000_000;
/// Slots of the local layer when `local.slots` is not set.
pub const DEFAULT_LOCAL_SLOTS: u32 = 4_096;
/// Longest tenant header value, in bytes, when `max_tenant_length` is not
/// set: a longer one is refused with 431 and never reaches the service.
pub const DEFAULT_MAX_TENANT_LENGTH: u32 = 128;
/// The most `max_tenant_length` may be (Envoy's own default header limit is
/// 60 KiB; no tenant needs more than this).
pub const MAX_MAX_TENANT_LENGTH: u32 = 4_096;
pub const MAX_TIMEOUT_MS: u32 = 60_000;
/// The most slots `local.slots` may ask for (about 320 MiB of shared data).
pub const MAX_LOCAL_SLOTS: u32 = 1_048_576;
/// The largest cost a request may carry when `cost_header` is set and
/// `max_cost` is not.
pub const DEFAULT_MAX_COST: u32 = 1_000;
/// The most `max_cost` may be.
pub const MAX_MAX_COST: u32 = 1_000_000;
/// The most tokens one lease reserves when `local.lease.max_batch` is not
/// set (the batch is about one second of the Envoy's own rate, at most this).
pub const DEFAULT_LEASE_MAX_BATCH: u32 = 100;
/// The most `local.lease.max_batch` may be.
pub const MAX_LEASE_MAX_BATCH: u32 = 100_000;
/// How often each worker's root context sends the lease refills its
/// requests asked for (the period of `on_tick`), in milliseconds.
pub const LEASE_TICK_MS: u32 = 20;
/// How often sync mode pushes each active tenant's unsynced hits
/// (`local.sync.interval_ms`), and the range it may be set in.
pub const DEFAULT_SYNC_INTERVAL_MS: u32 = 100;
pub const MIN_SYNC_INTERVAL_MS: u32 = 10;
pub const MAX_SYNC_INTERVAL_MS: u32 = 60_000;
/// The most hits of one tenant an Envoy admits without the service having
/// seen them (`local.sync.max_unsynced`); past it, requests ask the service
/// one by one until the next sync. The overshoot bound scales with it.
pub const DEFAULT_SYNC_MAX_UNSYNCED: u32 = 1_000;
pub const MAX_SYNC_MAX_UNSYNCED: u32 = 1_000_000;

/// An option whose value is one of a few names.
trait Named: Copy + 'static {
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
}

/// What to do with a request that carries no tenant header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum MissingTenant {
    /// Not limited (the behaviour of Envoy's own `request_headers` action).
    Allow,
    /// Answered 429.
    Deny,
}

impl Named for MissingTenant {
    const ALL: &'static [Self] = &[MissingTenant::Allow, MissingTenant::Deny];
    fn name(self) -> &'static str {
        match self {
            MissingTenant::Allow => "allow",
            MissingTenant::Deny => "deny",
        }
    }
}

/// Which rate-limit headers the filter adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum HeaderMode {
    /// `X-RateLimit-*` as Envoy's `DRAFT_VERSION_03`, plus `Retry-After` on 429.
    DraftVersion03,
    /// Only `Retry-After` on 429.
    Off,
    /// `RateLimit-Policy` and `RateLimit` of
    /// draft-ietf-httpapi-ratelimit-headers-10, plus `Retry-After` on 429.
    IetfDraft10,
}

impl Named for HeaderMode {
    const ALL: &'static [Self] = &[
        HeaderMode::DraftVersion03,
        HeaderMode::Off,
        HeaderMode::IetfDraft10,
    ];
    fn name(self) -> &'static str {
        match self {
            HeaderMode::DraftVersion03 => "draft_version_03",
            HeaderMode::Off => "off",
            HeaderMode::IetfDraft10 => "ietf_draft_10",
        }
    }
}

/// How a group's limits are enforced across the fleet (`local.mode`, and
/// per group `local.groups.<group>.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "cli",
    derive(serde::Serialize),
    serde(into = "&'static str")
)]
pub enum Mode {
    /// One call to the rate-limit service per admitted request: exact.
    Exact,
    /// Tokens reserved from the service in batches and spent locally: never
    /// over the limit, may strand tokens (undershoot).
    Lease,
    /// Counted locally and pushed to the service every sync interval: may
    /// overshoot by what the fleet admits in one interval.
    Sync,
}

impl Named for Mode {
    const ALL: &'static [Self] = &[Mode::Exact, Mode::Lease, Mode::Sync];
    fn name(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Lease => "lease",
            Mode::Sync => "sync",
        }
    }
}

impl Mode {
    /// The name in the configuration (`"exact"`, `"lease"`, `"sync"`).
    pub fn as_str(self) -> &'static str {
        self.name()
    }
}

impl From<Mode> for &'static str {
    fn from(m: Mode) -> &'static str {
        m.name()
    }
}

impl From<MissingTenant> for &'static str {
    fn from(m: MissingTenant) -> &'static str {
        m.name()
    }
}

impl From<HeaderMode> for &'static str {
    fn from(h: HeaderMode) -> &'static str {
        h.name()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    pub domain: String,
    pub limits: TeamLimits,
    pub cluster: String,
    pub timeout_ms: u32,
    pub failure_mode_deny: bool,
    pub status_on_error: u16,
    pub missing_tenant: MissingTenant,
    /// A tenant header value longer than this many bytes is refused (431).
    pub max_tenant_length: u32,
    pub descriptor_key: String,
    pub headers: HeaderMode,
    pub local: LocalConfig,
    /// `"shadow": true`: every group's refusals are counted, never enforced
    /// (a group's own `"shadow": true` shadows only that group).
    pub shadow: bool,
    /// `near_limit_ratio` in millionths (0 < r <= 1): an admitted request
    /// that leaves at most `1 - r` of a window's limit is near the limit.
    pub near_limit_ppm: u32,
    /// Request cost (`cost_header`, `max_cost`): None, every request costs 1.
    pub cost: Option<CostConfig>,
}

impl PluginConfig {
    /// Whether `group`'s refusals are only counted: the global `shadow`, or
    /// the group's own.
    pub fn shadowed(&self, group: &Group) -> bool {
        self.shadow || group.shadow
    }
}

/// Request cost: a request carrying `header` costs that many hits (an
/// integer from 1 to `max`); without it, 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostConfig {
    /// The request header (lowercase) that carries the cost.
    pub header: String,
    /// The largest cost accepted; a larger one is refused (400).
    pub max: u32,
}

/// A token bucket's parameters: refill rate and capacity, in requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketParams {
    pub tokens_per_second: u32,
    pub burst: u32,
}

/// The local layer (`local`): a token bucket and an over-limit cache per
/// tenant, in proxy-wasm shared data, in front of the rate-limit service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalConfig {
    pub enabled: bool,
    /// Shared-data slots; tenants hash into them, a newcomer takes a slot over.
    pub slots: u32,
    /// The mode of every group that does not set its own (`local.mode`).
    pub mode: Mode,
    /// Per-group settings (`local.groups.<group>`), by group name.
    pub groups: Vec<(String, GroupLocal)>,
    /// The most tokens one lease reserves (`local.lease.max_batch`).
    pub lease_max_batch: u32,
    /// `local.sync.interval_ms`.
    pub sync_interval_ms: u32,
    /// `local.sync.max_unsynced`.
    pub sync_max_unsynced: u32,
}

/// One group's `local.groups.<group>` entry: each key is optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupLocal {
    /// Its own bucket (`tokens_per_second`, `burst`).
    pub bucket: Option<BucketParams>,
    /// Its own mode.
    pub mode: Option<Mode>,
}

impl Default for LocalConfig {
    fn default() -> LocalConfig {
        LocalConfig {
            enabled: DEFAULT_LOCAL_ENABLED,
            slots: DEFAULT_LOCAL_SLOTS,
            mode: DEFAULT_MODE,
            groups: Vec::new(),
            lease_max_batch: DEFAULT_LEASE_MAX_BATCH,
            sync_interval_ms: DEFAULT_SYNC_INTERVAL_MS,
            sync_max_unsynced: DEFAULT_SYNC_MAX_UNSYNCED,
        }
    }
}

impl LocalConfig {
    /// A group's `local.groups` entry, if it has one.
    pub fn group(&self, name: &str) -> Option<&GroupLocal> {
        self.groups.iter().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// The mode of a group: its own, else `local.mode`. Always `Exact`
    /// when the local layer is off (lease and sync keep their state in it;
    /// the parser refuses another mode there).
    pub fn mode_for(&self, group: &Group) -> Mode {
        if !self.enabled {
            return Mode::Exact;
        }
        self.group(&group.name)
            .and_then(|g| g.mode)
            .unwrap_or(self.mode)
    }

    /// The bucket of a group: its own `local.groups` entry, else its
    /// per-second limit as both rate and burst, else none (a group without
    /// a per-second limit has no bucket unless it sets one).
    pub fn bucket_for(&self, group: &Group) -> Option<BucketParams> {
        if !self.enabled {
            return None;
        }
        if let Some(p) = self.group(&group.name).and_then(|g| g.bucket) {
            return Some(p);
        }
        group.limits.get(Unit::Second).map(|n| BucketParams {
            tokens_per_second: n,
            burst: n,
        })
    }
}

const KEYS: &[&str] = &[
    "domain",
    "limits",
    "rate_limit_service",
    "failure_mode_deny",
    "status_on_error",
    "missing_tenant",
    "max_tenant_length",
    "descriptor_key",
    "headers",
    "local",
    "shadow",
    "near_limit_ratio",
    "cost_header",
    "max_cost",
];
const LOCAL_KEYS: &[&str] = &["enabled", "slots", "mode", "groups", "lease", "sync"];
const LEASE_KEYS: &[&str] = &["max_batch"];
const SYNC_KEYS: &[&str] = &["interval_ms", "max_unsynced"];
const GROUP_LOCAL_KEYS: &[&str] = &["tokens_per_second", "burst", "mode"];
const SERVICE_KEYS: &[&str] = &["cluster", "timeout_ms"];

fn unknown_key(errors: &mut Errors, path: String, key: &str, allowed: &[&str]) {
    errors.push(
        path,
        format!(
            "unknown key {}, expected one of {}",
            excerpt(key),
            allowed.join(", ")
        ),
    );
}

fn non_empty_string(v: &Value, path: &str, errors: &mut Errors) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::String(_) => {
            errors.push(path, "must not be empty");
            None
        }
        other => {
            errors.push(path, format!("must be a string, got {}", describe(other)));
            None
        }
    }
}

fn boolean(v: &Value, path: &str, errors: &mut Errors) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        other => {
            errors.push(
                path,
                format!("must be true or false, got {}", describe(other)),
            );
            None
        }
    }
}

fn one_of<T: Named>(v: &Value, path: &str, errors: &mut Errors) -> Option<T> {
    let found = v
        .as_str()
        .and_then(|s| T::ALL.iter().copied().find(|t| t.name() == s));
    if found.is_none() {
        let names: Vec<String> = T::ALL.iter().map(|t| format!("{:?}", t.name())).collect();
        errors.push(
            path,
            format!("must be one of {}, got {}", names.join(", "), describe(v)),
        );
    }
    found
}

/// The value of an optional key: its default when it is left out, and also
/// when it is invalid (the error is recorded, and no configuration is built).
fn or_default<T>(v: Option<&Value>, default: T, parse: impl FnOnce(&Value) -> Option<T>) -> T {
    v.and_then(parse).unwrap_or(default)
}

/// Parses the plugin configuration. On success also returns the warnings of
/// its team limits.
pub fn parse_plugin_config(bytes: &[u8]) -> Result<(PluginConfig, Vec<Warning>), Vec<ConfigError>> {
    if starts_with_bom(bytes) {
        return Err(vec![ConfigError {
            path: String::new(),
            message: BOM_MESSAGE.into(),
        }]);
    }
    let doc: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            return Err(vec![ConfigError {
                path: String::new(),
                message: format!("not valid JSON: {e}"),
            }])
        }
    };
    let Value::Object(obj) = &doc else {
        return Err(vec![ConfigError {
            path: String::new(),
            message: format!("must be a JSON object, got {}", describe(&doc)),
        }]);
    };
    let mut errors = Errors::default();
    // serde_json keeps the last of two equal keys without a word: a group
    // pasted twice would silently replace the first. The text says where.
    // (It parsed as JSON, so it is UTF-8.)
    if let Ok(text) = std::str::from_utf8(bytes) {
        for d in duplicate_keys(text) {
            errors.push(d.path.clone(), d.message(true));
        }
    }
    check_keys(obj, "", KEYS, &mut errors);
    let get = |k: &str| obj.get(k);

    let domain = match get("domain") {
        Some(v) => non_empty_string(v, "domain", &mut errors),
        None => {
            errors.push(
                "domain",
                "missing: the rate-limit service domain is required",
            );
            None
        }
    };
    let mut warnings = Vec::new();
    let limits = match get("limits") {
        Some(v) => match parse_team_limits(v, "limits") {
            Ok((l, w)) => {
                warnings = w;
                Some(l)
            }
            Err(e) => {
                errors.0.extend(e);
                None
            }
        },
        None => {
            errors.push("limits", "missing: the team limits JSON is required");
            None
        }
    };
    let (cluster, timeout_ms) = rate_limit_service(get("rate_limit_service"), &mut errors);
    let failure_mode_deny = or_default(get("failure_mode_deny"), DEFAULT_FAILURE_MODE_DENY, |v| {
        boolean(v, "failure_mode_deny", &mut errors)
    });
    let status_on_error = or_default(get("status_on_error"), DEFAULT_STATUS_ON_ERROR, |v| match v
        .as_u64()
        .and_then(|n| u16::try_from(n).ok())
    {
        Some(n) if (200..=599).contains(&n) => Some(n),
        _ => {
            errors.push(
                "status_on_error",
                format!(
                    "must be an HTTP status from 200 to 599, got {}",
                    describe(v)
                ),
            );
            None
        }
    });
    let missing_tenant = or_default(get("missing_tenant"), DEFAULT_MISSING_TENANT, |v| {
        one_of(v, "missing_tenant", &mut errors)
    });
    let max_tenant_length = match get("max_tenant_length") {
        None => limits
            .as_ref()
            .map_or(DEFAULT_MAX_TENANT_LENGTH, default_max_tenant_length),
        Some(v) => match positive_u32(v) {
            Ok(n) if n <= MAX_MAX_TENANT_LENGTH => {
                if let Some(limits) = &limits {
                    listed_tenants_fit(limits, n, &mut errors);
                }
                n
            }
            Ok(n) => {
                errors.push(
                    "max_tenant_length",
                    format!("must be at most {MAX_MAX_TENANT_LENGTH} (bytes), got {n}"),
                );
                DEFAULT_MAX_TENANT_LENGTH
            }
            Err(m) => {
                errors.push("max_tenant_length", m);
                DEFAULT_MAX_TENANT_LENGTH
            }
        },
    };
    let descriptor_key = or_default(
        get("descriptor_key"),
        DEFAULT_DESCRIPTOR_KEY.to_string(),
        |v| non_empty_string(v, "descriptor_key", &mut errors),
    );
    let headers = or_default(get("headers"), DEFAULT_HEADERS, |v| {
        one_of(v, "headers", &mut errors)
    });
    let local = local_config(get("local"), limits.as_ref(), &mut errors);
    let shadow = or_default(get("shadow"), DEFAULT_SHADOW, |v| {
        boolean(v, "shadow", &mut errors)
    });
    let near_limit_ppm = or_default(get("near_limit_ratio"), DEFAULT_NEAR_LIMIT_PPM, |v| {
        near_limit_ratio(v, &mut errors)
    });
    let cost = cost_config(
        get("cost_header"),
        get("max_cost"),
        limits.as_ref(),
        &mut errors,
    );

    // Every field was checked, so every problem is reported; build only
    // when there were none.
    match (limits, errors.0.is_empty()) {
        (Some(limits), true) => Ok((
            PluginConfig {
                domain: domain.unwrap_or_default(),
                limits,
                cluster: cluster.unwrap_or_default(),
                timeout_ms,
                failure_mode_deny,
                status_on_error,
                missing_tenant,
                max_tenant_length,
                descriptor_key,
                headers,
                local,
                shadow,
                near_limit_ppm,
                cost,
            },
            warnings,
        )),
        _ => Err(errors.0),
    }
}

/// `near_limit_ratio`: a number with 0 < r <= 1, kept in millionths.
fn near_limit_ratio(v: &Value, errors: &mut Errors) -> Option<u32> {
    let ppm = v
        .as_f64()
        .filter(|r| *r > 0.0 && *r <= 1.0)
        .map(|r| (r * f64::from(PPM)).round())
        // A ratio under half a millionth rounds to 0: refused with the rest.
        .filter(|ppm| *ppm >= 1.0);
    match ppm {
        // In 1..=PPM, so the conversion is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(ppm) => Some(ppm as u32),
        None => {
            errors.push(
                "near_limit_ratio",
                format!(
                    "must be a number greater than 0 and at most 1 (the share of a window's limit used), got {}",
                    describe(v)
                ),
            );
            None
        }
    }
}

/// `max_tenant_length` when it is left out: the default, or the longest
/// tenant value listed in `header_value` when that is longer (a team file may
/// list values up to 256 bytes), so that limits the CLI accepts are never
/// refused by the filter.
pub fn default_max_tenant_length(limits: &TeamLimits) -> u32 {
    let longest = limits
        .groups
        .iter()
        .flat_map(|g| g.tenants.iter())
        .map(String::len)
        .max()
        .unwrap_or(0);
    u32::try_from(longest)
        .unwrap_or(u32::MAX)
        .clamp(DEFAULT_MAX_TENANT_LENGTH, MAX_MAX_TENANT_LENGTH)
}

/// A tenant listed in `header_value` that is longer than `max_tenant_length`
/// could never be served: every request carrying it would be refused (431).
fn listed_tenants_fit(limits: &TeamLimits, max: u32, errors: &mut Errors) {
    let max_len = usize::try_from(max).unwrap_or(usize::MAX);
    for g in &limits.groups {
        for (i, t) in g.tenants.iter().enumerate() {
            if t.len() > max_len {
                let path = join(
                    &join(&join("limits", &limits.header), &g.name),
                    "header_value",
                );
                errors.push(
                    format!("{path}[{i}]"),
                    format!(
                        "tenant value {} is {} bytes, longer than max_tenant_length ({max}): its requests would all be refused with 431; raise max_tenant_length",
                        excerpt(t),
                        t.len()
                    ),
                );
            }
        }
    }
}

/// `cost_header` and `max_cost`: both optional; `max_cost` only with a
/// `cost_header` (alone it would do nothing, which is a mistake to report).
fn cost_config(
    header: Option<&Value>,
    max_value: Option<&Value>,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
) -> Option<CostConfig> {
    let max = match max_value.map(positive_u32) {
        None => Some(DEFAULT_MAX_COST),
        Some(Ok(n)) if n <= MAX_MAX_COST => Some(n),
        Some(Ok(n)) => {
            errors.push(
                "max_cost",
                format!("must be at most {MAX_MAX_COST}, got {n}"),
            );
            None
        }
        Some(Err(m)) => {
            errors.push("max_cost", m);
            None
        }
    };
    let Some(header) = header else {
        if max_value.is_some() {
            errors.push(
                "max_cost",
                "needs cost_header (the request header that carries the cost)",
            );
        }
        return None;
    };
    let name = non_empty_string(header, "cost_header", errors)?;
    if let Some(problem) = header_name_problem(&name) {
        errors.push("cost_header", problem);
        return None;
    }
    if limits.is_some_and(|l| l.header == name) {
        errors.push(
            "cost_header",
            format!(
                "{} is the tenant header; the cost needs a header of its own",
                excerpt(&name)
            ),
        );
        return None;
    }
    Some(CostConfig {
        header: name,
        max: max?,
    })
}

fn rate_limit_service(v: Option<&Value>, errors: &mut Errors) -> (Option<String>, u32) {
    const BASE: &str = "rate_limit_service";
    let Some(v) = v else {
        errors.push(
            BASE,
            "missing: {\"cluster\": <name of the Envoy cluster of the rate-limit service>} is required",
        );
        return (None, DEFAULT_TIMEOUT_MS);
    };
    let Value::Object(obj) = v else {
        errors.push(BASE, format!("must be an object, got {}", describe(v)));
        return (None, DEFAULT_TIMEOUT_MS);
    };
    check_keys(obj, BASE, SERVICE_KEYS, errors);
    let cluster = match obj.get("cluster") {
        Some(c) => non_empty_string(c, &join(BASE, "cluster"), errors),
        None => {
            errors.push(
                join(BASE, "cluster"),
                "missing: the Envoy cluster of the rate-limit service is required",
            );
            None
        }
    };
    let timeout = or_default(
        obj.get("timeout_ms"),
        DEFAULT_TIMEOUT_MS,
        |t| match positive_u32(t) {
            Ok(n) if n <= MAX_TIMEOUT_MS => Some(n),
            Ok(n) => {
                errors.push(
                    join(BASE, "timeout_ms"),
                    format!("must be at most {MAX_TIMEOUT_MS}, got {n}"),
                );
                None
            }
            Err(m) => {
                errors.push(join(BASE, "timeout_ms"), m);
                None
            }
        },
    );
    (cluster, timeout)
}

fn local_config(
    v: Option<&Value>,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
) -> LocalConfig {
    const BASE: &str = "local";
    let mut local = LocalConfig::default();
    let Some(v) = v else {
        return local;
    };
    let Value::Object(obj) = v else {
        errors.push(BASE, format!("must be an object, got {}", describe(v)));
        return local;
    };
    check_keys(obj, BASE, LOCAL_KEYS, errors);
    if let Some(e) = obj.get("enabled") {
        local.enabled = boolean(e, &join(BASE, "enabled"), errors).unwrap_or(DEFAULT_LOCAL_ENABLED);
    }
    if let Some(s) = obj.get("slots") {
        let path = join(BASE, "slots");
        match positive_u32(s) {
            Ok(n) if n <= MAX_LOCAL_SLOTS => local.slots = n,
            Ok(n) => errors.push(path, format!("must be at most {MAX_LOCAL_SLOTS}, got {n}")),
            Err(m) => errors.push(path, m),
        }
    }
    if let Some(m) = obj.get("mode") {
        let path = join(BASE, "mode");
        if let Some(mode) = one_of(m, &path, errors) {
            needs_local_layer(mode, local.enabled, &path, errors);
            local.mode = mode;
        }
    }
    if let Some(l) = obj.get("lease") {
        local.lease_max_batch = lease_max_batch(l, &join(BASE, "lease"), errors);
    }
    if let Some(v) = obj.get("sync") {
        let path = join(BASE, "sync");
        match v {
            Value::Object(sync) => {
                check_keys(sync, &path, SYNC_KEYS, errors);
                let mut bounded = |key: &str, min: u32, max: u32, default: u32| {
                    let Some(v) = sync.get(key) else {
                        return default;
                    };
                    let at = join(&path, key);
                    match positive_u32(v) {
                        Ok(n) if (min..=max).contains(&n) => n,
                        Ok(n) => {
                            errors.push(at, format!("must be from {min} to {max}, got {n}"));
                            default
                        }
                        Err(e) => {
                            errors.push(at, e);
                            default
                        }
                    }
                };
                local.sync_interval_ms = bounded(
                    "interval_ms",
                    MIN_SYNC_INTERVAL_MS,
                    MAX_SYNC_INTERVAL_MS,
                    DEFAULT_SYNC_INTERVAL_MS,
                );
                local.sync_max_unsynced = bounded(
                    "max_unsynced",
                    1,
                    MAX_SYNC_MAX_UNSYNCED,
                    DEFAULT_SYNC_MAX_UNSYNCED,
                );
            }
            other => errors.push(path, format!("must be an object, got {}", describe(other))),
        }
    }
    let Some(groups) = obj.get("groups") else {
        return local;
    };
    let base = join(BASE, "groups");
    let Value::Object(groups) = groups else {
        errors.push(base, format!("must be an object, got {}", describe(groups)));
        return local;
    };
    for (name, params) in groups {
        let path = join(&base, name);
        // Only checkable when the limits themselves parsed.
        if let Some(limits) = limits {
            if !limits.all_groups().any(|g| g.name == *name) {
                let names: Vec<&str> = limits.all_groups().map(|g| g.name.as_str()).collect();
                errors.push(
                    path.clone(),
                    format!(
                        "no such group in limits, expected one of {}",
                        names.join(", ")
                    ),
                );
            }
        }
        if let Some(g) = group_local(params, &path, local.enabled, errors) {
            local.groups.push((name.clone(), g));
        }
    }
    local
}

/// `local.lease`: `{"max_batch": n}`, 1 to `MAX_LEASE_MAX_BATCH`.
fn lease_max_batch(v: &Value, path: &str, errors: &mut Errors) -> u32 {
    let Value::Object(obj) = v else {
        errors.push(path, format!("must be an object, got {}", describe(v)));
        return DEFAULT_LEASE_MAX_BATCH;
    };
    check_keys(obj, path, LEASE_KEYS, errors);
    let Some(m) = obj.get("max_batch") else {
        return DEFAULT_LEASE_MAX_BATCH;
    };
    let path = join(path, "max_batch");
    match positive_u32(m) {
        Ok(n) if n <= MAX_LEASE_MAX_BATCH => n,
        Ok(n) => {
            errors.push(
                path,
                format!("must be at most {MAX_LEASE_MAX_BATCH}, got {n}"),
            );
            DEFAULT_LEASE_MAX_BATCH
        }
        Err(e) => {
            errors.push(path, e);
            DEFAULT_LEASE_MAX_BATCH
        }
    }
}

/// Lease and sync keep their tokens and counts in the local layer's shared
/// data: without it they cannot work.
fn needs_local_layer(mode: Mode, enabled: bool, path: &str, errors: &mut Errors) {
    if mode != Mode::Exact && !enabled {
        errors.push(
            path,
            format!(
                "{:?} needs the local layer, which local.enabled turns off",
                mode.name()
            ),
        );
    }
}

/// A `local.groups.<group>` entry: a bucket, a mode, or both.
fn group_local(v: &Value, path: &str, enabled: bool, errors: &mut Errors) -> Option<GroupLocal> {
    let Value::Object(obj) = v else {
        errors.push(path, format!("must be an object, got {}", describe(v)));
        return None;
    };
    check_keys(obj, path, GROUP_LOCAL_KEYS, errors);
    let mode = obj.get("mode").and_then(|m| {
        let mode_path = join(path, "mode");
        let mode = one_of(m, &mode_path, errors)?;
        needs_local_layer(mode, enabled, &mode_path, errors);
        Some(mode)
    });
    let has_bucket = obj.contains_key("tokens_per_second") || obj.contains_key("burst");
    let bucket = if has_bucket || !obj.contains_key("mode") {
        Some(bucket_params(obj, path, errors)?)
    } else {
        None
    };
    Some(GroupLocal { bucket, mode })
}

fn bucket_params(
    obj: &Map<String, Value>,
    path: &str,
    errors: &mut Errors,
) -> Option<BucketParams> {
    let mut field = |key: &str| match obj.get(key).map(positive_u32) {
        None => None,
        Some(Ok(n)) => Some(Ok(n)),
        Some(Err(m)) => {
            errors.push(join(path, key), m);
            Some(Err(()))
        }
    };
    let rate = field("tokens_per_second");
    let burst = field("burst");
    match (rate, burst) {
        (Some(Ok(r)), Some(Ok(b))) => Some(BucketParams {
            tokens_per_second: r,
            burst: b,
        }),
        (Some(Ok(r)), None) => Some(BucketParams {
            tokens_per_second: r,
            burst: r,
        }),
        (None, _) => {
            errors.push(
                join(path, "tokens_per_second"),
                "missing: a group's bucket needs its refill rate",
            );
            None
        }
        _ => None,
    }
}

fn check_keys(obj: &Map<String, Value>, base: &str, allowed: &[&str], errors: &mut Errors) {
    for key in obj.keys() {
        if !allowed.contains(&key.as_str()) {
            unknown_key(errors, join(base, key), key, allowed);
        }
    }
}

/// Options for the generated plugin configuration.
#[cfg(feature = "cli")]
pub struct PluginOptions<'a> {
    pub domain: &'a str,
    pub cluster: &'a str,
    pub timeout_ms: u32,
    pub descriptor_key: &'a str,
}

/// The plugin configuration `generate` writes, in the order of its fields.
#[cfg(feature = "cli")]
#[derive(serde::Serialize)]
pub struct PluginConfigJson<'a> {
    pub domain: &'a str,
    /// The team file, verbatim.
    pub limits: &'a Value,
    pub rate_limit_service: RateLimitServiceJson<'a>,
    pub failure_mode_deny: bool,
    pub status_on_error: u16,
    pub missing_tenant: MissingTenant,
    pub max_tenant_length: u32,
    pub descriptor_key: &'a str,
    pub headers: HeaderMode,
    pub local: LocalJson,
}

#[cfg(feature = "cli")]
#[derive(serde::Serialize)]
pub struct RateLimitServiceJson<'a> {
    pub cluster: &'a str,
    pub timeout_ms: u32,
}

#[cfg(feature = "cli")]
#[derive(serde::Serialize)]
pub struct LocalJson {
    pub enabled: bool,
    pub slots: u32,
}

/// `default_max_tenant_length`, from the team file's JSON (what `generate`
/// has): the parser takes the same value for a key left out.
#[cfg(feature = "cli")]
fn max_tenant_length_for(team_json: &Value) -> u32 {
    let longest = team_json
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .filter_map(Value::as_object)
        .flat_map(|groups| groups.values())
        .filter_map(|g| g.get("header_value")?.as_array())
        .flatten()
        .filter_map(Value::as_str)
        .map(str::len)
        .max()
        .unwrap_or(0);
    u32::try_from(longest)
        .unwrap_or(u32::MAX)
        .clamp(DEFAULT_MAX_TENANT_LENGTH, MAX_MAX_TENANT_LENGTH)
}

/// The plugin configuration for a team limits document, with every default
/// written out so that operators see what is in force.
#[cfg(feature = "cli")]
pub fn plugin_config_json<'a>(
    team_json: &'a Value,
    opts: &PluginOptions<'a>,
) -> PluginConfigJson<'a> {
    PluginConfigJson {
        domain: opts.domain,
        limits: team_json,
        rate_limit_service: RateLimitServiceJson {
            cluster: opts.cluster,
            timeout_ms: opts.timeout_ms,
        },
        failure_mode_deny: DEFAULT_FAILURE_MODE_DENY,
        status_on_error: DEFAULT_STATUS_ON_ERROR,
        missing_tenant: DEFAULT_MISSING_TENANT,
        max_tenant_length: max_tenant_length_for(team_json),
        descriptor_key: opts.descriptor_key,
        headers: DEFAULT_HEADERS,
        local: LocalJson {
            enabled: DEFAULT_LOCAL_ENABLED,
            slots: DEFAULT_LOCAL_SLOTS,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(text: &str) -> Vec<String> {
        match parse_plugin_config(text.as_bytes()) {
            Ok(_) => vec![],
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    const LIMITS: &str = r#"{"x-tenant-id": {"default": {"perhour": 100}}}"#;

    #[test]
    fn minimal_config_takes_defaults() {
        let text = format!(
            r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}}}"#
        );
        let (c, _) = parse_plugin_config(text.as_bytes()).unwrap();
        assert_eq!(c.timeout_ms, 20);
        assert!(!c.failure_mode_deny);
        assert_eq!(c.status_on_error, 500);
        assert_eq!(c.missing_tenant, MissingTenant::Allow);
        assert_eq!(c.max_tenant_length, 128);
        assert_eq!(c.descriptor_key, "tenant");
        assert_eq!(c.headers, HeaderMode::DraftVersion03);
        assert_eq!(c.local, LocalConfig::default());
        assert!(!c.shadow);
        assert_eq!(c.near_limit_ppm, 800_000);
    }

    fn with_top(extra: &str) -> Result<PluginConfig, Vec<String>> {
        let text = format!(
            r#"{{"domain": "d", "limits": {{"x-t": {{"default": {{"perhour": 1}}, "gold": {{"perhour": 2, "header_value": ["b"], "shadow": true}}}}}}, "rate_limit_service": {{"cluster": "rl"}}{extra}}}"#
        );
        parse_plugin_config(text.as_bytes())
            .map(|(c, _)| c)
            .map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn shadow_is_global_or_per_group() {
        let c = with_top("").unwrap();
        let default = c.limits.default.as_ref().unwrap();
        let gold = c.limits.groups.first().unwrap();
        assert!(!c.shadowed(default));
        assert!(c.shadowed(gold));
        let all = with_top(r#", "shadow": true"#).unwrap();
        assert!(all.shadowed(all.limits.default.as_ref().unwrap()));
        assert_eq!(
            with_top(r#", "shadow": "yes""#).unwrap_err(),
            vec!["shadow: must be true or false, got string \"yes\""]
        );
    }

    #[test]
    fn near_limit_ratio_is_above_0_and_at_most_1() {
        assert_eq!(
            with_top(r#", "near_limit_ratio": 0.9"#)
                .unwrap()
                .near_limit_ppm,
            900_000
        );
        assert_eq!(
            with_top(r#", "near_limit_ratio": 1"#)
                .unwrap()
                .near_limit_ppm,
            PPM
        );
        for bad in ["0", "1.5", "-0.2", "\"0.8\"", "0.0000001"] {
            let e = with_top(&format!(r#", "near_limit_ratio": {bad}"#)).unwrap_err();
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(
                e[0].starts_with("near_limit_ratio: must be a number greater than 0 and at most 1"),
                "{e:?}"
            );
        }
    }

    #[test]
    fn headers_take_each_family_by_name() {
        let with = |h: &str| {
            let text = format!(
                r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}, "headers": {h}}}"#
            );
            parse_plugin_config(text.as_bytes())
                .map(|(c, _)| c.headers)
                .map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())
        };
        assert_eq!(with(r#""ietf_draft_10""#), Ok(HeaderMode::IetfDraft10));
        assert_eq!(with(r#""off""#), Ok(HeaderMode::Off));
        assert_eq!(
            with(r#""ietf""#),
            Err(vec![
                "headers: must be one of \"draft_version_03\", \"off\", \"ietf_draft_10\", got string \"ietf\"".to_string()
            ])
        );
    }

    fn with_cost(keys: &str) -> Result<PluginConfig, Vec<String>> {
        let text = format!(
            r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}},
                "limits": {{"x-t": {{"default": {{"perhour": 30}}}}}}{keys}}}"#
        );
        parse_plugin_config(text.as_bytes())
            .map(|(c, _)| c)
            .map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn request_cost_is_off_unless_a_cost_header_is_named() {
        assert_eq!(with_cost("").unwrap().cost, None);
        let c = with_cost(r#", "cost_header": "x-cost""#).unwrap();
        assert_eq!(
            c.cost,
            Some(CostConfig {
                header: "x-cost".into(),
                max: DEFAULT_MAX_COST
            })
        );
        let c = with_cost(r#", "cost_header": "x-cost", "max_cost": 50"#).unwrap();
        assert_eq!(c.cost.unwrap().max, 50);
    }

    #[test]
    fn bad_cost_settings_are_named() {
        let err = |keys: &str| with_cost(keys).unwrap_err();
        assert_eq!(
            err(r#", "max_cost": 10"#),
            vec!["max_cost: needs cost_header (the request header that carries the cost)"]
        );
        assert_eq!(
            err(r#", "cost_header": "x-cost", "max_cost": 0"#),
            vec!["max_cost: must be a positive integer, got 0"]
        );
        assert_eq!(
            err(r#", "cost_header": "x-cost", "max_cost": 1000001"#),
            vec!["max_cost: must be at most 1000000, got 1000001"]
        );
        assert_eq!(
            err(r#", "cost_header": "x-cost", "max_cost": "5""#),
            vec!["max_cost: must be a positive integer, got string \"5\""]
        );
        assert_eq!(
            err(r#", "cost_header": "X-Cost""#),
            vec!["cost_header: header name \"X-Cost\" must be lowercase (Envoy matches header names in lowercase)"]
        );
        assert_eq!(
            err(r#", "cost_header": """#),
            vec!["cost_header: must not be empty"]
        );
        assert_eq!(
            err(r#", "cost_header": "x-t""#),
            vec!["cost_header: \"x-t\" is the tenant header; the cost needs a header of its own"]
        );
    }

    #[test]
    fn lease_max_batch_is_validated_and_defaults() {
        let c = with_local(r#"{"mode": "lease"}"#).unwrap();
        assert_eq!(c.local.lease_max_batch, DEFAULT_LEASE_MAX_BATCH);
        let c = with_local(r#"{"mode": "lease", "lease": {"max_batch": 7}}"#).unwrap();
        assert_eq!(c.local.lease_max_batch, 7);
        assert_eq!(
            with_local(r#"{"lease": {"max_batch": 0, "size": 1}}"#).unwrap_err(),
            vec![
                "local.lease.size: unknown key \"size\", expected one of max_batch",
                "local.lease.max_batch: must be a positive integer, got 0",
            ]
        );
        assert_eq!(
            with_local(r#"{"lease": {"max_batch": 100001}}"#).unwrap_err(),
            vec!["local.lease.max_batch: must be at most 100000, got 100001"]
        );
        assert_eq!(
            with_local(r#"{"lease": 5}"#).unwrap_err(),
            vec!["local.lease: must be an object, got 5"]
        );
    }

    #[test]
    fn sync_settings_are_validated_and_default() {
        let c = with_local(r#"{"mode": "sync"}"#).unwrap();
        assert_eq!(
            (c.local.sync_interval_ms, c.local.sync_max_unsynced),
            (DEFAULT_SYNC_INTERVAL_MS, DEFAULT_SYNC_MAX_UNSYNCED)
        );
        let c = with_local(r#"{"sync": {"interval_ms": 250, "max_unsynced": 9}}"#).unwrap();
        assert_eq!(
            (c.local.sync_interval_ms, c.local.sync_max_unsynced),
            (250, 9)
        );
        assert_eq!(
            with_local(r#"{"sync": {"interval_ms": 5, "max_unsynced": 0, "x": 1}}"#).unwrap_err(),
            vec![
                "local.sync.x: unknown key \"x\", expected one of interval_ms, max_unsynced",
                "local.sync.interval_ms: must be from 10 to 60000, got 5",
                "local.sync.max_unsynced: must be a positive integer, got 0",
            ]
        );
        assert_eq!(
            with_local(r#"{"sync": []}"#).unwrap_err(),
            vec!["local.sync: must be an object, got an array"]
        );
    }

    fn with_local(local: &str) -> Result<PluginConfig, Vec<String>> {
        let text = format!(
            r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}},
                "limits": {{"x-t": {{"default": {{"persecond": 5, "perhour": 30}},
                                    "gold": {{"perminute": 70, "header_value": ["b"]}},
                                    "silver": {{"persecond": 9, "header_value": ["c"]}}}}}},
                "local": {local}}}"#
        );
        parse_plugin_config(text.as_bytes())
            .map(|(c, _)| c)
            .map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn buckets_default_to_the_per_second_limit_and_groups_override_them() {
        let c = with_local(r#"{"slots": 64, "groups": {"gold": {"tokens_per_second": 2, "burst": 10}, "silver": {"tokens_per_second": 3}}}"#).unwrap();
        assert_eq!(c.local.slots, 64);
        let bucket = |t: &str| c.local.bucket_for(c.limits.group_for(t).unwrap());
        assert_eq!(
            bucket("a"),
            Some(BucketParams {
                tokens_per_second: 5,
                burst: 5
            })
        );
        assert_eq!(
            bucket("b"),
            Some(BucketParams {
                tokens_per_second: 2,
                burst: 10
            })
        );
        assert_eq!(
            bucket("c"),
            Some(BucketParams {
                tokens_per_second: 3,
                burst: 3
            })
        );
        let plain = with_local("{}").unwrap();
        // gold has no per-second limit and no override: no bucket.
        assert_eq!(
            plain.local.bucket_for(plain.limits.group_for("b").unwrap()),
            None
        );
        let off = with_local(r#"{"enabled": false}"#).unwrap();
        assert_eq!(
            off.local.bucket_for(off.limits.group_for("a").unwrap()),
            None
        );
    }

    fn with_max_tenant_length(v: &str, tenant: &str) -> Result<PluginConfig, Vec<String>> {
        let text = format!(
            r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl"}}, "max_tenant_length": {v},
                "limits": {{"x-t": {{"default": {{"perhour": 30}}, "gold": {{"perhour": 70, "header_value": ["{tenant}"]}}}}}}}}"#
        );
        parse_plugin_config(text.as_bytes())
            .map(|(c, _)| c)
            .map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn max_tenant_length_is_bytes_from_1_to_4096() {
        assert_eq!(
            with_max_tenant_length("1", "b").unwrap().max_tenant_length,
            1
        );
        assert_eq!(
            with_max_tenant_length("4096", "b")
                .unwrap()
                .max_tenant_length,
            4096
        );
        assert_eq!(
            with_max_tenant_length("0", "b").unwrap_err(),
            vec!["max_tenant_length: must be a positive integer, got 0"]
        );
        assert_eq!(
            with_max_tenant_length("4097", "b").unwrap_err(),
            vec!["max_tenant_length: must be at most 4096 (bytes), got 4097"]
        );
        assert_eq!(
            with_max_tenant_length("\"128\"", "b").unwrap_err(),
            vec!["max_tenant_length: must be a positive integer, got string \"128\""]
        );
        // A listed tenant longer than the cap could never be served. Bytes,
        // not characters: "é" is two.
        assert_eq!(
            with_max_tenant_length("3", "ééé").unwrap_err(),
            vec!["limits.x-t.gold.header_value[0]: tenant value \"ééé\" is 6 bytes, longer than max_tenant_length (3): its requests would all be refused with 431; raise max_tenant_length"]
        );
        assert!(with_max_tenant_length("6", "ééé").is_ok());
    }

    #[cfg(feature = "cli")]
    #[test]
    fn generate_writes_a_max_tenant_length_every_listed_tenant_fits() {
        let opts = PluginOptions {
            domain: "d",
            cluster: "rl",
            timeout_ms: 20,
            descriptor_key: "tenant",
        };
        let short: Value = serde_json::from_str(LIMITS).unwrap();
        assert_eq!(
            plugin_config_json(&short, &opts).max_tenant_length,
            DEFAULT_MAX_TENANT_LENGTH
        );
        let long_tenant = "t".repeat(200);
        let long: Value = serde_json::json!({"x-t": {"default": {"perhour": 1},
            "gold": {"perhour": 2, "header_value": ["a", long_tenant]}}});
        let generated = plugin_config_json(&long, &opts);
        assert_eq!(generated.max_tenant_length, 200);
        let text = serde_json::to_string(&generated).unwrap();
        let (with_key, _) = parse_plugin_config(text.as_bytes()).unwrap();
        // Left out, the parser takes the same value.
        let mut without = serde_json::to_value(&generated).unwrap();
        without.as_object_mut().unwrap().remove("max_tenant_length");
        let (without_key, _) = parse_plugin_config(without.to_string().as_bytes()).unwrap();
        assert_eq!(with_key, without_key);
        assert_eq!(without_key.max_tenant_length, 200);
    }

    #[test]
    fn modes_are_global_or_per_group() {
        let c = with_local(r#"{"mode": "sync", "groups": {"gold": {"mode": "lease"}, "silver": {"tokens_per_second": 3}}}"#).unwrap();
        let group = |name: &str| c.limits.all_groups().find(|g| g.name == name).unwrap();
        assert_eq!(c.local.mode_for(group("gold")), Mode::Lease);
        assert_eq!(c.local.mode_for(group("silver")), Mode::Sync);
        assert_eq!(c.local.mode_for(group("default")), Mode::Sync);
        // A mode alone keeps the group's default bucket.
        assert_eq!(c.local.bucket_for(group("gold")), None);
        assert_eq!(
            c.local.bucket_for(group("silver")),
            Some(BucketParams {
                tokens_per_second: 3,
                burst: 3
            })
        );
        let exact = with_local("{}").unwrap();
        assert_eq!(exact.local.mode_for(group("gold")), Mode::Exact);
    }

    #[test]
    fn bad_modes_name_their_field() {
        assert_eq!(
            with_local(r#"{"mode": "fast", "groups": {"gold": {"mode": 1}}}"#).unwrap_err(),
            vec![
                "local.mode: must be one of \"exact\", \"lease\", \"sync\", got string \"fast\"",
                "local.groups.gold.mode: must be one of \"exact\", \"lease\", \"sync\", got 1",
            ]
        );
        assert_eq!(
            with_local(r#"{"enabled": false, "mode": "lease", "groups": {"gold": {"mode": "sync"}}}"#).unwrap_err(),
            vec![
                "local.mode: \"lease\" needs the local layer, which local.enabled turns off",
                "local.groups.gold.mode: \"sync\" needs the local layer, which local.enabled turns off",
            ]
        );
    }

    #[test]
    fn bad_local_sections_name_their_field() {
        assert_eq!(
            with_local(r#"{"slots": 0, "enabled": "yes", "size": 1, "groups": {"bronze": {"burst": 3}, "gold": {"tokens_per_second": 1.5, "burst": -1}}}"#).unwrap_err(),
            vec![
                "local.size: unknown key \"size\", expected one of enabled, slots, mode, groups, lease, sync",
                "local.enabled: must be true or false, got string \"yes\"",
                "local.slots: must be a positive integer, got 0",
                "local.groups.bronze: no such group in limits, expected one of default, gold, silver",
                "local.groups.bronze.tokens_per_second: missing: a group's bucket needs its refill rate",
                "local.groups.gold.tokens_per_second: must be a positive integer, got 1.5",
                "local.groups.gold.burst: must be a positive integer, got -1",
            ]
        );
        assert_eq!(
            with_local(r#"{"slots": 2000000}"#).unwrap_err(),
            vec!["local.slots: must be at most 1048576, got 2000000"]
        );
        assert_eq!(
            with_local("[]").unwrap_err(),
            vec!["local: must be an object, got an array"]
        );
    }

    #[cfg(feature = "cli")]
    #[test]
    fn generated_config_round_trips() {
        let team: Value = serde_json::from_str(LIMITS).unwrap();
        let v = plugin_config_json(
            &team,
            &PluginOptions {
                domain: "internal-api",
                cluster: "ratelimit",
                timeout_ms: 25,
                descriptor_key: "tenant",
            },
        );
        let text = serde_json::to_string(&v).unwrap();
        let (c, _) = parse_plugin_config(text.as_bytes()).unwrap();
        assert_eq!(c.domain, "internal-api");
        assert_eq!(c.cluster, "ratelimit");
        assert_eq!(c.timeout_ms, 25);
        // Every default written out is the one the parser takes.
        let minimal = format!(
            r#"{{"domain": "internal-api", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 25}}}}"#
        );
        assert_eq!(c, parse_plugin_config(minimal.as_bytes()).unwrap().0);
    }

    #[test]
    fn bad_configs_name_their_field() {
        assert_eq!(
            errs(&format!(
                r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}, "bogus": 1}}"#
            )),
            vec!["bogus: unknown key \"bogus\", expected one of domain, limits, rate_limit_service, failure_mode_deny, status_on_error, missing_tenant, max_tenant_length, descriptor_key, headers, local, shadow, near_limit_ratio, cost_header, max_cost"]
        );
        assert_eq!(
            errs(r#"{"domain": "d", "rate_limit_service": {"cluster": "rl"}}"#),
            vec!["limits: missing: the team limits JSON is required"]
        );
        assert_eq!(
            errs(
                r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": -5}}}, "rate_limit_service": {"cluster": "rl", "timeout_ms": 0, "x": 1}, "missing_tenant": "block", "status_on_error": 42}"#
            ),
            vec![
                "limits.x-t.default.perhour: must be a positive integer, got -5",
                "rate_limit_service.x: unknown key \"x\", expected one of cluster, timeout_ms",
                "rate_limit_service.timeout_ms: must be a positive integer, got 0",
                "status_on_error: must be an HTTP status from 200 to 599, got 42",
                "missing_tenant: must be one of \"allow\", \"deny\", got string \"block\"",
            ]
        );
        assert_eq!(errs("[1]"), vec!["must be a JSON object, got an array"]);
        assert_eq!(
            errs("\u{feff}{}"),
            vec!["starts with a UTF-8 byte order mark (BOM), which JSON does not allow: save it as UTF-8 without a BOM"]
        );
        let long = "d".repeat(1 << 20);
        let out = errs(&format!(r#"{{"domain": 7, "missing_tenant": "{long}"}}"#));
        assert!(out.iter().all(|l| l.len() < 300), "{out:?}");
        assert!(out.contains(&format!("missing_tenant: must be one of \"allow\", \"deny\", got string \"{}\"… (1048576 bytes)", &long[..64])), "{out:?}");
        assert_eq!(
            errs(&format!(
                "{{\"domain\": \"d\", \"limits\": {LIMITS}, \"rate_limit_service\": {{\"cluster\": \"rl\"}},\n \"domain\": \"e\"}}"
            )),
            vec!["domain: duplicate key \"domain\" at 2:2 (first at 1:2): JSON keeps only the last one"]
        );
        assert_eq!(
            errs(r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": 1, "perhour": 2}}}, "rate_limit_service": {"cluster": "rl"}}"#),
            vec!["limits.x-t.default.perhour: duplicate key \"perhour\" at 1:62 (first at 1:48): JSON keeps only the last one"]
        );
        assert!(errs("{").first().unwrap().starts_with("not valid JSON: "));
    }
}
