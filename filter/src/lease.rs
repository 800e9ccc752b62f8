//! Lease mode: an Envoy reserves a batch of a tenant's quota with one call
//! and spends it locally, so most requests need no call and admitted never
//! exceeds the limit. The batch follows this Envoy's rate for the tenant,
//! and a lease lives only until the end of its window (see "Modes: design
//! notes" in docs/architecture.md). Pure: state in, state out, time passed
//! in; `modes` keeps it in the tenant's slot.

use ratelimit_config::{Group, Mode, PluginConfig};

use crate::answer::Answer;
use crate::local::state::Lease;
use crate::proto::DescriptorStatus;
use crate::window;

impl Lease {
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

/// A group's lease settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseParams {
    /// `lease.max_batch`, at most a twentieth of the group's tightest
    /// limit (`LocalConfig::lease_max_batch_for`).
    pub max_batch: u32,
    /// The group's shortest window, in milliseconds.
    pub window_ms: u64,
    /// A refill not answered after this long is taken as lost, and the
    /// next request may ask again.
    pub refill_lost_ms: u64,
}

impl LeaseParams {
    /// The lease settings of `group`, None unless its mode is lease.
    pub fn for_group(config: &PluginConfig, group: &Group) -> Option<LeaseParams> {
        if config.local.mode_for(group) != Mode::Lease {
            return None;
        }
        let (unit, _) = group.limits.iter().next()?;
        Some(LeaseParams {
            max_batch: config.local.lease_max_batch_for(group),
            window_ms: window::of_unit(unit),
            refill_lost_ms: u64::from(config.timeout_ms).saturating_add(1_000),
        })
    }

    /// The end of the window holding `now_ms`.
    pub fn window_end(&self, now_ms: u64) -> u64 {
        window::end(self.window_ms, now_ms)
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

/// At the root's pass after a window ended: the batch to reserve for a
/// tenant this Envoy served a request of in this second or the one before,
/// sent with every other tenant's in one call, so that the window's first
/// requests find tokens instead of each asking on its own. Returns the
/// lease to store (the refill marked under way, the old window's tokens
/// dropped), the batch (None: the lease of this window is there, a refill
/// is under way, or the tenant is idle), the tokens that expired unspent,
/// and whether the tenant is idle (the root forgets it until its next
/// request).
pub fn window_refill(
    lease: Lease,
    p: &LeaseParams,
    now_ms: u64,
) -> (Lease, Option<u32>, u32, bool) {
    let mut l = lease;
    let idle = l.rate_second.saturating_add(1) < now_ms / 1_000;
    if idle || now_ms < l.until_ms || l.refill_pending(p, now_ms) {
        return (l, None, 0, idle);
    }
    let stranded = l.expire(now_ms);
    let batch = l.batch(p, now_ms);
    l.refill_at_ms = now_ms.max(1);
    (l, Some(batch), stranded, false)
}

/// How a call for a batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Granted; the smallest `limit_remaining` of the answer.
    Granted { remaining: u32 },
    /// Refused (OVER_LIMIT): none of the batch is ours.
    Refused,
    /// Error or timeout.
    Failed,
}

impl BatchOutcome {
    /// From the service's answer (`answer::decode`; None: the call
    /// failed).
    pub fn of(answer: Option<&Answer>) -> BatchOutcome {
        match answer {
            Some(a) if a.over_limit => BatchOutcome::Refused,
            Some(a) => BatchOutcome::Granted {
                remaining: a.remaining(),
            },
            None => BatchOutcome::Failed,
        }
    }
}

/// Stores the outcome of a call for a batch asked at `asked_at_ms`:
/// `tokens` of it become the lease's (the batch, less the asking request's
/// own hit). Returns the lease and the tokens stranded (granted after their
/// window ended, or left from an ended window).
pub fn after_answer(
    lease: Option<Lease>,
    p: &LeaseParams,
    asked_at_ms: u64,
    now_ms: u64,
    tokens: u32,
    outcome: BatchOutcome,
) -> (Lease, u32) {
    let mut l = lease.unwrap_or_default();
    l.refill_at_ms = 0;
    let until = p.window_end(asked_at_ms);
    let mut stranded = l.expire(now_ms);
    match outcome {
        BatchOutcome::Granted { remaining } => {
            if now_ms >= until {
                stranded = stranded.saturating_add(tokens);
            } else {
                if l.until_ms != until {
                    stranded = stranded.saturating_add(std::mem::take(&mut l.tokens));
                }
                l.tokens = l.tokens.saturating_add(tokens);
                l.until_ms = until;
                // Within one window the service's count only grows, so of
                // two answers the smaller remaining is the later count:
                // answers to calls of two workers may come back in either
                // order. A refusal's 0 gives way to a grant.
                l.remaining = if l.remaining_until_ms == until && l.remaining > 0 {
                    l.remaining.min(remaining)
                } else {
                    remaining
                };
                l.remaining_until_ms = until;
            }
        }
        BatchOutcome::Refused => {
            // Nothing left in this window: the next ask is for one hit.
            l.remaining = 0;
            l.remaining_until_ms = until;
        }
        BatchOutcome::Failed => {}
    }
    (l, stranded)
}

/// Whether a refusal of a call for `hits` hits leaves room for a smaller
/// one: every window of the answer still has some left. The counter
/// refuses a request that would cross a limit whole, counts none of it and
/// says what remains; envoyproxy/ratelimit counts refused hits and answers
/// 0 left on a refusal. Such a refusal is not kept in the over-limit cache:
/// the tenant's next requests spend the tokens this Envoy holds, then ask
/// for one hit (`after_answer`), until the limit is spent exactly.
pub fn smaller_may_fit(hits: u32, statuses: &[DescriptorStatus]) -> bool {
    hits > 1 && statuses.iter().all(|s| s.limit_remaining > 0)
}

#[cfg(test)]
mod tests;
