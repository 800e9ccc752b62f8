//! Sync mode: an Envoy admits a tenant's requests locally while its last
//! view of the fleet's count plus its own hits the service has not seen yet
//! stays within every limit of the group, and reconciles every
//! `local.sync.interval_ms`: the root context of each worker takes the
//! tenant's unsynced hits out of its slot (with CAS, so exactly one worker
//! pushes a given delta), sends them as `hits_addend`, and the answer's
//! `limit_remaining` gives the fleet's new count (`limit - remaining`).
//!
//! - A view belongs to one clock-aligned window per unit; a new window
//!   starts from 0 (the service's count starts again too).
//! - At most `local.sync.max_unsynced` hits per tenant may be unknown to the
//!   service (unsynced or in a push under way); past it, requests ask the
//!   service one by one (hits_addend 1), as in exact mode, and their answers
//!   refresh the view too. This bounds the overshoot: while one Envoy fills
//!   the limit, each other Envoy may hold up to `max_unsynced` hits the
//!   service has not seen, once for its stale view and once for the push
//!   under way: overshoot <= 2 x (Envoys - 1) x max_unsynced.
//! - The view at the limit refuses locally (429, no call).
//! - A push that fails puts its hits back (they are pushed again with the
//!   next one), so the service learns them once it is back; meanwhile the
//!   cap above holds, and then each request follows `failure_mode_deny`.
//!
//! Pure: state in, state out, time passed in.

use std::borrow::Cow;

use prost::Message;
use ratelimit_config::{BucketParams, Group, HeaderMode, Mode};

use crate::counters::GroupCounter;
use crate::decision::{encode_request, Compiled, Limited, RETRY_AFTER};
use crate::host::Host;
use crate::local::slot::{put, u32_at, u64_at};
use crate::local::{admit, update, Claim, LocalVerdict, Slot, SlotRef, CAS_ATTEMPTS};
use crate::proto::{Code, RateLimitResponse};

/// The most units a group limits (second, minute, hour, day).
pub const UNITS: usize = 4;

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
    pub const BYTES: usize = 64;

    pub fn encode(&self, b: &mut [u8]) {
        for (i, (view, until)) in self.views.iter().zip(&self.view_until_ms).enumerate() {
            put(b, 4 * i, &view.to_le_bytes());
            put(b, 16 + 8 * i, &until.to_le_bytes());
        }
        put(b, 48, &self.unsynced.to_le_bytes());
        put(b, 52, &self.in_flight.to_le_bytes());
        put(b, 56, &self.push_at_ms.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Option<SyncState> {
        let mut s = SyncState::default();
        for (i, (view, until)) in s.views.iter_mut().zip(&mut s.view_until_ms).enumerate() {
            *view = u32_at(b, 4 * i)?;
            *until = u64_at(b, 16 + 8 * i)?;
        }
        s.unsynced = u32_at(b, 48)?;
        s.in_flight = u32_at(b, 52)?;
        s.push_at_ms = u64_at(b, 56)?;
        Some(s)
    }

    /// Hits the service has not seen: another tenant must not take the slot.
    pub fn in_use(&self, _now_ms: u64) -> bool {
        self.unsynced > 0 || self.in_flight > 0
    }

    /// Hits the service has not counted yet.
    pub fn pending(&self) -> u32 {
        self.unsynced.saturating_add(self.in_flight)
    }

    /// Starts the views of ended windows from 0, and takes a push that
    /// was never answered as not sent.
    fn roll(&mut self, p: &SyncParams, now_ms: u64) {
        let units = self.views.iter_mut().zip(&mut self.view_until_ms);
        for (i, (view, until)) in units.enumerate().take(p.units) {
            if now_ms >= *until {
                *view = 0;
                *until = p.window_end(i, now_ms);
            }
        }
        if self.in_flight > 0 && now_ms >= self.push_at_ms.saturating_add(p.push_lost_ms) {
            self.unsynced = self.unsynced.saturating_add(self.in_flight);
            self.in_flight = 0;
        }
    }
}

/// A group's sync settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncParams {
    pub max_unsynced: u32,
    /// The window (ms) and the limit of each unit the group limits,
    /// shortest first; `units` of them.
    pub windows: [(u64, u32); UNITS],
    pub units: usize,
    /// A push not answered after this long is taken as not sent.
    pub push_lost_ms: u64,
}

