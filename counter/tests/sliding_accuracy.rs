//! How exact the counter's sliding window is, against an exact sliding
//! log, on a replayed synthetic trace (docs/configuration.md, "How exact
//! a sliding window is").
//!
//! Many tenants, each its own group with a sliding `persecond` (limits 2
//! to 10) or `perminute` (limits 20 to 200), send one of four shapes of
//! traffic: steady at their limit, steady at 0.9 of it, bursty (on at 3x
//! the limit's rate, then off), and at twice their limit (Poisson). The
//! trace is generated from a fixed seed, merged in time order and replayed
//! through the counter's own decision (`decide::plan`, the memory store's
//! `decide_now`) on a clock the test sets. Each decision is judged by an
//! exact log of what the counter admitted: a request the counter admitted
//! is wrongly admitted when the admitted requests in `(t - L, t]`, itself
//! included, are more than the limit; one it refused is wrongly refused
//! when they, with it, would have been at most the limit. An exact
//! sliding-log limiter run alone on the same trace gives the throughput
//! the counter is compared with.
//!
//! `cargo test -p ratelimit-counter --test sliding_accuracy -- --nocapture`
//! prints the figures; `TRL_ACCURACY_SCALE=10` (and `--release`) replays a
//! trace ten times as long.

// A test: a failed expectation is a failed test.
#![allow(clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
use std::collections::{HashMap, VecDeque};

use ratelimit_config::validate::parse_team_limits_for;
use ratelimit_config::window::window_at;
use ratelimit_config::{Service, Unit};
use ratelimit_counter::decide::{plan, Domain};
use ratelimit_counter::proto::{Entry, RateLimitDescriptor, RateLimitRequest};
use ratelimit_counter::store::memory::MemoryStore;

/// splitmix64: a small, seeded, deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// An exponential gap of mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Shape {
    AtLimit,
    Below,
    Bursty,
    Double,
}

impl Shape {
    const ALL: [Shape; 4] = [Shape::AtLimit, Shape::Below, Shape::Bursty, Shape::Double];

    fn name(self) -> &'static str {
        match self {
            Shape::AtLimit => "steady at the limit",
            Shape::Below => "steady at 0.9x",
            Shape::Bursty => "bursty (on 3x / off)",
            Shape::Double => "twice the limit",
        }
    }
}

struct Tenant {
    name: String,
    shape: Shape,
    unit: Unit,
    limit: u64,
    /// The window's length, ms.
    len: u64,
}

/// When one tenant sends, in ms from `start`, over `windows` of its windows.
fn arrivals(t: &Tenant, rng: &mut Rng, start: u64, windows: u64) -> Vec<u64> {
    let end = start + windows * t.len;
    let gap = t.len as f64 / t.limit as f64;
    let mut out = Vec::new();
    match t.shape {
        Shape::AtLimit | Shape::Below => {
            // Evenly spaced from a random phase, each moved by up to a
            // tenth of the gap.
            let gap = if t.shape == Shape::Below {
                gap / 0.9
            } else {
                gap
            };
            let mut at = start as f64 + rng.unit() * gap;
            while at < end as f64 {
                let jitter = (rng.unit() - 0.5) * 0.2 * gap;
                out.push((at + jitter).max(start as f64) as u64);
                at += gap;
            }
        }
        Shape::Bursty => {
            let mut at = start as f64 + rng.unit() * t.len as f64;
            while at < end as f64 {
                let on_until = at + (0.2 + 0.8 * rng.unit()) * t.len as f64;
                while at < on_until && at < end as f64 {
                    out.push(at as u64);
                    at += rng.exp(gap / 3.0);
                }
                at = on_until + (0.5 + 2.5 * rng.unit()) * t.len as f64;
            }
        }
        Shape::Double => {
            let mut at = start as f64 + rng.exp(gap / 2.0);
            while at < end as f64 {
                out.push(at as u64);
                at += rng.exp(gap / 2.0);
            }
        }
    }
    out.sort_unstable();
    out
}

/// An exact sliding log: the instants of what was admitted in the last
/// window.
#[derive(Default)]
struct Log(VecDeque<u64>);

impl Log {
    /// The admitted requests in `(now - len, now]`.
    fn count(&mut self, now: u64, len: u64) -> u64 {
        while self.0.front().is_some_and(|&t| t + len <= now) {
            self.0.pop_front();
        }
        self.0.len() as u64
    }
}

#[derive(Default, Clone, Copy)]
struct Row {
    tenants: u64,
    requests: u64,
    admitted: u64,
    log_admitted: u64,
    wrongly_admitted: u64,
    wrongly_refused: u64,
    /// The most admitted in any sliding window, over the limit (permille).
    worst_permille: u64,
    /// Fixed windows that counted more than their limit.
    fixed_over: u64,
}

