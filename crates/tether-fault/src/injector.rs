//! The injector: a fault plan applied to a stream of calls and datagrams,
//! at the three places Li et al. [CI] section 5 puts it - the application's
//! call (`on_call`), the transport's send (`on_send`) and its receive
//! (`on_recv`, then `drain_ready`). Pure: time comes in as the duration
//! since the caller started, randomness from one seeded `Pcg64Mcg`, so the
//! same plan, seed and inputs give the same faults, in a real transport
//! wrapper and in the simulator alike.
//!
//! Delay goes past the paper's "hold until the next message": a delayed
//! datagram is held for a drawn duration and released when the caller
//! next asks at or after that time (`next_release` says when to ask).
//! Memory is bounded: held and ready datagrams live in reused buffers, at
//! most `MAX_QUEUED` of them; beyond that a datagram is dropped and counted
//! as `overflow`, as a full socket buffer would.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

use crate::dist::Countdown;
use crate::plan::{ErrorKind, Fault, FaultKind, FaultPlan, Modify, PlanError, Rule, Side};

/// Most datagrams held or waiting to be handed out at once.
pub const MAX_QUEUED: usize = 4096;
/// Recently sent datagrams kept as material for inject faults.
const HISTORY: usize = 8;
/// Distinct destinations remembered as targets for inject faults.
const MAX_DESTINATIONS: usize = 64;

/// How many of each fault were injected, and how much was looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounters {
    pub calls_seen: u64,
    pub sends_seen: u64,
    pub receives_seen: u64,
    pub dropped: u64,
    pub delayed: u64,
    pub modified: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub injected: u64,
    pub invocation: u64,
    pub operation: u64,
    /// Datagrams lost because `MAX_QUEUED` were already held: not a fault
    /// of the plan, but never silent.
    pub overflow: u64,
}

impl FaultCounters {
    pub fn of(&self, kind: FaultKind) -> u64 {
        match kind {
            FaultKind::Drop => self.dropped,
            FaultKind::Delay => self.delayed,
            FaultKind::Modify => self.modified,
            FaultKind::Reorder => self.reordered,
            FaultKind::Duplicate => self.duplicated,
            FaultKind::Inject => self.injected,
            FaultKind::Invocation => self.invocation,
            FaultKind::Operation => self.operation,
        }
    }

    fn count(&mut self, kind: FaultKind) {
        *match kind {
            FaultKind::Drop => &mut self.dropped,
            FaultKind::Delay => &mut self.delayed,
            FaultKind::Modify => &mut self.modified,
            FaultKind::Reorder => &mut self.reordered,
            FaultKind::Duplicate => &mut self.duplicated,
            FaultKind::Inject => &mut self.injected,
            FaultKind::Invocation => &mut self.invocation,
            FaultKind::Operation => &mut self.operation,
        } += 1;
    }

    /// Every fault injected, of all kinds.
    pub fn total(&self) -> u64 {
        FaultKind::ALL.iter().map(|&k| self.of(k)).sum()
    }

    /// How many counters `values` gives.
    pub const COUNT: usize = 12;

    /// The counters in declaration order (`from_values` reads them back):
    /// how an engine process reports them to its applications.
    pub fn values(&self) -> [u64; Self::COUNT] {
        let FaultCounters {
            calls_seen,
            sends_seen,
            receives_seen,
            dropped,
            delayed,
            modified,
            reordered,
            duplicated,
            injected,
            invocation,
            operation,
            overflow,
        } = *self;
        [
            calls_seen,
            sends_seen,
            receives_seen,
            dropped,
            delayed,
            modified,
            reordered,
            duplicated,
            injected,
            invocation,
            operation,
            overflow,
        ]
    }

    /// The counters `values` gave, back; a shorter list leaves the rest
    /// at zero, extra values are ignored.
    pub fn from_values(values: impl IntoIterator<Item = u64>) -> Self {
        let mut v = [0u64; Self::COUNT];
        for (slot, value) in v.iter_mut().zip(values) {
            *slot = value;
        }
        let [calls_seen, sends_seen, receives_seen, dropped, delayed, modified, reordered, duplicated, injected, invocation, operation, overflow] =
            v;
        FaultCounters {
            calls_seen,
            sends_seen,
            receives_seen,
            dropped,
            delayed,
            modified,
            reordered,
            duplicated,
            injected,
            invocation,
            operation,
            overflow,
        }
    }

