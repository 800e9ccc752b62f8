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
//!   its mailbox (`vm::Mailbox`: lease refills, response costs to charge)
//!   go out, each as one call; then, once per sync interval, the
//!   unsynced hits of every tracked tenant (one call per tenant), and a
//!   tenant with nothing left pending is forgotten until its next request.
//!   A call that cannot be sent is handled as its failed answer: a refill
//!   counts `lease.failed`, a push `sync.failed` and puts its hits back, a
//!   charge `response_cost.failed`.
//! - On an answer (`Root::on_answer`): the call's token finds what it was
//!   for; its answer is decoded once (`answer::decode`) and stored in the
//!   tenant's slot by the mode (`modes`).
//!
//! Calls are sent from the root, not from a stream, so that a stream that
//! ends cannot cancel them and their answers come back here. Every bound is
//! the mailbox's (`vm::MAX_QUEUED_CALLS`, `vm::MAX_TRACKED`).

use std::collections::HashMap;

use ratelimit_config::{OnFailure, LEASE_TICK_MS};

use crate::answer::{self, RlsError};
use crate::breaker::{self, Gate};
use crate::decision::Compiled;
use crate::fallback;
use crate::host::{Host, HostError, SharedData};
use crate::lease::{LeaseParams, Outcome};
use crate::local::names::{empty_entry, name_key, NAME_ENTRIES};
use crate::local::{agree, create, Agreed, SlotKey, SlotSecret, SLOT_BYTES};
use crate::modes::{next_push, settle_charge, store_heard, store_outcome};
use crate::proto::{METHOD, SERVICE};
use crate::sync::SyncParams;
use crate::vm::{CallKind, TenantCall, Vm};

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
    let mut groups = c.config.limits.all_groups();
    groups
        .any(|g| SyncParams::for_group(c, g).is_some())
        .then_some(u64::from(c.config.local.sync_interval_ms))
}

/// The root's tick period: the shorter of the lease refills' and the sync
/// pushes' (None: no group needs a tick). Response costs are charged on the
/// tick of lease refills.
pub fn tick_ms(c: &Compiled) -> Option<u64> {
    let mut groups = c.config.limits.all_groups();
    let leases =
        groups.any(|g| LeaseParams::for_group(c, g).is_some()) || c.config.response_cost.is_some();
    let lease_tick = leases.then_some(u64::from(LEASE_TICK_MS));
    match (lease_tick, sync_interval_ms(c)) {
        (Some(l), Some(s)) => Some(l.min(s)),
        (l, s) => l.or(s),
    }
}

/// A call the root sent, until its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pending {
    call: TenantCall,
    asked_at_ms: u64,
}

/// One worker's root: the calls it has under way, and its sync schedule.
#[derive(Debug, Default)]
pub struct Root {
    /// Calls sent, by token.
    in_flight: HashMap<u32, Pending>,
    /// When sync mode pushes next.
    next_sync_ms: u64,
}

impl Root {
    /// How many calls are under way.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The tick: sends what the mailbox holds, then, when due, the sync
    /// pushes.
    pub fn on_tick<H: Host + ?Sized>(&mut self, c: &Compiled, host: &H, vm: &Vm) {
        for call in vm.mailbox.take_queued() {
            let now = host.now_ms();
            self.send(c, host, vm, call, now);
        }
        if let Some(interval) = sync_interval_ms(c) {
            let now = host.now_ms();
            if now >= self.next_sync_ms {
                self.next_sync_ms = now.saturating_add(interval);
                self.push_syncs(c, host, vm, now);
            }
        }
    }

    /// Pushes the unsynced hits of every tenant the worker tracks; a tenant
    /// with nothing pending is forgotten until its next request.
    fn push_syncs<H: Host + ?Sized>(&mut self, c: &Compiled, host: &H, vm: &Vm, now: u64) {
        for tracked in vm.mailbox.tracked() {
            let (push, idle) = next_push(c, host, &tracked, now);
            if idle {
                vm.mailbox.forget(tracked.at);
            }
            if let Some(push) = push {
                self.send(c, host, vm, push, now);
            }
        }
    }

    /// Sends one call; one that cannot be sent is answered as failed, and so
    /// is one the breaker keeps in (it is open, and this call is not its
    /// probe): a refill counts `lease.failed`, a push puts its hits back.
    fn send<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        call: TenantCall,
        now: u64,
    ) {
        let open = breaker::may_call(c, host, &vm.breaker, now) == Gate::Fallback;
        let sent = match (!open).then(|| call.message(c)).flatten() {
            Some(message) => host
                .dispatch_grpc(&c.upstream, SERVICE, METHOD, &message, c.config.timeout_ms)
                .map_err(|e| {
                    log::debug!("root call not sent: {e}");
                    breaker::record(c, host, &vm.breaker, Some(&RlsError::Host(e)), now);
                }),
            // The breaker is open, or the group is gone from the configuration.
            None => Err(()),
        };
        let pending = Pending {
            call,
            asked_at_ms: now,
        };
        match sent {
            Ok(token) => {
                self.in_flight.insert(token, pending);
            }
            Err(()) => settle(c, host, &pending, None),
        }
    }

    /// The answer to the call sent under `token` (`grpc_status` not 0: it
    /// failed); `body_size` bytes of body. A token the root did not send
    /// is ignored.
    pub fn on_answer<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        token: u32,
        grpc_status: u32,
        body_size: usize,
    ) {
        let Some(pending) = self.in_flight.remove(&token) else {
            return;
        };
        let body = if grpc_status == 0 {
            host.grpc_response(body_size)
                .unwrap_or_else(|e: HostError| {
                    log::debug!("root call's answer not read: {e}");
                    None
                })
        } else {
            None
        };
        let decoded = answer::decode(grpc_status, body.as_deref());
        let now = host.now_ms();
        breaker::record(c, host, &vm.breaker, decoded.as_ref().err(), now);
        settle(c, host, &pending, decoded.as_ref().ok());
    }
}

/// What the answer to a root's call (None: it failed, or was never sent)
/// leaves in the tenant's slot and its group's counters.
fn settle<H: Host + ?Sized>(c: &Compiled, host: &H, p: &Pending, heard: Option<&answer::Answer>) {
    let t = &p.call;
    if let Some(answer) = heard {
        fallback::on_answer(c, host, t.group, t.at, t.hits, answer);
    }
    match t.kind {
        CallKind::Refill => store_outcome(
            c,
            host,
            t.group,
            t.at,
            p.asked_at_ms,
            t.hits,
            t.hits,
            Outcome::of(heard),
        ),
        CallKind::Push => store_heard(c, host, t.group, t.at, p.asked_at_ms, t.hits, true, heard),
        CallKind::Charge => settle_charge(c, host, t, p.asked_at_ms, heard),
    }
}

#[cfg(test)]
mod tests;
