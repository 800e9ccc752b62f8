//! The local fallback (`on_failure: "local"`): while the service cannot
//! decide, each Envoy enforces every limit of a tenant's group at its share
//! of the fleet, alone, in windows aligned to the clock as the service's
//! are.
//!
//! - The share is `1 / N`, or (`fallback.share: "learned"`) the part of
//!   the tenant's count at the service this Envoy sent, learned from the
//!   answers (`share`), never under half of `1 / N`. `N` is the fleet's
//!   size the counter last answered (`fleet::held`: the Envoys that called
//!   it in its interval), `fallback.envoys` until one was heard (and with
//!   envoyproxy/ratelimit, which answers none).
//! - In the window where the outage begins, an Envoy starts from what the
//!   fleet had left by the last answer it got (`limit_remaining`), not from
//!   a whole limit: every answer is remembered (`learn`).
//! - Its admissions are counted per unit and window; a request is admitted
//!   while, for every unit, they stay within its share of what is left
//!   (`decide`).
//!
//! The counts live in an entry of their own per slot index (`key`), in
//! shared data, created at configure only with `on_failure: "local"`, so
//! that the slots, and the memory of a filter that does not use it, do not
//! grow. An entry belongs to a tenant as its slot does (a fingerprint; one
//! left alone for `HOLD_MS` goes to the next tenant that needs it).

use crate::answer::Answer;
use crate::fleet;
use crate::host::{Host, SharedData};
use crate::local::slot::{put, u32_at, u64_at};
use crate::local::{self, update_key, SlotRef, UpdateError, CAS_ATTEMPTS};
use crate::window::{self, UNITS};
use ratelimit_config::{Group, OnFailure, PluginConfig, Share};

/// The shared-data key of the fallback entry at `index` (the index of the
/// tenant's slot).
pub fn key(index: u32) -> String {
    format!("trl.fb.{index}")
}

/// Every entry has this size: version, fingerprint, the last answer's
/// time and remaining per unit, the last admission's time and the counts
/// per unit, the hits this Envoy sent in the window, the learned share.
pub const ENTRY_BYTES: usize = 40 + 8 * UNITS;
const VERSION: u8 = 2;
/// Where the remaining and the counts per unit are, 4 bytes each.
const REMAINING_AT: usize = 40;
const USED_AT: usize = 40 + 4 * UNITS;

/// An entry another tenant needs is left to its tenant while it heard an
/// answer or admitted a request this recently.
pub const HOLD_MS: u64 = 2_000;

/// The fleet's count (of the group's longest unit, in a window) from which
/// an Envoy's part of it is taken as its share: fewer hits say too little.
pub const MIN_SAMPLE: u32 = 20;

const PPM: u64 = 1_000_000;

/// One tenant's fallback state on this Envoy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub fingerprint: u64,
    /// When the last answer came: `remaining` holds in its windows.
    pub heard_ms: u64,
    /// The fleet's `limit_remaining` per unit (shortest first), by it.
    pub remaining: [u32; UNITS],
    /// When the fallback last admitted: `used` holds in its windows.
    pub spent_ms: u64,
    /// What the fallback admitted per unit.
    pub used: [u32; UNITS],
    /// Hits this Envoy sent that the service counted, in `heard_ms`'s
    /// window of the group's longest unit.
    pub own: u32,
    /// The share learned in earlier windows, in millionths (0: none).
    pub share_ppm: u32,
}

impl Entry {
    fn empty(fingerprint: u64) -> Entry {
        Entry {
            fingerprint,
            ..Entry::default()
        }
    }

    fn in_use(&self, now_ms: u64) -> bool {
        now_ms < self.heard_ms.max(self.spent_ms).saturating_add(HOLD_MS)
    }

