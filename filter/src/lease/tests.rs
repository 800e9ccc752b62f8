//! Lease mode's steps (the flow in lease mode: `modes`' tests).

use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use crate::testing::NOW;
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
    let (l, stranded) = after_answer(
        Some(lease),
        &P,
        NOW,
        NOW + 5,
        10,
        BatchOutcome::Granted { remaining: 500 },
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
    let (l, _) = after_answer(
        None,
        &P,
        NOW,
        NOW + 3,
        7,
        BatchOutcome::Granted { remaining: 9 },
    );
    let (l, step, stranded) = spend(Some(l), &P, MINUTE_END - 1);
    assert_eq!((step, stranded), (Spend::Token { refill: None }, 0));
    assert_eq!(l.tokens, 6);
    let (l, step, stranded) = spend(Some(l), &P, MINUTE_END);
    assert_eq!(stranded, 6);
    assert_eq!(l.tokens, 0);
    assert!(matches!(step, Spend::Ask { .. }));
}

#[test]
fn of_two_answers_in_one_window_the_later_count_stands_whatever_their_order() {
    // Two calls under way (two workers): the one asked later is answered
    // first, with the smaller remaining; the earlier one's answer, which
    // the service counted before it, must not raise the estimate again.
    let (l, _) = after_answer(
        None,
        &P,
        NOW + 2,
        NOW + 4,
        5,
        BatchOutcome::Granted { remaining: 1_489 },
    );
    let (l, _) = after_answer(
        Some(l),
        &P,
        NOW,
        NOW + 5,
        4,
        BatchOutcome::Granted { remaining: 1_494 },
    );
    assert_eq!((l.tokens, l.remaining), (9, 1_489));
    // In the next window the first answer stands as it is.
    let (l, _) = after_answer(
        Some(l),
        &P,
        MINUTE_END + 1,
        MINUTE_END + 3,
        2,
        BatchOutcome::Granted { remaining: 1_497 },
    );
    assert_eq!(l.remaining, 1_497);
    // A refusal's 0 gives way to a later grant of one hit.
    let (l, _) = after_answer(
        Some(l),
        &P,
        MINUTE_END + 4,
        MINUTE_END + 5,
        0,
        BatchOutcome::Refused,
    );
    let (l, _) = after_answer(
        Some(l),
        &P,
        MINUTE_END + 6,
        MINUTE_END + 7,
        0,
        BatchOutcome::Granted { remaining: 2 },
    );
    assert_eq!(l.remaining, 2);
}

#[test]
fn a_batch_granted_after_its_window_ended_is_stranded_whole() {
    // Asked 1 ms before the minute ended, answered in the next one.
    let (l, stranded) = after_answer(
        None,
        &P,
        MINUTE_END - 1,
        MINUTE_END + 2,
        9,
        BatchOutcome::Granted { remaining: 3 },
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
    let (l, _) = after_answer(Some(busy), &P, NOW, NOW + 1, 49, BatchOutcome::Refused);
    assert_eq!(l.batch(&P, NOW + 2), 1);
    assert_eq!(Lease::default().batch(&P, NOW), 1);
}

#[test]
fn a_window_refill_goes_for_a_tenant_served_last_second_whose_lease_ended() {
    // Served 7 requests in the second before the window ended, 3 tokens
    // left of the window that ended.
    let served = Lease {
        tokens: 3,
        until_ms: MINUTE_END,
        rate_second: MINUTE_END / 1_000 - 1,
        rate_count: 7,
        ..Lease::default()
    };
    // Within its window: nothing to do, not idle.
    let (l, batch, stranded, idle) = window_refill(served, &P, MINUTE_END - 10);
    assert_eq!((l, batch, stranded, idle), (served, None, 0, false));
    // The window ended: a batch of its rate, the old tokens stranded, the
    // refill marked under way.
    let (l, batch, stranded, idle) = window_refill(served, &P, MINUTE_END + 5);
    assert_eq!((batch, stranded, idle), (Some(7), 3, false));
    assert_eq!((l.tokens, l.refill_at_ms), (0, MINUTE_END + 5));
    // While that refill is under way, no second one.
    let (_, batch, _, idle) = window_refill(l, &P, MINUTE_END + 20);
    assert_eq!((batch, idle), (None, false));
    // No request in this second or the one before: idle, nothing asked.
    let (_, batch, stranded, idle) = window_refill(served, &P, MINUTE_END + 1_005);
    assert_eq!((batch, stranded, idle), (None, 0, true));
    // Never more than the batch cap.
    let busy = Lease {
        rate_count: 500,
        ..served
    };
    let (_, batch, _, _) = window_refill(busy, &P, MINUTE_END + 5);
    assert_eq!(batch, Some(P.max_batch));
}

#[test]
fn a_batch_refused_with_room_left_may_be_followed_by_a_smaller_ask() {
    use crate::proto::{Code, RateLimitUnit};
    use crate::testing::status;
    let minute = |code, left| status(code, 600, RateLimitUnit::Minute, left, 40);
    let hour = status(Code::Ok, 6_000, RateLimitUnit::Hour, 3_000, 40);
    // The counter: a batch of 30 refused, 12 left in the minute.
    let counter = [minute(Code::OverLimit, 12), hour.clone()];
    assert!(smaller_may_fit(30, &counter));
    // envoyproxy/ratelimit answers 0 left, and one hit refused is refused.
    let counted = [minute(Code::OverLimit, 0), hour];
    assert!(!smaller_may_fit(30, &counted));
    assert!(!smaller_may_fit(1, &counter));
    // After the refusal the next ask is for one hit, then a grant's
    // remaining bounds the batches again.
    let (l, _) = after_answer(None, &P, NOW, NOW + 2, 0, BatchOutcome::Refused);
    let (l, step, _) = spend(Some(l), &P, NOW + 3);
    assert_eq!(step, Spend::Ask { batch: 1 });
    let (l, _) = after_answer(
        Some(l),
        &P,
        NOW + 3,
        NOW + 4,
        0,
        BatchOutcome::Granted { remaining: 11 },
    );
    assert_eq!(
        l.batch(&P, NOW + 5),
        1.max(l.rate_count.max(l.rate_prev)).min(11)
    );
}
