//! The datagram: a fixed header, frames, and a checksum trailer.
//!
//! ```text
//!  0      2     3      4         5        6          8           12
//!  +------+-----+------+---------+--------+----------+-----------+
//!  | "TH" | ver | flags| cksum   | probe  | body_len | src_node  |
//!  +------+-----+------+---------+--------+----------+-----------+
//!  12          16         24         32        36              36+body_len
//!  +-----------+----------+----------+---------+----------------+----------+
//!  | dst_node  | src_inc  | dst_inc  | epoch   | frames ...     | checksum |
//!  +-----------+----------+----------+---------+----------------+----------+
//! ```
//!
//! All integers little-endian. `src_inc`/`dst_inc` are incarnations (a node
//! restarted gets a new one; `dst_inc == 0` means "not known yet") and `epoch`
//! is the sender's stream epoch toward `dst_node`, bumped when the sender
//! abandons the stream: together they are the generations of Tang and Bilas
//! [TB] section 4.2, so packets from an older life are recognised and dropped.
//! The checksum trailer (4 or 8 bytes: the named algorithm's width) covers
//! every byte before it, taken body first and header last: the writer
//! checksums each payload as it copies it into the datagram (Trahay et al.
//! [NMAD] section 5.2, one pass instead of two) and the header, whose length
//! and flags are settled only then, at `finish`.

use core::mem::MaybeUninit;

use crate::frame::{self, parse_frame, AckRepr, DataFlags, DataFrame, Frame, HandshakeFrame};
use crate::integrity::{AuthKind, Checksummer, MacKey, TAG_LEN};
use crate::{ChecksumKind, NodeId, WireError, MAX_DATAGRAM};

pub const MAGIC: [u8; 2] = *b"TH";
/// 5: DATA's channel flag (`Channel`): a fragment of a message on `Channel::LAYER`
/// (tether's calls).
/// 4: probes are numbered (header byte 5) and an ACK names the probe it
/// answers (its byte 3), so a late answer to an older probe is not taken
/// for the answer to a newer one (3: PADDING, with which a HELLO and its
/// WELCOME prove the datagram size; 2: the handshake, HELLO, WELCOME,
/// CONFIRM, and the ACK's FULL flag).
pub const VERSION: u8 = 5;
/// Bytes before the body.
pub const HEADER_LEN: usize = 36;
/// Bytes after the body of an authenticated datagram: the packet number
/// (8) and the AES-GCM tag (16).
pub const AUTH_TRAILER_LEN: usize = 8 + TAG_LEN;
/// Bytes after the body at most: an authenticated datagram's trailer.
pub const MAX_TRAILER_LEN: usize = AUTH_TRAILER_LEN;
/// Bytes an authenticated datagram carries besides its frames.
pub const AUTH_OVERHEAD: usize = HEADER_LEN + AUTH_TRAILER_LEN;
/// Bytes after the body at least.
const MIN_TRAILER_LEN: usize = 4;
/// Bytes a datagram carries besides its frames, at most (any checksum).
pub const OVERHEAD: usize = HEADER_LEN + MAX_TRAILER_LEN;

/// Bytes a datagram checksummed with `kind` carries besides its frames.
pub const fn overhead(kind: ChecksumKind) -> usize {
    HEADER_LEN + kind.width()
}

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const FLAGS: usize = 3;
    pub const CHECKSUM_KIND: usize = 4;
    pub const PROBE: usize = 5;
    pub const BODY_LEN: Range<usize> = 6..8;
    pub const SRC_NODE: Range<usize> = 8..12;
    pub const DST_NODE: Range<usize> = 12..16;
    pub const SRC_INC: Range<usize> = 16..24;
    pub const DST_INC: Range<usize> = 24..32;
    pub const EPOCH: Range<usize> = 32..36;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderFlags(u8);

impl HeaderFlags {
    /// The sender's window is filling: acknowledge at once rather than after
    /// the delayed-ACK interval (Tang and Bilas [TB] section 4.1.2).
    pub const ACK_REQUEST: u8 = 0x01;
    /// The datagram is authenticated: its trailer is a packet number and
    /// a tag, header byte 4 names the [`AuthKind`] in place of a checksum,
    /// and the body is encrypted unless that is AES-256-GMAC
    /// (docs/PROTOCOL.md, "Authentication").
    pub const AUTHENTICATED: u8 = 0x02;
    const KNOWN: u8 = Self::ACK_REQUEST | Self::AUTHENTICATED;

