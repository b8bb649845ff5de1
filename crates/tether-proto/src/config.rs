//! Endpoint configuration: every queue, window and retry has a limit here
//! (TigerBeetle's rule), with defaults from the papers' parameter studies.

use core::time::Duration;
use tether_wire::{
    overhead, AuthKind, ChecksumKind, ChecksumSet, MacKey, AUTH_OVERHEAD, MAX_DATAGRAM, OVERHEAD,
};
use thiserror::Error;

use crate::paths::RailPolicy;

/// How lost segments are repaired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetransmitMode {
    /// Retransmit only what the receiver's SACK ranges show missing.
    #[default]
    Selective,
    /// On timeout retransmit everything from the first unacknowledged
    /// segment on; the receiver keeps nothing out of order. Kept so the
    /// experiments of Tang and Bilas [TB] can be reproduced side by side.
    GoBackN,
}

/// The cluster's shared secret and the algorithm this endpoint uses it
/// with: with one configured, every datagram is authenticated (and, unless
/// the algorithm is AES-256-GMAC, encrypted) under a key derived from it
/// for its sender, receiver, both incarnations and the algorithm
/// (docs/PROTOCOL.md, "Authentication"), and datagrams protected any other
/// way are refused: peers must choose the same algorithm. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey {
    secret: [u8; 32],
    auth: AuthKind,
}

impl core::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// The key from secret material (a key file's bytes), at least 16
    /// bytes of it: BLAKE3's key derivation turns any length into a key.
    pub fn from_material(material: &[u8]) -> Result<Self, ConfigError> {
        if material.len() < 16 {
            return Err(ConfigError { field: "key", why: "needs at least 16 bytes of secret material" });
        }
        let secret = blake3::derive_key("tether 2026-11 cluster key", material);
        Ok(ClusterKey { secret, auth: AuthKind::default() })
    }

    /// The same secret used with `auth` (default AES-256-GMAC: authenticated,
    /// not encrypted).
    pub fn with_auth(self, auth: AuthKind) -> Self {
        ClusterKey { auth, ..self }
    }

    /// The algorithm datagrams are protected with.
    pub fn auth(&self) -> AuthKind {
        self.auth
    }

    /// The key that authenticates datagrams from `src` (incarnation
    /// `src_inc`) to `dst` (as the sender knows it, `dst_inc`).
    pub fn datagram_key(&self, src: u32, src_inc: u64, dst: u32, dst_inc: u64) -> MacKey {
        let words = [src as u64, src_inc, dst as u64, dst_inc];
        MacKey::derive(self.auth, &self.secret, "tether 2026-11 datagram key", &words)
    }
}

