//! The answer's path, beside the batcher (`batch`) that sends the calls:
//! what each finished part of a call (`batch::Done`) leaves behind, and
//! where the answer goes.
//!
//! 1. `finish` takes the parts a call (or a failure to send it) finished.
//! 2. `store_part_answer` stores what each part's answer leaves in its
//!    tenant's slot and its group's counters: a lease's batch
//!    (`store_lease_answer`, over the pure `lease::after_answer`), a sync
//!    view or a push's hits (`store_sync_answer`, over `sync::after_answer`),
//!    a response's charge (`store_charge_answer`); what the fallback
//!    learns, and for a request still waiting a refusal remembered in the
//!    over-limit cache of the tenant's slot and of its state on the route
//!    (`store_learned`, over `remember`). `flow` only turns the
//!    verdict into a reply.
//! 3. A request's answer is handed to its stream: the stream calling gets
//!    it back from `finish`; any other goes to the batcher's outbox
//!    (`batch::Batcher::deliver`), which the glue empties acting for each
//!    stream (`glue::deliver`), into `flow::Stream::on_answer`, where the
//!    verdict is read (`decision::verdict_of`) and acted on.
//! 4. Parts dropped before they were sent (their stream ended) are
//!    released (`release`).

use ratelimit_config::HeaderMode;

use crate::answer::{Answer, RlsError};
use crate::batch::{CallKind, Delivery, Done, Owner, Part, Settle, TenantCall};
use crate::compiled::Compiled;
use crate::counters::GroupCounter;
use crate::fallback;
use crate::group::GroupId;
use crate::host::Host;
use crate::lease::{self, smaller_may_fit, BatchOutcome};
use crate::local::names::intern;
use crate::local::over_limit::MAX_STATUSES;
use crate::local::{remember_refusal, update, Claim, ModeState, Slot, SlotRef, CAS_ATTEMPTS};
use crate::modes::local_error;
use crate::proto::{Code, DescriptorStatus};
use crate::sync;
use crate::vm::Vm;

/// Who a call asked about: the tenant's slot (`slot`) in its group, when
/// the call was asked, and the time its answer is stored (`now_ms`, the
/// clock read once in the callback that stores it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    pub group: GroupId,
    pub slot: SlotRef,
    pub asked_at_ms: u64,
    pub now_ms: u64,
}

/// A lease's batch: the hits the call asked for, and the tokens of them
/// that become the lease's when granted (a request that asked keeps the
/// first hit for itself; a refill's are all the lease's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseBatch {
    pub asked: u32,
    pub tokens: u32,
}

/// The sync hits a call carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncHits {
    /// A push of this many pending hits (counted in the group).
    Pushed(u32),
    /// The one hit of a request that asked the service itself.
    OwnHit,
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
fn remember<H: Host + ?Sized>(
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

/// What the answer to a response's charge (None: it failed, or was never
/// sent) leaves: counted in the group; when the service says the tenant is
/// now over a limit, remembered in the over-limit cache of its slot and of
/// its state on the route, so that its next requests are refused without
/// a call.
pub fn store_charge_answer<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    call: &TenantCall,
    asked_at_ms: u64,
    answer: Option<&Answer>,
) {
    let group = call.group;
    let Some(answer) = answer else {
        host.count_group(group, GroupCounter::ResponseCostFailed);
        return;
    };
    host.count_group(group, GroupCounter::ResponseCostCharges);
    host.add_group(group, GroupCounter::ResponseCostHits, u64::from(call.hits));
    if !answer.over_limit {
        return;
    }
    let statuses = &answer.response.statuses;
    let (own, on_route) = statuses.split_at(c.descriptor_count(group, None).min(statuses.len()));
    remember(c, host, call.slot, asked_at_ms, own);
    if let Some(r) = &call.route {
        remember(c, host, r.slot, asked_at_ms, on_route);
    }
}

