//! What a command makes while it runs, and how none of it outlives the
//! command: not when it finishes, not when it is interrupted, not when it
//! is killed outright.
//!
//! Engine directories with their regions, call logs, name stores, child
//! processes (engines, bank servers) and network namespaces are each
//! registered here when made and forgotten when removed. Three ways out:
//!
//! - **it finishes**: each thing goes with its owner's destructor, and
//!   [`clean_up`] removes the run's directories at the end of `main`;
//! - **SIGINT, SIGTERM or SIGHUP** ([`handle_interrupts`]): a thread of
//!   its own stops the children, deletes the namespaces and removes the
//!   directories, then exits with 128 + the signal, as a shell expects;
//! - **SIGKILL**, which runs nothing: every directory a run makes lies in
//!   one of its own, `tether-run-PID` (in `/dev/shm` and in the temporary
//!   directory), and its namespaces are named for its pid, so the next
//!   command finds those whose process is gone and removes them
//!   ([`reclaim`]). Its children see their owner go ([`watch_owner`]) and
//!   stop themselves.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tether_engine::owner;

/// The environment variable a command's children find their owner's pid
/// in ([`watch_owner`]).
pub const OWNER_VAR: &str = "TETHER_RUN_OWNER";

/// Where a scratch directory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// `/dev/shm` (the temporary directory where there is none): engines'
    /// directories, whose regions are shared memory.
    Shm,
    /// The temporary directory (`TMPDIR`, else `/tmp`): files that need
    /// not be in memory (call logs, name stores).
    Tmp,
}

impl Base {
    fn path(self) -> PathBuf {
        match self {
            Base::Shm if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            _ => std::env::temp_dir(),
        }
    }
}

/// The prefix of every namespace a run makes (`tether-PURPOSE-PID-SIDE`).
const NAMESPACE_PREFIX: &str = "tether-";

/// What this process has made and not yet removed.
#[derive(Default)]
struct Made {
    children: Vec<u32>,
    namespaces: Vec<String>,
}

static MADE: Mutex<Made> = Mutex::new(Made { children: Vec::new(), namespaces: Vec::new() });

fn made() -> MutexGuard<'static, Made> {
    // A thread that panicked holding it left the lists whole.
    MADE.lock().unwrap_or_else(|p| p.into_inner())
}

/// This run's own directory in `base`.
pub fn run_root(base: Base) -> PathBuf {
    base.path().join(owner::run_dir_name(std::process::id()))
}

