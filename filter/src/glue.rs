//! The proxy-wasm adapter: reads what the pure core needs from the host, and
//! carries out its decisions. Every host call goes through the SDK's
//! `hostcalls` functions, which return errors instead of panicking; any
//! surprise is treated as a limiter failure (fail open unless
//! `failure_mode_deny`).

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use ratelimit_config::parse_plugin_config;

use crate::decision::{first_step, verdict, Compiled, RlsError, Step, Verdict};
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
}

const COUNTERS: [(Counter, &str); 6] = [
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
];

#[derive(Default)]
struct Metrics([Option<u32>; 6]);

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

struct Shared {
    compiled: Compiled,
    metrics: Metrics,
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

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
}

impl Http {
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
            Verdict::OverLimit(headers) => {
                shared.metrics.inc(Counter::OverLimit);
                let mut h: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                h.push(("x-envoy-ratelimited", "true"));
                self.local_reply(429, &h, "rate limit exceeded\n")
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
            Step::Ask(message) => {
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
