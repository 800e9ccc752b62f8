//! The proxy-wasm adapter, and the only module that names proxy-wasm. It
//! does three things: implements `Host` with the SDK's `hostcalls` (which
//! return errors instead of panicking), registers the root and HTTP
//! contexts, and reads the plugin configuration. What happens to a request
//! is `flow`'s business.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use ratelimit_config::parse_plugin_config;

use crate::counters::{Counter, GroupCounter, Histogram, COUNTERS, GROUP_COUNTERS, HISTOGRAMS};
use crate::decision::Compiled;
use crate::flow::{Next, Stream};
use crate::health::LogThrottle;
use crate::host::{Host, HostError, SharedData, SharedDataError};
use crate::lease::{on_refill_answer, refill_message, store_outcome, LeaseParams, Outcome, Refill};
use crate::local::names::{empty_entry, name_key, NAME_ENTRIES};
use crate::local::{agree, Agreed, SlotKey, SlotRef, SlotSecret, SLOT_BYTES};
use crate::sync::{next_push, on_push_answer, Push, SyncParams};
use ratelimit_config::LEASE_TICK_MS;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// `log`'s macros, to Envoy's log. Not the SDK's logger: its `log()` unwraps
/// the host's answer (a failed log call would trap the VM, and Envoy would
/// then fail every request of this worker), and it costs about 3 KB more.
/// The SDK's panic hook goes with it: the filter denies panics, and std's
/// own hook already writes a panic's message to stderr, which Envoy logs.
struct HostLogger;

static LOGGER: HostLogger = HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        // A failed log call is dropped: there is nowhere else to say so.
        let _ = match record.args().as_str() {
            Some(literal) => hostcalls::log(level, literal),
            None => hostcalls::log(level, &record.args().to_string()),
        };
    }

    fn flush(&self) {}
}

/// Installs the logger (once per VM: a second call keeps the first) at the
/// level Envoy runs the wasm logger with, read once per VM: the level check
/// on the request path is then a comparison with `log::max_level()`.
fn init_logging() {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(match hostcalls::get_log_level().unwrap_or(LogLevel::Info) {
        LogLevel::Trace => log::LevelFilter::Trace,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Error => log::LevelFilter::Error,
        // We log nothing at critical.
        LogLevel::Critical => log::LevelFilter::Off,
    });
}

fn host_error(e: Status) -> HostError {
    HostError(format!("{e:?}"))
}

fn define_counter(name: &str) -> Option<u32> {
    define_metric(MetricType::Counter, name)
}

fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    match hostcalls::define_metric(kind, name) {
        Ok(defined) => Some(defined),
        Err(e) => {
            log::warn!("cannot define metric {name}: {e:?}");
            None
        }
    }
}

/// The metric ids Envoy gave the counters, by `Counter::index`, and the
/// group counters, by group index then `GroupCounter::index`.
struct Metrics {
    counters: [Option<u32>; COUNTERS],
    groups: Vec<[Option<u32>; GROUP_COUNTERS]>,
    histograms: [Option<u32>; HISTOGRAMS],
}

