//! Validation of the team limits JSON. Every problem is reported, not only
//! the first, each with the JSON path of the field it concerns. The filter
//! and the CLI both go through here, so they reject the same inputs with the
//! same messages.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::model::{Group, TeamLimits, Unit, UnitLimits, DEFAULT_GROUP};

/// One problem in a configuration, located by its JSON path
/// (`x-tenant-id.group_1.perminute`, `header_value[2]`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write_path(f, &self.path)?;
            write!(f, ": {}", self.message)
        }
    }
}

/// A limit that is legal but can never take effect.
pub type Warning = ConfigError;

/// What an error points at in the source: the value at its path, or the key
/// that names it (an unknown key, a bad header or group name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    Value,
    Key,
}

/// An error with what it points at, for tools that show where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub error: ConfigError,
    pub anchor: Anchor,
}

/// Longest tenant value accepted in `header_value`.
pub const MAX_TENANT_LEN: usize = 256;

const HEADER_VALUE: &str = "header_value";
/// A group's `"shadow": true`: counted, never enforced.
const SHADOW: &str = "shadow";

pub(crate) fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// Collects errors while walking a document. The second field holds the
/// indices (into the first) of the errors that point at a key.
#[derive(Default)]
pub(crate) struct Errors(pub Vec<ConfigError>, pub Vec<usize>);

impl Errors {
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// An error about the key at `path` rather than its value.
    pub fn push_key(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.1.push(self.0.len());
        self.push(path, message);
    }

    fn into_diagnostics(self) -> Vec<Diagnostic> {
        let keys = self.1;
        self.0
            .into_iter()
            .enumerate()
            .map(|(i, error)| Diagnostic {
                error,
                anchor: if keys.contains(&i) {
                    Anchor::Key
                } else {
                    Anchor::Value
                },
            })
            .collect()
    }
}

/// The most characters of a value (a key, a name, a string) that a message
/// shows; a longer one is cut, and the message gives its full length.
pub const EXCERPT_CHARS: usize = 64;

/// `s`, or its first [`EXCERPT_CHARS`] characters and `true` when it is longer.
fn cut(s: &str) -> (&str, bool) {
    match s.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => (s.get(..end).unwrap_or(s), true),
        None => (s, false),
    }
}

/// `s` quoted for a message (`"tenant-b"`, escapes as Rust writes them),
/// bounded: `"aaaa…"… (1048576 bytes)` for a long one, so that a 1 MB
/// value still gives a short line.
pub fn excerpt(s: &str) -> String {
    match cut(s) {
        (shown, false) => format!("{shown:?}"),
        (shown, true) => format!("{shown:?}… ({} bytes)", s.len()),
    }
}

/// A JSON path for a message: any key in it longer than [`EXCERPT_CHARS`]
/// is cut (`x-t.aaaa….perhour`).
fn write_path(f: &mut fmt::Formatter<'_>, path: &str) -> fmt::Result {
    for (i, segment) in path.split('.').enumerate() {
        if i > 0 {
            f.write_str(".")?;
        }
        let (shown, was_cut) = cut(segment);
        f.write_str(shown)?;
        if was_cut {
            f.write_str("…")?;
        }
    }
    Ok(())
}

/// What a text that starts with a UTF-8 byte order mark is told; serde_json
/// would say "expected value at line 1 column 1".
pub const BOM_MESSAGE: &str = "starts with a UTF-8 byte order mark (BOM), which JSON does not allow: save it as UTF-8 without a BOM";

/// Whether `bytes` start with the UTF-8 byte order mark (EF BB BF).
pub fn starts_with_bom(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\xEF\xBB\xBF")
}

/// A short description of a JSON value for error messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let (shown, cut) = cut(s);
            let quoted = Value::String(shown.to_string());
            match cut {
                false => format!("string {quoted}"),
                true => format!("string {quoted}… ({} bytes)", s.len()),
            }
        }
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// A positive integer that fits in u32, or an error message.
pub(crate) fn positive_u32(v: &Value) -> Result<u32, String> {
    if let Some(n) = v.as_u64() {
        if n == 0 {
            return Err("must be a positive integer, got 0".into());
        }
        return u32::try_from(n)
            .map_err(|_| format!("must be a positive integer at most {}, got {n}", u32::MAX));
    }
    Err(format!("must be a positive integer, got {}", describe(v)))
}

/// RFC 9110 token characters, lowercase only.
pub(crate) fn header_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the header name is empty".into());
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(format!(
            "header name {} must be lowercase (Envoy matches header names in lowercase)",
            excerpt(name)
        ));
    }
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.bytes().all(tchar) {
        return Some(format!(
            "header name {} is not a valid HTTP header name",
            excerpt(name)
        ));
    }
    None
}

