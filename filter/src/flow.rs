//! The request flow: what tenant-ratelimit does with one request, from its
//! headers to its response. Open this file first.
//!
//! Envoy calls the filter three times per request, and each call is one
//! method of `Stream` here:
//!
//! 1. `on_request_headers`: read the tenant (`tenant`); a value longer than
//!    `max_tenant_length` is refused with 431 (`tenant_too_long`), a header
//!    sent more than once with 400 (`tenant_repeated`); a missing
//!    tenant is allowed or refused (`missing_tenant`); a tenant no group limits
//!    passes; a limited one goes through the local layer (over-limit cache,
//!    token bucket: a refusal there is a 429 with no call), then the request
//!    is paused and its descriptors go to the rate-limit service, in a
//!    `ShouldRateLimit` call of their own or shared with the worker's other
//!    requests (`batch`).
//! 2. `on_answer`: the service's answer for this request (its share of the
//!    call's, split back by the root that received it, which stored what
//!    it leaves: `answer_path`). OK admits the request (its X-RateLimit-*
//!    headers are kept for the response); OVER_LIMIT is a 429; an error, a
//!    timeout or an open breaker (`breaker`: no call was made) gets
//!    `on_failure`: let through, `status_on_error`, or the local fallback
//!    (`fallback`).
//! 3. `on_response_headers`: adds the kept headers to the upstream's
//!    response.
//!
//! Everything the flow needs from Envoy goes through the ports (`host`),
//! which the glue implements with proxy-wasm hostcalls and
//! `testing::MemHost` in memory, and what it keeps per VM is `vm::Vm`; so
//! this file is pure code, tested path by path below. A host call that
//! fails is a limiter failure (`on_failure`) or,
//! in the local layer, skips that layer; it never panics.

use std::ops::ControlFlow::{self, Break, Continue};

use crate::access_log::{record, record_admitted, DecidedBy};
use crate::answer::{Answer, RlsError};
use crate::answer_path::finish;
use crate::batch::{CallKind, OnRoute, TenantCall};
use crate::batch::{Owner, Part, Settle};
use crate::compiled::Compiled;
use crate::cost::{charge_response, request_cost, CostError};
use crate::counters::{Counter, GroupCounter};
use crate::decision::{self, first_step, near_limit, verdict_of, Decision, Limited, Step, Verdict};
use crate::fallback::{self, FallbackDecision};
use crate::group::GroupId;
use crate::headers::RETRY_AFTER;
use crate::health;
use crate::host::{Host, HostError};
use crate::local::{SlotRef, Slots};
use crate::modes::{local_outcome, LocalOutcome, Request};
use crate::tenant;
use crate::vm::Vm;
use ratelimit_config::OnFailure;

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
    /// The stream's context id: what the root hands its answer to.
    id: u32,
    /// X-RateLimit-* headers to add to the upstream response (admitted
    /// requests only: local replies carry their own).
    response_headers: Vec<(&'static str, String)>,
    /// The service's `response_headers_to_add`, for the upstream response
    /// of an admitted request (cleaned and bounded: `headers::forwarded`).
    forwarded: Vec<(String, String)>,
    /// The tenant's local-layer slot, when the layer is on.
    slot: Option<SlotRef>,
    /// The tenant as the filter read it (the header's value escaped as the
    /// service sees it, or the verified property's), once known: what every
    /// log line, access-log field and warning about this request names.
    tenant: Option<String>,
    /// The tenant's group, once known: whose per-group counters this
    /// request counts in.
    group: Option<GroupId>,
    /// The group is in shadow (`shadow`, globally or its own): a refusal
    /// is counted and the request let through.
    shadow: bool,
    /// The request's cost (`cost_header`; 1 without).
    cost: u32,
    /// With `response_cost_header`: the charge to send once the response
    /// tells its cost, `hits` holding what the request was charged.
    charge: Option<Box<TenantCall>>,
    /// The request went upstream counted: its response's cost is charged.
    charge_armed: bool,
}

impl Stream {
    /// The state of the stream with context id `id` (not 0).
    pub fn new(id: u32) -> Stream {
        Stream {
            id,
            ..Stream::default()
        }
    }

