//! The local layer's step in every mode, against the in-memory host and
//! its clock: lease mode, sync mode, and a group's mode changing under
//! traffic (a new configuration over the same slots).

use prost::Message;

use super::*;
use crate::answer::decode;
use crate::answer_path::{store_lease_answer, store_sync_answer, Asked, LeaseBatch, SyncHits};
use crate::flow::{Next, Stream};
use crate::group::GroupId;
use crate::lease::BatchOutcome;
use crate::local::state::Lease;
use crate::local::SlotKey;
use crate::proto::{Code, DescriptorStatus, RateLimitRequest, RateLimitUnit};
use crate::root::{pass_tracked, DueWork, PassOutcome};
use crate::testing::{answer, compiled, compiled_json, host, slot_of, status, Worker};
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use crate::testing::NOW;

mod lease_mode {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(local: Value) -> Compiled {
        let base = json!({"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
            "limits": {"x-tenant-id": {
                "default": {"perminute": 1000, "perhour": 5000},
                "gold": {"perminute": 70, "header_value": ["tenant-b"]}}},
            "local": local});
        compiled_json(base, json!({}))
    }

    fn request(c: &Compiled, h: &Worker, tenant: &str) -> (Stream, Next) {
        h.request(c, tenant)
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
        h.answer(c, s, 0, size);
    }

    fn last_hits(h: &Worker) -> Vec<Option<u64>> {
        let calls = h.calls();
        let r = RateLimitRequest::decode(&calls.last().unwrap().message[..]).unwrap();
        // Left out (0), the service counts 1.
        let hits = u64::from(r.hits_addend.max(1));
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
        let outcome = BatchOutcome::of(decode(grpc_status, body).ok().as_ref());
        let asked = Asked {
            group: r.group,
            slot: r.slot,
            asked_at_ms: asked_at,
            now_ms: h.now_ms(),
        };
        let batch = LeaseBatch {
            asked: r.hits,
            tokens: r.hits,
        };
        store_lease_answer(c, h, asked, batch, outcome);
    }

    fn lease_of(c: &Compiled, h: &Worker, tenant: &str) -> Lease {
        let at = slot_of(c, &h.slot_secret(), "default", tenant);
        let bytes = h.shared_value(&SlotKey::new(at.index)).unwrap();
        match Slot::decode(&bytes).unwrap().mode {
            ModeState::Lease(l) => l,
            other => panic!("not a lease: {other:?}"),
        }
    }

