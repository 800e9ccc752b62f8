//! An in-memory host for the tests and the criterion benchmark: Envoy's
//! shared data with its CAS semantics, a settable clock, request headers,
//! and a record of what the flow and the root did (local replies, gRPC
//! calls, response headers, counters, resumes). Every host call can be made
//! to fail (`fail`), and other workers can be made to write between a read
//! and a write (`interfere`). `Worker` pairs it with a VM's state
//! (`vm::Vm`), as the glue gives both to a stream or the root.
//!
//! Compiled for tests and for native builds (the benchmark) only, never
//! into the `.wasm`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Deref;

#[cfg(test)]
use crate::batch::Delivery;
use crate::compiled::Compiled;
use crate::counters::{Counter, Gauge, GroupCounter, Histogram, COUNTERS, GAUGES, HISTOGRAMS};
use crate::flow::Stream;
use crate::group::GroupId;
use crate::host::{Host, HostCall, HostError, SharedData, SharedDataError};
use crate::local::{slot_for, SlotKey, SlotRef, SlotSecret};
use crate::proto::{
    Code, DescriptorStatus, Duration, HeaderValue, RateLimit, RateLimitResponse, RateLimitUnit,
};
use crate::root::create_shared;
use crate::vm::Vm;

/// The slot secret of every `Worker`'s VM until `set_slot_secret`.
pub const MEMHOST_SECRET: [u8; 16] = *b"memhost-secret!!";

fn bit(call: HostCall) -> u16 {
    1 << call as u16
}

/// A local reply the flow sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The value of header `name`, if the reply has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A gRPC call the flow or the root dispatched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// What `dispatch_grpc` returned (1, 2, ... in order).
    pub token: u32,
    pub upstream: String,
    pub service: String,
    pub method: String,
    pub message: Vec<u8>,
    pub timeout_ms: u32,
}

/// The tests' clock: 2023-11-14T22:13:20.250Z, 20.25 s into its minute.
pub const NOW: u64 = 1_700_000_000_250;

/// A plugin configuration compiled, for a test (it panics on a bad one).
#[cfg(test)]
pub fn compiled(text: &str) -> Compiled {
    match ratelimit_config::parse_plugin_config(text.as_bytes()) {
        Ok((config, _)) => Compiled::new(config),
        Err(e) => panic!("test configuration: {e:?}"),
    }
}

/// A worker ready for `c` (its slots created) at the tests' clock.
#[cfg(test)]
pub fn host(c: &Compiled) -> Worker {
    Worker::ready(c, NOW)
}

/// A plugin configuration built with `json!` and compiled, for a test;
/// `extra`'s keys (an object's) are set on top of `base`'s.
#[cfg(test)]
pub fn compiled_json(base: serde_json::Value, extra: serde_json::Value) -> Compiled {
    compiled(&with_keys(base, extra).to_string())
}

/// `base` (an object) with each key of `extra` (an object) set on it.
#[cfg(test)]
pub fn with_keys(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

/// JSON text parsed, for a test (it panics on bad text).
#[cfg(test)]
pub fn json_of(text: &str) -> serde_json::Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => panic!("test JSON {text}: {e}"),
    }
}

/// One descriptor's status in a `RateLimitResponse`: `limit` per `unit`,
/// `remaining` left, the window resetting in `reset_s` seconds.
pub fn status(
    code: Code,
    limit: u32,
    unit: RateLimitUnit,
    remaining: u32,
    reset_s: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: limit,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(Duration {
            seconds: reset_s,
            nanos: 0,
        }),
    }
}

/// The encoded answer of the service.
pub fn answer(code: Code, statuses: Vec<DescriptorStatus>) -> Vec<u8> {
    prost::Message::encode_to_vec(&RateLimitResponse {
        overall_code: code as i32,
        statuses,
        ..RateLimitResponse::default()
    })
}

/// The encoded answer of the service, with headers for the client
/// (`response_headers_to_add`) and for the upstream (`request_headers_to_add`).
pub fn answer_with_headers(
    code: Code,
    statuses: Vec<DescriptorStatus>,
    to_client: &[(&str, &str)],
    to_upstream: &[(&str, &str)],
) -> Vec<u8> {
    let hv = |(k, v): &(&str, &str)| HeaderValue {
        key: k.to_string(),
        value: v.to_string(),
    };
    prost::Message::encode_to_vec(&RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add: to_client.iter().map(hv).collect(),
        request_headers_to_add: to_upstream.iter().map(hv).collect(),
        ..RateLimitResponse::default()
    })
}