    pub fn new(ack_request: bool) -> Self {
        HeaderFlags(ack_request as u8 * Self::ACK_REQUEST)
    }
    pub fn ack_request(self) -> bool {
        self.0 & Self::ACK_REQUEST != 0
    }
    pub fn authenticated(self) -> bool {
        self.0 & Self::AUTHENTICATED != 0
    }
    pub fn bits(self) -> u8 {
        self.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub flags: HeaderFlags,
    pub checksum: ChecksumKind,
    pub src_node: NodeId,
    pub dst_node: NodeId,
    pub src_inc: u64,
    pub dst_inc: u64,
    pub epoch: u32,
    /// The number of the probe this datagram is (byte 5): a datagram with
    /// the ACK-request flag and no frames that a sender's retransmission
    /// timeout sent, numbered so that the answer can name it. 0: not a
    /// numbered probe; only a datagram with the ACK-request flag may carry
    /// another.
    pub probe: u8,
}

impl Header {
    /// The source and destination node a datagram's header claims, read
    /// without checking anything else: only to pick the core (of the many
    /// an engine runs) that the datagram is for, which then checks it all.
    /// `None` for a datagram too short to hold them.
    pub fn peek_nodes(datagram: &[u8]) -> Option<(NodeId, NodeId)> {
        let word = |r: core::ops::Range<usize>| {
            datagram.get(r).map(|b| NodeId::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        Some((word(field::SRC_NODE)?, word(field::DST_NODE)?))
    }

    fn emit(&self, out: &mut [u8]) {
        out[field::MAGIC].copy_from_slice(&MAGIC);
        out[field::VERSION] = VERSION;
        out[field::FLAGS] = self.flags.0;
        out[field::CHECKSUM_KIND] = self.checksum as u8;
        out[field::PROBE] = self.probe;
        out[field::BODY_LEN].fill(0);
        out[field::SRC_NODE].copy_from_slice(&self.src_node.to_le_bytes());
        out[field::DST_NODE].copy_from_slice(&self.dst_node.to_le_bytes());
        out[field::SRC_INC].copy_from_slice(&self.src_inc.to_le_bytes());
        out[field::DST_INC].copy_from_slice(&self.dst_inc.to_le_bytes());
        out[field::EPOCH].copy_from_slice(&self.epoch.to_le_bytes());
    }
}

/// A received datagram that passed every check.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    pub header: Header,
    body: &'a [u8],
    /// The datagram's length as received (header and trailer included).
    len: usize,
    /// The packet number of an authenticated datagram.
    pn: Option<u64>,
}

impl<'a> Packet<'a> {
    /// Validate a received datagram completely: header fields, the body
    /// length against the received length, every frame, and the checksum.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, WireError> {
        Unverified::parse(datagram)?.verify()
    }

    /// The frames, in order. Cannot fail: `parse` validated them.
    pub fn frames(&self) -> Frames<'a> {
        Frames { rest: self.body }
    }

    pub fn body_len(&self) -> usize {
        self.body.len()
    }

    /// The datagram's length as it was received: a padded handshake's
    /// proof of the size the path carries.
    pub fn datagram_len(&self) -> usize {
        self.len
    }

    /// The packet number, for an authenticated datagram (authenticated with it).
    pub fn packet_number(&self) -> Option<u64> {
        self.pn
    }
}

pub struct Frames<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Frames<'a> {
    type Item = Frame<'a>;
    fn next(&mut self) -> Option<Frame<'a>> {
        // `Packet::parse` walked these exact bytes successfully, so an error
        // here is impossible; stopping is the safe answer regardless.
        // Padding is last and means nothing: it ends the walk.
        let (frame, len) = parse_frame(self.rest).ok()?;
        self.rest = &self.rest[len..];
        frame
    }
}

/// A received datagram whose header is valid but whose frames and
/// checksum are not yet verified. Nothing in it may be acted on until
/// [`verify`](Self::verify) or [`verify_landing`](Self::verify_landing)
/// turns it into a [`Packet`]; it exists so the receiver can copy payloads
/// to where they will land *while* verifying (Trahay et al. [NMAD] 5.2:
/// one pass over the bytes instead of two) and commit the copies only if
/// the check passes. The receive path walks the frames twice in all: once
/// here while verifying, once to act on the verified packet.
#[derive(Debug, Clone, Copy)]
pub struct Unverified<'a> {
    pub header: Header,
    datagram: &'a [u8],
    /// Where the trailer starts: the body is `HEADER_LEN..at`.
    at: usize,
    /// How an authenticated datagram is protected (header byte 4).
    auth: Option<AuthKind>,
}

/// An authenticated datagram opened: its header and plaintext body (in the
/// caller's scratch buffer if it was decrypted, else where it was
/// received), already authenticated. Only its frames remain
/// to be walked ([`land`](Self::land)).
#[derive(Debug)]
pub struct Opened<'s> {
    header: Header,
    body: &'s [u8],
    pn: u64,
    /// The datagram's length as received.
    len: usize,
}

impl<'s> Opened<'s> {
    /// Walk the frames, copying each DATA payload to where `landing`
    /// wants it. A malformed frame in an authenticated datagram is the
    /// sender's own fault (nothing on the way could have made it).
    pub fn land(self, landing: &mut impl Landing) -> Result<Packet<'s>, WireError> {
        let mut rest = self.body;
        while !rest.is_empty() {
            let (frame, len) = parse_frame(rest)?;
            if let Some(Frame::Data(data)) = frame {
                if let Some(dst) = landing.landing(&data) {
                    let src = data.payload;
                    assert_eq!(dst.len(), src.len(), "a landing is as long as its payload");
                    // SAFETY: equal lengths (checked above); no overlap: the
                    // payload is in the received datagram or the caller's
                    // scratch buffer, `dst` elsewhere.
                    unsafe {
                        core::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), src.len())
                    };
                }
            }
            rest = &rest[len..];
        }
        Ok(Packet { header: self.header, body: self.body, pn: Some(self.pn), len: self.len })
    }
}

