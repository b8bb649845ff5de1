//! A call's identity and where it stands: the <AckStatus, OperationStatus>
//! tuple of Kaur's AMVIA initiator (thesis section 3.2.1, Figure 3.2),
//! with what each state says about whether the handler ran.

use tether_wire::NodeId;

/// A handler's number, as registered on the server.
pub type HandlerId = u32;

/// A call's identity on the wire: the caller's life (its incarnation) and
/// its count of calls toward one server. Unique for that pair of nodes
/// across every life of both, so a server can recognise a copy of a call
/// it ran before it died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId {
    pub client: u64,
    pub seq: u64,
}

/// A call as the caller names it: the server it went to, and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallRef {
    pub server: NodeId,
    pub id: CallId,
}

/// Did the server hear of the call, and how did it answer (the tuple's
/// first half).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// No acknowledgement yet.
    NotAcked,
    /// The handler started (and, with a reply, finished).
    Acked,
    /// No handler under that id (AMVIA's negative acknowledgement).
    NotFound,
    /// The server answered with an error acknowledgement: the reason says
    /// whether the call ran.
    ErrorAck(Refusal),
    /// Acknowledged, then no reply through every retransmission.
    ReplyRtxExceeded,
}

/// What became of the operation (the tuple's second half).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationStatus {
    /// Not handed to the network yet.
    NotProcessed,
    /// Sent, possibly several times.
    RequestSent,
    /// The handler is running.
    Processing,
    /// The handler ran; its reply is here (or, one-way, it started).
    Processed,
    /// No acknowledgement through every retransmission (k of them).
    RequestRtxExceeded,
    /// The call's deadline passed first.
    DeadlineExceeded,
}

/// Whether the handler ran, as far as a state can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executed {
    /// It ran (its reply came), or, one-way, it started.
    Yes,
    /// It did not and never will.
    No,
    /// It may have: the state is indeterminate.
    Unknown,
}

/// The state tuple a caller can query at any time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallState {
    pub ack: AckStatus,
    pub op: OperationStatus,
}

impl CallState {
    pub const CREATED: CallState = CallState { ack: AckStatus::NotAcked, op: OperationStatus::NotProcessed };
    pub const SENT: CallState = CallState { ack: AckStatus::NotAcked, op: OperationStatus::RequestSent };
    pub const PROCESSING: CallState = CallState { ack: AckStatus::Acked, op: OperationStatus::Processing };
    pub const PROCESSED: CallState = CallState { ack: AckStatus::Acked, op: OperationStatus::Processed };

    /// The server's refusal, as a state.
    pub fn refused(reason: Refusal) -> CallState {
        let ack = match reason {
            Refusal::NotFound => AckStatus::NotFound,
            other => AckStatus::ErrorAck(other),
        };
        CallState { ack, op: OperationStatus::RequestSent }
    }

    /// The state as 32 bits, for a caller's log: the ACK status, its
    /// refusal, the operation status, a byte each.
    pub fn to_bits(self) -> u32 {
        let (ack, refusal) = match self.ack {
            AckStatus::NotAcked => (0, 0),
            AckStatus::Acked => (1, 0),
            AckStatus::NotFound => (2, 0),
            AckStatus::ErrorAck(r) => (3, r as u32),
            AckStatus::ReplyRtxExceeded => (4, 0),
        };
        let op = match self.op {
            OperationStatus::NotProcessed => 0,
            OperationStatus::RequestSent => 1,
            OperationStatus::Processing => 2,
            OperationStatus::Processed => 3,
            OperationStatus::RequestRtxExceeded => 4,
            OperationStatus::DeadlineExceeded => 5,
        };
        ack | refusal << 8 | op << 16
    }

    /// The state `to_bits` made, or `None` for bits no state makes.
    pub fn from_bits(bits: u32) -> Option<Self> {
        let (ack, refusal, op, rest) = (bits & 0xff, bits >> 8 & 0xff, bits >> 16 & 0xff, bits >> 24);
        if rest != 0 || (ack != 3 && refusal != 0) {
            return None;
        }
        let ack = match ack {
            0 => AckStatus::NotAcked,
            1 => AckStatus::Acked,
            2 => AckStatus::NotFound,
            3 => AckStatus::ErrorAck(Refusal::from_u8(refusal as u8)?),
            4 => AckStatus::ReplyRtxExceeded,
            _ => return None,
        };
        let op = match op {
            0 => OperationStatus::NotProcessed,
            1 => OperationStatus::RequestSent,
            2 => OperationStatus::Processing,
            3 => OperationStatus::Processed,
            4 => OperationStatus::RequestRtxExceeded,
            5 => OperationStatus::DeadlineExceeded,
            _ => return None,
        };
        Some(CallState { ack, op })
    }