fn pct(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        100.0 * n as f64 / of as f64
    }
}

/// Replays the trace; the figures per shape and unit.
fn replay(seed: u64, per_kind: u64, windows: u64) -> Vec<((Shape, Unit), Row)> {
    let mut rng = Rng(seed);
    let mut tenants = Vec::new();
    for shape in Shape::ALL {
        for unit in [Unit::Second, Unit::Minute] {
            for _ in 0..per_kind {
                let limit = match unit {
                    Unit::Second => rng.range(2, 10),
                    _ => rng.range(20, 200),
                };
                // The window's length from the window functions.
                let (s, e) = window_at(unit, 0);
                tenants.push(Tenant {
                    name: format!("t{}", tenants.len()),
                    shape,
                    unit,
                    limit,
                    len: e - s,
                });
            }
        }
    }
    // One group per tenant, sliding.
    let mut groups = serde_json::Map::new();
    for t in &tenants {
        groups.insert(
            format!("g_{}", t.name),
            serde_json::json!({
                t.unit.json_key(): t.limit,
                "window": "sliding",
                "header_value": [t.name],
            }),
        );
    }
    let doc = serde_json::json!({ "x-tenant-id": groups });
    let (limits, _) = parse_team_limits_for(&doc, "", Service::Counter).expect("a valid team file");
    let domain = Domain {
        limits,
        descriptor_key: "tenant".into(),
    };
    // 2026-12-05T00:00:07.123Z: not on a boundary.
    let start = 1_796_428_807_123;
    let mut trace: Vec<(u64, usize)> = Vec::new();
    for (i, t) in tenants.iter().enumerate() {
        trace.extend(
            arrivals(t, &mut rng, start, windows)
                .into_iter()
                .map(|at| (at, i)),
        );
    }
    trace.sort_unstable();

    let store = MemoryStore::new(usize::MAX / 2);
    let mut logs: Vec<Log> = tenants.iter().map(|_| Log::default()).collect();
    let mut alone: Vec<Log> = tenants.iter().map(|_| Log::default()).collect();
    let mut fixed: HashMap<(usize, u64), u64> = HashMap::new();
    let mut rows: HashMap<(Shape, Unit), Row> = HashMap::new();
    for t in &tenants {
        rows.entry((t.shape, t.unit)).or_default().tenants += 1;
    }
    for &(now, i) in &trace {
        let t = &tenants[i];
        let row = rows.get_mut(&(t.shape, t.unit)).expect("a row per kind");
        row.requests += 1;
        let req = RateLimitRequest {
            domain: "accuracy".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "generic_key".into(),
                        value: t.unit.descriptor_value().into(),
                    },
                    Entry {
                        key: "tenant".into(),
                        value: t.name.clone(),
                    },
                ],
                hits_addend: None,
            }],
            hits_addend: 0,
        };
        let p = plan(Some(&domain), &req, now).expect("a call within the bounds");
        assert_eq!(p.requests.len(), 1);
        assert!(p.requests[0].checks[0].sliding);
        let decided = store
            .decide_now(&p.requests, now)
            .expect("the store decides");
        let admitted = decided[0].admitted;
        let before = logs[i].count(now, t.len);
        if admitted {
            row.admitted += 1;
            logs[i].0.push_back(now);
            if before + 1 > t.limit {
                row.wrongly_admitted += 1;
            }
            row.worst_permille = row.worst_permille.max((before + 1) * 1_000 / t.limit);
            let n = fixed.entry((i, window_at(t.unit, now).0)).or_default();
            *n += 1;
            if *n > t.limit {
                row.fixed_over += 1;
            }
        } else if before < t.limit {
            row.wrongly_refused += 1;
        }
        // The exact limiter alone.
        if alone[i].count(now, t.len) < t.limit {
            alone[i].0.push_back(now);
            row.log_admitted += 1;
        }
    }
    let mut out: Vec<_> = rows.into_iter().collect();
    out.sort_by_key(|((s, u), _)| (*s, *u));
    out
}

fn table(rows: &[((Shape, Unit), Row)]) -> String {
    let mut out = String::from(
        "| traffic | window | tenants | requests | admitted (counter) | admitted (exact log alone) | wrongly admitted | wrongly refused | most in any sliding window |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut total = Row::default();
    for ((shape, unit), r) in rows {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {:.3}% | {:.3}% | {:.2}x the limit |\n",
            shape.name(),
            match unit {
                Unit::Second => "sliding second, limit 2-10",
                _ => "sliding minute, limit 20-200",
            },
            r.tenants,
            r.requests,
            r.admitted,
            r.log_admitted,
            pct(r.wrongly_admitted, r.requests),
            pct(r.wrongly_refused, r.requests),
            r.worst_permille as f64 / 1_000.0,
        );
        total.requests += r.requests;
        total.wrongly_admitted += r.wrongly_admitted;
        total.wrongly_refused += r.wrongly_refused;
    }
    out += &format!(
        "\nall: {} requests, {:.3}% wrongly admitted, {:.3}% wrongly refused, {:.3}% either\n",
        total.requests,
        pct(total.wrongly_admitted, total.requests),
        pct(total.wrongly_refused, total.requests),
        pct(
            total.wrongly_admitted + total.wrongly_refused,
            total.requests
        ),
    );
    out
}

