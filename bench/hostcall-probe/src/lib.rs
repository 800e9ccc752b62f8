//! A proxy-wasm filter that makes one kind of host call N times per
//! request, and nothing else: `make bench-hostcalls`' probe
//! (bench/hostcalls.py). Its plugin configuration is a JSON object
//! `{"kind": "<kind>", "n": <N>}`; every request then goes on to the
//! upstream. The calls are made as the filter makes them (the same
//! arguments' sizes: a tenant header, a 180-byte slot, the route name
//! property, ...), so that the slope of Envoy's CPU per request between
//! N = 0 and N = k is what one such call costs. Written against the ABI
//! (v0.2.1, github.com/proxy-wasm/spec) with no SDK.
//!
//! Kinds made from `proxy_on_request_headers`: `get_request_header`,
//! `get_request_header_absent`, `get_property` (the route name),
//! `get_tenant_property` (`request.headers.x-tenant-id`, as the filter
//! reads the tenant), `get_shared_data`,
//! `set_shared_data`, `cas_update` (a get, then a set with its CAS token),
//! `increment_metric`, `record_metric`, `get_current_time`,
//! `get_log_level`, `log_disabled` (a debug line, which Envoy at its info
//! level drops), `set_property`, `refusal_properties` (the four
//! properties the filter sets on a refusal, in turn: with N = 4 the
//! access log of envoy/envoy.yaml.tmpl writes its line for the request),
//! `set_effective_context` (to the stream
//! itself), `grpc_call` (a ShouldRateLimit call to the `ratelimit`
//! cluster, its answer taken in `proxy_on_grpc_receive`). From
//! `proxy_on_response_headers`: `get_response_header`,
//! `add_response_header`. `none` makes no call (as N = 0).

use std::cell::Cell;
use std::ptr::null_mut;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
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
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
    ) -> u32;
    fn proxy_set_property(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
}

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

const OK: u32 = 0;
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const PLUGIN_CONFIGURATION: u32 = 7;
const COUNTER: u32 = 0;
const HISTOGRAM: u32 = 2;
const DEBUG: u32 = 1;
/// The shared-data keys the probe reads and writes in turn (the filter's
/// slots are `trl.<i>`, 180 bytes each).
const KEYS: usize = 64;
const SLOT_BYTES: usize = 180;
/// A ShouldRateLimit request: domain "probe", one descriptor ("k", "v").
/// The service answers OK for a domain it does not know.
const RLS_REQUEST: [u8; 17] = [
    0x0a, 5, b'p', b'r', b'o', b'b', b'e', 0x12, 8, 0x0a, 6, 0x0a, 1, b'k', 0x12, 1, b'v',
];
/// What the filter sets on a refusal, for Envoy's access log.
const REFUSAL_PROPERTIES: [(&str, &str); 4] = [
    ("tenant_ratelimit_tenant", "probe-tenant"),
    ("tenant_ratelimit_group", "default"),
    ("tenant_ratelimit_verdict", "refused"),
    ("tenant_ratelimit_source", "bucket"),
];
/// An empty header map (its pair count).
const NO_METADATA: [u8; 4] = [0; 4];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    None,
    GetRequestHeader,
    GetRequestHeaderAbsent,
    GetProperty,
    GetTenantProperty,
    GetSharedData,
    SetSharedData,
    CasUpdate,
    IncrementMetric,
    RecordMetric,
    GetCurrentTime,
    GetLogLevel,
    LogDisabled,
    SetProperty,
    RefusalProperties,
    SetEffectiveContext,
    GrpcCall,
    GetResponseHeader,
    AddResponseHeader,
}

const KINDS: [(&str, Kind); 19] = [
    ("none", Kind::None),
    ("get_request_header", Kind::GetRequestHeader),
    ("get_request_header_absent", Kind::GetRequestHeaderAbsent),
    ("get_property", Kind::GetProperty),
    ("get_tenant_property", Kind::GetTenantProperty),
    ("get_shared_data", Kind::GetSharedData),
    ("set_shared_data", Kind::SetSharedData),
    ("cas_update", Kind::CasUpdate),
    ("increment_metric", Kind::IncrementMetric),
    ("record_metric", Kind::RecordMetric),
    ("get_current_time", Kind::GetCurrentTime),
    ("get_log_level", Kind::GetLogLevel),
    ("log_disabled", Kind::LogDisabled),
    ("set_property", Kind::SetProperty),
    ("refusal_properties", Kind::RefusalProperties),
    ("set_effective_context", Kind::SetEffectiveContext),
    ("grpc_call", Kind::GrpcCall),
    ("get_response_header", Kind::GetResponseHeader),
    ("add_response_header", Kind::AddResponseHeader),
];

