//! The local layer: a token bucket and an over-limit cache per tenant, kept
//! in proxy-wasm shared data so that every worker of one Envoy sees them,
//! decided before any network call.
//!
//! Shared data is never deleted, so the keyspace is fixed: `slots` keys,
//! created once, each holding one tenant's state and a fingerprint of that
//! tenant. A tenant that hashes to a slot held by another takes it over
//! (with a full bucket and no cached refusal). Losing a slot that way only
//! costs calls to the rate-limit service: the local layer refuses, it never
//! admits on its own, so the fleet-wide limit still holds.
//!
//! Everything here is pure, with time passed in as milliseconds since the
//! Unix epoch; `SharedStore` is the narrow view of shared data that the glue
//! implements with hostcalls.

use ratelimit_config::{BucketParams, HeaderMode};

use crate::decision::{draft03_headers, RETRY_AFTER};
use crate::proto::{Code, DescriptorStatus, Duration, RateLimit};

/// Refill time of one token is counted in milli-tokens, so that a rate of
/// `r` tokens per second adds exactly `r` milli-tokens per millisecond.
const MILLI: u64 = 1_000;

/// A clock that goes back by less than this is taken as two workers reading
/// the clock in a different order than they write; the bucket keeps its
/// reference time. A larger step back is a real clock step: the bucket
/// re-anchors on the new time (without refilling).
pub const CLOCK_REORDER_TOLERANCE_MS: u64 = 1_000;

/// How many times a read-modify-write of a slot is tried before the local
/// layer gives up on that request (and lets it through to the service).
pub const CAS_ATTEMPTS: u32 = 8;

/// A token bucket: `milli_tokens` available at `updated_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    pub milli_tokens: u64,
    pub updated_ms: u64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(p: BucketParams, now_ms: u64) -> TokenBucket {
        TokenBucket {
            milli_tokens: u64::from(p.burst).saturating_mul(MILLI),
            updated_ms: now_ms,
        }
    }

    /// The bucket as it stands at `now_ms`: refilled for the time since it
    /// was last updated, never above `burst`.
    pub fn refilled(self, p: BucketParams, now_ms: u64) -> TokenBucket {
        let cap = u64::from(p.burst).saturating_mul(MILLI);
        if now_ms < self.updated_ms {
            let back = self.updated_ms - now_ms;
            return TokenBucket {
                milli_tokens: self.milli_tokens.min(cap),
                updated_ms: if back > CLOCK_REORDER_TOLERANCE_MS {
                    now_ms
                } else {
                    self.updated_ms
                },
            };
        }
        let added = (now_ms - self.updated_ms).saturating_mul(u64::from(p.tokens_per_second));
        TokenBucket {
            milli_tokens: self.milli_tokens.saturating_add(added).min(cap),
            updated_ms: now_ms,
        }
    }

    /// Takes one token at `now_ms`: the new bucket, or the seconds until a
    /// token will be there (rounded up, at least 1) when there is none.
    pub fn take(self, p: BucketParams, now_ms: u64) -> Result<TokenBucket, u64> {
        let b = self.refilled(p, now_ms);
        if b.milli_tokens >= MILLI {
            Ok(TokenBucket {
                milli_tokens: b.milli_tokens - MILLI,
                ..b
            })
        } else {
            let missing = MILLI - b.milli_tokens;
            let rate = u64::from(p.tokens_per_second.max(1));
            let wait_ms = missing.div_ceil(rate);
            Err(wait_ms.div_ceil(1_000).max(1))
        }
    }
}

/// What the service said about one descriptor, kept to answer from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StatusSnapshot {
    pub requests_per_unit: u32,
    /// `RateLimitUnit` as its protobuf number.
    pub unit: i32,
    pub remaining: u32,
    pub over_limit: bool,
    /// When this descriptor's window resets.
    pub reset_at_ms: u64,
}

/// At most one descriptor per unit is sent.
pub const MAX_STATUSES: usize = 4;

/// A tenant the service has refused, until `until_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct OverLimit {
    pub until_ms: u64,
    pub statuses: Vec<StatusSnapshot>,
}

/// One tenant's state in one shared-data slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub fingerprint: u64,
    pub bucket: Option<TokenBucket>,
    pub over_limit: Option<OverLimit>,
}

impl Slot {
    fn empty(fingerprint: u64) -> Slot {
        Slot {
            fingerprint,
            bucket: None,
            over_limit: None,
        }
    }

    /// The slot's state for `fingerprint`: what is stored when it is that
    /// tenant's, a fresh state when the slot is empty, unreadable or held by
    /// another tenant, regardless of whether that tenant still uses it
    /// (requests go through `claim`, refusals through `remember_over_limit`).
    #[cfg(test)]
    pub fn for_tenant(stored: Option<&[u8]>, fingerprint: u64) -> Slot {
        match stored.and_then(Slot::decode) {
            Some(s) if s.fingerprint == fingerprint => s,
            _ => Slot::empty(fingerprint),
        }
    }

    /// Whether a refusal is cached that has not ended at `now_ms`.
    fn refusing(&self, now_ms: u64) -> bool {
        self.over_limit
            .as_ref()
            .is_some_and(|o| now_ms < o.until_ms)
    }

