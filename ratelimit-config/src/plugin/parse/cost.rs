//! What a request costs: `cost_header` and `max_cost` (the request's
//! cost, read before it is counted) and `response_cost_header` (the cost
//! the upstream reports).

use serde_json::{Map, Value};

use crate::error::{excerpt, Errors};
use crate::field::{header_name, non_empty_string, positive_u32_at_most};
use crate::model::TeamLimits;

use super::super::defaults::{DEFAULT_MAX_COST, MAX_MAX_COST};
use super::super::types::CostConfig;

/// The request's cost (`cost`) and the response's (`response_cost`), read
/// from the configuration's top level.
pub(super) struct Costs {
    pub cost: Option<CostConfig>,
    pub response_cost: Option<CostConfig>,
}

/// `response_cost_header`, then `cost_header` and `max_cost`, which bounds
/// both costs.
pub(super) fn costs(
    obj: &Map<String, Value>,
    limits: Option<&TeamLimits>,
    errors: &mut Errors,
) -> Costs {
    let response_cost = response_cost_header(obj.get("response_cost_header"), errors);
    let (cost, max_cost) = cost_config(
        obj.get("cost_header"),
        obj.get("max_cost"),
        limits,
        response_cost.is_some(),
        errors,
    );
    let response_cost = response_cost.map(|header| CostConfig {
        header,
        max: max_cost,
    });
    Costs {
        cost,
        response_cost,
    }
}

/// `response_cost_header`: the response header (and trailer) whose value
/// the upstream sets to what the request cost.
fn response_cost_header(v: Option<&Value>, errors: &mut Errors) -> Option<String> {
    let name = errors.record("response_cost_header", non_empty_string(v?))?;
    errors.record("response_cost_header", header_name(name))?;
    Some(name.to_string())
}

/// `cost_header` and `max_cost`: both optional; `max_cost` only with a
/// `cost_header` or a `response_cost_header` (alone it would do nothing,
/// which is a mistake to report). Also returns `max_cost`, which bounds a
/// response's cost too.
fn cost_config(
    header: Option<&Value>,
    max_value: Option<&Value>,
    limits: Option<&TeamLimits>,
    response_cost: bool,
    errors: &mut Errors,
) -> (Option<CostConfig>, u32) {
    let max = match max_value {
        None => Some(DEFAULT_MAX_COST),
        Some(v) => errors.record("max_cost", positive_u32_at_most(v, MAX_MAX_COST)),
    };
    let cost = request_cost(
        header,
        max_value.is_some(),
        max,
        limits,
        response_cost,
        errors,
    );
    (cost, max.unwrap_or(DEFAULT_MAX_COST))
}

fn request_cost(
    header: Option<&Value>,
    max_given: bool,
    max: Option<u32>,
    limits: Option<&TeamLimits>,
    response_cost: bool,
    errors: &mut Errors,
) -> Option<CostConfig> {
    let Some(header) = header else {
        if max_given && !response_cost {
            errors.push(
                "max_cost",
                "needs cost_header or response_cost_header (the header that carries the cost)",
            );
        }
        return None;
    };
    let name = errors.record("cost_header", non_empty_string(header))?;
    errors.record("cost_header", header_name(name))?;
    if limits.is_some_and(|l| l.header == name) {
        errors.push(
            "cost_header",
            format!(
                "{} is the tenant header; the cost needs a header of its own",
                excerpt(name)
            ),
        );
        return None;
    }
    Some(CostConfig {
        header: name.to_string(),
        max: max?,
    })
}