    pub fn accumulate(&mut self, o: &FaultCounters) {
        let mut sum = self.values();
        for (s, v) in sum.iter_mut().zip(o.values()) {
            *s += v;
        }
        *self = FaultCounters::from_values(sum);
    }
}

/// What became of an application call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallVerdict {
    Proceed,
    /// Fail the call at once with this status.
    Invocation(ErrorKind),
    /// Accept the call, then complete it with this status; `dropped`: the
    /// message is not passed on.
    Operation {
        error: ErrorKind,
        dropped: bool,
    },
}

/// What became of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendVerdict {
    /// Report success (dropped datagrams too: Li et al. [CI] Table 4).
    Sent,
    /// Fail the call at once with this status; nothing was sent.
    Invocation(ErrorKind),
    /// Report success; the operation completes with this status.
    Operation(ErrorKind),
}

struct Armed {
    rule: Rule,
    countdown: Countdown,
}

/// A datagram held or ready, with where it came from: the node the
/// transport knew it by and the address it arrived from, handed back with
/// it so a fault changes when and what arrives, never who sent it.
struct Slot {
    from: Option<u32>,
    addr: Option<SocketAddr>,
    buf: Vec<u8>,
}

struct Held {
    slot: Slot,
    /// Released at this time (nanoseconds since start) at the latest.
    release_ns: u64,
    /// Later datagrams still to pass before release (reorder); 0: time only.
    after: u32,
}

pub struct Injector {
    rules: Vec<Armed>,
    /// Off: no rule strikes or draws (`set_enabled`).
    enabled: bool,
    rng: Pcg64Mcg,
    counters: FaultCounters,
    ready: VecDeque<Slot>,
    held: Vec<Held>,
    spare: Vec<Vec<u8>>,
    /// Only kept when an inject rule exists: the copy costs a send.
    history: Vec<Vec<u8>>,
    history_next: usize,
    destinations: Vec<u32>,
}

