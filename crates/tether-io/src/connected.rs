//! Connected sockets for the peers a rail exchanges with most
//! (docs/ARCHITECTURE.md, "Connected sockets"): beside the rail's
//! listening socket, one socket per such peer, bound to the same local
//! address and port and connected to the peer's, so the peer sees one
//! address either way and identity still comes from it.
//!
//! - A connected socket's `send` reuses the route its `connect` looked up;
//!   every `sendto` of an unconnected one looks it up again (587 against
//!   672 ns for an 8 B datagram on this machine's loopback, more where the
//!   routing table or the neighbour cache is larger). The kernel hands a
//!   connected peer's datagrams to its socket, not to the listener.
//! - All of a rail's sockets sit in one epoll set, whose descriptor is the
//!   rail's (the progress threads and blocking calls sleep on it). A
//!   receive turn asks `epoll_wait` which sockets hold datagrams and reads
//!   only those: 66 ns for a turn that finds nothing whatever the number of
//!   sockets (33 here), against 92 ns for one empty `recv`, so a spinning
//!   receiver's turn does not grow with its peers. On the path of each
//!   datagram it costs more than the route lookup saves on loopback (the
//!   set's callback at every arrival, and a second system call to read
//!   it), which is why a rail has none unless asked: the measurements are
//!   in docs/ARCHITECTURE.md, "Connected sockets".
//! - Sharing the port takes `SO_REUSEPORT` on every socket of the rail. The
//!   listener is bound only after a plain socket bound the address alone
//!   (`exclusive_port`), so a second endpoint started on a taken port
//!   still fails with `AddrInUse`; what the option leaves open is another
//!   process of the same user binding the port on purpose.
//! - Which peers: each peer sent to gets one while fewer than the bound
//!   have one; every `RERANK` datagrams the busiest peers since the last
//!   ranking take the places of the least busy, but only from one sent
//!   less than half as many (two peers of equal traffic do not trade
//!   places at every ranking), so a node of hundreds of peers keeps
//!   sockets for those it talks to most (`UdpTransport::rerank`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use socket2::{Domain, Protocol, Socket, Type};

/// The most connected sockets a rail may have (one descriptor each).
pub const MAX_CONNECTED: usize = 1024;

/// Datagrams sent between two rankings of the peers.
pub(crate) const RERANK: u32 = 4096;

/// Readiness reports taken per `epoll_wait`: a rail with more sockets
/// ready than this reads the rest at its next turn (the set is
/// level-triggered, so none is forgotten).
pub(crate) const EVENTS: usize = 64;

/// The epoll token of the listening socket; a connection's is its slot + 1.
const LISTENER: u64 = 0;

/// A socket connected to one peer.
pub(crate) struct Conn {
    pub socket: Socket,
    /// The receive turn that last found it ready (`Connected::turn`).
    pub seen: u64,
}

/// What a peer's entry says about its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Sent to from the listener.
    Listener,
    /// Its own socket, in this slot.
    Slot(u32),
    /// Opening one failed (a descriptor limit, an address the kernel
    /// cannot connect to): not tried again before the next ranking.
    Refused,
}

/// The rail's connected sockets and the epoll set over them and the
/// listener.
pub(crate) struct Connected {
    bound: usize,
    epoll: OwnedFd,
    slots: Vec<Option<Conn>>,
    live: usize,
    events: Box<[libc::epoll_event; EVENTS]>,
    /// Receive turns taken through the epoll set.
    turn: u64,
    /// The turn that last found the listener ready.
    listener_seen: u64,
    since_rank: u32,
}

/// A ready socket a receive turn reads: its descriptor, and how many turns
/// before this one it was last seen ready (0: in the turn just before).
pub(crate) struct Ready {
    pub fd: RawFd,
    pub idle: u64,
}

impl Connected {
    /// An epoll set holding `listener`, for at most `bound` connections.
    pub fn new(listener: &Socket, bound: usize) -> std::io::Result<Self> {
        // SAFETY: no pointers; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just created and owned by nothing else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        add(&epoll, listener.as_raw_fd(), LISTENER)?;
        Ok(Connected {
            bound,
            epoll,
            slots: Vec::new(),
            live: 0,
            events: Box::new([libc::epoll_event { events: 0, u64: 0 }; EVENTS]),
            turn: 0,
            listener_seen: 0,
            since_rank: 0,
        })
    }

