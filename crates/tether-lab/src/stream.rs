//! `tether stream`: one-way bandwidth, messages of one size sent as fast as
//! the window allows; every delivered byte is verified.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::faults::FaultCounters;
use tether::Refused;

use crate::net::{
    drops, listening, loopback, no_answer, nothing_arrived, Drops, NetOpts, Sender, FIRST_WAIT, RECEIVER,
    SENDER,
};
use crate::pattern;
use crate::raw::RawPeer;
use crate::timeline::Timeline;

const RECV_TIMEOUT: Duration = Duration::from_secs(10);

/// From this size on the sender writes each message into a buffer from the
/// endpoint's pool and hands it over whole (`Endpoint::send_bytes`: kept by
/// the log, no copy before the datagram's, back in the pool once
/// acknowledged); below it copying the bytes into the log costs less than a
/// buffer per message, so it reuses one (`send`).
pub(crate) const HAND_OVER_FROM: usize = 4096;

/// Send message `i` of the stream as `HAND_OVER_FROM` says, waiting up to
/// `timeout` for room.
fn send_pattern(
    tx: &tether::Endpoint,
    buf: &mut [u8],
    i: u64,
    timeout: Duration,
) -> Result<tether::SendHandle, tether::Error> {
    if buf.len() >= HAND_OVER_FROM {
        let msg = pattern::write_message(tx.message_buffer(buf.len()), buf.len(), SENDER, i);
        tx.send_bytes_blocking(RECEIVER, tx.seal(msg), Some(timeout))
    } else {
        pattern::fill(buf, SENDER, i);
        tx.send_blocking(RECEIVER, buf, Some(timeout))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamRun {
    pub messages: u64,
    pub delivered: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub goodput_mb_s: f64,
    pub msgs_per_s: f64,
    pub corrupted: u64,
    pub out_of_order: u64,
    pub retransmits: u64,
    /// The largest datagram the sender sent, as its handshake proved the
    /// path carries (`None`: the raw path, or this process only received).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_datagram: Option<usize>,
    /// Faults the endpoints' injectors applied (`--fault`, `--loss`).
    pub injected: FaultCounters,
    /// The sender's rails: state changes, failovers, per-path counters.
    #[serde(skip_serializing_if = "Timeline::is_empty")]
    pub rails: Timeline,
    /// Datagrams each side dropped, by reason (the non-zero ones): forged,
    /// replayed, from strangers, corrupted, stale ... (`crate::net::drops`).
    /// `None`: this process did not run that side (the other prints it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_drops: Option<Drops>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receiver_drops: Option<Drops>,
    /// Runs of datagrams the sender's kernel segmented, and the receiver's
    /// handed over coalesced (UDP GSO/GRO; `--no-offload`: none). `None`:
    /// this process did not run that side, or ran the raw path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs_received: Option<u64>,
}

/// Runs of datagrams segmented and coalesced over all of `e`'s rails.
fn runs(e: &tether::Endpoint) -> (u64, u64) {
    e.rail_counters().iter().fold((0, 0), |(s, r), c| (s + c.runs_sent, r + c.runs_received))
}

pub fn default_count(size: usize) -> u64 {
    ((256u64 << 20) / size.max(1) as u64).clamp(2_000, 2_000_000)
}

/// Receive-side accounting shared by the raw and reliable paths.
#[derive(Default)]
struct Tally {
    delivered: u64,
    bytes: u64,
    corrupted: u64,
    out_of_order: u64,
    next: u64,
}

impl Tally {
    fn take(&mut self, msg: &[u8], expect_len: usize) {
        self.delivered += 1;
        self.bytes += msg.len() as u64;
        let index =
            if msg.len() >= 8 { pattern::index_of(msg, SENDER).unwrap_or(u64::MAX) } else { self.next };
        if msg.len() != expect_len || !pattern::verify(msg, SENDER, index) {
            self.corrupted += 1;
        }
        if index != self.next {
            self.out_of_order += 1;
        }
        self.next = index.wrapping_add(1);
    }
}

fn run_from(t: Tally, messages: u64, seconds: f64, retransmits: u64, injected: FaultCounters) -> StreamRun {
    StreamRun {
        messages,
        delivered: t.delivered,
        bytes: t.bytes,
        seconds,
        goodput_mb_s: t.bytes as f64 / seconds / 1e6,
        msgs_per_s: t.delivered as f64 / seconds,
        corrupted: t.corrupted,
        out_of_order: t.out_of_order,
        retransmits,
        max_datagram: None,
        injected,
        rails: Timeline::default(),
        sender_drops: None,
        receiver_drops: None,
        runs_sent: None,
        runs_received: None,
    }
}

/// Reliable stream over loopback, both endpoints in this process.
pub fn reliable_loopback(o: &NetOpts, count: u64) -> anyhow::Result<StreamRun> {
    // A wait may span several timeouts in a row: a timer pinned at a
    // second (`tether bench sweep`) takes that long for each.
    let patience = RECV_TIMEOUT.max(o.config().rto_max * 30);
    let (rx, tx) = o.loopback_pair()?;
    let origin = tx.now();
    let size = o.size;
    // The receiver endpoint is handed back, not dropped, so its last
    // (delayed) ACK still goes out while the sender flushes.
    let receiver = std::thread::spawn(move || -> anyhow::Result<(Tally, Instant, tether::Endpoint)> {
        let mut t = Tally::default();
        for _ in 0..count {
            let d = rx.recv(Some(patience))?;
            t.take(&d.message, size);
        }
        Ok((t, Instant::now(), rx))
    });
    let mut buf = vec![0u8; size];
    let start = Instant::now();
    for i in 0..count {
        send_pattern(&tx, &mut buf, i, patience)?;
    }
    // Keep driving the sender until everything is acknowledged, and the
    // receiver once its thread is done: with --polling there is no progress
    // thread, so a coalesced tail or a delayed last ACK waits for us.
    let waiting = Instant::now();
    let mut receiver = Some(receiver);
    let mut done = None;
    loop {
        let flushed = tx.flush(Some(Duration::from_millis(1))).is_ok();
        if done.is_none() && receiver.as_ref().is_some_and(|r| r.is_finished()) {
            let r = receiver.take().expect("checked above");
            done = Some(r.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??);
        }
        match &done {
            Some(_) if flushed => break,
            Some((_, _, rx)) => rx.progress(),
            None => {}
        }
        anyhow::ensure!(waiting.elapsed() < patience, "the last messages were never acknowledged");
    }
    let (tally, end, rx) = done.expect("loop ends with the receiver done");
    let mut injected = tx.fault_counters();
    injected.accumulate(&rx.fault_counters());
    let mut run = run_from(tally, count, (end - start).as_secs_f64(), tx.stats().retransmits, injected);
    run.rails = Timeline::collect(&tx, RECEIVER, origin);
    run.max_datagram = tx.max_datagram_to(RECEIVER);
    run.sender_drops = Some(drops(&tx.stats()));
    run.receiver_drops = Some(drops(&rx.stats()));
    (run.runs_sent, run.runs_received) = (Some(runs(&tx).0), Some(runs(&rx).1));
    Ok(run)
}

/// Split each message into datagrams of at most `mtu` bytes, as tether would.
fn raw_sender(mut peer: RawPeer, o: &NetOpts, count: u64) -> anyhow::Result<()> {
    let size = o.size;
    let chunk = o.mtu.min(size.max(1));
    let per_batch = (32 * chunk / size.max(1)).clamp(1, 32);
    let mut msgs = vec![vec![0u8; size]; per_batch];
    let mut i = 0;
    while i < count {
        let n = per_batch.min((count - i) as usize);
        for (k, m) in msgs.iter_mut().take(n).enumerate() {
            pattern::fill(m, SENDER, i + k as u64);
        }
        peer.send_chunks(RECEIVER, msgs[..n].iter().flat_map(|m| m.chunks(chunk.max(1))))?;
        i += n as u64;
    }
    Ok(())
}

/// Raw stream over loopback: counts what arrives; loss is possible and reported.
pub fn raw_loopback(o: &NetOpts, count: u64) -> anyhow::Result<StreamRun> {
    let spin = Duration::from_micros(o.spin_us);
    let rx_t = o.transport(loopback(), &[], o.seed)?;
    let rx_addr = rx_t.local_addr().expect("UDP has an address");
    let tx_t = o.transport(loopback(), &[(RECEIVER, rx_addr)], o.seed + 1)?;
    let mut rx = RawPeer::new(rx_t, o.mtu, spin);
    let tx = RawPeer::new(tx_t, o.mtu, spin);
    let size = o.size;
    let chunk = o.mtu.min(size.max(1));
    let per_msg = size.div_ceil(chunk).max(1) as u64;
    let start = Arc::new(Instant::now());
    let o2 = o.clone();
    let sender = std::thread::spawn(move || raw_sender(tx, &o2, count));
    let mut t = Tally::default();
    let mut datagrams = 0u64;
    let mut last = Instant::now();
    while datagrams < count * per_msg {
        let n = rx.recv(Duration::from_millis(300))?;
        if n == 0 {
            break; // The sender is done and the rest was lost.
        }
        last = Instant::now();
        for (_, d) in rx.batch.iter() {
            datagrams += 1;
            if per_msg == 1 {
                t.take(d, size);
            } else {
                // Every chunk starts on a word boundary of its message's
                // pattern, so the baseline verifies every byte as tether does.
                t.bytes += d.len() as u64;
                let ok = pattern::index_of(d, SENDER).is_some_and(|i| pattern::verify(d, SENDER, i));
                t.corrupted += (!ok) as u64;
            }
        }
    }
    if per_msg > 1 {
        t.delivered = datagrams / per_msg;
    }
    sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    Ok(run_from(t, count, (last - *start).as_secs_f64(), 0, FaultCounters::default()))
}

/// Two-process mode, receiving side.
pub fn listen(o: &NetOpts, addr: SocketAddr, peer: Sender, count: u64) -> anyhow::Result<StreamRun> {
    let timeout = FIRST_WAIT;
    if o.raw {
        let t = o.transport(addr, &peer.peers(SENDER), o.seed)?;
        let local = t.local_addr().unwrap_or(addr);
        listening("stream", local, peer, &format!("{count} raw messages of {} B", o.size));
        let mut rx = RawPeer::new(t, o.mtu, Duration::from_micros(o.spin_us));
        let mut tally = Tally::default();
        let first = rx.recv(timeout)?;
        if first == 0 {
            return Err(nothing_arrived("stream", local, peer, &Refused::default(), timeout));
        }
        let start = Instant::now();
        let mut last = start;
        let mut n = first;
        while n > 0 {
            last = Instant::now();
            for (_, d) in rx.batch.iter() {
                tally.take(d, o.size.min(o.mtu));
            }
            if tally.delivered >= count {
                break;
            }
            n = rx.recv(Duration::from_millis(500))?;
        }
        return Ok(run_from(
            tally,
            count,
            (last - start).as_secs_f64().max(1e-9),
            0,
            FaultCounters::default(),
        ));
    }
    let rx = o.endpoint(RECEIVER, addr, &peer.peers(SENDER))?;
    let local = rx.local_addr().unwrap_or(addr);
    listening("stream", local, peer, &format!("{count} messages of {} B", o.size));
    let mut tally = Tally::default();
    let terms = crate::net::first_message(&rx, "stream", local, peer, o.give_up_after)?;
    crate::net::agree(&rx, SENDER, crate::net::Terms { size: o.size, count }, &terms.message)?;
    let first = rx.recv(Some(RECV_TIMEOUT))?;
    let start = Instant::now();
    tally.take(&first.message, o.size);
    for _ in 1..count {
        let d = rx.recv(Some(RECV_TIMEOUT))?;
        tally.take(&d.message, o.size);
    }
    let end = Instant::now();
    // Linger so the last ACKs reach the sender before this endpoint goes away.
    let linger = Instant::now();
    while linger.elapsed() < Duration::from_millis(300) {
        rx.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut run = run_from(tally, count, (end - start).as_secs_f64().max(1e-9), 0, rx.fault_counters());
    run.receiver_drops = Some(drops(&rx.stats()));
    run.runs_received = Some(runs(&rx).1);
    Ok(run)
}

/// Two-process mode, sending side: done when everything is acknowledged.
pub fn connect(o: &NetOpts, addr: SocketAddr, bind: SocketAddr, count: u64) -> anyhow::Result<StreamRun> {
    if o.raw {
        let t = o.transport(bind, &[(RECEIVER, addr)], o.seed)?;
        let tx = RawPeer::new(t, o.mtu, Duration::from_micros(o.spin_us));
        let start = Instant::now();
        raw_sender(tx, o, count)?;
        let secs = start.elapsed().as_secs_f64();
        let t = Tally { delivered: count, bytes: count * o.size as u64, ..Tally::default() };
        return Ok(run_from(t, count, secs, 0, FaultCounters::default()));
    }
    let tx = o.endpoint(SENDER, bind, &[(RECEIVER, addr)])?;
    let origin = tx.now();
    let mut buf = vec![0u8; o.size];
    // Messages to a peer that stopped answering fail after --give-up-after;
    // stop at the first failure rather than refill the send buffer and wait
    // that long again for every bufferful still to send.
    let keyed = o.key_file.is_some();
    // The stream's own messages: the run's terms (`net::offer`), the first
    // message acknowledged, are not among them.
    let stream_stats = || {
        let mut s = tx.stats();
        s.messages_acked = s.messages_acked.saturating_sub(1);
        s
    };
    let quiet = || no_answer("stream", addr, bind, count, o.give_up_after, &stream_stats(), keyed);
    // Looked at every 256 messages and after any wait for room, which is
    // when failures free it: often enough, and no lock per message.
    // A peer that gave no sign of life for --give-up-after is reported at
    // once: no linger for messages queued behind the failure (dropping the
    // endpoint would wait `Options::linger` for them, a second past the
    // user's bound).
    let gone = |tx: tether::Endpoint, e: anyhow::Error| {
        let _ = tx.close(Duration::ZERO);
        Err(e)
    };
    let terms = crate::net::Terms { size: o.size, count };
    if let Err(e) = crate::net::offer(&tx, RECEIVER, addr, terms, o.give_up_after * 2, quiet) {
        return gone(tx, e);
    }
    let start = Instant::now();
    for i in 0..count {
        let t0 = Instant::now();
        match send_pattern(&tx, &mut buf, i, o.give_up_after * 2) {
            Ok(_) => {}
            // No room for twice the bound: nothing was acknowledged.
            Err(tether::Error::TimedOut) => {
                let e = quiet();
                return gone(tx, e);
            }
            Err(e) => return Err(e.into()),
        }
        if (i % 256 == 255 || t0.elapsed() > Duration::from_millis(1)) && tx.stats().messages_failed > 0 {
            let e = quiet();
            return gone(tx, e);
        }
    }
    if let Err(e) = crate::net::drain(&tx, o.give_up_after, quiet) {
        return gone(tx, e);
    }
    let secs = start.elapsed().as_secs_f64();
    let s = stream_stats();
    let t =
        Tally { delivered: s.messages_acked, bytes: s.messages_acked * o.size as u64, ..Tally::default() };
    let mut run = run_from(t, count, secs, s.retransmits, tx.fault_counters());
    run.rails = Timeline::collect(&tx, RECEIVER, origin);
    run.max_datagram = tx.max_datagram_to(RECEIVER);
    run.sender_drops = Some(drops(&s));
    run.runs_sent = Some(runs(&tx).0);
    Ok(run)
}