fn group_name_problem(name: &str) -> Option<String> {
    if Unit::from_json_key(name).is_some() || name == HEADER_VALUE || name == SHADOW {
        return Some(format!(
            "{} is a reserved key and cannot name a group (limits go inside a group, such as \"default\")",
            excerpt(name)
        ));
    }
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return Some(format!(
            "group name {} must be made of letters, digits, '_' and '-'",
            excerpt(name)
        ));
    }
    None
}

fn tenant_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("a tenant value must not be empty".into());
    }
    if value.len() > MAX_TENANT_LEN {
        return Some(format!(
            "a tenant value must be at most {MAX_TENANT_LEN} bytes, got {}",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return Some(format!(
            "tenant value {} contains a control character",
            excerpt(value)
        ));
    }
    if value.trim() != value {
        return Some(format!(
            "tenant value {} has leading or trailing whitespace, which Envoy strips from header values, so it could never match",
            excerpt(value)
        ));
    }
    None
}

/// Parses and validates a team limits document held at `base` (empty for a
/// file of its own, `limits` inside the plugin configuration).
pub fn parse_team_limits(
    doc: &Value,
    base: &str,
) -> Result<(TeamLimits, Vec<Warning>), Vec<ConfigError>> {
    walk(doc, base).map_err(|e| e.0)
}

/// [`parse_team_limits`], with each error telling whether it points at a
/// key or at a value (the CLI turns that into a line and column).
pub fn diagnose_team_limits(
    doc: &Value,
    base: &str,
) -> Result<(TeamLimits, Vec<Warning>), Vec<Diagnostic>> {
    walk(doc, base).map_err(Errors::into_diagnostics)
}

fn walk(doc: &Value, base: &str) -> Result<(TeamLimits, Vec<Warning>), Errors> {
    let mut errors = Errors::default();
    let limits = team_limits(doc, base, &mut errors);
    match limits {
        Some(l) if errors.0.is_empty() => {
            let warnings = warnings(&l, base);
            Ok((l, warnings))
        }
        _ => Err(errors),
    }
}

fn team_limits(doc: &Value, base: &str, errors: &mut Errors) -> Option<TeamLimits> {
    let Value::Object(top) = doc else {
        errors.push(
            base,
            format!(
                "must be an object mapping one header name to its groups, got {}",
                describe(doc)
            ),
        );
        return None;
    };
    let mut entries = top.iter();
    let (header, groups_value) = match (entries.next(), entries.next()) {
        (Some(only), None) => only,
        (None, _) => {
            errors.push(
                base,
                "no header: expected one header name mapping to its groups, such as {\"x-tenant-id\": {\"default\": {\"perhour\": 100}}}",
            );
            return None;
        }
        (Some((first, _)), Some(_)) => {
            for name in top.keys().skip(1) {
                errors.push_key(
                    join(base, name),
                    format!("a second header name: the file maps exactly one header to its groups, and {} comes first", excerpt(first)),
                );
            }
            return None;
        }
    };
    let header_path = join(base, header);
    if let Some(p) = header_name_problem(header) {
        errors.push_key(&header_path, p);
    }
    let Value::Object(groups_obj) = groups_value else {
        errors.push(
            &header_path,
            format!(
                "must be an object of groups, got {}",
                describe(groups_value)
            ),
        );
        return None;
    };
    if groups_obj.is_empty() {
        errors.push(
            &header_path,
            "has no groups: add at least \"default\" or a named group",
        );
        return None;
    }

    let mut default = None;
    let mut groups = Vec::new();
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (name, gv) in groups_obj {
        let path = join(&header_path, name);
        if let Some(p) = group_name_problem(name) {
            errors.push_key(&path, p);
            continue;
        }
        let is_default = name == DEFAULT_GROUP;
        if let Some(g) = group(name, gv, &path, is_default, &mut seen, errors) {
            if is_default {
                default = Some(g);
            } else {
                groups.push(g);
            }
        }
    }
    Some(TeamLimits::new(header.clone(), default, groups))
}

fn group<'a>(
    name: &'a str,
    v: &'a Value,
    path: &str,
    is_default: bool,
    seen: &mut HashMap<&'a str, &'a str>,
    errors: &mut Errors,
) -> Option<Group> {
    let Value::Object(obj) = v else {
        errors.push(
            path,
            format!(
                "must be an object of limits such as {{\"perminute\": 60}}, got {}",
                describe(v)
            ),
        );
        return None;
    };
    let before = errors.0.len();
    let mut limits = UnitLimits::default();
    let mut tenants = Vec::new();
    let mut has_unit_key = false;
    let mut shadow = false;
    for (key, value) in obj {
        let field = join(path, key);
        if let Some(unit) = Unit::from_json_key(key) {
            has_unit_key = true;
            match positive_u32(value) {
                Ok(n) => limits.set(unit, n),
                Err(m) => errors.push(&field, m),
            }
        } else if key == HEADER_VALUE {
            if is_default {
                errors.push_key(
                    &field,
                    "the default group applies to every tenant not listed in another group; it takes no header_value",
                );
                continue;
            }
            tenants = tenant_list(name, obj_key(obj, key), &field, seen, errors);
        } else if key == SHADOW {
            match value {
                Value::Bool(b) => shadow = *b,
                other => errors.push(
                    &field,
                    format!("must be true or false, got {}", describe(other)),
                ),
            }
        } else {
            errors.push_key(
                &field,
                format!(
                    "unknown key {}, expected one of persecond, perminute, perhour, perday, shadow{}",
                    excerpt(key),
                    if is_default { "" } else { ", header_value" }
                ),
            );
        }
    }
    if !has_unit_key {
        errors.push(
            path,
            "has no limits: set at least one of persecond, perminute, perhour, perday",
        );
    }
    if !is_default && !obj.contains_key(HEADER_VALUE) {
        errors.push(
            join(path, HEADER_VALUE),
            "missing: a named group must list its tenants in header_value",
        );
    }
    if errors.0.len() > before {
        return None;
    }
    Some(Group {
        name: name.to_string(),
        limits,
        tenants,
        shadow,
    })
}

