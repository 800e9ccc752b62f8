//! What one VM (one Envoy worker, or the main thread) keeps between
//! callbacks, apart from its configuration: the slot secret it agreed at
//! configure, its calls to the service (`batch::Batcher`: the queue, the
//! calls under way, the answers for its streams, what it last read of the
//! breaker), and the mailbox through which its streams hand work to its
//! root context.
//! Plain state: the flow and the root are given it (`&Vm`); the glue keeps
//! one per VM. Envoy's own state (shared data, metrics, ...) is behind the
//! ports (`host`).

use std::cell::RefCell;

use crate::batch::Batcher;
use crate::batch::TenantCall;
use crate::group::GroupId;
use crate::health::LogThrottle;
use crate::id_map::IdMap;
use crate::local::{SlotRef, SlotSecret};

/// The most calls a worker keeps queued for its root's next tick; one
/// queued beyond it is dropped (a lease refill's tenant asks again after
/// `refill_lost_ms`).
pub const MAX_QUEUED_CALLS: usize = 4_096;

/// The most tenants one worker tracks for sync and lease; a tenant beyond
/// it is pushed by another worker that tracks it, or its requests ask the
/// service once `max_unsynced` of its hits are pending (in lease mode,
/// once its lease runs out, as without the root's window refills).
pub const MAX_TRACKED: usize = 16_384;

/// A tenant whose sync hits this worker's root pushes, or whose lease it
/// refills when a window ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub group: GroupId,
    pub tenant: String,
    pub slot: SlotRef,
    /// The second of this worker's last request of the tenant (None: not
    /// known). A lease tenant this worker has not served in this second or
    /// the one before is forgotten without reading its slot
    /// (`root::pass_tracked`): a worker that served it since tracks it.
    pub seen_s: Option<u64>,
}

/// Work a worker's streams hand to its root context, bounded: lease
/// refills to send on the next tick, and the tenants to track. A refill
/// waits for the tick so that the refills and pushes of a tick go out
/// together, in the worker's next calls, instead of each as a call of its
/// own on the request path (the lease still holds tokens: nothing waits
/// for it). Not to outlive the stream: every call of a VM is made and
/// answered on its root context, whichever context sends it, so a stream
/// that ends cancels no call (`root`). Borrowed only for the length of one
/// method: a borrow that fails (never, in one thread) drops the work as a
/// full mailbox would.
#[derive(Debug, Default)]
pub struct Mailbox {
    queued: RefCell<Vec<TenantCall>>,
    /// By the tenant's slot fingerprint.
    tracked: RefCell<IdMap<u64, Tracked>>,
}

impl Mailbox {
    /// Queues a call for the root's next tick; false when the mailbox is
    /// full (`MAX_QUEUED_CALLS`) and the call was dropped.
    pub fn queue(&self, call: TenantCall) -> bool {
        match self.queued.try_borrow_mut() {
            Ok(mut q) if q.len() < MAX_QUEUED_CALLS => {
                q.push(call);
                true
            }
            _ => false,
        }
    }

    /// Takes every queued call out, oldest first.
    pub fn take_queued(&self) -> Vec<TenantCall> {
        self.queued
            .try_borrow_mut()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }

    /// Sync mode: the root pushes this tenant's hits from now on, until it
    /// has nothing left to push (lease mode: refills its lease after each
    /// window, until it is idle). False when it is not tracked (the mailbox
    /// holds `MAX_TRACKED` others); a tenant tracked already stays as it is
    /// (no allocation).
    pub fn track(&self, group: GroupId, tenant: &str, at: SlotRef) -> bool {
        self.track_seen(group, tenant, at, None)
    }

    /// `track`, for a request of the tenant at `now_ms` (the tenant's
    /// `seen_s`).
    pub fn track_at(&self, group: GroupId, tenant: &str, at: SlotRef, now_ms: u64) -> bool {
        self.track_seen(group, tenant, at, Some(now_ms / 1_000))
    }

    fn track_seen(&self, group: GroupId, tenant: &str, at: SlotRef, seen_s: Option<u64>) -> bool {
        let Ok(mut t) = self.tracked.try_borrow_mut() else {
            return false;
        };
        if let Some(known) = t.get_mut(&at.fingerprint) {
            if seen_s.is_some() {
                known.seen_s = seen_s;
            }
            return true;
        }
        if t.len() >= MAX_TRACKED {
            return false;
        }
        t.insert(
            at.fingerprint,
            Tracked {
                group,
                tenant: tenant.to_string(),
                slot: at,
                seen_s,
            },
        );
        true
    }

    /// The tenants tracked, by slot fingerprint (a copy: the root calls the
    /// host for each).
    pub fn tracked(&self) -> Vec<Tracked> {
        self.tracked
            .try_borrow()
            .map(|t| t.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Stops tracking the tenant at `at` (it has nothing left to push).
    pub fn forget(&self, at: SlotRef) {
        if let Ok(mut t) = self.tracked.try_borrow_mut() {
            t.remove(&at.fingerprint);
        }
    }
}

/// One VM's state, given to the flow and the root.
#[derive(Debug)]
pub struct Vm {
    /// The key of the slot hash, agreed at configure (`local::secret`).
    pub slot_secret: SlotSecret,
    /// The worker's calls to the service.
    pub batch: Batcher,
    /// This VM's warnings about invalid response costs.
    pub cost_warnings: LogThrottle,
    /// This VM's "no rule for a descriptor" warnings (`health::no_rule`).
    pub no_rule_warnings: LogThrottle,
    pub mailbox: Mailbox,
}

impl Vm {
    pub fn new(slot_secret: SlotSecret) -> Vm {
        Vm {
            slot_secret,
            batch: Batcher::default(),
            cost_warnings: LogThrottle::new(),
            no_rule_warnings: LogThrottle::new(),
            mailbox: Mailbox::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::CallKind;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn at(fingerprint: u64) -> SlotRef {
        SlotRef {
            index: 0,
            fingerprint,
        }
    }

    fn refill(i: usize) -> TenantCall {
        TenantCall {
            kind: CallKind::Refill,
            group: GroupId::new(0),
            tenant: format!("t{i}"),
            slot: at(i as u64 + 1),
            hits: 1,
            route: None,
        }
    }

    #[test]
    fn the_queue_holds_at_most_max_queued_calls_until_taken() {
        let m = Mailbox::default();
        for i in 0..MAX_QUEUED_CALLS {
            assert!(m.queue(refill(i)));
        }
        assert!(!m.queue(refill(MAX_QUEUED_CALLS)));
        let taken = m.take_queued();
        assert_eq!(taken.len(), MAX_QUEUED_CALLS);
        assert_eq!(taken[0].tenant, "t0");
        assert!(m.take_queued().is_empty());
        assert!(m.queue(refill(0)));
    }

    #[test]
    fn at_most_max_tracked_tenants_each_once_until_forgotten() {
        let m = Mailbox::default();
        for i in 0..MAX_TRACKED as u64 {
            assert!(m.track(GroupId::new(0), "t", at(i + 1)));
        }
        // Tracked already: still tracked, not added twice.
        assert!(m.track(GroupId::new(0), "t", at(1)));
        assert!(!m.track(GroupId::new(0), "t", at(u64::MAX)));
        assert_eq!(m.tracked().len(), MAX_TRACKED);
        m.forget(at(1));
        assert!(m.track(GroupId::new(0), "other", at(u64::MAX)));
        assert_eq!(m.tracked().len(), MAX_TRACKED);
    }
}
