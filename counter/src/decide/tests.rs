//! The decision's tests, each run on every store (memory, one Redis, a
//! Redis Cluster) by `test_with_all_stores!`: the script decides as the
//! Rust code does.

use super::*;
use crate::proto::{Entry, RateLimitDescriptor, UInt64Value};
use crate::store::testing::{Kind, Under};
use crate::test_with_all_stores;
use proptest::prelude::{any, Strategy};
use proptest::test_runner::{Config, TestCaseResult, TestRunner};
use ratelimit_config::validate::parse_team_limits_for;
use ratelimit_config::Service;

fn domain(json: &str) -> Domain {
    let doc: serde_json::Value = serde_json::from_str(json).unwrap();
    let (limits, _) = parse_team_limits_for(&doc, "", Service::Counter).unwrap();
    Domain {
        limits,
        descriptor_key: "tenant".into(),
    }
}

fn desc(pairs: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
    }
}

fn call(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// One call decided by the store `s` at `now`, answered.
fn run(s: &Under, d: &Domain, req: &RateLimitRequest, now: u64) -> RateLimitResponse {
    let plan = plan(Some(d), req, now).unwrap();
    answer(&plan, &s.decide(&plan.requests, now), now).0
}

fn admitted(decided: &[Decision]) -> Vec<bool> {
    decided.iter().map(|d| d.admitted).collect()
}

/// Whether a mark goes before a descriptor of `tenant` after one of
/// `last` in the same request: on a Cluster, a request's keys must share a
/// slot (one script call decides it atomically), and each tenant has its
/// own slot: a request naming two tenants fails there (CROSSSLOT), so the
/// random calls mark where the tenant changes.
fn new_request(s: &Under, marked: bool, last: Option<usize>, tenant: usize) -> bool {
    marked || (s.kind == Kind::Cluster && last.is_some_and(|l| l != tenant))
}

/// A property test on the store `s`: `test` on each case drawn from
/// `strategy`, every case on a fresh store.
fn prop<S: Strategy>(s: &Under, strategy: S, test: impl Fn(S::Value) -> TestCaseResult) {
    let mut runner = TestRunner::new(Config {
        cases: s.cases(),
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, |v| {
        s.fresh();
        test(v)
    }) {
        panic!("{:?}: {e}", s.kind);
    }
}

const T0: u64 = 1_800_000_000_000; // an hour's (and a minute's) boundary

/// A call of one push of `hits` on the tenant's minute and hour: its
/// answer, and how far past a limit its hits took a count.
fn push(s: &Under, d: &Domain, hits: u64, now: u64) -> (RateLimitResponse, u64) {
    let req = call(vec![
        desc(&[(REQUEST_MARK, PUSH)], None),
        desc(
            &[("generic_key", "per_minute"), ("tenant", "a")],
            Some(hits),
        ),
        desc(&[("generic_key", "per_hour"), ("tenant", "a")], Some(hits)),
    ]);
    let p = plan(Some(d), &req, now).unwrap();
    assert!(p.requests[0].push);
    let decided = s.decide(&p.requests, now);
    assert_eq!(admitted(&decided), [true], "a push is always counted");
    let (r, outcomes) = answer(&p, &decided, now);
    (r, outcomes[0].overshoot)
}

fn a_push_is_counted_whole_on_every_window_and_answered_with_the_count(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 5, "perhour": 8}}}"#);
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    // status: (code, remaining) of the minute and the hour, after the mark.
    let got = |r: &RateLimitResponse| {
        r.statuses[1..]
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect::<Vec<_>>()
    };
    let (r, overshoot) = push(s, &d, 4, T0);
    assert_eq!(
        (r.overall_code, got(&r), overshoot),
        (ok, vec![(ok, 1), (ok, 4)], 0)
    );
    assert_eq!(r.statuses[0].code, ok, "the mark's own status");
    // 3 more: the minute at 7 of 5, counted whole; 2 past its limit.
    let (r, overshoot) = push(s, &d, 3, T0 + 1);
    assert_eq!(
        (r.overall_code, got(&r), overshoot),
        (over, vec![(over, 0), (ok, 1)], 2)
    );
    assert_eq!(r.statuses[1].duration_until_reset.unwrap().seconds, 60);
    let minute = plan(
        Some(&d),
        &call(vec![desc(
            &[("generic_key", "per_minute"), ("tenant", "a")],
            None,
        )]),
        T0,
    )
    .unwrap()
    .requests[0]
        .checks[0]
        .key
        .clone();
    assert_eq!(s.value(&minute, T0 + 1), 7);
    // An ordinary request is still refused whole, nothing counted.
    let one = call(vec![
        desc(&[(REQUEST_MARK, "")], None),
        desc(&[("generic_key", "per_minute"), ("tenant", "a")], None),
        desc(&[("generic_key", "per_hour"), ("tenant", "a")], None),
    ]);
    assert_eq!(run(s, &d, &one, T0 + 2).overall_code, over);
    assert_eq!(s.value(&minute, T0 + 2), 7);
    // The next minute: its own count, and the hour 1 past its 8.
    let (r, overshoot) = push(s, &d, 2, T0 + 60_000);
    assert_eq!(
        (r.overall_code, got(&r), overshoot),
        (over, vec![(ok, 3), (over, 0)], 1)
    );
    // Already past: every hit of a push is past the limit.
    let (_, overshoot) = push(s, &d, 2, T0 + 60_001);
    assert_eq!(overshoot, 2);
}