fn obj_key<'a>(obj: &'a Map<String, Value>, key: &str) -> &'a Value {
    obj.get(key).unwrap_or(&Value::Null)
}

fn tenant_list<'a>(
    group: &'a str,
    v: &'a Value,
    path: &str,
    seen: &mut HashMap<&'a str, &'a str>,
    errors: &mut Errors,
) -> Vec<String> {
    let Value::Array(items) = v else {
        errors.push(
            path,
            format!("must be an array of tenant values, got {}", describe(v)),
        );
        return Vec::new();
    };
    if items.is_empty() {
        errors.push(path, "must list at least one tenant value");
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Value::String(t) = item else {
            errors.push(
                &item_path,
                format!("must be a string, got {}", describe(item)),
            );
            continue;
        };
        if let Some(p) = tenant_value_problem(t) {
            errors.push(&item_path, p);
            continue;
        }
        match seen.get(t.as_str()) {
            Some(&other) if other == group => {
                errors.push(
                    &item_path,
                    format!("{} is listed twice in this group", excerpt(t)),
                );
            }
            Some(&other) => {
                errors.push(
                    &item_path,
                    format!(
                        "{} is already listed in group {}",
                        excerpt(t),
                        excerpt(other)
                    ),
                );
            }
            None => {
                seen.insert(t, group);
                out.push(t.clone());
            }
        }
    }
    out
}

