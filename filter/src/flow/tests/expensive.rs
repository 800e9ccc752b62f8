//! Expensive operations through the flow and the root: a route's own limits
//! (`routes`), and a cost the upstream reports after the response
//! (`response_cost_header`), charged when the response tells it.
#![cfg(test)]

use prost::Message;

use crate::compiled::Compiled;
use crate::counters::{Counter, GroupCounter};
use crate::flow::{Next, Stream};
use crate::host::HostCall;
use crate::proto::{Code, DescriptorStatus, RateLimitRequest, RateLimitUnit};
use crate::root::{tick_ms, Root};
use crate::testing::{self, answer, compiled, compiled_json, status, Worker};
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const HEADER: &str = "x-tenant-id";

/// 600 a minute per tenant, 5 on `reports`, 2 a second on `burst`; `gold`
/// (tenant `acme`) has no routes. `extra`: more top-level keys. One request
/// per call, so that each request's call is the last one.
fn config(extra: Value) -> Compiled {
    let base = json!({"domain": "api", "rate_limit_service": {"cluster": "ratelimit", "batch": false},
        "limits": {"x-tenant-id": {
          "default": {"perminute": 600,
                      "routes": {"reports": {"perminute": 5}, "burst": {"persecond": 2}}},
          "gold": {"perminute": 6000, "header_value": ["acme"]}}}});
    compiled_json(base, extra)
}

/// Quota 100 a minute, costs from `x-cost` in the response.
fn costly(extra: Value) -> Compiled {
    let base = json!({"domain": "api", "rate_limit_service": {"cluster": "ratelimit"},
        "limits": {"x-tenant-id": {
          "default": {"perminute": 100, "routes": {"reports": {"perhour": 50}}}}},
        "response_cost_header": "x-cost"});
    compiled_json(base, extra)
}

/// A worker ready for `c`, its requests on route `reports`.
fn on_reports(c: &Compiled) -> Worker {
    let h = testing::host(c);
    h.set_route_name(Some("reports"));
    h
}

fn request(c: &Compiled, h: &Worker, tenant: &str, route: Option<&str>) -> (Stream, Next) {
    h.set_route_name(route);
    h.set_request_header(HEADER, tenant.as_bytes());
    let mut s = h.stream();
    let next = s.on_request_headers(c, h, &h.vm);
    (s, next)
}

fn respond(c: &Compiled, h: &Worker, s: &mut Stream, code: Code, statuses: Vec<DescriptorStatus>) {
    let body = answer(code, statuses);
    let size = body.len();
    h.set_grpc_response(Some(body));
    h.answer(c, s, 0, size);
}

/// The descriptors of the last call, as `key=value` entries.
fn last_call(h: &Worker) -> (Vec<Vec<String>>, u32) {
    let calls = h.calls();
    let asked = RateLimitRequest::decode(&calls.last().unwrap().message[..]).unwrap();
    let descriptors = asked
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect()
        })
        .collect();
    (descriptors, asked.hits_addend)
}

/// The hits of each call sent since the `since`th: the charges a test's
/// responses sent (each call of one part, with its hits; 1 is sent as 0).
fn charges_since(h: &Worker, since: usize) -> Vec<u32> {
    h.calls()
        .iter()
        .skip(since)
        .map(|call| {
            let asked = RateLimitRequest::decode(&call.message[..]).unwrap();
            asked.hits_addend
        })
        .collect()
}

/// The charges sent by one admitted request (its own call answered) whose
/// response carries `cost` (`trailer`).
fn charged(c: &Compiled, h: &Worker, cost: Option<&[u8]>, trailer: Option<&[u8]>) -> Vec<u32> {
    let before = h.calls().len() + 1;
    admitted_with_cost(c, h, cost, trailer);
    answer_charges(c, h, before);
    charges_since(h, before)
}

/// The service admits the calls sent since the `since`th (charges: no
/// stream waits for them), so that the next request's call goes at once.
fn answer_charges(c: &Compiled, h: &Worker, since: usize) {
    let body = answer(Code::Ok, vec![minute(Code::Ok, 100, 50)]);
    h.set_grpc_response(Some(body.clone()));
    for call in h.calls().iter().skip(since) {
        Root::default().on_answer(c, h, &h.vm, call.token, 0, body.len());
    }
}

