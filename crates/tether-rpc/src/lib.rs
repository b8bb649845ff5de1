//! Active messages over tether, sans-IO: an application invokes handlers
//! on other nodes and always knows where each invocation stands. The
//! protocol is the three-way request / acknowledgement / reply of Kaur's
//! AMVIA ("Performability Modeling and Analysis of Fault Tolerance Support
//! in Communication Protocols", Rutgers MS thesis, 2000, chapter 3;
//! `docs/REFERENCES.md` [AMVIA]): the acknowledgement says the handler
//! started, so a caller can tell a dead network from a slow handler; each
//! call has a queryable <AckStatus, OperationStatus> state and ends in a
//! reply or an abandon state that says whether the handler ran. Calls are
//! at-most-once across server crashes: each carries an id that outlives
//! both sides' incarnations, the server logs what it decided before acting
//! on it (`record`), and a copy of a call it ran is answered from the log
//! (RIFL, Lee et al., "Implementing Linearizability at Large Scale and Low
//! Latency", SOSP'15 [RIFL]).
//!
//! Like `tether-proto`, this crate reads no clock and touches no socket or
//! file: the runtime (`tether`) carries envelopes as tether messages and
//! gives the server its log file; the simulator (`tether-sim`) does the
//! same in virtual time, with crashes.
//!
//! - `envelope`: the bytes of each piece of a call (parsed as untrusted).
//! - `call`: ids and the state tuple.
//! - `caller`: the initiator (Figure 3.2).
//! - `target`: the server (Figure 3.3), its table and its credit.
//! - `record`: the server's log records, the `CallLog` trait, `MemLog`.

mod arena;
pub mod call;
pub mod caller;
pub mod config;
pub mod envelope;
pub mod record;
pub mod target;

pub use call::{AckStatus, CallId, CallRef, CallState, Executed, HandlerId, OperationStatus, Refusal};
pub use caller::{CallError, CallEvent, Caller, CallerStats};
pub use config::RpcConfig;

pub use envelope::{Envelope, EnvelopeError};
pub use record::{replay, CallLog, LogError, MemLog, Record, Torn};
pub use target::{CompleteError, Dispatch, Outgoing, Target, TargetStats};

/// The stream channel calls' envelopes ride on, beside the application's
/// messages (`tether_proto::Channel::APP`): in order with them, and handed
/// to the call layer, not to the application.
pub const CHANNEL: tether_proto::Channel = tether_proto::Channel::LAYER;
