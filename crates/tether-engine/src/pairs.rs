//! The engine's table of direct paths (docs/ENGINE.md, "The direct
//! path"): for two applications attached to the same engine, a pair region
//! in the engine's directory (`tether_shm::create_pair`) that they use
//! alone. The engine only lays it out, tells both sides its generation
//! (`Completion::Local`), rings a sleeper's doorbell when asked, and tells
//! the survivor when one side goes (`Completion::LocalGone`).
//!
//! A new engine (after a crash) has an empty table: when the applications
//! name their peers again it adopts the region files it finds, so a path
//! in use goes on untouched through the engine's death.
//!
//! Bounded: an application has at most `MAX_CLIENTS` direct paths laid
//! (no engine serves more applications for it to talk to), each a region
//! file of its rings' size; one asking for more goes through the rails.
//! A pair both of whose sides went is forgotten.

use std::collections::BTreeMap;
use std::path::Path;

use tether_proto::NodeId;
use tether_shm::{create_pair, PairEnd, ShmError};

use tether_attach::records::pair_file;

use crate::application::MAX_CLIENTS;

#[derive(Debug, Clone, Copy)]
struct Pair {
    generation: u64,
    /// The region exists (false once a side went: laid anew when it
    /// attaches again).
    live: bool,
}

#[derive(Debug)]
pub struct Pairs {
    /// By (lower node, higher node).
    table: BTreeMap<(NodeId, NodeId), Pair>,
    /// Generations are unique across engines' lives: they start at the
    /// clock's nanoseconds.
    next_generation: u64,
}

impl Default for Pairs {
    fn default() -> Self {
        Pairs { table: BTreeMap::new(), next_generation: tether_attach::monotonic_ns().max(1) }
    }
}

fn key(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl Pairs {
    /// The direct path between `a` and `b`: the one in use, one a dead
    /// engine left in `dir`, or a new one with rings of `capacity` bytes.
    pub fn open(&mut self, dir: &Path, a: NodeId, b: NodeId, capacity: usize) -> Result<u64, ShmError> {
        if a == b {
            return Err(ShmError::BadField("a direct path to itself"));
        }
        let k = key(a, b);
        match self.table.get(&k) {
            Some(p) if p.live => return Ok(p.generation),
            _ if self.laid_for(a) >= MAX_CLIENTS => {
                return Err(ShmError::BadField("more direct paths than an engine serves applications"))
            }
            Some(_) => {}
            None => {
                if let Some(generation) = adoptable(dir, a, b) {
                    self.table.insert(k, Pair { generation, live: true });
                    return Ok(generation);
                }
            }
        }
        self.lay(dir, a, b, capacity)
    }

    /// Paths laid now with `node` at one end.
    fn laid_for(&self, node: NodeId) -> usize {
        self.table.iter().filter(|(k, p)| p.live && (k.0 == node || k.1 == node)).count()
    }

    fn lay(&mut self, dir: &Path, a: NodeId, b: NodeId, capacity: usize) -> Result<u64, ShmError> {
        assert_ne!(a, b, "a direct path laid from node {a} to itself");
        let generation = self.next_generation;
        self.next_generation += 1;
        // This engine's own generations only rise. (Not compared with the
        // table's: a generation adopted from a file name in the directory
        // is whatever the file says.)
        assert!(self.next_generation > generation, "a direct path's generation reused");
        create_pair(&dir.join(pair_file(a, b, generation)), a, b, capacity)?;
        self.table.insert(key(a, b), Pair { generation, live: true });
        Ok(generation)
    }

    /// `node` attached as a new life: each of its paths is laid anew (what
    /// the old life left in them is the other side's to fail, exactly, by
    /// what was taken). The peers and their new generations.
    pub fn renew(&mut self, dir: &Path, node: NodeId, capacity: usize) -> Vec<(NodeId, u64)> {
        let keys: Vec<_> = self.table.keys().filter(|(l, h)| *l == node || *h == node).copied().collect();
        let mut laid = Vec::new();
        for k in keys {
            let other = if k.0 == node { k.1 } else { k.0 };
            let old = self.table[&k];
            if old.live {
                let _ = std::fs::remove_file(dir.join(pair_file(k.0, k.1, old.generation)));
            }
            match self.lay(dir, node, other, capacity) {
                Ok(generation) => laid.push((other, generation)),
                Err(e) => {
                    tracing::warn!(node, peer = other, error = %e, "direct path not laid anew");
                    self.table.remove(&k);
                }
            }
        }
        laid
    }

    /// `node` went: its paths are closed and their files in `dir` removed
    /// (the survivors keep their mappings to drain them; a survivor's path
    /// is laid anew if `node` attaches again). Paths whose other side went
    /// before are forgotten: nobody is left on them. The survivors.
    pub fn gone(&mut self, dir: &Path, node: NodeId) -> Vec<NodeId> {
        let mut survivors = Vec::new();
        self.table.retain(|k, p| {
            if k.0 != node && k.1 != node {
                return true;
            }
            if !p.live {
                return false;
            }
            p.live = false;
            let _ = std::fs::remove_file(dir.join(pair_file(k.0, k.1, p.generation)));
            survivors.push(if k.0 == node { k.1 } else { k.0 });
            true
        });
        survivors
    }
}

/// The newest pair region of `a` and `b` in `dir` that opens and checks.
fn adoptable(dir: &Path, a: NodeId, b: NodeId) -> Option<u64> {
    let prefix = format!("pair-{}-{}-", a.min(b), a.max(b));
    let newest = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.strip_prefix(&prefix)?.strip_suffix(".shm")?.parse::<u64>().ok())
        .max()?;
    PairEnd::open(&dir.join(pair_file(a, b, newest)), a, b).ok().map(|_| newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An application asking for ever more direct paths gets `MAX_CLIENTS`
    /// of them (region files), then is refused (its peers go through the
    /// rails); a pair both of whose sides went is forgotten, so a long
    /// life of applications coming and going leaves no table behind.
    #[test]
    fn direct_paths_are_bounded_per_application_and_forgotten_when_both_went() {
        let dir = std::env::temp_dir().join(format!("tether-pairs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut pairs = Pairs::default();
        let capacity = 4096;
        for peer in 2..2 + MAX_CLIENTS as NodeId {
            pairs.open(&dir, 1, peer, capacity).unwrap();
        }
        let refused = pairs.open(&dir, 1, 9_999, capacity);
        assert!(matches!(refused, Err(ShmError::BadField(_))), "{refused:?}");
        let files = || std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(files(), MAX_CLIENTS, "no file for the refused one");
        // A path already laid is still answered at the bound.
        assert!(pairs.open(&dir, 2, 1, capacity).is_ok());
        // Node 1 goes: every path closed, its files removed, the entries
        // kept for the survivors (node 1 may attach again).
        assert_eq!(pairs.gone(&dir, 1).len(), MAX_CLIENTS);
        assert_eq!((files(), pairs.table.len()), (0, MAX_CLIENTS));
        // The survivors go too: nothing is left.
        for peer in 2..2 + MAX_CLIENTS as NodeId {
            assert!(pairs.gone(&dir, peer).is_empty());
        }
        assert_eq!(pairs.table.len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
