//! Refused traffic by reason, and what each reason most likely means for
//! the person running the endpoint. A peer whose configuration differs
//! (another key, a key on one side only, another `--auth`, a size below
//! the protocol's) gets no answer at all - strangers get nothing - so the
//! only place the cause shows is the refusing side's counters: they are
//! reported as an [`crate::Event::Refused`] at most once a second, and put
//! in words by [`Refused::causes`].

use std::collections::VecDeque;

use crate::stats::Stats;
use crate::{Event, Instant};

/// Datagrams refused, by reason (the [`Stats`] counters of the same
/// names), counted over some span: since the last report, or ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Refused {
    /// From a node id this endpoint was not given.
    pub strangers_refused: u64,
    /// From an address no peer has.
    pub unknown_source: u64,
    /// Naming another node than their source address belongs to.
    pub source_mismatch: u64,
    /// Unauthenticated, where this endpoint's cluster key requires it.
    pub auth_missing: u64,
    /// Authenticated, and this endpoint has no key to check them.
    pub auth_unexpected: u64,
    /// Authenticated with another algorithm than this endpoint's.
    pub auth_mismatch: u64,
    /// Authenticated, and the tag did not check.
    pub mac_failures: u64,
    /// Authenticated datagrams seen before.
    pub replays: u64,
    /// Handshake datagrams forged, replayed or stale.
    pub handshakes_refused: u64,
    /// HELLOs left unanswered in a flood of them.
    pub handshake_replies_dropped: u64,
    /// Handshakes from a peer whose datagram size is below the smallest
    /// the protocol works with.
    pub mtu_refused: u64,
}

impl Refused {
    /// Everything `stats` counts as refused so far.
    pub fn from_stats(s: &Stats) -> Self {
        Refused {
            strangers_refused: s.strangers_refused,
            unknown_source: s.unknown_source,
            source_mismatch: s.source_mismatch,
            auth_missing: s.auth_missing,
            auth_unexpected: s.auth_unexpected,
            auth_mismatch: s.auth_mismatch,
            mac_failures: s.mac_failures,
            replays: s.replays,
            handshakes_refused: s.handshakes_refused,
            handshake_replies_dropped: s.handshake_replies_dropped,
            mtu_refused: s.mtu_refused,
        }
    }

    /// From the counts in `counts()`'s order (a record that carries them).
    pub fn from_counts(c: [u64; 11]) -> Self {
        Refused {
            strangers_refused: c[0],
            unknown_source: c[1],
            source_mismatch: c[2],
            auth_missing: c[3],
            auth_unexpected: c[4],
            auth_mismatch: c[5],
            mac_failures: c[6],
            replays: c[7],
            handshakes_refused: c[8],
            handshake_replies_dropped: c[9],
            mtu_refused: c[10],
        }
    }

    /// Each count, with its reason's name, in a fixed order.
    pub fn counts(&self) -> [(&'static str, u64); 11] {
        [
            ("strangers_refused", self.strangers_refused),
            ("unknown_source", self.unknown_source),
            ("source_mismatch", self.source_mismatch),
            ("auth_missing", self.auth_missing),
            ("auth_unexpected", self.auth_unexpected),
            ("auth_mismatch", self.auth_mismatch),
            ("mac_failures", self.mac_failures),
            ("replays", self.replays),
            ("handshakes_refused", self.handshakes_refused),
            ("handshake_replies_dropped", self.handshake_replies_dropped),
            ("mtu_refused", self.mtu_refused),
        ]
    }

    /// What was refused after `earlier` (counters only grow).
    pub fn since(&self, earlier: &Refused) -> Refused {
        self.zip_with(earlier, u64::saturating_sub)
    }

    /// Add `other`'s counts (two reports merged into one).
    pub fn add(&mut self, other: &Refused) {
        *self = self.zip_with(other, u64::saturating_add);
    }

    fn zip_with(&self, o: &Refused, f: fn(u64, u64) -> u64) -> Refused {
        let (a, b) = (self.counts(), o.counts());
        Refused::from_counts(std::array::from_fn(|i| f(a[i].1, b[i].1)))
    }

    /// Queue `refused` (counted at `at`) on `events` as an
    /// [`crate::Event::Refused`]: added to one already waiting, so at most
    /// one waits however long the refusals go on (an application that
    /// never looks loses no room to them).
    pub fn report(self, events: &mut VecDeque<Event>, at: Instant) {
        let waiting = events.iter_mut().find_map(|e| match e {
            Event::Refused { refused, at } => Some((refused, at)),
            _ => None,
        });
        match waiting {
            Some((r, when)) => {
                r.add(&self);
                *when = at;
            }
            None => events.push_back(Event::Refused { refused: self, at }),
        }
    }

    /// Nothing refused.
    pub fn is_empty(&self) -> bool {
        self.counts().iter().all(|&(_, n)| n == 0)
    }

    /// Each reason with a count, in words: what it most likely means,
    /// largest count first (a cause shows as the bulk of the refusals;
    /// an attacker's forgeries as a few of another kind).
    pub fn causes(&self) -> Vec<String> {
        let mut found: Vec<(u64, String)> = self
            .counts()
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(reason, n)| (n, format!("{n} {}", explain(reason))))
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        found.into_iter().map(|(_, s)| s).collect()
    }
}

/// A reason, as a person running the endpoint needs to read it.
fn explain(reason: &str) -> &'static str {
    match reason {
        "strangers_refused" => {
            "datagrams from a node id this endpoint was not given (the peer's node id or --peer differs)"
        }
        "unknown_source" => "datagrams from an address no peer has (check the addresses each side was given)",
        "source_mismatch" => "datagrams naming another node than the one their address belongs to",
        "auth_missing" => {
            "datagrams came unauthenticated though this side has a cluster key: the other side has none \
             (a key on one side only)"
        }
        "auth_unexpected" => {
            "datagrams came authenticated and this side has no key to check them: a key on the other side only"
        }
        "auth_mismatch" => "datagrams were authenticated with another algorithm: --auth differs between the sides",
        "mac_failures" => {
            "datagrams failed authentication: the key differs between the two sides (or they were corrupted \
             on the way)"
        }
        "replays" => "datagrams were replays of ones already taken",
        "handshakes_refused" => "handshake datagrams were forged, replayed or stale",
        "handshake_replies_dropped" => "handshakes went unanswered in a flood of them",
        "mtu_refused" => {
            "handshakes came from a peer whose datagram size is below the smallest the protocol works with \
             (--mtu)"
        }
        _ => "datagrams were refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_largest_first_and_named() {
        let r = Refused { mac_failures: 412, unknown_source: 3, ..Refused::default() };
        let c = r.causes();
        assert_eq!(c.len(), 2);
        assert!(c[0].starts_with("412 datagrams failed authentication: the key differs"), "{c:?}");
        assert!(c[1].starts_with("3 datagrams from an address no peer has"), "{c:?}");
        assert!(Refused::default().causes().is_empty());
    }

    #[test]
    fn since_and_add_are_per_reason() {
        let a = Refused { auth_missing: 10, replays: 2, ..Refused::default() };
        let b = Refused { auth_missing: 4, replays: 5, ..Refused::default() };
        assert_eq!(a.since(&b), Refused { auth_missing: 6, ..Refused::default() });
        let mut m = a;
        m.add(&b);
        assert_eq!((m.auth_missing, m.replays), (14, 7));
        assert_eq!(Refused::from_counts(m.counts().map(|(_, n)| n)), m);
    }
}
