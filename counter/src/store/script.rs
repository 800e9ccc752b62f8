//! The Lua script every Redis store runs (`script.lua`), its arguments
//! laid out and its answer read back.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::decide::{Counts, Decision, Request};

use super::StoreError;

/// The script (`script.lua`, headed by what each `KEYS[i]` and `ARGV[i]`
/// holds): does nothing once Redis's clock is past the call's deadline;
/// else reads the keys a call reads before it adds to them (MGET), then
/// decides each request in order (an admitted one's hits count for the
/// requests after it): its adds made (INCRBY), its checks decided on the
/// counts before them, its adds undone if it is refused or one of its keys
/// holds something else than a count (that request alone fails). Its
/// numbers come packed in one argument (`Layout::pack`); it returns each
/// key's value as first read, then per request admitted, refused or
/// failed: the caller replays the adds to know the counts each request was
/// decided on.
pub const SCRIPT: &str = include_str!("script.lua");

/// One script call deciding `chosen` (requests that share a slot on a
/// Cluster), within `deadline`; the script loaded again if Redis lost it.
pub(super) async fn run<C: redis::aio::ConnectionLike>(
    con: &mut C,
    script: &redis::Script,
    deadline: Duration,
    chosen: &[&Request],
) -> Result<Vec<Decision>, StoreError> {
    if chosen.iter().all(|r| r.checks.is_empty()) {
        return Ok(chosen
            .iter()
            .map(|_| Decision {
                counts: Vec::new(),
                admitted: true,
                failed: false,
                allocations: Vec::new(),
            })
            .collect());
    }
    let layout = Layout::of(chosen);
    // EVALSHA with the keys and one packed argument (see SCRIPT), the
    // call's deadline on this process's clock as it sends.
    let mut cmd = redis::cmd("EVALSHA");
    let extra = if layout.regional.is_empty() {
        0
    } else {
        1 + layout.hashes.len()
    };
    cmd.arg(script.get_hash()).arg(layout.keys.len() + extra);
    for k in &layout.keys {
        cmd.arg(*k);
    }
    if extra > 0 {
        cmd.arg(crate::regions::REGISTRY);
        for k in &layout.hashes {
            cmd.arg(*k);
        }
    }
    cmd.arg(layout.pack(chosen, script_deadline_ms(wall_clock_ms(), deadline)));
    let call = async {
        match cmd.query_async::<Vec<i64>>(con).await {
            Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                // Redis restarted or flushed its scripts: loaded again.
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(SCRIPT)
                    .exec_async(con)
                    .await?;
                cmd.query_async::<Vec<i64>>(con).await
            }
            other => other,
        }
    };
    let answer: Vec<i64> = tokio::time::timeout(deadline, call)
        .await
        .map_err(|_| StoreError::Timeout)?
        .map_err(StoreError::Redis)?;
    if answer == [TOO_LATE] {
        return Err(StoreError::TooLate);
    }
    layout.replay(&answer).ok_or(StoreError::Shape)
}

/// The script's answer when it ran past the call's deadline (nothing
/// read, nothing written).
const TOO_LATE: i64 = -1;

/// This process's wall clock, Unix ms (not the test clock of the
/// decisions: the deadline is compared with Redis's own clock).
fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The most the clocks of this process and Redis are assumed to differ,
/// plus the time a reply takes back (same machine, or both on NTP).
pub const CLOCK_MARGIN_MS: u64 = 25;

/// The deadline the script is given, from `sent_ms` (when the call is
/// sent) and the store's `deadline`: the instant this process gives up,
/// less a margin (a quarter of the deadline, at most [`CLOCK_MARGIN_MS`])
/// so that a script Redis starts just before it gives up has answered by
/// then.
pub fn script_deadline_ms(sent_ms: u64, deadline: Duration) -> u64 {
    let ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
    sent_ms.saturating_add(ms.saturating_sub(CLOCK_MARGIN_MS.min(ms / 4)))
}

