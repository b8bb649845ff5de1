//! The T(L) model of Trahay et al. [NMAD] section 5.2 (docs/REFERENCES.md): what checksums should cost an
//! eager message of length L, predicted from measured copy, checksum and
//! network figures, next to what `tether stream` measures with and without
//! a checksum in the same run.
//!
//! The paper's model, two copies (send and receive) and two separate
//! checksum passes:
//!
//! ```text
//! T(L) = 2L/B_copy + 2L/B_csum + lambda_net + L/B_net
//! ```
//!
//! against `2L/B_copy + lambda_net + L/B_net` without checksums. The
//! second shape is tether's: both copies fused with the checksum
//! (`2L/B_fused` instead of the copies and the passes): the sender
//! checksums each payload as it copies it into the datagram, the receiver
//! as it copies it to where the message lives (`Unverified::
//! verify_landing`). tether's third copy, into the sender-based log, is
//! made with or without a checksum and so adds nothing to the overhead.

use serde::Serialize;

use crate::bandwidth::BandwidthReport;
use crate::bench::repeat;
use crate::net::NetOpts;
use crate::summary::Summary;
use crate::{pingpong, stream};

/// The measured figures the model takes, in bytes per second and seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Inputs {
    /// Memory copy, in cache (32 KiB blocks).
    pub b_copy: f64,
    /// The checksum alone, over data in cache.
    pub b_csum: f64,
    /// Copy fused with the checksum, in cache.
    pub b_fused: f64,
    /// One-way latency of the raw transport: half the small-message round trip.
    pub lambda_net: f64,
    /// Bandwidth of the raw transport for large messages.
    pub b_net: f64,
}

impl Inputs {
    /// Copy and checksum figures from the bandwidth table (in-cache
    /// medians: an eager message is copied while it is hot), network
    /// figures from [`measure_network`].
    pub fn from(
        report: &BandwidthReport,
        kind: tether_wire::ChecksumKind,
        (lambda_net, b_net): (f64, f64),
    ) -> Option<Self> {
        let a = report.algorithm(kind)?;
        Some(Inputs {
            b_copy: report.memcpy_gb_s.in_cache.median * 1e9,
            b_csum: a.alone_gb_s.in_cache.median * 1e9,
            b_fused: a.fused_gb_s.in_cache.median * 1e9,
            lambda_net,
            b_net,
        })
    }
}

/// The model's inputs and one row per message size.
#[derive(Debug, Clone, Serialize)]
pub struct ModelReport {
    pub checksum: &'static str,
    pub inputs: Inputs,
    pub rows: Vec<Row>,
}

/// Predicted and measured overhead of checksums at one message size.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub size: usize,
    /// T(L) without checksums, microseconds.
    pub t_plain_us: f64,
    /// Time per message `tether stream` took without a checksum (median
    /// run), microseconds: the model's T(L) leaves out tether's own
    /// per-datagram work, so this is longer.
    pub t_measured_us: f64,
    /// The paper's model: separate checksum passes after both copies.
    pub predicted_paper: f64,
    /// Both copies fused with the checksum: tether's path.
    pub predicted_fused: f64,
    /// `tether stream` goodput without and with the checksum, MB/s.
    pub stream_none_mb_s: Summary,
    pub stream_checksum_mb_s: Summary,
    /// Measured overhead: time per message with / without, minus 1.
    pub measured: f64,
}

impl Row {
    /// Half the relative spread (max - min over median) of the stream runs
    /// without the checksum: a measured overhead smaller than this cannot
    /// be told from noise on this machine.
    pub fn noise(&self) -> f64 {
        let s = &self.stream_none_mb_s;
        (s.max - s.min) / s.median / 2.0
    }
}

/// Model times for one length, seconds: (plain, paper, fused).
pub fn predict(i: &Inputs, len: usize) -> (f64, f64, f64) {
    let l = len as f64;
    let net = i.lambda_net + l / i.b_net;
    let plain = 2.0 * l / i.b_copy + net;
    let paper = plain + 2.0 * l / i.b_csum;
    let fused = 2.0 * l / i.b_fused + net;
    (plain, paper, fused)
}

/// The network figures, from the raw transport in this run: lambda from an
/// 8-byte pingpong, B_net from a 64 KiB stream (medians of `runs`).
pub fn measure_network(o: &NetOpts, runs: usize) -> anyhow::Result<(f64, f64)> {
    let small = NetOpts { size: 8, ..o.clone() };
    let rtt_us = repeat(runs, || Ok(pingpong::raw_loopback(&small, 20_000)?.rtt_us.median))?;
    let large = NetOpts { size: 65_536, ..o.clone() };
    let net = repeat(runs, || Ok(stream::raw_loopback(&large, 4_000)?.goodput_mb_s))?;
    Ok((rtt_us.median / 2.0 * 1e-6, net.median * 1e6))
}

/// Measure `tether stream` at `size` without and with `o.checksum`,
/// alternating the two so drift on a shared machine hits both alike.
pub fn row(o: &NetOpts, inputs: &Inputs, size: usize, runs: usize) -> anyhow::Result<Row> {
    let count = (stream::default_count(size) / 4).max(2_000);
    let with = NetOpts { size, ..o.clone() };
    let without = NetOpts { checksum: tether::ChecksumKind::None, ..with.clone() };
    let (mut none, mut sum) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        for (opts, out) in [(&without, &mut none), (&with, &mut sum)] {
            let r = stream::reliable_loopback(opts, count)?;
            anyhow::ensure!(r.delivered == r.messages && r.corrupted == 0, "stream verification failed");
            out.push(r.goodput_mb_s);
        }
    }
    let (none, sum) = (Summary::of(&none).expect("runs"), Summary::of(&sum).expect("runs"));
    let (plain, paper, fused) = predict(inputs, size);
    Ok(Row {
        size,
        t_plain_us: plain * 1e6,
        t_measured_us: size as f64 / none.median,
        predicted_paper: paper / plain - 1.0,
        predicted_fused: fused / plain - 1.0,
        measured: none.median / sum.median - 1.0,
        stream_none_mb_s: none,
        stream_checksum_mb_s: sum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_own_figures_give_its_percentages() {
        // [NMAD] section 5.2: lambda 1.4 us, B_net 3 GB/s, B_copy 4.5 GB/s,
        // B_csum 24.1 GB/s "gives 7% on 4 kB and 10% on 32 kB messages".
        let i = Inputs { b_copy: 4.5e9, b_csum: 24.1e9, b_fused: 4.5e9, lambda_net: 1.4e-6, b_net: 3e9 };
        let overhead = |len| {
            let (plain, paper, ..) = predict(&i, len);
            paper / plain - 1.0
        };
        let (o4, o32) = (overhead(4096), overhead(32768));
        assert!((0.05..0.09).contains(&o4), "{o4}");
        assert!((0.08..0.12).contains(&o32), "{o32}");
    }
}
