//! Sync mode: the pure steps, then the flow and the root's pushes against
//! the in-memory host and its clock.

use prost::Message;
use ratelimit_config::parse_plugin_config;

use super::*;
use crate::flow::{Next, Stream};
use crate::local::{slot_for, SlotKey};
use crate::proto::{RateLimitRequest, RateLimitUnit};
use crate::testing::{answer, status, MemHost};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// 2023-11-14T22:13:20.250Z: 20.25 s into its minute.
const NOW: u64 = 1_700_000_000_250;
const MINUTE_END: u64 = 1_700_000_040_000;

/// 10 per minute, 100 per hour; 4 hits may be pending.
fn params() -> SyncParams {
    SyncParams {
        max_unsynced: 4,
        windows: [(60_000, 10), (3_600_000, 100), (1_000, 0), (1_000, 0)],
        units: 2,
        push_lost_ms: 1_025,
    }
}

#[test]
fn admits_while_the_view_and_the_pending_hits_fit_then_asks_then_refuses() {
    let p = params();
    let mut s = SyncState {
        views: [5, 50, 0, 0],
        view_until_ms: [MINUTE_END, MINUTE_END + 1_000_000, 0, 0],
        ..SyncState::default()
    };
    let mut steps = Vec::new();
    for _ in 0..5 {
        let (next, step) = decide(Some(s), &p, NOW);
        steps.push(step);
        s = next;
    }
    // 4 admitted (max_unsynced), then the fifth asks the service.
    assert_eq!(&steps[..4], &[SyncStep::Admit; 4]);
    assert_eq!(steps[4], SyncStep::Ask);
    assert_eq!((s.unsynced, s.in_flight), (4, 1));
    // The asking request's hit stays pending until its answer: another
    // request meanwhile is judged with it (5 + 5 pending: the limit).
    let (_, step) = decide(Some(s), &p, NOW);
    assert!(matches!(step, SyncStep::Refuse { .. }), "{step:?}");
    let answered = Heard::Counts(vec![(false, 4), (false, 49)]);
    let s = settle(Some(s), &p, NOW, NOW + 1, 1, false, &answered);
    assert_eq!((s.views[0], s.views[1], s.in_flight), (6, 51, 0));
    // The root pushes the 4; the service has counted 10 of 10: 429, no call.
    let (pushed, delta) = take_delta(Some(s), &p, NOW + 1);
    assert_eq!(delta, 4);
    let heard = Heard::Counts(vec![(false, 0), (false, 45)]);
    let s = settle(Some(pushed), &p, NOW + 1, NOW + 5, delta, true, &heard);
    assert_eq!((s.views[0], s.views[1], s.pending()), (10, 55, 0));
    let (s, step) = decide(Some(s), &p, NOW + 7);
    assert_eq!(
        step,
        SyncStep::Refuse {
            retry_after_s: (MINUTE_END - NOW - 7).div_ceil(1_000)
        }
    );
    // The next minute starts from 0 (the hour's view stays).
    let (s, step) = decide(Some(s), &p, MINUTE_END);
    assert_eq!(step, SyncStep::Admit);
    assert_eq!((s.views[0], s.views[1]), (0, 55));
}

#[test]
fn only_one_push_of_a_tenant_is_under_way_and_a_failed_one_is_pushed_again() {
    let p = params();
    let s = SyncState {
        unsynced: 3,
        ..SyncState::default()
    };
    let (s, delta) = take_delta(Some(s), &p, NOW);
    assert_eq!((delta, s.in_flight, s.unsynced), (3, 3, 0));
    // Another worker's root, meanwhile: nothing to take.
    let (s, again) = take_delta(Some(s), &p, NOW + 1);
    assert_eq!(again, 0);
    let s = settle(Some(s), &p, NOW, NOW + 30, 3, true, &Heard::Failed);
    assert_eq!((s.in_flight, s.unsynced), (0, 3));
    // A request's own call that failed is not put back (it followed
    // failure_mode_deny, as in exact mode).
    let asking = SyncState { in_flight: 1, ..s };
    let after = settle(Some(asking), &p, NOW, NOW + 30, 1, false, &Heard::Failed);
    assert_eq!((after.in_flight, after.unsynced), (0, 3));
    // A push never answered is taken as not sent after push_lost_ms.
    let (s, delta) = take_delta(Some(s), &p, NOW + 40);
    assert_eq!(delta, 3);
    let (s, _) = decide(Some(s), &p, NOW + 40 + p.push_lost_ms);
    assert_eq!((s.in_flight, s.unsynced), (0, 4));
}

