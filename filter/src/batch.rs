//! One worker's calls to the rate-limit service, batched: the requests
//! that must ask the service and the root's calls about tenants (lease
//! refills, sync pushes) are parts (`Part`) of calls, and one call carries
//! many of them. Pure: the host through the ports, time read through them.
//!
//! - **At once, or queued** (`Batcher::ask`): while fewer than
//!   `rate_limit_service.batch.max_in_flight` calls of the worker are under
//!   way, a request's call goes at once (with whatever is queued); while
//!   they are, it queues, and the queue goes as one call when an answer
//!   comes back (`answered`), or as soon as it holds `max_descriptors`
//!   descriptors. A call holds whole parts. `"batch": false`, or a service
//!   found unable to answer a batch, sends one part per call.
//! - **The root's tick** (`tick`): everything due (lease refills, sync
//!   pushes) joins the queue and the whole queue goes, in calls of at most
//!   `max_descriptors`, whatever is under way.
//! - **The answer** (`answered`): the token finds the call; its answer is
//!   decoded once and split back: each part gets its own descriptors'
//!   statuses, and is over the limit if any of them is (and the answer as a
//!   whole says so, which a global shadow mode of the service does not).
//!   The service's own headers describe a whole call: only a call of one
//!   part passes them on. A failed call fails each of its parts.
//! - **Deadlines**: no part waits longer than `timeout_ms` in total: a call
//!   is given the time its most urgent part has left, a queued part whose
//!   time is up fails (`RlsError::Expired`), and a call whose answer never
//!   came is taken as failed a second past its deadline (`sweep`). A queued
//!   part always has a call under way that ends before its own deadline,
//!   so it goes before its time is up.
//! - **The breaker** (`breaker`): every call is gated where it goes
//!   (`send`): while the breaker is open a call that is not its probe is
//!   not made, and each of its parts fails with `RlsError::BreakerOpen`
//!   (settled as a failed call; a request gets `on_failure`). A call is one
//!   outcome for the breaker, however many parts it carries: its answer
//!   (`answered`), a dispatch that failed, or a lost call (`sweep`).
//! - **A stream that ends** (`forget_stream`): its queued part is dropped,
//!   nothing is sent for it; a part of a call under way is still settled
//!   (its lease or sync answer stored), its answer delivered to nobody.
//! - **A service without per-descriptor statuses** (Kuadrant's Limitador
//!   answers with the overall code only): a batch's answer cannot be split.
//!   Found from the answer (the statuses do not match the descriptors
//!   sent), counted (`batch_unsplittable`) and logged once per worker;
//!   from then on one part per call. The parts of that answer: admitted if
//!   it said OK, sent again one by one if it said OVER_LIMIT (which of them
//!   was over cannot be known).
//!
//! What becomes of a finished part (`Done`) is the caller's: `answer_path::finish`
//! settles what it leaves in the tenant's slot, and hands a request's
//! answer to its stream through the outbox (`Delivery`), which the glue
//! delivers after the callback, acting for that stream.

use std::cell::{Cell, RefCell};

use crate::answer::{decode, Answer, RlsError};
use crate::breaker::{self, Gate};
use crate::compiled::Compiled;
use crate::counters::Counter;
use crate::decision::tenant_message;
use crate::group::GroupId;
use crate::health::{self, LogThrottle};
use crate::host::Host;
use crate::id_map::IdMap;
use crate::local::{SlotRef, Slots};
use crate::proto::{encode_batch_request, Code, RateLimitResponse, METHOD, SERVICE};
use ratelimit_config::model::{RequestDescriptors, Service};
use ratelimit_config::rls::{PUSH, REQUEST_MARK};

/// The most parts a worker keeps queued; one more fails at once
/// (`RlsError::QueueFull`). A full call goes as soon as the queue holds
/// `max_descriptors` descriptors, so only a tick's work comes near it.
pub const MAX_QUEUED_PARTS: usize = 4_096;

