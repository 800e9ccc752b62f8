//! The breaker: the state machine alone, then shared by the workers of one
//! Envoy over `MemHost`, then in the flow (a request's call and the root's).

use super::*;
use crate::flow::Next;
use crate::host::HostCall;
use crate::local::SlotSecret;
use crate::testing::{compiled, compiled_json, Worker, MEMHOST_SECRET};
use crate::vm::Vm;
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const P: Params = Params {
    failures: 3,
    probe_interval_ms: 1_000,
};
use crate::testing::NOW;

fn fail(s: State, now: u64) -> (State, Option<Transition>) {
    let (w, t) = settle(s, &P, true, now);
    (w.unwrap_or(s), t)
}

#[test]
fn it_opens_after_failures_in_a_row_and_an_answer_resets_the_count() {
    let (s, t) = fail(State::default(), NOW);
    assert_eq!((s.failures, t), (1, None));
    let (s, _) = fail(s, NOW);
    // An answer in between: the count starts again.
    let (w, t) = settle(s, &P, false, NOW);
    assert_eq!((w, t), (Some(State::default()), None));
    let mut s = State::default();
    for _ in 0..2 {
        s = fail(s, NOW).0;
    }
    assert!(!s.is_open());
    let (s, t) = fail(s, NOW + 5);
    assert_eq!(t, Some(Transition::Opened));
    assert_eq!(
        s,
        State {
            failures: 3,
            opened_ms: NOW + 5,
            probe_at_ms: NOW + 1_005
        }
    );
    // A healthy service's answers write nothing.
    assert_eq!(settle(State::default(), &P, false, NOW), (None, None));
}

#[test]
fn open_it_lets_one_probe_out_per_interval_and_an_answer_closes_it() {
    let open = fail(fail(fail(State::default(), NOW).0, NOW).0, NOW).0;
    assert_eq!(gate(State::default(), &P, NOW), (Gate::Call, None));
    assert_eq!(gate(open, &P, NOW + 999), (Gate::Fallback, None));
    let (g, claimed) = gate(open, &P, NOW + 1_000);
    assert_eq!(g, Gate::Probe);
    let claimed = claimed.unwrap();
    assert_eq!(claimed.probe_at_ms, NOW + 2_000);
    // The others in that interval get the fallback.
    assert_eq!(gate(claimed, &P, NOW + 1_500).0, Gate::Fallback);
    // The probe failed: nothing changes, the next one is due.
    assert_eq!(settle(claimed, &P, true, NOW + 1_300), (None, None));
    assert_eq!(gate(claimed, &P, NOW + 2_000).0, Gate::Probe);
    // It was answered: closed, after 2.5 s open.
    assert_eq!(
        settle(claimed, &P, false, NOW + 2_500),
        (
            Some(State::default()),
            Some(Transition::Closed { open_ms: 2_500 })
        )
    );
}

#[test]
fn its_state_round_trips_and_anything_else_is_closed() {
    let s = State {
        failures: 7,
        opened_ms: NOW,
        probe_at_ms: NOW + 10,
    };
    assert_eq!(State::decode(Some(&s.encode())), s);
    assert_eq!(State::decode(None), State::default());
    assert_eq!(State::decode(Some(&[0; STATE_BYTES])), State::default());
    assert_eq!(State::decode(Some(&s.encode()[..20])), State::default());
}

/// Exact mode, no local layer (only the breaker reads shared data), the
/// breaker at 3 failures and 1 s probes, and `extra`.
fn config(extra: Value) -> Compiled {
    let base = json!({"domain": "d", "rate_limit_service": {"cluster": "rl", "timeout_ms": 300},
        "limits": {"x-tenant-id": {"default": {"perminute": 100}}},
        "local": {"enabled": false},
        "breaker": {"failures": 3, "probe_interval_ms": 1000}});
    compiled_json(base, extra)
}

fn worker(c: &Compiled) -> Worker {
    let w = Worker::new();
    crate::root::prepare_failure(&w, c);
    w.set_now_ms(NOW);
    w
}

/// A request that calls, and its call failing (gRPC 14, as a timeout or a
/// refused connection arrive), on the VM `vm` of the host.
fn failing_request(c: &Compiled, w: &Worker, vm: &Vm) -> Next {
    w.set_request_header("x-tenant-id", b"tenant-a");
    let mut s = w.stream();
    let next = s.on_request_headers(c, w, vm);
    if let Some(token) = vm.batch.token_for(s.id()) {
        crate::root::Root::default().on_answer(c, w, vm, token, 14, 0);
        for d in vm.batch.take_deliveries() {
            if d.stream == s.id() {
                s.on_answer(c, w, vm, d.answer);
            }
        }
    }
    next
}

