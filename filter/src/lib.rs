//! tenant-ratelimit: per-tenant, fleet-wide rate limits for Envoy.
//!
//! A proxy-wasm HTTP filter that takes the tenant from a request header,
//! sends one descriptor per limited unit to the Envoy rate-limit service in
//! one `ShouldRateLimit` call, answers 429 with X-RateLimit-* headers and
//! Retry-After, and fails open (counted) when the limiter breaks.
//!
//! Everything decidable lives in pure modules (`decision`, `proto`) that
//! build and test natively; `glue` is the thin proxy-wasm adapter, compiled
//! for wasm only.

pub mod decision;
pub mod local;
pub mod proto;

#[cfg(all(target_arch = "wasm32", not(test)))]
mod glue;
