//! Fuzz the requests `tether engine --fault-hook` takes (docs/ENGINE.md,
//! "The engine fault campaign"): arbitrary bytes. No panic; what parses is
//! two words, and writing them back parses to the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_engine::hook::parse;

fuzz_target!(|bytes: &[u8]| {
    if let Some((target, seed)) = parse(bytes) {
        assert!(!target.is_empty() && !target.contains(char::is_whitespace));
        assert_eq!(parse(format!("{target} {seed}").as_bytes()), Some((target, seed)));
    }
});
