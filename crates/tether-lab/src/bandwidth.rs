//! `tether bench checksum`: the bandwidth table of Trahay et al. [NMAD]
//! Figure 4 on this machine. Every algorithm alone, fused with a copy, and
//! as a copy followed by a second pass, both on blocks that stay in cache
//! and on a buffer far larger than the last-level cache; next to plain
//! memcpy and plain memory reads measured in the same run, so each figure
//! is read as a ratio to what the memory system does anyway (Trahay et al.
//! [NMAD] section 5.1).

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::Serialize;
use tether_wire::integrity::{crc32c_copy_with, CrcCopyKernel};
use tether_wire::{ChecksumKind, Checksummer};

use crate::args;
use crate::summary::Summary;

/// How long one measurement runs at least: long enough that the clock
/// reads and the warm-up are noise, short enough for many runs.
const MIN_TIME: Duration = Duration::from_millis(30);

#[derive(Debug, Clone, clap::Args)]
pub struct ChecksumOpts {
    /// Measurements per figure; the table shows median (min-max).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1000, "", ""))]
    pub runs: usize,
    /// In-cache block size in bytes (the paper's 32 KiB; 64 B to 64 MiB).
    #[arg(long, default_value_t = 32 * 1024, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(64, 64 << 20, "bytes", ""))]
    pub block: usize,
    /// Out-of-cache buffer size in MiB (walked in blocks; several times the
    /// last-level cache). Two buffers of it are allocated, so at most 4096.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 4096, "MiB", "two buffers of it are allocated"))]
    pub large_mib: usize,
    /// Algorithms to measure, comma-separated [default: all nine].
    #[arg(long, value_delimiter = ',', value_parser = crate::net::checksum_kind)]
    pub algorithms: Vec<ChecksumKind>,
    /// Measure detection strength instead: the fraction of corruptions each
    /// algorithm misses, per error pattern.
    #[arg(long)]
    pub errors: bool,
    /// Trials per pattern and algorithm for --errors.
    #[arg(long, default_value_t = 1_000_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1_000_000_000, "", ""))]
    pub trials: u64,
    /// Message length in bytes for --errors (16 B, two words to swap, to 1 MiB).
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(16, 1 << 20, "bytes", "the word swap needs two 8-byte words"))]
    pub error_len: usize,
    /// Seed for --errors (the same seed gives the same table).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = args::seed)]
    pub seed: u64,
    /// After the bandwidths, the T(L) model of Trahay et al. [NMAD] section
    /// 5.2: predicted checksum overhead for eager messages next to `tether
    /// stream` with and without the checksum.
    #[arg(long)]
    pub model: bool,
    /// The algorithm the model prices (the stream runs with it and with none).
    #[arg(long, default_value = "crc32c", value_parser = crate::net::checksum_kind)]
    pub model_checksum: ChecksumKind,
    /// Stream runs per size (alternating with and without) for --model.
    #[arg(long, default_value_t = 7, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1000, "", ""))]
    pub model_runs: usize,
    /// Message sizes for --model, comma-separated, in bytes (at least 8).
    #[arg(long, value_delimiter = ',', default_values_t = [4096, 32768, 65536], allow_negative_numbers = true,
          value_parser = args::size(8))]
    pub model_sizes: Vec<usize>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl ChecksumOpts {
    pub fn kinds(&self) -> Vec<ChecksumKind> {
        if self.algorithms.is_empty() {
            ChecksumKind::ALL.to_vec()
        } else {
            self.algorithms.clone()
        }
    }
}

/// GB/s in cache and out of cache.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pair {
    pub in_cache: Summary,
    pub out_of_cache: Summary,
}

#[derive(Debug, Clone, Serialize)]
pub struct AlgorithmRecord {
    pub name: &'static str,
    /// The checksum alone over data already in memory.
    pub alone_gb_s: Pair,
    /// Copy and checksum in one pass (`Checksummer::copy_update`).
    pub fused_gb_s: Pair,
    /// Copy, then checksum the copy (`Checksummer::copy_then_update`).
    pub two_pass_gb_s: Pair,
    /// Fused copy+checksum over memcpy, in cache (medians).
    pub fused_vs_memcpy: f64,
}

/// One of CRC32C's fused copy loops, each measured whether or not it is
/// the one in use, so the kernels can be compared on one machine.
#[derive(Debug, Clone, Serialize)]
pub struct KernelRecord {
    pub kernel: &'static str,
    pub fused_gb_s: Pair,
}

