//! Where a lost datagram's time goes in a round trip: the measurement
//! behind the performability model's missed bar (Kaur [AMVIA] chapter 4;
//! `tether model`, docs/RESULTS.md "The performability model").
//!
//! Two endpoints on loopback, each dropping datagrams it sends with
//! probability P, exchange N round trips of 1 KiB (after 100 to warm up).
//! For each round trip it records the time, and the requester's timeouts,
//! probes and retransmissions during it, and its timer before it. It
//! prints the round trips with a timeout against the timer they waited
//! for, the round trips after one, and the extra time by kind of round
//! trip.
//!
//! ```sh
//! cargo run --release -p tether-lab --example loss_anatomy -- 0.01 20000
//! ```

// A measurement on real sockets and the wall clock, in a thread of its own.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tether::{Endpoint, Options};
use tether_fault::FaultPlan;

const WARMUP: usize = 100;

/// One round trip: its time, and what the requester's core did in it.
#[derive(Clone, Copy)]
struct Trip {
    us: f64,
    timeouts: u64,
    retransmits: u64,
    probes: u64,
    spurious: u64,
    /// The requester's timer (no back-off) before the round trip.
    timer_us: f64,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (n, sum) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    sum / n.max(1) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let p: f64 = args.next().map_or(Ok(0.01), |s| s.parse())?;
    let n: usize = args.next().map_or(Ok(20_000), |s| s.parse())?;
    let rule = format!("drop:p={p},side=send");
    let options = |seed| -> Result<Options, Box<dyn std::error::Error>> {
        Ok(Options { faults: FaultPlan::parse_rules(seed, &[rule.as_str()])?, ..Options::default() })
    };
    let any = || "127.0.0.1:0".parse().expect("an address");
    let (a, b) = (Endpoint::udp(1, any(), &[], options(1)?)?, Endpoint::udp(2, any(), &[], options(2)?)?);
    a.add_peer(2, b.local_addr().ok_or("UDP has an address")?)?;
    b.add_peer(1, a.local_addr().ok_or("UDP has an address")?)?;
    let limit = Some(Duration::from_secs(10));
    let echo = std::thread::spawn(move || -> Result<tether::Stats, tether::Error> {
        for _ in 0..n + WARMUP {
            let d = b.recv(limit)?;
            b.send_blocking(1, &d.message, limit)?;
        }
        // The last reply's acknowledgement, before the counters are read.
        std::thread::sleep(Duration::from_millis(200));
        Ok(b.stats())
    });
    let msg = vec![7u8; 1024];
    let mut trips = Vec::with_capacity(n);
    for i in 0..n + WARMUP {
        let (before, timer_us) = (a.stats(), a.base_rto(2).map_or(0.0, |t| t.as_secs_f64() * 1e6));
        let t = Instant::now();
        a.send_blocking(2, &msg, limit)?;
        a.recv(limit)?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        let after = a.stats();
        if i >= WARMUP {
            trips.push(Trip {
                us,
                timeouts: after.timeouts - before.timeouts,
                retransmits: after.retransmits - before.retransmits,
                probes: after.probes_sent - before.probes_sent,
                spurious: after.spurious_timeouts - before.spurious_timeouts,
                timer_us,
            });
        }
    }
    let bs = echo.join().map_err(|_| "the echo thread panicked")??;
    let s = a.stats();
    let mut sorted: Vec<f64> = trips.iter().map(|t| t.us).collect();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!(
        "loss {p}, {n} round trips of 1 KiB: mean {:.1} us, median {median:.1} us",
        mean(trips.iter().map(|t| t.us))
    );
    for (who, st) in [("requester", &s), ("echo", &bs)] {
        println!(
            "  {who}: timeouts {}, of them spurious {}, retransmits {}, probes {}",
            st.timeouts, st.spurious_timeouts, st.retransmits, st.probes_sent
        );
    }
    let lossy: Vec<&Trip> = trips.iter().filter(|t| t.timeouts > 0).collect();
    let mut timers: Vec<f64> = lossy.iter().map(|t| t.timer_us).collect();
    timers.sort_by(f64::total_cmp);
    if let (Some(lo), Some(hi)) = (timers.first(), timers.last()) {
        println!(
            "round trips with a timeout: {}; the timer before them: mean {:.0} us (min {lo:.0}, median {:.0}, max {hi:.0}); the round trip less that timer: mean {:.0} us",
            lossy.len(),
            mean(timers.iter().copied()),
            timers[timers.len() / 2],
            mean(lossy.iter().map(|t| t.us - t.timer_us))
        );
    }
    for k in 1..=4 {
        // The k-th round trip after one with a timeout, none in between.
        let after: Vec<f64> = trips
            .windows(k + 1)
            .filter(|w| w[0].timeouts > 0 && w[1..].iter().all(|t| t.timeouts == 0))
            .map(|w| w[k].us)
            .collect();
        println!(
            "  round trip {k} after it: mean {:.1} us ({:+.1} over the median; {} of them)",
            mean(after.iter().copied()),
            mean(after.iter().copied()) - median,
            after.len()
        );
    }
    // The time over the median, by kind of round trip.
    let mut kinds = BTreeMap::<String, (usize, f64)>::new();
    for t in &trips {
        let kind = match (t.us < 100.0, t.timeouts) {
            (true, _) => "under 100 us".to_string(),
            (false, 0) => "100 us or more, no timeout".to_string(),
            (false, k) => format!(
                "{k} timeout(s): {} retransmitted, {} probes, {} spurious",
                t.retransmits, t.probes, t.spurious
            ),
        };
        let e = kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 += t.us - median;
    }
    println!("time over the median, by kind of round trip:");
    for (kind, (count, extra)) in kinds {
        println!(
            "  {kind:48} {count:6} round trips, {extra:9.0} us in all, {:7.1} us each",
            extra / count as f64
        );
    }
    Ok(())
}