fn a_refused_request_adds_nothing_anywhere(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 2, "perhour": 3}}}"#);
    let req = call(vec![
        desc(&[("generic_key", "per_minute"), ("tenant", "a")], None),
        desc(&[("generic_key", "per_hour"), ("tenant", "a")], None),
    ]);
    let codes = |r: &RateLimitResponse| r.statuses.iter().map(|s| s.code).collect::<Vec<_>>();
    assert_eq!(run(s, &d, &req, T0).overall_code, Code::Ok as i32);
    let r = run(s, &d, &req, T0 + 1);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(r.statuses[1].limit_remaining, 1);
    // Over the minute: refused, and the hour keeps its one left.
    let r = run(s, &d, &req, T0 + 2);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(codes(&r), vec![Code::OverLimit as i32, Code::Ok as i32]);
    assert_eq!(r.statuses[1].limit_remaining, 1);
    // The next minute: the hour's last one, then the hour refuses.
    assert_eq!(run(s, &d, &req, T0 + 60_000).overall_code, Code::Ok as i32);
    let r = run(s, &d, &req, T0 + 60_001);
    assert_eq!(codes(&r), vec![Code::Ok as i32, Code::OverLimit as i32]);
    let hour = &plan(Some(&d), &req, T0).unwrap().requests[0].checks[1].key;
    assert_eq!(s.value(hour, T0 + 60_002), 3, "exactly what was admitted");
}

fn marks_split_a_call_into_requests_and_get_a_status_of_their_own(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 1}}}"#);
    let mark = || desc(&[(REQUEST_MARK, "")], None);
    let minute = |t: &str| desc(&[("generic_key", "per_minute"), ("tenant", t)], None);
    let req = call(vec![
        mark(),
        minute("a"),
        mark(),
        minute("a"),
        mark(),
        minute("b"),
    ]);
    let p = plan(Some(&d), &req, T0).unwrap();
    assert_eq!(p.requests.len(), 3);
    let r = run(s, &d, &req, T0);
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, vec![ok, ok, ok, over, ok, ok]);
    assert!(r.statuses[0].current_limit.is_none());
    // No marks: one request.
    assert_eq!(
        plan(Some(&d), &call(vec![minute("a"), minute("b")]), T0)
            .unwrap()
            .requests
            .len(),
        1
    );
}

