//! The breaker: when the rate-limit service keeps failing, stop calling
//! it, answer every request at once from `on_failure`, and let one call
//! probe every `breaker.probe_interval_ms`; the first call answered closes
//! it. One per Envoy, shared by its workers through one shared-data value
//! (`key`), changed under CAS.
//!
//! The rule: `breaker.failures` failed calls in a row (errors or timeouts;
//! an answer, OK or OVER_LIMIT, resets the count). A run of failures, not a
//! ratio over a window: it opens after a few calls however low the traffic
//! is (a ratio needs enough calls to mean anything), one answer in between
//! keeps a service that only drops a call now and then in use, and it costs
//! a shared-data write only on a failure, never on the answers of a healthy
//! service.
//!
//! Each VM keeps how long it may take the breaker as closed with no failure
//! without reading it again (`Cache`, at most `TRUST_CLOSED_MS`): a healthy
//! service costs one shared-data read per worker per that long, not one
//! per request. While it is open every request reads it (a request then
//! makes no call, and the first one due claims the probe).
//!
//! `may_call` and `record` are the two hooks: where a call is about to go
//! out, and where its outcome is known (the flow's and the root's).

use std::cell::Cell;

use crate::answer::RlsError;
use crate::compiled::Compiled;
use crate::counters::{Counter, Gauge};
use crate::host::{Host, SharedData};
use crate::local::slot::{put, u32_at, u64_at};
use crate::local::{self, update_key, CAS_ATTEMPTS};

/// The breaker's shared-data key: one per plugin instance (its VM id).
pub fn key() -> &'static str {
    "trl.breaker"
}

/// How long a VM takes the breaker as closed, with no failure counted,
/// without reading it: another worker's opening is seen within this long
/// (or at this worker's own next failed call).
pub const TRUST_CLOSED_MS: u64 = 100;

/// The breaker as shared by the workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Failed calls in a row, while closed.
    pub failures: u32,
    /// When it opened (0: closed).
    pub opened_ms: u64,
    /// While open: when the next probe may go out.
    pub probe_at_ms: u64,
}

const VERSION: u8 = 1;
/// The encoded size: version, failures, opened, probe.
pub const STATE_BYTES: usize = 21;

impl State {
    pub fn is_open(&self) -> bool {
        self.opened_ms != 0
    }

    pub fn encode(&self) -> [u8; STATE_BYTES] {
        let mut b = [0u8; STATE_BYTES];
        put(&mut b, 0, &[VERSION]);
        put(&mut b, 1, &self.failures.to_le_bytes());
        put(&mut b, 5, &self.opened_ms.to_le_bytes());
        put(&mut b, 13, &self.probe_at_ms.to_le_bytes());
        b
    }

    /// Anything that is not a state of this version (the zeroed value it
    /// is created with, nothing at all) is a closed breaker.
    pub fn decode(b: Option<&[u8]>) -> State {
        let read = |b: &[u8]| {
            (b.len() == STATE_BYTES && b.first() == Some(&VERSION)).then_some(())?;
            Some(State {
                failures: u32_at(b, 1)?,
                opened_ms: u64_at(b, 5)?,
                probe_at_ms: u64_at(b, 13)?,
            })
        };
        b.and_then(read).unwrap_or_default()
    }
}

/// The breaker's settings (None: `breaker.enabled` false).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub failures: u32,
    pub probe_interval_ms: u64,
}

impl Params {
    pub fn of(c: &Compiled) -> Option<Params> {
        let b = &c.config.breaker;
        b.enabled.then_some(Params {
            failures: b.failures.max(1),
            probe_interval_ms: u64::from(b.probe_interval_ms),
        })
    }
}

/// Whether a call may go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Closed: call.
    Call,
    /// Open, and this call is the probe of this interval.
    Probe,
    /// Open: no call; the request gets `on_failure`.
    Fallback,
}

/// A change of the breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Opened,
    /// Closed after being open this long.
    Closed {
        open_ms: u64,
    },
}

/// Whether a call may go out at `now_ms`, and the state to write (a probe
/// claimed: the next one is due an interval later).
pub fn gate(s: State, p: &Params, now_ms: u64) -> (Gate, Option<State>) {
    if !s.is_open() {
        return (Gate::Call, None);
    }
    if now_ms < s.probe_at_ms {
        return (Gate::Fallback, None);
    }
    let claimed = State {
        probe_at_ms: now_ms.saturating_add(p.probe_interval_ms),
        ..s
    };
    (Gate::Probe, Some(claimed))
}

/// What a call's outcome (`failed`: it failed) does to the breaker at
/// `now_ms`: the state to write, if it changed, and the transition, if any.
pub fn settle(
    s: State,
    p: &Params,
    failed: bool,
    now_ms: u64,
) -> (Option<State>, Option<Transition>) {
    match (failed, s.is_open()) {
        // A failure while open (a probe, or a call sent before it opened)
        // changes nothing: the next probe is already scheduled.
        (true, true) => (None, None),
        (true, false) => {
            let failures = s.failures.saturating_add(1);
            if failures < p.failures {
                return (Some(State { failures, ..s }), None);
            }
            let opened = State {
                failures,
                opened_ms: now_ms.max(1),
                probe_at_ms: now_ms.saturating_add(p.probe_interval_ms),
            };
            (Some(opened), Some(Transition::Opened))
        }
        (false, false) if s.failures == 0 => (None, None),
        (false, false) => (Some(State::default()), None),
        (false, true) => {
            let open_ms = now_ms.saturating_sub(s.opened_ms);
            (Some(State::default()), Some(Transition::Closed { open_ms }))
        }
    }
}

