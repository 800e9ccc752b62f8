//! The root's policy against the in-memory host and its clock: the tick
//! period, the mailbox drained, the bounds, failed refills and pushes, the
//! push schedule, idle tenants forgotten, the shared data at configure.

use prost::Message;

use super::*;
use crate::counters::GroupCounter;
use crate::flow::{Next, Stream};
use crate::host::HostCall;
use crate::lease::Lease;
use crate::local::{ModeState, Slot, SlotRef};
use crate::proto::{Code, RateLimitRequest, RateLimitUnit};
use crate::testing::{answer, compiled, slot_of, status, MemHost, Worker};
use crate::vm::MAX_QUEUED_CALLS;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// 2023-11-14T22:13:20.250Z: 20.25 s into its minute.
const NOW: u64 = 1_700_000_000_250;

fn config(local: &str) -> Compiled {
    let text = format!(
        r#"{{"domain": "d", "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 25}},
            "limits": {{"x-tenant-id": {{
                "default": {{"perminute": 10}},
                "gold": {{"perminute": 1000, "header_value": ["tenant-b"]}}}}}},
            "local": {local}}}"#
    );
    compiled(&text)
}

const SYNC: &str = r#"{"mode": "sync", "sync": {"interval_ms": 50, "max_unsynced": 6}}"#;
const LEASE: &str = r#"{"groups": {"gold": {"mode": "lease"}}, "lease": {"max_batch": 20}}"#;

fn worker(c: &Compiled) -> Worker {
    Worker::ready(c, NOW)
}

fn request(c: &Compiled, h: &Worker, tenant: &str) -> (Stream, Next) {
    h.request(c, tenant)
}

fn at(c: &Compiled, h: &Worker, group: &str, tenant: &str) -> SlotRef {
    slot_of(c, &h.slot_secret(), group, tenant)
}

fn slot(c: &Compiled, h: &Worker, group: &str, tenant: &str) -> Slot {
    let bytes = h.shared_value(&SlotKey::new(at(c, h, group, tenant).index));
    Slot::decode(&bytes.unwrap_or_default()).unwrap()
}

fn unsynced(c: &Compiled, h: &Worker, tenant: &str) -> (u32, u32) {
    match slot(c, h, "default", tenant).mode {
        ModeState::Sync(s) => (s.unsynced, s.in_flight),
        other => panic!("not a sync block: {other:?}"),
    }
}

fn lease(c: &Compiled, h: &Worker, tenant: &str) -> Lease {
    match slot(c, h, "gold", tenant).mode {
        ModeState::Lease(l) => l,
        other => panic!("not a lease: {other:?}"),
    }
}

fn hits(call: &crate::testing::Call) -> u32 {
    RateLimitRequest::decode(&call.message[..])
        .unwrap()
        .hits_addend
}

/// The service answers the root's call `token`.
fn answer_root(c: &Compiled, h: &Worker, root: &mut Root, token: u32, body: Vec<u8>) {
    let size = body.len();
    h.set_grpc_response(Some(body));
    root.on_answer(c, h, &h.vm, token, 0, size);
}

fn minute(remaining: u32) -> Vec<u8> {
    answer(
        Code::Ok,
        vec![status(Code::Ok, 10, RateLimitUnit::Minute, remaining, 40)],
    )
}