    /// What this state says of the handler.
    pub fn executed(self) -> Executed {
        match (self.ack, self.op) {
            (_, OperationStatus::Processed) => Executed::Yes,
            (AckStatus::NotFound, _) | (AckStatus::ErrorAck(Refusal::NotRun), _) => Executed::No,
            (_, OperationStatus::NotProcessed) => Executed::No,
            _ => Executed::Unknown,
        }
    }

    /// How far along a call a state is: made, sent, running, abandoned
    /// (its fate still to be asked), answered. A call's state only ever
    /// moves to a later stage (`may_become`).
    pub(crate) fn stage(self) -> u8 {
        match (self.ack, self.op) {
            (AckStatus::NotAcked, OperationStatus::NotProcessed) => 0,
            (AckStatus::NotAcked, OperationStatus::RequestSent) => 1,
            (AckStatus::Acked, OperationStatus::Processing) => 2,
            (_, OperationStatus::Processed) | (AckStatus::NotFound | AckStatus::ErrorAck(_), _) => 4,
            _ => 3,
        }
    }

    /// Whether a call in this state may move to `next` (Figure 3.2's
    /// transitions): forward only, never back to a state it left, and
    /// nothing after an answer. The caller asserts this at every change.
    pub(crate) fn may_become(self, next: CallState) -> bool {
        self.stage() < next.stage()
    }

    /// No further transition comes by itself: the call was answered or
    /// abandoned. (An abandoned call may still be resolved by a query.)
    pub fn is_final(self) -> bool {
        !matches!(
            self.op,
            OperationStatus::NotProcessed | OperationStatus::RequestSent | OperationStatus::Processing
        ) || !matches!(self.ack, AckStatus::NotAcked | AckStatus::Acked)
    }
}

/// Why a server did not run a call (or cannot say whether it did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Refusal {
    /// No handler is registered under the id (AMVIA's negative ACK): it
    /// did not run and never will under this id.
    NotFound = 1,
    /// The caller is past the credit the server granted it: this copy did
    /// not run; the caller may send it again once earlier calls finish.
    Busy = 2,
    /// The handler started in an earlier life of the server, which died
    /// before logging its end: it may or may not have taken effect.
    Indeterminate = 3,
    /// Asked about by a QUERY before any copy of it arrived: the server
    /// fenced it off, and no copy will ever run.
    NotRun = 4,
    /// The call is below what the server still remembers of its client
    /// (freed by the client's own first-incomplete report, or its client's
    /// life forgotten): this copy did not run, an earlier one may have.
    Stale = 5,
}

impl Refusal {
    pub(crate) fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Refusal::NotFound,
            2 => Refusal::Busy,
            3 => Refusal::Indeterminate,
            4 => Refusal::NotRun,
            5 => Refusal::Stale,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_or_a_fence_is_certain() {
        assert_eq!(CallState::PROCESSED.executed(), Executed::Yes);
        assert_eq!(CallState::refused(Refusal::NotFound).executed(), Executed::No);
        assert_eq!(CallState::refused(Refusal::NotRun).executed(), Executed::No);
        for r in [Refusal::Indeterminate, Refusal::Stale, Refusal::Busy] {
            assert_eq!(CallState::refused(r).executed(), Executed::Unknown, "{r:?}");
        }
        let timed_out = CallState { ack: AckStatus::Acked, op: OperationStatus::DeadlineExceeded };
        assert_eq!(timed_out.executed(), Executed::Unknown);
        assert!(timed_out.is_final());
        assert!(!CallState::SENT.is_final() && !CallState::PROCESSING.is_final());
        assert!(CallState::refused(Refusal::NotFound).is_final());
    }

    #[test]
    fn states_move_forward_only() {
        let abandoned = CallState { ack: AckStatus::NotAcked, op: OperationStatus::RequestRtxExceeded };
        let reply_lost = CallState { ack: AckStatus::ReplyRtxExceeded, op: OperationStatus::RequestSent };
        let refused = CallState::refused(Refusal::Indeterminate);
        let path =
            [CallState::CREATED, CallState::SENT, CallState::PROCESSING, reply_lost, CallState::PROCESSED];
        for (i, a) in path.iter().enumerate() {
            for (j, b) in path.iter().enumerate() {
                assert_eq!(a.may_become(*b), i < j, "{a:?} -> {b:?}");
            }
        }
        assert!(CallState::SENT.may_become(abandoned) && abandoned.may_become(refused));
        assert!(!abandoned.may_become(reply_lost), "abandoned once");
        assert!(!refused.may_become(CallState::PROCESSED) && !CallState::PROCESSED.may_become(refused));
    }

    #[test]
    fn every_state_reads_back_from_its_bits_and_no_other_bits_read() {
        let mut states = 0;
        for bits in 0..(1u32 << 20) {
            if let Some(s) = CallState::from_bits(bits) {
                assert_eq!(s.to_bits(), bits);
                states += 1;
            }
        }
        // 4 ACK statuses and 5 refusals, times 6 operation statuses.
        assert_eq!(states, (4 + 5) * 6);
        assert_eq!(CallState::from_bits(1 << 24), None);
    }
}
