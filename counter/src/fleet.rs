//! The fleet's size, per domain: how many Envoys called for it in the last
//! interval (`--fleet-interval-ms`). The filter names its Envoy in every
//! call (gRPC metadata [`ENVOY_ID_HEADER`], one id per Envoy process) and
//! its local fallback gives each Envoy `1 / N` of every limit while the
//! service cannot answer: the counter answers that `N` with every call
//! that names its Envoy ([`crate::proto::RateLimitResponse::fleet_envoys`]).
//!
//! Each replica keeps the Envoys it heard (`Fleet`: an id and when it last
//! called, per domain). With a Redis store the replicas pool what they
//! heard, so that the size is the fleet's and not one replica's callers: a
//! sorted set per domain (`store::fleet::key`: member the Envoy id, score when it last
//! called), written by each replica once a second (`store::fleet::sync_redis`: the ids it heard
//! since its last write, then the members older than the interval dropped,
//! then the set's size read, all in one pipeline, off the request path).
//! A call is answered from memory: the larger of the last size read from
//! Redis and the replica's own count (an Envoy first heard since is
//! counted at once). With the memory store (one replica) the size is the
//! replica's own count.
//!
//! Bounded: only domains the team files serve are kept, at most
//! [`MAX_ENVOYS`] ids each; an id not heard within the interval goes.

use std::collections::HashMap;
use std::sync::Mutex;

pub use crate::proto::{ENVOY_ID_HEADER, MAX_ENVOY_ID_BYTES};
use crate::store::fleet::Sync;

/// The interval by default: an Envoy that has not called in it is not
/// counted.
pub const DEFAULT_INTERVAL_MS: u64 = 30_000;

/// How often a replica writes what it heard to Redis and reads the size.
pub const SYNC_MS: u64 = 1_000;

/// A size read from Redis is used for this long after it was read; then
/// (Redis unreachable) the replica's own count alone.
pub const SHARED_FRESH_MS: u64 = 3 * SYNC_MS;

/// The most Envoys counted per domain (per replica, and per sorted set).
pub const MAX_ENVOYS: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    /// When it last called.
    last_ms: u64,
    /// `last_ms` as last written to Redis (0: never).
    written_ms: u64,
}

#[derive(Debug, Default)]
struct Domain {
    seen: HashMap<String, Seen>,
    /// The size last read from Redis, and when.
    shared: Option<(u32, u64)>,
    /// How many of `seen` called within the interval, as of the last
    /// recount, plus those first heard since.
    own: usize,
    /// When the first of `seen` leaves the interval: the next recount (a
    /// call does not scan every Envoy, only one at or after this instant).
    recount_at: u64,
}

impl Domain {
    /// Drops the Envoys not heard within the interval, when one may have
    /// left it: `own` is then exact.
    fn recount(&mut self, now_ms: u64, interval_ms: u64) {
        if now_ms < self.recount_at {
            return;
        }
        let cut = since(now_ms, interval_ms);
        self.seen.retain(|_, s| s.last_ms > cut);
        self.own = self.seen.len();
        self.recount_at = (self.seen.values().map(|s| s.last_ms).min())
            .map_or(u64::MAX, |oldest| oldest.saturating_add(interval_ms));
    }
}

/// The Envoys each domain heard, on this replica.
#[derive(Debug)]
pub struct Fleet {
    interval_ms: u64,
    domains: Mutex<HashMap<String, Domain>>,
}

fn since(now_ms: u64, interval_ms: u64) -> u64 {
    now_ms.saturating_sub(interval_ms)
}

impl Fleet {
    pub fn new(interval_ms: u64) -> Fleet {
        Fleet {
            interval_ms: interval_ms.max(1),
            domains: Mutex::default(),
        }
    }

    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Domain>> {
        self.domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A call of Envoy `id` for `domain` (a domain the team files serve)
    /// at `now_ms`: counted; returns the fleet's size to answer (at least
    /// 1: this Envoy). Names are copied only the first time they are seen;
    /// an id over [`MAX_ENVOY_ID_BYTES`], or past [`MAX_ENVOYS`], is not
    /// counted.
    pub fn called(&self, domain: &str, id: &str, now_ms: u64) -> u32 {
        let mut domains = self.lock();
        let d = match domains.get_mut(domain) {
            Some(d) => d,
            None => domains.entry(domain.to_string()).or_default(),
        };
        let full = d.seen.len() >= MAX_ENVOYS;
        if id.len() <= MAX_ENVOY_ID_BYTES {
            match d.seen.get_mut(id) {
                Some(s) => s.last_ms = s.last_ms.max(now_ms),
                None if !full => {
                    let seen = Seen {
                        last_ms: now_ms,
                        written_ms: 0,
                    };
                    d.seen.insert(id.to_string(), seen);
                    d.own += 1;
                    d.recount_at = d.recount_at.min(now_ms.saturating_add(self.interval_ms));
                }
                None => {}
            }
        }
        size(d, now_ms, self.interval_ms)
    }

    /// The sizes of every domain heard, for the metrics.
    pub fn sizes(&self, now_ms: u64) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = self
            .lock()
            .iter_mut()
            .map(|(name, d)| (name.clone(), size(d, now_ms, self.interval_ms)))
            .collect();
        out.sort();
        out
    }

