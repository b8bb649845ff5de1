//! The engine as a process of its own (docs/ENGINE.md; Zhou et al.
//! [FTGM]): one engine per node owns the sockets of every rail and runs
//! the protocol for any number of applications, which reach it through
//! shared memory.
//!
//! - [`records`]: what an application and its engine exchange through the
//!   rings of the application's region;
//! - [`attach`]: the rendezvous on the engine's Unix socket, which then
//!   carries only doorbells and the news of either side dying;
//! - [`Engine`]: the engine's loop (`tether engine`);
//! - [`Client`]: an application's side;
//! - [`supervise`]: the supervisor that replaces an engine that died or
//!   hung.
//!
//! Still to come: docs/ENGINE.md, "Next, in order".

// An I/O crate: it reads clocks and runs a process's loop.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod attach;
mod audit;
mod book;
mod client;
mod clock;
mod counters;
mod engine;
mod error;
#[cfg(feature = "fault-hook")]
pub mod hook;
mod pairs;
pub mod records;
mod selftest;
mod supervisor;

pub use client::{Client, ClientOptions, Tracker};
pub use clock::monotonic_ns;
pub use counters::EngineCounters;
pub use engine::{Engine, EngineOptions, EngineSockets, EngineStats, Heartbeat, MAX_CLIENTS};
pub use error::EngineError;
pub use records::{Completion, RecordError, Submission, Taken};
pub use selftest::{is_probe_node, SelfTestOptions, SelfTestStats, PROBE_BASE};
pub use supervisor::{supervise, Incident, Watch, HEARTBEAT_FILE};