/// A call whose answer has not come this long after its deadline is taken
/// as failed (Envoy answers a timed-out call with status 14 itself).
pub const LOST_CALL_MS: u64 = 1_000;

/// Why the root calls the service about a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Lease mode: reserve a batch of `hits` tokens for the tenant's lease.
    Refill,
    /// Sync mode: the tenant's `hits` admitted since the last push.
    Push,
    /// A response's cost (`response_cost_header`): the `hits` it cost
    /// beyond what its request was charged, on the request's descriptors
    /// (the group's, and its route's). Nothing waits for the answer.
    Charge,
}

/// A call to the service about one tenant of a group, from the root: its
/// descriptors, each counting `hits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantCall {
    pub kind: CallKind,
    pub group: GroupId,
    pub tenant: String,
    /// The tenant's slot (not used when the local layer is off).
    pub slot: SlotRef,
    pub hits: u32,
    /// A charge's route, when the request's route had limits of its own:
    /// its descriptors follow the group's in the call.
    pub route: Option<OnRoute>,
}

/// The route a call is also about, and the slot of the tenant's state on
/// that route (not used when the local layer is off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnRoute {
    pub name: String,
    pub slot: SlotRef,
}

impl TenantCall {
    /// The message of this call sent alone; None if the configuration has
    /// no such group (or the group no such route).
    pub fn message(&self, c: &Compiled) -> Option<Vec<u8>> {
        let route = self.route.as_ref().map(|r| r.name.as_str());
        tenant_message(c, self.group, &self.tenant, route, self.hits)
    }
}

/// What a request's answer leaves in its tenant's slot, besides the
/// verdict (settled whether or not its stream is still there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Nothing (exact mode, or no slot).
    Nothing,
    /// A lease's batch: `batch` hits asked, the first the request's own.
    Lease { slot: SlotRef, batch: u32 },
    /// A sync view, refreshed by the answer to the request's own hit.
    Sync { slot: SlotRef },
}

/// Who a part is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A request paused for the answer: its stream's context id (None once
    /// the stream has ended: the answer is settled, delivered to nobody),
    /// and the tenant's slots (None: the local layer is off), where the
    /// answer's refusal is remembered.
    Stream {
        id: Option<u32>,
        settle: Settle,
        slots: Option<Slots>,
    },
    /// The root's call about the tenant in `slot` (and, for a charge, its
    /// state on the route in `route_slot`).
    Root {
        kind: CallKind,
        slot: SlotRef,
        route_slot: Option<SlotRef>,
    },
}

/// One request's (or one tenant call's) share of a call: the descriptors
/// of `tenant`'s group, each counting `hits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub owner: Owner,
    pub group: GroupId,
    pub tenant: String,
    /// The route whose descriptors follow the group's (a request on a
    /// route with limits of its own, a charge for one).
    pub route: Option<String>,
    pub hits: u32,
    /// How many descriptors it sends (its group's units, then its
    /// route's): the split of the answer takes this many statuses for it.
    pub descriptors: usize,
    /// When it was asked (a lease's and a sync view's window).
    pub asked_at_ms: u64,
    /// When its wait ends: asked + `timeout_ms`.
    pub deadline_ms: u64,
}

impl Part {
    /// A part of `c`'s group `group` (and `route`) for `owner`, asked at
    /// `now_ms`.
    pub fn new(
        c: &Compiled,
        owner: Owner,
        group: GroupId,
        (tenant, route): (String, Option<String>),
        hits: u32,
        now_ms: u64,
    ) -> Part {
        Part {
            owner,
            group,
            descriptors: c.descriptor_count(group, route.as_deref()),
            tenant,
            route,
            hits,
            asked_at_ms: now_ms,
            deadline_ms: now_ms.saturating_add(u64::from(c.config.timeout_ms)),
        }
    }

    /// The root's call `t`, asked at `now_ms`.
    pub fn tenant(c: &Compiled, t: TenantCall, now_ms: u64) -> Part {
        let (route, route_at) = match t.route {
            Some(r) => (Some(r.name), Some(r.slot)),
            None => (None, None),
        };
        let owner = Owner::Root {
            kind: t.kind,
            slot: t.slot,
            route_slot: route_at,
        };
        Part::new(c, owner, t.group, (t.tenant, route), t.hits, now_ms)
    }

