//! Typed transport errors, after Li et al. [CI] Table 1, mapped from errno.
//!
//! The typed variants are the statuses [CI]'s CL returns, so a caller can
//! react to the kind of failure (back off on `LocalResource`, give up on
//! `Unreachable`) without decoding errno. What does not map keeps its errno
//! and prints the operating system's own words for it. Binding a socket is
//! the one call that fails because of the caller's own address, so its
//! errors carry that address: an operator reading "cannot bind" must not
//! have to guess which of several rails it was.

use std::net::SocketAddr;

use thiserror::Error;

/// Why a transport call failed. `Copy`, so a driver can keep the last error
/// it saw without cloning; new causes may be added, hence non-exhaustive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Out of local buffers or memory (ENOBUFS, ENOMEM).
    #[error("local resource exhausted")]
    LocalResource,
    /// The destination had no room for the datagram. UDP never says so;
    /// only an injected invocation or operation fault (`error_of`) does.
    #[error("remote resource exhausted")]
    RemoteResource,
    /// The buffer cannot be sent as a datagram (EMSGSIZE, too large).
    #[error("invalid buffer")]
    InvalidBuffer,
    /// No such destination: the node is not in the address book.
    #[error("invalid endpoint")]
    InvalidEndpoint,
    /// An argument the transport cannot use (EINVAL, EAFNOSUPPORT,
    /// EDESTADDRREQ), or an operation this transport does not offer.
    #[error("invalid arguments")]
    InvalidArgs,
    /// The destination refused the datagram (ECONNREFUSED).
    #[error("destination rejected the datagram")]
    DestReject,
    /// No route, network or host down.
    #[error("destination unreachable")]
    Unreachable,
    /// The socket is gone or was never opened (EBADF, ENOTSOCK).
    #[error("transport not initialised")]
    NotInitialized,
    /// A signal interrupted the call (EINTR); trying again is right.
    #[error("interrupted")]
    Interrupted,
    /// Non-blocking call found the socket full (send) or empty (receive): flow, not failure.
    #[error("would block")]
    WouldBlock,
    /// Another socket holds `addr` (EADDRINUSE). Its own variant because
    /// it is the bind failure a caller can act on: pick another port.
    #[error("address {addr} already in use")]
    AddrInUse {
        /// The address this side asked for.
        addr: SocketAddr,
    },
    /// Binding a socket at `addr` failed for any other reason, e.g. an
    /// address no local interface has (EADDRNOTAVAIL) or a privileged
    /// port (EACCES).
    #[error("cannot bind {addr}: {}", os_message(*errno))]
    Bind {
        /// The address this side asked for.
        addr: SocketAddr,
        /// The errno `bind(2)` returned.
        errno: i32,
    },
    /// An errno with no typed meaning here, printed in the operating
    /// system's words (`from_raw_os_error`), with the number after them.
    #[error("{}", os_message(*.0))]
    Os(i32),
}

/// The operating system's message for `errno`, e.g. "Permission denied
/// (os error 13)": std already asks libc for it, with the number kept for
/// searching.
fn os_message(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

impl TransportError {
    /// The typed error for `errno`, per [CI] Table 1; unmapped ones stay `Os`.
    pub fn from_errno(errno: i32) -> Self {
        match errno {
            libc::EAGAIN => TransportError::WouldBlock,
            libc::ENOBUFS | libc::ENOMEM => TransportError::LocalResource,
            libc::ECONNREFUSED => TransportError::DestReject,
            libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ENETDOWN | libc::EHOSTDOWN => {
                TransportError::Unreachable
            }
            libc::EMSGSIZE => TransportError::InvalidBuffer,
            libc::EINVAL | libc::EAFNOSUPPORT | libc::EDESTADDRREQ => TransportError::InvalidArgs,
            libc::EINTR => TransportError::Interrupted,
            libc::EBADF | libc::ENOTSOCK => TransportError::NotInitialized,
            other => TransportError::Os(other),
        }
    }

    /// A failed `bind(2)` at `addr`: every cause names the address, since
    /// an endpoint with several rails binds several.
    pub fn bind(addr: SocketAddr, errno: i32) -> Self {
        match errno {
            libc::EADDRINUSE => TransportError::AddrInUse { addr },
            errno => TransportError::Bind { addr, errno },
        }
    }

    /// The typed error for the calling thread's last errno.
    pub fn last_os_error() -> Self {
        Self::from_errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The errno behind this error, when one is known (`Os`, `Bind`,
    /// `AddrInUse`); the typed variants stand for several.
    pub fn raw_os_error(&self) -> Option<i32> {
        match *self {
            TransportError::Os(errno) | TransportError::Bind { errno, .. } => Some(errno),
            TransportError::AddrInUse { .. } => Some(libc::EADDRINUSE),
            _ => None,
        }
    }
}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        Self::from_errno(e.raw_os_error().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        use TransportError::*;
        let cases = [
            (libc::EAGAIN, WouldBlock),
            (libc::ENOBUFS, LocalResource),
            (libc::ENOMEM, LocalResource),
            (libc::ECONNREFUSED, DestReject),
            (libc::ENETUNREACH, Unreachable),
            (libc::EHOSTUNREACH, Unreachable),
            (libc::ENETDOWN, Unreachable),
            (libc::EHOSTDOWN, Unreachable),
            (libc::EMSGSIZE, InvalidBuffer),
            (libc::EINVAL, InvalidArgs),
            (libc::EAFNOSUPPORT, InvalidArgs),
            (libc::EDESTADDRREQ, InvalidArgs),
            (libc::EINTR, Interrupted),
            (libc::EBADF, NotInitialized),
            (libc::ENOTSOCK, NotInitialized),
            (libc::EPERM, Os(libc::EPERM)),
        ];
        for (errno, want) in cases {
            assert_eq!(TransportError::from_errno(errno), want, "errno {errno}");
        }
    }

    #[test]
    fn os_errors_print_the_systems_words_not_a_bare_number() {
        let msg = TransportError::from_errno(libc::EPERM).to_string();
        let os = std::io::Error::from_raw_os_error(libc::EPERM).to_string();
        assert_eq!(msg, os);
        assert!(msg.contains("not permitted"), "{msg}");
        assert_eq!(TransportError::Os(libc::EPERM).raw_os_error(), Some(libc::EPERM));
        assert_eq!(TransportError::WouldBlock.raw_os_error(), None);
    }

    #[test]
    fn bind_failures_name_the_address_and_the_reason() {
        let addr: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let in_use = TransportError::bind(addr, libc::EADDRINUSE);
        assert_eq!(in_use, TransportError::AddrInUse { addr });
        assert_eq!(in_use.to_string(), "address 127.0.0.1:9000 already in use");
        assert_eq!(in_use.raw_os_error(), Some(libc::EADDRINUSE));

        let addr: SocketAddr = "192.0.2.1:7000".parse().unwrap();
        let not_here = TransportError::bind(addr, libc::EADDRNOTAVAIL);
        assert_eq!(not_here, TransportError::Bind { addr, errno: libc::EADDRNOTAVAIL });
        let msg = not_here.to_string();
        let os = std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        assert_eq!(msg, format!("cannot bind 192.0.2.1:7000: {os}"));
    }
}
