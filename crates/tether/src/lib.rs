//! tether: messages delivered exactly once, in order and uncorrupted over
//! networks that drop, corrupt, reorder and delay them, or the application
//! is told exactly which were not (DESIGN.md layer 5, the runtime).
//!
//! ```no_run
//! use tether::{Endpoint, Options};
//! let a = Endpoint::udp(1, "127.0.0.1:7001".parse().unwrap(), &[(2, "127.0.0.1:7002".parse().unwrap())], Options::default())?;
//! let handle = a.send(2, b"hello")?;
//! handle.wait(None)?; // Delivered, or Failed(reason)
//! # Ok::<(), tether::Error>(())
//! ```

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod clock;
mod driver;
mod endpoint;
mod error;
mod waiter;

pub use endpoint::{Endpoint, Options, Progress, SendHandle};
pub use error::Error;
pub use tether_fault::{FaultCounters, FaultKind, FaultPlan, Rule as FaultRule};
pub use tether_io::FaultHandle;
pub use tether_proto::{
    Config, Delivery, Event, FailReason, FailedMessages, Failover, Instant, MessageId, MessageState, NodeId,
    PathInfo, PathState, PathStats, RailId, RailPolicy, RetransmitMode, SendError, Stats, MAX_RAILS,
};
pub use tether_wire::ChecksumKind;
