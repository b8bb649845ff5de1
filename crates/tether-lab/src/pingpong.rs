//! `tether pingpong`: round-trip latency of one message at a time, echoed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::net::{
    drops, listening, loopback, nothing_arrived, Drops, NetOpts, Sender, FIRST_WAIT, RECEIVER, SENDER,
};
use crate::pattern;
use crate::raw::RawPeer;
use crate::summary::Summary;

const TIMEOUT: Duration = Duration::from_secs(10);
const WARMUP: u64 = 200;

#[derive(Debug, Clone, Serialize)]
pub struct PingpongRun {
    /// Round-trip times in microseconds.
    pub rtt_us: Summary,
    pub corrupted: u64,
    pub retransmits: u64,
    /// The endpoint's smoothed round trip to its peer at the end (what its
    /// retransmission timer starts from), in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srtt_us: Option<f64>,
    /// Its retransmission timer to the peer at the end, without back-off,
    /// in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rto_us: Option<f64>,
    /// What this side's endpoint dropped, by reason (empty for raw).
    pub drops: Drops,
    /// What the echo side dropped, when this process ran it (loopback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo_drops: Option<Drops>,
}

pub fn default_count(size: usize) -> u64 {
    if size >= 256 * 1024 {
        200
    } else {
        5_000
    }
}

/// Echo `rounds` messages back to their sender, each the very bytes
/// received (`send_bytes`: no copy but into the datagrams, as the raw
/// baseline sends from its buffer); what the echo side dropped, by reason.
fn reliable_echo(ep: &tether::Endpoint, rounds: u64) -> anyhow::Result<Drops> {
    for _ in 0..rounds {
        let d = ep.recv(Some(TIMEOUT))?;
        ep.send_bytes(d.from, d.message)?;
    }
    ep.flush(Some(TIMEOUT))?;
    Ok(drops(&ep.stats()))
}

/// Who the client talks to, for its errors: the listener's address and
/// this side's (two-process mode) or none (loopback).
type Far = Option<(SocketAddr, SocketAddr)>;

fn reliable_client(ep: &tether::Endpoint, o: &NetOpts, count: u64, far: Far) -> anyhow::Result<PingpongRun> {
    let size = o.size;
    // Capped: a huge --count grows the vector as it goes instead of
    // reserving gigabytes up front.
    let mut samples = Vec::with_capacity(count.min(1 << 20) as usize);
    let mut corrupted = 0;
    // A round trip crosses twice; each way the layer gives up after
    // --give-up-after without an acknowledgement.
    let bound = o.give_up_after * 2;
    for i in 0..count + WARMUP {
        // Written into a buffer of the endpoint's pool and handed over
        // whole, as `tether stream` does: the send copies nothing but into
        // the datagrams, as the raw baseline sends from its buffer.
        let msg = ep.seal(pattern::write_message(ep.message_buffer(size), size, SENDER, i));
        let t0 = Instant::now();
        ep.send_bytes(RECEIVER, msg)?;
        let d = match ep.recv(Some(bound)) {
            Err(tether::Error::TimedOut) => return Err(silent(far, i, count + WARMUP, bound)),
            r => r?,
        };
        let rtt = t0.elapsed();
        if d.message.len() != size || !pattern::verify(&d.message, SENDER, i) {
            corrupted += 1;
        }
        if i >= WARMUP {
            samples.push(rtt.as_secs_f64() * 1e6);
        }
    }
    ep.flush(Some(TIMEOUT))?;
    let rtt_us = Summary::of(&samples).expect("count > 0");
    let stats = ep.stats();
    Ok(PingpongRun {
        rtt_us,
        corrupted,
        retransmits: stats.retransmits,
        srtt_us: ep.rtt(RECEIVER).map(|d| d.as_secs_f64() * 1e6),
        rto_us: ep.base_rto(RECEIVER).map(|d| d.as_secs_f64() * 1e6),
        drops: drops(&stats),
        echo_drops: None,
    })
}

