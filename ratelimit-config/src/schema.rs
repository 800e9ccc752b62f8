//! A JSON Schema (draft 2020-12) of the team limits file, for editors to
//! check files as people type. It says what a schema can: shapes, types,
//! ranges, names. What it cannot, the validator still checks: a tenant
//! listed in two groups, a key given twice, limits that can never bind.

use serde_json::{json, Value};

use crate::model::Unit;
use crate::validate::{MAX_ROUTE_NAME_LEN, MAX_TENANT_LEN};

/// A custom window's key: `per<N><unit>`, N without leading zeros.
const CUSTOM_PATTERN: &str = "^per[1-9][0-9]*(second|minute|hour|day)s?$";

/// The `$id` of the schema.
pub const SCHEMA_ID: &str = "urn:tenant-ratelimit:team-limits";

pub fn team_limits_schema() -> Value {
    let mut units = serde_json::Map::new();
    for u in Unit::ALL {
        let aligned = if u.is_calendar() {
            "UTC calendar window (ISO weeks from Monday, calendar months and years); needs the counter"
        } else {
            "clock-aligned window"
        };
        units.insert(
            u.json_key().to_string(),
            json!({
                "description": format!("Requests allowed per {} ({aligned}). Left out: not limited per {}.", u.service_unit(), u.service_unit()),
                "$ref": "#/$defs/limit"
            }),
        );
    }
    units.insert(
        "shadow".into(),
        json!({
            "description": "true: this group's refusals are counted (shadow_refused) and the requests let through, never refused.",
            "type": "boolean"
        }),
    );
    units.insert(
        "window".into(),
        json!({
            "description": "fixed (the default): clock-aligned windows counted on their own. sliding: the previous window's count weighted by how much of it still overlaps, with the current one's; needs the counter.",
            "enum": ["fixed", "sliding"]
        }),
    );
    let unit_keys: Vec<String> = Unit::ALL
        .iter()
        .map(|u| u.json_key().into_owned())
        .collect();
    let mut at_least_one_unit: Vec<Value> =
        unit_keys.iter().map(|k| json!({"required": [k]})).collect();
    // Or a custom window: not every key fails its pattern.
    at_least_one_unit.push(json!({"not": {"propertyNames": {"not": {"pattern": CUSTOM_PATTERN}}}}));
    let custom = json!({CUSTOM_PATTERN: {
        "description": "Requests allowed per window of N seconds, minutes, hours or days (per5minutes, per30seconds, per90days): a fixed window from multiples of its length since the Unix epoch; needs the counter. The limits of a group and of each route take at most 6 windows.",
        "$ref": "#/$defs/limit"
    }});
    let mut route_units = units.clone();
    route_units.remove("shadow");
    route_units.remove("window");
    units.insert(
        "regions".into(),
        json!({
            "description": "local (the default): each region's counter counts to the whole limit. global: the limits hold across regions, each region admitting against its allocation (ratelimit-counter --region, moved by ratelimit-counter rebalance); needs the counter and fixed windows.",
            "enum": ["local", "global"]
        }),
    );
    units.insert(
        "routes".into(),
        json!({
            "description": "Limits of each tenant of the group on an Envoy route (the route's name in Envoy's route configuration, which Envoy gives the filter as xds.route_name), on top of the group's own.",
            "type": "object",
            "minProperties": 1,
            "propertyNames": {
                "minLength": 1,
                "maxLength": MAX_ROUTE_NAME_LEN,
                // No control character; no '*' at the end (a wildcard to the service).
                "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\x00-\\x1f\\x7f-\\x9f*]$"
            },
            "additionalProperties": {
                "type": "object",
                "properties": route_units,
                "patternProperties": custom.clone(),
                "additionalProperties": false,
                "maxProperties": crate::model::MAX_UNITS_PER_GROUP,
                "anyOf": at_least_one_unit.clone()
            }
        }),
    );
    let mut named_props = units.clone();
    named_props.insert(
        "header_value".into(),
        json!({
            "description": "The tenant values (header values) in this group.",
            "type": "array",
            "minItems": 1,
            "uniqueItems": true,
            "items": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_TENANT_LEN,
                // No control character, no whitespace at either end.
                "pattern": "^[^\\s\\x00-\\x1f\\x7f-\\x9f](?:[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f])?$"
            }
        }),
    );
    let mut reserved: Vec<&str> = unit_keys.iter().map(String::as_str).collect();
    reserved.push("header_value");
    reserved.push("shadow");
    reserved.push("window");
    reserved.push("routes");
    reserved.push("regions");
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "tenant-ratelimit team limits",
        "description": "One request header mapping to groups of per-tenant limits: \"default\" for every tenant not listed elsewhere, and named groups listing their tenants in header_value. Check with `ratelimit-config validate`, which also finds what a schema cannot (a tenant in two groups, a key given twice, limits that can never bind).",
        "examples": [{"x-tenant-id": {
            "default": {"persecond": 5, "perminute": 20, "perhour": 30},
            "group_1": {"persecond": 50, "perminute": 70, "perhour": 100, "header_value": ["tenant-b", "tenant-c"]}
        }}, {"x-tenant-id": {
            "default": {"perminute": 600, "routes": {"reports": {"perminute": 5}}},
            "gold": {"perminute": 6000, "header_value": ["acme"], "routes": {"reports": {"perminute": 50}}}
        }}],
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "propertyNames": {
            "description": "The request header carrying the tenant: a lowercase HTTP header name.",
            "pattern": "^[a-z0-9!#$%&'*+.^_`|~-]+$"
        },
        "additionalProperties": {"$ref": "#/$defs/groups"},
        "$defs": {
            "limit": {"type": "integer", "minimum": 1, "maximum": u32::MAX},
            "groups": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {
                    "pattern": "^[A-Za-z0-9_-]+$",
                    "not": {"anyOf": [{"enum": reserved}, {"pattern": CUSTOM_PATTERN}]}
                },
                "properties": {"default": {"$ref": "#/$defs/default_group"}},
                "additionalProperties": {"$ref": "#/$defs/named_group"}
            },
            "default_group": {
                "description": "Limits of every tenant not listed in a named group; each tenant still has its own counter.",
                "type": "object",
                "properties": units,
                "patternProperties": custom.clone(),
                "additionalProperties": false,
                "anyOf": at_least_one_unit
            },
            "named_group": {
                "description": "Limits of the tenants listed in header_value.",
                "type": "object",
                "properties": named_props,
                "patternProperties": custom,
                "required": ["header_value"],
                "additionalProperties": false,
                "anyOf": at_least_one_unit
            }
        }
    })
}
