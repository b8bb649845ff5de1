//! The supervisor (Zhou et al. [FTGM] section 3: the fault-tolerance
//! daemon and the watchdog; docs/ENGINE.md): it binds the engine's sockets
//! once, runs the engine in a child process, and replaces it when it dies
//! or hangs.
//!
//! - Death is seen at once: the supervisor is the parent (`waitpid`).
//! - A hang is the heartbeat standing still while the engine is not asleep,
//!   or an engine asleep past the moment it meant to wake, for longer than
//!   `hang_after` - and the engine not merely waiting for a CPU. On a host
//!   the engine shares its cores (the paper's watchdog runs on a card of
//!   its own), so a still heartbeat is judged by the kernel's account of
//!   the engine (`/proc/PID/stat`, `/proc/PID/schedstat`): stopped, or
//!   blocked while it says it is awake, is a hang at once; runnable is a
//!   hang only once it has had `hang_after / 4` of CPU time since it went
//!   still without making a turn (a turn takes microseconds), so a busy
//!   machine delays the verdict instead of replacing healthy engines. The
//!   hung engine is fenced (SIGKILL, then waited for) before a new one
//!   starts, so two engines never serve the same regions.
//! - The sockets outlive every engine: datagrams and attachments that
//!   arrive while one is replaced wait in them for the next. Applications
//!   see their connection close and resume with the new engine from their
//!   backups (`Client`, "Restore" in docs/ENGINE.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tether_shm::Region;

use crate::engine::{Engine, EngineOptions, EngineSockets};
use crate::heartbeat::Heartbeat;
use tether_attach::monotonic_ns;
use tether_attach::EngineError;

/// How the supervisor watches.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// A heartbeat still for this long (awake), or a sleep this far past
    /// its wake-up time, is a hang.
    pub hang_after: Duration,
    /// How often the supervisor looks.
    pub every: Duration,
}

impl Default for Watch {
    fn default() -> Self {
        Watch { hang_after: Duration::from_millis(5), every: Duration::from_micros(250) }
    }
}

/// What happened to an engine, as the supervisor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incident {
    /// The sockets are bound (once, for every engine to come).
    Serving { rails: Vec<std::net::SocketAddr> },
    /// An engine started.
    Started { pid: u32 },
    /// It exited or was killed; `status` says how.
    Died { pid: u32, status: String },
    /// Its heartbeat stood still for `still` (and it was not asleep).
    Hung { pid: u32, still: Duration },
    /// A hung engine killed and waited for: it can touch nothing more.
    Fenced { pid: u32 },
    /// A new engine took over, `after` the incident was detected.
    Replaced { old: u32, new: u32, after: Duration },
}

/// How long a new engine is watched with more patience.
const STARTUP: Duration = Duration::from_millis(50);

/// The file the heartbeat lives in, in the engine's directory.
pub const HEARTBEAT_FILE: &str = "engine.heartbeat";

/// Supervise engines for `options` until `stop` is set: each incident is
/// reported as it happens. Call from a single-threaded process (it forks).
pub fn supervise(
    options: EngineOptions,
    watch: Watch,
    stop: &AtomicBool,
    mut report: impl FnMut(&Incident),
) -> Result<(), EngineError> {
    let sockets = EngineSockets::bind(&options)?;
    report(&Incident::Serving { rails: sockets.rail_addrs() });
    let heartbeat =
        Heartbeat::new(Arc::new(Region::create(&options.dir.join(HEARTBEAT_FILE), Heartbeat::LEN)?));
    let mut replacing: Option<(u32, Instant)> = None;
    let mut replaced = 0;
    let result = loop {
        // An idle engine sleeps at most half the threshold: a hang while
        // it sleeps (a SIGSTOP) shows once the sleep should have ended, so
        // it is still seen within 1.5 thresholds. (Unset, the bound was
        // 0, and an idle engine woke every 100 us and spun: a whole core.)
        heartbeat.reset(watch.hang_after / 2);
        let pid = spawn(&options, &sockets, &heartbeat, replaced)?;
        match replacing.take() {
            Some((old, since)) => report(&Incident::Replaced { old, new: pid, after: since.elapsed() }),
            None => report(&Incident::Started { pid }),
        }
        let outcome = watch_over(pid, &heartbeat, watch, stop);
        // Killed while making its board, an engine leaves the board's
        // staging file; it is gone now, so nobody else will.
        let board = options.dir.join(tether_attach::stat::ENGINE_BOARD);
        let _ = std::fs::remove_file(tether_shm::BoardWriter::staging_path(&board, pid));
        match outcome {
            Outcome::Stopped => break Ok(()),
            Outcome::Died(status) => report(&Incident::Died { pid, status }),
            Outcome::Hung(still) => {
                report(&Incident::Hung { pid, still });
                fence(pid);
                report(&Incident::Fenced { pid });
            }
        }
        replacing = Some((pid, Instant::now()));
        replaced += 1;
    };
    let _ = std::fs::remove_file(tether_attach::attach::socket_path(&options.dir));
    let _ = std::fs::remove_file(options.dir.join(HEARTBEAT_FILE));
    let _ = std::fs::remove_file(options.dir.join(tether_attach::stat::ENGINE_BOARD));
    result
}