#[test]
fn an_answer_from_an_ended_window_teaches_nothing_about_the_new_one() {
    let p = params();
    let s = SyncState {
        in_flight: 2,
        push_at_ms: MINUTE_END - 1,
        ..SyncState::default()
    };
    let heard = Heard::Counts(vec![(true, 0), (false, 10)]);
    let s = settle(Some(s), &p, MINUTE_END - 1, MINUTE_END + 1, 2, true, &heard);
    assert_eq!(s.views[0], 0);
    assert_eq!(s.views[1], 90);
}

#[test]
fn sync_states_round_trip_through_their_bytes() {
    let s = SyncState {
        views: [1, 2, 3, 4],
        view_until_ms: [5, 6, 7, u64::MAX],
        unsynced: 8,
        in_flight: 9,
        push_at_ms: NOW,
    };
    let mut b = [0u8; SyncState::BYTES];
    s.encode(&mut b);
    assert_eq!(SyncState::decode(&b), Some(s));
}

// ------------------------------------------------------------ the flow

const HEADER: &str = "x-tenant-id";

fn config() -> Compiled {
    let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
        "limits": {"x-tenant-id": {"default": {"perminute": 10}}},
        "local": {"mode": "sync", "sync": {"interval_ms": 50, "max_unsynced": 6}}}"#;
    match parse_plugin_config(text.as_bytes()) {
        Ok((config, _)) => Compiled::new(config),
        Err(e) => panic!("test configuration: {e:?}"),
    }
}

fn request(c: &Compiled, h: &MemHost, tenant: &str) -> (Stream, Next) {
    h.set_request_header(HEADER, tenant.as_bytes());
    let mut s = Stream::default();
    let next = s.on_request_headers(c, h);
    (s, next)
}

#[test]
fn requests_are_admitted_locally_and_the_root_pushes_their_hits() {
    let c = config();
    let h = MemHost::new();
    h.create_slots(c.config.local.slots);
    h.set_now_ms(NOW);
    for _ in 0..6 {
        assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    }
    assert_eq!(h.call_count(), 0);
    // The seventh: 6 hits pending, max_unsynced: it asks the service.
    let (mut s, next) = request(&c, &h, "acme");
    assert_eq!(next, Next::Pause);
    let body = answer(
        Code::Ok,
        vec![status(Code::Ok, 10, RateLimitUnit::Minute, 7, 40)],
    );
    h.set_grpc_response(Some(body.clone()));
    s.on_rls_answer(&c, &h, 0, body.len());
    // The root's tick: the tracked tenant's 6 hits go out in one call.
    let tracked = h.tracked();
    assert_eq!(tracked.len(), 1);
    let (group, tenant, at) = tracked[0].clone();
    let (push, idle) = next_push(&c, &h, group, &tenant, at);
    let (push, message) = push.unwrap();
    assert!(!idle);
    let asked = RateLimitRequest::decode(&message[..]).unwrap();
    assert_eq!(asked.hits_addend, 6);
    // Another worker's root finds nothing to push.
    assert_eq!(next_push(&c, &h, group, &tenant, at).0, None);
    // The service counted 1 + 6: 3 remain, and the Envoy admits 3 more.
    let body = answer(
        Code::Ok,
        vec![status(Code::Ok, 10, RateLimitUnit::Minute, 3, 40)],
    );
    on_push_answer(&c, &h, &push, 0, Some(&body));
    let statuses: Vec<Next> = (0..5).map(|_| request(&c, &h, "acme").1).collect();
    assert_eq!(
        statuses,
        [
            Next::Continue,
            Next::Continue,
            Next::Continue,
            Next::Pause,
            Next::Pause
        ]
    );
    assert_eq!(h.replies().len(), 2);
    assert_eq!(h.replies()[0].status, 429);
    assert_eq!(h.call_count(), 1);
    assert_eq!(h.group_counter(0, GroupCounter::SyncLocal), 9);
    assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 2);
    assert_eq!(h.group_counter(0, GroupCounter::Syncs), 1);
    assert_eq!(h.group_counter(0, GroupCounter::SyncHits), 6);
    let slot = Slot::decode(
        &h.shared_value(&SlotKey::new(
            slot_for(&h.slot_secret(), "default", "acme", c.config.local.slots).index,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(slot.sync.unwrap().unsynced, 3);
}

fn config_with(extra: &str) -> Compiled {
    let text = format!(
        r#"{{"domain": "d", "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 25}},
        "limits": {{"x-tenant-id": {{"default": {{"perminute": 10}}}}}},
        "local": {{"mode": "sync", "sync": {{"interval_ms": 50, "max_unsynced": 6}}}}{extra}}}"#
    );
    match parse_plugin_config(text.as_bytes()) {
        Ok((config, _)) => Compiled::new(config),
        Err(e) => panic!("test configuration: {e:?}"),
    }
}

