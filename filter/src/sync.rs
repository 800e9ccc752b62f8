//! Sync mode: an Envoy admits a tenant's requests locally while its last
//! view of the fleet's count plus its own unpushed hits stays within the
//! limits, and each worker's root pushes those hits every interval: no call
//! on most requests, an overshoot bounded by `max_unsynced` (see "Modes:
//! design notes" in docs/architecture.md). Pure: state in, state out, time
//! passed in; `modes` keeps it in the tenant's slot.

use ratelimit_config::{Group, Mode, PluginConfig};

use crate::answer::Answer;
use crate::headers::RETRY_AFTER;
use crate::local::state::SyncState;
use crate::window;

use crate::window::UNITS;

impl SyncState {
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
    pub fn for_group(config: &PluginConfig, group: &Group) -> Option<SyncParams> {
        if config.local.mode_for(group) != Mode::Sync {
            return None;
        }
        let (windows, units) = window::of_group(group);
        Some(SyncParams {
            max_unsynced: config.local.max_unsynced_for(group),
            windows,
            units,
            push_lost_ms: u64::from(config.timeout_ms).saturating_add(1_000),
        })
    }

    /// The end of unit `i`'s window holding `now_ms`.
    pub fn window_end(&self, i: usize, now_ms: u64) -> u64 {
        window::end(self.windows.get(i).map_or(1_000, |w| w.0), now_ms)
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

/// Stores what the service said to a call asked at `asked_at_ms` that
/// carried `delta` pending hits (a push's, `pushed`, or an asking request's
/// own): the in-flight hits are done with (a failed push's are put back,
/// to be pushed again: they were admitted on the promise of being pushed;
/// a request whose own call failed followed `failure_mode_deny` and is not
/// counted, as in exact mode), and every unit whose window has not ended
/// since learns the fleet's count.
pub fn after_answer(
    state: Option<SyncState>,
    p: &SyncParams,
    asked_at_ms: u64,
    now_ms: u64,
    delta: u32,
    pushed: bool,
    answer: Option<&Answer>,
) -> SyncState {
    let mut s = state.unwrap_or_default();
    if delta > 0 {
        s.in_flight = s.in_flight.saturating_sub(delta);
        // `push_at_ms` is when the last in-flight hits went out: the others
        // still under way are older, and lost together with them.
        if s.in_flight == 0 {
            s.push_at_ms = 0;
        }
        if answer.is_none() && pushed {
            s.unsynced = s.unsynced.saturating_add(delta);
        }
    }
    s.roll(p, now_ms);
    if let Some(answer) = answer {
        let units = s.views.iter_mut().zip(&mut s.view_until_ms).zip(&p.windows);
        for (i, (((view, view_until), (_, limit)), (over, remaining))) in
            units.zip(answer.counts()).enumerate().take(p.units)
        {
            let until = p.window_end(i, asked_at_ms);
            if now_ms >= until {
                continue;
            }
            let total = if over {
                *limit
            } else {
                limit.saturating_sub(remaining)
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

#[cfg(test)]
mod tests;
