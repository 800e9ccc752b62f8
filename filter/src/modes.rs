//! The local layer's outcome for one request (`local_outcome`), by the
//! group's mode (exact: the bucket and the over-limit cache, then a call;
//! `lease`; `sync`); what an answer to a mode's call leaves in the slot is
//! `answer_path`'s. One read-modify-write of the slot per request in every
//! mode; the mode's counters are counted here, so `flow` only acts on the
//! outcome and `root` only sends and receives.
//!
//! A slot outlives configurations: when a new one changes a group's mode,
//! the tenant's next request that the local layer lets through finds the
//! old mode's block and drops it (`Slot::switch_mode`), counting what it
//! held (`mode_change_lease_tokens`, `mode_change_sync_hits`). That request
//! always calls the service (exact mode does; a fresh lease has no token),
//! and its call carries a sync block's unpushed hits (`LocalOutcome::Ask`),
//! so the service counts every hit admitted before it decides on this one.

use ratelimit_config::{BucketParams, HeaderMode, Unit};

use crate::access_log::DecidedBy;
use crate::batch::{CallKind, Settle, TenantCall};
use crate::compiled::{Compiled, ModeParams};
use crate::counters::{Counter, GroupCounter};
use crate::decision::Limited;
use crate::headers::{group_policy, limit_headers};
use crate::host::Host;
use crate::lease::{self, Spend};
use crate::local::names::lookup;
use crate::local::state::{Lease, SyncState};
use crate::local::SLOT_PROBES;
use crate::local::{self, update, Claim, LocalVerdict, ModeState, Slot};
use crate::local::{route_slot_for, slot_for, SlotRef, Slots, Stranded, UpdateError, CAS_ATTEMPTS};
use crate::proto::{Code, DescriptorStatus, Duration, RateLimit, RateLimitUnit};
use crate::sync::{self, refusal_headers, SyncParams, SyncStep};
use crate::vm::Vm;
use crate::window::UNITS;

