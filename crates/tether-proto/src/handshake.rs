//! The handshake: no data is accepted from a peer, and none is sent to it,
//! before both incarnations are proven and the datagram size is agreed.
//!
//! Identity must not come from a header field alone (Li et al. [CI]
//! section 3 required authenticated messages in their management layer;
//! docs/REFERENCES.md). Three messages, after QUIC's address validation
//! and WireGuard's cookies:
//!
//! ```text
//!  initiator                                           responder
//!  HELLO    src_inc=I, nonce N, "I accept D_i"  --->   (keeps nothing)
//!           <---  WELCOME src_inc=R dst_inc=I, N, cookie C, "I accept D_r"
//!  CONFIRM  src_inc=I dst_inc=R, N, C, min(D_i, D_r)  [+ DATA ...]  --->
//! ```
//!
//! * The responder keeps no state for a HELLO: the cookie is a keyed hash
//!   of (initiator node, its incarnation, its nonce, our incarnation, a
//!   time slot) under a secret only the responder knows. A CONFIRM whose
//!   cookie checks proves the initiator received the WELCOME at the
//!   address the responder has for it, so a blind attacker cannot complete
//!   a handshake, and a flood of HELLOs costs one hash and one bounded
//!   reply slot each ([`MAX_REPLIES`]).
//! * The initiator accepts a WELCOME only if it echoes the nonce of its own
//!   HELLO in progress: a forged WELCOME needs a nonce it never saw.
//! * A peer's incarnation changes only through a completed handshake, so
//!   one forged datagram with a higher incarnation changes nothing (it used
//!   to make the listener drop its genuine peer as stale).
//! * Data is never sent with `dst_inc` 0: it waits for the WELCOME (the
//!   CONFIRM rides in front of it until the peer shows it knows us), so a
//!   message cannot reach two incarnations of a receiver.
//! * Both sides send datagrams of at most the smaller of their sizes, so a
//!   size mismatch cannot truncate datagrams silently.
//! * The size is proven, not only agreed: a HELLO is padded to the size it
//!   proposes and a WELCOME to the size it accepts (never more than the
//!   HELLO's length), and each side takes at most the length that actually
//!   arrived. A path that drops large datagrams without a word (a PMTU
//!   black hole: a smaller link on the way whose ICMP never returns)
//!   loses those HELLOs or WELCOMEs, and from the third round on every
//!   other HELLO proposes [`BASE_DATAGRAM`] instead (RFC 8899's base
//!   size), so the session starts at a size the path carries.
//!
//! HELLO and WELCOME have the same length (an answer never amplifies) and
//! travel alone; a CONFIRM travels in front of data until the initiator
//! hears anything but a WELCOME from the responder's proven incarnation
//! addressed to its own.

use core::time::Duration;
use std::net::SocketAddr;

use tether_wire::{HandshakeFrame, HandshakeKind};

use crate::{Instant, NodeId};

/// HELLO answers (WELCOMEs) waiting to be sent, at most: a flood of HELLOs
/// beyond this is dropped and counted, never queued. About 100 bytes each.
/// A job's start, where every node greets every other at once, brings a
/// node one HELLO per peer (per rail) in one receive turn: 64 dropped
/// 46,940 HELLOs in a 128-node demo, whose handshakes then took seconds of
/// retries and some peers were given up.
pub const MAX_REPLIES: usize = 1024;

/// The size a HELLO falls back to when larger ones go unanswered: the
/// UDP payload every IPv6 path carries (1,280 less headers, with room to
/// spare for tunnels), as RFC 8899's BASE_PLPMTU and QUIC's initial size.
pub const BASE_DATAGRAM: usize = 1200;

/// `wait`, spread over [wait/2, 3 wait/2) by the HELLO's nonce and try:
/// endpoints that began their handshakes together (a job's start, every
/// node greeting every other) and lost HELLOs together to a full queue
/// must not all try again together (RFC 8085 section 3.1.3 asks the same
/// of any UDP retransmission).
fn spread(wait: Duration, nonce: u64, try_no: u32) -> Duration {
    // splitmix64's finaliser: the nonce is already unguessable, this only
    // spreads it and the try number over the bits.
    let mut z = nonce ^ u64::from(try_no).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let nanos = wait.as_nanos().min(u64::MAX as u128) as u64;
    // (z / 2^64) of the wait, in [0, 1).
    let part = ((u128::from(nanos) * u128::from(z)) >> 64) as u64;
    Duration::from_nanos(nanos / 2 + part)
}