fn unknown_domains_and_descriptors_without_a_rule_are_ok_without_a_limit(s: &Under) {
    let d = domain(r#"{"x-t": {"gold": {"header_value": ["g"], "perminute": 1}}}"#);
    let req = call(vec![
        desc(&[("generic_key", "per_minute"), ("tenant", "nobody")], None),
        desc(&[("generic_key", "per_hour"), ("tenant", "g")], None),
        desc(&[("other", "x")], None),
        desc(&[], None),
    ]);
    for dom in [None, Some(&d)] {
        let p = plan(dom, &req, T0).unwrap();
        assert!(p.requests.iter().all(|r| r.checks.is_empty()));
        let decided = s.decide(&p.requests, T0);
        assert!(decided.iter().all(|d| d.admitted && d.counts.is_empty()));
        let r = answer(&p, &decided, T0).0;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses.len(), 4);
        assert!(r.statuses.iter().all(|s| s.current_limit.is_none()));
    }
}

fn hits_addend_zero_checks_and_a_huge_one_is_refused_without_counting(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 2}}}"#);
    let check = call(vec![desc(
        &[("generic_key", "per_minute"), ("tenant", "a")],
        Some(0),
    )]);
    let r = run(s, &d, &check, T0);
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 2)
    );
    let mut huge = call(vec![desc(
        &[("generic_key", "per_minute"), ("tenant", "a")],
        None,
    )]);
    huge.hits_addend = u32::MAX;
    assert_eq!(run(s, &d, &huge, T0).overall_code, Code::OverLimit as i32);
    let big = call(vec![desc(
        &[("generic_key", "per_minute"), ("tenant", "a")],
        Some(u64::MAX),
    )]);
    assert_eq!(run(s, &d, &big, T0).overall_code, Code::OverLimit as i32);
    let minute = &plan(Some(&d), &check, T0).unwrap().requests[0].checks[0].key;
    assert_eq!(s.value(minute, T0), 0, "nothing counted");
    let two = call(vec![desc(
        &[("generic_key", "per_minute"), ("tenant", "a")],
        Some(2),
    )]);
    assert_eq!(run(s, &d, &two, T0).overall_code, Code::Ok as i32);
    let r = run(s, &d, &check, T0);
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "full: a check says so"
    );
}

fn routes_count_apart_and_calendar_windows_end_on_the_calendar(s: &Under) {
    let d =
        domain(r#"{"x-t": {"default": {"permonth": 5, "routes": {"reports": {"perweek": 1}}}}}"#);
    let req = call(vec![
        desc(&[("generic_key", "per_month"), ("tenant", "a")], None),
        desc(
            &[
                ("generic_key", "per_week"),
                ("tenant", "a"),
                ("route", "reports"),
            ],
            None,
        ),
    ]);
    // 2027-01-31 23:59:59 UTC (a Sunday).
    let now = 1_801_439_999_000;
    let p = plan(Some(&d), &req, now).unwrap();
    let checks = &p.requests[0].checks;
    assert_eq!(checks[0].window.1, now + 1_000, "1 February");
    assert_eq!(checks[1].window.1, now + 1_000, "Monday");
    assert!(checks[1].key.ends_with(":r:reports"));
    assert_eq!(checks[0].tag, checks[1].tag);
    let r = run(s, &d, &req, now);
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 1);
    assert_eq!(
        r.statuses[1].current_limit.as_ref().unwrap().name,
        "default/reports"
    );
    assert_eq!(
        run(s, &d, &req, now + 500).overall_code,
        Code::OverLimit as i32
    );
    assert_eq!(run(s, &d, &req, now + 1_000).overall_code, Code::Ok as i32);
}

fn a_sliding_window_stops_the_boundary_burst(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 10, "window": "sliding"}}}"#);
    let one = call(vec![desc(
        &[("generic_key", "per_minute"), ("tenant", "a")],
        None,
    )]);
    let admitted_between = |from: u64, n: u64| {
        (0..n)
            .filter(|i| run(s, &d, &one, from + i).overall_code == Code::Ok as i32)
            .count()
    };
    // All 10 in the last second of a minute, then a burst at the next one's start.
    assert_eq!(admitted_between(T0 + 59_000, 30), 10);
    assert_eq!(admitted_between(T0 + 60_000, 30), 0, "fixed would admit 10");
    // A quarter into the next minute: three quarters of 10 still count.
    assert_eq!(admitted_between(T0 + 75_000, 30), 2);
    let r = run(s, &d, &one, T0 + 75_100);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let wait = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!((1..=10).contains(&wait), "{wait}");
}

