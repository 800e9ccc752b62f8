//! Lease mode: the pure steps, then the whole flow against the in-memory
//! host and its clock.

use prost::Message;
use ratelimit_config::parse_plugin_config;

use super::*;
use crate::flow::{Next, Stream};
use crate::local::{slot_for, SlotKey};
use crate::proto::{DescriptorStatus, RateLimitRequest, RateLimitUnit};
use crate::testing::{answer, status, MemHost};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// 2023-11-14T22:13:20.250Z: 20.25 s into its minute.
const NOW: u64 = 1_700_000_000_250;
const MINUTE_END: u64 = 1_700_000_040_000;

const P: LeaseParams = LeaseParams {
    max_batch: 50,
    window_ms: 60_000,
    refill_lost_ms: 1_025,
};

#[test]
fn the_first_request_asks_for_one_and_the_next_wait_for_its_answer_with_one_each() {
    let (l, step, stranded) = spend(None, &P, NOW);
    assert_eq!((step, stranded), (Spend::Ask { batch: 1 }, 0));
    assert_eq!(l.refill_at_ms, NOW);
    let (l, step, _) = spend(Some(l), &P, NOW + 1);
    assert_eq!(step, Spend::Ask { batch: 1 });
    // An answer that never came is given up after refill_lost_ms: the next
    // request asks for a batch of the rate it has seen.
    let (_, step, _) = spend(Some(l), &P, NOW + 1 + P.refill_lost_ms);
    assert_eq!(step, Spend::Ask { batch: 2 });
}

#[test]
fn a_granted_batch_is_spent_without_calls_and_refilled_at_half() {
    let lease = Lease {
        rate_second: NOW / 1_000 - 1,
        rate_count: 10,
        ..Lease::default()
    };
    let (l, stranded) = settle(
        Some(lease),
        &P,
        NOW,
        NOW + 5,
        10,
        Outcome::Granted { remaining: 500 },
    );
    assert_eq!((l.tokens, l.until_ms, stranded), (10, MINUTE_END, 0));
    let mut l = Some(l);
    let mut steps = Vec::new();
    for i in 0..10 {
        let (next, step, _) = spend(l, &P, NOW + 10 + i);
        steps.push(step);
        l = Some(next);
    }
    // The batch is the last second's rate, 10: a refill goes out when 5
    // tokens are left, once.
    let refills: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Spend::Token { refill: Some(10) }))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(refills, vec![4]);
    assert!(steps.iter().all(|s| matches!(s, Spend::Token { .. })));
    // Out of tokens with the refill under way: one hit at a time.
    let (_, step, _) = spend(l, &P, NOW + 30);
    assert_eq!(step, Spend::Ask { batch: 1 });
}

#[test]
fn tokens_never_outlive_their_window_and_are_counted_as_stranded() {
    let (l, _) = settle(None, &P, NOW, NOW + 3, 7, Outcome::Granted { remaining: 9 });
    let (l, step, stranded) = spend(Some(l), &P, MINUTE_END - 1);
    assert_eq!((step, stranded), (Spend::Token { refill: None }, 0));
    assert_eq!(l.tokens, 6);
    let (l, step, stranded) = spend(Some(l), &P, MINUTE_END);
    assert_eq!(stranded, 6);
    assert_eq!(l.tokens, 0);
    assert!(matches!(step, Spend::Ask { .. }));
}

#[test]
fn a_batch_granted_after_its_window_ended_is_stranded_whole() {
    // Asked 1 ms before the minute ended, answered in the next one.
    let (l, stranded) = settle(
        None,
        &P,
        MINUTE_END - 1,
        MINUTE_END + 2,
        9,
        Outcome::Granted { remaining: 3 },
    );
    assert_eq!((l.tokens, stranded), (0, 9));
}

