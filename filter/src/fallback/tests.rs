//! The fallback: its arithmetic alone, then in the flow over `MemHost`,
//! then a fleet of three Envoys in front of a simulated service that stops
//! mid-window (the outage targets, without a network).

use prost::Message;

use super::*;
use crate::access_log;
use crate::compiled::Compiled;
use crate::counters::{Counter, GroupCounter};
use crate::flow::Next;
use crate::host::HostCall;
use crate::proto::{Code, RateLimitRequest, RateLimitUnit};
use crate::testing::{answer, compiled, compiled_json, status, Worker};
use proptest::prelude::*;
use serde_json::{json, Value};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The start of a minute (2023-11-14T22:14:00Z).
const MINUTE: u64 = 1_700_000_040_000;

fn params(windows: &[(u64, u32)], envoys: u32, learned: bool) -> Params {
    let mut w = [(1_000, 0); UNITS];
    w[..windows.len()].copy_from_slice(windows);
    Params {
        windows: w,
        units: windows.len(),
        envoys,
        learned,
        fleet: 0,
    }
}

fn heard_remaining(e: Entry, p: &Params, remaining: &[u32], hits: u32, now: u64) -> Entry {
    let statuses = remaining
        .iter()
        .map(|r| status(Code::Ok, 0, RateLimitUnit::Minute, *r, 1))
        .collect();
    let a = crate::answer::decode(0, Some(&answer(Code::Ok, statuses))).unwrap();
    learn(e, p, &a, hits, now)
}

/// Admits requests one at a time at `now` until one is refused.
fn admitted(mut e: Entry, p: &Params, now: u64) -> (u32, Entry, FallbackDecision) {
    let mut n = 0;
    loop {
        match decide(e, p, 1, now) {
            (FallbackDecision::Admit, Some(next)) => {
                e = next;
                n += 1;
            }
            (refused, _) => return (n, e, refused),
        }
    }
}

#[test]
fn without_an_answer_each_envoy_gets_its_share_of_the_limit_per_window() {
    let p = params(&[(60_000, 300)], 3, false);
    let (n, e, refused) = admitted(Entry::empty(1), &p, MINUTE + 10_000);
    assert_eq!(n, 100);
    assert_eq!(refused, FallbackDecision::Refuse { retry_after_s: 50 });
    // A new window: a new share.
    let (n, _, _) = admitted(e, &p, MINUTE + 60_000);
    assert_eq!(n, 100);
}

#[test]
fn in_the_window_of_the_last_answer_it_starts_from_what_the_fleet_had_left() {
    let p = params(&[(60_000, 300)], 3, false);
    // 210 of 300 used by the fleet, as the last answer said.
    let e = heard_remaining(Entry::empty(1), &p, &[90], 1, MINUTE + 20_000);
    let (n, e, _) = admitted(e, &p, MINUTE + 30_000);
    assert_eq!(n, 30);
    assert_eq!(admitted(e, &p, MINUTE + 60_000).0, 100);
    // An over-limit answer leaves nothing.
    let statuses = vec![status(Code::OverLimit, 300, RateLimitUnit::Minute, 0, 1)];
    let a = crate::answer::decode(0, Some(&answer(Code::OverLimit, statuses))).unwrap();
    let over = learn(Entry::empty(1), &p, &a, 1, MINUTE);
    assert_eq!(admitted(over, &p, MINUTE + 1).0, 0);
}

#[test]
fn every_unit_of_the_group_holds_in_its_own_windows() {
    // 30 per second and 300 per minute, 3 Envoys: 10 per second, 100 per
    // minute each.
    let p = params(&[(1_000, 30), (60_000, 300)], 3, false);
    let mut e = Entry::empty(1);
    let mut total = 0;
    for s in 0..15 {
        let (n, next, refused) = admitted(e, &p, MINUTE + s * 1_000);
        total += n;
        e = next;
        if s < 9 {
            assert_eq!(
                (n, refused),
                (10, FallbackDecision::Refuse { retry_after_s: 1 })
            );
        } else {
            // The minute's share is used up: retry when the minute ends.
            assert_eq!(
                refused,
                FallbackDecision::Refuse {
                    retry_after_s: 60 - s
                }
            );
        }
    }
    assert_eq!(total, 100);
}

