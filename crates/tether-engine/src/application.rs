//! An application attached to the engine, and its data path (docs/ENGINE.md,
//! "Step 1 in detail"; Zhou et al. [FTGM] section 4): its submissions
//! taken into its core, its completions published (failures, then settled
//! marks, then deliveries), its datagrams handed to the driver, and its
//! streams' backups written before the datagrams they cover leave. What
//! admits an application, resumes it with a new engine and lays out its
//! direct paths is the engine's control part (`admit`, `resume`, `pairs`).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use tether_attach::records::PAYLOAD_HEAD;
use tether_attach::{is_probe_node, Completion, EngineCounters, Submission, Taken};
use tether_driver::Driver;
use tether_fault::FaultCounters;
use tether_proto::{
    Channel, Endpoint as Core, Event, FailReason, Instant, MessageId, NodeId, RailId, SendError, Unsettled,
};
use tether_proto::{MessagePool, POOL_FROM};
use tether_shm::{ClientRegion, ShmError, StreamBackup};
use tracing::{debug, warn};

use crate::book::Book;
use crate::heartbeat::Heartbeat;
use crate::stats::EngineStats;

/// Applications one engine serves at most.
pub const MAX_CLIENTS: usize = 256;

/// Submissions taken from one application per turn, so one busy
/// application cannot starve the others or the network.
pub(crate) const SUBMISSIONS_PER_TURN: usize = 256;

/// How often an application's protocol counters are published to it
/// (when they changed): `Endpoint::stats` in engine mode.
pub(crate) const COUNTERS_EVERY: Duration = Duration::from_millis(50);

/// An application attached to the engine.
pub(crate) struct Application {
    pub(crate) node: NodeId,
    pub(crate) pid: u32,
    pub(crate) region: ClientRegion,
    /// Where the region is: removed here if its owner dies (`crate::reclaim`).
    pub(crate) path: PathBuf,
    pub(crate) core: Core,
    pub(crate) conn: UnixStream,
    /// The submission being handled; `stalled` while the core has no room.
    pub(crate) record: Vec<u8>,
    pub(crate) stalled: bool,
    /// The core's pool of message buffers: a large submission is taken
    /// into one, which the send log then keeps as it is (`take_into`).
    pub(crate) pool: MessagePool,
    /// The small submissions' buffer while `record` is a pooled one.
    pub(crate) spare: Vec<u8>,
    /// A completion the ring had no room for, published before any other.
    pub(crate) held: Vec<u8>,
    /// Per peer, the settled mark last published.
    pub(crate) settled: BTreeMap<NodeId, u64>,
    /// Per peer, its pair of backup blocks (`2 * slot`, `2 * slot + 1`)
    /// and what was last written there.
    pub(crate) backups: BTreeMap<NodeId, (usize, Option<StreamBackup>)>,
    /// Rails each peer was given.
    pub(crate) rails: BTreeMap<NodeId, usize>,
    /// The backup a dead engine left, as found at attachment.
    pub(crate) recovered: BTreeMap<NodeId, (usize, Option<StreamBackup>)>,
    /// Taking a dead engine's place: what the application resubmits. Until
    /// it is all there the core is not run, so nothing touches the backup.
    pub(crate) resuming: Option<BTreeMap<NodeId, Resumed>>,
    /// `Close` received: detach once everything settles or by then.
    pub(crate) closing: Option<Instant>,
    /// Closing and settled: the ACKs it owes its peers may go out until
    /// then (`Engine::turn`).
    pub(crate) acks_by: Option<Instant>,
    /// Lost its connection or broke the protocol.
    pub(crate) gone: bool,
    /// `EngineOptions::backup`.
    pub(crate) backup: bool,
    /// Peers it named at this engine's own addresses (a direct path each,
    /// set up by `Engine::pair_up`), and peers whose doorbell it asked to
    /// have rung after a push on such a path.
    pub(crate) local_requests: Vec<NodeId>,
    pub(crate) wakes: Vec<NodeId>,
    /// Completions of the engine's own making (the direct paths' news),
    /// published before anything else, in order.
    pub(crate) control_out: VecDeque<Vec<u8>>,
    /// Attached as a new life: its direct paths are laid anew.
    pub(crate) fresh: bool,
    /// When its counters are next published, and what was last published.
    pub(crate) counters_due: Instant,
    pub(crate) counters_sent: tether_proto::Stats,
    pub(crate) faults_sent: FaultCounters,
    pub(crate) checks_sent: EngineCounters,
    pub(crate) counters_buf: Vec<u8>,
}

