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

/// The observation topology of one view.
#[derive(Debug, Clone, Default)]
pub struct Rings {
    /// Each ring: the members in ring order.
    rings: Vec<Vec<NodeId>>,
}

impl Rings {
    /// `k` rings over `members` (any order; duplicates ignored).
    pub fn new(members: &[NodeId], k: u32) -> Self {
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let rings = (0..k)
            .map(|r| {
                let mut ring = sorted.clone();
                ring.sort_by_key(|&n| (place(r, n), n));
                ring
            })
            .collect();
        Rings { rings }
    }

    /// Those who watch `node`: its successor on each ring, each once, never
    /// itself (fewer than `k` in a view of `k` members or fewer).
    pub fn observers(&self, node: NodeId) -> Vec<NodeId> {
        self.neighbours(node, 1)
    }

    /// Those `node` watches: its predecessor on each ring.
    pub fn subjects(&self, node: NodeId) -> Vec<NodeId> {
        self.neighbours(node, -1)
    }

    fn neighbours(&self, node: NodeId, step: isize) -> Vec<NodeId> {
        let mut out = Vec::new();
        for ring in &self.rings {
            let Some(at) = ring.iter().position(|&n| n == node) else { return Vec::new() };
            let len = ring.len() as isize;
            let other = ring[((at as isize + step).rem_euclid(len)) as usize];
            if other != node && !out.contains(&other) {
                out.push(other);
            }
        }
        out
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
}
