//! One tenant's state in one shared-data slot, and its fixed-size binary
//! encoding: the bucket, the over-limit cache, and the mode block (a lease
//! or a sync view: one enum, so a slot never holds two modes' state). Who
//! owns a slot is decided here, in `Slot::claim`, and nowhere else. Where a
//! tenant lives is `placement`'s business.

use ratelimit_config::Mode;

use crate::local::bucket::TokenBucket;
use crate::local::over_limit::{OverLimit, StatusSnapshot, MAX_STATUSES};
use crate::local::state::{Lease, SyncState};
use crate::window::UNITS;

/// One tenant's state in one shared-data slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub fingerprint: u64,
    pub bucket: Option<TokenBucket>,
    pub over_limit: Option<OverLimit>,
    /// The state of the tenant's group's mode (a slot's tenant has one
    /// group, so one mode at a time).
    pub mode: ModeState,
}

/// A slot's mode block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModeState {
    /// Exact mode, or nothing kept yet.
    #[default]
    None,
    /// The tenant's lease (`lease`).
    Lease(Lease),
    /// The tenant's view of the fleet's count and its unsynced hits
    /// (`sync`).
    Sync(SyncState),
}

impl ModeState {
    /// Whether another tenant must leave the slot alone.
    fn in_use(&self, now_ms: u64) -> bool {
        match self {
            ModeState::None => false,
            ModeState::Lease(l) => l.in_use(now_ms),
            ModeState::Sync(s) => s.in_use(now_ms),
        }
    }
}