/// Where the receiver wants a DATA frame's payload copied during
/// verification. The copy is only a proposal until verification succeeds:
/// if it fails, whatever was written must be treated as garbage.
pub trait Landing {
    /// A destination of exactly `frame.payload.len()` bytes, or `None` to
    /// only checksum the payload. Called once per DATA frame, in order.
    fn landing(&mut self, frame: &DataFrame<'_>) -> Option<&mut [MaybeUninit<u8>]>;
}

impl<'a> Unverified<'a> {
    /// The header's checks: magic, version, flags, checksum kind, and the
    /// body length against the bytes received. The frames are checked by
    /// [`verify`](Self::verify) or [`verify_landing`](Self::verify_landing),
    /// in the same walk that checks the trailer.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, WireError> {
        let shortest = HEADER_LEN + MIN_TRAILER_LEN;
        if datagram.len() < shortest {
            return Err(WireError::Truncated { needed: shortest, got: datagram.len() });
        }
        if datagram.len() > MAX_DATAGRAM {
            return Err(WireError::Oversized);
        }
        if datagram[field::MAGIC] != MAGIC {
            return Err(WireError::BadMagic);
        }
        if datagram[field::VERSION] != VERSION {
            return Err(WireError::BadVersion(datagram[field::VERSION]));
        }
        let flags = datagram[field::FLAGS];
        if flags & !HeaderFlags::KNOWN != 0 {
            return Err(WireError::BadFlags(flags));
        }
        let probe = datagram[field::PROBE];
        if probe != 0 && flags & HeaderFlags::ACK_REQUEST == 0 {
            return Err(WireError::ReservedBits);
        }
        let kind_raw = datagram[field::CHECKSUM_KIND];
        let authenticated = flags & HeaderFlags::AUTHENTICATED != 0;
        // Byte 4 names the checksum, or with a MAC in its place the
        // authentication algorithm.
        let (checksum, auth) = if authenticated {
            let auth = AuthKind::from_u8(kind_raw).ok_or(WireError::UnknownChecksum(kind_raw))?;
            (ChecksumKind::None, Some(auth))
        } else {
            (ChecksumKind::from_u8(kind_raw).ok_or(WireError::UnknownChecksum(kind_raw))?, None)
        };
        let width = if authenticated { AUTH_TRAILER_LEN } else { checksum.width() };
        if datagram.len() < HEADER_LEN + width {
            return Err(WireError::Truncated { needed: HEADER_LEN + width, got: datagram.len() });
        }
        let claimed = u16::from_le_bytes([datagram[6], datagram[7]]) as usize;
        let actual = datagram.len() - HEADER_LEN - width;
        if claimed != actual {
            return Err(WireError::LengthMismatch { claimed, actual });
        }
        let at = datagram.len() - width;
        let le32 = |r: core::ops::Range<usize>| u32::from_le_bytes(datagram[r].try_into().expect("4 bytes"));
        let le64 = |r: core::ops::Range<usize>| u64::from_le_bytes(datagram[r].try_into().expect("8 bytes"));
        let header = Header {
            flags: HeaderFlags(flags),
            checksum,
            src_node: le32(field::SRC_NODE),
            dst_node: le32(field::DST_NODE),
            src_inc: le64(field::SRC_INC),
            dst_inc: le64(field::DST_INC),
            epoch: le32(field::EPOCH),
            probe,
        };
        Ok(Unverified { header, datagram, at, auth })
    }

