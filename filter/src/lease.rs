//! Lease mode: an Envoy reserves a batch of a tenant's quota with one call
//! (`hits_addend` = batch on every descriptor of the group), and every
//! worker spends it through the tenant's slot in shared data, without a
//! call. Before the lease runs out (half of a batch left), the request that
//! notices asks its worker's root context to reserve the next batch
//! (`Host::request_refill`); the root sends it from `on_tick`, so no request
//! waits while tokens are left, and an HTTP stream that ends cannot cancel
//! the call. A request that finds no token asks for a batch itself (or for
//! one hit, while a refill is already under way) and waits for the answer,
//! as in exact mode.
//!
//! - The batch is about one second of this Envoy's own rate for the tenant
//!   (the requests of the last whole second, or of this one if more),
//!   between 1 and `local.lease.max_batch`, and never more than the service
//!   last reported as remaining in this window.
//! - A lease lives until the end of the window of the group's shortest unit
//!   that held the moment the call went out (windows align to the clock, as
//!   the service's do); tokens left then are stranded (counted), and a
//!   lease granted after its window ended is stranded whole. So every token
//!   spent in a window was counted by the service in that window: admitted
//!   never exceeds the limit.
//! - envoyproxy/ratelimit refuses a batch that would cross the limit, and
//!   (unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) still adds it to the
//!   counter, which is then over the limit: the tokens below the limit are
//!   lost for that window. Capping the batch at the last `limit_remaining`
//!   keeps that loss to what other Envoys took since that answer.
//!
//! Pure: state in, state out, time passed in; `flow` and the glue call it.

use std::borrow::Cow;

use prost::Message;
use ratelimit_config::{Group, Mode};

use crate::counters::GroupCounter;
use crate::decision::{encode_request, Compiled, Limited};
use crate::host::Host;
use crate::local::slot::{put, u32_at, u64_at};
use crate::local::{admit, update, Claim, LocalVerdict, Slot, SlotRef, UpdateError, CAS_ATTEMPTS};
use crate::proto::{Code, RateLimitResponse};
use ratelimit_config::{BucketParams, HeaderMode};

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
    pub const BYTES: usize = 48;

    pub fn encode(&self, b: &mut [u8]) {
        put(b, 0, &self.tokens.to_le_bytes());
        put(b, 4, &self.until_ms.to_le_bytes());
        put(b, 12, &self.refill_at_ms.to_le_bytes());
        put(b, 20, &self.remaining.to_le_bytes());
        put(b, 24, &self.remaining_until_ms.to_le_bytes());
        put(b, 32, &self.rate_second.to_le_bytes());
        put(b, 40, &self.rate_count.to_le_bytes());
        put(b, 44, &self.rate_prev.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Option<Lease> {
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

    /// Whether another tenant must leave the slot alone: tokens that have
    /// not expired, or a call for more under way.
    pub fn in_use(&self, now_ms: u64) -> bool {
        (self.tokens > 0 && now_ms < self.until_ms)
            || (self.refill_at_ms != 0 && now_ms < self.refill_at_ms.saturating_add(REFILL_HOLD_MS))
    }

    fn count_request(&mut self, now_ms: u64) {
        let second = now_ms / 1_000;
        if second == self.rate_second {
            self.rate_count = self.rate_count.saturating_add(1);
        } else {
            self.rate_prev = if second == self.rate_second.saturating_add(1) {
                self.rate_count
            } else {
                0
            };
            self.rate_second = second;
            self.rate_count = 1;
        }
    }

    /// Drops tokens whose window has ended; returns how many.
    fn expire(&mut self, now_ms: u64) -> u32 {
        if now_ms < self.until_ms {
            return 0;
        }
        std::mem::take(&mut self.tokens)
    }

    /// The next batch to ask for (see the module's comment).
    pub fn batch(&self, p: &LeaseParams, now_ms: u64) -> u32 {
        let rate = self.rate_count.max(self.rate_prev);
        let b = rate.clamp(1, p.max_batch.max(1));
        if now_ms < self.remaining_until_ms {
            b.min(self.remaining).max(1)
        } else {
            b
        }
    }

    fn refill_pending(&self, p: &LeaseParams, now_ms: u64) -> bool {
        self.refill_at_ms != 0 && now_ms < self.refill_at_ms.saturating_add(p.refill_lost_ms)
    }
}

/// A slot with a refill under way stays with its tenant this long.
const REFILL_HOLD_MS: u64 = 2_000;

/// A group's lease settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseParams {
    pub max_batch: u32,
    /// The group's shortest window, in milliseconds.
    pub window_ms: u64,
    /// A refill not answered after this long is taken as lost, and the
    /// next request may ask again.
    pub refill_lost_ms: u64,
}

impl LeaseParams {
    /// The lease settings of `group`, None unless its mode is lease.
    pub fn for_group(c: &Compiled, group: &Group) -> Option<LeaseParams> {
        if c.config.local.mode_for(group) != Mode::Lease {
            return None;
        }
        let (unit, _) = group.limits.iter().next()?;
        Some(LeaseParams {
            max_batch: c.config.local.lease_max_batch,
            window_ms: unit.seconds().saturating_mul(1_000),
            refill_lost_ms: u64::from(c.config.timeout_ms).saturating_add(1_000),
        })
    }

    /// The end of the window holding `now_ms`.
    pub fn window_end(&self, now_ms: u64) -> u64 {
        let w = self.window_ms.max(1);
        (now_ms / w).saturating_add(1).saturating_mul(w)
    }
}

/// What a request in lease mode does once the local layer let it through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// Admitted with a token of the lease, no call; `refill`: ask the root
    /// to reserve this batch.
    Token { refill: Option<u32> },
    /// No token left: this request asks the service for `batch` hits, the
    /// first of them its own (1 while a refill is already under way).
    Ask { batch: u32 },
}