#[test]
fn the_tick_is_as_fast_as_the_fastest_need_and_none_without_one() {
    assert_eq!(tick_ms(&config("{}")), None);
    assert_eq!(sync_interval_ms(&config("{}")), None);
    assert_eq!(tick_ms(&config(LEASE)), Some(u64::from(LEASE_TICK_MS)));
    assert_eq!(tick_ms(&config(SYNC)), Some(50));
    assert_eq!(sync_interval_ms(&config(SYNC)), Some(50));
    let both = r#"{"mode": "sync", "sync": {"interval_ms": 1000},
                  "groups": {"gold": {"mode": "lease"}}}"#;
    assert_eq!(tick_ms(&config(both)), Some(u64::from(LEASE_TICK_MS)));
    let fast = r#"{"mode": "sync", "sync": {"interval_ms": 10},
                  "groups": {"gold": {"mode": "lease"}}}"#;
    assert_eq!(tick_ms(&config(fast)), Some(10));
    // The local layer off: no mode needs a tick.
    assert_eq!(tick_ms(&config(r#"{"enabled": false}"#)), None);
}

/// A stream's call answered by the service: the gold group's minute.
fn respond_gold(c: &Compiled, h: &Worker, s: &mut Stream, remaining: u32) {
    let body = answer(
        Code::Ok,
        vec![status(Code::Ok, 1000, RateLimitUnit::Minute, remaining, 40)],
    );
    let size = body.len();
    h.set_grpc_response(Some(body));
    s.on_rls_answer(c, h, &h.vm, 0, size);
}

#[test]
fn a_tick_sends_the_queued_refills_and_their_answers_fill_the_leases() {
    let c = config(LEASE);
    let h = worker(&c);
    let mut root = Root::default();
    // No lease: the first request asks for 1 hit, the second (the rate is
    // now 2 a second) for 2, and keeps 1 token.
    let (mut s, next) = request(&c, &h, "tenant-b");
    assert_eq!(next, Next::Pause);
    respond_gold(&c, &h, &mut s, 900);
    let (mut s, next) = request(&c, &h, "tenant-b");
    assert_eq!(next, Next::Pause);
    respond_gold(&c, &h, &mut s, 898);
    assert_eq!(lease(&c, &h, "tenant-b").tokens, 1);
    // The third spends it and, at half a batch left, queues a refill of
    // 3 (the rate): nothing goes out until the tick.
    let calls = h.call_count();
    assert_eq!(request(&c, &h, "tenant-b").1, Next::Continue);
    assert_eq!((h.call_count(), root.in_flight()), (calls, 0));
    root.on_tick(&c, &h, &h.vm);
    assert_eq!((h.call_count(), root.in_flight()), (calls + 1, 1));
    let refill = h.calls().last().cloned().unwrap();
    assert_eq!(hits(&refill), 3);
    // The mailbox is empty: the next tick sends nothing.
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), calls + 1);
    let body = answer(
        Code::Ok,
        vec![status(Code::Ok, 1000, RateLimitUnit::Minute, 800, 40)],
    );
    answer_root(&c, &h, &mut root, refill.token, body);
    assert_eq!(root.in_flight(), 0);
    assert_eq!(lease(&c, &h, "tenant-b").tokens, 3);
    assert_eq!(h.group_counter(1, GroupCounter::LeaseTokens), 1 + 2 + 3);
    // An answer under a token the root did not send changes nothing.
    let snapshot = h.shared_snapshot();
    answer_root(&c, &h, &mut root, 999, minute(0));
    assert_eq!(h.shared_snapshot(), snapshot);
}

fn queued_refill(h: &Worker, tenant: String) -> bool {
    h.vm.mailbox.queue(TenantCall {
        kind: CallKind::Refill,
        group: 1,
        tenant,
        at: SlotRef {
            index: 0,
            fingerprint: 1,
        },
        hits: 5,
        route: None,
    })
}

#[test]
fn the_mailbox_holds_max_queued_calls_and_a_tick_sends_each_once() {
    let c = config(LEASE);
    let h = Worker::with(MemHost::counting());
    h.create_slots(c.config.local.slots);
    let mut root = Root::default();
    let queued = (0..MAX_QUEUED_CALLS + 10)
        .filter(|i| queued_refill(&h, format!("t{i}")))
        .count();
    assert_eq!(queued, MAX_QUEUED_CALLS);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), MAX_QUEUED_CALLS as u64);
    assert_eq!(root.in_flight(), MAX_QUEUED_CALLS);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), MAX_QUEUED_CALLS as u64);
    // Room again.
    assert!(queued_refill(&h, "again".into()));
}

#[test]
fn a_refill_that_cannot_be_sent_or_fails_is_counted_and_the_tenant_may_ask_again() {
    let c = config(LEASE);
    let h = worker(&c);
    let mut root = Root::default();
    let b = at(&c, &h, "gold", "tenant-b");
    let refill = |h: &Worker| {
        h.vm.mailbox.queue(TenantCall {
            kind: CallKind::Refill,
            group: 1,
            tenant: "tenant-b".into(),
            at: b,
            hits: 7,
            route: None,
        })
    };
    // Dispatch fails: the refill's outcome is a failure, at once.
    h.fail(HostCall::Dispatch);
    refill(&h);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!((root.in_flight(), h.call_count()), (0, 0));
    assert_eq!(h.group_counter(1, GroupCounter::LeasesFailed), 1);
    // The slot says no refill is under way: the next request may ask.
    assert_eq!(lease(&c, &h, "tenant-b").refill_at_ms, 0);
    // Sent, and answered with an error (a timeout is 14).
    h.heal(HostCall::Dispatch);
    refill(&h);
    root.on_tick(&c, &h, &h.vm);
    let token = h.calls()[0].token;
    root.on_answer(&c, &h, &h.vm, token, 14, 0);
    assert_eq!(h.group_counter(1, GroupCounter::LeasesFailed), 2);
    assert_eq!(lease(&c, &h, "tenant-b").tokens, 0);
    // An answer that cannot be read is a failure too.
    refill(&h);
    root.on_tick(&c, &h, &h.vm);
    h.fail(HostCall::GrpcResponse);
    root.on_answer(&c, &h, &h.vm, h.calls()[1].token, 0, 10);
    assert_eq!(h.group_counter(1, GroupCounter::LeasesFailed), 3);
    assert_eq!(h.group_counter(1, GroupCounter::LeasesTaken), 0);
}

/// 6 hits of `tenant` admitted locally (`SYNC`'s max_unsynced).
fn six_local_hits(c: &Compiled, h: &Worker, tenant: &str) {
    for _ in 0..6 {
        assert_eq!(request(c, h, tenant).1, Next::Continue);
    }
}