    /// The root's call this part is (None: a request's).
    pub fn call(&self) -> Option<TenantCall> {
        let Owner::Root {
            kind,
            slot: at,
            route_slot: route_at,
        } = self.owner
        else {
            return None;
        };
        let route = self.route.clone().zip(route_at);
        Some(TenantCall {
            kind,
            group: self.group,
            tenant: self.tenant.clone(),
            slot: at,
            hits: self.hits,
            route: route.map(|(name, at)| OnRoute { name, slot: at }),
        })
    }

    /// Whether it is a sync push or a response's cost: hits admitted or
    /// served already, to be counted whatever the limits.
    fn pushes(&self) -> bool {
        matches!(
            self.owner,
            Owner::Root {
                kind: CallKind::Push | CallKind::Charge,
                ..
            }
        )
    }

    /// The stream this part's answer goes to (None: the root's, or the
    /// stream has ended).
    pub fn stream(&self) -> Option<u32> {
        match self.owner {
            Owner::Stream { id, .. } => id,
            Owner::Root { .. } => None,
        }
    }
}

/// A part whose call is over: the service's answer for it alone, or why
/// there is none.
#[derive(Clone, Debug, PartialEq)]
pub struct Done {
    pub part: Part,
    pub answer: Result<Answer, RlsError>,
}

/// A request's answer, for the glue to deliver to its stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub stream: u32,
    pub answer: Result<Answer, RlsError>,
}

/// A call under way.
#[derive(Debug)]
struct Flight {
    parts: Vec<Part>,
    sent_ms: u64,
    deadline_ms: u64,
}

/// How much of the queue goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flush {
    /// Everything, in calls of at most `max_descriptors`.
    All,
    /// Only full calls: the rest waits for an answer.
    Full,
}

/// Takes the parts `gone` picks out of `q`, the others kept in order (one
/// body for every caller).
fn take_parts(q: &mut Vec<Part>, gone: &dyn Fn(&Part) -> bool) -> Vec<Part> {
    let (out, kept): (Vec<Part>, Vec<Part>) = q.drain(..).partition(|p| gone(p));
    *q = kept;
    out
}

/// One worker's calls: the queue, the calls under way by token, and the
/// answers waiting for the glue to deliver. Interior mutability, borrowed
/// only within one method: the flow and the root share it through `Vm`.
#[derive(Debug, Default)]
pub struct Batcher {
    queue: RefCell<Vec<Part>>,
    /// By token.
    in_flight: RefCell<IdMap<u32, Flight>>,
    outbox: RefCell<Vec<Delivery>>,
    /// The service answered a batch without per-descriptor statuses: one
    /// part per call from then on.
    unsplittable: Cell<bool>,
    /// The "cannot call the service" warnings (`health::dispatch_failed`).
    pub warnings: LogThrottle,
    /// What this worker last read of the breaker (`breaker::Cache`).
    pub breaker: breaker::Cache,
    /// The fleet's sizes this worker last wrote (`fleet::Written`).
    pub fleet: crate::fleet::Written,
}

impl Batcher {
    /// Calls under way.
    pub fn in_flight(&self) -> usize {
        self.in_flight.try_borrow().map_or(0, |f| f.len())
    }

    /// Parts queued for the next call.
    pub fn queued(&self) -> usize {
        self.queue.try_borrow().map_or(0, |q| q.len())
    }

    /// Whether the service was found unable to answer a batch.
    pub fn unsplittable(&self) -> bool {
        self.unsplittable.get()
    }

    /// The token of the call under way that carries stream `id`'s part.
    pub fn token_for(&self, id: u32) -> Option<u32> {
        let f = self.in_flight.try_borrow().ok()?;
        f.iter()
            .find(|(_, fl)| fl.parts.iter().any(|p| p.stream() == Some(id)))
            .map(|(t, _)| *t)
    }

