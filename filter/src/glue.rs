//! The proxy-wasm adapter. It does four things: implements the ports
//! (`host`) with the ABI's host functions (`abi`), keeps the VM's contexts
//! (a root per plugin configuration, a stream per request), forwards each
//! of Envoy's callbacks to `flow::Stream` or `root::Root`, and delivers the
//! answers the root split out of a call to the streams they belong to,
//! acting for each (`set_effective_context`). What happens to a request is
//! `flow`'s business, what a worker's root does `root`'s.
//!
//! The built .wasm exports only the callbacks written here and in `abi`
//! (`WASM_EXPORTS` in the Makefile, applied by tools/trim-exports): Envoy
//! skips a callback that is not exported. A new one must be added there.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ratelimit_config::parse_plugin_config;

use crate::abi::{self, Level};
use crate::compiled::Compiled;
use crate::counters::{
    flush_due, route_stat_name, Counter, Gauge, GroupCounter, Histogram, MetricIds, MetricKind,
    STATS_FLUSH_MS,
};
use crate::fleet;
use crate::flow::{Next, Stream};
use crate::group::GroupId;
use crate::host::{Host, HostCall, HostError, SharedData, SharedDataError};
use crate::id_map::IdMap;
use crate::local::SlotSecret;
use crate::root::{self, Root};
use crate::vm::Vm;

/// `log`'s macros, to Envoy's log. A failed log call is dropped: there is
/// nowhere else to say so.
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
            log::Level::Trace => Level::Trace,
            log::Level::Debug => Level::Debug,
            log::Level::Info => Level::Info,
            log::Level::Warn => Level::Warn,
            log::Level::Error => Level::Error,
        };
        let _ = match record.args().as_str() {
            Some(literal) => abi::log(level, literal),
            None => abi::log(level, &record.args().to_string()),
        };
    }

    fn flush(&self) {}
}

/// Installs the logger (once per VM: a second call keeps the first) at the
/// level Envoy runs the wasm logger with, read once per VM: the level check
/// on the request path is then a comparison with `log::max_level()`.
fn init_logging() {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(match abi::log_level().unwrap_or(Level::Info) {
        Level::Trace => log::LevelFilter::Trace,
        Level::Debug => log::LevelFilter::Debug,
        Level::Info => log::LevelFilter::Info,
        Level::Warn => log::LevelFilter::Warn,
        Level::Error => log::LevelFilter::Error,
        // We log nothing at critical.
        Level::Critical => log::LevelFilter::Off,
    });
}

/// A failed host call, as the ports say it.
fn failed(call: HostCall) -> impl Fn(abi::Status) -> HostError {
    move |status| HostError::new(call, status)
}

/// Defines a metric; None (logged) when the host refuses it.
fn define_metric(kind: MetricKind, name: &str) -> Option<u32> {
    let kind = match kind {
        MetricKind::Counter => abi::COUNTER,
        MetricKind::Histogram => abi::HISTOGRAM,
        MetricKind::Gauge => abi::GAUGE,
    };
    abi::define_metric(kind, name)
        .map_err(|e| log::warn!("cannot define metric {name}: status {e}"))
        .ok()
}

/// The counts a VM kept since its last flush, to Envoy: one
/// `increment_metric` per counter that moved, and one for
/// `stats_flushes`. A metric that cannot be updated is logged at debug,
/// not counted: there is no other metric to count it in.
fn flush_counts(metrics: &MetricIds) {
    if let Some(id) = metrics.counter(Counter::StatsFlushes) {
        metrics.pending.add(id, 1);
    }
    metrics.pending.flush(|id, n| {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        if let Err(e) = abi::increment_metric(id, n) {
            log::debug!("cannot update metric {id}: status {e}");
        }
    });
}

/// Records a histogram's value, or sets a gauge.
fn record_metric(id: Option<u32>, value: u64) {
    if let Some(id) = id {
        if let Err(e) = abi::record_metric(id, value) {
            log::debug!("cannot record metric {id}: status {e}");
        }
    }
}