/// An endpoint's limits and timers, checked by [`Config::validate`]. Every
/// bound the core keeps is a field here, so nothing grows without one.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest datagram emitted, header included (1472 fits an Ethernet MTU).
    pub max_datagram: usize,
    /// Segments in flight per peer: the papers' send-queue size.
    pub send_window: usize,
    /// Payload bytes in flight per peer, whatever the segment count: what
    /// a receiver's socket buffer can hold (the runtime asks for 8 MiB).
    /// With 65,507-byte datagrams a window of 1,024 segments put 64 MiB on
    /// the wire at once and the receiving kernel dropped what did not fit;
    /// a segment is always admitted when nothing is in flight.
    pub send_window_bytes: usize,
    /// Memory the send buffer toward one peer may hold: the bytes of the
    /// messages accepted and not yet acknowledged plus the log's own
    /// bookkeeping for each of their segments (`SEGMENT_COST` bytes), so a
    /// flood of tiny or empty messages is bounded too. Beyond it `send`
    /// returns `WouldBlock`; an empty buffer takes one message of any size
    /// up to `max_message_len`. The default is as much as the window may
    /// put in flight (`send_window_bytes`): a deeper buffer only holds the
    /// application's bytes longer before they go, and they go cold in the
    /// cache meanwhile (64 MiB, the earlier default, cost a 64 KiB stream
    /// on loopback a fifth of its goodput and a 1 MiB stream a quarter).
    pub send_buffer_bytes: usize,
    /// Messages accepted per peer and not yet settled (acknowledged or
    /// failed); beyond it `send` returns `WouldBlock`.
    pub send_buffer_messages: usize,
    /// Segments above the cumulative ACK a receiver holds out of order.
    pub recv_window: usize,
    /// Memory of delivered-but-unread messages (their bytes plus
    /// `DELIVERY_COST` each) before the receiver stops accepting (and so
    /// stops acknowledging) new data: the commit point.
    pub delivery_queue_bytes: usize,
    /// Delivered-but-unread messages before the receiver stops accepting
    /// new data, whatever their size (empty messages included).
    pub delivery_queue_messages: usize,
    /// Largest message `send` accepts and a receiver reassembles.
    pub max_message_len: usize,
    /// Deliver each fragment as it comes in order instead of whole
    /// messages, and move the commit point to the application's `recv`:
    /// nothing is acknowledged before it was taken. For an engine that
    /// hands fragments to an application which outlives it (docs/ENGINE.md):
    /// whatever the engine acknowledged is then safe in the application,
    /// and a restored engine resumes exactly where the application stands.
    pub deliver_fragments: bool,
    /// Keep a CRC32C of every payload buffered (queued to send, or held
    /// out of order) and check it before the bytes are sent or delivered
    /// (and in `Endpoint::audit`): a payload corrupted in this memory
    /// while it waited is then never sent under a fresh, valid checksum.
    /// Two passes over every payload byte (about 15% of a 64 KiB stream's
    /// throughput on loopback), so on for an engine process, whose memory
    /// is a failure domain of its own (docs/ENGINE.md, "The state audit"),
    /// and off in an application's own process by default.
    pub verify_payloads: bool,
    /// Retransmission timeout before any round trip has been measured.
    pub rto_initial: Duration,
    /// Floor of the adaptive timeout: about 1 ms was best in Tang and
    /// Bilas [TB]'s study, and a lower one retransmits on scheduling noise.
    pub rto_min: Duration,
    /// Ceiling of the timeout after back-off, so a healed path is retried
    /// within this long.
    pub rto_max: Duration,
    /// How long new data may wait to be aggregated with more while earlier
    /// data is still in flight (a bounded Nagle rule; aggregation is Trahay
    /// et al. [NMAD] section 3). Zero sends every message at once.
    pub coalesce_delay: Duration,
    /// How long a received segment may wait for reverse data to carry its ACK.
    pub ack_delay: Duration,
    /// Window fill fraction (in 1/256ths) at which the sender asks for an
    /// immediate ACK (Tang and Bilas [TB] section 4.1.2).
    pub ack_request_at: u8,
    /// No acknowledged progress toward a peer with data outstanding for this
    /// long: the peer is unreachable and its messages fail. A floor: an
    /// endpoint whose own conversations are slow waits longer (its
    /// patience, up to `abandon_limit`).
    pub abandon_after: Duration,
    /// The longest the patience may stretch `abandon_after` to: the bound,
    /// from the last sign of life, within which the messages to a silent
    /// peer fail whatever the endpoint measured before (a peer frozen for
    /// seconds leaves round trips of seconds behind it). `None`: twelve
    /// times `abandon_after`; `Some(abandon_after)`: no stretching at all.
    pub abandon_limit: Option<Duration>,
    /// The checksum this endpoint sends with (named in every header).
    pub checksum: ChecksumKind,
    /// What it accepts from peers besides its own `checksum`: a receiver
    /// verifies with the sender's algorithm if it is in this set, and
    /// counts anything else as `checksum_refused`. Default: every algorithm
    /// but `none`, so nobody can switch verification off.
    pub accept_checksums: ChecksumSet,
    /// The cluster secret: `Some` authenticates every datagram (and
    /// refuses any that is not); `None` checks integrity with `checksum`
    /// only. The handshake and source validation hold either way.
    pub key: Option<ClusterKey>,
    /// Peers this endpoint takes in without being told of them: a node id
    /// it was not given whose handshake completes from an address it
    /// answered at (`Event::PeerAccepted`). With a cluster key the
    /// handshake proves the node holds the key; without one, only if
    /// `accept_unkeyed` says so. At most this many over the endpoint's
    /// life (0: none); they count toward `MAX_PEERS` too.
    pub accept_peers: usize,
    /// Without a cluster key, take in peers not given (up to
    /// `accept_peers`) anyway. Their node ids then prove nothing: anyone
    /// who can send here can claim one not yet taken, or move one taken in
    /// this way to its own address. Off by default; configured peers are
    /// never moved without a key.
    pub accept_unkeyed: bool,
    /// How lost segments are repaired: selective by default, go-back-N to
    /// compare with [TB].
    pub retransmit: RetransmitMode,
    /// How data uses a peer's healthy rails (`Endpoint::set_paths`).
    pub rail_policy: RailPolicy,
    /// A path that asked for an answer and heard nothing this long (or two
    /// retransmission timeouts, if longer) while another path answered is
    /// suspect: probed, and its unacknowledged data moves to another rail
    /// (Tang and Bilas [TB] section 4: a transient failure). Silence on
    /// every path at once is the peer's, not a path's (`paths.rs`).
    pub path_suspect_after: Duration,
    /// ... and this long (or five timeouts), down for that peer: probed
    /// slowly until it answers (a permanent failure).
    pub path_down_after: Duration,
    /// Probe interval of a suspect path.
    pub path_probe_interval: Duration,
    /// Probe interval of a down path, until it answers.
    pub path_down_probe_interval: Duration,
    /// A healthy path that carried nothing this long is probed, so a dead
    /// backup is known before it is needed.
    pub path_idle_probe_interval: Duration,
    /// The congestion controller of every stream (`congestion`): by
    /// default queueing delay against a target, and loss when competing
    /// with loss-based flows.
    pub congestion: crate::congestion::CongestionControl,
    /// Bytes of unreliable messages (`Endpoint::send_unreliable`) waiting
    /// to go to one peer, and waiting for the application on arrival: past
    /// either bound a message is dropped and counted (`unreliable_dropped`),
    /// never waited for.
    pub unreliable_queue_bytes: usize,
    /// ... and as many messages. The NACK-reliable class's queues (the
    /// sender's hold, a receiver's reorder buffer, the delivery queue)
    /// have the same bounds.
    pub unreliable_queue_messages: usize,
    /// How long a NACK-reliable message is held for its receiver to ask
    /// for it again (`crate::nacked`); after that, asking finds it lost.
    pub nacked_hold: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_datagram: 1472,
            send_window: 256,
            send_buffer_bytes: 4 << 20,
            send_buffer_messages: 1 << 20,
            send_window_bytes: 4 << 20,
            recv_window: 1024,
            delivery_queue_bytes: 64 << 20,
            delivery_queue_messages: 1 << 20,
            max_message_len: 64 << 20,
            deliver_fragments: false,
            verify_payloads: false,
            rto_initial: Duration::from_millis(5),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_millis(250),
            coalesce_delay: Duration::from_micros(25),
            ack_delay: Duration::from_micros(200),
            ack_request_at: 128,
            abandon_after: Duration::from_secs(5),
            abandon_limit: None,
            checksum: ChecksumKind::Crc32c,
            accept_checksums: ChecksumSet::checked(),
            key: None,
            accept_peers: 256,
            accept_unkeyed: false,
            retransmit: RetransmitMode::Selective,
            rail_policy: RailPolicy::PrimaryBackup,
            path_suspect_after: Duration::from_millis(2),
            path_down_after: Duration::from_millis(5),
            path_probe_interval: Duration::from_millis(1),
            path_down_probe_interval: Duration::from_millis(50),
            path_idle_probe_interval: Duration::from_millis(20),
            congestion: crate::congestion::CongestionControl::Delay,
            unreliable_queue_bytes: 1 << 20,
            unreliable_queue_messages: 4096,
            nacked_hold: Duration::from_millis(500),
        }
    }
}

