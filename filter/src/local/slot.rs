//! One tenant's state in one shared-data slot: the fixed-size binary
//! encoding, where a tenant lives (index and fingerprint), the slot's key,
//! and who owns a slot (`Slot::claim`, the one place that decides it).

use crate::lease::Lease;
use crate::local::bucket::TokenBucket;
use crate::local::over_limit::{OverLimit, StatusSnapshot, MAX_STATUSES};
use crate::sync::SyncState;

/// One tenant's state in one shared-data slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub fingerprint: u64,
    pub bucket: Option<TokenBucket>,
    pub over_limit: Option<OverLimit>,
    /// The tenant's lease (lease mode only).
    pub lease: Option<Lease>,
    /// The tenant's view of the fleet's count and its unsynced hits (sync
    /// mode only; a slot's tenant has one group, so one mode: the lease and
    /// the sync state share the slot's mode block).
    pub sync: Option<SyncState>,
}

/// Why a tenant claims a slot; the two give way to a holder differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// A request: takes a slot whose holder no longer uses it.
    Request,
    /// A refusal from the service, to remember: worth more than a bucket,
    /// it takes a slot unless the holder's own refusal is still cached.
    Refusal,
}

impl Slot {
    pub fn empty(fingerprint: u64) -> Slot {
        Slot {
            fingerprint,
            bucket: None,
            over_limit: None,
            lease: None,
            sync: None,
        }
    }

    /// Who owns the slot, decided here and nowhere else: the slot's state
    /// for `fingerprint` at `now_ms`. What is stored when it is that
    /// tenant's; a fresh state when the slot is empty, unreadable, or held
    /// by a tenant that no longer needs it for this kind of claim; `None`
    /// when the holder keeps it (see `SLOT_HOLD_MS`).
    pub fn claim(stored: Option<&[u8]>, fingerprint: u64, now_ms: u64, why: Claim) -> Option<Slot> {
        match stored.and_then(Slot::decode) {
            Some(s) if s.fingerprint == fingerprint => Some(s),
            Some(s) if s.fingerprint != 0 && s.held_against(why, now_ms) => None,
            _ => Some(Slot::empty(fingerprint)),
        }
    }

    /// The stored slot if it is `fingerprint`'s, else None (nothing is
    /// claimed: for the root's work on a tenant's state).
    pub fn decode_for(stored: Option<&[u8]>, fingerprint: u64) -> Option<Slot> {
        stored
            .and_then(Slot::decode)
            .filter(|s| s.fingerprint == fingerprint)
    }

    fn held_against(&self, why: Claim, now_ms: u64) -> bool {
        match why {
            Claim::Request => self.in_use(now_ms),
            Claim::Refusal => self.refusing(now_ms),
        }
    }

    /// Whether a refusal is cached that has not ended at `now_ms`.
    pub fn refusing(&self, now_ms: u64) -> bool {
        self.over_limit
            .as_ref()
            .is_some_and(|o| now_ms < o.until_ms)
    }

    /// Whether the slot's state still matters at `now_ms`: a cached refusal
    /// that has not ended, a bucket that took a token less than
    /// `SLOT_HOLD_MS` ago, or a lease in use (`Lease::in_use`).
    fn in_use(&self, now_ms: u64) -> bool {
        self.refusing(now_ms)
            || self
                .bucket
                .is_some_and(|b| now_ms < b.updated_ms.saturating_add(SLOT_HOLD_MS))
            || self.lease.as_ref().is_some_and(|l| l.in_use(now_ms))
            || self.sync.as_ref().is_some_and(|s| s.in_use(now_ms))
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

// Version 2 added the lease block. Every VM of one Envoy runs the same
// .wasm, so a slot of another version is only met across a reload, and is
// then taken as empty.
const VERSION: u8 = 2;
const HAS_BUCKET: u8 = 1;
const HAS_OVER_LIMIT: u8 = 2;
const HAS_LEASE: u8 = 4;
const HAS_SYNC: u8 = 8;
const HEADER_BYTES: usize = 36;
const STATUS_BYTES: usize = 20;
const MODE_AT: usize = HEADER_BYTES + MAX_STATUSES * STATUS_BYTES;
/// The mode block: a lease or a sync state, whichever is larger.
const MODE_BYTES: usize = if Lease::BYTES > SyncState::BYTES {
    Lease::BYTES
} else {
    SyncState::BYTES
};
/// Every slot value has this size, so the shared data never grows after the
/// slots are created: 180 bytes (the mode block is 64 of them).
pub const SLOT_BYTES: usize = MODE_AT + MODE_BYTES;

pub(crate) fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)?.try_into().ok().map(u64::from_le_bytes)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)?.try_into().ok().map(u32::from_le_bytes)
}