/// No echo came back within `waited`.
fn silent(far: Far, done: u64, total: u64, waited: Duration) -> anyhow::Error {
    let waited = tether_fault::format_duration(waited);
    match far {
        Some((addr, bind)) if done == 0 => anyhow::anyhow!(
            "nobody answered at {addr}: no echo within {waited}; \
             is `tether pingpong --listen {addr} --peer {bind}` running there?"
        ),
        Some((addr, _)) => {
            anyhow::anyhow!(
                "{addr} stopped answering after {done} of {total} round trips (no echo within {waited})"
            )
        }
        None => anyhow::anyhow!("the echo side stopped answering after {done} of {total} round trips"),
    }
}

pub fn reliable_loopback(o: &NetOpts, count: u64) -> anyhow::Result<PingpongRun> {
    let (server, client) = o.loopback_pair()?;
    let echo = std::thread::spawn(move || reliable_echo(&server, count + WARMUP));
    let mut run = reliable_client(&client, o, count, None)?;
    run.echo_drops = Some(echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??);
    Ok(run)
}

/// Send a message as datagrams of at most `mtu` bytes and wait for all of
/// them to come back: the raw transport's round trip for the same size.
fn raw_round_trip(peer: &mut RawPeer, dst: u32, msg: &[u8], mtu: usize) -> anyhow::Result<usize> {
    let chunks = msg.len().div_ceil(mtu).max(1);
    raw_send(peer, dst, msg, mtu)?;
    let mut got = 0;
    let mut bytes = 0;
    while got < chunks {
        let n = peer.recv(TIMEOUT)?;
        if n == 0 {
            anyhow::bail!("raw round trip timed out (a datagram was lost)");
        }
        got += n;
        bytes += peer.batch.iter().map(|(_, d)| d.len()).sum::<usize>();
    }
    Ok(bytes)
}

/// Echo `count + WARMUP` messages; the first may take `first` to come,
/// and `silent` says why when it does not.
fn raw_echo(
    mut peer: RawPeer,
    (count, size, mtu): (u64, usize, usize),
    first: Duration,
    silent: impl FnOnce() -> anyhow::Error,
) -> anyhow::Result<()> {
    let chunks = size.div_ceil(mtu).max(1);
    let mut buf = vec![0u8; size];
    let mut silent = Some(silent);
    for i in 0..count + WARMUP {
        let mut got = 0;
        let mut at = 0;
        while got < chunks {
            let n = peer.recv(if i == 0 && got == 0 { first } else { TIMEOUT })?;
            if n == 0 && i == 0 && got == 0 {
                return Err(silent.take().expect("only the first wait")());
            }
            if n == 0 {
                anyhow::bail!("raw echo timed out");
            }
            got += n;
            for (_, d) in peer.batch.iter() {
                let end = (at + d.len()).min(size);
                buf[at..end].copy_from_slice(&d[..end - at]);
                at = end;
            }
        }
        raw_send(&mut peer, SENDER, &buf, mtu)?;
    }
    Ok(())
}

/// Send `msg` as datagrams of at most `mtu` bytes (one empty datagram if empty).
fn raw_send(peer: &mut RawPeer, dst: u32, msg: &[u8], mtu: usize) -> anyhow::Result<()> {
    peer.send_chunks(dst, msg.chunks(mtu).chain(msg.is_empty().then_some(msg)))?;
    Ok(())
}