/// A sliding group slides its minute and leaves its month on the
/// calendar: the month's 4th request on 5 December waits until 1
/// January, not for December's use to slide out of January.
fn a_sliding_group_keeps_its_month_on_the_calendar(s: &Under) {
    use ratelimit_config::window::days_from_civil;
    let d = domain(r#"{"x-t": {"default": {"perminute": 2, "permonth": 3, "window": "sliding"}}}"#);
    let one = call(vec![
        desc(&[("generic_key", "per_minute"), ("tenant", "a")], None),
        desc(&[("generic_key", "per_month"), ("tenant", "a")], None),
    ]);
    let day = 86_400_000;
    let dec5 = days_from_civil(2026, 12, 5) * day + 12 * 3_600_000;
    let jan1 = days_from_civil(2027, 1, 1) * day;
    // Two a minute apart, then a third in the next minute: the minute
    // slides (the previous one's 2 still weigh 2 at its start).
    assert_eq!(run(s, &d, &one, dec5).overall_code, Code::Ok as i32);
    assert_eq!(run(s, &d, &one, dec5 + 1).overall_code, Code::Ok as i32);
    let r = run(s, &d, &one, dec5 + 60_000);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0].code,
        Code::OverLimit as i32,
        "the minute slides"
    );
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    assert_eq!(
        run(s, &d, &one, dec5 + 130_000).overall_code,
        Code::Ok as i32
    );
    // The month's 4th: refused until 1 January, its Retry-After counts
    // down to it (about 26 days), never December's use carried into January.
    let at = dec5 + 300_000;
    let r = run(s, &d, &one, at);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    let wait = r.statuses[1].duration_until_reset.unwrap().seconds;
    assert_eq!(wait as u64, (jan1 - at).div_ceil(1_000));
    // On the 1st the month is new: admitted again (the minute has room).
    let r = run(s, &d, &one, jan1);
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[1].limit_remaining, 2);
}

/// Custom windows: counted in windows from multiples of their length,
/// each with its own key, sliding when the group is.
fn custom_windows_count_from_multiples_of_their_length(s: &Under) {
    let d = domain(
        r#"{"x-t": {"default": {"per5minutes": 3, "per90days": 100},
            "slide": {"header_value": ["b"], "per5minutes": 3, "window": "sliding"}}}"#,
    );
    let five = |tenant: &str| {
        call(vec![desc(
            &[("generic_key", "per_5_minutes"), ("tenant", tenant)],
            None,
        )])
    };
    // T0 is a multiple of 5 minutes: the window is [T0, T0 + 300 s).
    let end = T0 + 300_000;
    for i in 0..3 {
        assert_eq!(
            run(s, &d, &five("a"), end - 10 + i).overall_code,
            Code::Ok as i32
        );
    }
    let r = run(s, &d, &five("a"), end - 1);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 1);
    assert_eq!(
        run(s, &d, &five("a"), end).overall_code,
        Code::Ok as i32,
        "a new window"
    );
    // The sliding one: the previous window's 3 still weigh at the boundary.
    for i in 0..3 {
        assert_eq!(
            run(s, &d, &five("b"), end - 10 + i).overall_code,
            Code::Ok as i32
        );
    }
    assert_eq!(
        run(s, &d, &five("b"), end).overall_code,
        Code::OverLimit as i32
    );
    assert_eq!(
        run(s, &d, &five("b"), end + 150_000).overall_code,
        Code::Ok as i32
    );
    // Another spelling of the window has no rule: answered without a limit.
    let other = call(vec![desc(
        &[("generic_key", "per_300_seconds"), ("tenant", "a")],
        None,
    )]);
    let r = run(s, &d, &other, end);
    assert!(r.statuses[0].current_limit.is_none());
    // 90 days: admitted, with its reset at the next multiple of 90 days.
    let ninety = call(vec![desc(
        &[("generic_key", "per_90_days"), ("tenant", "a")],
        None,
    )]);
    let r = run(s, &d, &ninety, T0);
    let len = 90 * 86_400_000;
    let want = (T0 - T0 % len + len - T0).div_ceil(1_000);
    assert_eq!(
        r.statuses[0].duration_until_reset.unwrap().seconds as u64,
        want
    );
}