/// Fills the view: 6 admitted locally, the seventh asks and hears that
/// 10 of 10 are counted.
fn fill_the_view(c: &Compiled, h: &MemHost) {
    for _ in 0..6 {
        assert_eq!(request(c, h, "acme").1, Next::Continue);
    }
    let (mut s, next) = request(c, h, "acme");
    assert_eq!(next, Next::Pause);
    let body = answer(
        Code::Ok,
        vec![status(Code::Ok, 10, RateLimitUnit::Minute, 0, 40)],
    );
    h.set_grpc_response(Some(body.clone()));
    s.on_rls_answer(c, h, 0, body.len());
}

#[test]
fn a_local_sync_refusal_is_the_source_sync_and_shadow_lets_it_through() {
    let c = config_with("");
    let h = MemHost::new();
    h.create_slots(c.config.local.slots);
    h.set_now_ms(NOW);
    fill_the_view(&c, &h);
    assert_eq!(request(&c, &h, "acme").1, Next::Pause);
    assert_eq!(h.replies()[0].status, 429);
    assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 1);
    assert_eq!(
        GroupCounter::SyncRefused.stat_name("default"),
        "tenant_ratelimit.group.default.refused.sync"
    );
    // In shadow: let through, counted as a would-be refusal of source sync.
    let c = config_with(r#", "shadow": true"#);
    let h = MemHost::new();
    h.create_slots(c.config.local.slots);
    h.set_now_ms(NOW);
    fill_the_view(&c, &h);
    assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    assert!(h.replies().is_empty());
    assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 0);
    assert_eq!(h.group_counter(0, GroupCounter::ShadowRefusedSync), 1);
}

#[test]
fn a_request_that_costs_more_than_one_asks_the_service_with_its_cost() {
    let c = config_with(r#", "cost_header": "x-cost""#);
    let h = MemHost::new();
    h.create_slots(c.config.local.slots);
    h.set_now_ms(NOW);
    h.set_request_header("x-cost", b"3");
    let (_, next) = request(&c, &h, "acme");
    assert_eq!(next, Next::Pause);
    let asked = RateLimitRequest::decode(&h.calls()[0].message[..]).unwrap();
    assert_eq!(asked.hits_addend, 3);
    // Nothing was admitted locally for it.
    assert_eq!(h.group_counter(0, GroupCounter::SyncLocal), 0);
    // A request of cost 1 is admitted locally again.
    h.set_request_header("x-cost", b"1");
    assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    assert_eq!(h.group_counter(0, GroupCounter::SyncLocal), 1);
}