impl Metrics {
    /// Defines the counters, and the group counters of these groups (in
    /// `limits.all_groups()` order).
    fn define<'a>(groups: impl Iterator<Item = &'a str>) -> Metrics {
        let mut counters = [None; COUNTERS];
        for (id, c) in counters.iter_mut().zip(Counter::ALL) {
            *id = define_counter(c.name());
        }
        let groups = groups
            .map(|group| {
                let mut ids = [None; GROUP_COUNTERS];
                for (id, c) in ids.iter_mut().zip(GroupCounter::ALL) {
                    *id = define_counter(&c.stat_name(group));
                }
                ids
            })
            .collect();
        let mut histograms = [None; HISTOGRAMS];
        for (id, h) in histograms.iter_mut().zip(Histogram::ALL) {
            *id = define_metric(MetricType::Histogram, h.name());
        }
        Metrics {
            counters,
            groups,
            histograms,
        }
    }

    fn record(&self, histogram: Histogram, value: u64) {
        if let Some(Some(id)) = self.histograms.get(histogram.index()) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }

    fn count(&self, counter: Counter) {
        if let Some(Some(id)) = self.counters.get(counter.index()) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }

    fn add_group(&self, group: usize, counter: GroupCounter, n: u64) {
        let id = self.groups.get(group).and_then(|g| g.get(counter.index()));
        if let (Some(Some(id)), Ok(n)) = (id, i64::try_from(n)) {
            let _ = hostcalls::increment_metric(*id, n);
        }
    }
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    /// WASI's `random_get`: Envoy's proxy-wasm host fills the buffer with
    /// BoringSSL's `RAND_bytes` and answers 0 (an error only for a buffer
    /// over 64 KiB or outside memory). Called directly rather than through
    /// std, which panics when it fails, or the getrandom crate.
    fn random_get(buf: *mut u8, buf_len: usize) -> i32;
}

// The SDK's `hostcalls::set_property` panics on any status but Ok (for one,
// when Envoy refuses to overwrite a property): the import is called here
// instead, and its status is returned as an error.
#[link(wasm_import_module = "env")]
#[allow(clashing_extern_declarations)]
extern "C" {
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
}

/// 128 random bits for the slot secret; if `random_get` fails, a warning,
/// `slot_secret_fallback`, and the host's clock in nanoseconds instead,
/// which someone outside could only guess by knowing, to the nanosecond,
/// when this Envoy configured the filter.
fn draw_secret(metrics: &Metrics) -> SlotSecret {
    let mut buf = [0u8; SlotSecret::BYTES];
    // SAFETY: the host writes at most `buf.len()` bytes into `buf`.
    let errno = unsafe { random_get(buf.as_mut_ptr(), buf.len()) };
    if errno == 0 {
        return SlotSecret::from_bytes(buf);
    }
    log::warn!("random_get failed (WASI errno {errno}): the slot secret comes from the clock");
    metrics.count(Counter::SlotSecretFallback);
    let nanos = hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    SlotSecret::from_bytes(nanos.to_le_bytes())
}

/// A `ShouldRateLimit` call from the root context (a lease refill or a sync
/// push): its answer comes back to the root's `on_grpc_call_response`
/// under the token returned.
fn ask_service(c: &Compiled, message: &[u8]) -> Result<u32, Status> {
    hostcalls::dispatch_grpc_call(
        &c.upstream,
        crate::proto::SERVICE,
        crate::proto::METHOD,
        Vec::new(),
        Some(message),
        Duration::from_millis(u64::from(c.config.timeout_ms)),
    )
}

/// `Host` for one stream (or the root context), through proxy-wasm
/// hostcalls.
struct Envoy<'a> {
    metrics: &'a Metrics,
    slot_secret: SlotSecret,
    dispatch_warnings: &'a LogThrottle,
    /// Lease refills for the root's next tick (None: the root itself).
    refills: Option<&'a RefCell<Vec<Refill>>>,
    /// Sync mode's tenants, whose hits the root pushes.
    tracked: Option<&'a RefCell<Tracked>>,
}

/// The tenants this worker's root pushes the hits of, by fingerprint.
type Tracked = HashMap<u64, (usize, String, SlotRef)>;

/// The most tenants one worker tracks for sync; a tenant beyond it is
/// pushed by another worker that tracks it, or its requests ask the
/// service once `max_unsynced` of its hits are pending.
const MAX_TRACKED: usize = 16_384;

/// The most refills one worker keeps for its next tick; one asked beyond
/// it is dropped (its tenant's next request asks after `refill_lost_ms`).
const MAX_QUEUED_REFILLS: usize = 4_096;

