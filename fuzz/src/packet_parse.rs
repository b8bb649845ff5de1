//! Fuzz `Packet::parse`: arbitrary bytes must never panic it, and whatever it
//! accepts must be internally consistent and survive a re-emit with
//! `PacketWriter` unchanged. The receiver's fused path (`Unverified::
//! verify_landing`, copying payloads while verifying) must decide exactly
//! as `parse` does and land every payload exactly.
//!
//! Random bytes almost never carry a valid checksum, so a datagram naming
//! any checksum algorithm is also checked a second time with its checksum
//! fixed up: that way the frame parser behind a passing checksum gets
//! fuzzed too, for every algorithm and trailer width.

use std::mem::MaybeUninit;

use tether_wire::{
    overhead, AckRepr, ChecksumKind, DataFrame, DatagramFrame, Frame, Landing, Packet, PacketWriter,
    SackRange, Unverified, HANDSHAKE_LEN, HEADER_LEN, MAX_DATAGRAM,
};

/// Lands every DATA payload in one buffer, back to back.
#[derive(Default)]
struct Collect(Vec<MaybeUninit<u8>>, Vec<usize>);

impl Landing for Collect {
    fn landing(&mut self, frame: &DataFrame<'_>) -> Option<&mut [MaybeUninit<u8>]> {
        let at = self.0.len();
        self.0.resize(at + frame.payload.len(), MaybeUninit::new(0));
        self.1.push(frame.payload.len());
        Some(&mut self.0[at..])
    }
}

/// One fuzz input.
pub fn run(data: &[u8]) {
    check(data);
    let kind = data.get(4).and_then(|&k| ChecksumKind::from_u8(k));
    if let Some(kind) = kind.filter(|&k| k != ChecksumKind::None && data.len() >= overhead(k)) {
        // The trailer is the checksum of the body, then the header
        // (docs/PROTOCOL.md), in the algorithm's width.
        let mut fixed = data.to_vec();
        let at = fixed.len() - kind.width();
        let sum = kind.compute(&[&fixed[HEADER_LEN..at], &fixed[..HEADER_LEN]]);
        fixed[at..].copy_from_slice(&sum.to_le_bytes()[..kind.width()]);
        check(&fixed);
    }
}

fn check(data: &[u8]) {
    let parsed = Packet::parse(data);
    let mut landed = Collect::default();
    let fused = Unverified::parse(data).and_then(|u| u.verify_landing(&mut landed));
    assert_eq!(parsed.as_ref().err(), fused.as_ref().err(), "the fused receive path decided otherwise");
    let Ok(packet) = parsed else { return };
    let payloads: Vec<u8> = packet
        .frames()
        .filter_map(|f| if let Frame::Data(d) = f { Some(d.payload) } else { None })
        .flatten()
        .copied()
        .collect();
    // SAFETY: `Collect` initialised every byte before handing it out.
    let got: Vec<u8> = landed.0.iter().map(|b| unsafe { b.assume_init() }).collect();
    assert_eq!(got, payloads, "a landing differs from its payload");
    assert!(data.len() <= MAX_DATAGRAM);
    assert_eq!(data.len(), overhead(packet.header.checksum) + packet.body_len());

    let frames: Vec<Frame<'_>> = packet.frames().collect();
    let walked: usize = frames.iter().map(walk).sum();
    // What the frames do not account for is the padding that ends the
    // body (its type byte and zeros), which the iterator skips.
    assert!(walked <= packet.body_len(), "the frames ran past the body");
    let padded = walked < packet.body_len();
    if padded {
        assert_eq!(data[HEADER_LEN + walked], 0x06, "the frame iterator stopped before the end of the body");
    }

    // Re-emit the parsed packet; it must take exactly as many bytes.
    let mut buf = vec![0u8; data.len()];
    let mut writer = PacketWriter::new(&mut buf, &packet.header).expect("buffer holds the header");
    for frame in &frames {
        match frame {
            Frame::Data(d) => writer.push_data(d.seq, d.flags, d.total_len.unwrap_or(0), d.payload),
            Frame::Ack(a) => writer.push_ack(&a.to_repr()),
            Frame::Handshake(h) => writer.push_handshake(h),
            Frame::Datagram(d) => writer.push_datagram(d.port, d.payload),
        }
        .expect("a re-emitted frame fits where the parsed one did");
    }
    if padded {
        writer.pad_to(data.len());
    }
    assert_eq!(writer.remaining(), 0);
    let n = writer.finish();
    assert_eq!(n, data.len());

    let again = Packet::parse(&buf[..n]).expect("a re-emitted packet parses");
    assert_eq!(again.header, packet.header);
    assert!(again.frames().eq(frames.iter().copied()), "re-emitted frames differ");

    // Every byte, the checksum trailer included, is determined by the
    // parsed values (with `none` the trailer must be zero, as written).
    assert_eq!(buf[..n], data[..]);
}

/// Check one frame's invariants; returns its encoded length.
fn walk(frame: &Frame<'_>) -> usize {
    match frame {
        Frame::Data(d) => {
            assert_eq!(d.total_len.is_some(), d.flags.carries_total_len());
            if let Some(total) = d.total_len {
                assert!(total as usize > d.payload.len());
            }
            DataFrame::encoded_len(d.payload.len(), d.flags)
        }
        Frame::Ack(a) => {
            let ranges: Vec<SackRange> = a.ranges().collect();
            let mut prev_end = 0u32;
            for r in &ranges {
                assert!(r.start >= 1 && r.start < r.end && r.start > prev_end, "bad SACK range {r:?}");
                assert!(a.cumulative.checked_add(r.end as u64).is_some());
                prev_end = r.end;
            }
            let repr: AckRepr = a.to_repr();
            assert_eq!(repr.ranges(), &ranges[..], "to_repr dropped a range");
            assert_eq!(
                (repr.epoch, repr.cumulative, repr.full, repr.answer),
                (a.epoch, a.cumulative, a.full, a.answer)
            );
            repr.encoded_len()
        }
        // HELLO, WELCOME and CONFIRM: fixed length, every field a plain
        // number (their meaning is the core's to check).
        Frame::Handshake(_) => HANDSHAKE_LEN,
        Frame::Datagram(d) => DatagramFrame::encoded_len(d.payload.len()),
    }
}