/// What the local layer decided for one request: the one outcome the flow
/// acts on.
#[derive(Debug, PartialEq, Eq)]
pub enum LocalOutcome {
    /// The local layer is off: the request asks the service, with no slot.
    Skip,
    /// Refused without a call: by a token bucket or an over-limit cache
    /// (the tenant's, or its state on the route), or by a sync view at its
    /// limit (`source` says which), with the reply's headers.
    Refused {
        source: DecidedBy,
        headers: Vec<(&'static str, String)>,
    },
    /// Admitted from local state without a call (a lease's token, or a
    /// sync view), with the rate-limit headers of its estimate (`RemainingEstimate`).
    Admitted {
        slots: Slots,
        headers: Vec<(&'static str, String)>,
    },
    /// Ask the service for `hits` hits (a lease's batch, or the request's
    /// cost, plus the hits of a sync block a mode change dropped, that no
    /// push took); `settle` is what its answer leaves in the tenant's slot.
    /// A slot another tenant holds, or a local layer that failed, asks as
    /// exact mode does (`Settle::Nothing`).
    Ask {
        slots: Slots,
        settle: Settle,
        hits: u32,
    },
}

impl LocalOutcome {
    /// The tenant's slots, when the request goes on with them (admitted
    /// locally, or asking).
    pub fn slots(&self) -> Option<Slots> {
        match self {
            LocalOutcome::Admitted { slots, .. } | LocalOutcome::Ask { slots, .. } => Some(*slots),
            LocalOutcome::Skip | LocalOutcome::Refused { .. } => None,
        }
    }
}

/// One request, as the local layer sees it.
pub struct Request<'r, 'c> {
    pub limited: &'r Limited<'c>,
    /// What it costs (`cost_header`; 1 without).
    pub cost: u32,
    /// The time of the request callback (the clock is read once per
    /// callback).
    pub now_ms: u64,
}

/// What `admit` decided on the stored slot (pure: the effects are
/// `tenant_outcome`'s).
#[derive(Debug, PartialEq, Eq)]
struct Admission {
    step: ModeStep,
    /// The block of another mode the slot held, dropped.
    switched: Option<Stranded>,
    /// Lease tokens whose window ended unspent.
    lease_stranded: u32,
}

/// The local layer's verdict, then the mode's step on it.
#[derive(Debug, PartialEq, Eq)]
enum ModeStep {
    /// As the local layer's verdict says (exact mode, a request that
    /// costs more than 1 or is on a route, a refusal, a contended slot).
    Local(LocalVerdict),
    /// A lease's token spent, with what it leaves (and, when the lease runs
    /// low, the batch of a refill to send).
    LeaseToken {
        refill: Option<u32>,
        left: RemainingEstimate,
    },
    /// No token: the request asks for a batch of `batch` hits.
    LeaseAsk { batch: u32 },
    /// Sync: admitted from the view, with what it leaves.
    SyncAdmit(RemainingEstimate),
    /// Sync: the view is at the limit.
    SyncRefuse { retry_after_s: u64 },
    /// Sync: the request asks the service (its answer refreshes the view).
    SyncAsk,
}

impl Admission {
    fn just(verdict: LocalVerdict) -> Admission {
        Admission {
            step: ModeStep::Local(verdict),
            switched: None,
            lease_stranded: 0,
        }
    }
}

/// What an admission without a call leaves of each of its group's limits
/// (shortest unit first), as this Envoy knows it: the last answer of the
/// service, less what this Envoy admitted since. An estimate (other Envoys
/// may have taken some since), never more than that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemainingEstimate {
    pub remaining: [u32; UNITS],
    /// When each unit's window ends.
    pub until_ms: [u64; UNITS],
    pub units: usize,
}

impl RemainingEstimate {
    /// A lease's: the smallest `limit_remaining` of its last answer plus
    /// its tokens unspent (the service counted them with that answer), in
    /// every unit, at most the unit's limit.
    fn lease(l: &Lease, limits: &ratelimit_config::UnitLimits, now_ms: u64) -> RemainingEstimate {
        let mut left = RemainingEstimate::default();
        let estimate = l.remaining.saturating_add(l.tokens);
        let slots = left.remaining.iter_mut().zip(left.until_ms.iter_mut());
        for ((unit, limit), (remaining, until)) in limits.iter().zip(slots) {
            *remaining = estimate.min(limit);
            *until = crate::window::end(crate::window::of_unit(unit), now_ms);
            left.units += 1;
        }
        left
    }

    /// A sync view's: each unit's limit less the fleet's last reported
    /// count and this Envoy's hits the service has not counted yet.
    fn sync(s: &SyncState, p: &SyncParams) -> RemainingEstimate {
        let mut left = RemainingEstimate::default();
        let pending = s.pending();
        let units = p.windows.iter().zip(s.views.iter().zip(&s.view_until_ms));
        let slots = left.remaining.iter_mut().zip(left.until_ms.iter_mut());
        for (((_, limit), (view, view_until)), (remaining, until)) in units.zip(slots).take(p.units)
        {
            *remaining = limit.saturating_sub(view.saturating_add(pending));
            *until = *view_until;
            left.units += 1;
        }
        left
    }

    /// The rate-limit headers of this estimate, as an answer with these
    /// statuses would give them.
    pub fn headers(
        &self,
        mode: HeaderMode,
        limits: &ratelimit_config::UnitLimits,
        now_ms: u64,
    ) -> Vec<(&'static str, String)> {
        if mode == HeaderMode::Off {
            return Vec::new();
        }
        let statuses: Vec<DescriptorStatus> = limits
            .iter()
            .zip(self.remaining.iter().zip(&self.until_ms))
            .take(self.units)
            .map(|((unit, limit), (remaining, until))| DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: limit,
                    unit: RateLimitUnit::from(unit) as i32,
                }),
                limit_remaining: *remaining,
                duration_until_reset: Some(Duration {
                    seconds: i64::try_from(until.saturating_sub(now_ms).div_ceil(1_000))
                        .unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            })
            .collect();
        limit_headers(mode, &statuses)
    }
}

/// What `admit` reads besides the stored slot: the request, and its
/// group's local settings.
struct Admit<'a> {
    now_ms: u64,
    cost: u32,
    bucket: Option<BucketParams>,
    headers: HeaderMode,
    /// Reads the rule names of a cached refusal.
    names: &'a dyn Fn(u8) -> Option<String>,
    params: ModeParams,
    /// The request is on a route with limits of its own.
    on_route: bool,
    limits: &'a ratelimit_config::UnitLimits,
}

