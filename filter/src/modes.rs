//! The local layer's step for one request, by the group's mode (exact:
//! the bucket and the over-limit cache, then a call; `lease`; `sync`), and
//! what an answer to a mode's call leaves in the tenant's slot. One
//! read-modify-write of the slot per request in every mode; the mode's
//! counters are counted here, so `flow` only acts on the outcome and `root`
//! only sends and receives.
//!
//! A slot outlives configurations: when a new one changes a group's mode,
//! the tenant's next request that the local layer lets through finds the
//! old mode's block and drops it (`Slot::switch_mode`), counting what it
//! held (`mode_change_lease_tokens`, `mode_change_sync_hits`). That request
//! always calls the service (exact mode does; a fresh lease has no token),
//! and its call carries a sync block's unpushed hits (`LocalOutcome::Ask`),
//! so the service counts every hit admitted before it decides on this one.

use ratelimit_config::{BucketParams, HeaderMode, Unit};

use crate::access_log::Source;
use crate::answer::{Answer, RlsError};
use crate::batch::{CallKind, Delivery, Done, Owner, Part, Settle, TenantCall};
use crate::counters::{Counter, GroupCounter};
use crate::decision::{own_statuses, Compiled, Limited, ModeParams};
use crate::fallback;
use crate::headers::{group_policy, limit_headers};
use crate::host::Host;
use crate::lease::{self, LeaseParams, Outcome, Spend};
use crate::local::names::{intern, lookup};
use crate::local::over_limit::MAX_STATUSES;
use crate::local::SLOT_PROBES;
use crate::local::{self, remember_refusal, update, Claim, LocalVerdict, ModeState, Slot};
use crate::local::{route_slot_for, slot_for, SlotRef, Stranded, UpdateError, CAS_ATTEMPTS};
use crate::proto::{Code, DescriptorStatus, Duration, RateLimit, RateLimitUnit};
use crate::sync::{self, refusal_headers, SyncParams, SyncStep};
use crate::vm::{Tracked, Vm};

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
        source: Source,
        headers: Vec<(&'static str, String)>,
    },
    /// Admitted from local state without a call (a lease's token, or a
    /// sync view), with the rate-limit headers of its estimate (`Left`).
    Admitted {
        slots: Slots,
        headers: Vec<(&'static str, String)>,
    },
    /// Ask the service for `hits` hits (a lease's batch, or the request's
    /// cost, plus the hits of a sync block a mode change dropped, that no
    /// push took); `settle` is what its answer leaves in the tenant's slot.
    /// A slot another tenant holds, or a local layer that failed, asks as
    /// exact mode does (`Settle::Exact`).
    Ask {
        slots: Slots,
        settle: Settle,
        hits: u32,
    },
}

/// The tenant's slots a request used: its own (after probing past those
/// other tenants hold), and its state on its route's, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    pub at: SlotRef,
    pub route_at: Option<SlotRef>,
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
    LeaseToken { refill: Option<u32>, left: Left },
    /// No token: the request asks for a batch of `batch` hits.
    LeaseAsk { batch: u32 },
    /// Sync: admitted from the view, with what it leaves.
    SyncAdmit(Left),
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
pub struct Left {
    pub remaining: [u32; sync::UNITS],
    /// When each unit's window ends.
    pub until_ms: [u64; sync::UNITS],
    pub units: usize,
}

impl Left {
    /// A lease's: the smallest `limit_remaining` of its last answer plus
    /// its tokens unspent (the service counted them with that answer), in
    /// every unit, at most the unit's limit.
    fn lease(l: &lease::Lease, limits: &ratelimit_config::UnitLimits, now_ms: u64) -> Left {
        let mut left = Left::default();
        let estimate = l.remaining.saturating_add(l.tokens);
        let slots = left.remaining.iter_mut().zip(left.until_ms.iter_mut());
        for ((unit, limit), (remaining, until)) in limits.iter().zip(slots) {
            *remaining = estimate.min(limit);
            *until = crate::window::end(unit.seconds().saturating_mul(1_000), now_ms);
            left.units += 1;
        }
        left
    }

