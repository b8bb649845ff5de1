//! `tether bench detect`: which failure detector to trust (docs/CLUSTER.md,
//! "Failure detection"), argued from heartbeats really sent.
//!
//! Two embedded endpoints on loopback exchange heartbeats as unreliable
//! messages, one every `--period`, for `--secs`, first on an idle machine,
//! then beside a busy thread per core (the bar: under that load, false
//! alarms at least 10x fewer than Li et al.'s [CI] two-miss rule at the
//! same median detection time). The receiver records each heartbeat's
//! send and arrival times, and an observer thread records how late its own
//! turns come (what Lifeguard's local health sees).
//!
//! Each detector is then replayed over the same trace, as Hayashibara et
//! al. and Chen, Toueg and Aguilera evaluate detectors:
//!
//! * a **false alarm** is a gap between two arrivals in which the detector
//!   would have suspected the sender (it never crashed);
//! * the **detection time** of a crash just after heartbeat `i` was sent
//!   is when the detector, having seen `i` arrive, suspects, less `i`'s
//!   send time; every heartbeat gives a sample.
//!
//! A detector trades one against the other, so they are compared at the
//! same median detection time: the two-miss rule's grace is set (by
//! bisection on the trace) so that its median detection time equals phi's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use serde::Serialize;
use tether::{Endpoint, Options};
use tether_members::{Detector, DetectorKind, Lateness};
use tether_proto::Instant;

use crate::args;
use crate::contention_bench::Load;
use crate::summary::Summary;

