//! The `rpc_envelope` fuzz target: its body is `tether_fuzz::rpc_envelope::run`
//! (src/rpc_envelope.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::rpc_envelope::run(data));
