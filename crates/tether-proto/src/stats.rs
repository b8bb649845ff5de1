//! Counters with stable short names (Aeron's operations model): everything
//! the core does that an operator may want to see, and every drop by reason.
//!
//! One list below defines the struct, the name table and the sum, so the
//! three can never disagree.

use tether_wire::WireError;

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// An endpoint's counters, all monotonic from its creation.
        /// Non-exhaustive: every new drop reason or action gets a counter,
        /// so read fields by name or iterate [`Stats::fields`], and build
        /// one from `Stats::default()`.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        // `default`: a record written before a counter existed still reads,
        // with that counter at zero.
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(default))]
        #[non_exhaustive]
        pub struct Stats {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        impl Stats {
            /// Every counter with its stable name, for tables and JSON.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name), )*]
            }

            /// Counters from their values in `fields` order (an engine's
            /// report); a shorter list leaves the rest at zero, extra
            /// values are ignored.
            pub fn from_values(values: impl IntoIterator<Item = u64>) -> Stats {
                let mut s = Stats::default();
                let mut v = values.into_iter();
                $( s.$name = v.next().unwrap_or(0); )*
                s
            }

            /// Add another endpoint's counters into this one.
            pub fn accumulate(&mut self, other: &Stats) {
                $( self.$name += other.$name; )*
            }
        }
    };
}

