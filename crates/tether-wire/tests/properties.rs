//! Property tests for the wire format.
//!
//! They state what every datagram must satisfy, whatever its contents:
//! emit-then-parse is the identity, CRC32C catches every single-bit error and
//! every two-bit burst within 32 bits, and `Packet::parse` never panics and
//! never accepts a truncated datagram (docs/ARCHITECTURE.md, "Guarantees":
//! bad input gets a typed error, never a panic).

use proptest::collection::{btree_set, vec};
use proptest::prelude::*;
use tether_wire::{
    overhead, AckRepr, ChecksumKind, DataFlags, DataFrame, Frame, HandshakeFrame, HandshakeKind, Header,
    HeaderFlags, Landing, Packet, PacketWriter, SackRange, Unverified, HANDSHAKE_LEN, HEADER_LEN, MAGIC,
    MAX_DATAGRAM, MAX_SACK_RANGES, OVERHEAD, VERSION,
};

/// An owned frame, so emitted and parsed frames can be compared with `==`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FrameModel {
    Data { seq: u64, flags: DataFlags, total_len: Option<u32>, payload: Vec<u8> },
    Ack { epoch: u32, cumulative: u64, full: bool, answer: Option<u8>, ranges: Vec<SackRange> },
    Handshake(HandshakeFrame),
    Datagram(u8, Vec<u8>),
}

impl FrameModel {
    fn from_frame(frame: &Frame<'_>) -> Self {
        match frame {
            Frame::Data(d) => FrameModel::Data {
                seq: d.seq,
                flags: d.flags,
                total_len: d.total_len,
                payload: d.payload.to_vec(),
            },
            Frame::Ack(a) => FrameModel::Ack {
                epoch: a.epoch,
                cumulative: a.cumulative,
                full: a.full,
                answer: a.answer,
                ranges: a.ranges().collect(),
            },
            Frame::Handshake(h) => FrameModel::Handshake(*h),
            Frame::Datagram(d) => FrameModel::Datagram(d.port, d.payload.to_vec()),
        }
    }

    /// Bytes this frame occupies on the wire (see docs/PROTOCOL.md).
    fn encoded_len(&self) -> usize {
        match self {
            FrameModel::Data { total_len, payload, .. } => {
                12 + if total_len.is_some() { 4 } else { 0 } + payload.len()
            }
            FrameModel::Ack { ranges, .. } => 16 + 8 * ranges.len(),
            FrameModel::Handshake(_) => HANDSHAKE_LEN,
            FrameModel::Datagram(_, payload) => 4 + payload.len(),
        }
    }

    fn push_to(&self, w: &mut PacketWriter<'_>) -> Result<(), tether_wire::WireError> {
        match self {
            FrameModel::Data { seq, flags, total_len, payload } => {
                w.push_data(*seq, *flags, total_len.unwrap_or(0), payload)
            }
            FrameModel::Handshake(h) => w.push_handshake(h),
            FrameModel::Datagram(port, payload) => w.push_datagram(*port, payload),
            FrameModel::Ack { epoch, cumulative, full, answer, ranges } => {
                let mut ack = AckRepr::new(*epoch, *cumulative);
                ack.full = *full;
                ack.answer = *answer;
                for r in ranges {
                    assert!(ack.push_range(*r), "generator produced an invalid SACK range {r:?}");
                }
                w.push_ack(&ack)
            }
        }
    }
}

fn header_strategy() -> impl Strategy<Value = Header> {
    let kind = (0..ChecksumKind::ALL.len()).prop_map(|i| ChecksumKind::ALL[i]);
    let ids = (any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>());
    (any::<bool>(), kind, ids, any::<u8>()).prop_map(
        |(ack_request, checksum, (src_node, dst_node, src_inc, dst_inc, epoch), probe)| Header {
            flags: HeaderFlags::new(ack_request),
            checksum,
            src_node,
            dst_node,
            src_inc,
            dst_inc,
            epoch,
            // Only a datagram asking for an ACK may be a numbered probe.
            probe: if ack_request { probe } else { 0 },
        },
    )
}

fn crc_header_strategy() -> impl Strategy<Value = Header> {
    header_strategy().prop_map(|h| Header { checksum: ChecksumKind::Crc32c, ..h })
}

fn data_strategy(max_payload: usize) -> impl Strategy<Value = FrameModel> {
    (any::<u64>(), any::<bool>(), any::<bool>(), vec(any::<u8>(), 0..=max_payload)).prop_flat_map(
        |(seq, first, last, payload)| {
            let flags = DataFlags::new(first, last);
            // The parser requires a multi-fragment message to be longer than its
            // first fragment; other fragments carry no total length at all.
            let total_len = if flags.carries_total_len() {
                (payload.len() as u32 + 1..=u32::MAX).prop_map(Some).boxed()
            } else {
                Just(None).boxed()
            };
            total_len.prop_map(move |total_len| FrameModel::Data {
                seq,
                flags,
                total_len,
                payload: payload.clone(),
            })
        },
    )
}

