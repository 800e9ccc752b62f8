//! The whole flow against the in-memory host, one path each.

use prost::Message;

use super::{Next, Stream};
use crate::access_log;
use crate::compiled::Compiled;
use crate::counters::{Counter, GroupCounter, Histogram};
use crate::health::WARN_INTERVAL_MS;
use crate::host::HostCall;
use crate::local::{slot_for, Slot, SlotKey};
use crate::proto::{Code, DescriptorStatus, RateLimitRequest, RateLimitUnit, METHOD, SERVICE};
use crate::testing::{compiled_json, group_id, host, slot_of, status, MemHost, Worker, NOW};
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const HEADER: &str = "x-tenant-id";

/// The seed's groups (tenant-b is gold), plus `extra` top-level keys.
fn config(extra: Value) -> Compiled {
    config_with_limits(
        json!({"x-tenant-id": {
            "default": {"persecond": 5, "perminute": 20, "perhour": 30},
            "gold": {"persecond": 50, "perhour": 100, "header_value": ["tenant-b"]}}}),
        extra,
    )
}

/// Each request's call goes at once (`max_in_flight` 64): how requests
/// share calls is `batch`'s tests'.
fn config_with_limits(limits: Value, extra: Value) -> Compiled {
    let base = json!({"domain": "internal-api",
        "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25, "batch": {"max_in_flight": 64}},
        "limits": limits});
    compiled_json(base, extra)
}

/// A request of `tenant` (None: without the header) up to its first answer.
fn request(c: &Compiled, h: &Worker, tenant: Option<&str>) -> (Stream, Next) {
    match tenant {
        Some(t) => h.set_request_header(HEADER, t.as_bytes()),
        None => h.remove_request_header(HEADER),
    }
    let mut s = h.stream();
    let next = s.on_request_headers(c, h, &h.vm);
    (s, next)
}

/// A request of `tenant` that asked the service, and the call's failure
/// (the service is down): one call per request, whatever else is under way.
fn answered(c: &Compiled, h: &Worker, tenant: &str) {
    let (mut s, next) = request(c, h, Some(tenant));
    assert_eq!(next, Next::Pause);
    h.answer(c, &mut s, 14, 0);
}

/// The service's answer reaches the stream.
fn respond(c: &Compiled, h: &Worker, s: &mut Stream, code: Code, statuses: Vec<DescriptorStatus>) {
    let body = crate::testing::answer(code, statuses);
    let size = body.len();
    h.set_grpc_response(Some(body));
    h.answer(c, s, 0, size);
}

fn ok_answer() -> Vec<DescriptorStatus> {
    vec![
        status(Code::Ok, 5, RateLimitUnit::Second, 4, 1),
        status(Code::Ok, 20, RateLimitUnit::Minute, 3, 40),
        status(Code::Ok, 30, RateLimitUnit::Hour, 9, 1_000),
    ]
}

fn over_limit_answer() -> Vec<DescriptorStatus> {
    vec![
        status(Code::Ok, 5, RateLimitUnit::Second, 4, 1),
        status(Code::OverLimit, 20, RateLimitUnit::Minute, 0, 40),
        status(Code::Ok, 30, RateLimitUnit::Hour, 9, 1_000),
    ]
}

/// The counters that are not 0, but the descriptors sent (which count
/// calls, as `call_count` does).
fn counted(h: &MemHost) -> Vec<(&'static str, u64)> {
    let mut all = h.counted();
    all.retain(|(name, _)| *name != Counter::RlsDescriptors.name());
    all
}

fn n(c: Counter, times: u64) -> (&'static str, u64) {
    (c.name(), times)
}

#[test]
fn a_missing_tenant_is_allowed_and_counted() {
    let c = config(json!({}));
    let h = host(&c);
    let (_, next) = request(&c, &h, None);
    assert_eq!(next, Next::Continue);
    assert_eq!(counted(&h), vec![n(Counter::MissingTenant, 1)]);
    assert_eq!((h.call_count(), h.reply_count()), (0, 0));
}

/// The tenant sent to the service by the last call.
fn tenant_asked(h: &MemHost) -> String {
    let call = h.calls().pop().unwrap();
    let r = RateLimitRequest::decode(&call.message[..]).unwrap();
    r.descriptors[0].entries[1].value.clone()
}

#[test]
fn an_empty_tenant_is_a_tenant_with_its_own_counter() {
    // As in Envoy's own rate-limit filter: the header was sent, empty.
    // Everyone who sends it empty shares that one counter; it is never a
    // way around the limit, with either policy.
    for policy in ["allow", "deny"] {
        let c = config(json!({"missing_tenant": policy}));
        let h = host(&c);
        let (_, next) = request(&c, &h, Some(""));
        assert_eq!((next, h.call_count(), h.reply_count()), (Next::Pause, 1, 0));
        assert_eq!(tenant_asked(&h), "");
        assert_eq!(counted(&h), vec![]);
    }
}

#[test]
fn a_tenant_header_sent_twice_is_a_400_never_asked() {
    let c = config(json!({}));
    let h = host(&c);
    let slots_before = h.shared_snapshot();
    // An empty first value would once have been no tenant at all.
    for (first, second) in [
        ("", "tenant-a"),
        ("tenant-a", "tenant-b"),
        ("tenant-a", "tenant-a"),
    ] {
        h.set_request_header(HEADER, first.as_bytes());
        h.append_request_header(HEADER, second.as_bytes());
        let mut s = Stream::default();
        assert_eq!(s.on_request_headers(&c, &h, &h.vm), Next::Pause);
    }
    let replies = h.replies();
    assert_eq!(replies.len(), 3);
    assert!(replies.iter().all(|r| r.status == 400), "{replies:?}");
    assert_eq!(replies[0].body, "tenant header sent more than once\n");
    assert_eq!(counted(&h), vec![n(Counter::TenantRepeated, 3)]);
    assert_eq!(h.call_count(), 0);
    assert_eq!(h.shared_snapshot(), slots_before);
    let sources: Vec<String> = h
        .properties()
        .into_iter()
        .filter(|(k, _)| k == access_log::SOURCE)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(sources, ["tenant_repeated"; 3]);
    // One value holding a comma is one tenant.
    let (_, next) = request(&c, &h, Some("a,b"));
    assert_eq!((next, h.call_count()), (Next::Pause, 1));
    assert_eq!(tenant_asked(&h), "a,b");
}