/// A PING within `deadline`, or why not.
pub(super) async fn ping<C: redis::aio::ConnectionLike>(
    con: &mut C,
    deadline: Duration,
) -> Result<(), StoreError> {
    match tokio::time::timeout(deadline, redis::cmd("PING").query_async::<String>(con)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(StoreError::Redis(e)),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// A key's value (0 when missing), for the tests that compare stores.
#[cfg(test)]
pub(super) async fn value<C: redis::aio::ConnectionLike>(
    con: &mut C,
    key: &str,
) -> Result<u64, StoreError> {
    let v: Option<u64> = redis::cmd("GET")
        .arg(key)
        .query_async(con)
        .await
        .map_err(StoreError::Redis)?;
    Ok(v.unwrap_or(0))
}

/// A script call's arguments: the distinct keys of the chosen requests,
/// and per request its checks' keys (current, previous) and the keys it
/// adds to, as indexes into `keys`.
pub(super) struct Layout<'a> {
    /// The keys the script reads before it adds to them first (see
    /// SCRIPT), then the others.
    pub(super) keys: Vec<&'a str>,
    pub(super) read_count: usize,
    pub(super) ttl_ms: Vec<u64>,
    #[allow(clippy::type_complexity)]
    pub(super) requests: Vec<(Vec<(usize, Option<usize>)>, Vec<(usize, u64)>)>,
    /// The regions hashes of the regional checks (`crate::regions`),
    /// each once, and per regional check (a push's aside): its request,
    /// its place among the request's checks, its hash (an index into
    /// `hashes`) and its floor.
    pub(super) hashes: Vec<&'a str>,
    pub(super) regional: Vec<(usize, usize, usize, u64)>,
}

impl<'a> Layout<'a> {
    pub(super) fn of(chosen: &[&'a Request]) -> Layout<'a> {
        let mut index: HashMap<&'a str, usize> = HashMap::new();
        let mut keys: Vec<&'a str> = Vec::new();
        let mut ttl_ms: Vec<u64> = Vec::new();
        // Per key, whether the call first reads it (before any add).
        let mut read_first: Vec<bool> = Vec::new();
        let mut at =
            |k: &'a str, ttl: u64, read: bool, keys: &mut Vec<&'a str>, ttl_ms: &mut Vec<u64>| {
                let i = *index.entry(k).or_insert_with(|| {
                    keys.push(k);
                    ttl_ms.push(1);
                    read_first.push(read);
                    keys.len() - 1
                });
                if let Some(t) = ttl_ms.get_mut(i) {
                    *t = (*t).max(ttl);
                }
                i
            };
        let mut requests = Vec::with_capacity(chosen.len());
        // Per key, the last request (numbered from 1) that adds to it.
        let mut added_by: Vec<usize> = Vec::new();
        for (q, r) in chosen.iter().enumerate() {
            let mut checks = Vec::with_capacity(r.checks.len());
            let mut adds: Vec<(usize, u64)> = Vec::new();
            for c in &r.checks {
                let k = at(&c.key, c.ttl_ms, c.key_hits == 0, &mut keys, &mut ttl_ms);
                let pk = c
                    .prev_key
                    .as_deref()
                    .map(|p| at(p, 1, true, &mut keys, &mut ttl_ms));
                checks.push((k, pk));
                // key_hits: the request's hits on that key, added once.
                if added_by.len() < keys.len() {
                    added_by.resize(keys.len(), 0);
                }
                if c.key_hits > 0 {
                    if let Some(a) = added_by.get_mut(k).filter(|a| **a != q + 1) {
                        *a = q + 1;
                        adds.push((k, c.key_hits));
                    }
                }
            }
            requests.push((checks, adds));
        }
        // The keys read first go first (a stable order otherwise).
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| !read_first.get(i).copied().unwrap_or(false));
        let read_count = read_first.iter().filter(|r| **r).count();
        if order.iter().enumerate().any(|(new, &old)| new != old) {
            let mut place = vec![0; keys.len()];
            for (new, &old) in order.iter().enumerate() {
                if let Some(p) = place.get_mut(old) {
                    *p = new;
                }
            }
            let moved = |i: usize| place.get(i).copied().unwrap_or(i);
            keys = order.iter().filter_map(|&i| keys.get(i).copied()).collect();
            ttl_ms = order
                .iter()
                .filter_map(|&i| ttl_ms.get(i).copied())
                .collect();
            for (checks, adds) in &mut requests {
                for (k, pk) in checks.iter_mut() {
                    *k = moved(*k);
                    *pk = pk.map(moved);
                }
                for (k, _) in adds.iter_mut() {
                    *k = moved(*k);
                }
            }
        }
        let mut hashes: Vec<&'a str> = Vec::new();
        let mut regional = Vec::new();
        for (q, r) in chosen.iter().enumerate().filter(|(_, r)| !r.push) {
            for (j, c) in r.checks.iter().enumerate() {
                if let Some(g) = &c.regional {
                    let h = match hashes.iter().position(|k| *k == g.key) {
                        Some(h) => h,
                        None => {
                            hashes.push(g.key.as_str());
                            hashes.len() - 1
                        }
                    };
                    regional.push((q, j, h, g.floor));
                }
            }
        }
        Layout {
            keys,
            read_count,
            ttl_ms,
            requests,
            hashes,
            regional,
        }
    }

    /// The script's numbers (see SCRIPT), packed as little-endian doubles.
    pub(super) fn pack(&self, chosen: &[&Request], deadline_ms: u64) -> Vec<u8> {
        let per_request: usize = self
            .requests
            .iter()
            .map(|(checks, adds)| 2 + 5 * checks.len() + 2 * adds.len())
            .sum();
        let mut out = Vec::with_capacity(8 * (4 + self.ttl_ms.len() + per_request));
        let mut put = |n: u64| out.extend_from_slice(&(n as f64).to_le_bytes());
        put(deadline_ms);
        put(self.keys.len() as u64);
        put(self.read_count as u64);
        put(chosen.len() as u64);
        for &t in &self.ttl_ms {
            put(t);
        }
        for (r, (checks, adds)) in chosen.iter().zip(&self.requests) {
            // A push goes without checks: the script admits it and adds
            // its hits; its counts are replayed from the keys read.
            let checks: &[_] = if r.push { &[] } else { checks };
            put(checks.len() as u64);
            put(adds.len() as u64);
            for (c, &(k, pk)) in r.checks.iter().zip(checks) {
                put(c.limit);
                put(c.key_hits);
                put(k as u64 + 1);
                put(pk.map_or(0, |p| p as u64 + 1));
                put(c.weight_ppm);
            }
            for &(k, hits) in adds {
                put(k as u64 + 1);
                put(hits);
            }
        }
        if !self.regional.is_empty() {
            // KEYS: the counters, the registry, then the hashes.
            let first_hash = self.keys.len() as u64 + 2;
            put(self.regional.len() as u64);
            for &(q, j, h, floor) in &self.regional {
                put(q as u64 + 1);
                put(j as u64 + 1);
                put(first_hash + h as u64);
                put(floor);
            }
        }
        out
    }

    /// Each request's counts as the script decided it on, from the keys'
    /// values as read and which requests were admitted: the adds of the
    /// admitted ones replayed in order. A request the script failed (a key
    /// that holds something else than a count) is decided failed, with no
    /// counts.
    pub(super) fn replay(&self, answer: &[i64]) -> Option<Vec<Decision>> {
        let nk = self.keys.len();
        if answer.len() != nk + self.requests.len() + self.regional.len() {
            return None;
        }
        // A key that holds something else than a count: -1.
        let mut values: Vec<u64> = Vec::with_capacity(nk);
        for &n in answer.get(..nk)? {
            values.push(match n {
                -1 => 0,
                n => u64::try_from(n).ok()?,
            });
        }
        let mut out = Vec::with_capacity(self.requests.len());
        for ((checks, adds), &outcome) in self.requests.iter().zip(answer.get(nk..)?) {
            let admitted = match outcome {
                1 => true,
                0 => false,
                2 => {
                    out.push(Decision {
                        counts: Vec::new(),
                        admitted: false,
                        failed: true,
                        allocations: Vec::new(),
                    });
                    continue;
                }
                _ => return None,
            };
            let counts = checks
                .iter()
                .map(|&(k, pk)| {
                    Some(Counts {
                        current: *values.get(k)?,
                        previous: match pk {
                            Some(p) => *values.get(p)?,
                            None => 0,
                        },
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            if admitted {
                for &(k, hits) in adds {
                    let v = values.get_mut(k)?;
                    *v = v.saturating_add(hits);
                }
            }
            out.push(Decision {
                counts,
                admitted,
                failed: false,
                allocations: Vec::new(),
            });
        }
        // The allocations the regional checks were decided against.
        let decided_against = answer.get(nk + self.requests.len()..)?;
        for (&(q, j, _, _), &held) in self.regional.iter().zip(decided_against) {
            if let (Some(d), Ok(held)) = (out.get_mut(q), u64::try_from(held)) {
                if !d.failed {
                    d.allocations.push((j, held));
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Check;

    fn check(key: &str, prev: Option<&str>, limit: u64, hits: u64) -> Check {
        Check {
            index: 0,
            unit: ratelimit_config::Unit::Minute,
            limit,
            hits,
            key_hits: hits,
            sliding: prev.is_some(),
            shadow: false,
            group: 0,
            name: "g".into(),
            tag: "{1:d:a}".into(),
            key: key.into(),
            prev_key: prev.map(Into::into),
            window: (0, 60_000),
            next_end: 120_000,
            weight_ppm: 500_000,
            ttl_ms: 60_000,
            regional: None,
        }
    }

    #[test]
    fn a_call_sends_each_key_once_and_adds_a_request_s_hits_to_a_key_once() {
        let mut twice = Request {
            checks: vec![check("k1", None, 5, 1), check("k1", None, 9, 2)],
            ..Request::default()
        };
        for c in &mut twice.checks {
            c.key_hits = 3;
        }
        let other = Request {
            checks: vec![check("k1", None, 5, 1), check("k2", Some("k0"), 5, 1)],
            ..Request::default()
        };
        let chosen = [&twice, &other];
        let l = Layout::of(&chosen);
        // k0 (a previous window's) is read first; k1 and k2 first added to.
        assert_eq!(l.keys, ["k0", "k1", "k2"]);
        assert_eq!(l.read_count, 1);
        assert_eq!(l.ttl_ms, [1, 60_000, 60_000]);
        assert_eq!(l.requests[0].1, [(1, 3)]);
        assert_eq!(l.requests[1].0, [(1, None), (2, Some(0))]);
        assert_eq!(l.requests[1].1, [(1, 1), (2, 1)]);
        // Read 4, 1, 0; the first request admitted: the second is decided on
        // k1 = 4.
        let got = l.replay(&[4, 1, 0, 1, 0]).unwrap();
        assert_eq!(
            got[0].counts[0],
            Counts {
                current: 1,
                previous: 0
            }
        );
        assert_eq!(
            got[1].counts[0],
            Counts {
                current: 4,
                previous: 0
            }
        );
        assert_eq!(
            got[1].counts[1],
            Counts {
                current: 0,
                previous: 4
            }
        );
        assert_eq!((got[0].admitted, got[1].admitted), (true, false));
        assert!(!got[0].failed && !got[1].failed);
        assert!(l.replay(&[4, 1, 0, 1]).is_none());
        assert!(l.replay(&[4, 1, 0, 1, 3]).is_none());
        // k1 holds something else than a count: the first request failed
        // alone (nothing added), the second decided on the others.
        let got = l.replay(&[4, -1, 0, 2, 1]).unwrap();
        assert!(got[0].failed && !got[0].admitted && got[0].counts.is_empty());
        assert!(got[1].admitted && !got[1].failed);
        // The numbers the script reads, in its order.
        let packed: Vec<f64> = l
            .pack(&chosen, 7)
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        #[rustfmt::skip]
        let want = [
            7.0, 3.0, 1.0, 2.0,                  // deadline, keys, read first, requests
            1.0, 60_000.0, 60_000.0,             // ttls
            2.0, 1.0,                            // twice: 2 checks, 1 add
            5.0, 3.0, 2.0, 0.0, 500_000.0,
            9.0, 3.0, 2.0, 0.0, 500_000.0,
            2.0, 3.0,
            2.0, 2.0,                            // other: 2 checks, 2 adds
            5.0, 1.0, 2.0, 0.0, 500_000.0,
            5.0, 1.0, 3.0, 1.0, 500_000.0,
            2.0, 1.0, 3.0, 1.0,
        ];
        assert_eq!(packed, want);
    }

    #[test]
    fn the_script_s_deadline_is_the_counter_s_less_a_margin() {
        let ms = Duration::from_millis;
        assert_eq!(script_deadline_ms(1_000, ms(100)), 1_000 + 100 - 25);
        assert_eq!(script_deadline_ms(1_000, ms(5_000)), 1_000 + 5_000 - 25);
        // A short deadline keeps three quarters of itself.
        assert_eq!(script_deadline_ms(1_000, ms(40)), 1_000 + 40 - 10);
    }
}
