//! The two decisions the request flow (`flow`) takes from data alone: the
//! first step, from the compiled configuration and the tenant header; the
//! verdict, from the rate-limit service's answer (`answer`, with its
//! headers). Also the call's message, for a request or for a tenant the
//! root calls about.

use std::borrow::Cow;

use ratelimit_config::model::{RequestDescriptors, Route};
use ratelimit_config::plugin::PPM;
use ratelimit_config::{tenant_value, Group, HeaderMode, MissingTenant};

use crate::answer::{decode, Answer, RlsError};
use crate::compiled::Compiled;
use crate::group::GroupId;
use crate::headers::{
    forwarded, limit_headers, retry_after, retry_after_from_headers, RETRY_AFTER,
};
use crate::proto::{encode_rate_limit_request, DescriptorStatus};
use crate::tenant::Read;

/// The first step for a request, from its tenant.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// No tenant (no such header, or no such attribute) and
    /// `missing_tenant: allow`: pass it on.
    AllowMissingTenant,
    /// No tenant and `missing_tenant: deny`.
    DenyMissingTenant,
    /// A tenant value longer than `max_tenant_length` bytes: refused (431),
    /// never sent to the service, whatever group it would fall in.
    TenantTooLong,
    /// The tenant header sent more than once: refused (400), whatever its
    /// values (`tenant`).
    RepeatedTenant,
    /// A tenant that no group limits (there is no `default` group): pass it
    /// on.
    NotLimited,
    /// Limited: through the local layer, then the rate-limit service.
    Limit(Limited<'a>),
}

/// A tenant and the group whose limits apply to it.
#[derive(Debug, PartialEq, Eq)]
pub struct Limited<'a> {
    pub group: &'a Group,
    /// The group's id: its per-group counters.
    pub group_id: GroupId,
    pub tenant: Cow<'a, str>,
    /// The route the request matched, when the group limits it (`routes`):
    /// its descriptors follow the group's in the call.
    pub route: Option<&'a Route>,
}

/// Decides the first step from the tenant as read (`tenant::read`). The
/// length is checked on the raw bytes, before anything else is done with
/// them: a long value would otherwise become a long counter key in Redis.
/// An empty value is a tenant, the empty one (as in Envoy's own rate-limit
/// filter). The group is the one listing the raw value; the value sent is
/// `tenant_value`'s: bytes that are not UTF-8, and `%`, written `%XX`, so
/// that every raw value, hostile or not, is a tenant with its own counter,
/// never a way around it, and still a valid protobuf string.
pub fn first_step<'a>(c: &'a Compiled, tenant: &'a Read) -> Step<'a> {
    let raw = match tenant {
        Read::Value(raw) if raw.len() > c.max_tenant_length => return Step::TenantTooLong,
        Read::Value(raw) => raw,
        Read::Repeated => return Step::RepeatedTenant,
        Read::Missing => {
            return match c.config.missing_tenant {
                MissingTenant::Allow => Step::AllowMissingTenant,
                MissingTenant::Deny => Step::DenyMissingTenant,
            }
        }
    };
    let limits = &c.config.limits;
    let group = match std::str::from_utf8(raw) {
        Ok(t) => limits.group_index_for(t),
        // No team file lists a value that is not UTF-8.
        Err(_) => limits.default.as_ref().map(|g| (0, g)),
    };
    match group {
        Some((index, group)) => Step::Limit(Limited {
            group,
            group_id: GroupId::new(index),
            tenant: tenant_value(raw),
            route: None,
        }),
        None => Step::NotLimited,
    }
}

/// The encoded `RateLimitRequest` for a limited tenant: one descriptor per
/// unit its group limits, then one per unit of its route's limits
/// (`Compiled::descriptor_count`), each counting `hits_addend` hits (0
/// counts 1).
pub fn encode_request(c: &Compiled, l: &Limited<'_>, hits_addend: u32) -> Vec<u8> {
    let key = &c.config.descriptor_key;
    let d = RequestDescriptors::new(l.group, l.route, key, &l.tenant);
    encode_rate_limit_request(&c.config.domain, hits_addend, || {
        d.as_slice().iter().map(|(_, entries)| entries)
    })
}