/// FNV-1a: shared-data keys are short, and SipHash would make the
/// benchmark measure the map more than the flow.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

type SharedMap = HashMap<String, (Vec<u8>, u32), BuildHasherDefault<Fnv>>;

type Writer = Box<dyn FnMut(Option<&[u8]>) -> Vec<u8>>;

/// A response's headers or trailers.
type Fields = Vec<(String, Vec<u8>)>;

/// The in-memory host. Single-threaded, like a proxy-wasm VM.
pub struct MemHost {
    now_ms: Cell<u64>,
    /// In order; a name may appear more than once (a repeated header).
    request_headers: RefCell<Vec<(String, Vec<u8>)>>,
    /// The matched route's name (`xds.route_name`), and how often it was
    /// read.
    route_name: RefCell<Option<Vec<u8>>>,
    route_name_reads: Cell<u64>,
    /// The upstream response's headers, then its trailers.
    response: RefCell<[Fields; 2]>,
    /// Envoy attributes by path (segments joined by NUL), besides
    /// `request.headers`, which is read from `request_headers`.
    attributes: RefCell<Vec<(String, Vec<u8>)>>,
    shared: RefCell<SharedMap>,
    last_cas: Cell<u32>,
    failing: Cell<u16>,
    interference_left: Cell<u32>,
    interference: RefCell<Option<Writer>>,
    grpc_body: RefCell<Option<Vec<u8>>>,
    /// Off: replies, calls and headers are counted, not kept (the
    /// benchmark's host, which runs millions of requests).
    keep: bool,
    replies: RefCell<Vec<Reply>>,
    calls: RefCell<Vec<Call>>,
    added: RefCell<Vec<(String, String)>>,
    /// Properties set (the access-log fields), in order.
    properties: RefCell<Vec<(String, String)>>,
    added_to_request: RefCell<Vec<(String, String)>>,
    reply_count: Cell<u64>,
    call_count: Cell<u64>,
    added_count: Cell<u64>,
    resumed: Cell<u64>,
    counters: [Cell<u64>; COUNTERS],
    /// Group counters, by (group index, counter).
    group_counters: RefCell<Vec<((usize, GroupCounter), u64)>>,
    /// `count_route`'s (group index, route index), once per count.
    pub routes_counted: RefCell<Vec<(usize, usize)>>,
    /// Values recorded per histogram (only their count for a `counting`
    /// host).
    recorded: [RefCell<Vec<u64>>; HISTOGRAMS],
    recorded_count: Cell<u64>,
    gauges: [Cell<u64>; GAUGES],
}

impl Default for MemHost {
    fn default() -> MemHost {
        MemHost::new()
    }
}

impl MemHost {
    /// A host that keeps everything the flow does, at time 0.
    pub fn new() -> MemHost {
        MemHost {
            now_ms: Cell::new(0),
            request_headers: RefCell::new(Vec::new()),
            route_name: RefCell::new(None),
            route_name_reads: Cell::new(0),
            response: RefCell::new(Default::default()),
            attributes: RefCell::new(Vec::new()),
            shared: RefCell::new(SharedMap::default()),
            last_cas: Cell::new(0),
            failing: Cell::new(0),
            interference_left: Cell::new(0),
            interference: RefCell::new(None),
            grpc_body: RefCell::new(None),
            keep: true,
            replies: RefCell::new(Vec::new()),
            calls: RefCell::new(Vec::new()),
            added: RefCell::new(Vec::new()),
            properties: RefCell::new(Vec::new()),
            added_to_request: RefCell::new(Vec::new()),
            reply_count: Cell::new(0),
            call_count: Cell::new(0),
            added_count: Cell::new(0),
            resumed: Cell::new(0),
            counters: Default::default(),
            group_counters: RefCell::new(Vec::new()),
            routes_counted: RefCell::new(Vec::new()),
            recorded: Default::default(),
            recorded_count: Cell::new(0),
            gauges: Default::default(),
        }
    }

    /// A host that only counts what the flow does (for the benchmark).
    pub fn counting() -> MemHost {
        MemHost {
            keep: false,
            ..MemHost::new()
        }
    }