#[test]
fn months_and_years_are_the_calendars() {
    let day = 86_400_000;
    let at =
        |y, m, d, h: u64| ratelimit_config::window::days_from_civil(y, m, d) * day + h * 3_600_000;
    let month = window::of_unit(ratelimit_config::Unit::Month);
    let year = window::of_unit(ratelimit_config::Unit::Year);
    let p = params(&[(month, 300), (year, 3_000)], 3, false);
    // 31 January 2027, 23:00: the month's share is spent, the retry is at
    // 1 February 00:00, an hour on.
    let (n, e, refused) = admitted(Entry::empty(1), &p, at(2027, 1, 31, 23));
    assert_eq!(n, 100);
    assert_eq!(
        refused,
        FallbackDecision::Refuse {
            retry_after_s: 3_600
        }
    );
    // February: a new month, the year's count carried.
    let (n, e, _) = admitted(e, &p, at(2027, 2, 1, 0));
    assert_eq!((n, e.used), (100, [100, 200, 0, 0, 0, 0]));
    // 28 February 2027 is still February's; 1 March starts a month.
    let (n, e, refused) = admitted(e, &p, at(2027, 2, 28, 12));
    assert_eq!(n, 0);
    assert_eq!(
        refused,
        FallbackDecision::Refuse {
            retry_after_s: 12 * 3_600
        }
    );
    assert_eq!(admitted(e, &p, at(2027, 3, 1, 0)).0, 100);
    // 2028: 28 and 29 February are one month, 1 March the next.
    let (n, e, _) = admitted(Entry::empty(1), &p, at(2028, 2, 28, 0));
    assert_eq!(n, 100);
    let (n, e, refused) = admitted(e, &p, at(2028, 2, 29, 0));
    assert_eq!(n, 0);
    assert_eq!(
        refused,
        FallbackDecision::Refuse {
            retry_after_s: 24 * 3_600
        }
    );
    assert_eq!(admitted(e, &p, at(2028, 3, 1, 0)).0, 100);
    // The year: spent by 31 December, a new one on 1 January.
    let p = params(&[(year, 300)], 1, false);
    let (n, e, refused) = admitted(Entry::empty(1), &p, at(2027, 12, 31, 22));
    assert_eq!(n, 300);
    assert_eq!(
        refused,
        FallbackDecision::Refuse {
            retry_after_s: 2 * 3_600
        }
    );
    assert_eq!(admitted(e, &p, at(2028, 1, 1, 0)).0, 300);
}

#[test]
fn the_learned_share_is_what_this_envoy_sent_of_the_fleets_count() {
    let p = params(&[(60_000, 600)], 3, true);
    let t = MINUTE + 1_000;
    // Too few hits to say anything: the configured share.
    let e = heard_remaining(Entry::empty(1), &p, &[590], 10, t);
    assert_eq!(share(&e, &p), (1, 3));
    // All of the tenant's traffic through this Envoy: the whole limit.
    let pinned = heard_remaining(Entry::empty(1), &p, &[500], 100, t);
    assert_eq!(share(&pinned, &p), (PPM, PPM));
    assert_eq!(admitted(pinned, &p, t).0, 500);
    // A fifth of it: a fifth (over half the configured share).
    let fifth = heard_remaining(Entry::empty(1), &p, &[500], 20, t);
    assert_eq!(share(&fifth, &p), (200_000, PPM));
    // A twentieth: no less than half the configured share.
    let little = heard_remaining(Entry::empty(1), &p, &[200], 20, t);
    assert_eq!(share(&little, &p), (PPM / 6, PPM));
    // The configured share when the option is off.
    assert_eq!(share(&pinned, &params(&[(60_000, 600)], 3, false)), (1, 3));
}

#[test]
fn the_learned_share_carries_over_windows_with_the_older_ones_halved() {
    let p = params(&[(60_000, 600)], 3, true);
    // A window where it sent everything.
    let mut e = heard_remaining(Entry::empty(1), &p, &[500], 100, MINUTE + 1_000);
    // The next window's first answer folds it in; too few hits yet.
    e = heard_remaining(e, &p, &[595], 5, MINUTE + 61_000);
    assert_eq!((e.share_ppm, e.own), (1_000_000, 5));
    assert_eq!(share(&e, &p), (PPM, PPM));
    // Now a third of the window's 60 hits: halfway between.
    e = heard_remaining(e, &p, &[540], 15, MINUTE + 62_000);
    assert_eq!(share(&e, &p), (666_666, PPM));
    // An outage: no answer for minutes, the share stays what was learned.
    let (n, _, _) = admitted(e, &p, MINUTE + 300_000);
    assert_eq!(n, 399);
}

