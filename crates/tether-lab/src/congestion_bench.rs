//! `tether bench congestion`: tether's congestion control through a real
//! bottleneck. Two hosts in two network namespaces joined by a veth pair;
//! the sender's end is shaped by `tc` tbf (1 Gbit/s, a shallow queue),
//! which drops what overflows the queue like a switch port. Measured in
//! one run:
//!
//! - 8 B round trips through the idle link, unshaped and shaped: control
//!   must not cost latency when nothing queues;
//! - N tether streams at once through the bottleneck: their sum against
//!   its rate, Jain's fairness index, the share of packets the queue
//!   dropped;
//! - one tether stream beside one TCP connection (Cubic): tether's share
//!   against the fair half.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tether::transport::{AddressBook, UdpTransport};
use tether::{Config, Endpoint, Options};

use crate::args;
use crate::flows::{self, FlowsRun, Until};
use crate::net::{Congestion, RECEIVER, SENDER};
use crate::netns::{Netns, NetnsError};
use crate::summary::Summary;

#[derive(Debug, Clone, Args)]
pub struct CongestionOpts {
    /// The bottleneck's rate, megabits per second.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(10, 100_000, "Mbit/s", ""))]
    pub rate_mbit: u64,
    /// The bottleneck's queue, KiB (tbf's limit): shallow, as a switch
    /// port's share of a shared buffer.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(16, 65_536, "KiB", ""))]
    pub queue_kib: u64,
    /// tether streams through the bottleneck together.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 16, "", ""))]
    pub flows: usize,
    /// The links' MTU, bytes; tether's datagrams fill it. (At 9000, jumbo
    /// frames, the streams' per-packet work no longer makes this 2-core
    /// machine's CPU the limit, but the 128 KiB queue holds 14 packets.)
    #[arg(long, default_value_t = 1500, allow_negative_numbers = true,
          value_parser = args::int_in::<u32>(1280, 65_535, "bytes", ""))]
    pub mtu: u32,
    /// Message size of the streams, bytes.
    #[arg(long, default_value_t = 16384, allow_negative_numbers = true, value_parser = args::size(1))]
    pub size: usize,
    /// How long each measurement runs, after its warm-up.
    #[arg(long, default_value = "4s", value_parser = args::duration_in(Duration::from_millis(100), Duration::from_secs(3600), "a measurement"))]
    pub duration: Duration,
    /// Warm-up before each measurement (slow start, the first queue).
    #[arg(long, default_value = "1s", value_parser = args::duration_in(Duration::ZERO, Duration::from_secs(600), "a warm-up"))]
    pub warmup: Duration,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 2000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(10, 10_000_000, "", ""))]
    pub round_trips: u64,
    /// The tether streams' congestion control.
    #[arg(long, value_enum, default_value_t = Congestion::Delay)]
    pub congestion: Congestion,
    /// Send each datagram alone, without UDP segmentation offload (GSO)
    /// and receive offload (GRO): how the streams do through the queue
    /// without offload's bursts of up to 64 KiB.
    #[arg(long)]
    pub no_offload: bool,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Round trips of 8 B through the idle link, microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Every round trip of each kind, pooled over the turns.
    pub unshaped_us: Summary,
    pub shaped_us: Summary,
    /// Each shaped turn's median against the mean of the medians of the
    /// unshaped turns on either side of it: the median of those ratios.
    /// The comparison to judge by (see `latency`).
    pub shaped_over_unshaped: f64,
    /// Each turn's median in the order run, unshaped first and last.
    pub turn_medians_us: Vec<f64>,
}