/// SACK ranges the parser accepts after `cumulative`: ascending, disjoint and
/// not adjacent, `start >= 1`, and `cumulative + end` within `u64`.
fn sack_ranges(cumulative: u64) -> BoxedStrategy<Vec<SackRange>> {
    let max_end = (u64::MAX - cumulative).min(u32::MAX as u64) as u32;
    if max_end < 2 {
        return Just(Vec::new()).boxed();
    }
    // Strictly increasing bounds taken in pairs give ranges with a gap of at
    // least one between neighbours. Mix small offsets (the common case) with
    // offsets anywhere in the space (the edges).
    let bound = prop_oneof![1..=max_end.min(64), 1..=max_end];
    btree_set(bound, 0..=2 * MAX_SACK_RANGES)
        .prop_map(|set| {
            let b: Vec<u32> = set.into_iter().collect();
            b.chunks_exact(2).map(|p| SackRange { start: p[0], end: p[1] }).collect()
        })
        .boxed()
}

fn ack_strategy() -> impl Strategy<Value = FrameModel> {
    let cumulative = prop_oneof![any::<u64>(), 0..1_000u64, u64::MAX - 1_000..=u64::MAX];
    (any::<u32>(), cumulative, any::<bool>(), proptest::option::of(any::<u8>())).prop_flat_map(
        |(epoch, cumulative, full, answer)| {
            sack_ranges(cumulative).prop_map(move |ranges| FrameModel::Ack {
                epoch,
                cumulative,
                full,
                answer,
                ranges,
            })
        },
    )
}

fn handshake_strategy() -> impl Strategy<Value = FrameModel> {
    let kind =
        prop_oneof![Just(HandshakeKind::Hello), Just(HandshakeKind::Welcome), Just(HandshakeKind::Confirm)];
    (kind, any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(kind, max_datagram, nonce, cookie)| {
        FrameModel::Handshake(HandshakeFrame { kind, max_datagram, nonce, cookie })
    })
}

/// Frames in order, cut to the longest prefix that fits one datagram.
fn frames_strategy(max_frames: usize, max_payload: usize) -> impl Strategy<Value = Vec<FrameModel>> {
    vec(
        prop_oneof![
            3 => data_strategy(max_payload),
            1 => ack_strategy(),
            1 => handshake_strategy(),
            1 => (any::<u8>(), vec(any::<u8>(), 0..=max_payload)).prop_map(|(port, p)| FrameModel::Datagram(port, p)),
        ],
        0..=max_frames,
    )
    .prop_map(|frames| {
        let mut room = MAX_DATAGRAM - OVERHEAD;
        frames
            .into_iter()
            .take_while(|f| {
                let fits = f.encoded_len() <= room;
                room = room.saturating_sub(f.encoded_len());
                fits
            })
            .collect()
    })
}

