//! The pure parts of `ratelimit-counter`, as a library: the messages of
//! `envoy.service.ratelimit.v3.RateLimitService` ([`proto`], the filter's
//! own: `ratelimit_config::rls`) and the decision ([`decide`]: a call planned into requests at `now`, answered
//! from the counts), and the stores that hold the counts ([`store`]:
//! memory, Redis, Redis Cluster, Redis Sentinel, plain or TLS, and the
//! over-limit cache in front of them). The binary's glue (gRPC, HTTP, reloading the team files) is in
//! `main.rs` and its modules; the fuzz targets (`fuzz/`) use these.

pub mod bounds;
pub mod decide;
pub mod fleet;
pub mod regions;
pub use ratelimit_config::rls as proto;
pub mod store;