/// An admitted request's reset is the window's real reset, never 0: a
/// sliding window with room resets with its current window.
fn an_admitted_reset_is_never_zero(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 10, "window": "sliding"}}}"#);
    let one = call(vec![desc(
        &[("generic_key", "per_minute"), ("tenant", "a")],
        None,
    )]);
    let r = run(s, &d, &one, T0 + 15_000);
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 45);
}

/// Seen once by proptest: one request naming the minute and the hour of
/// one tenant four times adds all its hits to each, decided on their sum.
fn a_request_naming_one_counter_four_times_adds_all_its_hits(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 5, "perhour": 7}}}"#);
    let twice = |descriptors: &mut Vec<RateLimitDescriptor>| {
        descriptors.push(desc(
            &[("generic_key", "per_minute"), ("tenant", "b")],
            Some(2),
        ));
        descriptors.push(desc(
            &[("generic_key", "per_hour"), ("tenant", "b")],
            Some(2),
        ));
    };
    let mut descriptors = Vec::new();
    for _ in 0..4 {
        twice(&mut descriptors);
    }
    let req = call(descriptors);
    assert_eq!(run(s, &d, &req, T0).overall_code, Code::OverLimit as i32);
    let mut descriptors = Vec::new();
    twice(&mut descriptors);
    twice(&mut descriptors);
    let req = call(descriptors);
    let p = plan(Some(&d), &req, T0).unwrap();
    assert_eq!(run(s, &d, &req, T0).overall_code, Code::Ok as i32);
    for c in &p.requests[0].checks {
        assert_eq!(s.value(&c.key, T0), 4);
    }
}

fn never_admits_more_than_the_limit_in_a_window(s: &Under) {
    let steps = proptest::collection::vec((0u64..3_000, 0u64..3), 1..200);
    prop(s, (1u32..20, steps), |(limit, steps)| {
        let d = domain(&format!(
            r#"{{"x-t": {{"default": {{"persecond": {limit}}}}}}}"#
        ));
        let mut now = T0;
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for (dt, hits) in steps {
            now += dt;
            let req = call(vec![desc(
                &[("generic_key", "per_second"), ("tenant", "a")],
                Some(hits),
            )]);
            if run(s, &d, &req, now).overall_code == Code::Ok as i32 {
                *per_window.entry(now / 1_000).or_default() += hits;
            }
        }
        proptest::prop_assert!(per_window.values().all(|&n| n <= u64::from(limit)));
        Ok(())
    });
}