#[test]
fn the_batch_follows_the_rate_within_one_and_max_batch_and_never_above_remaining() {
    let busy = Lease {
        rate_second: NOW / 1_000,
        rate_count: 400,
        ..Lease::default()
    };
    assert_eq!(busy.batch(&P, NOW), 50);
    let near = Lease {
        remaining: 3,
        remaining_until_ms: MINUTE_END,
        ..busy
    };
    assert_eq!(near.batch(&P, NOW), 3);
    // The remaining of an ended window no longer caps it.
    assert_eq!(near.batch(&P, MINUTE_END), 50);
    // A refused batch: the next ask is for one hit, so a refusal at the
    // limit costs the service's counter one.
    let (l, _) = settle(Some(busy), &P, NOW, NOW + 1, 49, Outcome::Refused);
    assert_eq!(l.batch(&P, NOW + 2), 1);
    assert_eq!(Lease::default().batch(&P, NOW), 1);
}

#[test]
fn leases_round_trip_through_their_bytes() {
    let l = Lease {
        tokens: 7,
        until_ms: MINUTE_END,
        refill_at_ms: NOW,
        remaining: 12,
        remaining_until_ms: MINUTE_END,
        rate_second: NOW / 1_000,
        rate_count: 3,
        rate_prev: 9,
    };
    let mut b = [0u8; Lease::BYTES];
    l.encode(&mut b);
    assert_eq!(Lease::decode(&b), Some(l));
    assert_eq!(Lease::decode(&b[..47]), None);
}

// ------------------------------------------------------------ the flow

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

fn host(c: &Compiled) -> MemHost {
    let h = MemHost::new();
    h.create_slots(c.config.local.slots);
    h.set_now_ms(NOW);
    h
}

fn request(c: &Compiled, h: &MemHost, tenant: &str) -> (Stream, Next) {
    h.set_request_header(HEADER, tenant.as_bytes());
    let mut s = Stream::default();
    let next = s.on_request_headers(c, h);
    (s, next)
}

fn ok(remaining: u32) -> Vec<DescriptorStatus> {
    vec![
        status(Code::Ok, 1000, RateLimitUnit::Minute, remaining, 40),
        status(Code::Ok, 5000, RateLimitUnit::Hour, 4000, 2_000),
    ]
}

fn respond(c: &Compiled, h: &MemHost, s: &mut Stream, code: Code, statuses: Vec<DescriptorStatus>) {
    let body = answer(code, statuses);
    let size = body.len();
    h.set_grpc_response(Some(body));
    s.on_rls_answer(c, h, 0, size);
}

fn last_hits(h: &MemHost) -> Vec<Option<u64>> {
    let calls = h.calls();
    let r = RateLimitRequest::decode(&calls.last().unwrap().message[..]).unwrap();
    let hits = u64::from(r.hits_addend);
    r.descriptors.iter().map(|_| Some(hits)).collect()
}

fn lease_of(c: &Compiled, h: &MemHost, tenant: &str) -> Lease {
    let at = slot_for(&h.slot_secret(), "default", tenant, c.config.local.slots);
    let bytes = h.shared_value(&SlotKey::new(at.index)).unwrap();
    Slot::decode(&bytes).unwrap().lease.unwrap()
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
        refills.extend(h.take_refills());
    }
    assert_eq!(h.call_count(), calls, "no call while tokens are left");
    // One refill, when half a batch was left.
    assert_eq!(refills.len(), 1);
    let r = &refills[0];
    assert_eq!((r.group, r.tenant.as_str(), r.batch), (0, "acme", 20));
    let message = refill_message(&c, r).unwrap();
    let asked = RateLimitRequest::decode(&message[..]).unwrap();
    assert_eq!((asked.hits_addend, asked.descriptors.len()), (20, 2));
    // Its answer (at the root) adds the batch to what is left.
    let body = answer(Code::Ok, ok(850));
    on_refill_answer(&c, &h, r, NOW + 1_010, 0, Some(&body));
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
    let refills = h.take_refills();
    assert_eq!(refills.len(), 1);
    on_refill_answer(&c, &h, &refills[0], NOW + 2_001, 14, None);
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
    assert!(h.take_refills().is_empty());
    assert_eq!(h.group_counter(1, GroupCounter::LeasesTaken), 0);
}
