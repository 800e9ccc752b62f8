//! The root context's policy, as pure code over the ports: what a worker's
//! root does at configure, on a tick, and on the answer to a call it sent.
//! The glue only forwards Envoy's callbacks here.
//!
//! - At configure (`prepare_local`): every slot and the rule-name table are
//!   created in shared data (`create_shared`), and the slot secret agreed
//!   (`local::secret`); `prepare_failure`: the breaker's state and the
//!   fallback's entries.
//! - The tick (`tick_ms`): as often as the fastest need, lease refills
//!   (`LEASE_TICK_MS`) or sync pushes (`local.sync.interval_ms`); no tick
//!   when no group needs one.
//! - On a tick (`Root::on_tick`): the calls the worker's streams queued in
//!   its mailbox (`vm::Mailbox`: lease refills)
//!   and, once per sync interval, the unsynced hits of every tracked tenant
//!   join the worker's queue of calls (`batch`), and so, after each end of
//!   the shortest lease window, do the refills of the leases of the tenants
//!   it tracks that were served in the last second (`lease::window_refill`),
//!   each taken out of the tenant's slot by the pass over it
//!   (`pass_tracked`);
//!   the queue goes at once:
//!   everything due in one call (or a few, of `max_descriptors` each). A
//!   tenant with nothing left pending is forgotten until its next request.
//!   A call that cannot be sent, or that the open breaker keeps in
//!   (`breaker`, gated where each call goes: `batch`), is handled as its
//!   failed answer: a refill counts `lease.failed`, a push `sync.failed`
//!   and puts its hits back, a charge `response_cost.failed`.
//! - On an answer (`Root::on_answer`): Envoy answers every call of the
//!   worker, whichever context sent it, on the root context; the call's
//!   token finds its parts (`batch`), the answer is decoded once and split
//!   back per part (the call's outcome, one, recorded by the breaker), each
//!   part's share is stored in its tenant's slot by the mode
//!   (`answer_path::finish`, and the fallback's entry, `fallback`), and each
//!   request's share is handed to its
//!   stream (the glue delivers it, acting for that stream).
//!
//! A call is never cancelled with the stream that happened to send it:
//! Envoy makes every call on the root context. The mailbox is not there
//! for that: it holds lease refills until the tick, so that they go out
//! with the tick's pushes instead of as calls on the request path
//! (`vm::Mailbox`). Every bound is the
//! mailbox's (`vm::MAX_QUEUED_CALLS`, `vm::MAX_TRACKED`) or the queue's
//! (`batch::MAX_QUEUED_PARTS`).

use ratelimit_config::{OnFailure, LEASE_TICK_MS};

use crate::answer_path::{finish, release};
use crate::batch::{CallKind, Part, TenantCall};
use crate::breaker;
use crate::compiled::Compiled;
use crate::counters::GroupCounter;
use crate::fallback;
use crate::host::{Host, SharedData};
use crate::lease;
use crate::local::names::{empty_entry, name_key, NAME_ENTRIES};
use crate::local::{agree, create, update, Agreed, ModeState, Slot, SlotKey, SlotSecret};
use crate::local::{CAS_ATTEMPTS, SLOT_BYTES};
use crate::sync;
use crate::vm::{Tracked, Vm};
use crate::window;

/// How many slots and rule-name entries could not be created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Created {
    pub failed_slots: u32,
    pub failed_names: u32,
}

/// Creates every slot once, zeroed and at full size, so that the shared
/// data has its final size from the start and never grows with traffic,
/// and the entries of the rule-name table (`local::names`: they must exist
/// before they are written under CAS). Every VM runs this; a key that
/// exists is left alone, and one that cannot be read is not written
/// (counted as failed).
pub fn create_shared<S: SharedData + ?Sized>(shared: &S, slots: u32) -> Created {
    let create = |key: &str, value: &[u8]| create(shared, key, value);
    let zeroed = [0u8; SLOT_BYTES];
    let mut created = Created::default();
    for index in 0..slots {
        if !create(SlotKey::new(index).as_str(), &zeroed) {
            created.failed_slots += 1;
        }
    }
    for i in 0..NAME_ENTRIES {
        if !create(&name_key(i), &empty_entry()) {
            created.failed_names += 1;
        }
    }
    created
}