/// A cookie is good in the time slot it was made in and the next one.
const COOKIE_SLOT_NANOS: u64 = 1 << 31; // about 2.1 s

/// The endpoint's handshake secret and nonce source. The key is drawn from
/// the seed the driver gives (`Endpoint::seed_secrets`); in tests and the
/// simulator it comes from the run's seed, so a run replays exactly.
#[derive(Clone)]
pub(crate) struct Secrets {
    key: [u8; 32],
    counter: u64,
}

impl core::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Keys are never logged.
        f.write_str("Secrets(..)")
    }
}

impl Secrets {
    pub fn new(seed: [u8; 32]) -> Self {
        Secrets { key: blake3::derive_key("tether 2026-11 handshake secret", &seed), counter: 0 }
    }

    /// A fresh nonce: a keyed hash of a counter, so it cannot be guessed
    /// from the ones seen before. Never 0 (0 means "no HELLO in progress").
    pub fn nonce(&mut self) -> u64 {
        self.counter += 1;
        self.prf(b"nonce", &[self.counter]).max(1)
    }

    /// The cookie for a HELLO, for `slot` (see [`cookie_slot`]); `from`
    /// is the HELLO's source address when it came from one no peer has
    /// (a peer that moved), so the cookie proves that address and no other.
    pub fn cookie(
        &self,
        peer: NodeId,
        peer_inc: u64,
        nonce: u64,
        (our_node, our_inc): (NodeId, u64),
        slot: u64,
        from: Option<SocketAddr>,
    ) -> u64 {
        let [a0, a1, a2] = address_words(from);
        self.prf(b"cookie", &[peer as u64, peer_inc, nonce, our_node as u64, our_inc, slot, a0, a1, a2])
    }

    /// Does `cookie` answer a HELLO with these fields (from `from`), made
    /// now or one slot ago?
    pub fn cookie_valid(
        &self,
        cookie: u64,
        (peer, peer_inc, nonce): (NodeId, u64, u64),
        ours: (NodeId, u64),
        now: Instant,
        from: Option<SocketAddr>,
    ) -> bool {
        let slot = cookie_slot(now);
        let made_in = |s| self.cookie(peer, peer_inc, nonce, ours, s, from);
        // Both compared without an early exit: timing says nothing of which.
        let now_ok = constant_time_eq(made_in(slot), cookie);
        let before_ok = constant_time_eq(made_in(slot.saturating_sub(1)), cookie);
        now_ok | before_ok
    }

    /// The packet number of a WELCOME to a node that is no peer yet (one
    /// this endpoint may take in): no counter is kept for it, so the number
    /// is a keyed hash of everything the WELCOME says, in the upper half of
    /// the number space, which a peer's own counter never reaches. Two
    /// WELCOMEs under one key and number therefore say the same thing
    /// (an AEAD nonce is never used for two plaintexts), and a successor
    /// engine with the same secret repeats only whole datagrams.
    pub fn welcome_pn(
        &self,
        frame: &HandshakeFrame,
        peer: (NodeId, u64),
        ours: (NodeId, u64),
        from: Option<SocketAddr>,
    ) -> u64 {
        let [a0, a1, a2] = address_words(from);
        let words = [
            peer.0 as u64,
            peer.1,
            ours.0 as u64,
            ours.1,
            frame.nonce,
            frame.cookie,
            frame.max_datagram as u64,
            a0,
            a1,
            a2,
        ];
        self.prf(b"welcome pn", &words) | 1 << 63
    }

    fn prf(&self, domain: &[u8], words: &[u64]) -> u64 {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(domain);
        for w in words {
            h.update(&w.to_le_bytes());
        }
        let out = h.finalize();
        u64::from_le_bytes(out.as_bytes()[..8].try_into().expect("8 of 32 bytes"))
    }
}

/// An address as three words, one-to-one (zeros: none given).
fn address_words(addr: Option<SocketAddr>) -> [u64; 3] {
    match addr {
        None => [0; 3],
        Some(SocketAddr::V4(a)) => [1 << 48 | u64::from(a.port()) << 32 | u64::from(a.ip().to_bits()), 0, 0],
        Some(SocketAddr::V6(a)) => {
            let ip = a.ip().to_bits();
            [2 << 48 | u64::from(a.port()), (ip >> 64) as u64, ip as u64]
        }
    }
}