    pub fn set_now_ms(&self, now_ms: u64) {
        self.now_ms.set(now_ms);
    }

    /// Sets (or replaces) a request header, reusing its buffer; a header
    /// sent more than once is left with this one value.
    pub fn set_request_header(&self, name: &str, value: &[u8]) {
        let mut headers = self.request_headers.borrow_mut();
        let mut seen = false;
        headers.retain_mut(|(k, v)| {
            if k != name {
                return true;
            }
            if seen {
                return false;
            }
            seen = true;
            v.clear();
            v.extend_from_slice(value);
            true
        });
        if !seen {
            headers.push((name.to_string(), value.to_vec()));
        }
    }

    /// Sends a request header once more (a repeated header), after its
    /// other values.
    pub fn append_request_header(&self, name: &str, value: &[u8]) {
        (self.request_headers.borrow_mut()).push((name.to_string(), value.to_vec()));
    }

    pub fn remove_request_header(&self, name: &str) {
        self.request_headers.borrow_mut().retain(|(k, _)| k != name);
    }

    /// Sets an Envoy attribute (`Host::property`), by its path: segments
    /// joined by NUL.
    pub fn set_attribute(&self, path: &str, value: &[u8]) {
        let mut attributes = self.attributes.borrow_mut();
        attributes.retain(|(p, _)| p != path);
        attributes.push((path.to_string(), value.to_vec()));
    }

    /// What `grpc_response` returns: the body of the service's answer.
    /// The route the next requests match (None: no route name).
    pub fn set_route_name(&self, name: Option<&str>) {
        *self.route_name.borrow_mut() = name.map(|n| n.as_bytes().to_vec());
    }

    /// How often the flow read the route's name.
    pub fn route_name_reads(&self) -> u64 {
        self.route_name_reads.get()
    }

    /// The upstream response's headers (`trailers` false) or trailers,
    /// replacing those set before.
    pub fn set_response(&self, trailers: bool, fields: &[(&str, &[u8])]) {
        let mut r = self.response.borrow_mut();
        if let Some(map) = r.get_mut(usize::from(trailers)) {
            *map = fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect();
        }
    }

    fn response_field(&self, trailers: bool, name: &str) -> Option<Vec<u8>> {
        self.response
            .borrow()
            .get(usize::from(trailers))?
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    pub fn set_grpc_response(&self, body: Option<Vec<u8>>) {
        *self.grpc_body.borrow_mut() = body;
    }

    /// Creates slots `trl.0` … `trl.<slots-1>` zeroed, and the rule-name
    /// table's entries, as the root does at configure
    /// (`root::create_shared`).
    pub fn create_slots(&self, slots: u32) {
        let created = create_shared(self, slots);
        assert_eq!(created, Default::default(), "creating the slots failed");
    }

    /// The value stored under a slot's key.
    pub fn shared_value(&self, key: &SlotKey) -> Option<Vec<u8>> {
        self.shared
            .borrow()
            .get(key.as_str())
            .map(|(v, _)| v.clone())
    }

    /// Every shared-data key and value, sorted by key (to see that nothing
    /// was written).
    pub fn shared_snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let mut all: Vec<(String, Vec<u8>)> = self
            .shared
            .borrow()
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        all.sort();
        all
    }

    /// Makes every later call of this kind fail.
    pub fn fail(&self, call: HostCall) {
        self.failing.set(self.failing.get() | bit(call));
    }

    pub fn heal(&self, call: HostCall) {
        self.failing.set(self.failing.get() & !bit(call));
    }

    fn check(&self, call: HostCall) -> Result<(), HostError> {
        if self.failing.get() & bit(call) != 0 {
            Err(HostError::new(call, HostError::INTERNAL_FAILURE))
        } else {
            Ok(())
        }
    }

    /// After each of the next `times` reads of shared data, another worker
    /// writes what `write` makes of the value read (which changes its CAS
    /// token, so the reader's write fails with `CasMismatch`).
    pub fn interfere(&self, times: u32, write: impl FnMut(Option<&[u8]>) -> Vec<u8> + 'static) {
        *self.interference.borrow_mut() = Some(Box::new(write));
        self.interference_left.set(times);
    }

    pub fn set_interference(&self, times: u32) {
        self.interference_left.set(times);
    }

    pub fn interference_left(&self) -> u32 {
        self.interference_left.get()
    }