/// A `Config` field out of its range, named so a command-line or file
/// front end can point at the option that set it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid config field `{field}`: {why}")]
pub struct ConfigError {
    /// The field's name in `Config`.
    pub field: &'static str,
    /// The allowed range, in words.
    pub why: &'static str,
}

/// A fragment leaves room in its datagram for the data frame's own 16-byte
/// header and either an ACK without SACK ranges (16 bytes) or a handshake
/// CONFIRM (24 bytes), whichever is larger: a full fragment always fits
/// behind the CONFIRM that rides in front of data until the peer shows it
/// knows us. An ACK with ranges that does not fit beside a full fragment
/// goes in a datagram of its own: reserving room for 16 ranges in every
/// datagram cost 13% more datagrams.
const FRAGMENT_OVERHEAD: usize = 16 + tether_wire::HANDSHAKE_LEN;
/// The smallest datagram an endpoint may use or agree to: it must hold an
/// ACK with every SACK range beside a data frame.
pub const MIN_DATAGRAM: usize = OVERHEAD + 16 + 8 * tether_wire::MAX_SACK_RANGES + FRAGMENT_OVERHEAD;

impl Config {
    /// Check every field against its range; an endpoint refuses a config
    /// that fails, so a bad limit is an error at start-up, not a hang later.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, why| Err(ConfigError { field, why });
        if self.max_datagram < MIN_DATAGRAM || self.max_datagram > MAX_DATAGRAM {
            return bad("max_datagram", "must be between 244 and 65507 bytes");
        }
        if self.accept_peers > crate::MAX_PEERS {
            return Err(ConfigError { field: "accept_peers", why: "must be at most MAX_PEERS (4096)" });
        }
        if self.send_window < 2 || self.send_window > 1 << 16 {
            return bad("send_window", "must be between 2 and 65536 segments");
        }
        if self.send_window_bytes < self.max_datagram {
            return bad("send_window_bytes", "must admit at least one full datagram");
        }
        if self.recv_window < 1 || self.recv_window > 1 << 20 {
            return bad("recv_window", "must be between 1 and 2^20 segments");
        }
        if self.max_message_len == 0 || self.max_message_len > u32::MAX as usize {
            return bad("max_message_len", "must be between 1 byte and 4 GiB");
        }
        if self.send_buffer_bytes == 0 {
            return bad("send_buffer_bytes", "must hold something (a larger message is taken alone)");
        }
        if self.delivery_queue_bytes < self.max_message_len {
            return bad("delivery_queue_bytes", "must hold at least one largest message");
        }
        if self.send_buffer_messages == 0 || self.send_buffer_messages > 1 << 30 {
            return bad("send_buffer_messages", "must be between 1 and 2^30");
        }
        if self.delivery_queue_messages == 0 || self.delivery_queue_messages > 1 << 30 {
            return bad("delivery_queue_messages", "must be between 1 and 2^30");
        }
        if self.unreliable_queue_bytes == 0 || self.unreliable_queue_bytes > 1 << 30 {
            return bad("unreliable_queue_bytes", "must be between 1 byte and 1 GiB");
        }
        if self.unreliable_queue_messages == 0 || self.unreliable_queue_messages > 1 << 20 {
            return bad("unreliable_queue_messages", "must be between 1 and 2^20");
        }
        if self.nacked_hold.is_zero() || self.nacked_hold > Duration::from_secs(3600) {
            return bad("nacked_hold", "must be between 1 ns and an hour");
        }
        if self.rto_min.is_zero() || self.rto_min > self.rto_max {
            return bad("rto_min", "must be non-zero and at most rto_max");
        }
        if self.rto_initial < self.rto_min || self.rto_initial > self.rto_max {
            return bad("rto_initial", "must lie between rto_min and rto_max");
        }
        if self.coalesce_delay >= self.rto_min {
            return bad("coalesce_delay", "must be below rto_min");
        }
        if self.abandon_after < self.rto_max {
            return bad("abandon_after", "must be at least rto_max");
        }
        if self.abandon_limit.is_some_and(|limit| limit < self.abandon_after) {
            return bad("abandon_limit", "must be at least abandon_after");
        }
        if self.path_suspect_after.is_zero() || self.path_suspect_after >= self.path_down_after {
            return bad("path_suspect_after", "must be non-zero and below path_down_after");
        }
        if self.path_down_after >= self.abandon_after {
            return bad("path_down_after", "must be below abandon_after");
        }
        for (field, d) in [
            ("path_probe_interval", self.path_probe_interval),
            ("path_down_probe_interval", self.path_down_probe_interval),
            ("path_idle_probe_interval", self.path_idle_probe_interval),
        ] {
            if d.is_zero() {
                return bad(field, "must be non-zero");
            }
        }
        Ok(())
    }

    /// Does this endpoint verify and take packets checksummed with `kind`?
    pub fn accepts(&self, kind: ChecksumKind) -> bool {
        kind == self.checksum || self.accept_checksums.contains(kind)
    }

    /// Payload bytes one data frame carries at most.
    pub fn max_fragment(&self) -> usize {
        self.max_fragment_for(self.max_datagram)
    }

    /// Payload bytes one data frame carries at most in datagrams of
    /// `max_datagram` bytes (the size agreed with a peer).
    pub fn max_fragment_for(&self, max_datagram: usize) -> usize {
        (max_datagram - self.overhead() - FRAGMENT_OVERHEAD).min(u16::MAX as usize)
    }

    /// Bytes each datagram carries besides its frames: header and checksum,
    /// or header, packet number and MAC when authenticated.
    pub fn overhead(&self) -> usize {
        if self.key.is_some() {
            AUTH_OVERHEAD
        } else {
            overhead(self.checksum)
        }
    }
}

// The range in `validate`'s message, kept true.
const _: () = assert!(MIN_DATAGRAM == 244);
