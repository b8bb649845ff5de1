//! The `stat_board` fuzz target: its body is `tether_fuzz::stat_board::run`
//! (src/stat_board.rs), which tests/corpus.rs also replays on stable.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::stat_board::run(data));
