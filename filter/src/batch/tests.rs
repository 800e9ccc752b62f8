//! The worker's calls against the in-memory host: requests sent at once or
//! queued, the answer split back per request, the queue's bounds, the
//! deadlines, a failed call, a stream that ends while it waits, a service
//! that answers without statuses.

use prost::Message;

use super::*;
use crate::counters::GroupCounter;
use crate::flow::{Next, Stream};
use crate::group::GroupId;
use crate::proto::{DescriptorStatus, RateLimitRequest, RateLimitUnit};
use crate::root::Root;
use crate::testing::{answer, answer_with_headers, compiled, compiled_json, status, Worker, NOW};
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// No local layer: every request asks the service. `batch` is
/// `rate_limit_service.batch`; `extra` more top-level keys.
fn config(batch: Value, extra: Value) -> Compiled {
    let base = json!({"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 100, "batch": batch},
        "limits": {"x-tenant-id": {
            "default": {"perminute": 20, "perhour": 100},
            "gold": {"perminute": 70, "header_value": ["tenant-b"]}}},
        "local": {"enabled": false}, "cost_header": "x-cost"});
    compiled_json(base, extra)
}

fn one_in_flight() -> Value {
    json!({"max_in_flight": 1})
}

fn worker() -> Worker {
    let w = Worker::new();
    w.set_now_ms(NOW);
    w
}

fn ask(c: &Compiled, w: &Worker, tenant: &str, cost: u32) -> Stream {
    w.set_request_header("x-cost", cost.to_string().as_bytes());
    let (s, next) = w.request(c, tenant);
    assert_eq!(next, Next::Pause);
    s
}

/// Each descriptor of a call: its tenant, unit and hits.
fn sent(w: &Worker, token: u32) -> Vec<(String, String, u64)> {
    let call = w.calls().into_iter().find(|c| c.token == token).unwrap();
    let r = RateLimitRequest::decode(&call.message[..]).unwrap();
    r.descriptors
        .iter()
        .map(|d| {
            let hits = d
                .hits_addend
                .map_or(u64::from(r.hits_addend.max(1)), |h| h.value);
            (d.entries[1].value.clone(), d.entries[0].value.clone(), hits)
        })
        .collect()
}

fn minute(code: Code, limit: u32, remaining: u32) -> DescriptorStatus {
    status(code, limit, RateLimitUnit::Minute, remaining, 40)
}

fn hour(code: Code, remaining: u32) -> DescriptorStatus {
    status(code, 100, RateLimitUnit::Hour, remaining, 2_000)
}

fn respond(c: &Compiled, w: &Worker, token: u32, body: Vec<u8>, streams: &mut [&mut Stream]) {
    let size = body.len();
    w.set_grpc_response(Some(body));
    let others = w.answer_call(c, token, 0, size, streams);
    assert!(others.is_empty(), "{others:?}");
}

#[test]
fn requests_go_at_once_until_max_in_flight_then_queue_for_the_next_call() {
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let mut first = ask(&c, &w, "tenant-a", 1);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (1, 0));
    let mut second = ask(&c, &w, "tenant-a", 2);
    let mut third = ask(&c, &w, "tenant-b", 1);
    // One call under way: the others wait for its answer.
    assert_eq!((w.call_count(), w.vm.batch.queued()), (1, 2));
    assert_eq!(w.counter(Counter::BatchQueued), 2);
    let token = w.calls()[0].token;
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 19), hour(Code::Ok, 99)]);
    respond(&c, &w, token, body, &mut [&mut first]);
    // The answer sent the queue as one call: each request's descriptors
    // with its own cost, in the order they came.
    assert_eq!(w.call_count(), 2);
    let token = w.calls()[1].token;
    assert_eq!(
        sent(&w, token),
        [
            ("tenant-a".into(), "per_minute".into(), 2),
            ("tenant-a".into(), "per_hour".into(), 2),
            ("tenant-b".into(), "per_minute".into(), 1),
        ]
    );
    assert_eq!(w.counter(Counter::RlsDescriptors), 2 + 3);
    // The answer is split back: tenant-a's two statuses admit it, with its
    // own headers; tenant-b's refuses it.
    let body = answer(
        Code::OverLimit,
        vec![
            minute(Code::Ok, 20, 17),
            hour(Code::Ok, 97),
            minute(Code::OverLimit, 70, 0),
        ],
    );
    respond(&c, &w, token, body, &mut [&mut second, &mut third]);
    assert_eq!(w.resumed(), 2);
    assert_eq!(second.on_response_headers(&c, &w, &w.vm), Next::Continue);
    let added = w.added_headers();
    assert!(
        added.contains(&("x-ratelimit-remaining".into(), "17".into())),
        "{added:?}"
    );
    assert!(
        added.contains(&("x-ratelimit-limit".into(), "20, 20;w=60, 100;w=3600".into())),
        "{added:?}"
    );
    let replies = w.replies();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].status, 429);
    assert_eq!(replies[0].header("x-ratelimit-limit"), Some("70, 70;w=60"));
    assert_eq!(replies[0].header("retry-after"), Some("40"));
    assert_eq!(w.counter(Counter::Allowed), 2);
    assert_eq!(w.counter(Counter::OverLimit), 1);
    assert_eq!(w.group_counter(1, GroupCounter::RefusedService), 1);
    assert_eq!(w.vm.batch.in_flight(), 0);
}