    /// `stored` if it is `fingerprint`'s; a fresh entry when it is empty,
    /// unreadable, or another tenant's left alone; None when that tenant
    /// keeps it.
    pub fn claim(stored: Option<&[u8]>, fingerprint: u64, now_ms: u64) -> Option<Entry> {
        match stored.and_then(Entry::decode) {
            Some(e) if e.fingerprint == fingerprint => Some(e),
            Some(e) if e.in_use(now_ms) => None,
            _ => Some(Entry::empty(fingerprint)),
        }
    }

    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        put(&mut b, 0, &[VERSION]);
        put(&mut b, 8, &self.fingerprint.to_le_bytes());
        put(&mut b, 16, &self.heard_ms.to_le_bytes());
        put(&mut b, 24, &self.spent_ms.to_le_bytes());
        for i in 0..UNITS {
            let (r, u) = (self.remaining.get(i), self.used.get(i));
            put(
                &mut b,
                REMAINING_AT + 4 * i,
                &r.copied().unwrap_or(0).to_le_bytes(),
            );
            put(
                &mut b,
                USED_AT + 4 * i,
                &u.copied().unwrap_or(0).to_le_bytes(),
            );
        }
        put(&mut b, 32, &self.own.to_le_bytes());
        put(&mut b, 36, &self.share_ppm.to_le_bytes());
        b
    }

    /// None for anything that is not an entry of this version (the zeroed
    /// value it is created with among them).
    pub fn decode(b: &[u8]) -> Option<Entry> {
        if b.len() != ENTRY_BYTES || b.first() != Some(&VERSION) {
            return None;
        }
        let mut e = Entry {
            fingerprint: u64_at(b, 8)?,
            heard_ms: u64_at(b, 16)?,
            spent_ms: u64_at(b, 24)?,
            own: u32_at(b, 32)?,
            share_ppm: u32_at(b, 36)?,
            ..Entry::default()
        };
        for i in 0..UNITS {
            *e.remaining.get_mut(i)? = u32_at(b, REMAINING_AT + 4 * i)?;
            *e.used.get_mut(i)? = u32_at(b, USED_AT + 4 * i)?;
        }
        Some(e)
    }

    /// This Envoy's part of the fleet's count in `heard_ms`'s window of the
    /// longest unit, in millionths; None when the fleet's count there is
    /// under `MIN_SAMPLE` or at the limit (the service stops counting
    /// usefully once it refuses).
    fn estimate(&self, p: &Params) -> Option<u32> {
        let (_, limit) = p.longest();
        let remaining = *self.remaining.get(p.units.saturating_sub(1))?;
        let fleet = limit.saturating_sub(remaining);
        if fleet < MIN_SAMPLE || remaining == 0 {
            return None;
        }
        let ppm = u64::from(self.own) * PPM / u64::from(fleet);
        u32::try_from(ppm.min(PPM)).ok()
    }
}

/// A group's windows and limits, and the share of them this Envoy
/// enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// The window (ms) and the limit of each unit, shortest first.
    pub windows: [(u64, u32); UNITS],
    pub units: usize,
    /// The fleet's size: `fallback.envoys` as configured; in a decision,
    /// the size last heard (`with_fleet`).
    pub envoys: u32,
    pub learned: bool,
    /// The domain's key of the fleet's size (`fleet::domain_hash`).
    pub fleet: u64,
}

impl Params {
    /// The group's fallback, None unless `on_failure` is `local`
    /// (compiled once per group with the configuration:
    /// `compiled::Compiled::fallback`).
    pub fn for_group(config: &PluginConfig, g: &Group) -> Option<Params> {
        if config.on_failure != OnFailure::Local {
            return None;
        }
        let (windows, units) = window::of_group(g);
        Some(Params {
            windows,
            units,
            envoys: config.fallback.envoys.max(1),
            learned: config.fallback.share == Share::Learned,
            fleet: fleet::domain_hash(&config.domain),
        })
    }

    /// These parameters with the fleet's size heard (`heard`: None before
    /// any, `fallback.envoys` then).
    pub fn with_fleet(&self, heard: Option<u32>) -> Params {
        Params {
            envoys: heard.unwrap_or(self.envoys).max(1),
            ..*self
        }
    }

    fn longest(&self) -> (u64, u32) {
        self.windows
            .get(self.units.saturating_sub(1))
            .copied()
            .unwrap_or((1_000, 0))
    }
}

/// The share of each limit this Envoy enforces for the tenant of `e`, as
/// a fraction (numerator, denominator). Configured: `1 / envoys` (the
/// fleet's size, `Params::with_fleet`). Learned:
/// the estimate of the window of its last answer, averaged with those of
/// the windows before (each window halves the weight of the older ones),
/// the configured share until there is one; never under half the
/// configured share, never over the whole.
pub fn share(e: &Entry, p: &Params) -> (u64, u64) {
    let configured = (1, u64::from(p.envoys));
    if !p.learned {
        return configured;
    }
    let ppm = match (e.share_ppm, e.estimate(p)) {
        (0, None) => return configured,
        (0, Some(now)) => u64::from(now),
        (before, None) => u64::from(before),
        (before, Some(now)) => (u64::from(before) + u64::from(now)) / 2,
    };
    (ppm.clamp(PPM / (2 * configured.1), PPM), PPM)
}

/// Remembers an answer heard at `now_ms` to a call that carried `hits` of
/// this Envoy: what the fleet has left per unit, and (for the learned
/// share) the hits this Envoy sent in the window. An answer in a new window
/// of the longest unit first folds the last window's estimate into the
/// learned share.
pub fn learn(mut e: Entry, p: &Params, answer: &Answer, hits: u32, now_ms: u64) -> Entry {
    let (long_ms, _) = p.longest();
    if !window::same(long_ms, e.heard_ms, now_ms) {
        if let Some(est) = e.estimate(p) {
            e.share_ppm = match e.share_ppm {
                0 => est,
                before => before / 2 + est / 2,
            };
        }
        e.own = 0;
    }
    e.own = e.own.saturating_add(hits);
    let counts = answer.counts().chain(std::iter::repeat((false, 0)));
    for (r, (over, remaining)) in e.remaining.iter_mut().zip(counts).take(p.units) {
        *r = if over { 0 } else { remaining };
    }
    e.heard_ms = now_ms;
    e
}

