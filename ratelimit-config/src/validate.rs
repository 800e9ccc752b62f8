//! Validation of the team limits JSON. Every problem is reported, not only
//! the first, each with the JSON path of the field it concerns. The filter
//! and the CLI both go through here, so they reject the same inputs with the
//! same messages.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::error::{join, Errors};
use crate::field::{boolean, describe, header_name, positive_u32, string, FieldError};
use crate::model::{
    Group, Route, Service, TeamLimits, Unit, UnitLimits, Window, DEFAULT_GROUP, MAX_UNITS_PER_GROUP,
};

// The toolkit both parsers share moved to `error` and `field`; these paths
// stay for the users of this module.
pub use crate::error::{excerpt, Anchor, ConfigError, Diagnostic, Warning, EXCERPT_CHARS};
pub use crate::field::{starts_with_bom, BOM_MESSAGE};

/// Longest tenant value accepted in `header_value`.
pub const MAX_TENANT_LEN: usize = 256;

const HEADER_VALUE: &str = "header_value";
/// A group's `"shadow": true`: counted, never enforced.
const SHADOW: &str = "shadow";
/// A group's limits on Envoy routes, by route name.
const ROUTES: &str = "routes";
/// A group's `"window": "fixed" | "sliding"`.
const WINDOW: &str = "window";
/// A group's `"regions": "global" | "local"`: global, its limits are held
/// across regions (each region's counter admits against its allocation).
const REGIONS: &str = "regions";
/// The keys of a group, as an unknown key's message lists them.
const DEFAULT_GROUP_KEYS: &[&str] = &[
    "persecond",
    "perminute",
    "perhour",
    "perday",
    "perweek",
    "permonth",
    "peryear",
    CUSTOM_KEY,
    SHADOW,
    WINDOW,
    ROUTES,
    REGIONS,
];
const NAMED_GROUP_KEYS: &[&str] = &[
    "persecond",
    "perminute",
    "perhour",
    "perday",
    "perweek",
    "permonth",
    "peryear",
    CUSTOM_KEY,
    SHADOW,
    WINDOW,
    ROUTES,
    REGIONS,
    HEADER_VALUE,
];
const ROUTE_KEYS: &[&str] = &[
    "persecond",
    "perminute",
    "perhour",
    "perday",
    "perweek",
    "permonth",
    "peryear",
    CUSTOM_KEY,
];
/// A window of any length, as the unknown key's message names it.
const CUSTOM_KEY: &str = "per<N><unit> (such as per5minutes)";
/// What a group without limits is told to set.
const NO_LIMITS: &str =
    "has no limits: set at least one of persecond, perminute, perhour, perday, perweek, permonth, peryear";

/// Longest route name accepted in `routes` (it is part of every Redis key
/// of the route's counters).
pub const MAX_ROUTE_NAME_LEN: usize = 256;

/// Why a key cannot name a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupNameError {
    /// A unit, `header_value` or `shadow`: a limit put where a group goes.
    Reserved(String),
    /// Not made of letters, digits, '_' and '-' (or empty).
    BadCharacters(String),
}

impl fmt::Display for GroupNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupNameError::Reserved(name) => f.write_str(&excerpt_in("", name, " is a reserved key and cannot name a group (limits go inside a group, such as \"default\")")),
            GroupNameError::BadCharacters(name) => f.write_str(&excerpt_in("group name ", name, " must be made of letters, digits, '_' and '-'")),
        }
    }
}

impl std::error::Error for GroupNameError {}

/// Why a `header_value` entry could never match a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantValueError {
    Empty,
    /// Longer than [`MAX_TENANT_LEN`] bytes (its length).
    TooLong(usize),
    ControlCharacter(String),
    /// Envoy strips a header value's leading and trailing whitespace.
    Whitespace(String),
}

impl fmt::Display for TenantValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantValueError::Empty => f.write_str("a tenant value must not be empty"),
            TenantValueError::TooLong(len) => write!(
                f,
                "a tenant value must be at most {MAX_TENANT_LEN} bytes, got {len}"
            ),
            TenantValueError::ControlCharacter(value) => f.write_str(&excerpt_in("tenant value ", value, " contains a control character")),
            TenantValueError::Whitespace(value) => f.write_str(&excerpt_in("tenant value ", value, " has leading or trailing whitespace, which Envoy strips from header values, so it could never match")),
        }
    }
}