#[test]
fn a_call_holds_whole_requests_up_to_max_descriptors_and_a_full_queue_goes_at_once() {
    let c = config(json!({"max_in_flight": 1, "max_descriptors": 5}), json!({}));
    let w = worker();
    let _first = ask(&c, &w, "tenant-a", 1);
    // Two descriptors each: the third request fills five, and a full call
    // (whole requests: two of them, four descriptors) goes without waiting.
    let _a = ask(&c, &w, "tenant-a", 1);
    let _b = ask(&c, &w, "tenant-c", 1);
    assert_eq!(w.call_count(), 1);
    let _c = ask(&c, &w, "tenant-d", 1);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (2, 1));
    assert_eq!(sent(&w, w.calls()[1].token).len(), 4);
    // An answer sends the rest.
    let token = w.calls()[0].token;
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 1), hour(Code::Ok, 1)]);
    w.set_grpc_response(Some(body.clone()));
    w.answer_call(&c, token, 0, body.len(), &mut []);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (3, 0));
    assert_eq!(sent(&w, w.calls()[2].token).len(), 2);
    // A request with more descriptors than max_descriptors still goes,
    // alone.
    let c = config(json!({"max_in_flight": 1, "max_descriptors": 1}), json!({}));
    let w = worker();
    let _a = ask(&c, &w, "tenant-a", 1);
    let _b = ask(&c, &w, "tenant-c", 1);
    assert_eq!(w.call_count(), 2);
    assert_eq!(sent(&w, w.calls()[1].token).len(), 2);
}

#[test]
fn the_queue_holds_at_most_max_queued_parts() {
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let _first = ask(&c, &w, "tenant-a", 1);
    // The tick's work is what can fill it: parts beyond the bound fail.
    let parts: Vec<Part> = (0..MAX_QUEUED_PARTS + 3)
        .map(|i| {
            let owner = Owner::Stream {
                id: Some(1_000 + i as u32),
                settle: Settle::Nothing,
                slots: None,
            };
            Part::new(&c, owner, GroupId::new(0), (format!("t{i}"), None), 1, NOW)
        })
        .collect();
    let queue_room = MAX_QUEUED_PARTS;
    // Through the queue without sending: fill it directly.
    if let Ok(mut q) = w.vm.batch.queue.try_borrow_mut() {
        q.extend(parts.iter().take(queue_room).cloned());
    }
    let mut s = w.stream();
    w.set_request_header("x-tenant-id", b"tenant-z");
    w.remove_request_header("x-cost");
    // A full queue: the request fails open at once, counted.
    assert_eq!(s.on_request_headers(&c, &w, &w.vm), Next::Continue);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 1);
    assert_eq!(w.counter(Counter::RlsError), 1);
    assert_eq!(w.vm.batch.queued(), MAX_QUEUED_PARTS);
}

