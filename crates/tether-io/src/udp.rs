//! UDP transport: one non-blocking socket, datagrams batched through
//! `sendmmsg`/`recvmmsg` so a burst costs one system call, not one per
//! datagram. The address book maps nodes to socket addresses both ways.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{NodeId, RecvBatch, Transport, TransportCounters, TransportError};

/// After this many receives in a row found the socket empty, the next
/// datagram is taken alone (`recv_one`): the receiver is spinning for an
/// answer. After every empty receive, a loaded endpoint whose sockets
/// drain between bursts took most of its datagrams one at a time: the
/// two-rail fault-free demo failed healthy paths over in 8 of 10 runs,
/// against 3 of 10 with batches only and 4 of 10 with this wait.
const IDLE_TURNS: u32 = 8;

/// Datagrams per `sendmmsg`/`recvmmsg` call.
const MMSG_BATCH: usize = 64;
/// Socket buffer size asked for; loopback bursts overrun the default 208 KiB.
const SOCKET_BUFFER: usize = 8 << 20;

/// Which address each node is reached at, and which node an address is.
/// Hash maps: both are asked once per datagram, and a B-tree search of a
/// 255-peer book (cache misses at every level) was 2.4% of a 256-node
/// demo's CPU. Only configuration inserts, so the network cannot choose
/// keys to collide.
#[derive(Debug, Clone, Default)]
pub struct AddressBook {
    by_node: HashMap<NodeId, (SocketAddr, SockAddr)>,
    by_addr: HashMap<SocketAddr, NodeId>,
}

impl AddressBook {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, node: NodeId, addr: SocketAddr) {
        if let Some((old, _)) = self.by_node.insert(node, (addr, SockAddr::from(addr))) {
            self.by_addr.remove(&old);
        }
        self.by_addr.insert(addr, node);
    }

    pub fn addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.by_node.get(&node).map(|(a, _)| *a)
    }

    pub fn node(&self, addr: &SocketAddr) -> Option<NodeId> {
        self.by_addr.get(addr).copied()
    }

    fn sockaddr(&self, node: NodeId) -> Option<&SockAddr> {
        self.by_node.get(&node).map(|(_, s)| s)
    }
}

pub struct UdpTransport {
    socket: Socket,
    local: SocketAddr,
    book: AddressBook,
    counters: TransportCounters,
    rx: Box<RecvScratch>,
    /// Receives in a row that found the socket empty (`IDLE_TURNS`).
    idle: u32,
}

impl std::fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpTransport")
            .field("local", &self.local)
            .field("peers", &{
                let mut peers: Vec<_> = self.book.by_node.keys().collect();
                peers.sort_unstable();
                peers
            })
            .field("counters", &self.counters)
            .finish()
    }
}

/// The receive syscall's headers, kept between calls: rebuilding (and
/// zeroing) 12 KiB of them per call cost a spinning receiver 16% of its time.
struct RecvScratch {
    iov: [libc::iovec; MMSG_BATCH],
    names: [MaybeUninit<libc::sockaddr_storage>; MMSG_BATCH],
    msgs: [libc::mmsghdr; MMSG_BATCH],
}

// SAFETY: the raw pointers inside are written immediately before each
// recvmmsg call and never read outside it, so moving the transport to
// another thread cannot leave one dangling or shared.
unsafe impl Send for RecvScratch {}

impl UdpTransport {
    /// Bind a non-blocking UDP socket at `addr` (port 0: any). The socket
    /// needs no node id of its own: the book maps nodes to addresses both
    /// ways. A failure to get a socket at `addr` is `AddrInUse` or `Bind`,
    /// naming `addr`, so a caller binding several rails need not add it.
    pub fn bind(addr: SocketAddr, book: AddressBook) -> Result<Self, TransportError> {
        let at = |e: std::io::Error| TransportError::bind(addr, e.raw_os_error().unwrap_or(0));
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(at)?;
        socket.set_nonblocking(true)?;
        grow_buffers(&socket);
        never_fragment(&socket, addr.is_ipv6())?;
        socket.bind(&addr.into()).map_err(at)?;
        let local = socket.local_addr()?.as_socket().ok_or(TransportError::InvalidArgs)?;
        let rx = Box::new(RecvScratch {
            iov: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MMSG_BATCH],
            names: [MaybeUninit::zeroed(); MMSG_BATCH],
            msgs: [zeroed_mmsg(); MMSG_BATCH],
        });
        Ok(UdpTransport { socket, local, book, counters: TransportCounters::default(), rx, idle: 0 })
    }

    pub fn book(&self) -> &AddressBook {
        &self.book
    }

    pub fn book_mut(&mut self) -> &mut AddressBook {
        &mut self.book
    }
}

