//! The `hook_request` fuzz target: its body is `tether_fuzz::hook_request::run`
//! (src/hook_request.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::hook_request::run(data));