#[test]
fn the_tenant_from_a_property_reads_no_header() {
    let c = config(
        json!({"tenant_source": {"property": ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "tenant"]}}),
    );
    let h = host(&c);
    h.fail(HostCall::RequestHeader);
    h.set_request_header(HEADER, b"victim");
    h.set_attribute(
        "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0tenant",
        b"tenant-b",
    );
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&c, &h, &h.vm), Next::Pause);
    assert_eq!(tenant_asked(&h), "tenant-b");
    // Its group is the one that lists it.
    let r = RateLimitRequest::decode(&h.calls()[0].message[..]).unwrap();
    assert_eq!(r.descriptors.len(), 2);
    assert_eq!(counted(&h), vec![]);
}

#[test]
fn a_missing_tenant_is_denied_with_the_deny_policy() {
    let c = config(json!({"missing_tenant": "deny"}));
    let h = host(&c);
    let (_, next) = request(&c, &h, None);
    assert_eq!(next, Next::Pause);
    let replies = h.replies();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].status, 429);
    assert_eq!(replies[0].body, "missing tenant header\n");
    assert_eq!(counted(&h), vec![n(Counter::MissingTenant, 1)]);
    assert_eq!(h.call_count(), 0);
}

#[test]
fn a_tenant_no_group_limits_passes_uncounted() {
    let c = config_with_limits(
        json!({"x-tenant-id": {"gold": {"perhour": 100, "header_value": ["tenant-b"]}}}),
        json!({}),
    );
    let h = host(&c);
    let (mut s, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!(s.on_response_headers(&c, &h, &h.vm), Next::Continue);
    // Not a missing tenant: nothing is counted, nothing asked.
    assert_eq!(counted(&h), vec![]);
    assert_eq!((h.call_count(), h.reply_count()), (0, 0));
    assert!(h.added_headers().is_empty());
}

#[test]
fn an_admitted_request_asks_once_and_carries_the_headers() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    let calls = h.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(
        (call.service.as_str(), call.method.as_str()),
        (SERVICE, METHOD)
    );
    assert_eq!(call.upstream, c.upstream);
    assert_eq!(call.timeout_ms, 25);
    let asked = RateLimitRequest::decode(&call.message[..]).unwrap();
    assert_eq!(asked.domain, "internal-api");
    let units: Vec<&str> = asked
        .descriptors
        .iter()
        .map(|d| d.entries[0].value.as_str())
        .collect();
    assert_eq!(units, ["per_second", "per_minute", "per_hour"]);
    assert!(asked
        .descriptors
        .iter()
        .all(|d| d.entries[1].key == "tenant" && d.entries[1].value == "tenant-a"));

    respond(&c, &h, &mut s, Code::Ok, ok_answer());
    assert_eq!(h.resumed(), 1);
    assert_eq!(s.on_response_headers(&c, &h, &h.vm), Next::Continue);
    assert_eq!(
        h.added_headers(),
        vec![
            (
                "x-ratelimit-limit".into(),
                "20, 5;w=1, 20;w=60, 30;w=3600".into()
            ),
            ("x-ratelimit-remaining".into(), "3".into()),
            ("x-ratelimit-reset".into(), "40".into()),
        ]
    );
    assert_eq!(counted(&h), vec![n(Counter::Allowed, 1)]);
    assert_eq!(h.reply_count(), 0);
}

#[test]
fn a_refusal_by_the_service_is_a_429_and_fills_the_cache() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    // Not resumed: the 429 went out instead.
    assert_eq!(h.resumed(), 0);
    let replies = h.replies();
    assert_eq!(replies.len(), 1);
    let r = &replies[0];
    assert_eq!(r.status, 429);
    assert_eq!(r.body, "rate limit exceeded\n");
    assert_eq!(r.header("retry-after"), Some("40"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(counted(&h), vec![n(Counter::OverLimit, 1)]);
    // Its own headers are on the reply, none is added to it again.
    s.on_response_headers(&c, &h, &h.vm);
    assert!(h.added_headers().is_empty());
    // The tenant's slot remembers the refusal until the minute's window
    // ends: asked at 20.25 s past a whole second, 40 s left.
    let group = &c.config.limits.group_for("tenant-a").unwrap().name;
    let at = slot_of(&c, &h.slot_secret(), group, "tenant-a");
    let stored = h.shared_value(&SlotKey::new(at.index)).unwrap();
    let slot = Slot::decode(&stored).unwrap();
    assert_eq!(slot.fingerprint, at.fingerprint);
    assert_eq!(slot.over_limit.unwrap().until_ms, NOW - 250 + 40_000);
}

#[test]
fn a_cached_refusal_answers_without_a_call_until_the_window_ends() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    h.set_now_ms(NOW + 10_000);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.call_count(), 1);
    let replies = h.replies();
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[1].status, 429);
    assert_eq!(replies[1].header("retry-after"), Some("30"));
    assert_eq!(replies[1].header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(
        counted(&h),
        vec![n(Counter::OverLimit, 1), n(Counter::CachedOverLimit, 1)]
    );
    // Another tenant is still asked about.
    let (_, next) = request(&c, &h, Some("tenant-c"));
    assert_eq!((next, h.call_count()), (Next::Pause, 2));
    // When the window has ended, the tenant is asked about again.
    h.set_now_ms(NOW - 250 + 40_000);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 3));
}

#[test]
fn an_empty_bucket_refuses_without_a_call() {
    let c = config(json!({"local": {"groups": {"default": {"tokens_per_second": 1, "burst": 2}}}}));
    let h = host(&c);
    for _ in 0..2 {
        let (mut s, next) = request(&c, &h, Some("tenant-a"));
        assert_eq!(next, Next::Pause);
        respond(&c, &h, &mut s, Code::Ok, ok_answer());
    }
    h.set_now_ms(NOW + 100);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.call_count(), 2);
    let r = &h.replies()[0];
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(
        counted(&h),
        vec![n(Counter::Allowed, 2), n(Counter::LocalOverLimit, 1)]
    );
    // A token later, the tenant is asked about again.
    h.set_now_ms(NOW + 1_000);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 3));
}