/// Limits that are legal but can never bind.
fn warnings(limits: &TeamLimits, base: &str) -> Vec<Warning> {
    let mut out = Vec::new();
    let header_path = join(base, &limits.header);
    for g in limits.all_groups() {
        let units: Vec<(Unit, u32)> = g.limits.iter().collect();
        for (i, &(longer, long_limit)) in units.iter().enumerate() {
            for &(shorter, short_limit) in units.iter().take(i) {
                let ratio = longer.seconds() / shorter.seconds();
                let path = join(&join(&header_path, &g.name), longer.json_key());
                if u64::from(long_limit) >= u64::from(short_limit) * ratio {
                    out.push(ConfigError {
                        path,
                        message: format!(
                            "can never bind: {} {} allows {} per {} already",
                            shorter.json_key(),
                            short_limit,
                            u64::from(short_limit) * ratio,
                            longer.service_unit()
                        ),
                    });
                } else if long_limit < short_limit {
                    let spath = join(&join(&header_path, &g.name), shorter.json_key());
                    out.push(ConfigError {
                        path: spath,
                        message: format!(
                            "can never bind: {} {} is lower",
                            longer.json_key(),
                            long_limit
                        ),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errs(doc: Value) -> Vec<String> {
        match parse_team_limits(&doc, "") {
            Ok(_) => vec![],
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn seed_example_parses() {
        let doc = json!({"x-tenant-id": {
            "default": {"persecond": 5, "perminute": 20, "perhour": 30},
            "group_1": {"persecond": 50, "perminute": 70, "perhour": 100,
                        "header_value": ["tenant-b", "tenant-c"]}}});
        let (l, w) = parse_team_limits(&doc, "").unwrap();
        assert_eq!(l.header, "x-tenant-id");
        assert_eq!(l.group_for("tenant-c").unwrap().name, "group_1");
        assert_eq!(
            l.group_for("tenant-a").unwrap().limits.get(Unit::Minute),
            Some(20)
        );
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let doc = json!({"x-tenant-id": {
            "default": {"persecond": 0, "perminute": -5, "perhour": 2.5, "perday": "9", "bogus": 1},
            "group_1": {"perhour": 4294967296u64, "header_value": []},
            "perhour": {"perhour": 1}}});
        assert_eq!(
            errs(doc),
            vec![
                "x-tenant-id.default.persecond: must be a positive integer, got 0",
                "x-tenant-id.default.perminute: must be a positive integer, got -5",
                "x-tenant-id.default.perhour: must be a positive integer, got 2.5",
                "x-tenant-id.default.perday: must be a positive integer, got string \"9\"",
                "x-tenant-id.default.bogus: unknown key \"bogus\", expected one of persecond, perminute, perhour, perday, shadow",
                "x-tenant-id.group_1.perhour: must be a positive integer at most 4294967295, got 4294967296",
                "x-tenant-id.group_1.header_value: must list at least one tenant value",
                "x-tenant-id.perhour: \"perhour\" is a reserved key and cannot name a group (limits go inside a group, such as \"default\")",
            ]
        );
    }

    #[test]
    fn duplicate_tenants_and_missing_header_value() {
        let doc = json!({"x-tenant-id": {
            "a": {"perhour": 1, "header_value": ["t1", "t1"]},
            "b": {"perhour": 1, "header_value": ["t1"]},
            "c": {"perhour": 1},
            "d": {"header_value": ["t2"]}}});
        assert_eq!(
            errs(doc),
            vec![
                "x-tenant-id.a.header_value[1]: \"t1\" is listed twice in this group",
                "x-tenant-id.b.header_value[0]: \"t1\" is already listed in group \"a\"",
                "x-tenant-id.c.header_value: missing: a named group must list its tenants in header_value",
                "x-tenant-id.d: has no limits: set at least one of persecond, perminute, perhour, perday",
            ]
        );
    }

    #[test]
    fn header_name_rules() {
        assert_eq!(
            errs(json!({"X-Tenant": {"default": {"perhour": 1}}})),
            vec!["X-Tenant: header name \"X-Tenant\" must be lowercase (Envoy matches header names in lowercase)"]
        );
        assert_eq!(
            errs(json!({"x tenant": {"default": {"perhour": 1}}})),
            vec!["x tenant: header name \"x tenant\" is not a valid HTTP header name"]
        );
        assert_eq!(
            errs(json!({"a": {"default": {"perhour": 1}}, "b": {}})),
            vec!["b: a second header name: the file maps exactly one header to its groups, and \"a\" comes first"]
        );
        assert_eq!(
            errs(json!({})),
            vec!["no header: expected one header name mapping to its groups, such as {\"x-tenant-id\": {\"default\": {\"perhour\": 100}}}"]
        );
    }

    #[test]
    fn default_takes_no_header_value() {
        assert_eq!(
            errs(json!({"x-t": {"default": {"perhour": 1, "header_value": ["a"]}}})),
            vec!["x-t.default.header_value: the default group applies to every tenant not listed in another group; it takes no header_value"]
        );
    }

    #[test]
    fn tenant_values_that_could_never_match_are_refused() {
        assert_eq!(
            errs(json!({"x-t": {"g": {"perhour": 1, "header_value": [" a", "", 7]}}})),
            vec![
                "x-t.g.header_value[0]: tenant value \" a\" has leading or trailing whitespace, which Envoy strips from header values, so it could never match",
                "x-t.g.header_value[1]: a tenant value must not be empty",
                "x-t.g.header_value[2]: must be a string, got 7",
            ]
        );
    }

    #[test]
    fn limits_that_cannot_bind_are_warnings() {
        let doc = json!({"x-t": {"default": {"persecond": 1, "perminute": 60, "perhour": 30}}});
        let (_, w) = parse_team_limits(&doc, "limits").unwrap();
        let w: Vec<String> = w.iter().map(ToString::to_string).collect();
        assert_eq!(
            w,
            vec![
                "limits.x-t.default.perminute: can never bind: persecond 1 allows 60 per minute already",
                "limits.x-t.default.perminute: can never bind: perhour 30 is lower",
            ]
        );
    }
}
