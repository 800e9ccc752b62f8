//! Where ratelimit-counter counts: the Redis keys of a tenant's windows,
//! written by the counter and printed by `explain`, from this one place.

use std::fmt::Write;

use crate::Unit;

/// `{<len>:<domain>:<tenant>}`: one Redis Cluster slot per tenant, and no
/// two domains or tenants share a tag: the domain's length in bytes; a `}`
/// (which would end the tag early) written `%7D`, and in the tenant (the
/// value the filter sends) a `%` written `%25`.
pub fn tag(domain: &str, tenant: &str) -> String {
    let mut t = String::with_capacity(domain.len() + tenant.len() + 8);
    let _ = write!(t, "{{{}:", domain.len());
    for ch in domain.chars() {
        match ch {
            '}' => t.push_str("%7D"),
            c => t.push(c),
        }
    }
    t.push(':');
    for ch in tenant.chars() {
        match ch {
            '%' => t.push_str("%25"),
            '}' => t.push_str("%7D"),
            c => t.push(c),
        }
    }
    t.push('}');
    t
}

/// The key of one window: `trl:<tag>:per_<unit>:<window start, Unix ms>`,
/// and on a route `:r:<route>`.
pub fn key(tag: &str, unit: Unit, start_ms: u64, route: Option<&str>) -> String {
    let unit = unit.descriptor_value();
    let mut k =
        String::with_capacity(tag.len() + unit.len() + 28 + route.map_or(0, |r| r.len() + 3));
    k.push_str("trl:");
    k.push_str(tag);
    k.push(':');
    k.push_str(&unit);
    let _ = write!(k, ":{start_ms}");
    if let Some(r) = route {
        k.push_str(":r:");
        k.push_str(r);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_escape_what_would_end_them_and_keys_name_the_window() {
        assert_eq!(tag("d}", "50%25off}"), "{2:d%7D:50%2525off%7D}");
        assert_eq!(
            key("{1:d:t}", Unit::Minute, 60_000, Some("r")),
            "trl:{1:d:t}:per_minute:60000:r:r"
        );
        assert_eq!(
            key("{1:d:t}", Unit::Custom(300), 0, None),
            "trl:{1:d:t}:per_5_minutes:0"
        );
    }
}