counters! {
    /// Datagrams handed to the driver to send, on every rail.
    datagrams_sent,
    /// Datagrams the driver handed in, before any check.
    datagrams_received,
    /// Bytes of those sent datagrams, headers included.
    bytes_sent,
    /// Bytes of those received datagrams, headers included.
    bytes_received,
    /// Messages accepted from the application.
    messages_sent,
    /// Messages put in this endpoint's delivery queue.
    messages_delivered,
    /// Messages reported failed to the application (sender side).
    messages_failed,
    /// Messages the peer acknowledged (sender side).
    messages_acked,
    /// Segments the peer acknowledged (sender side; a fragmented message's
    /// fragments one by one): each frees room in the send buffer.
    segments_acked,
    /// Data frames sent, first sends and retransmissions.
    data_frames_sent,
    /// Data frames sent again: judged lost by time (RACK), moved off a failed
    /// path, or resent with a timeout's probes.
    retransmits,
    /// Retransmission timer expiries.
    timeouts,
    /// Timeouts found spurious: the answer to their probe showed nothing
    /// lost (the receiver, or its ACKs, were late).
    spurious_timeouts,
    /// ACK frames sent, piggy-backed or alone.
    acks_sent,
    /// ACKs that went alone, with no data to ride on.
    standalone_acks,
    /// Datagrams sent with the ACK_REQUEST flag because the window was
    /// filling (Tang and Bilas [TB] section 4.1.2).
    ack_requests,
    /// Data frames received that were already delivered or buffered.
    duplicates_discarded,
    /// Data frames beyond the receive window or refused by a full delivery queue.
    out_of_window,
    /// Packets from an older incarnation or epoch (Tang and Bilas [TB] section 4.2).
    stale_dropped,
    /// Streams resynchronised because the peer acknowledged an epoch this
    /// endpoint never started (forged or undetected-corrupt traffic).
    streams_reset,
    /// Packets addressed to another node.
    misdirected,
    /// Datagrams whose checksum did not match: corruption, dropped.
    checksum_failures,
    /// Packets naming a checksum algorithm this endpoint does not accept.
    checksum_refused,
    /// Buffered payloads found corrupted in this endpoint's own memory
    /// (their CRC32C changed since they were buffered): never sent or
    /// delivered; an engine that sees one stops and is replaced.
    integrity_faults,
    /// Packets rejected by the parser for anything but the checksum.
    malformed,
    /// Well-formed frames that break the protocol (ACK for unsent data, oversized message).
    protocol_violations,
    /// Payload bytes copied to where they live by the checksum pass itself
    /// (the fused receive copy, Trahay et al. [NMAD] section 5.1).
    bytes_landed,
    /// Payload bytes copied in a pass of their own after verification
    /// (first fragments, reordered fragments, a full delivery queue).
    bytes_copied_after_verify,
    /// Paths that stopped answering with data in flight on them: data
    /// moved to another rail.
    failovers,
    /// Probes sent: at retransmission timeouts, and to suspect, down or
    /// idle paths.
    probes_sent,
    /// HELLOs sent (first tries and retries).
    hellos_sent,
    /// HELLOs answered with a WELCOME.
    hellos_answered,
    /// HELLOs not answered because `MAX_REPLIES` answers were already
    /// waiting: a handshake flood, dropped at the cost of a parse.
    handshake_replies_dropped,
    /// Handshakes completed (as initiator or responder).
    handshakes_completed,
    /// WELCOMEs answering no HELLO of ours, CONFIRMs whose cookie does not
    /// check, HELLOs without an incarnation: forged, replayed or stale.
    handshakes_refused,
    /// Handshakes refused because the peer's datagram size is below the
    /// smallest the protocol works with.
    mtu_refused,
    /// Datagrams from a node id this endpoint was not given (`add_peer`,
    /// `set_paths`): strangers get nothing, not even an answer.
    strangers_refused,
    /// Datagrams that only a session could carry, from a peer with no
    /// session for the incarnations they name: a handshake is begun instead.
    sessionless_dropped,
    /// Datagrams whose header names another node than the one the
    /// transport knows their source address as.
    source_mismatch,
    /// Datagrams from an address no peer has: all of them without a
    /// cluster key; with one, all but an authenticated HELLO or CONFIRM.
    unknown_source,
    /// Peers that proved themselves at a new address (a CONFIRM from an
    /// address no peer had, its cookie made for that address).
    peers_moved,
    /// Authenticated datagrams that did not open (their tag did not check): forged, or
    /// corrupted on the way (with a cluster key, corruption counts here).
    mac_failures,
    /// Datagrams refused for coming unauthenticated where this endpoint's
    /// cluster key requires authentication (the peer has no key).
    auth_missing,
    /// Authenticated datagrams this endpoint has no key to check (a key
    /// on the peer's side only).
    auth_unexpected,
    /// Datagrams authenticated with another algorithm than this
    /// endpoint's (`--auth` differs).
    auth_mismatch,
    /// Authenticated datagrams whose packet number was already taken (or
    /// fell below the replay window): replays, dropped.
    replays,
    /// Unreliable messages put in a datagram (`Endpoint::send_unreliable`).
    unreliable_sent,
    /// Unreliable messages received and queued for the application.
    unreliable_received,
    /// Unreliable messages dropped here: a queue full (either way), or
    /// larger than the datagram size agreed with the peer, or for a port
    /// this endpoint does not serve. Never sent again: that is their class.
    unreliable_dropped,
    /// NACK-reliable messages sent (`Endpoint::send_nacked`), first
    /// sending only.
    nacked_sent,
    /// NACK-reliable messages delivered to the application's queue.
    nacked_received,
    /// NACK-reliable messages sent again because the receiver asked.
    nacked_repaired,
    /// NACKs sent: requests for missing NACK-reliable messages.
    nacks_sent,
    /// NACK-reliable messages a receiver skipped: the sender no longer
    /// held them when it asked (or it learned so before asking).
    nacked_lost,
    /// NACK-reliable messages this sender reported lost
    /// (`NackedFate::Lost`): their receiver skipped them.
    nacked_lost_sent,
    /// NACK-reliable messages that arrived again after being delivered.
    nacked_duplicates,
    /// NACK-reliable messages dropped on arrival for want of room (asked
    /// for again later), and frames of the class that did not parse.
    nacked_dropped,
    /// Datagrams of the cluster's own services (membership, the managers'
    /// Raft) put in a datagram (`Endpoint::send_service`).
    service_sent,
    /// Datagrams of the cluster's services received and queued for them
    /// (`Endpoint::recv_service`). Their drops count in
    /// `unreliable_dropped`.
    service_received,
    /// Nodes not given that were taken in as peers after their handshake
    /// (`Config::accept_peers`, `Event::PeerAccepted`).
    peers_accepted,
}

impl Stats {
    pub(crate) fn count_wire_error(&mut self, e: WireError) {
        match e {
            WireError::ChecksumMismatch => self.checksum_failures += 1,
            _ => self.malformed += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulate_adds_each_field_to_itself() {
        let mut a = Stats { retransmits: 2, checksum_refused: 5, ..Stats::default() };
        let b = Stats { retransmits: 3, messages_acked: 7, ..Stats::default() };
        a.accumulate(&b);
        assert_eq!((a.retransmits, a.messages_acked, a.checksum_refused), (5, 7, 5));
        let names: Vec<_> = a.fields().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"checksum_refused") && names.contains(&"messages_acked"));
        assert_eq!(names.len(), 60);
    }
}