fn minute(code: Code, limit: u32, remaining: u32) -> DescriptorStatus {
    status(code, limit, RateLimitUnit::Minute, remaining, 40)
}

#[test]
fn a_request_on_a_limited_route_sends_the_routes_descriptors_after_the_tenants() {
    let c = config(json!({}));
    let h = on_reports(&c);
    let (_, next) = request(&c, &h, "tenant-a", Some("reports"));
    assert_eq!(next, Next::Pause);
    assert_eq!(
        last_call(&h),
        (
            vec![
                vec!["generic_key=per_minute".into(), "tenant=tenant-a".into()],
                vec![
                    "generic_key=per_minute".into(),
                    "tenant=tenant-a".into(),
                    "route=reports".into()
                ],
            ],
            0
        )
    );
    assert_eq!(h.route_name_reads(), 1);
    // Another route, or none: the tenant's descriptors only.
    for route in [Some("search"), None] {
        request(&c, &h, "tenant-a", route);
        assert_eq!(last_call(&h).0.len(), 1);
    }
    // A group without routes never reads the route's name.
    request(&c, &h, "acme", Some("reports"));
    assert_eq!(last_call(&h).0.len(), 1);
    assert_eq!(h.route_name_reads(), 3);
    // Nor does any tenant when no group has routes.
    let plain = compiled(
        r#"{"domain": "api", "rate_limit_service": {"cluster": "ratelimit"},
            "limits": {"x-tenant-id": {"default": {"perminute": 600}}}}"#,
    );
    request(&plain, &h, "tenant-a", Some("reports"));
    assert_eq!(h.route_name_reads(), 3);
    // The route's name unreadable: the tenant's limits still apply.
    h.fail(HostCall::RouteName);
    let (_, next) = request(&c, &h, "tenant-a", Some("reports"));
    assert_eq!((next, last_call(&h).0.len()), (Next::Pause, 1));
}

#[test]
fn both_must_admit_and_the_headers_describe_the_tightest_window() {
    let c = config(json!({}));
    let h = on_reports(&c);
    let (mut s, _) = request(&c, &h, "tenant-a", Some("reports"));
    respond(
        &c,
        &h,
        &mut s,
        Code::Ok,
        vec![minute(Code::Ok, 600, 590), minute(Code::Ok, 5, 2)],
    );
    s.on_response_headers(&c, &h, &h.vm);
    let added = h.added_headers();
    assert_eq!(
        added[0],
        ("x-ratelimit-limit".into(), "5, 600;w=60, 5;w=60".into())
    );
    assert_eq!(added[1], ("x-ratelimit-remaining".into(), "2".into()));
    // The route refuses: a 429, whatever the tenant's own window says.
    let (mut s, _) = request(&c, &h, "tenant-a", Some("reports"));
    respond(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![minute(Code::Ok, 600, 589), minute(Code::OverLimit, 5, 0)],
    );
    let reply = h.replies().pop().unwrap();
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("40"));
}

#[test]
fn a_refusal_on_the_route_is_remembered_apart_from_the_tenants() {
    let c = config(json!({}));
    let h = on_reports(&c);
    let (mut s, _) = request(&c, &h, "tenant-a", Some("reports"));
    respond(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![minute(Code::Ok, 600, 100), minute(Code::OverLimit, 5, 0)],
    );
    let calls = h.call_count();
    // The same route: refused from the cache, no call.
    let (_, next) = request(&c, &h, "tenant-a", Some("reports"));
    assert_eq!((next, h.call_count()), (Next::Pause, calls));
    assert_eq!(h.counter(Counter::CachedOverLimit), 1);
    let reply = h.replies().pop().unwrap();
    assert_eq!(reply.header("x-ratelimit-limit"), Some("5, 5;w=60"));
    // The tenant's other routes, and another tenant on this one, still ask.
    for (tenant, route) in [
        ("tenant-a", Some("search")),
        ("tenant-a", None),
        ("tenant-c", Some("reports")),
    ] {
        let (_, next) = request(&c, &h, tenant, route);
        assert_eq!(next, Next::Pause);
    }
    assert_eq!(h.call_count(), calls + 3);
    assert_eq!(h.counter(Counter::CachedOverLimit), 1);
}

