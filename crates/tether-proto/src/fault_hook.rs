//! A test-only hook that corrupts the core's own state on request: one bit
//! flipped in a buffered payload, a sequence number, a window pointer or a
//! rail's state (Zhou et al. [FTGM] section 5: faults injected into the
//! network card's memory, to measure what the watchdog and the self-test
//! catch). `tether campaign --engine` drives it through an engine started
//! with `--fault-hook`; nothing else reaches it, and without the
//! `fault-hook` feature it does not exist.
//!
//! A flip changes what is there in place, as a particle strike would; it
//! does not keep digests or shadow copies in step, since catching the
//! difference is exactly what is being measured.

use crate::{Endpoint, NodeId};

/// Which part of the state a flip strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateTarget {
    /// A byte of a payload waiting to be (re)sent or held out of order.
    Payload,
    /// A segment's sequence number, or the next one to assign.
    Seq,
    /// A cumulative or sent mark of a send stream, or a receive stream's
    /// consumed or taken mark.
    Window,
    /// A path's state (active, suspect, down).
    Rail,
}

impl StateTarget {
    /// By its name in the hook's requests.
    pub fn parse(name: &str) -> Option<StateTarget> {
        Some(match name {
            "payload" => StateTarget::Payload,
            "seq" => StateTarget::Seq,
            "window" => StateTarget::Window,
            "rail" => StateTarget::Rail,
            _ => return None,
        })
    }
}

/// The draws of one flip (SplitMix64: no dependency, and the same seed
/// strikes the same place).
pub struct Draw(u64);