/// 128 random bits for the slot secret; if `random_get` fails, a warning,
/// `slot_secret_fallback`, and the host's clock in nanoseconds instead,
/// which someone outside could only guess by knowing, to the nanosecond,
/// when this Envoy configured the filter.
fn draw_secret(host: &Envoy<'_>) -> SlotSecret {
    let mut buf = [0u8; SlotSecret::BYTES];
    match abi::random(&mut buf) {
        Ok(()) => SlotSecret::from_bytes(buf),
        Err(errno) => {
            log::warn!(
                "random_get failed (WASI errno {errno}): the slot secret comes from the clock"
            );
            host.count(Counter::SlotSecretFallback);
            let nanos = u128::from(abi::now_ns().unwrap_or(0));
            SlotSecret::from_bytes(nanos.to_le_bytes())
        }
    }
}

/// This Envoy's id in every call's metadata (once per VM): the one its
/// VMs share, or drawn (random bytes; the clock if `random_get` fails).
fn name_this_envoy(host: &Envoy<'_>) {
    let named = CALL_METADATA.with(|m| m.try_borrow().map_or(true, |m| !m.is_empty()));
    if named {
        return;
    }
    let id = fleet::envoy_id(host, || {
        let mut buf = [0u8; fleet::ID_BYTES];
        if abi::random(&mut buf).is_err() {
            buf = abi::now_ns().unwrap_or(0).to_le_bytes();
        }
        buf
    });
    let metadata = abi::serialize_map(&[(ratelimit_config::rls::ENVOY_ID_HEADER, &id)]);
    CALL_METADATA.with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            *m = metadata;
        }
    });
}

/// The ports for the effective context (a stream, or the root context),
/// through the ABI, for one callback: the clock is read once in it (a
/// callback takes microseconds; the filter counts in milliseconds), and
/// counts are kept in the VM until the tick flushes them
/// (`counters::Pending`).
struct Envoy<'a> {
    metrics: &'a MetricIds,
    now_ms: Cell<Option<u64>>,
}

impl<'a> Envoy<'a> {
    fn new(metrics: &'a MetricIds) -> Envoy<'a> {
        Envoy::at(metrics, None)
    }

    /// The ports later in the same callback, the clock already read (or not).
    fn at(metrics: &'a MetricIds, now_ms: Option<u64>) -> Envoy<'a> {
        Envoy {
            metrics,
            now_ms: Cell::new(now_ms),
        }
    }

    fn add_metric(&self, id: Option<u32>, n: u64) {
        if let Some(id) = id {
            self.metrics.pending.add(id, n);
        }
    }
}

impl SharedData for Envoy<'_> {
    fn get_shared(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedDataError> {
        abi::shared_data(key).map_err(|e| SharedDataError::Host(failed(HostCall::GetShared)(e)))
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError> {
        match abi::set_shared_data(key, value, cas) {
            Ok(()) => Ok(()),
            Err(HostError::CAS_MISMATCH) => Err(SharedDataError::CasMismatch),
            Err(e) => Err(SharedDataError::Host(failed(HostCall::SetShared)(e))),
        }
    }
}

impl Host for Envoy<'_> {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        abi::header(abi::REQUEST_HEADERS, name).map_err(failed(HostCall::RequestHeader))
    }

    fn route_name(&self) -> Result<Option<Vec<u8>>, HostError> {
        abi::property(&["xds", "route_name"]).map_err(failed(HostCall::RouteName))
    }

    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        abi::header(abi::RESPONSE_HEADERS, name).map_err(failed(HostCall::ResponseHeader))
    }

    fn response_trailer(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        abi::header(abi::RESPONSE_TRAILERS, name).map_err(failed(HostCall::ResponseTrailer))
    }

