//! `tether bench group`: ordered multicast among the members of a group
//! (docs/CLUSTER.md, "Groups") on loopback, against tether's own 8 B round
//! trip measured in the same run.
//!
//! Three embedded endpoints in this process form a cluster (each a member
//! and a manager replica) and join one group. Then, per run:
//!
//! * **throughput**: every member multicasts `--size` byte messages as
//!   fast as the group takes them for `--secs`; each member counts what it
//!   delivers. The figure is the slowest member's deliveries a second:
//!   every one of them is a message in the group's single order.
//! * **latency**: one member multicasts one message at a time, waiting for
//!   every member to deliver it; each delivery's latency is its time at
//!   the member less the send's (one clock: one process).
//! * **round trip**: two plain endpoints ping-pong 8 B messages, the
//!   bar's yardstick (Derecho and Spread are judged the same way: ordered
//!   delivery against the network's round trip).
//!
//! The bar (the issue's): at least 200,000 ordered 64 B messages a second
//! among three members, and a median delivery latency at most 3x the 8 B
//! round trip.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use serde::Serialize;
use tether::cluster::{ClusterConfig, GroupOutput};
use tether::{Endpoint, NodeId};

use crate::args;
use crate::summary::Summary;

#[derive(Debug, Clone, clap::Args)]
pub struct GroupOpts {
    /// Message size in bytes.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(8, 65_536, "bytes", ""))]
    pub size: usize,
    /// Seconds of multicasting per throughput run.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 3_600, "seconds", ""))]
    pub secs: u64,
    /// Runs (medians, min and max are reported over them).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 100, "runs", ""))]
    pub runs: usize,
    /// Messages timed one at a time per latency run.
    #[arg(long, default_value_t = 2_000, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(10, 1_000_000, "messages", ""))]
    pub pings: usize,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

const GROUP: u32 = 1;
const MEMBERS: [NodeId; 3] = [1, 2, 3];

#[derive(Debug, Clone, Serialize)]
struct Report {
    size: usize,
    members: usize,
    secs: u64,
    /// Ordered messages a second at the slowest member, per run.
    throughput: Summary,
    /// Delivery latency, microseconds, over every delivery of every run.
    latency_us: Summary,
    /// tether's 8 B round trip, microseconds, same runs.
    rtt_us: Summary,
    /// Median latency over median round trip.
    latency_over_rtt: f64,
    bar_throughput: f64,
    bar_latency_over_rtt: f64,
    met: bool,
}

fn any() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().expect("an address")
}