/// What a mode block held when its group's mode changed (a new
/// configuration) and it was dropped for the new mode's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stranded {
    /// Tokens of a lease: reserved at the service, never spent.
    pub lease_tokens: u32,
    /// Hits a sync view admitted that no push has taken yet: the service
    /// has not counted them.
    pub sync_hits: u32,
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
            mode: ModeState::None,
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
    /// `SLOT_HOLD_MS` ago, or a mode block in use (`Lease::in_use`,
    /// `SyncState::in_use`).
    fn in_use(&self, now_ms: u64) -> bool {
        self.refusing(now_ms)
            || self
                .bucket
                .is_some_and(|b| now_ms < b.updated_ms.saturating_add(SLOT_HOLD_MS))
            || self.mode.in_use(now_ms)
    }

    /// Makes the mode block fit `mode`, the group's mode now. A block of
    /// another mode (written before a new configuration changed the
    /// group's mode; slots outlive configurations) is dropped, and what it
    /// held is returned, for the caller to count (and, for sync hits, to
    /// push); None when the block already fits (or is empty).
    pub fn switch_mode(&mut self, mode: Mode) -> Option<Stranded> {
        let stranded = match (&self.mode, mode) {
            (ModeState::None, _)
            | (ModeState::Lease(_), Mode::Lease)
            | (ModeState::Sync(_), Mode::Sync) => return None,
            (ModeState::Lease(l), _) => Stranded {
                lease_tokens: l.tokens,
                sync_hits: 0,
            },
            (ModeState::Sync(s), _) => Stranded {
                lease_tokens: 0,
                sync_hits: s.unsynced,
            },
        };
        self.mode = ModeState::None;
        Some(stranded)
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

// The layout's version: any change of the layout bumps it. Version 2 added
// the lease block, version 3 the sync block and the mode tag (byte 35).
// Every VM of one Envoy runs the same .wasm, so a slot of another version
// is only met across a reload, and is then taken as empty.
const VERSION: u8 = 4;
const HAS_BUCKET: u8 = 1;
const HAS_OVER_LIMIT: u8 = 2;
/// Byte 35: which mode block follows the statuses.
const MODE_TAG_AT: usize = 35;
const TAG_NONE: u8 = 0;
const TAG_LEASE: u8 = 1;
const TAG_SYNC: u8 = 2;
const HEADER_BYTES: usize = 36;
const STATUS_BYTES: usize = 20;
const MODE_AT: usize = HEADER_BYTES + MAX_STATUSES * STATUS_BYTES;
const LEASE_BYTES: usize = 48;
/// A sync view: each window's view (4 bytes) and its end in whole seconds
/// (4: every window ends on a second), then the unsynced hits, the hits in
/// flight and the next push (16).
const SYNC_BYTES: usize = 8 * UNITS + 16;
const SYNC_UNTIL_AT: usize = 4 * UNITS;
const SYNC_TAIL_AT: usize = 8 * UNITS;
/// The mode block: a lease or a sync state, whichever is larger.
const MODE_BYTES: usize = if LEASE_BYTES > SYNC_BYTES {
    LEASE_BYTES
} else {
    SYNC_BYTES
};
/// Every slot value has this size, so the shared data never grows after the
/// slots are created: 180 bytes (the mode block is 64 of them).
pub const SLOT_BYTES: usize = MODE_AT + MODE_BYTES;

/// Writes `bytes` at `at` (nothing if they do not fit): the fixed-size
/// encodings of shared-data values (a slot, the breaker, a fallback entry).
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

fn encode_lease(l: &Lease, b: &mut [u8]) {
    put(b, 0, &l.tokens.to_le_bytes());
    put(b, 4, &l.until_ms.to_le_bytes());
    put(b, 12, &l.refill_at_ms.to_le_bytes());
    put(b, 20, &l.remaining.to_le_bytes());
    put(b, 24, &l.remaining_until_ms.to_le_bytes());
    put(b, 32, &l.rate_second.to_le_bytes());
    put(b, 40, &l.rate_count.to_le_bytes());
    put(b, 44, &l.rate_prev.to_le_bytes());
}

fn decode_lease(b: &[u8]) -> Option<Lease> {
    Some(Lease {
        tokens: u32_at(b, 0)?,
        until_ms: u64_at(b, 4)?,
        refill_at_ms: u64_at(b, 12)?,
        remaining: u32_at(b, 20)?,
        remaining_until_ms: u64_at(b, 24)?,
        rate_second: u64_at(b, 32)?,
        rate_count: u32_at(b, 40)?,
        rate_prev: u32_at(b, 44)?,
    })
}

fn encode_sync(s: &SyncState, b: &mut [u8]) {
    for (i, (view, until)) in s.views.iter().zip(&s.view_until_ms).enumerate() {
        put(b, 4 * i, &view.to_le_bytes());
        let secs = u32::try_from(until.div_ceil(1_000)).unwrap_or(u32::MAX);
        put(b, SYNC_UNTIL_AT + 4 * i, &secs.to_le_bytes());
    }
    put(b, SYNC_TAIL_AT, &s.unsynced.to_le_bytes());
    put(b, SYNC_TAIL_AT + 4, &s.in_flight.to_le_bytes());
    put(b, SYNC_TAIL_AT + 8, &s.push_at_ms.to_le_bytes());
}

fn decode_sync(b: &[u8]) -> Option<SyncState> {
    let mut s = SyncState::default();
    for (i, (view, until)) in s.views.iter_mut().zip(&mut s.view_until_ms).enumerate() {
        *view = u32_at(b, 4 * i)?;
        *until = u64::from(u32_at(b, SYNC_UNTIL_AT + 4 * i)?) * 1_000;
    }
    s.unsynced = u32_at(b, SYNC_TAIL_AT)?;
    s.in_flight = u32_at(b, SYNC_TAIL_AT + 4)?;
    s.push_at_ms = u64_at(b, SYNC_TAIL_AT + 8)?;
    Some(s)
}

impl Slot {
    /// The fixed-size encoding: version, flags, fingerprint, bucket,
    /// over-limit deadline, the mode tag, up to four descriptor statuses
    /// (each with the id of its rule's name in `names`, 0 for none), and
    /// the mode block.
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
        let block = b.get_mut(MODE_AT..).unwrap_or_default();
        let tag = match &self.mode {
            ModeState::None => TAG_NONE,
            ModeState::Lease(l) => {
                encode_lease(l, block);
                TAG_LEASE
            }
            ModeState::Sync(s) => {
                encode_sync(s, block);
                TAG_SYNC
            }
        };
        put(&mut b, MODE_TAG_AT, &[tag]);
        put(&mut b, 0, &[VERSION, flags]);
        b
    }

    /// None for anything that is not a slot of this version (including the
    /// zeroed value a slot is created with, and an unknown mode tag).
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
        let block = b.get(MODE_AT..)?;
        let mode = match *b.get(MODE_TAG_AT)? {
            TAG_NONE => ModeState::None,
            TAG_LEASE => ModeState::Lease(decode_lease(block)?),
            TAG_SYNC => ModeState::Sync(decode_sync(block)?),
            _ => return None,
        };
        Some(Slot {
            fingerprint: u64_at(b, 2)?,
            bucket,
            over_limit,
            mode,
        })
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
            mode: ModeState::None,
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
            block in 0u8..3,
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
                mode: match block {
                    0 => ModeState::None,
                    1 => ModeState::Lease(Lease {
                        tokens: tokens_left,
                        until_ms: until,
                        refill_at_ms: updated,
                        remaining,
                        remaining_until_ms: until / 3,
                        rate_second: tokens,
                        rate_count: remaining / 2,
                        rate_prev: tokens_left / 2,
                    }),
                    _ => ModeState::Sync(SyncState {
                        views: [remaining, 1, 2, tokens_left, 5, 6],
                        // Window ends: whole seconds, kept as such.
                        view_until_ms: [
                            (until % (1 << 32)) * 1_000,
                            (updated % (1 << 32)) * 1_000,
                            3_000,
                            4_000,
                            5_000,
                            6_000,
                        ],
                        unsynced: tokens_left,
                        in_flight: remaining / 3,
                        push_at_ms: updated / 2,
                    }),
                },
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

    fn with_mode(mode: ModeState) -> Slot {
        Slot {
            mode,
            ..Slot::empty(9)
        }
    }

    const LEASED: Lease = Lease {
        tokens: 7,
        until_ms: 60_000,
        refill_at_ms: 0,
        remaining: 40,
        remaining_until_ms: 60_000,
        rate_second: 1,
        rate_count: 2,
        rate_prev: 3,
    };

    const SYNCED: SyncState = SyncState {
        views: [3, 0, 0, 0, 0, 0],
        view_until_ms: [60_000, 0, 0, 0, 0, 0],
        unsynced: 5,
        in_flight: 2,
        push_at_ms: 1_000,
    };

    #[test]
    fn a_mode_block_of_another_mode_is_dropped_and_what_it_held_returned() {
        let modes = [Mode::Exact, Mode::Lease, Mode::Sync];
        let blocks = [
            ModeState::None,
            ModeState::Lease(LEASED),
            ModeState::Sync(SYNCED),
        ];
        for block in blocks {
            for mode in modes {
                let mut slot = with_mode(block);
                let stranded = slot.switch_mode(mode);
                let expected = match (block, mode) {
                    (ModeState::None, _)
                    | (ModeState::Lease(_), Mode::Lease)
                    | (ModeState::Sync(_), Mode::Sync) => None,
                    // The lease's tokens: reserved, never spent.
                    (ModeState::Lease(_), _) => Some(Stranded {
                        lease_tokens: 7,
                        sync_hits: 0,
                    }),
                    // The hits no push took (those in flight reached the
                    // service already).
                    (ModeState::Sync(_), _) => Some(Stranded {
                        lease_tokens: 0,
                        sync_hits: 5,
                    }),
                };
                assert_eq!(stranded, expected, "{block:?} -> {mode:?}");
                let kept = if expected.is_some() {
                    ModeState::None
                } else {
                    block
                };
                assert_eq!(slot.mode, kept, "{block:?} -> {mode:?}");
                // Whatever it holds, it encodes as itself.
                assert_eq!(Slot::decode(&slot.encode()), Some(slot));
            }
        }
    }

    #[test]
    fn the_layout_is_version_4_with_the_mode_tag_at_byte_35() {
        let bytes = with_mode(ModeState::Sync(SYNCED)).encode();
        assert_eq!((bytes[0], bytes[MODE_TAG_AT]), (4, TAG_SYNC));
        assert_eq!(SLOT_BYTES, 180);
        // A slot of the previous layout is taken as empty.
        let mut old = bytes.clone();
        old[0] = 2;
        assert_eq!(Slot::decode(&old), None);
        // An unknown mode tag is not a slot.
        let mut unknown = bytes;
        unknown[MODE_TAG_AT] = 3;
        assert_eq!(Slot::decode(&unknown), None);
    }

    #[test]
    fn a_mode_block_in_use_holds_the_slot() {
        let lease = with_mode(ModeState::Lease(LEASED)).encode();
        assert_eq!(Slot::claim(Some(&lease), 2, 59_999, Claim::Request), None);
        assert!(Slot::claim(Some(&lease), 2, 60_000, Claim::Request).is_some());
        let sync = with_mode(ModeState::Sync(SYNCED)).encode();
        assert_eq!(Slot::claim(Some(&sync), 2, u64::MAX, Claim::Request), None);
    }
}
