//! Sync mode's steps (the flow in sync mode and the root's pushes: `modes`'
//! and `root`'s tests).

use super::*;
use crate::answer::decode;
use crate::proto::{Code, RateLimitUnit};
use crate::testing::{answer, status};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use crate::testing::NOW;
const MINUTE_END: u64 = 1_700_000_040_000;

/// The service's answer: per status, over the limit or not, and what
/// remains.
fn heard(counts: &[(bool, u32)]) -> Answer {
    let statuses = counts
        .iter()
        .map(|&(over, remaining)| {
            let code = if over { Code::OverLimit } else { Code::Ok };
            status(code, 0, RateLimitUnit::Minute, remaining, 1)
        })
        .collect();
    decode(0, Some(&answer(Code::Ok, statuses))).unwrap()
}

/// 10 per minute, 100 per hour; 4 hits may be pending.
fn params() -> SyncParams {
    SyncParams {
        max_unsynced: 4,
        windows: [
            (60_000, 10),
            (3_600_000, 100),
            (1_000, 0),
            (1_000, 0),
            (1_000, 0),
            (1_000, 0),
        ],
        units: 2,
        push_lost_ms: 1_025,
    }
}

#[test]
fn admits_while_the_view_and_the_pending_hits_fit_then_asks_then_refuses() {
    let p = params();
    let mut s = SyncState {
        views: [5, 50, 0, 0, 0, 0],
        view_until_ms: [MINUTE_END, MINUTE_END + 1_000_000, 0, 0, 0, 0],
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
    let answered = heard(&[(false, 4), (false, 49)]);
    let s = after_answer(Some(s), &p, NOW, NOW + 1, 1, false, Some(&answered));
    assert_eq!((s.views[0], s.views[1], s.in_flight), (6, 51, 0));
    // The root pushes the 4; the service has counted 10 of 10: 429, no call.
    let (pushed, delta) = take_delta(Some(s), &p, NOW + 1);
    assert_eq!(delta, 4);
    let counted = heard(&[(false, 0), (false, 45)]);
    let s = after_answer(
        Some(pushed),
        &p,
        NOW + 1,
        NOW + 5,
        delta,
        true,
        Some(&counted),
    );
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
    let s = after_answer(Some(s), &p, NOW, NOW + 30, 3, true, None);
    assert_eq!((s.in_flight, s.unsynced), (0, 3));
    // A request's own call that failed is not put back (it followed
    // failure_mode_deny, as in exact mode).
    let asking = SyncState { in_flight: 1, ..s };
    let after = after_answer(Some(asking), &p, NOW, NOW + 30, 1, false, None);
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
    let over = heard(&[(true, 0), (false, 10)]);
    let s = after_answer(
        Some(s),
        &p,
        MINUTE_END - 1,
        MINUTE_END + 1,
        2,
        true,
        Some(&over),
    );
    assert_eq!(s.views[0], 0);
    assert_eq!(s.views[1], 90);
}