/// The local layer's shared state at configure: the slots created, and the
/// slot secret every VM of this Envoy uses (`draw` makes one, when this VM
/// is the first). Failures are logged: the layer then works with what it
/// has (a slot that does not exist is skipped; an unshared secret gives
/// this worker buckets of its own).
pub fn prepare_local<S: SharedData + ?Sized>(
    shared: &S,
    slots: u32,
    draw: impl FnOnce() -> SlotSecret,
) -> SlotSecret {
    let created = create_shared(shared, slots);
    if created.failed_slots > 0 {
        log::warn!(
            "local layer: {} of {slots} slots could not be created",
            created.failed_slots
        );
    }
    if created.failed_names > 0 {
        log::warn!(
            "local layer: {} of {NAME_ENTRIES} rule-name entries could not be created",
            created.failed_names
        );
    }
    let (secret, agreed) = agree(shared, draw);
    if let Agreed::Unshared(why) = agreed {
        log::warn!(
            "local layer: the slot secret could not be shared ({why}): this worker's buckets are its own"
        );
    }
    secret
}

/// The breaker's and the fallback's shared state at configure: the
/// breaker's value (its gauge set from it), and with `on_failure: local`
/// one fallback entry per slot (`fallback::create`).
pub fn prepare_failure<H: Host + ?Sized>(host: &H, c: &Compiled) {
    if c.config.breaker.enabled {
        breaker::create(host);
    }
    let local = c.config.on_failure == OnFailure::Local;
    if local && fallback::create(host, c.config.local.slots) > 0 {
        log::warn!("fallback: some entries could not be created at configure");
    }
}

/// Sync mode's push period (None: no group syncs).
pub fn sync_interval_ms(c: &Compiled) -> Option<u64> {
    c.group_modes()
        .any(|m| m.sync().is_some())
        .then_some(u64::from(c.config.local.sync_interval_ms))
}

/// The root's tick period: the shorter of the lease refills' and the sync
/// pushes' (None: no group needs a tick). A response's cost needs none: it
/// is charged when the response tells it (`cost::charge_response`).
pub fn tick_ms(c: &Compiled) -> Option<u64> {
    let leases = c.group_modes().any(|m| m.lease().is_some());
    let lease_tick = leases.then_some(u64::from(LEASE_TICK_MS));
    match (lease_tick, sync_interval_ms(c)) {
        (Some(l), Some(s)) => Some(l.min(s)),
        (l, s) => l.or(s),
    }
}

/// The shortest window of the groups in lease mode (None: none leases):
/// after each of its ends, the root refills the leases of the tenants it
/// tracks, in one call.
pub fn lease_window_ms(c: &Compiled) -> Option<u64> {
    c.group_modes()
        .filter_map(|m| m.lease())
        .map(|p| p.window_ms)
        .min()
}

/// One worker's root: its sync schedule. Its calls under way are the
/// worker's (`vm::Vm::batch`), shared with its streams.
#[derive(Debug, Default)]
pub struct Root {
    /// When sync mode pushes next.
    next_sync_ms: u64,
    /// When the shortest lease window ends next (the next refill pass).
    next_lease_ms: u64,
}

impl Root {
    /// The tick: what the mailbox holds and, when due, the sync pushes go,
    /// with whatever requests are queued.
    pub fn on_tick<H: Host + ?Sized>(&mut self, c: &Compiled, host: &H, vm: &Vm) {
        let now = host.now_ms();
        let mut parts: Vec<Part> = vm
            .mailbox
            .take_queued()
            .into_iter()
            .map(|call| Part::tenant(c, call, now))
            .collect();
        let sync_due = match sync_interval_ms(c) {
            Some(interval) if now >= self.next_sync_ms => {
                self.next_sync_ms = now.saturating_add(interval);
                true
            }
            _ => false,
        };
        let lease_due = match lease_window_ms(c) {
            Some(window) if now >= self.next_lease_ms => {
                self.next_lease_ms = window::end(window, now);
                true
            }
            _ => false,
        };
        if sync_due || lease_due {
            for tracked in vm.mailbox.tracked() {
                let due = DueWork {
                    push_sync: sync_due,
                    refill_leases: lease_due,
                };
                let PassOutcome { call, idle } = pass_tracked(c, host, &tracked, now, due);
                if idle {
                    vm.mailbox.forget(tracked.slot);
                }
                parts.extend(call.map(|p| Part::tenant(c, p, now)));
            }
        }
        let done = vm.batch.tick(c, host, parts);
        finish(c, host, vm, done, None);
    }

