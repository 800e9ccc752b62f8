//! The proxy-wasm adapter: reads what the pure core needs from the host, and
//! carries out its decisions. Every host call goes through the SDK's
//! `hostcalls` functions, which return errors instead of panicking; any
//! surprise is treated as a limiter failure (fail open unless
//! `failure_mode_deny`).

use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use ratelimit_config::parse_plugin_config;

use crate::decision::{encode_request, first_step, verdict, Compiled, RlsError, Step, Verdict};
use crate::local::{
    admit, remember_over_limit, slot_for, update, LocalVerdict, SharedStore, SlotKey, SlotRef,
    StoreError, UpdateError, CAS_ATTEMPTS, SLOT_BYTES,
};
use crate::proto::{METHOD, SERVICE};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

fn log(level: LogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

fn debug_enabled() -> bool {
    matches!(
        hostcalls::get_log_level(),
        Ok(LogLevel::Trace | LogLevel::Debug)
    )
}

/// The filter's counters, as Envoy stats.
#[derive(Clone, Copy, Default)]
enum Counter {
    #[default]
    Allowed,
    OverLimit,
    FailureModeAllowed,
    FailureModeDenied,
    RlsError,
    MissingTenant,
    LocalOverLimit,
    CachedOverLimit,
    CasRetriesExhausted,
    LocalError,
    SlotContended,
}

const COUNTERS: [(Counter, &str); 11] = [
    (Counter::Allowed, "tenant_ratelimit.allowed"),
    (Counter::OverLimit, "tenant_ratelimit.over_limit"),
    (
        Counter::FailureModeAllowed,
        "tenant_ratelimit.failure_mode_allowed",
    ),
    (
        Counter::FailureModeDenied,
        "tenant_ratelimit.failure_mode_denied",
    ),
    (Counter::RlsError, "tenant_ratelimit.rls_error"),
    (Counter::MissingTenant, "tenant_ratelimit.missing_tenant"),
    (Counter::LocalOverLimit, "tenant_ratelimit.local_over_limit"),
    (
        Counter::CachedOverLimit,
        "tenant_ratelimit.cached_over_limit",
    ),
    (
        Counter::CasRetriesExhausted,
        "tenant_ratelimit.cas_retries_exhausted",
    ),
    (Counter::LocalError, "tenant_ratelimit.local_error"),
    (Counter::SlotContended, "tenant_ratelimit.slot_contended"),
];

#[derive(Default)]
struct Metrics([Option<u32>; COUNTERS.len()]);

impl Metrics {
    fn define() -> Metrics {
        let mut m = Metrics::default();
        for (i, (_, name)) in COUNTERS.iter().enumerate() {
            match hostcalls::define_metric(MetricType::Counter, name) {
                Ok(id) => {
                    if let Some(slot) = m.0.get_mut(i) {
                        *slot = Some(id);
                    }
                }
                Err(e) => log(
                    LogLevel::Warn,
                    &format!("cannot define metric {name}: {e:?}"),
                ),
            }
        }
        m
    }

    fn inc(&self, c: Counter) {
        if let Some(Some(id)) = self.0.get(c as usize) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }
}

/// Milliseconds since the Unix epoch, from the host's clock.
fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The local layer's slots in Envoy's shared data (one map per VM id,
/// shared by every worker): keys `trl.0` … `trl.<slots-1>`, short enough to
/// need no allocation of their own in Envoy.
struct HostSlots;

impl SharedStore for HostSlots {
    fn get(&self, index: u32) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        hostcalls::get_shared_data(SlotKey::new(index).as_str())
            .map_err(|e| StoreError::Host(format!("{e:?}")))
    }

    fn set(&self, index: u32, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(SlotKey::new(index).as_str(), Some(value), cas) {
            Ok(()) => Ok(()),
            Err(proxy_wasm::types::Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(e) => Err(StoreError::Host(format!("{e:?}"))),
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
        log(
            LogLevel::Warn,
            &format!("local layer: {failed} of {slots} slots could not be created"),
        );
    }
}

struct Shared {
    compiled: Compiled,
    metrics: Metrics,
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

// The built .wasm exports only the callbacks implemented in this file
// (`WASM_EXPORTS` in the Makefile, applied by tools/trim-exports): Envoy
// skips a callback that is not exported. Implementing another one here
// means adding its export there, or Envoy never calls it.
impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => {
                log(
                    LogLevel::Error,
                    &format!("cannot read the plugin configuration: {e:?}"),
                );
                return false;
            }
        };
        match parse_plugin_config(&bytes) {
            Ok((config, warnings)) => {
                for w in warnings {
                    log(LogLevel::Warn, &format!("configuration warning: {w}"));
                }
                if config.local.enabled {
                    create_slots(config.local.slots);
                }
                self.shared = Some(Rc::new(Shared {
                    compiled: Compiled::new(config),
                    metrics: Metrics::define(),
                }));
                true
            }
            Err(errors) => {
                for e in errors {
                    log(LogLevel::Error, &format!("invalid configuration: {e}"));
                }
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            shared: self.shared.clone(),
            response_headers: Vec::new(),
            slot: None,
            asked_at_ms: 0,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    /// None only if Envoy created a stream without a configured root.
    shared: Option<Rc<Shared>>,
    /// X-RateLimit-* headers to add to the upstream response (admitted
    /// requests only: local replies carry their own).
    response_headers: Vec<(&'static str, String)>,
    /// The tenant's local-layer slot, when the layer is on.
    slot: Option<SlotRef>,
    /// When the call to the service went out (for the over-limit cache).
    asked_at_ms: u64,
}

impl Http {
    /// Sends a 429 for the limiter with these headers.
    fn over_limit_reply(&self, headers: &[(&'static str, String)]) -> Action {
        let mut h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        h.push(("x-envoy-ratelimited", "true"));
        self.local_reply(429, &h, "rate limit exceeded\n")
    }

    /// A failure of the local layer skips it (the service still decides).
    fn on_local_error(shared: &Shared, e: &UpdateError) {
        match e {
            UpdateError::CasRetriesExhausted => shared.metrics.inc(Counter::CasRetriesExhausted),
            UpdateError::Host(why) => {
                shared.metrics.inc(Counter::LocalError);
                if debug_enabled() {
                    log(LogLevel::Debug, &format!("local layer error: {why}"));
                }
            }
        }
    }

    /// Sends a local reply; `Action::Pause` when it went out, else
    /// `Action::Continue`, so that a host failure lets the request through
    /// instead of leaving it stuck.
    fn local_reply(&self, status: u32, headers: &[(&str, &str)], body: &str) -> Action {
        match hostcalls::send_http_response(status, headers.to_vec(), Some(body.as_bytes())) {
            Ok(()) => Action::Pause,
            Err(e) => {
                log(
                    LogLevel::Error,
                    &format!("cannot send a local reply: {e:?}"),
                );
                Action::Continue
            }
        }
    }

    /// The limiter failed: count it, then fail open or deny.
    fn on_limiter_error(&self, shared: &Shared, why: &RlsError) -> Action {
        shared.metrics.inc(Counter::RlsError);
        if debug_enabled() {
            log(LogLevel::Debug, &format!("limiter error: {why:?}"));
        }
        let config = &shared.compiled.config;
        if config.failure_mode_deny {
            shared.metrics.inc(Counter::FailureModeDenied);
            self.local_reply(
                u32::from(config.status_on_error),
                &[],
                "rate limiter unavailable\n",
            )
        } else {
            shared.metrics.inc(Counter::FailureModeAllowed);
            Action::Continue
        }
    }
}

impl Context for Http {
    fn on_grpc_call_response(&mut self, _token_id: u32, status_code: u32, response_size: usize) {
        let Some(shared) = self.shared.clone() else {
            let _ = hostcalls::resume_http_request();
            return;
        };
        let body = if status_code == 0 {
            hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, response_size)
                .ok()
                .flatten()
        } else {
            None
        };
        let action = match verdict(shared.compiled.config.headers, status_code, body.as_deref()) {
            Verdict::Allow(headers) => {
                shared.metrics.inc(Counter::Allowed);
                self.response_headers = headers;
                Action::Continue
            }
            Verdict::OverLimit(headers, statuses) => {
                shared.metrics.inc(Counter::OverLimit);
                if let Some(at) = self.slot {
                    let asked_at = self.asked_at_ms;
                    let remembered = update(&HostSlots, at.index, CAS_ATTEMPTS, |stored| {
                        ((), remember_over_limit(stored, at, asked_at, &statuses))
                    });
                    if let Err(e) = remembered {
                        Self::on_local_error(&shared, &e);
                    }
                }
                self.over_limit_reply(&headers)
            }
            Verdict::Error(why) => self.on_limiter_error(&shared, &why),
        };
        // Paused since the request headers: resume unless a reply went out.
        if let Action::Continue = action {
            let _ = hostcalls::resume_http_request();
        }
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let compiled = &shared.compiled;
        let tenant = match hostcalls::get_map_value_bytes(
            MapType::HttpRequestHeaders,
            &compiled.config.limits.header,
        ) {
            Ok(t) => t,
            Err(e) => return self.on_limiter_error(&shared, &RlsError::Host(format!("{e:?}"))),
        };
        match first_step(compiled, tenant.as_deref()) {
            Step::Pass => {
                if tenant.as_deref().is_none_or(<[u8]>::is_empty) {
                    shared.metrics.inc(Counter::MissingTenant);
                }
                Action::Continue
            }
            Step::DenyMissingTenant => {
                shared.metrics.inc(Counter::MissingTenant);
                self.local_reply(429, &[], "missing tenant header\n")
            }
            Step::Limit(limited) => {
                let local = &compiled.config.local;
                if local.enabled {
                    let at = slot_for(&limited.group.name, &limited.tenant, local.slots);
                    let now = now_ms();
                    let bucket = local.bucket_for(limited.group);
                    let mode = compiled.config.headers;
                    match update(&HostSlots, at.index, CAS_ATTEMPTS, |stored| {
                        admit(stored, at, now, bucket, mode)
                    }) {
                        Ok(LocalVerdict::Proceed) => {}
                        Ok(LocalVerdict::Contended) => shared.metrics.inc(Counter::SlotContended),
                        Ok(LocalVerdict::BucketEmpty(headers)) => {
                            shared.metrics.inc(Counter::LocalOverLimit);
                            return self.over_limit_reply(&headers);
                        }
                        Ok(LocalVerdict::CachedOverLimit(headers)) => {
                            shared.metrics.inc(Counter::CachedOverLimit);
                            return self.over_limit_reply(&headers);
                        }
                        Err(e) => Self::on_local_error(&shared, &e),
                    }
                    self.slot = Some(at);
                    self.asked_at_ms = now;
                }
                let message = encode_request(compiled, &limited);
                let timeout = Duration::from_millis(u64::from(compiled.config.timeout_ms));
                match hostcalls::dispatch_grpc_call(
                    &compiled.upstream,
                    SERVICE,
                    METHOD,
                    Vec::new(),
                    Some(&message),
                    timeout,
                ) {
                    Ok(_) => Action::Pause,
                    Err(e) => self.on_limiter_error(&shared, &RlsError::Host(format!("{e:?}"))),
                }
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in self.response_headers.drain(..) {
            let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, &value);
        }
        Action::Continue
    }
}
