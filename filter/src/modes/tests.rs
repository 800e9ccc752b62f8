//! The local layer's step in every mode, against the in-memory host and
//! its clock: lease mode, sync mode, and a group's mode changing under
//! traffic (a new configuration over the same slots).

use prost::Message;
use ratelimit_config::parse_plugin_config;

use super::*;
use crate::answer::decode;
use crate::flow::{Next, Stream};
use crate::lease::Lease;
use crate::local::{slot_for, SlotKey};
use crate::proto::{Code, DescriptorStatus, RateLimitRequest, RateLimitUnit};
use crate::testing::{answer, status, Worker};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// 2023-11-14T22:13:20.250Z: 20.25 s into its minute.
const NOW: u64 = 1_700_000_000_250;

mod lease_mode {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const HEADER: &str = "x-tenant-id";

    fn config(local: &str) -> Compiled {
        let text = format!(
            r#"{{"domain": "d", "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 25}},
                "limits": {{"x-tenant-id": {{
                    "default": {{"perminute": 1000, "perhour": 5000}},
                    "gold": {{"perminute": 70, "header_value": ["tenant-b"]}}}}}},
                "local": {local}}}"#
        );
        match parse_plugin_config(text.as_bytes()) {
            Ok((config, _)) => Compiled::new(config),
            Err(e) => panic!("test configuration: {e:?}"),
        }
    }

    fn host(c: &Compiled) -> Worker {
        let h = Worker::new();
        h.create_slots(c.config.local.slots);
        h.set_now_ms(NOW);
        h
    }

    fn request(c: &Compiled, h: &Worker, tenant: &str) -> (Stream, Next) {
        h.set_request_header(HEADER, tenant.as_bytes());
        let mut s = Stream::default();
        let next = s.on_request_headers(c, h, &h.vm);
        (s, next)
    }

    fn ok(remaining: u32) -> Vec<DescriptorStatus> {
        vec![
            status(Code::Ok, 1000, RateLimitUnit::Minute, remaining, 40),
            status(Code::Ok, 5000, RateLimitUnit::Hour, 4000, 2_000),
        ]
    }

    fn respond(
        c: &Compiled,
        h: &Worker,
        s: &mut Stream,
        code: Code,
        statuses: Vec<DescriptorStatus>,
    ) {
        let body = answer(code, statuses);
        let size = body.len();
        h.set_grpc_response(Some(body));
        s.on_rls_answer(c, h, 0, size);
    }

    fn last_hits(h: &Worker) -> Vec<Option<u64>> {
        let calls = h.calls();
        let r = RateLimitRequest::decode(&calls.last().unwrap().message[..]).unwrap();
        let hits = u64::from(r.hits_addend);
        r.descriptors.iter().map(|_| Some(hits)).collect()
    }

    /// The root's answer to a refill (`Root` sends it; here, its outcome).
    fn refill_answered(
        c: &Compiled,
        h: &Worker,
        r: &TenantCall,
        asked_at: u64,
        grpc_status: u32,
        body: Option<&[u8]>,
    ) {
        let outcome = Outcome::of(decode(grpc_status, body).ok().as_ref());
        store_outcome(c, h, r.group, r.at, asked_at, r.hits, r.hits, outcome);
    }

    fn lease_of(c: &Compiled, h: &Worker, tenant: &str) -> Lease {
        let at = slot_for(&h.slot_secret(), "default", tenant, c.config.local.slots);
        let bytes = h.shared_value(&SlotKey::new(at.index)).unwrap();
        match Slot::decode(&bytes).unwrap().mode {
            ModeState::Lease(l) => l,
            other => panic!("not a lease: {other:?}"),
        }
    }

    #[test]
    fn a_lease_admits_without_calls_and_the_root_refills_it_ahead_of_time() {
        let c = config(r#"{"mode": "lease", "lease": {"max_batch": 20}}"#);
        let h = host(&c);
        // The first second: 30 requests, each asking for one hit (the first
        // one's answer has not come).
        let mut waiting = Vec::new();
        for _ in 0..30 {
            let (s, next) = request(&c, &h, "acme");
            assert_eq!(next, Next::Pause);
            waiting.push(s);
        }
        assert_eq!(h.call_count(), 30);
        assert_eq!(last_hits(&h), vec![Some(1), Some(1)]);
        for mut s in waiting {
            respond(&c, &h, &mut s, Code::Ok, ok(900));
        }
        assert_eq!(h.resumed(), 30);
        // A second later the rate is known: a batch of max_batch (20) for the
        // next request, which keeps one hit; 19 tokens for the others.
        h.set_now_ms(NOW + 1_000);
        let (mut s, _) = request(&c, &h, "acme");
        assert_eq!(last_hits(&h), vec![Some(20), Some(20)]);
        respond(&c, &h, &mut s, Code::Ok, ok(870));
        assert_eq!(lease_of(&c, &h, "acme").tokens, 19);
        let calls = h.call_count();
        let mut refills = Vec::new();
        for i in 0..19 {
            h.set_now_ms(NOW + 1_001 + i);
            let (_, next) = request(&c, &h, "acme");
            assert_eq!(next, Next::Continue);
            refills.extend(h.vm.mailbox.take_queued());
        }
        assert_eq!(h.call_count(), calls, "no call while tokens are left");
        // One refill, when half a batch was left.
        assert_eq!(refills.len(), 1);
        let r = &refills[0];
        assert_eq!(
            (r.kind, r.group, r.tenant.as_str(), r.hits),
            (CallKind::Refill, 0, "acme", 20)
        );
        let message = r.message(&c).unwrap();
        let asked = RateLimitRequest::decode(&message[..]).unwrap();
        assert_eq!((asked.hits_addend, asked.descriptors.len()), (20, 2));
        // Its answer (at the root) adds the batch to what is left.
        let body = answer(Code::Ok, ok(850));
        refill_answered(&c, &h, r, NOW + 1_010, 0, Some(&body));
        assert_eq!(lease_of(&c, &h, "acme").tokens, 20);
        assert_eq!(h.group_counter(0, GroupCounter::LeasesTaken), 32);
        assert_eq!(h.group_counter(0, GroupCounter::LeaseTokens), 30 + 20 + 20);
        assert_eq!(h.group_counter(0, GroupCounter::LeaseSpent), 19);
        assert_eq!(h.group_counter(0, GroupCounter::Admitted), 30 + 1 + 19);
    }

    #[test]
    fn when_the_service_fails_the_lease_left_is_spent_then_failure_mode_decides() {
        let c = config(r#"{"mode": "lease", "lease": {"max_batch": 4}}"#);
        let h = host(&c);
        h.set_now_ms(NOW + 2_000);
        let (mut s, _) = request(&c, &h, "acme");
        respond(&c, &h, &mut s, Code::Ok, ok(900));
        // 1 token was asked (no rate yet) and spent by the asker: now a
        // request at the same second asks for 2.
        let (mut s, _) = request(&c, &h, "acme");
        assert_eq!(last_hits(&h), vec![Some(2), Some(2)]);
        respond(&c, &h, &mut s, Code::Ok, ok(890));
        assert_eq!(lease_of(&c, &h, "acme").tokens, 1);
        // The service goes down: the refill fails, counted; the token left is
        // still spent.
        let (_, next) = request(&c, &h, "acme");
        assert_eq!(next, Next::Continue);
        let refills = h.vm.mailbox.take_queued();
        assert_eq!(refills.len(), 1);
        refill_answered(&c, &h, &refills[0], NOW + 2_001, 14, None);
        assert_eq!(h.group_counter(0, GroupCounter::LeasesFailed), 1);
        // Then each request asks and fails open (failure_mode_deny is false).
        let (mut s, next) = request(&c, &h, "acme");
        assert_eq!(next, Next::Pause);
        s.on_rls_answer(&c, &h, 14, 0);
        assert_eq!(h.group_counter(0, GroupCounter::FailedOpen), 1);
        assert_eq!(h.group_counter(0, GroupCounter::LeasesFailed), 2);
        assert_eq!(h.resumed(), 3);
        assert_eq!(h.reply_count(), 0);
    }

    #[test]
    fn a_refused_batch_is_a_429_remembered_and_the_group_in_exact_mode_is_untouched() {
        let c = config(r#"{"groups": {"default": {"mode": "lease"}}}"#);
        let h = host(&c);
        let (mut s, _) = request(&c, &h, "acme");
        respond(
            &c,
            &h,
            &mut s,
            Code::OverLimit,
            vec![status(Code::OverLimit, 1000, RateLimitUnit::Minute, 0, 40)],
        );
        assert_eq!(h.replies()[0].status, 429);
        assert_eq!(h.group_counter(0, GroupCounter::LeasesRefused), 1);
        // Refused from the cache now, no call.
        let calls = h.call_count();
        let (_, next) = request(&c, &h, "acme");
        assert_eq!(next, Next::Pause);
        assert_eq!(h.call_count(), calls);
        // gold stays exact: one call per request, hits_addend left out.
        let (mut s, _) = request(&c, &h, "tenant-b");
        assert_eq!(last_hits(&h), vec![Some(0)]);
        respond(
            &c,
            &h,
            &mut s,
            Code::Ok,
            vec![status(Code::Ok, 70, RateLimitUnit::Minute, 60, 40)],
        );
        let (_, next) = request(&c, &h, "tenant-b");
        assert_eq!(next, Next::Pause);
        assert!(h.vm.mailbox.take_queued().is_empty());
        assert_eq!(h.group_counter(1, GroupCounter::LeasesTaken), 0);
    }
}

mod sync_mode {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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

    fn request(c: &Compiled, h: &Worker, tenant: &str) -> (Stream, Next) {
        h.set_request_header(HEADER, tenant.as_bytes());
        let mut s = Stream::default();
        let next = s.on_request_headers(c, h, &h.vm);
        (s, next)
    }

    #[test]
    fn requests_are_admitted_locally_and_the_root_pushes_their_hits() {
        let c = config();
        let h = Worker::new();
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
        let tracked = h.vm.mailbox.tracked();
        assert_eq!(tracked.len(), 1);
        let (push, idle) = next_push(&c, &h, &tracked[0], NOW);
        let push = push.unwrap();
        assert!(!idle);
        let asked = RateLimitRequest::decode(&push.message(&c).unwrap()[..]).unwrap();
        assert_eq!(asked.hits_addend, 6);
        // Another worker's root finds nothing to push.
        assert_eq!(next_push(&c, &h, &tracked[0], NOW).0, None);
        // The service counted 1 + 6: 3 remain, and the Envoy admits 3 more.
        let body = answer(
            Code::Ok,
            vec![status(Code::Ok, 10, RateLimitUnit::Minute, 3, 40)],
        );
        let heard = decode(0, Some(&body)).unwrap();
        store_heard(
            &c,
            &h,
            push.group,
            push.at,
            NOW,
            push.hits,
            true,
            Some(&heard),
        );
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
        assert!(
            matches!(slot.mode, ModeState::Sync(s) if s.unsynced == 3),
            "{slot:?}"
        );
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
    fn fill_the_view(c: &Compiled, h: &Worker) {
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
        let h = Worker::new();
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
        let h = Worker::new();
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
        let h = Worker::new();
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
}
