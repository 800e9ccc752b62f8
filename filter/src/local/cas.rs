//! The read-modify-write of a slot in shared data, under Envoy's CAS: every
//! worker of an Envoy shares the slots, and a write is only taken when no
//! other worker wrote in between.

use std::fmt;

use crate::host::{HostCall, HostError, SharedData, SharedDataError};
use crate::local::placement::SlotKey;
use crate::local::slot::{Slot, SLOT_BYTES};

/// How many times a read-modify-write of a slot is tried before the local
/// layer gives up on that request (and lets it through to the service).
pub const CAS_ATTEMPTS: u32 = 8;

/// Why a read-modify-write of a slot did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateError {
    /// Every attempt lost its CAS race.
    CasRetriesExhausted,
    /// The host failed to read or write the slot.
    Host(HostError),
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateError::CasRetriesExhausted => f.write_str("every CAS attempt lost its race"),
            UpdateError::Host(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for UpdateError {}

/// Reads slot `index`, computes, and writes the result back under the CAS
/// token of the read, retrying up to `attempts` times when another worker
/// wrote in between. `step` gets the stored bytes and returns its result and
/// the slot to write, if any; a result with nothing to write needs no CAS.
/// The result is that of the last call of `step`.
pub fn update<S, T, F>(store: &S, index: u32, attempts: u32, mut step: F) -> Result<T, UpdateError>
where
    S: SharedData + ?Sized,
    F: FnMut(Option<&[u8]>) -> (T, Option<Slot>),
{
    let mut result = None;
    update_slot(store, index, attempts, &mut |stored| {
        let (r, write) = step(stored);
        result = Some(r);
        write
    })?;
    // `step` ran whenever update_slot succeeded.
    result.ok_or(UpdateError::CasRetriesExhausted)
}

/// The loop of `update`, compiled once per store rather than once per
/// caller's closure (each caller's copy cost about 700 bytes of the .wasm).
fn update_slot<S: SharedData + ?Sized>(
    store: &S,
    index: u32,
    attempts: u32,
    step: &mut dyn FnMut(Option<&[u8]>) -> Option<Slot>,
) -> Result<(), UpdateError> {
    let key = SlotKey::new(index);
    let mut scratch = [0u8; SLOT_BYTES];
    update_key(
        store,
        key.as_str(),
        attempts,
        &mut scratch,
        &mut |stored, out| {
            out.copy_from_slice(&step(stored)?.encode_fixed());
            Some(SLOT_BYTES)
        },
    )
}

/// A step of `update_key`: the stored bytes in, the new value written into
/// the buffer and its length out (None: nothing to write).
pub type Step<'a> = dyn FnMut(Option<&[u8]>, &mut [u8]) -> Option<usize> + 'a;

/// Creates `key` with `value` unless it exists (a value that cannot be read
/// is not written); false when it could not be.
pub fn create<S: SharedData + ?Sized>(shared: &S, key: &str, value: &[u8]) -> bool {
    match shared.get_shared(key) {
        Ok((Some(_), _)) => true,
        Ok((None, _)) => shared.set_shared(key, value, None).is_ok(),
        Err(_) => false,
    }
}

/// The read-modify-write of any shared-data value under CAS (a slot, the
/// breaker, a fallback entry): `step` gets the stored bytes and writes the
/// new value into `scratch`, returning its length (None: nothing to write,
/// no CAS needed). Generic over the store only, so one copy serves every
/// caller.
pub fn update_key<S: SharedData + ?Sized>(
    store: &S,
    key: &str,
    attempts: u32,
    scratch: &mut [u8],
    step: &mut Step<'_>,
) -> Result<(), UpdateError> {
    for _ in 0..attempts {
        let (stored, cas) = store.get_shared(key).map_err(|e| match e {
            SharedDataError::Host(e) => UpdateError::Host(e),
            // Not a thing a read answers: a host failure.
            SharedDataError::CasMismatch => {
                UpdateError::Host(HostError::new(HostCall::GetShared, HostError::CAS_MISMATCH))
            }
        })?;
        let Some(len) = step(stored.as_deref(), scratch) else {
            return Ok(());
        };
        let value = scratch.get(..len).unwrap_or_default();
        match store.set_shared(key, value, cas) {
            Ok(()) => return Ok(()),
            Err(SharedDataError::CasMismatch) => continue,
            Err(SharedDataError::Host(e)) => return Err(UpdateError::Host(e)),
        }
    }
    Err(UpdateError::CasRetriesExhausted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::placement::SlotRef;
    use crate::local::{admit, LocalVerdict};
    use crate::testing::MemHost;
    use proptest::prelude::*;
    use ratelimit_config::{BucketParams, HeaderMode};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const AT: SlotRef = SlotRef {
        index: 0,
        fingerprint: 42,
    };

    const BIG: BucketParams = BucketParams {
        tokens_per_second: 1,
        burst: 100_000,
    };

    const FULL: u64 = 100_000_000;

    /// Shared data with every slot created, and other workers that each
    /// take a token between a read and a write, `times` times.
    fn store(times: u32) -> MemHost {
        let host = MemHost::new();
        host.create_slots(1);
        host.interfere(times, |stored| {
            let (_, w) = admit(stored, AT, 1_000, Some(BIG), HeaderMode::Off);
            w.map(|s| s.encode()).unwrap_or_default()
        });
        host
    }

    fn take_one(store: &MemHost) -> Result<LocalVerdict, UpdateError> {
        update(store, AT.index, CAS_ATTEMPTS, |stored| {
            admit(stored, AT, 1_000, Some(BIG), HeaderMode::Off)
        })
    }

    fn tokens(store: &MemHost) -> u64 {
        let stored = store.shared_value(&SlotKey::new(AT.index)).unwrap();
        assert_eq!(stored.len(), SLOT_BYTES);
        Slot::decode(&stored).unwrap().bucket.unwrap().milli_tokens
    }

    #[test]
    fn a_lost_cas_race_is_retried_and_no_token_is_lost() {
        let store = store(0);
        assert_eq!(take_one(&store), Ok(LocalVerdict::Proceed));
        assert_eq!(tokens(&store), FULL - 1_000);
        // Three other workers write in between: three retries, and every
        // token taken is accounted for (1 + 3 + 1).
        store.set_interference(3);
        assert_eq!(take_one(&store), Ok(LocalVerdict::Proceed));
        assert_eq!(tokens(&store), FULL - 5_000);
    }

    #[test]
    fn cas_retries_run_out() {
        let store = store(CAS_ATTEMPTS);
        assert_eq!(take_one(&store), Err(UpdateError::CasRetriesExhausted));
        // The others' writes stand; ours was never applied.
        assert_eq!(tokens(&store), FULL - u64::from(CAS_ATTEMPTS) * 1_000);
        // One fewer interference and the last attempt succeeds.
        store.set_interference(CAS_ATTEMPTS - 1);
        assert_eq!(take_one(&store), Ok(LocalVerdict::Proceed));
    }

    proptest! {
        /// Whatever the interleaving of interfering writers, every admitted
        /// request took exactly one token.
        #[test]
        fn cas_updates_never_lose_or_double_count(interference in prop::collection::vec(0u32..10, 1..30)) {
            let store = store(0);
            let mut taken = 0u64;
            for i in interference {
                store.set_interference(i);
                let r = take_one(&store);
                taken += u64::from(i - store.interference_left());
                match r {
                    Ok(LocalVerdict::Proceed) => taken += 1,
                    Err(UpdateError::CasRetriesExhausted) => {}
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
                store.set_interference(0);
                prop_assert_eq!(tokens(&store), FULL - taken * 1_000);
            }
        }
    }

    #[test]
    fn host_errors_end_the_update() {
        let store = store(0);
        store.fail(HostCall::SetShared);
        assert_eq!(
            take_one(&store),
            Err(UpdateError::Host(HostError::new(
                HostCall::SetShared,
                HostError::INTERNAL_FAILURE
            )))
        );
        store.heal(HostCall::SetShared);
        store.fail(HostCall::GetShared);
        assert!(matches!(take_one(&store), Err(UpdateError::Host(_))));
    }

    #[test]
    fn nothing_to_write_takes_no_cas() {
        let store = store(CAS_ATTEMPTS);
        // A step that writes nothing returns after one read, even while
        // others keep writing.
        assert_eq!(update(&store, AT.index, CAS_ATTEMPTS, |_| (7, None)), Ok(7));
        assert_eq!(store.interference_left(), CAS_ATTEMPTS - 1);
    }
}