#[test]
fn pushes_go_out_once_per_interval_one_call_per_tenant() {
    let c = config(SYNC);
    let h = worker(&c);
    let mut root = Root::default();
    six_local_hits(&c, &h, "acme");
    for _ in 0..2 {
        assert_eq!(request(&c, &h, "other").1, Next::Continue);
    }
    root.on_tick(&c, &h, &h.vm);
    let mut pushed: Vec<u32> = h.calls().iter().map(hits).collect();
    pushed.sort_unstable();
    assert_eq!(pushed, [2, 6]);
    assert_eq!(unsynced(&c, &h, "acme"), (0, 6));
    // The answer lands in the slot: the fleet counted 6 of 10.
    let calls = h.calls();
    let acme = calls.iter().find(|call| hits(call) == 6).unwrap();
    answer_root(&c, &h, &mut root, acme.token, minute(4));
    assert_eq!(unsynced(&c, &h, "acme"), (0, 0));
    assert_eq!(h.group_counter(0, GroupCounter::Syncs), 1);
    assert_eq!(h.group_counter(0, GroupCounter::SyncHits), 6);
    // More hits, but the next push is due only an interval later.
    assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    h.set_now_ms(NOW + 49);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), 2);
    h.set_now_ms(NOW + 50);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), 3);
    assert_eq!(hits(&h.calls()[2]), 1);
}

#[test]
fn a_push_that_cannot_be_sent_or_fails_puts_its_hits_back() {
    let c = config(SYNC);
    let h = worker(&c);
    let mut root = Root::default();
    six_local_hits(&c, &h, "acme");
    h.fail(HostCall::Dispatch);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(root.in_flight(), 0);
    assert_eq!(unsynced(&c, &h, "acme"), (6, 0));
    assert_eq!(h.group_counter(0, GroupCounter::SyncFailed), 1);
    h.heal(HostCall::Dispatch);
    h.set_now_ms(NOW + 50);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(unsynced(&c, &h, "acme"), (0, 6));
    root.on_answer(&c, &h, &h.vm, h.calls()[0].token, 14, 0);
    assert_eq!(unsynced(&c, &h, "acme"), (6, 0));
    assert_eq!(h.group_counter(0, GroupCounter::SyncFailed), 2);
    assert_eq!(h.group_counter(0, GroupCounter::Syncs), 0);
}

#[test]
fn a_tenant_with_nothing_pending_is_forgotten_until_its_next_request() {
    let c = config(SYNC);
    let h = worker(&c);
    let mut root = Root::default();
    six_local_hits(&c, &h, "acme");
    assert_eq!(h.vm.mailbox.tracked().len(), 1);
    root.on_tick(&c, &h, &h.vm);
    // A push under way: still tracked.
    assert_eq!(h.vm.mailbox.tracked().len(), 1);
    answer_root(&c, &h, &mut root, h.calls()[0].token, minute(4));
    // The next push finds nothing pending: forgotten, no call.
    h.set_now_ms(NOW + 50);
    root.on_tick(&c, &h, &h.vm);
    assert!(h.vm.mailbox.tracked().is_empty());
    assert_eq!(h.call_count(), 1);
    // Its next request tracks it again.
    assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    assert_eq!(h.vm.mailbox.tracked().len(), 1);
    // A tenant whose slot went to another tenant is forgotten too.
    let other = Worker::new();
    other.create_slots(c.config.local.slots);
    assert!(other
        .vm
        .mailbox
        .track(0, "ghost", at(&c, &h, "default", "ghost")));
    Root::default().on_tick(&c, &other, &other.vm);
    assert!(other.vm.mailbox.tracked().is_empty());
}

#[test]
fn the_shared_data_is_created_once_and_the_secret_agreed() {
    let h = MemHost::new();
    let created = create_shared(&h, 8);
    assert_eq!(created, Created::default());
    let keys = h.shared_snapshot().len();
    assert_eq!(keys, 8 + usize::from(NAME_ENTRIES));
    // A slot in use is left alone by the next VM.
    h.set_shared(SlotKey::new(3).as_str(), b"in use", None)
        .unwrap();
    assert_eq!(create_shared(&h, 8), Created::default());
    assert_eq!(
        h.shared_value(&SlotKey::new(3)).as_deref(),
        Some(&b"in use"[..])
    );
    // What cannot be read is not written, and counted.
    let broken = MemHost::new();
    broken.fail(HostCall::GetShared);
    assert_eq!(
        create_shared(&broken, 8),
        Created {
            failed_slots: 8,
            failed_names: u32::from(NAME_ENTRIES),
        }
    );
    assert!(broken.shared_snapshot().is_empty());
    // Every VM agrees the first one's secret.
    let first = prepare_local(&h, 8, || SlotSecret::from_bytes([1; 16]));
    let second = prepare_local(&h, 8, || SlotSecret::from_bytes([2; 16]));
    assert_eq!((first, second), (SlotSecret::from_bytes([1; 16]), first));
}