#[test]
fn a_tenant_whose_slot_another_uses_is_asked_about_and_counted() {
    // One slot for everyone: tenant-a takes a token and holds it.
    let c = config(json!({"local": {"slots": 1}}));
    let h = host(&c);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    let (_, next) = request(&c, &h, Some("tenant-c"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.call_count(), 2);
    assert_eq!(counted(&h), vec![n(Counter::SlotContended, 1)]);
}

#[test]
fn a_tenant_whose_slot_another_holds_takes_the_next_free_one() {
    // Two slots, three tenants, each with a bucket of 2: the first two
    // hash to the same slot, yet each holds one, so both are shed locally;
    // the third finds both held and is asked about every time.
    let c = config(
        json!({"local": {"slots": 2, "groups": {"default": {"tokens_per_second": 1, "burst": 2}}}}),
    );
    let h = host(&c);
    // A second tenant whose own slot is tenant-a's (the default group).
    let group = group_id(&c, "default").unwrap_or_default();
    let home = |t: &str| slot_for(&h.vm.slot_secret, c.scope(group), t, 2).index;
    let second = (0..100)
        .map(|i| format!("tenant-{i}"))
        .find(|t| home(t) == home("tenant-a"))
        .unwrap_or_default();
    for tenant in ["tenant-a", second.as_str()] {
        for _ in 0..2 {
            let (mut s, next) = request(&c, &h, Some(tenant));
            assert_eq!(next, Next::Pause);
            respond(&c, &h, &mut s, Code::Ok, ok_answer());
        }
        let (_, next) = request(&c, &h, Some(tenant));
        assert_eq!(next, Next::Pause);
    }
    assert_eq!(h.call_count(), 4);
    assert_eq!(h.replies().len(), 2);
    assert_eq!(h.counter(Counter::SlotContended), 0);
    for _ in 0..3 {
        let (mut s, next) = request(&c, &h, Some("tenant-d"));
        assert_eq!(next, Next::Pause);
        respond(&c, &h, &mut s, Code::Ok, ok_answer());
    }
    assert_eq!((h.call_count(), h.replies().len()), (7, 2));
    assert_eq!(h.counter(Counter::SlotContended), 3);
}

#[test]
fn a_failed_call_fails_open_by_default() {
    let c = config(json!({}));
    let h = host(&c);
    // A timeout and a refused connection both arrive as UNAVAILABLE (14).
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    h.answer(&c, &mut s, 14, 0);
    assert_eq!(h.resumed(), 1);
    assert_eq!(h.reply_count(), 0);
    s.on_response_headers(&c, &h, &h.vm);
    assert!(h.added_headers().is_empty());
    assert_eq!(
        counted(&h),
        vec![n(Counter::FailureModeAllowed, 1), n(Counter::RlsError, 1)]
    );
}

#[test]
fn a_failed_call_fails_closed_with_failure_mode_deny() {
    let c = config(json!({"failure_mode_deny": true, "status_on_error": 503}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    h.answer(&c, &mut s, 4, 0);
    assert_eq!(h.resumed(), 0);
    let r = &h.replies()[0];
    assert_eq!(
        (r.status, r.body.as_str()),
        (503, "rate limiter unavailable\n")
    );
    assert!(r.headers.is_empty());
    assert_eq!(
        counted(&h),
        vec![n(Counter::FailureModeDenied, 1), n(Counter::RlsError, 1)]
    );
}

#[test]
fn an_undecodable_answer_is_a_limiter_error() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    h.set_grpc_response(Some(vec![0x12, 0x05, 0x08]));
    h.answer(&c, &mut s, 0, 3);
    assert_eq!(h.resumed(), 1);
    assert_eq!(
        counted(&h),
        vec![n(Counter::FailureModeAllowed, 1), n(Counter::RlsError, 1)]
    );
    // So is an answer whose body cannot be read.
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    h.fail(HostCall::GrpcResponse);
    h.answer(&c, &mut s, 0, 3);
    assert_eq!(h.resumed(), 2);
    assert_eq!(h.counter(Counter::RlsError), 2);
}

#[test]
fn a_header_that_cannot_be_read_is_a_limiter_error() {
    let c = config(json!({}));
    let h = host(&c);
    h.fail(HostCall::Property);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!(h.call_count(), 0);
    assert_eq!(
        counted(&h),
        vec![n(Counter::FailureModeAllowed, 1), n(Counter::RlsError, 1)]
    );
    // Failing closed, it is refused.
    let c = config(json!({"failure_mode_deny": true}));
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.replies()[0].status, 500);
}

#[test]
fn shared_data_failures_skip_the_local_layer() {
    let c = config(json!({}));
    for broken in [HostCall::GetShared, HostCall::SetShared] {
        let h = host(&c);
        h.fail(broken);
        let (mut s, next) = request(&c, &h, Some("tenant-a"));
        // The service still decides.
        assert_eq!(next, Next::Pause, "{broken:?}");
        assert_eq!(h.call_count(), 1);
        assert_eq!(counted(&h), vec![n(Counter::LocalError, 1)]);
        // Its refusal cannot be remembered: still a 429.
        respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
        assert_eq!(h.replies()[0].status, 429);
        assert_eq!(
            counted(&h),
            vec![n(Counter::OverLimit, 1), n(Counter::LocalError, 2)]
        );
    }
}

#[test]
fn lost_cas_races_skip_the_local_layer() {
    let c = config(json!({}));
    let h = host(&c);
    // Another worker writes between every read and write.
    h.interfere(u32::MAX, |stored| {
        stored.map(<[u8]>::to_vec).unwrap_or_default()
    });
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.call_count(), 1);
    assert_eq!(counted(&h), vec![n(Counter::CasRetriesExhausted, 1)]);
}

#[test]
fn a_failed_dispatch_fails_open_or_closed() {
    let c = config(json!({}));
    let h = host(&c);
    h.fail(HostCall::Dispatch);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!(
        counted(&h),
        vec![
            n(Counter::FailureModeAllowed, 1),
            n(Counter::RlsError, 1),
            n(Counter::RlsDispatchFailed, 1)
        ]
    );
    let c = config(json!({"failure_mode_deny": true}));
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.replies()[0].status, 500);
    assert_eq!(h.counter(Counter::FailureModeDenied), 1);
}

#[test]
fn a_local_reply_that_fails_lets_the_request_through() {
    // Refused locally: nothing can be sent, so the request goes on rather
    // than hang.
    let c = config(json!({"missing_tenant": "deny"}));
    let h = host(&c);
    h.fail(HostCall::Reply);
    let (_, next) = request(&c, &h, None);
    assert_eq!(next, Next::Continue);
    // Refused by the service: resumed.
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    assert_eq!(h.resumed(), 1);
    assert_eq!(h.reply_count(), 0);
}

#[test]
fn without_the_local_layer_nothing_is_read_or_written() {
    let c = config(json!({"local": {"enabled": false}}));
    let h = Worker::new();
    h.set_now_ms(NOW);
    // Any shared-data call would fail: none is made.
    h.fail(HostCall::GetShared);
    h.fail(HostCall::SetShared);
    let (mut s, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    assert_eq!(counted(&h), vec![n(Counter::OverLimit, 1)]);
    // The next request is asked about again.
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 2));
}