    /// The tokens of the calls under way, in the order they were sent.
    pub fn tokens(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self
            .in_flight
            .try_borrow()
            .map(|f| f.keys().copied().collect())
            .unwrap_or_default();
        t.sort_unstable();
        t
    }

    /// The parts of the call under way under `token`, in order.
    pub fn parts_of(&self, token: u32) -> Vec<Part> {
        self.in_flight
            .try_borrow()
            .ok()
            .and_then(|f| f.get(&token).map(|fl| fl.parts.clone()))
            .unwrap_or_default()
    }

    /// A request's part: sent at once while fewer than `max_in_flight`
    /// calls are under way, else queued (sent when an answer comes back, or
    /// when the queue fills a call). Returns the parts that are over already
    /// (expired, or in a call that could not be sent), this one included if
    /// it is.
    pub fn ask<H: Host + ?Sized>(&self, c: &Compiled, host: &H, part: Part) -> Vec<Done> {
        // The part was made in this callback, at its clock.
        let now = part.asked_at_ms;
        let mut done = self.sweep(c, host, now);
        if !self.batching(c) {
            self.send(c, host, vec![part], now, &mut done);
            return done;
        }
        let full = {
            let Ok(mut q) = self.queue.try_borrow_mut() else {
                done.push(failed(part, RlsError::Busy));
                return done;
            };
            if q.len() >= MAX_QUEUED_PARTS {
                drop(q);
                done.push(failed(part, RlsError::QueueFull));
                return done;
            }
            q.push(part);
            descriptors(&q) >= max_descriptors(c)
        };
        let max_in_flight = usize::try_from(c.config.batch.max_in_flight).unwrap_or(usize::MAX);
        if self.in_flight() < max_in_flight {
            self.flush(c, host, Flush::All, now, &mut done);
        } else {
            host.count(Counter::BatchQueued);
            if full {
                self.flush(c, host, Flush::Full, now, &mut done);
            }
        }
        done
    }

    /// The root's tick: `parts` (the refills and pushes due) join the
    /// queue, and the whole queue goes.
    pub fn tick<H: Host + ?Sized>(&self, c: &Compiled, host: &H, parts: Vec<Part>) -> Vec<Done> {
        let now = host.now_ms();
        let mut done = self.sweep(c, host, now);
        if !self.batching(c) {
            for part in parts {
                self.send(c, host, vec![part], now, &mut done);
            }
            return done;
        }
        match self.queue.try_borrow_mut() {
            Ok(mut q) => {
                let room = MAX_QUEUED_PARTS.saturating_sub(q.len());
                let mut parts = parts.into_iter();
                q.extend(parts.by_ref().take(room));
                done.extend(parts.map(|p| failed(p, RlsError::QueueFull)));
            }
            Err(_) => done.extend(parts.into_iter().map(|p| failed(p, RlsError::Busy))),
        }
        self.flush(c, host, Flush::All, now, &mut done);
        done
    }

    /// The answer to the call sent under `token` (`grpc_status` not 0: it
    /// failed), `body_size` bytes of body: its parts, each with its share;
    /// then the queue goes. A token this worker did not send is ignored.
    pub fn answered<H: Host + ?Sized>(
        &self,
        c: &Compiled,
        host: &H,
        token: u32,
        grpc_status: u32,
        body_size: usize,
    ) -> Vec<Done> {
        let now = host.now_ms();
        let flight = self
            .in_flight
            .try_borrow_mut()
            .ok()
            .and_then(|mut f| f.remove(&token));
        let mut done = Vec::new();
        if let Some(flight) = flight {
            health::answered(host, flight.sent_ms, grpc_status);
            let body = if grpc_status == 0 {
                host.grpc_response(body_size).unwrap_or_else(|e| {
                    log::debug!("the service's answer not read: {e}");
                    None
                })
            } else {
                None
            };
            let answer = decode(grpc_status, body.as_deref());
            if let Ok(a) = &answer {
                let n = a.response.fleet_envoys;
                crate::fleet::heard(host, &self.fleet, &c.config.domain, n, now);
            }
            // One call, one outcome for the breaker, however many parts.
            breaker::record(c, host, &self.breaker, answer.as_ref().err(), now);
            let again = self.split(c, host, flight.parts, answer, &mut done);
            for part in again {
                self.send(c, host, vec![part], now, &mut done);
            }
        }
        done.extend(self.sweep(c, host, now));
        self.flush(c, host, Flush::All, now, &mut done);
        done
    }

