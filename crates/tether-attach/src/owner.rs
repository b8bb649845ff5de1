//! Whose a region is, read from its file name, and whether that process
//! still lives.
//!
//! An application removes its region when it detaches, and a command its
//! scratch files when it exits or is interrupted; a process killed
//! outright (SIGKILL, the OOM killer) runs no destructor. What it left is
//! found by name, its owner checked against the kernel, and reclaimed by
//! the next engine that starts in the directory, or by the engine that
//! sees the application's connection close (docs/ENGINE.md, "Nothing left
//! behind").

use std::path::Path;
use std::sync::{RwLock, RwLockWriteGuard};

use tether_proto::NodeId;

/// Held for writing by a run that is closing (`close_run`); every
/// directory made through [`make_dir`] takes it for reading first.
static CLOSING: RwLock<()> = RwLock::new(());

/// Make `dir` and its parents (0700), unless this process's run is
/// closing: then wait, for ever, since the process is about to exit. An
/// interrupted command removes its run directory while its other threads
/// still run; one that made a directory after the removal left the run
/// directory behind (`tether sim --mix engine_kill` under SIGTERM did).
pub fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let _open = CLOSING.read().unwrap_or_else(|p| p.into_inner());
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Close this process's run: no directory is made through [`make_dir`]
/// while the guard is held. For a process about to remove what it made
/// and exit.
pub fn close_run() -> RwLockWriteGuard<'static, ()> {
    CLOSING.write().unwrap_or_else(|p| p.into_inner())
}

/// The name of the `n`-th region that process `pid` made for `node`.
pub fn region_name(node: NodeId, pid: u32, n: u64) -> String {
    format!("client-{node}-{pid}-{n}.shm")
}

/// The node and owning process a region's file name gives, if it is a
/// client region's name at all.
pub fn region_owner(name: &str) -> Option<(NodeId, u32)> {
    let mut parts = name.strip_prefix("client-")?.strip_suffix(".shm")?.split('-');
    let node = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next().is_none().then_some((node, pid))
}

/// The name of the directory in which a tether command (or a simulator
/// run) keeps what it makes while it runs, `tether-run-PID`: removed when
/// it exits or is interrupted, and by the next command if it was killed.
pub fn run_dir_name(pid: u32) -> String {
    format!("tether-run-{pid}")
}

/// The process a run directory's name gives.
pub fn run_dir_owner(name: &str) -> Option<u32> {
    name.strip_prefix("tether-run-")?.parse().ok()
}

/// Does process `pid` still run? A zombie (dead, not yet reaped by its
/// parent) does not: it will never touch its files again.
pub fn alive(pid: u32) -> bool {
    let Ok(pid_t) = i32::try_from(pid) else { return false };
    if pid_t <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only asks whether `pid` exists.
    let exists = unsafe { libc::kill(pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // "pid (comm) S ...": the state follows the last ')' (a command name
    // may hold one).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_name_gives_back_its_owner() {
        assert_eq!(region_owner(&region_name(7, 4242, 3)), Some((7, 4242)));
        for bad in ["client-7-4242.shm", "client-7-x-1.shm", "pair-1-2-3.shm", "client-7-1-2-3.shm", ""] {
            assert_eq!(region_owner(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_run_directory_name_gives_back_its_owner() {
        assert_eq!(run_dir_owner(&run_dir_name(99)), Some(99));
        assert_eq!(run_dir_owner("tether-run-x"), None);
        assert_eq!(run_dir_owner("tether-1000"), None);
    }

    #[test]
    fn this_process_lives_and_a_reaped_child_does_not() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid));
        assert!(!alive(0));
    }

    #[test]
    fn a_zombie_is_gone() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped: a zombie once it exits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive(pid), "an exited, unreaped child still counts as alive");
        drop(child);
    }
}