    fn property(&self, path: &str) -> Result<Option<Vec<u8>>, HostError> {
        abi::property_at(path).map_err(failed(HostCall::Property))
    }

    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = abi::now_ns().map_or(0, |ns| ns / 1_000_000);
        self.now_ms.set(Some(now));
        now
    }

    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        CALL_METADATA
            .with(|m| {
                let m = m.try_borrow().ok();
                // No metadata: an empty map (its count, 0).
                let metadata = match m.as_deref() {
                    Some(m) if !m.is_empty() => m.as_slice(),
                    _ => &[0; 4],
                };
                abi::grpc_call(upstream, service, method, metadata, message, timeout_ms)
            })
            .map_err(failed(HostCall::Dispatch))
    }

    fn grpc_response(&self, size: usize) -> Result<Option<Vec<u8>>, HostError> {
        abi::buffer(abi::GRPC_RECEIVE_BUFFER, 0, size).map_err(failed(HostCall::GrpcResponse))
    }

    fn send_reply(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<(), HostError> {
        abi::send_local_response(status, headers, body).map_err(failed(HostCall::Reply))
    }

    fn resume_request(&self) -> Result<(), HostError> {
        abi::resume_request().map_err(failed(HostCall::Resume))
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        abi::add_header(abi::RESPONSE_HEADERS, name, value).map_err(failed(HostCall::AddHeader))
    }

    fn add_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        abi::add_header(abi::REQUEST_HEADERS, name, value)
            .map_err(failed(HostCall::AddRequestHeader))
    }

    fn add(&self, counter: Counter, n: u64) {
        self.add_metric(self.metrics.counter(counter), n);
    }

    fn add_group(&self, group: GroupId, counter: GroupCounter, n: u64) {
        self.add_metric(self.metrics.group(group, counter), n);
    }

    fn count_route(&self, group: GroupId, route: usize) {
        self.add_metric(self.metrics.route(group, route), 1);
    }

    fn record(&self, histogram: Histogram, value: u64) {
        record_metric(self.metrics.histogram(histogram), value);
    }

    fn set_gauge(&self, gauge: Gauge, value: u64) {
        record_metric(self.metrics.gauge(gauge), value);
    }

    fn set_property(&self, name: &str, value: &str) -> Result<(), HostError> {
        abi::set_property(name, value).map_err(failed(HostCall::SetProperty))
    }
}

/// What every context of a plugin configuration shares once configured.
struct Shared {
    compiled: Compiled,
    metrics: MetricIds,
    vm: Vm,
    /// The root has work on a tick (`root::tick_ms`); without, the tick
    /// only flushes the counts.
    root_ticks: bool,
    /// The tick period, in ms.
    tick_ms: u64,
    /// When the counts were last flushed (`counters::flush_due`).
    flushed_ms: Cell<u64>,
}

/// A root context: its configuration (None until configured), and the
/// worker's `Root`.
#[derive(Default)]
struct Plugin {
    shared: Option<Rc<Shared>>,
    root: Root,
}

/// A stream: its root's configuration (None: created before it), and
/// its `Stream`.
struct Http {
    shared: Option<Rc<Shared>>,
    stream: Stream,
}

/// Context ids are small distinct integers: no need to hash them.
type ById<T> = IdMap<u32, T>;

/// A context: a root context's plugin (boxed: there are a few, streams
/// many), or a stream. Context ids are unique across both.
enum Context {
    Root(Box<Plugin>),
    Http(Http),
}

thread_local! {
    /// Every call's initial metadata: this Envoy's id (`fleet::envoy_id`),
    /// serialized once, at the first configure.
    static CALL_METADATA: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };

    /// The VM's contexts. The table is borrowed only within one step of a
    /// callback: Envoy runs a resumed or answered request's next steps
    /// after the callback returns, so nothing calls back into the VM
    /// meanwhile (a borrow that fails anyway skips the step, silently:
    /// there is no state to log it with, and it has never been seen).
    static CONTEXTS: RefCell<ById<Context>> = RefCell::default();
}

/// A step on the table of contexts: a closure behind a vtable of one
/// method (a `dyn FnMut`'s vtable also holds a `call_once` copy of each
/// closure, never called).
trait OnContexts {
    fn run(&mut self, contexts: &mut ById<Context>);
}

impl<F: FnMut(&mut ById<Context>)> OnContexts for F {
    fn run(&mut self, contexts: &mut ById<Context>) {
        self(contexts)
    }
}

/// Runs `f` on the table of contexts, if it is not borrowed (one copy of
/// this for every caller).
fn on_contexts(f: &mut dyn OnContexts) {
    CONTEXTS.with(|c| {
        if let Ok(mut contexts) = c.try_borrow_mut() {
            f.run(&mut contexts);
        }
    });
}