impl Slot {
    /// The fixed-size encoding: version, flags, fingerprint, bucket,
    /// over-limit deadline and up to four descriptor statuses (each with
    /// the id of its rule's name in `names`, 0 for none).
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
                put(&mut b, at + 4, &[unit, u8::from(s.over_limit), s.name, 0]);
                put(&mut b, at + 8, &s.remaining.to_le_bytes());
                put(&mut b, at + 12, &s.reset_at_ms.to_le_bytes());
            }
        }
        if let Some(l) = &self.lease {
            flags |= HAS_LEASE;
            if let Some(dst) = b.get_mut(MODE_AT..MODE_AT + Lease::BYTES) {
                l.encode(dst);
            }
        } else if let Some(s) = &self.sync {
            flags |= HAS_SYNC;
            if let Some(dst) = b.get_mut(MODE_AT..MODE_AT + SyncState::BYTES) {
                s.encode(dst);
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
                    name: *b.get(at + 6)?,
                });
            }
            Some(OverLimit {
                until_ms: u64_at(b, 26)?,
                statuses,
            })
        } else {
            None
        };
        let lease = if flags & HAS_LEASE != 0 {
            Some(Lease::decode(b.get(MODE_AT..MODE_AT + Lease::BYTES)?)?)
        } else {
            None
        };
        let sync = if flags & HAS_SYNC != 0 && lease.is_none() {
            Some(SyncState::decode(
                b.get(MODE_AT..MODE_AT + SyncState::BYTES)?,
            )?)
        } else {
            None
        };
        Some(Slot {
            fingerprint: u64_at(b, 2)?,
            bucket,
            over_limit,
            lease,
            sync,
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

/// The key of the hash that places tenants in slots: 128 bits drawn when the
/// first VM of an Envoy configures, the same in every VM (they share the
/// slots; see `secret`). Without it, whoever knows the hash could pick tenant
/// values that land on a victim's slot and take it over.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SlotSecret {
    k0: u64,
    k1: u64,
}

impl SlotSecret {
    pub const BYTES: usize = 16;

    pub const fn from_bytes(b: [u8; SlotSecret::BYTES]) -> SlotSecret {
        let [a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7] = b;
        SlotSecret {
            k0: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            k1: u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]),
        }
    }

    /// None unless `b` is exactly `BYTES` long.
    pub fn from_slice(b: &[u8]) -> Option<SlotSecret> {
        <[u8; SlotSecret::BYTES]>::try_from(b)
            .ok()
            .map(SlotSecret::from_bytes)
    }

    pub fn to_bytes(self) -> [u8; SlotSecret::BYTES] {
        let mut b = [0u8; SlotSecret::BYTES];
        put(&mut b, 0, &self.k0.to_le_bytes());
        put(&mut b, 8, &self.k1.to_le_bytes());
        b
    }
}

/// Never shows the key (in a debug log, a panic message).
impl std::fmt::Debug for SlotSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotSecret(..)")
    }
}

