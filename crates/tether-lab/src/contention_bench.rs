//! `tether bench contention`: the small-message round trip while every
//! core also runs a busy thread, or (`--external`) beside other processes
//! of the kinds a cluster node runs (`crate::external_load`: a parallel
//! build, processes that block and wake). The bars: under contention the
//! 8 B round trip's median stays within 3x the limit's under the same
//! load, and its 99th percentile within 10x.
//!
//! The limit (`crate::limit`: two spinning non-blocking sockets) and
//! tether are measured in alternating runs under the same load, so both
//! meet the same scheduler; each run's median (and 99th percentile) round
//! trip is the sample, and the ratios are of their medians.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::args;
use crate::external_load::{ExternalLoad, Kind};
use crate::net::NetOpts;
use crate::summary::Summary;
use crate::{limit, pingpong};

#[derive(Debug, Clone, clap::Args)]
pub struct ContentionOpts {
    /// Message size in bytes.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = args::size(0))]
    pub size: usize,
    /// Runs of each (the limit's and tether's, alternating).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 1000, "runs", ""))]
    pub runs: usize,
    /// Round trips per run [default: half of `tether pingpong`'s, by --size].
    #[arg(long, allow_negative_numbers = true, value_parser = args::int_in::<u64>(1, 1 << 30, "round trips", ""))]
    pub count: Option<u64>,
    /// Busy threads beside the benchmark [default: one per core, none
    /// with --external].
    #[arg(long, allow_negative_numbers = true, value_parser = args::int_in::<usize>(0, 1024, "threads", ""))]
    pub busy: Option<usize>,
    /// Load from other processes instead, comma-separated: build (a
    /// parallel build: `cc -O2` loops), wake (processes that sleep half a
    /// millisecond and wake), pipe (`yes | cat`), spin (busy processes)
    /// [default: none; `--external` alone: build,wake,pipe].
    #[arg(long, value_delimiter = ',', num_args = 0.., default_missing_value = "build,wake,pipe")]
    pub external: Option<Vec<Kind>>,
    /// Processes (or compiler loops) of each --external kind [default: one per core].
    #[arg(long, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 64, "processes", ""))]
    pub per_kind: Option<usize>,
    /// Print one JSON document instead of a line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct ContentionBench {
    pub size: usize,
    pub count: u64,
    pub busy_threads: usize,
    /// The --external kinds, and how many of each.
    pub external: Vec<Kind>,
    pub per_kind: usize,
    /// Each run's median round trip, microseconds.
    pub limit_us: Summary,
    pub tether_us: Summary,
    /// Each run's 99th percentile round trip, microseconds.
    pub limit_p99_us: Summary,
    pub tether_p99_us: Summary,
    /// tether's median over the limit's (lower is better).
    pub ratio: f64,
    /// tether's 99th percentile over the limit's (medians of the runs').
    pub p99_ratio: f64,
}

/// Busy threads that spin until dropped.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `n` threads spinning.
    pub(crate) fn start(n: usize) -> Self {
        Load::with(n, |_| {
            |stop: &AtomicBool| {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
        })
    }

    /// `n` threads, thread `i` running `body(i)` until told to stop (it
    /// must look at the flag now and then).
    pub(crate) fn with<F>(n: usize, body: impl Fn(usize) -> F) -> Self
    where
        F: FnOnce(&AtomicBool) + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let (stop, run) = (stop.clone(), body(i));
                std::thread::spawn(move || run(&stop))
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run the alternating measurements under the load, `net` otherwise as
/// `tether pingpong` has it by default.
pub fn run(o: &ContentionOpts, mut net: NetOpts) -> anyhow::Result<()> {
    net.size = o.size;
    let count = o.count.unwrap_or(pingpong::default_count(o.size) / 2);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let external = o.external.clone().unwrap_or_default();
    let busy = o.busy.unwrap_or(if external.is_empty() { cores } else { 0 });
    let per_kind = o.per_kind.unwrap_or(cores);
    let (mut lim, mut lim99, mut teth, mut p99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    {
        let _load = Load::start(busy);
        let _external = ExternalLoad::start(&external, per_kind)?;
        // The load settles first (the compilers started, the caches taken).
        if !external.is_empty() {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        for _ in 0..o.runs {
            let l = limit::round_trips(o.size, count)?;
            lim.push(l.median);
            lim99.push(l.p99);
            let r = pingpong::reliable_loopback(&net, count)?;
            anyhow::ensure!(
                r.corrupted == 0,
                "verification failed: {} round trips came back changed",
                r.corrupted
            );
            teth.push(r.rtt_us.median);
            p99.push(r.rtt_us.p99);
        }
    }
    let of = |v: &[f64]| Summary::of(v).expect("at least one run");
    let (limit_us, tether_us) = (of(&lim), of(&teth));
    let (limit_p99_us, tether_p99_us) = (of(&lim99), of(&p99));
    let doc = ContentionBench {
        size: o.size,
        count,
        busy_threads: busy,
        external,
        per_kind,
        ratio: tether_us.median / limit_us.median,
        p99_ratio: tether_p99_us.median / limit_p99_us.median,
        limit_us,
        tether_us,
        limit_p99_us,
        tether_p99_us,
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let s = |x: &Summary| format!("{:.1} ({:.1}-{:.1})", x.median, x.min, x.max);
    let mut load = Vec::new();
    if doc.busy_threads > 0 {
        load.push(format!("{} busy threads", doc.busy_threads));
    }
    for k in &doc.external {
        let what = match k {
            Kind::Build => "compiler loops",
            Kind::Wake => "sleep-and-wake loops",
            Kind::Pipe => "yes | cat pairs",
            Kind::Spin => "busy processes",
        };
        load.push(format!("{} {what}", doc.per_kind));
    }
    let load = if load.is_empty() { "nothing".to_string() } else { load.join(", ") };
    println!(
        "{} B round trip beside {load}, {} runs of {} each, median (min-max) of the runs' medians and 99th percentiles:",
        doc.size, o.runs, doc.count
    );
    println!(
        "limit {} us (p99 {}), tether {} us (p99 {}): tether / limit {:.3} (bar: <= 3), p99 {:.3} (bar: <= 10)",
        s(&doc.limit_us),
        s(&doc.limit_p99_us),
        s(&doc.tether_us),
        s(&doc.tether_p99_us),
        doc.ratio,
        doc.p99_ratio
    );
    Ok(())
}