fn default_only() -> Value {
    json!({"x-tenant-id": {"default": {"perhour": 30}}})
}

#[test]
fn a_tenant_longer_than_max_tenant_length_is_a_431_never_asked_and_never_stored() {
    let c = config(json!({"max_tenant_length": 16}));
    let h = host(&c);
    let slots_before = h.shared_snapshot();
    // 17 bytes: one more than allowed.
    let (mut s, next) = request(&c, &h, Some("tenant-aaaaaaaaaa"));
    assert_eq!(next, Next::Pause);
    let replies = h.replies();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].status, 431);
    assert_eq!(replies[0].body, "tenant header value too long\n");
    assert_eq!(counted(&h), vec![n(Counter::TenantTooLong, 1)]);
    // Never sent to the service, and the local layer was not touched.
    assert_eq!(h.call_count(), 0);
    assert_eq!(h.shared_snapshot(), slots_before);
    assert_eq!(s.on_response_headers(&c, &h, &h.vm), Next::Continue);
    assert!(h.added_headers().is_empty());
}

#[test]
fn a_tenant_of_exactly_max_tenant_length_is_limited_as_before() {
    let c = config(json!({"max_tenant_length": 16}));
    let h = host(&c);
    let (_, next) = request(&c, &h, Some("tenant-aaaaaaaaa"));
    assert_eq!(next, Next::Pause);
    assert_eq!((h.call_count(), h.reply_count()), (1, 0));
    assert_eq!(counted(&h), vec![]);
}

#[test]
fn the_length_is_counted_in_raw_bytes_not_in_lossy_characters() {
    let c = config_with_limits(default_only(), json!({"max_tenant_length": 4}));
    let h = host(&c);
    // Four bytes that are not UTF-8 (four replacement characters, twelve
    // bytes, once lossy): within the cap, limited.
    h.set_request_header(HEADER, &[0xff; 4]);
    let mut s = h.stream();
    assert_eq!(s.on_request_headers(&c, &h, &h.vm), Next::Pause);
    assert_eq!(h.call_count(), 1);
    // Five: refused.
    h.set_request_header(HEADER, &[0xff; 5]);
    let mut s = h.stream();
    assert_eq!(s.on_request_headers(&c, &h, &h.vm), Next::Pause);
    assert_eq!(h.call_count(), 1);
    assert_eq!(h.replies()[0].status, 431);
    assert_eq!(counted(&h), vec![n(Counter::TenantTooLong, 1)]);
}

#[test]
fn a_431_that_cannot_be_sent_lets_the_request_through_unasked() {
    // The reply failing is a host failure: the request goes on rather than
    // hang (as for every local reply); it still never reaches the service.
    let c = config_with_limits(default_only(), json!({"max_tenant_length": 4}));
    let h = host(&c);
    h.fail(HostCall::Reply);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!(h.call_count(), 0);
    assert_eq!(counted(&h), vec![n(Counter::TenantTooLong, 1)]);
}

#[test]
fn a_long_tenant_is_refused_even_where_no_group_would_limit_it() {
    // The length is decided before the group: one documented outcome.
    let c = config_with_limits(
        json!({"x-tenant-id": {"gold": {"perhour": 100, "header_value": ["tenant-b"]}}}),
        json!({"max_tenant_length": 8}),
    );
    let h = host(&c);
    let (_, next) = request(&c, &h, Some("tenant-bb"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.replies()[0].status, 431);
    let (_, next) = request(&c, &h, Some("tenant-b"));
    assert_eq!(next, Next::Pause);
    assert_eq!((h.call_count(), h.reply_count()), (1, 1));
    assert_eq!(counted(&h), vec![n(Counter::TenantTooLong, 1)]);
}

#[test]
fn the_slot_secret_decides_where_a_tenant_lives_so_vms_must_share_it() {
    // One shared-data store, as every VM of one Envoy has. Bucket: the
    // default group's 5 per second. The calls fail: no breaker, which would
    // open and write its own shared value.
    let c = config(json!({"breaker": {"enabled": false}}));
    let h = host(&c);
    for _ in 0..5 {
        answered(&c, &h, "tenant-a");
    }
    assert_eq!(h.call_count(), 5);
    h.clear_counters();
    // Another VM with the same secret finds the same bucket, empty.
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 5));
    assert_eq!(counted(&h), vec![n(Counter::LocalOverLimit, 1)]);
    // A VM with another secret would look elsewhere and find a full
    // bucket: what `local::secret::agree` prevents.
    let used = h.shared_snapshot();
    let mut h = h;
    h.set_slot_secret(crate::local::SlotSecret::from_bytes([42; 16]));
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 6));
    let after = h.shared_snapshot();
    let changed: Vec<&String> = after
        .iter()
        .zip(&used)
        .filter(|(now, before)| now != before)
        .map(|(now, _)| &now.0)
        .collect();
    let group = "default";
    let original = slot_of(
        &c,
        &crate::local::SlotSecret::from_bytes(crate::testing::MEMHOST_SECRET),
        group,
        "tenant-a",
    );
    let other = slot_of(&c, &h.slot_secret(), group, "tenant-a");
    assert_ne!(original.index, other.index);
    assert_eq!(changed, vec![SlotKey::new(other.index).as_str()]);
}

// ---- Shadow mode, per-group counters, near limit, access-log properties.

/// Group indices in `config(json!({}))`'s `all_groups()`.
const DEFAULT: usize = 0;
const GOLD: usize = 1;

fn props(h: &MemHost) -> Vec<(String, String)> {
    h.properties()
}

fn logged(
    tenant: Option<&str>,
    group: Option<&str>,
    verdict: &str,
    source: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(t) = tenant {
        out.push((access_log::TENANT.to_string(), t.to_string()));
    }
    if let Some(g) = group {
        out.push((access_log::GROUP.to_string(), g.to_string()));
    }
    out.push((access_log::VERDICT.to_string(), verdict.to_string()));
    out.push((access_log::SOURCE.to_string(), source.to_string()));
    out
}

#[test]
fn an_admitted_request_counts_in_its_group_and_sets_no_property() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    respond(
        &c,
        &h,
        &mut s,
        Code::Ok,
        vec![status(Code::Ok, 50, RateLimitUnit::Second, 49, 1)],
    );
    assert_eq!(h.group_counted(), vec![(GOLD, "admitted", 1)]);
    assert!(props(&h).is_empty());
}

