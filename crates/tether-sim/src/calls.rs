//! Calls under server crashes (Kaur [AMVIA] chapter 3, RIFL's
//! completion records): a caller and a server, each with the real
//! protocol core in the virtual network, the call layer of `tether-rpc`
//! on top. Every datagram may be lost, duplicated, corrupted (the run's
//! fault plan, on the sender's interface) or delayed past others (a
//! latency drawn per datagram); the server node crashes at moments drawn
//! from the seed and at random between a handler's effect and its
//! completion record or in the middle of a log write, and restarts as a
//! new incarnation on its log. At the end no call may have run twice,
//! every call must have ended, and each final state must say truly
//! whether its handler ran, against the effects the handlers actually
//! had (`tether sim --mix calls_server_crash`).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether_fault::{node_seed, Injector};
use tether_proto::{Config, Instant, NodeId, Stats};
use tether_rpc::{
    replay, CallLog, CallRef, Caller, Dispatch, Envelope, Executed, LogError, MemLog, Record, RpcConfig,
    Target,
};

use crate::checker::Violation;
use crate::net::{self, Datagram, Link, Step, Timeline, VirtualNet};
use crate::{LinkCounters, SimConfig, SimReport};

const CLIENT: NodeId = 1;
const SERVER: NodeId = 2;
const HANDLER: u32 = 5;
/// Calls made, one every half millisecond or so.
const CALLS: u64 = 400;
/// Crashes at moments drawn from the seed, over the first 200 ms.
const TIMED_CRASHES: usize = 8;
/// The chance, at each handler's end, of a crash between its effect and
/// its record, and (separately) of one in the middle of the record.
const CRASH_RATE: f64 = 0.01;
/// Latency of a datagram, drawn uniformly: the spread reorders them.
const LATENCY_US: std::ops::Range<u64> = 20..600;

/// What a calls run came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CallsReport {
    /// Server crashes (timed, between effect and record, mid-write).
    pub crashes: u32,
    pub calls: u64,
    /// Calls whose final state says the handler ran, that it did not, and
    /// that nobody can tell.
    pub ran: u64,
    pub not_run: u64,
    pub unknown: u64,
}

/// The call layers' settings: quick timers against the virtual network's
/// microseconds.
pub fn rpc_config() -> RpcConfig {
    RpcConfig {
        credit: 8,
        retries: 12,
        ack_timeout: Duration::from_millis(20),
        reply_timeout: Duration::from_millis(40),
        max_retry_interval: Duration::from_millis(200),
        ack_request_after: Duration::from_millis(10),
        ..RpcConfig::default()
    }
}

/// The protocol settings of a calls run.
pub fn proto_config() -> Config {
    Config { rto_min: Duration::from_millis(1), abandon_after: Duration::from_secs(2), ..Config::default() }
}

/// A log that dies in the middle of its next append when told to: half
/// the record is written, and the write fails.
pub struct DyingLog {
    pub log: MemLog,
    pub tear_next: bool,
}

impl DyingLog {
    pub fn new(capacity: usize) -> Self {
        DyingLog { log: MemLog::new(capacity), tear_next: false }
    }
}