impl SyncParams {
    /// The sync settings of `group`, None unless its mode is sync.
    pub fn for_group(c: &Compiled, group: &Group) -> Option<SyncParams> {
        if c.config.local.mode_for(group) != Mode::Sync {
            return None;
        }
        let mut windows = [(1_000, 0); UNITS];
        let mut units = 0;
        for ((unit, limit), w) in group.limits.iter().zip(windows.iter_mut()) {
            *w = (unit.seconds().saturating_mul(1_000), limit);
            units += 1;
        }
        Some(SyncParams {
            max_unsynced: c.config.local.sync_max_unsynced,
            windows,
            units,
            push_lost_ms: u64::from(c.config.timeout_ms).saturating_add(1_000),
        })
    }

    /// The end of unit `i`'s window holding `now_ms`.
    pub fn window_end(&self, i: usize, now_ms: u64) -> u64 {
        let w = self.windows.get(i).map_or(1_000, |w| w.0.max(1));
        (now_ms / w).saturating_add(1).saturating_mul(w)
    }
}

/// What a request in sync mode does once the local layer let it through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncStep {
    /// Admitted locally: one more unsynced hit.
    Admit,
    /// The view plus the unsynced hits reach a limit: 429, no call.
    Refuse { retry_after_s: u64 },
    /// `max_unsynced` hits are pending: ask the service (one hit).
    Ask,
}

/// Decides a request at `now_ms` from the tenant's sync state.
pub fn decide(state: Option<SyncState>, p: &SyncParams, now_ms: u64) -> (SyncState, SyncStep) {
    let mut s = state.unwrap_or_default();
    s.roll(p, now_ms);
    let pending = u64::from(s.pending());
    let units = s.views.iter().zip(&s.view_until_ms).zip(&p.windows);
    for ((view, until), (_, limit)) in units.take(p.units) {
        if u64::from(*view) + pending + 1 > u64::from(*limit) {
            let retry = until.saturating_sub(now_ms).div_ceil(1_000);
            return (
                s,
                SyncStep::Refuse {
                    retry_after_s: retry.max(1),
                },
            );
        }
    }
    if s.pending() >= p.max_unsynced {
        // The asking request's hit stays pending until its answer, which
        // includes it in the view: requests asking at once must not each
        // be admitted against the same view.
        s.in_flight = s.in_flight.saturating_add(1);
        s.push_at_ms = now_ms.max(1);
        return (s, SyncStep::Ask);
    }
    s.unsynced = s.unsynced.saturating_add(1);
    (s, SyncStep::Admit)
}

/// The local layer, then the sync decision, in one read-modify-write.
pub fn admit_sync(
    stored: Option<&[u8]>,
    at: SlotRef,
    now_ms: u64,
    bucket: Option<BucketParams>,
    mode: HeaderMode,
    p: &SyncParams,
) -> ((LocalVerdict, Option<SyncStep>), Option<Slot>) {
    let (verdict, write) = admit(stored, at, now_ms, bucket, mode);
    if verdict != LocalVerdict::Proceed {
        return ((verdict, None), write);
    }
    let claimed = write.or_else(|| Slot::claim(stored, at.fingerprint, now_ms, Claim::Request));
    let Some(mut slot) = claimed else {
        return ((LocalVerdict::Contended, None), None);
    };
    let (state, step) = decide(slot.sync, p, now_ms);
    // A refusal writes only what changed (a rolled window, a bucket's
    // token), so a flood of refusals costs no writes.
    let changed = slot.sync != Some(state) || write_needed(&step);
    slot.sync = Some(state);
    let write = changed.then_some(slot);
    ((LocalVerdict::Proceed, Some(step)), write)
}