#[test]
fn the_workers_of_an_envoy_share_it_through_shared_data() {
    let c = config(json!({}));
    let w = worker(&c);
    let other = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    // Failures on two workers add up: the third opens it.
    assert_eq!(failing_request(&c, &w, &w.vm), Next::Pause);
    assert_eq!(failing_request(&c, &w, &other), Next::Pause);
    assert_eq!(failing_request(&c, &w, &w.vm), Next::Pause);
    assert_eq!(w.counter(Counter::BreakerOpened), 1);
    assert_eq!(w.gauge(Gauge::BreakerOpen), 1);
    assert_eq!(w.call_count(), 3);
    // Both workers now answer at once, with no call.
    for vm in [&w.vm, &other] {
        assert_eq!(failing_request(&c, &w, vm), Next::Continue);
    }
    assert_eq!(w.call_count(), 3);
    assert_eq!(w.counter(Counter::BreakerSkipped), 2);
    // Fail open, as on_failure says; not an rls_error: no call failed.
    assert_eq!(w.counter(Counter::FailureModeAllowed), 5);
    assert_eq!(w.counter(Counter::RlsError), 3);
}

#[test]
fn one_request_probes_per_interval_and_an_answer_closes_it_for_every_worker() {
    let c = config(json!({}));
    let w = worker(&c);
    let other = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    w.set_now_ms(NOW + 1_000);
    w.set_request_header("x-tenant-id", b"tenant-a");
    let mut probe = w.stream();
    assert_eq!(probe.on_request_headers(&c, &w, &w.vm), Next::Pause);
    assert_eq!(w.counter(Counter::BreakerProbes), 1);
    // While it is under way, the other worker's requests get the fallback.
    assert_eq!(failing_request(&c, &w, &other), Next::Continue);
    assert_eq!(w.call_count(), 4);
    // Answered: closed, on every worker at once.
    let body = crate::testing::answer(crate::proto::Code::Ok, vec![]);
    w.set_grpc_response(Some(body.clone()));
    w.set_now_ms(NOW + 1_200);
    w.answer(&c, &mut probe, 0, body.len());
    assert_eq!(w.counter(Counter::BreakerClosed), 1);
    assert_eq!(w.counter(Counter::BreakerOpenMs), 1_200);
    assert_eq!(w.gauge(Gauge::BreakerOpen), 0);
    assert_eq!(failing_request(&c, &w, &other), Next::Pause);
    assert_eq!(w.call_count(), 5);
}

#[test]
fn a_worker_that_read_it_closed_trusts_that_for_a_moment() {
    let c = config(json!({}));
    let w = worker(&c);
    let other = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    // `other` reads it closed, with no failure, at NOW.
    assert_eq!(
        may_call(&c, &w.host, &other.batch.breaker, NOW, 1),
        Gate::Call
    );
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    // Within TRUST_CLOSED_MS it still calls; then it reads it open.
    let last = NOW + TRUST_CLOSED_MS - 1;
    assert_eq!(
        may_call(&c, &w.host, &other.batch.breaker, last, 1),
        Gate::Call
    );
    let later = NOW + TRUST_CLOSED_MS;
    assert_eq!(
        may_call(&c, &w.host, &other.batch.breaker, later, 1),
        Gate::Fallback
    );
    // Its own failure is seen at once, and no answer is taken as closed
    // until it reads it again.
    let fresh = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    assert_eq!(
        may_call(&c, &w.host, &fresh.batch.breaker, later, 1),
        Gate::Fallback
    );
}

#[test]
fn with_deny_an_open_breaker_refuses_at_once() {
    let c = config(json!({"on_failure": "deny", "status_on_error": 503}));
    let w = worker(&c);
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    assert_eq!(failing_request(&c, &w, &w.vm), Next::Pause);
    assert_eq!(w.call_count(), 3);
    let statuses: Vec<u32> = w.replies().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503; 4]);
    assert_eq!(w.counter(Counter::FailureModeDenied), 4);
}

#[test]
fn calls_that_cannot_be_sent_open_it_and_off_it_never_opens() {
    let c = config(json!({}));
    let w = worker(&c);
    w.fail(HostCall::Dispatch);
    for _ in 0..4 {
        assert_eq!(failing_request(&c, &w, &w.vm), Next::Continue);
    }
    assert_eq!(w.counter(Counter::RlsDispatchFailed), 3);
    assert_eq!(w.counter(Counter::BreakerSkipped), 1);

    let c = compiled(
        r#"{"domain": "d", "rate_limit_service": {"cluster": "rl"},
            "limits": {"x-tenant-id": {"default": {"perminute": 100}}},
            "breaker": {"enabled": false}}"#,
    );
    let w = worker(&c);
    w.fail(HostCall::Dispatch);
    for _ in 0..20 {
        failing_request(&c, &w, &w.vm);
    }
    assert_eq!(w.counter(Counter::RlsDispatchFailed), 20);
    assert_eq!(w.counter(Counter::BreakerOpened), 0);
    assert!(!w.shared_keys().contains(&key().to_string()));
}

#[test]
fn a_shared_data_failure_never_keeps_a_request_from_calling() {
    let c = config(json!({}));
    let w = worker(&c);
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    w.fail(HostCall::GetShared);
    let fresh = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    assert_eq!(
        may_call(&c, &w.host, &fresh.batch.breaker, NOW, 1),
        Gate::Call
    );
}

