//! The root's policy against the in-memory host and its clock: the tick
//! period, the mailbox drained, the bounds, failed refills and pushes, the
//! push schedule, idle tenants forgotten, the shared data at configure.

use prost::Message;

use super::*;
use crate::batch::{CallKind, TenantCall};
use crate::counters::GroupCounter;
use crate::flow::{Next, Stream};
use crate::group::GroupId;
use crate::host::HostCall;
use crate::local::state::Lease;
use crate::local::{ModeState, Slot, SlotRef};
use crate::proto::{Code, RateLimitRequest, RateLimitUnit};
use crate::testing::{answer, compiled, compiled_json, host, slot_of, status, MemHost, Worker};
use crate::vm::MAX_QUEUED_CALLS;
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use crate::testing::NOW;

fn config(local: Value) -> Compiled {
    let base = json!({"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
        "limits": {"x-tenant-id": {
            "default": {"perminute": 12},
            "gold": {"perminute": 1000, "header_value": ["tenant-b"]}}},
        "local": local});
    compiled_json(base, json!({}))
}

fn sync_local() -> Value {
    json!({"mode": "sync", "sync": {"interval_ms": 50, "max_unsynced": 6}})
}

fn lease_local() -> Value {
    json!({"groups": {"gold": {"mode": "lease"}}, "lease": {"max_batch": 20}})
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

/// Each descriptor's hits in a call, with its tenant.
fn descriptor_hits(call: &crate::testing::Call) -> Vec<(String, u64)> {
    let r = RateLimitRequest::decode(&call.message[..]).unwrap();
    r.descriptors
        .iter()
        .map(|d| {
            let own = d.hits_addend.map(|h| h.value);
            let hits = own.unwrap_or(u64::from(r.hits_addend.max(1)));
            (d.entries[1].value.clone(), hits)
        })
        .collect()
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
        vec![status(Code::Ok, 12, RateLimitUnit::Minute, remaining, 40)],
    )
}

#[test]
fn the_tick_is_as_fast_as_the_fastest_need_and_none_without_one() {
    assert_eq!(tick_ms(&config(json!({}))), None);
    assert_eq!(sync_interval_ms(&config(json!({}))), None);
    assert_eq!(
        tick_ms(&config(lease_local())),
        Some(u64::from(LEASE_TICK_MS))
    );
    assert_eq!(tick_ms(&config(sync_local())), Some(50));
    assert_eq!(sync_interval_ms(&config(sync_local())), Some(50));
    let both = json!({"mode": "sync", "sync": {"interval_ms": 1000},
                  "groups": {"gold": {"mode": "lease"}}});
    assert_eq!(tick_ms(&config(both)), Some(u64::from(LEASE_TICK_MS)));
    let fast = json!({"mode": "sync", "sync": {"interval_ms": 10},
                  "groups": {"gold": {"mode": "lease"}}});
    assert_eq!(tick_ms(&config(fast)), Some(10));
    // The local layer off: no mode needs a tick.
    assert_eq!(tick_ms(&config(json!({"enabled": false}))), None);
}

/// A stream's call answered by the service: the gold group's minute.
fn respond_gold(c: &Compiled, h: &Worker, s: &mut Stream, remaining: u32) {
    let body = answer(
        Code::Ok,
        vec![status(Code::Ok, 1000, RateLimitUnit::Minute, remaining, 40)],
    );
    let size = body.len();
    h.set_grpc_response(Some(body));
    h.answer(c, s, 0, size);
}

#[test]
fn a_tick_sends_the_queued_refills_and_their_answers_fill_the_leases() {
    let c = config(lease_local());
    let h = host(&c);
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
    assert_eq!((h.call_count(), h.vm.batch.in_flight()), (calls, 0));
    root.on_tick(&c, &h, &h.vm);
    assert_eq!((h.call_count(), h.vm.batch.in_flight()), (calls + 1, 1));
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
    assert_eq!(h.vm.batch.in_flight(), 0);
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
        group: GroupId::new(1),
        tenant,
        slot: SlotRef {
            index: 0,
            fingerprint: 1,
        },
        hits: 5,
        route: None,
    })
}

