//! The fleet's size, learned from ratelimit-counter: the local fallback
//! gives each Envoy `1 / N` of every limit, and `N` follows the fleet.
//!
//! - Every call names its Envoy (gRPC metadata
//!   [`ratelimit_config::rls::ENVOY_ID_HEADER`]): one id per Envoy process,
//!   drawn by the first VM to configure and shared by every worker
//!   through shared data (`envoy_id`, write-if-absent under CAS, as the
//!   slot secret is agreed).
//! - The counter answers with the Envoys that called for the domain in its
//!   interval (`RateLimitResponse::fleet_envoys`; envoyproxy/ratelimit
//!   never does). The last size heard is kept in shared data, per domain
//!   (`heard`): written when it changes, and at most once a second
//!   otherwise, by each worker (`Written`); with it the Envoy gauge
//!   `tenant_ratelimit.fleet_envoys`.
//! - The fallback reads it (`held`) when it decides; `fallback.envoys` is
//!   the size until one was heard.

use std::cell::RefCell;

use crate::counters::Gauge;
use crate::host::{Host, SharedData, SharedDataError};

/// The shared-data key of this Envoy's id.
pub const ID_KEY: &str = "trl.envoy";
/// Written to take a CAS token that no write of `ID_KEY` has.
const CLAIM_KEY: &str = "trl.envoy.claim";
/// Random bytes in an id (written as twice as many hex digits).
pub const ID_BYTES: usize = 8;

/// The size heard is written again after this long, though unchanged: a
/// worker that wrote an older size is overwritten within it.
pub const REWRITE_MS: u64 = 1_000;

/// Sizes kept per VM of the last write (one per domain; a few domains).
const WRITTEN_MOST: usize = 8;