impl CallLog for DyingLog {
    fn append(&mut self, record: &Record<'_>) -> Result<(), LogError> {
        if self.tear_next {
            let before = self.log.bytes().len();
            self.log.append(record)?;
            self.log.tear(before + record.len() / 2);
            return Err(LogError::Io("the process died in the write".into()));
        }
        self.log.append(record)
    }
    fn compact(&mut self, live: &[Record<'_>]) -> Result<(), LogError> {
        self.log.compact(live)
    }
}

/// Check every call's end against what actually ran (`effects`: how
/// often each call's handler took effect, by (client, seq)): it ended,
/// it ran at most once, and its state's claim is true. Returns how many
/// ended in each `Executed`.
pub fn check_ends(
    calls: &[CallRef],
    caller: &Caller,
    effects: &BTreeMap<(u64, u64), u32>,
    violations: &mut Vec<Violation>,
) -> [u64; 3] {
    let mut claims = [0; 3];
    for &call in calls {
        let (client, seq) = (call.id.client, call.id.seq);
        let state = caller.state(call);
        let shown = format!("{state:?}");
        let ran = effects.get(&(client, seq)).copied().unwrap_or(0);
        if ran > 1 {
            violations.push(Violation::CallRanTwice { client, seq, times: ran });
        }
        let Some(state) = state.filter(|_| caller.finished(call) == Some(true)) else {
            violations.push(Violation::CallUnfinished { client, seq, state: shown });
            continue;
        };
        claims[state.executed() as usize] += 1;
        let false_claim = match state.executed() {
            Executed::Yes => ran != 1,
            Executed::No => ran != 0,
            Executed::Unknown => false,
        };
        if false_claim {
            violations.push(Violation::CallStateFalse { client, seq, state: shown, ran });
        }
    }
    claims
}

/// Things that happen besides datagrams and the cores' timers.
#[derive(Debug)]
enum Ev {
    /// A handler started in server life `life` finishes.
    Finish {
        life: u32,
        job: Dispatch,
    },
    /// The call layers' timers.
    Timers,
    Crash,
    NewCall,
}

/// Each node's interface (the run's fault plan, as a real one wraps a
/// socket, on both sides) and a latency drawn per datagram. Faults strike
/// until `faulty` is cleared.
struct Wire {
    injectors: [Injector; 2],
    rng: Pcg64Mcg,
    faulty: bool,
    counters: LinkCounters,
}

impl Link<Ev> for Wire {
    fn transmit(&mut self, timeline: &mut Timeline<Ev>, sent: net::Sent<'_>) {
        self.counters.datagrams += 1;
        let mut out = Vec::with_capacity(2);
        if self.faulty {
            let nic = &mut self.injectors[(sent.src == SERVER) as usize];
            nic.on_send(timeline.elapsed(), sent.dst, sent.bytes, |to, bytes| out.push((to, bytes.to_vec())));
        } else {
            out.push((sent.dst, sent.bytes.to_vec()));
        }
        for (dst, bytes) in out {
            let latency = Duration::from_micros(self.rng.gen_range(LATENCY_US));
            timeline
                .send(sent.now + latency, Datagram { src: sent.src, dst, rail: sent.rail, bytes, tag: 0 });
        }
    }

    /// The receiver's interface, where the plan's receive-side rules
    /// strike. (The calls mix's plan holds nothing back: the spread of
    /// latencies is what reorders; anything a plan with delays held would
    /// be handed over at the next arrival after it is due.)
    fn arrive(&mut self, timeline: &mut Timeline<Ev>, ep: &mut tether_proto::Endpoint, datagram: Datagram) {
        let Datagram { src, rail, bytes, .. } = datagram;
        if !self.faulty {
            return ep.handle_datagram_on(timeline.now(), rail, &bytes);
        }
        let (now, elapsed) = (timeline.now(), timeline.elapsed());
        let nic = &mut self.injectors[(ep.node() == SERVER) as usize];
        nic.on_recv(elapsed, Some(src), None, &bytes);
        nic.drain_ready(elapsed, |_, _, bytes| {
            ep.handle_datagram_on(now, rail, bytes);
            true
        });
    }
}

struct World {
    rng: Pcg64Mcg,
    net: VirtualNet<Wire, Ev>,
    caller: Caller,
    server: Target,
    log: DyingLog,
    life: u32,
    incarnation: u64,
    effects: BTreeMap<(u64, u64), u32>,
    calls: Vec<CallRef>,
    crashes: u32,
    crash_rate: f64,
    /// The cores the server's crashes replaced, their counters kept.
    stats: Stats,
}

impl World {
    /// Take the call envelopes node `id`'s core delivered into its call
    /// layer, and its call layer's envelopes into the core.
    fn pump(&mut self, id: NodeId) {
        let now = self.net.now();
        let ep = self.net.ep_mut(id);
        while let Some(d) = ep.recv_on(tether_rpc::CHANNEL) {
            // Each envelope parsed once; a malformed one is the server
            // side's to count.
            if id == SERVER {
                if let Ok(env) = self.server.parse(&d.message) {
                    if env.for_server() {
                        self.server.handle_envelope(now, d.from, env, &mut self.log);
                    }
                }
            } else if let Ok(env) = Envelope::parse(&d.message) {
                if !env.for_server() {
                    self.caller.handle_envelope(now, d.from, env);
                }
            }
        }
        // Nothing but calls goes over these streams.
        assert!(ep.recv().is_none(), "a message where only calls go");
        if self.log.tear_next {
            return self.crash();
        }
        if id == SERVER {
            while let Some(job) = self.server.poll_dispatch(&mut self.log) {
                let at = now + Duration::from_micros(self.rng.gen_range(0..2_000));
                self.net.timeline_mut().schedule(at, Ev::Finish { life: self.life, job });
            }
            if self.log.tear_next {
                return self.crash();
            }
        }
        self.flush();
    }