/// The message of a call about `tenant` of group `group`
/// (a lease refill, a sync push; a charge, on `route` too): the group's
/// descriptors (and the route's), each counting `hits`. None if the
/// configuration has no such group, or the group no such route.
pub fn tenant_message(
    c: &Compiled,
    group: GroupId,
    tenant: &str,
    route: Option<&str>,
    hits: u32,
) -> Option<Vec<u8>> {
    let g = c.group(group)?;
    let route = match route {
        Some(name) => Some(g.route(name.as_bytes())?),
        None => None,
    };
    let limited = Limited {
        group: g,
        group_id: group,
        tenant: Cow::Borrowed(tenant),
        route,
    };
    Some(encode_request(c, &limited, hits))
}

/// The decision on a request that the service has answered.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Admitted; add these headers to the upstream response. The statuses
    /// tell whether it was near the limit (`near_limit`).
    Allow(Vec<(&'static str, String)>, Vec<DescriptorStatus>),
    /// Refused: answer 429 with these headers (Retry-After included); the
    /// statuses are what the over-limit cache remembers.
    OverLimit(Vec<(&'static str, String)>, Vec<DescriptorStatus>),
    /// The limiter failed: fail open, or deny with `status_on_error`.
    Error(RlsError),
}

/// What the flow does with the service's answer: the verdict, and the
/// service's own headers to forward (`response_headers_to_add` to the
/// client, on the 429 or the upstream's response; `request_headers_to_add`
/// to the upstream).
#[derive(Debug, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    pub to_client: Vec<(String, String)>,
    pub to_upstream: Vec<(String, String)>,
    /// Forwarded headers left out (invalid, framing, over the bounds).
    pub dropped: usize,
}

/// Whether an admitted request left at most `1 - ratio` of any of its
/// windows' limits (`ratio` in millionths, `near_limit_ratio`): used, after
/// this request, at least `ratio` of the limit. A status without a limit
/// (or with limit 0) says nothing.
pub fn near_limit(statuses: &[DescriptorStatus], ratio_ppm: u32) -> bool {
    statuses.iter().any(|s| {
        let Some(limit) = s.current_limit.as_ref().map(|l| l.requests_per_unit) else {
            return false;
        };
        let used = u64::from(limit.saturating_sub(s.limit_remaining));
        limit > 0 && used * u64::from(PPM) >= u64::from(ratio_ppm) * u64::from(limit)
    })
}

/// The first status (its index: that of the descriptor sent) that matched
/// none of the service's rules: envoyproxy/ratelimit answers such a
/// descriptor OK with no `current_limit` and `limit_remaining` 0 (an
/// unknown domain, a descriptor key or value its rules do not name); a rule
/// that is `unlimited` answers `u32::MAX` remaining, on purpose.
pub fn no_rule(statuses: &[DescriptorStatus]) -> Option<usize> {
    statuses.iter().position(|s| {
        s.code() == crate::proto::Code::Ok
            && s.current_limit.is_none()
            && s.limit_remaining != u32::MAX
    })
}

/// Decides from the gRPC status and the response body.
pub fn verdict(mode: HeaderMode, grpc_status: u32, body: Option<&[u8]>) -> Verdict {
    verdict_of(mode, decode(grpc_status, body)).verdict
}

/// Decides from the decoded answer, with the service's headers to forward.
/// The filter's own headers win: a forwarded header of the same name is
/// left out. A refusal carries Retry-After from the statuses; without any
/// that says when its window resets, from the service's own Retry-After or
/// reset header; else none (never a guess).
pub fn verdict_of(mode: HeaderMode, answer: Result<Answer, RlsError>) -> Decision {
    let Answer {
        over_limit: over,
        response,
    } = match answer {
        Ok(a) => a,
        Err(why) => {
            return Decision {
                verdict: Verdict::Error(why),
                to_client: Vec::new(),
                to_upstream: Vec::new(),
                dropped: 0,
            }
        }
    };
    let mut headers = limit_headers(mode, &response.statuses);
    let own_retry = if over {
        retry_after(&response.statuses)
    } else {
        None
    };
    // Nothing allocated for a service that sends no headers (the usual).
    let (to_client, dropped_client) = if response.response_headers_to_add.is_empty() {
        (Vec::new(), 0)
    } else {
        let mut own: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
        if own_retry.is_some() {
            own.push(RETRY_AFTER);
        }
        forwarded(&response.response_headers_to_add, &own)
    };
    let (to_upstream, dropped_upstream) = if over || response.request_headers_to_add.is_empty() {
        (Vec::new(), 0)
    } else {
        forwarded(&response.request_headers_to_add, &[])
    };
    let verdict = if over {
        let has_retry = to_client.iter().any(|(k, _)| k == RETRY_AFTER);
        let seconds = own_retry.or_else(|| {
            // The service's own Retry-After is forwarded as it is.
            (!has_retry)
                .then(|| retry_after_from_headers(&to_client))
                .flatten()
        });
        if let Some(s) = seconds {
            headers.push((RETRY_AFTER, s.to_string()));
        }
        Verdict::OverLimit(headers, response.statuses)
    } else {
        Verdict::Allow(headers, response.statuses)
    };
    Decision {
        verdict,
        to_client,
        to_upstream,
        dropped: dropped_client + dropped_upstream,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Code, RateLimitRequest, RateLimitResponse, RateLimitUnit};
    use prost::Message;

    fn decide_body(mode: HeaderMode, grpc_status: u32, body: Option<&[u8]>) -> Decision {
        verdict_of(mode, decode(grpc_status, body))
    }
    use crate::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
    use crate::testing::{answer, compiled_json, status};
    use ratelimit_config::parse_plugin_config;
    use serde_json::json;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn compiled(extra: serde_json::Value) -> Compiled {
        let base = json!({"domain": "internal-api", "rate_limit_service": {"cluster": "ratelimit"},
            "limits": {"x-tenant-id": {
                "default": {"persecond": 5, "perhour": 30},
                "gold": {"perminute": 70, "header_value": ["tenant-b"]}}}});
        compiled_json(base, extra)
    }

    fn some(tenant: &[u8]) -> Read {
        Read::Value(tenant.to_vec())
    }

    fn asked(c: &Compiled, tenant: &[u8]) -> RateLimitRequest {
        match first_step(c, &some(tenant)) {
            Step::Limit(l) => RateLimitRequest::decode(&encode_request(c, &l, 0)[..]).unwrap(),
            other => panic!("expected a call, got {other:?}"),
        }
    }

    fn pairs(r: &RateLimitRequest) -> Vec<Vec<(String, String)>> {
        r.descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect()
            })
            .collect()
    }

    fn p(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn default_tenant_sends_one_descriptor_per_unit() {
        let r = asked(&compiled(json!({})), b"tenant-a");
        assert_eq!(r.domain, "internal-api");
        assert_eq!(
            pairs(&r),
            vec![
                vec![p("generic_key", "per_second"), p("tenant", "tenant-a")],
                vec![p("generic_key", "per_hour"), p("tenant", "tenant-a")],
            ]
        );
    }

    #[test]
    fn listed_tenant_sends_its_groups_units() {
        let r = asked(&compiled(json!({})), b"tenant-b");
        assert_eq!(
            pairs(&r),
            vec![vec![
                p("generic_key", "per_minute"),
                p("tenant", "tenant-b")
            ]]
        );
    }

    #[test]
    fn a_missing_tenant_follows_the_policy_and_an_empty_one_is_a_tenant() {
        assert_eq!(
            first_step(&compiled(json!({})), &Read::Missing),
            Step::AllowMissingTenant
        );
        let deny = compiled(json!({"missing_tenant": "deny"}));
        assert_eq!(first_step(&deny, &Read::Missing), Step::DenyMissingTenant);
        for c in [compiled(json!({})), deny] {
            let r = asked(&c, b"");
            assert_eq!(r.descriptors[0].entries[1].value, "");
            assert_eq!(first_step(&c, &Read::Repeated), Step::RepeatedTenant);
        }
    }

    #[test]
    fn a_tenant_no_group_limits_is_not_limited() {
        let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "c"},
            "limits": {"x-tenant-id": {"gold": {"perminute": 70, "header_value": ["tenant-b"]}}}}"#;
        let c = Compiled::new(parse_plugin_config(text.as_bytes()).unwrap().0);
        assert_eq!(first_step(&c, &some(b"tenant-a")), Step::NotLimited);
        assert!(matches!(first_step(&c, &some(b"tenant-b")), Step::Limit(_)));
        assert_eq!(first_step(&c, &Read::Missing), Step::AllowMissingTenant);
        // Not UTF-8: in no listed group, and no default here.
        assert_eq!(first_step(&c, &some(b"tenant-\xff")), Step::NotLimited);
    }

    #[test]
    fn hostile_bytes_are_each_a_limited_tenant_of_their_own() {
        let r = asked(&compiled(json!({})), &[0xff, 0xfe, b'a', 0]);
        assert_eq!(r.descriptors[0].entries[1].value, "%FF%FEa\u{0}");
        // Distinct raw values, distinct values sent: no lossy form that two
        // share.
        let sent = |t: &[u8]| {
            asked(&compiled(json!({})), t).descriptors[0].entries[1]
                .value
                .clone()
        };
        let values = [
            sent(b"vic\xfftim"),
            sent(b"vic\xfetim"),
            sent("vic\u{FFFD}tim".as_bytes()),
            sent(b"vic%FFtim"),
        ];
        assert_eq!(
            values,
            ["vic%FFtim", "vic%FEtim", "vic\u{FFFD}tim", "vic%25FFtim"]
        );
        // A listed tenant is found by its raw value, whatever it is sent as.
        let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "c"},
            "limits": {"x-tenant-id": {"default": {"perhour": 1}, "gold": {"perminute": 70, "header_value": ["50%off"]}}}}"#;
        let listed = Compiled::new(parse_plugin_config(text.as_bytes()).unwrap().0);
        let read = some(b"50%off");
        let Step::Limit(l) = first_step(&listed, &read) else {
            panic!("not limited")
        };
        assert_eq!(
            (l.group.name.as_str(), l.tenant.as_ref()),
            ("gold", "50%25off")
        );
    }

    #[test]
    fn ok_answer_carries_the_tightest_window() {
        let body = answer(
            Code::Ok,
            vec![
                status(Code::Ok, 5, RateLimitUnit::Second, 4, 1),
                status(Code::Ok, 20, RateLimitUnit::Minute, 2, 37),
                status(Code::Ok, 30, RateLimitUnit::Hour, 2, 1800),
            ],
        );
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 0, Some(&body)),
            Verdict::Allow(
                vec![
                    (X_RATELIMIT_LIMIT, "20, 5;w=1, 20;w=60, 30;w=3600".into()),
                    (X_RATELIMIT_REMAINING, "2".into()),
                    (X_RATELIMIT_RESET, "37".into()),
                ],
                RateLimitResponse::decode(&body[..]).unwrap().statuses
            )
        );
    }

    #[test]
    fn over_limit_waits_for_the_longest_window_it_is_over() {
        let body = answer(
            Code::OverLimit,
            vec![
                status(Code::OverLimit, 5, RateLimitUnit::Second, 0, 1),
                status(Code::OverLimit, 100, RateLimitUnit::Hour, 0, 1200),
                status(Code::Ok, 1000, RateLimitUnit::Day, 10, 50000),
            ],
        );
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 0, Some(&body)),
            Verdict::OverLimit(
                vec![
                    (
                        X_RATELIMIT_LIMIT,
                        "5, 5;w=1, 100;w=3600, 1000;w=86400".into()
                    ),
                    (X_RATELIMIT_REMAINING, "0".into()),
                    (X_RATELIMIT_RESET, "1".into()),
                    (RETRY_AFTER, "1200".into()),
                ],
                RateLimitResponse::decode(&body[..]).unwrap().statuses
            )
        );
        match verdict(HeaderMode::Off, 0, Some(&body)) {
            Verdict::OverLimit(headers, _) => {
                assert_eq!(headers, vec![(RETRY_AFTER, "1200".into())])
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn with_headers(
        code: Code,
        statuses: Vec<DescriptorStatus>,
        to_client: &[(&str, &str)],
        to_upstream: &[(&str, &str)],
    ) -> Vec<u8> {
        let hv = |(k, v): &(&str, &str)| crate::proto::HeaderValue {
            key: k.to_string(),
            value: v.to_string(),
        };
        RateLimitResponse {
            overall_code: code as i32,
            statuses,
            response_headers_to_add: to_client.iter().map(hv).collect(),
            request_headers_to_add: to_upstream.iter().map(hv).collect(),
            ..RateLimitResponse::default()
        }
        .encode_to_vec()
    }

    fn pairs_of(h: &[(&str, &str)]) -> Vec<(String, String)> {
        h.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn near_limit_is_at_most_the_rest_of_a_window_left() {
        let s = |limit, remaining| status(Code::Ok, limit, RateLimitUnit::Minute, remaining, 30);
        // 0.8 of 100: 80 used (20 left) is near, 79 used is not.
        assert!(near_limit(&[s(100, 20)], 800_000));
        assert!(!near_limit(&[s(100, 21)], 800_000));
        // Any window: the second one is near.
        assert!(near_limit(&[s(100, 90), s(10, 2)], 800_000));
        assert!(!near_limit(&[s(100, 90), s(10, 3)], 800_000));
        // Ratio 1: only the last request of a window.
        assert!(near_limit(&[s(5, 0)], 1_000_000));
        assert!(!near_limit(&[s(5, 1)], 1_000_000));
        // A tiny ratio: any request that used something.
        assert!(near_limit(&[s(1_000, 999)], 1));
        // No limit known, or limit 0: not near.
        assert!(!near_limit(&[], 800_000));
        let mut unknown = s(100, 0);
        unknown.current_limit = None;
        assert!(!near_limit(&[unknown], 800_000));
        assert!(!near_limit(&[s(0, 0)], 800_000));
        // Remaining above the limit (a service that says so) is not near.
        assert!(!near_limit(&[s(10, 50)], 800_000));
        // u32::MAX limits do not overflow.
        assert!(near_limit(&[s(u32::MAX, 0)], 1_000_000));
    }

    #[test]
    fn an_over_limit_answer_without_statuses_never_guesses_retry_after() {
        // A server that sends no statuses (Limitador): no Retry-After of our
        // own, and no X-RateLimit-* (nothing to describe).
        let bare = with_headers(Code::OverLimit, vec![], &[], &[]);
        let a = decide_body(HeaderMode::DraftVersion03, 0, Some(&bare));
        assert_eq!(a.verdict, Verdict::OverLimit(vec![], vec![]));
        // Its own reset header gives the Retry-After.
        let reset = with_headers(Code::OverLimit, vec![], &[("RateLimit-Reset", "54")], &[]);
        let a = decide_body(HeaderMode::DraftVersion03, 0, Some(&reset));
        assert_eq!(
            a.verdict,
            Verdict::OverLimit(vec![(RETRY_AFTER, "54".into())], vec![])
        );
        assert_eq!(a.to_client, pairs_of(&[("ratelimit-reset", "54")]));
        // Its own Retry-After is forwarded, once.
        let retry = with_headers(Code::OverLimit, vec![], &[("Retry-After", "59")], &[]);
        let a = decide_body(HeaderMode::IetfDraft10, 0, Some(&retry));
        assert_eq!(a.verdict, Verdict::OverLimit(vec![], vec![]));
        assert_eq!(a.to_client, pairs_of(&[("retry-after", "59")]));
    }

    #[test]
    fn the_filters_own_headers_win_over_the_services() {
        let body = with_headers(
            Code::OverLimit,
            vec![status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 20)],
            &[
                ("Retry-After", "1"),
                ("X-RateLimit-Limit", "99"),
                ("X-Service", "s"),
            ],
            &[("x-to-upstream", "u")],
        );
        let a = decide_body(HeaderMode::DraftVersion03, 0, Some(&body));
        match &a.verdict {
            Verdict::OverLimit(h, _) => {
                assert!(h.contains(&(RETRY_AFTER, "20".into())));
                assert!(h.contains(&(X_RATELIMIT_LIMIT, "5, 5;w=60".into())));
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(a.to_client, pairs_of(&[("x-service", "s")]));
        assert_eq!(a.dropped, 2);
        // A refused request never goes upstream: nothing for it.
        assert!(a.to_upstream.is_empty());
        // With headers off, the service's X-RateLimit-* pass.
        let a = decide_body(HeaderMode::Off, 0, Some(&body));
        assert_eq!(
            a.to_client,
            pairs_of(&[("x-ratelimit-limit", "99"), ("x-service", "s")])
        );
        let ok = with_headers(
            Code::Ok,
            vec![status(Code::Ok, 5, RateLimitUnit::Minute, 3, 20)],
            &[("x-service", "s")],
            &[("X-To-Upstream", "u\r\n")],
        );
        let a = decide_body(HeaderMode::IetfDraft10, 0, Some(&ok));
        assert_eq!(
            a.verdict,
            Verdict::Allow(
                vec![
                    (
                        crate::headers::RATELIMIT_POLICY,
                        r#""per_minute";q=5;w=60"#.into()
                    ),
                    (crate::headers::RATELIMIT, r#""per_minute";r=3;t=20"#.into()),
                ],
                vec![status(Code::Ok, 5, RateLimitUnit::Minute, 3, 20)]
            )
        );
        assert_eq!(a.to_client, pairs_of(&[("x-service", "s")]));
        assert_eq!(a.to_upstream, pairs_of(&[("x-to-upstream", "u")]));
    }

    #[test]
    fn failures_are_errors_not_decisions() {
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 14, None),
            Verdict::Error(RlsError::Grpc(14))
        );
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 0, None),
            Verdict::Error(RlsError::Undecodable)
        );
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 0, Some(&[0xff, 0xff])),
            Verdict::Error(RlsError::Undecodable)
        );
        let unknown = answer(Code::Unknown, vec![]);
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 0, Some(&unknown)),
            Verdict::Error(RlsError::UnknownCode)
        );
    }

    #[test]
    fn an_empty_body_is_not_an_admit() {
        // An empty message decodes to overall_code UNKNOWN: an error, not an admit.
        assert_eq!(
            verdict(HeaderMode::DraftVersion03, 0, Some(&[])),
            Verdict::Error(RlsError::UnknownCode)
        );
    }

    proptest::proptest! {
        #[test]
        fn any_answer_bytes_give_a_verdict(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256), status in 0u32..20) {
            let _ = verdict(HeaderMode::DraftVersion03, status, Some(&body));
        }

        #[test]
        fn any_tenant_bytes_give_a_step(tenant in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let c = compiled(json!({}));
            match first_step(&c, &Read::Value(tenant.clone())) {
                Step::Limit(l) => {
                    // Never more than max_tenant_length raw bytes reach the
                    // service (escaped, at most three times as many), and
                    // the message decodes: the value is a valid string.
                    proptest::prop_assert!(tenant.len() <= 128);
                    proptest::prop_assert!(l.tenant.len() <= 3 * tenant.len());
                    RateLimitRequest::decode(&encode_request(&c, &l, 0)[..]).unwrap();
                }
                Step::TenantTooLong => proptest::prop_assert!(tenant.len() > 128),
                _ => proptest::prop_assert!(false),
            }
        }
    }
}
