//! The `fault_plan` fuzz target: its body is `tether_fuzz::fault_plan::run`
//! (src/fault_plan.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::fault_plan::run(data));