/// SipHash-2-4 (Aumasson and Bernstein), a keyed hash meant for exactly
/// this: short inputs an attacker chooses, a key they do not know. Byte by
/// byte: tenants are short (`max_tenant_length`, 128 by default).
struct SipHasher {
    v: [u64; 4],
    tail: u64,
    len: u64,
}

impl SipHasher {
    fn new(key: &SlotSecret) -> SipHasher {
        SipHasher {
            v: [
                key.k0 ^ 0x736f_6d65_7073_6575,
                key.k1 ^ 0x646f_7261_6e64_6f6d,
                key.k0 ^ 0x6c79_6765_6e65_7261,
                key.k1 ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            len: 0,
        }
    }

    fn round(&mut self) {
        let [mut v0, mut v1, mut v2, mut v3] = self.v;
        v0 = v0.wrapping_add(v1);
        v1 = v1.rotate_left(13) ^ v0;
        v0 = v0.rotate_left(32);
        v2 = v2.wrapping_add(v3);
        v3 = v3.rotate_left(16) ^ v2;
        v0 = v0.wrapping_add(v3);
        v3 = v3.rotate_left(21) ^ v0;
        v2 = v2.wrapping_add(v1);
        v1 = v1.rotate_left(17) ^ v2;
        v2 = v2.rotate_left(32);
        self.v = [v0, v1, v2, v3];
    }

    fn compress(&mut self, m: u64) {
        self.v[3] ^= m;
        self.round();
        self.round();
        self.v[0] ^= m;
    }

    fn write(&mut self, bytes: impl IntoIterator<Item = u8>) {
        for b in bytes {
            self.tail |= u64::from(b) << (8 * (self.len % 8));
            self.len = self.len.wrapping_add(1);
            if self.len % 8 == 0 {
                self.compress(self.tail);
                self.tail = 0;
            }
        }
    }

    fn finish(mut self) -> u64 {
        self.compress(((self.len & 0xff) << 56) | self.tail);
        self.v[2] ^= 0xff;
        for _ in 0..4 {
            self.round();
        }
        let [v0, v1, v2, v3] = self.v;
        v0 ^ v1 ^ v2 ^ v3
    }
}

/// The keyed hash of the group name and the tenant (a tenant that moves to
/// another group starts afresh).
fn fingerprint(key: &SlotSecret, group: &str, tenant: &str) -> u64 {
    let mut h = SipHasher::new(key);
    h.write(group.bytes().chain([0xff]).chain(tenant.bytes()));
    // 0 marks an empty slot.
    h.finish().max(1)
}

/// Where `tenant` of `group` lives among `slots` slots, under `key`.
pub fn slot_for(key: &SlotSecret, group: &str, tenant: &str, slots: u32) -> SlotRef {
    let fp = fingerprint(key, group, tenant);
    let index = u32::try_from((fp >> 32) % u64::from(slots.max(1))).unwrap_or(0);
    SlotRef {
        index,
        fingerprint: fp,
    }
}

/// The shared-data key of a slot, `trl.<index>`, formatted on the stack:
/// it is named on every request (a read, and a write when one is needed).
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn holding(fingerprint: u64, bucket_at: Option<u64>, refused_until: Option<u64>) -> Vec<u8> {
        Slot {
            fingerprint,
            bucket: bucket_at.map(|t| TokenBucket {
                milli_tokens: 0,
                updated_ms: t,
            }),
            over_limit: refused_until.map(|until_ms| OverLimit {
                until_ms,
                statuses: Vec::new(),
            }),
            lease: None,
            sync: None,
        }
        .encode()
    }

