//! What dead applications left in an engine's directory, found and
//! removed (docs/ENGINE.md, "Nothing left behind").
//!
//! An application removes its own region when it detaches. One killed
//! outright leaves it: its region is named for its pid
//! (`tether_attach::owner`), so the engine that next starts in the
//! directory removes every region whose owner is gone, and the pair
//! regions nobody can use any more (a side gone, or an older generation
//! than the newest). While it runs, an engine watches the applications
//! whose connection closed until their process is gone or their region
//! is: a process's sockets close before it is reaped, so the moment the
//! connection closes is too early to tell.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tether_attach::owner;
use tether_attach::stat::ENGINE_BOARD;
use tether_proto::NodeId;
use tether_shm::BoardWriter;

use crate::application::MAX_CLIENTS;

/// What a start's sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    /// Regions of applications no longer running.
    pub regions: usize,
    /// Pair regions of which a side is gone, or a newer one exists.
    pub pairs: usize,
}

/// Remove from `dir` the regions of applications that are gone and the
/// pair regions nobody will adopt. Only for an engine about to serve
/// `dir` (none serves it now: the caller holds its socket).
pub fn sweep(dir: &Path) -> Reclaimed {
    let Ok(entries) = std::fs::read_dir(dir) else { return Reclaimed::default() };
    let names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    let mut done = Reclaimed::default();
    let mut living: BTreeSet<NodeId> = BTreeSet::new();
    for name in &names {
        // A board's staging file, left by an engine killed while making
        // it (its supervisor killed with it).
        if let Some(pid) = BoardWriter::staging_owner(name, ENGINE_BOARD) {
            if !owner::alive(pid) {
                let _ = std::fs::remove_file(dir.join(name));
            }
            continue;
        }
        let Some((node, pid)) = owner::region_owner(name) else { continue };
        if owner::alive(pid) {
            living.insert(node);
        } else if std::fs::remove_file(dir.join(name)).is_ok() {
            done.regions += 1;
        }
    }
    let pairs: Vec<(NodeId, NodeId, u64)> = names.iter().filter_map(|n| pair_of(n)).collect();
    let mut newest: BTreeMap<(NodeId, NodeId), u64> = BTreeMap::new();
    for &(a, b, g) in &pairs {
        let n = newest.entry((a, b)).or_insert(g);
        *n = (*n).max(g);
    }
    for (a, b, g) in pairs {
        let useful = newest[&(a, b)] == g && living.contains(&a) && living.contains(&b);
        if !useful && std::fs::remove_file(dir.join(tether_attach::records::pair_file(a, b, g))).is_ok() {
            done.pairs += 1;
        }
    }
    done
}

/// The nodes and generation a pair region's name gives.
fn pair_of(name: &str) -> Option<(NodeId, NodeId, u64)> {
    let mut parts = name.strip_prefix("pair-")?.strip_suffix(".shm")?.split('-');
    let a = parts.next()?.parse().ok()?;
    let b = parts.next()?.parse().ok()?;
    let g = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((a, b, g))
}

/// Applications whose connection closed, watched until their region is
/// removed (by them, or here once their process is gone). Bounded: past
/// `MAX_CLIENTS` the oldest is forgotten (the next start's sweep finds
/// its region).
#[derive(Debug, Default)]
pub(crate) struct Departed {
    watched: Vec<(u32, PathBuf)>,
}

impl Departed {
    /// Watch `path`, the region of process `pid`, whose connection closed.
    pub(crate) fn watch(&mut self, pid: u32, path: PathBuf) {
        if self.watched.len() >= MAX_CLIENTS {
            self.watched.remove(0);
        }
        self.watched.push((pid, path));
    }

    /// Remove the regions whose owner is gone; forget those removed by
    /// their owner. How many this removed.
    pub(crate) fn check(&mut self) -> usize {
        let mut removed = 0;
        self.watched.retain(|(pid, path)| {
            if !path.exists() {
                return false;
            }
            if owner::alive(*pid) {
                return true;
            }
            removed += std::fs::remove_file(path).is_ok() as usize;
            false
        });
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_attach::records::pair_file;

    /// A process that has exited and been reaped: its pid is free.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn a_start_removes_what_the_dead_left_and_keeps_the_living() {
        let dir = std::env::temp_dir().join(format!("tether-reclaim-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let dead = dead_pid();
        let touch = |name: &str| std::fs::write(dir.join(name), b"x").unwrap();
        touch(&owner::region_name(1, me, 0));
        touch(&owner::region_name(2, me, 0));
        touch(&owner::region_name(3, dead, 0));
        touch(&pair_file(1, 2, 5)); // both sides live, newest: kept
        touch(&pair_file(1, 2, 4)); // an older generation: removed
        touch(&pair_file(1, 3, 6)); // a side gone: removed
        touch("engine.sock.not-a-region"); // not ours to judge: kept
        let board = |pid: u32| format!("{ENGINE_BOARD}.new-{pid}");
        touch(&board(dead)); // a killed engine's half-made board: removed
        touch(&board(me)); // one being made now: kept
        let done = sweep(&dir);
        assert_eq!(done, Reclaimed { regions: 1, pairs: 2 });
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        let mut want = vec![
            owner::region_name(1, me, 0),
            owner::region_name(2, me, 0),
            pair_file(1, 2, 5),
            "engine.sock.not-a-region".to_string(),
            board(me),
        ];
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_departed_region_goes_once_its_owner_is_gone() {
        let dir = std::env::temp_dir().join(format!("tether-departed-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (mine, theirs, removed) = (dir.join("a.shm"), dir.join("b.shm"), dir.join("c.shm"));
        for p in [&mine, &theirs] {
            std::fs::write(p, b"x").unwrap();
        }
        let mut d = Departed::default();
        d.watch(std::process::id(), mine.clone());
        d.watch(dead_pid(), theirs.clone());
        d.watch(dead_pid(), removed);
        assert_eq!(d.check(), 1);
        assert!(mine.exists() && !theirs.exists());
        assert_eq!(d.watched.len(), 1, "the living one is still watched");
        std::fs::remove_file(&mine).unwrap();
        assert_eq!(d.check(), 0);
        assert!(d.watched.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