/// Takes a token of `lease` for a request at `now_ms`; returns the lease to
/// store, what the request does, and the tokens that expired unspent.
pub fn spend(lease: Option<Lease>, p: &LeaseParams, now_ms: u64) -> (Lease, Spend, u32) {
    let mut l = lease.unwrap_or_default();
    l.count_request(now_ms);
    let stranded = l.expire(now_ms);
    let pending = l.refill_pending(p, now_ms);
    if !pending {
        l.refill_at_ms = 0;
    }
    let batch = l.batch(p, now_ms);
    let step = if l.tokens > 0 {
        l.tokens -= 1;
        let low = u64::from(l.tokens) * 2 <= u64::from(batch);
        let refill = (low && !pending).then(|| {
            l.refill_at_ms = now_ms.max(1);
            batch
        });
        Spend::Token { refill }
    } else if pending {
        Spend::Ask { batch: 1 }
    } else {
        l.refill_at_ms = now_ms.max(1);
        Spend::Ask { batch }
    };
    (l, step, stranded)
}

/// The local layer, then the lease, in one read-modify-write of the slot.
/// A refusal of the local layer (or a contended slot) comes back as it is,
/// with no spend.
pub fn admit_lease(
    stored: Option<&[u8]>,
    at: SlotRef,
    now_ms: u64,
    bucket: Option<BucketParams>,
    mode: HeaderMode,
    p: &LeaseParams,
) -> ((LocalVerdict, Option<Spend>, u32), Option<Slot>) {
    let (verdict, write) = admit(stored, at, now_ms, bucket, mode);
    if verdict != LocalVerdict::Proceed {
        return ((verdict, None, 0), write);
    }
    let claimed = write.or_else(|| Slot::claim(stored, at.fingerprint, now_ms, Claim::Request));
    let Some(mut slot) = claimed else {
        return ((LocalVerdict::Contended, None, 0), None);
    };
    let (lease, step, stranded) = spend(slot.lease, p, now_ms);
    slot.lease = Some(lease);
    ((LocalVerdict::Proceed, Some(step), stranded), Some(slot))
}

/// How a call for a batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Granted; the smallest `limit_remaining` of the answer.
    Granted { remaining: u32 },
    /// Refused (OVER_LIMIT): none of the batch is ours.
    Refused,
    /// Error or timeout.
    Failed,
}

impl Outcome {
    /// From the gRPC status and the answer's body.
    pub fn of(grpc_status: u32, body: Option<&[u8]>) -> Outcome {
        if grpc_status != 0 {
            return Outcome::Failed;
        }
        let Some(r) = body.and_then(|b| RateLimitResponse::decode(b).ok()) else {
            return Outcome::Failed;
        };
        match r.overall_code() {
            Code::Ok => Outcome::Granted {
                remaining: r
                    .statuses
                    .iter()
                    .map(|s| s.limit_remaining)
                    .min()
                    .unwrap_or(u32::MAX),
            },
            Code::OverLimit => Outcome::Refused,
            Code::Unknown => Outcome::Failed,
        }
    }
}

