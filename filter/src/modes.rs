//! The local layer's step for one request, by the group's mode: exact (the
//! bucket and the over-limit cache, then a call), lease (`lease`) or sync
//! (`sync`). One read-modify-write of the tenant's slot in every mode; the
//! mode's counters are counted here, so `flow` only acts on the outcome.

use crate::counters::GroupCounter;
use crate::decision::{Compiled, Limited};
use crate::host::Host;
use crate::lease::{admit_lease, LeaseParams, Refill, Spend};
use crate::local::{admit_named, update, LocalVerdict, SlotRef, UpdateError, CAS_ATTEMPTS};
use crate::sync::{admit_sync, refusal_headers, SyncParams, SyncStep};

/// What the mode adds to the local layer's verdict.
#[derive(Debug, PartialEq, Eq)]
pub enum ModeStep {
    /// Exact mode, or the local layer refused or had no slot: as the
    /// verdict says.
    Exact,
    /// Admitted without a call (a lease's token, or a local admission in
    /// sync mode).
    Admitted,
    /// Refused without a call (sync: the view is at the limit).
    Refused(Vec<(&'static str, String)>),
    /// Call the service: `lease_batch` hits for a lease (None: one hit); in
    /// sync mode the answer refreshes the view (`sync`).
    Ask {
        lease_batch: Option<u32>,
        sync: bool,
    },
}

/// The local layer and the mode for a request of `limited` at `now` that
/// costs `cost` hits (`cost_header`); `names` reads the rule names of a
/// cached refusal. A request that costs more than 1 asks the service
/// itself in every mode, as in exact mode: leases and sync views count
/// single hits.
#[allow(clippy::too_many_arguments)]
pub fn local_step<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    limited: &Limited<'_>,
    at: SlotRef,
    now: u64,
    names: &dyn Fn(u8) -> Option<String>,
    cost: u32,
) -> Result<(LocalVerdict, ModeStep), UpdateError> {
    let group = limited.group_index;
    let bucket = c.config.local.bucket_for(limited.group);
    let headers = c.config.headers;
    let single = cost <= 1;
    if let Some(p) = LeaseParams::for_group(c, limited.group).filter(|_| single) {
        let (verdict, spend, stranded) = update(host, at.index, CAS_ATTEMPTS, |stored| {
            admit_lease(stored, at, now, bucket, headers, &p)
        })?;
        if stranded > 0 {
            host.add_group(group, GroupCounter::LeaseStranded, u64::from(stranded));
        }
        let step = match spend {
            Some(Spend::Token { refill }) => {
                if let Some(batch) = refill {
                    host.request_refill(Refill {
                        group,
                        tenant: limited.tenant.to_string(),
                        at,
                        batch,
                    });
                }
                host.count_group(group, GroupCounter::Admitted);
                host.count_group(group, GroupCounter::LeaseSpent);
                ModeStep::Admitted
            }
            Some(Spend::Ask { batch }) => ModeStep::Ask {
                lease_batch: Some(batch),
                sync: false,
            },
            None => ModeStep::Exact,
        };
        return Ok((verdict, step));
    }
    if let Some(p) = SyncParams::for_group(c, limited.group).filter(|_| single) {
        let (verdict, step) = update(host, at.index, CAS_ATTEMPTS, |stored| {
            admit_sync(stored, at, now, bucket, headers, &p)
        })?;
        let step = match step {
            Some(SyncStep::Admit) => {
                host.track_sync(group, &limited.tenant, at);
                host.count_group(group, GroupCounter::Admitted);
                host.count_group(group, GroupCounter::SyncLocal);
                ModeStep::Admitted
            }
            // Counted by the flow, as a refusal (or, in shadow, a would-be
            // refusal) from the source `sync`.
            Some(SyncStep::Refuse { retry_after_s }) => {
                ModeStep::Refused(refusal_headers(retry_after_s))
            }
            Some(SyncStep::Ask) => ModeStep::Ask {
                lease_batch: None,
                sync: true,
            },
            None => ModeStep::Exact,
        };
        return Ok((verdict, step));
    }
    let verdict = update(host, at.index, CAS_ATTEMPTS, |stored| {
        admit_named(stored, at, now, bucket, headers, names, cost)
    })?;
    Ok((verdict, ModeStep::Exact))
}