/// Bytes a record adds to a payload at most (kind, ids, length).
pub(crate) const RECORD_OVERHEAD: usize = 48;

/// How far ahead of the highest sequence number sent the backup records
/// its high-water mark: a block write per this many segments.
pub(crate) const SENT_MARGIN: u64 = 1024;

/// Take the application's submissions into its core, at most
/// `SUBMISSIONS_PER_TURN`; a send the core has no room for stays until it
/// has (back-pressure: the ring fills and the application waits).
pub(crate) fn take_submissions(
    c: &mut Application,
    book: &mut Book,
    driver: &mut Driver,
    own: &[SocketAddr],
    stats: &mut EngineStats,
    now: Instant,
    beat: Option<&Heartbeat>,
) -> bool {
    // Out of `c` while it is read, so handling may change `c`.
    let mut record = std::mem::take(&mut c.record);
    let mut taken = 0;
    while taken < SUBMISSIONS_PER_TURN && c.closing.is_none() {
        // Long work is progress, not a hang: the heartbeat says so.
        beat.inspect(|h| h.beat());
        // A stalled submission is this process's copy, taken whole from
        // the ring before (never re-read from shared memory).
        assert!(!c.stalled || !record.is_empty(), "node {}: stalled on no submission", c.node);
        if !c.stalled {
            fit_record(c, &mut record);
            match c.region.submissions.pop(&mut record) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    c.broke(stats, &format!("submission ring: {e}"));
                    break;
                }
            }
        }
        match take(c, &mut record, book, driver, own, now, beat) {
            Ok(true) => taken += 1,
            Ok(false) => break,
            Err(why) => {
                c.broke(stats, &why);
                break;
            }
        }
    }
    c.record = record;
    taken > 0 || c.gone
}

/// Make `record` the buffer for the next submission: one from the core's
/// pool for a large one (its length as its header says; `pop` checks the
/// record), the small submissions' own otherwise. A large submission's
/// buffer becomes its message in the send log (`take`), so a stream of
/// large messages is copied once in the engine, out of the ring, and
/// allocates nothing once the pool is warm.
fn fit_record(c: &mut Application, record: &mut Vec<u8>) {
    match c.region.submissions.next_len() {
        Some(n) if n >= POOL_FROM && record.capacity() < n => {
            let old = std::mem::replace(record, c.pool.take(n));
            if (1..POOL_FROM).contains(&old.capacity()) {
                c.spare = old;
            }
        }
        Some(n) if n >= POOL_FROM => {}
        _ if record.capacity() == 0 => *record = std::mem::take(&mut c.spare),
        _ => {}
    }
}

/// Queue an application's message on `channel` (a call's envelope rides
/// another) on the core.
pub(crate) fn send(
    core: &mut Core,
    now: Instant,
    peer: NodeId,
    payload: &[u8],
    channel: Channel,
) -> Result<MessageId, SendError> {
    if channel == Channel::APP {
        core.send(now, peer, payload)
    } else {
        core.send_on_slice(now, peer, channel, payload)
    }
}

