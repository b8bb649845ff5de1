//! `tether bench async`: the async API (`tether::aio`, on tokio) beside
//! the blocking API it wraps, in turns in one invocation: the 8 B round
//! trip and a 1 KiB stream between two endpoints on loopback.
//!
//! Blocking: two threads, each blocked in its endpoint's calls. Async: a
//! tokio runtime with two worker threads, one task per side. Both take the
//! same endpoints' options, so what differs is the waiting: a blocking
//! call busy-polls then sleeps in `ppoll`; a future drives its endpoint
//! one step a poll for the same spin time, yielding between polls, then
//! parks for the endpoint's progress worker (docs/ASYNC.md).
//!
//! The bar (the issue's): the async 8 B round trip within 1.2x of the
//! blocking one, measured in one run.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use serde::Serialize;
use tether::{aio, Endpoint};

use crate::args;
use crate::summary::Summary;

#[derive(Debug, Clone, clap::Args)]
pub struct AsyncOpts {
    /// Round trips timed per run (after 200 to warm up).
    #[arg(long, default_value_t = 5_000, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(10, 10_000_000, "round trips", ""))]
    pub pings: usize,
    /// Messages per stream run.
    #[arg(long, default_value_t = 200_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(100, 100_000_000, "messages", ""))]
    pub count: u64,
    /// Stream message size in bytes.
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 1 << 20, "bytes", ""))]
    pub size: usize,
    /// Runs of each, in turns (medians, min and max are over the runs' medians).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 100, "runs", ""))]
    pub runs: usize,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

const WARMUP: usize = 200;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));

#[derive(Debug, Clone, Serialize)]
struct Report {
    runs: usize,
    /// Median 8 B round trip of each run, microseconds.
    blocking_rtt_us: Summary,
    async_rtt_us: Summary,
    /// Median async over median blocking.
    rtt_ratio: f64,
    /// Stream messages a second, per run.
    size: usize,
    blocking_msgs_per_s: Summary,
    async_msgs_per_s: Summary,
    /// Median async over median blocking.
    stream_ratio: f64,
    bar_rtt_ratio: f64,
    met: bool,
}

fn pair() -> anyhow::Result<(Endpoint, Endpoint)> {
    let any = || "127.0.0.1:0".parse().expect("an address");
    let a = Endpoint::builder(1).bind(any()).build()?;
    let b = Endpoint::builder(2).bind(any()).build()?;
    a.add_peer(2, b.local_addr().expect("bound"))?;
    b.add_peer(1, a.local_addr().expect("bound"))?;
    Ok((a, b))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build()?)
}

