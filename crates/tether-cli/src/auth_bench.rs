//! `tether bench auth`: what authentication costs. The round trip of small
//! messages and the goodput of a large-message stream, with integrity by
//! CRC32C alone (the baseline) and under each authentication algorithm,
//! all on loopback in the same invocation (docs/PROTOCOL.md,
//! "Authentication").
//!
//! The machine is shared and noisy, so the protections take turns within
//! each round (in an order that rotates from round to round) and every
//! ratio is taken within its round, against the baseline measured
//! minutes, not hours, apart; the table gives median (min-max) over rounds.

use clap::Args;
use serde::Serialize;
use tether::{AuthKind, ChecksumKind, ClusterKey};

use crate::net::NetOpts;
use crate::summary::Summary;
use crate::{args, pingpong, stream};

#[derive(Debug, Clone, Args)]
pub struct AuthOpts {
    /// Rounds; in each, every protection is measured once.
    #[arg(long, default_value_t = 7, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1000, "", ""))]
    pub rounds: usize,
    /// Message size of the round trips, in bytes.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = args::size(0))]
    pub pingpong_size: usize,
    /// Message size of the stream, in bytes.
    #[arg(long, default_value_t = 65536, allow_negative_numbers = true, value_parser = args::size(0))]
    pub stream_size: usize,
    /// Largest datagram in bytes, header included.
    #[arg(long, default_value_t = 1472, allow_negative_numbers = true,
          value_parser = args::config_field(|c, v| c.max_datagram = v))]
    pub mtu: usize,
    /// Algorithms to measure against CRC32C, comma-separated [default: all three].
    #[arg(long, value_delimiter = ',', value_parser = crate::net::auth_kind)]
    pub algorithms: Vec<AuthKind>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One protection's figures over the rounds.
#[derive(Debug, Serialize)]
pub struct AuthRow {
    /// `crc32c` or an authentication algorithm's name.
    pub protection: &'static str,
    pub encrypted: bool,
    /// Median round trip of each round's run, microseconds.
    pub rtt_us: Summary,
    /// Its round trip over the baseline's in the same round.
    pub rtt_ratio: Summary,
    /// Stream goodput, MB/s.
    pub stream_mb_s: Summary,
    /// Its goodput over the baseline's in the same round.
    pub stream_ratio: Summary,
}

/// A fresh cluster secret for the run: the bench only needs both ends to
/// share one, and a key file would only be read into the same thing.
fn fresh_key() -> anyhow::Result<ClusterKey> {
    let mut material = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut material)?;
    Ok(ClusterKey::from_material(&material)?)
}

pub fn run(o: &AuthOpts, base: &NetOpts, progress: &dyn Fn(&str)) -> anyhow::Result<Vec<AuthRow>> {
    let key = fresh_key()?;
    let algorithms = if o.algorithms.is_empty() { AuthKind::ALL.to_vec() } else { o.algorithms.clone() };
    // None is the baseline: CRC32C and no key.
    let protections: Vec<Option<AuthKind>> =
        std::iter::once(None).chain(algorithms.into_iter().map(Some)).collect();
    let opts = |auth: Option<AuthKind>, size: usize| NetOpts {
        size,
        mtu: o.mtu,
        checksum: ChecksumKind::Crc32c,
        key_file: auth.map(|a| key.clone().with_auth(a)),
        runs: 1,
        ..base.clone()
    };
    let pp_count = pingpong::default_count(o.pingpong_size);
    let st_count = stream::default_count(o.stream_size);
    let n = protections.len();
    let (mut rtt, mut goodput) = (vec![vec![0.0; o.rounds]; n], vec![vec![0.0; o.rounds]; n]);
    for round in 0..o.rounds {
        for k in 0..n {
            let i = (k + round) % n;
            let name = protections[i].map_or("crc32c", AuthKind::name);
            progress(&format!("round {}/{}: {name}", round + 1, o.rounds));
            rtt[i][round] =
                pingpong::reliable_loopback(&opts(protections[i], o.pingpong_size), pp_count)?.rtt_us.median;
            let s = stream::reliable_loopback(&opts(protections[i], o.stream_size), st_count)?;
            anyhow::ensure!(
                s.corrupted == 0 && s.out_of_order == 0 && s.delivered == s.messages,
                "{name}: the stream's verification failed"
            );
            goodput[i][round] = s.goodput_mb_s;
        }
    }
    let summary = |v: &[f64]| Summary::of(v).expect("at least one round");
    let ratios =
        |v: &[f64], base: &[f64]| summary(&v.iter().zip(base).map(|(x, b)| x / b).collect::<Vec<_>>());
    Ok(protections
        .iter()
        .enumerate()
        .map(|(i, p)| AuthRow {
            protection: p.map_or("crc32c", AuthKind::name),
            encrypted: p.is_some_and(AuthKind::encrypts),
            rtt_us: summary(&rtt[i]),
            rtt_ratio: ratios(&rtt[i], &rtt[0]),
            stream_mb_s: summary(&goodput[i]),
            stream_ratio: ratios(&goodput[i], &goodput[0]),
        })
        .collect())
}
