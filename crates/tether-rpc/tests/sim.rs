//! Calls through the real protocol core in the simulator's virtual network
//! (`tether_sim::VirtualNet`): every datagram may be lost, duplicated,
//! delayed past others or corrupted, and the server node crashes at
//! random, sometimes in the middle of a log write, and restarts as a new
//! incarnation on its log. At 120 seeds: no call runs twice, every call
//! ends, and each final state says truly whether its handler ran (the
//! state tuples against what actually ran).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use tether_proto::{Config, Instant};
use tether_rpc::{for_server, replay, CallLog, CallRef, Caller, Dispatch, MemLog, RpcConfig, Target};
use tether_sim::net::{self, Datagram, Link, Step, Timeline, VirtualNet};

mod common;
use common::DyingLog;

const CLIENT: u32 = 1;
const SERVER: u32 = 2;
const HANDLER: u32 = 5;

fn rpc() -> RpcConfig {
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

fn config() -> Config {
    Config { rto_min: Duration::from_millis(1), abandon_after: Duration::from_secs(2), ..Config::default() }
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

/// Loss, duplication, reordering (jittered latency) and corruption.
struct Faulty {
    rng: Pcg64Mcg,
    rate: f64,
}

impl Link<Ev> for Faulty {
    fn transmit(&mut self, timeline: &mut Timeline<Ev>, sent: net::Sent<'_>) {
        if self.rng.gen_bool(self.rate) {
            return;
        }
        let copies = if self.rng.gen_bool(self.rate) { 2 } else { 1 };
        for _ in 0..copies {
            let mut bytes = sent.bytes.to_vec();
            if self.rng.gen_bool(self.rate) {
                let i = self.rng.gen_range(0..bytes.len());
                bytes[i] ^= 1 << self.rng.gen_range(0..8);
            }
            let latency = Duration::from_micros(self.rng.gen_range(20..600));
            timeline
                .send(sent.now + latency, Datagram { src: sent.src, dst: sent.dst, rail: sent.rail, bytes });
        }
    }
}

struct World {
    rng: Pcg64Mcg,
    net: VirtualNet<Faulty, Ev>,
    caller: Caller,
    server: Target,
    log: DyingLog,
    life: u32,
    incarnation: u64,
    effects: BTreeMap<(u64, u64), u32>,
    calls: Vec<CallRef>,
    crashes: u32,
    crash_rate: f64,
}

impl World {
    /// Take the call envelopes node `id`'s core delivered into its call
    /// layer, and its call layer's envelopes into the core.
    fn pump(&mut self, id: u32) {
        let now = self.net.now();
        let ep = self.net.ep_mut(id);
        while let Some(d) = ep.recv_call() {
            if id == SERVER && for_server(&d.message) {
                self.server.handle(now, d.from, &d.message, &mut self.log).unwrap();
            } else if id == CLIENT && !for_server(&d.message) {
                self.caller.handle(now, d.from, &d.message).unwrap();
            }
        }
        // Nothing but calls goes over these streams.
        assert!(ep.recv().is_none());
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
            let _ = self.net.ep_mut(CLIENT).send_call(now, o.to, Bytes::from(o.bytes));
        }
        while let Some(o) = self.server.poll_transmit() {
            let _ = self.net.ep_mut(SERVER).send_call(now, o.to, Bytes::from(o.bytes));
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
        let mut server = Target::recover(rpc(), &records);
        server.register(HANDLER);
        let mut clean = MemLog::new(1 << 20);
        clean.compact(&records).unwrap();
        self.log.log = clean;
        self.server = server;
        self.net.replace(net::endpoint(config(), SERVER, self.incarnation, [CLIENT], &[0]));
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

    fn run(&mut self, span: Duration) {
        let end = self.net.now() + span;
        while let Some(step) = self.net.step(end) {
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
        }
    }
}

fn run(seed: u64) -> (u32, usize, [usize; 3]) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let link = Faulty { rng: Pcg64Mcg::seed_from_u64(seed ^ 0x5EED), rate: 0.02 };
    let mut net = VirtualNet::new(Instant::from_nanos(1_000_000_000), link);
    net.add(net::endpoint(config(), CLIENT, 1, [SERVER], &[0]));
    net.add(net::endpoint(config(), SERVER, 1, [CLIENT], &[0]));
    let start = net.now();
    for i in 0..400u64 {
        let at = start + Duration::from_micros(i * 500 + rng.gen_range(0..400));
        net.timeline_mut().schedule(at, Ev::NewCall);
    }
    for _ in 0..8 {
        let at = start + Duration::from_micros(rng.gen_range(0..200_000));
        net.timeline_mut().schedule(at, Ev::Crash);
    }
    let mut server = Target::new(rpc());
    server.register(HANDLER);
    let mut w = World {
        rng,
        net,
        caller: Caller::new(rpc(), 77),
        server,
        log: DyingLog::new(1 << 20),
        life: 0,
        incarnation: 1,
        effects: BTreeMap::new(),
        calls: Vec::new(),
        crashes: 0,
        crash_rate: 0.01,
    };
    w.flush();
    w.run(Duration::from_millis(250));
    // No more crashes: everything ends.
    w.crash_rate = 0.0;
    w.net.link.rate = 0.0;
    for _ in 0..600 {
        w.run(Duration::from_millis(50));
        if w.calls.iter().all(|c| w.caller.finished(*c) == Some(true)) {
            break;
        }
    }
    let claims = common::check_ends(seed, &w.calls, &w.caller, &w.effects);
    (w.crashes, w.calls.len(), claims)
}

#[test]
fn calls_through_the_core_survive_faults_and_server_crashes_at_many_seeds() {
    let common::Sweep { crashes, calls, claims } = common::sweep(0..120, run);
    assert!(crashes >= 120 * 4, "{crashes} crashes");
    assert!(claims[0] > calls / 2, "most calls ran: {claims:?}");
}
