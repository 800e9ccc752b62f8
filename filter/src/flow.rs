//! The request flow: what tenant-ratelimit does with one request, from its
//! headers to its response. Open this file first.
//!
//! Envoy calls the filter three times per request, and each call is one
//! method of `Stream` here:
//!
//! 1. `on_request_headers`: read the tenant header; a value longer than
//!    `max_tenant_length` is refused with 431 (`tenant_too_long`); a missing
//!    tenant is allowed or refused (`missing_tenant`); a tenant no group limits
//!    passes; a limited one goes through the local layer (over-limit cache,
//!    token bucket: a refusal there is a 429 with no call), then the request
//!    is paused and one `ShouldRateLimit` call goes to the rate-limit
//!    service.
//! 2. `on_rls_answer`: the service's answer. OK admits the request (its
//!    X-RateLimit-* headers are kept for the response); OVER_LIMIT is a 429,
//!    remembered in the over-limit cache; an error or timeout fails open, or
//!    answers `status_on_error` with `failure_mode_deny`.
//! 3. `on_response_headers`: adds the kept headers to the upstream's
//!    response.
//!
//! Everything the flow needs from Envoy goes through the `Host` trait
//! (`host`), which the glue implements with proxy-wasm hostcalls and
//! `testing::MemHost` in memory; so this file is pure code, tested path by
//! path below. A host call that fails is a limiter failure (fail open,
//! unless `failure_mode_deny`) or, in the local layer, skips that layer; it
//! never panics.

use crate::counters::{Counter, GroupCounter};
use crate::decision::{encode_request, first_step, verdict, Compiled, RlsError, Step, Verdict};
use crate::host::Host;
use crate::lease::{store_outcome, Outcome};
use crate::local::{remember_over_limit, slot_for, update, LocalVerdict, SlotRef};
use crate::local::{UpdateError, CAS_ATTEMPTS};
use crate::modes::{local_step, ModeStep};
use crate::proto::{METHOD, SERVICE};
use crate::sync::{store_heard, Heard};

/// What Envoy does with the request after a callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Go on to the next filter (or the client).
    Continue,
    /// Wait: a gRPC call or a local reply is under way.
    Pause,
}

/// The flow's state for one request, between Envoy's callbacks.
#[derive(Debug, Default)]
pub struct Stream {
    /// X-RateLimit-* headers to add to the upstream response (admitted
    /// requests only: local replies carry their own).
    response_headers: Vec<(&'static str, String)>,
    /// The tenant's local-layer slot, when the layer is on.
    slot: Option<SlotRef>,
    /// When the call to the service went out (for the over-limit cache).
    asked_at_ms: u64,
    /// The tenant's group (its index in `limits.all_groups()`), once known:
    /// whose per-group counters this request counts in.
    group: Option<usize>,
    /// Lease mode: the batch this request asked for (`lease`).
    lease_batch: Option<u32>,
    /// Sync mode: this request asked the service itself; its answer
    /// refreshes the tenant's view (`sync`).
    sync: bool,
}

impl Stream {
    /// The request's headers have arrived.
    pub fn on_request_headers<H: Host + ?Sized>(&mut self, c: &Compiled, host: &H) -> Next {
        let tenant = match host.request_header(&c.config.limits.header) {
            Ok(t) => t,
            Err(e) => return limiter_error(c, host, None, &RlsError::Host(e.0)),
        };
        let limited = match first_step(c, tenant.as_deref()) {
            Step::AllowMissingTenant => {
                host.count(Counter::MissingTenant);
                return Next::Continue;
            }
            Step::DenyMissingTenant => {
                host.count(Counter::MissingTenant);
                return local_reply(host, 429, &[], "missing tenant header\n");
            }
            Step::TenantTooLong => {
                host.count(Counter::TenantTooLong);
                return local_reply(host, 431, &[], "tenant header value too long\n");
            }
            Step::NotLimited => return Next::Continue,
            Step::Limit(limited) => limited,
        };
        let group = limited.group_index;
        self.group = Some(group);
        let local = &c.config.local;
        if local.enabled {
            let key = host.slot_secret();
            let at = slot_for(&key, &limited.group.name, &limited.tenant, local.slots);
            let now = host.now_ms();
            let verdict = match local_step(c, host, &limited, at, now) {
                Ok((_, ModeStep::Admitted)) => return Next::Continue,
                Ok((_, ModeStep::Refused(headers))) => return over_limit_reply(host, &headers),
                Ok((v, ModeStep::Ask { lease_batch, sync })) => {
                    self.lease_batch = lease_batch;
                    self.sync = sync;
                    Ok(v)
                }
                Ok((v, ModeStep::Exact)) => Ok(v),
                Err(e) => Err(e),
            };
            match verdict {
                Ok(LocalVerdict::Proceed) => {}
                Ok(LocalVerdict::Contended) => host.count(Counter::SlotContended),
                Ok(LocalVerdict::BucketEmpty(headers)) => {
                    host.count(Counter::LocalOverLimit);
                    host.count_group(group, GroupCounter::RefusedBucket);
                    return over_limit_reply(host, &headers);
                }
                Ok(LocalVerdict::CachedOverLimit(headers)) => {
                    host.count(Counter::CachedOverLimit);
                    host.count_group(group, GroupCounter::RefusedCache);
                    return over_limit_reply(host, &headers);
                }
                Err(e) => local_error(host, &e),
            }
            self.slot = Some(at);
            self.asked_at_ms = now;
        }
        let message = encode_request(c, &limited, self.lease_batch.unwrap_or(0));
        match host.dispatch_grpc(&c.upstream, SERVICE, METHOD, &message, c.config.timeout_ms) {
            Ok(()) => Next::Pause,
            Err(e) => {
                if let (Some(batch), Some(at)) = (self.lease_batch, self.slot) {
                    store_outcome(
                        c,
                        host,
                        group,
                        at,
                        self.asked_at_ms,
                        batch,
                        0,
                        Outcome::Failed,
                    );
                }
                limiter_error(c, host, Some(group), &RlsError::Host(e.0))
            }
        }
    }

