//! The slot secret (`slot::SlotSecret`) that every VM of one Envoy must
//! share, agreed through shared data at configure.
//!
//! Each worker has its own VM, and all of them read and write the same
//! slots: if two VMs hashed with different keys, one tenant would have a
//! slot per VM, each with its own bucket. So the first VM to configure
//! draws the secret and stores it under `trl.secret`; every later one reads
//! it. In Envoy the first is always the configuration canary, which
//! proxy-wasm's `createWasm` configures on the main thread before any
//! worker VM exists; the secret then outlives it (shared data lives as long
//! as the Envoy process, so a configuration pushed later keeps it too).
//!
//! Creating the key is write-if-absent, so even VMs configuring at the same
//! moment agree. Envoy has no such call, but its CAS gives one: a write
//! with a CAS token creates a key that does not exist, and fails on a key
//! that does unless the token is that key's. Tokens come from one counter
//! for every write, so a token taken from a write to another key
//! (`trl.secret.claim`) can never be `trl.secret`'s: the write creates the
//! key if it is still absent and fails if another VM created it meanwhile,
//! and the loser adopts the winner's secret. (Tokens are 32 bits: after
//! 2^32 shared-data writes the counter wraps and the two could meet, which
//! would take two VMs creating the key in that one instant.)

use crate::host::{SharedData, SharedDataError};
use crate::local::placement::SlotSecret;

/// The shared-data key of the secret (slot keys are `trl.<digits>`).
pub const SECRET_KEY: &str = "trl.secret";
/// Written to take a CAS token that no write of `SECRET_KEY` has.
pub const CLAIM_KEY: &str = "trl.secret.claim";

/// How this VM came by its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreed {
    /// Another VM had stored it.
    Found,
    /// This VM drew it and stored it.
    Stored,
    /// Shared data failed: this VM uses the secret it drew, alone; its
    /// local layer does not share state with the other VMs'.
    Unshared(&'static str),
}

/// The secret stored in shared data, drawing and storing one (`draw`) if
/// there is none yet.
pub fn agree<S: SharedData + ?Sized>(
    shared: &S,
    draw: impl FnOnce() -> SlotSecret,
) -> (SlotSecret, Agreed) {
    let stored_cas = match shared.get_shared(SECRET_KEY) {
        Ok((Some(v), cas)) => match SlotSecret::from_slice(&v) {
            Some(s) => return (s, Agreed::Found),
            // Not a secret (nothing writes one, but it is not ours to
            // trust): replaced, under its own token.
            None => cas,
        },
        Ok((None, _)) => None,
        Err(_) => return (draw(), Agreed::Unshared("reading it failed")),
    };
    let drawn = draw();
    let cas = match stored_cas {
        Some(cas) => Some(cas),
        None => match claim_token(shared) {
            Some(token) => Some(token),
            None => return (drawn, Agreed::Unshared("taking a CAS token failed")),
        },
    };
    match shared.set_shared(SECRET_KEY, &drawn.to_bytes(), cas) {
        Ok(()) | Err(SharedDataError::CasMismatch) => {}
        Err(_) => return (drawn, Agreed::Unshared("writing it failed")),
    }
    // Whoever won, what is stored now is the secret.
    match shared.get_shared(SECRET_KEY) {
        Ok((Some(v), _)) => match SlotSecret::from_slice(&v) {
            Some(s) if s == drawn => (s, Agreed::Stored),
            Some(s) => (s, Agreed::Found),
            None => (drawn, Agreed::Unshared("not a secret after writing one")),
        },
        Ok((None, _)) => (drawn, Agreed::Unshared("gone after writing it")),
        Err(_) => (drawn, Agreed::Unshared("reading it back failed")),
    }
}

/// A CAS token of a write to `CLAIM_KEY`: never the token of a write to
/// `SECRET_KEY`.
fn claim_token<S: SharedData + ?Sized>(shared: &S) -> Option<u32> {
    shared.set_shared(CLAIM_KEY, &[], None).ok()?;
    shared.get_shared(CLAIM_KEY).ok()?.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostCall;
    use crate::testing::MemHost;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn secret(b: u8) -> SlotSecret {
        SlotSecret::from_bytes([b; 16])
    }

    #[test]
    fn the_first_vm_stores_its_secret_and_every_later_one_adopts_it() {
        let h = MemHost::new();
        assert_eq!(agree(&h, || secret(1)), (secret(1), Agreed::Stored));
        let mut drawn = false;
        let second = agree(&h, || {
            drawn = true;
            secret(2)
        });
        assert_eq!(second, (secret(1), Agreed::Found));
        // A later VM does not even draw.
        assert!(!drawn);
    }

    #[test]
    fn a_vm_that_loses_the_race_to_create_it_adopts_the_winners() {
        // Another VM creates the key between this VM's read (absent) and its
        // write: an unconditional write would replace it, and the two VMs
        // would then hash with different keys.
        let h = MemHost::new();
        h.interfere(1, |_| secret(7).to_bytes().to_vec());
        assert_eq!(agree(&h, || secret(1)), (secret(7), Agreed::Found));
        assert_eq!(
            h.get_shared(SECRET_KEY).unwrap().0,
            Some(secret(7).to_bytes().to_vec())
        );
    }

    #[test]
    fn a_stored_value_that_is_not_a_secret_is_replaced() {
        let h = MemHost::new();
        h.set_shared(SECRET_KEY, b"short", None).unwrap();
        assert_eq!(agree(&h, || secret(3)), (secret(3), Agreed::Stored));
        assert_eq!(agree(&h, || secret(4)), (secret(3), Agreed::Found));
    }

    #[test]
    fn when_shared_data_fails_the_vm_keeps_its_own_secret_and_says_so() {
        for failing in [HostCall::GetShared, HostCall::SetShared] {
            let h = MemHost::new();
            h.fail(failing);
            let (s, how) = agree(&h, || secret(5));
            assert_eq!(s, secret(5));
            assert!(matches!(how, Agreed::Unshared(_)), "{how:?}");
        }
    }
}