impl SharedData for Envoy<'_> {
    fn get_shared(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedDataError> {
        hostcalls::get_shared_data(key).map_err(|e| SharedDataError::Host(host_error(e)))
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(SharedDataError::CasMismatch),
            Err(e) => Err(SharedDataError::Host(host_error(e))),
        }
    }
}

impl Host for Envoy<'_> {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        // The `_bytes` getter: the SDK's other getters unwrap UTF-8.
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name).map_err(host_error)
    }

    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<(), HostError> {
        hostcalls::dispatch_grpc_call(
            upstream,
            service,
            method,
            Vec::new(),
            Some(message),
            Duration::from_millis(u64::from(timeout_ms)),
        )
        .map(|_token| ())
        .map_err(host_error)
    }

    fn grpc_response(&self, size: usize) -> Result<Option<Vec<u8>>, HostError> {
        hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size).map_err(host_error)
    }

    fn send_reply(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<(), HostError> {
        hostcalls::send_http_response(status, headers.to_vec(), Some(body.as_bytes()))
            .map_err(host_error)
    }

    fn resume_request(&self) -> Result<(), HostError> {
        hostcalls::resume_http_request().map_err(host_error)
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value).map_err(host_error)
    }

    fn add_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value).map_err(host_error)
    }

    fn count(&self, counter: Counter) {
        self.metrics.count(counter);
    }

    fn add_group(&self, group: usize, counter: GroupCounter, n: u64) {
        self.metrics.add_group(group, counter, n);
    }

    fn record(&self, histogram: Histogram, value: u64) {
        self.metrics.record(histogram, value);
    }

    fn dispatch_warnings(&self) -> &LogThrottle {
        self.dispatch_warnings
    }

    fn slot_secret(&self) -> SlotSecret {
        self.slot_secret
    }

    fn set_property(&self, name: &str, value: &str) -> Result<(), HostError> {
        // One path segment (no NUL): Envoy stores it as the filter state
        // `wasm.<name>`.
        // SAFETY: the host reads `name.len()` bytes of `name` and
        // `value.len()` bytes of `value`, both alive for the call.
        let status =
            unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
        match status {
            0 => Ok(()),
            other => Err(HostError(format!("set_property: status {other}"))),
        }
    }

    fn track_sync(&self, group: usize, tenant: &str, at: SlotRef) {
        if let Some(Ok(mut t)) = self.tracked.map(RefCell::try_borrow_mut) {
            if t.len() < MAX_TRACKED && !t.contains_key(&at.fingerprint) {
                t.insert(at.fingerprint, (group, tenant.to_string(), at));
            }
        }
    }

    fn request_refill(&self, refill: Refill) {
        if let Some(queue) = self.refills {
            if let Ok(mut q) = queue.try_borrow_mut() {
                if q.len() < MAX_QUEUED_REFILLS {
                    q.push(refill);
                }
            }
        }
    }
}

/// Creates every slot once, zeroed and at full size, so that the shared
/// data has its final size from the start and never grows with traffic.
/// Each VM runs this; a slot that exists is left alone.
fn create_slots(slots: u32) {
    let zeroed = [0u8; SLOT_BYTES];
    let mut failed = 0u32;
    for index in 0..slots {
        let key = SlotKey::new(index);
        match hostcalls::get_shared_data(key.as_str()) {
            Ok((Some(_), _)) => {}
            _ => {
                if hostcalls::set_shared_data(key.as_str(), Some(&zeroed), None).is_err() {
                    failed += 1;
                }
            }
        }
    }
    if failed > 0 {
        log::warn!("local layer: {failed} of {slots} slots could not be created");
    }
    // The rule-name table of cached refusals (`local::names`): entries must
    // exist before they are written under CAS.
    for i in 0..NAME_ENTRIES {
        let key = name_key(i);
        if let Ok((None, _)) = hostcalls::get_shared_data(&key) {
            let _ = hostcalls::set_shared_data(&key, Some(&empty_entry()), None);
        }
    }
}

