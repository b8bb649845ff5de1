//! An application's side of an engine (docs/ENGINE.md): it creates its
//! region (which it owns, so the region outlives the engine), attaches
//! over the engine's socket, and from then on talks to the engine only
//! through the region's rings: sends are submission records, deliveries,
//! settled marks and failures are completion records.
//!
//! Message ids are the core's: the n-th message to a peer is `seq` n, so
//! the application knows a message's id when it submits it, and one
//! settled mark per peer (`Completion::Settled`) with the failure reports
//! answers `message_state` for every message.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant, SystemTime, UNIX_EPOCH};

use crate::machine::{readable, Machine, RealMachine};

use bytes::Bytes;
use tether_fault::FaultCounters;

use crate::counters::EngineCounters;
use tether_proto::{
    Assembled, Channel, Delivery, Event, FailReason, FailedMessages, Fragment, MessageId, MessagePool,
    MessageState, Messages, NodeId, Reassembly, Received, SentBatch, Stats, Unsettled, MAX_RAILS, POOL_FROM,
};
use tether_shm::{ClientHeader, ClientRegion, Control, PairEnd, ShmError, LAYOUT_VERSION};

use crate::attach::{self, Doorbell};
use crate::records::{
    batch_count, channel_bit, counter_values, pair_file, put_batch_message, BatchMessages, Completion, Rails,
    Submission, Taken,
};
use crate::EngineError;

/// How long a wait spins without yielding when the endpoint has direct
/// paths (`Look::Spin`): two round trips between two cores. Not more:
/// when the peer shares this core (two cores, more busy parties), each
/// hop waits this long for the spinner to give the core up (at 50 us,
/// some runs measured 50.8 us one way instead of 0.27).
const DIRECT_SPIN: Duration = Duration::from_micros(1);

/// The longest sleep of a wait for room in the submission ring between
/// looks: the engine rings when it publishes, and this bounds a wake-up
/// it had no reason to ring for (it took submissions, published nothing).
const ROOM_SLEEP: Duration = Duration::from_millis(1);

/// The top bit of a direct path's record id: the message is on the
/// layer's channel (`Channel::LAYER`: tether's calls). Ids count messages
/// from zero and never reach it.
const DIRECT_LAYER: u64 = 1 << 63;

/// The next bit of a direct path's record id: the record is a batch
/// (`Client::send_batch`), several messages each its length (u32,
/// little-endian) and bytes, their ids counting up from the record's.
const DIRECT_BATCH: u64 = 1 << 62;

/// Failure reports kept for `message_state` queries, per peer (as the
/// core keeps them).
const FAILURE_HISTORY: usize = 64;

/// What the application knows of its streams with one peer.
#[derive(Debug, Default)]
struct PeerLog {
    /// Its address on each of the engine's rails.
    rails: Vec<SocketAddr>,
    /// Every unsettled message, from message `settled` on: the host-side
    /// backup a new engine resends them from (docs/ENGINE.md, "Restore").
    retained: VecDeque<Unsettled>,
    /// One past the last message a failure report covered.
    failed_upto: u64,
    /// Where the application stands in the peer's stream, and the message
    /// being put together from its fragments.
    taken: Reassembly,
    /// The next message's id.
    next: u64,
    /// Every message below is acknowledged or failed.
    settled: u64,
    /// Failed runs, newest last.
    failures: VecDeque<(FailedMessages, FailReason)>,
    /// Below this, failure reports were dropped from the bounded history.
    forgotten_below: u64,
    /// Named at the engine's own addresses: attached to the same engine,
    /// so messages go by the direct path, never through the engine.
    is_local: bool,
    /// That path, while it is open.
    direct: Option<Direct>,
}

/// A direct path to a peer on the same engine (docs/ENGINE.md, "The
/// direct path"): a ring each way in a pair region, each record a message
/// id (u64, little-endian; its top bit `DIRECT_LAYER` set for a
/// message on `Channel::LAYER`) and the message.
struct Direct {
    end: PairEnd,
    generation: u64,
    /// The id of the first message sent on this path: the peer's count of
    /// records taken settles `base + taken`.
    base: u64,
    /// The id the next record from the peer must carry (`None`: the first
    /// on this path sets it), and the records taken from it.
    expect: Option<u64>,
    taken: u64,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").field("generation", &self.generation).field("base", &self.base).finish()
    }
}

impl PeerLog {
    fn state(&self, seq: u64) -> MessageState {
        if seq >= self.next {
            MessageState::Unknown
        } else if seq >= self.settled {
            MessageState::Pending
        } else if seq < self.forgotten_below {
            MessageState::Unknown
        } else {
            match self.failures.iter().rev().find(|(f, _)| f.contains(seq)) {
                Some((_, reason)) => MessageState::Failed(*reason),
                None => MessageState::Delivered,
            }
        }
    }
}

/// How an application attaches.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The clock, scheduler and random source the client waits with: the
    /// real machine, or a simulator's (`Machine`).
    pub machine: Arc<dyn Machine>,
    /// This life's incarnation (default: the wall clock).
    pub incarnation: Option<u64>,
    /// Bytes of each ring; a message must fit a quarter of the smaller.
    pub ring_bytes: usize,
    /// How long a blocked call polls (yielding the core between looks)
    /// before it sleeps. An application and its engine often share a core:
    /// yielding hands it over in a microsecond or two, where a sleep and a
    /// wake-up cost tens (57.8 us per pipe round trip, `perf bench sched
    /// pipe`, on the 2-core VMs this was measured on).
    pub spin: Duration,
    /// How long dropping the client waits for what it sent to be
    /// acknowledged or failed, as an embedded endpoint does.
    pub linger: Duration,
    /// Peers this endpoint may have (each has a pair of backup blocks in
    /// the region).
    pub peers: u32,
    /// How long to wait for a new engine when the engine dies (`None`:
    /// report `EngineGone` at once). Calls made meanwhile wait.
    pub recovery: Option<Duration>,
    /// Keep a copy of every message until it is acknowledged: the half of
    /// the host-side backup a new engine resends from. Off only to measure
    /// what the backup costs (`tether bench engine`, with engines whose
    /// `EngineOptions::backup` is off too): then nothing can be resumed
    /// and a dead engine is `EngineGone` at once, whatever `recovery` says.
    pub retain: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            machine: RealMachine::shared(),
            incarnation: None,
            ring_bytes: 4 << 20,
            spin: Duration::from_millis(1),
            linger: Duration::from_secs(1),
            peers: 64,
            recovery: Some(Duration::from_secs(10)),
            retain: true,
        }
    }
}

/// How far a look at the completion ring takes: while a batch receive's
/// buffer has room, or past it when full (a recovery must take every
/// record the dead engine published).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Room,
    Full,
}

/// An application's attachment to its engine, driven by the application's
/// calls and by the watcher (see [`Client`]).
struct Attachment {
    node: NodeId,
    machine: Arc<dyn Machine>,
    region: ClientRegion,
    dir: PathBuf,
    path: PathBuf,
    recovery: Option<Duration>,
    conn: UnixStream,
    engine_pid: u32,
    spin: Duration,
    /// `ClientOptions::retain`.
    retain: bool,
    peers: BTreeMap<NodeId, PeerLog>,
    /// Peers with a direct path open, for the look at their rings.
    locals: Vec<NodeId>,
    /// The peer whose `AddPeer` awaits the engine's answer, and whether it came.
    awaiting: Option<NodeId>,
    answered: bool,
    /// What was delivered and not yet taken.
    inbox: Inbox,
    /// Completions and direct-path records taken in so far: a change
    /// rings the `sleepers`.
    progress: u64,
    /// The bells of the threads asleep in a wait (`thread_bell`): one
    /// thread takes in what another waits for (a message, a call's
    /// envelope, an event) and may read the engine's doorbell before the
    /// other sleeps on it, so it rings theirs.
    sleepers: Vec<std::os::fd::RawFd>,
    events: VecDeque<Event>,
    buf: Vec<u8>,
    /// Where a direct path's batch record is put together.
    batch: Vec<u8>,
    /// Buffers for large deliveries, back when the application drops them.
    messages: MessagePool,
    engine_gone: bool,
    /// New engines this endpoint resumed with.
    recoveries: u64,
    /// `close` ran: dropping has nothing left to do.
    closed: bool,
    /// How long dropping waits for what was sent to settle.
    linger: Duration,
    /// The protocol counters the engine serving now last reported, and
    /// the sum of those of the engines before it.
    engine_stats: Stats,
    stats_before: Stats,
    /// The same for the faults the engines injected into what they received.
    engine_faults: FaultCounters,
    faults_before: FaultCounters,
    engine_checks: EngineCounters,
    checks_before: EngineCounters,
}