/// One submission: `Ok(false)` if the core has no room for it yet (it
/// stays, `stalled`), an error if the application broke the protocol.
pub(crate) fn take(
    c: &mut Application,
    record: &mut Vec<u8>,
    book: &mut Book,
    driver: &mut Driver,
    own: &[SocketAddr],
    now: Instant,
    beat: Option<&Heartbeat>,
) -> Result<bool, String> {
    let s = Submission::decode(record).map_err(|e| format!("submission: {e}"))?;
    match s {
        Submission::Send { id, peer, payload, channel } if c.resuming.is_some() => {
            if !c.resumed_message(peer, id, payload, channel) {
                return Err(format!("resuming: message {id} to {peer} out of order"));
            }
        }
        Submission::Resume { peer, failed_upto, taken } => {
            let r = c.resuming.get_or_insert_with(BTreeMap::new).entry(peer).or_default();
            (r.failed_upto, r.taken) = (failed_upto, taken);
        }
        Submission::ResumeEnd => c.resume(now, beat)?,
        Submission::Send { id, peer, payload, channel } => {
            // A large message in a pooled buffer the core has room for: the
            // buffer itself goes into the send log, the record's head
            // sliced off; a smaller one is copied into the log's arena.
            let sent = if payload.len() >= POOL_FROM && c.core.can_send(peer, payload.len()) {
                let at = payload.as_ptr() as usize - record.as_ptr() as usize;
                let range = at..at + payload.len();
                let message = c.pool.seal(std::mem::take(record)).slice(range);
                match channel {
                    Channel::APP => c.core.send_bytes(now, peer, message),
                    _ => c.core.send_on(now, peer, channel, message),
                }
            } else {
                send(&mut c.core, now, peer, payload, channel)
            };
            match sent {
                Ok(m) if m.seq == id => c.stalled = false,
                Ok(m) => return Err(format!("send id {id} to {peer}, the stream's next is {}", m.seq)),
                Err(SendError::WouldBlock) => {
                    c.stalled = true;
                    return Ok(false);
                }
                Err(e) => return Err(format!("send {id} to {peer}: {e}")),
            }
        }
        Submission::AddPeer { node, .. } if is_probe_node(node) => {
            return Err(format!("peer {node} is reserved for the engine's self-test"));
        }
        Submission::AddPeer { node, rails: addrs } => {
            let addrs: Vec<_> = addrs.iter().take(own.len()).collect();
            if addrs == own && node != c.node {
                // Attached here too (or to be): a direct path, and nothing
                // of it in the core (`Engine::pair_up`).
                if c.local_requests.len() >= MAX_CLIENTS {
                    return Err("more direct paths asked for than an engine serves applications".into());
                }
                c.local_requests.push(node);
                assert!(c.local_requests.len() <= MAX_CLIENTS, "direct paths asked for past the bound");
            } else {
                c.add_remote_peer(book, driver, node, &addrs)?;
                c.control_out.push_back(completion(&Completion::PeerAdded { peer: node }));
            }
        }
        Submission::Wake { peer } => {
            if !c.wakes.contains(&peer) && c.wakes.len() < MAX_CLIENTS {
                c.wakes.push(peer);
            }
            assert!(c.wakes.len() <= MAX_CLIENTS, "doorbells asked for past the bound");
        }
        Submission::Close { linger_ns } => c.closing = Some(now + Duration::from_nanos(linger_ns)),
    }
    Ok(true)
}

/// Publish completions in their order: a held one first, then failures
/// (events), then settled marks (after the failures they cover), then
/// deliveries. A full ring holds the record and stops: the core's own
/// delivery queue backs up, which is the commit point's back-pressure.
pub(crate) fn publish(c: &mut Application, out: &mut Vec<u8>) -> bool {
    let mut any = false;
    if !c.held.is_empty() {
        match c.region.completions.push(&c.held) {
            Ok(()) => {
                c.held.clear();
                any = true;
            }
            Err(_) => return false,
        }
    }
    while let Some(record) = c.control_out.front() {
        if c.region.completions.push(record).is_err() {
            return any;
        }
        c.control_out.pop_front();
        any = true;
    }
    // A failure report or a refusal report, the largest (1 + 11 x 8).
    out.resize(96, 0);
    // Failures first: a failure the application was told of is never
    // undone by a restore (docs/ENGINE.md, "Restore").
    while let Some(event) = c.core.poll_event() {
        let (failed, reason) = match event {
            Event::PeerUnreachable { failed } => (failed, FailReason::PeerUnreachable),
            Event::PeerRestarted { failed, .. } => (failed, FailReason::PeerRestarted),
            Event::StreamReset { failed } => (failed, FailReason::StreamReset),
            // Passed on: the application learns why a peer gets nothing.
            Event::Refused { refused, .. } => {
                let n = Completion::Refused { refused }.encode(out).expect("96 bytes hold a refusal report");
                if !c.push_or_hold(&out[..n]) {
                    return any;
                }
                any = true;
                continue;
            }
            other => {
                debug!(node = c.node, event = ?other, "event not forwarded to the application");
                continue;
            }
        };
        if failed.is_empty() {
            continue;
        }
        let n = Completion::Failed { failed, reason }.encode(out).expect("96 bytes hold a failure");
        if !c.push_or_hold(&out[..n]) {
            return any;
        }
        any = true;
    }
    // The backup before the marks it covers: the application lets go of a
    // message only once a new engine could not need it.
    let peers: Vec<NodeId> = c.core.peers().collect();
    for &peer in &peers {
        c.back_up(peer);
    }
    for peer in peers {
        let below = c.core.settled_below(peer).unwrap_or(0);
        let last = c.settled.entry(peer).or_insert(0);
        if below > *last {
            *last = below;
            let n = Completion::Settled { peer, below }.encode(out).expect("64 bytes hold a mark");
            if !c.push_or_hold(&out[..n]) {
                return any;
            }
            any = true;
        }
    }
    // Fragments as they came; taking each is the commit point, so one is
    // taken only when the ring has room for it.
    while let Some(len) = c.core.next_delivery_len() {
        if !c.region.completions.fits(len + RECORD_OVERHEAD) {
            break;
        }
        let Some(d) = c.core.recv() else { break };
        let Some(fragment) = d.fragment else {
            warn!(node = c.node, "a whole message from a core in fragment mode");
            continue;
        };
        out.resize(PAYLOAD_HEAD, 0);
        let (n, payload) =
            Completion::Delivery { from: d.from, fragment, channel: d.channel, payload: &d.message }
                .encode_parts(out)
                .expect("a delivery's head fits PAYLOAD_HEAD");
        any = true;
        if !c.push_parts_or_hold(&out[..n], payload) {
            return any;
        }
    }
    any
}

