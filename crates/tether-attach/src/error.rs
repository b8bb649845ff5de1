//! Why an engine or an attachment to one failed: typed, with the reason.

use std::io;

use tether_proto::{ConfigError, NodeId, SendError};
use tether_shm::ShmError;
use thiserror::Error;

use crate::records::RecordError;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("engine socket or directory: {0}")]
    Io(#[from] io::Error),
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    #[error("record: {0}")]
    Record(#[from] RecordError),
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("transport: {0}")]
    Transport(#[from] tether_io::TransportError),
    #[error("an engine already serves {0}")]
    AlreadyRunning(String),
    #[error("the engine refused the attachment: {0}")]
    Refused(String),
    #[error("the engine is gone (it exited or died)")]
    EngineGone,
    #[error("timed out")]
    Timeout,
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("node {0} is not a peer of this endpoint (add it first)")]
    UnknownPeer(NodeId),
    #[error("self-test failed: {0}")]
    SelfTest(String),
    #[error("fault plan: {0}")]
    Faults(String),
    #[error("need 1 to {max} rails, got {given}")]
    Rails { given: usize, max: usize },
}
