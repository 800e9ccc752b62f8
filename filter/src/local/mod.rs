//! The local layer: a token bucket and an over-limit cache per tenant, kept
//! in proxy-wasm shared data so that every worker of one Envoy sees them,
//! decided before any network call.
//!
//! Shared data is never deleted, so the keyspace is fixed: `slots` keys,
//! created once, each holding one tenant's state and a fingerprint of that
//! tenant. The slot and the fingerprint come from a keyed hash (SipHash-2-4)
//! whose 128-bit key is drawn when the first VM configures
//! (`secret`), so nobody outside can choose tenants that land on a given
//! slot. A tenant that hashes to a slot held by another takes it over
//! (with a full bucket and no cached refusal) once the holder no longer
//! uses it (`slot::Slot::claim`). Losing a slot that way only costs calls
//! to the rate-limit service: the local layer refuses, it never admits on
//! its own, so the fleet-wide limit still holds.
//!
//! One concern per file, all pure, with time passed in as milliseconds
//! since the Unix epoch:
//!
//! - `bucket`: token-bucket arithmetic;
//! - `over_limit`: the over-limit cache and the headers of its refusals;
//! - `placement`: where a tenant lives (the keyed hash, the slot's key);
//! - `slot`: a slot's state, its binary encoding, and who owns a slot
//!   (decided in one place, `Slot::claim`);
//! - `names`: the rule names of cached refusals, in a fixed shared table;
//! - `secret`: the key of the slot hash, agreed by every VM at configure;
//! - `cas`: the read-modify-write of a slot under Envoy's CAS;
//! - this file: the local decision for one request (`admit`), and what a
//!   refusal of the service leaves in the slot (`remember_refusal`).

pub mod bucket;
pub mod cas;
pub mod names;
pub mod over_limit;
pub mod placement;
pub mod secret;
pub mod slot;
pub mod state;

use ratelimit_config::{BucketParams, HeaderMode};

pub use bucket::TokenBucket;
pub use cas::{create, update, update_key, UpdateError, CAS_ATTEMPTS};
pub use over_limit::{cached_headers, cached_headers_named, OverLimit, StatusSnapshot};
pub use placement::{
    route_slot_for, slot_for, Scope, ScopeBuilder, SlotKey, SlotRef, SlotSecret, Slots, SLOT_PROBES,
};
pub use secret::{agree, Agreed, SECRET_KEY};
pub use slot::{Claim, ModeState, Slot, Stranded, SLOT_BYTES, SLOT_HOLD_MS};

use crate::headers::RETRY_AFTER;
use crate::proto::DescriptorStatus;

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
    admit_named(stored, at, now_ms, bucket, mode, &|_| None, 1)
}

/// `admit` for a request that costs `cost` hits: the bucket gives `cost`
/// tokens or refuses.
pub fn admit_cost(
    stored: Option<&[u8]>,
    at: SlotRef,
    now_ms: u64,
    bucket: Option<BucketParams>,
    mode: HeaderMode,
    cost: u32,
) -> (LocalVerdict, Option<Slot>) {
    admit_named(stored, at, now_ms, bucket, mode, &|_| None, cost)
}

/// `admit` for a request that costs `cost` hits, reading the rule names of
/// a cached refusal with `name` (see `names`; not called when the refusal
/// has none).
pub fn admit_named(
    stored: Option<&[u8]>,
    at: SlotRef,
    now_ms: u64,
    bucket: Option<BucketParams>,
    mode: HeaderMode,
    name: &dyn Fn(u8) -> Option<String>,
    cost: u32,
) -> (LocalVerdict, Option<Slot>) {
    let Some(mut slot) = Slot::claim(stored, at.fingerprint, now_ms, Claim::Request) else {
        return (LocalVerdict::Contended, None);
    };
    match decide(&mut slot, now_ms, bucket, mode, name, cost) {
        Ok(changed) => (LocalVerdict::Proceed, changed.then_some(slot)),
        Err(refusal) => (refusal, None),
    }
}

/// The local decision on a slot the tenant holds: `Ok(changed)` when the
/// request proceeds (whether the slot changed and needs writing), else the
/// refusal (the slot unchanged: a refusal writes nothing, so floods cost no
/// writes).
pub fn decide(
    slot: &mut Slot,
    now_ms: u64,
    bucket: Option<BucketParams>,
    mode: HeaderMode,
    name: &dyn Fn(u8) -> Option<String>,
    cost: u32,
) -> Result<bool, LocalVerdict> {
    let mut expired = false;
    if let Some(o) = &slot.over_limit {
        if now_ms < o.until_ms {
            return Err(LocalVerdict::CachedOverLimit(cached_headers_named(
                o, now_ms, mode, name,
            )));
        }
        slot.over_limit = None;
        expired = true;
    }
    if let Some(p) = bucket {
        let current = slot.bucket.unwrap_or_else(|| TokenBucket::full(p, now_ms));
        match current.take_n(p, now_ms, cost) {
            Ok(next) => slot.bucket = Some(next),
            Err(retry_after) => {
                return Err(LocalVerdict::BucketEmpty(vec![(
                    RETRY_AFTER,
                    retry_after.to_string(),
                )]))
            }
        }
    }
    // Without a bucket, a tenant with nothing cached needs no write.
    Ok(expired || slot.bucket.is_some())
}

