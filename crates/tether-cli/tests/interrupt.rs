//! Nothing left behind: every long command, interrupted at a random
//! moment by SIGINT or SIGTERM, exits at once and leaves no file, no
//! directory and no process; one killed outright (SIGKILL) leaves what
//! the next command removes; an application killed outright leaves a
//! region its engine removes, while it runs or at its next start.
//!
//! The moments are drawn from a seed printed first (`TETHER_TEST_SEED`
//! replays one). Each command runs with a temporary directory of its own
//! and a mark in its environment, which its children inherit: a process
//! still carrying the mark afterwards is one it left running.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MARK: &str = "TETHER_TEST_INTERRUPT_MARK";

/// A small deterministic generator (splitmix64): the moments to strike.
struct Moments(u64);

impl Moments {
    fn from_env() -> Self {
        let seed = std::env::var("TETHER_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        println!("interrupt moments: TETHER_TEST_SEED={seed}");
        Moments(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A moment between `lo` and `hi`.
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        lo + Duration::from_nanos(self.next() % (hi - lo).as_nanos() as u64)
    }
}

/// A private temporary directory for one run.
fn private_tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tether-interrupt-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tether(args: &[&str], tmp: &Path, mark: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tether"));
    c.args(args).env("TMPDIR", tmp).env(MARK, mark).stdin(Stdio::null());
    c
}

/// Processes whose environment carries `mark`.
fn marked(mark: &str) -> Vec<u32> {
    let want = format!("{MARK}={mark}");
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()))
        })
        .collect()
}

/// Wait up to `limit` for `child` to exit.
fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a run of `pid` left: files in its temporary directory, entries
/// named for it in /dev/shm, processes carrying its mark (given a moment
/// to go: an engine whose owner is gone stops within a tenth of a second).
fn leftovers(pid: u32, tmp: &Path, mark: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !marked(mark).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut left: Vec<String> = marked(mark).iter().map(|p| format!("process {p}")).collect();
    for e in std::fs::read_dir(tmp).unwrap().filter_map(Result::ok) {
        left.push(e.path().display().to_string());
    }
    if let Ok(shm) = std::fs::read_dir("/dev/shm") {
        let named = format!("-{pid}");
        for e in shm.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(&named) {
                left.push(e.path().display().to_string());
            }
        }
    }
    left
}

/// Interrupt `args` with `signal` after `after`; it must exit within ten
/// seconds, with 0 (it finished first) or 128 + the signal, and leave
/// nothing.
fn interrupt(args: &[&str], signal: i32, after: Duration, n: usize) {
    let name = format!("{}-{n}", args.join("-").replace("--", ""));
    let tmp = private_tmp(&name);
    let mark = format!("{}-{name}", std::process::id());
    let mut child = tether(args, &tmp, &mark).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    // Drained as it comes: a full pipe would stall the command.
    let mut stderr = child.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
        err
    });
    std::thread::sleep(after);
    // SAFETY: a signal to the child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = wait_for(&mut child, Duration::from_secs(10));
    let Some(status) = status else {
        let _ = child.kill();
        panic!("tether {} did not exit within 10 s of signal {signal} sent after {after:?}", args.join(" "));
    };
    let err = drain.join().unwrap();
    // Finished first; or interrupted; or struck before it could take
    // signals at all (nothing made yet: the check below holds it to that).
    use std::os::unix::process::ExitStatusExt;
    let code = status.code();
    assert!(
        code == Some(0) || code == Some(128 + signal) || status.signal() == Some(signal),
        "tether {} after {after:?} and signal {signal}: exit {status}; stderr: {err}",
        args.join(" ")
    );
    let left = leftovers(child.id(), &tmp, &mark);
    assert!(
        left.is_empty(),
        "tether {} interrupted by signal {signal} after {after:?} left {left:?}; stderr: {err}",
        args.join(" ")
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Every long command, twice each (SIGINT, then SIGTERM), at random
/// moments between its start and past its busiest part.
#[test]
fn interrupted_commands_leave_nothing() {
    let mut moments = Moments::from_env();
    let commands: &[&[&str]] = &[
        &["demo", "--engine"],
        &["demo", "--rpc"],
        &["demo", "--cluster"],
        &["demo"],
        &["bench", "engine", "--runs", "2"],
        &["bench", "calls", "--runs", "2"],
        &["bench", "contention", "--external", "--runs", "2"],
        &["sim", "--mix", "engine_kill", "--seeds", "50"],
        &["stream", "--listen", "127.0.0.1:0", "--peer", "127.0.0.1:9"],
    ];
    let mut n = 0;
    for args in commands {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            let after = moments.between(Duration::from_millis(50), Duration::from_millis(2500));
            interrupt(args, signal, after, n);
            n += 1;
        }
    }
}

/// A run killed outright leaves its directories (and its engines see it
/// go and stop); the next command removes what it left.
#[test]
fn what_a_killed_run_left_goes_with_the_next_command() {
    let mut moments = Moments::from_env();
    let tmp = private_tmp("killed");
    let mark = format!("{}-killed", std::process::id());
    let mut child = tether(&["demo", "--engine"], &tmp, &mark)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(moments.between(Duration::from_millis(300), Duration::from_millis(1500)));
    child.kill().unwrap();
    child.wait().unwrap();
    let pid = child.id();
    // The next command: an engine, stopped once it serves.
    let next_dir = tmp.join("next-engine");
    let mut next =
        tether(&["engine", "--dir", next_dir.to_str().unwrap(), "--bind", "127.0.0.1:0"], &tmp, &mark)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let mut line = String::new();
    BufReader::new(next.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("tether engine: pid"), "{line}");
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(next.id() as i32, libc::SIGTERM) };
    let status = wait_for(&mut next, Duration::from_secs(10)).expect("the engine stops on SIGTERM");
    assert_eq!(status.code(), Some(0), "the engine's exit");
    let left = leftovers(pid, &tmp, &mark);
    assert!(left.is_empty(), "a killed `tether demo --engine` left {left:?} after the next command");
    std::fs::remove_dir_all(&tmp).unwrap();
}