/// Messages delivered and not yet taken, by channel: each channel's in
/// the order they came (nothing needs the order between channels).
#[derive(Debug)]
struct Inbox {
    queues: [VecDeque<Delivery>; Channel::COUNT],
    /// The channels a layer takes from (`Client::serve_channel`; the
    /// application's always). Messages on the others are dropped as they
    /// come (counted), never left to pile up unread.
    served: [bool; Channel::COUNT],
    dropped: [u64; Channel::COUNT],
    /// The caller's buffer while a batch receive waits (`recv_batch`):
    /// the application's messages go straight into it while its queue is
    /// empty and it has room, with no allocation.
    sink: Option<Received>,
}

impl Default for Inbox {
    fn default() -> Self {
        let mut served = [false; Channel::COUNT];
        served[Channel::APP.index()] = true;
        Inbox { queues: Default::default(), served, dropped: [0; Channel::COUNT], sink: None }
    }
}

impl Inbox {
    /// Into the batch receive's buffer, if one waits and the message may
    /// go there without passing one queued before it.
    fn sunk(&mut self, from: NodeId, channel: Channel, message: &[u8]) -> bool {
        let Some(sink) = self.sink.as_mut() else { return false };
        channel == Channel::APP && self.queues[channel.index()].is_empty() && sink.push(from, message)
    }

    /// A message of `len` bytes on `channel` would go into the batch
    /// receive's buffer (`sunk`).
    fn would_sink(&self, channel: Channel, len: usize) -> bool {
        channel == Channel::APP
            && self.queues[channel.index()].is_empty()
            && self.sink.as_ref().is_some_and(|s| s.has_room(len))
    }

    /// A batch receive's buffer is here and can take no more.
    fn sink_full(&self) -> bool {
        self.sink.as_ref().is_some_and(Received::is_full)
    }

    /// `deliver` of a message not yet copied out of where it came.
    fn deliver_slice(&mut self, from: NodeId, channel: Channel, message: &[u8]) {
        if !self.sunk(from, channel, message) {
            self.deliver(Delivery {
                from,
                message: Bytes::copy_from_slice(message),
                fragment: None,
                channel,
            });
        }
    }

    /// Move what is queued for the application into `out`, in order, as
    /// much as fits.
    fn drain_into(&mut self, out: &mut Received) {
        let queue = &mut self.queues[Channel::APP.index()];
        while let Some(d) = queue.front() {
            if !out.push(d.from, &d.message) {
                break;
            }
            queue.pop_front();
        }
    }

    /// Queue a delivery on its channel, or drop it if nobody takes from
    /// that channel.
    fn deliver(&mut self, d: Delivery) {
        if self.sunk(d.from, d.channel, &d.message) {
            return;
        }
        let c = d.channel.index();
        if self.served[c] {
            self.queues[c].push_back(d);
        } else {
            self.dropped[c] += 1;
            tracing::debug!(from = d.from, channel = c, "a message on a channel nobody takes: dropped");
        }
    }

    /// The oldest delivery on a channel.
    fn pop(&mut self, channel: Channel) -> Option<Delivery> {
        self.queues[channel.index()].pop_front()
    }
}

/// What one look of a wait found.
enum Look<R> {
    Ready(R),
    /// Look again at once: a peer on a direct path answers in well under
    /// a microsecond, and a yield alone costs about that.
    Spin,
    Yield,
    Sleep(Duration),
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("node", &self.node).field("engine_pid", &self.engine_pid()).finish()
    }
}

fn default_incarnation() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (now.as_nanos() as u64).max(1)
}

/// A fresh secret from the machine's random source.
fn entropy(machine: &dyn Machine) -> std::io::Result<[u8; tether_shm::SECRET_LEN]> {
    let mut seed = [0u8; tether_shm::SECRET_LEN];
    machine.entropy(&mut seed)?;
    Ok(seed)
}

/// Did the attachment fail because the engine died in the middle of it
/// (the connection made, then reset or closed unanswered)? Not when
/// nobody was listening: that is told at once.
fn died_answering(e: &EngineError) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    matches!(e, EngineError::Io(io) if matches!(io.kind(), ConnectionReset | UnexpectedEof | BrokenPipe))
}

/// Regions created by this process so far, for unique names.
static REGIONS: AtomicU64 = AtomicU64::new(0);