    /// Whether the slot's state still matters at `now_ms`: a cached refusal
    /// that has not ended, or a bucket that took a token less than
    /// `SLOT_HOLD_MS` ago.
    fn in_use(&self, now_ms: u64) -> bool {
        self.refusing(now_ms)
            || self
                .bucket
                .is_some_and(|b| now_ms < b.updated_ms.saturating_add(SLOT_HOLD_MS))
    }

    /// The slot's state for `fingerprint`, for a request: `None` when
    /// another tenant holds the slot and still uses it (see `SLOT_HOLD_MS`).
    pub fn claim(stored: Option<&[u8]>, fingerprint: u64, now_ms: u64) -> Option<Slot> {
        match stored.and_then(Slot::decode) {
            Some(s) if s.fingerprint == fingerprint => Some(s),
            Some(s) if s.fingerprint != 0 && s.in_use(now_ms) => None,
            _ => Some(Slot::empty(fingerprint)),
        }
    }
}

/// Two tenants whose fingerprints map to the same slot must not take it from
/// each other on every request: each takeover starts the newcomer with a
/// full bucket, so two busy tenants taking turns would each be shed by
/// neither bucket. A slot stays with its tenant while that tenant's cached
/// refusal lasts and for this long after its bucket last took a token (a
/// tenant being shed takes one at least every second: rates are at least 1
/// per second). Meanwhile a colliding tenant has no local state and every
/// request of it is asked about (`slot_contended`). A refusal to remember is
/// worth more than a bucket: it takes the slot unless the holder's own
/// refusal is still cached.
pub const SLOT_HOLD_MS: u64 = 2_000;

const VERSION: u8 = 1;
const HAS_BUCKET: u8 = 1;
const HAS_OVER_LIMIT: u8 = 2;
const HEADER_BYTES: usize = 36;
const STATUS_BYTES: usize = 20;
/// Every slot value has this size, so the shared data never grows after the
/// slots are created.
pub const SLOT_BYTES: usize = HEADER_BYTES + MAX_STATUSES * STATUS_BYTES;

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)?.try_into().ok().map(u64::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)?.try_into().ok().map(u32::from_le_bytes)
}

impl Slot {
    /// The fixed-size encoding: version, flags, fingerprint, bucket,
    /// over-limit deadline and up to four descriptor statuses.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_fixed().to_vec()
    }

    /// `encode`, on the stack (what a write of the slot sends).
    pub fn encode_fixed(&self) -> [u8; SLOT_BYTES] {
        let mut b = [0u8; SLOT_BYTES];
        let mut flags = 0;
        put(&mut b, 2, &self.fingerprint.to_le_bytes());
        if let Some(t) = self.bucket {
            flags |= HAS_BUCKET;
            put(&mut b, 10, &t.milli_tokens.to_le_bytes());
            put(&mut b, 18, &t.updated_ms.to_le_bytes());
        }
        if let Some(o) = &self.over_limit {
            flags |= HAS_OVER_LIMIT;
            put(&mut b, 26, &o.until_ms.to_le_bytes());
            let n = o.statuses.len().min(MAX_STATUSES);
            put(&mut b, 34, &[n as u8]);
            for (i, s) in o.statuses.iter().take(MAX_STATUSES).enumerate() {
                let at = HEADER_BYTES + i * STATUS_BYTES;
                put(&mut b, at, &s.requests_per_unit.to_le_bytes());
                let unit = u8::try_from(s.unit).unwrap_or(0);
                put(&mut b, at + 4, &[unit, u8::from(s.over_limit), 0, 0]);
                put(&mut b, at + 8, &s.remaining.to_le_bytes());
                put(&mut b, at + 12, &s.reset_at_ms.to_le_bytes());
            }
        }
        put(&mut b, 0, &[VERSION, flags]);
        b
    }

    /// None for anything that is not a slot of this version (including the
    /// zeroed value a slot is created with).
    pub fn decode(b: &[u8]) -> Option<Slot> {
        if b.len() != SLOT_BYTES || *b.first()? != VERSION {
            return None;
        }
        let flags = *b.get(1)?;
        let bucket = if flags & HAS_BUCKET != 0 {
            Some(TokenBucket {
                milli_tokens: u64_at(b, 10)?,
                updated_ms: u64_at(b, 18)?,
            })
        } else {
            None
        };
        let over_limit = if flags & HAS_OVER_LIMIT != 0 {
            let n = usize::from(*b.get(34)?).min(MAX_STATUSES);
            let mut statuses = Vec::with_capacity(n);
            for i in 0..n {
                let at = HEADER_BYTES + i * STATUS_BYTES;
                statuses.push(StatusSnapshot {
                    requests_per_unit: u32_at(b, at)?,
                    unit: i32::from(*b.get(at + 4)?),
                    over_limit: *b.get(at + 5)? != 0,
                    remaining: u32_at(b, at + 8)?,
                    reset_at_ms: u64_at(b, at + 12)?,
                });
            }
            Some(OverLimit {
                until_ms: u64_at(b, 26)?,
                statuses,
            })
        } else {
            None
        };
        Some(Slot {
            fingerprint: u64_at(b, 2)?,
            bucket,
            over_limit,
        })
    }
}

