//! The control of ../sdk: the same call from every request's
//! `proxy_on_request_headers`, the ABI's exports written by hand, and the
//! answers counted by the context Envoy gives them to.
//!
//! Counters: `probe.sent`, `probe.send_failed`, `probe.answered_root`,
//! `probe.answered_elsewhere`.

use std::cell::Cell;
use std::ptr::null;

#[link(wasm_import_module = "env")]
extern "C" {
    #[allow(clippy::too_many_arguments)]
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
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
}

thread_local! {
    static ROOT: Cell<u32> = const { Cell::new(0) };
}

fn count(name: &str) {
    let mut id = 0;
    // SAFETY: the name and the id outlive the calls.
    unsafe {
        if proxy_define_metric(0, name.as_ptr(), name.len(), &mut id) == 0 {
            proxy_increment_metric(id, 1);
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    Box::into_raw(vec![0u8; size].into_boxed_slice()).cast()
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, _size: usize) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(id: u32, parent: u32) {
    if parent == 0 {
        ROOT.with(|r| r.set(id));
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_id: u32, _headers: usize, _end: u32) -> u32 {
    let (u, s, m) = (
        "rls",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ShouldRateLimit",
    );
    let mut token = 0;
    // SAFETY: every pointer is valid for its size during the call.
    let status = unsafe {
        proxy_grpc_call(
            u.as_ptr(),
            u.len(),
            s.as_ptr(),
            s.len(),
            m.as_ptr(),
            m.len(),
            null(),
            0,
            b"".as_ptr(),
            0,
            500,
            &mut token,
        )
    };
    count(if status == 0 {
        "probe.sent"
    } else {
        "probe.send_failed"
    });
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_close(context: u32, _token: u32, _status: u32) {
    let on_root = ROOT.with(Cell::get) == context;
    count(if on_root {
        "probe.answered_root"
    } else {
        "probe.answered_elsewhere"
    });
}