#[test]
fn a_refusal_of_the_tenant_on_a_route_refuses_its_other_routes_too() {
    let c = config(json!({}));
    let h = on_reports(&c);
    let (mut s, _) = request(&c, &h, "tenant-a", Some("reports"));
    respond(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![minute(Code::OverLimit, 600, 0), minute(Code::Ok, 5, 4)],
    );
    let calls = h.call_count();
    request(&c, &h, "tenant-a", None);
    assert_eq!(h.call_count(), calls);
    assert_eq!(h.counter(Counter::CachedOverLimit), 1);
}

#[test]
fn a_routes_persecond_is_a_bucket_of_its_own() {
    let c = config(json!({}));
    let h = on_reports(&c);
    for _ in 0..2 {
        let (_, next) = request(&c, &h, "tenant-a", Some("burst"));
        assert_eq!(next, Next::Pause);
    }
    let calls = h.call_count();
    request(&c, &h, "tenant-a", Some("burst"));
    assert_eq!(h.call_count(), calls);
    assert_eq!(h.counter(Counter::LocalOverLimit), 1);
    assert_eq!(h.group_counter(0, GroupCounter::RefusedBucket), 1);
    assert_eq!(h.replies().pop().unwrap().status, 429);
    // The tenant itself has no bucket (no persecond): its other routes ask.
    let (_, next) = request(&c, &h, "tenant-a", None);
    assert_eq!((next, h.call_count()), (Next::Pause, calls + 1));
}

#[test]
fn a_request_on_a_limited_route_asks_the_service_in_lease_and_sync_mode() {
    for mode in ["lease", "sync"] {
        let c = config(json!({"local": {"mode": mode}}));
        let h = on_reports(&c);
        let (_, next) = request(&c, &h, "tenant-a", Some("reports"));
        assert_eq!(next, Next::Pause, "{mode}");
        // One hit of its own, on both: no batch, no local admission.
        let (descriptors, hits) = last_call(&h);
        assert_eq!((descriptors.len(), hits), (2, 0), "{mode}");
    }
}

/// A request of tenant-a on `reports` admitted by the service, whose
/// response carries `cost` in its headers (`trailer`: in its trailers).
fn admitted_with_cost(c: &Compiled, h: &Worker, cost: Option<&[u8]>, trailer: Option<&[u8]>) {
    let (mut s, _) = request(c, h, "tenant-a", Some("reports"));
    let ok = vec![
        minute(Code::Ok, 100, 90),
        status(Code::Ok, 50, RateLimitUnit::Hour, 40, 900),
    ];
    respond(c, h, &mut s, Code::Ok, ok);
    let headers: Vec<(&str, &[u8])> = cost.map(|v| ("x-cost", v)).into_iter().collect();
    h.set_response(false, &headers);
    let trailers: Vec<(&str, &[u8])> = trailer.map(|v| ("x-cost", v)).into_iter().collect();
    h.set_response(true, &trailers);
    assert_eq!(s.on_response_headers(c, h, &h.vm), Next::Continue);
    assert_eq!(s.on_response_trailers(c, h, &h.vm), Next::Continue);
}

#[test]
fn a_response_cost_is_charged_at_once_on_the_same_descriptors() {
    let c = costly(json!({}));
    let h = on_reports(&c);
    admitted_with_cost(&c, &h, Some(b"10"), None);
    // Sent with the response's headers, no tick in between.
    assert_eq!(h.call_count(), 2);
    let mut root = Root::default();
    assert_eq!(
        last_call(&h),
        (
            vec![
                vec!["generic_key=per_minute".into(), "tenant=tenant-a".into()],
                vec![
                    "generic_key=per_hour".into(),
                    "tenant=tenant-a".into(),
                    "route=reports".into()
                ],
            ],
            9
        )
    );
    let body = answer(Code::Ok, vec![minute(Code::Ok, 100, 81)]);
    let size = body.len();
    h.set_grpc_response(Some(body));
    root.on_answer(&c, &h, &h.vm, 2, 0, size);
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostCharges), 1);
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostHits), 9);
    assert_eq!(h.vm.batch.in_flight(), 0);
    // No tick: a charge needs none.
    assert_eq!(tick_ms(&c), None);
}

