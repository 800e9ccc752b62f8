//! Limiter health: what an operator (or an alert) needs to see that the
//! limiter itself works. The service call's latency goes into a histogram;
//! a call that cannot even be sent is counted on its own and logged at
//! warn, naming the cluster, at most once a minute per VM.
//!
//! Why a call cannot be sent: on Envoy, `dispatch_grpc_call` fails at once
//! (no callback follows) when Envoy has no cluster of the configured
//! `rate_limit_service.cluster` name. Without this, a one-letter typo in
//! the cluster gave a proxy that failed every request open, silently.
//! The filter still starts with such a name: Envoy may learn the cluster
//! later (CDS), and refusing to start would take the whole listener down.

use std::cell::Cell;

use crate::compiled::Compiled;
use crate::counters::{Counter, GroupCounter, Histogram};
use crate::group::GroupId;
use crate::host::{Host, HostError};
use ratelimit_config::OnFailure;

/// The least time between two warnings of the same kind from one VM.
pub const WARN_INTERVAL_MS: u64 = 60_000;

/// Lets a repeated warning through once, then at most once per interval,
/// counting what it held back in between. Pure: time is passed in. One per
/// VM (`batch::Batcher::warnings`).
#[derive(Debug, Default)]
pub struct LogThrottle {
    /// When the last warning went out; None before the first.
    last_ms: Cell<Option<u64>>,
    /// Warnings held back since.
    held: Cell<u64>,
}

impl LogThrottle {
    pub const fn new() -> LogThrottle {
        LogThrottle {
            last_ms: Cell::new(None),
            held: Cell::new(0),
        }
    }

    /// Whether to log at `now_ms`: `Some(held)` (how many were held back
    /// since the last one) when it is due, else None (and one more is
    /// held). A clock that steps back by more than the interval makes it
    /// due at once, rather than silent until the clock catches up.
    pub fn due(&self, now_ms: u64, interval_ms: u64) -> Option<u64> {
        let due = match self.last_ms.get() {
            None => true,
            Some(last) => {
                now_ms >= last.saturating_add(interval_ms)
                    || now_ms.saturating_add(interval_ms) < last
            }
        };
        if due {
            self.last_ms.set(Some(now_ms));
            Some(self.held.replace(0))
        } else {
            self.held.set(self.held.get().saturating_add(1));
            None
        }
    }
}

/// The call could not be sent: count it, and warn (throttled) with the
/// cluster's name. The caller then fails open or denies, as for any
/// limiter failure.
pub fn dispatch_failed<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    warnings: &LogThrottle,
    why: &HostError,
) {
    host.count(Counter::RlsDispatchFailed);
    if let Some(held) = warnings.due(host.now_ms(), WARN_INTERVAL_MS) {
        let meanwhile = match c.config.on_failure {
            OnFailure::Allow => "requests pass unlimited meanwhile",
            OnFailure::Deny => "requests are refused meanwhile",
            OnFailure::Local => "requests get this Envoy's share meanwhile",
        };
        log::warn!(
            "cannot call the rate-limit service: dispatch to cluster \"{}\" failed ({}); \
             does Envoy have a cluster of that name (rate_limit_service.cluster)? {}; \
             {} more failures since the last warning",
            c.config.cluster,
            why,
            meanwhile,
            held
        );
    }
}

/// The service answered a descriptor (the `index`th of the group's, for
/// `tenant` as the filter read it) with no rule of its own: count it for the group, and warn
/// (throttled) naming the domain and the descriptor. That limit is off: a
/// descriptor key, domain or tenant value the service's rules do not name.
pub fn no_rule<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    warnings: &LogThrottle,
    group: GroupId,
    index: usize,
    tenant: &str,
) {
    host.count_group(group, GroupCounter::NoRule);
    let Some(held) = warnings.due(host.now_ms(), WARN_INTERVAL_MS) else {
        return;
    };
    let Some(g) = c.group(group) else {
        return;
    };
    // The descriptor as the flow sends it (`model::descriptors`): the
    // group's `index`th unit, then the tenant.
    let Some((unit, _)) = g.limits.iter().nth(index) else {
        return;
    };
    log::warn!(
        "the rate-limit service has no rule for domain \"{}\", descriptor [generic_key={}, {}={}] \
         (group {}): that limit is not applied; check the service's configuration against this \
         one (ratelimit-config check); {} more since the last warning",
        c.config.domain,
        unit.descriptor_value(),
        c.config.descriptor_key,
        tenant,
        g.name,
        held
    );
}

/// The service answered a call sent at `sent_ms`: record its latency. Only
/// answered calls (gRPC status 0) are recorded: a timeout would record the
/// timeout itself and a refused connection 0 ms, hiding the service's real
/// latency; those are counted in `rls_error`.
pub fn answered<H: Host + ?Sized>(host: &H, sent_ms: u64, grpc_status: u32) {
    if grpc_status == 0 {
        host.record(
            Histogram::RlsLatencyMs,
            host.now_ms().saturating_sub(sent_ms),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_first_warning_goes_out_then_one_per_interval_with_the_count_held() {
        let t = LogThrottle::new();
        assert_eq!(t.due(1_000, 60_000), Some(0));
        assert_eq!(t.due(1_001, 60_000), None);
        assert_eq!(t.due(60_999, 60_000), None);
        assert_eq!(t.due(61_000, 60_000), Some(2));
        assert_eq!(t.due(61_000, 60_000), None);
        assert_eq!(t.due(200_000, 60_000), Some(1));
    }

    #[test]
    fn a_clock_step_back_does_not_silence_it() {
        let t = LogThrottle::new();
        assert_eq!(t.due(10_000_000, 60_000), Some(0));
        // A small step back (workers' clocks read out of order): held.
        assert_eq!(t.due(9_999_000, 60_000), None);
        // An hour back: due again, not silent for an hour.
        assert_eq!(t.due(10_000_000 - 3_600_000, 60_000), Some(1));
    }
}
