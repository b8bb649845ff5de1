//! The campaign's end of an engine's fault hook: faults injected into the
//! engine's own state, the software counterpart of Zhou et al. [FTGM]
//! section 5's bit flips in the interface's memory (Table 1's internal
//! faults), for `tether campaign --engine`.
//!
//! An engine started with `--fault-hook` binds a Unix datagram socket at
//! `<dir>/fault-hook`. A request is one datagram, `"<target> <seed>"`; the
//! engine applies it at its next loop turn and answers the sender's
//! address with `"flipped <target>: <details>"` or `"none: <why>"` (nothing
//! of that kind to flip). No answer within the timeout means the engine
//! is dead, stopped or being replaced: the strike is recorded as such.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The hook's socket, in the engine's directory.
pub const SOCKET: &str = "fault-hook";

/// What the engine answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The state was changed: the engine's account of what it flipped.
    Flipped(String),
    /// Nothing of that kind to flip (e.g. no payload buffered): the engine's why.
    Nothing(String),
    /// The request went out and nothing came back in time.
    Silent,
    /// The request could not be delivered (no hook bound: no engine, or
    /// one started without `--fault-hook`).
    Unreachable(String),
    /// An answer that is neither form.
    Unexpected(String),
}

impl Reply {
    fn parse(text: &str) -> Reply {
        let text = text.trim();
        if text.starts_with("flipped ") {
            Reply::Flipped(text.to_string())
        } else if let Some(why) = text.strip_prefix("none:") {
            Reply::Nothing(why.trim().to_string())
        } else {
            Reply::Unexpected(text.to_string())
        }
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        match self {
            Reply::Flipped(t) => t.clone(),
            Reply::Nothing(why) => format!("none: {why}"),
            Reply::Silent => "no reply".into(),
            Reply::Unreachable(why) => format!("no hook: {why}"),
            Reply::Unexpected(t) => format!("unexpected reply: {t}"),
        }
    }
}

/// This side's socket: replies come back to its address.
pub struct Hook {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Hook {
    /// Bind at `path` (a stale socket left there by a killed run is removed).
    pub fn bind(path: &Path) -> std::io::Result<Hook> {
        let _ = std::fs::remove_file(path);
        let socket = UnixDatagram::bind(path)?;
        Ok(Hook { socket, path: path.to_path_buf() })
    }

    /// Ask the engine serving `engine_dir` to flip `target` with `seed`,
    /// and wait up to `timeout` for its answer.
    pub fn strike(&self, engine_dir: &Path, target: &str, seed: u64, timeout: Duration) -> Reply {
        let mut buf = [0u8; 4096];
        // A late answer to an earlier request would pass for this one's.
        let _ = self.socket.set_nonblocking(true);
        while self.socket.recv(&mut buf).is_ok() {}
        let _ = self.socket.set_nonblocking(false);
        let request = format!("{target} {seed}");
        if let Err(e) = self.socket.send_to(request.as_bytes(), engine_dir.join(SOCKET)) {
            return Reply::Unreachable(e.to_string());
        }
        if let Err(e) = self.socket.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))) {
            return Reply::Unreachable(e.to_string());
        }
        match self.socket.recv(&mut buf) {
            Ok(n) => Reply::parse(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => Reply::Silent,
        }
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tether-hook-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn replies_parse() {
        assert_eq!(
            Reply::parse("flipped seq: bit 3 of 17"),
            Reply::Flipped("flipped seq: bit 3 of 17".into())
        );
        assert_eq!(Reply::parse("none: nothing buffered\n"), Reply::Nothing("nothing buffered".into()));
        assert_eq!(Reply::parse("what?"), Reply::Unexpected("what?".into()));
    }

    /// Against a stand-in for the engine's end: the request arrives as
    /// sent, the answer comes back, and silence and absence are told apart.
    #[test]
    fn requests_reach_the_engine_and_answers_come_back() {
        let dir = temp("dir");
        std::fs::create_dir_all(&dir).unwrap();
        let engine = UnixDatagram::bind(dir.join(SOCKET)).unwrap();
        let hook = Hook::bind(&temp("me.sock")).unwrap();
        let answer = std::thread::scope(|s| {
            let t = s.spawn(|| {
                let mut buf = [0u8; 64];
                let (n, from) = engine.recv_from(&mut buf).unwrap();
                let path = from.as_pathname().unwrap().to_path_buf();
                engine.send_to(b"none: nothing buffered", path).unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            });
            let reply = hook.strike(&dir, "payload", 42, Duration::from_secs(5));
            assert_eq!(reply, Reply::Nothing("nothing buffered".into()));
            t.join().unwrap()
        });
        assert_eq!(answer, "payload 42");
        assert_eq!(hook.strike(&dir, "seq", 1, Duration::from_millis(20)), Reply::Silent);
        drop(engine);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(hook.strike(&dir, "seq", 1, Duration::from_millis(20)), Reply::Unreachable(_)));
        let path = hook.path.clone();
        drop(hook);
        assert!(!path.exists(), "the socket is removed with the hook");
    }
}
