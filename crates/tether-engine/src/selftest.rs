//! The adaptive concurrent self-test (Zhou et al. [FTGM] section 4: the
//! network card's self-test of the service paths in use; docs/ENGINE.md,
//! "The self-test"). A watchdog sees an engine that stops; this sees one
//! that goes on but does the wrong thing.
//!
//! On each rail applications' traffic crossed since its last probe, the
//! engine runs a pair of protocol cores of its own (node ids from
//! `PROBE_BASE`, which no application may take) that exchange probe
//! messages through that rail's socket and the kernel - the engine sends
//! to its own address - along the code path applications' messages take:
//! a small message always; one of several fragments when applications sent
//! full datagrams since the last probe; and every fourth probe with its
//! first datagram withheld on purpose, so the retransmission path runs too.
//! Each probe is checked for count (exactly the probes sent, in order,
//! once), contents (a pattern keyed by the probe's number) and latency
//! (within `deadline`). A rail nobody used is not probed: the interval
//! adapts to the traffic and the test stops when a path is idle.
//!
//! A failed probe is an engine fault: the engine stops with
//! `EngineError::SelfTest`, its supervisor reports the failure and starts
//! another engine, which resumes from the applications' backups.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_attach::PROBE_BASE;
use tether_io::Transport;
use tether_proto::{Config, Endpoint as Core, Instant, NodeId, Origin, RailId, MAX_RAILS};

/// How the self-test runs.
#[derive(Debug, Clone, Copy)]
pub struct SelfTestOptions {
    /// Probe a rail in use at most this often (the paper's 0.5 s).
    pub every: Duration,
    /// A probe not delivered, exact, within this is a failure.
    pub deadline: Duration,
}

impl Default for SelfTestOptions {
    fn default() -> Self {
        SelfTestOptions { every: Duration::from_millis(500), deadline: Duration::from_secs(1) }
    }
}

/// What the self-test did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SelfTestStats {
    pub probes: u64,
    pub passed: u64,
    /// Probes with their first datagram withheld (the retransmission path).
    pub withheld: u64,
    /// Probes that spanned several datagrams.
    pub fragmented: u64,
    /// Rails skipped at their turn because nobody used them.
    pub idle_skips: u64,
    /// Time spent on the self-test: starting probes, running its cores,
    /// sending their datagrams, checking what they delivered.
    pub busy_ns: u64,
}

/// One rail's pair of cores and the probes in flight between them.
struct Pair {
    rail: RailId,
    /// Where the rail's socket receives (the engine's own address).
    addr: SocketAddr,
    tx: Core,
    rx: Core,
    /// Probes sent and not yet delivered: number and when sent.
    pending: VecDeque<(u64, Instant)>,
    /// Probe rounds started (a round is one probe, or two with a
    /// fragmented one).
    rounds: u64,
    /// The next probe's number, and the next expected at the receiver.
    next: u64,
    expected: u64,
    due: Instant,
    /// Applications' traffic crossed the rail since the last probe; some
    /// of it in full datagrams (messages that fragment).
    used: bool,
    large: bool,
    /// Drop the sender's next datagram instead of sending it.
    withhold: bool,
    /// A probe sent or a datagram received since the cores last ran;
    /// else they need a turn only at `wake`, their next timer. The pair
    /// costs nothing on the turns in between: the engine spins through
    /// millions of them.
    stirred: bool,
    wake: Option<Instant>,
}

pub struct SelfTest {
    options: SelfTestOptions,
    pairs: Vec<Pair>,
    stats: SelfTestStats,
    /// `stats` as others see them, updated when they change.
    shared: Arc<Mutex<SelfTestStats>>,
    /// The largest payload one datagram carries: probes larger fragment.
    datagram_payload: usize,
    scratch: Vec<u8>,
}

/// Where a socket bound at `addr` is reached from the host itself.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

/// The bytes of probe `n`, `len` long: its number, then a pattern of it.
fn probe(n: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&n.to_le_bytes());
    out.extend((8..len.max(8)).map(|i| (n as usize).wrapping_mul(31).wrapping_add(i * 7) as u8));
}