/// A directory of this run's, removed with everything in it on drop, on
/// interruption, or (after SIGKILL) by the next command.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Make `name` (fresh: anything there is removed first) in this run's
    /// directory in `base`.
    pub fn new(base: Base, name: &str) -> std::io::Result<Scratch> {
        // Under the lock, so no other scratch's drop removes the run's
        // directory between its making and this one's.
        let _m = made();
        let path = run_root(base).join(name);
        let _ = std::fs::remove_dir_all(&path);
        owner::make_dir(&path)?;
        Ok(Scratch { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _m = made();
        let _ = std::fs::remove_dir_all(&self.path);
        // The run's own directory goes with its last scratch.
        if let Some(root) = self.path.parent() {
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// A child this run started: stopped on interruption. Forget it with
/// [`child_gone`] once it is reaped.
pub fn child_started(pid: u32) {
    made().children.push(pid);
}

/// A child of this run reaped: forgotten, and its run directories removed.
pub fn child_gone(pid: u32) {
    made().children.retain(|&p| p != pid);
    remove_run_of(pid);
}

/// Remove the run directories a reaped child left (one killed outright
/// runs nothing: a demo's bank servers, a bench's engines). Left to the
/// next command, they outlived an interrupted demo that had just killed
/// a server and not yet started its successor.
fn remove_run_of(pid: u32) {
    for base in [Base::Shm, Base::Tmp] {
        let _ = std::fs::remove_dir_all(base.path().join(owner::run_dir_name(pid)));
    }
}

/// Tell a child command whose it is, so it stops when its owner is gone.
pub fn owned_by_this_run(cmd: &mut Command) -> &mut Command {
    cmd.env(OWNER_VAR, std::process::id().to_string())
}

/// A network namespace this run made: deleted on interruption.
pub fn namespace_made(name: &str) {
    made().namespaces.push(name.to_string());
}

pub fn namespace_gone(name: &str) {
    made().namespaces.retain(|n| n != name);
}

/// Stop every child (SIGTERM, then SIGKILL after two seconds), delete
/// every namespace and remove this run's directories, and any its
/// children left, with everything in them.
pub fn clean_up() {
    let mut m = made();
    for &pid in &m.children {
        // SAFETY: a signal to a child this process started and has not
        // reaped (it is forgotten once reaped), so the pid is still its.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    for &pid in &m.children {
        loop {
            let mut status = 0;
            // SAFETY: reaps our own child; `status` is valid for writes.
            let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
            if r != 0 {
                break; // reaped, or not ours to reap any more
            }
            if Instant::now() >= deadline {
                // SAFETY: as above; it did not stop when asked.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                // SAFETY: as above.
                unsafe { libc::waitpid(pid as i32, &mut status, 0) };
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // A child stopped before it could take the signal (still starting:
    // the default action ends it on the spot) leaves its own run's
    // directories; reaped, it is gone, and they are ours to remove.
    for pid in m.children.drain(..) {
        remove_run_of(pid);
    }
    for n in m.namespaces.drain(..) {
        let _ = Command::new("ip").args(["netns", "del", &n]).output();
    }
    for base in [Base::Shm, Base::Tmp] {
        let _ = std::fs::remove_dir_all(run_root(base));
    }
}

/// [`clean_up`] and exit with `code`, no directory of this run made
/// meanwhile by the threads still running (`owner::make_dir` waits).
pub fn clean_up_and_exit(code: i32) -> ! {
    let _closed = owner::close_run();
    clean_up();
    std::process::exit(code)
}

/// The names of the signals [`handle_interrupts`] takes.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// On SIGINT, SIGTERM or SIGHUP: [`clean_up`], then exit with 128 + the
/// signal. A thread of its own waits for them (signal-hook), so the clean-up
/// runs outside any signal handler.
pub fn handle_interrupts() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new().name("interrupts".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            // A child (a bank server) is interrupted with its owner, who
            // says so once.
            if std::env::var_os(OWNER_VAR).is_none() {
                eprintln!("tether: interrupted ({}): removing what this run made", signal_name(signal));
            }
            clean_up_and_exit(128 + signal);
        }
    })?;
    Ok(())
}

/// If this process was started by another tether command (`OWNER_VAR`),
/// call `on_gone` once that command is gone: killed outright, it could
/// not stop this one. The owner is the parent, so its death shows as a
/// new parent; the watching thread only asks the kernel and sleeps, never
/// allocating or locking, so an engine's supervisor may still fork beside
/// it.
pub fn watch_owner(on_gone: impl FnOnce() + Send + 'static) {
    let Some(pid) = std::env::var(OWNER_VAR).ok().and_then(|v| v.parse::<u32>().ok()) else { return };
    let parent = || {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() as u32 }
    };
    if parent() != pid && owner::alive(pid) {
        // Not this process's owner: the variable came from further up.
        return;
    }
    let _ = std::thread::Builder::new().name("owner".into()).spawn(move || {
        while parent() == pid {
            std::thread::sleep(Duration::from_millis(100));
        }
        on_gone();
    });
}

/// What [`reclaim`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub dirs: Vec<PathBuf>,
    pub namespaces: Vec<String>,
}

/// Remove what runs that are gone left: their directories in `/dev/shm`
/// and the temporary directory, and (as root) their network namespaces.
pub fn reclaim() -> Reclaimed {
    let mut done = Reclaimed::default();
    let mut bases = vec![Base::Shm.path(), Base::Tmp.path()];
    bases.dedup();
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else { continue };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(owner::run_dir_owner) else { continue };
            if !owner::alive(pid) && std::fs::remove_dir_all(e.path()).is_ok() {
                done.dirs.push(e.path());
            }
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                let dead = namespace_owner(name).is_some_and(|pid| !owner::alive(pid));
                if dead
                    && Command::new("ip")
                        .args(["netns", "del", name])
                        .output()
                        .is_ok_and(|o| o.status.success())
                {
                    done.namespaces.push(name.to_string());
                }
            }
        }
    }
    done
}

/// The pid a run's namespace is named for (`tether-PURPOSE-PID-a` or `-b`).
fn namespace_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAMESPACE_PREFIX)?;
    let rest = rest.strip_suffix("-a").or_else(|| rest.strip_suffix("-b"))?;
    rest.rsplit_once('-')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_give_their_owner() {
        assert_eq!(namespace_owner("tether-campaign-4242-a"), Some(4242));
        assert_eq!(namespace_owner("tether-congestion-7-b"), Some(7));
        for other in ["tether-campaign-4242-c", "other-campaign-1-a", "tether-a", "tether-x-y-a"] {
            assert_eq!(namespace_owner(other), None, "{other}");
        }
    }

    #[test]
    fn a_scratch_directory_goes_with_its_guard_and_a_dead_runs_with_the_next_reclaim() {
        let s = Scratch::new(Base::Tmp, "test-guard").unwrap();
        std::fs::write(s.path().join("f"), b"x").unwrap();
        let path = s.path().to_owned();
        drop(s);
        assert!(!path.exists());
        // A run killed outright: its directory, named for a pid now free.
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let left = Base::Tmp.path().join(owner::run_dir_name(dead));
        std::fs::create_dir_all(left.join("engine")).unwrap();
        let mine = Scratch::new(Base::Tmp, "test-kept").unwrap();
        let done = reclaim();
        assert!(done.dirs.contains(&left), "{done:?}");
        assert!(!left.exists());
        assert!(mine.path().exists(), "a living run's directory is kept");
    }
}