#[test]
fn refusals_count_by_group_and_source_and_tell_the_access_log() {
    let c = config(json!({"local": {"groups": {"default": {"tokens_per_second": 1, "burst": 1}}}}));
    let h = host(&c);
    // Service: the tenant is read again for the log.
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    assert_eq!(
        props(&h),
        logged(Some("tenant-a"), Some("default"), "refused", "service")
    );
    h.clear_properties();
    // Cache.
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(
        props(&h),
        logged(Some("tenant-a"), Some("default"), "refused", "cache")
    );
    h.clear_properties();
    // Bucket (another tenant, one token, spent).
    let (mut s, _) = request(&c, &h, Some("tenant-c"));
    respond(&c, &h, &mut s, Code::Ok, ok_answer());
    let (_, next) = request(&c, &h, Some("tenant-c"));
    assert_eq!(next, Next::Pause);
    assert_eq!(
        props(&h),
        logged(Some("tenant-c"), Some("default"), "refused", "bucket")
    );
    assert_eq!(
        h.group_counted(),
        vec![
            (DEFAULT, "refused.service", 1),
            (DEFAULT, "refused.cache", 1),
            (DEFAULT, "admitted", 1),
            // ok_answer leaves 3 of 20 per minute: near the limit.
            (DEFAULT, "near_limit", 1),
            (DEFAULT, "refused.bucket", 1),
        ]
    );
    assert_eq!(
        counted(&h),
        vec![
            n(Counter::Allowed, 1),
            n(Counter::OverLimit, 1),
            n(Counter::LocalOverLimit, 1),
            n(Counter::CachedOverLimit, 1),
        ]
    );
}

#[test]
fn a_shadowed_service_refusal_is_let_through_with_the_admitted_headers() {
    let c = config(json!({"shadow": true}));
    let h = host(&c);
    let (mut s, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    // Resumed, no 429.
    assert_eq!((h.resumed(), h.reply_count()), (1, 0));
    s.on_response_headers(&c, &h, &h.vm);
    let added = h.added_headers();
    let names: Vec<&str> = added.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
    assert!(added.contains(&("x-ratelimit-remaining".to_string(), "0".to_string())));
    assert_eq!(
        h.group_counted(),
        vec![(DEFAULT, "shadow_refused.service", 1)]
    );
    // Not an enforced refusal, nor an admit by the service.
    assert_eq!(counted(&h), vec![]);
    assert_eq!(
        props(&h),
        logged(
            Some("tenant-a"),
            Some("default"),
            "shadow_refused",
            "service"
        )
    );
}

#[test]
fn a_shadowed_refusal_is_remembered_and_then_counted_from_the_cache() {
    let c = config(json!({"shadow": true}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    h.clear_properties();
    h.set_now_ms(NOW + 10_000);
    // Let through at once: no call (an enforced one would not call either).
    let (mut s, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!((h.call_count(), h.reply_count()), (1, 0));
    s.on_response_headers(&c, &h, &h.vm);
    assert!(h
        .added_headers()
        .iter()
        .all(|(k, _)| k.starts_with("x-ratelimit-")));
    assert_eq!(
        h.group_counted(),
        vec![
            (DEFAULT, "shadow_refused.service", 1),
            (DEFAULT, "shadow_refused.cache", 1)
        ]
    );
    assert_eq!(
        props(&h),
        logged(Some("tenant-a"), Some("default"), "shadow_refused", "cache")
    );
    // When the window ends, the service is asked again.
    h.set_now_ms(NOW - 250 + 40_000);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 2));
}

#[test]
fn a_shadowed_empty_bucket_lets_through_without_a_call() {
    let c = config(
        json!({"shadow": true, "local": {"groups": {"default": {"tokens_per_second": 1, "burst": 1}}}}),
    );
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::Ok, ok_answer());
    let (mut s, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!((h.call_count(), h.reply_count()), (1, 0));
    // The bucket's refusal has no X-RateLimit-* headers to pass on, and
    // its Retry-After is dropped.
    let before = h.added_count();
    s.on_response_headers(&c, &h, &h.vm);
    assert_eq!(h.added_count(), before);
    assert_eq!(
        h.group_counted(),
        vec![
            (DEFAULT, "admitted", 1),
            (DEFAULT, "near_limit", 1),
            (DEFAULT, "shadow_refused.bucket", 1)
        ]
    );
    assert_eq!(counted(&h), vec![n(Counter::Allowed, 1)]);
    assert_eq!(
        props(&h),
        logged(
            Some("tenant-a"),
            Some("default"),
            "shadow_refused",
            "bucket"
        )
    );
}

#[test]
fn a_shadowed_group_beside_an_enforced_one() {
    let c = config_with_limits(
        json!({"x-tenant-id": {
            "default": {"perminute": 20},
            "gold": {"perminute": 100, "header_value": ["tenant-b"], "shadow": true}}}),
        json!({}),
    );
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    let replies = h.replies();
    assert_eq!(replies.len(), 1, "only the enforced group is refused");
    assert_eq!(h.resumed(), 1);
    assert_eq!(
        h.group_counted(),
        vec![
            (GOLD, "shadow_refused.service", 1),
            (DEFAULT, "refused.service", 1)
        ]
    );
    assert_eq!(counted(&h), vec![n(Counter::OverLimit, 1)]);
}

#[test]
fn a_failed_property_changes_nothing_else() {
    let c = config(json!({}));
    let h = host(&c);
    h.fail(HostCall::SetProperty);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    assert_eq!(h.replies()[0].status, 429);
    assert!(props(&h).is_empty());
    assert_eq!(h.group_counted(), vec![(DEFAULT, "refused.service", 1)]);
}

#[test]
fn near_limit_follows_near_limit_ratio() {
    let answer = || vec![status(Code::Ok, 100, RateLimitUnit::Minute, 10, 30)];
    // 90 of 100 used: near at 0.8 (the default) and 0.9, not at 0.95.
    for (extra, near) in [
        (json!({}), 1),
        (json!({"near_limit_ratio": 0.9}), 1),
        (json!({"near_limit_ratio": 0.95}), 0),
    ] {
        let c = config(extra.clone());
        let h = host(&c);
        let (mut s, _) = request(&c, &h, Some("tenant-a"));
        respond(&c, &h, &mut s, Code::Ok, answer());
        assert_eq!(
            h.group_counter(DEFAULT, GroupCounter::NearLimit),
            near,
            "{extra}"
        );
        assert_eq!(h.group_counter(DEFAULT, GroupCounter::Admitted), 1);
    }
}

#[test]
fn failing_open_counts_in_the_group_and_denied_requests_tell_the_log() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    h.answer(&c, &mut s, 14, 0);
    assert_eq!(h.group_counted(), vec![(GOLD, "failed_open", 1)]);
    assert!(props(&h).is_empty());
    let deny = config(json!({"failure_mode_deny": true, "missing_tenant": "deny"}));
    let h = host(&deny);
    let (mut s, _) = request(&deny, &h, Some("tenant-b"));
    h.answer(&deny, &mut s, 14, 0);
    assert_eq!(
        props(&h),
        logged(Some("tenant-b"), Some("gold"), "refused", "limiter_error")
    );
    h.clear_properties();
    request(&deny, &h, None);
    assert_eq!(props(&h), logged(None, None, "refused", "missing_tenant"));
}

/// The service's answer, with its own headers, reaches the stream.
fn respond_with_headers(
    c: &Compiled,
    h: &Worker,
    s: &mut Stream,
    code: Code,
    statuses: Vec<DescriptorStatus>,
    to_client: &[(&str, &str)],
    to_upstream: &[(&str, &str)],
) {
    let body = crate::testing::answer_with_headers(code, statuses, to_client, to_upstream);
    let size = body.len();
    h.set_grpc_response(Some(body));
    h.answer(c, s, 0, size);
}

fn pairs(h: &[(&str, &str)]) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_refusal_without_statuses_carries_no_guessed_retry_after() {
    // A server that sends no per-descriptor statuses (Limitador): the
    // window may have a minute left, so "Retry-After: 1" would be a lie.
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond_with_headers(&c, &h, &mut s, Code::OverLimit, vec![], &[], &[]);
    let r = &h.replies()[0];
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"));
    // Nothing to remember: the next request is asked about.
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 2));
    // What the service itself says gives it.
    let (mut s, _) = request(&c, &h, Some("tenant-c"));
    respond_with_headers(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![],
        &[("RateLimit-Reset", "54")],
        &[],
    );
    let r = &h.replies()[1];
    assert_eq!(r.header("retry-after"), Some("54"));
    assert_eq!(r.header("ratelimit-reset"), Some("54"));
}