fn random_secret() -> [u8; 32] {
    let mut s = [0u8; 32];
    // SAFETY: getrandom writes at most `s.len()` bytes into `s`.
    let n = unsafe { libc::getrandom(s.as_mut_ptr().cast(), s.len(), 0) };
    if n != s.len() as isize {
        // Never expected on Linux >= 3.17; the secret then only guards
        // handshakes between the engine and itself over its own address.
        s[..16].copy_from_slice(&tether_attach::monotonic_ns().to_le_bytes().repeat(2));
    }
    s
}

impl SelfTest {
    /// A pair of cores for each rail bound at `rails`, speaking `config`.
    pub fn new(config: &Config, rails: &[SocketAddr], options: SelfTestOptions, now: Instant) -> Self {
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let mut pairs = Vec::new();
        for (r, &addr) in rails.iter().enumerate().take(MAX_RAILS) {
            let (a, b) = (PROBE_BASE + 2 * r as NodeId, PROBE_BASE + 2 * r as NodeId + 1);
            let core = |node: NodeId, peer: NodeId| -> Option<Core> {
                let mut c = Core::new(config.clone(), node, incarnation).ok()?;
                c.seed_secrets(random_secret());
                c.add_peer(peer).ok()?;
                c.set_paths(peer, &[r as RailId]).ok()?;
                Some(c)
            };
            // The engine's configuration was validated when it started.
            let (Some(tx), Some(rx)) = (core(a, b), core(b, a)) else { continue };
            let wake = [tx.poll_timeout(), rx.poll_timeout()].into_iter().flatten().min();
            pairs.push(Pair {
                rail: r as RailId,
                addr: reachable(addr),
                tx,
                rx,
                pending: VecDeque::new(),
                rounds: 0,
                next: 0,
                expected: 0,
                due: now + options.every,
                used: false,
                large: false,
                withhold: false,
                stirred: false,
                wake,
            });
        }
        let datagram_payload = config.max_datagram.saturating_sub(128).max(64);
        SelfTest {
            options,
            pairs,
            stats: SelfTestStats::default(),
            shared: Arc::default(),
            datagram_payload,
            scratch: Vec::new(),
        }
    }

    pub fn stats(&self) -> SelfTestStats {
        self.stats
    }

    /// The stats, kept current while the engine runs elsewhere.
    pub fn watch(&self) -> Arc<Mutex<SelfTestStats>> {
        self.shared.clone()
    }

    /// Applications sent a `len`-byte datagram (`full`: as large as
    /// datagrams get) on `rail`: the rail is in use.
    pub fn saw_traffic(&mut self, rail: RailId, full: bool) {
        if let Some(p) = self.pairs.iter_mut().find(|p| p.rail == rail) {
            p.used = true;
            p.large |= full;
        }
    }

    /// A datagram for a probe node arrived on `rail` from `addr`: only the
    /// engine's own address speaks for them.
    pub fn handle_datagram(&mut self, now: Instant, rail: RailId, addr: SocketAddr, dst: NodeId, d: &[u8]) {
        let Some(p) = self.pairs.iter_mut().find(|p| p.rail == rail) else { return };
        let origin = |claimed: NodeId| {
            if addr == p.addr {
                Origin::Node(claimed)
            } else {
                Origin::Stranger(addr)
            }
        };
        let started = std::time::Instant::now();
        p.stirred = true;
        let src = if dst == p.rx.node() { p.tx.node() } else { p.rx.node() };
        if dst == p.rx.node() {
            p.rx.handle_datagram_from(now, rail, origin(src), d);
        } else if dst == p.tx.node() {
            p.tx.handle_datagram_from(now, rail, origin(src), d);
        }
        self.stats.busy_ns += started.elapsed().as_nanos() as u64;
    }