#[test]
fn an_entry_is_one_tenants_and_passes_on_when_left_alone() {
    let theirs = Entry {
        spent_ms: MINUTE,
        ..Entry::empty(1)
    }
    .encode();
    assert_eq!(Entry::claim(Some(&theirs), 2, MINUTE + HOLD_MS - 1), None);
    assert_eq!(
        Entry::claim(Some(&theirs), 2, MINUTE + HOLD_MS),
        Some(Entry::empty(2))
    );
    assert_eq!(
        Entry::claim(Some(&[0; ENTRY_BYTES]), 2, 0),
        Some(Entry::empty(2))
    );
    assert_eq!(Entry::claim(None, 2, 0), Some(Entry::empty(2)));
}

proptest! {
    #[test]
    fn entries_round_trip(fp in any::<u64>(), t in any::<u64>(), r in any::<[u32; 6]>(),
                          u in any::<[u32; 6]>(), own in any::<u32>(), ppm in any::<u32>()) {
        let e = Entry { fingerprint: fp, heard_ms: t, remaining: r, spent_ms: t / 3, used: u, own, share_ppm: ppm };
        prop_assert_eq!(Entry::decode(&e.encode()), Some(e));
    }

    #[test]
    fn any_bytes_decode_without_panicking(b in prop::collection::vec(any::<u8>(), 0..100)) {
        let _ = Entry::claim(Some(&b), 3, 0);
    }

    /// However the requests come, an Envoy alone never admits more than its
    /// share of what the fleet had left, per window.
    #[test]
    fn never_more_than_the_share(remaining in 0u32..1_000, envoys in 1u32..10,
                                 steps in prop::collection::vec((0u64..5_000, 1u32..4), 1..200)) {
        let p = params(&[(60_000, 1_000)], envoys, false);
        let mut e = heard_remaining(Entry::empty(1), &p, &[remaining], 1, MINUTE);
        let (mut now, mut got) = (MINUTE, 0u32);
        for (dt, cost) in steps {
            now += dt;
            if now >= MINUTE + 60_000 { break; }
            if let (FallbackDecision::Admit, Some(next)) = decide(e, &p, cost, now) {
                e = next;
                got += cost;
            }
        }
        prop_assert!(got <= remaining / envoys, "{} > {}", got, remaining / envoys);
    }
}

// ------------------------------------------------------------ in the flow

const TENANT: &str = "tenant-a";

fn local_config(extra: Value) -> Compiled {
    local_config_with(json!({"envoys": 3}), extra)
}

fn local_config_with(fallback: Value, extra: Value) -> Compiled {
    let base = json!({"domain": "d", "rate_limit_service": {"cluster": "rl", "timeout_ms": 300},
        "limits": {"x-tenant-id": {"default": {"perminute": 300},
                                   "gold": {"perminute": 300, "header_value": ["gold-a"], "shadow": true}}},
        "on_failure": "local", "fallback": fallback});
    compiled_json(base, extra)
}

fn worker(c: &Compiled, now: u64) -> Worker {
    let w = Worker::ready(c, now);
    crate::root::prepare_failure(&w, c);
    w
}

/// The service, simulated: one counter per tenant and minute window,
/// counting every call's hits as envoyproxy/ratelimit does; `up` false: it
/// is stopped, and calls fail (gRPC 14).
#[derive(Default)]
struct Service {
    up: bool,
    counts: std::collections::HashMap<(String, u64), u32>,
    limit: u32,
    /// The fleet's size it answers (ratelimit-counter's); 0: none
    /// (envoyproxy/ratelimit's).
    fleet: u32,
}

impl Service {
    fn new(limit: u32) -> Service {
        Service {
            up: true,
            limit,
            ..Service::default()
        }
    }