#[derive(Debug, Clone, Serialize)]
pub struct BandwidthReport {
    pub block_bytes: usize,
    pub large_bytes: usize,
    pub runs: usize,
    /// The kernel CRC32C's fused copy uses on this CPU.
    pub crc32c_kernel: &'static str,
    pub memcpy_gb_s: Pair,
    pub memory_read_gb_s: Pair,
    pub algorithms: Vec<AlgorithmRecord>,
    /// CRC32C's fused copy by kernel (when CRC32C is measured).
    pub crc32c_kernels: Vec<KernelRecord>,
}

impl BandwidthReport {
    pub fn algorithm(&self, kind: ChecksumKind) -> Option<&AlgorithmRecord> {
        self.algorithms.iter().find(|a| a.name == kind.name())
    }
}

/// Source and destination buffers, filled with non-trivial bytes once.
struct Buffers {
    small_src: Vec<u8>,
    small_dst: Vec<u8>,
    large_src: Vec<u8>,
    large_dst: Vec<u8>,
    block: usize,
}

impl Buffers {
    fn new(block: usize, large: usize) -> Self {
        let fill = |n: usize| (0..n).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<u8>>();
        // Touch the destinations too, so no run pays for first-touch faults.
        Buffers {
            small_src: fill(block),
            small_dst: vec![1; block],
            large_src: fill(large),
            large_dst: vec![1; large],
            block,
        }
    }
}

/// Bytes per second of `op` over `bytes_per_call`, timed over at least
/// [`MIN_TIME`] after one warm-up call.
fn rate(bytes_per_call: usize, mut op: impl FnMut()) -> f64 {
    op();
    // Batch calls between clock reads so reading the clock stays well under 1%.
    let batch = (256 * 1024 / bytes_per_call.max(1)).max(1);
    let start = Instant::now();
    let mut calls = 0usize;
    loop {
        for _ in 0..batch {
            op();
        }
        calls += batch;
        let t = start.elapsed();
        if t >= MIN_TIME {
            return (calls * bytes_per_call) as f64 / t.as_secs_f64() / 1e9;
        }
    }
}

/// An operation over one (destination, source) block pair.
type BlockOp<'a> = &'a mut dyn FnMut(&mut [u8], &[u8]);

/// GB/s of `op` on one block in cache, and walking the large buffers.
fn in_and_out(b: &mut Buffers, op: BlockOp<'_>) -> (f64, f64) {
    let block = b.block;
    let (src, dst) = (&b.small_src, &mut b.small_dst);
    let small = rate(block, || op(dst, src));
    let (src, dst) = (&b.large_src, &mut b.large_dst);
    let large = rate(src.len(), || {
        for (d, s) in dst.chunks_mut(block).zip(src.chunks(block)) {
            op(d, s);
        }
    });
    (small, large)
}

/// Collects one figure per run and summarises it.
#[derive(Default)]
struct Samples {
    in_cache: Vec<f64>,
    out_of_cache: Vec<f64>,
}

impl Samples {
    fn push(&mut self, (i, o): (f64, f64)) {
        self.in_cache.push(i);
        self.out_of_cache.push(o);
    }
    fn pair(&self) -> Pair {
        Pair {
            in_cache: Summary::of(&self.in_cache).expect("at least one run"),
            out_of_cache: Summary::of(&self.out_of_cache).expect("at least one run"),
        }
    }
}

#[derive(Default)]
struct AlgorithmSamples {
    alone: Samples,
    fused: Samples,
    two_pass: Samples,
}

