//! Where a tenant lives: the keyed hash (SipHash-2-4) of its scope and
//! value gives a slot index and a fingerprint (`slot_for`); the slot's
//! shared-data key is `trl.<index>` (`SlotKey`). The hash's key is the slot
//! secret, agreed by every VM at configure (`secret`).
//!
//! The scope (`Scope`) is what, besides the tenant's value, makes its
//! state its own: the instance of the filter (the rate-limit service's
//! cluster, the domain, the descriptor key, where the tenant is read) and
//! the tenant's group (its name and limits). Several instances of the
//! filter in one Envoy share one shared-data map when their `vm_id` is the
//! same (Istio leaves it empty): they share the slots too, but a tenant of
//! one never owns the slot of a tenant of another, so none reads another's
//! bucket, cached refusal, lease or sync view. Two instances with the same
//! scope spend the same counters of the same service, and share the
//! tenant's state, as two workers do. One array of slots for every
//! instance keeps the keyspace at `local.slots` keys, however many
//! instances and configurations come and go.

/// The tenant's slots a request used: its own (after probing past those
/// other tenants hold), and its state on its route's, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    pub own: SlotRef,
    pub on_route: Option<SlotRef>,
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

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
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

/// What a tenant's state belongs to besides its value: one instance of the
/// filter and one group of its configuration (see the module doc), as a
/// 64-bit hash, computed once per configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scope(u64);

impl Scope {
    /// The scope of nothing (of a group that does not exist).
    pub const NONE: Scope = Scope(0);
}

/// Builds a `Scope` from its parts, in order; each is written with its
/// length, so no two lists of parts are written alike. FNV-1a, unkeyed:
/// the parts are the operator's configuration, not chosen by clients (the
/// keyed hash is the fingerprint's, over the scope and the tenant).
pub struct ScopeBuilder(u64);

impl ScopeBuilder {
    pub fn new() -> ScopeBuilder {
        ScopeBuilder(0xcbf2_9ce4_8422_2325)
    }