#[test]
fn the_services_headers_reach_the_client_and_the_upstream() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond_with_headers(
        &c,
        &h,
        &mut s,
        Code::Ok,
        ok_answer(),
        &[("RateLimit-Limit", "20"), ("X-Bad", "a\r\nx-injected: 1")],
        &[("x-quota-left", "3")],
    );
    // Added to the request before it was resumed.
    assert_eq!(h.added_request_headers(), pairs(&[("x-quota-left", "3")]));
    assert_eq!(h.resumed(), 1);
    s.on_response_headers(&c, &h, &h.vm);
    let added = h.added_headers();
    assert!(added.contains(&("ratelimit-limit".into(), "20".into())));
    assert!(added.contains(&("x-bad".into(), "ax-injected: 1".into())));
    assert!(added.contains(&("x-ratelimit-remaining".into(), "3".into())));
    // On a refusal they are on the 429.
    let (mut s, _) = request(&c, &h, Some("tenant-c"));
    respond_with_headers(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        over_limit_answer(),
        &[("RateLimit-Remaining", "0"), ("Retry-After", "1")],
        &[("x-never", "1")],
    );
    let r = &h.replies()[0];
    assert_eq!(r.header("ratelimit-remaining"), Some("0"));
    // The filter's own Retry-After, from the statuses, and only it.
    let retry: Vec<_> = r
        .headers
        .iter()
        .filter(|(k, _)| k == "retry-after")
        .collect();
    assert_eq!(retry, vec![&("retry-after".to_string(), "40".to_string())]);
    assert_eq!(h.added_request_headers().len(), 1);
    // A failing host call does not stop the request.
    let (mut s, _) = request(&c, &h, Some("tenant-d"));
    h.fail(HostCall::AddRequestHeader);
    respond_with_headers(&c, &h, &mut s, Code::Ok, ok_answer(), &[], &[("x-a", "1")]);
    assert_eq!(h.resumed(), 2);
}

