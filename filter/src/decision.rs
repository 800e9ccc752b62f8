//! The two decisions the request flow (`flow`) takes from data alone: the
//! first step, from the compiled configuration and the tenant header; the
//! verdict, from the rate-limit service's answer (`answer`, with its
//! headers). Also the call's message, for a request or for a tenant the
//! root calls about.

use std::borrow::Cow;

use ratelimit_config::plugin::PPM;
use ratelimit_config::{descriptors, Group, HeaderMode, MissingTenant, PluginConfig};

use crate::answer::{decode, Answer};
use crate::headers::{forwarded, limit_headers, retry_after_from_headers};
use crate::proto::{encode_rate_limit_request, grpc_upstream, DescriptorStatus};

pub use crate::answer::RlsError;

/// The configuration compiled once per VM in `on_configure`.
pub struct Compiled {
    pub config: PluginConfig,
    /// What `dispatch_grpc_call` is given as its upstream.
    pub upstream: String,
    /// `config.max_tenant_length`, as a length.
    pub max_tenant_length: usize,
}

impl Compiled {
    pub fn new(config: PluginConfig) -> Compiled {
        let upstream = grpc_upstream(&config.cluster);
        let max_tenant_length = usize::try_from(config.max_tenant_length).unwrap_or(usize::MAX);
        Compiled {
            config,
            upstream,
            max_tenant_length,
        }
    }
}

/// The first step for a request, from its tenant header.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// No tenant header (or an empty one) and `missing_tenant: allow`:
    /// pass it on.
    AllowMissingTenant,
    /// No tenant header (or an empty one) and `missing_tenant: deny`.
    DenyMissingTenant,
    /// A tenant value longer than `max_tenant_length` bytes: refused (431),
    /// never sent to the service, whatever group it would fall in.
    TenantTooLong,
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
    /// The group's index in `limits.all_groups()`: its per-group counters.
    pub group_index: usize,
    pub tenant: Cow<'a, str>,
}

/// Decides the first step. `tenant` is the raw header value, if any. Its
/// length is checked on these raw bytes, before anything else is done with
/// it: a long value would otherwise become a long counter key in Redis (and
/// its lossy form can be up to three times longer). A value that is not
/// UTF-8 is limited as its lossy UTF-8 form, so a hostile byte string is
/// still a tenant with its own counter, never a way around it.
pub fn first_step<'a>(c: &'a Compiled, tenant: Option<&'a [u8]>) -> Step<'a> {
    let tenant = match tenant {
        Some(t) if t.len() > c.max_tenant_length => return Step::TenantTooLong,
        Some(t) if !t.is_empty() => String::from_utf8_lossy(t),
        _ => {
            return match c.config.missing_tenant {
                MissingTenant::Allow => Step::AllowMissingTenant,
                MissingTenant::Deny => Step::DenyMissingTenant,
            }
        }
    };
    match c.config.limits.group_index_for(&tenant) {
        Some((group_index, group)) => Step::Limit(Limited {
            group,
            group_index,
            tenant,
        }),
        None => Step::NotLimited,
    }
}

/// The encoded `RateLimitRequest` for a limited tenant: one descriptor per
/// unit its group limits, each counting `hits_addend` hits (0 counts 1).
pub fn encode_request(c: &Compiled, l: &Limited<'_>, hits_addend: u32) -> Vec<u8> {
    encode_rate_limit_request(&c.config.domain, hits_addend, || {
        descriptors(l.group, &c.config.descriptor_key, &l.tenant).map(|(_, entries)| entries)
    })
}

/// The message of a call about `tenant` of the group with index `group`
/// (a lease refill, a sync push): the group's descriptors, each counting
/// `hits`. None if the configuration has no such group.
pub fn tenant_message(c: &Compiled, group: usize, tenant: &str, hits: u32) -> Option<Vec<u8>> {
    let limited = Limited {
        group: c.config.limits.all_groups().nth(group)?,
        group_index: group,
        tenant: Cow::Borrowed(tenant),
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

pub use crate::headers::{
    draft03_headers, retry_after, RETRY_AFTER, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};

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
    decide(mode, decode(grpc_status, body)).verdict
}

/// Decides from the decoded answer, with the service's headers to forward.
/// The filter's own headers win: a forwarded header of the same name is
/// left out. A refusal carries Retry-After from the statuses; without any
/// that says when its window resets, from the service's own Retry-After or
/// reset header; else none (never a guess).
pub fn decide(mode: HeaderMode, answer: Result<Answer, RlsError>) -> Decision {
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
        decide(mode, decode(grpc_status, body))
    }
    use crate::testing::{answer, status};
    use ratelimit_config::parse_plugin_config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn compiled(extra: &str) -> Compiled {
        let text = format!(
            r#"{{"domain": "internal-api", "rate_limit_service": {{"cluster": "ratelimit"}},
               "limits": {{"x-tenant-id": {{
                  "default": {{"persecond": 5, "perhour": 30}},
                  "gold": {{"perminute": 70, "header_value": ["tenant-b"]}}}}}}{extra}}}"#
        );
        Compiled::new(parse_plugin_config(text.as_bytes()).unwrap().0)
    }

    fn asked(c: &Compiled, tenant: &[u8]) -> RateLimitRequest {
        match first_step(c, Some(tenant)) {
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
        let r = asked(&compiled(""), b"tenant-a");
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
        let r = asked(&compiled(""), b"tenant-b");
        assert_eq!(
            pairs(&r),
            vec![vec![
                p("generic_key", "per_minute"),
                p("tenant", "tenant-b")
            ]]
        );
    }

    #[test]
    fn missing_or_empty_tenant_follows_the_policy() {
        assert_eq!(first_step(&compiled(""), None), Step::AllowMissingTenant);
        assert_eq!(
            first_step(&compiled(""), Some(b"")),
            Step::AllowMissingTenant
        );
        let deny = compiled(r#", "missing_tenant": "deny""#);
        assert_eq!(first_step(&deny, None), Step::DenyMissingTenant);
    }

    #[test]
    fn a_tenant_no_group_limits_is_not_limited() {
        let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "c"},
            "limits": {"x-tenant-id": {"gold": {"perminute": 70, "header_value": ["tenant-b"]}}}}"#;
        let c = Compiled::new(parse_plugin_config(text.as_bytes()).unwrap().0);
        assert_eq!(first_step(&c, Some(b"tenant-a")), Step::NotLimited);
        assert!(matches!(first_step(&c, Some(b"tenant-b")), Step::Limit(_)));
        assert_eq!(first_step(&c, None), Step::AllowMissingTenant);
    }

    #[test]
    fn hostile_bytes_are_still_a_limited_tenant() {
        let r = asked(&compiled(""), &[0xff, 0xfe, b'a', 0]);
        assert_eq!(r.descriptors[0].entries[1].value, "\u{fffd}\u{fffd}a\u{0}");
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
            let c = compiled("");
            match first_step(&c, Some(&tenant)) {
                Step::Limit(l) => {
                    // Never more than max_tenant_length raw bytes reach the
                    // service (the lossy form may be longer).
                    proptest::prop_assert!(tenant.len() <= 128);
                    RateLimitRequest::decode(&encode_request(&c, &l, 0)[..]).unwrap();
                }
                Step::AllowMissingTenant => proptest::prop_assert!(tenant.is_empty()),
                Step::TenantTooLong => proptest::prop_assert!(tenant.len() > 128),
                Step::NotLimited | Step::DenyMissingTenant => proptest::prop_assert!(false),
            }
        }
    }
}