    /// The gRPC status and body of the answer to `call`, at `now`.
    fn reply(&mut self, call: &crate::testing::Call, now: u64) -> (u32, Vec<u8>) {
        if !self.up {
            return (14, Vec::new());
        }
        let req = RateLimitRequest::decode(&call.message[..]).unwrap();
        let tenant = req.descriptors[0].entries[1].value.clone();
        let hits = req.hits_addend.max(1);
        let count = self.counts.entry((tenant, now / 60_000)).or_default();
        *count += hits;
        let code = if *count > self.limit {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let left = self.limit.saturating_sub(*count);
        let reset = 60 - (now / 1_000) % 60;
        let statuses = vec![status(
            code,
            self.limit,
            RateLimitUnit::Minute,
            left,
            reset as i64,
        )];
        let mut r = crate::proto::RateLimitResponse::decode(&answer(code, statuses)[..]).unwrap();
        r.fleet_envoys = self.fleet;
        (0, r.encode_to_vec())
    }

    /// Answers the last call `w` made, to its stream.
    fn answer(&mut self, w: &Worker, s: &mut crate::flow::Stream, c: &Compiled) {
        let call = w.calls().pop().unwrap();
        let (grpc, body) = self.reply(&call, w.now_ms());
        w.set_grpc_response(Some(body.clone()));
        w.answer_call(c, call.token, grpc, body.len(), &mut [s]);
    }

    /// The root's tick, and the answers to the calls it sent.
    fn tick(&mut self, w: &Worker, root: &mut crate::root::Root, c: &Compiled) {
        let before = w.call_count() as usize;
        root.on_tick(c, w, &w.vm);
        for call in w.calls().into_iter().skip(before) {
            let (grpc, body) = self.reply(&call, w.now_ms());
            w.set_grpc_response(Some(body.clone()));
            root.on_answer(c, w, &w.vm, call.token, grpc, body.len());
        }
    }
}

/// One request of `tenant` through `w`, with the service's answer when it
/// calls; whether it was admitted.
fn send(c: &Compiled, w: &Worker, service: &mut Service, tenant: &str) -> bool {
    let replies = w.reply_count();
    let calls = w.call_count();
    let (mut s, next) = w.request(c, tenant);
    if next == Next::Pause && w.call_count() > calls {
        service.answer(w, &mut s, c);
    }
    w.reply_count() == replies
}

#[test]
fn a_failed_call_and_an_open_breaker_get_the_tenants_share() {
    let c = local_config(json!({}));
    let w = worker(&c, MINUTE + 1_000);
    let mut service = Service::new(300);
    // 60 admitted by the service: the fleet has 240 left.
    for _ in 0..60 {
        assert!(send(&c, &w, &mut service, TENANT));
    }
    service.up = false;
    let mut got = 0;
    for _ in 0..200 {
        got += u32::from(send(&c, &w, &mut service, TENANT));
    }
    // A third of the 240 left: the first 5 failed calls, then the breaker.
    assert_eq!(got, 80);
    assert_eq!(w.counter(Counter::RlsError), 5);
    assert_eq!(w.counter(Counter::BreakerSkipped), 195);
    assert_eq!(w.counter(Counter::FallbackAllowed), 80);
    assert_eq!(w.counter(Counter::FallbackOverLimit), 120);
    assert_eq!(w.counter(Counter::FailureModeAllowed), 0);
    assert_eq!(w.group_counter(0, GroupCounter::FallbackAdmitted), 80);
    assert_eq!(w.group_counter(0, GroupCounter::FallbackRefused), 120);
    assert_eq!(w.group_counter(0, GroupCounter::Admitted), 140);
    // A refusal: 429, retry when the minute ends, source fallback.
    let r = w.replies().pop().unwrap();
    assert_eq!((r.status, r.header("retry-after")), (429, Some("59")));
    let props = w.properties();
    assert!(props.contains(&(access_log::SOURCE.into(), "fallback".into())));
    assert!(props.contains(&(access_log::VERDICT.into(), "admitted".into())));
    assert!(props.contains(&(access_log::VERDICT.into(), "refused".into())));
}

#[test]
fn a_shadow_group_only_counts_the_fallbacks_refusals() {
    let c = local_config(json!({}));
    let w = worker(&c, MINUTE + 1_000);
    let mut service = Service::new(300);
    service.up = false;
    let mut got = 0;
    for _ in 0..150 {
        got += u32::from(send(&c, &w, &mut service, "gold-a"));
    }
    assert_eq!(got, 150);
    assert_eq!(w.group_counter(1, GroupCounter::FallbackAdmitted), 100);
    assert_eq!(w.group_counter(1, GroupCounter::ShadowRefusedFallback), 50);
    assert_eq!(w.counter(Counter::FallbackOverLimit), 0);
}

#[test]
fn without_its_entry_a_request_fails_open() {
    let c = local_config(json!({}));
    let w = worker(&c, MINUTE + 1_000);
    let mut service = Service::new(300);
    service.up = false;
    w.interfere(u32::MAX, |stored| {
        stored.map(<[u8]>::to_vec).unwrap_or_default()
    });
    assert!(send(&c, &w, &mut service, TENANT));
    assert_eq!(w.counter(Counter::FailureModeAllowed), 1);
    w.set_interference(0);
    w.fail(HostCall::SetShared);
    assert!(send(&c, &w, &mut service, TENANT));
    assert_eq!(w.counter(Counter::FailureModeAllowed), 2);
}

#[test]
fn entries_are_created_at_configure_only_for_local() {
    let c = local_config(json!({"local": {"slots": 8}}));
    let w = worker(&c, MINUTE);
    let keys = w.shared_keys();
    assert_eq!(keys.iter().filter(|k| k.starts_with("trl.fb.")).count(), 8);
    let allow = compiled(
        r#"{"domain": "d", "rate_limit_service": {"cluster": "rl"},
            "limits": {"x-tenant-id": {"default": {"perminute": 5}}}, "local": {"slots": 8}}"#,
    );
    let w = worker(&allow, MINUTE);
    assert!(!w.shared_keys().iter().any(|k| k.starts_with("trl.fb.")));
}