impl Attachment {
    fn attach(dir: &Path, node: NodeId, options: ClientOptions) -> Result<Self, EngineError> {
        // Nothing is created where no engine is: told at once, by name.
        if !attach::socket_path(dir).exists() {
            return Err(EngineError::NoEngine { dir: dir.to_owned() });
        }
        let ring = options.ring_bytes.next_power_of_two().clamp(64 << 10, 1 << 30) as u32;
        let header = ClientHeader {
            version: LAYOUT_VERSION,
            node,
            port: 0,
            pid: std::process::id(),
            incarnation: options.incarnation.unwrap_or_else(default_incarnation),
            submission_capacity: ring,
            completion_capacity: ring,
            streams: 2 * options.peers.min(tether_shm::MAX_STREAMS / 2),
        };
        let n = REGIONS.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(crate::owner::region_name(node, std::process::id(), n));
        let region = ClientRegion::create(&path, header)?;
        let machine = options.machine.clone();
        region.control.set_secret(&entropy(&*machine)?);
        let result = match Self::connect(&*machine, dir, &path, attach::Mode::Fresh) {
            // An engine was there and died answering: as when one dies
            // later, a new one (its supervisor starts it) is waited for.
            Err(e) if died_answering(&e) => match options.recovery {
                Some(patience) => {
                    Self::reconnect(&*machine, dir, &path, attach::Mode::Fresh, machine.now(), patience)
                }
                None => Err(e),
            },
            // A socket left by an engine that is gone: nobody listens.
            Err(EngineError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Err(EngineError::NoEngine { dir: dir.to_owned() })
            }
            other => other,
        };
        let (conn, engine_pid) = match result {
            Ok(ok) => ok,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(Attachment {
            node,
            machine,
            region,
            dir: dir.to_owned(),
            path,
            // Nothing retained, nothing to resume from.
            recovery: options.recovery.filter(|_| options.retain),
            retain: options.retain,
            conn,
            engine_pid,
            spin: options.spin,
            peers: BTreeMap::new(),
            locals: Vec::new(),
            awaiting: None,
            answered: false,
            inbox: Inbox::default(),
            progress: 0,
            sleepers: Vec::new(),
            events: VecDeque::new(),
            buf: Vec::new(),
            batch: Vec::new(),
            messages: MessagePool::new(),
            engine_gone: false,
            recoveries: 0,
            closed: false,
            engine_stats: Stats::default(),
            stats_before: Stats::default(),
            engine_faults: FaultCounters::default(),
            faults_before: FaultCounters::default(),
            engine_checks: EngineCounters::default(),
            checks_before: EngineCounters::default(),
            linger: options.linger,
        })
    }

    fn connect(
        machine: &dyn Machine,
        dir: &Path,
        region: &Path,
        mode: attach::Mode,
    ) -> Result<(UnixStream, u32), EngineError> {
        let mut conn = UnixStream::connect(attach::socket_path(dir))?;
        conn.set_read_timeout(Some(attach::EXCHANGE_TIMEOUT))?;
        conn.set_write_timeout(Some(attach::EXCHANGE_TIMEOUT))?;
        attach::write_request(&mut conn, region, mode)?;
        // The engine answers at its next look at its socket: waited for on
        // the machine (a simulator turns the engine meanwhile), then read.
        let deadline = machine.now() + attach::EXCHANGE_TIMEOUT;
        loop {
            let mut fd = [readable(conn.as_raw_fd())];
            let left = deadline.saturating_sub(machine.now());
            if crate::machine::ready_now(&mut fd) {
                break;
            }
            if left.is_zero() {
                return Err(EngineError::Timeout);
            }
            machine.sleep_on(&mut fd, left);
        }
        let pid = attach::read_reply(&mut conn)?.map_err(EngineError::Refused)?;
        conn.set_nonblocking(true)?;
        Ok((conn, pid))
    }

    /// Attach again and again until an engine answers, up to `patience`
    /// after `since`: `EngineGone` if none did, `Refused` at once if one
    /// refused.
    fn reconnect(
        machine: &dyn Machine,
        dir: &Path,
        region: &Path,
        mode: attach::Mode,
        since: Duration,
        patience: Duration,
    ) -> Result<(UnixStream, u32), EngineError> {
        loop {
            match Self::connect(machine, dir, region, mode) {
                Ok(ok) => return Ok(ok),
                Err(EngineError::Refused(why)) => return Err(EngineError::Refused(why)),
                Err(_) if machine.now().saturating_sub(since) < patience => {
                    machine.sleep_on(&mut [], Duration::from_millis(2))
                }
                Err(_) => return Err(EngineError::EngineGone),
            }
        }
    }

    pub fn incarnation(&self) -> u64 {
        self.region.header.incarnation
    }

    /// The engine process serving this endpoint.
    pub fn engine_pid(&self) -> u32 {
        self.engine_pid
    }

    /// New engines this endpoint resumed with.
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// The largest message this endpoint can send or receive through its
    /// rings.
    pub fn max_message_len(&self) -> usize {
        self.region.submissions.max_record().min(self.region.completions.max_record()) - 32
    }

    /// `node` is at `addrs[i]` on the engine's rail `i`.
    pub fn add_peer_rails(&mut self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), EngineError> {
        if addrs.is_empty() || addrs.len() > MAX_RAILS {
            return Err(EngineError::Rails { given: addrs.len(), max: MAX_RAILS });
        }
        if attach::is_probe_node(node) {
            return Err(EngineError::Refused(format!("peer {node} is reserved for the engine's self-test")));
        }
        let known = self.peers.contains_key(&node);
        if !known && self.peers.len() * 2 >= self.region.backups.len() {
            return Err(EngineError::Rails {
                given: self.peers.len() + 1,
                max: self.region.backups.len() / 2,
            });
        }
        let rails = Rails::new(addrs)?;
        self.peers.entry(node).or_default().rails = addrs.to_vec();
        (self.awaiting, self.answered) = (Some(node), false);
        self.submit(&Submission::AddPeer { node, rails }, None)?;
        // The answer says whether the peer is on this engine (a direct path,
        // `Completion::Local`, comes first): known before any message to it
        // is sent, so its messages never take two ways.
        let deadline = self.machine.now() + attach::EXCHANGE_TIMEOUT;
        let result = loop {
            self.take_completions()?;
            if self.answered {
                break Ok(());
            }
            if self.machine.now() >= deadline {
                break Err(EngineError::Timeout);
            }
            self.check_engine()?;
            self.machine.yield_now();
        };
        self.awaiting = None;
        result
    }

    /// Send `msg` to `peer`: its id, at once. Waits (up to `timeout`;
    /// `None` waits as long as it takes) only while the submission ring is
    /// full, which happens when the engine's send buffer for the peer is.
    pub fn send(
        &mut self,
        peer: NodeId,
        msg: &[u8],
        timeout: Option<Duration>,
        channel: Channel,
    ) -> Result<MessageId, EngineError> {
        self.send_kept(peer, msg, None, timeout, channel)
    }

    /// `send`, with `owned` (if given) the message's bytes held already:
    /// the retained copy is then a reference to them, not a copy.
    fn send_kept(
        &mut self,
        peer: NodeId,
        msg: &[u8],
        owned: Option<&Bytes>,
        timeout: Option<Duration>,
        channel: Channel,
    ) -> Result<MessageId, EngineError> {
        let Some(seq) = self.peers.get(&peer).map(|p| p.next) else {
            return Err(EngineError::UnknownPeer(peer));
        };
        if peer == self.node {
            return Err(tether_proto::SendError::SelfSend.into());
        }
        if msg.len() > self.max_message_len() {
            return Err(tether_proto::SendError::MessageTooLarge {
                len: msg.len(),
                max: self.max_message_len(),
            }
            .into());
        }
        if self.peers[&peer].is_local {
            return self.send_direct(peer, seq, msg, timeout, channel);
        }
        self.submit(&Submission::Send { id: seq, peer, payload: msg, channel }, timeout)?;
        self.submitted(peer, seq, msg, owned, channel);
        Ok(MessageId { peer, seq })
    }

    /// Message `seq` to `peer` is in the submission ring: the next id
    /// moves past it, and it is retained until settled (`owned`'s bytes by
    /// reference, else a copy of `msg`).
    fn submitted(&mut self, peer: NodeId, seq: u64, msg: &[u8], owned: Option<&Bytes>, channel: Channel) {
        let p = self.peers.entry(peer).or_default();
        p.next = seq + 1;
        if self.retain {
            let data = owned.cloned().unwrap_or_else(|| Bytes::copy_from_slice(msg));
            p.retained.push_back(Unsettled { data, channel });
        }
    }

    /// Send `msgs` to `peer`, in order, ids counting up from the first's:
    /// through the engine, each a submission with one doorbell for them
    /// all; on a direct path, packed into as few records as fit. Waits for
    /// room up to `timeout` in all; once some are taken, a wait that runs
    /// out or fails ends the batch short (`SentBatch::count`), and the
    /// next call reports why.
    pub fn send_batch<T: Messages + ?Sized>(
        &mut self,
        peer: NodeId,
        msgs: &T,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, EngineError> {
        let Some(first) = self.peers.get(&peer).map(|p| p.next) else {
            return Err(EngineError::UnknownPeer(peer));
        };
        if peer == self.node {
            return Err(tether_proto::SendError::SelfSend.into());
        }
        let max = self.max_message_len();
        if let Some(len) = (0..msgs.count()).map(|i| msgs.message(i).len()).find(|&len| len > max) {
            return Err(tether_proto::SendError::MessageTooLarge { len, max }.into());
        }
        let deadline = timeout.map(|t| self.machine.now() + t);
        let count = if self.peers[&peer].is_local {
            self.send_direct_batch(peer, first, msgs, deadline)
        } else {
            self.submit_batch(peer, first, msgs, deadline)
        };
        match count {
            Ok(count) => Ok(SentBatch { first: MessageId { peer, seq: first }, count }),
            Err((0, e)) => Err(e),
            Err((count, _)) => Ok(SentBatch { first: MessageId { peer, seq: first }, count }),
        }
    }

    /// `send_batch` through the engine: how many were taken, or how many
    /// and the error that stopped the rest.
    fn submit_batch<T: Messages + ?Sized>(
        &mut self,
        peer: NodeId,
        first: u64,
        msgs: &T,
        deadline: Option<Duration>,
    ) -> Result<usize, (usize, EngineError)> {
        let mut result = Ok(msgs.count());
        for i in 0..msgs.count() {
            let (id, payload) = (first + i as u64, msgs.message(i));
            let s = Submission::Send { id, peer, payload, channel: Channel::APP };
            if let Err(e) = self.submit_quietly(&s, deadline) {
                result = Err((i, e));
                break;
            }
            self.submitted(peer, id, payload, None, Channel::APP);
        }
        self.ring_engine();
        result
    }

    /// `send_batch` on a direct path: as many messages a record as fit
    /// (each its length and bytes after the first's id, `DIRECT_BATCH`),
    /// the peer woken once a record. One too large for a batch record
    /// (within 4 bytes of the largest) goes on its own.
    fn send_direct_batch<T: Messages + ?Sized>(
        &mut self,
        peer: NodeId,
        first: u64,
        msgs: &T,
        deadline: Option<Duration>,
    ) -> Result<usize, (usize, EngineError)> {
        let mut sent = 0;
        let mut record = std::mem::take(&mut self.batch);
        let result = loop {
            if sent == msgs.count() {
                break Ok(sent);
            }
            let seq = first + sent as u64;
            let p = self.peers.get_mut(&peer).expect("a known peer");
            let Some(d) = p.direct.as_mut() else {
                // The path closed (the peer went): the rest fail at once,
                // as `send_direct`'s messages do.
                let end = first + msgs.count() as u64;
                (p.next, p.settled) = (end, end);
                let failed = FailedMessages { peer, first: seq, end, in_doubt_end: seq };
                self.on_completion(Completion::Failed { failed, reason: FailReason::PeerUnreachable });
                break Ok(msgs.count());
            };
            let room = d.end.tx.max_record();
            record.clear();
            record.extend_from_slice(&(seq | DIRECT_BATCH).to_le_bytes());
            let mut n = 0;
            for m in (sent..msgs.count()).map(|i| msgs.message(i)) {
                if record.len() + 4 + m.len() > room {
                    break;
                }
                put_batch_message(&mut record, m);
                n += 1;
            }
            if n == 0 {
                let timeout = deadline.map(|d| d.saturating_sub(self.machine.now()));
                match self.send_direct(peer, seq, msgs.message(sent), timeout, Channel::APP) {
                    Ok(_) => sent += 1,
                    Err(e) => break Err((sent, e)),
                }
                continue;
            }
            match d.end.tx.push(&record) {
                Ok(()) => {
                    p.next = seq + n as u64;
                    sent += n;
                    if d.end.peer_needs_waking() {
                        if let Err(e) = self.submit(&Submission::Wake { peer }, None) {
                            break Err((sent, e));
                        }
                    }
                }
                Err(ShmError::Full { .. }) => {
                    if let Err(e) = self.wait_for_room(deadline) {
                        break Err((sent, e));
                    }
                }
                Err(e) => {
                    tracing::warn!(node = self.node, peer, error = %e, "direct path unusable: closed");
                    self.close_direct(peer);
                }
            }
        };
        self.batch = record;
        result
    }

    /// Take the inbox's sink for a batch receive into `out`, after moving
    /// what is queued into `out`: whether it was free to take (no other
    /// batch receive holds it) and `out` had room left.
    fn own_sink(&mut self, out: &mut Received) -> bool {
        self.inbox.drain_into(out);
        let free =
            self.inbox.sink.is_none() && !out.is_full() && self.inbox.queues[Channel::APP.index()].is_empty();
        if free {
            self.inbox.sink = Some(std::mem::take(out));
        }
        free
    }

    /// `send` to a peer on the same engine: straight into the direct path's
    /// ring, waiting for room; the peer's doorbell rung (by the engine) if
    /// it sleeps. With the path closed (the peer went), the message fails
    /// at once, as every message after the last the peer took did.
    fn send_direct(
        &mut self,
        peer: NodeId,
        seq: u64,
        msg: &[u8],
        timeout: Option<Duration>,
        channel: Channel,
    ) -> Result<MessageId, EngineError> {
        let deadline = timeout.map(|t| self.machine.now() + t);
        let id = if channel == Channel::APP { seq } else { seq | DIRECT_LAYER };
        loop {
            let p = self.peers.get_mut(&peer).expect("a known peer");
            let Some(d) = p.direct.as_mut() else {
                p.next = seq + 1;
                p.settled = p.next;
                let failed = FailedMessages { peer, first: seq, end: seq + 1, in_doubt_end: seq };
                self.on_completion(Completion::Failed { failed, reason: FailReason::PeerUnreachable });
                return Ok(MessageId { peer, seq });
            };
            if msg.len() + 8 > d.end.tx.max_record() {
                let max = d.end.tx.max_record() - 8;
                return Err(tether_proto::SendError::MessageTooLarge { len: msg.len(), max }.into());
            }
            match d.end.tx.push_parts(&id.to_le_bytes(), msg) {
                Ok(()) => {
                    p.next = seq + 1;
                    if d.end.peer_needs_waking() {
                        self.submit(&Submission::Wake { peer }, None)?;
                    }
                    return Ok(MessageId { peer, seq });
                }
                // What the peer takes frees room; its path may close.
                Err(ShmError::Full { .. }) => self.wait_for_room(deadline)?,
                Err(e) => {
                    tracing::warn!(node = self.node, peer, error = %e, "direct path unusable: closed");
                    self.close_direct(peer);
                }
            }
        }
    }

    /// Take what the peers on direct paths sent, and settle what they took.
    fn take_direct(&mut self) {
        let mut record = std::mem::take(&mut self.buf);
        let mut i = 0;
        while i < self.locals.len() {
            let peer = self.locals[i];
            let Some(p) = self.peers.get_mut(&peer) else { break };
            let Some(d) = p.direct.as_mut() else { break };
            let before = d.taken;
            let mut broken = None;
            // A closing endpoint takes nothing more: what it never handed
            // its application is not delivered, and the sender is told so.
            // A full batch receive leaves the rest in the ring (where it
            // holds the sender back) rather than queue it.
            while !self.closed && !self.inbox.sink_full() {
                match d.end.rx.pop(&mut record) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        broken = Some(e.to_string());
                        break;
                    }
                }
                let Some((id, message)) = record.split_first_chunk::<8>() else {
                    broken = Some("a record without a message id".into());
                    break;
                };
                let id = u64::from_le_bytes(*id);
                let channel = channel_bit(id & DIRECT_LAYER != 0);
                let batch = id & DIRECT_BATCH != 0;
                let id = id & !(DIRECT_LAYER | DIRECT_BATCH);
                if d.expect.is_some_and(|e| e != id) {
                    broken = Some(format!("message {id} where {:?} was next", d.expect));
                    break;
                }
                // A batch is checked whole before any of it is taken.
                let count = if batch { batch_count(message) } else { Some(1) };
                let Some(count) = count.filter(|&n| n > 0) else {
                    broken = Some(format!("batch record at message {id} does not parse"));
                    break;
                };
                d.expect = Some(id + count);
                d.taken += count;
                self.progress += 1;
                if batch {
                    for m in BatchMessages(message) {
                        self.inbox.deliver_slice(peer, channel, m);
                    }
                } else {
                    self.inbox.deliver_slice(peer, channel, message);
                }
            }
            if d.taken != before {
                d.end.set_taken(d.taken);
            }
            // Never past what was sent: the peer's word is checked.
            let took = d.end.peer_taken().min(p.next - d.base);
            p.settled = p.settled.max(d.base + took);
            if let Some(why) = broken {
                tracing::warn!(node = self.node, peer, why, "direct path damaged: closed");
                self.buf = record;
                self.close_direct(peer);
                record = std::mem::take(&mut self.buf);
                continue;
            }
            i += 1;
        }
        self.buf = record;
    }