pub(crate) fn cookie_slot(now: Instant) -> u64 {
    now.as_nanos() / COOKIE_SLOT_NANOS
}

fn constant_time_eq(a: u64, b: u64) -> bool {
    // No data-dependent branch: the difference folded to one bit.
    let d = a ^ b;
    ((d | d.wrapping_neg()) >> 63) == 0
}

/// A WELCOME owed to an initiator: everything needed to build it, so the
/// responder keeps no other state for a HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub to: NodeId,
    pub rail: crate::RailId,
    /// Where to send it when not to `to`'s known address: the source of a
    /// HELLO from an address no peer has (a peer that moved).
    pub to_addr: Option<SocketAddr>,
    /// The initiator's incarnation (the WELCOME's `dst_inc`).
    pub to_inc: u64,
    pub frame: HandshakeFrame,
    /// With a cluster key, the packet number of a WELCOME to a node that
    /// is no peer (`Secrets::welcome_pn`); `None`: the peer's own counter.
    pub pn: Option<u64>,
}

/// One peer's side of the handshake.
#[derive(Debug, Clone)]
pub(crate) struct Handshake {
    /// The nonce of our HELLO in progress; 0 when we are not initiating.
    nonce: u64,
    /// When our next HELLO goes; `None` when not initiating.
    hello_at: Option<Instant>,
    /// The wait before the HELLO after that (doubles, up to a ceiling).
    backoff: Duration,
    /// A HELLO is due now (its timer expired, or a handshake just began).
    hello_due: bool,
    /// The next HELLO's try number: each try takes the next rail.
    tries: u32,
    /// HELLOs still due at once.
    burst: u32,
    /// This handshake begins with a HELLO on every rail (nothing prompted
    /// it, so nothing says which rail works); counted when the first goes,
    /// as the rails may be set after the handshake was begun.
    on_every_rail: bool,
    /// The nonce of the handshake completed last: its late WELCOMEs (one
    /// per HELLO of a burst) are duplicates, not forgeries.
    last_nonce: u64,
    /// When the first HELLO of this handshake went.
    began: Option<Instant>,
    /// A HELLO went after the first instant: which one a WELCOME answers
    /// is unknown, and it measures no round trip (Karn's rule).
    retried: bool,
    /// The CONFIRM to put in front of everything we send until the peer
    /// shows it knows us: (our nonce, its cookie, the agreed size).
    confirm: Option<HandshakeFrame>,
    /// The CONFIRM has not gone out once yet: it goes even with nothing
    /// to carry, so the responder's session exists before data does.
    confirm_unsent: bool,
    /// The datagram size agreed with the peer; 0 before any handshake.
    max_datagram: usize,
    /// A handshake waits for a place among those the endpoint has under
    /// way (`greeting`), with the first try it will take.
    waiting: Option<Option<u32>>,
    /// Rounds of HELLOs so far: the first, and one per retry timer.
    rounds: u32,
}

impl Handshake {
    pub fn new() -> Self {
        Handshake {
            nonce: 0,
            hello_at: None,
            backoff: Duration::ZERO,
            hello_due: false,
            tries: 0,
            burst: 0,
            on_every_rail: false,
            last_nonce: 0,
            began: None,
            retried: false,
            confirm: None,
            confirm_unsent: false,
            max_datagram: 0,
            waiting: None,
            rounds: 0,
        }
    }

    /// A session restored from a snapshot: proven before, agreed size known.
    pub fn restored(max_datagram: usize) -> Self {
        Handshake { max_datagram, ..Handshake::new() }
    }

    /// Begin a handshake (if none is in progress): a HELLO goes at once,
    /// then again after `first_wait`, doubling; try `first_try` is the
    /// first (the tries turn through the rails from there).
    pub fn start(&mut self, now: Instant, nonce: u64, first_wait: Duration, first_try: Option<u32>) {
        if self.nonce != 0 {
            return;
        }
        self.nonce = nonce;
        self.waiting = None;
        self.rounds = 1;
        self.tries = first_try.unwrap_or(0);
        self.on_every_rail = first_try.is_none();
        self.burst = 1;
        self.hello_due = true;
        self.backoff = first_wait;
        self.hello_at = Some(now);
    }

    pub fn initiating(&self) -> bool {
        self.nonce != 0
    }

    /// Wait for a place to begin, the first HELLO on try `first_try`.
    pub fn wait(&mut self, first_try: Option<u32>) {
        if self.nonce == 0 {
            self.waiting = Some(first_try);
        }
    }