/// Runs `f` on root `id`'s plugin, if it exists and is not borrowed.
fn with_root<T>(id: u32, f: impl FnOnce(&mut Plugin) -> T) -> Option<T> {
    let (mut f, mut out) = (Some(f), None);
    on_contexts(&mut |c: &mut ById<Context>| {
        if let (Some(Context::Root(p)), Some(f)) = (c.get_mut(&id), f.take()) {
            out = Some(f(p));
        }
    });
    out
}

/// Runs `f` on stream `id`, if it exists and is not borrowed.
fn with_stream<T>(id: u32, f: impl FnOnce(&mut Http) -> T) -> Option<T> {
    let (mut f, mut out) = (Some(f), None);
    on_contexts(&mut |c: &mut ById<Context>| {
        if let (Some(Context::Http(http)), Some(f)) = (c.get_mut(&id), f.take()) {
            out = Some(f(http));
        }
    });
    out
}

/// The answers `shared`'s root split out of its calls, each to its stream,
/// acting for it. A stream that has ended since is skipped.
fn deliver(shared: &Shared, now_ms: Option<u64>) {
    let host = Envoy::at(&shared.metrics, now_ms);
    for d in shared.vm.batch.take_deliveries() {
        if abi::set_effective_context(d.stream).is_err() {
            continue;
        }
        let delivered = with_stream(d.stream, |http| {
            (http.stream).on_answer(&shared.compiled, &host, &shared.vm, d.answer)
        });
        if delivered.is_none() {
            log::debug!("an answer for stream {} not delivered", d.stream);
        }
    }
}

fn action(next: Next) -> u32 {
    match next {
        Next::Continue => 0,
        Next::Pause => 1,
    }
}