/// Start an engine in a child process over the supervisor's sockets.
fn spawn(
    options: &EngineOptions,
    sockets: &EngineSockets,
    heartbeat: &Heartbeat,
    replaced_before: u64,
) -> Result<u32, EngineError> {
    // SAFETY: the caller is single-threaded (see `supervise`), so the child
    // is a whole copy of it; the child never returns from this branch.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        // The engine does not outlive its supervisor: nobody would replace
        // it, and nobody could stop it but by its pid.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        // SAFETY: the child's own copy of the sockets (the fork duplicated
        // the descriptors); the parent's copy is never used in the child,
        // and the child exits without unwinding, so nothing drops twice.
        let sockets = unsafe { std::ptr::read(sockets) };
        let run =
            Engine::with_sockets(options.clone(), sockets, Some(heartbeat.clone())).and_then(|mut engine| {
                engine.set_replaced_before(replaced_before);
                engine.run()
            });
        let code = match run {
            Ok(()) => 0,
            Err(e @ EngineError::SelfTest(_)) => {
                tracing::error!(error = %e, "engine failed its self-test");
                SELFTEST_EXIT
            }
            Err(e) => {
                tracing::error!(error = %e, "engine failed");
                1
            }
        };
        // SAFETY: ends the child at once, as it must after fork.
        unsafe { libc::_exit(code) };
    }
    Ok(pid as u32)
}

enum Outcome {
    Stopped,
    Died(String),
    Hung(Duration),
}

/// Whether an engine whose heartbeat stood still for `still` is late, at
/// `now_ns`: awake (`asleep_until` 0), it is once `patience` passed; asleep,
/// once `patience` passed its declared wake-up. The word is the engine's
/// to write, and an engine gone wrong may write anything: a wake-up
/// further off than it may sleep (`max_sleep`) is no promise, and it is
/// judged as awake (before, a word near the end of the numbers overflowed
/// the sum: a panic with overflow checks, a wrong judgment without).
fn is_late(asleep_until: u64, now_ns: u64, still: Duration, patience: Duration, max_sleep: Duration) -> bool {
    let patience_ns = patience.as_nanos().min(u64::MAX as u128) as u64;
    let furthest = now_ns.saturating_add(max_sleep.as_nanos().min(u64::MAX as u128) as u64);
    if asleep_until == 0 || asleep_until > furthest.saturating_add(patience_ns) {
        still > patience
    } else {
        now_ns > asleep_until.saturating_add(patience_ns)
    }
}