/// The local layer, then the mode, for a request (`a`) on the stored slot;
/// returns the slot to write, if any. Every mode answers cached refusals
/// alike. A request that costs more than 1, or that is on a route with
/// limits of its own, asks the service itself in every mode, as in exact
/// mode (leases and sync views count single hits of the group's
/// descriptors only), and leaves the mode's block as it is.
fn admit(stored: Option<&[u8]>, at: SlotRef, a: &Admit<'_>) -> (Admission, Option<Slot>) {
    let now_ms = a.now_ms;
    let Some(mut slot) = Slot::claim(stored, at.fingerprint, now_ms, Claim::Request) else {
        return (Admission::just(LocalVerdict::Contended), None);
    };
    let changed = match local::decide(&mut slot, now_ms, a.bucket, a.headers, a.names, a.cost) {
        Ok(changed) => changed,
        Err(refusal) => return (Admission::just(refusal), None),
    };
    let switched = slot.switch_mode(a.params.mode());
    let mut admission = Admission {
        switched,
        ..Admission::just(LocalVerdict::Proceed)
    };
    let single = a.cost <= 1 && !a.on_route;
    let write = match a.params {
        ModeParams::Lease(p) if single => {
            let held = match slot.mode {
                ModeState::Lease(l) => Some(l),
                _ => None,
            };
            let (l, spend, stranded) = lease::spend(held, &p, now_ms);
            slot.mode = ModeState::Lease(l);
            admission.step = match spend {
                Spend::Token { refill } => ModeStep::LeaseToken {
                    refill,
                    left: RemainingEstimate::lease(&l, a.limits, now_ms),
                },
                Spend::Ask { batch } => ModeStep::LeaseAsk { batch },
            };
            admission.lease_stranded = stranded;
            true
        }
        ModeParams::Sync(p) if single => {
            let before = slot.mode;
            let held = match before {
                ModeState::Sync(s) => Some(s),
                _ => None,
            };
            let (state, step) = sync::decide(held, &p, now_ms);
            slot.mode = ModeState::Sync(state);
            let refused = matches!(step, SyncStep::Refuse { .. });
            admission.step = match step {
                SyncStep::Admit => ModeStep::SyncAdmit(RemainingEstimate::sync(&state, &p)),
                SyncStep::Refuse { retry_after_s } => ModeStep::SyncRefuse { retry_after_s },
                SyncStep::Ask => ModeStep::SyncAsk,
            };
            // A refusal writes only what changed in the view (a rolled
            // window) or a dropped block, so a flood of refusals costs no
            // writes.
            switched.is_some() || slot.mode != before || !refused
        }
        _ => changed || switched.is_some(),
    };
    (admission, write.then_some(slot))
}

/// The local layer for `req`: the tenant's state on its route first (a
/// refusal there writes nothing), then its own slot (probing past slots
/// other tenants hold) and its group's mode. Queues what the root must
/// send (a lease refill) and the tenants it must track in `vm`'s mailbox;
/// counts the layer's own counters (the flow counts refusals).
pub fn local_outcome<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    vm: &Vm,
    req: &Request<'_, '_>,
) -> LocalOutcome {
    let local = &c.config.local;
    if !local.enabled {
        return LocalOutcome::Skip;
    }
    let limited = req.limited;
    let (secret, tenant) = (&vm.slot_secret, &limited.tenant);
    let scope = c.scope(limited.group_id);
    let first = slot_for(secret, scope, tenant, local.slots);
    let on_route = limited.route.map(|r| {
        (
            r,
            route_slot_for(secret, scope, tenant, &r.name, local.slots),
        )
    });
    let names = |id| lookup(host, id);
    if let Some((route, route_at)) = on_route {
        let verdict = route_verdict(c, host, req, route, route_at, &names);
        if let Some(refused) = refusal(c, host, &route.limits, verdict) {
            return refused;
        }
    }
    let (at, admitted) = probe(c, host, req, first, &names);
    let slots = Slots {
        own: at,
        on_route: on_route.map(|(_, at)| at),
    };
    tenant_outcome(c, host, vm, req, slots, admitted)
}

