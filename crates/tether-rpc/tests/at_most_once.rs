//! A caller and a server through a stream with the guarantee tether's
//! gives between two live incarnations (every envelope once, in order),
//! losing everything in flight when the server dies; the server killed at
//! random moments (between a handler's effect and its completion record,
//! in the middle of a log write, while idle) and restarted on its log.
//! At many seeds: no call runs twice, every call ends, and what each
//! call's final state says of its handler is true.
//!
//! The real stack (tether's core under the simulator, and real processes
//! killed with SIGKILL) runs the same checks elsewhere; this is the call
//! layer's own logic at thousands of crash points.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use tether_proto::Instant;
use tether_rpc::{replay, CallLog, CallRef, Caller, Dispatch, MemLog, RpcConfig, Target};

mod common;
use common::DyingLog;

const CALLER: u32 = 1;
const SERVER: u32 = 2;
const HANDLER: u32 = 7;
const MISSING_HANDLER: u32 = 8;

fn config() -> RpcConfig {
    RpcConfig {
        credit: 8,
        retries: 6,
        ack_timeout: Duration::from_millis(2),
        reply_timeout: Duration::from_millis(5),
        max_retry_interval: Duration::from_millis(20),
        ack_request_after: Duration::from_millis(3),
        ..RpcConfig::default()
    }
}

struct World {
    rng: Pcg64Mcg,
    now: Instant,
    caller: Caller,
    server: Target,
    log: DyingLog,
    /// Envelopes on their way, each with when it arrives (in order).
    to_server: VecDeque<(Instant, Bytes)>,
    to_caller: VecDeque<(Instant, Bytes)>,
    /// Handlers running on the server, and when each finishes.
    running: Vec<(Instant, Dispatch)>,
    /// How many times each call's handler took effect.
    effects: BTreeMap<(u64, u64), u32>,
    crashes: u32,
    calls: Vec<CallRef>,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut server = Target::new(config());
        server.register(HANDLER);
        World {
            rng: Pcg64Mcg::seed_from_u64(seed),
            now: Instant::from_nanos(1_000_000),
            caller: Caller::new(config(), 1000),
            server,
            log: DyingLog::new(16 << 10),
            to_server: VecDeque::new(),
            to_caller: VecDeque::new(),
            running: Vec::new(),
            effects: BTreeMap::new(),
            crashes: 0,
            calls: Vec::new(),
        }
    }

    fn arrival(&mut self, queue_last: Option<Instant>) -> Instant {
        let delay = Duration::from_micros(self.rng.gen_range(20..400));
        (self.now + delay).max(queue_last.unwrap_or(Instant::ZERO))
    }

    /// The server dies: its memory, what it was sending and what was on
    /// its way to it are gone; it restarts on its log.
    fn crash(&mut self) {
        self.crashes += 1;
        self.log.tear_next = false;
        self.to_server.clear();
        self.to_caller.clear();
        self.running.clear();
        let (records, _torn) = replay(self.log.log.bytes());
        let mut server = Target::recover(config(), &records);
        server.register(HANDLER);
        // The torn tail is cut off before anything is written after it.
        let mut clean = MemLog::new(16 << 10);
        clean.compact(&records).unwrap();
        self.log.log = clean;
        server.check_invariants();
        self.server = server;
    }

    fn step(&mut self, crash_rate: f64) {
        self.now = self.now + Duration::from_micros(self.rng.gen_range(10..300));
        let now = self.now;
        while self.to_server.front().is_some_and(|(t, _)| *t <= now) {
            let (_, bytes) = self.to_server.pop_front().unwrap();
            self.server.handle(now, CALLER, &bytes, &mut self.log).unwrap();
            if self.log.tear_next {
                return self.crash();
            }
        }
        while self.to_caller.front().is_some_and(|(t, _)| *t <= now) {
            let (_, bytes) = self.to_caller.pop_front().unwrap();
            self.caller.handle(now, SERVER, &bytes).unwrap();
        }
        // Handlers that finish now: their effect, then (unless the server
        // dies in between) their completion.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].0 > now {
                i += 1;
                continue;
            }
            let (_, d) = self.running.swap_remove(i);
            *self.effects.entry((d.call.client, d.call.seq)).or_default() += 1;
            if self.rng.gen_bool(crash_rate) {
                return self.crash();
            }
            if self.rng.gen_bool(crash_rate) {
                self.log.tear_next = true;
            }
            let result = d.args.clone();
            if self.server.complete(d.from, d.call, &result, &mut self.log).is_err() {
                assert!(self.log.tear_next, "a completion failed without a dying write");
                return self.crash();
            }
        }
        while let Some(d) = self.server.poll_dispatch(&mut self.log) {
            let finish = now + Duration::from_micros(self.rng.gen_range(0..3_000));
            self.running.push((finish, d));
        }
        self.server.handle_timeout(now);
        self.caller.handle_timeout(now);
        while let Some(o) = self.server.poll_transmit() {
            let at = self.arrival(self.to_caller.back().map(|x| x.0));
            self.to_caller.push_back((at, o.bytes));
        }
        while let Some(o) = self.caller.poll_transmit() {
            let at = self.arrival(self.to_server.back().map(|x| x.0));
            self.to_server.push_back((at, o.bytes));
        }
        if self.rng.gen_bool(crash_rate) {
            self.crash();
        } else if self.rng.gen_bool(crash_rate) {
            // The next record written tears.
            self.log.tear_next = true;
        }
        let bound = config().credit as usize * config().lives_per_node;
        assert!(self.server.entries() <= bound, "server holds {} entries", self.server.entries());
        self.caller.check_invariants();
        self.server.check_invariants();
    }

    fn call(&mut self, n: u64) {
        let handler = if n % 17 == 5 { MISSING_HANDLER } else { HANDLER };
        let deadline = n.is_multiple_of(5).then(|| Duration::from_micros(self.rng.gen_range(500..20_000)));
        let args = Bytes::from(n.to_le_bytes().to_vec());
        if let Ok(call) = self.caller.request(self.now, SERVER, handler, args, false, deadline, false) {
            self.calls.push(call);
        }
    }
}

/// Crashes, calls, and how many calls ended in each `Executed`.
fn run(seed: u64) -> (u32, usize, [usize; 3]) {
    let mut w = World::new(seed);
    let mut n = 0u64;
    for _ in 0..3_000 {
        if w.rng.gen_bool(0.5) {
            w.call(n);
            n += 1;
        }
        w.step(0.01);
    }
    // No more crashes: everything settles.
    for _ in 0..20_000 {
        w.step(0.0);
        if w.calls.iter().all(|c| w.caller.finished(*c) == Some(true)) && w.running.is_empty() {
            break;
        }
    }
    for _ in 0..200 {
        w.step(0.0);
    }
    let claims = common::check_ends(seed, &w.calls, &w.caller, &w.effects);
    (w.crashes, w.calls.len(), claims)
}

#[test]
fn no_call_runs_twice_and_every_state_is_true_across_server_crashes() {
    let common::Sweep { crashes, calls, claims } = common::sweep(0..200, run);
    assert!(crashes > 1_000, "the servers died {crashes} times");
    assert!(calls > 100_000, "{calls} calls");
    // Every kind of ending happened, so each check above was made.
    assert!(claims.iter().all(|&n| n > 100), "{claims:?}");
}