impl std::error::Error for TenantValueError {}

fn group_name(name: &str) -> Result<(), GroupNameError> {
    if Unit::from_json_key(name).is_some()
        || [HEADER_VALUE, SHADOW, WINDOW, ROUTES, REGIONS].contains(&name)
    {
        return Err(GroupNameError::Reserved(name.to_string()));
    }
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return Err(GroupNameError::BadCharacters(name.to_string()));
    }
    Ok(())
}

fn tenant_value(value: &str) -> Result<(), TenantValueError> {
    if value.is_empty() {
        return Err(TenantValueError::Empty);
    }
    if value.len() > MAX_TENANT_LEN {
        return Err(TenantValueError::TooLong(value.len()));
    }
    if value.chars().any(char::is_control) {
        return Err(TenantValueError::ControlCharacter(value.to_string()));
    }
    if value.trim() != value {
        return Err(TenantValueError::Whitespace(value.to_string()));
    }
    Ok(())
}

/// Parses and validates a team limits document held at `base` (empty for a
/// file of its own, `limits` inside the plugin configuration), for
/// envoyproxy/ratelimit: sliding windows and calendar units are refused.
pub fn parse_team_limits(
    doc: &Value,
    base: &str,
) -> Result<(TeamLimits, Vec<Warning>), Vec<ConfigError>> {
    parse_team_limits_for(doc, base, Service::EnvoyRatelimit)
}

/// [`parse_team_limits`] for the service that will count them.
pub fn parse_team_limits_for(
    doc: &Value,
    base: &str,
    service: Service,
) -> Result<(TeamLimits, Vec<Warning>), Vec<ConfigError>> {
    walk(doc, base, service).map_err(|e| e.0)
}

/// [`parse_team_limits`], with each error telling whether it points at a
/// key or at a value (the CLI turns that into a line and column).
pub fn diagnose_team_limits(
    doc: &Value,
    base: &str,
) -> Result<(TeamLimits, Vec<Warning>), Vec<Diagnostic>> {
    diagnose_team_limits_for(doc, base, Service::EnvoyRatelimit)
}

/// [`diagnose_team_limits`] for the service that will count them.
pub fn diagnose_team_limits_for(
    doc: &Value,
    base: &str,
    service: Service,
) -> Result<(TeamLimits, Vec<Warning>), Vec<Diagnostic>> {
    walk(doc, base, service).map_err(Errors::into_diagnostics)
}

fn walk(doc: &Value, base: &str, service: Service) -> Result<(TeamLimits, Vec<Warning>), Errors> {
    let mut errors = Errors::default();
    let limits = team_limits(doc, base, service, &mut errors);
    match limits {
        Some(l) if errors.is_empty() => {
            let warnings = warnings(&l, base);
            Ok((l, warnings))
        }
        _ => Err(errors),
    }
}

fn team_limits(
    doc: &Value,
    base: &str,
    service: Service,
    errors: &mut Errors,
) -> Option<TeamLimits> {
    let Value::Object(top) = doc else {
        errors.push(
            base,
            got(
                "must be an object mapping one header name to its groups",
                doc,
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
                    excerpt_in("a second header name: the file maps exactly one header to its groups, and ", first, " comes first"),
                );
            }
            return None;
        }
    };
    let header_path = join(base, header);
    if let Err(e) = header_name(header) {
        errors.push_key(&header_path, e);
    }
    let Value::Object(groups_obj) = groups_value else {
        errors.push(
            &header_path,
            got("must be an object of groups", groups_value),
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
    // Each listed tenant, with the index of its group among `names`. (The
    // map's type is the model's, `TeamLimits::new`: one copy of the code.)
    let names: Vec<&str> = groups_obj.keys().map(String::as_str).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, (name, gv)) in groups_obj.iter().enumerate() {
        let path = join(&header_path, name);
        if let Err(e) = group_name(name) {
            errors.push_key(&path, e);
            continue;
        }
        let is_default = name == DEFAULT_GROUP;
        let listed = Listed {
            names: &names,
            index,
            seen: &mut seen,
        };
        if let Some(g) = group(name, gv, &path, is_default, listed, service, errors) {
            if is_default {
                default = Some(g);
            } else {
                groups.push(g);
            }
        }
    }
    Some(TeamLimits::new(header.clone(), default, groups))
}

