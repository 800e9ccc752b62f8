//! The proxy-wasm adapter, and the only module that names proxy-wasm. It
//! does three things: implements the ports (`host`) with the SDK's
//! `hostcalls` (which return errors instead of panicking), registers the
//! root and HTTP contexts, and reads the plugin configuration. What happens
//! to a request is `flow`'s business, what a worker's root does `root`'s.

use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use ratelimit_config::parse_plugin_config;

use crate::counters::{Counter, Gauge, GroupCounter, Histogram, MetricIds, MetricKind};
use crate::decision::Compiled;
use crate::flow::{Next, Stream};
use crate::host::{Host, HostCall, HostError, SharedData, SharedDataError};
use crate::local::SlotSecret;
use crate::root::{self, Root};
use crate::vm::Vm;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Plugin::default()) });
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

/// A failed hostcall, as the ports say it.
fn failed(call: HostCall) -> impl Fn(Status) -> HostError {
    move |status| HostError::new(call, status as u32)
}

/// Defines a metric with Envoy (`MetricIds::define`).
fn define_metric(kind: MetricKind, name: &str) -> Option<u32> {
    let kind = match kind {
        MetricKind::Counter => MetricType::Counter,
        MetricKind::Histogram => MetricType::Histogram,
        MetricKind::Gauge => MetricType::Gauge,
    };
    hostcalls::define_metric(kind, name)
        .map_err(|e| log::warn!("cannot define metric {name}: status {}", e as u32))
        .ok()
}

/// A metric that cannot be updated is logged at debug, not counted: there
/// is no other metric to count it in.
fn add_metric(id: Option<u32>, n: u64) {
    if let Some(id) = id {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        if let Err(e) = hostcalls::increment_metric(id, n) {
            log::debug!("cannot update metric {id}: status {}", e as u32);
        }
    }
}

/// Records a histogram's value, or sets a gauge.
fn record_metric(id: Option<u32>, value: u64) {
    if let Some(id) = id {
        if let Err(e) = hostcalls::record_metric(id, value) {
            log::debug!("cannot record metric {id}: status {}", e as u32);
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
// when Envoy refuses to overwrite a property), and its `get_property` both
// panics on an unexpected status and reads an empty value as absent: the
// imports are called here instead, and their status returned as an error.
#[link(wasm_import_module = "env")]
#[allow(clashing_extern_declarations)]
extern "C" {
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
}

/// `xds.route_name`, as proxy-wasm serialises a property path: its parts,
/// each followed by a NUL.
const ROUTE_NAME_PATH: &[u8] = b"xds\0route_name\0";

/// 128 random bits for the slot secret; if `random_get` fails, a warning,
/// `slot_secret_fallback`, and the host's clock in nanoseconds instead,
/// which someone outside could only guess by knowing, to the nanosecond,
/// when this Envoy configured the filter.
fn draw_secret(host: &Envoy<'_>) -> SlotSecret {
    let mut buf = [0u8; SlotSecret::BYTES];
    // SAFETY: the host writes at most `buf.len()` bytes into `buf`.
    let errno = unsafe { random_get(buf.as_mut_ptr(), buf.len()) };
    if errno == 0 {
        return SlotSecret::from_bytes(buf);
    }
    log::warn!("random_get failed (WASI errno {errno}): the slot secret comes from the clock");
    host.count(Counter::SlotSecretFallback);
    SlotSecret::from_bytes(since_epoch().map_or(0, |d| d.as_nanos()).to_le_bytes())
}

fn since_epoch() -> Option<Duration> {
    hostcalls::get_current_time()
        .map_err(|e| log::debug!("cannot read the clock: status {}", e as u32))
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
}

/// The ports for one stream (or the root context), through proxy-wasm
/// hostcalls. Envoy routes each call to the context it is made for.
struct Envoy<'a>(&'a MetricIds);

impl SharedData for Envoy<'_> {
    fn get_shared(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedDataError> {
        hostcalls::get_shared_data(key)
            .map_err(|e| SharedDataError::Host(failed(HostCall::GetShared)(e)))
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(SharedDataError::CasMismatch),
            Err(e) => Err(SharedDataError::Host(failed(HostCall::SetShared)(e))),
        }
    }
}

impl Host for Envoy<'_> {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        // The `_bytes` getter: the SDK's other getters unwrap UTF-8.
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
            .map_err(failed(HostCall::RequestHeader))
    }

    fn route_name(&self) -> Result<Option<Vec<u8>>, HostError> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size = 0;
        // SAFETY: the host reads the path, and writes a buffer it allocated
        // with this module's allocator (`proxy_on_memory_allocate`, a Vec
        // of that capacity), which the Vec below takes over.
        let status = unsafe {
            proxy_get_property(
                ROUTE_NAME_PATH.as_ptr(),
                ROUTE_NAME_PATH.len(),
                &mut data,
                &mut size,
            )
        };
        match status {
            0 if data.is_null() => Ok(None),
            // SAFETY: see above.
            0 => Ok(Some(unsafe { Vec::from_raw_parts(data, size, size) })),
            // NotFound: no route.
            1 => Ok(None),
            other => Err(HostError::new(HostCall::RouteName, other)),
        }
    }

    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name)
            .map_err(failed(HostCall::ResponseHeader))
    }

    fn response_trailer(&self, name: &str) -> Result<Option<Vec<u8>>, HostError> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseTrailers, name)
            .map_err(failed(HostCall::ResponseTrailer))
    }

    fn property(&self, path: &str) -> Result<Option<Vec<u8>>, HostError> {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: the host reads `path.len()` bytes of `path`; on Ok it
        // writes the address and size of a buffer it allocated through
        // `proxy_on_memory_allocate` (this module's allocator, as a Vec of
        // that capacity), which the Vec below then owns.
        let status = unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) };
        match status {
            0 if data.is_null() => Ok(Some(Vec::new())),
            // SAFETY: as above: `size` bytes at `data`, allocated for us.
            0 => Ok(Some(unsafe { Vec::from_raw_parts(data, size, size) })),
            // NotFound.
            1 => Ok(None),
            other => Err(HostError::new(HostCall::Property, other)),
        }
    }

    fn now_ms(&self) -> u64 {
        since_epoch().map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        hostcalls::dispatch_grpc_call(
            upstream,
            service,
            method,
            Vec::new(),
            Some(message),
            timeout,
        )
        .map_err(failed(HostCall::Dispatch))
    }

    fn grpc_response(&self, size: usize) -> Result<Option<Vec<u8>>, HostError> {
        hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size)
            .map_err(failed(HostCall::GrpcResponse))
    }

    fn send_reply(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<(), HostError> {
        hostcalls::send_http_response(status, headers.to_vec(), Some(body.as_bytes()))
            .map_err(failed(HostCall::Reply))
    }

    fn resume_request(&self) -> Result<(), HostError> {
        hostcalls::resume_http_request().map_err(failed(HostCall::Resume))
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value)
            .map_err(failed(HostCall::AddHeader))
    }

    fn add_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value)
            .map_err(failed(HostCall::AddRequestHeader))
    }

    fn add(&self, counter: Counter, n: u64) {
        add_metric(self.0.counter(counter), n);
    }

    fn add_group(&self, group: usize, counter: GroupCounter, n: u64) {
        add_metric(self.0.group(group, counter), n);
    }

    fn record(&self, histogram: Histogram, value: u64) {
        record_metric(self.0.histogram(histogram), value);
    }

    fn set_gauge(&self, gauge: Gauge, value: u64) {
        record_metric(self.0.gauge(gauge), value);
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
            other => Err(HostError::new(HostCall::SetProperty, other)),
        }
    }
}

