//! `tether bench loss`: a stream's goodput under random loss against the
//! same stream without it (no retransmission without a loss: the bar
//! is 1% loss goodput >= 0.9x loss-free), in alternating runs.
//!
//! This 2-core machine's speed drifts by 2x within minutes (two runs of the
//! same 1 KiB stream gave 1,094 and 2,405 MB/s back to back), so a lossy
//! run set against a loss-free one from another minute says more about
//! the machine than about loss recovery. Each pair here is a loss-free run
//! and a lossy one back to back (in turn first); the ratio is taken within
//! each pair, and the median of the pairs' ratios is the figure.

use serde::Serialize;

use crate::args;
use crate::net::{Congestion, NetOpts};
use crate::stream::{self, StreamRun};
use crate::summary::Summary;

#[derive(Debug, Clone, clap::Args)]
pub struct LossOpts {
    /// Fraction of datagrams dropped at random on receive in the lossy runs.
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true, value_parser = args::probability)]
    pub rate: f64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true, value_parser = args::size(0))]
    pub size: usize,
    /// Pairs of runs (a loss-free run and a lossy one, in turn first).
    #[arg(long, default_value_t = 7, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 1000, "pairs", ""))]
    pub runs: usize,
    /// Messages per run [default: by --size, as `tether stream`].
    #[arg(long, allow_negative_numbers = true, value_parser = args::int_in::<u64>(1, 1 << 40, "messages", ""))]
    pub count: Option<u64>,
    /// Congestion control of both streams.
    #[arg(long, value_enum, default_value_t = Congestion::Delay)]
    pub congestion: Congestion,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One pair of runs.
#[derive(Debug, Serialize)]
pub struct Pair {
    pub loss_free_mb_s: f64,
    pub lossy_mb_s: f64,
    pub ratio: f64,
    pub lossy_retransmits: u64,
    pub lossy_dropped: u64,
    pub loss_free_retransmits: u64,
}

#[derive(Debug, Serialize)]
pub struct LossBench {
    pub size: usize,
    pub count: u64,
    pub rate: f64,
    pub pairs: Vec<Pair>,
    /// The pairs' ratios, lossy over loss-free.
    pub ratio: Summary,
}

/// Run the pairs over loopback, `net` otherwise as `tether stream` has it
/// by default.
pub fn run(o: &LossOpts, mut net: NetOpts) -> anyhow::Result<()> {
    net.size = o.size;
    net.congestion = o.congestion;
    let count = o.count.unwrap_or(stream::default_count(o.size));
    let mut pairs = Vec::new();
    let checked = |r: StreamRun, what: &str| -> anyhow::Result<StreamRun> {
        anyhow::ensure!(
            r.delivered == r.messages && r.corrupted == 0 && r.out_of_order == 0,
            "{what} run: {} of {} delivered, {} corrupted, {} out of order",
            r.delivered,
            r.messages,
            r.corrupted,
            r.out_of_order
        );
        Ok(r)
    };
    let mut one = |loss: f64, what: &str| {
        net.loss = loss;
        checked(stream::reliable_loopback(&net, count)?, what)
    };
    // A process's first run is slower (its allocator and pages are cold:
    // `tether stream --size 1024` gave 1,527-1,647 MB/s first, 2,288-2,547
    // after): one run, not counted, warms them for the pairs.
    one(0.0, "warm-up")?;
    for i in 0..o.runs {
        // Which goes first alternates too: a pair's second run is not
        // always the lossy one (nor the one after a warm machine).
        let (free, lossy) = if i % 2 == 0 {
            let free = one(0.0, "loss-free")?;
            (free, one(o.rate, "lossy")?)
        } else {
            let lossy = one(o.rate, "lossy")?;
            (one(0.0, "loss-free")?, lossy)
        };
        pairs.push(Pair {
            loss_free_mb_s: free.goodput_mb_s,
            lossy_mb_s: lossy.goodput_mb_s,
            ratio: lossy.goodput_mb_s / free.goodput_mb_s,
            lossy_retransmits: lossy.retransmits,
            lossy_dropped: lossy.injected.dropped,
            loss_free_retransmits: free.retransmits,
        });
    }
    let ratios: Vec<f64> = pairs.iter().map(|p| p.ratio).collect();
    let ratio = Summary::of(&ratios).expect("at least one pair");
    let doc = LossBench { size: o.size, count, rate: o.rate, pairs, ratio };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "tether bench loss: {} B messages, {} per run, {} pairs of runs (loss-free and drop:p={} on receive, in turn first)",
        doc.size, doc.count, o.runs, doc.rate
    );
    println!(
        "pair  loss-free MB/s  lossy MB/s   ratio  retransmits (lossy)  dropped  retransmits (loss-free)"
    );
    for (i, p) in doc.pairs.iter().enumerate() {
        println!(
            "{:>4}  {:>14.1}  {:>10.1}  {:>6.3}  {:>19}  {:>7}  {:>23}",
            i + 1,
            p.loss_free_mb_s,
            p.lossy_mb_s,
            p.ratio,
            p.lossy_retransmits,
            p.lossy_dropped,
            p.loss_free_retransmits
        );
    }
    println!(
        "lossy / loss-free goodput: median {:.3} (min {:.3}, max {:.3}) over {} pairs",
        doc.ratio.median, doc.ratio.min, doc.ratio.max, doc.ratio.n
    );
    Ok(())
}