/// FNV-1a of the domain: the key of its size is bounded whatever the
/// domain's length.
pub fn domain_hash(domain: &str) -> u64 {
    domain.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The shared-data key of a domain's fleet size.
pub fn key(domain_hash: u64) -> String {
    format!("trl.fleet.{domain_hash:016x}")
}

/// An id's hex digits, two per byte, in order.
fn hex(bytes: [u8; ID_BYTES]) -> String {
    format!("{:016x}", u64::from_be_bytes(bytes))
}

fn valid(id: &[u8]) -> bool {
    id.len() == 2 * ID_BYTES && id.iter().all(u8::is_ascii_hexdigit)
}

/// This Envoy's id: the one in shared data, or one `draw`n and stored there
/// if there is none yet (the first VM to configure: the canary, on the
/// main thread). Write-if-absent under CAS, so VMs configuring at once
/// agree. If shared data fails, the drawn id, for this VM alone: the
/// counter then counts this worker as an Envoy of its own (the share is
/// smaller than it should be, never larger).
pub fn envoy_id<S: SharedData + ?Sized>(
    shared: &S,
    draw: impl FnOnce() -> [u8; ID_BYTES],
) -> String {
    let cas = match shared.get_shared(ID_KEY) {
        Ok((Some(v), cas)) => {
            if valid(&v) {
                return String::from_utf8_lossy(&v).into_owned();
            }
            cas
        }
        Ok((None, _)) => None,
        Err(_) => return hex(draw()),
    };
    let drawn = hex(draw());
    let cas = match cas {
        Some(cas) => Some(cas),
        None => {
            let claimed = shared.set_shared(CLAIM_KEY, &[], None).is_ok();
            match shared.get_shared(CLAIM_KEY) {
                Ok((_, Some(token))) if claimed => Some(token),
                _ => return drawn,
            }
        }
    };
    match shared.set_shared(ID_KEY, drawn.as_bytes(), cas) {
        Ok(()) | Err(SharedDataError::CasMismatch) => {}
        Err(_) => return drawn,
    }
    match shared.get_shared(ID_KEY) {
        Ok((Some(v), _)) if valid(&v) => String::from_utf8_lossy(&v).into_owned(),
        _ => drawn,
    }
}

/// What a worker last wrote, per domain: (domain hash, size, when).
#[derive(Debug, Default)]
pub struct Written(RefCell<Vec<(u64, u32, u64)>>);

/// Whether a size heard must be written, given this VM's last write of it.
pub fn must_write(last: Option<(u32, u64)>, n: u32, now_ms: u64) -> bool {
    match last {
        None => true,
        Some((was, at)) => was != n || now_ms >= at.saturating_add(REWRITE_MS),
    }
}

/// The fleet's size heard in an answer for `domain` (0: none: the service
/// is not the counter, or the call did not name its Envoy), kept in shared
/// data, with the gauge, when it must be written (`must_write`).
pub fn heard<H: Host + ?Sized>(host: &H, written: &Written, domain: &str, n: u32, now_ms: u64) {
    if n == 0 {
        return;
    }
    let h = domain_hash(domain);
    let last = (written.0.try_borrow().ok())
        .and_then(|w| w.iter().find(|(d, ..)| *d == h).map(|&(_, n, at)| (n, at)));
    if !must_write(last, n, now_ms) {
        return;
    }
    if host.set_shared(&key(h), &n.to_le_bytes(), None).is_err() {
        return;
    }
    host.set_gauge(Gauge::FleetEnvoys, u64::from(n));
    if let Ok(mut w) = written.0.try_borrow_mut() {
        let room = w.len() < WRITTEN_MOST;
        match w.iter_mut().find(|(d, ..)| *d == h) {
            Some(e) => *e = (h, n, now_ms),
            None if room => w.push((h, n, now_ms)),
            None => {}
        }
    }
}

/// The last size heard for the domain of `domain_hash` (by any worker of
/// this Envoy), None before any.
pub fn held<S: SharedData + ?Sized>(shared: &S, domain_hash: u64) -> Option<u32> {
    let (v, _) = shared.get_shared(&key(domain_hash)).ok()?;
    let b: [u8; 4] = v?.get(..4)?.try_into().ok()?;
    Some(u32::from_le_bytes(b)).filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostCall;
    use crate::testing::MemHost;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_first_vm_draws_the_id_and_every_later_one_reads_it() {
        let h = MemHost::new();
        let first = envoy_id(&h, || [0xab; ID_BYTES]);
        assert_eq!(first, "abababababababab");
        let mut drawn = false;
        let second = envoy_id(&h, || {
            drawn = true;
            [1; ID_BYTES]
        });
        assert_eq!(second, first);
        assert!(!drawn);
    }

    #[test]
    fn a_value_that_is_not_an_id_is_replaced() {
        let h = MemHost::new();
        h.set_shared(ID_KEY, b"junk", None).unwrap();
        assert_eq!(envoy_id(&h, || [0x01; ID_BYTES]), "0101010101010101");
        assert_eq!(envoy_id(&h, || [0x02; ID_BYTES]), "0101010101010101");
    }

    #[test]
    fn shared_data_failing_leaves_the_vm_its_own_id() {
        let h = MemHost::new();
        h.fail(HostCall::GetShared);
        assert_eq!(envoy_id(&h, || [0x0f; ID_BYTES]), "0f0f0f0f0f0f0f0f");
    }

    #[test]
    fn a_size_is_written_when_it_changes_or_a_second_after_the_last_write() {
        assert!(must_write(None, 2, 0));
        assert!(!must_write(Some((2, 1_000)), 2, 1_999));
        assert!(must_write(Some((2, 1_000)), 2, 2_000));
        assert!(must_write(Some((2, 1_000)), 6, 1_001));
    }

    #[test]
    fn the_size_heard_is_held_per_domain_with_its_gauge() {
        let h = MemHost::new();
        let w = Written::default();
        let (a, b) = (domain_hash("a"), domain_hash("b"));
        assert_ne!(a, b);
        assert_eq!(held(&h, a), None);
        heard(&h, &w, "a", 0, 1_000);
        assert_eq!(held(&h, a), None);
        heard(&h, &w, "a", 6, 1_000);
        assert_eq!(held(&h, a), Some(6));
        assert_eq!(h.gauge(Gauge::FleetEnvoys), 6);
        assert_eq!(held(&h, b), None);
        // Another worker wrote 2; this one heard 6 again within the second:
        // not written; after it, written again.
        h.set_shared(&key(a), &2u32.to_le_bytes(), None).unwrap();
        heard(&h, &w, "a", 6, 1_500);
        assert_eq!(held(&h, a), Some(2));
        heard(&h, &w, "a", 6, 2_000);
        assert_eq!(held(&h, a), Some(6));
        heard(&h, &w, "a", 2, 2_001);
        assert_eq!(held(&h, a), Some(2));
        assert_eq!(h.gauge(Gauge::FleetEnvoys), 2);
    }
}