    /// Writes `key` if `cas` is None or its current token, as Envoy does:
    /// a stale token on an existing key is a mismatch; no token, or a key
    /// that does not exist yet, writes.
    fn write(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError> {
        let mut shared = self.shared.borrow_mut();
        let entry = shared.get_mut(key);
        if let (Some(want), Some((_, have))) = (cas, &entry) {
            if want != *have {
                return Err(SharedDataError::CasMismatch);
            }
        }
        // Envoy's CAS tokens are never 0 (0 means "no CAS").
        let next = self.last_cas.get().wrapping_add(1).max(1);
        self.last_cas.set(next);
        match entry {
            Some((stored, token)) => {
                stored.clear();
                stored.extend_from_slice(value);
                *token = next;
            }
            None => {
                shared.insert(key.to_string(), (value.to_vec(), next));
            }
        }
        Ok(())
    }

    /// The local replies sent, in order (empty for a `counting` host).
    pub fn replies(&self) -> Vec<Reply> {
        self.replies.borrow().clone()
    }

    /// The gRPC calls dispatched, in order (empty for a `counting` host).
    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    /// The headers added to the response, in order.
    pub fn added_headers(&self) -> Vec<(String, String)> {
        self.added.borrow().clone()
    }

    /// The properties set, in order (empty for a `counting` host).
    pub fn properties(&self) -> Vec<(String, String)> {
        self.properties.borrow().clone()
    }

    /// Forgets the properties set so far (a new request's, on one host).
    pub fn clear_properties(&self) {
        self.properties.borrow_mut().clear();
    }

    /// The headers added to the request, in order.
    pub fn added_request_headers(&self) -> Vec<(String, String)> {
        self.added_to_request.borrow().clone()
    }

    pub fn reply_count(&self) -> u64 {
        self.reply_count.get()
    }

    pub fn call_count(&self) -> u64 {
        self.call_count.get()
    }

    pub fn added_count(&self) -> u64 {
        self.added_count.get()
    }

    /// How many times a paused request was resumed.
    pub fn resumed(&self) -> u64 {
        self.resumed.get()
    }

    pub fn counter(&self, c: Counter) -> u64 {
        self.counters.get(c.index()).map_or(0, Cell::get)
    }

    /// A counter of the group at position `group` in
    /// `limits.all_groups()` (`GroupId::new(group)`).
    pub fn group_counter(&self, group: usize, c: GroupCounter) -> u64 {
        self.group_counters
            .borrow()
            .iter()
            .find(|(k, _)| *k == (group, c))
            .map_or(0, |(_, n)| *n)
    }

    /// The group counters that are not 0, as (group index, name, value),
    /// in the order they were first counted.
    pub fn group_counted(&self) -> Vec<(usize, &'static str, u64)> {
        self.group_counters
            .borrow()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|((g, c), n)| (*g, c.name(), *n))
            .collect()
    }

    /// The values recorded in a histogram, in order.
    pub fn recorded(&self, h: Histogram) -> Vec<u64> {
        self.recorded
            .get(h.index())
            .map_or_else(Vec::new, |r| r.borrow().clone())
    }

    /// A gauge's value (0 until set).
    pub fn gauge(&self, g: Gauge) -> u64 {
        self.gauges.get(g.index()).map_or(0, Cell::get)
    }

    /// Every shared-data key (sorted), to see what a change created.
    pub fn shared_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.shared.borrow().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// How many values were recorded, in every histogram.
    pub fn recorded_count(&self) -> u64 {
        self.recorded_count.get()
    }

    /// Sets every counter back to 0.
    pub fn clear_counters(&self) {
        self.counters.iter().for_each(|c| c.set(0));
    }