/// Ask for large socket buffers (8 MiB each way); as root, past the sysctl
/// limit too. What the kernel grants is accepted either way. Public for the
/// benchmarks' baselines, whose sockets must get what tether's get.
pub fn grow_buffers(socket: &impl AsRawFd) {
    let size = SOCKET_BUFFER as libc::c_int;
    // The plain options are capped at the sysctl limit; the forcing ones
    // go past it, and fail harmlessly (EPERM) when not privileged.
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF, libc::SO_SNDBUFFORCE, libc::SO_RCVBUFFORCE] {
        let _ = set_int(socket, libc::SOL_SOCKET, opt, size);
    }
}

/// Set an integer socket option.
fn set_int(
    socket: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Send every datagram whole with the don't-fragment bit set, up to the
/// interface's MTU, whatever the kernel has learnt of the path
/// (`IP_PMTUDISC_PROBE`, as QUIC stacks do): a datagram larger than the
/// interface carries fails at once (`EMSGSIZE`, a counted loss), and one
/// larger than a link on the way is dropped there, never cut into IP
/// fragments of which one lost loses all. The handshake proves the size a
/// path carries (its padded HELLO), so a forged ICMP "too big" cannot
/// shrink it either.
fn never_fragment(socket: &Socket, v6: bool) -> std::io::Result<()> {
    if v6 {
        set_int(socket, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_PROBE)
    } else {
        set_int(socket, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_PROBE)
    }
}

fn zeroed_mmsg() -> libc::mmsghdr {
    // SAFETY: mmsghdr is a plain C struct for which all-zero bytes is a valid value.
    unsafe { MaybeUninit::<libc::mmsghdr>::zeroed().assume_init() }
}

impl Transport for UdpTransport {
    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.local)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.socket.as_raw_fd())
    }

    fn has_peer(&self, node: NodeId) -> bool {
        self.book.addr(node).is_some()
    }
    fn peer_addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.book.addr(node)
    }
    fn add_peer(&mut self, node: NodeId, addr: SocketAddr) -> Result<(), TransportError> {
        self.book.insert(node, addr);
        Ok(())
    }

    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
        self.send_batch(&[(dst, datagram)]).map(|_| ())
    }

    fn send_to_addr(&mut self, addr: SocketAddr, datagram: &[u8]) -> Result<(), TransportError> {
        self.counters.syscalls += 1;
        match self.socket.send_to(datagram, &addr.into()) {
            Ok(_) => {
                self.counters.datagrams_sent += 1;
                self.counters.bytes_sent += datagram.len() as u64;
                Ok(())
            }
            Err(e) => {
                let e = TransportError::from(e);
                if e != TransportError::WouldBlock {
                    self.counters.send_errors += 1;
                }
                Err(e)
            }
        }
    }

    fn send_batch(&mut self, batch: &[(NodeId, &[u8])]) -> Result<usize, TransportError> {
        let n = batch.len().min(MMSG_BATCH);
        if n == 0 {
            return Ok(0);
        }
        if let [(dst, data)] = batch {
            // One datagram (a round trip's): `sendto`, without the message
            // headers `sendmmsg` copies in and walks.
            let Some(addr) = self.book.sockaddr(*dst) else {
                self.counters.send_errors += 1;
                return Err(TransportError::InvalidEndpoint);
            };
            self.counters.syscalls += 1;
            // SAFETY: a live slice and a live sockaddr of the length given.
            let sent = unsafe {
                libc::sendto(
                    self.socket.as_raw_fd(),
                    data.as_ptr().cast(),
                    data.len(),
                    0,
                    addr.as_ptr(),
                    addr.len(),
                )
            };
            if sent < 0 {
                return Err(self.send_failed());
            }
            self.counted_sent(batch);
            return Ok(1);
        }
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MMSG_BATCH];
        let mut msgs = [zeroed_mmsg(); MMSG_BATCH];
        for (i, &(dst, data)) in batch[..n].iter().enumerate() {
            let Some(addr) = self.book.sockaddr(dst) else {
                // Send what precedes the unknown destination; report it when it is first.
                if i == 0 {
                    self.counters.send_errors += 1;
                    return Err(TransportError::InvalidEndpoint);
                }
                return self.send_prepared(&mut msgs[..i], &mut iov[..i], &batch[..i]);
            };
            iov[i] = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
            msgs[i].msg_hdr.msg_name = addr.as_ptr() as *mut libc::c_void;
            msgs[i].msg_hdr.msg_namelen = addr.len();
        }
        self.send_prepared(&mut msgs[..n], &mut iov[..n], &batch[..n])
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        batch.clear();
        if self.idle >= IDLE_TURNS {
            return self.recv_one(batch);
        }
        let n = batch.capacity().min(MMSG_BATCH);
        let rx = &mut *self.rx;
        for (i, slot) in batch.slots_mut().take(n).enumerate() {
            rx.iov[i] = libc::iovec { iov_base: slot.as_mut_ptr().cast(), iov_len: slot.len() };
            let hdr = &mut rx.msgs[i].msg_hdr;
            hdr.msg_iov = &mut rx.iov[i];
            hdr.msg_iovlen = 1;
            hdr.msg_name = rx.names[i].as_mut_ptr().cast();
            hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_control = std::ptr::null_mut();
            hdr.msg_controllen = 0;
            hdr.msg_flags = 0;
        }
        self.counters.syscalls += 1;
        // SAFETY: `rx.msgs[..n]` point at `n` live iovecs over distinct slots
        // of `batch` and at `n` live sockaddr_storage buffers, all of which
        // outlive the call; the kernel writes at most the sizes given.
        let got = unsafe {
            libc::recvmmsg(
                self.socket.as_raw_fd(),
                rx.msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.idle = if got <= 0 { self.idle.saturating_add(1) } else { 0 };
        if got < 0 {
            return nothing_waiting();
        }
        let got = got as usize;
        for i in 0..got {
            let (len, name_len) = (rx.msgs[i].msg_len as usize, rx.msgs[i].msg_hdr.msg_namelen);
            taken(&self.book, &mut self.counters, batch, i, len, &rx.names[i], name_len);
        }
        batch.set_filled(got);
        Ok(got)
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool, TransportError> {
        let mut fd = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.map_or(-1, |t| t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        match n {
            n if n > 0 => Ok(true),
            0 => Ok(false),
            _ => match TransportError::last_os_error() {
                TransportError::Interrupted => Ok(false),
                e => Err(e),
            },
        }
    }

    fn counters(&self) -> TransportCounters {
        self.counters
    }
}

/// A receive call that failed: an empty socket is no datagram, not an error.
fn nothing_waiting() -> Result<usize, TransportError> {
    match TransportError::last_os_error() {
        TransportError::WouldBlock => Ok(0),
        e => Err(e),
    }
}

/// Datagram `i` of `batch`, `len` bytes, came from the address the kernel
/// wrote into `name` (`name_len` bytes): its node, if the book knows it,
/// and the counters.
fn taken(
    book: &AddressBook,
    counters: &mut TransportCounters,
    batch: &mut RecvBatch,
    i: usize,
    len: usize,
    name: &MaybeUninit<libc::sockaddr_storage>,
    name_len: libc::socklen_t,
) {
    // SAFETY: the kernel initialised `name_len` bytes of `name` (a
    // sockaddr_storage, large enough for any address), and the storage was
    // zeroed at construction, so reading all of it is defined.
    let addr = unsafe { SockAddr::new(name.assume_init(), name_len) }.as_socket();
    batch.set(i, len, addr.and_then(|a| book.node(&a)), addr);
    counters.datagrams_received += 1;
    counters.bytes_received += len as u64;
}

impl UdpTransport {
    /// Receive one datagram with `recvfrom`, into the batch's first slot:
    /// what a transport that found its socket empty `IDLE_TURNS` times in
    /// a row does. The
    /// next datagram most likely comes alone (a round trip's answer), and
    /// `recvmmsg` costs more per call than `recvfrom` (its message headers
    /// copied in and walked) on every turn of a spinning receiver and on
    /// the datagram's path: 1.0 us of an 8 B round trip's 7.6 on loopback,
    /// in a spin loop of each kind side by side. Once one arrives the next
    /// call takes a whole batch again.
    fn recv_one(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        let Some(slot) = batch.slots_mut().next() else { return Ok(0) };
        let name = &mut self.rx.names[0];
        let mut name_len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        self.counters.syscalls += 1;
        // SAFETY: a live slot of the length given and a live
        // sockaddr_storage whose size is given; the kernel writes within.
        let got = unsafe {
            libc::recvfrom(
                self.socket.as_raw_fd(),
                slot.as_mut_ptr().cast(),
                slot.len(),
                libc::MSG_DONTWAIT,
                name.as_mut_ptr().cast(),
                &mut name_len,
            )
        };
        if got < 0 {
            return nothing_waiting();
        }
        self.idle = 0;
        taken(&self.book, &mut self.counters, batch, 0, got as usize, &self.rx.names[0], name_len);
        batch.set_filled(1);
        batch.set_partial();
        Ok(1)
    }

    fn send_prepared(
        &mut self,
        msgs: &mut [libc::mmsghdr],
        iov: &mut [libc::iovec],
        batch: &[(NodeId, &[u8])],
    ) -> Result<usize, TransportError> {
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        self.counters.syscalls += 1;
        // SAFETY: every header points at one live iovec over a caller slice
        // and at a live sockaddr in the address book; nothing is written.
        let sent = unsafe {
            libc::sendmmsg(self.socket.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as libc::c_uint, 0)
        };
        if sent < 0 {
            return Err(self.send_failed());
        }
        let sent = sent as usize;
        self.counted_sent(&batch[..sent]);
        Ok(sent)
    }

    /// The error of a send that failed, counted unless it is only a full
    /// socket buffer.
    fn send_failed(&mut self) -> TransportError {
        let e = TransportError::last_os_error();
        if e != TransportError::WouldBlock {
            self.counters.send_errors += 1;
        }
        e
    }

    /// Count the datagrams of `sent` as gone.
    fn counted_sent(&mut self, sent: &[(NodeId, &[u8])]) {
        self.counters.datagrams_sent += sent.len() as u64;
        self.counters.bytes_sent += sent.iter().map(|(_, d)| d.len() as u64).sum::<u64>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (UdpTransport, UdpTransport) {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut a = UdpTransport::bind(any, AddressBook::new()).unwrap();
        let mut b = UdpTransport::bind(any, AddressBook::new()).unwrap();
        a.add_peer(2, b.local_addr().unwrap()).unwrap();
        b.add_peer(1, a.local_addr().unwrap()).unwrap();
        (a, b)
    }

    #[test]
    fn batch_of_64_in_one_syscall_arrives_exactly() {
        let (mut a, mut b) = pair();
        let msgs: Vec<Vec<u8>> = (0..64u32).map(|i| vec![i as u8; 1 + (i as usize * 37) % 1400]).collect();
        let batch: Vec<(NodeId, &[u8])> = msgs.iter().map(|m| (2, &m[..])).collect();
        assert_eq!(a.send_batch(&batch).unwrap(), 64);
        assert_eq!(a.counters().syscalls, 1);
        let mut rx = RecvBatch::new(64, 2048);
        let mut got = Vec::new();
        while got.len() < 64 {
            assert!(b.wait_readable(Some(Duration::from_secs(2))).unwrap());
            b.recv_batch(&mut rx).unwrap();
            got.extend(rx.iter().map(|(from, d)| (from, d.to_vec())));
        }
        assert!(b.counters().syscalls < 64);
        let want: Vec<_> = msgs.into_iter().map(|m| (Some(1), m)).collect();
        assert_eq!(got, want);
    }

    /// A receiver that found its socket empty `IDLE_TURNS` times in a row
    /// takes the next datagram alone (`recvfrom`): exact bytes, its
    /// sender's node and address, and a datagram larger than the slot cut
    /// to the slot as a batch cuts it; the call after takes a whole batch
    /// again.
    #[test]
    fn after_empty_receives_one_datagram_then_a_batch() {
        let (mut a, mut b) = pair();
        let mut rx = RecvBatch::new(8, 2048);
        for _ in 0..IDLE_TURNS {
            assert_eq!(b.recv_batch(&mut rx).unwrap(), 0, "empty");
        }
        let big = vec![9u8; 3000];
        assert_eq!(a.send_batch(&[(2, &big[..])]).unwrap(), 1);
        let three: Vec<(NodeId, &[u8])> = vec![(2, b"two"), (2, b"three"), (2, b"four")];
        assert_eq!(a.send_batch(&three).unwrap(), 3);
        assert!(b.wait_readable(Some(Duration::from_secs(2))).unwrap());
        let calls = b.counters().syscalls;
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 1, "alone, after an empty receive");
        let got: Vec<_> = rx.iter().map(|(f, d)| (f, d.to_vec())).collect();
        assert_eq!(got, vec![(Some(1), vec![9u8; 2048])], "cut to the slot");
        assert_eq!(rx.addr(0), a.local_addr());
        assert!(rx.may_hold_more(), "taken alone: the socket may hold more");
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 3, "then a batch");
        assert!(!rx.may_hold_more(), "a batch short of full emptied the socket");
        let got: Vec<_> = rx.iter().map(|(f, d)| (f, d.to_vec())).collect();
        let want: Vec<_> =
            ["two", "three", "four"].iter().map(|m| (Some(1), m.as_bytes().to_vec())).collect();
        assert_eq!(got, want);
        assert_eq!(b.counters().syscalls - calls, 2);
        assert_eq!(b.counters().datagrams_received, 4);
    }

    /// One datagram goes by `sendto`, several by `sendmmsg`: exact bytes,
    /// the sender's node and address either way.
    #[test]
    fn one_datagram_by_sendto_then_a_batch() {
        let (mut a, mut b) = pair();
        let mut rx = RecvBatch::new(8, 2048);
        assert_eq!(a.send_batch(&[(2, &b"one"[..])]).unwrap(), 1);
        let three: Vec<(NodeId, &[u8])> = vec![(2, b"two"), (2, b"three"), (2, b"four")];
        assert_eq!(a.send_batch(&three).unwrap(), 3);
        assert_eq!(a.counters().syscalls, 2);
        assert_eq!(a.counters().datagrams_sent, 4);
        assert!(b.wait_readable(Some(Duration::from_secs(2))).unwrap());
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 4);
        assert_eq!(rx.addr(0), a.local_addr());
        let got: Vec<_> = rx.iter().map(|(f, d)| (f, d.to_vec())).collect();
        let want: Vec<_> =
            ["one", "two", "three", "four"].iter().map(|m| (Some(1), m.as_bytes().to_vec())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn typed_errors_not_panics() {
        let (mut a, mut b) = pair();
        assert_eq!(a.send_to(99, b"x"), Err(TransportError::InvalidEndpoint));
        let big = vec![0u8; 70_000];
        assert_eq!(a.send_to(2, &big), Err(TransportError::InvalidBuffer));
        let mut rx = RecvBatch::new(4, 2048);
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 0);
        let t = std::time::Instant::now();
        assert!(!b.wait_readable(Some(Duration::from_millis(20))).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn bind_failures_name_the_address() {
        let (a, _) = pair();
        let taken = a.local_addr().unwrap();
        let e = UdpTransport::bind(taken, AddressBook::new()).expect_err("the port is taken");
        assert_eq!(e, TransportError::AddrInUse { addr: taken });
        assert!(e.to_string().contains(&taken.to_string()), "{e}");
        // TEST-NET-1 (RFC 5737): no interface here has it.
        let foreign: SocketAddr = "192.0.2.1:7000".parse().unwrap();
        let e = UdpTransport::bind(foreign, AddressBook::new()).expect_err("not a local address");
        assert_eq!(e, TransportError::Bind { addr: foreign, errno: libc::EADDRNOTAVAIL });
        assert!(e.to_string().starts_with("cannot bind 192.0.2.1:7000: "), "{e}");
    }

    #[test]
    fn unknown_source_is_received_without_a_node() {
        let (mut a, _) = pair();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut stranger = UdpTransport::bind(any, AddressBook::new()).unwrap();
        stranger.add_peer(1, a.local_addr().unwrap()).unwrap();
        stranger.send_to(1, b"hi").unwrap();
        let mut rx = RecvBatch::new(4, 64);
        assert!(a.wait_readable(Some(Duration::from_secs(2))).unwrap());
        assert_eq!(a.recv_batch(&mut rx).unwrap(), 1);
        assert_eq!(rx.iter().next().unwrap(), (None, &b"hi"[..]));
        assert_eq!(rx.addr(0), stranger.local_addr());
    }
}