#[test]
fn no_request_waits_longer_than_timeout_ms_queueing_included() {
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let _first = ask(&c, &w, "tenant-a", 1);
    assert_eq!(w.calls()[0].timeout_ms, 100);
    w.set_now_ms(NOW + 40);
    let mut queued = ask(&c, &w, "tenant-a", 1);
    w.set_now_ms(NOW + 70);
    let mut later = ask(&c, &w, "tenant-c", 1);
    // The first call answers at 90 ms: the queue goes, its call given what
    // its most urgent request has left (140 - 90).
    w.set_now_ms(NOW + 90);
    let token = w.calls()[0].token;
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 1), hour(Code::Ok, 1)]);
    w.set_grpc_response(Some(body.clone()));
    w.answer_call(&c, token, 0, body.len(), &mut []);
    assert_eq!(w.calls()[1].timeout_ms, 50);
    // Envoy times it out: both fail open, each counted.
    w.set_now_ms(NOW + 140);
    let token = w.calls()[1].token;
    w.answer_call(&c, token, 14, 0, &mut [&mut queued, &mut later]);
    assert_eq!(w.resumed(), 2);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 2);
    assert_eq!(w.counter(Counter::RlsError), 2);
    // A queued request whose time is up fails when the worker next looks
    // (a request, an answer, a tick), without a call.
    let mut a = ask(&c, &w, "tenant-a", 1);
    let mut waiting = ask(&c, &w, "tenant-c", 1);
    w.set_now_ms(NOW + 240);
    let calls = w.call_count();
    Root::default().on_tick(&c, &w, &w.vm);
    w.deliver(&c, &mut [&mut waiting]);
    assert_eq!(w.call_count(), calls);
    assert_eq!(w.counter(Counter::RlsError), 3);
    assert_eq!(w.resumed(), 3);
    // A call whose answer never comes is given up a second past its
    // deadline, so the queue never waits for it forever.
    assert_eq!(w.vm.batch.in_flight(), 1);
    w.set_now_ms(NOW + 140 + 1_000 + LOST_CALL_MS);
    let _b = ask(&c, &w, "tenant-a", 1);
    w.deliver(&c, &mut [&mut a]);
    assert_eq!(w.counter(Counter::RlsError), 4);
    assert_eq!(w.vm.batch.in_flight(), 1);
}

#[test]
fn a_failed_call_fails_each_of_its_requests_open_or_closed() {
    for deny in [false, true] {
        let extra = if deny {
            json!({"failure_mode_deny": true, "status_on_error": 503})
        } else {
            json!({})
        };
        let c = config(one_in_flight(), extra);
        let w = worker();
        let mut first = ask(&c, &w, "tenant-a", 1);
        let mut a = ask(&c, &w, "tenant-a", 1);
        let mut b = ask(&c, &w, "tenant-b", 1);
        let token = w.calls()[0].token;
        w.answer_call(&c, token, 14, 0, &mut [&mut first]);
        let token = w.calls()[1].token;
        w.answer_call(&c, token, 14, 0, &mut [&mut a, &mut b]);
        if deny {
            assert_eq!(w.resumed(), 0);
            assert_eq!(w.replies().len(), 3);
            assert!(w.replies().iter().all(|r| r.status == 503));
            assert_eq!(w.counter(Counter::FailureModeDenied), 3);
        } else {
            assert_eq!(w.resumed(), 3);
            assert_eq!(w.counter(Counter::FailureModeAllowed), 3);
            assert_eq!(w.group_counter(1, GroupCounter::FailedOpen), 1);
        }
        assert_eq!(w.counter(Counter::RlsError), 3);
    }
    // A call that cannot be sent: every request in it fails, the one that
    // sent it at once.
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let mut first = ask(&c, &w, "tenant-a", 1);
    let mut queued = ask(&c, &w, "tenant-c", 1);
    w.fail(crate::host::HostCall::Dispatch);
    let token = w.calls()[0].token;
    w.answer_call(&c, token, 14, 0, &mut [&mut first, &mut queued]);
    assert_eq!(w.counter(Counter::RlsDispatchFailed), 1);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 2);
    let (_, next) = w.request(&c, "tenant-a");
    assert_eq!(next, Next::Continue);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 3);
}