/// Measure everything `o` asks for. Runs are interleaved (every figure once
/// per round, then the next round) so drift on a shared machine spreads
/// over all figures alike instead of biasing whichever ran last.
pub fn measure(o: &ChecksumOpts, progress: &dyn Fn(&str)) -> BandwidthReport {
    let kinds = o.kinds();
    let block = o.block.max(64);
    let mut b = Buffers::new(block, (o.large_mib.max(1) << 20).max(block));
    let (mut memcpy, mut read) = (Samples::default(), Samples::default());
    let mut per_kind: Vec<AlgorithmSamples> = kinds.iter().map(|_| AlgorithmSamples::default()).collect();
    let kernels = if kinds.contains(&ChecksumKind::Crc32c) { CrcCopyKernel::available() } else { vec![] };
    let mut per_kernel: Vec<Samples> = kernels.iter().map(|_| Samples::default()).collect();
    for run in 0..o.runs.max(1) {
        progress(&format!("round {} of {}: memcpy, memory read", run + 1, o.runs.max(1)));
        memcpy.push(in_and_out(&mut b, &mut |d, s| d.copy_from_slice(s)));
        read.push(in_and_out(&mut b, &mut |_, s| {
            black_box(read_all(s));
        }));
        for (&kind, samples) in kinds.iter().zip(per_kind.iter_mut()) {
            progress(&format!("round {} of {}: {}", run + 1, o.runs.max(1), kind.name()));
            samples.alone.push(in_and_out(&mut b, &mut |_, s| {
                let mut c = Checksummer::new(kind);
                c.update(s);
                black_box(c.finish());
            }));
            samples.fused.push(in_and_out(&mut b, &mut |d, s| {
                let mut c = Checksummer::new(kind);
                c.copy_update(d, s);
                black_box(c.finish());
            }));
            samples.two_pass.push(in_and_out(&mut b, &mut |d, s| {
                let mut c = Checksummer::new(kind);
                c.copy_then_update(d, s);
                black_box(c.finish());
            }));
        }
        for (&kernel, samples) in kernels.iter().zip(per_kernel.iter_mut()) {
            progress(&format!("round {} of {}: crc32c kernel {}", run + 1, o.runs.max(1), kernel.name()));
            samples.push(in_and_out(&mut b, &mut |d, s| {
                black_box(crc32c_copy_with(kernel, 0, d, s));
            }));
        }
    }
    let memcpy_gb_s = memcpy.pair();
    let algorithms = kinds
        .iter()
        .zip(&per_kind)
        .map(|(kind, s)| {
            let fused_gb_s = s.fused.pair();
            AlgorithmRecord {
                name: kind.name(),
                alone_gb_s: s.alone.pair(),
                two_pass_gb_s: s.two_pass.pair(),
                fused_vs_memcpy: fused_gb_s.in_cache.median / memcpy_gb_s.in_cache.median,
                fused_gb_s,
            }
        })
        .collect();
    BandwidthReport {
        block_bytes: block,
        large_bytes: b.large_src.len(),
        runs: o.runs.max(1),
        crc32c_kernel: CrcCopyKernel::best().name(),
        memcpy_gb_s,
        memory_read_gb_s: read.pair(),
        algorithms,
        crc32c_kernels: kernels
            .iter()
            .zip(&per_kernel)
            .map(|(k, s)| KernelRecord { kernel: k.name(), fused_gb_s: s.pair() })
            .collect(),
    }
}

/// Read every byte as fast as the core can: a xor of 64-bit words, which
/// the compiler turns into the widest loads worth using. This is the floor
/// under every checksum: none can be faster than reading its input. (AVX2,
/// not AVX-512: the compiler's 512-bit version of this loop measured 4x
/// slower here.)
fn read_all(data: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked on the line above).
        return unsafe { read_avx2(data) };
    }
    fold_words(data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn read_avx2(data: &[u8]) -> u64 {
    fold_words(data)
}

#[inline(always)]
fn fold_words(data: &[u8]) -> u64 {
    let (words, tail) = data.as_chunks::<8>();
    let x = words.iter().fold(0u64, |x, w| x ^ u64::from_le_bytes(*w));
    tail.iter().fold(x, |x, &b| x.rotate_left(8) ^ u64::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_all_reads_every_byte() {
        let mut data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let before = read_all(&data);
        for i in [0, 63, 64, 511, 999] {
            data[i] ^= 0x10;
            assert_ne!(read_all(&data), before, "a change at byte {i} must show");
            data[i] ^= 0x10;
        }
        assert_eq!(read_all(&data), before);
    }

    #[test]
    fn a_tiny_measurement_has_every_figure() {
        let o = ChecksumOpts {
            runs: 1,
            block: 4096,
            large_mib: 1,
            algorithms: vec![ChecksumKind::Crc32c, ChecksumKind::Sum],
            errors: false,
            trials: 0,
            error_len: 0,
            seed: 0,
            model: false,
            model_checksum: ChecksumKind::Crc32c,
            model_runs: 0,
            model_sizes: vec![],
            json: false,
        };
        let r = measure(&o, &|_| {});
        assert_eq!(r.algorithms.len(), 2);
        for a in &r.algorithms {
            for p in [a.alone_gb_s, a.fused_gb_s, a.two_pass_gb_s] {
                assert!(p.in_cache.median > 0.0 && p.out_of_cache.median > 0.0, "{}", a.name);
            }
        }
        assert!(r.memcpy_gb_s.in_cache.median > 0.0 && r.memory_read_gb_s.out_of_cache.median > 0.0);
    }
}