/// Where a tenant lives: a slot index and the fingerprint that says the
/// slot is that tenant's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRef {
    pub index: u32,
    pub fingerprint: u64,
}

/// 64-bit FNV-1a with a final avalanche, over the group name and the tenant
/// (a tenant that moves to another group starts afresh).
fn fingerprint(group: &str, tenant: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in group.bytes().chain([0xff]).chain(tenant.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    // 0 marks an empty slot.
    h.max(1)
}

pub fn slot_for(group: &str, tenant: &str, slots: u32) -> SlotRef {
    let fp = fingerprint(group, tenant);
    let index = u32::try_from((fp >> 32) % u64::from(slots.max(1))).unwrap_or(0);
    SlotRef {
        index,
        fingerprint: fp,
    }
}

/// The shared-data key of a slot, `trl.<index>`, formatted on the stack:
/// it is named twice per request (read, then write).
#[derive(Clone, Copy)]
pub struct SlotKey {
    buf: [u8; SlotKey::CAPACITY],
    len: usize,
}

impl SlotKey {
    const PREFIX: &'static [u8] = b"trl.";
    /// The prefix and the ten digits of `u32::MAX`.
    const CAPACITY: usize = 14;

    pub fn new(index: u32) -> SlotKey {
        let mut digits = [0u8; 10];
        let mut n = index;
        let mut count = 0;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
            count += 1;
            if n == 0 {
                break;
            }
        }
        let mut buf = [0u8; SlotKey::CAPACITY];
        let prefix = SlotKey::PREFIX.len();
        put(&mut buf, 0, SlotKey::PREFIX);
        put(
            &mut buf,
            prefix,
            digits.get(digits.len() - count..).unwrap_or_default(),
        );
        SlotKey {
            buf,
            len: prefix + count,
        }
    }

    pub fn as_str(&self) -> &str {
        self.buf
            .get(..self.len)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
    }
}