    fn flush(&mut self) {
        let now = self.net.now();
        while let Some(o) = self.caller.poll_transmit() {
            // Refused only when the stream is full: the caller retransmits.
            let _ = self.net.ep_mut(CLIENT).send_on(now, o.to, tether_rpc::CHANNEL, o.bytes);
        }
        while let Some(o) = self.server.poll_transmit() {
            let _ = self.net.ep_mut(SERVER).send_on(now, o.to, tether_rpc::CHANNEL, o.bytes);
        }
        let next = [self.caller.poll_timeout(), self.server.poll_timeout()].into_iter().flatten().min();
        if let Some(t) = next {
            self.net.timeline_mut().schedule(t.max(now), Ev::Timers);
        }
        for id in [CLIENT, SERVER] {
            self.net.settle(id, |_, _| {});
        }
    }

    /// The server dies (its core, its table, its running handlers) and a
    /// new incarnation starts on its log.
    fn crash(&mut self) {
        self.crashes += 1;
        self.log.tear_next = false;
        self.life += 1;
        self.incarnation += 1;
        let (records, _) = replay(self.log.log.bytes());
        let mut server = Target::recover(rpc_config(), &records);
        server.register(HANDLER);
        let mut clean = MemLog::new(1 << 20);
        // The records just read back fit the log they came from.
        let _ = clean.compact(&records);
        self.log.log = clean;
        self.server = server;
        let old = self.net.replace(net::endpoint(proto_config(), SERVER, self.incarnation, [CLIENT], &[0]));
        self.stats.accumulate(old.stats());
    }

    fn finish(&mut self, life: u32, job: Dispatch) {
        if life != self.life {
            return; // It died with its server.
        }
        *self.effects.entry((job.call.client, job.call.seq)).or_default() += 1;
        if self.rng.gen_bool(self.crash_rate) {
            return self.crash(); // Between the effect and its record.
        }
        if self.rng.gen_bool(self.crash_rate) {
            self.log.tear_next = true;
        }
        if self.server.complete(job.from, job.call, &job.args, &mut self.log).is_err() {
            return self.crash();
        }
        self.flush();
    }

