//! `ratelimit-config explain --service counter` prints the counter's keys
//! and windows from `ratelimit_config::explain::counter_window`; the
//! counter builds them in `decide::plan`. The two agree, for every unit,
//! fixed and sliding, on a route, for odd tenant and domain values, at
//! instants around window and calendar boundaries.

// A test: a failed expectation is a failed test.
#![allow(clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
use ratelimit_config::explain::counter_window;
use ratelimit_config::validate::parse_team_limits_for;
use ratelimit_config::{Service, Unit};
use ratelimit_counter::decide::{plan, Domain};
use ratelimit_counter::proto::{Entry, RateLimitDescriptor, RateLimitRequest};

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

#[test]
fn explain_prints_the_keys_and_windows_the_counter_counts_in() {
    // Six windows a group at most: the two groups together hold every
    // named unit and two custom lengths.
    let units = |us: &[Unit]| -> serde_json::Map<String, serde_json::Value> {
        us.iter()
            .map(|u| (u.json_key().to_string(), serde_json::json!(5)))
            .collect()
    };
    use Unit::*;
    let mut fixed = units(&[Second, Minute, Custom(300), Hour, Week, Year]);
    fixed.insert(
        "header_value".into(),
        serde_json::json!(["a}b", "50%25off"]),
    );
    fixed.insert(
        "routes".into(),
        serde_json::json!({"reports": {"perminute": 1}}),
    );
    let mut sliding = units(&[Minute, Custom(90), Day, Week, Month, Year]);
    sliding.insert("window".into(), serde_json::json!("sliding"));
    sliding.insert(
        "routes".into(),
        serde_json::json!({"reports": {"perminute": 1}}),
    );
    let doc = serde_json::json!({"x-tenant-id": {"default": sliding, "gold": fixed}});
    let (limits, _) = parse_team_limits_for(&doc, "", Service::Counter).expect("a valid team file");
    let domain = Domain {
        limits,
        descriptor_key: "tenant".into(),
    };
    let days = |y, m, d| ratelimit_config::window::days_from_civil(y, m, d) * 86_400_000;
    let instants = [
        days(2026, 12, 5) + 41_412_345,
        days(2027, 1, 1),
        days(2026, 12, 31) + 86_399_999,
        days(2028, 2, 29) + 1,
        days(2026, 12, 7) - 1,
    ];
    for domain_name in ["internal-api", "d}"] {
        for tenant in ["a}b", "50%25off", "plain"] {
            let group = domain.limits.group_for(tenant).expect("a group");
            for now in instants {
                let group_units: Vec<Unit> = group.limits.iter().map(|(u, _)| u).collect();
                for unit in group_units {
                    for route in [None, Some("reports")] {
                        if route.is_some() && unit != Unit::Minute {
                            continue;
                        }
                        let mut entries = vec![
                            entry("generic_key", &unit.descriptor_value()),
                            entry("tenant", tenant),
                        ];
                        if let Some(r) = route {
                            entries.push(entry("route", r));
                        }
                        let req = RateLimitRequest {
                            domain: domain_name.into(),
                            descriptors: vec![RateLimitDescriptor {
                                entries,
                                hits_addend: None,
                            }],
                            hits_addend: 0,
                        };
                        let p = plan(Some(&domain), &req, now).expect("planned");
                        let check = &p.requests[0].checks[0];
                        let shown = counter_window(domain_name, tenant, group, unit, route, now);
                        let what = format!("{domain_name} {tenant} {unit:?} {route:?} at {now}");
                        assert_eq!(shown.key, check.key, "{what}");
                        assert_eq!(shown.prev_key, check.prev_key, "{what}");
                        assert_eq!(shown.sliding, check.sliding, "{what}");
                        assert_eq!(shown.window, check.window, "{what}");
                    }
                }
            }
        }
    }
}