    /// The stream `id` has ended: its queued part is dropped (returned, for
    /// what it holds to be released), its part of a call under way goes to
    /// nobody.
    pub fn forget_stream(&self, id: u32) -> Vec<Part> {
        let mine = |p: &Part| p.stream() == Some(id);
        let mut dropped = Vec::new();
        if let Ok(mut q) = self.queue.try_borrow_mut() {
            if q.iter().any(mine) {
                dropped = take_parts(&mut q, &mine);
            }
        }
        if let Ok(mut f) = self.in_flight.try_borrow_mut() {
            for part in f.values_mut().flat_map(|f| f.parts.iter_mut()) {
                if let Owner::Stream { id: stream, .. } = &mut part.owner {
                    if *stream == Some(id) {
                        *stream = None;
                    }
                }
            }
        }
        dropped
    }

    /// Hands a request's answer to the glue, to deliver to its stream.
    pub fn deliver(&self, d: Delivery) {
        if let Ok(mut o) = self.outbox.try_borrow_mut() {
            o.push(d);
        }
    }

    /// The answers to deliver, oldest first.
    pub fn take_deliveries(&self) -> Vec<Delivery> {
        self.outbox
            .try_borrow_mut()
            .map(|mut o| std::mem::take(&mut *o))
            .unwrap_or_default()
    }

    fn batching(&self, c: &Compiled) -> bool {
        c.config.batch.enabled && !self.unsplittable.get()
    }

    /// Expired queued parts, and the parts of calls whose answer never came
    /// (each such call a failed one for the breaker).
    fn sweep<H: Host + ?Sized>(&self, c: &Compiled, host: &H, now: u64) -> Vec<Done> {
        let mut done = Vec::new();
        if let Ok(mut q) = self.queue.try_borrow_mut() {
            if q.iter().any(|p| p.deadline_ms <= now) {
                let expired = take_parts(&mut q, &|p: &Part| p.deadline_ms <= now);
                done.extend(expired.into_iter().map(|p| failed(p, RlsError::Expired)));
            }
        }
        if let Ok(mut f) = self.in_flight.try_borrow_mut() {
            let lost = |fl: &Flight| fl.deadline_ms.saturating_add(LOST_CALL_MS) <= now;
            if f.values().any(lost) {
                let tokens: Vec<u32> = f
                    .iter()
                    .filter(|(_, fl)| lost(fl))
                    .map(|(t, _)| *t)
                    .collect();
                for fl in tokens.iter().filter_map(|t| f.remove(t)) {
                    let why = RlsError::Expired;
                    breaker::record(c, host, &self.breaker, Some(&why), now);
                    done.extend(fl.parts.into_iter().map(|p| failed(p, why.clone())));
                }
            }
        }
        done
    }

    /// Sends the queue (all of it, or its full calls only).
    fn flush<H: Host + ?Sized>(
        &self,
        c: &Compiled,
        host: &H,
        how: Flush,
        now: u64,
        done: &mut Vec<Done>,
    ) {
        let max = max_descriptors(c);
        loop {
            let call = {
                let Ok(mut q) = self.queue.try_borrow_mut() else {
                    return;
                };
                let queued = descriptors(&q);
                if queued == 0 || (how == Flush::Full && queued < max) {
                    return;
                }
                // Whole parts, at least one, up to `max` descriptors.
                let mut n = 0;
                let mut size = 0;
                for p in q.iter() {
                    if n > 0 && size + p.descriptors > max {
                        break;
                    }
                    size += p.descriptors;
                    n += 1;
                }
                q.drain(..n).collect::<Vec<Part>>()
            };
            self.send(c, host, call, now, done);
        }
    }