    /// Close the direct path to `peer` (it went, or the path is damaged,
    /// or another replaces it): what it sent is taken, what it took is
    /// settled, and the rest of what was sent on it fails, exactly.
    fn close_direct(&mut self, peer: NodeId) {
        if !self.locals.contains(&peer) {
            return;
        }
        self.take_direct();
        self.locals.retain(|&n| n != peer);
        let Some(p) = self.peers.get_mut(&peer) else { return };
        let Some(d) = p.direct.take() else { return };
        let took = d.end.peer_taken().min(p.next - d.base);
        let delivered = p.settled.max(d.base + took);
        let end = p.next;
        p.settled = end;
        if delivered < end {
            let failed = FailedMessages { peer, first: delivered, end, in_doubt_end: delivered };
            self.on_completion(Completion::Failed { failed, reason: FailReason::PeerUnreachable });
        }
    }

    /// Open the direct path `generation` to `peer` (replacing an older one).
    fn open_direct(&mut self, peer: NodeId, generation: u64) {
        let p = self.peers.entry(peer).or_default();
        p.is_local = true;
        if p.direct.as_ref().is_some_and(|d| d.generation == generation) {
            return;
        }
        self.close_direct(peer);
        let path = self.dir.join(pair_file(self.node, peer, generation));
        match PairEnd::open(&path, self.node, peer) {
            Ok(end) => {
                let p = self.peers.get_mut(&peer).expect("entered above");
                p.direct = Some(Direct { end, generation, base: p.next, expect: None, taken: 0 });
                self.locals.push(peer);
            }
            Err(e) => tracing::warn!(node = self.node, peer, error = %e, "direct path not opened"),
        }
    }

    /// One look while a ring is full: take what came (which may be what
    /// frees it), then yield; an error past `deadline` or with the engine gone.
    fn wait_for_room(&mut self, deadline: Option<Duration>) -> Result<(), EngineError> {
        self.look_for_room(deadline)?;
        self.machine.yield_now();
        Ok(())
    }

    /// What every look for room does first: take what came (which may be
    /// what frees it); an error past `deadline` or with the engine gone.
    fn look_for_room(&mut self, deadline: Option<Duration>) -> Result<(), EngineError> {
        self.take_completions()?;
        if deadline.is_some_and(|d| self.machine.now() >= d) {
            return Err(EngineError::Timeout);
        }
        self.check_engine()
    }

    /// One look while the submission ring has been full since `start`:
    /// `wait_for_room` for `spin`, then a sleep with the flag raised that
    /// asks the engine to ring. Room comes back as the engine's send buffer
    /// drains, which it tells with settled marks (completions, so it
    /// rings); without the sleep a sender whose peer is slow held a core
    /// yielding (a 64 KiB stream through engines cost 1.6-3.1 ms of CPU a
    /// message with every other wait sleeping, against 0.06 embedded).
    fn wait_for_submission_room(
        &mut self,
        start: Duration,
        deadline: Option<Duration>,
    ) -> Result<(), EngineError> {
        if self.machine.now().saturating_sub(start) < self.spin {
            return self.wait_for_room(deadline);
        }
        self.look_for_room(deadline)?;
        let completions = &self.region.completions;
        if !Control::before_sleep(self.region.control.client_waiting(), || !completions.is_empty()) {
            let left = deadline.map_or(ROOM_SLEEP, |d| d.saturating_sub(self.machine.now()));
            self.sleep(left.min(ROOM_SLEEP));
        }
        self.region.control.client_waiting().store(0, Ordering::SeqCst);
        Ok(())
    }