/// The tenants listed so far, and this group's place among the groups.
struct Listed<'a, 'm> {
    names: &'a [&'a str],
    index: usize,
    seen: &'m mut HashMap<String, usize>,
}

fn group(
    name: &str,
    v: &Value,
    path: &str,
    is_default: bool,
    mut listed: Listed<'_, '_>,
    service: Service,
    errors: &mut Errors,
) -> Option<Group> {
    let counter = service == Service::Counter;
    let Value::Object(obj) = v else {
        errors.push(
            path,
            got("must be an object of limits such as {\"perminute\": 60}", v),
        );
        return None;
    };
    let before = errors.len();
    let mut limits = UnitLimits::default();
    let mut tenants = Vec::new();
    let mut has_unit_key = false;
    let mut shadow = false;
    let mut window = Window::Fixed;
    let mut routes = Vec::new();
    let mut global = false;
    for (key, value) in obj {
        let field = join(path, key);
        if let Some(unit) = Unit::from_json_key(key) {
            has_unit_key = true;
            unit_limit(
                unit,
                (key, value),
                obj,
                &field,
                counter,
                &mut limits,
                errors,
            );
        } else if key == HEADER_VALUE {
            if is_default {
                errors.push_key(
                    &field,
                    "the default group applies to every tenant not listed in another group; it takes no header_value",
                );
                continue;
            }
            tenants = tenant_list(obj_key(obj, key), &field, &mut listed, errors);
        } else if key == SHADOW {
            match boolean(value) {
                Ok(b) => shadow = b,
                Err(e) => errors.push(&field, e),
            }
        } else if key == WINDOW {
            match value.as_str() {
                Some("fixed") => window = Window::Fixed,
                Some("sliding") if counter => window = Window::Sliding,
                Some("sliding") => errors.push(&field, SLIDING_NEEDS_COUNTER),
                _ => errors.push(&field, got("must be \"fixed\" or \"sliding\"", value)),
            }
        } else if key == ROUTES {
            routes = route_list(value, &field, counter, errors);
        } else if key == REGIONS {
            match value.as_str() {
                Some("local") => global = false,
                Some("global") if counter => global = true,
                Some("global") => errors.push(&field, GLOBAL_NEEDS_COUNTER),
                _ => errors.push(&field, got("must be \"global\" or \"local\"", value)),
            }
        } else {
            let expected = if is_default {
                DEFAULT_GROUP_KEYS
            } else {
                NAMED_GROUP_KEYS
            };
            errors.push_key(
                &field,
                FieldError::UnknownKey {
                    key: key.clone(),
                    expected,
                },
            );
        }
    }
    if !has_unit_key {
        errors.push(path, NO_LIMITS);
    }
    too_many_units(&limits, path, errors);
    if !is_default && !obj.contains_key(HEADER_VALUE) {
        errors.push(
            join(path, HEADER_VALUE),
            FieldError::Missing("a named group must list its tenants in header_value"),
        );
    }
    if global && window == Window::Sliding {
        errors.push(join(path, REGIONS), GLOBAL_NEEDS_FIXED);
    }
    if errors.len() > before {
        return None;
    }
    Some(Group {
        name: name.to_string(),
        limits,
        tenants,
        shadow,
        window,
        routes,
        global,
    })
}

/// One window's limit, `key: value` at `field`: refused for
/// envoyproxy/ratelimit when only the counter counts it, and when another
/// key of the same object already names its window (`perminute` and
/// `per60seconds`).
fn unit_limit(
    unit: Unit,
    (key, value): (&str, &Value),
    obj: &Map<String, Value>,
    field: &str,
    counter: bool,
    limits: &mut UnitLimits,
    errors: &mut Errors,
) {
    if unit.is_calendar() && !counter {
        errors.push_key(field, CALENDAR_NEEDS_COUNTER);
    }
    if unit.is_custom() && !counter {
        errors.push_key(field, CUSTOM_NEEDS_COUNTER);
    }
    if limits.get(unit).is_some() {
        // The key written first, as it was written.
        let first = obj
            .keys()
            .find(|k| Unit::from_json_key(k) == Some(unit))
            .map_or("", String::as_str);
        errors.push_key(
            field,
            format!("{key} and {first} are the same window: keep one"),
        );
        return;
    }
    match positive_u32(value) {
        Ok(n) => limits.set(unit, n),
        Err(e) => errors.push(field, e),
    }
}