    /// Sends `parts` as one call, given the time its most urgent part has
    /// left; a call that cannot be sent fails every part, and so does one
    /// the open breaker keeps in (`RlsError::BreakerOpen`: no call failed).
    /// A probe of the open breaker may be a call of many parts.
    fn send<H: Host + ?Sized>(
        &self,
        c: &Compiled,
        host: &H,
        parts: Vec<Part>,
        now: u64,
        done: &mut Vec<Done>,
    ) {
        let deadline = parts.iter().map(|p| p.deadline_ms).min().unwrap_or(now);
        if deadline <= now {
            done.extend(parts.into_iter().map(|p| failed(p, RlsError::Expired)));
            return;
        }
        let Some(message) = message(c, &parts) else {
            // A group the configuration does not have (never: the parts
            // come from this configuration).
            done.extend(parts.into_iter().map(|p| failed(p, RlsError::NoGroup)));
            return;
        };
        if breaker::may_call(c, host, &self.breaker, now, parts.len()) == Gate::Fallback {
            done.extend(parts.into_iter().map(|p| failed(p, RlsError::BreakerOpen)));
            return;
        }
        let timeout = u32::try_from(deadline - now).unwrap_or(u32::MAX);
        match host.dispatch_grpc(&c.upstream, SERVICE, METHOD, &message, timeout) {
            Ok(token) => {
                let sent = parts.iter().map(|p| p.descriptors).sum::<usize>();
                host.add(Counter::RlsDescriptors, sent as u64);
                let flight = Flight {
                    parts,
                    sent_ms: now,
                    deadline_ms: deadline,
                };
                match self.in_flight.try_borrow_mut() {
                    Ok(mut f) => {
                        f.insert(token, flight);
                    }
                    Err(_) => {
                        done.extend(flight.parts.into_iter().map(|p| failed(p, RlsError::Busy)))
                    }
                }
            }
            Err(e) => {
                health::dispatch_failed(c, host, &self.warnings, &e);
                let why = RlsError::Host(e);
                breaker::record(c, host, &self.breaker, Some(&why), now);
                done.extend(parts.into_iter().map(|p| failed(p, why.clone())));
            }
        }
    }

    /// The answer of a call, split back per part (a mark's own status,
    /// before each part of a call to the counter, skipped); returns the
    /// parts to send again, one per call (an OVER_LIMIT batch answer
    /// without statuses).
    fn split<H: Host + ?Sized>(
        &self,
        c: &Compiled,
        host: &H,
        parts: Vec<Part>,
        answer: Result<Answer, RlsError>,
        done: &mut Vec<Done>,
    ) -> Vec<Part> {
        let marks = marked(c, &parts);
        let answer = match answer {
            Err(e) => {
                done.extend(parts.into_iter().map(|p| failed(p, e.clone())));
                return Vec::new();
            }
            Ok(a) if parts.len() == 1 && !marks => {
                done.extend(parts.into_iter().map(|part| Done {
                    part,
                    answer: Ok(a.clone()),
                }));
                return Vec::new();
            }
            Ok(a) => a,
        };
        let sent: usize = descriptors(&parts) + if marks { parts.len() } else { 0 };
        if answer.response.statuses.len() != sent {
            if !self.unsplittable.replace(true) {
                host.count(Counter::BatchUnsplittable);
                log::warn!(
                    "the rate-limit service answered a call of {} requests with {} statuses for {sent} descriptors: \
                     it cannot answer batches; this worker sends one request per call from now on",
                    parts.len(),
                    answer.response.statuses.len()
                );
            }
            // (A push alone is not sent again: it would be marked again.)
            if answer.over_limit && parts.len() > 1 {
                return parts;
            }
            done.extend(parts.into_iter().map(|part| Done {
                part,
                answer: Ok(share(answer.over_limit, Vec::new())),
            }));
            return Vec::new();
        }
        let mut statuses = answer.response.statuses.into_iter();
        for part in parts {
            if marks {
                // The mark's own OK.
                statuses.next();
            }
            let own: Vec<_> = statuses.by_ref().take(part.descriptors).collect();
            let over = answer.over_limit && own.iter().any(|s| s.code() == Code::OverLimit);
            done.push(Done {
                part,
                answer: Ok(share(over, own)),
            });
        }
        Vec::new()
    }
}

