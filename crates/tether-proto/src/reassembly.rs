//! The application's side of fragment mode (`Config::deliver_fragments`,
//! docs/ENGINE.md): a core that delivers each fragment as it comes in
//! order, and an application that puts the messages together and knows
//! exactly where in each peer's stream it stands. An engine's application
//! (`tether-attach`'s client) and the simulator's both reassemble with
//! this one type.
//!
//! Where it stands survives the engine that delivered (Zhou et al. [FTGM]
//! section 4): a new engine resumes the stream there and may deliver again
//! what was taken, which is recognised and passed over. A message that
//! breaks a rule (larger than allowed, fragments disagreeing on their
//! channel, a fragment with no first) is dropped whole, its remaining
//! fragments with it: never delivered as a message of their own.

use bytes::Bytes;

use crate::{Channel, Fragment};

/// Where an application stands in a peer's stream: its life and epoch,
/// and the next fragment it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPosition {
    /// The peer's incarnation (a new one starts its streams afresh).
    pub incarnation: u64,
    /// The peer's stream epoch.
    pub epoch: u32,
    /// The next fragment expected.
    pub next: u64,
}

/// What a fragment taken in came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assembled {
    /// Taken before (a restored engine delivered it again): passed over.
    Again,
    /// Part of a message still coming.
    Part,
    /// The message it ends, and its channel.
    Whole(Bytes, Channel),
    /// The message it belongs to broke a rule, and why: dropped whole.
    Dropped(&'static str),
}

/// One peer's stream, as its application takes it in.
#[derive(Debug, Default)]
pub struct Reassembly {
    at: Option<StreamPosition>,
    buf: Vec<u8>,
    /// The channel the message's first fragment named.
    channel: Channel,
    state: State,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No message begun.
    #[default]
    Idle,
    Assembling,
    /// The message broke a rule: its fragments up to its last are dropped.
    Discarding,
}

impl Reassembly {
    /// Where the application stands, once it has taken a fragment.
    pub fn position(&self) -> Option<StreamPosition> {
        self.at
    }

    /// Take the next fragment delivered (`f`, on `channel`, carrying
    /// `payload`) of a message of at most `max` bytes. Fragments come in
    /// order; one of a new life or epoch of the stream voids what was
    /// partial. A fragment missing between two taken is not detected here
    /// (the core never skips one): the message comes out short.
    pub fn take(&mut self, f: &Fragment, channel: Channel, payload: &[u8], max: usize) -> Assembled {
        let fresh = StreamPosition { incarnation: f.incarnation, epoch: f.epoch, next: f.seq };
        let at = match self.at {
            Some(at) if (at.incarnation, at.epoch) == (f.incarnation, f.epoch) => at,
            // A new life or epoch of the peer's stream: what was partial
            // is void.
            _ => {
                self.buf.clear();
                self.state = State::Idle;
                fresh
            }
        };
        if f.seq < at.next {
            return Assembled::Again;
        }
        self.at = Some(StreamPosition { next: f.seq + 1, ..at });
        if f.first {
            self.buf.clear();
            (self.channel, self.state) = (channel, State::Assembling);
        }
        let broken = match self.state {
            State::Discarding => {
                self.state = if f.last { State::Idle } else { State::Discarding };
                return Assembled::Part;
            }
            State::Idle => Some("a fragment without its message's first"),
            State::Assembling if channel != self.channel => {
                Some("fragments disagree on their message's channel")
            }
            State::Assembling if self.buf.len() + payload.len() > max => {
                Some("a message beyond the largest allowed")
            }
            State::Assembling => None,
        };
        if let Some(why) = broken {
            self.buf.clear();
            self.state = if f.last { State::Idle } else { State::Discarding };
            return Assembled::Dropped(why);
        }
        self.buf.extend_from_slice(payload);
        if !f.last {
            return Assembled::Part;
        }
        self.state = State::Idle;
        Assembled::Whole(Bytes::from(std::mem::take(&mut self.buf)), self.channel)
    }

    /// `take` for a fragment handed over as [`Bytes`]: a fragment that is a
    /// whole message (first and last) is delivered as it is, without the
    /// copy into the assembly buffer (an engine's deliveries of messages
    /// that fit one record, taken straight into pooled buffers).
    pub fn take_bytes(&mut self, f: &Fragment, channel: Channel, payload: Bytes, max: usize) -> Assembled {
        if !(f.first && f.last) {
            return self.take(f, channel, &payload, max);
        }
        match self.take_whole(f, channel, payload.len(), max) {
            Assembled::Whole(_, channel) => Assembled::Whole(payload, channel),
            other => other,
        }
    }