    /// The rate-limit service answered (or the call failed: `grpc_status`
    /// not 0). The request was paused since its headers: it is resumed
    /// unless a local reply went out.
    pub fn on_rls_answer<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        grpc_status: u32,
        body_size: usize,
    ) {
        let body = if grpc_status == 0 {
            host.grpc_response(body_size).ok().flatten()
        } else {
            None
        };
        if let (Some(batch), Some(at), Some(group)) = (self.lease_batch, self.slot, self.group) {
            // This request asked for a batch: the first hit is its own.
            let outcome = Outcome::of(grpc_status, body.as_deref());
            let tokens = batch.saturating_sub(1);
            store_outcome(c, host, group, at, self.asked_at_ms, batch, tokens, outcome);
        }
        if let (true, Some(at), Some(group)) = (self.sync, self.slot, self.group) {
            let heard = Heard::of(grpc_status, body.as_deref());
            store_heard(c, host, group, at, self.asked_at_ms, 1, false, &heard);
        }
        let next = match verdict(c.config.headers, grpc_status, body.as_deref()) {
            Verdict::Allow(headers) => {
                host.count(Counter::Allowed);
                if let Some(group) = self.group {
                    host.count_group(group, GroupCounter::Admitted);
                }
                self.response_headers = headers;
                Next::Continue
            }
            Verdict::OverLimit(headers, statuses) => {
                host.count(Counter::OverLimit);
                if let Some(group) = self.group {
                    host.count_group(group, GroupCounter::RefusedService);
                }
                if let Some(at) = self.slot {
                    let asked_at = self.asked_at_ms;
                    let remembered = update(host, at.index, CAS_ATTEMPTS, |stored| {
                        ((), remember_over_limit(stored, at, asked_at, &statuses))
                    });
                    if let Err(e) = remembered {
                        local_error(host, &e);
                    }
                }
                over_limit_reply(host, &headers)
            }
            Verdict::Error(why) => limiter_error(c, host, self.group, &why),
        };
        if next == Next::Continue {
            let _ = host.resume_request();
        }
    }

    /// The upstream's response headers have arrived (also for the filter's
    /// own local replies, which carry their headers already).
    pub fn on_response_headers<H: Host + ?Sized>(&mut self, host: &H) -> Next {
        for (name, value) in self.response_headers.drain(..) {
            let _ = host.add_response_header(name, &value);
        }
        Next::Continue
    }
}

/// A 429 for the limiter, with these headers.
fn over_limit_reply<H: Host + ?Sized>(host: &H, headers: &[(&'static str, String)]) -> Next {
    let mut h: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 1);
    h.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
    h.push(("x-envoy-ratelimited", "true"));
    local_reply(host, 429, &h, "rate limit exceeded\n")
}

/// Sends a local reply: `Pause` when it went out, else `Continue`, so that
/// a host failure lets the request through instead of leaving it stuck.
fn local_reply<H: Host + ?Sized>(
    host: &H,
    status: u32,
    headers: &[(&str, &str)],
    body: &str,
) -> Next {
    match host.send_reply(status, headers, body) {
        Ok(()) => Next::Pause,
        Err(e) => {
            log::error!("cannot send a local reply: {}", e.0);
            Next::Continue
        }
    }
}

/// A failure of the local layer skips it (the service still decides).
fn local_error<H: Host + ?Sized>(host: &H, e: &UpdateError) {
    match e {
        UpdateError::CasRetriesExhausted => host.count(Counter::CasRetriesExhausted),
        UpdateError::Host(why) => {
            host.count(Counter::LocalError);
            // `debug!` formats nothing unless debug is on (a static check).
            log::debug!("local layer error: {why}");
        }
    }
}

/// The limiter failed: count it (in the tenant's group too, once known),
/// then fail open or deny.
fn limiter_error<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    group: Option<usize>,
    why: &RlsError,
) -> Next {
    host.count(Counter::RlsError);
    log::debug!("limiter error: {why:?}");
    if c.config.failure_mode_deny {
        host.count(Counter::FailureModeDenied);
        local_reply(
            host,
            u32::from(c.config.status_on_error),
            &[],
            "rate limiter unavailable\n",
        )
    } else {
        host.count(Counter::FailureModeAllowed);
        if let Some(group) = group {
            host.count_group(group, GroupCounter::FailedOpen);
        }
        Next::Continue
    }
}

#[cfg(test)]
mod tests;