#[test]
fn the_ietf_family_comes_from_the_service_the_cache_and_the_bucket() {
    let c = config(
        json!({"headers": "ietf_draft_10", "local": {"groups": {"default": {"tokens_per_second": 1, "burst": 1}}}}),
    );
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::Ok, ok_answer());
    s.on_response_headers(&c, &h, &h.vm);
    let policy = r#""per_second";q=5;w=1, "per_minute";q=20;w=60, "per_hour";q=30;w=3600"#;
    assert_eq!(
        h.added_headers(),
        pairs(&[
            ("ratelimit-policy", policy),
            ("ratelimit", r#""per_minute";r=3;t=40"#),
        ])
    );
    // The bucket (1 token) refuses the next: the group's policy, no RateLimit.
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    let r = &h.replies()[0];
    assert_eq!(r.header("ratelimit-policy"), Some(policy));
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.header("x-ratelimit-limit").is_none());
    // A service refusal, then the same from the cache.
    h.set_now_ms(NOW + 2_000);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    let r = &h.replies()[1];
    assert_eq!(r.header("ratelimit"), Some(r#""per_minute";r=0;t=40"#));
    assert_eq!(r.header("retry-after"), Some("40"));
    h.set_now_ms(NOW + 12_500);
    let _ = request(&c, &h, Some("tenant-a"));
    let r = &h.replies()[2];
    assert_eq!(r.header("ratelimit-policy"), Some(policy));
    // 10.5 s later the minute window (ending 40 s after the whole second
    // the call went out) has 29.25 s left: 30, rounded up as the service
    // rounds it.
    assert_eq!(r.header("ratelimit"), Some(r#""per_minute";r=0;t=30"#));
    assert_eq!(r.header("retry-after"), Some("30"));
}

#[test]
fn a_cached_refusal_carries_the_rule_names_of_the_services() {
    let c = config(json!({}));
    let h = host(&c);
    let mut answer = over_limit_answer();
    for (s, name) in answer
        .iter_mut()
        .zip(["second", "minute \"m\"\r\nx-injected: 1", ""])
    {
        s.current_limit.as_mut().unwrap().name = name.to_string();
    }
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    respond(&c, &h, &mut s, Code::OverLimit, answer);
    h.set_now_ms(NOW + 1_000);
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!((next, h.call_count()), (Next::Pause, 1));
    let replies = h.replies();
    let expected =
        r#"20, 5;w=1;name="second", 20;w=60;name="minute \"m\"x-injected: 1", 30;w=3600"#;
    assert_eq!(replies[0].header("x-ratelimit-limit"), Some(expected));
    assert_eq!(replies[1].header("x-ratelimit-limit"), Some(expected));
    // The reset of the tightest (the minute), as the service would say it.
    assert_eq!(replies[0].header("x-ratelimit-reset"), Some("40"));
    assert_eq!(replies[1].header("x-ratelimit-reset"), Some("39"));
}

#[test]
fn the_latency_of_answered_calls_is_recorded_and_failed_calls_are_not() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    h.set_now_ms(NOW + 7);
    respond(&c, &h, &mut s, Code::Ok, ok_answer());
    // A refusal is an answer too.
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    h.set_now_ms(NOW + 10);
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    assert_eq!(h.recorded(Histogram::RlsLatencyMs), vec![7, 3]);
    // A timeout (gRPC 14) took the timeout, not the service's time: not
    // recorded, only counted as an error.
    let (mut s, _) = request(&c, &h, Some("tenant-c"));
    h.set_now_ms(NOW + 35);
    h.answer(&c, &mut s, 14, 0);
    assert_eq!(h.recorded(Histogram::RlsLatencyMs), vec![7, 3]);
    assert_eq!(h.counter(Counter::RlsError), 1);
    // A refusal from the over-limit cache makes no call: nothing recorded.
    let (_, next) = request(&c, &h, Some("tenant-b"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.counter(Counter::CachedOverLimit), 1);
    assert_eq!(h.recorded_count(), 2);
}

#[test]
fn a_call_that_cannot_be_sent_is_counted_and_warned_at_most_once_a_minute() {
    // No breaker: it would open after five failures and keep the last
    // call in.
    let c = config(json!({"breaker": {"enabled": false}}));
    let h = host(&c);
    h.fail(HostCall::Dispatch);
    for _ in 0..5 {
        let (_, next) = request(&c, &h, Some("tenant-a"));
        assert_eq!(next, Next::Continue);
    }
    assert_eq!(h.counter(Counter::RlsDispatchFailed), 5);
    assert_eq!(h.counter(Counter::FailureModeAllowed), 5);
    assert_eq!(h.recorded_count(), 0);
    // The first warning went out; the next four were held back, and the
    // next warning, a minute later, says so.
    assert_eq!(
        h.vm.batch
            .warnings
            .due(NOW + WARN_INTERVAL_MS, WARN_INTERVAL_MS),
        Some(4)
    );
    // A call that went out but failed is not a dispatch failure (another
    // tenant: tenant-a's bucket is empty).
    h.heal(HostCall::Dispatch);
    let (mut s, _) = request(&c, &h, Some("tenant-z"));
    h.answer(&c, &mut s, 14, 0);
    assert_eq!(h.counter(Counter::RlsDispatchFailed), 5);
    assert_eq!(h.counter(Counter::RlsError), 6);
}

fn cost() -> Value {
    json!({"cost_header": "x-cost", "max_cost": 100})
}

fn asked_hits(h: &MemHost) -> Vec<u32> {
    h.calls()
        .iter()
        .map(|call| {
            RateLimitRequest::decode(&call.message[..])
                .unwrap()
                .hits_addend
        })
        .collect()
}

#[test]
fn a_request_costs_the_value_of_its_cost_header_and_1_without_it() {
    let c = config_with_limits(
        json!({"x-tenant-id": {"default": {"perhour": 100}}}),
        cost(),
    );
    let h = host(&c);
    h.set_request_header("x-cost", b"10");
    answered(&c, &h, "tenant-a");
    h.set_request_header("x-cost", b"100");
    answered(&c, &h, "tenant-a");
    h.remove_request_header("x-cost");
    answered(&c, &h, "tenant-a");
    h.set_request_header("x-cost", b"1");
    answered(&c, &h, "tenant-a");
    // 0 is left out: the service counts 1.
    assert_eq!(asked_hits(&h), vec![10, 100, 0, 0]);
    // Without a cost_header, the header means nothing.
    let c = config_with_limits(
        json!({"x-tenant-id": {"default": {"perhour": 100}}}),
        json!({}),
    );
    let h = host(&c);
    h.set_request_header("x-cost", b"10");
    request(&c, &h, Some("tenant-a"));
    assert_eq!(asked_hits(&h), vec![0]);
}

#[test]
fn a_bad_cost_is_a_400_counted_and_never_asked() {
    let c = config_with_limits(
        json!({"x-tenant-id": {"default": {"perhour": 100}}}),
        cost(),
    );
    let h = host(&c);
    let bad: [&[u8]; 6] = [b"0", b"101", b"-1", b"abc", b"", b"1.5"];
    for value in bad {
        h.set_request_header("x-cost", value);
        let (_, next) = request(&c, &h, Some("tenant-a"));
        assert_eq!(next, Next::Pause, "{value:?}");
    }
    let replies = h.replies();
    assert_eq!(replies.len(), bad.len());
    for r in &replies {
        assert_eq!(r.status, 400);
        assert_eq!(
            r.body,
            "invalid x-cost header: the cost must be an integer from 1 to 100\n"
        );
    }
    assert_eq!(counted(&h), vec![n(Counter::CostInvalid, 6)]);
    assert_eq!(h.call_count(), 0);
    // Nothing was stored for the tenant either.
    let at = slot_of(&c, &h.slot_secret(), "default", "tenant-a");
    assert_eq!(
        h.shared_value(&SlotKey::new(at.index)),
        Some(vec![0; crate::local::SLOT_BYTES])
    );
}

#[test]
fn a_cost_header_sent_twice_is_a_400_whatever_its_values() {
    let c = config_with_limits(
        json!({"x-tenant-id": {"default": {"perhour": 100}}}),
        cost(),
    );
    let h = host(&c);
    // The first value is never taken: `1` then `100` must not cost 1, and
    // `100` then `1` is refused the same way.
    for (first, second) in [
        (&b"1"[..], &b"100"[..]),
        (b"100", b"1"),
        (b"5", b"5"),
        (b"", b"1"),
    ] {
        h.set_request_header("x-cost", first);
        h.append_request_header("x-cost", second);
        let (_, next) = request(&c, &h, Some("tenant-a"));
        assert_eq!(next, Next::Pause, "{first:?} {second:?}");
    }
    let replies = h.replies();
    assert_eq!(replies.len(), 4);
    for r in &replies {
        assert_eq!(r.status, 400);
        assert_eq!(
            r.body,
            "invalid x-cost header: sent more than once, or not one integer from 1 to 100\n"
        );
    }
    assert_eq!(counted(&h), vec![n(Counter::CostInvalid, 4)]);
    assert_eq!(h.call_count(), 0);
    let at = slot_of(&c, &h.slot_secret(), "default", "tenant-a");
    assert_eq!(
        h.shared_value(&SlotKey::new(at.index)),
        Some(vec![0; crate::local::SLOT_BYTES])
    );
    // Once, it is a cost again.
    h.set_request_header("x-cost", b"100");
    answered(&c, &h, "tenant-a");
    assert_eq!(asked_hits(&h), vec![100]);
}

#[test]
fn the_cost_of_a_tenant_no_group_limits_is_not_read() {
    let c = config_with_limits(
        json!({"x-tenant-id": {"gold": {"perhour": 100, "header_value": ["tenant-b"]}}}),
        cost(),
    );
    let h = host(&c);
    h.set_request_header("x-cost", b"abc");
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Continue);
    assert_eq!((h.reply_count(), h.call_count()), (0, 0));
    assert_eq!(counted(&h), vec![]);
}

#[test]
fn the_local_bucket_takes_the_cost() {
    // default: 5 per second, so a bucket of 5.
    let c = config(cost());
    let h = host(&c);
    h.set_request_header("x-cost", b"3");
    let (_, next) = request(&c, &h, Some("tenant-a"));
    assert_eq!(next, Next::Pause);
    assert_eq!(h.call_count(), 1);
    // 2 tokens left: another 3 is refused by the bucket, without a call.
    request(&c, &h, Some("tenant-a"));
    assert_eq!(h.call_count(), 1);
    assert_eq!(h.replies()[0].status, 429);
    assert_eq!(h.counter(Counter::LocalOverLimit), 1);
    // 2 fit.
    h.set_request_header("x-cost", b"2");
    request(&c, &h, Some("tenant-a"));
    assert_eq!(asked_hits(&h), vec![3, 2]);
}

/// What the service answers for a descriptor: no rule matched it (`limit`
/// None: OK, no current_limit, 0 remaining), or a rule that is `unlimited`.
fn unmatched(unlimited: bool) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: None,
        limit_remaining: if unlimited { u32::MAX } else { 0 },
        duration_until_reset: None,
    }
}

