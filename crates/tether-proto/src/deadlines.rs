//! Which peers' timers come next: the endpoint finds its due peers and its
//! own deadline here, not by looking at every peer.
//!
//! `handle_timeout` used to walk every peer for those due, and a peer
//! whose deadline moved later made the endpoint look at every peer again
//! for the new earliest. With 255 peers per endpoint (a 256-node demo on
//! two cores) that walk was the largest single cost of the whole run:
//! `Endpoint::handle_timeout` 15% of all CPU, with the ordered map's
//! searches another 3%.
//!
//! A min-heap of (deadline, peer), with lazy deletion: a peer whose
//! deadline changes gets a new entry, and the old one stays until it
//! reaches the top, where it is seen to be stale (the peer's `scheduled`
//! deadline, the one its live entry holds, is another) and dropped. So a
//! change costs a push, the earliest a look at the top, the due peers a
//! pop each. Stale entries are bounded: past twice the peers (plus a few),
//! the heap is rebuilt from the peers' deadlines, an O(peers) cost paid
//! at most once per that many changes. The heap's storage grows with the
//! number of peers, never with the rate of changes, so the steady state
//! allocates nothing.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::peer::Peer;
use crate::{Instant, NodeId};

/// Stale entries tolerated beyond twice the peers before a rebuild.
const SLACK: usize = 32;

#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, NodeId)>>,
}

impl Deadlines {
    /// Peer `id`'s deadline is now `next`; `scheduled` is the peer's record
    /// of the deadline its live entry holds.
    pub fn set(&mut self, id: NodeId, scheduled: &mut Option<Instant>, next: Option<Instant>) {
        if *scheduled == next {
            return;
        }
        *scheduled = next;
        if let Some(t) = next {
            self.heap.push(Reverse((t, id)));
        }
    }

    /// The earliest deadline of any peer. Drops stale entries from the top,
    /// and rebuilds the heap when too many have piled up below it.
    pub fn earliest(&mut self, peers: &BTreeMap<NodeId, Peer>) -> Option<Instant> {
        if self.heap.len() > 2 * peers.len() + SLACK {
            self.rebuild(peers);
        }
        while let Some(&Reverse((t, id))) = self.heap.peek() {
            if live(peers, t, id) {
                return Some(t);
            }
            self.heap.pop();
        }
        None
    }

    /// Take every peer due at `now` into `due`, in node order (the
    /// simulator's totals depend on the order): their entries leave the
    /// heap, and each is scheduled anew once it has been handled.
    pub fn take_due(&mut self, now: Instant, peers: &mut BTreeMap<NodeId, Peer>, due: &mut Vec<NodeId>) {
        while let Some(&Reverse((t, id))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            if let Some(p) = peers.get_mut(&id).filter(|p| p.scheduled == Some(t)) {
                p.scheduled = None;
                due.push(id);
            }
        }
        due.sort_unstable();
    }

    /// Every peer's deadline read afresh (after a change to all of them).
    pub fn rebuild(&mut self, peers: &BTreeMap<NodeId, Peer>) {
        self.heap.clear();
        self.heap.extend(peers.iter().filter_map(|(&id, p)| p.scheduled.map(|t| Reverse((t, id)))));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

fn live(peers: &BTreeMap<NodeId, Peer>, t: Instant, id: NodeId) -> bool {
    peers.get(&id).is_some_and(|p| p.scheduled == Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregate;
    use crate::Config;
    use core::time::Duration;

    fn peers(n: NodeId) -> BTreeMap<NodeId, Peer> {
        let config = Config::default();
        let mut aggregate = Aggregate::new(&config);
        (1..=n).map(|id| (id, Peer::new(id, &config, &mut aggregate))).collect()
    }

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn the_earliest_follows_deadlines_that_move_both_ways() {
        let mut peers = peers(3);
        let mut d = Deadlines::default();
        for (id, ms) in [(1, 30), (2, 10), (3, 20)] {
            let p = peers.get_mut(&id).unwrap();
            d.set(id, &mut p.scheduled, Some(at(ms)));
        }
        assert_eq!(d.earliest(&peers), Some(at(10)));
        // The earliest moves later: the next one takes its place.
        d.set(2, &mut peers.get_mut(&2).unwrap().scheduled, Some(at(40)));
        assert_eq!(d.earliest(&peers), Some(at(20)));
        // And back earlier than all.
        d.set(2, &mut peers.get_mut(&2).unwrap().scheduled, Some(at(5)));
        assert_eq!(d.earliest(&peers), Some(at(5)));
        // Timers stopped.
        for id in 1..=3 {
            d.set(id, &mut peers.get_mut(&id).unwrap().scheduled, None);
        }
        assert_eq!(d.earliest(&peers), None);
    }

    #[test]
    fn due_peers_come_once_in_node_order() {
        let mut peers = peers(4);
        let mut d = Deadlines::default();
        for (id, ms) in [(4, 1), (1, 3), (3, 2), (2, 9)] {
            d.set(id, &mut peers.get_mut(&id).unwrap().scheduled, Some(at(ms)));
        }
        // Peer 3 moved to 1 ms and back to 2 ms: two entries at 2 ms.
        d.set(3, &mut peers.get_mut(&3).unwrap().scheduled, Some(at(1)));
        d.set(3, &mut peers.get_mut(&3).unwrap().scheduled, Some(at(2)));
        let mut due = Vec::new();
        d.take_due(at(5), &mut peers, &mut due);
        assert_eq!(due, vec![1, 3, 4]);
        assert_eq!(d.earliest(&peers), Some(at(9)));
        due.clear();
        d.take_due(at(5), &mut peers, &mut due);
        assert!(due.is_empty(), "a peer taken is not due again until rescheduled");
    }

    #[test]
    fn stale_entries_stay_bounded() {
        let mut peers = peers(8);
        let mut d = Deadlines::default();
        for round in 0..10_000u64 {
            let id = (round % 8) as NodeId + 1;
            d.set(id, &mut peers.get_mut(&id).unwrap().scheduled, Some(at(round)));
            assert!(d.earliest(&peers).is_some());
            assert!(d.len() <= 2 * 8 + SLACK + 1, "{} entries for 8 peers", d.len());
        }
        // Every peer's latest deadline survived the rebuilds.
        let mut due = Vec::new();
        d.take_due(at(u64::MAX / 2_000_000), &mut peers, &mut due);
        assert_eq!(due, (1..=8).collect::<Vec<_>>());
    }
}