    #[test]
    fn a_lease_admits_without_calls_and_the_root_refills_it_ahead_of_time() {
        let c = config(json!({"mode": "lease", "lease": {"max_batch": 20}}));
        let h = host(&c);
        // The first second: 30 requests, each asking for one hit (the first
        // one's answer has not come).
        let mut waiting = Vec::new();
        for _ in 0..30 {
            let (s, next) = request(&c, &h, "acme");
            assert_eq!(next, Next::Pause);
            waiting.push(s);
        }
        // One call at once (max_in_flight), the others queued for the next,
        // which goes when its answer comes back.
        assert_eq!((h.call_count(), h.vm.batch.queued()), (1, 29));
        assert_eq!(last_hits(&h), vec![Some(1), Some(1)]);
        assert_eq!(h.answer_all(&c, &mut waiting, Code::Ok, &|_| ok(900)), 2);
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
            (CallKind::Refill, GroupId::new(0), "acme", 20)
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
    fn a_request_admitted_from_a_lease_gets_headers_from_the_last_answer_less_what_was_spent() {
        let c = config(json!({"mode": "lease", "lease": {"max_batch": 20}}));
        let h = host(&c);
        // 30 requests in a second: the next one asks for a batch of 20.
        let mut waiting: Vec<Stream> = (0..30).map(|_| request(&c, &h, "acme").0).collect();
        h.answer_all(&c, &mut waiting, Code::Ok, &|_| ok(900));
        h.set_now_ms(NOW + 1_000);
        let (mut s, _) = request(&c, &h, "acme");
        respond(&c, &h, &mut s, Code::Ok, ok(870));
        let tokens = lease_of(&c, &h, "acme").tokens;
        assert_eq!(tokens, 19);
        // Two requests from the lease: the service's 870, plus the tokens
        // this Envoy holds, less the ones just spent.
        for spent in 1..=2 {
            let (mut s, next) = request(&c, &h, "acme");
            assert_eq!(next, Next::Continue);
            let before = h.added_headers().len();
            s.on_response_headers(&c, &h, &h.vm);
            let added: Vec<(String, String)> = h.added_headers().split_off(before);
            let remaining = (870 + tokens - spent).to_string();
            assert_eq!(
                added,
                [
                    (
                        "x-ratelimit-limit".into(),
                        "1000, 1000;w=60, 5000;w=3600".into()
                    ),
                    ("x-ratelimit-remaining".into(), remaining),
                    // 21.25 s into the minute: 39 s left, rounded up.
                    ("x-ratelimit-reset".into(), "39".into()),
                ]
            );
        }
    }

    #[test]
    fn when_the_service_fails_the_lease_left_is_spent_then_failure_mode_decides() {
        let c = config(json!({"mode": "lease", "lease": {"max_batch": 4}}));
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
        h.answer(&c, &mut s, 14, 0);
        assert_eq!(h.group_counter(0, GroupCounter::FailedOpen), 1);
        assert_eq!(h.group_counter(0, GroupCounter::LeasesFailed), 2);
        assert_eq!(h.resumed(), 3);
        assert_eq!(h.reply_count(), 0);
    }

    #[test]
    fn a_refused_batch_is_a_429_remembered_and_the_group_in_exact_mode_is_untouched() {
        let c = config(json!({"groups": {"default": {"mode": "lease"}}}));
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
        let asked = RateLimitRequest::decode(&h.calls().last().unwrap().message[..]).unwrap();
        assert_eq!(asked.hits_addend, 0);
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

    fn config() -> Compiled {
        let text = r#"{"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
            "limits": {"x-tenant-id": {"default": {"perminute": 12}}},
            "local": {"mode": "sync", "sync": {"interval_ms": 50, "max_unsynced": 6}}}"#;
        compiled(text)
    }

    fn request(c: &Compiled, h: &Worker, tenant: &str) -> (Stream, Next) {
        h.request(c, tenant)
    }

    #[test]
    fn requests_are_admitted_locally_and_the_root_pushes_their_hits() {
        let c = config();
        let h = Worker::ready(&c, NOW);
        for _ in 0..6 {
            assert_eq!(request(&c, &h, "acme").1, Next::Continue);
        }
        assert_eq!(h.call_count(), 0);
        // The seventh: 6 hits pending, max_unsynced: it asks the service.
        let (mut s, next) = request(&c, &h, "acme");
        assert_eq!(next, Next::Pause);
        let body = answer(
            Code::Ok,
            vec![status(Code::Ok, 12, RateLimitUnit::Minute, 9, 40)],
        );
        h.set_grpc_response(Some(body.clone()));
        h.answer(&c, &mut s, 0, body.len());
        // The root's tick: the tracked tenant's 6 hits go out in one call.
        let tracked = h.vm.mailbox.tracked();
        assert_eq!(tracked.len(), 1);
        let due = DueWork {
            push_sync: true,
            refill_leases: false,
        };
        let PassOutcome { call: push, idle } = pass_tracked(&c, &h, &tracked[0], NOW, due);
        let push = push.unwrap();
        assert!(!idle);
        let asked = RateLimitRequest::decode(&push.message(&c).unwrap()[..]).unwrap();
        assert_eq!(asked.hits_addend, 6);
        // Another worker's root finds nothing to push.
        assert_eq!(pass_tracked(&c, &h, &tracked[0], NOW, due).call, None);
        // The service counted 1 + 6: 5 remain, and the Envoy admits 5 more.
        let body = answer(
            Code::Ok,
            vec![status(Code::Ok, 12, RateLimitUnit::Minute, 5, 40)],
        );
        let heard = decode(0, Some(&body)).unwrap();
        let asked = Asked {
            group: push.group,
            slot: push.slot,
            asked_at_ms: NOW,
            now_ms: h.now_ms(),
        };
        store_sync_answer(&c, &h, asked, SyncHits::Pushed(push.hits), Some(&heard));
        // Admitted locally, with headers from the view: 12 - 7 - this hit.
        let (mut first, next) = request(&c, &h, "acme");
        assert_eq!(next, Next::Continue);
        let before = h.added_headers().len();
        first.on_response_headers(&c, &h, &h.vm);
        let added: Vec<(String, String)> = h.added_headers().split_off(before);
        assert!(
            added.contains(&("x-ratelimit-remaining".into(), "4".into())),
            "{added:?}"
        );
        let statuses: Vec<Next> = std::iter::once(next)
            .chain((0..6).map(|_| request(&c, &h, "acme").1))
            .collect();
        assert_eq!(
            statuses,
            [
                Next::Continue,
                Next::Continue,
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
        assert_eq!(h.group_counter(0, GroupCounter::SyncLocal), 11);
        assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 2);
        assert_eq!(h.group_counter(0, GroupCounter::Syncs), 1);
        assert_eq!(h.group_counter(0, GroupCounter::SyncHits), 6);
        let slot = Slot::decode(
            &h.shared_value(&SlotKey::new(
                slot_of(&c, &h.slot_secret(), "default", "acme").index,
            ))
            .unwrap(),
        )
        .unwrap();
        assert!(
            matches!(slot.mode, ModeState::Sync(s) if s.unsynced == 5),
            "{slot:?}"
        );
    }

    fn config_with(extra: Value) -> Compiled {
        let base = json!({"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
            "limits": {"x-tenant-id": {"default": {"perminute": 12}}},
            "local": {"mode": "sync", "sync": {"interval_ms": 50, "max_unsynced": 6}}});
        compiled_json(base, extra)
    }

    /// Fills the view: 6 admitted locally, the seventh asks and hears that
    /// 12 of 12 are counted.
    fn fill_the_view(c: &Compiled, h: &Worker) {
        for _ in 0..6 {
            assert_eq!(request(c, h, "acme").1, Next::Continue);
        }
        let (mut s, next) = request(c, h, "acme");
        assert_eq!(next, Next::Pause);
        let body = answer(
            Code::Ok,
            vec![status(Code::Ok, 12, RateLimitUnit::Minute, 0, 40)],
        );
        h.set_grpc_response(Some(body.clone()));
        h.answer(c, &mut s, 0, body.len());
    }

    #[test]
    fn a_local_sync_refusal_is_the_source_sync_and_shadow_lets_it_through() {
        let c = config_with(json!({}));
        let h = Worker::ready(&c, NOW);
        fill_the_view(&c, &h);
        assert_eq!(request(&c, &h, "acme").1, Next::Pause);
        assert_eq!(h.replies()[0].status, 429);
        assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 1);
        assert_eq!(
            GroupCounter::SyncRefused.stat_name("default"),
            "tenant_ratelimit.group.default.refused.sync"
        );
        // In shadow: let through, counted as a would-be refusal of source sync.
        let c = config_with(json!({"shadow": true}));
        let h = Worker::ready(&c, NOW);
        fill_the_view(&c, &h);
        assert_eq!(request(&c, &h, "acme").1, Next::Continue);
        assert!(h.replies().is_empty());
        assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 0);
        assert_eq!(h.group_counter(0, GroupCounter::ShadowRefusedSync), 1);
    }