#[test]
fn a_stream_that_ends_while_queued_is_dropped_and_the_rest_answered() {
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let mut first = ask(&c, &w, "tenant-a", 1);
    let gone = ask(&c, &w, "tenant-a", 5);
    let mut kept = ask(&c, &w, "tenant-c", 1);
    Root::on_stream_end(&c, &w, &w.vm, gone.id());
    assert_eq!(w.vm.batch.queued(), 1);
    let token = w.calls()[0].token;
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 19), hour(Code::Ok, 99)]);
    respond(&c, &w, token, body, &mut [&mut first]);
    // Nothing was sent for it.
    let token = w.calls()[1].token;
    assert_eq!(
        sent(&w, token),
        [
            ("tenant-c".into(), "per_minute".into(), 1),
            ("tenant-c".into(), "per_hour".into(), 1)
        ]
    );
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 18), hour(Code::Ok, 98)]);
    respond(&c, &w, token, body, &mut [&mut kept]);
    assert_eq!(w.resumed(), 2);
    // A stream that ends while its call is under way: its answer goes to
    // nobody, the others' to them.
    let mut a = ask(&c, &w, "tenant-a", 1);
    let mut b = ask(&c, &w, "tenant-c", 1);
    let _ = (&mut a, &mut b);
    let token = w.vm.batch.token_for(a.id()).unwrap();
    Root::on_stream_end(&c, &w, &w.vm, a.id());
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 17), hour(Code::Ok, 97)]);
    respond(&c, &w, token, body, &mut []);
    let token = w.vm.batch.token_for(b.id()).unwrap();
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 16), hour(Code::Ok, 96)]);
    respond(&c, &w, token, body, &mut [&mut b]);
    assert_eq!(w.resumed(), 3);
}

#[test]
fn a_service_that_answers_a_batch_without_statuses_gets_one_request_per_call() {
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let mut first = ask(&c, &w, "tenant-a", 1);
    let mut a = ask(&c, &w, "tenant-a", 1);
    let mut b = ask(&c, &w, "tenant-b", 1);
    // One request alone: its answer without statuses is its own.
    let token = w.calls()[0].token;
    respond(&c, &w, token, answer(Code::Ok, vec![]), &mut [&mut first]);
    assert!(!w.vm.batch.unsplittable());
    // The batch's OVER_LIMIT without statuses: which request is over cannot
    // be known; each is asked again, alone, and answered alone.
    let token = w.calls()[1].token;
    respond(
        &c,
        &w,
        token,
        answer(Code::OverLimit, vec![]),
        &mut [&mut a, &mut b],
    );
    assert!(w.vm.batch.unsplittable());
    assert_eq!(w.counter(Counter::BatchUnsplittable), 1);
    assert_eq!(w.call_count(), 4);
    assert_eq!(w.resumed(), 1);
    let (ta, tb) = (w.calls()[2].token, w.calls()[3].token);
    assert_eq!(sent(&w, ta).len(), 2);
    assert_eq!(sent(&w, tb).len(), 1);
    respond(&c, &w, ta, answer(Code::Ok, vec![]), &mut [&mut a]);
    respond(&c, &w, tb, answer(Code::OverLimit, vec![]), &mut [&mut b]);
    assert_eq!(w.resumed(), 2);
    assert_eq!(w.replies().len(), 1);
    // From now on, one request per call, whatever is under way.
    let _c = ask(&c, &w, "tenant-a", 1);
    let _d = ask(&c, &w, "tenant-a", 1);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (6, 0));
    assert_eq!(w.counter(Counter::BatchUnsplittable), 1);
    // An OK batch answer without statuses admits every request of it.
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let mut first = ask(&c, &w, "tenant-a", 1);
    let mut a = ask(&c, &w, "tenant-a", 1);
    let mut b = ask(&c, &w, "tenant-b", 1);
    let token = w.calls()[0].token;
    respond(&c, &w, token, answer(Code::Ok, vec![]), &mut [&mut first]);
    let token = w.calls()[1].token;
    respond(
        &c,
        &w,
        token,
        answer(Code::Ok, vec![]),
        &mut [&mut a, &mut b],
    );
    assert_eq!((w.resumed(), w.call_count()), (3, 2));
    assert!(w.vm.batch.unsplittable());
}

