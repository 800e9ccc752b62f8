//! What the request flow needs from Envoy, as a trait: the glue implements
//! it with proxy-wasm hostcalls, `testing::MemHost` in memory for the tests
//! and the benchmark. Every method returns the host's failure instead of
//! panicking; the flow decides what a failure means (see `flow`).

use crate::counters::{Counter, GroupCounter, Histogram};
use crate::health::LogThrottle;
use crate::lease::Refill;
use crate::local::{SlotRef, SlotSecret};

/// A host call that failed: what the host said, for the debug log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostError(pub String);

/// Why a shared-data call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharedDataError {
    /// Another writer changed the key since it was read (the CAS token given
    /// is stale).
    CasMismatch,
    /// Any other host failure.
    Host(HostError),
}

/// Envoy's shared data (one map per VM id, shared by every worker), with
/// its compare-and-swap: every value carries a CAS token that changes on
/// every write.
pub trait SharedData {
    /// The value under `key` and its CAS token; `(None, None)` when the key
    /// does not exist.
    fn get_shared(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), SharedDataError>;

    /// Writes `key` if its CAS token is still `cas` (`CasMismatch` if it is
    /// not); `cas` None always writes.
    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SharedDataError>;
}

/// Everything else the request flow asks of the host, for the stream it is
/// called for.
pub trait Host: SharedData {
    /// The request header `name`'s raw bytes, None when it is absent.
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError>;

    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Sends the gRPC call; its answer comes back in `Stream::on_rls_answer`.
    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<(), HostError>;

    /// The body of the gRPC answer, `size` bytes of it.
    fn grpc_response(&self, size: usize) -> Result<Option<Vec<u8>>, HostError>;

    /// Answers the request locally (it never reaches the upstream).
    fn send_reply(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<(), HostError>;

    /// Lets a request paused for the gRPC call go on.
    fn resume_request(&self) -> Result<(), HostError>;

    /// Adds a header to the upstream's response.
    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError>;

    /// Adds a header to the request, before it goes upstream (while it is
    /// paused for the service's answer).
    fn add_request_header(&self, name: &str, value: &str) -> Result<(), HostError>;

    /// Adds one to a counter (a failure to count is not worth failing for).
    fn count(&self, counter: Counter);

    /// Adds `n` to a counter of the group with index `group` (its position
    /// in `limits.all_groups()`, `Limited::group_index`).
    fn add_group(&self, group: usize, counter: GroupCounter, n: u64);

    /// Adds one to a group's counter.
    fn count_group(&self, group: usize, counter: GroupCounter) {
        self.add_group(group, counter, 1);
    }

    /// Records a value in a histogram (a failure to record is dropped).
    fn record(&self, histogram: Histogram, value: u64);

    /// The VM's throttle of the "cannot call the service" warning
    /// (`health::dispatch_failed`).
    fn dispatch_warnings(&self) -> &LogThrottle;
    /// Hands a lease refill to this worker's root context, which sends it
    /// on its next tick (a call from the stream would be cancelled with it).
    fn request_refill(&self, refill: Refill);

    /// Sync mode: this worker's root context pushes the unsynced hits of
    /// this tenant (of group `group`, at slot `at`) from now on, every
    /// `local.sync.interval_ms`, until it has nothing left to push.
    fn track_sync(&self, group: usize, tenant: &str, at: SlotRef);

    /// The key of the slot hash, agreed at configure (`local::secret`):
    /// no host call.
    fn slot_secret(&self) -> SlotSecret;

    /// Sets a property of this stream that Envoy's access log can print:
    /// proxy-wasm `set_property`, which Envoy keeps as the filter state
    /// `wasm.<name>` (`%FILTER_STATE(wasm.<name>:PLAIN)%`).
    fn set_property(&self, name: &str, value: &str) -> Result<(), HostError>;
}