/// A part's own answer out of a batch's: its statuses, none of the
/// service's headers (they describe the whole call).
fn share(over_limit: bool, statuses: Vec<crate::proto::DescriptorStatus>) -> Answer {
    let code = if over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    };
    Answer {
        over_limit,
        response: RateLimitResponse {
            overall_code: code as i32,
            statuses,
            ..RateLimitResponse::default()
        },
    }
}

fn failed(part: Part, why: RlsError) -> Done {
    Done {
        part,
        answer: Err(why),
    }
}

fn descriptors(parts: &[Part]) -> usize {
    parts.iter().map(|p| p.descriptors).sum()
}

fn max_descriptors(c: &Compiled) -> usize {
    usize::try_from(c.config.batch.max_descriptors)
        .unwrap_or(usize::MAX)
        .max(1)
}

/// The mark that begins a request in a call to the counter
/// ([`REQUEST_MARK`]), a descriptor of one entry (its value empty, left out
/// on the wire): the counter decides each request of a call as a whole,
/// admitted only if all of its windows admit it, and a call without marks
/// is one request.
const MARK: &[(&str, &str)] = &[(REQUEST_MARK, "")];

/// The mark of a sync push or a response's cost: hits admitted (served)
/// already, which the counter counts on every window whatever the limits
/// (an ordinary request it refuses whole when it would cross one),
/// answering the counts.
const PUSH_MARK: &[(&str, &str)] = &[(REQUEST_MARK, PUSH)];

/// Whether a call of `parts` marks where each begins: a call to the
/// counter of several parts, or of a push. envoyproxy/ratelimit, which has
/// no rule for the mark and would not decide the requests apart, never
/// gets one (it counts a push's hits whatever the limits).
fn marked(c: &Compiled, parts: &[Part]) -> bool {
    c.config.service == Service::Counter && (parts.len() > 1 || parts.iter().any(Part::pushes))
}

/// The message of a call of `parts`: one part as every call was before
/// batching (its hits request-wide, left out for 1), several with each
/// descriptor's own hits, and, to the counter, a mark before each part (a
/// push's own, even alone). None if a part's group is not in the
/// configuration.
fn message(c: &Compiled, parts: &[Part]) -> Option<Vec<u8>> {
    let marks = marked(c, parts);
    if let ([p], false) = (parts, marks) {
        // Left out for 1 (it counts 1), as every call was before batching.
        let hits = if p.hits == 1 { 0 } else { p.hits };
        return tenant_message(c, p.group, &p.tenant, p.route.as_deref(), hits);
    }
    let key = c.config.descriptor_key.as_str();
    let sets = parts
        .iter()
        .map(|p| {
            let g = c.group(p.group)?;
            let route = match p.route.as_deref() {
                Some(name) => Some(g.route(name.as_bytes())?),
                None => None,
            };
            Some((RequestDescriptors::new(g, route, key, &p.tenant), p.hits))
        })
        .collect::<Option<Vec<_>>>()?;
    let mut all: Vec<(&[(&str, &str)], u32)> = Vec::with_capacity(descriptors(parts) + parts.len());
    for ((d, hits), p) in sets.iter().zip(parts) {
        if marks {
            all.push((if p.pushes() { PUSH_MARK } else { MARK }, 1));
        }
        all.extend(d.as_slice().iter().map(|(_, e)| (e.as_ref(), *hits)));
    }
    Some(encode_batch_request(&c.config.domain, || {
        all.iter().copied()
    }))
}

#[cfg(test)]
mod tests;
