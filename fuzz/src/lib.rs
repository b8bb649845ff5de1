//! The bodies of tether's fuzz targets, one module each with
//! `pub fn run(data: &[u8])`, so that they build without libFuzzer.
//!
//! Each `fuzz_targets/NAME.rs` (a `[[bin]]` of this crate, built by
//! cargo-fuzz on nightly with the default `libfuzzer` feature) is only
//! `fuzz_target!(|data| tether_fuzz::NAME::run(data))`. On the stable
//! toolchain `tests/corpus.rs` replays every saved input through the same
//! functions: the seed corpus `seeds/NAME/` and the crash inputs
//! `regressions/NAME/` (`scripts/test` runs it in CI), and checks that
//! [`TARGETS`], the `[[bin]]`s of `Cargo.toml`, `fuzz_targets/`, the
//! modules here, `seeds/` and `regressions/` name the same targets, so
//! none can be left out.
//!
//! A new target: a module here, its name in [`TARGETS`], a
//! `[[bin]]` in `Cargo.toml` (with `required-features = ["libfuzzer"]`),
//! `fuzz_targets/NAME.rs`, and a seed corpus in `seeds/NAME/` (run it with
//! `scripts/fuzz`, then minimise and copy: see `seeds/README.md`).

pub mod datagram;
pub mod fabric_file;
pub mod fault_plan;
pub mod groups;
pub mod handshake;
pub mod hook_request;
pub mod launch;
pub mod members;
pub mod nacked;
pub mod packet_parse;
pub mod records;
pub mod rpc_envelope;
pub mod rpc_log;
pub mod shm;
pub mod stat_board;

/// `(name, module::run)` for each module named.
macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), $name::run)),*]
    };
}

/// A fuzz target's body: one input.
pub type Run = fn(&[u8]);

/// Every fuzz target: its name (that of its module, its `[[bin]]`, its
/// `fuzz_targets/` file and its `seeds/` directory) and its body.
pub const TARGETS: &[(&str, Run)] = targets![
    packet_parse,
    fault_plan,
    handshake,
    datagram,
    shm,
    records,
    hook_request,
    rpc_envelope,
    rpc_log,
    stat_board,
    nacked,
    members,
    groups,
    launch,
    fabric_file
];
