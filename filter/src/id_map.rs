//! Maps by keys that are spread already, hashed as they are (no keyed
//! hash: no client chooses them).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes keys that are spread already: context ids and call tokens (small
/// distinct integers) and slot fingerprints (keyed hashes, which no client can
/// choose), as they are.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map by a key `IdHasher` hashes.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