fn emit(header: &Header, frames: &[FrameModel]) -> Vec<u8> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut w = PacketWriter::new(&mut buf, header).expect("a MAX_DATAGRAM buffer holds a header");
    for f in frames {
        f.push_to(&mut w).expect("frames_strategy only yields frames that fit");
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn parse_models(datagram: &[u8]) -> Result<(Header, Vec<FrameModel>), tether_wire::WireError> {
    let p = Packet::parse(datagram)?;
    Ok((p.header, p.frames().map(|f| FrameModel::from_frame(&f)).collect()))
}

fn flip(datagram: &[u8], bits: &[usize]) -> Vec<u8> {
    let mut d = datagram.to_vec();
    for &b in bits {
        d[b / 8] ^= 1 << (b % 8);
    }
    d
}

/// A bit index, biased toward the header where one flipped bit changes the
/// meaning of the whole datagram.
fn bit_index(len_bits: usize) -> impl Strategy<Value = usize> {
    prop_oneof![0..HEADER_LEN * 8, 0..len_bits]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// (a) Emit then parse gives back exactly the header and frames emitted.
    #[test]
    fn emit_then_parse_is_identity(header in header_strategy(), frames in frames_strategy(48, 1500)) {
        let datagram = emit(&header, &frames);
        let expected_len = overhead(header.checksum) + frames.iter().map(FrameModel::encoded_len).sum::<usize>();
        prop_assert_eq!(datagram.len(), expected_len);
        prop_assert_eq!(&datagram[..2], &MAGIC[..]);
        prop_assert_eq!(datagram[2], VERSION);
        let p = Packet::parse(&datagram).map_err(|e| TestCaseError::fail(format!("parse: {e}")))?;
        prop_assert_eq!(p.header, header);
        prop_assert_eq!(p.body_len(), datagram.len() - overhead(header.checksum));
        let parsed: Vec<FrameModel> = p.frames().map(|f| FrameModel::from_frame(&f)).collect();
        prop_assert_eq!(parsed, frames);
    }

    /// The fused receive path (verify while copying payloads to where they
    /// land) accepts and refuses exactly what the two-pass path does, for
    /// every algorithm, intact or with a few flipped bits.
    #[test]
    fn landing_verification_agrees_with_two_pass(
        header in header_strategy(),
        frames in frames_strategy(12, 1500),
        kind in 0u8..9,
        flips in vec(any::<prop::sample::Index>(), 0..3),
    ) {
        let header = Header { checksum: ChecksumKind::from_u8(kind).expect("0..9 are kinds"), ..header };
        let datagram = emit(&header, &frames);
        let bits: Vec<usize> = flips.iter().map(|i| i.index(datagram.len() * 8)).collect();
        check_landing_agrees(&flip(&datagram, &bits))?;
        if bits.is_empty() {
            prop_assert!(Unverified::parse(&datagram).unwrap().verify_landing(&mut EveryOther::default()).is_ok());
        }
    }

    /// (a) One data frame filling the datagram to the last byte round-trips,
    /// and one byte more is refused by the writer instead of overflowing.
    #[test]
    fn largest_data_frame_round_trips(header in header_strategy(), seq in any::<u64>(), fill in any::<u8>()) {
        let payload = vec![fill; MAX_DATAGRAM - overhead(header.checksum) - 12];
        let frame = FrameModel::Data { seq, flags: DataFlags::new(true, true), total_len: None, payload };
        let datagram = emit(&header, std::slice::from_ref(&frame));
        prop_assert_eq!(datagram.len(), MAX_DATAGRAM);
        prop_assert_eq!(parse_models(&datagram), Ok((header, vec![frame])));

        let mut buf = vec![0u8; MAX_DATAGRAM + 1];
        let mut w = PacketWriter::new(&mut buf, &header).expect("buffer holds a header");
        let too_big = vec![fill; MAX_DATAGRAM - overhead(header.checksum) - 12 + 1];
        prop_assert_eq!(
            w.push_data(seq, DataFlags::new(true, true), 0, &too_big),
            Err(tether_wire::WireError::BufferTooSmall)
        );
        prop_assert!(w.is_empty());
    }

    /// (b) With CRC32C, every single-bit flip anywhere in a small datagram is
    /// rejected (all bits tried).
    #[test]
    fn crc32c_rejects_every_single_bit_flip(header in crc_header_strategy(), frames in frames_strategy(4, 64)) {
        let datagram = emit(&header, &frames);
        for bit in 0..datagram.len() * 8 {
            let result = parse_models(&flip(&datagram, &[bit]));
            prop_assert!(result.is_err(), "flipping bit {} (byte {}) was accepted: {:?}", bit, bit / 8, result);
        }
    }

    /// (b) The same for large datagrams, at sampled bit positions.
    #[test]
    fn crc32c_rejects_single_bit_flips_in_large_datagrams(
        (datagram, bits) in (crc_header_strategy(), frames_strategy(48, 1500))
            .prop_map(|(h, f)| emit(&h, &f))
            .prop_flat_map(|d| { let n = d.len() * 8; (Just(d), vec(bit_index(n), 1..64)) })
    ) {
        for bit in bits {
            let result = parse_models(&flip(&datagram, &[bit]));
            prop_assert!(result.is_err(), "flipping bit {} (byte {}) was accepted: {:?}", bit, bit / 8, result);
        }
    }

    /// (c) Arbitrary bytes never make the parser panic; when it accepts them,
    /// every accessor works and the frames cover the whole body.
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..2048)) {
        check_accepted_is_consistent(&bytes)?;
    }

    /// (c) The same for bytes behind a valid checksum-`none` header, so the
    /// frame parser (not the header checks) sees the arbitrary input.
    #[test]
    fn parse_never_panics_on_arbitrary_bodies(
        header in header_strategy(),
        body in vec(prop_oneof![
            4 => any::<u8>(),
            1 => Just(1u8),  // the DATA frame type
            1 => Just(2u8),  // the ACK frame type
            1 => Just(0u8),
        ], 0..512),
    ) {
        let header = Header { checksum: ChecksumKind::None, ..header };
        let mut datagram = emit(&header, &[]);
        datagram[6..8].copy_from_slice(&(body.len() as u16).to_le_bytes());
        datagram.extend_from_slice(&body);
        check_accepted_is_consistent(&datagram)?;
    }

    /// (c) Every proper prefix of a valid datagram is rejected, with either
    /// checksum kind (all prefixes tried).
    #[test]
    fn every_truncation_is_rejected(header in header_strategy(), frames in frames_strategy(6, 200)) {
        let datagram = emit(&header, &frames);
        for cut in 0..datagram.len() {
            prop_assert!(Packet::parse(&datagram[..cut]).is_err(), "prefix of {} bytes was accepted", cut);
        }
    }

    /// (d) With CRC32C, every two-bit burst (both flipped bits within a
    /// 32-bit window) in a small datagram is rejected (all pairs tried).
    #[test]
    fn crc32c_rejects_every_two_bit_burst(header in crc_header_strategy(), frames in frames_strategy(3, 48)) {
        let datagram = emit(&header, &frames);
        let n = datagram.len() * 8;
        for i in 0..n {
            for j in i + 1..(i + 32).min(n) {
                let result = parse_models(&flip(&datagram, &[i, j]));
                prop_assert!(
                    result.is_err(),
                    "flipping bits {} and {} (bytes {} and {}) was accepted: {:?}", i, j, i / 8, j / 8, result
                );
            }
        }
    }

    /// (d) Two flipped bits anywhere (not only in a burst) are rejected too:
    /// CRC32C has Hamming distance 4 far beyond MAX_DATAGRAM bits, so this is
    /// also a guarantee, and the case that would let a corrupted payload through.
    #[test]
    fn crc32c_rejects_two_bit_flips_anywhere(
        (datagram, pairs) in (crc_header_strategy(), frames_strategy(8, 300))
            .prop_map(|(h, f)| emit(&h, &f))
            .prop_flat_map(|d| { let n = d.len() * 8; (Just(d), vec((bit_index(n), 0..n), 1..64)) })
    ) {
        for (i, j) in pairs {
            if i == j {
                continue;
            }
            let result = parse_models(&flip(&datagram, &[i, j]));
            prop_assert!(
                result.is_err(),
                "flipping bits {} and {} (bytes {} and {}) was accepted: {:?}", i, j, i / 8, j / 8, result
            );
        }
    }
}