/// A request of `tenant-a` on worker `w`, up to its first answer.
fn asking(c: &Compiled, w: &Worker) -> (crate::flow::Stream, Next) {
    w.set_request_header("x-tenant-id", b"tenant-a");
    let mut s = w.stream();
    let next = s.on_request_headers(c, w, &w.vm);
    (s, next)
}

#[test]
fn a_batched_call_is_one_outcome_one_probe_and_the_open_breaker_fails_every_part() {
    // One call under way at a time: the next requests queue and go
    // together when its answer comes back.
    let c = compiled(
        r#"{"domain": "d",
            "rate_limit_service": {"cluster": "rl", "timeout_ms": 300, "batch": {"max_in_flight": 1}},
            "limits": {"x-tenant-id": {"default": {"perminute": 100}}},
            "local": {"enabled": false},
            "breaker": {"failures": 2, "probe_interval_ms": 1000}}"#,
    );
    let w = worker(&c);
    let (mut a, _) = asking(&c, &w);
    let (mut b, _) = asking(&c, &w);
    let (mut d, _) = asking(&c, &w);
    assert_eq!((w.call_count(), w.vm.batch.queued()), (1, 2));
    // The first call fails: one failure; the queue goes as one call.
    w.answer(&c, &mut a, 14, 0);
    assert_eq!((w.call_count(), w.counter(Counter::BreakerOpened)), (2, 0));
    // That call of two requests fails: one more failure, which opens it,
    // and both requests get on_failure.
    let token = w.vm.batch.token_for(b.id()).unwrap();
    assert!(w
        .answer_call(&c, token, 14, 0, &mut [&mut b, &mut d])
        .is_empty());
    assert_eq!(w.counter(Counter::BreakerOpened), 1);
    assert_eq!(w.counter(Counter::RlsError), 3);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 3);
    // Open: a request makes no call, and is answered at once; not an
    // rls_error (no call failed).
    let (_, next) = asking(&c, &w);
    assert_eq!((next, w.call_count()), (Next::Continue, 2));
    assert_eq!(w.counter(Counter::BreakerSkipped), 1);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 4);
    assert_eq!(w.counter(Counter::RlsError), 3);
    // A second on: one probe; the requests behind it queue, then go in
    // one call once its answer has closed the breaker.
    w.set_now_ms(NOW + 1_000);
    let (mut probe, next) = asking(&c, &w);
    assert_eq!((next, w.call_count()), (Next::Pause, 3));
    assert_eq!(w.counter(Counter::BreakerProbes), 1);
    let _queued = (asking(&c, &w), asking(&c, &w));
    assert_eq!(w.vm.batch.queued(), 2);
    let body = crate::testing::answer(crate::proto::Code::Ok, vec![]);
    w.set_grpc_response(Some(body.clone()));
    w.answer(&c, &mut probe, 0, body.len());
    assert_eq!(w.counter(Counter::BreakerClosed), 1);
    assert_eq!(w.call_count(), 4);
    assert_eq!(w.vm.batch.parts_of(w.vm.batch.tokens()[0]).len(), 2);
    assert_eq!(w.counter(Counter::BreakerSkipped), 1);
}

#[test]
fn the_root_calls_the_open_breaker_keeps_in_are_settled_as_failed() {
    // Lease mode: a tenant's refill, queued by its request, goes on the
    // tick; with the breaker open it is not made, and counts lease.failed.
    let c = compiled(
        r#"{"domain": "d", "rate_limit_service": {"cluster": "rl", "timeout_ms": 300},
            "limits": {"x-tenant-id": {"default": {"perminute": 1000}}},
            "local": {"mode": "lease"},
            "breaker": {"failures": 1, "probe_interval_ms": 60000}}"#,
    );
    let w = worker(&c);
    w.create_slots(c.config.local.slots);
    // One failed call opens it.
    let (mut s, next) = asking(&c, &w);
    assert_eq!(next, Next::Pause);
    w.answer(&c, &mut s, 14, 0);
    assert_eq!(w.counter(Counter::BreakerOpened), 1);
    let calls = w.call_count();
    // The tenant's next requests: no call; whatever the root is handed goes
    // nowhere either, and is settled as failed.
    for _ in 0..3 {
        let (_, next) = asking(&c, &w);
        assert_eq!(next, Next::Continue);
    }
    let mut root = crate::root::Root::default();
    w.set_now_ms(NOW + 2 * u64::from(ratelimit_config::LEASE_TICK_MS));
    root.on_tick(&c, &w, &w.vm);
    assert_eq!(w.call_count(), calls);
    assert_eq!(w.vm.batch.in_flight(), 0);
    let skipped = w.counter(Counter::BreakerSkipped);
    assert!(skipped >= 3, "{skipped}");
    let failed = w.group_counter(0, crate::counters::GroupCounter::LeasesFailed);
    assert!(failed >= 2, "{failed}");
}