impl Draw {
    /// The draws of `seed`.
    pub fn new(seed: u64) -> Self {
        Draw(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Flip one drawn bit of `data` in place (a copy put where it was, since
/// the bytes may be shared); the bit's number, or `None` if it is empty.
pub(crate) fn flip_bit(data: &mut bytes::Bytes, draw: &mut Draw) -> Option<usize> {
    if data.is_empty() {
        return None;
    }
    let mut bytes = data.to_vec();
    let bit = draw.below(bytes.len() as u64 * 8) as usize;
    bytes[bit / 8] ^= 1 << (bit % 8);
    *data = bytes.into();
    Some(bit)
}

impl Endpoint {
    /// Flip one bit of `target` in a peer drawn among those that have such
    /// state: what was struck, or why nothing was (none has any).
    pub fn flip_state(&mut self, target: StateTarget, seed: u64) -> Result<String, &'static str> {
        let mut draw = Draw::new(seed);
        let candidates: Vec<NodeId> = self
            .peers_mut()
            .filter(|(_, p)| {
                target != StateTarget::Payload || p.send.has_unacked() || p.recv.holds_out_of_order()
            })
            .map(|(id, _)| id)
            .collect();
        if candidates.is_empty() {
            return Err("no peer has such state");
        }
        let id = candidates[draw.below(candidates.len() as u64) as usize];
        let peer = self.peers_mut().find(|(p, _)| *p == id).map(|(_, p)| p).ok_or("peer gone")?;
        let what = match target {
            StateTarget::Payload => {
                if peer.send.has_unacked() && (!peer.recv.holds_out_of_order() || draw.below(2) == 0) {
                    peer.send.flip_payload(&mut draw)
                } else {
                    peer.recv.flip_payload(&mut draw)
                }
            }
            StateTarget::Seq => peer.send.flip_seq(&mut draw),
            StateTarget::Window => {
                if draw.below(2) == 0 {
                    peer.send.flip_window(&mut draw)
                } else {
                    peer.recv.flip_window(&mut draw)
                }
            }
            StateTarget::Rail => peer.paths.flip_state(&mut draw),
        };
        Ok(format!("peer {id}: {what}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Instant};

    fn two_peers() -> (Endpoint, Endpoint) {
        // As an engine runs its applications' cores.
        let config = Config { verify_payloads: true, ..Config::default() };
        let mut a = Endpoint::new(config.clone(), 1, 1).unwrap();
        let mut b = Endpoint::new(config, 2, 1).unwrap();
        a.add_peer(2).unwrap();
        b.add_peer(1).unwrap();
        (a, b)
    }

    fn message(i: usize) -> Vec<u8> {
        (0..300).map(|j| (i * 31 + j * 7) as u8).collect()
    }

    /// One turn 1 ms after `now`: `a` to `b` if `a_to_b`, then `b` to `a`
    /// if `b_to_a` (a direction not carried is lost); what `b`'s
    /// application reads is appended to `got`.
    fn turn(
        a: &mut Endpoint,
        b: &mut Endpoint,
        now: &mut Instant,
        (a_to_b, b_to_a): (bool, bool),
        got: &mut Vec<Vec<u8>>,
    ) {
        let mut buf = vec![0u8; 2048];
        *now = *now + std::time::Duration::from_millis(1);
        a.handle_timeout(*now);
        let mut n = 0;
        while let Some(t) = a.poll_transmit(*now, &mut buf) {
            n += 1;
            assert!(n < 10_000, "a sends without end: {:?}", a.stats());
            if a_to_b {
                b.handle_datagram(*now, &buf[..t.len]);
            }
        }
        b.handle_timeout(*now);
        while let Some(t) = b.poll_transmit(*now, &mut buf) {
            if b_to_a {
                a.handle_datagram(*now, &buf[..t.len]);
            }
        }
        while let Some(d) = b.recv() {
            got.push(d.message.to_vec());
        }
    }

    /// A whole pass of `Endpoint::audit_payloads`, in slices of 1 KiB (so
    /// that a pass takes several, as in an engine).
    fn payloads_audit(e: &Endpoint) -> Result<(), crate::StateFault> {
        let mut at = None;
        for _ in 0..10_000 {
            at = e.audit_payloads(at, 1024)?;
            if at.is_none() {
                return Ok(());
            }
        }
        panic!("the pass does not end");
    }

    /// `b` got a prefix of the messages sent, exact and in order, and `a`
    /// settled none that `b` did not get.
    fn check(a: &Endpoint, got: &[Vec<u8>], seed: u64) {
        for (i, m) in got.iter().enumerate() {
            assert!(*m == message(i), "seed {seed}: message {i} delivered wrong");
        }
        let settled = a.settled_below(2).unwrap();
        assert!(settled <= got.len() as u64, "seed {seed}: {settled} settled, {} delivered", got.len());
    }

    /// Payloads corrupted while the sender held them, before they ever
    /// reached the receiver: none is sent (without the check before each
    /// transmission, the receiver would deliver the flipped bytes under a
    /// fresh, valid checksum), the deep audit names the fault, and the
    /// sender counts it.
    #[test]
    fn a_corrupted_payload_is_never_sent() {
        for seed in 0..64 {
            let (mut a, mut b) = two_peers();
            let (mut now, mut got) = (Instant::from_nanos(1_000_000), Vec::new());
            for _ in 0..5 {
                turn(&mut a, &mut b, &mut now, (true, true), &mut got);
            }
            for i in 0..20 {
                a.send(now, 2, &message(i)).unwrap();
            }
            // Every datagram with data is lost: the payloads wait at `a`.
            for _ in 0..3 {
                turn(&mut a, &mut b, &mut now, (false, true), &mut got);
            }
            let what = a.flip_state(StateTarget::Payload, seed).unwrap();
            assert!(payloads_audit(&a).is_err(), "seed {seed}: the payload audit missed {what}");
            for _ in 0..2000 {
                turn(&mut a, &mut b, &mut now, (true, true), &mut got);
            }
            check(&a, &got, seed);
            assert!(got.len() < 20, "seed {seed}: the corrupted message went out ({what})");
            assert!(a.stats().integrity_faults > 0, "seed {seed}: not counted ({what})");
        }
    }

    /// Sequence numbers and window marks corrupted on either side of a
    /// stream in flight: the quick audit finds every one, and until it is
    /// acted on (an engine stops) nothing is delivered wrong, twice or out
    /// of order, and nothing is settled that was not delivered.
    #[test]
    fn corrupted_marks_are_found_and_never_acted_on() {
        for seed in 0..400u64 {
            let (mut a, mut b) = two_peers();
            let (mut now, mut got) = (Instant::from_nanos(1_000_000), Vec::new());
            for i in 0..40 {
                a.send(now, 2, &message(i)).unwrap();
                // Now and then a datagram each way is lost: state on both sides.
                let carry = (i % 7 != 3, i % 5 != 2);
                turn(&mut a, &mut b, &mut now, carry, &mut got);
            }
            let target = if seed % 2 == 0 { StateTarget::Seq } else { StateTarget::Window };
            let (struck, what) = match seed % 4 < 2 {
                true => ("sender", a.flip_state(target, seed).unwrap()),
                false => ("receiver", b.flip_state(target, seed).unwrap()),
            };
            let found = a.audit().and(b.audit());
            assert!(found.is_err(), "seed {seed}: the {struck}'s {what} went unnoticed");
            for _ in 0..500 {
                turn(&mut a, &mut b, &mut now, (true, true), &mut got);
            }
            check(&a, &got, seed);
        }
    }
}