#[test]
fn a_charge_the_service_refuses_refuses_the_tenants_next_request_without_a_call() {
    let c = costly(json!({}));
    let h = on_reports(&c);
    admitted_with_cost(&c, &h, Some(b"95"), None);
    let mut root = Root::default();
    let body = answer(
        Code::OverLimit,
        vec![
            minute(Code::OverLimit, 100, 0),
            status(Code::Ok, 50, RateLimitUnit::Hour, 5, 900),
        ],
    );
    let size = body.len();
    h.set_grpc_response(Some(body));
    root.on_answer(&c, &h, &h.vm, 2, 0, size);
    let calls = h.call_count();
    let (_, next) = request(&c, &h, "tenant-a", None);
    assert_eq!((next, h.call_count()), (Next::Pause, calls));
    assert_eq!(h.replies().pop().unwrap().status, 429);
    assert_eq!(h.counter(Counter::CachedOverLimit), 1);
    // The route's part of the answer was not over: nothing of its own.
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostHits), 94);
}

#[test]
fn a_cost_in_the_trailers_counts_when_the_headers_have_none_and_once() {
    let c = costly(json!({}));
    let h = on_reports(&c);
    assert_eq!(charged(&c, &h, None, Some(b"7")), [6]);
    let (descriptors, _) = last_call(&h);
    assert_eq!(
        descriptors[1].last().map(String::as_str),
        Some("route=reports")
    );
    // Both: the headers' cost, charged once.
    assert_eq!(charged(&c, &h, Some(b"3"), Some(b"7")), [2]);
    // Neither: nothing charged.
    assert!(charged(&c, &h, None, None).is_empty());
}

#[test]
fn bad_response_costs_are_counted_charge_nothing_and_leave_the_response_alone() {
    let c = costly(json!({"max_cost": 500}));
    let h = on_reports(&c);
    let before = h.calls().len();
    admitted_with_cost(&c, &h, Some(b"10"), None);
    answer_charges(&c, &h, before + 1);
    let good = h.added_headers();
    let bad: [&[u8]; 7] = [
        b"0",
        b"-1",
        b"abc",
        b"501",
        b"99999999999999999999",
        b"",
        b"1.5",
    ];
    for (i, value) in bad.iter().enumerate() {
        admitted_with_cost(&c, &h, Some(value), None);
        assert_eq!(h.counter(Counter::ResponseCostInvalid), i as u64 + 1);
        // The response gets the headers any admitted one gets, no more.
        assert_eq!(h.added_headers().len(), good.len() * (i + 2));
    }
    // In a trailer too.
    admitted_with_cost(&c, &h, None, Some(b"abc"));
    assert_eq!(h.counter(Counter::ResponseCostInvalid), 8);
    // Only the good one was charged (each request's own call counts 1).
    let sent = charges_since(&h, before);
    assert_eq!(sent.iter().filter(|&&hits| hits != 0).count(), 1);
    assert_eq!(sent[1], 9);
    assert_eq!(h.reply_count(), 0);
}

#[test]
fn a_cost_no_higher_than_the_requests_is_not_refunded() {
    let c = costly(json!({"cost_header": "x-request-cost"}));
    let h = on_reports(&c);
    h.set_request_header("x-request-cost", b"5");
    for (cost, more) in [(&b"3"[..], None), (b"5", None), (b"8", Some(3))] {
        let sent = charged(&c, &h, Some(cost), None);
        assert_eq!(sent.first().copied(), more);
    }
}

