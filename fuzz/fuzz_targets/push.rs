#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tenant_ratelimit_fuzz::push::check(data));