    /// The counters that are not 0, by name.
    pub fn counted(&self) -> Vec<(&'static str, u64)> {
        Counter::ALL
            .iter()
            .map(|c| (c.name(), self.counter(*c)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

impl SharedData for MemHost {
    fn get_shared(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedDataError> {
        self.check(HostCall::GetShared)
            .map_err(SharedDataError::Host)?;
        let read = match self.shared.borrow().get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        };
        let left = self.interference_left.get();
        if left > 0 {
            self.interference_left.set(left - 1);
            let written = self
                .interference
                .borrow_mut()
                .as_mut()
                .map(|w| w(read.0.as_deref()));
            if let Some(value) = written {
                self.write(key, &value, None)?;
            }
        }
        Ok(read)
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError> {
        self.check(HostCall::SetShared)
            .map_err(SharedDataError::Host)?;
        self.write(key, value, cas)
    }
}

impl Host for MemHost {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.check(HostCall::RequestHeader)?;
        Ok(self
            .request_headers
            .borrow()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone()))
    }

    fn route_name(&self) -> Result<Option<Vec<u8>>, HostError> {
        self.route_name_reads.set(self.route_name_reads.get() + 1);
        self.check(HostCall::RouteName)?;
        Ok(self.route_name.borrow().clone())
    }

    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.check(HostCall::ResponseHeader)?;
        Ok(self.response_field(false, name))
    }

    fn response_trailer(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.check(HostCall::ResponseTrailer)?;
        Ok(self.response_field(true, name))
    }

    /// `request\0headers\0<name>`: every value of the header, joined by
    /// `,`, as Envoy gives it; any other path, what `set_attribute` set.
    fn property(&self, path: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.check(HostCall::Property)?;
        if let Some(name) = path.strip_prefix("request\0headers\0") {
            let headers = self.request_headers.borrow();
            let mut values = headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v);
            let Some(first) = values.next() else {
                return Ok(None);
            };
            let mut all = first.clone();
            for v in values {
                all.push(b',');
                all.extend_from_slice(v);
            }
            return Ok(Some(all));
        }
        let attributes = self.attributes.borrow();
        Ok(attributes
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, v)| v.clone()))
    }

    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }

    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        self.check(HostCall::Dispatch)?;
        let token = u32::try_from(self.call_count.get() + 1).unwrap_or(u32::MAX);
        self.call_count.set(self.call_count.get() + 1);
        if self.keep {
            self.calls.borrow_mut().push(Call {
                token,
                upstream: upstream.to_string(),
                service: service.to_string(),
                method: method.to_string(),
                message: message.to_vec(),
                timeout_ms,
            });
        }
        Ok(token)
    }

    fn grpc_response(&self, size: usize) -> Result<Option<Vec<u8>>, HostError> {
        self.check(HostCall::GrpcResponse)?;
        Ok(self
            .grpc_body
            .borrow()
            .as_ref()
            .map(|b| b.iter().take(size).copied().collect()))
    }

    fn send_reply(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<(), HostError> {
        self.check(HostCall::Reply)?;
        self.reply_count.set(self.reply_count.get() + 1);
        if self.keep {
            self.replies.borrow_mut().push(Reply {
                status,
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                body: body.to_string(),
            });
        }
        Ok(())
    }

    fn resume_request(&self) -> Result<(), HostError> {
        self.check(HostCall::Resume)?;
        self.resumed.set(self.resumed.get() + 1);
        Ok(())
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.check(HostCall::AddHeader)?;
        self.added_count.set(self.added_count.get() + 1);
        if self.keep {
            self.added
                .borrow_mut()
                .push((name.to_string(), value.to_string()));
        }
        Ok(())
    }

    fn add_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.check(HostCall::AddRequestHeader)?;
        if self.keep {
            self.added_to_request
                .borrow_mut()
                .push((name.to_string(), value.to_string()));
        }
        Ok(())
    }

    fn add(&self, counter: Counter, n: u64) {
        if let Some(c) = self.counters.get(counter.index()) {
            c.set(c.get() + n);
        }
    }

    fn add_group(&self, group: GroupId, counter: GroupCounter, n: u64) {
        let group = group.index();
        let mut counters = self.group_counters.borrow_mut();
        match counters.iter_mut().find(|(k, _)| *k == (group, counter)) {
            Some((_, v)) => *v += n,
            None => counters.push(((group, counter), n)),
        }
    }

    fn count_route(&self, group: GroupId, route: usize) {
        self.routes_counted
            .borrow_mut()
            .push((group.index(), route));
    }

    fn record(&self, histogram: Histogram, value: u64) {
        self.recorded_count.set(self.recorded_count.get() + 1);
        if self.keep {
            if let Some(r) = self.recorded.get(histogram.index()) {
                r.borrow_mut().push(value);
            }
        }
    }

    fn set_gauge(&self, gauge: Gauge, value: u64) {
        if let Some(g) = self.gauges.get(gauge.index()) {
            g.set(value);
        }
    }

    fn set_property(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.check(HostCall::SetProperty)?;
        if self.keep {
            self.properties
                .borrow_mut()
                .push((name.to_string(), value.to_string()));
        }
        Ok(())
    }
}

