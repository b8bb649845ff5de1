//! `tether campaign`: the fault-injection campaigns of Li et al. [CI]
//! section 6.
//!
//! Two real endpoints talk over UDP on loopback, both wrapped in the same
//! fault plan: one fault kind at one rate, from one seed. Every cell of the
//! sweep kinds x rates x seeds runs a workload of section 6.2 and reports
//! what the application saw (sent, delivered, lost, duplicated, corrupted:
//! the last three must be zero), what the layer did to hide the faults
//! (retransmissions, duplicates discarded, checksum failures), and how long
//! it took relative to the fault-free runs of the same campaign, as in the
//! paper's Figures 3 and 4.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::Serialize;
use tether::faults::{FaultKind, FaultPlan};
use tether::{Endpoint, Error, NodeId, Options};

use crate::args;
use crate::net::loopback;
use crate::pattern;
use crate::plot::{self, Chart, Series};
use crate::summary::Summary;

/// The two hosts of every cell.
const A: NodeId = 1;
const B: NodeId = 2;
/// Messages each side sends per round of the CPU-bound workload (Li et al. [CI] section 6.2).
const PER_ROUND: u64 = 12;
/// A message that has not arrived after this much silence is counted lost.
const SILENCE: Duration = Duration::from_secs(3);
/// Bound on any one blocking call, so a broken cell fails instead of hanging.
const CALL: Duration = Duration::from_secs(10);

/// The workloads of Li et al. [CI] section 6.2.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Communication-bound: the sender streams as fast as the window allows.
    Comm,
    /// CPU-bound: each side sends 12 messages, computes long enough for
    /// the ACKs to arrive, then receives 12; repeated for some rounds.
    Cpu,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Comm => "comm",
            Workload::Cpu => "cpu",
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct CampaignOpts {
    /// Workloads to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "comm,cpu")]
    pub workloads: Vec<Workload>,
    /// Fault kinds to sweep, comma-separated [default: every message fault:
    /// drop, delay, modify, reorder, duplicate, inject].
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Fault rates to sweep, comma-separated: the probability that a
    /// datagram is struck, in (0, 1].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = args::rate,
          default_value = "0.0001,0.001,0.01,0.1")]
    pub rates: Vec<f64>,
    /// Seeds per kind and rate (and fault-free runs per workload).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = args::int_in::<u64>(1, 1000, "", ""))]
    pub seeds: u64,
    /// The first seed; a cell replays with --first-seed N --seeds 1.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = args::seed)]
    pub first_seed: u64,
    /// Message size in bytes (at least 8: every message carries its index).
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true, value_parser = args::size(8))]
    pub size: usize,
    /// Messages the communication-bound workload streams.
    #[arg(long, default_value_t = 20_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, MAX_MESSAGES, "", "each message is tracked"))]
    pub messages: u64,
    /// Rounds of the CPU-bound workload.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, MAX_MESSAGES / PER_ROUND, "", "12 messages each, each tracked"))]
    pub rounds: u64,
    /// Computation per round of the CPU-bound workload (at most 10s).
    #[arg(long, default_value = "1ms",
          value_parser = args::duration_in(Duration::ZERO, Duration::from_secs(10), "a round is meant to be short"))]
    pub compute: Duration,
    /// Mean of the delay fault's exponential duration (at most 1s: a
    /// message delayed past 3 s of silence would count as lost).
    #[arg(long, default_value = "1ms",
          value_parser = args::duration_in(Duration::from_nanos(1), Duration::from_secs(1), "well below the 3 s after which a message counts as lost"))]
    pub delay: Duration,
    /// Write campaign.csv and a PNG plot per workload (with --engine:
    /// engine-campaign.csv and engine-recovery.png) into this directory [default: none].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print one JSON document with a record per cell instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Strike engine processes instead of links (Zhou et al. [FTGM] Table 1):
    /// two hosts in network namespaces (needs root and `ip netns`), a
    /// supervised `tether engine` on each, a verified stream between them,
    /// and engines killed, hung and their state flipped, one strike at a time.
    #[arg(long)]
    pub engine: bool,
    /// With --engine: fault classes to strike, comma-separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub classes: Vec<crate::engine_fault::FaultClass>,
    /// With --engine: strikes per class.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 100_000, "", ""))]
    pub strikes: usize,
    /// With --engine: rails between the two hosts (a veth pair each).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true,
          value_parser = args::int_in::<u8>(1, crate::netns::MAX_RAILS as u64, "", ""))]
    pub rails: u8,
    /// With --engine: one message of the verified stream every this many microseconds.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(20, 1_000_000, "", "each message is stamped"))]
    pub pace_us: u64,
    /// With --engine: the supervisors' hang threshold (`tether engine --hang-after-us`).
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(100, 60_000_000, "", ""))]
    pub hang_after_us: u64,
    /// With --engine: how long each strike is watched for a detection
    /// (internal faults at least 1600 ms: the self-test's reach).
    #[arg(long, default_value_t = 500, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(10, 60_000, "ms", ""))]
    pub window_ms: u64,
    /// With --engine: probability that an engine drops a datagram it
    /// receives (`tether engine --fault drop:p=P`); 0 for none.
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true, value_parser = args::probability)]
    pub drop: f64,
    /// With --engine: seed of the strikes' order, sides, pauses, hang
    /// lengths and hook seeds (and of the engines' drops).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = args::seed)]
    pub seed: u64,
    /// Strike a cluster instead (Li et al. [CI] Figure 5): `--members`
    /// embedded endpoints, three of them manager replicas, heartbeating
    /// for `--cell-secs` at each of `--rates` (each of drop, duplicate and
    /// corrupt at that rate), with the two-miss rule and phi accrual side
    /// by side, then with a busy thread per core and no link faults;
    /// retransmissions, duplicates, false alarms and manager
    /// self-diagnosis per injected fault.
    #[arg(long)]
    pub cluster: bool,
    /// With --cluster: nodes, the three replicas among them.
    #[arg(long, default_value_t = 6, allow_negative_numbers = true, value_parser = args::int_in::<u32>(4, 64, "", ""))]
    pub members: u32,
    /// With --cluster: seconds each cell's heartbeats run once the cluster formed.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = args::int_in::<u64>(1, 3600, "s", ""))]
    pub cell_secs: u64,
    /// With --cluster: the heartbeat period, in milliseconds.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true, value_parser = args::int_in::<u64>(5, 1000, "ms", ""))]
    pub period_ms: u64,
}