#[test]
fn refused_and_failed_open_requests_are_not_charged() {
    let c = costly(json!({}));
    let h = on_reports(&c);
    h.set_response(false, &[("x-cost", b"10")]);
    // Refused by the service: the local reply's headers pass here too.
    let (mut s, _) = request(&c, &h, "tenant-a", None);
    respond(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![minute(Code::OverLimit, 100, 0)],
    );
    s.on_response_headers(&c, &h, &h.vm);
    // Refused from the cache.
    let (mut s, _) = request(&c, &h, "tenant-a", None);
    s.on_response_headers(&c, &h, &h.vm);
    // Failed open.
    let (mut s, _) = request(&c, &h, "tenant-b", None);
    h.answer(&c, &mut s, 14, 0);
    s.on_response_headers(&c, &h, &h.vm);
    // One call per request, and no charge.
    assert_eq!(h.call_count(), 2);
    // In shadow, a refusal goes upstream counted: charged.
    let c = costly(json!({"shadow": true}));
    let (mut s, _) = request(&c, &h, "tenant-d", None);
    respond(
        &c,
        &h,
        &mut s,
        Code::OverLimit,
        vec![minute(Code::OverLimit, 100, 0)],
    );
    let before = h.calls().len();
    s.on_response_headers(&c, &h, &h.vm);
    assert_eq!(charges_since(&h, before), [9]);
}

#[test]
fn a_lease_token_admission_is_charged_too() {
    let c = costly(json!({"local": {"mode": "lease"}}));
    let h = on_reports(&c);
    // The first two requests ask (for 1 hit, then for 2: one token is
    // left); the third spends the token.
    for _ in 0..2 {
        let (mut s, _) = request(&c, &h, "tenant-a", None);
        respond(&c, &h, &mut s, Code::Ok, vec![minute(Code::Ok, 100, 90)]);
    }
    let (mut s, next) = request(&c, &h, "tenant-a", None);
    assert_eq!(next, Next::Continue);
    h.set_response(false, &[("x-cost", b"4")]);
    let before = h.calls().len();
    s.on_response_headers(&c, &h, &h.vm);
    assert_eq!(charges_since(&h, before), [3]);
}

#[test]
fn a_charge_that_fails_is_counted() {
    let c = costly(json!({}));
    let h = on_reports(&c);
    let mut root = Root::default();
    // A charge that cannot be sent.
    let (mut s, _) = request(&c, &h, "tenant-a", Some("reports"));
    respond(&c, &h, &mut s, Code::Ok, vec![minute(Code::Ok, 100, 90)]);
    h.set_response(false, &[("x-cost", b"10")]);
    h.fail(HostCall::Dispatch);
    s.on_response_headers(&c, &h, &h.vm);
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostFailed), 1);
    h.heal(HostCall::Dispatch);
    // An answer that is an error.
    admitted_with_cost(&c, &h, Some(b"10"), None);
    let token = u32::try_from(h.call_count()).unwrap();
    root.on_answer(&c, &h, &h.vm, token, 14, 0);
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostFailed), 2);
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostCharges), 0);
}

#[test]
fn without_the_local_layer_a_charge_is_sent_and_nothing_is_stored() {
    let c = costly(json!({"local": {"enabled": false}}));
    let h = on_reports(&c);
    admitted_with_cost(&c, &h, Some(b"10"), None);
    let mut root = Root::default();
    let before = h.shared_snapshot();
    let body = answer(Code::OverLimit, vec![minute(Code::OverLimit, 100, 0)]);
    let size = body.len();
    h.set_grpc_response(Some(body));
    root.on_answer(&c, &h, &h.vm, 2, 0, size);
    assert_eq!(h.shared_snapshot(), before);
    assert_eq!(h.group_counter(0, GroupCounter::ResponseCostHits), 9);
}

#[test]
fn requests_on_a_limited_route_count_on_that_route_and_no_other() {
    let c = config(json!({}));
    let h = on_reports(&c);
    let _ = request(&c, &h, "t1", Some("reports"));
    let _ = request(&c, &h, "t2", Some("burst"));
    let _ = request(&c, &h, "t3", Some("reports"));
    // Another route, no route, a tenant whose group has no routes.
    let _ = request(&c, &h, "t4", Some("other"));
    let _ = request(&c, &h, "t5", None);
    let _ = request(&c, &h, "acme", Some("reports"));
    assert_eq!(
        *h.host.routes_counted.borrow(),
        [(0, 0), (0, 1), (0, 0)],
        "(group, route) of each request a route limit applied to"
    );
}