/// Stores the outcome of a call for a lease's batch (`batch`) of the
/// tenant `asked` names; counted in the group. Nothing is stored once the
/// group is no longer in lease mode.
pub fn store_lease_answer<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    asked: Asked,
    batch: LeaseBatch,
    outcome: BatchOutcome,
) {
    let Asked {
        group,
        slot: at,
        asked_at_ms,
        now_ms: now,
    } = asked;
    let LeaseBatch {
        asked: batch,
        tokens,
    } = batch;
    let Some(p) = c.mode_params(group).lease() else {
        return;
    };
    match outcome {
        BatchOutcome::Granted { .. } => {
            host.count_group(group, GroupCounter::LeasesTaken);
            host.add_group(group, GroupCounter::LeaseTokens, u64::from(batch));
        }
        BatchOutcome::Refused => {
            host.count_group(group, GroupCounter::LeasesRefused);
            host.add_group(group, GroupCounter::LeaseRefusedTokens, u64::from(batch));
        }
        BatchOutcome::Failed => host.count_group(group, GroupCounter::LeasesFailed),
    }
    let granted = match outcome {
        BatchOutcome::Granted { .. } => tokens,
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
                let (l, stranded) =
                    lease::after_answer(held, &p, asked_at_ms, now, tokens, outcome);
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

/// Counts a push of `hits` sync hits the service answered (`answer`; None:
/// it failed).
fn count_push<H: Host + ?Sized>(host: &H, group: GroupId, hits: u32, answer: Option<&Answer>) {
    match answer {
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

/// Stores what the service said (`answer`; None: the call failed) to a
/// call about the tenant `asked` names that carried its sync hits (`hits`);
/// a push is counted in the group. Returns whether the slot, as stored,
/// holds no pending hit of the tenant (nothing left for a push).
pub fn store_sync_answer<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    asked: Asked,
    hits: SyncHits,
    answer: Option<&Answer>,
) -> bool {
    let Asked {
        group,
        slot: at,
        asked_at_ms,
        now_ms: now,
    } = asked;
    let (delta, pushed) = match hits {
        SyncHits::Pushed(delta) => (delta, true),
        SyncHits::OwnHit => (1, false),
    };
    let Some(p) = c.mode_params(group).sync() else {
        return false;
    };
    if pushed {
        count_push(host, group, delta, answer);
    }
    let stored = update(host, at.index, CAS_ATTEMPTS, |stored| {
        let Some(mut slot) = Slot::decode_for(stored, at.fingerprint) else {
            return (false, None);
        };
        let held = match slot.mode {
            ModeState::Sync(s) => Some(s),
            ModeState::None => None,
            // The tenant's next request drops it.
            ModeState::Lease(_) => return (false, None),
        };
        let s = sync::after_answer(held, &p, asked_at_ms, now, delta, pushed, answer);
        slot.mode = ModeState::Sync(s);
        (s.pending() == 0, Some(slot))
    });
    stored.unwrap_or_else(|e| {
        log::debug!("sync answer not stored: {e}");
        false
    })
}

/// What the finished parts of calls leave: each part's answer stored in
/// its tenant's slot (`store_part_answer`), and each request's answer handed to its
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
    // The clock, read once, and only when a part is done.
    let now = if done.is_empty() { 0 } else { host.now_ms() };
    for Done { part, mut answer } in done {
        if store_part_answer(c, host, &part, answer.as_ref().ok(), now) {
            if let Owner::Root { slot: at, .. } = part.owner {
                // Nothing left to push: the root's next pass would read
                // the slot only to forget the tenant (`root::pass_tracked`).
                vm.mailbox.forget(at);
            }
        }
        if let Ok(a) = &mut answer {
            with_lease_tokens(c, &part, a, now);
            store_learned(c, host, &part, a);
        }
        match part.stream() {
            Some(id) if Some(id) == own => mine = Some(answer),
            Some(stream) => vm.batch.deliver(Delivery { stream, answer }),
            None => {}
        }
    }
    mine
}

/// A request that asked for a lease batch and got it holds the batch's
/// other tokens: its headers count them as remaining, as those of the
/// requests that will spend them do (`RemainingEstimate::lease`). Not when the batch was
/// granted after its window ended (the tokens were stranded).
fn with_lease_tokens(c: &Compiled, part: &Part, answer: &mut Answer, now_ms: u64) {
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
    let in_window = c
        .mode_params(part.group)
        .lease()
        .is_some_and(|p| now_ms < p.window_end(part.asked_at_ms));
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

/// What the answer to a part (`answer`; None: the call failed) leaves in
/// its tenant's slot and its group's counters: a lease's batch, a sync
/// view, a push's hits. Returns true for a push whose tenant has no hit
/// left pending once its answer is stored.
pub fn store_part_answer<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    part: &Part,
    answer: Option<&Answer>,
    now_ms: u64,
) -> bool {
    let asked = |at| Asked {
        group: part.group,
        slot: at,
        asked_at_ms: part.asked_at_ms,
        now_ms,
    };
    match part.owner {
        Owner::Root {
            kind: CallKind::Refill,
            slot: at,
            ..
        } => {
            // A refill's whole batch becomes the lease's.
            let batch = LeaseBatch {
                asked: part.hits,
                tokens: part.hits,
            };
            store_lease_answer(c, host, asked(at), batch, BatchOutcome::of(answer));
            false
        }
        Owner::Root {
            kind: CallKind::Push,
            slot: at,
            ..
        } => store_sync_answer(c, host, asked(at), SyncHits::Pushed(part.hits), answer),
        Owner::Root {
            kind: CallKind::Charge,
            ..
        } => {
            if let Some(call) = part.call() {
                store_charge_answer(c, host, &call, part.asked_at_ms, answer);
            }
            false
        }
        Owner::Stream { settle, .. } => match settle {
            Settle::Nothing => false,
            // The request asked for a batch: the first hit is its own.
            Settle::Lease { slot: at, batch } => {
                let batch = LeaseBatch {
                    asked: batch,
                    tokens: batch.saturating_sub(1),
                };
                store_lease_answer(c, host, asked(at), batch, BatchOutcome::of(answer));
                false
            }
            Settle::Sync { slot: at } => {
                store_sync_answer(c, host, asked(at), SyncHits::OwnHit, answer);
                false
            }
        },
    }
}

/// What an answer teaches beyond its mode's state: the fallback's entry
/// learns what the fleet has left from the answer to a root's call, or to
/// a request while its stream waits for it; and a request's refusal is
/// remembered in the over-limit cache of the tenant's slot and of its state
/// on the route, each with its part of the statuses (the group's
/// descriptors first, then the route's). In shadow too: the cache then
/// lets through (and counts) what it would have refused, as enforcing
/// would, and spares the service the same calls. Not a batch the counter
/// refused whole while one hit still fits (`lease::smaller_may_fit`).
fn store_learned<H: Host + ?Sized>(c: &Compiled, host: &H, part: &Part, answer: &Answer) {
    let slots = match part.owner {
        Owner::Root { slot: at, .. } => {
            fallback::on_answer(c.fallback(part.group), host, at, part.hits, answer);
            return;
        }
        Owner::Stream {
            id: Some(_),
            slots: Some(slots),
            ..
        } => slots,
        Owner::Stream { .. } => return,
    };
    fallback::on_answer(c.fallback(part.group), host, slots.own, part.hits, answer);
    let statuses = &answer.response.statuses;
    if !answer.over_limit || smaller_may_fit(part.hits, statuses) {
        return;
    }
    let own = c.descriptor_count(part.group, None).min(statuses.len());
    let (own, on_route) = statuses.split_at(own);
    remember(c, host, slots.own, part.asked_at_ms, own);
    if let Some(at) = slots.on_route {
        remember(c, host, at, part.asked_at_ms, on_route);
    }
}

/// Parts dropped before they were sent (their stream ended): a sync
/// request's pending hit is released, as for a request whose call failed
/// (it was never admitted). A lease's ask is taken as lost after
/// `refill_lost_ms`, as any unanswered one.
pub fn release<H: Host + ?Sized>(c: &Compiled, host: &H, dropped: Vec<Part>) {
    let now_ms = if dropped.is_empty() { 0 } else { host.now_ms() };
    for part in dropped {
        if let Owner::Stream {
            settle: Settle::Sync { slot: at },
            ..
        } = part.owner
        {
            let asked = Asked {
                group: part.group,
                slot: at,
                asked_at_ms: part.asked_at_ms,
                now_ms,
            };
            store_sync_answer(c, host, asked, SyncHits::OwnHit, None);
        }
    }
}
