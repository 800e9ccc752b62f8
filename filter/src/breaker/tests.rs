//! The breaker: the state machine alone, then shared by the workers of one
//! Envoy over `MemHost`, then in the flow (a request's call and the root's).

use super::*;
use crate::flow::{Next, Stream};
use crate::local::SlotSecret;
use crate::testing::{compiled, HostCall, Worker, MEMHOST_SECRET};
use crate::vm::Vm;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const P: Params = Params {
    failures: 3,
    probe_interval_ms: 1_000,
};
const NOW: u64 = 1_700_000_000_000;

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
fn config(extra: &str) -> Compiled {
    compiled(&format!(
        r#"{{"domain": "d", "rate_limit_service": {{"cluster": "rl", "timeout_ms": 300}},
            "limits": {{"x-tenant-id": {{"default": {{"perminute": 100}}}}}},
            "local": {{"enabled": false}},
            "breaker": {{"failures": 3, "probe_interval_ms": 1000}}{extra}}}"#
    ))
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
    let mut s = Stream::default();
    let calls = w.call_count();
    let next = s.on_request_headers(c, w, vm);
    if w.call_count() > calls {
        s.on_rls_answer(c, w, vm, 14, 0);
    }
    next
}

#[test]
fn the_workers_of_an_envoy_share_it_through_shared_data() {
    let c = config("");
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
    let c = config("");
    let w = worker(&c);
    let other = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    w.set_now_ms(NOW + 1_000);
    w.set_request_header("x-tenant-id", b"tenant-a");
    let mut probe = Stream::default();
    assert_eq!(probe.on_request_headers(&c, &w, &w.vm), Next::Pause);
    assert_eq!(w.counter(Counter::BreakerProbes), 1);
    // While it is under way, the other worker's requests get the fallback.
    assert_eq!(failing_request(&c, &w, &other), Next::Continue);
    assert_eq!(w.call_count(), 4);
    // Answered: closed, on every worker at once.
    let body = crate::testing::answer(crate::proto::Code::Ok, vec![]);
    w.set_grpc_response(Some(body.clone()));
    w.set_now_ms(NOW + 1_200);
    probe.on_rls_answer(&c, &w, &w.vm, 0, body.len());
    assert_eq!(w.counter(Counter::BreakerClosed), 1);
    assert_eq!(w.counter(Counter::BreakerOpenMs), 1_200);
    assert_eq!(w.gauge(Gauge::BreakerOpen), 0);
    assert_eq!(failing_request(&c, &w, &other), Next::Pause);
    assert_eq!(w.call_count(), 5);
}

#[test]
fn a_worker_that_read_it_closed_trusts_that_for_a_moment() {
    let c = config("");
    let w = worker(&c);
    let other = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    // `other` reads it closed, with no failure, at NOW.
    assert_eq!(may_call(&c, &w.host, &other.breaker, NOW), Gate::Call);
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    // Within TRUST_CLOSED_MS it still calls; then it reads it open.
    let last = NOW + TRUST_CLOSED_MS - 1;
    assert_eq!(may_call(&c, &w.host, &other.breaker, last), Gate::Call);
    let later = NOW + TRUST_CLOSED_MS;
    assert_eq!(may_call(&c, &w.host, &other.breaker, later), Gate::Fallback);
    // Its own failure is seen at once, and no answer is taken as closed
    // until it reads it again.
    let fresh = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    assert_eq!(may_call(&c, &w.host, &fresh.breaker, later), Gate::Fallback);
}

#[test]
fn with_deny_an_open_breaker_refuses_at_once() {
    let c = config(r#", "on_failure": "deny", "status_on_error": 503"#);
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
    let c = config("");
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
    let c = config("");
    let w = worker(&c);
    for _ in 0..3 {
        failing_request(&c, &w, &w.vm);
    }
    w.fail(HostCall::GetShared);
    let fresh = Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET));
    assert_eq!(may_call(&c, &w.host, &fresh.breaker, NOW), Gate::Call);
}
