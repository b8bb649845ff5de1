//! The limit of the machine for `tether bench` (the baseline is
//! the limit, not a convenient one): the same round trip and stream with nothing between the
//! application and the kernel. Two connected, non-blocking UDP sockets on
//! loopback; each side spins on `recv`/`send` (thin wrappers over the C
//! calls: a C program makes the same system calls), messages cut into the
//! largest datagrams UDP carries (65,507 B). What tether adds is measured
//! against this, in the same run.
//!
//! The receiving side checks every byte of what it gets, as the tether
//! side of the benchmark does (`crate::pattern`): application work both
//! sides pay, so the ratio is the transport's.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use crate::pattern;
use crate::summary::Summary;

/// The largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;
/// No datagram for this long: one was lost (a round trip cannot finish).
const LOST_AFTER: Duration = Duration::from_secs(1);
const WARMUP: u64 = 200;
const SRC: u32 = 1;

/// Two sockets on loopback, connected to each other, non-blocking, with
/// the socket buffers tether's own get (`tether_io::grow_buffers`).
fn pair() -> anyhow::Result<(UdpSocket, UdpSocket)> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    a.connect(b.local_addr()?)?;
    b.connect(a.local_addr()?)?;
    for s in [&a, &b] {
        s.set_nonblocking(true)?;
        tether_io::grow_buffers(s);
    }
    Ok((a, b))
}

/// Spin until a datagram arrives into `buf`: its length.
fn recv_spin(s: &UdpSocket, buf: &mut [u8]) -> anyhow::Result<usize> {
    let start = Instant::now();
    loop {
        match s.recv(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > LOST_AFTER {
                    anyhow::bail!("limit baseline: no datagram for {LOST_AFTER:?} (one was lost)");
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Send `msg` as datagrams of at most `MAX_DATAGRAM` (one empty one if
/// it is empty), spinning while the socket buffer is full.
fn send_spin(s: &UdpSocket, msg: &[u8]) -> anyhow::Result<()> {
    let empty = msg.is_empty().then_some(msg);
    for chunk in msg.chunks(MAX_DATAGRAM).chain(empty) {
        loop {
            match s.send(chunk) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Receive one message of `size` bytes (its datagrams) into `msg`.
fn recv_message(s: &UdpSocket, msg: &mut [u8]) -> anyhow::Result<()> {
    let chunks = msg.len().div_ceil(MAX_DATAGRAM).max(1);
    let mut at = 0;
    for _ in 0..chunks {
        let end = (at + MAX_DATAGRAM).min(msg.len());
        let n = recv_spin(s, &mut msg[at..end.max(at)])?;
        at += n;
    }
    Ok(())
}

/// `count` round trips of `size`-byte messages, after a warm-up: the round
/// trip in microseconds (median and spread over the round trips).
pub fn round_trips(size: usize, count: u64) -> anyhow::Result<Summary> {
    let (client, server) = pair()?;
    let total = count + WARMUP;
    let echo = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut msg = vec![0u8; size];
        for _ in 0..total {
            recv_message(&server, &mut msg)?;
            send_spin(&server, &msg)?;
        }
        Ok(())
    });
    let mut msg = vec![0u8; size];
    let mut back = vec![0u8; size];
    let mut samples = Vec::with_capacity(count as usize);
    for i in 0..total {
        pattern::fill(&mut msg, SRC, i);
        let t0 = Instant::now();
        send_spin(&client, &msg)?;
        recv_message(&client, &mut back)?;
        let rtt = t0.elapsed();
        anyhow::ensure!(pattern::verify(&back, SRC, i), "limit baseline: round trip {i} came back changed");
        if i >= WARMUP {
            samples.push(rtt.as_secs_f64() * 1e6);
        }
    }
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    Ok(Summary::of(&samples).expect("count >= 1"))
}

/// What a stream at the limit delivered.
#[derive(Debug, Clone, Copy)]
pub struct LimitStream {
    /// Payload bytes received and checked, a second (first to last), MB/s.
    pub goodput_mb_s: f64,
    /// Datagrams received over datagrams sent: UDP drops what the
    /// receiver's buffer has no room for, and nothing resends it.
    pub delivered_fraction: f64,
}

/// `count` messages of `size` bytes sent as fast as the socket takes them,
/// in maximal datagrams, each datagram's bytes checked on arrival.
pub fn stream(size: usize, count: u64) -> anyhow::Result<LimitStream> {
    let (tx, rx) = pair()?;
    let chunk = size.clamp(1, MAX_DATAGRAM);
    let per_msg = size.div_ceil(chunk).max(1) as u64;
    let sent = count * per_msg;
    let sender = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut msg = vec![0u8; size];
        for i in 0..count {
            // Every datagram a pattern of its own, so each is checked alone.
            for (k, c) in msg.chunks_mut(chunk).enumerate() {
                pattern::fill(c, SRC, i * per_msg + k as u64);
            }
            send_spin(&tx, &msg)?;
        }
        Ok(())
    });
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let (mut got, mut bytes, mut bad) = (0u64, 0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    while got < sent {
        let n = match rx.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // The sender is done and the rest was dropped.
                if first.is_some() && last.elapsed() > Duration::from_millis(300) {
                    break;
                }
                std::hint::spin_loop();
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        got += 1;
        bytes += n as u64;
        let d = &buf[..n];
        let ok = n < 8 || pattern::index_of(d, SRC).is_some_and(|i| pattern::verify(d, SRC, i));
        bad += u64::from(!ok);
    }
    sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    anyhow::ensure!(bad == 0, "limit baseline: {bad} datagrams changed on loopback");
    let secs = first.map_or(0.0, |f| (last - f).as_secs_f64()).max(1e-9);
    Ok(LimitStream { goodput_mb_s: bytes as f64 / secs / 1e6, delivered_fraction: got as f64 / sent as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_streams_of_every_size_check_out() {
        for size in [0, 8, 1024, MAX_DATAGRAM + 1, 200_000] {
            let rtt = round_trips(size, 50).unwrap();
            assert!(rtt.median > 0.0, "{size}: {rtt:?}");
            let s = stream(size, 50).unwrap();
            assert!(s.delivered_fraction > 0.0 && s.delivered_fraction <= 1.0, "{size}: {s:?}");
        }
    }
}