#[test]
fn lease_groups_spend_their_lease_then_the_fallback() {
    let c = local_config(json!({"local": {"mode": "lease", "lease": {"max_batch": 50}}}));
    let w = worker(&c, MINUTE + 1_000);
    let mut service = Service::new(300);
    // Two seconds of traffic: the rate is known, leases of 50 are held.
    let mut root = crate::root::Root::default();
    for i in 0..200u64 {
        w.set_now_ms(MINUTE + 1_000 + i * 10);
        send(&c, &w, &mut service, TENANT);
        service.tick(&w, &mut root, &c);
    }
    let spent_before = w.group_counter(0, GroupCounter::LeaseSpent);
    service.up = false;
    let mut got = 0;
    for _ in 0..300 {
        got += u32::from(send(&c, &w, &mut service, TENANT));
        service.tick(&w, &mut root, &c);
    }
    let spent = w.group_counter(0, GroupCounter::LeaseSpent) - spent_before;
    let fallback = w.group_counter(0, GroupCounter::FallbackAdmitted);
    assert!(spent > 0, "the lease left was spent first");
    assert_eq!(got as u64, spent + fallback);
    // The refills the open breaker kept in were settled as failed.
    assert!(w.counter(Counter::BreakerSkipped) > 0);
    assert!(w.group_counter(0, GroupCounter::LeasesFailed) > 0);
    // The fallback started from what the service had left at its last
    // answer (which counted the lease): at most a third of it.
    assert!(fallback <= 100, "{fallback}");
}

// ------------------------------------------------------------ a fleet

/// Three Envoys with `extra` settings; clients send 3 × the quota per
/// minute, spread over `envoys` of them; the service stops 10 s into the
/// second minute and stays down. Admitted per minute, from the first.
fn outage(fallback: Value, spread_over: usize) -> Vec<u32> {
    outage_of(fallback, 3, spread_over, 0)
}

/// `outage` with `envoys` Envoys, the service answering `fleet` as the
/// fleet's size (0: none).
fn outage_of(fallback: Value, envoys: usize, spread_over: usize, fleet_answered: u32) -> Vec<u32> {
    const QUOTA: u32 = 300;
    let c = local_config_with(fallback, json!({}));
    let fleet: Vec<Worker> = (0..envoys).map(|_| worker(&c, MINUTE)).collect();
    let mut service = Service::new(QUOTA);
    service.fleet = fleet_answered;
    let per_minute = 3 * u64::from(QUOTA);
    let mut admitted = vec![0; 4];
    for i in 0..4 * per_minute {
        let now = MINUTE + i * 60_000 / per_minute;
        service.up = now < MINUTE + 70_000;
        let w = &fleet[(i as usize) % spread_over];
        w.set_now_ms(now);
        if send(&c, w, &mut service, TENANT) {
            admitted[((now - MINUTE) / 60_000) as usize] += 1;
        }
    }
    admitted
}

#[test]
fn with_the_configured_share_the_fleet_stays_near_the_quota_through_an_outage() {
    let admitted = outage(json!({"envoys": 3}), 3);
    println!("admitted per minute, quota 300, 900 sent: {admitted:?}");
    // The first minute: the service decides, exactly. Then the outage's
    // first minute (the fleet had used most of it by the last answer) and
    // two whole minutes of it: never more than the quota, and not far under.
    assert_eq!(admitted[0], 300);
    for (m, n) in admitted.iter().enumerate().skip(1) {
        assert!((270..=300).contains(n), "minute {m}: {admitted:?}");
    }
}

