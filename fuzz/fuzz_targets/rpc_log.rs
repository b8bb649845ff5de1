//! The `rpc_log` fuzz target: its body is `tether_fuzz::rpc_log::run`
//! (src/rpc_log.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::rpc_log::run(data));
