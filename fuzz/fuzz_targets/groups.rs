//! The `groups` fuzz target: its body is `tether_fuzz::groups::run`
//! (src/groups.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::groups::run(data));
