//! The ports: what the filter asks of Envoy, as two traits. The glue
//! implements them with proxy-wasm hostcalls, `testing::MemHost` in memory
//! for the tests and the benchmark. Only what Envoy provides is here (shared
//! data, the request and response, gRPC, the clock, metrics, properties);
//! what a VM keeps between callbacks is `vm::Vm`. Every method returns the
//! host's failure instead of panicking; the caller decides what a failure
//! means (see `flow` and `root`).

use std::fmt;

use crate::counters::{Counter, Gauge, GroupCounter, Histogram};
use crate::group::GroupId;

/// A call of the ports, to say which one failed (and, in the tests, to
/// make one fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCall {
    RequestHeader,
    GetShared,
    SetShared,
    Dispatch,
    GrpcResponse,
    Reply,
    Resume,
    AddHeader,
    SetProperty,
    AddRequestHeader,
    RouteName,
    ResponseHeader,
    ResponseTrailer,
    Property,
}

impl HostCall {
    pub const fn name(self) -> &'static str {
        match self {
            HostCall::RequestHeader => "request_header",
            HostCall::GetShared => "get_shared",
            HostCall::SetShared => "set_shared",
            HostCall::Dispatch => "dispatch_grpc",
            HostCall::GrpcResponse => "grpc_response",
            HostCall::Reply => "send_reply",
            HostCall::Resume => "resume_request",
            HostCall::AddHeader => "add_response_header",
            HostCall::SetProperty => "set_property",
            HostCall::AddRequestHeader => "add_request_header",
            HostCall::RouteName => "route_name",
            HostCall::ResponseHeader => "response_header",
            HostCall::ResponseTrailer => "response_trailer",
            HostCall::Property => "get_property",
        }
    }
}

/// A host call that failed: which, and the proxy-wasm status the host
/// answered (`proxy_wasm::types::Status` as its number: 1 not found, 2 bad
/// argument, 8 CAS mismatch, 10 internal failure, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostError {
    pub call: HostCall,
    pub status: u32,
}

impl HostError {
    /// proxy-wasm's `InternalFailure`.
    pub const INTERNAL_FAILURE: u32 = 10;
    /// proxy-wasm's `CasMismatch`.
    pub const CAS_MISMATCH: u32 = 8;

    pub const fn new(call: HostCall, status: u32) -> HostError {
        HostError { call, status }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed (status {})", self.call.name(), self.status)
    }
}

impl std::error::Error for HostError {}

/// Why a shared-data call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedDataError {
    /// Another writer changed the key since it was read (the CAS token given
    /// is stale).
    CasMismatch,
    /// Any other host failure.
    Host(HostError),
}

impl fmt::Display for SharedDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedDataError::CasMismatch => f.write_str("shared data: CAS mismatch"),
            SharedDataError::Host(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SharedDataError {}

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

/// Everything else the filter asks of Envoy, for the context it is called
/// for (a stream, or the root context).
pub trait Host: SharedData {
    /// The request header `name`'s raw bytes, None when it is absent. Of a
    /// header sent more than once, the first value (Envoy's
    /// `get_header_map_value`).
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError>;

    /// The name of the route the request matched (Envoy's `xds.route_name`
    /// property), None when it has none.
    fn route_name(&self) -> Result<Option<Vec<u8>>, HostError>;

    /// The upstream response's header `name`, None when it is absent.
    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostError>;

    /// The upstream response's trailer `name`, None when it is absent.
    fn response_trailer(&self, name: &str) -> Result<Option<Vec<u8>>, HostError>;
    /// An Envoy attribute of this stream (proxy-wasm `get_property`): its
    /// raw bytes, as Envoy serializes it (a string as it is; a number as 8
    /// bytes), `Some` of nothing for an empty one, None when it is absent.
    /// `path` is the attribute's segments joined by NUL, as proxy-wasm
    /// takes it (`request\0headers\0x-tenant-id`: every value of that
    /// header, joined by `,`).
    fn property(&self, path: &str) -> Result<Option<Vec<u8>>, HostError>;

    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Sends the gRPC call; returns its token. Envoy answers it on the
    /// worker's root context, under that token (`Root::on_answer`).
    fn dispatch_grpc(
        &self,
        upstream: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError>;

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

    /// Adds `n` to a counter (a failure to count is the host's to log).
    fn add(&self, counter: Counter, n: u64);

    /// Adds one to a counter.
    fn count(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// Adds `n` to a counter of group `group`.
    fn add_group(&self, group: GroupId, counter: GroupCounter, n: u64);

    /// Adds one to a group's counter.
    fn count_group(&self, group: GroupId, counter: GroupCounter) {
        self.add_group(group, counter, 1);
    }

    /// Adds one to the requests counter of the route at `route` in the
    /// routes of group `group`:
    /// `tenant_ratelimit.route.<route>.requests`.
    fn count_route(&self, group: GroupId, route: usize);

    /// Records a value in a histogram (a failure to record is the host's to
    /// log).
    fn record(&self, histogram: Histogram, value: u64);

    /// Sets a gauge (a failure to set it is the host's to log).
    fn set_gauge(&self, gauge: Gauge, value: u64);

    /// Sets a property of this stream that Envoy's access log can print:
    /// proxy-wasm `set_property`, which Envoy keeps as the filter state
    /// `wasm.<name>` (`%FILTER_STATE(wasm.<name>:PLAIN)%`).
    fn set_property(&self, name: &str, value: &str) -> Result<(), HostError>;
}
