//! tether: messages delivered exactly once, in order and uncorrupted over
//! networks that drop, corrupt, reorder and delay them, or the application
//! is told exactly which were not. This crate is the runtime
//! (docs/ARCHITECTURE.md, "Layers"): the sans-IO protocol core of
//! `tether-proto` driven over real transports by a progress thread or by
//! the application itself.
//!
//! ```no_run
//! use std::time::Duration;
//! use tether::{Endpoint, MessageState};
//!
//! let a = Endpoint::builder(1)
//!     .bind("127.0.0.1:7001".parse().unwrap())
//!     .peer(2, "127.0.0.1:7002".parse().unwrap())
//!     .build()?;
//! let handle = a.send(2, b"hello")?;
//! match handle.wait(Some(Duration::from_secs(5)))? {
//!     MessageState::Delivered => println!("in node 2's delivery queue"),
//!     other => println!("not delivered: {other:?}"),
//! }
//! a.close(Duration::from_secs(1))?;
//! # Ok::<(), tether::Error>(())
//! ```
//!
//! Failures the layer cannot mask arrive as [`Event`]s (a peer unreachable
//! or restarted, with the exact messages that failed) and in each
//! [`SendHandle`]'s state. Faults can be injected into any endpoint
//! ([`faults`]) so an application can prove it survives them.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
#![warn(missing_docs)]

mod above;
mod api_faults;
mod attached;
mod attached_calls;
mod backend;
mod builder;
mod call_layer;
mod call_log;
mod call_site;
mod calls;
mod clock;
pub mod cluster;
mod embedded;
mod endpoint;
mod error;
mod handle;
pub mod launch;
mod leave;
mod options;
mod progress;
mod publish;
pub mod settings;
mod shared;
mod spin_policy;
mod station;
mod waiter;

pub use builder::Builder;
/// The message type of `Endpoint::send_bytes` and of every `Delivery`.
pub use bytes::Bytes;
pub use endpoint::Endpoint;
pub use error::Error;
pub use handle::SendHandle;
pub use options::{Options, Progress};
pub use tether_proto::{
    ClusterKey, Config, ConfigError, CongestionControl, CongestionInfo, Controller, ControllerFactory,
    Delivery, Event, FailReason, FailedMessages, Failover, Instant, MessageId, MessageState, Messages,
    Nacked, NackedFate, NodeId, PathError, PathInfo, PathState, PathStats, RailId, RailPolicy, Received,
    Refused, RetransmitMode, SendError, SentBatch, Stats, Unreliable, MAX_PEERS, MAX_RAILS,
};
pub use tether_wire::{AuthKind, ChecksumKind, ChecksumSet};

/// Where `tether engine` serves this user unless told `--dir`: the
/// directory to give `Builder::engine` (`/dev/shm/tether-UID`).
pub fn default_engine_dir() -> std::path::PathBuf {
    tether_attach::default_dir()
}

/// The async API on tokio (the `tokio` feature): sends, receives, events
/// and calls as futures.
#[cfg(feature = "tokio")]
pub mod aio;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "names")]
pub mod names;

/// Fault injection (the functional fault model of Li et al. \[CI\], see
/// docs/FAULTS.md): plans of rules that drop, delay, modify, reorder,
/// duplicate and inject datagrams, and fail the application's own calls;
/// the counters of what struck; the handle on a running injector.
pub mod faults {
    pub use tether_fault::{
        node_seed, ErrorKind, Fault, FaultCounters, FaultKind, FaultPlan, Modify, PlanError, Recurrence,
        Rule, Schedule, Side, Span, Spread,
    };
    pub use tether_io::FaultHandle;
}

/// Calls (active messages): handlers registered on an endpoint
/// and invoked from others through a three-way request / acknowledgement /
/// reply exchange, each call's `<AckStatus, OperationStatus>` state
/// queryable and true about whether the handler ran (Kaur \[AMVIA\],
/// docs/REFERENCES.md; docs/ARCHITECTURE.md, "Calls").
pub mod rpc {
    pub use crate::call_layer::{Handler, Request};
    pub use crate::call_log::{CallLogOptions, SyncPolicy};
    pub use crate::calls::{Call, CallOptions, CallOutcome, CallStats};
    pub use tether_rpc::{
        AckStatus, CallError, CallEvent, CallId, CallRef, CallState, CallerStats, Executed, HandlerId,
        OperationStatus, Refusal, RpcConfig, TargetStats,
    };
}

/// Transports an endpoint runs over: UDP, an in-memory network for tests,
/// or any type implementing [`Transport`](transport::Transport).
pub mod transport {
    pub use tether_io::{
        AddressBook, MemNetwork, MemTransport, RecvBatch, Transport, TransportCounters, TransportError,
        UdpTransport,
    };
}