#[test]
fn a_tenant_pinned_to_one_envoy_keeps_its_quota_only_with_the_learned_share() {
    let configured = outage(json!({"envoys": 3}), 1);
    let learned = outage(json!({"envoys": 3, "share": "learned"}), 1);
    println!("pinned: configured share {configured:?}, learned {learned:?}");
    assert_eq!(configured[0], 300);
    // The whole minutes of the outage: a third, or the whole quota.
    assert_eq!(&configured[2..], [100, 100]);
    assert_eq!(&learned[2..], [300, 300]);
}

#[test]
fn the_fallback_logs_the_verified_tenant_not_the_header() {
    let c = local_config(
        json!({"tenant_source": {"property": ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "tenant"]}}),
    );
    let w = worker(&c, MINUTE + 1_000);
    let mut service = Service::new(300);
    service.up = false;
    w.set_request_header("x-tenant-id", b"victim");
    w.fail(HostCall::RequestHeader);
    let jwt = "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0tenant";
    w.set_attribute(jwt, TENANT.as_bytes());
    let mut verdicts = Vec::new();
    for _ in 0..200 {
        w.clear_properties();
        let calls = w.call_count();
        let mut s = w.stream();
        if s.on_request_headers(&c, &w, &w.vm) == Next::Pause && w.call_count() > calls {
            service.answer(&w, &mut s, &c);
        }
        let props = w.properties();
        assert!(
            props.contains(&(access_log::TENANT.into(), TENANT.into())),
            "{props:?}"
        );
        verdicts.extend(props.into_iter().filter(|(k, _)| k == access_log::VERDICT));
    }
    assert!(verdicts.contains(&(access_log::VERDICT.into(), "admitted".into())));
    assert!(verdicts.contains(&(access_log::VERDICT.into(), "refused".into())));
}

#[test]
fn the_share_follows_the_fleet_size_the_counter_answered() {
    // Six Envoys configured for two: a third of the fleet each would admit
    // three times the quota; told the fleet is six, they hold it.
    let told = outage_of(json!({"envoys": 2}), 6, 6, 6);
    let static_share = outage_of(json!({"envoys": 2}), 6, 6, 0);
    println!("6 Envoys, envoys: 2: told 6 {told:?}, told nothing {static_share:?}");
    assert_eq!(told[0], 300);
    for (m, n) in told.iter().enumerate().skip(1) {
        assert!((270..=300).contains(n), "minute {m}: {told:?}");
    }
    // Told nothing (envoyproxy/ratelimit): 1/2 each, 3 times the quota in
    // the whole minutes of the outage.
    assert_eq!(&static_share[2..], [900, 900]);
    // The learned share keeps working on top: a tenant pinned to one of
    // six Envoys keeps its quota.
    let pinned = outage_of(json!({"envoys": 2, "share": "learned"}), 6, 1, 6);
    assert_eq!(&pinned[2..], [300, 300]);
    // And without it, a pinned tenant gets 1/6.
    let pinned = outage_of(json!({"envoys": 2}), 6, 1, 6);
    assert_eq!(&pinned[2..], [50, 50]);
}

#[test]
fn the_fleet_size_heard_replaces_the_configured_one_until_another_is_heard() {
    let c = local_config(json!({}));
    let w = worker(&c, MINUTE);
    let p = c
        .fallback(crate::testing::group_id(&c, "default").unwrap())
        .unwrap();
    assert_eq!(p.envoys, 3);
    assert_eq!(p.with_fleet(crate::fleet::held(&w, p.fleet)).envoys, 3);
    let mut service = Service::new(300);
    service.fleet = 6;
    assert!(send(&c, &w, &mut service, TENANT));
    assert_eq!(crate::fleet::held(&w, p.fleet), Some(6));
    assert_eq!(w.gauge(crate::counters::Gauge::FleetEnvoys), 6);
    // Back to 2, a second later (a smaller fleet is written at once).
    service.fleet = 2;
    w.set_now_ms(MINUTE + 10);
    assert!(send(&c, &w, &mut service, TENANT));
    assert_eq!(crate::fleet::held(&w, p.fleet), Some(2));
    // An answer without a size (envoyproxy/ratelimit) keeps the last one.
    service.fleet = 0;
    assert!(send(&c, &w, &mut service, TENANT));
    assert_eq!(crate::fleet::held(&w, p.fleet), Some(2));
    assert_eq!(p.with_fleet(Some(2)).envoys, 2);
}