struct Shared {
    compiled: Compiled,
    metrics: Metrics,
    slot_secret: SlotSecret,
    /// One per VM: this worker's "cannot call the service" warnings.
    dispatch_warnings: LogThrottle,
    /// Lease refills this worker's streams asked for, sent on the next tick.
    refills: RefCell<Vec<Refill>>,
    tracked: RefCell<Tracked>,
    /// Sync mode's push period (None: no group syncs).
    sync_interval_ms: Option<u64>,
}

impl Shared {
    fn host(&self) -> Envoy<'_> {
        Envoy {
            metrics: &self.metrics,
            slot_secret: self.slot_secret,
            dispatch_warnings: &self.dispatch_warnings,
            refills: Some(&self.refills),
            tracked: Some(&self.tracked),
        }
    }
}

/// The slot secret every VM of this Envoy uses (`local::secret`).
fn slot_secret(metrics: &Metrics) -> SlotSecret {
    let unused = LogThrottle::new();
    let shared = Envoy {
        metrics,
        slot_secret: SlotSecret::from_bytes([0; SlotSecret::BYTES]),
        dispatch_warnings: &unused,
        refills: None,
        tracked: None,
    };
    let (secret, agreed) = agree(&shared, || draw_secret(metrics));
    match agreed {
        Agreed::Found | Agreed::Stored => {}
        Agreed::Unshared(why) => log::warn!(
            "local layer: the slot secret could not be shared ({why}): this worker's buckets are its own"
        ),
    }
    secret
}

impl Root {
    /// Sync mode: pushes the unsynced hits of every tenant this worker
    /// tracks (a tenant with nothing pending is forgotten until its next
    /// request).
    fn push_syncs(&mut self, shared: &Shared) {
        let c = &shared.compiled;
        let host = shared.host();
        let tenants: Vec<(u64, usize, String, SlotRef)> = match shared.tracked.try_borrow() {
            Ok(t) => t
                .iter()
                .map(|(k, (g, n, a))| (*k, *g, n.clone(), *a))
                .collect(),
            Err(_) => return,
        };
        for (key, group, tenant, at) in tenants {
            let (push, idle) = next_push(c, &host, group, &tenant, at);
            if idle {
                if let Ok(mut t) = shared.tracked.try_borrow_mut() {
                    t.remove(&key);
                }
            }
            let Some((push, message)) = push else {
                continue;
            };
            let sent = ask_service(c, &message);
            match sent {
                Ok(token) => {
                    self.in_flight.insert(token, Pending::Push(push));
                }
                Err(_) => on_push_answer(c, &host, &push, 14, None),
            }
        }
    }
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
    /// Calls sent from `on_tick`, by token.
    in_flight: HashMap<u32, Pending>,
    /// When sync mode pushes next.
    next_sync_ms: u64,
}

/// A call the root sent.
enum Pending {
    /// A lease refill, and when it went out.
    Refill(Refill, u64),
    Push(Push),
}