    #[test]
    fn a_request_that_costs_more_than_one_asks_the_service_with_its_cost() {
        let c = config_with(json!({"cost_header": "x-cost"}));
        let h = Worker::ready(&c, NOW);
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

/// What every mode shares: the counters of a refusal, the rule names of a
/// cached one.
mod all_modes {
    use super::*;
    use crate::counters::Counter;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(limits: Value, local: Value) -> Compiled {
        let base = json!({"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
            "limits": {"x-tenant-id": {"default": limits}}, "local": local});
        compiled_json(base, json!({}))
    }

    fn request(c: &Compiled, h: &Worker) -> (Stream, Next) {
        h.request(c, "acme")
    }

    #[test]
    fn a_sync_refusal_counts_in_sync_over_limit_not_in_the_services_over_limit() {
        // A sync group with a quota of 5 per minute, 40 requests: 2
        // admitted from the view (max_unsynced: half of 5), 3 asking the
        // service (no answer yet), 35 refused by the view, none by the
        // service.
        let c = config(json!({"perminute": 5}), json!({"mode": "sync"}));
        let h = Worker::ready(&c, NOW);
        let nexts: Vec<Next> = (0..40).map(|_| request(&c, &h).1).collect();
        assert_eq!(nexts.iter().filter(|n| **n == Next::Continue).count(), 2);
        assert_eq!(h.replies().len(), 35);
        assert_eq!(h.call_count() + h.vm.batch.queued() as u64, 3);
        assert_eq!(h.counter(Counter::OverLimit), 0, "{:?}", h.counted());
        assert_eq!(h.counter(Counter::SyncOverLimit), 35);
        assert_eq!(h.group_counter(0, GroupCounter::SyncRefused), 35);
        // Every refusal has one source: the three local ones and the
        // service's add up to the 429s.
        let refused: u64 = [
            Counter::OverLimit,
            Counter::CachedOverLimit,
            Counter::LocalOverLimit,
            Counter::SyncOverLimit,
        ]
        .iter()
        .map(|c| h.counter(*c))
        .sum();
        assert_eq!(refused, 35);
    }

    #[test]
    fn a_cached_refusal_keeps_the_rule_names_in_every_mode() {
        let named = || {
            let mut s = status(Code::OverLimit, 10, RateLimitUnit::Minute, 0, 40);
            s.current_limit.as_mut().unwrap().name = "per-minute \"gold\"".into();
            vec![s]
        };
        let expected = r#"10, 10;w=60;name="per-minute \"gold\"""#;
        // Sync asks the service once max_unsynced (1) hits are pending:
        // the second request.
        for local in [
            json!({"mode": "exact"}),
            json!({"mode": "lease"}),
            json!({"mode": "sync", "sync": {"max_unsynced": 1}}),
        ] {
            let c = config(json!({"perminute": 10}), local.clone());
            let h = Worker::ready(&c, NOW);
            let (mut s, mut next) = request(&c, &h);
            if next == Next::Continue {
                (s, next) = request(&c, &h);
            }
            assert_eq!((next, h.call_count()), (Next::Pause, 1), "{local}");
            let body = answer(Code::OverLimit, named());
            let size = body.len();
            h.set_grpc_response(Some(body));
            h.answer(&c, &mut s, 0, size);
            // The service's 429, then the cache's: the same names.
            let (_, next) = request(&c, &h);
            assert_eq!((next, h.call_count()), (Next::Pause, 1), "{local}");
            let replies = h.replies();
            assert_eq!(replies.len(), 2, "{local}");
            for r in &replies {
                assert_eq!(r.header("x-ratelimit-limit"), Some(expected), "{local}");
            }
            assert_eq!(h.counter(Counter::CachedOverLimit), 1, "{local}");
        }
    }

    #[test]
    fn a_lease_then_sync_admits_at_most_max_unsynced_before_asking() {
        let lease = config(
            json!({"perminute": 600}),
            json!({"mode": "lease", "lease": {"max_batch": 50}}),
        );
        let sync = config(
            json!({"perminute": 600}),
            json!({"mode": "sync", "sync": {"max_unsynced": 4}}),
        );
        let h = Worker::ready(&lease, NOW);
        // A lease with tokens.
        for i in 0..2 {
            let (mut s, next) = request(&lease, &h);
            assert_eq!(next, Next::Pause, "{i}");
            let body = answer(
                Code::Ok,
                vec![status(Code::Ok, 600, RateLimitUnit::Minute, 500, 40)],
            );
            h.set_grpc_response(Some(body.clone()));
            h.answer(&lease, &mut s, 0, body.len());
        }
        assert_eq!(request(&lease, &h).1, Next::Continue);
        // Sync: at most max_unsynced (4) hits admitted before the service
        // is asked (it was every request, without limit).
        let calls = h.call_count();
        let admitted = (0..20)
            .take_while(|_| request(&sync, &h).1 == Next::Continue)
            .count();
        assert_eq!(admitted, 4, "admitted {admitted} without asking");
        assert_eq!(h.call_count(), calls + 1);
        assert_eq!(h.counter(Counter::OverLimit), 0);
    }
}

/// A group's mode changed by a new configuration, under traffic, over the
/// same slots (shared data outlives configurations). One Envoy, one tenant,
/// a quota of 10 per minute; a stand-in for the service counts every hit
/// it is told of, as envoyproxy/ratelimit does (a call over the limit is
/// still counted).
mod mode_change {
    use super::*;
    use crate::counters::Counter;
    use crate::root::Root;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const HEADER: &str = "x-tenant-id";
    const LIMIT: u32 = 60;
    const MODES: [&str; 3] = ["exact", "lease", "sync"];

    fn config(mode: &str) -> Compiled {
        let base = json!({"domain": "d", "rate_limit_service": {"cluster": "ratelimit", "timeout_ms": 25},
            "limits": {"x-tenant-id": {"default": {"perminute": LIMIT}}},
            "local": {"mode": mode, "lease": {"max_batch": 5},
                      "sync": {"interval_ms": 50, "max_unsynced": 4}}});
        compiled_json(base, json!({}))
    }

    /// One Envoy worker and the service's count of this minute (`sync`'s
    /// `max_unsynced`: 4).
    struct Fleet {
        c: Compiled,
        h: Worker,
        root: Root,
        /// Hits the service counted.
        counted: u32,
        admitted: u32,
        refused: u32,
    }

    impl Fleet {
        fn new(mode: &str) -> Fleet {
            let c = config(mode);
            let h = Worker::ready(&c, NOW);
            Fleet {
                c,
                h,
                root: Root::default(),
                counted: 0,
                admitted: 0,
                refused: 0,
            }
        }

        /// The service's answer to the call `n` (in `h.calls()`).
        fn answer_to(&mut self, n: usize) -> Vec<u8> {
            let message = &self.h.calls()[n].message;
            let hits = RateLimitRequest::decode(&message[..])
                .unwrap()
                .hits_addend
                .max(1);
            self.counted += hits;
            let over = self.counted > LIMIT;
            let code = if over { Code::OverLimit } else { Code::Ok };
            let remaining = LIMIT.saturating_sub(self.counted);
            answer(
                code,
                vec![status(code, LIMIT, RateLimitUnit::Minute, remaining, 30)],
            )
        }

        /// One request, 10 ms after the last; a call it makes is answered
        /// at once.
        fn request(&mut self) {
            self.h.set_now_ms(self.h.now_ms() + 10);
            self.h.set_request_header(HEADER, b"acme");
            let (calls, resumed, replies) =
                (self.h.calls().len(), self.h.resumed(), self.h.reply_count());
            let mut s = self.h.stream();
            let next = s.on_request_headers(&self.c, &self.h, &self.h.vm);
            if self.h.calls().len() > calls {
                let body = self.answer_to(calls);
                let size = body.len();
                self.h.set_grpc_response(Some(body));
                self.h.answer(&self.c, &mut s, 0, size);
            }
            if next == Next::Continue || self.h.resumed() > resumed {
                self.admitted += 1;
            }
            if self.h.reply_count() > replies {
                self.refused += 1;
            }
        }

        /// The root's tick, 50 ms on; its calls are answered at once.
        fn tick(&mut self) {
            self.h.set_now_ms(self.h.now_ms() + 50);
            let calls = self.h.calls().len();
            self.root.on_tick(&self.c, &self.h, &self.h.vm);
            for n in calls..self.h.calls().len() {
                let body = self.answer_to(n);
                let (token, size) = (self.h.calls()[n].token, body.len());
                self.h.set_grpc_response(Some(body));
                self.root
                    .on_answer(&self.c, &self.h, &self.h.vm, token, 0, size);
            }
        }

        /// `n` requests, with a tick after every fifth.
        fn traffic(&mut self, n: usize) {
            for i in 1..=n {
                self.request();
                if i % 5 == 0 {
                    self.tick();
                }
            }
        }

        fn block(&self) -> ModeState {
            let at = slot_of(&self.c, &self.h.slot_secret(), "default", "acme");
            let bytes = self.h.shared_value(&SlotKey::new(at.index)).unwrap();
            // Nothing written yet (exact mode without a bucket): no block.
            Slot::decode(&bytes).map_or(ModeState::None, |s| s.mode)
        }
    }

    #[test]
    fn the_quota_holds_and_every_admitted_hit_is_counted_through_every_mode_change() {
        for from in MODES {
            for to in MODES.into_iter().filter(|m| *m != from) {
                let mut f = Fleet::new(from);
                // 7 requests, the last two after the last tick: a lease or
                // a sync view holds something when the mode changes.
                f.traffic(7);
                let before = f.admitted;
                assert!(before > 0, "{from}");
                let held = f.block();
                f.c = config(to);
                f.traffic(93);
                // Whatever the mode held, once the next tick has run.
                f.tick();
                let what = format!("{from} -> {to}: {held:?}, {:?}", f.h.group_counted());
                // Into sync, a view starts unknown: up to max_unsynced hits
                // are admitted before the service's count is known (the
                // sync bound). Out of it, the hits no push had taken ride
                // on the next call: the quota holds.
                let bound = if to == "sync" { LIMIT + 4 } else { LIMIT };
                assert!(f.admitted <= bound, "admitted {}: {what}", f.admitted);
                assert_eq!(f.admitted + f.refused, 100, "{what}");
                // The service counted every hit admitted: none was lost
                // with the block of the old mode.
                assert!(f.counted >= f.admitted, "counted {}: {what}", f.counted);
                // The new mode's block, or none.
                let fits = matches!(
                    (to, f.block()),
                    ("exact", ModeState::None)
                        | ("lease", ModeState::Lease(_))
                        | ("sync", ModeState::Sync(_))
                );
                assert!(fits, "{:?}: {what}", f.block());
                // What the old block held is counted.
                let tokens = f.h.counter(Counter::ModeChangeLeaseTokens);
                let hits = f.h.counter(Counter::ModeChangeSyncHits);
                match held {
                    ModeState::Lease(l) => assert_eq!(tokens, u64::from(l.tokens), "{what}"),
                    ModeState::Sync(s) => assert_eq!(hits, u64::from(s.unsynced), "{what}"),
                    ModeState::None => assert_eq!((tokens, hits), (0, 0), "{what}"),
                }
            }
        }
    }

    #[test]
    fn lease_to_sync_under_traffic_keeps_the_sync_view() {
        // The case seen on a real Envoy: a lease block with tokens, then
        // sync. Every request used to start from a fresh view (the lease
        // block was written back, the sync state dropped): admitted
        // without limit, nothing pushed.
        let mut f = Fleet::new("lease");
        f.traffic(7);
        assert!(
            matches!(f.block(), ModeState::Lease(l) if l.tokens > 0),
            "{:?}",
            f.block()
        );
        f.c = config("sync");
        for _ in 0..3 {
            f.request();
        }
        match f.block() {
            ModeState::Sync(s) => assert_eq!(s.unsynced, 3),
            other => panic!("{other:?}"),
        }
        assert_eq!(f.h.vm.mailbox.tracked().len(), 1);
        let pushes = f.h.group_counter(0, GroupCounter::Syncs);
        f.tick();
        assert_eq!(f.h.group_counter(0, GroupCounter::Syncs), pushes + 1);
        assert_eq!(f.h.group_counter(0, GroupCounter::SyncHits), 3);
    }

    #[test]
    fn leaving_sync_the_next_call_carries_the_hits_no_push_had_taken() {
        for to in ["exact", "lease"] {
            let mut f = Fleet::new("sync");
            // 3 hits admitted locally, no tick yet: the service has none.
            for _ in 0..3 {
                f.request();
            }
            assert_eq!((f.admitted, f.counted), (3, 0), "{to}");
            f.c = config(to);
            f.request();
            // The request asked the service for its own hit and the 3.
            assert_eq!((f.admitted, f.counted), (4, 4), "{to}");
            let asked = RateLimitRequest::decode(&f.h.calls()[0].message[..]).unwrap();
            assert_eq!(asked.hits_addend, 4, "{to}");
            assert_eq!(f.h.counter(Counter::ModeChangeSyncHits), 3);
            // Nothing is left for the root to push.
            f.tick();
            assert_eq!((f.counted, f.h.call_count()), (4, 1), "{to}");
        }
    }
}