    /// A sync view's: each unit's limit less the fleet's last reported
    /// count and this Envoy's hits the service has not counted yet.
    fn sync(s: &sync::SyncState, p: &SyncParams) -> Left {
        let mut left = Left::default();
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
                    unit: rls_unit(unit) as i32,
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

fn rls_unit(unit: Unit) -> RateLimitUnit {
    match unit {
        Unit::Second => RateLimitUnit::Second,
        Unit::Minute => RateLimitUnit::Minute,
        Unit::Hour => RateLimitUnit::Hour,
        Unit::Day => RateLimitUnit::Day,
        Unit::Week => RateLimitUnit::Week,
        Unit::Month => RateLimitUnit::Month,
        Unit::Year => RateLimitUnit::Year,
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
                    left: Left::lease(&l, a.limits, now_ms),
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
                SyncStep::Admit => ModeStep::SyncAdmit(Left::sync(&state, &p)),
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
    let scope = c.scope(limited.group_index);
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
        at,
        route_at: on_route.map(|(_, at)| at),
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
        params: c.mode_params(limited.group_index),
        on_route: limited.route.is_some(),
        limits: &limited.group.limits,
    };
    let mut at = first;
    let mut admitted = update(host, at.index, CAS_ATTEMPTS, |stored| admit(stored, at, &a));
    for _ in 1..SLOT_PROBES {
        if !matches!(&admitted, Ok(a) if a.step == ModeStep::Local(LocalVerdict::Contended)) {
            break;
        }
        at = at.next(c.config.local.slots);
        admitted = update(host, at.index, CAS_ATTEMPTS, |stored| admit(stored, at, &a));
    }
    (at, admitted)
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
    let (limited, at) = (req.limited, slots.at);
    let group = limited.group_index;
    let exact = |hits| LocalOutcome::Ask {
        slots,
        settle: Settle::Exact,
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
    let admitted_locally = |counter, left: Left| {
        track(vm, limited, at);
        host.count_group(group, GroupCounter::Admitted);
        host.count_group(group, counter);
        let headers = left.headers(c.config.headers, &limited.group.limits, req.now_ms);
        LocalOutcome::Admitted { slots, headers }
    };
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
            admitted_locally(GroupCounter::LeaseSpent, left)
        }
        ModeStep::LeaseAsk { batch } => {
            track(vm, limited, at);
            LocalOutcome::Ask {
                slots,
                settle: Settle::Lease { at, batch },
                hits: batch.saturating_add(carried),
            }
        }
        ModeStep::SyncAdmit(left) => admitted_locally(GroupCounter::SyncLocal, left),
        // Counted by the flow, as a refusal (or, in shadow, a would-be
        // refusal) from the source `sync`.
        ModeStep::SyncRefuse { retry_after_s } => LocalOutcome::Refused {
            source: Source::Sync,
            headers: refusal_headers(retry_after_s),
        },
        ModeStep::SyncAsk => LocalOutcome::Ask {
            slots,
            settle: Settle::Sync { at },
            hits: req.cost.saturating_add(carried),
        },
    }
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
            (Source::Bucket, headers)
        }
        Ok(LocalVerdict::CachedOverLimit(headers)) => (Source::Cache, headers),
    };
    Some(LocalOutcome::Refused { source, headers })
}