    proptest! {
        #[test]
        fn slots_round_trip(
            fp in 1u64..,
            tokens in any::<u64>(),
            updated in any::<u64>(),
            until in any::<u64>(),
            n in 0usize..=4,
            remaining in any::<u32>(),
            name in any::<u8>(),
            tokens_left in any::<u32>(),
            with_lease in any::<bool>(),
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
                        name: name.wrapping_add(i as u8),
                    }).collect(),
                }),
                lease: with_lease.then_some(Lease {
                    tokens: tokens_left,
                    until_ms: until,
                    refill_at_ms: updated,
                    remaining,
                    remaining_until_ms: until / 3,
                    rate_second: tokens,
                    rate_count: remaining / 2,
                    rate_prev: tokens_left / 2,
                }),
                sync: (!with_lease).then_some(SyncState {
                    views: [remaining, 1, 2, tokens_left],
                    view_until_ms: [until, updated, 3, 4],
                    unsynced: tokens_left,
                    in_flight: remaining / 3,
                    push_at_ms: updated / 2,
                }),
            };
            let bytes = slot.encode();
            prop_assert_eq!(bytes.len(), SLOT_BYTES);
            prop_assert_eq!(Slot::decode(&bytes), Some(slot));
        }

        #[test]
        fn any_bytes_decode_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = Slot::decode(&bytes);
            let _ = Slot::claim(Some(&bytes), 7, 0, Claim::Request);
            let _ = Slot::claim(Some(&bytes), 7, u64::MAX, Claim::Refusal);
        }
    }

    #[test]
    fn a_zeroed_slot_is_empty_and_free() {
        assert_eq!(Slot::decode(&[0u8; SLOT_BYTES]), None);
        for why in [Claim::Request, Claim::Refusal] {
            assert_eq!(
                Slot::claim(Some(&[0u8; SLOT_BYTES]), 2, 0, why),
                Some(Slot::empty(2))
            );
            assert_eq!(Slot::claim(None, 2, 0, why), Some(Slot::empty(2)));
        }
    }

    #[test]
    fn a_tenant_gets_its_own_state_back() {
        let mine = holding(2, Some(5), Some(10));
        let slot = Slot::claim(Some(&mine), 2, 1_000_000, Claim::Request).unwrap();
        assert_eq!(slot.encode(), mine);
    }

    #[test]
    fn a_request_waits_for_the_holder_to_go_quiet() {
        // The holder's bucket took a token at 10 s.
        let theirs = holding(1, Some(10_000), None);
        let last = 10_000 + SLOT_HOLD_MS - 1;
        assert_eq!(Slot::claim(Some(&theirs), 2, last, Claim::Request), None);
        assert_eq!(
            Slot::claim(Some(&theirs), 2, last + 1, Claim::Request),
            Some(Slot::empty(2))
        );
        // A cached refusal holds the slot until it ends, for requests too.
        let refused = holding(1, None, Some(60_000));
        assert_eq!(Slot::claim(Some(&refused), 2, 59_999, Claim::Request), None);
        assert!(Slot::claim(Some(&refused), 2, 60_000, Claim::Request).is_some());
    }

    #[test]
    fn a_refusal_takes_a_slot_from_a_bucket_but_not_from_a_refusal() {
        let bucket_held = holding(1, Some(10_000), None);
        assert_eq!(
            Slot::claim(Some(&bucket_held), 2, 10_000, Claim::Refusal),
            Some(Slot::empty(2))
        );
        let refusal_held = holding(1, None, Some(60_000));
        assert_eq!(
            Slot::claim(Some(&refusal_held), 2, 59_999, Claim::Refusal),
            None
        );
        assert_eq!(
            Slot::claim(Some(&refusal_held), 2, 60_000, Claim::Refusal),
            Some(Slot::empty(2))
        );
    }

    #[test]
    fn slot_keys_are_the_prefix_and_the_index() {
        for i in [0, 7, 10, 99, 4_095, 1_048_575, u32::MAX] {
            assert_eq!(SlotKey::new(i).as_str(), format!("trl.{i}"));
        }
    }

    const KEY: SlotSecret = SlotSecret { k0: 1, k1: 2 };

    #[test]
    fn slots_spread_and_stay_in_range() {
        let slots = 64;
        let mut used = std::collections::HashSet::new();
        for i in 0..10_000 {
            let r = slot_for(&KEY, "default", &format!("tenant-{i}"), slots);
            assert!(r.index < slots);
            used.insert(r.index);
        }
        assert_eq!(used.len(), 64);
        assert_ne!(
            slot_for(&KEY, "default", "a", slots).fingerprint,
            slot_for(&KEY, "gold", "a", slots).fingerprint
        );
        assert_eq!(slot_for(&KEY, "g", "t", 0).index, 0);
    }

    #[test]
    fn the_same_key_places_a_tenant_the_same_and_another_key_elsewhere() {
        let other = SlotSecret::from_bytes(*b"another 16 bytes");
        let slots = 4_096;
        let tenants: Vec<String> = (0..1_000).map(|i| format!("tenant-{i}")).collect();
        let mut moved = 0;
        for t in &tenants {
            let a = slot_for(&KEY, "default", t, slots);
            assert_eq!(a, slot_for(&KEY, "default", t, slots));
            assert_eq!(
                a,
                slot_for(&SlotSecret { k0: 1, k1: 2 }, "default", t, slots)
            );
            let b = slot_for(&other, "default", t, slots);
            assert_ne!(a.fingerprint, b.fingerprint, "{t}");
            moved += usize::from(a.index != b.index);
        }
        // Under another key, the placement is unrelated: about 1 in 4,096
        // tenants would keep its index by chance.
        assert!(moved >= 990, "{moved}");
        // Tenants that share a slot under one key do not under another: a
        // collision found against one Envoy's key is worth nothing against
        // another's.
        let mut by_index = std::collections::HashMap::new();
        let pair = tenants.iter().find_map(|t| {
            let i = slot_for(&KEY, "default", t, 64).index;
            by_index
                .insert(i, t)
                .map(|first| (first.clone(), t.clone()))
        });
        let (x, y) = pair.unwrap();
        let keys = [
            other,
            SlotSecret::from_bytes([7; 16]),
            SlotSecret::from_bytes([9; 16]),
        ];
        assert!(keys
            .iter()
            .any(|k| slot_for(k, "default", &x, 64).index != slot_for(k, "default", &y, 64).index));
    }

    #[test]
    fn sip_hash_is_sip_hash_2_4() {
        // The reference vectors of the SipHash paper (key 00..0f, message
        // 00..n-1), first and last of the 64.
        let key = SlotSecret::from_bytes(core::array::from_fn(|i| i as u8));
        let hash = |n: u8| {
            let mut h = SipHasher::new(&key);
            h.write(0..n);
            h.finish()
        };
        assert_eq!(hash(0), 0x726f_db47_dd0e_0e31);
        assert_eq!(hash(63), 0x958a_324c_eb06_4572);
    }

    #[test]
    fn the_secret_round_trips_and_is_never_shown() {
        let bytes: [u8; 16] = core::array::from_fn(|i| 200 + i as u8);
        let s = SlotSecret::from_bytes(bytes);
        assert_eq!(s.to_bytes(), bytes);
        assert_eq!(SlotSecret::from_slice(&bytes), Some(s));
        assert_eq!(SlotSecret::from_slice(&bytes[..15]), None);
        assert_eq!(format!("{s:?}"), "SlotSecret(..)");
    }

    proptest! {
        #[test]
        #[allow(deprecated)]
        fn sip_hash_agrees_with_std(k0 in any::<u64>(), k1 in any::<u64>(),
                                    msg in prop::collection::vec(any::<u8>(), 0..300)) {
            use std::hash::Hasher;
            let mut ours = SipHasher::new(&SlotSecret { k0, k1 });
            ours.write(msg.iter().copied());
            let mut theirs = std::hash::SipHasher::new_with_keys(k0, k1);
            theirs.write(&msg);
            prop_assert_eq!(ours.finish(), theirs.finish());
        }
    }
}