/// Three members of one cluster, each a replica, all in `GROUP`.
fn group() -> anyhow::Result<Vec<Endpoint>> {
    let config = ClusterConfig::new(&MEMBERS, Duration::from_millis(50));
    let eps: Vec<Endpoint> = MEMBERS
        .iter()
        .map(|&n| Endpoint::builder(n).bind(any()).cluster(config.clone()).build())
        .collect::<Result<_, _>>()?;
    for a in &eps {
        for b in &eps {
            if a.node() != b.node() {
                a.add_peer(b.node(), b.local_addr().expect("bound"))?;
            }
        }
    }
    for e in &eps {
        e.join_group(GROUP)?;
    }
    let start = StdInstant::now();
    while !eps.iter().all(|e| e.group_view(GROUP).is_some_and(|(_, m)| m == MEMBERS)) {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(30), "the group did not form in 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(eps)
}

/// Drain every member's outputs until none comes for a while.
fn drain(eps: &[Endpoint]) {
    for e in eps {
        while e.next_group_output(Some(Duration::from_millis(100))).is_ok() {}
    }
}

/// Every member multicasts for `secs`; the slowest member's deliveries a
/// second.
fn throughput(eps: &[Endpoint], size: usize, secs: u64) -> f64 {
    let stop = AtomicBool::new(false);
    let counts: Vec<AtomicU64> = eps.iter().map(|_| AtomicU64::new(0)).collect();
    let start = StdInstant::now();
    std::thread::scope(|s| {
        for e in eps {
            let stop = &stop;
            s.spawn(move || {
                let msg = vec![e.node() as u8; size];
                while !stop.load(Ordering::Relaxed) {
                    let _ = e.multicast(GROUP, &msg, Some(Duration::from_millis(10)));
                }
            });
        }
        for (e, count) in eps.iter().zip(&counts) {
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(GroupOutput::Delivered(_)) =
                        e.next_group_output(Some(Duration::from_millis(10)))
                    {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = start.elapsed().as_secs_f64();
    let slowest = counts.iter().map(|c| c.load(Ordering::Relaxed)).min().unwrap_or(0);
    slowest as f64 / elapsed
}

/// One message at a time from member 1, each member's own thread waiting
/// on its endpoint (as an application's would): each delivery's time less
/// the send's, microseconds.
fn latency(eps: &[Endpoint], size: usize, pings: usize) -> anyhow::Result<Vec<f64>> {
    let base = StdInstant::now();
    let sent: Vec<AtomicU64> = (0..=pings).map(|_| AtomicU64::new(0)).collect();
    // How many members delivered each message, and a wake-up for the
    // sender, which waits without spinning (on two cores a spinning
    // sender is a delay for every receiver).
    let got: Vec<AtomicU64> = (0..=pings).map(|_| AtomicU64::new(0)).collect();
    let done = (std::sync::Mutex::new(()), std::sync::Condvar::new());
    let stop = AtomicBool::new(false);
    let samples = std::sync::Mutex::new(Vec::with_capacity(pings * eps.len()));
    let from = eps[0].node();
    // The member's numbers so far: this run's messages are numbered on.
    let first = eps[0].group_stats().map_or(0, |s| s.submitted);
    std::thread::scope(|s| -> anyhow::Result<()> {
        for e in eps {
            let (sent, got, stop, samples, done) = (&sent, &got, &stop, &samples, &done);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(GroupOutput::Delivered(m)) = e.next_group_output(Some(Duration::from_millis(20)))
                    else {
                        continue;
                    };
                    let at = base.elapsed().as_nanos() as u64;
                    let i = m.n.saturating_sub(first) as usize;
                    if m.from == from && (1..=pings).contains(&i) {
                        let us = at.saturating_sub(sent[i].load(Ordering::SeqCst)) as f64 / 1e3;
                        samples.lock().expect("samples").push(us);
                        let _g = done.0.lock().expect("done");
                        got[i].fetch_add(1, Ordering::SeqCst);
                        done.1.notify_all();
                    }
                }
            });
        }
        let msg = vec![7u8; size];
        let result = (|| {
            for i in 1..=pings {
                sent[i].store(base.elapsed().as_nanos() as u64, Ordering::SeqCst);
                eps[0].multicast(GROUP, &msg, Some(Duration::from_secs(5)))?;
                let t = StdInstant::now();
                let mut g = done.0.lock().expect("done");
                while got[i].load(Ordering::SeqCst) < eps.len() as u64 {
                    anyhow::ensure!(
                        t.elapsed() < Duration::from_secs(10),
                        "message {i} not delivered everywhere"
                    );
                    g = done.1.wait_timeout(g, Duration::from_millis(100)).expect("done").0;
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })?;
    Ok(samples.into_inner().expect("samples"))
}

/// tether's 8 B round trip between two plain endpoints, microseconds.
fn round_trips(pings: usize) -> anyhow::Result<Vec<f64>> {
    let a = Endpoint::builder(11).bind(any()).build()?;
    let b = Arc::new(Endpoint::builder(12).bind(any()).build()?);
    a.add_peer(12, b.local_addr().expect("bound"))?;
    b.add_peer(11, a.local_addr().expect("bound"))?;
    let echo = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || -> anyhow::Result<()> {
            for _ in 0..pings + 100 {
                let d = b.recv(Some(Duration::from_secs(5)))?;
                b.send(11, &d.message)?;
            }
            Ok(())
        })
    };
    let mut samples = Vec::with_capacity(pings);
    for i in 0..pings + 100 {
        let t = StdInstant::now();
        a.send(12, &[0u8; 8])?;
        a.recv(Some(Duration::from_secs(5)))?;
        if i >= 100 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    Ok(samples)
}

pub fn run(o: &GroupOpts) -> anyhow::Result<()> {
    let eps = group()?;
    let mut rates = Vec::new();
    let mut lat = Vec::new();
    let mut rtt = Vec::new();
    for run in 0..o.runs {
        rates.push(throughput(&eps, o.size, o.secs));
        drain(&eps);
        lat.extend(latency(&eps, o.size, o.pings)?);
        rtt.extend(round_trips(o.pings)?);
        if !o.json {
            eprintln!("run {}: {:.0} ordered messages/s", run + 1, rates[run]);
        }
    }
    for e in eps {
        e.close(Duration::from_secs(1)).ok();
    }
    let throughput = Summary::of(&rates).expect("runs");
    let latency_us = Summary::of(&lat).expect("pings");
    let rtt_us = Summary::of(&rtt).expect("pings");
    let ratio = latency_us.median / rtt_us.median;
    let report = Report {
        size: o.size,
        members: MEMBERS.len(),
        secs: o.secs,
        throughput,
        latency_us,
        rtt_us,
        latency_over_rtt: ratio,
        bar_throughput: 200_000.0,
        bar_latency_over_rtt: 3.0,
        met: throughput.median >= 200_000.0 && ratio <= 3.0,
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "tether bench group: {} members on loopback, {} B messages, {} runs of {} s",
        report.members, o.size, o.runs, o.secs
    );
    println!(
        "  ordered messages/s (slowest member): median {:.0}, min {:.0}, max {:.0} (bar: >= 200,000)",
        throughput.median, throughput.min, throughput.max
    );
    println!(
        "  delivery latency: median {:.1} us, p99 {:.1} us, min {:.1}, max {:.1} ({} deliveries)",
        latency_us.median, latency_us.p99, latency_us.min, latency_us.max, latency_us.n
    );
    println!(
        "  8 B round trip, same runs: median {:.1} us, p99 {:.1} us, min {:.1}, max {:.1}",
        rtt_us.median, rtt_us.p99, rtt_us.min, rtt_us.max
    );
    println!(
        "  latency / round trip: {ratio:.2}x (bar: <= 3x); bar {}",
        if report.met { "met" } else { "not met" }
    );
    Ok(())
}