fn write_needed(step: &SyncStep) -> bool {
    !matches!(step, SyncStep::Refuse { .. })
}

/// The headers of a local refusal in sync mode.
pub fn refusal_headers(retry_after_s: u64) -> Vec<(&'static str, String)> {
    vec![(RETRY_AFTER, retry_after_s.to_string())]
}

/// Takes the unsynced hits out of the state for a push at `now_ms` (0 when
/// there are none).
pub fn take_delta(state: Option<SyncState>, p: &SyncParams, now_ms: u64) -> (SyncState, u32) {
    let mut s = state.unwrap_or_default();
    s.roll(p, now_ms);
    if s.unsynced == 0 {
        return (s, 0);
    }
    // Taken out under CAS: each hit is pushed by exactly one worker, even
    // with another push (or a request's own call) still under way.
    let delta = std::mem::take(&mut s.unsynced);
    s.in_flight = s.in_flight.saturating_add(delta);
    s.push_at_ms = now_ms.max(1);
    (s, delta)
}

/// What the service said to a push (or to a request's own call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// The answer: per descriptor (unit order), whether it is over the
    /// limit and its `limit_remaining`.
    Counts(Vec<(bool, u32)>),
    Failed,
}

impl Heard {
    pub fn of(grpc_status: u32, body: Option<&[u8]>) -> Heard {
        if grpc_status != 0 {
            return Heard::Failed;
        }
        match body.and_then(|b| RateLimitResponse::decode(b).ok()) {
            Some(r) if r.overall_code() != Code::Unknown => Heard::Counts(
                r.statuses
                    .iter()
                    .map(|s| (s.code() == Code::OverLimit, s.limit_remaining))
                    .collect(),
            ),
            _ => Heard::Failed,
        }
    }

    pub fn over_limit(&self) -> bool {
        matches!(self, Heard::Counts(c) if c.iter().any(|(over, _)| *over))
    }
}

/// Stores what the service said to a call asked at `asked_at_ms` that
/// carried `delta` pending hits (a push's, `pushed`, or an asking request's
/// own): the in-flight hits are done with (a failed push's are put back,
/// to be pushed again: they were admitted on the promise of being pushed;
/// a request whose own call failed followed `failure_mode_deny` and is not
/// counted, as in exact mode), and every unit whose window has not ended
/// since learns the fleet's count.
pub fn settle(
    state: Option<SyncState>,
    p: &SyncParams,
    asked_at_ms: u64,
    now_ms: u64,
    delta: u32,
    pushed: bool,
    heard: &Heard,
) -> SyncState {
    let mut s = state.unwrap_or_default();
    if delta > 0 {
        s.in_flight = s.in_flight.saturating_sub(delta);
        // `push_at_ms` is when the last in-flight hits went out: the others
        // still under way are older, and lost together with them.
        if s.in_flight == 0 {
            s.push_at_ms = 0;
        }
        if *heard == Heard::Failed && pushed {
            s.unsynced = s.unsynced.saturating_add(delta);
        }
    }
    s.roll(p, now_ms);
    if let Heard::Counts(counts) = heard {
        let units = s.views.iter_mut().zip(&mut s.view_until_ms).zip(&p.windows);
        for (i, (((view, view_until), (_, limit)), (over, remaining))) in
            units.zip(counts).enumerate().take(p.units)
        {
            let until = p.window_end(i, asked_at_ms);
            if now_ms >= until {
                continue;
            }
            let total = if *over {
                *limit
            } else {
                limit.saturating_sub(*remaining)
            };
            if *view_until != until {
                *view = total;
                *view_until = until;
            } else {
                *view = (*view).max(total);
            }
        }
    }
    s
}