#[test]
fn a_descriptor_no_rule_matched_is_counted_in_its_group() {
    let c = config(json!({}));
    let h = host(&c);
    // gold sends one descriptor (per_second); an unknown domain answers OK with no limit.
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    respond(&c, &h, &mut s, Code::Ok, vec![unmatched(false)]);
    assert_eq!(h.resumed(), 1);
    assert_eq!(
        h.group_counted(),
        vec![(GOLD, "no_rule", 1), (GOLD, "admitted", 1)]
    );
    assert_eq!(counted(&h), vec![n(Counter::Allowed, 1)]);
    // The next one too (the warning is throttled, the counter is not).
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    respond(&c, &h, &mut s, Code::Ok, vec![unmatched(false)]);
    assert_eq!(h.group_counter(GOLD, GroupCounter::NoRule), 2);
    // A rule that is unlimited on purpose is not a missing one.
    let (mut s, _) = request(&c, &h, Some("tenant-b"));
    respond(&c, &h, &mut s, Code::Ok, vec![unmatched(true)]);
    assert_eq!(h.group_counter(GOLD, GroupCounter::NoRule), 2);
    assert_eq!(h.group_counter(GOLD, GroupCounter::Admitted), 3);
}

#[test]
fn a_refusal_by_one_limit_still_tells_of_another_without_a_rule() {
    let c = config(json!({}));
    let h = host(&c);
    let (mut s, _) = request(&c, &h, Some("tenant-a"));
    let over = status(Code::OverLimit, 5, RateLimitUnit::Second, 0, 1);
    respond(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![over, unmatched(false)],
    );
    assert_eq!(h.reply_count(), 1);
    assert_eq!(h.group_counter(DEFAULT, GroupCounter::NoRule), 1);
}

/// Routes and the cost the upstream reports.
mod expensive;

const JWT_TENANT: &str =
    "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0tenant";

/// A request whose verified tenant (a property) is `tenant`, while the
/// client sends another in the header: the header is never read.
fn verified(c: &Compiled, h: &Worker, tenant: &[u8]) -> (Stream, Next) {
    h.set_request_header(HEADER, b"victim");
    h.fail(HostCall::RequestHeader);
    h.set_attribute(JWT_TENANT, tenant);
    let mut s = h.stream();
    let next = s.on_request_headers(c, h, &h.vm);
    (s, next)
}

#[test]
fn every_refusal_logs_the_verified_tenant_not_the_header() {
    let property = json!({"property": ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "tenant"]});
    let local = json!({"groups": {"default": {"tokens_per_second": 1, "burst": 1}}});
    let c = config(json!({"tenant_source": property, "local": local}));
    let h = host(&c);
    let (mut s, _) = verified(&c, &h, b"tenant-a");
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    let service = logged(Some("tenant-a"), Some("default"), "refused", "service");
    assert_eq!(props(&h), service);
    h.clear_properties();
    verified(&c, &h, b"tenant-a");
    let cache = logged(Some("tenant-a"), Some("default"), "refused", "cache");
    assert_eq!(props(&h), cache);
    h.clear_properties();
    let (mut s, _) = verified(&c, &h, b"tenant-c");
    respond(&c, &h, &mut s, Code::Ok, ok_answer());
    verified(&c, &h, b"tenant-c");
    let bucket = logged(Some("tenant-c"), Some("default"), "refused", "bucket");
    assert_eq!(props(&h), bucket);
    // The service fails and the filter denies: the tenant is still named.
    let deny = config(json!({"tenant_source": property, "failure_mode_deny": true}));
    let h = host(&deny);
    let (mut s, _) = verified(&deny, &h, b"tenant-b");
    h.answer(&deny, &mut s, 14, 0);
    let error = logged(Some("tenant-b"), Some("gold"), "refused", "limiter_error");
    assert_eq!(props(&h), error);
}

#[test]
fn a_header_tenant_is_logged_escaped_as_the_service_sees_it() {
    let c = config(json!({}));
    let h = host(&c);
    h.set_request_header(HEADER, b"vic\xfftim%");
    let mut s = h.stream();
    s.on_request_headers(&c, &h, &h.vm);
    respond(&c, &h, &mut s, Code::OverLimit, over_limit_answer());
    assert_eq!(tenant_asked(&h), "vic%FFtim%25");
    let shown = logged(Some("vic%FFtim%25"), Some("default"), "refused", "service");
    assert_eq!(props(&h), shown);
}