/// Watch the engine `pid` until it dies, hangs, or the supervisor stops.
fn watch_over(pid: u32, heartbeat: &Heartbeat, watch: Watch, stop: &AtomicBool) -> Outcome {
    let started = Instant::now();
    let (mut beats, mut since) = (heartbeat.beats(), started);
    let mut first_late: Option<Scheduling> = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            fence(pid);
            return Outcome::Stopped;
        }
        std::thread::sleep(watch.every);
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        if unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } == pid as i32 {
            return Outcome::Died(describe(status));
        }
        let now = heartbeat.beats();
        if now != beats {
            (beats, since, first_late) = (now, Instant::now(), None);
            continue;
        }
        // A new engine starting, perhaps taking over many applications on a
        // loaded machine, is given four times as long for its first
        // STARTUP: a false hang would only start another to do the same.
        let patience = if started.elapsed() < STARTUP { 4 * watch.hang_after } else { watch.hang_after };
        let late = is_late(
            heartbeat.asleep_until(),
            monotonic_ns(),
            since.elapsed(),
            patience,
            heartbeat.max_sleep(),
        );
        // Where the engine stood when it was first seen late: CPU time
        // from then on, without a turn, is what convicts a runnable one.
        if !late {
            first_late = None;
            continue;
        }
        let now_seen = Scheduling::of(pid);
        let at = *first_late.get_or_insert(now_seen);
        if is_hang(at, now_seen, watch.hang_after) {
            return Outcome::Hung(since.elapsed());
        }
    }
}

/// What the kernel says of a process: its state letter and whether it is
/// already dying (`/proc/PID/stat`, `/proc/PID/status`), the CPU time it
/// has had (`/proc/PID/schedstat`), if readable, and when this was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scheduling {
    state: Option<u8>,
    cpu_ns: Option<u64>,
    /// Exiting (`PF_EXITING`) or with SIGKILL pending: `waitpid` will
    /// report a death, which is what happened.
    dying: bool,
    at_ns: u64,
}

/// `PF_EXITING` in `/proc/PID/stat`'s flags: the process is exiting.
const PF_EXITING: u64 = 0x4;

impl Scheduling {
    fn of(pid: u32) -> Self {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        // "PID (COMM) S PPID PGRP SESSION TTY TPGID FLAGS ...": COMM may hold
        // spaces and parentheses, the state follows the last ')'.
        let fields: Vec<&str> = stat
            .as_deref()
            .and_then(|s| s.rsplit_once(')'))
            .map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
        let state = fields.first().and_then(|f| f.bytes().next());
        let exiting = fields.get(6).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_EXITING != 0);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kill_pending = status
            .lines()
            .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
            .any(|mask| mask & (1 << (libc::SIGKILL - 1)) != 0);
        let sched = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok();
        let cpu_ns = sched.as_deref().and_then(|s| s.split_whitespace().next()?.parse().ok());
        Scheduling { state, cpu_ns, dying: exiting || kill_pending, at_ns: monotonic_ns() }
    }
}

/// A late engine is hung unless it is only waiting for a CPU or already
/// dying. Stopped (SIGSTOP, a debugger) is a hang; runnable is one once it
/// has had a quarter of `hang_after` of CPU time since first seen late
/// without a turn; blocked (where it never blocks while awake) is one once
/// it has stayed blocked that long, so a page fault caught in the act is
/// not. Dying or dead is left for `waitpid` to report as a death. Without
/// the kernel's account (no /proc), late is hung, as on a dedicated card.
fn is_hang(first_late: Scheduling, now: Scheduling, hang_after: Duration) -> bool {
    let quarter = hang_after.as_nanos() as u64 / 4;
    let ran = match (first_late.cpu_ns, now.cpu_ns) {
        (Some(then), Some(cpu)) => Some(cpu.saturating_sub(then)),
        _ => None,
    };
    if now.dying {
        return false;
    }
    match now.state {
        Some(b'T' | b't') => true,
        Some(b'Z' | b'X') => false,
        Some(b'R') => ran.is_none_or(|ran| ran >= quarter),
        Some(_) => {
            let blocked_since = first_late.state.is_some_and(|s| s != b'R');
            blocked_since && now.at_ns.saturating_sub(first_late.at_ns) >= quarter
        }
        None => true,
    }
}

/// Kill `pid` and wait until it is gone: only then may another engine map
/// what it mapped.
fn fence(pid: u32) {
    // SAFETY: our own child; SIGKILL cannot be caught, the wait reaps it.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid as i32, &mut status, 0);
    }
}

/// The exit status of an engine that failed its self-test.
const SELFTEST_EXIT: i32 = 3;