/// What the fallback decided for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackDecision {
    /// Within this Envoy's share of every limit: admitted, and counted.
    Admit,
    /// Over its share of a limit: 429, retry when that window ends.
    Refuse { retry_after_s: u64 },
    /// Another tenant holds the entry: nothing to decide with.
    Contended,
}

/// Decides a request of `cost` hits at `now_ms` from the entry; returns
/// the entry to store (an admission only: a refusal writes nothing).
pub fn decide(
    mut e: Entry,
    p: &Params,
    cost: u32,
    now_ms: u64,
) -> (FallbackDecision, Option<Entry>) {
    let (num, den) = share(&e, p);
    let mut retry_ms = 0;
    let units = p.windows.iter().zip(&e.remaining).zip(&mut e.used);
    for ((&(w, limit), &remaining), used) in units.take(p.units) {
        let left = if window::same(w, e.heard_ms, now_ms) {
            remaining
        } else {
            limit
        };
        let allowed = u64::from(left) * num / den.max(1);
        if !window::same(w, e.spent_ms, now_ms) {
            *used = 0;
        }
        if u64::from(*used) + u64::from(cost) > allowed {
            retry_ms = retry_ms.max(window::end(w, now_ms) - now_ms);
        }
        *used = used.saturating_add(cost);
    }
    if retry_ms > 0 {
        let retry_after_s = retry_ms.div_ceil(1_000).max(1);
        return (FallbackDecision::Refuse { retry_after_s }, None);
    }
    e.spent_ms = now_ms;
    (FallbackDecision::Admit, Some(e))
}

/// Reads, steps and writes the entry of `at` under CAS: `step` gets the
/// entry (None: another tenant holds it) and returns the one to write,
/// keeping what else it decides in its own captures (one copy of this for
/// every caller).
fn update<S>(
    shared: &S,
    at: SlotRef,
    now_ms: u64,
    step: &mut dyn FnMut(Option<Entry>) -> Option<Entry>,
) -> Result<(), UpdateError>
where
    S: SharedData + ?Sized,
{
    let mut scratch = [0u8; ENTRY_BYTES];
    update_key(
        shared,
        &key(at.index),
        CAS_ATTEMPTS,
        &mut scratch,
        &mut |stored, buf| {
            let write = step(Entry::claim(stored, at.fingerprint, now_ms))?;
            buf.copy_from_slice(&write.encode());
            Some(ENTRY_BYTES)
        },
    )
}

/// The hook where an answer is known: with `on_failure: "local"` (`p`,
/// the tenant's group's fallback), the answer to a call about the tenant at
/// `at` that carried `hits` is remembered in its entry.
pub fn on_answer<H: Host + ?Sized>(
    p: Option<&Params>,
    host: &H,
    at: SlotRef,
    hits: u32,
    answer: &Answer,
) {
    let Some(p) = p else {
        return;
    };
    let now = host.now_ms();
    // Not remembered (shared data failed): the share starts from a whole
    // limit, as for a tenant never heard of.
    let _ = update(host, at, now, &mut |e| {
        e.map(|e| learn(e, p, answer, hits, now))
    });
}

/// The hook where the service cannot decide: the fallback's decision (`p`,
/// the tenant's group's fallback) for a request of `cost` hits of the
/// tenant at `at`. `Contended` also when the entry cannot be read or
/// written, or without a fallback.
pub fn on_request<H: Host + ?Sized>(
    p: Option<&Params>,
    host: &H,
    at: SlotRef,
    cost: u32,
) -> FallbackDecision {
    let Some(p) = p else {
        return FallbackDecision::Contended;
    };
    let now = host.now_ms();
    // The fleet's size as last heard (one read, on the fallback's path
    // only).
    let p = &p.with_fleet(fleet::held(host, p.fleet));
    let mut decided = FallbackDecision::Contended;
    let stored = update(host, at, now, &mut |e| {
        let (d, write) = e.map_or((FallbackDecision::Contended, None), |e| {
            decide(e, p, cost, now)
        });
        decided = d;
        write
    });
    match stored {
        Ok(()) => decided,
        Err(_) => FallbackDecision::Contended,
    }
}

/// Creates the `slots` entries at configure, zeroed at full size, so that
/// shared data does not grow with traffic (every VM runs this; an entry
/// that exists is left alone). Returns how many could not be created.
pub fn create<S: SharedData + ?Sized>(shared: &S, slots: u32) -> u32 {
    let zeroed = [0u8; ENTRY_BYTES];
    (0..slots)
        .map(|index| u32::from(!local::create(shared, &key(index), &zeroed)))
        .sum()
}

#[cfg(test)]
mod tests;