    /// Check every frame, then the trailer in a pass of its own. An
    /// authenticated datagram needs [`open`](Self::open) instead.
    pub fn verify(self) -> Result<Packet<'a>, WireError> {
        if self.header.flags.authenticated() {
            return Err(WireError::KeyRequired);
        }
        let mut rest = &self.datagram[HEADER_LEN..self.at];
        while !rest.is_empty() {
            match parse_frame(rest) {
                Ok((_, len)) => rest = &rest[len..],
                Err(e) => return Err(self.frame_error(e)),
            }
        }
        let mut sum = Checksummer::new(self.header.checksum);
        sum.update(&self.datagram[HEADER_LEN..self.at]);
        self.check(sum)
    }

    /// The datagram's length in bytes.
    pub fn len(&self) -> usize {
        self.datagram.len()
    }

    /// Never true: a datagram has at least a header.
    pub fn is_empty(&self) -> bool {
        self.datagram.is_empty()
    }

    /// How the datagram says it is authenticated (`None`: it is not).
    pub fn auth(&self) -> Option<AuthKind> {
        self.auth
    }

    /// The packet number of an authenticated datagram (not yet verified).
    pub fn packet_number(&self) -> Option<u64> {
        self.header.flags.authenticated().then(|| u64_le(&self.datagram[self.at..self.at + 8]))
    }

    /// Check every frame and the trailer while copying each DATA payload to
    /// where `landing` wants it: one walk over the frames and one pass over
    /// the payload bytes do all three. On success every landing given holds
    /// its payload; on failure none may be used (a landing may have been
    /// asked for before a later frame turned out bad). An authenticated
    /// datagram needs [`open`](Self::open) instead.
    pub fn verify_landing(self, landing: &mut impl Landing) -> Result<Packet<'a>, WireError> {
        if self.header.flags.authenticated() {
            return Err(WireError::KeyRequired);
        }
        let body = &self.datagram[HEADER_LEN..self.at];
        let mut sum = Checksummer::new(self.header.checksum);
        // The checksum covers `body` up to `summed`; frames are parsed up
        // to `at`. Large payloads are copied to their landing and checksummed
        // in one pass; the rest is checksummed in runs (`FUSE_FROM`).
        let (mut summed, mut at) = (0, 0);
        while at < body.len() {
            let (frame, len) = match parse_frame(&body[at..]) {
                Ok(f) => f,
                Err(e) => return Err(self.frame_error(e)),
            };
            at += len;
            let Some(Frame::Data(data)) = frame else { continue };
            let Some(dst) = landing.landing(&data) else { continue };
            // A DATA frame ends with its payload.
            let payload = data.payload;
            if payload.len() >= FUSE_FROM {
                sum.update(&body[summed..at - payload.len()]);
                sum.copy_update_uninit(dst, payload);
                summed = at;
            } else {
                dst.write_copy_of_slice(payload);
            }
        }
        sum.update(&body[summed..]);
        self.check(sum)
    }

    /// Authenticate an authenticated datagram under `key`, and decrypt it
    /// if it is encrypted: the body is decrypted into `scratch` in the
    /// same pass that authenticates it (`scratch` grows only until it is
    /// as long as the largest body), the header and packet number
    /// authenticated with it. A datagram in clear (AES-256-GMAC) is checked
    /// where it lies, all of it authenticated, and `scratch` is not touched.
    pub fn open<'s>(self, key: &MacKey, scratch: &'s mut Vec<u8>) -> Result<Opened<'s>, WireError>
    where
        'a: 's,
    {
        let Some(pn) = self.packet_number() else { return Err(WireError::KeyRequired) };
        if self.auth != Some(key.kind()) {
            return Err(WireError::ChecksumMismatch);
        }
        let (d, at) = (self.datagram, self.at);
        let tag = &d[at + 8..at + 8 + TAG_LEN];
        let body = &d[HEADER_LEN..at];
        if !key.kind().encrypts() {
            // Header, body and packet number lie in one piece: all of it
            // is the associated data, and there is nothing to decrypt.
            if !key.open(pn, &d[..at + 8], tag, &[], &mut []) {
                return Err(WireError::ChecksumMismatch);
            }
            return Ok(Opened { header: self.header, body, pn, len: d.len() });
        }
        if scratch.len() < body.len() {
            scratch.resize(body.len(), 0);
        }
        let out = &mut scratch[..body.len()];
        let aad = associated_data(&d[..HEADER_LEN], &d[at..at + 8]);
        if !key.open(pn, &aad, tag, body, out) {
            return Err(WireError::ChecksumMismatch);
        }
        Ok(Opened { header: self.header, body: out, pn, len: d.len() })
    }

    /// What a malformed frame counts as: bad frames in a datagram whose
    /// checksum fails are corruption, and are counted as such; with a good
    /// checksum the sender itself is at fault.
    fn frame_error(&self, e: WireError) -> WireError {
        let mut sum = Checksummer::new(self.header.checksum);
        sum.update(&self.datagram[HEADER_LEN..self.at]);
        if self.trailer_matches(&mut sum) {
            e
        } else {
            WireError::ChecksumMismatch
        }
    }

    /// Feed the header into `sum`, which has taken the body; does the
    /// trailer match?
    fn trailer_matches(&self, sum: &mut Checksummer) -> bool {
        let (d, at) = (self.datagram, self.at);
        sum.update(&d[..HEADER_LEN]);
        // With `none` the trailer must be zero, as the writer leaves it: else
        // a single flipped bit in the kind byte would turn verification off.
        let expected = if self.header.checksum == ChecksumKind::None { 0 } else { sum.finish() };
        trailer_of(d, at) == expected
    }

    fn check(self, mut sum: Checksummer) -> Result<Packet<'a>, WireError> {
        if !self.trailer_matches(&mut sum) {
            return Err(WireError::ChecksumMismatch);
        }
        Ok(Packet {
            header: self.header,
            body: &self.datagram[HEADER_LEN..self.at],
            pn: None,
            len: self.datagram.len(),
        })
    }
}

/// What an encrypting algorithm authenticates besides the body of an
/// authenticated datagram: its header, then its packet number.
fn associated_data(header: &[u8], pn: &[u8]) -> [u8; HEADER_LEN + 8] {
    let mut aad = [0u8; HEADER_LEN + 8];
    aad[..HEADER_LEN].copy_from_slice(header);
    aad[HEADER_LEN..].copy_from_slice(pn);
    aad
}

fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The trailer starting at `at`, as the algorithm's value.
fn trailer_of(datagram: &[u8], at: usize) -> u64 {
    let mut trailer = [0u8; 8];
    trailer[..datagram.len() - at].copy_from_slice(&datagram[at..]);
    u64::from_le_bytes(trailer)
}

