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
//!
//! A second table isolates the datagram itself: payload bytes per second
//! through `PacketWriter` (copy in, then checksum or seal) and through the
//! receive path (verify or open, then land each payload in its buffer),
//! one core, no sockets: what each protection costs per datagram, small
//! and large.

use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use tether::{AuthKind, ChecksumKind, ClusterKey};
use tether_wire::{
    DataFlags, DataFrame, Header, HeaderFlags, Landing, PacketWriter, Unverified, AUTH_OVERHEAD,
};

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

/// One protection's cost per datagram, for one payload size.
#[derive(Debug, Serialize)]
pub struct DatagramRow {
    pub protection: &'static str,
    /// Payload bytes in the datagram (one DATA frame).
    pub payload: usize,
    /// Payload through `PacketWriter`: copied in, checksummed or sealed, GB/s.
    pub send_gb_s: Summary,
    /// Payload through verification or opening and landing, GB/s.
    pub receive_gb_s: Summary,
}

/// Payload sizes of the datagram table: a small message, a full 1472-byte
/// datagram's frame, a full 65000-byte one's.
pub const DATAGRAM_PAYLOADS: [usize; 3] = [8, 1472 - AUTH_OVERHEAD - 16, 65_000 - AUTH_OVERHEAD - 16];

/// Lands every payload in one buffer, as the receiver lands a segment.
struct LandIn<'a>(&'a mut [u8]);

impl Landing for LandIn<'_> {
    fn landing(&mut self, frame: &DataFrame<'_>) -> Option<&mut [MaybeUninit<u8>]> {
        let dst = &mut self.0[..frame.payload.len()];
        // SAFETY: initialised bytes are valid `MaybeUninit<u8>`s, and the
        // landing only writes bytes into them.
        Some(unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) })
    }
}

/// Payload GB/s of `f` (which handles `bytes` per call) over `span`.
fn rate(span: Duration, bytes: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while !calls.is_multiple_of(64) || start.elapsed() < span {
        f();
        calls += 1;
    }
    (calls * bytes as u64) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// The datagram table: every protection, every payload size, `rounds`
/// measurements of 20 ms each way.
pub fn datagrams(
    o: &AuthOpts,
    key: &ClusterKey,
    algorithms: &[AuthKind],
) -> anyhow::Result<Vec<DatagramRow>> {
    let header = Header {
        flags: HeaderFlags::default(),
        checksum: ChecksumKind::Crc32c,
        src_node: 1,
        dst_node: 2,
        src_inc: 1,
        dst_inc: 1,
        epoch: 0,
        probe: 0,
    };
    let span = Duration::from_millis(20);
    let mut rows = Vec::new();
    for auth in std::iter::once(None).chain(algorithms.iter().copied().map(Some)) {
        let mac = auth.map(|a| key.clone().with_auth(a).datagram_key(1, 1, 2, 1));
        for &payload in &DATAGRAM_PAYLOADS {
            let message: Vec<u8> = (0..payload).map(|i| i as u8).collect();
            let mut datagram = vec![0u8; 65_507];
            let mut landed = vec![0u8; payload];
            let mut pn = 0u64;
            let mut write = |out: &mut [u8]| -> anyhow::Result<usize> {
                pn += 1;
                let mut w = match &mac {
                    Some(k) => PacketWriter::new_authenticated(out, &header, k, pn)?,
                    None => PacketWriter::new(out, &header)?,
                };
                w.push_data(0, DataFlags::new(true, true), 0, &message)?;
                Ok(w.finish())
            };
            let len = write(&mut datagram)?;
            let mut scratch = Vec::new();
            let mut read = |d: &[u8], landed: &mut [u8]| -> anyhow::Result<()> {
                let u = Unverified::parse(d)?;
                match &mac {
                    Some(k) => u.open(k, &mut scratch)?.land(&mut LandIn(landed))?,
                    None => u.verify_landing(&mut LandIn(landed))?,
                };
                Ok(())
            };
            read(&datagram[..len], &mut landed)?;
            anyhow::ensure!(landed == message, "the payload did not land intact");
            let (mut send, mut receive) = (Vec::new(), Vec::new());
            for _ in 0..o.rounds {
                let mut failed = None;
                send.push(rate(span, payload, || {
                    if let Err(e) = write(&mut datagram) {
                        failed = Some(e);
                    }
                }));
                // A datagram sealed once opens once only in the protocol (the
                // replay window), but opening has no state: the same bytes
                // cost the same each time.
                let len = write(&mut datagram)?;
                receive.push(rate(span, payload, || {
                    if let Err(e) = read(&datagram[..len], &mut landed) {
                        failed = Some(e);
                    }
                }));
                if let Some(e) = failed {
                    return Err(e);
                }
            }
            let summary = |v: &[f64]| Summary::of(v).expect("at least one round");
            rows.push(DatagramRow {
                protection: auth.map_or("crc32c", AuthKind::name),
                payload,
                send_gb_s: summary(&send),
                receive_gb_s: summary(&receive),
            });
        }
    }
    Ok(rows)
}

/// The algorithms asked for (all of them by default).
fn algorithms(o: &AuthOpts) -> Vec<AuthKind> {
    if o.algorithms.is_empty() {
        AuthKind::ALL.to_vec()
    } else {
        o.algorithms.clone()
    }
}

/// A fresh cluster secret for the run: the bench only needs both ends to
/// share one, and a key file would only be read into the same thing.
fn fresh_key() -> anyhow::Result<ClusterKey> {
    let mut material = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut material)?;
    Ok(ClusterKey::from_material(&material)?)
}

/// Both tables of `tether bench auth`.
#[derive(Debug, Serialize)]
pub struct AuthReport {
    pub end_to_end: Vec<AuthRow>,
    pub datagrams: Vec<DatagramRow>,
}

pub fn run(o: &AuthOpts, base: &NetOpts, progress: &dyn Fn(&str)) -> anyhow::Result<AuthReport> {
    let key = fresh_key()?;
    progress("datagrams: seal and open on one core");
    let datagrams = datagrams(o, &key, &algorithms(o))?;
    let end_to_end = end_to_end(o, base, &key, progress)?;
    Ok(AuthReport { end_to_end, datagrams })
}

fn end_to_end(
    o: &AuthOpts,
    base: &NetOpts,
    key: &ClusterKey,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<AuthRow>> {
    // None is the baseline: CRC32C and no key.
    let protections: Vec<Option<AuthKind>> =
        std::iter::once(None).chain(algorithms(o).into_iter().map(Some)).collect();
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