/// Stores the outcome of a call for a batch asked at `asked_at_ms`:
/// `tokens` of it become the lease's (the batch, less the asking request's
/// own hit). Returns the lease and the tokens stranded (granted after their
/// window ended, or left from an ended window).
pub fn settle(
    lease: Option<Lease>,
    p: &LeaseParams,
    asked_at_ms: u64,
    now_ms: u64,
    tokens: u32,
    outcome: Outcome,
) -> (Lease, u32) {
    let mut l = lease.unwrap_or_default();
    l.refill_at_ms = 0;
    let until = p.window_end(asked_at_ms);
    let mut stranded = l.expire(now_ms);
    match outcome {
        Outcome::Granted { remaining } => {
            if now_ms >= until {
                stranded = stranded.saturating_add(tokens);
            } else {
                if l.until_ms != until {
                    stranded = stranded.saturating_add(std::mem::take(&mut l.tokens));
                }
                l.tokens = l.tokens.saturating_add(tokens);
                l.until_ms = until;
                l.remaining = remaining;
                l.remaining_until_ms = until;
            }
        }
        Outcome::Refused => {
            // Nothing left in this window: the next ask is for one hit.
            l.remaining = 0;
            l.remaining_until_ms = until;
        }
        Outcome::Failed => {}
    }
    (l, stranded)
}

/// A batch a request asked its worker's root context to reserve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refill {
    pub group: usize,
    pub tenant: String,
    pub at: SlotRef,
    pub batch: u32,
}

/// The call for a refill: the group's descriptors, `hits_addend` = batch.
/// None if the group no longer exists.
pub fn refill_message(c: &Compiled, r: &Refill) -> Option<Vec<u8>> {
    let group = c.config.limits.all_groups().nth(r.group)?;
    let limited = Limited {
        group,
        group_index: r.group,
        tenant: Cow::Borrowed(r.tenant.as_str()),
    };
    Some(encode_request(c, &limited, r.batch))
}

/// The outcome of a call for `batch` tokens of the tenant at `at` (of
/// group `group`), asked at `asked_at_ms`, of which `tokens` become the
/// lease's; counted in the group.
#[allow(clippy::too_many_arguments)]
pub fn store_outcome<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    group: usize,
    at: SlotRef,
    asked_at_ms: u64,
    batch: u32,
    tokens: u32,
    outcome: Outcome,
) {
    let Some(p) = c
        .config
        .limits
        .all_groups()
        .nth(group)
        .and_then(|g| LeaseParams::for_group(c, g))
    else {
        return;
    };
    let now = host.now_ms();
    match outcome {
        Outcome::Granted { .. } => {
            host.count_group(group, GroupCounter::LeasesTaken);
            host.add_group(group, GroupCounter::LeaseTokens, u64::from(batch));
        }
        Outcome::Refused => {
            host.count_group(group, GroupCounter::LeasesRefused);
            host.add_group(group, GroupCounter::LeaseRefusedTokens, u64::from(batch));
        }
        Outcome::Failed => host.count_group(group, GroupCounter::LeasesFailed),
    }
    let stored = update(host, at.index, CAS_ATTEMPTS, |stored| {
        match Slot::claim(stored, at.fingerprint, now, Claim::Request) {
            Some(mut slot) => {
                let (lease, stranded) = settle(slot.lease, &p, asked_at_ms, now, tokens, outcome);
                slot.lease = Some(lease);
                (stranded, Some(slot))
            }
            // Another tenant holds the slot: granted tokens are lost to us.
            None => (
                if matches!(outcome, Outcome::Granted { .. }) {
                    tokens
                } else {
                    0
                },
                None,
            ),
        }
    });
    match stored {
        Ok(stranded) if stranded > 0 => {
            host.add_group(group, GroupCounter::LeaseStranded, u64::from(stranded));
        }
        Ok(_) => {}
        Err(UpdateError::CasRetriesExhausted) | Err(UpdateError::Host(_)) => {
            if let Outcome::Granted { .. } = outcome {
                host.add_group(group, GroupCounter::LeaseStranded, u64::from(tokens));
            }
        }
    }
}

/// The answer to a refill the root sent at `asked_at_ms`.
pub fn on_refill_answer<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    r: &Refill,
    asked_at_ms: u64,
    grpc_status: u32,
    body: Option<&[u8]>,
) {
    let outcome = Outcome::of(grpc_status, body);
    store_outcome(
        c,
        host,
        r.group,
        r.at,
        asked_at_ms,
        r.batch,
        r.batch,
        outcome,
    );
}

#[cfg(test)]
mod tests;