/// The blocking API's round trips, microseconds.
fn blocking_rtt(pings: usize) -> anyhow::Result<f64> {
    let (a, b) = pair()?;
    let samples = std::thread::scope(|s| -> anyhow::Result<Vec<f64>> {
        let echo = s.spawn(|| -> anyhow::Result<()> {
            for _ in 0..pings + WARMUP {
                let d = b.recv(WAIT)?;
                b.send(1, &d.message)?;
            }
            Ok(())
        });
        let mut samples = Vec::with_capacity(pings);
        for i in 0..pings + WARMUP {
            let t = StdInstant::now();
            a.send(2, &[0u8; 8])?;
            a.recv(WAIT)?;
            if i >= WARMUP {
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
        Ok(samples)
    })?;
    Ok(median(samples))
}

/// The async API's round trips, microseconds.
fn async_rtt(rt: &tokio::runtime::Runtime, pings: usize) -> anyhow::Result<f64> {
    let (a, b) = pair()?;
    let (a, b) = (Arc::new(aio::Endpoint::from(a)), Arc::new(aio::Endpoint::from(b)));
    let samples = rt.block_on(async {
        // Both sides tasks on the runtime's workers, as the blocking
        // round trip's are threads of their own.
        let echo = tokio::spawn({
            let b = Arc::clone(&b);
            async move {
                for _ in 0..pings + WARMUP {
                    let d = b.recv().await?;
                    b.send(1, &d.message).await?;
                }
                Ok::<_, tether::Error>(())
            }
        });
        let ping = tokio::spawn({
            let a = Arc::clone(&a);
            async move {
                let mut samples = Vec::with_capacity(pings);
                for i in 0..pings + WARMUP {
                    let t = StdInstant::now();
                    a.send(2, &[0u8; 8]).await?;
                    a.recv().await?;
                    if i >= WARMUP {
                        samples.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
                Ok::<_, tether::Error>(samples)
            }
        });
        let samples = ping.await??;
        echo.await??;
        Ok::<_, anyhow::Error>(samples)
    })?;
    Ok(median(samples))
}

/// The blocking API's stream: messages a second, first send to last delivery.
fn blocking_stream(count: u64, size: usize) -> anyhow::Result<f64> {
    let (a, b) = pair()?;
    let msg = vec![7u8; size];
    let start = StdInstant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let rx = s.spawn(|| -> anyhow::Result<()> {
            for _ in 0..count {
                b.recv(WAIT)?;
            }
            Ok(())
        });
        for _ in 0..count {
            a.send_blocking(2, &msg, WAIT)?;
        }
        rx.join().map_err(|_| anyhow::anyhow!("the receiving thread panicked"))??;
        Ok(())
    })?;
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// The async API's stream: messages a second, first send to last delivery.
fn async_stream(rt: &tokio::runtime::Runtime, count: u64, size: usize) -> anyhow::Result<f64> {
    let (a, b) = pair()?;
    let (a, b) = (Arc::new(aio::Endpoint::from(a)), Arc::new(aio::Endpoint::from(b)));
    let secs = rt.block_on(async {
        let start = StdInstant::now();
        // Both sides tasks on the runtime's workers, as the blocking
        // stream's are threads of their own.
        let rx = tokio::spawn({
            let b = Arc::clone(&b);
            async move {
                for _ in 0..count {
                    b.recv().await?;
                }
                Ok::<_, tether::Error>(())
            }
        });
        let tx = tokio::spawn({
            let a = Arc::clone(&a);
            async move {
                let msg = vec![7u8; size];
                let mut last = None;
                for _ in 0..count {
                    last = Some(a.send(2, &msg).await?);
                }
                Ok::<_, tether::Error>(last)
            }
        });
        let last = tx.await??;
        rx.await??;
        let secs = start.elapsed().as_secs_f64();
        if let Some(last) = last {
            last.into_future().await?;
        }
        Ok::<_, anyhow::Error>(secs)
    })?;
    Ok(count as f64 / secs)
}

pub fn run(o: &AsyncOpts) -> anyhow::Result<()> {
    let rt = runtime()?;
    let (mut brtt, mut artt, mut bs, mut asy) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..o.runs {
        // In turns, so the machine's drift falls on both alike.
        brtt.push(blocking_rtt(o.pings)?);
        artt.push(async_rtt(&rt, o.pings)?);
        bs.push(blocking_stream(o.count, o.size)?);
        asy.push(async_stream(&rt, o.count, o.size)?);
        if !o.json {
            eprintln!(
                "run {}: 8 B round trip {:.2} us blocking, {:.2} us async; {} B stream {:.0} msgs/s blocking, {:.0} async",
                run + 1,
                brtt[run],
                artt[run],
                o.size,
                bs[run],
                asy[run]
            );
        }
    }
    let summary = |v: &[f64]| Summary::of(v).expect("runs");
    let (blocking_rtt_us, async_rtt_us) = (summary(&brtt), summary(&artt));
    let (blocking_msgs_per_s, async_msgs_per_s) = (summary(&bs), summary(&asy));
    let rtt_ratio = async_rtt_us.median / blocking_rtt_us.median;
    let report = Report {
        runs: o.runs,
        blocking_rtt_us,
        async_rtt_us,
        rtt_ratio,
        size: o.size,
        blocking_msgs_per_s,
        async_msgs_per_s,
        stream_ratio: async_msgs_per_s.median / blocking_msgs_per_s.median,
        bar_rtt_ratio: 1.2,
        met: rtt_ratio <= 1.2,
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "tether bench async: the async API (tokio, 2 workers) beside the blocking one, {} runs in turns",
        o.runs
    );
    let row = |what: &str, s: &Summary, unit: &str| {
        println!("  {what}: median {:.2}{unit}, min {:.2}, max {:.2}", s.median, s.min, s.max)
    };
    row("8 B round trip, blocking", &report.blocking_rtt_us, " us");
    row("8 B round trip, async   ", &report.async_rtt_us, " us");
    println!(
        "  async / blocking: {rtt_ratio:.3}x (bar: <= 1.2x); bar {}",
        if report.met { "met" } else { "not met" }
    );
    row(&format!("{} B stream, blocking", o.size), &report.blocking_msgs_per_s, " msgs/s");
    row(&format!("{} B stream, async   ", o.size), &report.async_msgs_per_s, " msgs/s");
    println!("  async / blocking: {:.3}x", report.stream_ratio);
    Ok(())
}
