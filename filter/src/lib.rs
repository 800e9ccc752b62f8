//! tenant-ratelimit: per-tenant, fleet-wide rate limits for Envoy.
//!
//! A proxy-wasm HTTP filter that takes the tenant from a request header (or
//! from an Envoy attribute, such as a verified JWT claim),
//! sends one descriptor per limited unit to the Envoy rate-limit service in
//! a `ShouldRateLimit` call (shared with the worker's other requests),
//! answers 429 with X-RateLimit-* headers and Retry-After, and fails open
//! (counted) when the limiter breaks.
//!
//! Start with `flow` (a request) and `root` (a worker's root context): both
//! are pure code over the ports (`host`) and a VM's state (`vm`). `glue` and
//! `abi` are the only modules that name proxy-wasm. No module depends on a
//! module that depends on it back (`tests/module_graph.rs` checks it). The
//! modules, one line each (docs/architecture.md tells the whole story):
//!
//! - `flow`: one request, from its headers to its response.
//! - `root`: what a worker's root context does at configure, on a tick and
//!   on an answer; its pass over the tenants it tracks (lease refills, sync
//!   pushes: `pass_tracked`).
//! - `modes`: the local layer's outcome for one request, by the group's
//!   mode (exact, lease, sync).
//! - `answer_path`: everything an answer leaves (the tenant's slot, its
//!   route's, the fallback's entry, the counters), for a request or the
//!   root's own calls, and where it goes (beside `batch`, which sends the
//!   calls); `flow` only turns the verdict into a reply.
//! - `lease`: lease mode's state machine (reserve a batch, spend it).
//! - `sync`: sync mode's state machine (admit against a view, push hits).
//! - `tenant`: the request's tenant, read from its source (a header, or an
//!   Envoy attribute): missing, sent more than once, or its raw value.
//! - `compiled`: the configuration compiled once per VM, and each group's
//!   part of it by `GroupId` (the group, its scope, its mode).
//! - `group`: `GroupId`, a group by its position, the key of all that is
//!   kept per group.
//! - `decision`: the first step, the call's message, the verdict from the
//!   service's answer.
//! - `answer`: the service's answer, decoded once.
//! - `breaker`: when the service keeps failing, no calls, one probe per
//!   interval (one state per Envoy, in shared data).
//! - `fallback`: `on_failure: local`, each Envoy's share of every limit
//!   while the service cannot decide.
//! - `fleet`: this Envoy's id in its calls, and the fleet's size the
//!   counter answers, kept for the fallback's share.
//! - `headers`: the rate-limit headers written, and the service's headers
//!   forwarded.
//! - `cost`: a request's cost (`cost_header`).
//! - `access_log`: the properties Envoy's access log prints for refusals.
//! - `health`: the service call's latency, and the throttled warning when
//!   it cannot be sent.
//! - `counters`: every counter and histogram, with its stat name.
//! - `window`: window arithmetic (clock-aligned windows).
//! - `proto`: the gRPC messages of the rate-limit service.
//! - `host`: the ports, what the filter asks of Envoy, and their errors.
//! - `batch`: one worker's calls to the service: requests and the root's
//!   refills and pushes queued, sent as one call, the answer split back.
//! - `vm`: what one VM keeps between callbacks (the slot secret, the
//!   worker's calls, the root's mailbox).
//! - `id_map`: maps by keys spread already (context ids, call tokens, slot
//!   fingerprints), hashed as they are.
//! - `local`: the local layer, decided before any call:
//!   - `local::bucket`: token-bucket arithmetic;
//!   - `local::over_limit`: the over-limit cache and its headers;
//!   - `local::placement`: where a tenant lives (its scope: the instance
//!     and group; keyed hash, slot key);
//!   - `local::slot`: a slot's state, its encoding, who owns it;
//!   - `local::state`: the plain state each mode keeps in a slot (the codec
//!     depends on no mode);
//!   - `local::cas`: the read-modify-write of a slot under CAS;
//!   - `local::names`: the rule names of cached refusals;
//!   - `local::secret`: the slot secret every VM agrees on.
//! - `testing`: an in-memory host for the tests and the benchmark (native
//!   builds only).
//! - `abi`: the proxy-wasm ABI's host functions and module exports, each
//!   host call returning its status as an error (the wasm32-wasip1 build
//!   only).
//! - `glue`: the proxy-wasm adapter: implements the ports, keeps the
//!   contexts, reads the configuration, delivers each answer to its stream
//!   (the wasm32-wasip1 build only).

pub mod access_log;
pub mod answer;
pub mod answer_path;
pub mod batch;
pub mod breaker;
pub mod compiled;
pub mod cost;
pub mod counters;
pub mod decision;
pub mod fallback;
pub mod fleet;
pub mod flow;
pub mod group;
pub mod headers;
pub mod health;
pub mod host;
pub mod id_map;
pub mod lease;
pub mod local;
pub mod modes;
pub mod proto;
pub mod root;
pub mod sync;
pub mod tenant;
pub mod vm;
pub mod window;

#[cfg(any(test, not(target_arch = "wasm32")))]
pub mod testing;

#[cfg(all(target_arch = "wasm32", target_os = "wasi", not(test)))]
pub mod abi;
#[cfg(all(target_arch = "wasm32", target_os = "wasi", not(test)))]
mod glue;