    /// `take` for a fragment that is a whole message (first and last) of
    /// `len` bytes the caller keeps where they are (a batch receive copies
    /// them straight into its buffer): the same rules, run on no bytes, so
    /// `Whole` carries none.
    pub fn take_whole(&mut self, f: &Fragment, channel: Channel, len: usize, max: usize) -> Assembled {
        debug_assert!(f.first && f.last, "a whole message's fragment");
        match self.take(f, channel, &[], max) {
            Assembled::Whole(..) if len > max => Assembled::Dropped("a message beyond the largest allowed"),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: Channel = Channel::APP;

    fn frag(seq: u64, first: bool, last: bool) -> Fragment {
        Fragment { incarnation: 1, epoch: 0, seq, first, last, total_len: None }
    }

    #[test]
    fn a_message_is_put_together_with_its_channel() {
        let mut r = Reassembly::default();
        assert_eq!(r.take(&frag(0, true, false), Channel::LAYER, b"ab", 10), Assembled::Part);
        assert_eq!(r.take(&frag(1, false, false), Channel::LAYER, b"cd", 10), Assembled::Part);
        assert_eq!(
            r.take(&frag(2, false, true), Channel::LAYER, b"e", 10),
            Assembled::Whole("abcde".into(), Channel::LAYER)
        );
        assert_eq!(r.take(&frag(3, true, true), APP, b"x", 10), Assembled::Whole("x".into(), APP));
        assert_eq!(r.position(), Some(StreamPosition { incarnation: 1, epoch: 0, next: 4 }));
    }

    /// Before, the tail of a dropped message was delivered as a message.
    #[test]
    fn a_dropped_message_takes_its_other_fragments_with_it() {
        let mut r = Reassembly::default();
        let mut seq = 0;
        let mut take = |r: &mut Reassembly, first, last, channel, payload: &[u8], max| {
            seq += 1;
            r.take(&frag(seq, first, last), channel, payload, max)
        };
        // Too large.
        assert_eq!(take(&mut r, true, false, APP, b"12345", 6), Assembled::Part);
        assert!(matches!(take(&mut r, false, false, APP, b"6789", 6), Assembled::Dropped(_)));
        assert_eq!(take(&mut r, false, false, APP, b"tail", 6), Assembled::Part);
        assert_eq!(take(&mut r, false, true, APP, b"end", 6), Assembled::Part);
        // Fragments that disagree on the channel.
        assert_eq!(take(&mut r, true, false, Channel::LAYER, b"ab", 10), Assembled::Part);
        assert!(matches!(take(&mut r, false, false, APP, b"cd", 10), Assembled::Dropped(_)));
        assert_eq!(take(&mut r, false, true, Channel::LAYER, b"ef", 10), Assembled::Part);
        // A middle or last fragment with no first before it.
        assert!(matches!(take(&mut r, false, true, APP, b"orphan", 10), Assembled::Dropped(_)));
        // And the next message comes whole.
        assert_eq!(take(&mut r, true, true, APP, b"next", 10), Assembled::Whole("next".into(), APP));
    }

    /// A whole message handed over as `Bytes` is delivered as those very
    /// bytes, under the same rules as a copied one.
    #[test]
    fn a_whole_message_handed_over_is_not_copied() {
        let mut r = Reassembly::default();
        let m = Bytes::from(vec![7u8; 100]);
        match r.take_bytes(&frag(0, true, true), APP, m.clone(), 100) {
            Assembled::Whole(got, APP) => assert_eq!(got.as_ptr(), m.as_ptr(), "the same memory"),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.take_bytes(&frag(0, true, true), APP, m.clone(), 100), Assembled::Again);
        assert!(matches!(r.take_bytes(&frag(1, true, true), APP, m.clone(), 99), Assembled::Dropped(_)));
        // Fragments of a longer message are put together as before.
        assert_eq!(r.take_bytes(&frag(2, true, false), APP, m.slice(..60), 100), Assembled::Part);
        assert_eq!(r.take_bytes(&frag(3, false, true), APP, m.slice(60..), 100), Assembled::Whole(m, APP));
        assert_eq!(r.position().map(|p| p.next), Some(4));
    }

    /// A restored engine delivers again what was taken: passed over. A new
    /// life of the peer's stream voids what was partial.
    #[test]
    fn fragments_taken_before_are_passed_over_and_a_new_life_starts_afresh() {
        let mut r = Reassembly::default();
        assert_eq!(r.take(&frag(5, true, false), APP, b"ab", 10), Assembled::Part);
        assert_eq!(r.take(&frag(5, true, false), APP, b"ab", 10), Assembled::Again);
        assert_eq!(r.take(&frag(6, false, true), APP, b"cd", 10), Assembled::Whole("abcd".into(), APP));
        assert_eq!(r.take(&frag(7, true, false), APP, b"partial", 10), Assembled::Part);
        let next_life = Fragment { incarnation: 2, ..frag(0, false, true) };
        assert!(
            matches!(r.take(&next_life, APP, b"tail", 10), Assembled::Dropped(_)),
            "no first in this life"
        );
        let whole = Fragment { incarnation: 2, ..frag(1, true, true) };
        assert_eq!(r.take(&whole, APP, b"new", 10), Assembled::Whole("new".into(), APP));
    }
}