fn describe(status: i32) -> String {
    if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else if libc::WEXITSTATUS(status) == SELFTEST_EXIT {
        "failed its self-test (exit status 3)".into()
    } else {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HANG: Duration = Duration::from_millis(4);

    fn seen(state: u8, cpu_ms: u64) -> Scheduling {
        Scheduling { state: Some(state), cpu_ns: Some(cpu_ms * 1_000_000), dying: false, at_ns: 0 }
    }

    fn later(s: Scheduling, ms: u64) -> Scheduling {
        Scheduling { at_ns: s.at_ns + ms * 1_000_000, ..s }
    }

    #[test]
    fn a_late_engine_waiting_for_a_cpu_is_not_hung_until_it_has_had_one() {
        // Runnable, and 0.5 ms of CPU since it went late: starved, not hung.
        assert!(!is_hang(seen(b'R', 10), Scheduling { cpu_ns: Some(10_500_000), ..seen(b'R', 0) }, HANG));
        // A whole quarter of the threshold on a CPU without a turn: hung.
        assert!(is_hang(seen(b'R', 10), seen(b'R', 11), HANG));
    }

    #[test]
    fn stopped_blocked_or_unknown_late_engines_are_hung() {
        assert!(is_hang(seen(b'R', 10), seen(b'T', 10), HANG), "SIGSTOP");
        assert!(is_hang(seen(b'R', 10), seen(b't', 10), HANG), "a debugger");
        let unknown = Scheduling { state: None, cpu_ns: None, dying: false, at_ns: 0 };
        assert!(is_hang(unknown, unknown, HANG), "no /proc: late is hung");
        // Blocked while it says it is awake: hung once it stays blocked.
        assert!(!is_hang(seen(b'D', 10), seen(b'D', 10), HANG), "a page fault caught in the act");
        assert!(!is_hang(seen(b'R', 10), later(seen(b'D', 10), 5), HANG), "runnable when first seen late");
        assert!(is_hang(seen(b'D', 10), later(seen(b'D', 10), 1), HANG));
        assert!(is_hang(seen(b'S', 10), later(seen(b'S', 10), 2), HANG));
    }

    #[test]
    fn lateness_is_judged_from_the_heartbeat_whatever_its_words_say() {
        let ms = Duration::from_millis;
        let (patience, max_sleep) = (ms(5), ms(100));
        let now = 10_000_000_000;
        // Awake: late once the heartbeat stood still past the patience.
        assert!(!is_late(0, now, ms(4), patience, max_sleep));
        assert!(is_late(0, now, ms(6), patience, max_sleep));
        // Asleep until a moment within reach: late only past it and the patience.
        let wake = now + 50_000_000;
        assert!(!is_late(wake, now, ms(60), patience, max_sleep));
        assert!(is_late(wake, wake + 6_000_000, ms(60), patience, max_sleep));
        // A wake-up past what the engine may sleep, up to the end of the
        // numbers: no promise, judged as awake (and no overflow).
        for corrupt in [now + 10_000_000_000, u64::MAX - 1, u64::MAX] {
            assert!(is_late(corrupt, now, ms(6), patience, max_sleep), "{corrupt}");
            assert!(!is_late(corrupt, now, ms(4), patience, max_sleep), "{corrupt}");
        }
    }

    #[test]
    fn dying_engines_are_left_to_be_reported_dead() {
        assert!(!is_hang(seen(b'R', 10), seen(b'Z', 10), HANG), "a zombie");
        let dying = Scheduling { dying: true, ..seen(b'R', 20) };
        assert!(!is_hang(seen(b'R', 10), dying, HANG), "killed, still exiting");
    }

    #[test]
    fn the_kernel_account_of_a_process_is_read() {
        let me = Scheduling::of(std::process::id());
        assert!(me.state.is_some() && me.cpu_ns.is_some_and(|ns| ns > 0), "{me:?}");
        assert_eq!(Scheduling::of(u32::MAX).state, None);
        let mut child = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Scheduling::of(child.id()).state != Some(b'T') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stopped = Scheduling::of(child.id());
        assert_eq!(stopped.state, Some(b'T'), "a stopped process reads as stopped");
        assert!(!stopped.dying);
        // SIGKILL to a stopped process: pending or exiting until reaped.
        child.kill().unwrap();
        let killed = Scheduling::of(child.id());
        child.wait().unwrap();
        assert!(killed.dying || killed.state == Some(b'Z'), "{killed:?}");
    }
}