/// What `transmit` sent: datagrams, and bit `r` set for each rail `r`
/// it used (in `full`, for full-size datagrams).
#[derive(Debug, Default)]
pub(crate) struct Sent {
    pub(crate) datagrams: usize,
    pub(crate) rails: u32,
    pub(crate) full: u32,
}

/// Send what the core has, through the driver's batches; what a full
/// socket does not take waits in the driver for the next turn.
pub(crate) fn transmit(
    c: &mut Application,
    driver: &mut Driver,
    now: Instant,
    beat: Option<&Heartbeat>,
) -> Sent {
    let mut sent = Sent::default();
    let taken = driver.transmit(|buf| {
        let full = buf.len();
        let t = c.core.poll_transmit(now, buf)?;
        beat.inspect(|h| h.beat());
        // Record before send: the datagram may carry a sequence number past
        // the backed-up high-water mark.
        c.back_up(t.dst);
        // The rail is in use; full datagrams mean messages that fragment.
        sent.rails |= 1 << t.rail;
        if t.len + 64 >= full {
            sent.full |= 1 << t.rail;
        }
        Some(t)
    });
    // Those built now and those an earlier turn left waiting alike: a
    // turn that only flushes is busy too, and the loop does not sleep on it.
    sent.datagrams = taken;
    sent
}

impl Application {
    /// A peer reached through the rails: in the address book, a pair of
    /// backup blocks, its paths in the core.
    pub(crate) fn add_remote_peer(
        &mut self,
        book: &mut Book,
        driver: &mut Driver,
        node: NodeId,
        addrs: &[SocketAddr],
    ) -> Result<(), String> {
        book.insert(node, addrs).map_err(|_| "the engine's address book is full".to_string())?;
        // Sent to by node id, in the driver's batches: each rail's
        // transport has the node's address there. (Who sent a datagram is
        // the engine's book's to say: an address may host many nodes.)
        for (rail, &addr) in addrs.iter().enumerate() {
            if let Some(t) = driver.rail_mut(rail as RailId) {
                t.add_peer(node, addr).map_err(|e| format!("add peer {node}: {e}"))?;
            }
        }
        if !self.backups.contains_key(&node) {
            let used: Vec<usize> = self.backups.values().map(|(slot, _)| *slot).collect();
            let slot = (0..).find(|s| !used.contains(s)).expect("a free slot");
            if 2 * slot + 1 >= self.region.backups.len() {
                return Err("more peers than the region has backup blocks for".into());
            }
            self.backups.insert(node, (slot, None));
        }
        self.rails.insert(node, addrs.len());
        if self.resuming.is_none() {
            let ids: Vec<RailId> = (0..addrs.len() as RailId).collect();
            self.core.set_paths(node, &ids).map_err(|e| format!("add peer {node}: {e}"))?;
        }
        Ok(())
    }