// The built .wasm exports only the callbacks implemented in this file
// (`WASM_EXPORTS` in the Makefile, applied by tools/trim-exports): Envoy
// skips a callback that is not exported. Implementing another one here
// means adding its export there, or Envoy never calls it.
impl Context for Root {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let (Some(shared), Some(pending)) = (&self.shared, self.in_flight.remove(&token_id)) else {
            return;
        };
        let body = if status_code == 0 {
            hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, response_size)
                .ok()
                .flatten()
        } else {
            None
        };
        let host = shared.host();
        let c = &shared.compiled;
        match pending {
            Pending::Refill(refill, asked_at) => {
                on_refill_answer(c, &host, &refill, asked_at, status_code, body.as_deref());
            }
            Pending::Push(push) => on_push_answer(c, &host, &push, status_code, body.as_deref()),
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        init_logging();
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => {
                log::error!("cannot read the plugin configuration: {e:?}");
                return false;
            }
        };
        match parse_plugin_config(&bytes) {
            Ok((config, warnings)) => {
                for w in warnings {
                    log::warn!("configuration warning: {w}");
                }
                let metrics = Metrics::define(config.limits.all_groups().map(|g| g.name.as_str()));
                let slot_secret = if config.local.enabled {
                    create_slots(config.local.slots);
                    slot_secret(&metrics)
                } else {
                    SlotSecret::from_bytes([0; SlotSecret::BYTES])
                };
                let compiled = Compiled::new(config);
                let groups = || compiled.config.limits.all_groups();
                let leases = groups().any(|g| LeaseParams::for_group(&compiled, g).is_some());
                let syncs = groups().any(|g| SyncParams::for_group(&compiled, g).is_some());
                let sync_interval_ms =
                    syncs.then_some(u64::from(compiled.config.local.sync_interval_ms));
                let tick_ms = match (leases, sync_interval_ms) {
                    (true, Some(s)) => Some(s.min(u64::from(LEASE_TICK_MS))),
                    (true, None) => Some(u64::from(LEASE_TICK_MS)),
                    (false, s) => s,
                };
                if let Some(ms) = tick_ms {
                    if let Err(e) = hostcalls::set_tick_period(Duration::from_millis(ms)) {
                        log::warn!(
                            "lease/sync: cannot set the tick period ({e:?}): no refills or pushes"
                        );
                    }
                }
                self.shared = Some(Rc::new(Shared {
                    compiled,
                    metrics,
                    slot_secret,
                    dispatch_warnings: LogThrottle::new(),
                    refills: RefCell::new(Vec::new()),
                    tracked: RefCell::new(HashMap::new()),
                    sync_interval_ms,
                }));
                true
            }
            Err(errors) => {
                for e in errors {
                    log::error!("invalid configuration: {e}");
                }
                false
            }
        }
    }

    /// Sends the lease refills this worker's streams asked for since the
    /// last tick: from the root context, so the answer comes back here even
    /// when the stream that asked has ended.
    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let queued = match shared.refills.try_borrow_mut() {
            Ok(mut q) => std::mem::take(&mut *q),
            Err(_) => return,
        };
        let c = &shared.compiled;
        let host = shared.host();
        for refill in queued {
            let now = host.now_ms();
            let sent = refill_message(c, &refill).map(|message| ask_service(c, &message));
            match sent {
                Some(Ok(token)) => {
                    self.in_flight.insert(token, Pending::Refill(refill, now));
                }
                _ => store_outcome(
                    c,
                    &host,
                    refill.group,
                    refill.at,
                    now,
                    refill.batch,
                    0,
                    Outcome::Failed,
                ),
            }
        }
        if let Some(interval) = shared.sync_interval_ms {
            let now = host.now_ms();
            if now >= self.next_sync_ms {
                self.next_sync_ms = now.saturating_add(interval);
                self.push_syncs(&shared);
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            shared: self.shared.clone(),
            stream: Stream::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    /// None only if Envoy created a stream without a configured root.
    shared: Option<Rc<Shared>>,
    stream: Stream,
}

fn action(next: Next) -> Action {
    match next {
        Next::Continue => Action::Continue,
        Next::Pause => Action::Pause,
    }
}

impl Context for Http {
    fn on_grpc_call_response(&mut self, _token_id: u32, status_code: u32, response_size: usize) {
        match &self.shared {
            Some(shared) => self.stream.on_rls_answer(
                &shared.compiled,
                &shared.host(),
                status_code,
                response_size,
            ),
            None => {
                let _ = hostcalls::resume_http_request();
            }
        }
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        match &self.shared {
            Some(shared) => action(
                self.stream
                    .on_request_headers(&shared.compiled, &shared.host()),
            ),
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        match &self.shared {
            Some(shared) => action(self.stream.on_response_headers(&shared.host())),
            None => Action::Continue,
        }
    }
}
