//! tether's wire format: the bytes that cross the network.
//!
//! A datagram is a fixed 36-byte [`Header`], a body of frames
//! ([`Frame::Data`], [`Frame::Ack`]) and a checksum trailer (4 or 8 bytes). Several frames share one datagram, which
//! is how small messages are aggregated and how ACKs ride on reverse data
//! (Trahay et al. [NMAD] section 3, Tang and Bilas [TB] section 4.1.2; the
//! papers are listed in docs/REFERENCES.md).
//!
//! [`Packet::parse`] validates *everything* before it returns: magic,
//! version, flags, every length field against the bytes actually received
//! (Li et al. [CI] section 6.1 is the cautionary tale), every frame, and the
//! checksum. Once it succeeds no accessor can fail or panic. [`PacketWriter`]
//! emits into a caller-owned buffer so the data path never allocates.
//!
//! The layout is documented byte by byte in `docs/PROTOCOL.md`.

mod error;
mod frame;
pub mod integrity;
mod packet;

pub use error::WireError;
pub use frame::{
    AckFrame, AckRepr, Channel, DataFlags, DataFrame, DatagramFrame, Frame, HandshakeFrame, HandshakeKind,
    SackRange, DATAGRAM_FIXED_LEN, HANDSHAKE_LEN, MAX_SACK_RANGES, PORT_APPLICATION, PORT_MANAGERS,
    PORT_MEMBERS, PORT_NACKED,
};
pub use integrity::{AuthKind, ChecksumKind, ChecksumSet, Checksummer, MacKey, TAG_LEN};
pub use packet::{
    overhead, Frames, Header, HeaderFlags, Landing, Opened, Packet, PacketWriter, Unverified, AUTH_OVERHEAD,
    AUTH_TRAILER_LEN, HEADER_LEN, MAGIC, MAX_TRAILER_LEN, OVERHEAD, VERSION,
};

/// Largest datagram tether ever emits or accepts: the largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;

/// A node's identity, independent of any address or rail: what the header's
/// `src_node` and `dst_node` carry. Defined here, at the bottom of the
/// stack, so the transports and the protocol core name nodes with one type.
pub type NodeId = u32;