/// Payloads from this size on are checksummed as they are copied, in one
/// pass (the fused kernels); smaller ones are copied plainly and
/// checksummed with their neighbours in one pass over a run of frames
/// later. Per call the checksum has a fixed cost (tens of nanoseconds)
/// that two 8-byte updates per message would pay thousands of times per
/// datagram, while a second pass over a few hundred bytes still in L1
/// costs next to nothing. Writer and reader use the same rule, though
/// either may change it: the sum is the same.
pub const FUSE_FROM: usize = 256;

/// Builds one datagram in a caller-owned buffer: header first, then frames
/// (each large payload checksummed as it is copied in, the rest in runs:
/// [`FUSE_FROM`]), then `finish` fills in the body length, checksums the
/// header and writes the trailer.
pub struct PacketWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    /// The checksum covers the body up to here (from `HEADER_LEN`).
    summed: usize,
    sum: Checksummer,
    width: usize,
    /// The key and packet number of an authenticated datagram.
    seal: Option<(MacKey, u64)>,
}

impl<'a> PacketWriter<'a> {
    /// `buf` bounds the datagram size; it is clamped to [`MAX_DATAGRAM`].
    /// The last bytes are kept for the checksum trailer.
    pub fn new(buf: &'a mut [u8], header: &Header) -> Result<Self, WireError> {
        let cap = buf.len().min(MAX_DATAGRAM);
        let width = header.checksum.width();
        if cap < HEADER_LEN + width {
            return Err(WireError::BufferTooSmall);
        }
        let buf = &mut buf[..cap];
        header.emit(buf);
        Ok(PacketWriter {
            buf,
            len: HEADER_LEN,
            summed: HEADER_LEN,
            sum: Checksummer::new(header.checksum),
            width,
            seal: None,
        })
    }

    /// An authenticated datagram: sealed under `key` at `finish` (with its
    /// algorithm: the body encrypted unless it is AES-256-GMAC), with
    /// packet number `pn` (the nonce: never twice under one key) and the
    /// tag in the trailer in place of the header's checksum (its kind byte
    /// names the algorithm and its `AUTHENTICATED` flag is set).
    pub fn new_authenticated(
        buf: &'a mut [u8],
        header: &Header,
        key: &MacKey,
        pn: u64,
    ) -> Result<Self, WireError> {
        let cap = buf.len().min(MAX_DATAGRAM);
        if cap < AUTH_OVERHEAD {
            return Err(WireError::BufferTooSmall);
        }
        let buf = &mut buf[..cap];
        let header = Header {
            checksum: ChecksumKind::None,
            flags: HeaderFlags(header.flags.0 | HeaderFlags::AUTHENTICATED),
            ..*header
        };
        header.emit(buf);
        buf[field::CHECKSUM_KIND] = key.kind() as u8;
        Ok(PacketWriter {
            buf,
            len: HEADER_LEN,
            summed: HEADER_LEN,
            sum: Checksummer::new(ChecksumKind::None),
            width: AUTH_TRAILER_LEN,
            seal: Some((key.clone(), pn)),
        })
    }

