//! `tether engine --fault-hook`: a test-only hook through which a fault
//! campaign corrupts the engine's own state (Zhou et al. [FTGM] section 5,
//! faults injected into the card's memory). A Unix datagram socket in the
//! engine's directory takes requests `"<target> <seed>"` (target:
//! `payload`, `seq`, `window`, `rail` in an application's core, `book` in
//! the engine's address book) and answers each with `"flipped <target>:
//! <what>"` or `"none: <why>"`. Built only with the `fault-hook` feature;
//! the socket exists only when the engine is started with the flag.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// The hook's socket in an engine's directory.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("fault-hook")
}

/// Longest request taken.
const MAX_REQUEST: usize = 64;

/// A request's words: the target's name and the seed; `None` for
/// anything else (not UTF-8, a word missing or too many, a seed that is
/// not a u64).
pub fn parse(request: &[u8]) -> Option<(&str, u64)> {
    let mut words = std::str::from_utf8(request).ok()?.split_whitespace();
    match (words.next(), words.next().and_then(|w| w.parse().ok()), words.next()) {
        (Some(target), Some(seed), None) => Some((target, seed)),
        _ => None,
    }
}

pub struct Hook {
    socket: UnixDatagram,
    path: PathBuf,
}

/// A request taken: what to strike, with which seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub target: String,
    pub seed: u64,
    reply_to: Option<PathBuf>,
}

impl Hook {
    /// Bind the hook's socket in `dir` (a stale one, left by a killed
    /// engine, is replaced).
    pub fn bind(dir: &Path) -> io::Result<Hook> {
        let path = socket_path(dir);
        let _ = std::fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path)?;
        socket.set_nonblocking(true)?;
        Ok(Hook { socket, path })
    }

    /// The next request waiting, if any; malformed ones are answered and
    /// dropped.
    pub fn take(&self) -> Option<Request> {
        let mut buf = [0u8; MAX_REQUEST];
        loop {
            let (n, from) = self.socket.recv_from(&mut buf).ok()?;
            let reply_to = from.as_pathname().map(Path::to_path_buf);
            match parse(&buf[..n]) {
                Some((target, seed)) => return Some(Request { target: target.to_string(), seed, reply_to }),
                None => self.answer(&reply_to, "none: expected \"<target> <seed>\""),
            }
        }
    }

    /// For the engine's sleep: a request wakes it.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.socket.as_raw_fd()
    }

    /// Answer `request` with `text` (lost if its sender is gone).
    pub fn reply(&self, request: &Request, text: &str) {
        self.answer(&request.reply_to, text);
    }

    fn answer(&self, to: &Option<PathBuf>, text: &str) {
        if let Some(to) = to {
            let _ = self.socket.send_to(text.as_bytes(), to);
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

    #[test]
    fn requests_parse_or_are_refused() {
        assert_eq!(parse(b"payload 42"), Some(("payload", 42)));
        assert_eq!(parse(b"  book\t18446744073709551615\n"), Some(("book", u64::MAX)));
        for bad in
            [&b""[..], b"payload", b"payload -1", b"payload 1 2", b"payload 18446744073709551616", b"\xff 1"]
        {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
