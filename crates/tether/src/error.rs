//! Errors the public API returns.

use tether_fault::PlanError;
use tether_io::TransportError;
use tether_proto::{ConfigError, SendError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("fault plan: {0}")]
    FaultPlan(#[from] PlanError),
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
    #[error("timed out")]
    TimedOut,
    #[error("endpoint closed")]
    Closed,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
