//! Whose quota a request spends: the tenant's raw value, read from where the
//! configuration says (`tenant_source`). Pure code over the `Host` port.
//!
//! - The team file's header (the default). Envoy's attribute
//!   `request.headers[name]` gives every value of the header, joined by
//!   `,`: one host call tells a single value from several. Only a value
//!   holding a `,` costs a second call (the first value alone, to see
//!   whether it is the whole). A header sent more than once is `Repeated`:
//!   the filter refuses it rather than guess which value is the tenant (a
//!   filter in front that appends its verified value, instead of replacing
//!   the client's, would otherwise let the client's first value win). An
//!   empty value is a tenant, the empty one, as in Envoy's own rate-limit
//!   filter.
//! - An attribute path (`{"property": [...]}`), e.g. the claim `jwt_authn`
//!   verified, in the request's dynamic metadata. No header is read.
//!
//! What the value becomes on its way to the service (escaped, so that
//! distinct raw values never share a counter) is `decision::first_step`'s,
//! through `ratelimit_config::tenant_value`.

use ratelimit_config::{TeamLimits, TenantSource};

use crate::host::{Host, HostError};

/// Where the tenant is read, compiled once per configuration: the
/// attribute path as the port takes it (segments joined by NUL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A request header: its name, and the path of all its values.
    Header { name: String, all_values: String },
    /// Any other attribute.
    Property(String),
}

impl Location {
    pub fn new(source: &TenantSource, limits: &TeamLimits) -> Location {
        match source {
            TenantSource::Header => Location::Header {
                name: limits.header.clone(),
                all_values: format!("request\0headers\0{}", limits.header),
            },
            TenantSource::Property(path) => {
                let mut joined = String::new();
                for (i, segment) in path.iter().enumerate() {
                    if i > 0 {
                        joined.push('\0');
                    }
                    joined.push_str(segment);
                }
                Location::Property(joined)
            }
        }
    }
}

/// A request's tenant, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// No such header, or no such attribute.
    Missing,
    /// The header was sent more than once.
    Repeated,
    /// The raw value (possibly empty, possibly not UTF-8).
    Value(Vec<u8>),
}

/// Reads the tenant of the request the host is called for.
pub fn read<H: Host + ?Sized>(source: &Location, host: &H) -> Result<Read, HostError> {
    let (path, header) = match source {
        Location::Header { name, all_values } => (all_values, Some(name)),
        Location::Property(path) => (path, None),
    };
    let Some(value) = host.property(path)? else {
        return Ok(Read::Missing);
    };
    let Some(name) = header.filter(|_| value.contains(&b',')) else {
        return Ok(Read::Value(value));
    };
    // Several values are joined by `,`: the value is one of them only if
    // the first value is the whole.
    match host.request_header(name)? {
        Some(first) if first.len() == value.len() => Ok(Read::Value(value)),
        _ => Ok(Read::Repeated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostCall;
    use crate::testing::{compiled_json, MemHost};
    use serde_json::{json, Value};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn source(extra: Value) -> Location {
        let base = json!({"domain": "d", "rate_limit_service": {"cluster": "rl"},
            "limits": {"x-tenant-id": {"default": {"perhour": 1}}}});
        compiled_json(base, extra).tenant_location
    }

    fn value(v: &[u8]) -> Read {
        Read::Value(v.to_vec())
    }

    #[test]
    fn a_header_is_one_value_or_refused_as_several() {
        let s = source(json!({}));
        let h = MemHost::new();
        assert_eq!(read(&s, &h), Ok(Read::Missing));
        h.set_request_header("x-tenant-id", b"acme");
        assert_eq!(read(&s, &h), Ok(value(b"acme")));
        // Empty is a value, the empty tenant.
        h.set_request_header("x-tenant-id", b"");
        assert_eq!(read(&s, &h), Ok(value(b"")));
        // One value holding commas is that value.
        h.set_request_header("x-tenant-id", b"a,b");
        assert_eq!(read(&s, &h), Ok(value(b"a,b")));
        // Two values, whatever they hold: the empty one first, too.
        for (first, second) in [
            (&b""[..], &b"victim"[..]),
            (b"a", b"b"),
            (b"a,b", b"c"),
            (b"x", b""),
        ] {
            h.set_request_header("x-tenant-id", first);
            h.append_request_header("x-tenant-id", second);
            assert_eq!(read(&s, &h), Ok(Read::Repeated), "{first:?} {second:?}");
        }
        // Bytes that are not UTF-8 come as they are.
        h.set_request_header("x-tenant-id", b"vic\xfftim");
        assert_eq!(read(&s, &h), Ok(value(b"vic\xfftim")));
    }

    #[test]
    fn a_property_source_reads_no_header() {
        let s = source(
            json!({"tenant_source": {"property": ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "tenant"]}}),
        );
        let h = MemHost::new();
        h.fail(HostCall::RequestHeader);
        h.set_request_header("x-tenant-id", b"victim");
        assert_eq!(read(&s, &h), Ok(Read::Missing));
        let path = "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0tenant";
        h.set_attribute(path, b"acme,corp");
        assert_eq!(read(&s, &h), Ok(value(b"acme,corp")));
        h.fail(HostCall::Property);
        assert_eq!(
            read(&s, &h),
            Err(HostError::new(
                HostCall::Property,
                HostError::INTERNAL_FAILURE
            ))
        );
    }

    #[test]
    fn a_host_call_that_fails_is_an_error() {
        let s = source(json!({}));
        let h = MemHost::new();
        h.set_request_header("x-tenant-id", b"a");
        h.append_request_header("x-tenant-id", b"b");
        h.fail(HostCall::RequestHeader);
        assert_eq!(
            read(&s, &h),
            Err(HostError::new(
                HostCall::RequestHeader,
                HostError::INTERNAL_FAILURE
            ))
        );
    }
}