    /// The stream's context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The request's headers have arrived: the tenant, its group and the
    /// request's cost are read (`limited`), the local layer decides
    /// (`modes::local_outcome`), and a request it lets through asks the
    /// service (`ask`).
    pub fn on_request_headers<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
    ) -> Next {
        let tenant = match tenant::read(&c.tenant_location, host) {
            Ok(t) => t,
            Err(e) => return self.on_failure(c, host, Some(&RlsError::Host(e))),
        };
        let (limited, cost) = match self.limited(c, host, &tenant) {
            Continue(known) => known,
            Break(answered) => return answered,
        };
        let now_ms = host.now_ms();
        let req = Request {
            limited: &limited,
            cost,
            now_ms,
        };
        let outcome = local_outcome(c, host, vm, &req);
        // Armed only when the request goes upstream counted.
        self.charge = charge_for(c, &limited, outcome.slots(), cost);
        match outcome {
            LocalOutcome::Refused { source, headers } => {
                self.refuse(c, host, source, headers, Vec::new())
            }
            LocalOutcome::Admitted { headers, .. } => {
                self.charge_armed = true;
                // An estimate: this Envoy's last answer, less what it
                // admitted since.
                self.response_headers = headers;
                Next::Continue
            }
            LocalOutcome::Ask {
                slots,
                settle,
                hits,
            } => {
                self.slot = Some(slots.own);
                self.ask(c, host, vm, &req, (settle, Some(slots)), hits)
            }
            LocalOutcome::Skip => self.ask(c, host, vm, &req, (Settle::Nothing, None), cost),
        }
    }

    /// Who the request is for and what it costs: the tenant's group (and
    /// its route), kept on the stream; `Break` with what Envoy does next
    /// when the request was answered here, or goes on unlimited.
    fn limited<'c, H: Host + ?Sized>(
        &mut self,
        c: &'c Compiled,
        host: &H,
        tenant: &'c tenant::Read,
    ) -> ControlFlow<Next, (Limited<'c>, u32)> {
        let mut limited = match first_step(c, tenant) {
            Step::AllowMissingTenant => {
                host.count(Counter::MissingTenant);
                return Break(Next::Continue);
            }
            Step::DenyMissingTenant => {
                host.count(Counter::MissingTenant);
                record(host, None, None, false, DecidedBy::MissingTenant);
                return Break(local_reply(host, 429, &[], "missing tenant header\n"));
            }
            Step::TenantTooLong => {
                host.count(Counter::TenantTooLong);
                record(host, None, None, false, DecidedBy::TenantTooLong);
                return Break(local_reply(
                    host,
                    431,
                    &[],
                    "tenant header value too long\n",
                ));
            }
            Step::RepeatedTenant => {
                host.count(Counter::TenantRepeated);
                record(host, None, None, false, DecidedBy::TenantRepeated);
                let body = "tenant header sent more than once\n";
                return Break(local_reply(host, 400, &[], body));
            }
            Step::NotLimited => return Break(Next::Continue),
            Step::Limit(limited) => limited,
        };
        // A hostcall per request only for the tenants of groups with routes.
        if !limited.group.routes.is_empty() {
            match host.route_name() {
                Ok(Some(name)) => {
                    let mut routes = limited.group.routes.iter().enumerate();
                    if let Some((i, r)) = routes.find(|(_, r)| r.name.as_bytes() == name) {
                        host.count_route(limited.group_id, i);
                        limited.route = Some(r);
                    }
                }
                Ok(None) => {}
                Err(e) => log::debug!("the route's name not read: {e}"),
            }
        }
        let cost = match request_cost(c, host) {
            Ok(cost) => cost,
            Err(CostError::Invalid(why)) => {
                host.count(Counter::CostInvalid);
                return Break(local_reply(host, 400, &[], &why));
            }
            Err(CostError::Host(e)) => {
                return Break(self.on_failure(c, host, Some(&RlsError::Host(e))))
            }
        };
        self.tenant = Some(limited.tenant.to_string());
        self.cost = cost;
        self.group = Some(limited.group_id);
        self.shadow = c.config.shadowed(limited.group);
        Continue((limited, cost))
    }

    /// Asks the service for `hits` hits of the request, whose answer leaves
    /// `settle` in the tenant's slot (`slots`: None when the local layer is
    /// off): paused until the answer, unless the call is over before it
    /// was sent.
    fn ask<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        req: &Request<'_, '_>,
        (settle, slots): (Settle, Option<Slots>),
        hits: u32,
    ) -> Next {
        let owner = Owner::Stream {
            id: Some(self.id),
            settle,
            slots,
        };
        let limited = req.limited;
        let route = limited.route.map(|r| r.name.clone());
        let tenant = self.tenant.clone().unwrap_or_default();
        let group = limited.group_id;
        let part = Part::new(c, owner, group, (tenant, route), hits, req.now_ms);
        let done = vm.batch.ask(c, host, part);
        match finish(c, host, vm, done, Some(self.id)) {
            None => Next::Pause,
            // Over before it was sent: the call could not go out.
            Some(answer) => self.act_on_answer(c, host, vm, answer),
        }
    }

    /// The service's answer for this request (or why there is none), as
    /// the root split it out of its call's: the request was paused since
    /// its headers, and is resumed unless a local reply went out. What the
    /// answer leaves for the tenant (its lease or sync view, the fallback's
    /// entry, a refusal in the over-limit cache) was stored before
    /// (`answer_path::finish`).
    pub fn on_answer<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        answer: Result<Answer, RlsError>,
    ) {
        if self.act_on_answer(c, host, vm, answer) == Next::Continue {
            if let Err(e) = host.resume_request() {
                log::error!("cannot resume a request paused for the service: {e}");
            }
        }
    }

    /// The verdict on the service's answer: admitted (headers kept),
    /// refused (a 429), or the limiter failed.
    fn act_on_answer<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        answer: Result<Answer, RlsError>,
    ) -> Next {
        let Decision {
            verdict,
            to_client,
            to_upstream,
            dropped,
        } = verdict_of(c.config.headers, answer);
        if dropped > 0 {
            log::debug!("{dropped} of the service's headers were not forwarded");
        }
        let no_rule = match &verdict {
            Verdict::Allow(_, statuses) | Verdict::OverLimit(_, statuses) => {
                decision::no_rule(statuses)
            }
            Verdict::Error(_) => None,
        };
        if let (Some(index), Some(group)) = (no_rule, self.group) {
            let tenant = self.tenant.as_deref().unwrap_or_default();
            health::no_rule(c, host, &vm.no_rule_warnings, group, index, tenant);
        }
        match verdict {
            Verdict::Allow(headers, statuses) => {
                host.count(Counter::Allowed);
                self.charge_armed = true;
                if let Some(group) = self.group {
                    host.count_group(group, GroupCounter::Admitted);
                    if near_limit(&statuses, c.config.near_limit_ppm) {
                        host.count_group(group, GroupCounter::NearLimit);
                    }
                }
                self.response_headers = headers;
                self.forwarded = to_client;
                for (name, value) in &to_upstream {
                    if let Err(e) = host.add_request_header(name, value) {
                        log::debug!("a header of the service not added: {e}");
                    }
                }
                Next::Continue
            }
            Verdict::OverLimit(headers, _) => {
                // In shadow the request goes upstream, counted.
                self.charge_armed = self.shadow;
                self.refuse(c, host, DecidedBy::Service, headers, to_client)
            }
            Verdict::Error(RlsError::BreakerOpen) => self.on_failure(c, host, None),
            Verdict::Error(why) => self.on_failure(c, host, Some(&why)),
        }
    }

    /// A refusal by the service, the cache or the bucket: a 429, or in
    /// shadow counted and let through with the rate-limit headers an
    /// admitted request gets (all but Retry-After).
    fn refuse<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        source: DecidedBy,
        mut headers: Vec<(&'static str, String)>,
        service: Vec<(String, String)>,
    ) -> Next {
        if let (false, Some(counter)) = (self.shadow, source.counter()) {
            host.count(counter);
        }
        let group = self.group;
        if let (Some(g), Some(counter)) = (group, source.group_counter(self.shadow)) {
            host.count_group(g, counter);
        }
        let tenant = self.tenant.as_deref();
        record(host, tenant, self.group_name(c), self.shadow, source);
        if self.shadow {
            headers.retain(|(name, _)| *name != RETRY_AFTER);
            self.response_headers = headers;
            self.forwarded = service;
            return Next::Continue;
        }
        over_limit_reply_with(host, &headers, &service)
    }

    /// The service cannot decide: the call failed (`why`, counted in
    /// `rls_error`), or the breaker is open (None). `on_failure` decides:
    /// let it through, refuse it with `status_on_error`, or ask the local
    /// fallback for the tenant's share (a request whose tenant is not known
    /// yet, or whose fallback entry another tenant holds, is let through).
    fn on_failure<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        why: Option<&RlsError>,
    ) -> Next {
        if let Some(why) = why {
            host.count(Counter::RlsError);
            log::debug!("limiter error: {why}");
        }
        let decided = match (c.config.on_failure, self.group, self.slot) {
            (OnFailure::Deny, ..) => {
                host.count(Counter::FailureModeDenied);
                let tenant = self.tenant.as_deref();
                record(
                    host,
                    tenant,
                    self.group_name(c),
                    false,
                    DecidedBy::LimiterError,
                );
                let status = u32::from(c.config.status_on_error);
                return local_reply(host, status, &[], "rate limiter unavailable\n");
            }
            (OnFailure::Local, Some(group), Some(at)) => {
                fallback::on_request(c.fallback(group), host, at, self.cost.max(1))
            }
            _ => FallbackDecision::Contended,
        };
        let group = self.group;
        match decided {
            FallbackDecision::Admit => {
                host.count(Counter::FallbackAllowed);
                if let Some(g) = group {
                    host.count_group(g, GroupCounter::Admitted);
                    host.count_group(g, GroupCounter::FallbackAdmitted);
                }
                let tenant = self.tenant.as_deref();
                record_admitted(host, tenant, self.group_name(c), DecidedBy::Fallback);
                Next::Continue
            }
            FallbackDecision::Refuse { retry_after_s } => {
                let headers = vec![(RETRY_AFTER, retry_after_s.to_string())];
                self.refuse(c, host, DecidedBy::Fallback, headers, Vec::new())
            }
            FallbackDecision::Contended => {
                host.count(Counter::FailureModeAllowed);
                if let Some(g) = group {
                    host.count_group(g, GroupCounter::FailedOpen);
                }
                Next::Continue
            }
        }
    }

    fn group_name<'c>(&self, c: &'c Compiled) -> Option<&'c str> {
        self.group.and_then(|g| c.group_name(g))
    }

    /// The upstream's response headers have arrived (also for the filter's
    /// own local replies, which carry their headers already). A cost the
    /// upstream reports in them is charged at once.
    pub fn on_response_headers<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
    ) -> Next {
        for (name, value) in self.response_headers.drain(..) {
            add_response_header(host, name, &value);
        }
        for (name, value) in self.forwarded.drain(..) {
            add_response_header(host, &name, &value);
        }
        if let (true, Some(rc)) = (self.charge_armed, &c.config.response_cost) {
            let found = host.response_header(&rc.header);
            self.response_cost(c, host, vm, found);
        }
        Next::Continue
    }

    /// The upstream's response trailers have arrived (gRPC, streamed
    /// responses): a cost the headers did not carry is charged from them.
    pub fn on_response_trailers<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
    ) -> Next {
        if let (true, Some(rc)) = (self.charge_armed, &c.config.response_cost) {
            let found = host.response_trailer(&rc.header);
            self.response_cost(c, host, vm, found);
        }
        Next::Continue
    }

    /// The response's cost field, as read: charged once, when there is one
    /// (the headers' wins over the trailers').
    fn response_cost<H: Host + ?Sized>(
        &mut self,
        c: &Compiled,
        host: &H,
        vm: &Vm,
        found: Result<Option<Vec<u8>>, HostError>,
    ) {
        let value = match found {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => return log::debug!("the response's cost not read: {e}"),
        };
        self.charge_armed = false;
        let Some(call) = self.charge.take() else {
            return;
        };
        // Sent now, not on a later tick: the tenant's next request, which
        // may follow at once on the same connection, meets the charge.
        if let Some(call) = charge_response(c, host, &vm.cost_warnings, *call, &value) {
            let done = vm.batch.ask(c, host, Part::tenant(c, call, host.now_ms()));
            finish(c, host, vm, done, None);
        }
    }
}

