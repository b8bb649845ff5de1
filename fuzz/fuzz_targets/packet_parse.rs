//! The `packet_parse` fuzz target: its body is `tether_fuzz::packet_parse::run`
//! (src/packet_parse.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::packet_parse::run(data));