/// Where the flow puts `tenant` of the group named `group` under `c`, with
/// the slot secret `secret` (`local::slot_for` in the group's scope).
pub fn slot_of(c: &Compiled, secret: &SlotSecret, group: &str, tenant: &str) -> SlotRef {
    let id = group_id(c, group).unwrap_or(GroupId::new(usize::MAX));
    slot_for(secret, c.scope(id), tenant, c.config.local.slots)
}

/// The id of the group named `name` under `c`.
pub fn group_id(c: &Compiled, name: &str) -> Option<GroupId> {
    let mut groups = c.config.limits.all_groups();
    groups.position(|g| g.name == name).map(GroupId::new)
}

/// One worker of one Envoy, for the tests: the in-memory host and one VM's
/// state (`vm`), as the glue gives them to a stream or the root. It derefs
/// to the host, so a test reads it as one.
pub struct Worker {
    pub host: MemHost,
    pub vm: Vm,
    /// The last stream id given (`stream`).
    streams: Cell<u32>,
}

impl Default for Worker {
    fn default() -> Worker {
        Worker::new()
    }
}

impl Worker {
    /// A host that keeps everything, at time 0, and a VM with the secret
    /// `MEMHOST_SECRET`.
    pub fn new() -> Worker {
        Worker::with(MemHost::new())
    }

    pub fn with(host: MemHost) -> Worker {
        Worker {
            host,
            vm: Vm::new(SlotSecret::from_bytes(MEMHOST_SECRET)),
            streams: Cell::new(0),
        }
    }

    /// A worker for `c` at `now_ms`: every slot created, as the root
    /// creates them at configure.
    #[cfg(test)]
    pub fn ready(c: &Compiled, now_ms: u64) -> Worker {
        let w = Worker::new();
        w.create_slots(c.config.local.slots);
        w.set_now_ms(now_ms);
        w
    }

    /// A new stream of this worker, with a context id no other has.
    pub fn stream(&self) -> Stream {
        self.streams.set(self.streams.get() + 1);
        Stream::new(self.streams.get())
    }

    /// A request of `tenant` (in the configured tenant header), up to its
    /// first answer.
    #[cfg(test)]
    pub fn request(&self, c: &Compiled, tenant: &str) -> (Stream, crate::flow::Next) {
        self.set_request_header(&c.config.limits.header, tenant.as_bytes());
        let mut s = self.stream();
        let next = s.on_request_headers(c, self, &self.vm);
        (s, next)
    }

    /// The service answers the call that carries `s`'s request (gRPC
    /// `status`; `size` bytes of the body `set_grpc_response` set): the
    /// root receives it, and `s` gets its share, as the glue delivers it.
    /// The shares of other streams are returned.
    #[cfg(test)]
    pub fn answer(&self, c: &Compiled, s: &mut Stream, status: u32, size: usize) -> Vec<Delivery> {
        let token = self.vm.batch.token_for(s.id());
        let token = token.unwrap_or_else(|| panic!("no call under way for stream {}", s.id()));
        self.answer_call(c, token, status, size, &mut [s])
    }

    /// The service answers the call under `token`; each stream of
    /// `streams` gets its share; the other shares are returned.
    #[cfg(test)]
    pub fn answer_call(
        &self,
        c: &Compiled,
        token: u32,
        status: u32,
        size: usize,
        streams: &mut [&mut Stream],
    ) -> Vec<Delivery> {
        crate::root::Root::default().on_answer(c, self, &self.vm, token, status, size);
        self.deliver(c, streams)
    }

    /// The service answers every call under way, and the calls their
    /// answers send, until none is left: `code` overall, `per_part` the
    /// statuses of each part; each of `streams` gets its share. Returns
    /// how many calls it answered.
    #[cfg(test)]
    pub fn answer_all(
        &self,
        c: &Compiled,
        streams: &mut [Stream],
        code: Code,
        per_part: &dyn Fn(&crate::batch::Part) -> Vec<DescriptorStatus>,
    ) -> usize {
        let mut calls = 0;
        while let Some(&token) = self.vm.batch.tokens().first() {
            let parts = self.vm.batch.parts_of(token);
            let body = answer(code, parts.iter().flat_map(per_part).collect());
            let size = body.len();
            self.set_grpc_response(Some(body));
            let mut refs: Vec<&mut Stream> = streams.iter_mut().collect();
            self.answer_call(c, token, 0, size, &mut refs);
            calls += 1;
        }
        calls
    }

