//! A `tether engine` process started by another tether command (the
//! engine benchmark, the engine demo): this same executable, run as
//! `tether engine`, with its supervisor's timeline read line by line and
//! stamped with the moment it arrived, and the pid of the engine serving
//! now kept current from it (docs/ENGINE.md, "The supervisor").

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tether::NodeId;
use tether_engine::{Client, ClientOptions};

use crate::scratch::{self, Base, Scratch};

/// One `tether engine` (its supervisor, and the engine it runs).
pub struct EngineProcess {
    child: Child,
    /// The engine's directory, this run's scratch: removed when the
    /// engine is stopped, or by the run's clean-up if it is interrupted.
    dir: Scratch,
    pub rails: Vec<SocketAddr>,
    /// The engine serving now (the supervisor's child).
    engine: Arc<AtomicU32>,
    /// The supervisor's lines after the first, each with when it arrived.
    timeline: Receiver<(Instant, String)>,
}

/// What a `tether engine` line says happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Died,
    /// How long the heartbeat had been still.
    Hung {
        still_ms: f64,
    },
    Fenced,
    Replaced {
        old: u32,
        new: u32,
    },
    Other,
}

impl Line {
    /// The engine a timeline line is about ("... ms engine PID ..."): for
    /// `died:` and `hung:`, the engine that failed.
    pub fn engine(line: &str) -> Option<u32> {
        line.split_whitespace().nth(3)?.parse().ok()
    }

    pub fn parse(line: &str) -> Line {
        let words: Vec<&str> = line.split_whitespace().collect();
        // "   507.993 ms engine 18964 replaced 18958, 0.184 ms after ..."
        match words.get(4).copied() {
            Some("died:") => Line::Died,
            Some("hung:") => {
                Line::Hung { still_ms: words.get(8).and_then(|w| w.parse().ok()).unwrap_or(f64::NAN) }
            }
            Some("fenced") => Line::Fenced,
            Some("replaced") => {
                let pid = |w: Option<&&str>| w.and_then(|w| w.trim_end_matches(',').parse().ok());
                match (pid(words.get(5)), pid(words.get(3))) {
                    (Some(old), Some(new)) => Line::Replaced { old, new },
                    _ => Line::Other,
                }
            }
            _ => Line::Other,
        }
    }
}

impl EngineProcess {
    /// Start a supervised `tether engine` serving a fresh directory `name`
    /// of this run's (in `/dev/shm`) on `binds` (one rail each), with
    /// `extra` arguments, and wait for it to serve.
    pub fn start(name: &str, binds: &[SocketAddr], extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_in(None, name, binds, extra)
    }

    /// `start`, in the network namespace `ns` if one is given (through
    /// `ip netns exec`, which execs the command itself, so the child is
    /// still the supervisor and SIGTERM still reaches it).
    pub fn start_in(
        ns: Option<&str>,
        name: &str,
        binds: &[SocketAddr],
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let dir = Scratch::new(Base::Shm, name)?;
        let exe = std::env::current_exe()?;
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.arg("engine").arg("--dir").arg(dir.path()).args(extra);
        scratch::owned_by_this_run(&mut cmd);
        for b in binds {
            cmd.args(["--bind", &b.to_string()]);
        }
        let mut child = cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?;
        scratch::child_started(child.id());
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut first = String::new();
        out.read_line(&mut first)?;
        // "tether engine: pid P (supervisor S) serving DIR on rails A, B"
        let parsed = (|| {
            let pid: u32 = first.split_whitespace().nth(3)?.parse().ok()?;
            let rails: Option<Vec<SocketAddr>> =
                first.split(" on rails ").nth(1)?.trim().split(", ").map(|a| a.parse().ok()).collect();
            Some((pid, rails?))
        })();
        let Some((pid, rails)) = parsed else {
            let _ = child.kill();
            let _ = child.wait();
            scratch::child_gone(child.id());
            anyhow::bail!("tether engine did not start: it said {:?}", first.trim());
        };
        let engine = Arc::new(AtomicU32::new(pid));
        let (tx, timeline) = std::sync::mpsc::channel();
        let current = engine.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Line::Replaced { new, .. } = Line::parse(&line) {
                    current.store(new, Ordering::Relaxed);
                }
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Ok(EngineProcess { child, dir, rails, engine, timeline })
    }

    /// The directory applications attach through.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The engine process serving now.
    /// The supervisor: the `tether engine` process this started.
    pub fn supervisor_pid(&self) -> u32 {
        self.child.id()
    }

    pub fn engine_pid(&self) -> u32 {
        self.engine.load(Ordering::Relaxed)
    }

    /// Send `signal` to the engine serving now.
    pub fn signal_engine(&self, signal: libc::c_int) -> anyhow::Result<u32> {
        let pid = self.engine_pid();
        // SAFETY: a signal to the engine process this command started.
        if unsafe { libc::kill(pid as i32, signal) } != 0 {
            anyhow::bail!("signal {signal} to engine {pid}: {}", std::io::Error::last_os_error());
        }
        Ok(pid)
    }

    /// The next timeline line, waiting up to `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Option<(Instant, String)> {
        self.timeline.recv_timeout(timeout).ok()
    }

    /// Wait (up to `timeout`) for the engine `old` to be replaced; every
    /// line seen on the way, with when it arrived.
    pub fn await_replacement(&self, old: u32, timeout: Duration) -> anyhow::Result<Vec<(Instant, Line)>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((at, text)) = self.next_line(left) else {
                anyhow::bail!("engine {old} was not replaced within {timeout:?} (saw {seen:?})");
            };
            let line = Line::parse(&text);
            let done = matches!(line, Line::Replaced { old: o, .. } if o == old);
            seen.push((at, line));
            if done {
                return Ok(seen);
            }
        }
    }

    /// Engines replaced in the timeline lines not yet read (reads them).
    pub fn replacements(&self) -> usize {
        let mut n = 0;
        while let Some((_, l)) = self.next_line(Duration::ZERO) {
            n += matches!(Line::parse(&l), Line::Replaced { .. }) as usize;
        }
        n
    }

    /// Attach an application to this engine as `node`.
    pub fn attach(&self, node: NodeId) -> anyhow::Result<Client> {
        self.attach_with(node, ClientOptions::default())
    }

    pub fn attach_with(&self, node: NodeId, options: ClientOptions) -> anyhow::Result<Client> {
        Ok(Client::attach(self.dir.path(), node, options)?)
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        // SIGTERM: the supervisor stops its engine and exits.
        // SAFETY: a signal to the child this command started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        scratch::child_gone(self.child.id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_lines_parse() {
        assert_eq!(Line::parse("   507.783 ms engine 18958 died: killed by signal 9"), Line::Died);
        assert_eq!(
            Line::parse("   716.542 ms engine 18964 hung: heartbeat still for 5.021 ms"),
            Line::Hung { still_ms: 5.021 }
        );
        assert_eq!(Line::parse("   716.843 ms engine 18964 fenced (killed and reaped)"), Line::Fenced);
        assert_eq!(
            Line::parse(
                "   716.980 ms engine 18969 replaced 18964, 0.119 ms after the incident was detected"
            ),
            Line::Replaced { old: 18964, new: 18969 }
        );
        assert_eq!(Line::parse("   1.000 ms engine 18969 started"), Line::Other);
        assert_eq!(Line::engine("   507.783 ms engine 18958 died: killed by signal 9"), Some(18958));
        assert_eq!(Line::engine("not a timeline line"), None);
    }
}
