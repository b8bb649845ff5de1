//! Errors the public API returns.

use tether_fault::PlanError;
use tether_io::TransportError;
use tether_proto::{ConfigError, NodeId, PathError, SendError, MAX_RAILS};
use thiserror::Error;

/// "1 message", "3 messages".
fn messages(n: u64) -> String {
    match n {
        1 => "1 message".to_string(),
        n => format!("{n} messages"),
    }
}

/// The calls' envelopes a `Lingered` close left, said after the messages.
fn envelopes_too(n: u64) -> String {
    match n {
        0 => String::new(),
        1 => " (and 1 call envelope)".to_string(),
        n => format!(" (and {n} call envelopes)"),
    }
}

/// Everything a tether call can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The protocol configuration is invalid (names the field and why).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The message was not accepted (too large, buffer full, unknown peer).
    #[error(transparent)]
    Send(#[from] SendError),
    /// A peer's paths could not be set.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The fault plan is invalid.
    #[error("fault plan: {0}")]
    FaultPlan(#[from] PlanError),
    /// The transport refused (bind, send): the typed errors of Li et al.
    /// \[CI\] Table 1 (docs/REFERENCES.md), with the address where known.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// An endpoint has one to `MAX_RAILS` rails.
    #[error("an endpoint has 1 to {MAX_RAILS} rails, not {given}")]
    Rails {
        /// How many were given.
        given: usize,
    },
    /// A peer was given more (or fewer) addresses than the endpoint has rails.
    #[error("a peer is reached over 1 to {rails} rails (one address each), not {given}")]
    PeerRails {
        /// How many addresses were given.
        given: usize,
        /// How many rails the endpoint has.
        rails: usize,
    },
    /// The same peer was given twice (`Builder::peer`): which addresses
    /// it has would be a guess.
    #[error("peer {node} is given twice (at {first} and at {second}): give each peer once")]
    PeerTwice {
        /// The peer.
        node: NodeId,
        /// Its first address (rail 0), as given.
        first: std::net::SocketAddr,
        /// Its second.
        second: std::net::SocketAddr,
    },
    /// The call's timeout passed first.
    #[error("timed out")]
    TimedOut,
    /// `close` (or drop) waited its bound and these messages were still
    /// neither acknowledged nor failed.
    #[error("closed with {} neither acknowledged nor failed{}", messages(*unsettled), envelopes_too(*envelopes))]
    Lingered {
        /// The application's messages whose fate is unknown.
        unsettled: u64,
        /// And the calls' envelopes (requests, replies, queries) on the
        /// same streams, not counted among the messages.
        envelopes: u64,
    },
    /// The endpoint is shutting down.
    #[error("endpoint closed")]
    Closed,
    /// The node's engine process could not be attached to, or is gone for
    /// good (no new one within `ClientOptions::recovery`).
    #[error("engine: {0}")]
    Engine(tether_attach::EngineError),
    /// What was asked does not apply to an endpoint attached to an engine
    /// (the engine owns the rails, the protocol configuration and the fault
    /// injection: `tether engine` sets them).
    #[error("{what} is the engine's to set (tether engine), not an attached endpoint's")]
    EngineOwns {
        /// The builder option that was given.
        what: &'static str,
    },
    /// A call could not be made (no credit left, too many kept, arguments
    /// too large).
    #[error(transparent)]
    Call(#[from] tether_rpc::CallError),
    /// The server's call log could not take a record: the reply was not
    /// sent, and the call still runs (nothing happened that the log does
    /// not hold).
    #[error("call log: {0}")]
    CallLog(String),
    /// What was asked is not available on this kind of endpoint.
    #[error("{what} is not supported")]
    Unsupported {
        /// What was asked.
        what: &'static str,
    },
    /// A group refused: not a member, or too many messages not yet
    /// delivered (`GroupError::Full`: try again as they are).
    #[error("group: {0}")]
    Group(#[from] crate::cluster::GroupError),
    /// The node's cluster part could not start (its manager replica's
    /// Raft configuration was refused).
    #[error("cluster: {0}")]
    Cluster(String),
    /// The configuration from `tether.toml` or `TETHER_*` variables was
    /// refused (`tether::settings`).
    #[error("configuration: {0}")]
    Settings(#[from] crate::settings::SettingsError),
    /// An operating-system call failed (thread or eventfd creation).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
