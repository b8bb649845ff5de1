//! The rendezvous between an application and its engine (docs/ENGINE.md,
//! "Step 1 in detail"): a Unix stream socket in the engine's directory.
//!
//! The application creates its region, connects, and names the region's
//! path; the engine checks who is asking (the kernel's peer credentials,
//! never what the request says), opens the region, and answers with its
//! pid or the reason it refuses. The connection then stays open for the
//! life of the attachment, for three things:
//!
//! - death: either side closing it (a crash included: the kernel closes a
//!   dead process's sockets) tells the other at once;
//! - doorbells: a side that sleeps is woken by one byte on it (only when
//!   the region's control line says it sleeps; see `tether_shm::Control`);
//! - nothing else: all data goes through the region.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_proto::{NodeId, MAX_RAILS};

/// The first node id of the engine's self-test cores, which no application
/// may attach as: rail `r` has the sender `PROBE_BASE + 2r` and the
/// receiver `PROBE_BASE + 2r + 1`.
pub const PROBE_BASE: NodeId = NodeId::MAX - 2 * MAX_RAILS as NodeId + 1;

/// Is `node` one of the self-test's own (not an application's)?
pub fn is_probe_node(node: NodeId) -> bool {
    node >= PROBE_BASE
}

/// The socket's name in the engine's directory.
pub const SOCKET_NAME: &str = "engine.sock";
/// Longest region path a request may name.
pub const MAX_PATH: usize = 4096;
/// Longest reason a refusal carries.
const MAX_REASON: usize = 1024;
/// How long either side waits for the other's half of the exchange.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where `tether engine` serves this user by default, and where an
/// application looks for it unless told otherwise: a directory of this
/// user's own in `/dev/shm` (the regions are shared memory).
pub fn default_dir() -> PathBuf {
    PathBuf::from(format!("/dev/shm/tether-{}", my_uid()))
}

/// The engine's socket in `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// Who is at the other end of a Unix socket, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// The connecting process.
    pub pid: u32,
    /// Its user.
    pub uid: u32,
}

/// The kernel's record of the process that connected `stream`
/// (`SO_PEERCRED`): identity that the request itself cannot forge.
pub fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred { pid: cred.pid as u32, uid: cred.uid })
}

/// This process's effective user.
pub fn my_uid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

/// Why an application attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new endpoint: its region is fresh.
    Fresh,
    /// Its engine died: the new one resumes from the region's backup and
    /// what the application resubmits (docs/ENGINE.md, "Restore").
    Resume,
}

/// The application's request: the path of the region it created, and why.
pub fn write_request(stream: &mut UnixStream, region: &Path, mode: Mode) -> io::Result<()> {
    let path = region.as_os_str().as_encoded_bytes();
    if path.len() > MAX_PATH {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "region path too long"));
    }
    let mut msg = Vec::with_capacity(5 + path.len());
    msg.push(match mode {
        Mode::Fresh => 0,
        Mode::Resume => 1,
    });
    msg.extend_from_slice(&(path.len() as u32).to_le_bytes());
    msg.extend_from_slice(path);
    stream.write_all(&msg)
}

/// The engine reads a request: the mode, a length (bounded) and that many bytes.
pub fn read_request(stream: &mut UnixStream) -> io::Result<(PathBuf, Mode)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head)?;
    let mode = match head[0] {
        0 => Mode::Fresh,
        1 => Mode::Resume,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "unknown attach mode")),
    };
    let len = u32::from_le_bytes(head[1..].try_into().expect("4 bytes")) as usize;
    if len == 0 || len > MAX_PATH {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "region path length out of range"));
    }
    let mut path = vec![0u8; len];
    stream.read_exact(&mut path)?;
    let path = String::from_utf8(path)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "region path is not UTF-8"))?;
    Ok((PathBuf::from(path), mode))
}

/// The engine's answer: its pid, or why it refused.
pub fn write_reply(stream: &mut UnixStream, reply: Result<u32, &str>) -> io::Result<()> {
    let mut msg = Vec::new();
    match reply {
        Ok(pid) => {
            msg.push(0);
            msg.extend_from_slice(&pid.to_le_bytes());
        }
        Err(why) => {
            let why = &why.as_bytes()[..why.len().min(MAX_REASON)];
            msg.push(1);
            msg.extend_from_slice(&(why.len() as u32).to_le_bytes());
            msg.extend_from_slice(why);
        }
    }
    stream.write_all(&msg)
}

/// The application reads the answer: `Ok(Ok(pid))`, or `Ok(Err(reason))`.
pub fn read_reply(stream: &mut UnixStream) -> io::Result<Result<u32, String>> {
    let mut status = [0u8; 5];
    stream.read_exact(&mut status)?;
    let word = u32::from_le_bytes(status[1..].try_into().expect("4 bytes"));
    match status[0] {
        0 => Ok(Ok(word)),
        1 if word as usize <= MAX_REASON => {
            let mut why = vec![0u8; word as usize];
            stream.read_exact(&mut why)?;
            Ok(Err(String::from_utf8_lossy(&why).into_owned()))
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "malformed reply from the engine")),
    }
}

/// What a non-blocking look at the connection found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doorbell {
    /// Nothing (or only doorbell bytes, now consumed).
    Open,
    /// The other side closed it: it exited or died.
    Closed,
}

/// Consume doorbell bytes without blocking and tell whether the other side
/// is gone. The stream must be non-blocking.
pub fn check(stream: &mut UnixStream) -> Doorbell {
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Doorbell::Closed,
            Ok(n) if n < buf.len() => return Doorbell::Open,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Doorbell::Open,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Doorbell::Closed,
        }
    }
}

/// Ring the other side's doorbell: one byte. A full socket buffer means
/// bells are already waiting to be read, which is as good.
pub fn ring(stream: &mut UnixStream) {
    let _ = stream.write(&[1]);
}

/// Sleep until one of `fds` is readable or `timeout` passes, to the
/// microsecond (`ppoll`: a deadline 50 us away is not rounded to a
/// millisecond, which would put a millisecond into a round trip).
pub fn sleep_on(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a live array of `fds.len()` pollfds; `ts` a live timespec.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