thread_local! {
    static KIND: Cell<Kind> = const { Cell::new(Kind::None) };
    static N: Cell<u32> = const { Cell::new(0) };
    static COUNTER_ID: Cell<u32> = const { Cell::new(0) };
    static HISTOGRAM_ID: Cell<u32> = const { Cell::new(0) };
    static NEXT_KEY: Cell<usize> = const { Cell::new(0) };
}

/// What the host returned in memory it allocated through
/// `proxy_on_memory_allocate`: freed here.
///
/// # Safety
/// `data` is null or came from `proxy_on_memory_allocate(size)`.
unsafe fn free(data: *mut u8, size: usize) -> usize {
    if data.is_null() {
        return 0;
    }
    let v = Vec::from_raw_parts(data, size, size);
    v.len()
}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut buf: Vec<u8> = Vec::new();
    if buf.try_reserve_exact(size).is_err() {
        return null_mut();
    }
    buf.resize(size, 0);
    Box::into_raw(buf.into_boxed_slice()).cast::<u8>()
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: called once, by the host, before any other export.
    #[cfg(target_os = "wasi")]
    unsafe {
        __wasm_call_ctors()
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_id: u32, _parent: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> u32 {
    1
}

/// The value of `"key":` in a flat JSON object: a string's contents or a
/// number's digits.
fn field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{key}\""))? + key.len() + 2;
    let rest = json.get(at..)?.trim_start().strip_prefix(':')?.trim_start();
    match rest.strip_prefix('"') {
        Some(s) => s.split('"').next(),
        None => rest.split(|c: char| !c.is_ascii_digit()).next(),
    }
}

/// `{"kind": ..., "n": ...}`; anything else is refused (0).
#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, _size: usize) -> u32 {
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host writes a pointer it allocated and its size.
    let s = unsafe {
        proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, usize::MAX, &mut data, &mut size)
    };
    if s != OK || data.is_null() {
        return 0;
    }
    // SAFETY: `data` came from `proxy_on_memory_allocate(size)`.
    let bytes = unsafe { Vec::from_raw_parts(data, size, size) };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return 0;
    };
    let kind = field(text, "kind").and_then(|k| KINDS.iter().find(|(name, _)| *name == k));
    let n = field(text, "n").and_then(|n| n.parse::<u32>().ok());
    let (Some(&(_, kind)), Some(n)) = (kind, n) else {
        return 0;
    };
    KIND.with(|k| k.set(kind));
    N.with(|c| c.set(n));
    let define = |kind: u32, name: &str| {
        let mut id = 0;
        // SAFETY: the host reads `name` and writes one u32.
        unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) };
        id
    };
    COUNTER_ID.with(|c| c.set(define(COUNTER, "probe.counter")));
    HISTOGRAM_ID.with(|c| c.set(define(HISTOGRAM, "probe.histogram")));
    let slot = [7u8; SLOT_BYTES];
    for i in 0..KEYS {
        let key = format!("probe.{i}");
        // SAFETY: the host reads both for their lengths.
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), slot.as_ptr(), slot.len(), 0) };
    }
    1
}

/// The next shared-data key, in turn.
fn next_key() -> String {
    let i = NEXT_KEY.with(|c| {
        let i = c.get();
        c.set((i + 1) % KEYS);
        i
    });
    format!("probe.{i}")
}

fn get_header(map: u32, name: &str) -> usize {
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host reads `name` and writes a pointer it allocated.
    unsafe {
        proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size);
        free(data, size)
    }
}

/// `get_shared_data` of `key`: the value's size and its CAS token.
fn get_shared(key: &str) -> (usize, u32) {
    let (mut data, mut size, mut cas) = (null_mut(), 0, 0);
    // SAFETY: the host reads `key` and writes a pointer it allocated.
    unsafe {
        proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas);
        (free(data, size), cas)
    }
}

fn get_property(path: &str) -> usize {
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: the host reads `path` and writes a pointer it allocated.
    unsafe {
        proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size);
        free(data, size)
    }
}

fn set_shared(key: &str, value: &[u8], cas: u32) -> u32 {
    // SAFETY: the host reads `key` and `value` for their lengths.
    unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) }
}