/// The one check of how many windows a group (or a route of it) limits:
/// the filter keeps [`MAX_UNITS_PER_GROUP`] per group, whichever service
/// counts. `validate`, `generate`, `render` and the plugin configuration
/// all refuse a group of more here.
fn too_many_units(limits: &UnitLimits, path: &str, errors: &mut Errors) {
    if limits.len() > MAX_UNITS_PER_GROUP {
        errors.push(path, TOO_MANY_UNITS);
    }
}

/// [`too_many_units`]'s message.
const TOO_MANY_UNITS: &str = "limits more than 6 windows: a group or route limits at most 6 (the windows the filter keeps per group)";
const _: () = assert!(MAX_UNITS_PER_GROUP == 6, "TOO_MANY_UNITS says 6");

/// What only the counter counts, refused for envoyproxy/ratelimit: a
/// sliding window, and weeks, months and years on the calendar (its own
/// are aligned to the Unix epoch: 30-day months, weeks from Thursday).
const SLIDING_NEEDS_COUNTER: &str = "sliding needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit has fixed windows only";
const GLOBAL_NEEDS_COUNTER: &str = "global needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit has no regional allocations";
/// A global group's windows are fixed: a sliding estimate straddles two
/// windows, and an allocation holds for one.
const GLOBAL_NEEDS_FIXED: &str =
    "global needs fixed windows: a sliding window's estimate spans two windows, a region's allocation holds for one";
const CUSTOM_NEEDS_COUNTER: &str = "a window of this length needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit's protocol has no such unit (second, minute, hour and day only)";
const CALENDAR_NEEDS_COUNTER: &str = "needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit has no calendar weeks, months or years";

/// A group's `routes`: `{"<route name>": {"perminute": 5}, ...}`.
fn route_list(v: &Value, path: &str, counter: bool, errors: &mut Errors) -> Vec<Route> {
    let Value::Object(obj) = v else {
        errors.push(
            path,
            got(
                "must be an object of routes such as {\"reports\": {\"perminute\": 5}}",
                v,
            ),
        );
        return Vec::new();
    };
    if obj.is_empty() {
        errors.push(path, "must name at least one route");
    }
    let mut out = Vec::new();
    for (name, rv) in obj {
        let field = join(path, name);
        if let Err(why) = route_name(name) {
            errors.push_key(&field, why);
            continue;
        }
        let Value::Object(units) = rv else {
            errors.push(
                &field,
                got("must be an object of limits such as {\"perminute\": 5}", rv),
            );
            continue;
        };
        let mut limits = UnitLimits::default();
        for (key, value) in units {
            let unit_path = join(&field, key);
            match Unit::from_json_key(key) {
                Some(unit) => unit_limit(
                    unit,
                    (key, value),
                    units,
                    &unit_path,
                    counter,
                    &mut limits,
                    errors,
                ),
                None => errors.push_key(
                    &unit_path,
                    FieldError::UnknownKey {
                        key: key.clone(),
                        expected: ROUTE_KEYS,
                    },
                ),
            }
        }
        if units.is_empty() {
            errors.push(&field, NO_LIMITS);
        }
        too_many_units(&limits, &field, errors);
        out.push(Route {
            name: name.clone(),
            limits,
        });
    }
    out
}

/// Why a key cannot name a route: the name must be one Envoy's route
/// configuration can hold, and one the service's YAML reads back as itself.
fn route_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a route name must not be empty".into());
    }
    if name.len() > MAX_ROUTE_NAME_LEN {
        return Err(format!(
            "a route name must be at most {MAX_ROUTE_NAME_LEN} bytes, got {}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(excerpt_in(
            "route name ",
            name,
            " contains a control character",
        ));
    }
    if name.ends_with('*') {
        return Err(excerpt_in(
            "route name ",
            name,
            " ends with '*', which the rate-limit service reads as a wildcard",
        ));
    }
    Ok(())
}