/// What the local layer decided for a request.
#[derive(Debug, PartialEq, Eq)]
pub enum LocalVerdict {
    /// Ask the rate-limit service.
    Proceed,
    /// The tenant's bucket is empty: 429 with these headers, no call.
    BucketEmpty(Vec<(&'static str, String)>),
    /// The service refused this tenant and its window has not ended: 429
    /// with these headers, no call.
    CachedOverLimit(Vec<(&'static str, String)>),
    /// The tenant's slot is in use by another tenant: ask the service,
    /// with no local state for this tenant.
    Contended,
}

/// Decides a request from the stored slot; returns what to write back, if
/// anything (a refusal writes nothing, so floods cost no writes).
pub fn admit(
    stored: Option<&[u8]>,
    at: SlotRef,
    now_ms: u64,
    bucket: Option<BucketParams>,
    mode: HeaderMode,
) -> (LocalVerdict, Option<Slot>) {
    let Some(mut slot) = Slot::claim(stored, at.fingerprint, now_ms) else {
        return (LocalVerdict::Contended, None);
    };
    let mut expired = false;
    if let Some(o) = &slot.over_limit {
        if now_ms < o.until_ms {
            return (
                LocalVerdict::CachedOverLimit(cached_headers(o, now_ms, mode)),
                None,
            );
        }
        slot.over_limit = None;
        expired = true;
    }
    if let Some(p) = bucket {
        let current = slot.bucket.unwrap_or_else(|| TokenBucket::full(p, now_ms));
        match current.take(p, now_ms) {
            Ok(next) => slot.bucket = Some(next),
            Err(retry_after) => {
                return (
                    LocalVerdict::BucketEmpty(vec![(RETRY_AFTER, retry_after.to_string())]),
                    None,
                )
            }
        }
    }
    // Without a bucket, a tenant with nothing cached needs no write.
    let write = (expired || slot.bucket.is_some()).then_some(slot);
    (LocalVerdict::Proceed, write)
}

fn floor_second(ms: u64) -> u64 {
    ms - ms % 1_000
}

fn duration_ms(d: Option<&Duration>) -> u64 {
    d.map(|d| {
        let s = u64::try_from(d.seconds).unwrap_or(0);
        let n = u64::try_from(d.nanos).unwrap_or(0);
        s.saturating_mul(1_000).saturating_add(n / 1_000_000)
    })
    .unwrap_or(0)
}

/// The slot after the service refused the tenant, for a call sent at
/// `asked_at_ms`. The service counts in windows aligned to whole seconds and
/// reports whole seconds until the reset, from its own clock, which read at
/// or after the call went out; so the reset is at or after
/// `floor_second(asked_at) + duration_until_reset`. Taking that lower bound
/// means the cache can end early by at most a second (costing one more
/// call), never late: it stops refusing when the window ends. It refuses
/// until every over-limit window has reset, because until then the service
/// would refuse too.
pub fn remember_over_limit(
    stored: Option<&[u8]>,
    at: SlotRef,
    asked_at_ms: u64,
    statuses: &[DescriptorStatus],
) -> Option<Slot> {
    let base = floor_second(asked_at_ms);
    let snapshots: Vec<StatusSnapshot> = statuses
        .iter()
        .take(MAX_STATUSES)
        .map(|s| StatusSnapshot {
            requests_per_unit: s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
            unit: s.current_limit.as_ref().map_or(0, |l| l.unit),
            remaining: s.limit_remaining,
            over_limit: s.code() == Code::OverLimit,
            reset_at_ms: base.saturating_add(duration_ms(s.duration_until_reset.as_ref())),
        })
        .collect();
    let until_ms = snapshots
        .iter()
        .filter(|s| s.over_limit)
        .map(|s| s.reset_at_ms)
        .max()?;
    if until_ms <= asked_at_ms {
        return None;
    }
    let mut slot = match stored.and_then(Slot::decode) {
        Some(s) if s.fingerprint == at.fingerprint => s,
        Some(s) if s.refusing(asked_at_ms) => return None,
        _ => Slot::empty(at.fingerprint),
    };
    slot.over_limit = Some(OverLimit {
        until_ms,
        statuses: snapshots,
    });
    Some(slot)
}

/// The headers of a refusal from the cache: the X-RateLimit-* headers the
/// service's answer gave, as they stand now (a window that has reset since
/// counts as full again, and its reset moves to the next window end), and
/// Retry-After counting down to the end of the cached refusal.
pub fn cached_headers(o: &OverLimit, now_ms: u64, mode: HeaderMode) -> Vec<(&'static str, String)> {
    let mut headers = match mode {
        HeaderMode::DraftVersion03 => {
            // A slot holds at most MAX_STATUSES; built on the stack.
            let mut now_statuses: [DescriptorStatus; MAX_STATUSES] = Default::default();
            let mut n = 0;
            for (to, s) in now_statuses.iter_mut().zip(&o.statuses) {
                *to = status_at(s, now_ms);
                n += 1;
            }
            draft03_headers(now_statuses.get(..n).unwrap_or_default())
        }
        HeaderMode::Off => Vec::with_capacity(1),
    };
    let retry_ms = o.until_ms.saturating_sub(now_ms);
    headers.push((RETRY_AFTER, retry_ms.div_ceil(1_000).max(1).to_string()));
    headers
}

fn status_at(s: &StatusSnapshot, now_ms: u64) -> DescriptorStatus {
    let window_ms = crate::proto::RateLimitUnit::try_from(s.unit)
        .map(|u| u.window_seconds() * 1_000)
        .unwrap_or(0);
    let (remaining, reset_at) = if now_ms < s.reset_at_ms || window_ms == 0 {
        (s.remaining, s.reset_at_ms)
    } else {
        let windows_past = (now_ms - s.reset_at_ms) / window_ms + 1;
        (
            s.requests_per_unit,
            s.reset_at_ms + windows_past * window_ms,
        )
    };
    let left = reset_at.saturating_sub(now_ms);
    DescriptorStatus {
        code: if s.over_limit && now_ms < s.reset_at_ms {
            Code::OverLimit as i32
        } else {
            Code::Ok as i32
        },
        current_limit: Some(RateLimit {
            requests_per_unit: s.requests_per_unit,
            unit: s.unit,
            ..RateLimit::default()
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(Duration {
            seconds: i64::try_from(left / 1_000).unwrap_or(i64::MAX),
            nanos: i32::try_from((left % 1_000) * 1_000_000).unwrap_or(0),
        }),
    }
}

/// Why a shared-data operation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    /// Another worker wrote the slot since it was read.
    CasMismatch,
    /// Any other host failure.
    Host(String),
}

/// The shared-data slots, as the glue provides them.
pub trait SharedStore {
    /// The slot's value and its CAS token.
    fn get(&self, index: u32) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;
    /// Writes the slot if its CAS token is still `cas`.
    fn set(&self, index: u32, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// Why a read-modify-write of a slot did not complete.
#[derive(Debug, PartialEq, Eq)]
pub enum UpdateError {
    /// Every attempt lost its CAS race.
    CasRetriesExhausted,
    Host(String),
}

/// Reads a slot, computes, and writes the result back under the CAS token
/// of the read, retrying up to `attempts` times when another worker wrote in
/// between. `step` gets the stored bytes and returns its result and the
/// slot to write, if any; a result with nothing to write needs no CAS.
pub fn update<S, T, F>(store: &S, index: u32, attempts: u32, mut step: F) -> Result<T, UpdateError>
where
    S: SharedStore + ?Sized,
    F: FnMut(Option<&[u8]>) -> (T, Option<Slot>),
{
    for _ in 0..attempts {
        let (stored, cas) = store
            .get(index)
            .map_err(|e| UpdateError::Host(format!("{e:?}")))?;
        let (result, write) = step(stored.as_deref());
        let Some(slot) = write else {
            return Ok(result);
        };
        match store.set(index, &slot.encode_fixed(), cas) {
            Ok(()) => return Ok(result),
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Host(e)) => return Err(UpdateError::Host(e)),
        }
    }
    Err(UpdateError::CasRetriesExhausted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RateLimitUnit;
    use proptest::prelude::*;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    fn params(rate: u32, burst: u32) -> BucketParams {
        BucketParams {
            tokens_per_second: rate,
            burst,
        }
    }

    #[test]
    fn a_full_bucket_admits_burst_then_refills_at_rate() {
        let p = params(10, 20);
        let mut b = TokenBucket::full(p, 1_000);
        for _ in 0..20 {
            b = b.take(p, 1_000).unwrap();
        }
        assert_eq!(b.take(p, 1_000), Err(1));
        // 100 ms at 10/s is one token.
        assert_eq!(b.take(p, 1_099), Err(1));
        let b = b.take(p, 1_100).unwrap();
        assert_eq!(b.milli_tokens, 0);
        // A long idle gap refills to burst, not beyond.
        let b = b.refilled(p, 1_100 + 3_600_000);
        assert_eq!(b.milli_tokens, 20_000);
    }

    #[test]
    fn retry_after_is_the_time_to_the_next_token_rounded_up() {
        let p = params(1, 1);
        let empty = TokenBucket {
            milli_tokens: 0,
            updated_ms: 0,
        };
        assert_eq!(empty.take(p, 0), Err(1));
        assert_eq!(empty.take(p, 999), Err(1));
        assert!(empty.take(p, 1_000).is_ok());
    }

    #[test]
    fn a_clock_step_back_neither_refills_nor_freezes_the_bucket() {
        let p = params(10, 10);
        let b = TokenBucket {
            milli_tokens: 0,
            updated_ms: 10_000_000,
        };
        // A small step back (workers' reads out of order): keep the reference.
        let small = b.refilled(p, 10_000_000 - 500);
        assert_eq!(small, b);
        // An hour back: re-anchor, so the bucket refills from the new time
        // instead of staying empty for an hour.
        let big = b.refilled(p, 10_000_000 - 3_600_000);
        assert_eq!(big.milli_tokens, 0);
        assert_eq!(big.updated_ms, 10_000_000 - 3_600_000);
        assert!(big.take(p, 10_000_000 - 3_600_000 + 100).is_ok());
    }

    #[test]
    fn extreme_values_saturate_instead_of_overflowing() {
        let p = params(u32::MAX, u32::MAX);
        let b = TokenBucket {
            milli_tokens: 0,
            updated_ms: 0,
        };
        let b = b.refilled(p, u64::MAX);
        assert_eq!(b.milli_tokens, u64::from(u32::MAX) * 1_000);
    }

    proptest! {
        /// With a clock that only moves forward, any run of requests admits
        /// at most burst + rate × elapsed.
        #[test]
        fn never_admits_more_than_burst_plus_rate_times_elapsed(
            rate in 1u32..1_000,
            burst in 1u32..200,
            steps in prop::collection::vec(0u64..50, 1..400),
        ) {
            let p = params(rate, burst);
            let start = 1_700_000_000_000u64;
            let mut b = TokenBucket::full(p, start);
            let mut now = start;
            let mut admitted = 0u64;
            for step in steps {
                now += step;
                if let Ok(next) = b.take(p, now) {
                    b = next;
                    admitted += 1;
                }
                let bound = u64::from(burst) * 1_000 + (now - start) * u64::from(rate);
                prop_assert!(admitted * 1_000 <= bound, "admitted {admitted} by {now}");
            }
        }

        /// With a clock that jumps both ways, nothing panics, tokens stay
        /// within [0, burst], and admissions stay within burst + rate × the
        /// forward movement of the bucket's reference time.
        #[test]
        fn clock_steps_both_ways_are_safe(
            rate in 1u32..1_000,
            burst in 1u32..200,
            steps in prop::collection::vec(-5_000i64..5_000, 1..400),
        ) {
            let p = params(rate, burst);
            let mut now: u64 = 1_000_000_000;
            let mut b = TokenBucket::full(p, now);
            let mut admitted = 0u64;
            let mut forward = 0u64;
            for step in steps {
                now = now.saturating_add_signed(step);
                let before = b.updated_ms;
                if let Ok(next) = b.take(p, now) {
                    b = next;
                    admitted += 1;
                } else {
                    b = b.refilled(p, now);
                }
                forward += b.updated_ms.saturating_sub(before);
                prop_assert!(b.milli_tokens <= u64::from(burst) * 1_000);
                prop_assert!(admitted * 1_000 <= u64::from(burst) * 1_000 + forward * u64::from(rate));
            }
        }

        #[test]
        fn slots_round_trip(
            fp in 1u64..,
            tokens in any::<u64>(),
            updated in any::<u64>(),
            until in any::<u64>(),
            n in 0usize..=4,
            remaining in any::<u32>(),
        ) {
            let slot = Slot {
                fingerprint: fp,
                bucket: Some(TokenBucket { milli_tokens: tokens, updated_ms: updated }),
                over_limit: Some(OverLimit {
                    until_ms: until,
                    statuses: (0..n).map(|i| StatusSnapshot {
                        requests_per_unit: i as u32 + 1,
                        unit: i as i32 + 1,
                        remaining,
                        over_limit: i % 2 == 0,
                        reset_at_ms: until / 2,
                    }).collect(),
                }),
            };
            let bytes = slot.encode();
            prop_assert_eq!(bytes.len(), SLOT_BYTES);
            prop_assert_eq!(Slot::decode(&bytes), Some(slot));
        }

        #[test]
        fn any_bytes_decode_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = Slot::decode(&bytes);
            let _ = Slot::for_tenant(Some(&bytes), 7);
        }
    }

    #[test]
    fn a_zeroed_slot_is_empty_and_another_tenant_takes_a_slot_over() {
        assert_eq!(Slot::decode(&[0u8; SLOT_BYTES]), None);
        let theirs = Slot {
            fingerprint: 1,
            bucket: Some(TokenBucket {
                milli_tokens: 0,
                updated_ms: 5,
            }),
            over_limit: None,
        };
        let mine = Slot::for_tenant(Some(&theirs.encode()), 2);
        assert_eq!(mine, Slot::empty(2));
    }

    const OTHER: SlotRef = SlotRef {
        index: 0,
        fingerprint: 7,
    };

    #[test]
    fn a_slot_stays_with_a_tenant_that_uses_it_and_passes_on_when_it_goes_quiet() {
        let p = params(100, 100);
        let mode = HeaderMode::Off;
        // AT takes a token at 10 s.
        let (_, write) = admit(None, AT, 10_000, Some(p), mode);
        let held = write.unwrap().encode();
        // Another tenant on the same slot, while AT's bucket was used less
        // than SLOT_HOLD_MS ago: asked about, nothing written, AT keeps it.
        let last = 10_000 + SLOT_HOLD_MS - 1;
        assert_eq!(
            admit(Some(&held), OTHER, last, Some(p), mode),
            (LocalVerdict::Contended, None)
        );
        // AT's clock read out of order (before its own write): still held.
        assert_eq!(
            admit(Some(&held), OTHER, 9_990, Some(p), mode),
            (LocalVerdict::Contended, None)
        );
        // Once AT has been quiet that long, the other tenant takes the slot
        // with a full bucket of its own.
        let (v, write) = admit(Some(&held), OTHER, last + 1, Some(p), mode);
        assert_eq!(v, LocalVerdict::Proceed);
        let taken = write.unwrap();
        assert_eq!(taken.fingerprint, OTHER.fingerprint);
        assert_eq!(taken.bucket.unwrap().milli_tokens, 99_000);
    }

    #[test]
    fn two_busy_tenants_on_one_slot_do_not_reset_each_others_bucket() {
        // Before the hold, alternating tenants took the slot from each other
        // and each started with a full bucket every time: neither was shed.
        let p = params(1, 5);
        let mode = HeaderMode::Off;
        let mut stored: Option<Vec<u8>> = None;
        let (mut refused, mut contended) = (0, 0);
        for i in 0..100u64 {
            let who = if i % 2 == 0 { AT } else { OTHER };
            let (v, write) = admit(stored.as_deref(), who, 1_000 + i, Some(p), mode);
            match v {
                LocalVerdict::BucketEmpty(_) => refused += 1,
                LocalVerdict::Contended => contended += 1,
                _ => {}
            }
            if let Some(s) = write {
                stored = Some(s.encode());
            }
        }
        // AT came first and keeps the slot: 5 tokens, then refusals; OTHER
        // is asked about every time.
        assert_eq!((refused, contended), (45, 50));
    }

    #[test]
    fn a_refusal_to_remember_takes_a_slot_unless_one_is_already_cached() {
        let statuses = [status(Code::OverLimit, RateLimitUnit::Minute, 5, 0, 30)];
        // A bucket in use gives way to a refusal (it saves more calls).
        let (_, write) = admit(None, AT, 1_000, Some(params(5, 5)), HeaderMode::Off);
        let bucket_held = write.unwrap().encode();
        let slot = remember_over_limit(Some(&bucket_held), OTHER, 1_000, &statuses).unwrap();
        assert_eq!(slot.fingerprint, OTHER.fingerprint);
        // A cached refusal that has not ended stays.
        let refusal_held = slot.encode();
        assert_eq!(
            remember_over_limit(Some(&refusal_held), AT, 2_000, &statuses),
            None
        );
        // After it ends, the next refusal takes the slot.
        let later = remember_over_limit(Some(&refusal_held), AT, 31_000, &statuses).unwrap();
        assert_eq!(later.fingerprint, AT.fingerprint);
    }

    #[test]
    fn slot_keys_are_the_prefix_and_the_index() {
        for i in [0, 7, 10, 99, 4_095, 1_048_575, u32::MAX] {
            assert_eq!(SlotKey::new(i).as_str(), format!("trl.{i}"));
        }
    }

    #[test]
    fn slots_spread_and_stay_in_range() {
        let slots = 64;
        let mut used = std::collections::HashSet::new();
        for i in 0..10_000 {
            let r = slot_for("default", &format!("tenant-{i}"), slots);
            assert!(r.index < slots);
            used.insert(r.index);
        }
        assert_eq!(used.len(), 64);
        assert_ne!(
            slot_for("default", "a", slots).fingerprint,
            slot_for("gold", "a", slots).fingerprint
        );
        assert_eq!(slot_for("g", "t", 0).index, 0);
    }

    fn status(
        code: Code,
        unit: RateLimitUnit,
        limit: u32,
        remaining: u32,
        reset_s: i64,
    ) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit {
                requests_per_unit: limit,
                unit: unit as i32,
                ..RateLimit::default()
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration {
                seconds: reset_s,
                nanos: 0,
            }),
        }
    }

    const AT: SlotRef = SlotRef {
        index: 0,
        fingerprint: 42,
    };

    #[test]
    fn the_cache_refuses_until_every_over_limit_window_has_reset() {
        // Asked at 100.7 s: over the minute (resets in 20 s) and the second.
        let statuses = [
            status(Code::OverLimit, RateLimitUnit::Second, 5, 0, 1),
            status(Code::OverLimit, RateLimitUnit::Minute, 20, 0, 20),
            status(Code::Ok, RateLimitUnit::Hour, 30, 9, 3_500),
        ];
        let slot = remember_over_limit(None, AT, 100_700, &statuses).unwrap();
        let o = slot.over_limit.clone().unwrap();
        assert_eq!(o.until_ms, 120_000);
        let stored = slot.encode();
        let mode = HeaderMode::DraftVersion03;
        let (v, write) = admit(Some(&stored), AT, 100_800, None, mode);
        assert_eq!(write, None);
        assert_eq!(
            v,
            LocalVerdict::CachedOverLimit(vec![
                (
                    "x-ratelimit-limit",
                    "5, 5;w=1, 20;w=60, 30;w=3600".to_string()
                ),
                ("x-ratelimit-remaining", "0".to_string()),
                ("x-ratelimit-reset", "0".to_string()),
                ("retry-after", "20".to_string()),
            ])
        );
        // After the second has reset, the minute is the tightest.
        let (v, _) = admit(Some(&stored), AT, 110_500, None, mode);
        assert_eq!(
            v,
            LocalVerdict::CachedOverLimit(vec![
                (
                    "x-ratelimit-limit",
                    "20, 5;w=1, 20;w=60, 30;w=3600".to_string()
                ),
                ("x-ratelimit-remaining", "0".to_string()),
                ("x-ratelimit-reset", "9".to_string()),
                ("retry-after", "10".to_string()),
            ])
        );
        // At the end of the minute the tenant is asked about again.
        let (v, write) = admit(Some(&stored), AT, 120_000, None, mode);
        assert_eq!(v, LocalVerdict::Proceed);
        assert_eq!(write.unwrap().over_limit, None);
        // Headers off: only Retry-After.
        let (v, _) = admit(Some(&stored), AT, 119_001, None, HeaderMode::Off);
        assert_eq!(
            v,
            LocalVerdict::CachedOverLimit(vec![("retry-after", "1".to_string())])
        );
    }

    #[test]
    fn the_cache_never_outlives_the_window_even_across_a_boundary() {
        // The call went out at 9.999 s; the service read its clock at 10.001
        // s and said "resets in 1 s" (at 11 s). The cache ends at 10 s: a
        // second early (one more call), never late.
        let statuses = [status(Code::OverLimit, RateLimitUnit::Second, 5, 0, 1)];
        let o = remember_over_limit(None, AT, 9_999, &statuses)
            .unwrap()
            .over_limit
            .unwrap();
        assert_eq!(o.until_ms, 10_000);
        // An answer that is already over by the time it is read caches nothing.
        assert_eq!(
            remember_over_limit(
                None,
                AT,
                9_999,
                &[status(Code::OverLimit, RateLimitUnit::Second, 5, 0, 0)]
            ),
            None
        );
        // No over-limit status: nothing to remember.
        assert_eq!(
            remember_over_limit(
                None,
                AT,
                0,
                &[status(Code::Ok, RateLimitUnit::Second, 5, 1, 1)]
            ),
            None
        );
    }

    #[test]
    fn remembering_keeps_the_tenants_bucket() {
        let p = params(5, 5);
        let (v, write) = admit(None, AT, 1_000, Some(p), HeaderMode::Off);
        assert_eq!(v, LocalVerdict::Proceed);
        let stored = write.unwrap().encode();
        let statuses = [status(Code::OverLimit, RateLimitUnit::Minute, 5, 0, 30)];
        let slot = remember_over_limit(Some(&stored), AT, 1_000, &statuses).unwrap();
        assert_eq!(slot.bucket.unwrap().milli_tokens, 4_000);
    }

    #[test]
    fn without_a_bucket_nothing_is_written_until_there_is_something_to_remember() {
        assert_eq!(
            admit(None, AT, 0, None, HeaderMode::Off),
            (LocalVerdict::Proceed, None)
        );
    }

    #[test]
    fn an_empty_bucket_refuses_without_writing() {
        let p = params(1, 2);
        let mut stored = None;
        let mut verdicts = Vec::new();
        for _ in 0..3 {
            let (v, write) = admit(
                stored.as_deref(),
                AT,
                5_000,
                Some(p),
                HeaderMode::DraftVersion03,
            );
            if let Some(s) = write {
                stored = Some(s.encode());
            }
            verdicts.push(v);
        }
        assert_eq!(
            verdicts,
            vec![
                LocalVerdict::Proceed,
                LocalVerdict::Proceed,
                LocalVerdict::BucketEmpty(vec![("retry-after", "1".to_string())]),
            ]
        );
    }

    const BIG: BucketParams = BucketParams {
        tokens_per_second: 1,
        burst: 100_000,
    };

    /// Shared data as Envoy keeps it (a value and a CAS token per key), with
    /// a hook that lets another "worker" write between a read and a write.
    #[derive(Default)]
    struct FakeStore {
        data: RefCell<HashMap<u32, (Vec<u8>, u32)>>,
        next_cas: Cell<u32>,
        /// Writes by others to inject after each of the next reads.
        interfere: Cell<u32>,
    }

    impl FakeStore {
        fn write(&self, index: u32, value: Vec<u8>) {
            self.next_cas.set(self.next_cas.get() + 1);
            self.data
                .borrow_mut()
                .insert(index, (value, self.next_cas.get()));
        }
    }

    impl SharedStore for FakeStore {
        fn get(&self, index: u32) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
            let r = match self.data.borrow().get(&index) {
                Some((v, cas)) => (Some(v.clone()), Some(*cas)),
                None => (None, None),
            };
            if self.interfere.get() > 0 {
                self.interfere.set(self.interfere.get() - 1);
                // Another worker takes a token in between.
                let (_, w) = admit(r.0.as_deref(), AT, 1_000, Some(BIG), HeaderMode::Off);
                self.write(index, w.unwrap().encode());
            }
            Ok(r)
        }

        fn set(&self, index: u32, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            let current = self.data.borrow().get(&index).map(|(_, c)| *c);
            if cas.is_some() && cas != current {
                return Err(StoreError::CasMismatch);
            }
            self.write(index, value.to_vec());
            Ok(())
        }
    }

    fn take_one(store: &FakeStore) -> Result<LocalVerdict, UpdateError> {
        update(store, AT.index, CAS_ATTEMPTS, |stored| {
            admit(stored, AT, 1_000, Some(BIG), HeaderMode::Off)
        })
    }

    const FULL: u64 = 100_000_000;

    fn tokens(store: &FakeStore) -> u64 {
        let data = store.data.borrow();
        Slot::decode(&data.get(&AT.index).unwrap().0)
            .unwrap()
            .bucket
            .unwrap()
            .milli_tokens
    }

    #[test]
    fn a_lost_cas_race_is_retried_and_no_token_is_lost() {
        let store = FakeStore::default();
        store.write(AT.index, vec![0; SLOT_BYTES]);
        assert_eq!(take_one(&store), Ok(LocalVerdict::Proceed));
        assert_eq!(tokens(&store), FULL - 1_000);
        // Three other workers write in between: three retries, and every
        // token taken is accounted for (1 + 3 + 1).
        store.interfere.set(3);
        assert_eq!(take_one(&store), Ok(LocalVerdict::Proceed));
        assert_eq!(tokens(&store), FULL - 5_000);
    }

    #[test]
    fn cas_retries_run_out() {
        let store = FakeStore::default();
        store.write(AT.index, vec![0; SLOT_BYTES]);
        store.interfere.set(CAS_ATTEMPTS);
        assert_eq!(take_one(&store), Err(UpdateError::CasRetriesExhausted));
        // The others' writes stand; ours was never applied.
        assert_eq!(tokens(&store), FULL - u64::from(CAS_ATTEMPTS) * 1_000);
        // One fewer interference and the last attempt succeeds.
        store.interfere.set(CAS_ATTEMPTS - 1);
        assert_eq!(take_one(&store), Ok(LocalVerdict::Proceed));
    }

    proptest! {
        /// Whatever the interleaving of interfering writers, every admitted
        /// request took exactly one token.
        #[test]
        fn cas_updates_never_lose_or_double_count(interference in prop::collection::vec(0u32..10, 1..30)) {
            let store = FakeStore::default();
            store.write(AT.index, vec![0; SLOT_BYTES]);
            let mut taken = 0u64;
            for i in interference {
                store.interfere.set(i);
                let before = store.interfere.get();
                let r = take_one(&store);
                let others = u64::from(before - store.interfere.get());
                taken += others;
                match r {
                    Ok(LocalVerdict::Proceed) => taken += 1,
                    Err(UpdateError::CasRetriesExhausted) => {}
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
                store.interfere.set(0);
                prop_assert_eq!(tokens(&store), FULL - taken * 1_000);
            }
        }
    }

    #[test]
    fn host_errors_end_the_update() {
        struct Broken;
        impl SharedStore for Broken {
            fn get(&self, _: u32) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
                Ok((None, None))
            }
            fn set(&self, _: u32, _: &[u8], _: Option<u32>) -> Result<(), StoreError> {
                Err(StoreError::Host("NotFound".into()))
            }
        }
        let r = update(&Broken, 0, CAS_ATTEMPTS, |s| {
            admit(s, AT, 0, Some(params(1, 1)), HeaderMode::Off)
        });
        assert_eq!(r, Err(UpdateError::Host("NotFound".into())));
    }
}