/// Pushes and ordinary requests in one window: the counter holds every
/// pushed hit and the admitted requests' hits, an ordinary request is
/// admitted only when it fits, and the pushes' overshoot adds up to what
/// the count went past the limit.
fn pushes_are_counted_whole_and_their_overshoot_is_the_count_past_the_limit(s: &Under) {
    let steps = proptest::collection::vec((0u64..4, any::<bool>()), 1..40);
    prop(s, steps, |steps| {
        let d = domain(r#"{"x-t": {"default": {"perminute": 5}}}"#);
        let (mut total, mut overshoot) = (0u64, 0u64);
        for (i, (hits, is_push)) in steps.into_iter().enumerate() {
            let now = T0 + i as u64;
            let mark = if is_push { PUSH } else { "" };
            let req = call(vec![
                desc(&[(REQUEST_MARK, mark)], None),
                desc(
                    &[("generic_key", "per_minute"), ("tenant", "a")],
                    Some(hits),
                ),
            ]);
            let p = plan(Some(&d), &req, now).unwrap();
            let decided = s.decide(&p.requests, now);
            let (r, outcomes) = answer(&p, &decided, now);
            let fits = total + hits <= 5 && !(hits == 0 && total >= 5);
            proptest::prop_assert_eq!(decided[0].admitted, is_push || fits);
            if decided[0].admitted {
                total += hits;
            }
            overshoot += outcomes[0].overshoot;
            if is_push {
                // Past the limit (a push of 0 hits checks only: at it).
                let past = total > 5 || (hits == 0 && total == 5);
                proptest::prop_assert_eq!(r.statuses[1].code == Code::OverLimit as i32, past);
                proptest::prop_assert_eq!(
                    u64::from(r.statuses[1].limit_remaining),
                    5u64.saturating_sub(total)
                );
            }
            let key = &p.requests[0].checks[0].key;
            proptest::prop_assert_eq!(s.value(key, now), total);
        }
        proptest::prop_assert_eq!(overshoot, total.saturating_sub(5));
        Ok(())
    });
}

/// Any bytes: decoded or refused, and a decoded call answered with one
/// status per descriptor, never a panic (what fuzz/ will run longer).
fn any_message_is_answered_or_refused(s: &Under) {
    use prost::Message;
    let bytes = proptest::collection::vec(any::<u8>(), 0..400);
    prop(s, (bytes, 0u64..4_102_444_800_000), |(bytes, now)| {
        let d = domain(
            r#"{"x-t": {"default": {"perminute": 2, "permonth": 9, "window": "sliding", "routes": {"r": {"perweek": 1}}}}}"#,
        );
        if let Ok(req) = RateLimitRequest::decode(bytes.as_slice()) {
            if let Ok(p) = plan(Some(&d), &req, now) {
                let decided = s.decide(&p.requests, now);
                let (r, outcomes) = answer(&p, &decided, now);
                proptest::prop_assert_eq!(r.statuses.len(), req.descriptors.len());
                proptest::prop_assert_eq!(outcomes.len(), p.requests.len());
            }
        }
        Ok(())
    });
}

/// Well-formed calls of random shapes: every admitted request's hits are
/// in its counters, and a refused one's nowhere.
fn counters_hold_exactly_what_was_admitted(s: &Under) {
    let calls = proptest::collection::vec(
        proptest::collection::vec((0usize..3, 0u64..3, any::<bool>()), 1..6),
        1..30,
    );
    prop(s, calls, |calls| {
        let d = domain(r#"{"x-t": {"default": {"perminute": 5, "perhour": 7}}}"#);
        let mut admitted_hits: HashMap<String, u64> = HashMap::new();
        for c in calls {
            let mut descriptors = Vec::new();
            let mut last = None;
            for (tenant, hits, mark) in c {
                if new_request(s, mark, last, tenant) {
                    descriptors.push(desc(&[(REQUEST_MARK, "")], None));
                }
                last = Some(tenant);
                let t = ["a", "b", "c"][tenant];
                descriptors.push(desc(
                    &[("generic_key", "per_minute"), ("tenant", t)],
                    Some(hits),
                ));
                descriptors.push(desc(
                    &[("generic_key", "per_hour"), ("tenant", t)],
                    Some(hits),
                ));
            }
            let req = call(descriptors);
            let p = plan(Some(&d), &req, T0).unwrap();
            for (r, decided) in p.requests.iter().zip(s.decide(&p.requests, T0)) {
                if decided.admitted {
                    for ch in &r.checks {
                        *admitted_hits.entry(ch.key.clone()).or_default() += ch.hits;
                    }
                }
            }
        }
        for (k, n) in admitted_hits {
            proptest::prop_assert_eq!(s.value(&k, T0), n);
            proptest::prop_assert!(n <= 7);
        }
        Ok(())
    });
}

/// The over-limit cache in front of a store decides as the store alone
/// (pushes among the requests: never refused by it): the same requests
/// admitted, the same overall codes, the same counts held; a window it
/// answers over is over without it too.
fn the_over_limit_cache_answers_as_the_store_does(s: &Under) {
    let cached = s.with_cache(4);
    let calls = proptest::collection::vec(
        (
            0u64..9_000,
            proptest::collection::vec((0usize..3, 0u64..3, 0usize..3, any::<bool>()), 1..6),
        ),
        1..40,
    );
    prop(s, (any::<bool>(), calls), |(sliding, calls)| {
        cached.fresh();
        let window = if sliding { "sliding" } else { "fixed" };
        let d = domain(&format!(
            r#"{{"x-t": {{"default": {{"persecond": 3, "perminute": 5, "permonth": 9, "window": "{window}"}}}}}}"#
        ));
        let mut now = T0;
        let mut keys = Vec::new();
        for (dt, c) in calls {
            now += dt;
            let mut descriptors = Vec::new();
            let mut last = None;
            for (tenant, hits, mark, month) in c {
                // No mark, a request's, a push's.
                if new_request(s, mark > 0, last, tenant) {
                    descriptors.push(desc(&[(REQUEST_MARK, ["", "", PUSH][mark])], None));
                }
                last = Some(tenant);
                let t = ["a", "b", "c"][tenant];
                descriptors.push(desc(
                    &[("generic_key", "per_second"), ("tenant", t)],
                    Some(hits),
                ));
                descriptors.push(desc(
                    &[("generic_key", "per_minute"), ("tenant", t)],
                    Some(hits),
                ));
                if month {
                    descriptors.push(desc(&[("generic_key", "per_month"), ("tenant", t)], None));
                }
            }
            let req = call(descriptors);
            let p = plan(Some(&d), &req, now).unwrap();
            let alone = s.decide(&p.requests, now);
            let behind_cache = cached.decide(&p.requests, now);
            proptest::prop_assert_eq!(admitted(&alone), admitted(&behind_cache));
            let (r1, _) = answer(&p, &alone, now);
            let (r2, _) = answer(&p, &behind_cache, now);
            proptest::prop_assert_eq!(r1.overall_code, r2.overall_code);
            for (s1, s2) in r1.statuses.iter().zip(&r2.statuses) {
                if s2.code == Code::OverLimit as i32 {
                    proptest::prop_assert_eq!(s1.code, Code::OverLimit as i32);
                }
            }
            for r in &p.requests {
                keys.extend(r.checks.iter().map(|c| c.key.clone()));
            }
            proptest::prop_assert!(cached.remembered() <= 4);
        }
        for k in keys {
            proptest::prop_assert_eq!(s.value(&k, now), cached.value(&k, now));
        }
        Ok(())
    });
}

/// Keys that hold something else than a count, as a push of 2^64-1 once
/// left one, a hand-written string, a hash, a negative or an inexact count:
/// on Redis (the memory store cannot hold one).
fn a_key_that_holds_no_count_fails_its_request_alone(s: &Under) {
    let d = domain(r#"{"x-t": {"default": {"perminute": 5, "perhour": 10}}}"#);
    let mark = || desc(&[(REQUEST_MARK, "")], None);
    let unit =
        |u: &str, t: &str, hits: Option<u64>| desc(&[("generic_key", u), ("tenant", t)], hits);
    let (ok, unknown) = (Code::Ok as i32, Code::Unknown as i32);
    let key = |req: &RateLimitRequest, r: usize, c: usize| {
        plan(Some(&d), req, T0).unwrap().requests[r].checks[c]
            .key
            .clone()
    };
    let poisons: [(&str, &[&str]); 6] = [
        ("SET", &["1.8446744073709552e+19"]),
        ("SET", &["many"]),
        ("HSET", &["f", "1"]),
        ("SET", &["-3"]),
        ("SET", &["9007199254740993"]),
        ("RPUSH", &["1"]),
    ];
    for (i, (command, args)) in poisons.into_iter().enumerate() {
        s.fresh();
        // p's minute then its hour (the hour poisoned), then q's minute
        // and hour, in one call.
        let req = call(vec![
            mark(),
            unit("per_minute", "p", None),
            unit("per_hour", "p", None),
            mark(),
            unit("per_minute", "q", None),
            unit("per_hour", "q", None),
        ]);
        let (p_minute, p_hour, q_minute) = (key(&req, 0, 0), key(&req, 0, 1), key(&req, 1, 0));
        if !s.poison(command, &p_hour, args) {
            return;
        }
        let p = plan(Some(&d), &req, T0).unwrap();
        let decided = s.decide(&p.requests, T0);
        assert!(
            decided[0].failed && !decided[0].admitted,
            "{i}: {decided:?}"
        );
        assert!(
            decided[1].admitted && !decided[1].failed,
            "{i}: {decided:?}"
        );
        let (r, outcomes) = answer(&p, &decided, T0);
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [ok, unknown, unknown, ok, ok, ok], "{i}");
        assert_eq!(r.overall_code, ok);
        assert!(outcomes[0].failed && !outcomes[1].failed);
        // Nothing of p counted (its minute was added to, then undone);
        // q counted once.
        assert_eq!(s.value(&p_minute, T0), 0, "{i}");
        assert_eq!(s.value(&q_minute, T0), 1, "{i}");
        // A check of 0 hits reads the poisoned key (before any add), and
        // a push adds to it: each fails alone.
        let again = call(vec![
            mark(),
            unit("per_hour", "p", Some(0)),
            desc(&[(REQUEST_MARK, PUSH)], None),
            unit("per_hour", "p", Some(3)),
            mark(),
            unit("per_minute", "q", None),
        ]);
        let p = plan(Some(&d), &again, T0 + 1).unwrap();
        let decided = s.decide(&p.requests, T0 + 1);
        assert_eq!(
            decided.iter().map(|d| d.failed).collect::<Vec<_>>(),
            [true, true, false],
            "{i}"
        );
        assert_eq!(s.value(&q_minute, T0 + 1), 2, "{i}");
    }
    // A sliding window's previous counter poisoned: read first, the
    // request fails alone.
    s.fresh();
    let d = domain(r#"{"x-t": {"default": {"perminute": 5, "window": "sliding"}}}"#);
    let req = call(vec![
        mark(),
        unit("per_minute", "p", None),
        mark(),
        unit("per_minute", "q", None),
    ]);
    let p = plan(Some(&d), &req, T0 + 30_000).unwrap();
    let previous = p.requests[0].checks[0].prev_key.clone().unwrap();
    let current = p.requests[0].checks[0].key.clone();
    assert!(s.poison("SET", &previous, &["1.5"]));
    let decided = s.decide(&p.requests, T0 + 30_000);
    assert!(decided[0].failed && decided[1].admitted, "{decided:?}");
    assert_eq!(s.value(&current, T0 + 30_000), 0);
}

test_with_all_stores!(
    a_sliding_group_keeps_its_month_on_the_calendar,
    custom_windows_count_from_multiples_of_their_length,
    an_admitted_reset_is_never_zero,
    a_key_that_holds_no_count_fails_its_request_alone,
    a_push_is_counted_whole_on_every_window_and_answered_with_the_count,
    a_refused_request_adds_nothing_anywhere,
    marks_split_a_call_into_requests_and_get_a_status_of_their_own,
    unknown_domains_and_descriptors_without_a_rule_are_ok_without_a_limit,
    hits_addend_zero_checks_and_a_huge_one_is_refused_without_counting,
    routes_count_apart_and_calendar_windows_end_on_the_calendar,
    a_sliding_window_stops_the_boundary_burst,
    a_request_naming_one_counter_four_times_adds_all_its_hits,
    never_admits_more_than_the_limit_in_a_window,
    pushes_are_counted_whole_and_their_overshoot_is_the_count_past_the_limit,
    any_message_is_answered_or_refused,
    counters_hold_exactly_what_was_admitted,
    the_over_limit_cache_answers_as_the_store_does,
);