impl CampaignOpts {
    /// What `--cluster` runs.
    pub fn cluster_campaign(&self) -> crate::cluster_campaign::ClusterCampaign {
        crate::cluster_campaign::ClusterCampaign {
            members: self.members,
            period: Duration::from_millis(self.period_ms),
            cell: Duration::from_secs(self.cell_secs),
            rates: self.rates.clone(),
            seeds: self.seeds,
            first_seed: self.first_seed,
        }
    }
}

/// Options of the message-fault sweep, and of the engine campaign.
const SWEEP_ONLY: [&str; 9] =
    ["workloads", "kinds", "rates", "seeds", "first_seed", "messages", "rounds", "compute", "delay"];
const ENGINE_ONLY: [&str; 8] =
    ["classes", "strikes", "rails", "pace_us", "hang_after_us", "window_ms", "drop", "seed"];
/// Options of the cluster campaign, and those of the sweep it shares.
const CLUSTER_ONLY: [&str; 3] = ["members", "cell_secs", "period_ms"];
const CLUSTER_SHARES: [&str; 3] = ["rates", "seeds", "first_seed"];

/// Messages a cell may track (a flag each, per direction): 10 million.
const MAX_MESSAGES: u64 = 10_000_000;

/// Refuse, before the first cell, what the sweep would ignore or could not
/// finish: options of a workload or fault kind not in the sweep, a seed
/// range past 2^64, an --out directory that cannot be made; and options of
/// the sweep with --engine, or of the engine campaign without it.
pub fn check(o: &CampaignOpts, given: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    let flag = |f: &str| format!("--{}", f.replace('_', "-"));
    let make_out = || -> anyhow::Result<()> {
        if let Some(dir) = &o.out {
            std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("--out {}: {e}", dir.display()))?;
        }
        Ok(())
    };
    if o.cluster {
        anyhow::ensure!(!o.engine, "--cluster and --engine are two campaigns: one at a time");
        let foreign = SWEEP_ONLY.iter().chain(&ENGINE_ONLY).filter(|f| !CLUSTER_SHARES.contains(f));
        if let Some(f) = foreign.into_iter().find(|f| given(f)) {
            anyhow::bail!(
                "{} is not for the cluster campaign (it takes --rates, --seeds, --first-seed)",
                flag(f)
            );
        }
        anyhow::ensure!(
            o.first_seed.checked_add(o.seeds).is_some(),
            "--first-seed {} plus --seeds {} passes the last seed, 2^64-1",
            o.first_seed,
            o.seeds
        );
        return make_out();
    }
    if let Some(f) = CLUSTER_ONLY.iter().find(|f| given(f)) {
        anyhow::bail!("{} is for the cluster campaign: add --cluster or leave it out", flag(f));
    }
    if o.engine {
        if let Some(f) = SWEEP_ONLY.iter().find(|f| given(f)) {
            anyhow::bail!(
                "{} is for the message-fault sweep; --engine strikes engines (see --classes and --seed)",
                flag(f)
            );
        }
        return make_out();
    }
    if let Some(f) = ENGINE_ONLY.iter().find(|f| given(f)) {
        anyhow::bail!("{} is for the engine campaign: add --engine or leave it out", flag(f));
    }
    let kinds = kinds(o)?;
    anyhow::ensure!(
        o.first_seed.checked_add(o.seeds).is_some(),
        "--first-seed {} plus --seeds {} passes the last seed, 2^64-1",
        o.first_seed,
        o.seeds
    );
    let without = |w: Workload, flags: &[&str]| -> anyhow::Result<()> {
        if let Some(f) = flags.iter().find(|f| given(f)) {
            anyhow::ensure!(
                o.workloads.contains(&w),
                "--{} is for the {} workload, which --workloads leaves out",
                f.replace('_', "-"),
                w.name()
            );
        }
        Ok(())
    };
    without(Workload::Comm, &["messages"])?;
    without(Workload::Cpu, &["rounds", "compute"])?;
    anyhow::ensure!(
        !given("delay") || kinds.contains(&FaultKind::Delay),
        "--delay is the delay fault's mean, and --kinds leaves delay out"
    );
    make_out()
}