/// Lands every other DATA payload in a buffer of its own (the rest are
/// only checksummed), as a receiver lands payloads where they will live.
#[derive(Default)]
struct EveryOther {
    calls: usize,
    landed: Vec<(usize, Vec<std::mem::MaybeUninit<u8>>)>,
}

impl Landing for EveryOther {
    fn landing(&mut self, frame: &DataFrame<'_>) -> Option<&mut [std::mem::MaybeUninit<u8>]> {
        self.calls += 1;
        if self.calls.is_multiple_of(2) {
            return None;
        }
        let mut buf = Vec::with_capacity(frame.payload.len());
        buf.resize(frame.payload.len(), std::mem::MaybeUninit::new(0xAA));
        self.landed.push((self.calls - 1, buf));
        Some(&mut self.landed.last_mut().expect("just pushed").1)
    }
}

/// Verifying while landing payloads decides exactly as verifying in a
/// separate pass, and on success every landing holds its exact payload.
fn check_landing_agrees(datagram: &[u8]) -> Result<(), TestCaseError> {
    let two_pass = Packet::parse(datagram).map(|p| (p.header, p.body_len()));
    let Ok(unverified) = Unverified::parse(datagram) else {
        prop_assert!(two_pass.is_err());
        return Ok(());
    };
    let mut landing = EveryOther::default();
    let fused = unverified.verify_landing(&mut landing);
    prop_assert_eq!(fused.as_ref().map(|p| (p.header, p.body_len())).ok(), two_pass.as_ref().ok().copied());
    prop_assert_eq!(fused.is_err(), two_pass.is_err());
    if let Ok(p) = fused {
        let payloads: Vec<&[u8]> = p
            .frames()
            .filter_map(|f| match f {
                Frame::Data(d) => Some(d.payload),
                Frame::Ack(_) | Frame::Handshake(_) | Frame::Datagram(_) => None,
            })
            .collect();
        prop_assert_eq!(landing.calls, payloads.len());
        for (i, buf) in &landing.landed {
            // SAFETY: verify_landing wrote every byte of each landing (and
            // the buffer was initialised besides).
            let got: Vec<u8> = buf.iter().map(|b| unsafe { b.assume_init() }).collect();
            prop_assert_eq!(&got[..], payloads[*i]);
        }
    }
    Ok(())
}

fn check_accepted_is_consistent(datagram: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(p) = Packet::parse(datagram) {
        let frames: Vec<FrameModel> = p.frames().map(|f| FrameModel::from_frame(&f)).collect();
        let walked: usize = frames.iter().map(FrameModel::encoded_len).sum();
        prop_assert_eq!(walked, p.body_len(), "the frame iterator stopped before the end of the body");
        prop_assert_eq!(datagram.len(), overhead(p.header.checksum) + p.body_len());
    }
    Ok(())
}