/// A root context (`parent` 0) or a stream of the root `parent`.
#[no_mangle]
pub extern "C" fn proxy_on_context_create(id: u32, parent: u32) {
    let context = if parent == 0 {
        Context::Root(Box::default())
    } else {
        Context::Http(Http {
            shared: with_root(parent, |p| p.shared.clone()).flatten(),
            stream: Stream::new(id),
        })
    };
    let mut context = Some(context);
    on_contexts(&mut |c: &mut ById<Context>| {
        if let Some(context) = context.take() {
            c.insert(id, context);
        }
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> u32 {
    1
}

/// A root context's plugin configuration: parsed and compiled once, or
/// refused (0) with a log line naming the field.
#[no_mangle]
pub extern "C" fn proxy_on_configure(root: u32, _size: usize) -> u32 {
    init_logging();
    let bytes = match abi::buffer(abi::PLUGIN_CONFIGURATION, 0, usize::MAX) {
        Ok(b) => b.unwrap_or_default(),
        Err(e) => {
            log::error!("cannot read the plugin configuration: status {e}");
            return 0;
        }
    };
    let config = match parse_plugin_config(&bytes) {
        Ok((config, warnings)) => {
            warnings
                .iter()
                .for_each(|w| log::warn!("configuration warning: {w}"));
            config
        }
        Err(errors) => {
            errors
                .iter()
                .for_each(|e| log::error!("invalid configuration: {e}"));
            return 0;
        }
    };
    let groups =
        (config.limits.all_groups()).map(|g| (g.name.as_str(), config.metrics.exported(&g.name)));
    let mut metrics = MetricIds::define(groups, define_metric);
    // Each team-file route's counter.
    for g in config.limits.all_groups() {
        metrics.route_base.push(metrics.routes.len());
        for r in &g.routes {
            let id = define_metric(MetricKind::Counter, &route_stat_name(&r.name));
            metrics.routes.push(id);
        }
    }
    let host = Envoy::new(&metrics);
    name_this_envoy(&host);
    let slot_secret = if config.local.enabled {
        root::prepare_local(&host, config.local.slots, || draw_secret(&host))
    } else {
        SlotSecret::from_bytes([0; SlotSecret::BYTES])
    };
    let compiled = Compiled::new(config);
    root::prepare_failure(&host, &compiled);
    // Every configuration ticks: the counts go to Envoy on the tick.
    let root_tick = root::tick_ms(&compiled);
    let tick = root_tick.map_or(STATS_FLUSH_MS, |t| t.min(STATS_FLUSH_MS));
    if let Err(e) = abi::set_tick_period_ms(u32::try_from(tick).unwrap_or(u32::MAX)) {
        log::warn!(
            "cannot set the tick period (status {e}): no counts reach Envoy's stats, no lease refills or sync pushes"
        );
    }
    let shared = Rc::new(Shared {
        compiled,
        metrics,
        vm: Vm::new(slot_secret),
        root_ticks: root_tick.is_some(),
        tick_ms: tick,
        flushed_ms: Cell::new(0),
    });
    u32::from(with_root(root, |p| p.shared = Some(shared)).is_some())
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root: u32) {
    let shared = with_root(root, |p| {
        let s = p.shared.clone()?;
        let host = Envoy::new(&s.metrics);
        if s.root_ticks {
            p.root.on_tick(&s.compiled, &host, &s.vm);
        }
        let now = host.now_ms();
        Some((s, now))
    });
    if let Some(Some((s, now))) = shared {
        deliver(&s, Some(now));
        if flush_due(now, s.flushed_ms.get(), s.tick_ms) {
            flush_counts(&s.metrics);
            s.flushed_ms.set(now);
        }
    }
}

/// The answer to a call (Envoy answers every call on the root context).
fn on_grpc_answer(root: u32, token: u32, status: u32, size: usize) {
    let shared = with_root(root, |p| {
        let s = p.shared.clone()?;
        let host = Envoy::new(&s.metrics);
        p.root
            .on_answer(&s.compiled, &host, &s.vm, token, status, size);
        let now = host.now_ms.get();
        Some((s, now))
    });
    if let Some(Some((s, now))) = shared {
        deliver(&s, now);
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive(root: u32, token: u32, size: usize) {
    on_grpc_answer(root, token, 0, size);
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_close(root: u32, token: u32, status: u32) {
    on_grpc_answer(root, token, status, 0);
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _headers: usize, _end: u32) -> u32 {
    let step = with_stream(id, |http| {
        let s = http.shared.clone()?;
        let host = Envoy::new(&s.metrics);
        let next = (http.stream).on_request_headers(&s.compiled, &host, &s.vm);
        let now = host.now_ms.get();
        Some((next, s, now))
    });
    match step {
        Some(Some((next, s, now))) => {
            // A call that went out with other requests may have failed them.
            deliver(&s, now);
            action(next)
        }
        _ => action(Next::Continue),
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, _headers: usize, _end: u32) -> u32 {
    on_response(id, false)
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(id: u32, _trailers: usize) -> u32 {
    on_response(id, true)
}

/// The response's headers (`trailers` false) or trailers; then a charge
/// sent with other requests' parts may have failed them: they get their
/// answers.
fn on_response(id: u32, trailers: bool) -> u32 {
    let step = with_stream(id, |http| {
        let s = http.shared.clone()?;
        let (c, host, vm) = (&s.compiled, &Envoy::new(&s.metrics), &s.vm);
        let next = if trailers {
            (http.stream).on_response_trailers(c, host, vm)
        } else {
            (http.stream).on_response_headers(c, host, vm)
        };
        let now = host.now_ms.get();
        Some((next, s, now))
    });
    match step {
        Some(Some((next, s, now))) => {
            deliver(&s, now);
            action(next)
        }
        _ => action(Next::Continue),
    }
}

/// A context is gone: a stream's queued call is dropped (nothing is sent
/// for it); a root's state goes with it, its last counts flushed.
#[no_mangle]
pub extern "C" fn proxy_on_delete(id: u32) {
    let mut gone = None;
    on_contexts(&mut |c: &mut ById<Context>| gone = c.remove(&id));
    match gone {
        Some(Context::Http(Http {
            shared: Some(s), ..
        })) => {
            let host = Envoy::new(&s.metrics);
            Root::on_stream_end(&s.compiled, &host, &s.vm, id);
        }
        Some(Context::Root(p)) => {
            if let Some(s) = &p.shared {
                flush_counts(&s.metrics);
            }
        }
        _ => {}
    }
}
