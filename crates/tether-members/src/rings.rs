//! Who watches whom: each member of a view is observed by its successors
//! on `K` rings laid over the view (docs/CLUSTER.md, "Roles"; the
//! monitoring topology of Rapid, Suresh et al.), so every member sends
//! and receives O(K) heartbeats a period whatever the size of the view,
//! and every member knows its observers and subjects from the view alone.
//!
//! Ring `r` orders the members by a hash of (r, node id); a member's
//! observer on ring `r` is the next member after it. Different rings give
//! different neighbours, so one member's observers are spread over the
//! view, not bunched beside it.

use tether_proto::NodeId;

/// A member's place on ring `ring`: a 64-bit mix of the two (SplitMix64's
/// finaliser), the same on every node.
fn place(ring: u32, node: NodeId) -> u64 {
    let mut z = (u64::from(ring) << 32 | u64::from(node)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The observation topology of one view, as the managers keep it (a
/// member keeps only its own [`Neighbourhood`]), changed member by
/// member: a view change moves one member, so laying every ring again
/// would cost a sort of the whole view per ring; here it costs a search
/// and a move of the ring's tail (a B-tree per ring was slower at a
/// thousand members: `tether sim --mix membership_1000`, 7.3 s against
/// 6.5).
#[derive(Debug, Clone, Default)]
pub struct Rings {
    /// Each ring: (place, member), sorted.
    rings: Vec<Vec<(u64, NodeId)>>,
}

impl Rings {
    /// `k` rings over `members` (any order; duplicates ignored).
    pub fn new(members: &[NodeId], k: u32) -> Self {
        let rings = (0..k)
            .map(|r| {
                let mut ring: Vec<(u64, NodeId)> = members.iter().map(|&n| (place(r, n), n)).collect();
                ring.sort_unstable();
                ring.dedup();
                ring
            })
            .collect();
        Rings { rings }
    }

    /// Put `node` on every ring (nothing if it is on them).
    pub fn insert(&mut self, node: NodeId) {
        for (r, ring) in self.rings.iter_mut().enumerate() {
            let key = (place(r as u32, node), node);
            if let Err(at) = ring.binary_search(&key) {
                ring.insert(at, key);
            }
        }
    }

    /// Take `node` off every ring.
    pub fn remove(&mut self, node: NodeId) {
        for (r, ring) in self.rings.iter_mut().enumerate() {
            if let Ok(at) = ring.binary_search(&(place(r as u32, node), node)) {
                ring.remove(at);
            }
        }
    }

    /// Those who watch `node`: its successor on each ring, each once, never
    /// itself (fewer than `k` in a view of `k` members or fewer).
    pub fn observers(&self, node: NodeId) -> Vec<NodeId> {
        self.neighbours(node, true)
    }

    /// Those `node` watches: its predecessor on each ring.
    pub fn subjects(&self, node: NodeId) -> Vec<NodeId> {
        self.neighbours(node, false)
    }

    /// The next member on each ring (`forward`) or the one before, round
    /// the end.
    fn neighbours(&self, node: NodeId, forward: bool) -> Vec<NodeId> {
        let mut out = Vec::new();
        for (r, ring) in self.rings.iter().enumerate() {
            let Ok(at) = ring.binary_search(&(place(r as u32, node), node)) else { return Vec::new() };
            let at = if forward { (at + 1) % ring.len() } else { (at + ring.len() - 1) % ring.len() };
            let other = ring[at].1;
            if other != node && !out.contains(&other) {
                out.push(other);
            }
        }
        out
    }
}

/// One member's own place on the rings: its predecessor (its subject)
/// and successor (its observer) on each, kept as the view changes. A
/// member needs no more than that, and a join then costs it O(K), a
/// leave O(K) unless the one that left was its neighbour (that ring is
/// searched again, O(N)): at a thousand members joining at once, moving
/// whole rings at every member was a third of the simulator's time.
#[derive(Debug, Clone)]
pub struct Neighbourhood {
    me: NodeId,
    k: u32,
    /// Per ring, (predecessor, successor); empty while `me` is not in the
    /// view; `me` itself when alone.
    rings: Vec<(NodeId, NodeId)>,
}

impl Neighbourhood {
    /// `me`'s neighbours on `k` rings over `members` (none if it is not
    /// one of them).
    pub fn new<I: Iterator<Item = NodeId> + Clone>(me: NodeId, members: I, k: u32) -> Self {
        let mut n = Neighbourhood { me, k, rings: Vec::new() };
        if members.clone().any(|m| m == me) {
            n.rings = (0..k).map(|r| n.search(r, members.clone())).collect();
        }
        n
    }

    /// `node` joined (the view holds it now; `members` are its members).
    pub fn joined<I: Iterator<Item = NodeId> + Clone>(&mut self, node: NodeId, members: I) {
        if node == self.me {
            *self = Neighbourhood::new(self.me, members, self.k);
            return;
        }
        for r in 0..self.rings.len() {
            let (pred, succ) = self.rings[r];
            let ring = r as u32;
            if self.after(ring, node) < self.after(ring, succ) || succ == self.me {
                self.rings[r].1 = node;
            }
            if self.before(ring, node) < self.before(ring, pred) || pred == self.me {
                self.rings[r].0 = node;
            }
        }
    }

    /// `node` left (the view no longer holds it; `members` are its
    /// members).
    pub fn left<I: Iterator<Item = NodeId> + Clone>(&mut self, node: NodeId, members: I) {
        if node == self.me {
            self.rings.clear();
            return;
        }
        for r in 0..self.rings.len() {
            let (pred, succ) = self.rings[r];
            if pred == node || succ == node {
                self.rings[r] = self.search(r as u32, members.clone());
            }
        }
    }

    /// Those who watch this member: its successor on each ring, each once.
    pub fn observers(&self) -> Vec<NodeId> {
        self.each(|&(_, succ)| succ)
    }

    /// Those this member watches: its predecessor on each ring.
    pub fn subjects(&self) -> Vec<NodeId> {
        self.each(|&(pred, _)| pred)
    }

    fn each(&self, pick: impl Fn(&(NodeId, NodeId)) -> NodeId) -> Vec<NodeId> {
        let mut out = Vec::new();
        for n in self.rings.iter().map(pick) {
            if n != self.me && !out.contains(&n) {
                out.push(n);
            }
        }
        out
    }

    /// How far round ring `r` `node` comes after this member: members
    /// after it first, nearest first, then those before it (round the
    /// end), in ring order.
    fn after(&self, r: u32, node: NodeId) -> (bool, (u64, NodeId)) {
        let key = (place(r, node), node);
        (key <= (place(r, self.me), self.me), key)
    }

    /// The same backwards: smaller is nearer before this member.
    fn before(&self, r: u32, node: NodeId) -> (bool, core::cmp::Reverse<(u64, NodeId)>) {
        let key = (place(r, node), node);
        (key >= (place(r, self.me), self.me), core::cmp::Reverse(key))
    }

    /// Ring `r`'s neighbours of this member, from every member.
    fn search<I: Iterator<Item = NodeId> + Clone>(&self, r: u32, members: I) -> (NodeId, NodeId) {
        let others = || members.clone().filter(|&m| m != self.me);
        let succ = others().min_by_key(|&m| self.after(r, m)).unwrap_or(self.me);
        let pred = others().min_by_key(|&m| self.before(r, m)).unwrap_or(self.me);
        (pred, succ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observers_and_subjects_mirror_each_other() {
        let members: Vec<NodeId> = (1..=50).collect();
        let rings = Rings::new(&members, 3);
        for &m in &members {
            let observers = rings.observers(m);
            assert!((2..=3).contains(&observers.len()), "{m}: {observers:?}");
            assert!(!observers.contains(&m));
            for o in observers {
                assert!(rings.subjects(o).contains(&m), "{o} watches {m}");
            }
        }
        // Everyone is watched by as many as it watches: the load is even.
        let watched: usize = members.iter().map(|&m| rings.subjects(m).len()).sum();
        let watching: usize = members.iter().map(|&m| rings.observers(m).len()).sum();
        assert_eq!(watched, watching);
    }

    #[test]
    fn small_views_and_strangers() {
        assert!(Rings::new(&[7], 3).observers(7).is_empty(), "alone: nobody watches");
        assert_eq!(Rings::new(&[7, 9], 3).observers(7), [9]);
        assert!(Rings::new(&[7, 9], 3).observers(8).is_empty(), "not a member");
        let a = Rings::new(&[3, 1, 2, 2], 2);
        let b = Rings::new(&[1, 2, 3], 2);
        assert_eq!(a.observers(1), b.observers(1), "order and duplicates do not matter");
    }

    #[test]
    fn a_member_moved_is_a_ring_laid_again() {
        let mut rings = Rings::new(&[1, 2, 3, 4, 5], 3);
        rings.insert(9);
        rings.insert(9);
        rings.remove(2);
        rings.remove(42);
        let laid = Rings::new(&[1, 3, 4, 5, 9], 3);
        for m in [1, 3, 4, 5, 9] {
            assert_eq!(rings.observers(m), laid.observers(m), "{m}");
            assert_eq!(rings.subjects(m), laid.subjects(m), "{m}");
        }
        assert!(rings.observers(2).is_empty(), "removed");
    }

    #[test]
    fn a_neighbourhood_kept_by_changes_is_the_rings_laid_again() {
        // Members come and go in an order drawn from a fixed generator;
        // after every change, each member's own neighbourhood agrees with
        // rings laid over the whole view.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut draw = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut members: Vec<NodeId> = Vec::new();
        let mut hoods: Vec<Neighbourhood> =
            (1..=40).map(|m| Neighbourhood::new(m, [].into_iter(), 3)).collect();
        for _ in 0..400 {
            let node = draw(40) as NodeId + 1;
            let joins = !members.contains(&node);
            if joins {
                members.push(node);
            } else {
                members.retain(|&m| m != node);
            }
            for h in &mut hoods {
                if joins {
                    h.joined(node, members.iter().copied());
                } else {
                    h.left(node, members.iter().copied());
                }
            }
            let rings = Rings::new(&members, 3);
            for (i, h) in hoods.iter().enumerate() {
                let m = i as NodeId + 1;
                assert_eq!(h.observers(), rings.observers(m), "{m} in {members:?}");
                assert_eq!(h.subjects(), rings.subjects(m), "{m} in {members:?}");
            }
        }
    }
}
