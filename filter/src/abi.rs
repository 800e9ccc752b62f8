//! The proxy-wasm ABI (v0.2.1) as the filter uses it: the host functions
//! it imports, each wrapped to return the host's status as an error (never
//! a panic), the memory the host allocates in the module, and the
//! module-level exports. Written from the ABI specification
//! (github.com/proxy-wasm/spec), without an SDK: the filter needs a dozen
//! host functions, and routes every gRPC answer by its token itself
//! (Envoy makes every call on the root context and answers it there,
//! whichever context sent it). The callbacks Envoy calls on contexts
//! (`proxy_on_*`) are the glue's (`glue`), which keeps the contexts.
//!
//! Every wrapper is a thin `unsafe` call: the host reads the memory it is
//! given for the length given, and writes what it returns into memory it
//! allocates through `proxy_on_memory_allocate`, which the wrapper then
//! owns. The wasm32-wasip1 build only.

use std::ptr::{null, null_mut};

/// A host status other than OK, as its number: 1 not found, 2 bad
/// argument, 8 CAS mismatch, 10 internal failure, ...
pub type Status = u32;

const OK: Status = 0;
const NOT_FOUND: Status = 1;

/// Header maps.
pub const REQUEST_HEADERS: u32 = 0;
pub const RESPONSE_HEADERS: u32 = 2;
pub const RESPONSE_TRAILERS: u32 = 3;
/// Buffers.
pub const GRPC_RECEIVE_BUFFER: u32 = 5;
pub const PLUGIN_CONFIGURATION: u32 = 7;
/// Metric kinds.
pub const COUNTER: u32 = 0;
pub const GAUGE: u32 = 1;
pub const HISTOGRAM: u32 = 2;
/// `proxy_continue_stream`'s request stream.
const HTTP_REQUEST: u32 = 0;

/// Log levels, as the host numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message: *const u8, size: usize) -> Status;
    fn proxy_get_log_level(level: *mut u32) -> Status;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> Status;
    fn proxy_set_tick_period_milliseconds(period: u32) -> Status;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> Status;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
    ) -> Status;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> Status;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
        cas: *mut u32,
    ) -> Status;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> Status;
    fn proxy_continue_stream(stream: u32) -> Status;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> Status;
    fn proxy_grpc_call(
        upstream: *const u8,
        upstream_size: usize,
        service: *const u8,
        service_size: usize,
        method: *const u8,
        method_size: usize,
        metadata: *const u8,
        metadata_size: usize,
        message: *const u8,
        message_size: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> Status;
    fn proxy_set_effective_context(context_id: u32) -> Status;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> Status;
    fn proxy_increment_metric(id: u32, offset: i64) -> Status;
    fn proxy_record_metric(id: u32, value: u64) -> Status;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
    ) -> Status;
    fn proxy_set_property(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> Status;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    /// WASI's `random_get`: Envoy fills the buffer with BoringSSL's
    /// `RAND_bytes` and answers 0 (an error only for a buffer over 64 KiB
    /// or outside memory).
    fn random_get(buf: *mut u8, buf_len: usize) -> i32;
}

fn status(s: Status) -> Result<(), Status> {
    if s == OK {
        Ok(())
    } else {
        Err(s)
    }
}

/// What the host returned in memory it allocated: owned from here on.
/// SAFETY (for the callers): `data` is null or came from
/// `proxy_on_memory_allocate(size)`.
unsafe fn returned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        Vec::from_raw_parts(data, size, size)
    }
}

/// Allocates `size` bytes for the host to write into; the wrapper that
/// asked the host then owns them (`returned`). Null when memory runs out:
/// the ABI's "cannot allocate".
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    #[cfg(feature = "hostcall-count")]
    hostcall_count::allocated();
    let mut buf: Vec<u8> = Vec::new();
    if buf.try_reserve_exact(size).is_err() {
        return null_mut();
    }
    buf.resize(size, 0);
    // A boxed slice has a capacity of exactly `size`, as `returned`
    // rebuilds it.
    Box::into_raw(buf.into_boxed_slice()).cast::<u8>()
}

/// The ABI version this module speaks (never called).
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// Called once when Envoy loads the module: runs the static constructors
/// of the C library and of std (a reactor module has no `_start`).
#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: called once, by the host, before any other export.
    unsafe { __wasm_call_ctors() }
}