#[test]
fn a_batch_answer_is_ok_for_all_when_the_service_says_ok_and_its_headers_stay_with_one_request() {
    let c = config(one_in_flight(), json!({}));
    let w = worker();
    let mut first = ask(&c, &w, "tenant-a", 1);
    let mut a = ask(&c, &w, "tenant-a", 1);
    let mut b = ask(&c, &w, "tenant-b", 1);
    // One request alone: the service's own headers are its own.
    let token = w.calls()[0].token;
    let body = answer_with_headers(
        Code::Ok,
        vec![minute(Code::Ok, 20, 19), hour(Code::Ok, 99)],
        &[("x-service", "1")],
        &[],
    );
    respond(&c, &w, token, body, &mut [&mut first]);
    first.on_response_headers(&c, &w, &w.vm);
    assert!(w
        .added_headers()
        .contains(&("x-service".into(), "1".into())));
    // A global shadow mode of the service answers OK with a descriptor over
    // its limit: no request of the call is refused. The service's headers
    // describe the whole call: not passed on.
    let token = w.calls()[1].token;
    let body = answer_with_headers(
        Code::Ok,
        vec![
            minute(Code::Ok, 20, 18),
            hour(Code::Ok, 98),
            minute(Code::OverLimit, 70, 0),
        ],
        &[("x-service", "2")],
        &[],
    );
    respond(&c, &w, token, body, &mut [&mut a, &mut b]);
    assert_eq!((w.resumed(), w.reply_count()), (3, 0));
    a.on_response_headers(&c, &w, &w.vm);
    b.on_response_headers(&c, &w, &w.vm);
    let added = w.added_headers();
    assert!(
        !added.contains(&("x-service".into(), "2".into())),
        "{added:?}"
    );
}

#[test]
fn batch_false_sends_one_request_per_call() {
    let c = config(json!(false), json!({}));
    let w = worker();
    for _ in 0..5 {
        ask(&c, &w, "tenant-a", 1);
    }
    assert_eq!((w.call_count(), w.vm.batch.queued()), (5, 0));
    assert_eq!(w.counter(Counter::BatchQueued), 0);
}

#[test]
fn a_tick_sends_the_queue_with_the_roots_calls() {
    let c = compiled(
        r#"{"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 100, "batch": {"max_in_flight": 1}},
            "limits": {"x-tenant-id": {"default": {"perminute": 20}}},
            "local": {"mode": "sync", "sync": {"interval_ms": 50}}}"#,
    );
    let w = Worker::ready(&c, NOW);
    // Sync admits locally (max_unsynced: 10, half of 20) and tracks it.
    assert_eq!(w.request(&c, "acme").1, Next::Continue);
    // Every call of the worker is under way: a request of another group
    // queues... here, a request costing 2 asks the service itself.
    w.set_request_header("x-cost", b"2");
    let c2 = compiled(
        r#"{"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 100, "batch": {"max_in_flight": 1}},
            "limits": {"x-tenant-id": {"default": {"perminute": 20}}},
            "local": {"mode": "sync", "sync": {"interval_ms": 50}}, "cost_header": "x-cost"}"#,
    );
    let (_s1, next) = w.request(&c2, "other");
    assert_eq!(next, Next::Pause);
    let (_s2, next) = w.request(&c2, "third");
    assert_eq!(next, Next::Pause);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (1, 1));
    // The tick: acme's push and the queued request go in one call.
    Root::default().on_tick(&c2, &w, &w.vm);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (2, 0));
    let mut got = sent(&w, w.calls()[1].token);
    got.sort();
    assert_eq!(
        got,
        [
            ("acme".into(), "per_minute".into(), 1),
            ("third".into(), "per_minute".into(), 2)
        ]
    );
}

/// The batch tests' configuration, calling `service`.
fn config_for(service: &str) -> Compiled {
    let base = json!({"domain": "d",
        "rate_limit_service": {"cluster": "ratelimit", "service": service, "timeout_ms": 100, "batch": one_in_flight()},
        "limits": {"x-tenant-id": {
            "default": {"perminute": 20, "perhour": 100},
            "gold": {"perminute": 70, "header_value": ["tenant-b"]}}},
        "local": {"enabled": false}});
    compiled_json(base, json!({}))
}