/// Flows through the bottleneck, with what its queue did over the same
/// interval (`tc -s qdisc`).
#[derive(Debug, Clone, Serialize)]
pub struct Shared {
    pub run: FlowsRun,
    /// The flows' goodput (payload bytes delivered) against the
    /// bottleneck's rate.
    pub goodput_share: f64,
    /// Bytes the queue sent (frames, every header included) against the
    /// rate: how busy the bottleneck was.
    pub link_utilization: f64,
    /// Packets the queue dropped, and their share of the packets offered.
    pub queue_drops: u64,
    pub loss: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CongestionReport {
    pub rate_mbit: u64,
    pub queue_kib: u64,
    pub mtu: u32,
    pub size: usize,
    pub congestion: String,
    pub latency: Latency,
    pub tether_flows: Shared,
    /// One tether stream beside one TCP connection.
    pub beside_tcp: Shared,
    /// The TCP connection's congestion control, as the kernel names it.
    pub tcp_algorithm: String,
    /// tether's goodput against half of the two flows' sum.
    pub tether_share_of_fair: f64,
}

/// Run the bench and print its report. Where the machine cannot make the
/// bottleneck (not root, no `ip`, no `tc` tbf) it says SKIPPED on stderr
/// and succeeds: nothing was measured, nothing failed.
pub fn run(o: &CongestionOpts) -> anyhow::Result<()> {
    let ns = match Netns::pair_for("congestion", 1) {
        Ok(ns) => ns,
        Err(NetnsError::Unavailable(why)) => {
            eprintln!("bench congestion SKIPPED: it needs two network namespaces (root and iproute2): {why}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let dev = Netns::veth(0, 0);
    ns.set_mtu(o.mtu)?;
    if let Err(why) = shape(&ns, &dev, o) {
        // tc or the tbf scheduler missing: the machine's limit, as above.
        eprintln!("bench congestion SKIPPED: it needs `tc` with the tbf qdisc: {why}");
        return Ok(());
    }
    let config = Config {
        congestion: o.congestion.control(),
        // The IPv4 and UDP headers less than the link's MTU.
        max_datagram: (o.mtu as usize - 28).min(crate::limit::MAX_DATAGRAM),
        ..Config::default()
    };
    let mut port = 7600;
    let mut pair = |ns: &Netns| -> anyhow::Result<(Endpoint, Endpoint)> {
        port += 1;
        endpoints(ns, &config, port, o.no_offload)
    };
    let latency = latency(&ns, &dev, o, pair(&ns)?)?;
    // Its last turn was unshaped: the bottleneck again for the flows.
    shape(&ns, &dev, o)?;
    let mut tether_flows = Vec::new();
    for _ in 0..o.flows {
        let (tx, rx) = pair(&ns)?;
        tether_flows.push(flows::tether_flow(tx, rx, o.size, u64::MAX));
    }
    let together = measure(&ns, &dev, o, tether_flows)?;
    let (tx, rx) = pair(&ns)?;
    let (tcp_tx, tcp_rx, tcp_algorithm) = tcp(&ns)?;
    let beside = measure(
        &ns,
        &dev,
        o,
        vec![flows::tether_flow(tx, rx, o.size, u64::MAX), flows::tcp_flow(tcp_tx, tcp_rx)],
    )?;
    let f = &beside.run.flows;
    let fair = (f[0].goodput_mb_s + f[1].goodput_mb_s) / 2.0;
    let report = CongestionReport {
        rate_mbit: o.rate_mbit,
        queue_kib: o.queue_kib,
        mtu: o.mtu,
        size: o.size,
        congestion: format!("{:?}", o.congestion).to_lowercase(),
        latency,
        tether_flows: together,
        tether_share_of_fair: if fair > 0.0 { f[0].goodput_mb_s / fair } else { 0.0 },
        beside_tcp: beside,
        tcp_algorithm,
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    Ok(())
}

/// The bottleneck: tbf at the rate, its bucket a few datagrams deep, its
/// queue `queue_kib`.
fn shape(ns: &Netns, dev: &str, o: &CongestionOpts) -> anyhow::Result<()> {
    let rate = format!("{}mbit", o.rate_mbit);
    let limit = format!("{}kb", o.queue_kib);
    ns.tc(
        0,
        &["qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", "16kb", "limit", &limit],
    )?;
    Ok(())
}

/// The queue's counters: bytes and packets sent, packets dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct QueueCounters {
    bytes: u64,
    packets: u64,
    dropped: u64,
}

impl QueueCounters {
    /// From `tc -s qdisc show`: " Sent 123 bytes 4 pkt (dropped 5, ...".
    fn parse(text: &str) -> Option<QueueCounters> {
        let sent = text.split(" Sent ").nth(1)?;
        let mut words = sent.split_whitespace();
        let bytes = words.next()?.parse().ok()?;
        let packets = words.nth(1)?.parse().ok()?;
        let dropped = sent.split("dropped ").nth(1)?.split(',').next()?.trim().parse().ok()?;
        Some(QueueCounters { bytes, packets, dropped })
    }
}

fn measure(ns: &Netns, dev: &str, o: &CongestionOpts, flows: Vec<flows::Flow>) -> anyhow::Result<Shared> {
    let mut marks = Vec::new();
    let run = flows::run(flows, o.warmup, Until::Elapsed(o.duration), &mut || {
        marks.push(QueueCounters::parse(&ns.qdisc_stats(0, dev)))
    })?;
    let (Some(Some(a)), Some(Some(b))) = (marks.first(), marks.last()) else {
        anyhow::bail!("cannot read the bottleneck's counters (`tc -s qdisc show dev {dev}`)")
    };
    let capacity_bytes_s = o.rate_mbit as f64 * 1e6 / 8.0;
    let (sent, dropped) = (b.packets - a.packets, b.dropped - a.dropped);
    Ok(Shared {
        goodput_share: run.total_mb_s * 1e6 / capacity_bytes_s,
        link_utilization: (b.bytes - a.bytes) as f64 / run.seconds / capacity_bytes_s,
        loss: if sent + dropped > 0 { dropped as f64 / (sent + dropped) as f64 } else { 0.0 },
        queue_drops: dropped,
        run,
    })
}

/// A sender in `a` and a receiver in `b` on `port`, each knowing the other.
fn endpoints(
    ns: &Netns,
    config: &Config,
    port: u16,
    no_offload: bool,
) -> anyhow::Result<(Endpoint, Endpoint)> {
    let (a, b) = (SocketAddr::new(Netns::host(0, 0), port), SocketAddr::new(Netns::host(1, 0), port));
    let options = Options { config: config.clone(), linger: Duration::ZERO, ..Options::default() };
    let make = |node, bind, peer, peer_addr| -> anyhow::Result<Endpoint> {
        let mut book = AddressBook::new();
        book.insert(peer, peer_addr);
        let udp = UdpTransport::bind(bind, book)?;
        let udp = if no_offload { udp.without_offload() } else { udp };
        Ok(Endpoint::with_transport(node, Box::new(udp), options.clone())?)
    };
    let rx = ns.within(1, || make(RECEIVER, b, SENDER, a))??;
    let tx = ns.within(0, || make(SENDER, a, RECEIVER, b))??;
    Ok((tx, rx))
}

/// A TCP connection from `a` to `b`, Cubic asked for.
fn tcp(ns: &Netns) -> anyhow::Result<(TcpStream, TcpStream, String)> {
    let listener = ns.within(1, || TcpListener::bind(SocketAddr::new(Netns::host(1, 0), 0)))??;
    let to = listener.local_addr()?;
    flows::tcp_pair(|| Ok(listener), |_| ns.within(0, || TcpStream::connect(to))?)
}

/// Turns of 8 B round trips over one pair of endpoints, unshaped and
/// shaped in alternation, unshaped first and last.
///
/// On this shared two-core machine a turn's median is a state more than a
/// measurement: it sat at 11, 18, 50 or 100 us for a whole turn of
/// unshaped round trips (where the scheduler put the two threads, and
/// runs of up to 256 waits that skip spinning after a few spins ran out,
/// `spin_policy`), and one such turn among three moved the pooled median
/// 1.4-3.4x either way. So there are many short turns, and each shaped
/// turn is judged against the unshaped turns just before and after it,
/// which a state that lasts longer than a turn or drifts over the run
/// moves as it moves the shaped one; the median of those ratios is the
/// figure.
fn latency(
    ns: &Netns,
    dev: &str,
    o: &CongestionOpts,
    (tx, rx): (Endpoint, Endpoint),
) -> anyhow::Result<Latency> {
    const SHAPED_TURNS: u64 = 15;
    let per_turn = o.round_trips.div_ceil(SHAPED_TURNS).max(MIN_PER_TURN);
    let turns = 2 * SHAPED_TURNS + 1;
    let wait = Some(Duration::from_secs(5));
    let total = turns * (per_turn + WARM);
    let echo = std::thread::spawn(move || -> anyhow::Result<()> {
        for _ in 0..total {
            let d = rx.recv(wait)?;
            rx.send(d.from, &d.message)?;
        }
        rx.flush(wait)?;
        Ok(())
    });
    let (mut unshaped, mut shaped) = (Vec::new(), Vec::new());
    let mut medians = Vec::new();
    let mut i = 0u64;
    for turn in 0..turns {
        let shaping = turn % 2 == 1;
        if shaping {
            shape(ns, dev, o)?;
        } else {
            // No root qdisc of ours: the veth's default.
            let _ = ns.tc(0, &["qdisc", "del", "dev", dev, "root"]);
        }
        let mut samples = Vec::with_capacity(per_turn as usize);
        for k in 0..per_turn + WARM {
            let t0 = std::time::Instant::now();
            tx.send(RECEIVER, &i.to_le_bytes())?;
            let d = tx.recv(wait)?;
            anyhow::ensure!(d.message[..] == i.to_le_bytes(), "the echo came back changed");
            if k >= WARM {
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            i += 1;
        }
        medians.push(Summary::of(&samples).expect("round trips >= 10").median);
        if shaping { &mut shaped } else { &mut unshaped }.extend(samples);
    }
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    let ratios: Vec<f64> = medians.windows(3).step_by(2).map(|w| w[1] / ((w[0] + w[2]) / 2.0)).collect();
    Ok(Latency {
        unshaped_us: Summary::of(&unshaped).expect("round trips >= 10"),
        shaped_us: Summary::of(&shaped).expect("round trips >= 10"),
        shaped_over_unshaped: Summary::of(&ratios).expect("15 shaped turns").median,
        turn_medians_us: medians,
    })
}

/// The fewest round trips a turn counts, whatever `--round-trips` asks.
const MIN_PER_TURN: u64 = 20;

/// Round trips of each turn not counted (the path warming up after the
/// qdisc changed).
const WARM: u64 = 50;

fn print(r: &CongestionReport) {
    let l = &r.latency;
    println!(
        "bottleneck: tbf {} Mbit/s, queue {} KiB, MTU {}; tether streams of {} B messages, congestion control {}",
        r.rate_mbit, r.queue_kib, r.mtu, r.size, r.congestion
    );
    println!(
        "8 B round trip through the idle link: unshaped {:.1} us median (p99 {:.1}), shaped {:.1} us (p99 {:.1}); each shaped turn against the unshaped turns beside it: {:.2}x (median of {} turns)",
        l.unshaped_us.median,
        l.unshaped_us.p99,
        l.shaped_us.median,
        l.shaped_us.p99,
        l.shaped_over_unshaped,
        l.turn_medians_us.len() / 2
    );
    let t = &r.tether_flows;
    let rates: Vec<String> = t.run.flows.iter().map(|f| format!("{:.1}", f.goodput_mb_s)).collect();
    println!(
        "{} tether streams: {:.1} MB/s together (link {:.1}% busy, goodput {:.1}% of its rate), each {} MB/s, Jain {:.3}, queue drops {} ({:.3}% of packets), retransmits {}",
        t.run.flows.len(),
        t.run.total_mb_s,
        t.link_utilization * 100.0,
        t.goodput_share * 100.0,
        rates.join(" / "),
        t.run.jain,
        t.queue_drops,
        t.loss * 100.0,
        t.run.flows.iter().map(|f| f.retransmits).sum::<u64>()
    );
    let b = &r.beside_tcp;
    println!(
        "1 tether stream beside 1 TCP ({}): tether {:.1} MB/s, TCP {:.1} MB/s, tether's share {:.2}x of fair, link {:.1}% busy, queue drops {:.3}%",
        r.tcp_algorithm,
        b.run.flows[0].goodput_mb_s,
        b.run.flows[1].goodput_mb_s,
        r.tether_share_of_fair,
        b.link_utilization * 100.0,
        b.loss * 100.0
    );
}
