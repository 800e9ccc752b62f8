//! tenant-ratelimit: per-tenant, fleet-wide rate limits for Envoy.
//!
//! A proxy-wasm HTTP filter that takes the tenant from a request header,
//! sends one descriptor per limited unit to the Envoy rate-limit service in
//! one `ShouldRateLimit` call, answers 429 with X-RateLimit-* headers and
//! Retry-After, and fails open (counted) when the limiter breaks.
//!
//! Start with `flow`: the whole request flow, as pure code over the `Host`
//! trait (`host`). It uses `decision` (first step, verdict, headers),
//! `local` (token bucket, over-limit cache, slots in shared data), `proto`
//! (the gRPC messages) and `counters`. `glue` is the only module that names
//! proxy-wasm: it implements `Host` with hostcalls, registers the contexts
//! and reads the plugin configuration; it is compiled for the wasm32-wasip1
//! build only. `testing` is an in-memory `Host` for the tests and the
//! benchmark.

pub mod access_log;
pub mod cost;
pub mod counters;
pub mod decision;
pub mod flow;
pub mod headers;
pub mod health;
pub mod host;
pub mod lease;
pub mod local;
pub mod modes;
pub mod proto;
pub mod sync;

#[cfg(any(test, not(target_arch = "wasm32")))]
pub mod testing;

#[cfg(all(target_arch = "wasm32", target_os = "wasi", not(test)))]
mod glue;