    /// Drops the ids not heard within the interval (and a domain left with
    /// none and no size from Redis); returns what to write to Redis: per
    /// domain, the ids heard since they were last written.
    pub fn to_sync(&self, now_ms: u64) -> Vec<Sync> {
        let cut = since(now_ms, self.interval_ms);
        let mut domains = self.lock();
        domains.retain(|_, d| {
            d.recount(now_ms, self.interval_ms);
            !d.seen.is_empty()
                || d.shared
                    .is_some_and(|(_, at)| at + self.interval_ms > now_ms)
        });
        let mut out: Vec<Sync> = domains
            .iter_mut()
            .map(|(name, d)| {
                let heard = d
                    .seen
                    .iter_mut()
                    .filter(|(_, s)| s.last_ms > s.written_ms)
                    .map(|(id, s)| {
                        s.written_ms = s.last_ms;
                        (id.clone(), s.last_ms)
                    })
                    .collect();
                Sync {
                    domain: name.clone(),
                    heard,
                    older_than_ms: cut,
                    expire_ms: 2 * self.interval_ms,
                }
            })
            .collect();
        out.sort_by(|a, b| a.domain.cmp(&b.domain));
        out
    }

    /// The sizes Redis answered for `to_sync`'s domains, read at `now_ms`.
    pub fn synced(&self, sizes: &[(String, u32)], now_ms: u64) {
        let mut domains = self.lock();
        for (name, n) in sizes {
            if let Some(d) = domains.get_mut(name) {
                d.shared = Some((*n, now_ms));
            }
        }
    }

    /// Redis could not be written: the ids of `failed` are written again
    /// at the next sync.
    pub fn unsynced(&self, failed: &[Sync]) {
        let mut domains = self.lock();
        for s in failed {
            if let Some(d) = domains.get_mut(&s.domain) {
                for (id, _) in &s.heard {
                    if let Some(seen) = d.seen.get_mut(id) {
                        seen.written_ms = 0;
                    }
                }
            }
        }
    }
}

