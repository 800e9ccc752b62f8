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
//! and its call carries a sync block's unpushed hits (`LocalStep::carried`),
//! so the service counts every hit admitted before it decides on this one.

use ratelimit_config::{BucketParams, HeaderMode, Mode, Unit};

use crate::answer::{Answer, RlsError};
use crate::batch::{CallKind, Delivery, Done, Owner, Part, Settle, TenantCall};
use crate::counters::{Counter, GroupCounter};
use crate::decision::{own_statuses, Compiled, Limited};
use crate::fallback;
use crate::headers::limit_headers;
use crate::host::Host;
use crate::lease::{self, LeaseParams, Outcome, Spend};
use crate::local::names::intern;
use crate::local::over_limit::MAX_STATUSES;
use crate::local::{self, remember_refusal, update, Claim, LocalVerdict, ModeState, Slot};
use crate::local::{SlotRef, Stranded, UpdateError, CAS_ATTEMPTS};
use crate::proto::{Code, DescriptorStatus, Duration, RateLimit, RateLimitUnit};
use crate::sync::{self, refusal_headers, SyncParams, SyncStep};
use crate::vm::{Tracked, Vm};

/// The local layer's step for one request.
#[derive(Debug, PartialEq, Eq)]
pub struct LocalStep {
    pub verdict: LocalVerdict,
    pub mode: ModeStep,
    /// Hits of a sync block dropped by a mode change, that no push took:
    /// the request's call to the service adds them to its own.
    pub carried: u32,
}