fn obj_key<'a>(obj: &'a Map<String, Value>, key: &str) -> &'a Value {
    obj.get(key).unwrap_or(&Value::Null)
}

fn tenant_list(
    v: &Value,
    path: &str,
    listed: &mut Listed<'_, '_>,
    errors: &mut Errors,
) -> Vec<String> {
    let Value::Array(items) = v else {
        errors.push(path, got("must be an array of tenant values", v));
        return Vec::new();
    };
    if items.is_empty() {
        errors.push(path, "must list at least one tenant value");
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let t = match string(item) {
            Ok(t) => t,
            Err(e) => {
                errors.push(&item_path, e);
                continue;
            }
        };
        if let Err(e) = tenant_value(t) {
            errors.push(&item_path, e);
            continue;
        }
        match listed.seen.get(t) {
            Some(&other) if other == listed.index => {
                errors.push(
                    &item_path,
                    excerpt_in("", t, " is listed twice in this group"),
                );
            }
            Some(&other) => {
                errors.push(
                    &item_path,
                    format!(
                        "{} is already listed in group {}",
                        excerpt(t),
                        excerpt(listed.names.get(other).copied().unwrap_or_default())
                    ),
                );
            }
            None => {
                listed.seen.insert(t.to_string(), listed.index);
                out.push(t.to_string());
            }
        }
    }
    out
}

/// `<before><s excerpted><after>`: one copy of the formatting for every
/// message that quotes one text.
fn excerpt_in(before: &str, s: &str, after: &str) -> String {
    let mut message = String::from(before);
    message.push_str(&excerpt(s));
    message.push_str(after);
    message
}

/// `<what>, got <the value described>`: one copy of the formatting for
/// every message that ends so.
fn got(what: &str, v: &Value) -> String {
    let mut message = String::from(what);
    message.push_str(", got ");
    message.push_str(&describe(v));
    message
}

/// Limits that are legal but can never bind.
fn warnings(limits: &TeamLimits, base: &str) -> Vec<Warning> {
    let mut out = Vec::new();
    let header_path = join(base, &limits.header);
    for g in limits.all_groups() {
        let group_path = join(&header_path, &g.name);
        unit_warnings(&group_path, &g.limits, &mut out);
        for r in &g.routes {
            let route_path = join(&join(&group_path, ROUTES), &r.name);
            unit_warnings(&route_path, &r.limits, &mut out);
            // Every request on the route counts in the group's limits too.
            for (unit, limit) in r.limits.iter() {
                let covered = g
                    .limits
                    .iter()
                    .filter(|(u, _)| *u <= unit)
                    .find_map(|(u, n)| {
                        let allows = u64::from(n) * (unit.seconds() / u.seconds());
                        (u64::from(limit) >= allows).then_some((u, n, allows))
                    });
                if let Some((u, n, allows)) = covered {
                    out.push(ConfigError {
                        path: join(&route_path, &unit.json_key()),
                        message: format!(
                            "can never bind: the group's {} {n} allows {allows} per {} on every route already",
                            u.json_key(),
                            unit.noun()
                        ),
                    });
                }
            }
        }
    }
    out
}

