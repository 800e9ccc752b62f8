//! The filter's plugin configuration: the JSON that Envoy hands to the wasm
//! filter (`configuration`), parsed and validated once per VM. Unknown keys
//! are errors, never silent defaults.

use serde_json::{json, Map, Value};

use crate::model::TeamLimits;
use crate::validate::{
    describe, join, parse_team_limits, positive_u32, ConfigError, Errors, Warning,
};

pub const DEFAULT_TIMEOUT_MS: u32 = 20;
pub const DEFAULT_STATUS_ON_ERROR: u16 = 500;
pub const DEFAULT_DESCRIPTOR_KEY: &str = "tenant";
pub const MAX_TIMEOUT_MS: u32 = 60_000;

/// What to do with a request that carries no tenant header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingTenant {
    /// Not limited (the behaviour of Envoy's own `request_headers` action).
    Allow,
    /// Answered 429.
    Deny,
}

/// Which rate-limit headers the filter adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderMode {
    /// `X-RateLimit-*` as Envoy's `DRAFT_VERSION_03`, plus `Retry-After` on 429.
    DraftVersion03,
    /// Only `Retry-After` on 429.
    Off,
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
    pub descriptor_key: String,
    pub headers: HeaderMode,
}

const KEYS: &[&str] = &[
    "domain",
    "limits",
    "rate_limit_service",
    "failure_mode_deny",
    "status_on_error",
    "missing_tenant",
    "descriptor_key",
    "headers",
];
const SERVICE_KEYS: &[&str] = &["cluster", "timeout_ms"];

fn unknown_key(errors: &mut Errors, path: String, key: &str, allowed: &[&str]) {
    errors.push(
        path,
        format!(
            "unknown key {key:?}, expected one of {}",
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

fn one_of<T: Copy>(v: &Value, path: &str, choices: &[(&str, T)], errors: &mut Errors) -> Option<T> {
    let found = v
        .as_str()
        .and_then(|s| choices.iter().find(|(name, _)| *name == s));
    match found {
        Some((_, t)) => Some(*t),
        None => {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
            errors.push(
                path,
                format!("must be one of {}, got {}", names.join(", "), describe(v)),
            );
            None
        }
    }
}

/// Parses the plugin configuration. On success also returns the warnings of
/// its team limits.
pub fn parse_plugin_config(bytes: &[u8]) -> Result<(PluginConfig, Vec<Warning>), Vec<ConfigError>> {
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
    for key in obj.keys() {
        if !KEYS.contains(&key.as_str()) {
            unknown_key(&mut errors, key.clone(), key, KEYS);
        }
    }
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
    let failure_mode_deny = get("failure_mode_deny")
        .map(|v| boolean(v, "failure_mode_deny", &mut errors))
        .unwrap_or(Some(false));
    let status_on_error = match get("status_on_error") {
        None => Some(DEFAULT_STATUS_ON_ERROR),
        Some(v) => match v.as_u64().and_then(|n| u16::try_from(n).ok()) {
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
        },
    };
    let missing_tenant = match get("missing_tenant") {
        None => Some(MissingTenant::Allow),
        Some(v) => one_of(
            v,
            "missing_tenant",
            &[
                ("allow", MissingTenant::Allow),
                ("deny", MissingTenant::Deny),
            ],
            &mut errors,
        ),
    };
    let descriptor_key = match get("descriptor_key") {
        None => Some(DEFAULT_DESCRIPTOR_KEY.to_string()),
        Some(v) => non_empty_string(v, "descriptor_key", &mut errors),
    };
    let headers = match get("headers") {
        None => Some(HeaderMode::DraftVersion03),
        Some(v) => one_of(
            v,
            "headers",
            &[
                ("draft_version_03", HeaderMode::DraftVersion03),
                ("off", HeaderMode::Off),
            ],
            &mut errors,
        ),
    };

    // Every field was checked, so every problem is reported; build only
    // when there were none.
    match (limits, errors.0.is_empty()) {
        (Some(limits), true) => Ok((
            PluginConfig {
                domain: domain.unwrap_or_default(),
                limits,
                cluster: cluster.unwrap_or_default(),
                timeout_ms: timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
                failure_mode_deny: failure_mode_deny.unwrap_or(false),
                status_on_error: status_on_error.unwrap_or(DEFAULT_STATUS_ON_ERROR),
                missing_tenant: missing_tenant.unwrap_or(MissingTenant::Allow),
                descriptor_key: descriptor_key.unwrap_or_default(),
                headers: headers.unwrap_or(HeaderMode::DraftVersion03),
            },
            warnings,
        )),
        _ => Err(errors.0),
    }
}

fn rate_limit_service(v: Option<&Value>, errors: &mut Errors) -> (Option<String>, Option<u32>) {
    const BASE: &str = "rate_limit_service";
    let Some(v) = v else {
        errors.push(
            BASE,
            "missing: {\"cluster\": <name of the Envoy cluster of the rate-limit service>} is required",
        );
        return (None, None);
    };
    let Value::Object(obj) = v else {
        errors.push(BASE, format!("must be an object, got {}", describe(v)));
        return (None, None);
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
    let timeout = match obj.get("timeout_ms") {
        None => Some(DEFAULT_TIMEOUT_MS),
        Some(t) => match positive_u32(t) {
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
    };
    (cluster, timeout)
}

fn check_keys(obj: &Map<String, Value>, base: &str, allowed: &[&str], errors: &mut Errors) {
    for key in obj.keys() {
        if !allowed.contains(&key.as_str()) {
            unknown_key(errors, join(base, key), key, allowed);
        }
    }
}

/// Options for the generated plugin configuration.
pub struct PluginOptions<'a> {
    pub domain: &'a str,
    pub cluster: &'a str,
    pub timeout_ms: u32,
    pub descriptor_key: &'a str,
}

/// The plugin configuration for a team limits document, with every default
/// written out so that operators see what is in force.
pub fn plugin_config_json(team_json: &Value, opts: &PluginOptions<'_>) -> Value {
    json!({
        "domain": opts.domain,
        "limits": team_json,
        "rate_limit_service": {"cluster": opts.cluster, "timeout_ms": opts.timeout_ms},
        "failure_mode_deny": false,
        "status_on_error": DEFAULT_STATUS_ON_ERROR,
        "missing_tenant": "allow",
        "descriptor_key": opts.descriptor_key,
        "headers": "draft_version_03",
    })
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
        assert_eq!(c.descriptor_key, "tenant");
        assert_eq!(c.headers, HeaderMode::DraftVersion03);
    }

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
        let (c, _) = parse_plugin_config(v.to_string().as_bytes()).unwrap();
        assert_eq!(c.domain, "internal-api");
        assert_eq!(c.cluster, "ratelimit");
        assert_eq!(c.timeout_ms, 25);
    }

    #[test]
    fn bad_configs_name_their_field() {
        assert_eq!(
            errs(&format!(
                r#"{{"domain": "d", "limits": {LIMITS}, "rate_limit_service": {{"cluster": "rl"}}, "bogus": 1}}"#
            )),
            vec!["bogus: unknown key \"bogus\", expected one of domain, limits, rate_limit_service, failure_mode_deny, status_on_error, missing_tenant, descriptor_key, headers"]
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
        assert!(errs("{").first().unwrap().starts_with("not valid JSON: "));
    }
}
