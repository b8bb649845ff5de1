//! The largest datagram a path carries (docs/ARCHITECTURE.md, "Datagram size"): what the
//! kernel knows of the route to a destination - the MTU of the interface
//! it leaves by, or a smaller one learnt from the path - read with
//! `IP_MTU` (`IPV6_MTU`) on a UDP socket connected to it (connecting a
//! UDP socket sends nothing). Loopback carries 65,507-byte datagrams; an
//! Ethernet link 1,472.
//!
//! This is where a path starts, not a promise: a path that drops large
//! datagrams silently (a black hole) still has to be found by probing.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// IPv4 and UDP headers.
const V4_HEADERS: usize = 20 + 8;
/// IPv6 and UDP headers.
const V6_HEADERS: usize = 40 + 8;
/// The largest UDP payload the length fields allow.
const MAX_V4: usize = 65_507;
const MAX_V6: usize = 65_527;

/// The largest UDP payload (a datagram, tether's header included) the
/// route to `dst` carries without IP fragmentation, as the kernel sees it.
pub fn max_datagram_to(dst: SocketAddr) -> io::Result<usize> {
    let any: SocketAddr = if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("an address");
    let s = UdpSocket::bind(any)?;
    s.connect(dst)?;
    let (level, opt) =
        if dst.is_ipv4() { (libc::IPPROTO_IP, libc::IP_MTU) } else { (libc::IPPROTO_IPV6, libc::IPV6_MTU) };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a live socket, and a c_int with its exact length to write into.
    let rc = unsafe {
        libc::getsockopt(s.as_raw_fd(), level, opt, (&mut mtu as *mut libc::c_int).cast(), &mut len)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let mtu = usize::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))?;
    Ok(if dst.is_ipv4() {
        mtu.saturating_sub(V4_HEADERS).min(MAX_V4)
    } else {
        mtu.saturating_sub(V6_HEADERS).min(MAX_V6)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux's loopback has an MTU of 65,536: over IPv4 the UDP length
    /// field is the tighter bound, over IPv6 the MTU (65,536 - 48).
    #[test]
    fn loopback_carries_the_largest_datagrams() {
        assert_eq!(max_datagram_to("127.0.0.1:9".parse().unwrap()).unwrap(), MAX_V4);
        // Where the host has IPv6 loopback at all.
        if let Ok(n) = max_datagram_to("[::1]:9".parse().unwrap()) {
            assert_eq!(n, 65_536 - V6_HEADERS);
        }
    }
}