/// The slot after the service refused the tenant, for a call sent at
/// `asked_at_ms`: `remember_refusal` with the answer read at once.
pub fn remember_over_limit(
    stored: Option<&[u8]>,
    at: SlotRef,
    asked_at_ms: u64,
    statuses: &[DescriptorStatus],
) -> Option<Slot> {
    remember_refusal(stored, at, asked_at_ms, asked_at_ms, statuses, &[])
}

/// The slot after the service refused the tenant, for a call sent at
/// `asked_at_ms` and answered at `answered_at_ms` (`over_limit::refusal`;
/// `names[i]` is the id of status `i`'s rule name); None when there is
/// nothing to remember, or the slot's holder keeps it (`Claim::Refusal`).
pub fn remember_refusal(
    stored: Option<&[u8]>,
    at: SlotRef,
    asked_at_ms: u64,
    answered_at_ms: u64,
    statuses: &[DescriptorStatus],
    names: &[u8],
) -> Option<Slot> {
    let refusal = over_limit::refusal(asked_at_ms, answered_at_ms, statuses, names)?;
    let now_ms = answered_at_ms.max(asked_at_ms);
    if refusal.until_ms <= now_ms {
        return None;
    }
    let mut slot = Slot::claim(stored, at.fingerprint, now_ms, Claim::Refusal)?;
    // Tokens of a lease the service granted are this Envoy's to spend: a
    // refusal (of a call answered after that grant) does not hide them.
    if matches!(slot.mode, ModeState::Lease(l) if l.tokens > 0 && now_ms < l.until_ms) {
        return None;
    }
    slot.over_limit = Some(refusal);
    Some(slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Code, RateLimitUnit};
    use crate::testing::status;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn params(rate: u32, burst: u32) -> BucketParams {
        BucketParams {
            tokens_per_second: rate,
            burst,
        }
    }

    const AT: SlotRef = SlotRef {
        index: 0,
        fingerprint: 42,
    };

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
        let statuses = [status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 30)];
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
    fn a_refusal_does_not_hide_the_tokens_of_a_lease_still_held() {
        let statuses = [status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 30)];
        let held = |tokens| {
            let mut slot = Slot::claim(None, AT.fingerprint, 1_000, Claim::Request).unwrap();
            slot.mode = ModeState::Lease(crate::local::state::Lease {
                tokens,
                until_ms: 60_000,
                ..Default::default()
            });
            slot.encode()
        };
        // Granted tokens are spent first: the refusal is not cached.
        assert_eq!(
            remember_over_limit(Some(&held(3)), AT, 2_000, &statuses),
            None
        );
        // Without tokens, or once their window ended, it is.
        assert!(remember_over_limit(Some(&held(0)), AT, 2_000, &statuses).is_some());
        let later = [status(Code::OverLimit, 5, RateLimitUnit::Minute, 0, 90)];
        assert!(remember_over_limit(Some(&held(3)), AT, 61_000, &later).is_some());
    }

    #[test]
    fn without_a_bucket_nothing_is_written_until_there_is_something_to_remember() {
        assert_eq!(
            admit(None, AT, 0, None, HeaderMode::Off),
            (LocalVerdict::Proceed, None)
        );
    }

    #[test]
    fn a_costly_request_takes_its_cost_from_the_bucket() {
        let p = params(1, 10);
        let (v, write) = admit_cost(None, AT, 5_000, Some(p), HeaderMode::Off, 7);
        assert_eq!(v, LocalVerdict::Proceed);
        let stored = write.unwrap().encode();
        // 3 left: a cost of 4 is refused (no write), a cost of 3 fits.
        let (v, write) = admit_cost(Some(&stored), AT, 5_000, Some(p), HeaderMode::Off, 4);
        assert_eq!(
            v,
            LocalVerdict::BucketEmpty(vec![("retry-after", "1".to_string())])
        );
        assert_eq!(write, None);
        let (v, write) = admit_cost(Some(&stored), AT, 5_000, Some(p), HeaderMode::Off, 3);
        assert_eq!(v, LocalVerdict::Proceed);
        assert_eq!(write.unwrap().bucket.unwrap().milli_tokens, 0);
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
}