    /// The epoll set's descriptor: readable when any socket of the rail is.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// How many peers have a socket of their own.
    pub fn live(&self) -> usize {
        self.live
    }

    pub fn bound(&self) -> usize {
        self.bound
    }

    /// Room for another connection.
    pub fn has_room(&self) -> bool {
        self.live < self.bound
    }

    /// The connected sockets' descriptors.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.slots.iter().flatten().map(|c| c.socket.as_raw_fd())
    }

    pub fn socket(&self, slot: u32) -> Option<&Socket> {
        self.slots.get(slot as usize).and_then(|c| c.as_ref()).map(|c| &c.socket)
    }

    /// Connect a socket at `local` to `node` at `peer`, in a free slot;
    /// `coalesce`: taking runs whole, as the rail's other sockets do.
    pub fn open(&mut self, local: SocketAddr, peer: SocketAddr, coalesce: bool) -> std::io::Result<u32> {
        let socket = rail_socket(local)?;
        if coalesce {
            // Refused, it hands over its datagrams one by one: no harm.
            let _ = crate::offload::set_coalescing(socket.as_raw_fd(), true);
        }
        socket.bind(&local.into())?;
        socket.connect(&peer.into())?;
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        add(&self.epoll, socket.as_raw_fd(), slot as u64 + 1)?;
        self.slots[slot] = Some(Conn { socket, seen: 0 });
        self.live += 1;
        Ok(slot as u32)
    }

    /// Close the socket in `slot`. Datagrams still queued in it are lost,
    /// as datagrams may be: the protocol above repairs them.
    pub fn close(&mut self, slot: u32) {
        if let Some(conn) = self.slots.get_mut(slot as usize).and_then(Option::take) {
            // SAFETY: removes a live descriptor from our own epoll set.
            unsafe {
                libc::epoll_ctl(
                    self.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    conn.socket.as_raw_fd(),
                    std::ptr::null_mut(),
                )
            };
            self.live -= 1;
        }
    }

    /// Which sockets hold datagrams now (never blocks), in `ready`;
    /// `listener` is the listening socket's descriptor.
    pub fn poll(&mut self, listener: RawFd, ready: &mut Vec<Ready>) -> std::io::Result<()> {
        ready.clear();
        self.turn += 1;
        // SAFETY: `events` is a live array of EVENTS entries the kernel fills.
        let n =
            unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), self.events.as_mut_ptr(), EVENTS as i32, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EINTR) { Ok(()) } else { Err(e) };
        }
        let turn = self.turn;
        for ev in &self.events[..n as usize] {
            let token = ev.u64;
            let (fd, seen) = if token == LISTENER {
                (listener, &mut self.listener_seen)
            } else {
                match self.slots.get_mut(token as usize - 1).and_then(Option::as_mut) {
                    Some(c) => (c.socket.as_raw_fd(), &mut c.seen),
                    // Closed since the kernel queued the report.
                    None => continue,
                }
            };
            ready.push(Ready { fd, idle: turn - *seen - 1 });
            *seen = turn;
        }
        Ok(())
    }

    /// Count `n` datagrams sent; true when the peers are due a ranking.
    pub fn count_sent(&mut self, n: usize) -> bool {
        self.since_rank = self.since_rank.saturating_add(n as u32);
        self.since_rank >= RERANK
    }

    /// Ranked: the count starts again.
    pub fn ranked(&mut self) {
        self.since_rank = 0;
    }
}

/// A socket for a rail at `local`: non-blocking, large buffers, never
/// fragmenting, sharing its port with the rail's other sockets. Not bound.
pub(crate) fn rail_socket(local: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    socket.set_reuse_port(true)?;
    crate::udp::grow_buffers(&socket);
    crate::udp::never_fragment(&socket, local.is_ipv6())?;
    Ok(socket)
}

/// Bind a plain socket (no `SO_REUSEPORT`) at `addr` and let it go: the
/// address it got, proof that no other socket held it. The listener is
/// bound there next, sharing the port only with its own connections.
pub(crate) fn exclusive_port(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    probe.bind(&addr.into())?;
    probe.local_addr()?.as_socket().ok_or_else(|| std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

fn add(epoll: &OwnedFd, fd: RawFd, token: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
    // SAFETY: registers a live descriptor with our own epoll set.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