/// What every context of a VM shares once configured.
struct Shared {
    compiled: Compiled,
    metrics: MetricIds,
    vm: Vm,
}

/// The root context: the configuration, and the worker's `Root`.
#[derive(Default)]
struct Plugin {
    shared: Option<Rc<Shared>>,
    root: Root,
}

// The built .wasm exports only the callbacks implemented in this file
// (`WASM_EXPORTS` in the Makefile, applied by tools/trim-exports): Envoy
// skips a callback that is not exported. Implementing another one here
// means adding its export there, or Envoy never calls it.
impl Context for Plugin {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        if let Some(s) = &self.shared {
            let host = Envoy(&s.metrics);
            let (c, vm) = (&s.compiled, &s.vm);
            (self.root).on_answer(c, &host, vm, token_id, status_code, response_size);
        }
    }
}

impl RootContext for Plugin {
    fn on_configure(&mut self, _size: usize) -> bool {
        init_logging();
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                log::error!("cannot read the plugin configuration: status {}", e as u32);
                return false;
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
                return false;
            }
        };
        let groups = (config.limits.all_groups())
            .map(|g| (g.name.as_str(), config.metrics.exported(&g.name)));
        let metrics = MetricIds::define(groups, define_metric);
        let host = Envoy(&metrics);
        let slot_secret = if config.local.enabled {
            root::prepare_local(&host, config.local.slots, || draw_secret(&host))
        } else {
            SlotSecret::from_bytes([0; SlotSecret::BYTES])
        };
        let compiled = Compiled::new(config);
        root::prepare_failure(&host, &compiled);
        let tick = root::tick_ms(&compiled).map(Duration::from_millis);
        if let Some(Err(e)) = tick.map(hostcalls::set_tick_period) {
            let e = e as u32;
            log::warn!("lease/sync: cannot set the tick period (status {e}): no refills or pushes");
        }
        self.shared = Some(Rc::new(Shared {
            compiled,
            metrics,
            vm: Vm::new(slot_secret),
        }));
        true
    }

    fn on_tick(&mut self) {
        if let Some(s) = &self.shared {
            self.root.on_tick(&s.compiled, &Envoy(&s.metrics), &s.vm);
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
        let Some(s) = &self.shared else {
            // Never sent: a stream without a configuration asks nothing.
            return;
        };
        let host = Envoy(&s.metrics);
        (self.stream).on_rls_answer(&s.compiled, &host, &s.vm, status_code, response_size);
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        match &self.shared {
            Some(s) => action(self.stream.on_request_headers(
                &s.compiled,
                &Envoy(&s.metrics),
                &s.vm,
            )),
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        match &self.shared {
            Some(s) => action(self.stream.on_response_headers(
                &s.compiled,
                &Envoy(&s.metrics),
                &s.vm,
            )),
            None => Action::Continue,
        }
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        match &self.shared {
            Some(s) => action(self.stream.on_response_trailers(
                &s.compiled,
                &Envoy(&s.metrics),
                &s.vm,
            )),
            None => Action::Continue,
        }
    }
}