pub fn raw_loopback(o: &NetOpts, count: u64) -> anyhow::Result<PingpongRun> {
    let spin = Duration::from_micros(o.spin_us);
    let server_t = o.transport(loopback(), &[], o.seed)?;
    let server_addr = server_t.local_addr().expect("udp");
    let client_t = o.transport(loopback(), &[(RECEIVER, server_addr)], o.seed + 1)?;
    let client_addr = client_t.local_addr().expect("udp");
    let mut server = RawPeer::new(server_t, o.mtu, spin);
    server.t.add_peer(SENDER, client_addr)?;
    let (size, mtu) = (o.size, o.mtu);
    let echo = std::thread::spawn(move || {
        raw_echo(server, (count, size, mtu), TIMEOUT, || anyhow::anyhow!("raw echo timed out"))
    });
    let mut client = RawPeer::new(client_t, o.mtu, spin);
    let mut buf = vec![0u8; size];
    let mut samples = Vec::with_capacity(count.min(1 << 20) as usize);
    for i in 0..count + WARMUP {
        pattern::fill(&mut buf, SENDER, i);
        let t0 = Instant::now();
        raw_round_trip(&mut client, RECEIVER, &buf, mtu)?;
        if i >= WARMUP {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    Ok(PingpongRun {
        rtt_us: Summary::of(&samples).expect("count > 0"),
        corrupted: 0,
        retransmits: 0,
        srtt_us: None,
        rto_us: None,
        drops: Drops::new(),
        echo_drops: None,
    })
}

/// Two-process mode: the echo side. What it dropped, by reason (`None`: raw).
pub fn listen(o: &NetOpts, addr: SocketAddr, peer: Sender, count: u64) -> anyhow::Result<Option<Drops>> {
    let what = format!("{} round trips of {} B ({count} and {WARMUP} to warm up)", count + WARMUP, o.size);
    if o.raw {
        let t = o.transport(addr, &peer.peers(SENDER), o.seed)?;
        let local = t.local_addr().unwrap_or(addr);
        listening("pingpong", local, peer, &format!("{what}, raw"));
        let peer_t = RawPeer::new(t, o.mtu, Duration::from_micros(o.spin_us));
        raw_echo(peer_t, (count, o.size, o.mtu), FIRST_WAIT, || {
            nothing_arrived("pingpong", local, peer, &tether::Refused::default(), FIRST_WAIT)
        })?;
        return Ok(None);
    }
    let ep = o.endpoint(RECEIVER, addr, &peer.peers(SENDER))?;
    let local = ep.local_addr().unwrap_or(addr);
    listening("pingpong", local, peer, &what);
    let terms = crate::net::first_message(&ep, "pingpong", local, peer, o.give_up_after)?;
    crate::net::agree(&ep, SENDER, crate::net::Terms { size: o.size, count }, &terms.message)?;
    reliable_echo(&ep, count + WARMUP).map(Some)
}

/// Two-process mode: the measuring side.
pub fn connect(o: &NetOpts, addr: SocketAddr, bind: SocketAddr, count: u64) -> anyhow::Result<PingpongRun> {
    if o.raw {
        let t = o.transport(bind, &[(RECEIVER, addr)], o.seed)?;
        let mut client = RawPeer::new(t, o.mtu, Duration::from_micros(o.spin_us));
        let mut buf = vec![0u8; o.size];
        let mut samples = Vec::new();
        for i in 0..count + WARMUP {
            pattern::fill(&mut buf, SENDER, i);
            let t0 = Instant::now();
            // Raw has no acknowledgements to give up on: a lost datagram
            // ends the run after TIMEOUT, and so does an absent listener.
            raw_round_trip(&mut client, RECEIVER, &buf, o.mtu).map_err(|e| {
                if i == 0 {
                    silent(Some((addr, bind)), 0, count + WARMUP, TIMEOUT)
                } else {
                    e
                }
            })?;
            if i >= WARMUP {
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        return Ok(PingpongRun {
            rtt_us: Summary::of(&samples).expect("count > 0"),
            corrupted: 0,
            retransmits: 0,
            srtt_us: None,
            rto_us: None,
            drops: Drops::new(),
            echo_drops: None,
        });
    }
    let ep = o.endpoint(SENDER, bind, &[(RECEIVER, addr)])?;
    // Both sides agree on the run first: an echo side expecting other
    // sizes or counts says so, rather than a round trip timing out.
    let bound = o.give_up_after * 2;
    let quiet = || silent(Some((addr, bind)), 0, count + WARMUP, bound);
    crate::net::offer(&ep, RECEIVER, addr, crate::net::Terms { size: o.size, count }, bound, quiet)?;
    reliable_client(&ep, o, count, Some((addr, bind)))
}