    /// When the self-test next needs a turn.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pairs
            .iter()
            .flat_map(|p| {
                let probing = (p.used || !p.pending.is_empty()).then_some(p.due);
                let deadline = p.pending.front().map(|&(_, at)| at + self.options.deadline);
                [p.tx.poll_timeout(), p.rx.poll_timeout(), probing, deadline]
            })
            .flatten()
            .min()
    }

    /// Start the probes that are due, run the cores' timers, send what they
    /// have on their rails, and check what was delivered. `Ok(true)` if
    /// anything happened; `Err` says how a probe failed.
    pub fn turn(
        &mut self,
        now: Instant,
        rails: &mut [Box<dyn Transport + Send>],
        tx: &mut [u8],
    ) -> Result<bool, String> {
        let before = self.stats;
        let result = self.probe_all(now, rails, tx);
        if self.stats != before {
            *self.shared.lock().unwrap_or_else(|e| e.into_inner()) = self.stats;
        }
        result
    }

    fn probe_all(
        &mut self,
        now: Instant,
        rails: &mut [Box<dyn Transport + Send>],
        tx: &mut [u8],
    ) -> Result<bool, String> {
        let mut busy = false;
        let SelfTest { options, pairs, stats, datagram_payload, scratch, .. } = self;
        for p in pairs.iter_mut() {
            let due = now >= p.due && p.pending.is_empty();
            let probing = due && p.used;
            if due && !p.used {
                p.due = now + options.every;
                stats.idle_skips += 1;
            }
            let timer = p.wake.is_some_and(|w| w <= now);
            if !probing && !p.stirred && !timer && p.pending.is_empty() {
                continue;
            }
            let started = std::time::Instant::now();
            p.stirred = false;
            if probing {
                p.due = now + options.every;
                let sizes: &[usize] = if p.large { &[16, *datagram_payload * 3] } else { &[16] };
                // Every fourth round, whatever its probes' sizes.
                p.rounds += 1;
                p.withhold = p.rounds % 4 == 0;
                stats.withheld += p.withhold as u64;
                for &len in sizes {
                    probe(p.next, len, scratch);
                    let peer = p.rx.node();
                    p.tx.send(now, peer, scratch)
                        .map_err(|e| format!("rail {}: probe not sent: {e}", p.rail))?;
                    p.pending.push_back((p.next, now));
                    p.next += 1;
                    stats.probes += 1;
                    stats.fragmented += (len > *datagram_payload) as u64;
                }
                (p.used, p.large) = (false, false);
                busy = true;
            }
            for core in [&mut p.tx, &mut p.rx] {
                if core.poll_timeout().is_some_and(|t| t <= now) {
                    core.handle_timeout(now);
                    busy = true;
                }
            }
            let Some(rail) = rails.get_mut(p.rail as usize) else { continue };
            for sender in [true, false] {
                let core = if sender { &mut p.tx } else { &mut p.rx };
                while let Some(t) = core.poll_transmit(now, tx) {
                    busy = true;
                    if sender && std::mem::take(&mut p.withhold) {
                        continue;
                    }
                    // A full socket loses it like any datagram: the core resends.
                    let _ = rail.send_to_addr(p.addr, &tx[..t.len]);
                }
            }
            while let Some(d) = p.rx.recv() {
                busy = true;
                let Some(&(n, sent)) = p.pending.front() else {
                    return Err(format!("rail {}: a probe delivered that was never sent", p.rail));
                };
                let got = d.message.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
                if got != Some(p.expected) || n != p.expected {
                    return Err(format!(
                        "rail {}: probe {:?} delivered where {} was expected",
                        p.rail, got, p.expected
                    ));
                }
                probe(n, d.message.len(), scratch);
                if d.message[..] != scratch[..] {
                    return Err(format!("rail {}: probe {n} delivered with other bytes", p.rail));
                }
                p.pending.pop_front();
                p.expected += 1;
                stats.passed += 1;
                let took = now.saturating_since(sent);
                if took > options.deadline {
                    return Err(format!("rail {}: probe {n} took {took:?}", p.rail));
                }
            }
            if let Some(&(n, sent)) = p.pending.front() {
                if now.saturating_since(sent) > options.deadline {
                    return Err(format!(
                        "rail {}: probe {n} not delivered within {:?}",
                        p.rail, options.deadline
                    ));
                }
            }
            p.wake = [p.tx.poll_timeout(), p.rx.poll_timeout()].into_iter().flatten().min();
            stats.busy_ns += started.elapsed().as_nanos() as u64;
        }
        Ok(busy)
    }
}