    /// Write `peer`'s marks to its backup blocks if they moved: both
    /// blocks in turn, so a crash tears at most one and the other holds
    /// the marks before or after. The sent high-water is written ahead by
    /// `SENT_MARGIN`, so most datagrams need no write.
    pub(crate) fn back_up(&mut self, peer: NodeId) {
        if !self.backup {
            return;
        }
        let (Some(m), Some((slot, last))) = (self.core.stream_marks(peer), self.backups.get_mut(&peer))
        else {
            return;
        };
        let mut b = StreamBackup {
            peer,
            epoch: m.epoch,
            peer_incarnation: m.peer_incarnation,
            max_datagram: m.max_datagram as u32,
            tx_pn_hi: (m.tx_pn >> 32) as u32 + 1,
            settled_msg: m.settled_msg,
            settled_seq: m.settled_seq,
            sent_upto: 0,
        };
        b.sent_upto = match last {
            Some(l) if l.epoch == b.epoch && l.sent_upto >= m.sent_upto => l.sent_upto,
            _ => m.sent_upto + SENT_MARGIN,
        };
        // Record before send: the block covers every sequence number the
        // core may put in a datagram now. (`last` is this engine's memory
        // of what it wrote, never read back from the region.)
        assert!(b.sent_upto >= m.sent_upto, "peer {peer}: backup's sent mark behind the stream's");
        if *last == Some(b) {
            return;
        }
        // Slots are handed out below the region's blocks (`add_remote_peer`,
        // `read_backups`).
        assert!(2 * *slot + 1 < self.region.backups.len(), "peer {peer}: backup slot {slot} past the region");
        self.region.backups[2 * *slot].write(&b);
        self.region.backups[2 * *slot + 1].write(&b);
        *last = Some(b);
    }

    /// The core's counters to the application, if they changed. Only when
    /// nothing waits to be published before them, and only if the ring
    /// has room: the next report carries what this one would have.
    pub(crate) fn publish_counters(
        &mut self,
        faults: FaultCounters,
        checks: EngineCounters,
        scratch: &mut Vec<u8>,
    ) {
        let stats = self.core.stats();
        let same = *stats == self.counters_sent && faults == self.faults_sent && checks == self.checks_sent;
        if same || !self.held.is_empty() {
            return;
        }
        let mut values = std::mem::take(&mut self.counters_buf);
        values.clear();
        let fields = stats.fields();
        let faulted = faults.values();
        let all = fields.iter().map(|(_, v)| *v).chain(faulted).chain(checks.values());
        for v in all.take(tether_attach::records::MAX_COUNTERS) {
            values.extend_from_slice(&v.to_le_bytes());
        }
        scratch.resize(values.len() + 16, 0);
        if let Ok(n) = (Completion::Counters { values: &values }).encode(scratch) {
            if self.region.completions.push(&scratch[..n]).is_ok() {
                self.counters_sent = stats.clone();
                self.faults_sent = faults;
                self.checks_sent = checks;
            }
        }
        self.counters_buf = values;
    }

    /// Push a completion, or hold it for the next turn; false if held.
    pub(crate) fn push_or_hold(&mut self, record: &[u8]) -> bool {
        self.push_parts_or_hold(record, &[])
    }

    /// `push_or_hold` of the record `head` then `payload` (a delivery,
    /// pushed without joining them first).
    pub(crate) fn push_parts_or_hold(&mut self, head: &[u8], payload: &[u8]) -> bool {
        // Completions go out in order: nothing is published past one held
        // back (`publish` stops at a hold, and sends the held one first).
        assert!(self.held.is_empty(), "node {}: a completion published past one held back", self.node);
        match self.region.completions.push_parts(head, payload) {
            Ok(()) => true,
            Err(ShmError::Full { .. }) => {
                self.held.clear();
                self.held.extend_from_slice(head);
                self.held.extend_from_slice(payload);
                false
            }
            Err(e) => {
                warn!(node = self.node, error = %e, "completion ring unusable: detaching");
                self.gone = true;
                false
            }
        }
    }

    /// The application broke the protocol or its memory did: detach it.
    pub(crate) fn broke(&mut self, stats: &mut EngineStats, why: &str) -> bool {
        warn!(node = self.node, pid = self.pid, reason = why, "application broke the protocol: detaching");
        stats.bad_submissions += 1;
        self.gone = true;
        true
    }
}

/// One completion record, encoded (the engine's own news: small).
pub(crate) fn completion(c: &Completion<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = c.encode(&mut buf).expect("a control record fits 64 bytes");
    buf.truncate(n);
    buf
}

/// What an application resubmits for one peer when it resumes.
#[derive(Debug, Default)]
pub(crate) struct Resumed {
    pub(crate) failed_upto: u64,
    pub(crate) taken: Option<Taken>,
    pub(crate) first_id: Option<u64>,
    pub(crate) messages: Vec<Unsettled>,
}