#[test]
fn the_mailbox_holds_max_queued_calls_and_a_tick_sends_each_once_in_full_calls() {
    let c = config(lease_local());
    let h = Worker::with(MemHost::counting());
    h.create_slots(c.config.local.slots);
    let mut root = Root::default();
    let queued = (0..MAX_QUEUED_CALLS + 10)
        .filter(|i| queued_refill(&h, format!("t{i}")))
        .count();
    assert_eq!(queued, MAX_QUEUED_CALLS);
    root.on_tick(&c, &h, &h.vm);
    // 4,096 refills of one descriptor each, in calls of at most
    // max_descriptors (100): 41 calls, every descriptor once.
    let calls = MAX_QUEUED_CALLS.div_ceil(100);
    assert_eq!(h.call_count(), calls as u64);
    assert_eq!(h.vm.batch.in_flight(), calls);
    assert_eq!(
        h.counter(crate::counters::Counter::RlsDescriptors),
        MAX_QUEUED_CALLS as u64
    );
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), calls as u64);
    // Room again.
    assert!(queued_refill(&h, "again".into()));
}

#[test]
fn a_refill_that_cannot_be_sent_or_fails_is_counted_and_the_tenant_may_ask_again() {
    let c = config(lease_local());
    let h = host(&c);
    let mut root = Root::default();
    let b = at(&c, &h, "gold", "tenant-b");
    let refill = |h: &Worker| {
        h.vm.mailbox.queue(TenantCall {
            kind: CallKind::Refill,
            group: GroupId::new(1),
            tenant: "tenant-b".into(),
            slot: b,
            hits: 7,
            route: None,
        })
    };
    // Dispatch fails: the refill's outcome is a failure, at once.
    h.fail(HostCall::Dispatch);
    refill(&h);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!((h.vm.batch.in_flight(), h.call_count()), (0, 0));
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

/// 6 hits of `tenant` admitted locally (`sync_local()`'s max_unsynced).
fn six_local_hits(c: &Compiled, h: &Worker, tenant: &str) {
    for _ in 0..6 {
        assert_eq!(request(c, h, tenant).1, Next::Continue);
    }
}

#[test]
fn pushes_go_out_once_per_interval_in_one_call_split_back_per_tenant() {
    let c = config(sync_local());
    let h = host(&c);
    let mut root = Root::default();
    six_local_hits(&c, &h, "acme");
    for _ in 0..2 {
        assert_eq!(request(&c, &h, "other").1, Next::Continue);
    }
    root.on_tick(&c, &h, &h.vm);
    // Both tenants' pushes in one call, each descriptor with its hits.
    assert_eq!(h.call_count(), 1);
    let call = h.calls()[0].clone();
    let mut pushed = descriptor_hits(&call);
    pushed.sort();
    assert_eq!(pushed, [("acme".into(), 6), ("other".into(), 2)]);
    assert_eq!(unsynced(&c, &h, "acme"), (0, 6));
    // The answer is split back: the fleet counted 8 of 12 for acme, 2 for
    // the other, in the order the call sent them.
    let statuses = descriptor_hits(&call)
        .iter()
        .map(|(t, _)| {
            let remaining = if t == "acme" { 4 } else { 10 };
            status(Code::Ok, 12, RateLimitUnit::Minute, remaining, 40)
        })
        .collect();
    answer_root(&c, &h, &mut root, call.token, answer(Code::Ok, statuses));
    assert_eq!(unsynced(&c, &h, "acme"), (0, 0));
    assert_eq!(unsynced(&c, &h, "other"), (0, 0));
    match slot(&c, &h, "default", "acme").mode {
        ModeState::Sync(s) => assert_eq!(s.views[0], 8),
        other => panic!("not a sync block: {other:?}"),
    }
    match slot(&c, &h, "default", "other").mode {
        ModeState::Sync(s) => assert_eq!(s.views[0], 2),
        other => panic!("not a sync block: {other:?}"),
    }
    assert_eq!(h.group_counter(0, GroupCounter::Syncs), 2);
    assert_eq!(h.group_counter(0, GroupCounter::SyncHits), 8);
    // More hits, but the next push is due only an interval later.
    assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    h.set_now_ms(NOW + 49);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), 1);
    h.set_now_ms(NOW + 50);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), 2);
    assert_eq!(hits(&h.calls()[1]), 0);
}

#[test]
fn a_push_that_cannot_be_sent_or_fails_puts_its_hits_back() {
    let c = config(sync_local());
    let h = host(&c);
    let mut root = Root::default();
    six_local_hits(&c, &h, "acme");
    h.fail(HostCall::Dispatch);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.vm.batch.in_flight(), 0);
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
    let c = config(sync_local());
    let h = host(&c);
    let mut root = Root::default();
    six_local_hits(&c, &h, "acme");
    assert_eq!(h.vm.mailbox.tracked().len(), 1);
    root.on_tick(&c, &h, &h.vm);
    // A push under way: still tracked.
    assert_eq!(h.vm.mailbox.tracked().len(), 1);
    answer_root(&c, &h, &mut root, h.calls()[0].token, minute(4));
    // Its push answered with nothing pending: forgotten then, and the next
    // pass neither reads its slot nor calls.
    assert!(h.vm.mailbox.tracked().is_empty());
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
        .track(GroupId::new(0), "ghost", at(&c, &h, "default", "ghost")));
    Root::default().on_tick(&c, &other, &other.vm);
    assert!(other.vm.mailbox.tracked().is_empty());
}

