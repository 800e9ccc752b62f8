//! A proxy-wasm filter that answers every request with a 429 at once: the
//! cheapest wasm refusal (one VM call for the request headers, one
//! hostcall to answer). `make bench`'s `wasm_reply` configuration, the
//! floor of the filter's local shed. Written against the ABI (v0.2.1,
//! github.com/proxy-wasm/spec) with no SDK and no std: the module imports
//! `proxy_send_local_response` and nothing else.
#![no_std]

/// `proxy_on_request_headers`'s "stop iteration": the stream waits (here:
/// for the local reply already sent).
const PAUSE: u32 = 1;
/// A header map with no pair: its count (u32, little-endian) only.
const NO_HEADERS: [u8; 4] = [0; 4];

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
}

#[panic_handler]
fn on_panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// The ABI version this module speaks (never called).
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory for the host to write into: whole new pages (never freed). The
/// host writes only what the module asks for, and this module asks for
/// nothing, so it is not called; it must be exported all the same.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let pages = size.div_ceil(65536);
    match core::arch::wasm32::memory_grow(0, pages) {
        usize::MAX => core::ptr::null_mut(),
        first => (first * 65536) as *mut u8,
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_id: u32, _parent: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> u32 {
    1
}

/// Any plugin configuration is accepted (and not read).
#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, _size: usize) -> u32 {
    1
}

/// Every request: a 429, no body, no added header, then stop.
#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_id: u32, _headers: usize, _end: u32) -> u32 {
    // SAFETY: the host reads the (empty) header map for its 4 bytes; the
    // details and body are empty.
    unsafe {
        proxy_send_local_response(
            429,
            core::ptr::null(),
            0,
            core::ptr::null(),
            0,
            NO_HEADERS.as_ptr(),
            NO_HEADERS.len(),
            -1,
        );
    }
    PAUSE
}