fn tenant_call(kind: CallKind, limited: &Limited<'_>, at: SlotRef, hits: u32) -> TenantCall {
    TenantCall {
        kind,
        group: limited.group_index,
        tenant: limited.tenant.to_string(),
        at,
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

/// The ids of the statuses' rule names in the shared name table (0: none);
/// no host call for a status whose rule has no name.
fn rule_names<H: Host + ?Sized>(host: &H, statuses: &[DescriptorStatus]) -> [u8; MAX_STATUSES] {
    let mut ids = [0u8; MAX_STATUSES];
    for (id, s) in ids.iter_mut().zip(statuses) {
        if let Some(limit) = s.current_limit.as_ref().filter(|l| !l.name.is_empty()) {
            *id = intern(host, &limit.name);
        }
    }
    ids
}

/// Remembers a refusal of the service in the over-limit cache of the slot
/// at `at` (a tenant's, or its state on a route), for a call sent at
/// `asked_at_ms`: `statuses` are that slot's part of the answer. Nothing
/// is written when none of them is over its limit, or for no slot
/// (fingerprint 0: the local layer was off).
pub fn remember<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    at: SlotRef,
    asked_at_ms: u64,
    statuses: &[DescriptorStatus],
) {
    if at.fingerprint == 0 || !statuses.iter().any(|s| s.code() == Code::OverLimit) {
        return;
    }
    let answered_at = host.now_ms();
    // Only X-RateLimit-Limit repeats rule names.
    let names = if c.config.headers == HeaderMode::DraftVersion03 {
        rule_names(host, statuses)
    } else {
        [0; MAX_STATUSES]
    };
    let remembered = update(host, at.index, CAS_ATTEMPTS, |stored| {
        let slot = remember_refusal(stored, at, asked_at_ms, answered_at, statuses, &names);
        ((), slot)
    });
    if let Err(e) = remembered {
        local_error(host, &e);
    }
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

/// What the answer to a response's charge (None: it failed, or was never
/// sent) leaves: counted in the group; when the service says the tenant is
/// now over a limit, remembered in the over-limit cache of its slot and of
/// its state on the route, so that its next requests are refused without
/// a call.
pub fn settle_charge<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    call: &TenantCall,
    asked_at_ms: u64,
    heard: Option<&Answer>,
) {
    let group = call.group;
    let Some(answer) = heard else {
        host.count_group(group, GroupCounter::ResponseCostFailed);
        return;
    };
    host.count_group(group, GroupCounter::ResponseCostCharges);
    host.add_group(group, GroupCounter::ResponseCostHits, u64::from(call.hits));
    if !answer.over_limit {
        return;
    }
    let statuses = &answer.response.statuses;
    let (own, on_route) = statuses.split_at(own_statuses(c, group).min(statuses.len()));
    remember(c, host, call.at, asked_at_ms, own);
    if let Some(r) = &call.route {
        remember(c, host, r.at, asked_at_ms, on_route);
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

fn lease_params(c: &Compiled, group: usize) -> Option<LeaseParams> {
    c.mode_params(group).lease()
}

fn sync_params(c: &Compiled, group: usize) -> Option<SyncParams> {
    c.mode_params(group).sync()
}

/// Stores the outcome of a call for `batch` tokens of the tenant at `at`
/// (of group `group`), asked at `asked_at_ms`, of which `tokens` become the
/// lease's (the batch, less the asking request's own hit); counted in the
/// group. Nothing is stored once the group is no longer in lease mode.
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
    let Some(p) = lease_params(c, group) else {
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
    let granted = match outcome {
        Outcome::Granted { .. } => tokens,
        _ => 0,
    };
    let stored = update(host, at.index, CAS_ATTEMPTS, |stored| {
        match Slot::claim(stored, at.fingerprint, now, Claim::Request) {
            Some(mut slot) => {
                let held = match slot.mode {
                    ModeState::Lease(l) => Some(l),
                    ModeState::None => None,
                    // A block of another mode: the tenant's next request
                    // drops it; the granted tokens are lost to us.
                    ModeState::Sync(_) => return (granted, None),
                };
                let (l, stranded) = lease::settle(held, &p, asked_at_ms, now, tokens, outcome);
                slot.mode = ModeState::Lease(l);
                (stranded, Some(slot))
            }
            // Another tenant holds the slot: granted tokens are lost to us.
            None => (granted, None),
        }
    });
    let stranded = match stored {
        Ok(stranded) => stranded,
        Err(e) => {
            log::debug!("lease outcome not stored: {e}");
            granted
        }
    };
    if stranded > 0 {
        host.add_group(group, GroupCounter::LeaseStranded, u64::from(stranded));
    }
}

/// Counts a push of `hits` sync hits the service answered (`heard`; None:
/// it failed).
fn count_push<H: Host + ?Sized>(host: &H, group: usize, hits: u32, heard: Option<&Answer>) {
    match heard {
        None => host.count_group(group, GroupCounter::SyncFailed),
        Some(answer) => {
            host.count_group(group, GroupCounter::Syncs);
            host.add_group(group, GroupCounter::SyncHits, u64::from(hits));
            if answer.any_over_limit() {
                host.add_group(group, GroupCounter::SyncOverLimitHits, u64::from(hits));
            }
        }
    }
}

/// Stores what the service said to a call asked at `asked_at_ms` that
/// carried `delta` pending hits of the tenant at `at` (a push's, `pushed`,
/// or 1 for a request that asked itself); a push is counted in the group.
/// `heard` None: the call failed.
#[allow(clippy::too_many_arguments)]
pub fn store_heard<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    group: usize,
    at: SlotRef,
    asked_at_ms: u64,
    delta: u32,
    pushed: bool,
    heard: Option<&Answer>,
) {
    let Some(p) = sync_params(c, group) else {
        return;
    };
    if pushed {
        count_push(host, group, delta, heard);
    }
    let now = host.now_ms();
    let stored = update(host, at.index, CAS_ATTEMPTS, |stored| {
        let Some(mut slot) = Slot::decode_for(stored, at.fingerprint) else {
            return ((), None);
        };
        let held = match slot.mode {
            ModeState::Sync(s) => Some(s),
            ModeState::None => None,
            // The tenant's next request drops it.
            ModeState::Lease(_) => return ((), None),
        };
        let s = sync::settle(held, &p, asked_at_ms, now, delta, pushed, heard);
        slot.mode = ModeState::Sync(s);
        ((), Some(slot))
    });
    if let Err(e) = stored {
        log::debug!("sync answer not stored: {e}");
    }
}

/// The root pushes the tenant's sync hits, or refills its lease after each
/// window, from now on.
#[inline(never)]
fn track(vm: &Vm, limited: &Limited<'_>, at: SlotRef) {
    if !vm.mailbox.track(limited.group_index, &limited.tenant, at) {
        log::debug!("tenant not tracked: the root tracks the most it may");
    }
}

/// The call a tracked tenant's root pass owes it at `now_ms`, taken out
/// of its slot: when `sync_due` and its group syncs, a push of its unsynced
/// hits (`sync::take_delta`); when `lease_due` and its group leases, the
/// refill of its lease after a window ended (`lease::window_refill`),
/// marked under way. None when nothing is owed, or another worker has it
/// under way. The second value says whether the tenant has nothing left
/// pending (the root forgets it until its next request).
pub fn next_tracked<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    t: &Tracked,
    now_ms: u64,
    sync_due: bool,
    lease_due: bool,
) -> (Option<TenantCall>, bool) {
    let (sync, lease) = (sync_params(c, t.group), lease_params(c, t.group));
    if sync.is_none() && lease.is_none() {
        // The group left both modes: nothing will be owed again.
        return (None, true);
    }
    let sync = sync.filter(|_| sync_due);
    let lease = lease.filter(|_| lease_due);
    if sync.is_none() && lease.is_none() {
        return (None, false);
    }
    let at = t.at;
    let taken = update(host, at.index, CAS_ATTEMPTS, |stored| {
        let none = ((CallKind::Push, 0, 0, true), None);
        let Some(mut slot) = Slot::decode_for(stored, at.fingerprint) else {
            return none;
        };
        match (slot.mode, sync, lease) {
            (ModeState::Sync(held), Some(p), _) => {
                let (state, delta) = sync::take_delta(Some(held), &p, now_ms);
                slot.mode = ModeState::Sync(state);
                let owed = (CallKind::Push, delta, 0, state.pending() == 0);
                (owed, (delta > 0).then_some(slot))
            }
            (ModeState::Lease(held), _, Some(p)) => {
                let (l, batch, stranded, idle) = lease::window_refill(held, &p, now_ms);
                slot.mode = ModeState::Lease(l);
                let owed = (CallKind::Refill, batch.unwrap_or(0), stranded, idle);
                (owed, batch.map(|_| slot))
            }
            _ => none,
        }
    });
    // Not taken (the slot could not be read or written): the tenant's
    // requests ask for themselves, as without the root.
    let Ok((kind, hits, stranded, idle)) = taken else {
        return (None, false);
    };
    if stranded > 0 {
        host.add_group(t.group, GroupCounter::LeaseStranded, u64::from(stranded));
    }
    let call = (hits > 0).then(|| TenantCall {
        kind,
        group: t.group,
        tenant: t.tenant.clone(),
        at,
        hits,
        route: None,
    });
    (call, idle)
}

/// What the finished parts of calls leave: each part's answer stored in
/// its tenant's slot (`settle`), and each request's answer handed to its
/// stream (`vm.batch`'s outbox, which the glue delivers), except the
/// answer of `own`, the stream calling, which is returned.
pub fn finish<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    vm: &Vm,
    done: Vec<Done>,
    own: Option<u32>,
) -> Option<Result<Answer, RlsError>> {
    let mut mine = None;
    for Done { part, mut heard } in done {
        settle(c, host, &part, heard.as_ref().ok());
        if let Ok(answer) = &mut heard {
            with_lease_tokens(c, host, &part, answer);
        }
        match part.stream() {
            Some(id) if Some(id) == own => mine = Some(heard),
            Some(stream) => vm.batch.deliver(Delivery { stream, heard }),
            None => {}
        }
    }
    mine
}