/// The local layer and the mode on the tenant's slot from `first`: a slot
/// another tenant holds, the next few are tried before the tenant goes
/// without local state (`slot_contended`). Returns the slot last tried.
fn probe<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    req: &Request<'_, '_>,
    first: SlotRef,
    names: &dyn Fn(u8) -> Option<String>,
) -> (SlotRef, Result<Admission, UpdateError>) {
    let limited = req.limited;
    let a = Admit {
        now_ms: req.now_ms,
        cost: req.cost,
        bucket: c.config.local.bucket_for(limited.group),
        headers: c.config.headers,
        names,
        params: c.mode_params(limited.group_id),
        on_route: limited.route.is_some(),
        limits: &limited.group.limits,
    };
    let mut at = first;
    let mut probes = 1;
    loop {
        let admitted = update(host, at.index, CAS_ATTEMPTS, |stored| admit(stored, at, &a));
        let contended =
            matches!(&admitted, Ok(a) if a.step == ModeStep::Local(LocalVerdict::Contended));
        if !contended || probes >= SLOT_PROBES {
            return (at, admitted);
        }
        probes += 1;
        at = at.next(c.config.local.slots);
    }
}

/// What the admission on the tenant's slot (`slots.at`) does: counted,
/// tracked, a refill queued, and the outcome for the flow.
fn tenant_outcome<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    vm: &Vm,
    req: &Request<'_, '_>,
    slots: Slots,
    admitted: Result<Admission, UpdateError>,
) -> LocalOutcome {
    let (limited, at) = (req.limited, slots.own);
    let group = limited.group_id;
    let exact = |hits| LocalOutcome::Ask {
        slots,
        settle: Settle::Nothing,
        hits,
    };
    let a = match admitted {
        Ok(a) => a,
        Err(e) => {
            local_error(host, &e);
            return exact(req.cost);
        }
    };
    // Hits of a sync block a mode change dropped: the call carries them.
    let carried = match a.switched {
        Some(stranded) => mode_changed(host, stranded),
        None => 0,
    };
    if a.lease_stranded > 0 {
        host.add_group(
            group,
            GroupCounter::LeaseStranded,
            u64::from(a.lease_stranded),
        );
    }
    match a.step {
        ModeStep::Local(verdict) => match refusal(c, host, &limited.group.limits, Ok(verdict)) {
            Some(refused) => refused,
            None => exact(req.cost.saturating_add(carried)),
        },
        ModeStep::LeaseToken { refill, left } => {
            if let Some(batch) = refill {
                let call = tenant_call(CallKind::Refill, limited, at, batch);
                if !vm.mailbox.queue(call) {
                    log::debug!("lease refill dropped: the root's mailbox is full");
                }
            }
            admitted_locally(c, host, vm, req, slots, GroupCounter::LeaseSpent, left)
        }
        ModeStep::LeaseAsk { batch } => {
            track(vm, limited, at, req.now_ms);
            LocalOutcome::Ask {
                slots,
                settle: Settle::Lease { slot: at, batch },
                hits: batch.saturating_add(carried),
            }
        }
        ModeStep::SyncAdmit(left) => {
            admitted_locally(c, host, vm, req, slots, GroupCounter::SyncLocal, left)
        }
        // Counted by the flow, as a refusal (or, in shadow, a would-be
        // refusal) from the source `sync`.
        ModeStep::SyncRefuse { retry_after_s } => LocalOutcome::Refused {
            source: DecidedBy::Sync,
            headers: refusal_headers(retry_after_s),
        },
        ModeStep::SyncAsk => LocalOutcome::Ask {
            slots,
            settle: Settle::Sync { slot: at },
            hits: req.cost.saturating_add(carried),
        },
    }
}

