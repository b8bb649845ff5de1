//! The engine as a process of its own (docs/ENGINE.md; Zhou et al.
//! [FTGM]): one engine per node owns the sockets of every rail and runs
//! the protocol for any number of applications, which reach it through
//! shared memory.
//!
//! What an application and its engine exchange, and the application's
//! side, are `tether-attach`'s (re-exported here for the engine's users);
//! this crate is the engine's side:
//!
//! - [`Engine`]: the engine's loop (`tether engine`);
//! - [`supervise`]: the supervisor that replaces an engine that died or
//!   hung.
//!
//! Still to come: docs/ENGINE.md, "Next, in order".

// An I/O crate: it reads clocks and runs a process's loop.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod admit;
mod application;
mod audit;
mod board;
mod book;
mod engine;
mod heartbeat;
#[cfg(feature = "fault-hook")]
pub mod hook;
mod pairs;
pub mod reclaim;
mod resume;
mod selftest;
mod stats;
mod supervisor;

pub use application::MAX_CLIENTS;
pub use engine::{Engine, EngineOptions, EngineSockets, Rail};
pub use heartbeat::Heartbeat;
pub use selftest::{SelfTestOptions, SelfTestStats};
pub use stats::EngineStats;
pub use supervisor::{supervise, Incident, Watch, HEARTBEAT_FILE};
pub use tether_attach::{
    attach, is_probe_node, monotonic_ns, owner, records, stat, Client, ClientOptions, Completion,
    EngineCounters, EngineError, RecordError, Submission, Taken, Tracker, PROBE_BASE,
};