/// One run of one workload under one fault kind, rate and seed.
#[derive(Debug, Clone, Serialize)]
pub struct CellRecord {
    pub workload: &'static str,
    /// `none` for the fault-free runs every time is relative to.
    pub fault: &'static str,
    pub rate: f64,
    pub seed: u64,
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Delivered, but not in send order.
    pub out_of_order: u64,
    /// Messages the layer gave up on (a peer declared unreachable).
    pub failed: u64,
    /// Faults the injectors of both endpoints applied.
    pub injected: u64,
    pub retransmissions: u64,
    pub duplicates_discarded: u64,
    pub checksum_failures: u64,
    pub seconds: f64,
    /// `seconds` over the median of this workload's fault-free runs.
    pub relative_time: f64,
}

impl CellRecord {
    /// The application saw exactly what was sent, once, in order.
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.corrupted == 0
            && self.out_of_order == 0
            && self.failed == 0
            && self.delivered == self.sent
    }
}

/// The fault rule a campaign applies for `kind` at `rate`, in the compact
/// form a user would pass to `--fault`.
pub fn rule(kind: FaultKind, rate: f64, delay: Duration) -> String {
    match kind {
        FaultKind::Delay => format!("delay:p={rate},mean={}", tether_fault::format_duration(delay)),
        FaultKind::Modify => format!("modify:p={rate},bits=1..3"),
        _ => format!("{}:p={rate}", kind.name()),
    }
}