/// The charge a response's cost will queue for this request, with
/// `response_cost_header` (None without): on its descriptors (the group's,
/// and its route's), `hits` what the request was charged. Without the
/// local layer, the slots are none (fingerprint 0).
fn charge_for(
    c: &Compiled,
    limited: &Limited<'_>,
    slots: Option<Slots>,
    cost: u32,
) -> Option<Box<TenantCall>> {
    const NO_SLOT: SlotRef = SlotRef {
        index: 0,
        fingerprint: 0,
    };
    c.config.response_cost.as_ref()?;
    let route_at = slots.and_then(|s| s.on_route).unwrap_or(NO_SLOT);
    Some(Box::new(TenantCall {
        kind: CallKind::Charge,
        group: limited.group_id,
        tenant: limited.tenant.to_string(),
        slot: slots.map_or(NO_SLOT, |s| s.own),
        hits: cost,
        route: limited.route.map(|r| OnRoute {
            name: r.name.clone(),
            slot: route_at,
        }),
    }))
}

fn add_response_header<H: Host + ?Sized>(host: &H, name: &str, value: &str) {
    if let Err(e) = host.add_response_header(name, value) {
        log::debug!("a response header not added: {e}");
    }
}

/// A 429 for the limiter, with these headers and the service's own.
fn over_limit_reply_with<H: Host + ?Sized>(
    host: &H,
    headers: &[(&'static str, String)],
    service: &[(String, String)],
) -> Next {
    let mut h: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + service.len() + 1);
    h.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
    h.extend(service.iter().map(|(k, v)| (k.as_str(), v.as_str())));
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
            log::error!("cannot send a local reply: {e}");
            Next::Continue
        }
    }
}

#[cfg(test)]
mod tests;