/// A request that asked for a lease batch and got it holds the batch's
/// other tokens: its headers count them as remaining, as those of the
/// requests that will spend them do (`Left::lease`). Not when the batch was
/// granted after its window ended (the tokens were stranded).
fn with_lease_tokens<H: Host + ?Sized>(c: &Compiled, host: &H, part: &Part, answer: &mut Answer) {
    let Owner::Stream {
        settle: Settle::Lease { batch, .. },
        ..
    } = part.owner
    else {
        return;
    };
    if answer.over_limit || batch <= 1 {
        return;
    }
    let in_window =
        lease_params(c, part.group).is_some_and(|p| host.now_ms() < p.window_end(part.asked_at_ms));
    if !in_window {
        return;
    }
    for s in &mut answer.response.statuses {
        let limit = s
            .current_limit
            .as_ref()
            .map_or(u32::MAX, |l| l.requests_per_unit);
        s.limit_remaining = s.limit_remaining.saturating_add(batch - 1).min(limit);
    }
}

/// What the answer to a part (`heard`; None: the call failed) leaves in
/// its tenant's slot and its group's counters: a lease's batch, a sync
/// view, a push's hits.
pub fn settle<H: Host + ?Sized>(c: &Compiled, host: &H, part: &Part, heard: Option<&Answer>) {
    let (group, asked) = (part.group, part.asked_at_ms);
    // A root call's answer teaches the fallback (a request's, its stream).
    if let (Owner::Tenant { at, .. }, Some(answer)) = (&part.owner, heard) {
        fallback::on_answer(c, host, group, *at, part.hits, answer);
    }
    match part.owner {
        Owner::Tenant {
            kind: CallKind::Refill,
            at,
            ..
        } => {
            let outcome = Outcome::of(heard);
            store_outcome(c, host, group, at, asked, part.hits, part.hits, outcome);
        }
        Owner::Tenant {
            kind: CallKind::Push,
            at,
            ..
        } => store_heard(c, host, group, at, asked, part.hits, true, heard),
        Owner::Tenant {
            kind: CallKind::Charge,
            ..
        } => {
            if let Some(call) = part.call() {
                settle_charge(c, host, &call, asked, heard);
            }
        }
        Owner::Stream { settle, .. } => match settle {
            Settle::Exact => {}
            // The request asked for a batch: the first hit is its own.
            Settle::Lease { at, batch } => {
                let tokens = batch.saturating_sub(1);
                store_outcome(c, host, group, at, asked, batch, tokens, Outcome::of(heard));
            }
            Settle::Sync { at } => store_heard(c, host, group, at, asked, 1, false, heard),
        },
    }
}

/// Parts dropped before they were sent (their stream ended): a sync
/// request's pending hit is released, as for a request whose call failed
/// (it was never admitted). A lease's ask is taken as lost after
/// `refill_lost_ms`, as any unanswered one.
pub fn release<H: Host + ?Sized>(c: &Compiled, host: &H, dropped: Vec<Part>) {
    for part in dropped {
        if let Owner::Stream {
            settle: Settle::Sync { at },
            ..
        } = part.owner
        {
            store_heard(c, host, part.group, at, part.asked_at_ms, 1, false, None);
        }
    }
}

#[cfg(test)]
mod tests;