    /// Bytes still free for frames.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.width - self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == HEADER_LEN
    }

    pub fn set_ack_request(&mut self, on: bool) {
        let bit = HeaderFlags::ACK_REQUEST;
        let f = &mut self.buf[field::FLAGS];
        *f = if on { *f | bit } else { *f & !bit };
        if !on {
            self.buf[field::PROBE] = 0;
        }
    }

    /// Make the datagram the probe numbered `n` (see [`Header::probe`]; 0:
    /// an unnumbered one): the ACK-request flag and the number.
    pub fn set_probe(&mut self, n: u8) {
        self.set_ack_request(true);
        self.buf[field::PROBE] = n;
    }

    /// Append a DATA frame; a payload of [`FUSE_FROM`] bytes or more is
    /// copied and checksummed in one pass.
    pub fn push_data(
        &mut self,
        seq: u64,
        flags: DataFlags,
        total_len: u32,
        payload: &[u8],
    ) -> Result<(), WireError> {
        let end = self.buf.len() - self.width;
        let fuse = payload.len() >= FUSE_FROM;
        if fuse {
            self.catch_up();
        }
        let out = &mut self.buf[self.len..end];
        self.len += frame::emit_data(out, seq, flags, total_len, payload, fuse.then_some(&mut self.sum))?;
        if fuse {
            self.summed = self.len;
        }
        Ok(())
    }

    /// Checksum what was written since the checksum last caught up.
    fn catch_up(&mut self) {
        self.sum.update(&self.buf[self.summed..self.len]);
        self.summed = self.len;
    }

    /// Append a DATAGRAM frame (an unreliable message, whole, for `port`);
    /// checksummed later with the run it belongs to.
    pub fn push_datagram(&mut self, port: u8, payload: &[u8]) -> Result<(), WireError> {
        self.push_frame(|out| frame::emit_datagram(out, port, payload))
    }

    pub fn push_handshake(&mut self, h: &HandshakeFrame) -> Result<(), WireError> {
        self.push_frame(|out| frame::emit_handshake(out, h))
    }

    pub fn push_ack(&mut self, ack: &AckRepr) -> Result<(), WireError> {
        self.push_frame(|out| frame::emit_ack(out, ack))
    }

    /// Pad the datagram so that `finish` returns `datagram_len` bytes (or
    /// as many as the buffer holds, if fewer). The padding is the last
    /// frame: nothing can be pushed after it.
    pub fn pad_to(&mut self, datagram_len: usize) {
        let end = self.buf.len() - self.width;
        let to = datagram_len.saturating_sub(self.width).clamp(self.len, end);
        // The datagram ends where the padding does: no room is left.
        let buf = core::mem::take(&mut self.buf);
        self.buf = &mut buf[..to + self.width];
        let _ = self.push_frame(|out| Ok(frame::emit_padding(out)));
    }

    /// Append a frame without a payload: `emit` writes it into the room
    /// left (checksummed later, with the run it belongs to).
    fn push_frame(
        &mut self,
        emit: impl FnOnce(&mut [u8]) -> Result<usize, WireError>,
    ) -> Result<(), WireError> {
        let end = self.buf.len() - self.width;
        self.len += emit(&mut self.buf[self.len..end])?;
        Ok(())
    }

    /// Write the body length and the checksum trailer; returns the datagram length.
    pub fn finish(mut self) -> usize {
        let body_len = (self.len - HEADER_LEN) as u16;
        self.buf[field::BODY_LEN].copy_from_slice(&body_len.to_le_bytes());
        let at = self.len;
        if let Some((key, pn)) = &self.seal {
            self.buf[at..at + 8].copy_from_slice(&pn.to_le_bytes());
            let tag = if key.kind().encrypts() {
                let aad = associated_data(&self.buf[..HEADER_LEN], &pn.to_le_bytes());
                key.seal(*pn, &aad, &mut self.buf[HEADER_LEN..at])
            } else {
                key.seal(*pn, &self.buf[..at + 8], &mut [])
            };
            self.buf[at + 8..at + AUTH_TRAILER_LEN].copy_from_slice(&tag);
            return at + AUTH_TRAILER_LEN;
        }
        self.catch_up();
        self.sum.update(&self.buf[..HEADER_LEN]);
        let sum = self.sum.finish().to_le_bytes();
        self.buf[at..at + self.width].copy_from_slice(&sum[..self.width]);
        at + self.width
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrity::MacKey;
    use crate::SackRange;

    fn header() -> Header {
        Header {
            flags: HeaderFlags::new(true),
            checksum: ChecksumKind::Crc32c,
            src_node: 7,
            dst_node: 9,
            src_inc: 0x0102_0304_0506_0708,
            dst_inc: 42,
            epoch: 3,
            probe: 5,
        }
    }

    #[test]
    fn only_a_datagram_asking_for_an_ack_is_a_numbered_probe() {
        let mut buf = [0u8; 128];
        let h = Header { flags: HeaderFlags::new(false), probe: 0, ..header() };
        let mut w = PacketWriter::new(&mut buf, &h).unwrap();
        w.set_probe(200);
        let n = w.finish();
        let p = Packet::parse(&buf[..n]).unwrap();
        assert!(p.header.flags.ack_request());
        assert_eq!(p.header.probe, 200);
        // The flag cleared, the number goes with it.
        let mut w = PacketWriter::new(&mut buf, &h).unwrap();
        w.set_probe(200);
        w.set_ack_request(false);
        let n = w.finish();
        assert_eq!(Packet::parse(&buf[..n]).unwrap().header.probe, 0);
        // A number without the flag is refused (before the checksum is read).
        let mut w = PacketWriter::new(&mut buf, &h).unwrap();
        w.set_probe(7);
        let n = w.finish();
        buf[field::FLAGS] &= !HeaderFlags::ACK_REQUEST;
        assert_eq!(Packet::parse(&buf[..n]).unwrap_err(), WireError::ReservedBits);
    }

    #[test]
    fn an_ack_names_the_probe_it_answers_and_only_an_answer_names_one() {
        let mut buf = [0u8; 128];
        let h = Header { probe: 0, ..header() };
        for answer in [None, Some(0), Some(255)] {
            let mut w = PacketWriter::new(&mut buf, &h).unwrap();
            let mut ack = AckRepr::new(1, 10);
            ack.answer = answer;
            w.push_ack(&ack).unwrap();
            let n = w.finish();
            let p = Packet::parse(&buf[..n]).unwrap();
            let Some(Frame::Ack(a)) = p.frames().next() else { panic!("expected an ACK") };
            assert_eq!(a.answer, answer);
        }
        // Byte 3 set without the ANSWER flag: malformed.
        let mut w = PacketWriter::new(&mut buf, &h).unwrap();
        w.push_ack(&AckRepr::new(1, 10)).unwrap();
        let n = w.finish();
        buf[HEADER_LEN + 3] = 4;
        let mut fixed = buf;
        // Re-checksum so that only the frame is wrong.
        let sum = {
            let mut c = Checksummer::new(ChecksumKind::Crc32c);
            c.update(&fixed[HEADER_LEN..n - 4]);
            c.update(&fixed[..HEADER_LEN]);
            c.finish().to_le_bytes()
        };
        fixed[n - 4..n].copy_from_slice(&sum[..4]);
        assert!(matches!(Packet::parse(&fixed[..n]), Err(WireError::MalformedFrame(_))));
    }

    fn sample(buf: &mut [u8]) -> usize {
        let mut w = PacketWriter::new(buf, &header()).unwrap();
        w.push_data(5, DataFlags::new(true, true), 0, b"hello").unwrap();
        let mut ack = AckRepr::new(1, 100);
        ack.full = true;
        ack.answer = Some(9);
        assert!(ack.push_range(SackRange { start: 2, end: 4 }));
        w.push_ack(&ack).unwrap();
        w.finish()
    }

    #[test]
    fn round_trip_fixture() {
        let mut buf = [0u8; 256];
        let n = sample(&mut buf);
        assert_eq!(n, overhead(ChecksumKind::Crc32c) + 12 + 5 + 16 + 8);
        assert_eq!(&buf[..4], &[b'T', b'H', VERSION, HeaderFlags::ACK_REQUEST]);
        let p = Packet::parse(&buf[..n]).unwrap();
        assert_eq!(p.header, header());
        let frames: Vec<_> = p.frames().collect();
        assert_eq!(frames.len(), 2);
        match frames[0] {
            Frame::Data(d) => {
                assert_eq!((d.seq, d.payload, d.total_len), (5, &b"hello"[..], None));
                assert!(d.flags.first() && d.flags.last());
            }
            _ => panic!("expected data"),
        }
        match frames[1] {
            Frame::Ack(a) => {
                assert_eq!((a.epoch, a.cumulative, a.full, a.answer), (1, 100, true, Some(9)));
                assert_eq!(a.ranges().collect::<Vec<_>>(), vec![SackRange { start: 2, end: 4 }]);
            }
            _ => panic!("expected ack"),
        }
    }

    /// A padded datagram is exactly as long as asked, its padding is
    /// invisible to the frame walk, and a padding byte that is not zero
    /// is refused.
    #[test]
    fn padding_fills_to_the_size_and_hides_nothing() {
        let mut buf = vec![0u8; 2000];
        let hello =
            HandshakeFrame { kind: frame::HandshakeKind::Hello, max_datagram: 1200, nonce: 3, cookie: 0 };
        let mut w = PacketWriter::new(&mut buf, &header()).unwrap();
        w.push_handshake(&hello).unwrap();
        w.pad_to(1200);
        assert_eq!(w.remaining(), 0);
        assert!(w.push_handshake(&hello).is_err(), "nothing goes after the padding");
        let n = w.finish();
        assert_eq!(n, 1200);
        let p = Packet::parse(&buf[..n]).unwrap();
        assert_eq!((p.datagram_len(), p.frames().collect::<Vec<_>>()), (1200, vec![Frame::Handshake(hello)]));
        // Beyond the buffer: as much as it holds.
        let mut small = [0u8; 300];
        let mut w = PacketWriter::new(&mut small, &header()).unwrap();
        w.pad_to(1200);
        assert_eq!(w.finish(), 300);
        // A byte of padding that is not zero, under a good checksum.
        let mut bad = buf[..n].to_vec();
        bad[HEADER_LEN + frame::HANDSHAKE_LEN + 7] = 1;
        let trailer = ChecksumKind::Crc32c.compute(&[&bad[HEADER_LEN..n - 4], &bad[..HEADER_LEN]]) as u32;
        bad[n - 4..].copy_from_slice(&trailer.to_le_bytes());
        assert_eq!(Packet::parse(&bad).unwrap_err(), WireError::MalformedFrame("padding not zero"));
    }

    #[test]
    fn rejects_each_kind_of_bad_datagram() {
        let mut buf = [0u8; 256];
        let n = sample(&mut buf);
        let good = buf[..n].to_vec();
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut d = good.clone();
            f(&mut d);
            Packet::parse(&d).unwrap_err()
        };
        assert!(matches!(Packet::parse(&good[..10]), Err(WireError::Truncated { .. })));
        assert_eq!(with(&|d| d[0] = b'X'), WireError::BadMagic);
        assert_eq!(with(&|d| d[2] = 9), WireError::BadVersion(9));
        assert_eq!(with(&|d| d[3] = 0x80), WireError::BadFlags(0x80));
        assert_eq!(with(&|d| d[4] = 77), WireError::UnknownChecksum(77));
        assert!(matches!(with(&|d| d.truncate(n - 1)), WireError::LengthMismatch { .. }));
        assert!(matches!(with(&|d| d.push(0)), WireError::LengthMismatch { .. }));
        assert_eq!(with(&|d| d[HEADER_LEN + 14] ^= 1), WireError::ChecksumMismatch);
        // The ACK frame starts after the 17-byte DATA frame: its flag byte
        // takes only the FULL and ANSWER bits, its reserved byte nothing.
        let ack_at = HEADER_LEN + 12 + 5;
        let mut bad = good.clone();
        bad[ack_at + 2] |= 0x04;
        let trailer = ChecksumKind::Crc32c.compute(&[&bad[HEADER_LEN..n - 4], &bad[..HEADER_LEN]]) as u32;
        bad[n - 4..].copy_from_slice(&trailer.to_le_bytes());
        assert!(matches!(Packet::parse(&bad), Err(WireError::MalformedFrame(_))));
    }

    #[test]
    fn frame_lengths_are_never_trusted() {
        // With checksum `none` a lying length field reaches frame parsing:
        // it must be caught there, not read past the buffer.
        let mut h = header();
        h.checksum = ChecksumKind::None;
        let mut buf = [0u8; 128];
        let mut w = PacketWriter::new(&mut buf, &h).unwrap();
        w.push_data(1, DataFlags::new(true, true), 0, b"abcd").unwrap();
        let n = w.finish();
        buf[HEADER_LEN + 2] = 200; // claims a 200-byte payload
        assert_eq!(Packet::parse(&buf[..n]).unwrap_err(), WireError::FrameTruncated);
        buf[HEADER_LEN] = 0x55;
        assert_eq!(Packet::parse(&buf[..n]).unwrap_err(), WireError::UnknownFrame(0x55));
    }

    #[test]
    fn writer_refuses_to_overflow() {
        let mut buf = [0u8; HEADER_LEN + 4 + 20];
        let mut w = PacketWriter::new(&mut buf, &header()).unwrap();
        assert_eq!(w.push_data(1, DataFlags::new(true, true), 0, &[0; 9]), Err(WireError::BufferTooSmall));
        assert!(w.is_empty());
        w.push_data(1, DataFlags::new(true, true), 0, &[0; 8]).unwrap();
        assert_eq!(w.remaining(), 0);
    }

    fn authenticated(key: &MacKey, pn: u64) -> Vec<u8> {
        let mut buf = [0u8; 256];
        let mut w = PacketWriter::new_authenticated(&mut buf, &header(), key, pn).unwrap();
        w.push_data(5, DataFlags::new(true, true), 0, b"hello").unwrap();
        let n = w.finish();
        buf[..n].to_vec()
    }

    #[test]
    fn an_authenticated_datagram_checks_only_under_its_key() {
        for kind in AuthKind::ALL {
            let key = MacKey::derive(kind, &[1; 32], "test", &[1, 2]);
            let d = authenticated(&key, 77);
            assert_eq!(d.len(), AUTH_OVERHEAD + 12 + 5);
            let clear = d.windows(5).any(|w| w == b"hello");
            assert_eq!(clear, !kind.encrypts(), "{kind:?}: the body is encrypted unless GMAC");
            let u = Unverified::parse(&d).unwrap();
            assert!(u.header.flags.authenticated());
            assert_eq!(u.header.checksum, ChecksumKind::None);
            assert_eq!(u.auth(), Some(kind));
            assert_eq!(u.packet_number(), Some(77));
            let mut scratch = Vec::new();
            let p = u.open(&key, &mut scratch).unwrap().land(&mut NoLanding).unwrap();
            assert_eq!(p.packet_number(), Some(77));
            match p.frames().next() {
                Some(Frame::Data(f)) => assert_eq!(f.payload, b"hello"),
                other => panic!("{other:?}"),
            }
            assert_eq!(Packet::parse(&d).unwrap_err(), WireError::KeyRequired);
            let other = MacKey::derive(kind, &[1; 32], "test", &[1, 3]);
            assert_eq!(
                Unverified::parse(&d).unwrap().open(&other, &mut scratch).unwrap_err(),
                WireError::ChecksumMismatch
            );
            // The same secret under another algorithm is another key, and
            // a datagram is only opened with its own algorithm.
            for k2 in AuthKind::ALL.into_iter().filter(|&k2| k2 != kind) {
                let same_secret = MacKey::derive(k2, &[1; 32], "test", &[1, 2]);
                assert_eq!(
                    Unverified::parse(&d).unwrap().open(&same_secret, &mut scratch).unwrap_err(),
                    WireError::ChecksumMismatch
                );
                let mut relabelled = d.clone();
                relabelled[field::CHECKSUM_KIND] = k2 as u8;
                let u = Unverified::parse(&relabelled).unwrap();
                assert!(u.open(&same_secret, &mut scratch).is_err(), "{kind:?} relabelled {k2:?}");
            }
            // Every byte is covered: the header, the body, the packet number, the tag.
            for i in 0..d.len() {
                let mut bad = d.clone();
                bad[i] ^= 0x10;
                let ok = Unverified::parse(&bad).and_then(|u| u.open(&key, &mut scratch).map(|_| ()));
                assert!(ok.is_err(), "{kind:?}: byte {i} flipped and still accepted");
            }
            // A kind byte naming no algorithm is no format.
            let mut unknown = d.clone();
            unknown[field::CHECKSUM_KIND] = 0;
            assert_eq!(Unverified::parse(&unknown).unwrap_err(), WireError::UnknownChecksum(0));
            assert!(format!("{key:?}").ends_with("..)"), "keys are never printed");
        }
    }

    struct NoLanding;
    impl Landing for NoLanding {
        fn landing(&mut self, _: &DataFrame<'_>) -> Option<&mut [MaybeUninit<u8>]> {
            None
        }
    }
}