    /// The answer to the call sent under `token` (`grpc_status` not 0: it
    /// failed), `body_size` bytes of body; then the queue goes. A token the
    /// worker did not send is ignored.
    pub fn on_answer<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        token: u32,
        grpc_status: u32,
        body_size: usize,
    ) {
        let done = vm.batch.answered(c, host, token, grpc_status, body_size);
        finish(c, host, vm, done, None);
    }

    /// The stream `id` has ended: its queued part is dropped, and what it
    /// held released.
    pub fn on_stream_end<H: Host + ?Sized>(c: &Compiled, host: &H, vm: &Vm, id: u32) {
        release(c, host, vm.batch.forget_stream(id));
    }
}

/// What a root pass is due to do for its tracked tenants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DueWork {
    /// Push sync tenants' unsynced hits (once per sync interval).
    pub push_sync: bool,
    /// Refill leases after their window ended.
    pub refill_leases: bool,
}

/// What a root pass does for one tracked tenant.
#[derive(Debug, PartialEq, Eq)]
pub struct PassOutcome {
    /// The call to send for it, if any.
    pub call: Option<TenantCall>,
    /// It has nothing left pending: the root forgets it until its next
    /// request.
    pub idle: bool,
}

/// What a tracked tenant's slot gave up to the root pass.
struct TakenFromSlot {
    /// The call's kind and hits (None: nothing owed).
    call: Option<(CallKind, u32)>,
    /// Lease tokens whose window ended unspent.
    stranded: u32,
    idle: bool,
}

/// The call a tracked tenant's root pass owes it at `now_ms`, taken out
/// of its slot: when `due.push_sync` and its group syncs, a push of its
/// unsynced hits (`sync::take_delta`); when `due.refill_leases` and its group
/// leases, the refill of its lease after a window ended
/// (`lease::window_refill`), marked under way. No call when nothing is
/// owed, or another worker has it under way.
pub fn pass_tracked<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    t: &Tracked,
    now_ms: u64,
    due: DueWork,
) -> PassOutcome {
    let params = c.mode_params(t.group);
    let (sync, lease) = (params.sync(), params.lease());
    let nothing = |idle| PassOutcome { call: None, idle };
    if sync.is_none() && lease.is_none() {
        // The group left both modes: nothing will be owed again.
        return nothing(true);
    }
    let sync = sync.filter(|_| due.push_sync);
    let lease = lease.filter(|_| due.refill_leases);
    if sync.is_none() && lease.is_none() {
        return nothing(false);
    }
    // A lease this worker has not served in this second or the one before
    // is idle to it (`lease::window_refill`'s rule; the slot may say
    // otherwise only when another worker served it since, which tracks it
    // and refills it): forgotten without reading its slot.
    let unseen = t
        .seen_s
        .is_some_and(|s| s.saturating_add(1) < now_ms / 1_000);
    if sync.is_none() && unseen {
        return nothing(true);
    }
    let at = t.slot;
    let taken = update(host, at.index, CAS_ATTEMPTS, |stored| {
        let none = TakenFromSlot {
            call: None,
            stranded: 0,
            idle: true,
        };
        let Some(mut slot) = Slot::decode_for(stored, at.fingerprint) else {
            return (none, None);
        };
        match (slot.mode, sync, lease) {
            (ModeState::Sync(held), Some(p), _) => {
                let (state, delta) = sync::take_delta(Some(held), &p, now_ms);
                slot.mode = ModeState::Sync(state);
                let taken = TakenFromSlot {
                    call: (delta > 0).then_some((CallKind::Push, delta)),
                    stranded: 0,
                    idle: state.pending() == 0,
                };
                (taken, (delta > 0).then_some(slot))
            }
            (ModeState::Lease(held), _, Some(p)) => {
                let (l, batch, stranded, idle) = lease::window_refill(held, &p, now_ms);
                slot.mode = ModeState::Lease(l);
                let taken = TakenFromSlot {
                    call: batch.filter(|b| *b > 0).map(|b| (CallKind::Refill, b)),
                    stranded,
                    idle,
                };
                (taken, batch.map(|_| slot))
            }
            _ => (none, None),
        }
    });
    // Not taken (the slot could not be read or written): the tenant's
    // requests ask for themselves, as without the root.
    let Ok(taken) = taken else {
        return nothing(false);
    };
    if taken.stranded > 0 {
        let stranded = u64::from(taken.stranded);
        host.add_group(t.group, GroupCounter::LeaseStranded, stranded);
    }
    let call = taken.call.map(|(kind, hits)| TenantCall {
        kind,
        group: t.group,
        tenant: t.tenant.clone(),
        slot: at,
        hits,
        route: None,
    });
    PassOutcome {
        call,
        idle: taken.idle,
    }
}

#[cfg(test)]
mod tests;