/// One call of `kind` for stream `id`; what it returned, so that nothing
/// is optimised away.
fn call(kind: Kind, id: u32, i: u32) -> u64 {
    match kind {
        Kind::None => 0,
        Kind::GetRequestHeader => get_header(REQUEST_HEADERS, "x-tenant-id") as u64,
        Kind::GetRequestHeaderAbsent => get_header(REQUEST_HEADERS, "x-probe-absent") as u64,
        Kind::GetResponseHeader => get_header(RESPONSE_HEADERS, "content-type") as u64,
        Kind::GetProperty => get_property("xds\0route_name\0") as u64,
        Kind::GetTenantProperty => get_property("request\0headers\0x-tenant-id") as u64,
        Kind::GetSharedData => get_shared(&next_key()).0 as u64,
        Kind::SetSharedData => {
            let slot = [i as u8; SLOT_BYTES];
            u64::from(set_shared(&next_key(), &slot, 0))
        }
        Kind::CasUpdate => {
            let key = next_key();
            let (_, cas) = get_shared(&key);
            let slot = [i as u8; SLOT_BYTES];
            u64::from(set_shared(&key, &slot, cas))
        }
        Kind::IncrementMetric => {
            // SAFETY: no memory is passed.
            u64::from(unsafe { proxy_increment_metric(COUNTER_ID.with(Cell::get), 1) })
        }
        Kind::RecordMetric => {
            // SAFETY: no memory is passed.
            u64::from(unsafe { proxy_record_metric(HISTOGRAM_ID.with(Cell::get), 3) })
        }
        Kind::GetCurrentTime => {
            let mut t = 0;
            // SAFETY: the host writes one u64.
            unsafe { proxy_get_current_time_nanoseconds(&mut t) };
            t
        }
        Kind::GetLogLevel => {
            let mut level = 0;
            // SAFETY: the host writes one u32.
            unsafe { proxy_get_log_level(&mut level) };
            u64::from(level)
        }
        Kind::LogDisabled => {
            let line = "probe: a debug line Envoy drops at its info level";
            // SAFETY: the host reads `line` for its length.
            u64::from(unsafe { proxy_log(DEBUG, line.as_ptr(), line.len()) })
        }
        Kind::SetProperty => {
            let (name, value) = ("probe_verdict", "refused");
            // SAFETY: the host reads both for their lengths.
            u64::from(unsafe {
                proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len())
            })
        }
        Kind::RefusalProperties => {
            let (name, value) = REFUSAL_PROPERTIES[i as usize % REFUSAL_PROPERTIES.len()];
            // SAFETY: the host reads both for their lengths.
            u64::from(unsafe {
                proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len())
            })
        }
        Kind::SetEffectiveContext => {
            // SAFETY: no memory is passed.
            u64::from(unsafe { proxy_set_effective_context(id) })
        }
        Kind::GrpcCall => {
            let (upstream, service, method) = (
                "ratelimit",
                "envoy.service.ratelimit.v3.RateLimitService",
                "ShouldRateLimit",
            );
            let mut token = 0;
            // SAFETY: the host reads every buffer for its length and
            // writes one u32.
            unsafe {
                proxy_grpc_call(
                    upstream.as_ptr(),
                    upstream.len(),
                    service.as_ptr(),
                    service.len(),
                    method.as_ptr(),
                    method.len(),
                    NO_METADATA.as_ptr(),
                    NO_METADATA.len(),
                    RLS_REQUEST.as_ptr(),
                    RLS_REQUEST.len(),
                    1000,
                    &mut token,
                )
            };
            u64::from(token)
        }
        Kind::AddResponseHeader => {
            let (name, value) = ("x-probe", "1");
            // SAFETY: the host reads both for their lengths.
            u64::from(unsafe {
                proxy_add_header_map_value(
                    RESPONSE_HEADERS,
                    name.as_ptr(),
                    name.len(),
                    value.as_ptr(),
                    value.len(),
                )
            })
        }
    }
}

/// N calls of the configured kind, if it belongs to this callback.
fn calls(id: u32, response: bool) {
    let kind = KIND.with(Cell::get);
    if matches!(kind, Kind::GetResponseHeader | Kind::AddResponseHeader) != response {
        return;
    }
    let mut sink = 0u64;
    for i in 0..N.with(Cell::get) {
        sink = sink.wrapping_add(call(kind, id, i));
    }
    std::hint::black_box(sink);
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _headers: usize, _end: u32) -> u32 {
    calls(id, false);
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, _headers: usize, _end: u32) -> u32 {
    calls(id, true);
    0
}

/// The answer to a `grpc_call` (Envoy answers every call on the root
/// context): not read.
#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive(_root: u32, _token: u32, _size: usize) {}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_close(_root: u32, _token: u32, _status: u32) {}

/// Nothing is kept per stream.
#[no_mangle]
pub extern "C" fn proxy_on_delete(_id: u32) {}
