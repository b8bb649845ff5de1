//! Why an engine or an attachment to one failed: typed, with the reason.

use std::io;

use tether_proto::{ConfigError, NodeId, SendError};
use tether_shm::ShmError;
use thiserror::Error;

use crate::records::RecordError;

/// Why an engine, or an application's attachment to one, failed.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The rendezvous socket, the engine's directory or a rail's socket.
    #[error("engine socket or directory: {0}")]
    Io(#[from] io::Error),
    /// A region: creating, mapping or reading its rings.
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    /// A record that does not decode (the other side, or its memory,
    /// cannot be trusted).
    #[error("record: {0}")]
    Record(#[from] RecordError),
    /// The protocol configuration is invalid.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// A rail's transport refused.
    #[error("transport: {0}")]
    Transport(#[from] tether_io::TransportError),
    /// No engine serves the directory (no socket there, or nobody
    /// listening on it).
    #[error("no engine serves {}: start one with `tether engine --dir {}`", .dir.display(), .dir.display())]
    NoEngine {
        /// The directory the application was told to attach in.
        dir: std::path::PathBuf,
    },
    /// Another engine answers on this directory's socket.
    #[error("an engine already serves {0}")]
    AlreadyRunning(String),
    /// The engine refused the attachment, and said why.
    #[error("the engine refused the attachment: {0}")]
    Refused(String),
    /// The engine exited or died, and no new one came within the
    /// recovery patience (or none is waited for).
    #[error("the engine is gone (it exited or died)")]
    EngineGone,
    /// A wait ended at its deadline.
    #[error("timed out")]
    Timeout,
    /// The message cannot be sent (too large, to itself).
    #[error(transparent)]
    Send(#[from] SendError),
    /// The destination was never added as a peer.
    #[error("node {0} is not a peer of this endpoint (add it first)")]
    UnknownPeer(NodeId),
    /// The engine's self-test or state audit failed: it stops, and its
    /// supervisor starts another.
    #[error("self-test failed: {0}")]
    SelfTest(String),
    /// A fault plan the engine cannot take.
    #[error("fault plan: {0}")]
    Faults(String),
    /// Too few or too many rails (or peers, for a region's backups).
    #[error("need 1 to {max} rails, got {given}")]
    Rails {
        /// How many were given.
        given: usize,
        /// The most there may be.
        max: usize,
    },
}