/// The size answered: the replica's own count, or the size read from
/// Redis while it is fresh if that is larger.
fn size(d: &mut Domain, now_ms: u64, interval_ms: u64) -> u32 {
    d.recount(now_ms, interval_ms);
    let own = u32::try_from(d.own).unwrap_or(u32::MAX);
    let shared = match d.shared {
        Some((n, at)) if now_ms < at.saturating_add(SHARED_FRESH_MS) => n,
        _ => 0,
    };
    own.max(shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fleet::key;

    const S: u64 = 1_000;

    #[test]
    fn envoys_are_counted_once_each_within_the_interval() {
        let f = Fleet::new(30 * S);
        assert_eq!(f.called("d", "a", 100 * S), 1);
        assert_eq!(f.called("d", "a", 101 * S), 1);
        assert_eq!(f.called("d", "b", 102 * S), 2);
        assert_eq!(f.called("other", "c", 102 * S), 1);
        // a last called at 101 s: gone once 30 s have passed since.
        assert_eq!(f.called("d", "b", 131 * S), 1);
        assert_eq!(f.called("d", "c", 131 * S), 2);
        assert_eq!(f.sizes(131 * S), [("d".into(), 2), ("other".into(), 1)]);
        assert_eq!(f.sizes(200 * S), [("d".into(), 0), ("other".into(), 0)]);
    }

    #[test]
    fn ids_too_long_or_past_the_most_are_not_counted() {
        let f = Fleet::new(30 * S);
        let long = "x".repeat(MAX_ENVOY_ID_BYTES + 1);
        assert_eq!(f.called("d", &long, S), 0);
        assert_eq!(f.called("d", &long[1..], S), 1);
    }

    #[test]
    fn each_id_is_written_once_per_sync_and_only_when_heard_since() {
        let f = Fleet::new(30 * S);
        f.called("d", "a", 100 * S);
        f.called("d", "b", 100 * S + 500);
        let s = f.to_sync(101 * S);
        assert_eq!(s.len(), 1);
        let mut heard = s[0].heard.clone();
        heard.sort();
        assert_eq!(heard, [("a".into(), 100 * S), ("b".into(), 100 * S + 500)]);
        assert_eq!(s[0].older_than_ms, 71 * S);
        assert_eq!(s[0].expire_ms, 60 * S);
        // Nothing heard since: nothing to write, the set still trimmed and read.
        let s = f.to_sync(102 * S);
        assert!(s[0].heard.is_empty());
        // a calls many times within the second: written once, at its last call.
        for ms in [102_100, 102_200, 102_900] {
            f.called("d", "a", ms);
        }
        assert_eq!(f.to_sync(103 * S)[0].heard, [("a".into(), 102_900)]);
    }

    #[test]
    fn a_failed_write_is_written_again() {
        let f = Fleet::new(30 * S);
        f.called("d", "a", 100 * S);
        let s = f.to_sync(101 * S);
        f.unsynced(&s);
        assert_eq!(f.to_sync(102 * S)[0].heard, [("a".into(), 100 * S)]);
    }

    #[test]
    fn the_fleet_size_is_the_larger_of_redis_and_the_replica_while_fresh() {
        let f = Fleet::new(30 * S);
        f.called("d", "a", 100 * S);
        let _ = f.to_sync(100 * S);
        // The other replicas heard 5 more.
        f.synced(&[("d".into(), 6)], 100 * S);
        assert_eq!(f.called("d", "a", 101 * S), 6);
        // A new Envoy, here: counted at once (the replica's own count
        // would be 2; Redis said 6 without it).
        assert_eq!(f.called("d", "new", 101 * S), 6);
        // Redis not read for SHARED_FRESH_MS: the replica's own count.
        assert_eq!(f.called("d", "a", 100 * S + SHARED_FRESH_MS), 2);
        f.synced(&[("d".into(), 7)], 104 * S);
        assert_eq!(f.called("d", "a", 104 * S), 7);
    }

    #[test]
    fn ids_and_domains_not_heard_within_the_interval_are_dropped() {
        let f = Fleet::new(10 * S);
        f.called("d", "a", 100 * S);
        f.called("e", "b", 105 * S);
        let s = f.to_sync(111 * S);
        assert_eq!(
            s.iter().map(|s| s.domain.as_str()).collect::<Vec<_>>(),
            ["e"]
        );
        assert!(f.to_sync(116 * S).is_empty());
        assert!(f.sizes(116 * S).is_empty());
    }

    #[test]
    fn the_key_keeps_every_domain_in_one_cluster_slot() {
        assert_eq!(key("internal-api"), "{trl_fleet}_internal-api");
    }

    /// Two replicas (two `Fleet`s) over one store: each answers the
    /// Envoys both heard once it has synced; an Envoy neither heard within
    /// the interval leaves the set. The memory store pools nothing.
    fn replicas_pool_what_they_heard(s: &crate::store::testing::Under) {
        use crate::store::testing::Kind;
        let (a, b) = (Fleet::new(30 * S), Fleet::new(30 * S));
        let t = 1_000 * S;
        a.called("d", "e1", t);
        a.called("d", "e2", t);
        b.called("d", "e2", t);
        b.called("d", "e3", t);
        let got = s.fleet(&a.to_sync(t + S));
        if s.kind == Kind::Memory {
            assert_eq!(got, None);
            return;
        }
        assert_eq!(got, Some(vec![2]));
        assert_eq!(s.fleet(&b.to_sync(t + S)), Some(vec![3]));
        let got = s.fleet(&a.to_sync(t + 2 * S)).unwrap();
        assert_eq!(got, [3]);
        a.synced(&[("d".into(), got[0])], t + 2 * S);
        assert_eq!(a.called("d", "e1", t + 2 * S), 3);
        // 40 s on, only e1 still calls: e2 and e3 leave the set.
        a.called("d", "e1", t + 40 * S);
        assert_eq!(s.fleet(&a.to_sync(t + 41 * S)), Some(vec![1]));
    }

    crate::test_with_all_stores!(replicas_pool_what_they_heard);
}