/// The seed of `node`'s injector in a run whose plan has `plan_seed`: every
/// node draws its own stream of faults, and all of them follow from the one
/// seed a run prints. Multiplying by 2^64 over the golden ratio (Fibonacci
/// hashing) spreads neighbouring run seeds far apart before the node is
/// mixed in. The simulator's runs are fixed by this formula: changing it
/// changes every simulated run of every seed.
pub fn node_seed(plan_seed: u64, node: u32) -> u64 {
    plan_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(node) + 1)
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl Injector {
    /// An injector for `plan`, drawing from `plan.seed`.
    pub fn new(plan: &FaultPlan) -> Result<Self, PlanError> {
        Self::with_seed(plan, plan.seed)
    }

    /// The same plan from another seed: each endpoint of a run gets its own
    /// stream of faults, all replayable from the run's seed ([`node_seed`]).
    pub fn with_seed(plan: &FaultPlan, seed: u64) -> Result<Self, PlanError> {
        plan.validate()?;
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let rules = plan
            .rules
            .iter()
            .map(|&rule| Armed { rule, countdown: rule.recurrence.start(&mut rng) })
            .collect();
        let wants_history = plan.rules.iter().any(|r| matches!(r.fault, Fault::Inject));
        Ok(Injector {
            rules,
            enabled: true,
            rng,
            counters: FaultCounters::default(),
            ready: VecDeque::new(),
            held: Vec::new(),
            spare: Vec::new(),
            history: if wants_history { Vec::with_capacity(HISTORY) } else { Vec::new() },
            history_next: 0,
            destinations: Vec::new(),
        })
    }

    pub fn counters(&self) -> FaultCounters {
        self.counters
    }

    /// Switch every rule on or off (a fault storm that ends; a healed link).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    pub fn touches(&self, side: Side) -> bool {
        self.rules.iter().any(|r| r.rule.side == side)
    }

    /// Which rules at `side` for faults of `kinds` strike this call or
    /// datagram, in plan order; `visit` returns false to stop looking (the
    /// datagram is gone). Rules of other kinds are not drawn at all, so a
    /// receive call does not consume (or count) the drops meant for the
    /// datagrams it returns.
    fn strike(
        &mut self,
        side: Side,
        kinds: fn(FaultKind) -> bool,
        now: Duration,
        mut visit: impl FnMut(&mut Self, Fault) -> bool,
    ) {
        if !self.enabled {
            return;
        }
        for i in 0..self.rules.len() {
            let a = &mut self.rules[i];
            if a.rule.side != side || !kinds(a.rule.kind()) || !a.rule.schedule.active(now) {
                continue;
            }
            if !a.rule.recurrence.strikes(&mut a.countdown, ns(now), &mut self.rng) {
                continue;
            }
            let fault = a.rule.fault;
            self.counters.count(fault.kind());
            if !visit(self, fault) {
                return;
            }
        }
    }

    /// An application call (a send): invocation and operation faults of
    /// the `api` side.
    pub fn on_call(&mut self, now: Duration) -> CallVerdict {
        self.counters.calls_seen += 1;
        let mut verdict = CallVerdict::Proceed;
        self.strike(
            Side::Api,
            |_| true,
            now,
            |inj, fault| {
                verdict = match fault {
                    Fault::Invocation(e) => CallVerdict::Invocation(e),
                    Fault::Operation { error, drop } => {
                        CallVerdict::Operation { error, dropped: drop >= 1.0 || inj.rng.gen_bool(drop) }
                    }
                    _ => return true,
                };
                false
            },
        );
        verdict
    }

    /// A datagram handed to the transport for `dst`: `send` is called for
    /// every datagram that should really go out (none, the datagram, its
    /// copies, an injected old one).
    pub fn on_send(
        &mut self,
        now: Duration,
        dst: u32,
        datagram: &[u8],
        mut send: impl FnMut(u32, &[u8]),
    ) -> SendVerdict {
        self.counters.sends_seen += 1;
        let (mut verdict, mut copies, mut inject, mut gone) = (SendVerdict::Sent, 1u32, false, false);
        self.strike(
            Side::Send,
            |_| true,
            now,
            |inj, fault| {
                match fault {
                    Fault::Invocation(e) => verdict = SendVerdict::Invocation(e),
                    Fault::Operation { error, drop } => {
                        verdict = SendVerdict::Operation(error);
                        gone = drop >= 1.0 || inj.rng.gen_bool(drop);
                    }
                    Fault::Drop => gone = true,
                    Fault::Duplicate { copies: c } => copies += c,
                    Fault::Inject => inject = true,
                    // Receive-side only; validation keeps them off this side.
                    Fault::Delay(_) | Fault::Modify(_) | Fault::Reorder { .. } => {}
                }
                !gone && !matches!(verdict, SendVerdict::Invocation(_))
            },
        );
        if matches!(verdict, SendVerdict::Invocation(_)) {
            return verdict;
        }
        if !gone {
            for _ in 0..copies {
                send(dst, datagram);
            }
        }
        if inject {
            self.inject(&mut send);
        }
        self.remember(dst, datagram);
        verdict
    }

    fn inject(&mut self, send: &mut impl FnMut(u32, &[u8])) {
        if self.history.is_empty() || self.destinations.is_empty() {
            return; // Nothing sent yet to copy or to send to.
        }
        let old = self.rng.gen_range(0..self.history.len());
        let to = self.destinations[self.rng.gen_range(0..self.destinations.len())];
        send(to, &self.history[old]);
    }

    fn remember(&mut self, dst: u32, datagram: &[u8]) {
        if self.history.capacity() == 0 {
            return;
        }
        if !self.destinations.contains(&dst) && self.destinations.len() < MAX_DESTINATIONS {
            self.destinations.push(dst);
        }
        if self.history.len() < HISTORY {
            self.history.push(datagram.to_vec());
        } else {
            let slot = &mut self.history[self.history_next];
            slot.clear();
            slot.extend_from_slice(datagram);
        }
        self.history_next = (self.history_next + 1) % HISTORY;
    }

    /// A receive call: an invocation fault fails it before the transport
    /// is asked.
    pub fn on_recv_call(&mut self, now: Duration) -> Option<ErrorKind> {
        let mut failed = None;
        self.strike(
            Side::Recv,
            |k| k == FaultKind::Invocation,
            now,
            |_, fault| match fault {
                Fault::Invocation(e) => {
                    failed = Some(e);
                    false
                }
                _ => true,
            },
        );
        failed
    }

    /// A datagram that arrived from `from` (a node, if the transport knew
    /// it) at `addr` (if it has addresses). What comes of it, now or later,
    /// is handed out by `drain_ready`.
    pub fn on_recv(&mut self, now: Duration, from: Option<u32>, addr: Option<SocketAddr>, datagram: &[u8]) {
        self.counters.receives_seen += 1;
        let now_ns = ns(now);
        let mut copies = 1u32;
        let mut hold: Option<(u64, u32)> = None; // (release at, later datagrams to pass)
        let mut modify = None;
        let mut gone = false;
        self.strike(
            Side::Recv,
            |k| k != FaultKind::Invocation,
            now,
            |inj, fault| {
                match fault {
                    Fault::Drop => gone = true,
                    Fault::Duplicate { copies: c } => copies += c,
                    Fault::Modify(m) => modify = Some(m),
                    Fault::Delay(spread) => {
                        let until = now_ns.saturating_add(spread.sample_ns(&mut inj.rng));
                        let after = hold.map_or(0, |h| h.1);
                        hold = Some((hold.map_or(until, |h| h.0.max(until)), after));
                    }
                    Fault::Reorder { depth, max_hold } => {
                        let after = inj.rng.gen_range(1..=depth);
                        hold = Some((hold.map_or(now_ns.saturating_add(ns(max_hold)), |h| h.0), after));
                    }
                    // Send-side or call faults; validation keeps them off this side.
                    Fault::Inject | Fault::Invocation(_) | Fault::Operation { .. } => {}
                }
                !gone
            },
        );
        if gone {
            self.pass_held();
            return;
        }
        let mut held = None;
        for copy in 0..copies {
            let Some(mut slot) = self.slot(from, addr, datagram) else { break };
            if let Some(m) = modify {
                self.mangle(&mut slot.buf, m);
            }
            match hold {
                // Extra copies of a held datagram arrive on time: only the
                // original is held.
                Some((release_ns, after)) if copy == 0 => held = Some(Held { slot, release_ns, after }),
                _ => self.ready.push_back(slot),
            }
        }
        // This datagram overtakes those held before it, not itself.
        self.pass_held();
        self.held.extend(held);
    }

    /// One more datagram has arrived past every held one: release those
    /// it was the last to overtake (after it, as Li et al. [CI] Table 4 says).
    fn pass_held(&mut self) {
        let mut i = 0;
        while i < self.held.len() {
            let h = &mut self.held[i];
            if h.after > 0 {
                h.after -= 1;
                if h.after == 0 {
                    let h = self.held.remove(i);
                    self.ready.push_back(h.slot);
                    continue;
                }
            }
            i += 1;
        }
    }

    fn slot(&mut self, from: Option<u32>, addr: Option<SocketAddr>, datagram: &[u8]) -> Option<Slot> {
        if self.ready.len() + self.held.len() >= MAX_QUEUED {
            self.counters.overflow += 1;
            return None;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(datagram);
        Some(Slot { from, addr, buf })
    }

    fn mangle(&mut self, buf: &mut Vec<u8>, how: Modify) {
        match how {
            Modify::Flip(bits) => {
                if buf.is_empty() {
                    return;
                }
                for _ in 0..bits.sample(&mut self.rng) {
                    let bit = self.rng.gen_range(0..buf.len() * 8);
                    buf[bit / 8] ^= 1 << (bit % 8);
                }
            }
            Modify::Truncate => {
                let len = self.rng.gen_range(0..buf.len().max(1));
                buf.truncate(len);
            }
            Modify::Extend(by) => {
                for _ in 0..by.sample(&mut self.rng) {
                    buf.push(self.rng.gen());
                }
            }
        }
    }

    /// Hand out, in order, the datagrams whose time has come, while
    /// `deliver` accepts them (it returns false when it has no room), each
    /// with the node and address it arrived from.
    pub fn drain_ready(
        &mut self,
        now: Duration,
        mut deliver: impl FnMut(Option<u32>, Option<SocketAddr>, &[u8]) -> bool,
    ) {
        let now_ns = ns(now);
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].release_ns <= now_ns {
                let h = self.held.remove(i);
                self.ready.push_back(h.slot);
            } else {
                i += 1;
            }
        }
        while let Some(slot) = self.ready.front() {
            if !deliver(slot.from, slot.addr, &slot.buf) {
                return;
            }
            let slot = self.ready.pop_front().expect("front exists");
            self.spare.push(slot.buf);
        }
    }

    /// When the next held datagram is due, if any is held.
    pub fn next_release(&self) -> Option<Duration> {
        self.held.iter().map(|h| h.release_ns).min().map(Duration::from_nanos)
    }

    /// Datagrams ready to hand out now.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Datagrams held back (delayed or reordered).
    pub fn holding(&self) -> usize {
        self.held.len()
    }

    /// Buffers owned by the injector, in use or spare: bounded by
    /// `MAX_QUEUED` plus the inject history.
    pub fn buffers(&self) -> usize {
        self.ready.len() + self.held.len() + self.spare.len() + self.history.len()
    }
}