    /// The answers waiting for streams, delivered to those of `streams`;
    /// the others are returned.
    #[cfg(test)]
    pub fn deliver(&self, c: &Compiled, streams: &mut [&mut Stream]) -> Vec<Delivery> {
        let mut others = Vec::new();
        for d in self.vm.batch.take_deliveries() {
            match streams.iter_mut().find(|s| s.id() == d.stream) {
                Some(s) => s.on_answer(c, self, &self.vm, d.answer),
                None => others.push(d),
            }
        }
        others
    }

    pub fn slot_secret(&self) -> SlotSecret {
        self.vm.slot_secret
    }

    /// Another VM's secret (as if this VM had drawn it alone).
    pub fn set_slot_secret(&mut self, key: SlotSecret) {
        self.vm.slot_secret = key;
    }
}

impl Deref for Worker {
    type Target = MemHost;

    fn deref(&self) -> &MemHost {
        &self.host
    }
}

/// The worker's host, so that a test passes the worker where a port is
/// asked for.
impl SharedData for Worker {
    fn get_shared(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedDataError> {
        self.host.get_shared(key)
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError> {
        self.host.set_shared(key, value, cas)
    }
}

impl Host for Worker {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.host.request_header(name)
    }

    fn route_name(&self) -> Result<Option<Vec<u8>>, HostError> {
        self.host.route_name()
    }

    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.host.response_header(name)
    }

    fn response_trailer(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.host.response_trailer(name)
    }

    fn property(&self, path: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.host.property(path)
    }

    fn now_ms(&self) -> u64 {
        self.host.now_ms()
    }

    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        self.host
            .dispatch_grpc(upstream, service, method, message, timeout_ms)
    }

    fn grpc_response(&self, size: usize) -> Result<Option<Vec<u8>>, HostError> {
        self.host.grpc_response(size)
    }

    fn send_reply(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<(), HostError> {
        self.host.send_reply(status, headers, body)
    }

    fn resume_request(&self) -> Result<(), HostError> {
        self.host.resume_request()
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.host.add_response_header(name, value)
    }

    fn add_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.host.add_request_header(name, value)
    }

    fn add(&self, counter: Counter, n: u64) {
        self.host.add(counter, n);
    }

    fn add_group(&self, group: GroupId, counter: GroupCounter, n: u64) {
        self.host.add_group(group, counter, n);
    }

    fn count_route(&self, group: GroupId, route: usize) {
        self.host.count_route(group, route);
    }

    fn record(&self, histogram: Histogram, value: u64) {
        self.host.record(histogram, value);
    }

    fn set_gauge(&self, gauge: Gauge, value: u64) {
        self.host.set_gauge(gauge, value);
    }

    fn set_property(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.host.set_property(name, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn shared_data_has_envoys_cas_semantics() {
        let h = MemHost::new();
        assert_eq!(h.get_shared("k"), Ok((None, None)));
        // A key that does not exist is written, with or without a token.
        assert_eq!(h.set_shared("k", b"a", Some(7)), Ok(()));
        let (v, cas) = h.get_shared("k").unwrap();
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        let cas = cas.unwrap();
        assert_ne!(cas, 0);
        // The token read writes once; after that it is stale.
        assert_eq!(h.set_shared("k", b"b", Some(cas)), Ok(()));
        assert_eq!(
            h.set_shared("k", b"c", Some(cas)),
            Err(SharedDataError::CasMismatch)
        );
        // No token always writes.
        assert_eq!(h.set_shared("k", b"d", None), Ok(()));
        assert_eq!(h.get_shared("k").unwrap().0.as_deref(), Some(&b"d"[..]));
    }

    #[test]
    fn a_failing_call_fails_until_healed() {
        let h = MemHost::new();
        h.fail(HostCall::Reply);
        assert!(h.send_reply(429, &[], "").is_err());
        assert_eq!(h.reply_count(), 0);
        h.heal(HostCall::Reply);
        assert!(h.send_reply(429, &[("a", "b")], "x").is_ok());
        assert_eq!(h.replies()[0].header("a"), Some("b"));
    }
}