    /// Encode and push one submission, waiting for room.
    fn submit(&mut self, s: &Submission<'_>, timeout: Option<Duration>) -> Result<(), EngineError> {
        let deadline = timeout.map(|t| self.machine.now() + t);
        self.submit_quietly(s, deadline)?;
        self.ring_engine();
        Ok(())
    }

    /// Ring the engine's doorbell if it sleeps: once after what was
    /// pushed, however many records that was.
    fn ring_engine(&mut self) {
        if Control::should_wake(self.region.control.engine_asleep()) {
            attach::ring(&mut self.conn);
        }
    }

    /// Encode and push one submission, waiting for room, without ringing.
    /// A payload goes into the ring as it is (`push_parts`), not through a
    /// framing copy.
    fn submit_quietly(&mut self, s: &Submission<'_>, deadline: Option<Duration>) -> Result<(), EngineError> {
        let mut record = std::mem::take(&mut self.buf);
        record.resize(record.len().max(256), 0);
        let (n, payload) = s.encode_parts(&mut record)?;
        let mut since = None;
        let result = loop {
            match self.region.submissions.push_parts(&record[..n], payload) {
                Ok(()) => break Ok(()),
                // Completions may be what frees the engine: taken while
                // waiting. The engine may be asleep before records of a
                // batch not yet rung for: it is rung before the wait.
                Err(ShmError::Full { .. }) => {
                    self.ring_engine();
                    let start = *since.get_or_insert_with(|| self.machine.now());
                    if let Err(e) = self.wait_for_submission_room(start, deadline) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e.into()),
            }
        };
        self.buf = record;
        result
    }

    /// A delivery on `channel`, if one is waiting.
    pub fn try_recv(&mut self, channel: Channel) -> Result<Option<Delivery>, EngineError> {
        if let Some(d) = self.pop(channel) {
            return Ok(Some(d));
        }
        self.take_completions()?;
        Ok(self.pop(channel))
    }

    /// The oldest delivery on a channel.
    fn pop(&mut self, channel: Channel) -> Option<Delivery> {
        self.inbox.pop(channel)
    }

    /// The next failure report, if one is waiting.
    pub fn poll_event(&mut self) -> Result<Option<Event>, EngineError> {
        self.take_completions()?;
        Ok(self.events.pop_front())
    }

    /// Where a sent message stands, from the settled marks and failure
    /// reports the engine published.
    pub fn message_state(&mut self, id: MessageId) -> MessageState {
        let _ = self.take_completions();
        self.peers.get(&id.peer).map_or(MessageState::Unknown, |p| p.state(id.seq))
    }

    /// This endpoint's protocol counters, as its engines last reported
    /// them (every 50 ms while they change), summed over every engine that
    /// served it.
    pub fn stats(&mut self) -> Stats {
        let _ = self.take_completions();
        let mut s = self.stats_before.clone();
        s.accumulate(&self.engine_stats);
        s
    }

    /// What the fault plans of the engines that served this endpoint did
    /// to what they received (shared by every application of an engine).
    pub fn fault_counters(&mut self) -> FaultCounters {
        let _ = self.take_completions();
        let mut f = self.faults_before;
        f.accumulate(&self.engine_faults);
        f
    }

    /// What the self-test and the audit of the engines that served this
    /// endpoint did, and the time they took.
    pub fn engine_counters(&mut self) -> EngineCounters {
        let _ = self.take_completions();
        let mut c = self.checks_before;
        c.accumulate(&self.engine_checks);
        c
    }

    /// Messages sent and not yet settled, over every peer.
    pub fn unsettled(&mut self) -> u64 {
        let _ = self.take_completions();
        self.peers.values().map(|p| p.next - p.settled).sum()
    }

    fn close_within(&mut self, linger: Duration) -> Result<(), EngineError> {
        if self.engine_gone {
            return Ok(());
        }
        self.closed = true;
        self.submit(&Submission::Close { linger_ns: linger.as_nanos() as u64 }, Some(linger))?;
        let deadline = self.machine.now() + linger + attach::EXCHANGE_TIMEOUT;
        while self.machine.now() < deadline {
            let _ = self.take_completions();
            if self.check_engine().is_err() {
                return Ok(());
            }
            self.sleep(Duration::from_millis(1));
        }
        Err(EngineError::Timeout)
    }

    /// One look of a wait that began at `start`: done, or whether to yield
    /// the core or sleep (the flag that asks the engine to ring raised) and
    /// for how long. The caller does either without holding anything, so
    /// other threads' calls go on meanwhile.
    fn look<R>(
        &mut self,
        start: Duration,
        deadline: Option<Duration>,
        ready: &mut impl FnMut(&mut Self) -> Option<R>,
    ) -> Result<Look<R>, EngineError> {
        self.take_completions()?;
        if let Some(r) = ready(self) {
            return Ok(Look::Ready(r));
        }
        let now = self.machine.now();
        let waited = now.saturating_sub(start);
        if deadline.is_some_and(|d| now >= d) {
            return Err(EngineError::Timeout);
        }
        if waited < self.spin {
            if !self.locals.is_empty() && waited < DIRECT_SPIN {
                return Ok(Look::Spin);
            }
            // Yield, not spin: the engine may be waiting for this core.
            return Ok(Look::Yield);
        }
        self.check_engine()?;
        let completions = &self.region.completions;
        if Control::before_sleep(self.region.control.client_waiting(), || !completions.is_empty()) {
            return Ok(Look::Yield);
        }
        // The direct paths' peers ring through the engine (`Wake`) when
        // they see this side's flag up.
        for d in self.locals.iter().filter_map(|n| self.peers.get(n)?.direct.as_ref()) {
            if Control::before_sleep(d.end.my_waiting(), || !d.end.rx.is_empty()) {
                return Ok(Look::Yield);
            }
        }
        let left = deadline.map_or(Duration::from_millis(100), |d| d.saturating_sub(now));
        Ok(Look::Sleep(left.min(Duration::from_millis(100))))
    }

    /// Awake again: no one need ring.
    fn lower_waiting(&self) {
        self.region.control.client_waiting().store(0, Ordering::SeqCst);
        for d in self.locals.iter().filter_map(|n| self.peers.get(n)?.direct.as_ref()) {
            d.end.my_waiting().store(0, Ordering::SeqCst);
        }
    }

    fn sleep(&mut self, d: Duration) {
        let mut fd = [readable(self.conn.as_raw_fd())];
        self.machine.sleep_on(&mut fd, d);
    }

