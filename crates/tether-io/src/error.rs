//! Typed transport errors, after Li et al. [CI] Table 1, mapped from errno.

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TransportError {
    /// Out of local buffers or memory (ENOBUFS, ENOMEM).
    #[error("local resource exhausted")]
    LocalResource,
    #[error("remote resource exhausted")]
    RemoteResource,
    /// The buffer cannot be sent as a datagram (EMSGSIZE, too large).
    #[error("invalid buffer")]
    InvalidBuffer,
    /// No such destination: the node is not in the address book.
    #[error("invalid endpoint")]
    InvalidEndpoint,
    #[error("invalid arguments")]
    InvalidArgs,
    /// The destination refused the datagram (ECONNREFUSED).
    #[error("destination rejected the datagram")]
    DestReject,
    /// No route, network or host down.
    #[error("destination unreachable")]
    Unreachable,
    #[error("transport not initialised")]
    NotInitialized,
    #[error("interrupted")]
    Interrupted,
    /// Non-blocking call found the socket full (send) or empty (receive): flow, not failure.
    #[error("would block")]
    WouldBlock,
    #[error("i/o error (errno {0})")]
    Os(i32),
}

impl TransportError {
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

    pub fn last_os_error() -> Self {
        Self::from_errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
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
            (libc::ECONNREFUSED, DestReject),
            (libc::ENETUNREACH, Unreachable),
            (libc::EHOSTUNREACH, Unreachable),
            (libc::ENETDOWN, Unreachable),
            (libc::EMSGSIZE, InvalidBuffer),
            (libc::EINVAL, InvalidArgs),
            (libc::EINTR, Interrupted),
            (libc::EBADF, NotInitialized),
            (libc::EPERM, Os(libc::EPERM)),
        ];
        for (errno, want) in cases {
            assert_eq!(TransportError::from_errno(errno), want, "errno {errno}");
        }
    }
}