/// An admission from local state (`counter`: the mode's), with the
/// headers of what it leaves: the root tracks the tenant from now on.
fn admitted_locally<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    vm: &Vm,
    req: &Request<'_, '_>,
    slots: Slots,
    counter: GroupCounter,
    left: RemainingEstimate,
) -> LocalOutcome {
    let limited = req.limited;
    track(vm, limited, slots.own, req.now_ms);
    host.count_group(limited.group_id, GroupCounter::Admitted);
    host.count_group(limited.group_id, counter);
    let headers = left.headers(c.config.headers, &limited.group.limits, req.now_ms);
    LocalOutcome::Admitted { slots, headers }
}

/// The local layer's verdict on a slot (the tenant's, or its state on the
/// route, whose limits are `limits`): a refusal, or None (the request goes
/// on; a contended slot or a failed layer counted). In shadow, a local
/// would-be refusal is let through without a call, as the refusal would
/// have gone out without one: one would-be refusal per request.
fn refusal<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    limits: &ratelimit_config::UnitLimits,
    verdict: Result<LocalVerdict, UpdateError>,
) -> Option<LocalOutcome> {
    let (source, headers) = match verdict {
        Ok(LocalVerdict::Proceed) => return None,
        Ok(LocalVerdict::Contended) => {
            host.count(Counter::SlotContended);
            return None;
        }
        Err(e) => {
            local_error(host, &e);
            return None;
        }
        Ok(LocalVerdict::BucketEmpty(mut headers)) => {
            headers.extend(group_policy(c.config.headers, limits));
            (DecidedBy::Bucket, headers)
        }
        Ok(LocalVerdict::CachedOverLimit(headers)) => (DecidedBy::Cache, headers),
    };
    Some(LocalOutcome::Refused { source, headers })
}

fn tenant_call(kind: CallKind, limited: &Limited<'_>, at: SlotRef, hits: u32) -> TenantCall {
    TenantCall {
        kind,
        group: limited.group_id,
        tenant: limited.tenant.to_string(),
        slot: at,
        hits,
        route: None,
    }
}

/// The local layer on the tenant's state on its request's route (its own
/// slot, `route_at`): the route's over-limit cache, and its bucket when the
/// route limits `persecond`. No mode: a request on such a route asks the
/// service (`admit`).
fn route_verdict<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    req: &Request<'_, '_>,
    route: &ratelimit_config::model::Route,
    route_at: SlotRef,
    names: &dyn Fn(u8) -> Option<String>,
) -> Result<LocalVerdict, UpdateError> {
    let bucket = route.limits.get(Unit::Second).map(|n| BucketParams {
        tokens_per_second: n,
        burst: n,
    });
    let headers = c.config.headers;
    let (now, cost) = (req.now_ms, req.cost);
    update(host, route_at.index, CAS_ATTEMPTS, |stored| {
        local::admit_named(stored, route_at, now, bucket, headers, names, cost)
    })
}

/// A failure of the local layer skips it (the service still decides).
pub fn local_error<H: Host + ?Sized>(host: &H, e: &UpdateError) {
    match e {
        UpdateError::CasRetriesExhausted => host.count(Counter::CasRetriesExhausted),
        UpdateError::Host(why) => {
            host.count(Counter::LocalError);
            // `debug!` formats nothing unless debug is on (a static check).
            log::debug!("local layer error: {why}");
        }
    }
}

/// The tenant's slot held another mode's block: counts what it held, and
/// returns the sync hits the request's call must carry.
fn mode_changed<H: Host + ?Sized>(host: &H, stranded: Stranded) -> u32 {
    if stranded.lease_tokens > 0 {
        let tokens = u64::from(stranded.lease_tokens);
        host.add(Counter::ModeChangeLeaseTokens, tokens);
    }
    if stranded.sync_hits > 0 {
        host.add(Counter::ModeChangeSyncHits, u64::from(stranded.sync_hits));
    }
    stranded.sync_hits
}

/// The root pushes the tenant's sync hits, or refills its lease after each
/// window, from now on.
#[inline(never)]
fn track(vm: &Vm, limited: &Limited<'_>, at: SlotRef, now_ms: u64) {
    if !vm
        .mailbox
        .track_at(limited.group_id, &limited.tenant, at, now_ms)
    {
        log::debug!("tenant not tracked: the root tracks the most it may");
    }
}

#[cfg(test)]
mod tests;
