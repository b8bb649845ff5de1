//! Counters with stable short names (Aeron's operations model): everything
//! the core does that an operator may want to see, and every drop by reason.

use tether_wire::WireError;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_delivered: u64,
    pub messages_failed: u64,
    /// Messages the peer acknowledged (sender side).
    pub messages_acked: u64,
    pub data_frames_sent: u64,
    /// Data frames sent again after a timeout or a SACK gap.
    pub retransmits: u64,
    pub timeouts: u64,
    pub acks_sent: u64,
    /// ACKs that went alone, with no data to ride on.
    pub standalone_acks: u64,
    pub ack_requests: u64,
    /// Data frames received that were already delivered or buffered.
    pub duplicates_discarded: u64,
    /// Data frames beyond the receive window or refused by a full delivery queue.
    pub out_of_window: u64,
    /// Packets from an older incarnation or epoch (seeds/001 section 4.2).
    pub stale_dropped: u64,
    /// Packets addressed to another node.
    pub misdirected: u64,
    pub checksum_failures: u64,
    /// Packets naming a checksum algorithm this endpoint does not accept.
    pub checksum_refused: u64,
    /// Packets rejected by the parser for anything but the checksum.
    pub malformed: u64,
    /// Well-formed frames that break the protocol (ACK for unsent data, oversized message).
    pub protocol_violations: u64,
}

impl Stats {
    pub(crate) fn count_wire_error(&mut self, e: WireError) {
        match e {
            WireError::ChecksumMismatch => self.checksum_failures += 1,
            _ => self.malformed += 1,
        }
    }

    /// Every counter with its stable name, for tables and JSON.
    pub fn fields(&self) -> [(&'static str, u64); 22] {
        [
            ("datagrams_sent", self.datagrams_sent),
            ("datagrams_received", self.datagrams_received),
            ("bytes_sent", self.bytes_sent),
            ("bytes_received", self.bytes_received),
            ("messages_sent", self.messages_sent),
            ("messages_delivered", self.messages_delivered),
            ("messages_failed", self.messages_failed),
            ("messages_acked", self.messages_acked),
            ("data_frames_sent", self.data_frames_sent),
            ("retransmits", self.retransmits),
            ("timeouts", self.timeouts),
            ("acks_sent", self.acks_sent),
            ("standalone_acks", self.standalone_acks),
            ("ack_requests", self.ack_requests),
            ("duplicates_discarded", self.duplicates_discarded),
            ("out_of_window", self.out_of_window),
            ("stale_dropped", self.stale_dropped),
            ("misdirected", self.misdirected),
            ("checksum_failures", self.checksum_failures),
            ("checksum_refused", self.checksum_refused),
            ("malformed", self.malformed),
            ("protocol_violations", self.protocol_violations),
        ]
    }

    /// Add another endpoint's counters into this one.
    pub fn accumulate(&mut self, other: &Stats) {
        let mut theirs = other.fields().into_iter();
        macro_rules! add { ($($f:ident),*) => { $( self.$f += theirs.next().expect("same field list").1; )* } }
        add!(
            datagrams_sent,
            datagrams_received,
            bytes_sent,
            bytes_received,
            messages_sent,
            messages_delivered,
            messages_failed,
            data_frames_sent,
            retransmits,
            timeouts,
            acks_sent,
            standalone_acks,
            ack_requests,
            duplicates_discarded,
            out_of_window,
            stale_dropped,
            misdirected,
            checksum_failures,
            malformed,
            protocol_violations
        );
    }
}