#[test]
fn after_a_window_ends_the_root_refills_its_tenants_leases_in_one_call() {
    // Every tenant leases, 1,000 a minute (batches of at most 50).
    let c = compiled(
        r#"{"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25,
                                                   "batch": {"max_in_flight": 2}},
            "limits": {"x-tenant-id": {"default": {"perminute": 1000}}},
            "local": {"mode": "lease"}}"#,
    );
    let window_end = window::end(60_000, NOW);
    let h = host(&c);
    h.set_now_ms(window_end - 500);
    let mut root = Root::default();
    let lease_of = |tenant: &str| match slot(&c, &h, "default", tenant).mode {
        ModeState::Lease(l) => l,
        other => panic!("not a lease: {other:?}"),
    };
    for (tenant, n) in [("acme", 1), ("other", 2)] {
        for i in 0..n {
            let (mut s, next) = request(&c, &h, tenant);
            if next == Next::Pause {
                let body = answer(
                    Code::Ok,
                    vec![status(Code::Ok, 1000, RateLimitUnit::Minute, 900, 40)],
                );
                let size = body.len();
                h.set_grpc_response(Some(body));
                h.answer(&c, &mut s, 0, size);
            } else {
                assert!(i > 0, "{tenant}: a first request without a lease");
            }
        }
    }
    assert_eq!(h.vm.mailbox.tracked().len(), 2);
    // Within the window, the leases hold: the pass sends nothing.
    let calls = h.call_count();
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), calls);
    // The first tick of the next window: both tenants' leases in one call,
    // each as large as its rate.
    h.set_now_ms(window_end + 5);
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), calls + 1);
    let call = h.calls().last().cloned().unwrap();
    let mut asked = descriptor_hits(&call);
    asked.sort();
    assert_eq!(asked, [("acme".into(), 1), ("other".into(), 2)]);
    let stranded = h.group_counter(0, GroupCounter::LeaseStranded);
    // A request while the refill is under way asks for its own hit only.
    let (mut s, next) = request(&c, &h, "acme");
    assert_eq!(next, Next::Pause);
    assert_eq!(hits(h.calls().last().unwrap()), 0);
    respond(&c, &h, &mut s, 1000, 897);
    let statuses = descriptor_hits(&call)
        .iter()
        .map(|_| status(Code::Ok, 1000, RateLimitUnit::Minute, 895, 60))
        .collect();
    answer_root(&c, &h, &mut root, call.token, answer(Code::Ok, statuses));
    assert_eq!((lease_of("acme").tokens, lease_of("other").tokens), (1, 2));
    // The next requests spend the tokens, with no call.
    let calls = h.call_count();
    assert_eq!(request(&c, &h, "other").1, Next::Continue);
    assert_eq!(request(&c, &h, "acme").1, Next::Continue);
    assert_eq!(h.call_count(), calls);
    assert_eq!(h.group_counter(0, GroupCounter::LeaseStranded), stranded);
    // The next tick sends what the spending requests queued (their leases
    // ran low), but no other pass is due before the window ends.
    root.on_tick(&c, &h, &h.vm);
    assert_eq!(h.call_count(), calls + 1);
    let queued = descriptor_hits(h.calls().last().unwrap()).len();
    assert!(queued >= 1, "{queued}");
    let calls = h.call_count();
    // A window later, with no request since: no refill, both forgotten,
    // without reading their slots (this worker served neither in this
    // second or the one before).
    h.set_now_ms(window_end + 60_000 + 5);
    h.fail(HostCall::GetShared);
    root.on_tick(&c, &h, &h.vm);
    h.heal(HostCall::GetShared);
    assert_eq!(h.call_count(), calls);
    assert!(h.vm.mailbox.tracked().is_empty());
}

/// A stream's call answered: one minute status of `limit`.
fn respond(c: &Compiled, h: &Worker, s: &mut Stream, limit: u32, remaining: u32) {
    let body = answer(
        Code::Ok,
        vec![status(
            Code::Ok,
            limit,
            RateLimitUnit::Minute,
            remaining,
            40,
        )],
    );
    let size = body.len();
    h.set_grpc_response(Some(body));
    h.answer(c, s, 0, size);
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