#[test]
fn the_sliding_estimate_against_an_exact_log() {
    let scale: u64 = std::env::var("TRL_ACCURACY_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let rows = replay(0x5EED_2026, 50, 20 * scale);
    println!("{}", table(&rows));
    for ((shape, unit), r) in &rows {
        let what = format!("{} / {unit:?}", shape.name());
        assert!(r.requests > 0, "{what}");
        // Each fixed window of the counter holds at most its limit: the
        // estimate is never below the current window's count.
        assert_eq!(r.fixed_over, 0, "{what}");
        // Hence no sliding window of length L ever holds more than twice
        // the limit (it spans two fixed windows).
        assert!(r.worst_permille <= 2_000, "{what}");
        let admitted = pct(r.wrongly_admitted, r.requests);
        let refused = pct(r.wrongly_refused, r.requests);
        match (shape, unit) {
            // Below the limit, no window of length L ever holds more than
            // the limit, and large limits refuse nothing the exact log
            // admits; small ones lose to the rounding up (L - 1).
            (Shape::Below, Unit::Second) => {
                assert_eq!(r.wrongly_admitted, 0, "{what}");
                assert!(refused < 15.0, "{what}: {refused}");
            }
            (Shape::Below, _) => {
                assert_eq!(r.wrongly_admitted, 0, "{what}");
                assert!(refused < 1.0, "{what}: {refused}");
            }
            // At and over the limit the estimate errs both ways (bursts
            // that end a window are underestimated in the next), within
            // these bounds.
            _ => {
                assert!(admitted < 10.0, "{what}: {admitted}");
                assert!(refused < 50.0, "{what}: {refused}");
            }
        }
        // It admits at least half of what an exact limiter would.
        assert!(r.admitted * 2 >= r.log_admitted, "{what}");
    }
}

/// The counter's admissions per window to one client that sends evenly at
/// `rate_per_s` against a sliding `persecond` of `limit`, over `secs`.
fn steady_client(limit: u64, rate_per_s: u64, secs: u64) -> Vec<u64> {
    let doc =
        serde_json::json!({"x-tenant-id": {"default": {"persecond": limit, "window": "sliding"}}});
    let (limits, _) = parse_team_limits_for(&doc, "", Service::Counter).expect("a valid team file");
    let domain = Domain {
        limits,
        descriptor_key: "tenant".into(),
    };
    let store = MemoryStore::new(1_000);
    let start = 1_796_428_807_000;
    let mut per_window = vec![0; secs as usize];
    let gap = 1_000 / rate_per_s;
    for k in 0..secs * rate_per_s {
        let now = start + 3 + k * gap;
        let req = RateLimitRequest {
            domain: "steady".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "generic_key".into(),
                        value: "per_second".into(),
                    },
                    Entry {
                        key: "tenant".into(),
                        value: "a".into(),
                    },
                ],
                hits_addend: None,
            }],
            hits_addend: 0,
        };
        let p = plan(Some(&domain), &req, now).expect("a call within the bounds");
        if store.decide_now(&p.requests, now).expect("decided")[0].admitted {
            per_window[((now - start) / 1_000) as usize] += 1;
        }
    }
    per_window
}

#[test]
fn a_steady_client_over_a_small_limit_gets_l_minus_1_per_window() {
    // The case: a client at 5/s against a sliding 2/s.
    let two = steady_client(2, 5, 60);
    println!(
        "sliding 2/s, client at 5/s, 60 s: {} admitted, per second {:?}",
        two.iter().sum::<u64>(),
        two
    );
    assert_eq!(
        two[0], 2,
        "the first window, after an empty one, admits the limit"
    );
    assert!(two[1..].iter().all(|&n| n == 1), "{two:?}");
    for limit in 3..=10 {
        let got = steady_client(limit, 5 * limit, 30);
        println!(
            "sliding {limit}/s, client at {}/s: per second {got:?}",
            5 * limit
        );
        // After a window that admitted some, the previous window's
        // weighted count rounds up to at least 1 until the window's last
        // instant: at most L - 1 fit.
        assert!(got[1..].iter().all(|&n| n < limit), "{limit}: {got:?}");
    }
}