/// A longer window of `limits` that allows at least what a shorter one
/// already allows over it, or that is lower than a shorter one.
fn unit_warnings(path: &str, limits: &UnitLimits, out: &mut Vec<Warning>) {
    for (i, (longer, long_limit)) in limits.iter().enumerate() {
        for (shorter, short_limit) in limits.iter().take(i) {
            let ratio = longer.seconds() / shorter.seconds();
            if u64::from(long_limit) >= u64::from(short_limit) * ratio {
                out.push(ConfigError {
                    path: join(path, &longer.json_key()),
                    message: format!(
                        "can never bind: {} {} allows {} per {} already",
                        shorter.json_key(),
                        short_limit,
                        u64::from(short_limit) * ratio,
                        longer.noun()
                    ),
                });
            } else if long_limit < short_limit {
                out.push(ConfigError {
                    path: join(path, &shorter.json_key()),
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
                "x-tenant-id.default.bogus: unknown key \"bogus\", expected one of persecond, perminute, perhour, perday, perweek, permonth, peryear, per<N><unit> (such as per5minutes), shadow, window, routes, regions",
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
                "x-tenant-id.d: has no limits: set at least one of persecond, perminute, perhour, perday, perweek, permonth, peryear",
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

    #[test]
    fn routes_parse_in_default_and_named_groups() {
        let doc = json!({"x-tenant-id": {
            "default": {"perminute": 600, "routes": {"reports": {"perminute": 5}}},
            "gold": {"perminute": 6000, "header_value": ["acme"],
                     "routes": {"reports": {"perminute": 50, "perday": 1000},
                                "httproute/ns/api/rule/0": {"persecond": 2}}}}});
        let (l, w) = parse_team_limits(&doc, "").unwrap();
        assert!(w.is_empty(), "{w:?}");
        let gold = l.group_for("acme").unwrap();
        assert_eq!(gold.routes.len(), 2);
        let reports = gold.route(b"reports").unwrap();
        assert_eq!(reports.limits.get(Unit::Minute), Some(50));
        assert_eq!(reports.limits.get(Unit::Day), Some(1000));
        assert!(gold.route(b"export").is_none());
        let default = l.group_for("other").unwrap();
        assert_eq!(default.route(b"reports").unwrap().limits.len(), 1);
        // A unit only a route sets is in use.
        assert_eq!(
            l.units_in_use(),
            vec![Unit::Second, Unit::Minute, Unit::Day]
        );
        // A group without routes has none.
        let (l, _) = parse_team_limits(&json!({"x-t": {"default": {"perhour": 1}}}), "").unwrap();
        assert!(l.default.unwrap().routes.is_empty());
    }

    #[test]
    fn bad_routes_are_named() {
        let long = "r".repeat(MAX_ROUTE_NAME_LEN + 1);
        let doc = json!({"x-t": {
            "default": {"perhour": 100, "routes": {
                "a": {"perminute": 0}, "b": {"perfortnight": 1}, "c": {},
                "d*": {"perhour": 1}, "": {"perhour": 1}, "e\u{7}": {"perhour": 1},
                long.clone(): {"perhour": 1}, "f": 5}},
            "g": {"perhour": 1, "header_value": ["t"], "routes": {}},
            "routes": {"perhour": 1}}});
        assert_eq!(
            errs(doc),
            vec![
                "x-t.default.routes.a.perminute: must be a positive integer, got 0".to_string(),
                "x-t.default.routes.b.perfortnight: unknown key \"perfortnight\", expected one of persecond, perminute, perhour, perday, perweek, permonth, peryear, per<N><unit> (such as per5minutes)".into(),
                "x-t.default.routes.c: has no limits: set at least one of persecond, perminute, perhour, perday, perweek, permonth, peryear".into(),
                "x-t.default.routes.d*: route name \"d*\" ends with '*', which the rate-limit service reads as a wildcard".into(),
                "x-t.default.routes.: a route name must not be empty".into(),
                "x-t.default.routes.e\u{7}: route name \"e\\u{7}\" contains a control character".into(),
                format!("x-t.default.routes.{}…: a route name must be at most 256 bytes, got 257", &long[..64]),
                "x-t.default.routes.f: must be an object of limits such as {\"perminute\": 5}, got 5".into(),
                "x-t.g.routes: must name at least one route".into(),
                "x-t.routes: \"routes\" is a reserved key and cannot name a group (limits go inside a group, such as \"default\")".into(),
            ]
        );
    }

    #[test]
    fn route_limits_the_group_already_enforces_are_warnings() {
        let doc = json!({"x-t": {"default": {"persecond": 1, "perhour": 1000, "routes": {
            "a": {"perminute": 60}, "b": {"perhour": 1000}, "c": {"perminute": 59},
            "d": {"persecond": 2, "perminute": 200}}}}});
        let (_, w) = parse_team_limits(&doc, "").unwrap();
        let w: Vec<String> = w.iter().map(ToString::to_string).collect();
        assert_eq!(
            w,
            vec![
                "x-t.default.routes.a.perminute: can never bind: the group's persecond 1 allows 60 per minute on every route already",
                "x-t.default.routes.b.perhour: can never bind: the group's perhour 1000 allows 1000 per hour on every route already",
                "x-t.default.routes.d.perminute: can never bind: persecond 2 allows 120 per minute already",
                "x-t.default.routes.d.persecond: can never bind: the group's persecond 1 allows 1 per second on every route already",
                "x-t.default.routes.d.perminute: can never bind: the group's persecond 1 allows 60 per minute on every route already",
            ]
        );
    }

    fn counter_errs(doc: Value) -> Vec<String> {
        match parse_team_limits_for(&doc, "", Service::Counter) {
            Ok(_) => vec![],
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn custom_windows_need_the_counter_and_are_named_when_refused() {
        let doc = json!({"x-t": {"default": {"per5minutes": 50, "per30seconds": 10, "perminute": 20,
            "routes": {"r": {"per90days": 9}}}}});
        let (l, _) = parse_team_limits_for(&doc, "", Service::Counter).unwrap();
        let g = l.default.as_ref().unwrap();
        assert_eq!(g.limits.get(Unit::Custom(300)), Some(50));
        assert_eq!(g.limits.get(Unit::Custom(30)), Some(10));
        assert_eq!(g.routes[0].limits.get(Unit::Custom(90 * 86_400)), Some(9));
        let why = "a window of this length needs rate_limit_service.service \"counter\" (--service counter): envoyproxy/ratelimit's protocol has no such unit (second, minute, hour and day only)";
        assert_eq!(
            errs(doc),
            vec![
                format!("x-t.default.per5minutes: {why}"),
                format!("x-t.default.per30seconds: {why}"),
                format!("x-t.default.routes.r.per90days: {why}"),
            ]
        );
        // A named unit's length is that unit: envoyproxy/ratelimit counts it.
        assert_eq!(
            errs(json!({"x-t": {"default": {"per60seconds": 5}}})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn two_keys_of_one_window_are_refused_naming_both() {
        assert_eq!(
            counter_errs(json!({"x-t": {"default": {"perminute": 5, "per60seconds": 6,
                "per5minutes": 1, "per300seconds": 2}}})),
            vec![
                "x-t.default.per60seconds: per60seconds and perminute are the same window: keep one",
                "x-t.default.per300seconds: per300seconds and per5minutes are the same window: keep one",
            ]
        );
    }

    #[test]
    fn a_group_of_more_windows_than_the_filter_keeps_is_refused_here() {
        let six = json!({"x-t": {"default": {"persecond": 1, "perminute": 20, "per5minutes": 50,
            "perhour": 300, "perday": 1000, "permonth": 9000}}});
        assert_eq!(counter_errs(six), Vec::<String>::new());
        let seven = json!({"x-t": {"default": {"persecond": 1, "perminute": 20, "per5minutes": 50,
            "perhour": 300, "perday": 1000, "permonth": 9000, "peryear": 90000},
            "gold": {"header_value": ["g"], "perminute": 1,
                "routes": {"r": {"persecond": 1, "per2seconds": 2, "per3seconds": 3, "per4seconds": 4,
                    "per5seconds": 5, "per6seconds": 6, "per7seconds": 7}}}}});
        assert_eq!(
            counter_errs(seven),
            vec![
                "x-t.default: limits more than 6 windows: a group or route limits at most 6 (the windows the filter keeps per group)",
                "x-t.gold.routes.r: limits more than 6 windows: a group or route limits at most 6 (the windows the filter keeps per group)",
            ]
        );
    }

    #[test]
    fn warnings_name_custom_windows_too() {
        let doc = json!({"x-t": {"default": {"per5minutes": 5, "per10minutes": 100}}});
        let (_, w) = parse_team_limits_for(&doc, "", Service::Counter).unwrap();
        let w: Vec<String> = w.iter().map(ToString::to_string).collect();
        assert_eq!(
            w,
            vec!["x-t.default.per10minutes: can never bind: per5minutes 5 allows 10 per 10 minutes already"]
        );
    }
}
