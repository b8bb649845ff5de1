//! Fuzz the NACK-reliable class (`tether_proto::nacked`, docs/PROTOCOL.md,
//! "The NACK-reliable class"): its frame parser on arbitrary bytes (a frame
//! that parses encodes back to the same bytes), and a pair of endpoints
//! mid-session taking fuzz-made frames of the class between the genuine
//! ones, in a genuine header with a correct checksum (what a forger who
//! knows the session's incarnations can send without a cluster key).
//! Whatever arrives: no panic, every invariant holds, and the receiver
//! hands each sender's messages over in increasing order, each at most
//! once; the sender's fates stay within what it sent.

use core::time::Duration;
use tether_proto::nacked::{self, NackedFrame};
use tether_proto::{Config, Endpoint, Event, Instant, MessagePool};

const A: u32 = 1;
const B: u32 = 2;

/// Re-encode a parsed frame: the bytes it came from, minus anything after it.
fn encoded(frame: &NackedFrame<'_>, pool: &MessagePool) -> Vec<u8> {
    let ranges = |r: &nacked::NackRanges<'_>| r.iter().map(|(f, c)| (f, c as u32)).collect::<Vec<_>>();
    match frame {
        NackedFrame::Msg { seq, oldest, message } => {
            nacked::encode_msg(*seq, *oldest, message, pool).to_vec()
        }
        NackedFrame::State { next, oldest } => nacked::encode_state(*next, *oldest, pool).to_vec(),
        NackedFrame::Nack { ranges: r } => nacked::encode_nack(&ranges(r), pool).to_vec(),
        NackedFrame::Skipped { ranges: r } => nacked::encode_skipped(&ranges(r), pool).to_vec(),
    }
}

/// One fuzz input.
pub fn run(input: &[u8]) {
    let pool = MessagePool::new();
    if let Ok(frame) = nacked::parse(input) {
        let again = encoded(&frame, &pool);
        assert_eq!(&input[..again.len()], &again[..], "a frame encodes back to its bytes");
        assert_eq!(nacked::parse(&again), Ok(frame));
    }
    let config = Config { nacked_hold: Duration::from_millis(20), ..Config::default() };
    let mut w = World {
        a: Endpoint::new(config.clone(), A, 10).unwrap(),
        b: Endpoint::new(config, B, 20).unwrap(),
        now: Instant::from_nanos(1_000_000),
        buf: vec![0u8; 2048],
        templates: Vec::new(),
        last_seq: None,
    };
    w.a.set_invariant_checks(true);
    w.b.set_invariant_checks(true);
    w.a.add_peer(B).unwrap();
    w.b.add_peer(A).unwrap();
    let mut sent = 0u64;
    for _ in 0..3 {
        w.a.send_nacked(w.now, B, b"genuine").unwrap();
        sent += 1;
    }
    w.exchange(10);
    // Each forged frame: a target byte, a length byte, then its payload.
    let mut data = input;
    while data.len() >= 2 && !w.templates.is_empty() {
        let (target, len) = (data[0], data[1] as usize);
        let n = len.min(data.len() - 2);
        let payload = &data[2..2 + n];
        data = &data[2 + n..];
        let (from_a, template) = w.templates[target as usize % w.templates.len()].clone();
        let mut body = vec![0x07, tether_wire::PORT_NACKED];
        body.extend_from_slice(&(payload.len() as u16).to_le_bytes());
        body.extend_from_slice(payload);
        let forged = crate::datagram::reframed(&template, &body);
        if from_a {
            w.b.handle_datagram(w.now, &forged);
        } else {
            w.a.handle_datagram(w.now, &forged);
        }
        if target & 0x80 != 0 && w.a.send_nacked(w.now, B, b"genuine").is_ok() {
            sent += 1;
        }
        w.exchange(usize::from(target & 3));
    }
    w.exchange(400);
    while let Some(e) = w.a.poll_event() {
        if let Event::Nacked { first, end, .. } = e {
            assert!(first < end && end <= sent, "a fate for [{first}, {end}) of {sent} sent");
        }
    }
}

struct World {
    a: Endpoint,
    b: Endpoint,
    now: Instant,
    buf: Vec<u8>,
    /// Datagrams each side sent (true: A's), for forged frames to ride in.
    templates: Vec<(bool, Vec<u8>)>,
    /// The last message number B took from A.
    last_seq: Option<u64>,
}

impl World {
    /// Run both endpoints for `turns` rounds of 100 us; B's application
    /// takes what it is given and checks its order.
    fn exchange(&mut self, turns: usize) {
        for _ in 0..turns {
            for a_sends in [true, false] {
                let (from, to) =
                    if a_sends { (&mut self.a, &mut self.b) } else { (&mut self.b, &mut self.a) };
                from.handle_timeout(self.now);
                while let Some(t) = from.poll_transmit(self.now, &mut self.buf) {
                    let d = self.buf[..t.len].to_vec();
                    to.handle_datagram(self.now, &d);
                    if self.templates.len() < 8 && d.len() > tether_wire::HEADER_LEN {
                        self.templates.push((a_sends, d));
                    }
                }
            }
            while let Some(m) = self.b.recv_nacked() {
                assert_eq!(m.from, A);
                let last = self.last_seq;
                assert!(last.is_none_or(|l| m.seq > l), "message {} after {last:?}", m.seq);
                self.last_seq = Some(m.seq);
            }
            self.now = self.now + Duration::from_micros(100);
        }
    }
}