/// Each descriptor of a call, as its entries' keys and values joined.
fn descriptors_sent(w: &Worker, token: u32) -> Vec<String> {
    let call = w.calls().into_iter().find(|c| c.token == token).unwrap();
    let r = RateLimitRequest::decode(&call.message[..]).unwrap();
    r.descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// A request alone in its call, answered OK; then `a` (tenant-a: minute
/// and hour) and `b` (tenant-b: minute) queued into one call.
fn first_then_two(c: &Compiled, w: &Worker) -> (Stream, Stream, u32) {
    let mut first = ask(c, w, "tenant-a", 1);
    let a = ask(c, w, "tenant-a", 1);
    let b = ask(c, w, "tenant-b", 1);
    let token = w.calls()[0].token;
    let body = answer(Code::Ok, vec![minute(Code::Ok, 20, 19), hour(Code::Ok, 99)]);
    respond(c, w, token, body, &mut [&mut first]);
    assert_eq!((w.call_count(), w.resumed()), (2, 1));
    (a, b, w.calls()[1].token)
}

/// The mark's own status: the counter answers it OK, without a limit.
fn mark_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

#[test]
fn a_batched_call_to_the_counter_marks_where_each_request_begins_and_only_to_the_counter() {
    let c = config_for("counter");
    let w = worker();
    let (_a, _b, token) = first_then_two(&c, &w);
    // A call of one request: no mark (a call without marks is one request).
    assert_eq!(
        descriptors_sent(&w, w.calls()[0].token),
        [
            "generic_key=per_minute,tenant=tenant-a",
            "generic_key=per_hour,tenant=tenant-a"
        ]
    );
    assert_eq!(
        descriptors_sent(&w, token),
        [
            "trl.request=",
            "generic_key=per_minute,tenant=tenant-a",
            "generic_key=per_hour,tenant=tenant-a",
            "trl.request=",
            "generic_key=per_minute,tenant=tenant-b",
        ]
    );
    // envoyproxy/ratelimit, named or by default, gets today's messages.
    for c in [
        config_for("envoy-ratelimit"),
        config(one_in_flight(), json!({})),
    ] {
        let w = worker();
        let (_a, _b, token) = first_then_two(&c, &w);
        assert_eq!(
            descriptors_sent(&w, token),
            [
                "generic_key=per_minute,tenant=tenant-a",
                "generic_key=per_hour,tenant=tenant-a",
                "generic_key=per_minute,tenant=tenant-b",
            ]
        );
    }
}

#[test]
fn the_counters_answer_splits_around_the_marks_one_request_refused_the_other_admitted() {
    let c = config_for("counter");
    // tenant-b over its minute: refused; tenant-a admitted, its statuses
    // its own (not shifted by the marks).
    let w = worker();
    let (mut a, mut b, token) = first_then_two(&c, &w);
    let body = answer_with_headers(
        Code::OverLimit,
        vec![
            mark_status(),
            minute(Code::Ok, 20, 18),
            hour(Code::Ok, 98),
            mark_status(),
            minute(Code::OverLimit, 70, 0),
        ],
        &[],
        &[],
    );
    respond(&c, &w, token, body, &mut [&mut a, &mut b]);
    assert_eq!((w.resumed(), w.reply_count()), (2, 1));
    let r = &w.replies()[0];
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-ratelimit-limit"), Some("70, 70;w=60"));
    a.on_response_headers(&c, &w, &w.vm);
    let added = w.added_headers();
    assert!(
        added.contains(&("x-ratelimit-remaining".into(), "18".into())),
        "{added:?}"
    );
    assert!(!w.vm.batch.unsplittable());
    // The other way round: tenant-a over its hour, tenant-b admitted.
    let w = worker();
    let (mut a, mut b, token) = first_then_two(&c, &w);
    let body = answer(
        Code::OverLimit,
        vec![
            mark_status(),
            minute(Code::Ok, 20, 18),
            hour(Code::OverLimit, 0),
            mark_status(),
            minute(Code::Ok, 70, 69),
        ],
    );
    respond(&c, &w, token, body, &mut [&mut a, &mut b]);
    assert_eq!((w.resumed(), w.reply_count()), (2, 1));
    let r = &w.replies()[0];
    assert_eq!(r.status, 429);
    assert_eq!(
        r.header("x-ratelimit-limit"),
        Some("100, 20;w=60, 100;w=3600")
    );
    assert_eq!(r.header("retry-after"), Some("2000"));
    b.on_response_headers(&c, &w, &w.vm);
    let added = w.added_headers();
    assert!(
        added.contains(&("x-ratelimit-remaining".into(), "69".into())),
        "{added:?}"
    );
    assert!(!w.vm.batch.unsplittable());
    // An answer to a marked call without the marks' statuses cannot be
    // split: one request per call from then on.
    let w = worker();
    let (mut a, mut b, token) = first_then_two(&c, &w);
    let body = answer(
        Code::Ok,
        vec![
            minute(Code::Ok, 20, 18),
            hour(Code::Ok, 98),
            minute(Code::Ok, 70, 69),
        ],
    );
    respond(&c, &w, token, body, &mut [&mut a, &mut b]);
    assert!(w.vm.batch.unsplittable());
}

/// Sync mode against `service`: 20 a minute, `max_unsynced` 10.
fn sync_config(service: &str) -> Compiled {
    let base = json!({"domain": "d",
        "rate_limit_service": {"cluster": "ratelimit", "service": service, "timeout_ms": 100, "batch": one_in_flight()},
        "limits": {"x-tenant-id": {"default": {"perminute": 20}}},
        "local": {"mode": "sync", "sync": {"interval_ms": 50}}, "cost_header": "x-cost"});
    compiled_json(base, json!({}))
}

#[test]
fn a_sync_push_to_the_counter_has_a_mark_of_its_own_and_its_answer_stops_local_admission() {
    let c = sync_config("counter");
    let w = Worker::ready(&c, NOW);
    // Two hits admitted locally, pushed alone: marked, as a push.
    for _ in 0..2 {
        assert_eq!(w.request(&c, "acme").1, Next::Continue);
    }
    Root::default().on_tick(&c, &w, &w.vm);
    assert_eq!(w.call_count(), 1);
    let token = w.calls()[0].token;
    assert_eq!(
        descriptors_sent(&w, token),
        ["trl.request=push", "generic_key=per_minute,tenant=acme"]
    );
    let call = w.calls().into_iter().find(|c| c.token == token).unwrap();
    let r = RateLimitRequest::decode(&call.message[..]).unwrap();
    assert_eq!(r.descriptors[1].hits_addend.map(|h| h.value), Some(2));
    assert_eq!(r.hits_addend, 0);
    // The counter counted them whatever the limit: the fleet is now at 21
    // of 20 (OVER_LIMIT, 0 left). The view learns it: no more local
    // admission in this window.
    let body = answer(
        Code::OverLimit,
        vec![mark_status(), minute(Code::OverLimit, 20, 0)],
    );
    respond(&c, &w, token, body, &mut []);
    assert_eq!(w.group_counter(0, GroupCounter::SyncOverLimitHits), 2);
    assert_eq!(w.group_counter(0, GroupCounter::SyncHits), 2);
    let (_s, next) = w.request(&c, "acme");
    assert_eq!(next, Next::Pause);
    assert_eq!((w.reply_count(), w.call_count()), (1, 1));
    assert_eq!(w.replies()[0].status, 429);
    // A push with a request queued behind a call under way: each part its
    // own mark, the request's an ordinary one.
    let w = Worker::ready(&c, NOW);
    assert_eq!(w.request(&c, "acme").1, Next::Continue);
    w.set_request_header("x-cost", b"2");
    let (_s1, next) = w.request(&c, "other");
    assert_eq!(next, Next::Pause);
    let (_s2, next) = w.request(&c, "third");
    assert_eq!(next, Next::Pause);
    Root::default().on_tick(&c, &w, &w.vm);
    let token = w.calls()[1].token;
    let got = descriptors_sent(&w, token);
    assert_eq!(got.len(), 4, "{got:?}");
    for pair in got.chunks(2) {
        let mark = if pair[1].ends_with("acme") {
            "trl.request=push"
        } else {
            "trl.request="
        };
        assert_eq!(pair[0], mark, "{got:?}");
    }
    // envoyproxy/ratelimit gets today's push: no mark, the hits
    // request-wide; it counts them whatever the limit itself.
    let c = sync_config("envoy-ratelimit");
    let w = Worker::ready(&c, NOW);
    for _ in 0..2 {
        assert_eq!(w.request(&c, "acme").1, Next::Continue);
    }
    Root::default().on_tick(&c, &w, &w.vm);
    let call = &w.calls()[0];
    let r = RateLimitRequest::decode(&call.message[..]).unwrap();
    assert_eq!(
        descriptors_sent(&w, call.token),
        ["generic_key=per_minute,tenant=acme"]
    );
    assert_eq!(r.hits_addend, 2);
}