/// What one side's application received, checked message by message.
struct Inbox {
    from: NodeId,
    size: usize,
    seen: Vec<bool>,
    next: u64,
    unique: u64,
    duplicated: u64,
    corrupted: u64,
    out_of_order: u64,
}

impl Inbox {
    fn new(from: NodeId, size: usize, expected: u64) -> Self {
        Inbox {
            from,
            size,
            seen: vec![false; expected as usize],
            next: 0,
            unique: 0,
            duplicated: 0,
            corrupted: 0,
            out_of_order: 0,
        }
    }

    fn take(&mut self, msg: &[u8]) {
        let index = pattern::index_of(msg, self.from).filter(|&i| i < self.seen.len() as u64);
        let Some(index) = index.filter(|&i| msg.len() == self.size && pattern::verify(msg, self.from, i))
        else {
            self.corrupted += 1;
            return;
        };
        if std::mem::replace(&mut self.seen[index as usize], true) {
            self.duplicated += 1;
            return;
        }
        if index != self.next {
            self.out_of_order += 1;
        }
        self.next = index + 1;
        self.unique += 1;
    }

    /// Receive until `until` messages have arrived or the line goes quiet.
    fn receive(&mut self, ep: &Endpoint, until: u64) -> anyhow::Result<()> {
        while self.unique < until {
            match ep.recv(Some(SILENCE)) {
                Ok(d) => self.take(&d.message),
                Err(Error::TimedOut) => return Ok(()), // the rest counts as lost
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// The pair of endpoints of a cell, both under `plan`.
fn pair(plan: &FaultPlan) -> anyhow::Result<(Endpoint, Endpoint)> {
    let options = || Options { faults: plan.clone(), ..Options::default() };
    let a = Endpoint::udp(A, loopback(), &[], options())?;
    let a_addr = a.local_addr().expect("UDP has an address");
    let b = Endpoint::udp(B, loopback(), &[(A, a_addr)], options())?;
    a.add_peer(B, b.local_addr().expect("UDP has an address"))?;
    Ok((a, b))
}

/// Counts of one run before they become a record.
#[derive(Default)]
struct Outcome {
    sent: u64,
    delivered: u64,
    duplicated: u64,
    corrupted: u64,
    out_of_order: u64,
    seconds: f64,
}

impl Outcome {
    fn add(&mut self, sent: u64, inbox: &Inbox) {
        self.sent += sent;
        self.delivered += inbox.unique;
        self.duplicated += inbox.duplicated;
        self.corrupted += inbox.corrupted;
        self.out_of_order += inbox.out_of_order;
    }
}

/// Communication-bound: A streams `messages` to B as fast as it can.
fn comm(o: &CampaignOpts, a: &Endpoint, b: &Endpoint) -> anyhow::Result<Outcome> {
    let (size, n) = (o.size, o.messages);
    let start = Instant::now();
    let (inbox, end) = std::thread::scope(|s| -> anyhow::Result<_> {
        let receiver = s.spawn(|| -> anyhow::Result<_> {
            let mut inbox = Inbox::new(A, size, n);
            inbox.receive(b, n)?;
            Ok((inbox, Instant::now()))
        });
        let mut buf = vec![0u8; size];
        for i in 0..n {
            pattern::fill(&mut buf, A, i);
            a.send_blocking(B, &buf, Some(CALL))?;
        }
        receiver.join().map_err(|_| anyhow::anyhow!("receiver panicked"))?
    })?;
    let mut out = Outcome { seconds: (end - start).as_secs_f64(), ..Outcome::default() };
    out.add(n, &inbox);
    Ok(out)
}

/// Burn the CPU for `d`: the computation that hides communication.
fn compute(d: Duration) {
    let start = Instant::now();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    while start.elapsed() < d {
        for _ in 0..256 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
    }
}

/// One side of the CPU-bound workload: 12 sends, compute, 12 receives.
fn cpu_side(o: &CampaignOpts, ep: &Endpoint, me: NodeId, peer: NodeId) -> anyhow::Result<(Inbox, Instant)> {
    let total = o.rounds * PER_ROUND;
    let mut inbox = Inbox::new(peer, o.size, total);
    let mut buf = vec![0u8; o.size];
    for round in 0..o.rounds {
        for k in 0..PER_ROUND {
            pattern::fill(&mut buf, me, round * PER_ROUND + k);
            ep.send_blocking(peer, &buf, Some(CALL))?;
        }
        compute(o.compute);
        inbox.receive(ep, (round + 1) * PER_ROUND)?;
    }
    Ok((inbox, Instant::now()))
}

fn cpu(o: &CampaignOpts, a: &Endpoint, b: &Endpoint) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let (sa, sb) = std::thread::scope(|s| {
        let other = s.spawn(|| cpu_side(o, b, B, A));
        let mine = cpu_side(o, a, A, B);
        (mine, other.join().map_err(|_| anyhow::anyhow!("side B panicked")))
    });
    let ((ia, ea), (ib, eb)) = (sa?, sb??);
    let sent = o.rounds * PER_ROUND;
    let mut out = Outcome { seconds: (ea.max(eb) - start).as_secs_f64(), ..Outcome::default() };
    out.add(sent, &ia);
    out.add(sent, &ib);
    Ok(out)
}

/// Run one cell: `kind` at `rate` (None: fault-free) from `seed`.
fn cell(
    o: &CampaignOpts,
    workload: Workload,
    fault: Option<(FaultKind, f64)>,
    seed: u64,
) -> anyhow::Result<CellRecord> {
    let plan = match fault {
        Some((kind, rate)) => FaultPlan::parse_rules(seed, &[rule(kind, rate, o.delay)])?,
        None => FaultPlan::new(seed),
    };
    let (a, b) = pair(&plan)?;
    let out = match workload {
        Workload::Comm => comm(o, &a, &b)?,
        Workload::Cpu => cpu(o, &a, &b)?,
    };
    // Let the last ACKs land so the counters are final; a cell whose data
    // all arrived never fails here, so an error is reported, not ignored.
    for ep in [&a, &b] {
        if let Err(e) = ep.flush(Some(SILENCE)) {
            anyhow::ensure!(out.delivered < out.sent, "flush after a complete run: {e}");
        }
    }
    let (sa, sb) = (a.stats(), b.stats());
    let injected = match fault {
        Some((kind, _)) => a.fault_counters().of(kind) + b.fault_counters().of(kind),
        None => 0,
    };
    Ok(CellRecord {
        workload: workload.name(),
        fault: fault.map_or("none", |(k, _)| k.name()),
        rate: fault.map_or(0.0, |(_, r)| r),
        seed,
        sent: out.sent,
        delivered: out.delivered,
        lost: out.sent - out.delivered,
        duplicated: out.duplicated,
        corrupted: out.corrupted,
        out_of_order: out.out_of_order,
        failed: sa.messages_failed + sb.messages_failed,
        injected,
        retransmissions: sa.retransmits + sb.retransmits,
        duplicates_discarded: sa.duplicates_discarded + sb.duplicates_discarded,
        checksum_failures: sa.checksum_failures + sb.checksum_failures,
        seconds: out.seconds,
        relative_time: f64::NAN, // set once the baseline is known
    })
}

/// The fault kinds asked for: message faults only, since invocation and
/// operation faults are meant to reach the application, not be masked.
fn kinds(o: &CampaignOpts) -> anyhow::Result<Vec<FaultKind>> {
    if o.kinds.is_empty() {
        return Ok(FaultKind::MESSAGE.to_vec());
    }
    o.kinds
        .iter()
        .map(|name| {
            let kind = FaultKind::from_name(name).ok_or_else(|| {
                let known: Vec<_> = FaultKind::MESSAGE.iter().map(|k| k.name()).collect();
                anyhow::anyhow!("--kinds: unknown fault kind `{name}` (one of {})", known.join(", "))
            })?;
            anyhow::ensure!(
                FaultKind::MESSAGE.contains(&kind),
                "`{name}` faults surface to the application by design; a campaign sweeps message faults"
            );
            Ok(kind)
        })
        .collect()
}

/// Run the whole sweep, calling `progress` after each cell.
pub fn run(o: &CampaignOpts, mut progress: impl FnMut(&CellRecord)) -> anyhow::Result<Vec<CellRecord>> {
    anyhow::ensure!(o.size >= 8, "--size must be at least 8 bytes (each message carries its index)");
    anyhow::ensure!(o.seeds > 0, "--seeds must be at least 1");
    for &r in &o.rates {
        anyhow::ensure!(r > 0.0 && r <= 1.0, "--rates: {r} is not a probability in (0, 1]");
    }
    let kinds = kinds(o)?;
    let seeds = o.first_seed..o.first_seed + o.seeds;
    let mut cells = Vec::new();
    for &workload in &o.workloads {
        // Warm-up, not recorded: the first run pays for cold caches, page
        // faults and thread start-up, and would skew the baseline.
        cell(o, workload, None, o.first_seed)?;
        let mut runs = Vec::new();
        for seed in seeds.clone() {
            let c = cell(o, workload, None, seed)?;
            progress(&c);
            runs.push(c);
        }
        for &kind in &kinds {
            for &rate in &o.rates {
                for seed in seeds.clone() {
                    let c = cell(o, workload, Some((kind, rate)), seed)?;
                    progress(&c);
                    runs.push(c);
                }
            }
        }
        let base: Vec<f64> = runs.iter().filter(|c| c.fault == "none").map(|c| c.seconds).collect();
        let base = Summary::of(&base).expect("at least one seed").median;
        for c in &mut runs {
            c.relative_time = c.seconds / base;
        }
        cells.extend(runs);
    }
    Ok(cells)
}

pub fn cell_count(o: &CampaignOpts) -> anyhow::Result<u64> {
    let per_workload = (kinds(o)?.len() * o.rates.len() + 1) as u64 * o.seeds;
    Ok(per_workload * o.workloads.len() as u64)
}

/// One line of the terminal table: a workload, kind and rate over all seeds.
pub struct Row {
    pub workload: &'static str,
    pub fault: &'static str,
    pub rate: f64,
    pub runs: usize,
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub injected: u64,
    pub retransmissions: u64,
    pub duplicates_discarded: u64,
    pub checksum_failures: u64,
    pub relative_time: Summary,
}

/// Group cells by workload, kind and rate, in the order they ran.
pub fn rows(cells: &[CellRecord]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut i = 0;
    while i < cells.len() {
        let c = &cells[i];
        let group: Vec<&CellRecord> = cells[i..]
            .iter()
            .take_while(|d| (d.workload, d.fault, d.rate) == (c.workload, c.fault, c.rate))
            .collect();
        let sum = |f: fn(&CellRecord) -> u64| group.iter().map(|c| f(c)).sum();
        let times: Vec<f64> = group.iter().map(|c| c.relative_time).collect();
        rows.push(Row {
            workload: c.workload,
            fault: c.fault,
            rate: c.rate,
            runs: group.len(),
            sent: sum(|c| c.sent),
            delivered: sum(|c| c.delivered),
            lost: sum(|c| c.lost),
            duplicated: sum(|c| c.duplicated),
            corrupted: sum(|c| c.corrupted),
            injected: sum(|c| c.injected),
            retransmissions: sum(|c| c.retransmissions),
            duplicates_discarded: sum(|c| c.duplicates_discarded),
            checksum_failures: sum(|c| c.checksum_failures),
            relative_time: Summary::of(&times).expect("a group has a cell"),
        });
        i += group.len();
    }
    rows
}

/// Write `campaign.csv` (a record per cell) and `campaign-<workload>.png`
/// (median relative time against fault rate, a line per kind) into `dir`.
pub fn write_out(dir: &Path, o: &CampaignOpts, cells: &[CellRecord]) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = vec![plot::write_csv(dir, "campaign.csv", cells)?];
    let rows = rows(cells);
    for &workload in &o.workloads {
        let series: Vec<Series> = kinds(o)?
            .into_iter()
            .map(|kind| Series {
                label: kind.name().to_string(),
                points: rows
                    .iter()
                    .filter(|r| r.workload == workload.name() && r.fault == kind.name())
                    .map(|r| (r.rate, r.relative_time.median))
                    .collect(),
            })
            .collect();
        let title = match workload {
            Workload::Comm => format!("Communication-bound: stream of {} x {} B", o.messages, o.size),
            Workload::Cpu => format!(
                "CPU-bound: {} rounds of 12 sends, {} compute, 12 receives",
                o.rounds,
                tether_fault::format_duration(o.compute)
            ),
        };
        let path = dir.join(format!("campaign-{}.png", workload.name()));
        let chart = Chart {
            title: &title,
            x_label: "fault rate (probability per datagram)",
            y_label: "execution time / fault-free (median of seeds)",
            log_x: true,
            series: &series,
        };
        plot::line_png(&path, &chart, 900, 600)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_kind_has_a_valid_rule() {
        for kind in FaultKind::MESSAGE {
            let r = rule(kind, 0.01, Duration::from_millis(1));
            let plan = FaultPlan::parse_rules(1, &[&r]).unwrap_or_else(|e| panic!("{r}: {e}"));
            assert_eq!(plan.rules[0].kind(), kind);
        }
    }

    /// `check` as `tether campaign ARGS` would run it.
    fn checked(args: &[&str]) -> anyhow::Result<()> {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            o: CampaignOpts,
        }
        let cli = Cli::try_parse_from(std::iter::once("campaign").chain(args.iter().copied()))?;
        let flags: Vec<String> =
            args.iter().filter_map(|a| a.strip_prefix("--")).map(|a| a.replace('-', "_")).collect();
        check(&cli.o, |id| flags.iter().any(|f| f == id))
    }

    #[test]
    fn engine_and_sweep_options_do_not_mix() {
        assert!(checked(&["--engine", "--classes", "kill", "--strikes", "3", "--seed", "7"]).is_ok());
        assert!(checked(&["--rates", "0.1", "--seeds", "2"]).is_ok());
        let err = checked(&["--engine", "--rates", "0.1"]).unwrap_err().to_string();
        assert!(err.contains("--rates is for the message-fault sweep"), "{err}");
        let err = checked(&["--engine", "--first-seed", "3"]).unwrap_err().to_string();
        assert!(err.contains("--first-seed"), "{err}");
        let err = checked(&["--strikes", "5"]).unwrap_err().to_string();
        assert!(err.contains("--strikes is for the engine campaign"), "{err}");
        let err = checked(&["--seed", "5"]).unwrap_err().to_string();
        assert!(err.contains("add --engine"), "{err}");
        assert!(checked(&["--cluster", "--rates", "0.1", "--seeds", "2", "--members", "8"]).is_ok());
        let err = checked(&["--members", "8"]).unwrap_err().to_string();
        assert!(err.contains("--members is for the cluster campaign"), "{err}");
        let err = checked(&["--cluster", "--kinds", "drop"]).unwrap_err().to_string();
        assert!(err.contains("--kinds is not for the cluster campaign"), "{err}");
        let err = checked(&["--cluster", "--engine"]).unwrap_err().to_string();
        assert!(err.contains("one at a time"), "{err}");
    }

    #[test]
    fn inbox_tells_duplicates_corruption_and_order_apart() {
        let mut inbox = Inbox::new(A, 16, 4);
        let msg = |i| {
            let mut b = vec![0u8; 16];
            pattern::fill(&mut b, A, i);
            b
        };
        inbox.take(&msg(0));
        inbox.take(&msg(2));
        inbox.take(&msg(1));
        inbox.take(&msg(1));
        let mut bad = msg(3);
        bad[12] ^= 1;
        inbox.take(&bad);
        inbox.take(&msg(3)[..8]);
        assert_eq!(
            (inbox.unique, inbox.duplicated, inbox.corrupted, inbox.out_of_order),
            (3, 1, 2, 2),
            "0, 2 (skips 1), 1 (behind), 1 again, 3 flipped, 3 truncated"
        );
    }
}
