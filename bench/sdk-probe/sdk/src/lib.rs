//! On the proxy-wasm SDK (0.2.5): every request makes one gRPC call from
//! its own `on_http_request_headers`, as the filter sends a request's call
//! at once, and counts the answers that reach a context. A request to
//! `/pause...` waits for its answer (and is resumed by it); any other goes
//! on at once, so its stream may end before the answer.
//!
//! Counters: `probe.sent`, `probe.send_failed`, `probe.answered_stream`,
//! `probe.answered_root`.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(Root));
}}

fn count(name: &str) {
    if let Ok(id) = hostcalls::define_metric(MetricType::Counter, name) {
        let _ = hostcalls::increment_metric(id, 1);
    }
}

struct Root;

impl Context for Root {
    fn on_grpc_call_response(&mut self, _token: u32, _status: u32, _size: usize) {
        count("probe.answered_root");
    }
}

impl RootContext for Root {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream))
    }
}

struct Stream;

impl Context for Stream {
    fn on_grpc_call_response(&mut self, _token: u32, _status: u32, _size: usize) {
        count("probe.answered_stream");
        let _ = hostcalls::resume_http_request();
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end: bool) -> Action {
        let sent = hostcalls::dispatch_grpc_call(
            "rls",
            "envoy.service.ratelimit.v3.RateLimitService",
            "ShouldRateLimit",
            vec![],
            Some(b""),
            Duration::from_millis(500),
        );
        count(if sent.is_ok() {
            "probe.sent"
        } else {
            "probe.send_failed"
        });
        let path = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, ":path");
        match path {
            Ok(Some(p)) if p.starts_with(b"/pause") => Action::Pause,
            _ => Action::Continue,
        }
    }
}
