//! The protocol between an application and its engine process
//! (docs/ENGINE.md; Zhou et al. \[FTGM\]), and the application's side of it,
//! as Aeron's client library stands apart from its media driver: an
//! application links this crate, never the engine's loop.
//!
//! - [`records`]: what an application and its engine exchange through the
//!   rings of the application's region (`tether-shm` lays the region out);
//! - [`attach`]: the rendezvous on the engine's Unix socket, which then
//!   carries only doorbells and the news of either side dying;
//! - [`Client`]: an application's side: its region, its submissions, its
//!   backup of every unsettled message, and its resumption with a new
//!   engine when one dies.

#![warn(missing_docs)]
// An I/O crate: it reads clocks and waits on sockets.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod attach;
mod client;
mod clock;
mod counters;
mod error;
mod machine;
pub mod owner;
pub mod records;
pub mod stat;

pub use attach::{default_dir, is_probe_node, PROBE_BASE};
pub use client::{Client, ClientOptions, Tracker};
pub use clock::monotonic_ns;
pub use counters::EngineCounters;
pub use error::EngineError;
pub use machine::{ready_now, Machine, RealMachine};
pub use records::{Completion, RecordError, Submission, Taken};
