//! The `fabric_file` fuzz target: its body is `tether_fuzz::fabric_file::run`
//! (src/fabric_file.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::fabric_file::run(data));
