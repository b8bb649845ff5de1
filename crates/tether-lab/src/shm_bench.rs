//! `tether bench shm`: what the shared-memory ring between an application
//! and its engine costs (docs/ENGINE.md), against the limit of the machine:
//! one cache line bounced between two cores.
//!
//! - One-way latency: two threads play ping-pong with 8-byte records over a
//!   pair of rings; the baseline bounces one atomic counter in the same
//!   shared region (the least any cross-core message can cost).
//! - Throughput: one thread pushes 8-byte records, another pops them; the
//!   baseline moves bare 8-byte words through a ring of slots with the same
//!   two positions and no record header or checksum.
//!
//! Each figure is the median (min-max) of `--runs`, baseline and ring
//! alternating within the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use tether_shm::{Region, Ring};

use crate::args;
use crate::summary::Summary;

#[derive(Debug, Clone, Args)]
pub struct ShmOpts {
    /// Measurements of each figure.
    #[arg(long, default_value_t = 7, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1000, "", ""))]
    pub runs: usize,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 200_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1_000_000_000, "", ""))]
    pub round_trips: u64,
    /// Records per throughput measurement.
    #[arg(long, default_value_t = 20_000_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 10_000_000_000, "", ""))]
    pub records: u64,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct ShmReport {
    /// One-way latency, ns: a cache line bounced, and an 8 B ring record.
    pub baseline_one_way_ns: Summary,
    pub ring_one_way_ns: Summary,
    /// Million 8 B messages a second: bare words, and ring records.
    pub baseline_m_msgs_s: Summary,
    pub ring_m_msgs_s: Summary,
}

/// A region in /dev/shm (or the temporary directory) for one measurement,
/// removed afterwards.
fn region(bytes: usize) -> anyhow::Result<Arc<Region>> {
    let dir =
        if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let path = dir.join(format!("tether-bench-shm-{}", std::process::id()));
    let r = Region::create(&path, bytes)?;
    std::fs::remove_file(&path)?;
    Ok(Arc::new(r))
}

/// Ping-pong over two rings: nanoseconds one way.
fn ring_latency(round_trips: u64) -> anyhow::Result<f64> {
    let cap = 1 << 12;
    let r = region(2 * Ring::footprint(cap))?;
    let (mut ping_tx, mut pong_rx) =
        (Ring::create(r.clone(), 0, cap)?, Ring::create(r.clone(), Ring::footprint(cap), cap)?);
    let (mut ping_rx, mut pong_tx) = (Ring::attach(r.clone(), 0)?, Ring::attach(r, Ring::footprint(cap))?);
    let echo = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut buf = Vec::with_capacity(64);
        for _ in 0..round_trips {
            while !ping_rx.pop(&mut buf)? {
                std::hint::spin_loop();
            }
            pong_tx.push(&buf)?;
        }
        Ok(())
    });
    let mut buf = Vec::with_capacity(64);
    let start = Instant::now();
    for i in 0..round_trips {
        ping_tx.push(&i.to_le_bytes())?;
        while !pong_rx.pop(&mut buf)? {
            std::hint::spin_loop();
        }
        anyhow::ensure!(buf == i.to_le_bytes(), "round trip {i} came back different");
    }
    let ns = start.elapsed().as_nanos() as f64 / round_trips as f64 / 2.0;
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    Ok(ns)
}

/// Ping-pong of one counter in a shared cache line: nanoseconds one way.
fn line_latency(round_trips: u64) -> anyhow::Result<f64> {
    let r = region(4096)?;
    let word = |r: &Region| -> &AtomicU64 {
        // SAFETY: the region is at least a page, page-aligned; an AtomicU64
        // at its start is valid for as long as the region lives.
        unsafe { &*(r.as_ptr() as *const AtomicU64) }
    };
    let r2 = r.clone();
    let echo = std::thread::spawn(move || {
        let w = word(&r2);
        for i in 0..round_trips {
            while w.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            w.store(2 * i + 2, Ordering::Release);
        }
    });
    let w = word(&r);
    let start = Instant::now();
    for i in 0..round_trips {
        w.store(2 * i + 1, Ordering::Release);
        while w.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / round_trips as f64 / 2.0;
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))?;
    Ok(ns)
}

/// 8-byte records through one ring: million messages a second.
fn ring_throughput(records: u64) -> anyhow::Result<f64> {
    let cap = 1 << 16;
    let r = region(Ring::footprint(cap))?;
    let mut tx = Ring::create(r.clone(), 0, cap)?;
    let mut rx = Ring::attach(r, 0)?;
    let start = Instant::now();
    let producer = std::thread::spawn(move || -> anyhow::Result<()> {
        for i in 0..records {
            while tx.push(&i.to_le_bytes()).is_err() {
                std::hint::spin_loop();
            }
        }
        Ok(())
    });
    let mut buf = Vec::with_capacity(64);
    for i in 0..records {
        while !rx.pop(&mut buf)? {
            std::hint::spin_loop();
        }
        anyhow::ensure!(buf == i.to_le_bytes(), "record {i} came out different");
    }
    let m = records as f64 / start.elapsed().as_secs_f64() / 1e6;
    producer.join().map_err(|_| anyhow::anyhow!("producer panicked"))??;
    Ok(m)
}

/// Bare 8-byte words through a ring of slots with the same two positions:
/// million messages a second.
fn word_throughput(records: u64) -> anyhow::Result<f64> {
    const SLOTS: u64 = 1 << 13;
    let r = region(4096 + SLOTS as usize * 8)?;
    let at = |r: &Region, i: usize| -> &AtomicU64 {
        // SAFETY: the region spans 4096 + 8 * SLOTS bytes, page-aligned;
        // the positions sit on separate cache lines at 0 and 64, the slots
        // from byte 4096, each 8-aligned.
        unsafe { &*(r.as_ptr().add(i) as *const AtomicU64) }
    };
    let r2 = r.clone();
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        let (tail, head) = (at(&r2, 0), at(&r2, 64));
        for i in 0..records {
            while i - head.load(Ordering::Acquire) >= SLOTS {
                std::hint::spin_loop();
            }
            at(&r2, 4096 + 8 * (i % SLOTS) as usize).store(i, Ordering::Relaxed);
            tail.store(i + 1, Ordering::Release);
        }
    });
    let (tail, head) = (at(&r, 0), at(&r, 64));
    for i in 0..records {
        while tail.load(Ordering::Acquire) <= i {
            std::hint::spin_loop();
        }
        let v = at(&r, 4096 + 8 * (i % SLOTS) as usize).load(Ordering::Relaxed);
        anyhow::ensure!(v == i, "word {i} came out as {v}");
        head.store(i + 1, Ordering::Release);
    }
    let m = records as f64 / start.elapsed().as_secs_f64() / 1e6;
    producer.join().map_err(|_| anyhow::anyhow!("producer panicked"))?;
    Ok(m)
}

pub fn run(o: &ShmOpts, progress: &dyn Fn(&str)) -> anyhow::Result<ShmReport> {
    let (mut bl, mut rl, mut bt, mut rt) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..o.runs {
        progress(&format!("run {}/{}", run + 1, o.runs));
        bl.push(line_latency(o.round_trips)?);
        rl.push(ring_latency(o.round_trips)?);
        bt.push(word_throughput(o.records)?);
        rt.push(ring_throughput(o.records)?);
    }
    let s = |v: &[f64]| Summary::of(v).expect("at least one run");
    Ok(ShmReport {
        baseline_one_way_ns: s(&bl),
        ring_one_way_ns: s(&rl),
        baseline_m_msgs_s: s(&bt),
        ring_m_msgs_s: s(&rt),
    })
}