#[derive(Debug, Clone, clap::Args)]
pub struct DetectOpts {
    /// Heartbeat period in milliseconds.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 60_000, "milliseconds", ""))]
    pub period_ms: u64,
    /// Seconds of heartbeats under each load.
    #[arg(long, default_value_t = 30, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 86_400, "seconds", ""))]
    pub secs: u64,
    /// Threads per load [default: one per core; two per core churning].
    #[arg(long, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1024, "threads", ""))]
    pub busy: Option<usize>,
    /// Loads to run under, comma-separated: idle; busy (a spinning thread
    /// per core, the bar's load); churn (threads that spin a few
    /// milliseconds and sleep one, waking and blocking as a parallel
    /// build's do).
    #[arg(long, value_delimiter = ',', default_value = "idle,busy,churn")]
    pub loads: Vec<LoadKind>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadKind {
    Idle,
    Busy,
    Churn,
}

/// Threads that spin for 0.1-3 ms and sleep for up to 1 ms, until dropped.
fn churn(n: usize) -> Load {
    Load::with(n, |i| {
        move |stop: &AtomicBool| {
            // A small xorshift: the pattern, not its quality, matters.
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            while !stop.load(Ordering::Relaxed) {
                let until = StdInstant::now() + Duration::from_micros(100 + next() % 2900);
                while StdInstant::now() < until {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_micros(next() % 1000));
            }
        }
    })
}

/// One heartbeat: when it was sent and when it arrived (nanoseconds on
/// the monotonic clock, from the run's start).
#[derive(Debug, Clone, Copy)]
struct Beat {
    sent: u64,
    arrived: u64,
}

/// A run's trace.
#[derive(Debug, Default)]
struct Trace {
    beats: Vec<Beat>,
    /// The observer's turns: (when it ran, its lateness then).
    turns: Vec<(u64, Duration)>,
    sent: u64,
}

impl Trace {
    /// The observer's lateness at `t`: as of its last turn by then.
    fn lateness_at(&self, t: u64) -> Duration {
        match self.turns.partition_point(|&(at, _)| at <= t) {
            0 => Duration::ZERO,
            i => self.turns[i - 1].1,
        }
    }
}

/// How one detector did over one trace.
#[derive(Debug, Clone, Serialize)]
pub struct Judged {
    pub detector: String,
    /// Its setting: the two-miss rule's grace, or phi's threshold.
    pub setting: String,
    /// Forgives the observer's own lateness (local health).
    pub local_health: bool,
    pub false_alarms: u64,
    /// Detection time of a crash after each heartbeat, milliseconds.
    pub detection_ms: Summary,
}

#[derive(Debug, Serialize)]
pub struct LoadRun {
    /// "idle" or "busy N".
    pub load: String,
    pub heartbeats_sent: u64,
    pub heartbeats_arrived: u64,
    /// Arrival gaps, milliseconds.
    pub gap_ms: Summary,
    /// The observer's turn lateness, milliseconds.
    pub lateness_ms: Summary,
    pub detectors: Vec<Judged>,
    /// Fixed patience against phi at the same median detection time: the
    /// two-miss rule's, and phi's at threshold 8.
    pub matched: Vec<Matched>,
}

#[derive(Debug, Serialize)]
pub struct DetectBench {
    pub period_ms: u64,
    pub secs: u64,
    pub runs: Vec<LoadRun>,
}

/// Heartbeats for `secs` between two endpoints on loopback.
fn record(period: Duration, secs: u64) -> anyhow::Result<Trace> {
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let a = Endpoint::udp(1, any, &[], Options::default())?;
    let b = Endpoint::udp(2, any, &[], Options::default())?;
    let addr = |e: &Endpoint| e.local_addr().ok_or_else(|| anyhow::anyhow!("an endpoint without an address"));
    a.add_peer(2, addr(&b)?)?;
    b.add_peer(1, addr(&a)?)?;
    let start = StdInstant::now();
    let ns = move || start.elapsed().as_nanos() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let trace = Arc::new(Mutex::new(Trace::default()));
    let end = start + Duration::from_secs(secs);
    std::thread::scope(|s| -> anyhow::Result<()> {
        // The observer's turns, four a period, as a member's would run.
        let (t, stop_t) = (trace.clone(), stop.clone());
        s.spawn(move || {
            let (mut lateness, every) = (Lateness::default(), period / 4);
            let mut due = StdInstant::now() + every;
            while !stop_t.load(Ordering::Relaxed) {
                std::thread::sleep(due.saturating_duration_since(StdInstant::now()));
                let now = StdInstant::now();
                let at = |i: StdInstant| Instant::from_nanos((i - start).as_nanos() as u64);
                lateness.turn(at(due), at(now));
                t.lock().unwrap().turns.push((ns(), lateness.get()));
                due += every;
                if due < now {
                    due = now + every;
                }
            }
        });
        let (t, stop_r, b) = (trace.clone(), stop.clone(), &b);
        s.spawn(move || {
            while !stop_r.load(Ordering::Relaxed) {
                if let Ok(u) = b.recv_unreliable(Some(Duration::from_millis(50))) {
                    let arrived = ns();
                    if let Some(sent) = u.message.get(..8) {
                        let sent = u64::from_le_bytes(sent.try_into().expect("eight bytes"));
                        t.lock().unwrap().beats.push(Beat { sent, arrived });
                    }
                }
            }
        });
        let mut due = StdInstant::now();
        let mut sent = 0;
        while due < end {
            std::thread::sleep(due.saturating_duration_since(StdInstant::now()));
            a.send_unreliable(2, &ns().to_le_bytes())?;
            sent += 1;
            due += period;
        }
        std::thread::sleep(period * 4);
        stop.store(true, Ordering::Relaxed);
        trace.lock().unwrap().sent = sent;
        Ok(())
    })?;
    let mut t = Arc::try_unwrap(trace).expect("the threads are done").into_inner().unwrap();
    t.beats.sort_by_key(|b| b.arrived);
    Ok(t)
}

/// Replay `kind` over `trace`.
fn judge(trace: &Trace, kind: DetectorKind, period: Duration, local_health: bool) -> (u64, Vec<f64>) {
    let Some(first) = trace.beats.first() else { return (0, Vec::new()) };
    let mut d = Detector::new(kind, period, Instant::from_nanos(first.arrived));
    let forgive = |t: u64| if local_health { trace.lateness_at(t) } else { Duration::ZERO };
    let (mut alarms, mut detection) = (0, Vec::with_capacity(trace.beats.len()));
    for b in &trace.beats {
        let deadline = d.deadline();
        let suspected_at = deadline + forgive(deadline.as_nanos());
        if b.arrived > suspected_at.as_nanos() {
            alarms += 1;
        }
        d.heartbeat(Instant::from_nanos(b.arrived));
        let deadline = d.deadline();
        let suspect = (deadline + forgive(deadline.as_nanos())).as_nanos();
        detection.push(suspect.saturating_sub(b.sent) as f64 / 1e6);
    }
    (alarms, detection)
}

fn judged(trace: &Trace, kind: DetectorKind, period: Duration, local_health: bool) -> Judged {
    let (false_alarms, detection) = judge(trace, kind, period, local_health);
    let setting = match kind {
        DetectorKind::Fixed { patience } if kind == DetectorKind::two_miss(period) => {
            format!("two-miss: {:.2} ms", patience.as_secs_f64() * 1e3)
        }
        DetectorKind::Fixed { patience } => format!("patience {:.2} ms", patience.as_secs_f64() * 1e3),
        DetectorKind::Phi { threshold, .. } => format!("threshold {threshold:.2}"),
    };
    Judged {
        detector: kind.name().to_string(),
        setting,
        local_health,
        false_alarms,
        detection_ms: Summary::of(&detection).unwrap_or_default(),
    }
}

/// The detector `make(x)` whose median detection time over `trace` is
/// `target_ms`, `x` in `[lo, hi]` (bisection: the median grows with `x`).
fn matching(
    trace: &Trace,
    period: Duration,
    target_ms: f64,
    (mut lo, mut hi): (f64, f64),
    make: impl Fn(f64) -> DetectorKind,
) -> DetectorKind {
    for _ in 0..50 {
        let mid = (lo + hi) / 2.0;
        let (_, det) = judge(trace, make(mid), period, true);
        if Summary::of(&det).map_or(0.0, |s| s.median) < target_ms {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    make(hi)
}

/// Two detectors at the same median detection time, both forgiving the
/// observer's lateness.
#[derive(Debug, Serialize)]
pub struct Matched {
    /// Whose setting fixed the detection time.
    pub at: String,
    pub detection_median_ms: f64,
    pub fixed: Judged,
    pub phi: Judged,
    /// The fixed patience's false alarms over phi's (`None`: neither had any).
    pub fixed_over_phi: Option<f64>,
}

fn matched(at: &str, fixed: Judged, phi: Judged) -> Matched {
    let ratio = match (fixed.false_alarms, phi.false_alarms) {
        (0, 0) => None,
        (f, p) => Some(f as f64 / p.max(1) as f64),
    };
    Matched {
        at: at.to_string(),
        detection_median_ms: fixed.detection_ms.median,
        fixed,
        phi,
        fixed_over_phi: ratio,
    }
}

fn analyse(load: String, trace: &Trace, period: Duration) -> LoadRun {
    let mut detectors = Vec::new();
    for local_health in [false, true] {
        detectors.push(judged(trace, DetectorKind::two_miss(period), period, local_health));
        for threshold in [4.0, 8.0, 12.0] {
            let kind = DetectorKind::Phi { threshold, min_deviation: period / 10 };
            detectors.push(judged(trace, kind, period, local_health));
        }
    }
    let p = period.as_secs_f64();
    let fixed = |x: f64| DetectorKind::Fixed { patience: Duration::from_secs_f64(x * p) };
    let phi = |threshold: f64| DetectorKind::Phi { threshold, min_deviation: period / 10 };
    // At the two-miss rule's median: phi's threshold set to match.
    let two_miss = judged(trace, DetectorKind::two_miss(period), period, true);
    let phi_there = matching(trace, period, two_miss.detection_ms.median, (0.1, 300.0), phi);
    let at_two_miss = matched("two-miss", two_miss, judged(trace, phi_there, period, true));
    // At phi's median (threshold 8): the fixed patience set to match.
    let phi8 = judged(trace, DetectorKind::phi(period), period, true);
    let fixed_there = matching(trace, period, phi8.detection_ms.median, (0.0, 100.0), fixed);
    let at_phi = matched("phi 8", judged(trace, fixed_there, period, true), phi8);
    let gaps: Vec<f64> = trace.beats.windows(2).map(|w| (w[1].arrived - w[0].arrived) as f64 / 1e6).collect();
    let lateness: Vec<f64> = trace.turns.iter().map(|t| t.1.as_secs_f64() * 1e3).collect();
    LoadRun {
        load,
        heartbeats_sent: trace.sent,
        heartbeats_arrived: trace.beats.len() as u64,
        gap_ms: Summary::of(&gaps).unwrap_or_default(),
        lateness_ms: Summary::of(&lateness).unwrap_or_default(),
        detectors,
        matched: vec![at_two_miss, at_phi],
    }
}

pub fn run(o: &DetectOpts) -> anyhow::Result<()> {
    let period = Duration::from_millis(o.period_ms);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut runs = Vec::new();
    for &kind in &o.loads {
        let (name, trace) = match kind {
            LoadKind::Idle => ("idle".to_string(), record(period, o.secs)?),
            LoadKind::Busy => {
                let n = o.busy.unwrap_or(cores);
                let _load = Load::start(n);
                (format!("busy {n}"), record(period, o.secs)?)
            }
            LoadKind::Churn => {
                let n = o.busy.unwrap_or(2 * cores);
                let _load = churn(n);
                (format!("churn {n}"), record(period, o.secs)?)
            }
        };
        runs.push(analyse(name, &trace, period));
    }
    let doc = DetectBench { period_ms: o.period_ms, secs: o.secs, runs };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    for r in &doc.runs {
        println!(
            "{}: {} of {} heartbeats arrived, gap {:.2} ms median ({:.2}-{:.2}), observer lateness p99 {:.2} ms max {:.2}",
            r.load,
            r.heartbeats_arrived,
            r.heartbeats_sent,
            r.gap_ms.median,
            r.gap_ms.min,
            r.gap_ms.max,
            r.lateness_ms.p99,
            r.lateness_ms.max
        );
        println!(
            "  {:<9} {:<30} {:>6} {:>12} {:>14} {:>10}",
            "detector", "setting", "local", "false alarms", "detect median", "max"
        );
        for j in &r.detectors {
            println!(
                "  {:<9} {:<30} {:>6} {:>12} {:>11.2} ms {:>7.2} ms",
                j.detector,
                j.setting,
                if j.local_health { "yes" } else { "no" },
                j.false_alarms,
                j.detection_ms.median,
                j.detection_ms.max
            );
        }
        for m in &r.matched {
            println!(
                "  at {}'s median detection time, {:.2} ms: fixed ({}) {} false alarms, phi ({}) {}: fixed / phi {}",
                m.at,
                m.detection_median_ms,
                m.fixed.setting,
                m.fixed.false_alarms,
                m.phi.setting,
                m.phi.false_alarms,
                m.fixed_over_phi.map_or("n/a (none)".to_string(), |r| format!("{r:.1}"))
            );
        }
    }
    Ok(())
}
