//! Fuzz the requests `tether engine --fault-hook` takes (docs/ENGINE.md,
//! "The engine fault campaign"): arbitrary bytes. No panic; what parses is
//! two words, and writing them back parses to the same.

use tether_engine::hook::parse;

/// One fuzz input.
pub fn run(bytes: &[u8]) {
    if let Some((target, seed)) = parse(bytes) {
        assert!(!target.is_empty() && !target.contains(char::is_whitespace));
        assert_eq!(parse(format!("{target} {seed}").as_bytes()), Some((target, seed)));
    }
}