/// A tenant whose hits a worker's root pushes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub group: usize,
    pub tenant: String,
    pub at: SlotRef,
    pub delta: u32,
    pub asked_at_ms: u64,
}

fn params_of(c: &Compiled, group: usize) -> Option<SyncParams> {
    let g = c.config.limits.all_groups().nth(group)?;
    SyncParams::for_group(c, g)
}

/// Takes the tenant's unsynced hits out of its slot and returns the push
/// to send (None: nothing to push, or another worker has it under way).
/// `idle`: whether the tenant has nothing pending any more (the caller may
/// forget it until its next request).
pub fn next_push<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    group: usize,
    tenant: &str,
    at: SlotRef,
) -> (Option<(Push, Vec<u8>)>, bool) {
    let Some(p) = params_of(c, group) else {
        return (None, true);
    };
    let now = host.now_ms();
    let taken = update(
        host,
        at.index,
        CAS_ATTEMPTS,
        |stored| match Slot::decode_for(stored, at.fingerprint) {
            Some(mut slot) => {
                let (state, delta) = take_delta(slot.sync, &p, now);
                let idle = state.pending() == 0;
                slot.sync = Some(state);
                let write = (delta > 0).then_some(slot);
                ((delta, idle), write)
            }
            None => ((0, true), None),
        },
    );
    let (delta, idle) = match taken {
        Ok(t) => t,
        Err(_) => return (None, false),
    };
    if delta == 0 {
        return (None, idle);
    }
    let push = Push {
        group,
        tenant: tenant.to_string(),
        at,
        delta,
        asked_at_ms: now,
    };
    let message = push_message(c, &push);
    match message {
        Some(m) => (Some((push, m)), false),
        None => (None, true),
    }
}

/// The call of a push: the group's descriptors, `hits_addend` = delta.
pub fn push_message(c: &Compiled, push: &Push) -> Option<Vec<u8>> {
    let group = c.config.limits.all_groups().nth(push.group)?;
    let limited = Limited {
        group,
        group_index: push.group,
        tenant: Cow::Borrowed(push.tenant.as_str()),
    };
    Some(encode_request(c, &limited, push.delta))
}

/// Stores what the service said to a call carrying `delta` hits that were
/// pending (a push's, or 1 for a request that asked itself: `pushed`
/// false) asked at `asked_at_ms`; a push is counted in the group.
#[allow(clippy::too_many_arguments)]
pub fn store_heard<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    group: usize,
    at: SlotRef,
    asked_at_ms: u64,
    delta: u32,
    pushed: bool,
    heard: &Heard,
) {
    let Some(p) = params_of(c, group) else {
        return;
    };
    if pushed {
        match heard {
            Heard::Failed => host.count_group(group, GroupCounter::SyncFailed),
            Heard::Counts(_) => {
                host.count_group(group, GroupCounter::Syncs);
                host.add_group(group, GroupCounter::SyncHits, u64::from(delta));
                if heard.over_limit() {
                    host.add_group(group, GroupCounter::SyncOverLimitHits, u64::from(delta));
                }
            }
        }
    }
    let now = host.now_ms();
    let _ = update(
        host,
        at.index,
        CAS_ATTEMPTS,
        |stored| match Slot::decode_for(stored, at.fingerprint) {
            Some(mut slot) => {
                slot.sync = Some(settle(
                    slot.sync,
                    &p,
                    asked_at_ms,
                    now,
                    delta,
                    pushed,
                    heard,
                ));
                ((), Some(slot))
            }
            None => ((), None),
        },
    );
}

/// The answer to a push the root sent.
pub fn on_push_answer<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    push: &Push,
    grpc_status: u32,
    body: Option<&[u8]>,
) {
    let heard = Heard::of(grpc_status, body);
    store_heard(
        c,
        host,
        push.group,
        push.at,
        push.asked_at_ms,
        push.delta,
        true,
        &heard,
    );
}

#[cfg(test)]
mod tests;