    /// Waiting for a place: with the first try it will take.
    pub fn waiting(&self) -> Option<Option<u32>> {
        self.waiting
    }

    /// Counted among the handshakes the endpoint has under way: begun,
    /// and in its first `GREETING_ROUNDS` rounds.
    pub fn counted(&self) -> bool {
        self.nonce != 0 && self.rounds <= crate::greeting::GREETING_ROUNDS
    }

    /// The HELLO timer's deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.hello_at
    }

    /// The HELLO timer expired.
    pub fn on_timer(&mut self, now: Instant) {
        if self.hello_at.is_some_and(|t| t <= now) && !self.hello_due {
            self.hello_due = true;
            self.rounds = self.rounds.saturating_add(1);
        }
    }

    pub fn hello_due(&self) -> bool {
        self.hello_due
    }

    /// The HELLO to send now, if one is due, and which try it is; arms
    /// the retry. It proposes `max_datagram` in its first two rounds
    /// (a round: one try per rail), then [`BASE_DATAGRAM`] in every other
    /// round, in case the path drops the larger size; the caller pads it
    /// to the size it proposes.
    pub fn take_hello(
        &mut self,
        now: Instant,
        max_datagram: usize,
        ceiling: Duration,
        rails: u32,
    ) -> Option<(HandshakeFrame, u32)> {
        if !self.hello_due {
            return None;
        }
        if self.began.is_none() && self.on_every_rail {
            self.burst = rails.max(1);
        }
        self.retried |= self.began.is_some_and(|b| b != now);
        self.began.get_or_insert(now);
        let try_no = self.tries;
        self.tries += 1;
        let round = try_no / rails.max(1);
        let size = if round >= 2 && round & 1 == 0 { max_datagram.min(BASE_DATAGRAM) } else { max_datagram };
        self.burst = self.burst.saturating_sub(1);
        self.hello_due = self.burst > 0;
        self.hello_at = Some(now + spread(self.backoff, self.nonce, try_no));
        self.backoff = (self.backoff * 2).min(ceiling);
        let hello = HandshakeFrame {
            kind: HandshakeKind::Hello,
            max_datagram: size as u32,
            nonce: self.nonce,
            cookie: 0,
        };
        Some((hello, try_no))
    }

    /// The round trip a WELCOME arriving at `now` measures: only when
    /// every HELLO of the handshake went at once (a burst over the rails),
    /// so there is no doubt which it answers.
    pub fn round_trip(&self, now: Instant) -> Option<Duration> {
        self.began.filter(|_| !self.retried).map(|b| now.saturating_since(b))
    }

    /// Is `nonce` the one of our HELLO in progress?
    pub fn answers_ours(&self, nonce: u64) -> bool {
        self.nonce != 0 && constant_time_eq(self.nonce, nonce)
    }

    /// Is `nonce` the one of the handshake we completed last?
    pub fn answered_before(&self, nonce: u64) -> bool {
        self.last_nonce != 0 && constant_time_eq(self.last_nonce, nonce)
    }

    /// Our handshake completed (a WELCOME answered our HELLO): stop
    /// sending HELLOs and carry a CONFIRM (with the size `agreed`, as the
    /// handshake proved it) until the peer shows it knows us; the session
    /// goes on at `used` (see `Peer::size_to_use`).
    pub fn on_welcome(&mut self, cookie: u64, agreed: usize, used: usize) {
        self.confirm = Some(HandshakeFrame {
            kind: HandshakeKind::Confirm,
            max_datagram: agreed as u32,
            nonce: self.nonce,
            cookie,
        });
        self.confirm_unsent = true;
        self.finish(used);
    }

    /// The peer completed a handshake toward us (its CONFIRM checked), or
    /// showed it knows our incarnation: nothing more to send for it.
    pub fn on_confirmed(&mut self, agreed: Option<usize>) {
        self.confirm = None;
        self.confirm_unsent = false;
        if let Some(agreed) = agreed {
            self.finish(agreed);
        }
    }

    /// How long this handshake has been trying.
    pub fn trying_for(&self, now: Instant) -> Duration {
        self.began.map_or(Duration::ZERO, |t| now.saturating_since(t))
    }

    /// Stop trying (nothing to send, and the peer never answered).
    pub fn give_up(&mut self) {
        let agreed = self.max_datagram;
        *self = Handshake::new();
        self.max_datagram = agreed;
    }

    fn finish(&mut self, agreed: usize) {
        if self.nonce != 0 {
            self.last_nonce = self.nonce;
        }
        self.nonce = 0;
        self.waiting = None;
        self.rounds = 0;
        self.burst = 0;
        self.tries = 0;
        self.began = None;
        self.retried = false;
        self.hello_at = None;
        self.hello_due = false;
        self.max_datagram = agreed;
    }

    /// The CONFIRM to put in front of the next datagram, while one is owed.
    pub fn confirm(&self) -> Option<HandshakeFrame> {
        self.confirm
    }

    /// A CONFIRM must go even alone: it never went out.
    pub fn confirm_due(&self) -> bool {
        self.confirm_unsent
    }

    /// A datagram carried the CONFIRM.
    pub fn on_confirm_sent(&mut self) {
        self.confirm_unsent = false;
    }

    /// The datagram size agreed with the peer (0: no handshake yet).
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// Forget the session (the peer restarted): the next one is agreed anew.
    pub fn reset(&mut self) {
        *self = Handshake::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_checks_for_its_own_fields_and_two_slots_only() {
        let s = Secrets::new([7; 32]);
        let now = Instant::from_nanos(5 * COOKIE_SLOT_NANOS + 3);
        let c = s.cookie(2, 10, 99, (1, 20), cookie_slot(now), None);
        assert!(s.cookie_valid(c, (2, 10, 99), (1, 20), now, None));
        let next_slot = now + Duration::from_nanos(COOKIE_SLOT_NANOS);
        assert!(s.cookie_valid(c, (2, 10, 99), (1, 20), next_slot, None), "good one slot later");
        let two_later = now + Duration::from_nanos(2 * COOKIE_SLOT_NANOS);
        assert!(!s.cookie_valid(c, (2, 10, 99), (1, 20), two_later, None), "stale two slots later");
        for (hello, ours) in
            [((3, 10, 99), (1, 20)), ((2, 11, 99), (1, 20)), ((2, 10, 98), (1, 20)), ((2, 10, 99), (1, 21))]
        {
            assert!(!s.cookie_valid(c, hello, ours, now, None), "bound to every field");
        }
        assert!(
            !Secrets::new([8; 32]).cookie_valid(c, (2, 10, 99), (1, 20), now, None),
            "bound to the secret"
        );
        // A HELLO from an address no peer has: the cookie is good from
        // that address only.
        let [x, y]: [SocketAddr; 2] = ["10.0.0.1:7000".parse().unwrap(), "10.0.0.1:7001".parse().unwrap()];
        let moved = s.cookie(2, 10, 99, (1, 20), cookie_slot(now), Some(x));
        assert!(s.cookie_valid(moved, (2, 10, 99), (1, 20), now, Some(x)));
        assert!(!s.cookie_valid(moved, (2, 10, 99), (1, 20), now, Some(y)), "bound to the port");
        assert!(!s.cookie_valid(moved, (2, 10, 99), (1, 20), now, None), "bound to the address");
        assert!(!s.cookie_valid(c, (2, 10, 99), (1, 20), now, Some(x)));
        let v6: SocketAddr = "[fe80::1]:7000".parse().unwrap();
        assert_ne!(address_words(Some(v6)), address_words(Some(x)));
    }

    /// Retries wait between half and one and a half of the backoff, and
    /// handshakes begun together (different nonces) retry apart.
    #[test]
    fn hello_retries_are_spread() {
        let wait = Duration::from_millis(8);
        let waits: Vec<Duration> =
            (1..=200u64).map(|nonce| spread(wait, nonce * 0x1234_5678_9abc, 1)).collect();
        assert!(waits.iter().all(|w| *w >= wait / 2 && *w < wait * 3 / 2), "{waits:?}");
        let low = waits.iter().filter(|w| **w < wait).count();
        assert!((60..=140).contains(&low), "{low} of 200 below the backoff: not spread");
        assert_ne!(spread(wait, 7, 1), spread(wait, 7, 2), "each try draws anew");
    }

    #[test]
    fn nonces_are_fresh_and_never_zero() {
        let mut s = Secrets::new([0; 32]);
        let a: Vec<u64> = (0..1000).map(|_| s.nonce()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(b.len(), a.len());
        assert!(!a.contains(&0));
        assert!(constant_time_eq(5, 5) && !constant_time_eq(5, 6) && !constant_time_eq(0, u64::MAX));
    }
}