    /// Whether the engine is still there (its end of the connection open).
    fn check_engine(&mut self) -> Result<(), EngineError> {
        if self.engine_gone {
            return Err(EngineError::EngineGone);
        }
        if attach::check(&mut self.conn) == Doorbell::Closed {
            let Some(patience) = self.recovery.filter(|_| !self.closed) else {
                self.engine_gone = true;
                return Err(EngineError::EngineGone);
            };
            if let Err(e) = self.recover(patience) {
                self.engine_gone = true;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The engine died: take what it published, forget what it never took,
    /// wait for a new engine, and give it everything it needs to go on
    /// where the old one stopped (docs/ENGINE.md, "Restore").
    fn recover(&mut self, patience: Duration) -> Result<(), EngineError> {
        let lost = self.machine.now();
        tracing::warn!(node = self.node, engine = self.engine_pid, "engine gone: waiting for a new one");
        // Every record the dead engine published, even past a batch
        // receive's full buffer (into the queue): where this side stands in
        // each stream, told to the new engine below, must count every
        // fragment the dead one committed and acknowledged. One left in the
        // ring would be taken after the new engine resumed before it, and
        // the sender, which settled it, would never send what follows it
        // to the new engine's expectation again.
        self.take_completions_past(Sink::Full)?;
        // Submissions the dead engine never took: everything in them is
        // retained and goes again below. No engine reads the ring now.
        let mut stale = Vec::new();
        while self.region.submissions.pop(&mut stale)? {}
        let (conn, pid) =
            Self::reconnect(&*self.machine, &self.dir, &self.path, attach::Mode::Resume, lost, patience)?;
        (self.conn, self.engine_pid) = (conn, pid);
        let peers: Vec<NodeId> = self.peers.keys().copied().collect();
        for peer in peers {
            let p = &self.peers[&peer];
            let taken = p.taken.position().map(|t| Taken {
                incarnation: t.incarnation,
                epoch: t.epoch,
                next: t.next,
            });
            let (rails, failed_upto) = (Rails::new(&p.rails)?, p.failed_upto);
            let local = p.is_local;
            self.submit(&Submission::AddPeer { node: peer, rails }, None)?;
            if local {
                // The direct path goes on without an engine; the new one
                // adopts its region (the same generation: nothing changes).
                continue;
            }
            self.submit(&Submission::Resume { peer, failed_upto, taken }, None)?;
            let p = &self.peers[&peer];
            let (first, retained) = (p.settled, p.retained.clone());
            for (i, m) in retained.iter().enumerate() {
                let id = first + i as u64;
                if id >= failed_upto {
                    self.submit(&Submission::Send { id, peer, payload: &m.data, channel: m.channel }, None)?;
                }
            }
        }
        self.submit(&Submission::ResumeEnd, None)?;
        // The new engine counts from zero.
        let last = std::mem::take(&mut self.engine_stats);
        self.stats_before.accumulate(&last);
        let last = std::mem::take(&mut self.engine_faults);
        self.faults_before.accumulate(&last);
        let last = std::mem::take(&mut self.engine_checks);
        self.checks_before.accumulate(&last);
        let outage = self.machine.now().saturating_sub(lost);
        tracing::info!(node = self.node, engine = pid, ?outage, "resumed with a new engine");
        self.recoveries += 1;
        self.events.push_back(Event::EngineRecovered { outage });
        Ok(())
    }

    /// Read every completion waiting; a record that does not decode means
    /// the engine (or its memory) cannot be trusted.
    fn take_completions(&mut self) -> Result<(), EngineError> {
        self.take_completions_past(Sink::Room)
    }

    /// `take_completions`, stopping at a full batch receive's buffer
    /// (`Sink::Room`) or not (`Sink::Full`: into the queue, in order).
    fn take_completions_past(&mut self, sink: Sink) -> Result<(), EngineError> {
        let before = self.progress;
        let result = self.take_completions_quietly(sink);
        if self.progress != before {
            for &bell in &self.sleepers {
                ring_bell(bell);
            }
        }
        result
    }

    fn take_completions_quietly(&mut self, sink: Sink) -> Result<(), EngineError> {
        // An engine that found the ring full holds what it would publish,
        // and may sleep meanwhile: room made in a ring over half full is
        // worth ringing for (an atomic load when it is not asleep). The
        // engine's position is read only when there is something to take,
        // not on every empty look.
        let completions = &self.region.completions;
        let crowded = completions.next_len().is_some() && completions.len() > completions.capacity() / 2;
        let mut record = std::mem::take(&mut self.buf);
        let result = loop {
            if sink == Sink::Room && self.inbox.sink_full() {
                break Ok(());
            }
            // A large delivery is taken into a pooled buffer, which is then
            // the application's message (no copy to put it together).
            let pooled = self.region.completions.next_len().filter(|&n| n >= POOL_FROM);
            let into = match pooled {
                Some(n) => &mut self.messages.take(n),
                None => &mut record,
            };
            match self.region.completions.pop(into) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(EngineError::from(e)),
            }
            let c = match Completion::decode(into) {
                Ok(c) => c,
                Err(e) => break Err(e.into()),
            };
            match c {
                Completion::Delivery { from, fragment, channel, payload } if pooled.is_some() => {
                    let at = payload.as_ptr() as usize - into.as_ptr() as usize;
                    let range = at..at + payload.len();
                    let message = self.messages.seal(std::mem::take(into)).slice(range);
                    self.on_delivery(from, &fragment, channel, message);
                }
                c => self.on_completion(c),
            }
        };
        self.buf = record;
        if crowded {
            self.ring_engine();
        }
        if !self.locals.is_empty() {
            self.take_direct();
        }
        result
    }

    /// A delivery whose payload is already the application's buffer.
    fn on_delivery(&mut self, from: NodeId, f: &Fragment, channel: Channel, payload: Bytes) {
        self.progress += 1;
        let max = self.max_message_len();
        let p = self.peers.entry(from).or_default();
        let taken = p.taken.take_bytes(f, channel, payload, max);
        self.on_assembled(from, taken);
    }

    /// Fragments taken before (a new engine resent them) are passed over.
    fn on_assembled(&mut self, from: NodeId, taken: Assembled) {
        match taken {
            Assembled::Whole(message, channel) => {
                self.inbox.deliver(Delivery { from, message, fragment: None, channel })
            }
            Assembled::Again | Assembled::Part => {}
            Assembled::Dropped(why) => tracing::warn!(peer = from, "{why}: the message is dropped"),
        }
    }

    fn on_completion(&mut self, c: Completion<'_>) {
        self.progress += 1;
        match c {
            Completion::Delivery { from, fragment: f, channel, payload } => {
                let max = self.max_message_len();
                let p = self.peers.entry(from).or_default();
                // A whole message a batch receive waits for is copied from
                // the ring record straight into its buffer.
                if f.first && f.last && self.inbox.would_sink(channel, payload.len()) {
                    match p.taken.take_whole(&f, channel, payload.len(), max) {
                        Assembled::Whole(_, channel) => self.inbox.deliver_slice(from, channel, payload),
                        other => self.on_assembled(from, other),
                    }
                    return;
                }
                let taken = p.taken.take(&f, channel, payload, max);
                self.on_assembled(from, taken);
            }
            Completion::Settled { peer, below } => {
                // Never past what was sent: the engine's word is checked.
                if let Some(p) = self.peers.get_mut(&peer) {
                    let below = below.min(p.next);
                    while p.settled < below {
                        p.retained.pop_front();
                        p.settled += 1;
                    }
                }
            }
            Completion::Counters { values } => {
                // From this build's engine, the same lists; another's is ignored.
                let stats = Stats::default().fields().len();
                let n = values.len() / 8;
                // The core's, then the fault injectors' (`FaultCounters::values`),
                // then the engine's checking (`EngineCounters::values`).
                if n == stats + FaultCounters::COUNT + EngineCounters::COUNT {
                    self.engine_stats = Stats::from_values(counter_values(values));
                    self.engine_faults = FaultCounters::from_values(counter_values(values).skip(stats));
                    let checks = counter_values(values).skip(stats + FaultCounters::COUNT);
                    self.engine_checks = EngineCounters::from_values(checks);
                }
            }
            Completion::Local { peer, generation } if peer != self.node => self.open_direct(peer, generation),
            Completion::Local { .. } => {}
            Completion::LocalGone { peer } => self.close_direct(peer),
            Completion::PeerAdded { peer } => self.answered |= self.awaiting == Some(peer),
            // As the core queues it: one report waiting at a time.
            Completion::Refused { refused } => {
                let at = tether_proto::Instant::from_nanos(self.machine.now().as_nanos() as u64);
                refused.report(&mut self.events, at);
            }
            Completion::Failed { failed, reason } => {
                if let Some(p) = self.peers.get_mut(&failed.peer) {
                    if p.failures.len() == FAILURE_HISTORY {
                        let (old, _) = p.failures.pop_front().expect("history is full");
                        p.forgotten_below = old.end;
                    }
                    p.failures.push_back((failed, reason));
                    p.failed_upto = p.failed_upto.max(failed.end);
                }
                self.events.push_back(match reason {
                    FailReason::PeerRestarted => Event::PeerRestarted { peer: failed.peer, failed },
                    FailReason::StreamReset => Event::StreamReset { failed },
                    _ => Event::PeerUnreachable { failed },
                });
            }
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // Messages accepted are given their chance, as by an embedded
        // endpoint (an application that dies instead loses them, as it would).
        if !self.closed {
            let _ = self.close_within(self.linger);
        }
        // The region is the application's: it goes with it. The engine
        // sees the connection close and detaches.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An application attached to an engine: the endpoint `node`, served by
/// the engine process.
///
/// A watcher thread sleeps on the connection to the engine while the
/// application is away; if the engine dies or is replaced, the watcher
/// resumes with the new one at once (docs/ENGINE.md, "Restore"), so what
/// the application sent is delivered even if it never calls in again.
pub struct Client {
    node: NodeId,
    /// The attachment's machine, held here too so that a wait need not
    /// take the attachment's lock to find its clock.
    machine: Arc<dyn Machine>,
    inner: Arc<Mutex<Attachment>>,
    /// The attachment's pool of message buffers (shared with it).
    messages: MessagePool,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

impl Client {
    /// Create a region in the engine's directory `dir` and attach as `node`.
    pub fn attach(dir: &Path, node: NodeId, options: ClientOptions) -> Result<Self, EngineError> {
        let machine = options.machine.clone();
        let watched = machine.watcher();
        let attachment = Attachment::attach(dir, node, options)?;
        let messages = attachment.messages.clone();
        let inner = Arc::new(Mutex::new(attachment));
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (Arc::downgrade(&inner), stop.clone());
        let watcher = match watched {
            true => Some(
                std::thread::Builder::new()
                    .name(format!("tether-watch-{node}"))
                    .spawn(move || watch(weak, flag))?,
            ),
            false => None,
        };
        Ok(Client { node, machine, inner, messages, stop, watcher })
    }

    /// What the watcher does, for a client whose machine has none (a
    /// simulator's): notice whether the engine went and, if so, resume
    /// with a new one (waiting on the machine for up to
    /// `ClientOptions::recovery`). `EngineGone` if there is none.
    pub fn check_engine(&self) -> Result<(), EngineError> {
        self.lock().check_engine()
    }

    fn lock(&self) -> MutexGuard<'_, Attachment> {
        // A panic in a call leaves the attachment as consistent as the
        // records it reached; nothing in it depends on the caller.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The attachment if no other thread holds it (one may for a while:
    /// a recovery waits for a new engine under it).
    fn try_lock(&self) -> Option<MutexGuard<'_, Attachment>> {
        match self.inner.try_lock() {
            Ok(a) => Some(a),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The node this endpoint is.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// This life's incarnation (its streams start afresh with a new one).
    pub fn incarnation(&self) -> u64 {
        self.lock().incarnation()
    }

    /// The engine process serving this endpoint now.
    pub fn engine_pid(&self) -> u32 {
        self.lock().engine_pid()
    }

    /// New engines this endpoint resumed with (one per
    /// `Event::EngineRecovered`).
    pub fn recoveries(&self) -> u64 {
        self.lock().recoveries()
    }

    /// The largest message this endpoint can send or receive.
    pub fn max_message_len(&self) -> usize {
        self.lock().max_message_len()
    }

    /// `node` is at `addrs[i]` on the engine's rail `i`.
    pub fn add_peer_rails(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), EngineError> {
        self.lock().add_peer_rails(node, addrs)
    }

    /// Send `msg` to `peer`: its id, at once. Waits (up to `timeout`;
    /// `None` waits as long as it takes) only while the submission ring is
    /// full, which happens when the engine's send buffer for the peer is.
    pub fn send(
        &self,
        peer: NodeId,
        msg: &[u8],
        timeout: Option<Duration>,
    ) -> Result<MessageId, EngineError> {
        self.lock().send(peer, msg, timeout, Channel::APP)
    }

    /// Send several messages to `peer` in one call (see
    /// [`SentBatch`]): between two applications on one engine, packed
    /// into as few ring records as fit.
    pub fn send_batch<T: Messages + ?Sized>(
        &self,
        peer: NodeId,
        msgs: &T,
        timeout: Option<Duration>,
    ) -> Result<SentBatch, EngineError> {
        self.lock().send_batch(peer, msgs, timeout)
    }

    /// Wait up to `timeout` for at least one application message, then
    /// take as many as have come and fit into `out` (cleared first, its
    /// memory reused: nothing is allocated for messages taken straight
    /// from the rings into it). How many it holds.
    pub fn recv_batch(&self, out: &mut Received, timeout: Option<Duration>) -> Result<usize, EngineError> {
        out.clear();
        // With the inbox's sink held for the wait, every look (this
        // thread's or another's) puts the application's messages straight
        // into it; without, they are moved from the queue.
        let owned = self.lock().own_sink(out);
        let got = self.wait(timeout, |a| match owned {
            true => a.inbox.sink.as_ref().is_some_and(|s| !s.is_empty()).then_some(()),
            false => {
                a.inbox.drain_into(out);
                (!out.is_empty()).then_some(())
            }
        });
        if owned {
            *out = self.lock().inbox.sink.take().unwrap_or_default();
        }
        // Messages taken are the application's (taking them is the commit
        // point): returned, and a failure told by the next call.
        match got {
            Err(e) if out.is_empty() => Err(e),
            _ => Ok(out.len()),
        }
    }

    /// `send` of a message held as [`Bytes`] (made with `message_buffer`
    /// and `seal`, say): what the client keeps of it until it is settled
    /// (the host-side backup) is these bytes, not a copy of them.
    pub fn send_bytes(
        &self,
        peer: NodeId,
        msg: &Bytes,
        timeout: Option<Duration>,
    ) -> Result<MessageId, EngineError> {
        self.lock().send_kept(peer, msg, Some(msg), timeout, Channel::APP)
    }

    /// An empty buffer of at least `capacity` bytes for a message, from
    /// the client's pool (large ones come back when their last `Bytes` is
    /// dropped: see `seal`).
    pub fn message_buffer(&self, capacity: usize) -> Vec<u8> {
        self.messages.take(capacity)
    }

    /// `buf` as a message for `send_bytes`, its buffer back to the pool
    /// once the client and the application are done with it.
    pub fn seal(&self, buf: Vec<u8>) -> Bytes {
        self.messages.seal(buf)
    }

    /// `send` on `channel`, for a layer riding the stream (tether's calls):
    /// delivered to the peer's layer on that channel, not its application.
    /// Never waits, not even for another thread's use of the client (a
    /// recovery from the engine's death holds it for its whole length):
    /// `Timeout` then, and the layer offers the message again.
    pub fn send_on(&self, channel: Channel, peer: NodeId, msg: &[u8]) -> Result<MessageId, EngineError> {
        let mut a = self.try_lock().ok_or(EngineError::Timeout)?;
        a.send(peer, msg, Some(Duration::ZERO), channel)
    }

    /// Whether `peer` was added (`None`: the client is busy, see
    /// `send_on`).
    pub fn knows(&self, peer: NodeId) -> Option<bool> {
        Some(self.try_lock()?.peers.contains_key(&peer))
    }

    /// Whether a layer takes the messages on `channel` (`try_recv_on`,
    /// `recv_on_until`; the application's own channel is always taken).
    /// While not, they are dropped as they come (and those waiting now are).
    pub fn serve_channel(&self, channel: Channel, on: bool) {
        if channel == Channel::APP {
            return;
        }
        let mut a = self.lock();
        let c = channel.index();
        a.inbox.served[c] = on;
        if !on {
            a.inbox.dropped[c] += a.inbox.queues[c].len() as u64;
            a.inbox.queues[c].clear();
        }
    }

    /// Wake every thread asleep in a wait of this client, to look again
    /// (a call layer's timer moved earlier than its pump's sleep).
    /// (Not while another thread holds the client: it is awake.)
    pub fn kick(&self) {
        if let Some(a) = self.try_lock() {
            for &bell in &a.sleepers {
                ring_bell(bell);
            }
        }
    }

    /// Messages on `channel` dropped because no layer took them.
    pub fn dropped_on(&self, channel: Channel) -> u64 {
        self.lock().inbox.dropped[channel.index()]
    }

    /// A message on `channel`, if one is waiting (none while another
    /// thread holds the client, see `send_on`).
    pub fn try_recv_on(&self, channel: Channel) -> Result<Option<Delivery>, EngineError> {
        match self.try_lock() {
            Some(mut a) => a.try_recv(channel),
            None => Ok(None),
        }
    }

    /// The next message on `channel`, waiting for one until `until()`
    /// (asked again at every look, so a layer's timer set meanwhile is
    /// kept) has passed: `Ok(None)` then.
    pub fn recv_on_until(
        &self,
        channel: Channel,
        until: impl Fn() -> Option<StdInstant>,
    ) -> Result<Option<Delivery>, EngineError> {
        // The caller's deadline on the real clock, as the machine counts.
        let machine = &*self.machine;
        let until = || until().map(|t| machine.now() + t.saturating_duration_since(StdInstant::now()));
        match wait_until(&self.inner, machine, until, |c| c.pop(channel)) {
            Err(EngineError::Timeout) => Ok(None),
            other => other.map(Some),
        }
    }

    /// An application message, if one is waiting (other channels'
    /// messages are passed over).
    pub fn try_recv(&self) -> Result<Option<Delivery>, EngineError> {
        self.lock().try_recv(Channel::APP)
    }

    /// The next application message, waiting up to `timeout` (`None`: for
    /// ever).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Delivery, EngineError> {
        self.wait(timeout, |c| c.pop(Channel::APP))
    }

    /// The next failure report or recovery, if one is waiting.
    pub fn poll_event(&self) -> Result<Option<Event>, EngineError> {
        self.lock().poll_event()
    }

    /// Where a sent message stands.
    pub fn message_state(&self, id: MessageId) -> MessageState {
        self.lock().message_state(id)
    }

    /// Messages sent and not yet settled, over every peer.
    pub fn unsettled(&self) -> u64 {
        self.lock().unsettled()
    }

    /// This endpoint's protocol counters, as its engines report them.
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// What its engines' fault plans injected, as they report it.
    pub fn fault_counters(&self) -> FaultCounters {
        self.lock().fault_counters()
    }

    /// What its engines' self-test and state audit did, and the time they
    /// took, as they report it (every `COUNTERS_EVERY`, 50 ms).
    pub fn engine_counters(&self) -> EngineCounters {
        self.lock().engine_counters()
    }

    /// Wait until every message sent is settled (acknowledged or failed).
    pub fn flush(&self, timeout: Option<Duration>) -> Result<(), EngineError> {
        self.wait(timeout, |c| (c.unsettled() == 0).then_some(()))
    }

    /// Wait until message `id` is delivered or failed.
    pub fn wait_settled(
        &self,
        id: MessageId,
        timeout: Option<Duration>,
    ) -> Result<MessageState, EngineError> {
        self.tracker().wait_settled(id, timeout)
    }

    /// Where this endpoint's sent messages stand, for as long as the
    /// endpoint lives (a message's handle holds one).
    pub fn tracker(&self) -> Tracker {
        Tracker(Arc::downgrade(&self.inner), self.machine.clone())
    }

    /// Spin, then sleep, until `ready` gives something, holding the
    /// attachment only while looking: other threads' calls (a send while
    /// another thread waits to receive) go on meanwhile.
    fn wait<R>(
        &self,
        timeout: Option<Duration>,
        ready: impl FnMut(&mut Attachment) -> Option<R>,
    ) -> Result<R, EngineError> {
        wait_unlocked(&self.inner, &*self.machine, timeout, ready)
    }

    /// Ask the engine to finish: it keeps driving up to `linger` for what
    /// is unsettled, then detaches. Returns once it has.
    pub fn close(mut self, linger: Duration) -> Result<(), EngineError> {
        self.shut(linger)
    }

    /// `close`, for an owner that cannot give the client away (a wrapper
    /// with a destructor of its own): the client does nothing afterwards.
    pub fn shut(&mut self, linger: Duration) -> Result<(), EngineError> {
        self.stop_watching();
        self.lock().close_within(linger)
    }

    /// Wait for the next failure report or recovery.
    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Event, EngineError> {
        self.wait(timeout, |c| c.events.pop_front())
    }

    fn stop_watching(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The attachment lingers and goes when the last reference does.
        self.stop_watching();
    }
}

/// Where an endpoint's sent messages stand; answers `Unknown` once the
/// endpoint is gone.
#[derive(Clone)]
pub struct Tracker(Weak<Mutex<Attachment>>, Arc<dyn Machine>);

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker").field("alive", &(self.0.strong_count() > 0)).finish()
    }
}

impl Tracker {
    /// Where message `id` stands.
    pub fn message_state(&self, id: MessageId) -> MessageState {
        match self.0.upgrade() {
            Some(a) => a.lock().unwrap_or_else(|e| e.into_inner()).message_state(id),
            None => MessageState::Unknown,
        }
    }

    /// Wait until message `id` is delivered or failed.
    pub fn wait_settled(
        &self,
        id: MessageId,
        timeout: Option<Duration>,
    ) -> Result<MessageState, EngineError> {
        let Some(a) = self.0.upgrade() else { return Ok(MessageState::Unknown) };
        wait_unlocked(&a, &*self.1, timeout, |c| match c.message_state(id) {
            MessageState::Pending => None,
            settled => Some(settled),
        })
    }
}

/// `Attachment::wait`, locking the attachment only to look.
fn wait_unlocked<R>(
    inner: &Mutex<Attachment>,
    machine: &dyn Machine,
    timeout: Option<Duration>,
    ready: impl FnMut(&mut Attachment) -> Option<R>,
) -> Result<R, EngineError> {
    // A timeout past the end of time is no deadline.
    let deadline = timeout.and_then(|t| machine.now().checked_add(t));
    wait_until(inner, machine, || deadline, ready)
}

/// Wait until `ready` gives something or the deadline `until()` gives
/// (asked at every look) passes.
fn wait_until<R>(
    inner: &Mutex<Attachment>,
    machine: &dyn Machine,
    until: impl Fn() -> Option<Duration>,
    mut ready: impl FnMut(&mut Attachment) -> Option<R>,
) -> Result<R, EngineError> {
    let lock = || inner.lock().unwrap_or_else(|e| e.into_inner());
    let start = machine.now();
    loop {
        let sleep = {
            let mut a = lock();
            match a.look(start, until(), &mut ready)? {
                Look::Ready(r) => return Ok(r),
                Look::Spin => {
                    std::hint::spin_loop();
                    continue;
                }
                Look::Yield => None,
                // A handle of its own on the connection: the attachment's
                // may be replaced (a recovery) while this thread sleeps.
                // Its bell registered in the same look that found nothing:
                // whatever another thread takes in from now on rings it.
                Look::Sleep(d) => {
                    let conn = a.conn.try_clone()?;
                    let bell = thread_bell();
                    a.sleepers.extend(bell);
                    Some((conn, d, bell))
                }
            }
        };
        match sleep {
            None => machine.yield_now(),
            Some((conn, d, bell)) => {
                let poll = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                let mut fds = [poll(conn.as_raw_fd()), poll(bell.unwrap_or(-1))];
                // A failed sleep is a short one: the caller looks again.
                // (Without a bell of its own, a thread sleeps in slices of
                // a millisecond.)
                let d = if bell.is_some() { d } else { d.min(Duration::from_millis(1)) };
                machine.sleep_on(&mut fds, d);
                let mut a = lock();
                if let Some(bell) = bell {
                    drain_bell(bell);
                    a.sleepers.retain(|&s| s != bell);
                }
                a.lower_waiting();
            }
        }
    }
}

/// This thread's bell for its sleeps in a client's waits (an eventfd,
/// made at its first sleep; `None` if none can be made).
fn thread_bell() -> Option<std::os::fd::RawFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    thread_local! {
        static BELL: Option<OwnedFd> = {
            // SAFETY: eventfd takes no pointers; a negative result is an error.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            // SAFETY: a descriptor just made and owned by nothing else.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        };
    }
    BELL.with(|b| b.as_ref().map(|f| f.as_raw_fd()))
}

/// Wake the thread asleep on `bell`.
fn ring_bell(bell: std::os::fd::RawFd) {
    let one = 1u64;
    // SAFETY: eight bytes from a live u64 to an eventfd; a failure (the
    // counter full) leaves it readable, which is as good.
    let _ = unsafe { libc::write(bell, (&one as *const u64).cast(), 8) };
}

/// Take the rings a bell got.
fn drain_bell(bell: std::os::fd::RawFd) {
    let mut n = 0u64;
    // SAFETY: eight bytes into a live u64 from a non-blocking eventfd.
    let _ = unsafe { libc::read(bell, (&mut n as *mut u64).cast(), 8) };
}

/// How often the watcher looks again at a connection it sleeps on (one
/// replaced by a recovery, or a stop request).
const WATCH_SLICE: Duration = Duration::from_millis(20);

/// The watcher: sleep until the engine's end of the connection closes,
/// then resume with a new engine (unless the application is already at
/// it, holding the attachment, in which case its own call does).
fn watch(inner: Weak<Mutex<Attachment>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Some(strong) = inner.upgrade() else { return };
        let fd = {
            let a = strong.lock().unwrap_or_else(|e| e.into_inner());
            if a.engine_gone || a.closed {
                return;
            }
            a.conn.as_raw_fd()
        };
        drop(strong);
        let mut pollfd = [libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 }];
        if attach::sleep_on(&mut pollfd, WATCH_SLICE).is_err() || pollfd[0].revents == 0 {
            continue;
        }
        let Some(strong) = inner.upgrade() else { return };
        let mut a = strong.lock().unwrap_or_else(|e| e.into_inner());
        // The closed connection is noticed and the recovery run here; an
        // error is the application's to see on its next call.
        let _ = a.check_engine();
    }
}