    /// Everything due by `end`. (The network's clock stops at the last
    /// event it ran, so ends are counted from the start, not from it.)
    fn run_until(&mut self, end: Instant) -> u64 {
        let mut events = 0;
        while let Some(step) = self.net.step(end) {
            events += 1;
            match step {
                Step::Node(id) => {
                    self.net.settle(id, |_, _| {});
                    self.pump(id);
                }
                Step::Nothing => {}
                Step::User(Ev::Finish { life, job }) => self.finish(life, job),
                Step::User(Ev::Timers) => {
                    let now = self.net.now();
                    self.caller.handle_timeout(now);
                    self.server.handle_timeout(now);
                    self.flush();
                }
                Step::User(Ev::Crash) => {
                    if self.crash_rate > 0.0 {
                        self.crash();
                        self.flush();
                    }
                }
                Step::User(Ev::NewCall) => {
                    let now = self.net.now();
                    let n = self.calls.len() as u64;
                    // Every seventh call with a deadline of its own.
                    let deadline =
                        n.is_multiple_of(7).then(|| Duration::from_millis(self.rng.gen_range(1..30)));
                    let args = Bytes::from(n.to_le_bytes().to_vec());
                    if let Ok(call) = self.caller.request(now, SERVER, HANDLER, args, false, deadline, false)
                    {
                        self.calls.push(call);
                    }
                    self.flush();
                }
            }
            // The call layers' tables after every step, as the cores'
            // invariants are checked after every operation (`net`).
            self.caller.check_invariants();
            self.server.check_invariants();
        }
        events
    }
}

/// One calls run (`cfg.faults` on both nodes' interfaces until
/// `cfg.safety_phase`; then no faults and no crashes, until every call
/// ended or `cfg.time_limit`).
pub(crate) fn run(cfg: &SimConfig) -> SimReport {
    let seed = cfg.seed;
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let nic = |node| Injector::with_seed(&cfg.faults, node_seed(seed, node)).expect("a valid fault plan");
    let wire = Wire {
        injectors: [nic(CLIENT), nic(SERVER)],
        rng: Pcg64Mcg::seed_from_u64(seed ^ 0x5EED),
        faulty: true,
        counters: LinkCounters::default(),
    };
    let mut net = VirtualNet::new(Instant::from_nanos(1_000_000_000), wire);
    net.add(net::endpoint(proto_config(), CLIENT, 1, [SERVER], &[0]));
    net.add(net::endpoint(proto_config(), SERVER, 1, [CLIENT], &[0]));
    let start = net.now();
    for i in 0..CALLS {
        let at = start + Duration::from_micros(i * 500 + rng.gen_range(0..400));
        net.timeline_mut().schedule(at, Ev::NewCall);
    }
    for _ in 0..TIMED_CRASHES {
        let at = start + Duration::from_micros(rng.gen_range(0..200_000));
        net.timeline_mut().schedule(at, Ev::Crash);
    }
    let mut server = Target::new(rpc_config());
    server.register(HANDLER);
    let mut w = World {
        rng,
        net,
        caller: Caller::new(rpc_config(), 77),
        server,
        log: DyingLog::new(1 << 20),
        life: 0,
        incarnation: 1,
        effects: BTreeMap::new(),
        calls: Vec::new(),
        crashes: 0,
        crash_rate: CRASH_RATE,
        stats: Stats::default(),
    };
    w.flush();
    let mut events = w.run_until(start + cfg.safety_phase);
    // No more faults and no more crashes: everything ends.
    w.crash_rate = 0.0;
    w.net.link.faulty = false;
    let slice = Duration::from_millis(50);
    let mut end = start + cfg.safety_phase;
    while end < start + cfg.time_limit {
        end = end + slice;
        events += w.run_until(end);
        if w.calls.iter().all(|c| w.caller.finished(*c) == Some(true)) {
            break;
        }
    }
    let mut violations = Vec::new();
    let [ran, not_run, unknown] = check_ends(&w.calls, &w.caller, &w.effects, &mut violations);
    let mut stats = w.stats.clone();
    for id in [CLIENT, SERVER] {
        stats.accumulate(w.net.ep_mut(id).stats());
    }
    let mut links = w.net.link.counters;
    for nic in &w.net.link.injectors {
        links.faults.accumulate(&nic.counters());
    }
    let calls = w.calls.len() as u64;
    SimReport {
        // A call is the unit here: made, and ended (every one must).
        sent: calls,
        delivered: ran + not_run + unknown,
        violations,
        retransmits: stats.retransmits,
        checksum_failures: stats.checksum_failures,
        duplicates_discarded: stats.duplicates_discarded,
        links,
        virtual_ms: w.net.now().saturating_since(start).as_nanos() as f64 / 1e6,
        stats,
        events,
        calls: Some(CallsReport { crashes: w.crashes, calls, ran, not_run, unknown }),
        ..SimReport::empty(cfg)
    }
}
