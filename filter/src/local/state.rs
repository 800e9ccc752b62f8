//! The plain state each mode keeps in a tenant's slot (a lease, a sync
//! view), and who may take a slot that holds it: what the slot codec
//! (`local::slot`) encodes, with no mode's logic. The modes (`lease`,
//! `sync`) change it; the codec depends on no mode.

use crate::window::UNITS;

/// A slot with a refill under way stays with its tenant this long.
pub const REFILL_HOLD_MS: u64 = 2_000;

/// One tenant's lease, in its slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    /// Tokens left to spend.
    pub tokens: u32,
    /// When they expire: the end of the window they were reserved in.
    pub until_ms: u64,
    /// When a call for the next batch went out (0: none under way).
    pub refill_at_ms: u64,
    /// What the service last reported as remaining (the smallest of the
    /// group's descriptors), valid until `remaining_until_ms`.
    pub remaining: u32,
    pub remaining_until_ms: u64,
    /// This Envoy's requests for the tenant in second `rate_second` (since
    /// the epoch), and in the second before it.
    pub rate_second: u64,
    pub rate_count: u32,
    pub rate_prev: u32,
}

impl Lease {
    /// Whether another tenant must leave the slot alone: tokens that have
    /// not expired, or a call for more under way.
    pub fn in_use(&self, now_ms: u64) -> bool {
        (self.tokens > 0 && now_ms < self.until_ms)
            || (self.refill_at_ms != 0 && now_ms < self.refill_at_ms.saturating_add(REFILL_HOLD_MS))
    }
}

/// One tenant's sync state, in its slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncState {
    /// The fleet's count per unit of the group (shortest first), as the
    /// service last reported it, valid until `view_until_ms`.
    pub views: [u32; UNITS],
    pub view_until_ms: [u64; UNITS],
    /// Hits this Envoy admitted that no push has taken yet.
    pub unsynced: u32,
    /// Hits of the push under way, and of requests that asked the service
    /// themselves and wait for its answer (0: none).
    pub in_flight: u32,
    /// When the last of those hits went out.
    pub push_at_ms: u64,
}

impl SyncState {
    /// Hits the service has not seen: another tenant must not take the slot.
    pub fn in_use(&self, _now_ms: u64) -> bool {
        self.unsynced > 0 || self.in_flight > 0
    }

    /// Hits the service has not counted yet.
    pub fn pending(&self) -> u32 {
        self.unsynced.saturating_add(self.in_flight)
    }
}
