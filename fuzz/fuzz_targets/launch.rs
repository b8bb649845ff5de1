//! The `launch` fuzz target: its body is `tether_fuzz::launch::run`
//! (src/launch.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::launch::run(data));