pub fn log(level: Level, message: &str) -> Result<(), Status> {
    tally(Kind::Log);
    // SAFETY: the host reads `message.len()` bytes of `message`.
    status(unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) })
}

pub fn log_level() -> Result<Level, Status> {
    tally(Kind::GetLogLevel);
    let mut level = 0;
    // SAFETY: the host writes one u32.
    status(unsafe { proxy_get_log_level(&mut level) })?;
    Ok(match level {
        0 => Level::Trace,
        1 => Level::Debug,
        2 => Level::Info,
        3 => Level::Warn,
        4 => Level::Error,
        _ => Level::Critical,
    })
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> Result<u64, Status> {
    tally(Kind::CurrentTime);
    let mut t = 0;
    // SAFETY: the host writes one u64.
    status(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

/// The root context's `proxy_on_tick` period (from a root callback).
pub fn set_tick_period_ms(period: u32) -> Result<(), Status> {
    tally(Kind::SetTickPeriod);
    // SAFETY: no memory is passed.
    status(unsafe { proxy_set_tick_period_milliseconds(period) })
}

/// Up to `max` bytes of buffer `kind` from `start`; None when there is none.
pub fn buffer(kind: u32, start: usize, max: usize) -> Result<Option<Vec<u8>>, Status> {
    tally(Kind::GetBuffer);
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host writes a pointer it allocated and its size.
    match unsafe { proxy_get_buffer_bytes(kind, start, max, &mut data, &mut size) } {
        OK if data.is_null() => Ok(None),
        // SAFETY: `data` came from `proxy_on_memory_allocate(size)`.
        OK => Ok(Some(unsafe { returned(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// The value of header `name` of map `map`, as raw bytes; None when absent.
pub fn header(map: u32, name: &str) -> Result<Option<Vec<u8>>, Status> {
    tally(Kind::get_header(map));
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host reads `name` and writes a pointer it allocated.
    match unsafe {
        proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size)
    } {
        // SAFETY: `data` is null or came from `proxy_on_memory_allocate`.
        OK => Ok(Some(unsafe { returned(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

pub fn add_header(map: u32, name: &str, value: &str) -> Result<(), Status> {
    tally(Kind::add_header(map));
    // SAFETY: the host reads both strings for their lengths.
    status(unsafe {
        proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    })
}

/// The value under `key` and its CAS token (`(None, None)`: no such key).
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
    tally(Kind::GetSharedData);
    let (mut data, mut size, mut cas) = (null_mut(), 0, 0);
    // SAFETY: the host reads `key` and writes a pointer it allocated, its
    // size and the CAS token.
    let s =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match s {
        OK => {
            let cas = (cas != 0).then_some(cas);
            // SAFETY: `data` came from `proxy_on_memory_allocate(size)`.
            let value = (!data.is_null()).then(|| unsafe { returned(data, size) });
            Ok((value, cas))
        }
        NOT_FOUND => Ok((None, None)),
        s => Err(s),
    }
}

/// Writes `key` if its CAS token is still `cas` (`None`: always); a stale
/// token is the status 8 (CAS mismatch).
pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    tally(Kind::SetSharedData);
    // SAFETY: the host reads `key` and `value` for their lengths.
    status(unsafe {
        proxy_set_shared_data(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    })
}

/// Lets the request of the effective context go on (Envoy does it after
/// the callback returns).
pub fn resume_request() -> Result<(), Status> {
    tally(Kind::ContinueStream);
    // SAFETY: no memory is passed.
    status(unsafe { proxy_continue_stream(HTTP_REQUEST) })
}

/// Answers the request of the effective context locally.
pub fn send_local_response(code: u32, headers: &[(&str, &str)], body: &str) -> Result<(), Status> {
    tally(Kind::SendLocalResponse);
    let map = serialize_map(headers);
    // SAFETY: the host reads `body` and `map` for their lengths.
    status(unsafe {
        proxy_send_local_response(
            code,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    })
}

/// Sends a gRPC call with its initial metadata (`serialize_map`'s bytes);
/// its token. Its answer comes to `proxy_on_grpc_receive` or
/// `proxy_on_grpc_close` of the root context.
pub fn grpc_call(
    upstream: &str,
    service: &str,
    method: &str,
    metadata: &[u8],
    message: &[u8],
    timeout_ms: u32,
) -> Result<u32, Status> {
    tally(Kind::GrpcCall);
    let mut token = 0;
    // SAFETY: the host reads every buffer for its length and writes one u32.
    status(unsafe {
        proxy_grpc_call(
            upstream.as_ptr(),
            upstream.len(),
            service.as_ptr(),
            service.len(),
            method.as_ptr(),
            method.len(),
            metadata.as_ptr(),
            metadata.len(),
            message.as_ptr(),
            message.len(),
            timeout_ms,
            &mut token,
        )
    })?;
    Ok(token)
}

/// Makes `context_id` (any context of this VM) the one the following host
/// calls of this callback act for; status 2 (bad argument) when it is gone.
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    tally(Kind::SetEffectiveContext);
    // SAFETY: no memory is passed.
    status(unsafe { proxy_set_effective_context(context_id) })
}

pub fn define_metric(kind: u32, name: &str) -> Result<u32, Status> {
    tally(Kind::DefineMetric);
    let mut id = 0;
    // SAFETY: the host reads `name` and writes one u32.
    status(unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn increment_metric(id: u32, n: i64) -> Result<(), Status> {
    tally(Kind::IncrementMetric);
    // SAFETY: no memory is passed.
    status(unsafe { proxy_increment_metric(id, n) })
}

pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    tally(Kind::RecordMetric);
    // SAFETY: no memory is passed.
    status(unsafe { proxy_record_metric(id, value) })
}

/// A property of the effective context (`path`'s segments, e.g.
/// `["xds", "route_name"]`); None when it has none.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    tally(Kind::GetProperty);
    // Each segment followed by a NUL, as the ABI's SDKs serialise a path.
    let path: String = path.iter().flat_map(|p| [*p, "\0"]).collect();
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host reads `path` and writes a pointer it allocated.
    match unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) } {
        OK if data.is_null() => Ok(None),
        // SAFETY: `data` came from `proxy_on_memory_allocate(size)`.
        OK => Ok(Some(unsafe { returned(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// A property of the effective context by its serialised path (segments
/// joined by NUL), as raw bytes: `Some` of nothing for an empty value,
/// None when it has none.
pub fn property_at(path: &str) -> Result<Option<Vec<u8>>, Status> {
    tally(Kind::GetProperty);
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host reads `path` and writes a pointer it allocated.
    match unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) } {
        // SAFETY: `data` is null or came from `proxy_on_memory_allocate`.
        OK => Ok(Some(unsafe { returned(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// Sets a property of the effective context (one path segment): Envoy
/// keeps it as the filter state `wasm.<name>`.
pub fn set_property(name: &str, value: &str) -> Result<(), Status> {
    tally(Kind::SetProperty);
    // SAFETY: the host reads both for their lengths.
    status(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Fills `buf` with random bytes (WASI); the WASI errno on failure.
pub fn random(buf: &mut [u8]) -> Result<(), i32> {
    tally(Kind::RandomGet);
    // SAFETY: the host writes at most `buf.len()` bytes into `buf`.
    match unsafe { random_get(buf.as_mut_ptr(), buf.len()) } {
        0 => Ok(()),
        errno => Err(errno),
    }
}

/// A header map as the ABI passes it: the number of pairs, each pair's
/// two lengths, then each name and value followed by a NUL (all numbers
/// u32, little-endian).
pub fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let len = |s: &str| u32::try_from(s.len()).unwrap_or(u32::MAX).to_le_bytes();
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 10 + k.len() + v.len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&u32::try_from(pairs.len()).unwrap_or(0).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&len(k));
        out.extend_from_slice(&len(v));
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// A host call's kind, as the `hostcall-count` build counts it.
#[cfg_attr(not(feature = "hostcall-count"), allow(dead_code))]
#[derive(Clone, Copy)]
enum Kind {
    Log,
    GetLogLevel,
    CurrentTime,
    SetTickPeriod,
    GetBuffer,
    GetRequestHeader,
    GetResponseHeader,
    GetResponseTrailer,
    AddRequestHeader,
    AddResponseHeader,
    GetSharedData,
    SetSharedData,
    ContinueStream,
    SendLocalResponse,
    GrpcCall,
    SetEffectiveContext,
    DefineMetric,
    IncrementMetric,
    RecordMetric,
    GetProperty,
    SetProperty,
    RandomGet,
    /// Not a host call: the host calling `proxy_on_memory_allocate` to
    /// hand back what a call returns (a crossing into the VM).
    MemoryAllocate,
}

impl Kind {
    fn get_header(map: u32) -> Kind {
        match map {
            REQUEST_HEADERS => Kind::GetRequestHeader,
            RESPONSE_HEADERS => Kind::GetResponseHeader,
            _ => Kind::GetResponseTrailer,
        }
    }

    fn add_header(map: u32) -> Kind {
        match map {
            REQUEST_HEADERS => Kind::AddRequestHeader,
            _ => Kind::AddResponseHeader,
        }
    }
}

/// Counts one host call of `kind` (the `hostcall-count` build only; the
/// shipped .wasm compiles this to nothing).
#[inline(always)]
fn tally(kind: Kind) {
    #[cfg(feature = "hostcall-count")]
    hostcall_count::count(kind);
    #[cfg(not(feature = "hostcall-count"))]
    let _ = kind;
}

/// The `hostcall-count` build (cargo feature, off by default, never
/// shipped): every host call the wrappers above make is counted by kind
/// in a proxy-wasm counter `hostcall.<kind>` (Envoy's /stats:
/// `wasmcustom.hostcall.<kind>`), so that N requests of a scenario through
/// a real Envoy give the calls per request of each kind (bench/hostcalls.py).
/// Each count is flushed right after the call it counts, by raw
/// `proxy_define_metric` / `proxy_increment_metric` calls that are not
/// themselves counted; `proxy_on_memory_allocate` (called by the host in
/// the middle of a host call) only adds to a pending count, flushed by the
/// next counted call.
#[cfg(feature = "hostcall-count")]
mod hostcall_count {
    use std::cell::Cell;

    use super::{Kind, COUNTER, OK};

    const KINDS: usize = Kind::MemoryAllocate as usize + 1;
    const NAMES: [&str; KINDS] = [
        "hostcall.log",
        "hostcall.get_log_level",
        "hostcall.get_current_time",
        "hostcall.set_tick_period",
        "hostcall.get_buffer",
        "hostcall.get_request_header",
        "hostcall.get_response_header",
        "hostcall.get_response_trailer",
        "hostcall.add_request_header",
        "hostcall.add_response_header",
        "hostcall.get_shared_data",
        "hostcall.set_shared_data",
        "hostcall.continue_stream",
        "hostcall.send_local_response",
        "hostcall.grpc_call",
        "hostcall.set_effective_context",
        "hostcall.define_metric",
        "hostcall.increment_metric",
        "hostcall.record_metric",
        "hostcall.get_property",
        "hostcall.set_property",
        "hostcall.random_get",
        "hostcall.memory_allocate",
    ];

    thread_local! {
        /// Each kind's metric id, once defined.
        static IDS: [Cell<Option<u32>>; KINDS] = Default::default();
        /// Allocations not yet flushed.
        static ALLOCATED: Cell<i64> = const { Cell::new(0) };
    }

    pub(super) fn allocated() {
        ALLOCATED.with(|a| a.set(a.get() + 1));
    }

    pub(super) fn count(kind: Kind) {
        add(kind as usize, 1);
        let pending = ALLOCATED.with(|a| a.replace(0));
        if pending > 0 {
            add(Kind::MemoryAllocate as usize, pending);
        }
    }

    fn add(index: usize, n: i64) {
        let (Some(name), Some(id)) = (
            NAMES.get(index),
            IDS.with(|ids| ids.get(index).map(|c| c.get())),
        ) else {
            return;
        };
        let id = match id {
            Some(id) => id,
            None => {
                let mut id = 0;
                // SAFETY: the host reads `name` and writes one u32.
                let s = unsafe {
                    super::proxy_define_metric(COUNTER, name.as_ptr(), name.len(), &mut id)
                };
                if s != OK {
                    return;
                }
                IDS.with(|ids| ids.get(index).map(|c| c.set(Some(id))));
                id
            }
        };
        // SAFETY: no memory is passed.
        let _ = unsafe { super::proxy_increment_metric(id, n) };
    }
}
