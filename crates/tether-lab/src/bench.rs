//! `tether bench`: pingpong and stream over a size sweep, each a median of
//! several runs: tether against the limit of the machine (`crate::limit`:
//! spinning non-blocking sockets, maximal datagrams), with the ratio from
//! the same invocation; and the bare transport layer (`tether-io`, no
//! tether header, no reliability) beside them, to tell its cost from the
//! protocol's.

use serde::Serialize;

use crate::net::NetOpts;
use crate::summary::Summary;
use crate::{limit, pingpong, stream};

pub const SIZES: [usize; 8] = [8, 64, 1024, 4096, 16384, 65536, 262144, 1048576];

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub size: usize,
    /// Median round trip per run at the limit, microseconds.
    pub pingpong_limit_us: Summary,
    /// tether over the limit (lower is better).
    pub pingpong_limit_ratio: f64,
    /// Goodput per run at the limit, MB/s, and the datagrams it delivered
    /// (median fraction: UDP drops what the receiver has no room for).
    pub stream_limit_mb_s: Summary,
    pub stream_limit_delivered_fraction: f64,
    /// tether over the limit (higher is better).
    pub stream_limit_ratio: f64,
    /// Median round trip per run, microseconds: distribution over runs.
    /// `raw`: the bare transport layer (`tether-io`).
    pub pingpong_raw_us: Summary,
    pub pingpong_tether_us: Summary,
    pub pingpong_ratio: f64,
    /// Goodput per run, MB/s.
    pub stream_raw_mb_s: Summary,
    pub stream_tether_mb_s: Summary,
    pub stream_ratio: f64,
    pub stream_raw_msgs_s: f64,
    pub stream_tether_msgs_s: f64,
    /// Fraction of raw datagrams lost in the raw stream runs (median).
    pub stream_raw_delivered_fraction: f64,
}

/// Run `f` `runs` times and summarise the figure it returns.
pub fn repeat(runs: usize, mut f: impl FnMut() -> anyhow::Result<f64>) -> anyhow::Result<Summary> {
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        v.push(f()?);
    }
    Ok(Summary::of(&v).expect("at least one run"))
}

pub fn row(o: &NetOpts, size: usize, progress: &dyn Fn(&str)) -> anyhow::Result<BenchRow> {
    let o = NetOpts { size, ..o.clone() };
    let pp_count = o.count.unwrap_or(pingpong::default_count(size) / 2);
    let st_count = o.count.unwrap_or(stream::default_count(size) / 4);
    progress(&format!("{size} B pingpong"));
    let pingpong_limit_us = repeat(o.runs, || Ok(limit::round_trips(size, pp_count)?.median))?;
    let pingpong_raw_us = repeat(o.runs, || Ok(pingpong::raw_loopback(&o, pp_count)?.rtt_us.median))?;
    let pingpong_tether_us = repeat(o.runs, || Ok(pingpong::reliable_loopback(&o, pp_count)?.rtt_us.median))?;
    progress(&format!("{size} B stream"));
    let mut limit_frac = Vec::new();
    let stream_limit_mb_s = repeat(o.runs, || {
        let r = limit::stream(size, st_count)?;
        limit_frac.push(r.delivered_fraction);
        Ok(r.goodput_mb_s)
    })?;
    let mut raw_msgs = Vec::new();
    let mut raw_frac = Vec::new();
    let stream_raw_mb_s = repeat(o.runs, || {
        let r = stream::raw_loopback(&o, st_count)?;
        raw_msgs.push(r.msgs_per_s);
        raw_frac.push(r.delivered as f64 / r.messages as f64);
        Ok(r.goodput_mb_s)
    })?;
    let mut tether_msgs = Vec::new();
    let stream_tether_mb_s = repeat(o.runs, || {
        let r = stream::reliable_loopback(&o, st_count)?;
        anyhow::ensure!(
            r.corrupted == 0 && r.out_of_order == 0 && r.delivered == r.messages,
            "verification failed"
        );
        tether_msgs.push(r.msgs_per_s);
        Ok(r.goodput_mb_s)
    })?;
    let med = |v: &[f64]| Summary::of(v).map_or(0.0, |s| s.median);
    Ok(BenchRow {
        size,
        pingpong_limit_ratio: pingpong_tether_us.median / pingpong_limit_us.median,
        stream_limit_ratio: stream_tether_mb_s.median / stream_limit_mb_s.median,
        stream_limit_delivered_fraction: med(&limit_frac),
        pingpong_limit_us,
        stream_limit_mb_s,
        pingpong_ratio: pingpong_tether_us.median / pingpong_raw_us.median,
        stream_ratio: stream_tether_mb_s.median / stream_raw_mb_s.median,
        stream_raw_msgs_s: med(&raw_msgs),
        stream_tether_msgs_s: med(&tether_msgs),
        stream_raw_delivered_fraction: med(&raw_frac),
        pingpong_raw_us,
        pingpong_tether_us,
        stream_raw_mb_s,
        stream_tether_mb_s,
    })
}