/// What a VM remembers of the breaker between callbacks: until when it
/// takes it as closed with no failure, without reading it.
#[derive(Debug, Default)]
pub struct Cache {
    closed_until_ms: Cell<u64>,
}

impl Cache {
    fn trusted(&self, now_ms: u64) -> bool {
        now_ms < self.closed_until_ms.get()
    }

    fn learn(&self, s: &State, now_ms: u64) {
        let until = if s.is_open() || s.failures > 0 {
            0
        } else {
            now_ms.saturating_add(TRUST_CLOSED_MS)
        };
        self.closed_until_ms.set(until);
    }
}

/// What `update` does with the state it read: a trait of one method, not
/// `dyn FnMut` (whose vtable also holds a `call_once` copy of the closure,
/// never called).
trait Step {
    fn step(&mut self, s: State) -> Option<State>;
}

impl<F: FnMut(State) -> Option<State>> Step for F {
    fn step(&mut self, s: State) -> Option<State> {
        self(s)
    }
}

/// Reads, steps and writes the breaker under CAS; returns the state read
/// last with what `step` decided for it written over it (None: not read or
/// not written). `step` returns the state to write, if any, and keeps what
/// else it decides in its own captures (one copy of this for every
/// caller). A host failure reads as closed (the breaker never stands
/// between a request and a working service because shared data failed).
fn update<S>(shared: &S, step: &mut dyn Step) -> Option<State>
where
    S: SharedData + ?Sized,
{
    let mut out = None;
    let mut scratch = [0u8; STATE_BYTES];
    let done = update_key(
        shared,
        key(),
        CAS_ATTEMPTS,
        &mut scratch,
        &mut |stored, buf| {
            let s = State::decode(stored);
            let write = step.step(s);
            out = Some(write.unwrap_or(s));
            buf.copy_from_slice(&write?.encode());
            Some(STATE_BYTES)
        },
    );
    match done {
        Ok(()) => out,
        Err(_) => None,
    }
}

/// The hook before a call of `parts` parts (requests, refills, pushes,
/// charges) goes out at `now_ms`: whether it may. A call told `Fallback` is
/// not made, and each of its parts counts in `breaker_skipped` (a request
/// gets `on_failure`); one told `Probe` calls as usual (its outcome goes to
/// `record`).
pub fn may_call<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    cache: &Cache,
    now_ms: u64,
    parts: usize,
) -> Gate {
    let Some(p) = Params::of(c) else {
        return Gate::Call;
    };
    if cache.trusted(now_ms) {
        return Gate::Call;
    }
    let mut g = Gate::Call;
    let Some(s) = update(host, &mut |s: State| {
        let (decided, write) = gate(s, &p, now_ms);
        g = decided;
        write
    }) else {
        return Gate::Call;
    };
    cache.learn(&s, now_ms);
    match g {
        Gate::Probe => host.count(Counter::BreakerProbes),
        Gate::Fallback => host.add(Counter::BreakerSkipped, parts as u64),
        Gate::Call => {}
    }
    g
}

/// The hook where a call's outcome is known at `now_ms`: `failed` is why
/// it failed (None: the service answered). Counts and logs a transition,
/// once, in the worker that made it.
pub fn record<H: Host + ?Sized>(
    c: &Compiled,
    host: &H,
    cache: &Cache,
    failed: Option<&RlsError>,
    now_ms: u64,
) {
    let Some(p) = Params::of(c) else {
        return;
    };
    if failed.is_none() && cache.trusted(now_ms) {
        return;
    }
    let mut t = None;
    let Some(s) = update(host, &mut |s: State| {
        let (write, transition) = settle(s, &p, failed.is_some(), now_ms);
        t = transition;
        write
    }) else {
        return;
    };
    cache.learn(&s, now_ms);
    match t {
        Some(Transition::Opened) => {
            host.count(Counter::BreakerOpened);
            host.set_gauge(Gauge::BreakerOpen, 1);
            log::warn!(
                "breaker open: {} calls to the rate-limit service failed in a row (the last: {}); requests get on_failure {}, a probe every {} ms",
                s.failures,
                failed.map_or(String::new(), ToString::to_string),
                c.config.on_failure.as_str(),
                p.probe_interval_ms
            );
        }
        Some(Transition::Closed { open_ms }) => {
            host.count(Counter::BreakerClosed);
            host.add(Counter::BreakerOpenMs, open_ms);
            host.set_gauge(Gauge::BreakerOpen, 0);
            log::warn!("breaker closed: the rate-limit service answered after {open_ms} ms open");
        }
        None => {}
    }
}

/// The breaker's shared value, created closed at configure (every VM runs
/// this; one that exists is left alone); its gauge set from it.
pub fn create<H: Host + ?Sized>(host: &H) {
    if !local::create(host, key(), &State::default().encode()) {
        log::warn!("breaker: its shared state cannot be created: it stays closed");
    }
    let open = host.get_shared(key()).ok().and_then(|(v, _)| v);
    let open = State::decode(open.as_deref()).is_open();
    host.set_gauge(Gauge::BreakerOpen, u64::from(open));
}

#[cfg(test)]
mod tests;