    #[inline(never)]
    pub fn part(mut self, part: &[u8]) -> ScopeBuilder {
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        for &b in len.to_le_bytes().iter().chain(part) {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    pub fn finish(self) -> Scope {
        Scope(self.0)
    }
}

impl Default for ScopeBuilder {
    fn default() -> ScopeBuilder {
        ScopeBuilder::new()
    }
}

impl Scope {
    /// The scope of `parts`, in order (`ScopeBuilder`).
    pub fn of(parts: &[&[u8]]) -> Scope {
        parts
            .iter()
            .fold(ScopeBuilder::new(), |b, p| b.part(p))
            .finish()
    }
}

/// The keyed hash of the scope and the tenant (a tenant that moves to
/// another group, or whose group's limits change, starts afresh), and of
/// the route for the tenant's state on a route. 0xff separates the tenant
/// from the route: no UTF-8 text holds that byte, and the tenant as sent is
/// always UTF-8.
fn fingerprint(key: &SlotSecret, scope: Scope, tenant: &str, route: Option<&str>) -> u64 {
    let mut h = SipHasher::new(key);
    h.write(&scope.0.to_le_bytes());
    h.write(tenant.as_bytes());
    if let Some(route) = route {
        h.write(&[0xff]);
        h.write(route.as_bytes());
    }
    // 0 marks an empty slot.
    h.finish().max(1)
}

/// Where `tenant` of `scope` lives among `slots` slots, under `key`.
pub fn slot_for(key: &SlotSecret, scope: Scope, tenant: &str, slots: u32) -> SlotRef {
    place(fingerprint(key, scope, tenant, None), slots)
}

/// Where the state of `tenant` of `scope` on `route` lives: a slot of its
/// own, apart from the tenant's (the same slots, bounded as they are).
pub fn route_slot_for(
    key: &SlotSecret,
    scope: Scope,
    tenant: &str,
    route: &str,
    slots: u32,
) -> SlotRef {
    place(fingerprint(key, scope, tenant, Some(route)), slots)
}

/// How many slots a tenant tries, its own and the next ones, before it
/// goes without local state because other tenants hold them all.
pub const SLOT_PROBES: u32 = 4;

impl SlotRef {
    /// The slot after this one (the first after the last), for the same
    /// tenant: where it goes when another tenant holds this one.
    pub fn next(self, slots: u32) -> SlotRef {
        SlotRef {
            index: self.index.wrapping_add(1) % slots.max(1),
            fingerprint: self.fingerprint,
        }
    }
}

fn place(fp: u64, slots: u32) -> SlotRef {
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

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn slot_keys_are_the_prefix_and_the_index() {
        for i in [0, 7, 10, 99, 4_095, 1_048_575, u32::MAX] {
            assert_eq!(SlotKey::new(i).as_str(), format!("trl.{i}"));
        }
    }

    const KEY: SlotSecret = SlotSecret { k0: 1, k1: 2 };

    fn group(name: &str) -> Scope {
        Scope::of(&[name.as_bytes()])
    }

    #[test]
    fn scopes_are_their_parts_in_order() {
        let s = |parts: &[&str]| {
            let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
            Scope::of(&parts)
        };
        assert_eq!(s(&["a", "bc"]), s(&["a", "bc"]));
        assert_ne!(s(&["a", "bc"]), s(&["ab", "c"]));
        assert_ne!(s(&["a", "bc"]), s(&["bc", "a"]));
        assert_ne!(s(&["a", ""]), s(&["a"]));
        // A tenant of one scope never owns another's slot.
        let (x, y) = (s(&["domain-a", "default"]), s(&["domain-b", "default"]));
        assert_ne!(
            slot_for(&KEY, x, "acme", 4_096).fingerprint,
            slot_for(&KEY, y, "acme", 4_096).fingerprint
        );
    }

    #[test]
    fn slots_spread_and_stay_in_range() {
        let slots = 64;
        let mut used = std::collections::HashSet::new();
        for i in 0..10_000 {
            let r = slot_for(&KEY, group("default"), &format!("tenant-{i}"), slots);
            assert!(r.index < slots);
            used.insert(r.index);
        }
        assert_eq!(used.len(), 64);
        assert_ne!(
            slot_for(&KEY, group("default"), "a", slots).fingerprint,
            slot_for(&KEY, group("gold"), "a", slots).fingerprint
        );
        assert_eq!(slot_for(&KEY, group("g"), "t", 0).index, 0);
        // A tenant's state on a route is apart from its own, and from
        // another tenant's on that route; the bytes cannot be shifted
        // from one part to the other.
        let own = slot_for(&KEY, group("g"), "t", 1 << 20).fingerprint;
        let on_route = route_slot_for(&KEY, group("g"), "t", "reports", 1 << 20);
        assert!(on_route.index < 1 << 20);
        assert_ne!(own, on_route.fingerprint);
        assert_ne!(
            on_route,
            route_slot_for(&KEY, group("g"), "u", "reports", 1 << 20)
        );
        assert_ne!(
            route_slot_for(&KEY, group("g"), "t\u{ff}a", "b", 64).fingerprint,
            route_slot_for(&KEY, group("g"), "t", "a\u{ff}b", 64).fingerprint
        );
    }

    #[test]
    fn the_same_key_places_a_tenant_the_same_and_another_key_elsewhere() {
        let other = SlotSecret::from_bytes(*b"another 16 bytes");
        let slots = 4_096;
        let tenants: Vec<String> = (0..1_000).map(|i| format!("tenant-{i}")).collect();
        let mut moved = 0;
        for t in &tenants {
            let d = group("default");
            let a = slot_for(&KEY, d, t, slots);
            assert_eq!(a, slot_for(&KEY, d, t, slots));
            assert_eq!(a, slot_for(&SlotSecret { k0: 1, k1: 2 }, d, t, slots));
            let b = slot_for(&other, d, t, slots);
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
            let i = slot_for(&KEY, group("default"), t, 64).index;
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
        let d = group("default");
        assert!(keys
            .iter()
            .any(|k| slot_for(k, d, &x, 64).index != slot_for(k, d, &y, 64).index));
    }

    #[test]
    fn sip_hash_is_sip_hash_2_4() {
        // The reference vectors of the SipHash paper (key 00..0f, message
        // 00..n-1), first and last of the 64.
        let key = SlotSecret::from_bytes(core::array::from_fn(|i| i as u8));
        let hash = |n: u8| {
            let mut h = SipHasher::new(&key);
            h.write(&(0..n).collect::<Vec<u8>>());
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
            ours.write(&msg);
            let mut theirs = std::hash::SipHasher::new_with_keys(k0, k1);
            theirs.write(&msg);
            prop_assert_eq!(ours.finish(), theirs.finish());
        }
    }
}