/// What the mode adds to the local layer's verdict.
#[derive(Debug, PartialEq, Eq)]
pub enum ModeStep {
    /// Exact mode, or the local layer refused or had no slot: as the
    /// verdict says.
    Exact,
    /// Admitted without a call (a lease's token, or a local admission in
    /// sync mode), with the rate-limit headers of its estimate (`Left`).
    Admitted(Vec<(&'static str, String)>),
    /// Refused without a call (sync: the view is at the limit).
    Refused(Vec<(&'static str, String)>),
    /// Call the service: `lease_batch` hits for a lease (None: one hit); in
    /// sync mode the answer refreshes the view (`sync`).
    Ask {
        lease_batch: Option<u32>,
        sync: bool,
    },
}

/// A group's mode, with its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeParams {
    Exact,
    Lease(LeaseParams),
    Sync(SyncParams),
}

impl ModeParams {
    pub fn of(c: &Compiled, group: &ratelimit_config::Group) -> ModeParams {
        if let Some(p) = LeaseParams::for_group(&c.config, group) {
            ModeParams::Lease(p)
        } else if let Some(p) = SyncParams::for_group(&c.config, group) {
            ModeParams::Sync(p)
        } else {
            ModeParams::Exact
        }
    }

    fn mode(&self) -> Mode {
        match self {
            ModeParams::Exact => Mode::Exact,
            ModeParams::Lease(_) => Mode::Lease,
            ModeParams::Sync(_) => Mode::Sync,
        }
    }
}

/// What the mode decided for a request the local layer let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    Lease(Spend),
    Sync(SyncStep),
}

/// The local layer and the mode's decision on one request, from the
/// stored slot.
#[derive(Debug, PartialEq, Eq)]
pub struct Admission {
    pub verdict: LocalVerdict,
    /// None: exact mode, a request that costs more than 1, or a refusal.
    pub decided: Option<Decided>,
    /// The block of another mode the slot held, dropped.
    pub switched: Option<Stranded>,
    /// Lease tokens whose window ended unspent.
    pub lease_stranded: u32,
    /// An admission without a call: what it leaves, for its headers.
    pub left: Option<Left>,
}

impl Admission {
    fn just(verdict: LocalVerdict) -> Admission {
        Admission {
            verdict,
            decided: None,
            switched: None,
            lease_stranded: 0,
            left: None,
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

/// The local layer, then the mode, for a request at `now_ms` that costs
/// `cost` hits, on the stored slot; returns the slot to write, if any.
/// `names` reads the rule names of a cached refusal (every mode answers
/// cached refusals alike). A request that costs more than 1, or that is on
/// a route with limits of its own (`on_route`), asks the service itself in
/// every mode, as in exact mode (leases and sync views count single hits of
/// the group's descriptors only), and leaves the mode's block as it is.
#[allow(clippy::too_many_arguments)]
pub fn admit(
    stored: Option<&[u8]>,
    at: SlotRef,
    now_ms: u64,
    bucket: Option<BucketParams>,
    headers: HeaderMode,
    names: &dyn Fn(u8) -> Option<String>,
    cost: u32,
    params: ModeParams,
    on_route: bool,
    limits: &ratelimit_config::UnitLimits,
) -> (Admission, Option<Slot>) {
    let Some(mut slot) = Slot::claim(stored, at.fingerprint, now_ms, Claim::Request) else {
        return (Admission::just(LocalVerdict::Contended), None);
    };
    let changed = match local::decide(&mut slot, now_ms, bucket, headers, names, cost) {
        Ok(changed) => changed,
        Err(refusal) => return (Admission::just(refusal), None),
    };
    let switched = slot.switch_mode(params.mode());
    let mut a = Admission {
        switched,
        ..Admission::just(LocalVerdict::Proceed)
    };
    let single = cost <= 1 && !on_route;
    let write = match params {
        ModeParams::Lease(p) if single => {
            let held = match slot.mode {
                ModeState::Lease(l) => Some(l),
                _ => None,
            };
            let (l, spend, stranded) = lease::spend(held, &p, now_ms);
            slot.mode = ModeState::Lease(l);
            if let Spend::Token { .. } = spend {
                a.left = Some(Left::lease(&l, limits, now_ms));
            }
            a.decided = Some(Decided::Lease(spend));
            a.lease_stranded = stranded;
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
            if step == SyncStep::Admit {
                a.left = Some(Left::sync(&state, &p));
            }
            a.decided = Some(Decided::Sync(step));
            // A refusal writes only what changed in the view (a rolled
            // window) or a dropped block, so a flood of refusals costs no
            // writes.
            switched.is_some() || slot.mode != before || !matches!(step, SyncStep::Refuse { .. })
        }
        _ => changed || switched.is_some(),
    };
    (a, write.then_some(slot))
}

/// The local layer and the mode for a request of `limited` at `now` that
/// costs `cost` hits (`cost_header`); `names` reads the rule names of a
/// cached refusal. Queues what the root must send (a lease refill) and the
/// sync tenants it must push in `vm`'s mailbox.
#[allow(clippy::too_many_arguments)]
pub fn local_step<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    vm: &Vm,
    limited: &Limited<'_>,
    at: SlotRef,
    now: u64,
    names: &dyn Fn(u8) -> Option<String>,
    cost: u32,
) -> Result<LocalStep, UpdateError> {
    let group = limited.group_index;
    let bucket = c.config.local.bucket_for(limited.group);
    let params = ModeParams::of(c, limited.group);
    let headers = c.config.headers;
    let on_route = limited.route.is_some();
    let a = update(host, at.index, CAS_ATTEMPTS, |stored| {
        admit(
            stored,
            at,
            now,
            bucket,
            headers,
            names,
            cost,
            params,
            on_route,
            &limited.group.limits,
        )
    })?;
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
    let step = match a.decided {
        None => ModeStep::Exact,
        Some(Decided::Lease(Spend::Token { refill })) => {
            if let Some(batch) = refill {
                let call = tenant_call(CallKind::Refill, limited, at, batch);
                if !vm.mailbox.queue(call) {
                    log::debug!("lease refill dropped: the root's mailbox is full");
                }
            }
            track(vm, limited, at);
            host.count_group(group, GroupCounter::Admitted);
            host.count_group(group, GroupCounter::LeaseSpent);
            ModeStep::Admitted(left_headers(c, limited, a.left, now))
        }
        Some(Decided::Lease(Spend::Ask { batch })) => {
            track(vm, limited, at);
            ModeStep::Ask {
                lease_batch: Some(batch),
                sync: false,
            }
        }
        Some(Decided::Sync(SyncStep::Admit)) => {
            track(vm, limited, at);
            host.count_group(group, GroupCounter::Admitted);
            host.count_group(group, GroupCounter::SyncLocal);
            ModeStep::Admitted(left_headers(c, limited, a.left, now))
        }
        // Counted by the flow, as a refusal (or, in shadow, a would-be
        // refusal) from the source `sync`.
        Some(Decided::Sync(SyncStep::Refuse { retry_after_s })) => {
            ModeStep::Refused(refusal_headers(retry_after_s))
        }
        Some(Decided::Sync(SyncStep::Ask)) => ModeStep::Ask {
            lease_batch: None,
            sync: true,
        },
    };
    Ok(LocalStep {
        verdict: a.verdict,
        mode: step,
        carried,
    })
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
#[allow(clippy::too_many_arguments)]
pub fn route_step<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    route: &ratelimit_config::model::Route,
    route_at: SlotRef,
    now: u64,
    names: &dyn Fn(u8) -> Option<String>,
    cost: u32,
) -> Result<LocalVerdict, UpdateError> {
    let bucket = route.limits.get(Unit::Second).map(|n| BucketParams {
        tokens_per_second: n,
        burst: n,
    });
    let headers = c.config.headers;
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
    let g = c.config.limits.all_groups().nth(group)?;
    LeaseParams::for_group(&c.config, g)
}

fn sync_params(c: &Compiled, group: usize) -> Option<SyncParams> {
    let g = c.config.limits.all_groups().nth(group)?;
    SyncParams::for_group(&c.config, g)
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

/// The headers of an admission without a call, from its estimate.
fn left_headers(
    c: &Compiled,
    limited: &Limited<'_>,
    left: Option<Left>,
    now_ms: u64,
) -> Vec<(&'static str, String)> {
    left.map(|l| l.headers(c.config.headers, &limited.group.limits, now_ms))
        .unwrap_or_default()
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
    let Some(group) = c.config.limits.all_groups().nth(part.group) else {
        return;
    };
    let in_window = LeaseParams::for_group(&c.config, group)
        .is_some_and(|p| host.now_ms() < p.window_end(part.asked_at_ms));
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
