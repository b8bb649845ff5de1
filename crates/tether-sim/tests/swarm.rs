//! Every fault mix at many seeds: every run must end with zero violations
//! of the guarantees, and where no link dies and no node restarts, with
//! every message delivered. One test walks `FaultMix::ALL`, so a mix added
//! later runs too, and `expect` matches every mix without a catch-all, so
//! it cannot be added without saying what its runs must show. A failure
//! prints the seed to replay it (`tether sim --mix NAME --first-seed N
//! --seeds 1`).

use std::sync::Mutex;
use tether_sim::{replay_line, swarm, FaultMix, SimReport};

/// Seeds per mix: 31 mixes x 100, and the thousand-member mix at 4 (a
/// run takes it about 3 s; `tether sim --mix membership_1000 --seeds
/// 1000` is its full check).
const SEEDS: u64 = 100;

fn seeds(mix: FaultMix) -> u64 {
    match mix {
        FaultMix::Membership1000 => 4,
        _ => SEEDS,
    }
}

#[test]
fn every_mix_at_every_seed() {
    // The mixes share the machine's cores: each thread takes the next mix.
    let queue = Mutex::new(FaultMix::ALL.to_vec());
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let Some(mix) = queue.lock().unwrap().pop() else { return };
                let outcome = std::panic::catch_unwind(|| {
                    let reports = check_mix(mix);
                    expect(mix, &reports);
                });
                if let Err(e) = outcome {
                    let why = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    failures.lock().unwrap().push(format!("{}: {why}", mix.name()));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} mixes failed:\n{}",
        failures.len(),
        FaultMix::ALL.len(),
        failures.join("\n")
    );
}

fn check_mix(mix: FaultMix) -> Vec<SimReport> {
    let reports = swarm(mix, 0..seeds(mix), |_| {});
    // A swarm draws its world from the seed: whether it may fail too.
    let may_fail = |seed| match mix {
        FaultMix::Swarm => mix.config(seed).may_fail(),
        m => m.may_fail(),
    };
    let mut failures = Vec::new();
    for r in &reports {
        if !r.ok() {
            failures.push(format!(
                "{}: {:?}\n  {}",
                replay_line(r),
                &r.violations[..r.violations.len().min(3)],
                r.config
            ));
        } else if !may_fail(r.seed) && (r.failed > 0 || r.delivered != r.sent) {
            failures.push(format!(
                "{}: {} of {} delivered, {} failed",
                replay_line(r),
                r.delivered,
                r.sent,
                r.failed
            ));
        }
    }
    let sum = |f: fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    eprintln!(
        "{:>14}: {} runs, sent {} delivered {} failed {} in-doubt-delivered {} retransmits {} checksum failures {} dropped {} cut {}",
        mix.name(),
        reports.len(),
        sum(|r| r.sent),
        sum(|r| r.delivered),
        sum(|r| r.failed),
        sum(|r| r.in_doubt_delivered),
        sum(|r| r.retransmits),
        sum(|r| r.checksum_failures),
        sum(|r| r.links.faults.dropped),
        sum(|r| r.links.cut),
    );
    eprintln!(
        "{:>14}  NACK class: sent {} delivered {} repaired {} NACKs {} skipped {} reported lost {}",
        "",
        sum(|r| r.stats.nacked_sent),
        sum(|r| r.stats.nacked_received),
        sum(|r| r.stats.nacked_repaired),
        sum(|r| r.stats.nacks_sent),
        sum(|r| r.stats.nacked_lost),
        sum(|r| r.stats.nacked_lost_sent),
    );
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        reports.len(),
        failures.join("\n")
    );
    reports
}

/// What each mix's runs must show beyond `check_mix`'s guarantees: that
/// its faults really struck and were masked as the mix intends. No
/// catch-all arm: a new mix says here what it proves.
fn expect(mix: FaultMix, r: &[SimReport]) {
    let sum = |f: &dyn Fn(&SimReport) -> u64| r.iter().map(f).sum::<u64>();
    match mix {
        FaultMix::Clean => {
            assert!(r.iter().all(|r| r.retransmits == 0), "no faults, no retransmission");
            // The NACK-reliable class sends nothing back when nothing is lost.
            assert_eq!(sum(&|r| r.stats.nacks_sent), 0);
            assert_eq!(sum(&|r| r.stats.nacked_received), sum(&|r| r.stats.nacked_sent));
        }
        FaultMix::Loss20 => {
            assert!(r.iter().all(|r| r.links.faults.dropped > 0 && r.retransmits > 0));
            // The NACK-reliable class asked for what it missed and got it.
            assert!(sum(&|r| r.stats.nacks_sent) > 0 && sum(&|r| r.stats.nacked_repaired) > 0);
            assert_eq!(sum(&|r| r.stats.nacked_received), sum(&|r| r.stats.nacked_sent));
        }
        FaultMix::HeavyReorder => {
            // Every datagram delayed 0-400 us on a 20 us link, nothing
            // lost: at most 1% of data frames go again (the bar; a
            // count of later segments acknowledged resent each about
            // thirteen times).
            let resent = sum(&|r| r.stats.retransmits);
            let first = sum(&|r| r.stats.data_frames_sent - r.stats.retransmits);
            assert!(resent * 100 <= first, "{resent} resends of {first} data frames under reordering alone");
        }
        FaultMix::Duplicate => {
            assert!(sum(&|r| r.duplicates_discarded) > 0);
            assert!(r.iter().all(|r| r.retransmits == 0), "duplication alone loses nothing");
        }
        FaultMix::Corrupt => {
            assert!(r.iter().all(|r| r.links.faults.modified > 0));
            assert!(sum(&|r| r.checksum_failures) > 0);
        }
        // The cut streams fail their tail; every other stream delivers in full.
        FaultMix::DeadLink => {
            assert!(r.iter().all(|r| r.failed > 0 && r.links.cut > 0), "the cut must bite in every run")
        }
        FaultMix::Flaky | FaultMix::GoBackN | FaultMix::RailStripe => {}
        FaultMix::Restart | FaultMix::RailRestart => {
            assert!(sum(&|r| r.stale_dropped + r.failed + r.lost_in_crash) > 0)
        }
        FaultMix::Tight => {
            assert!(r.iter().all(|r| r.retransmits > 0), "faults and tiny windows force repair");
            // The slow reader fills delivery queues: data is refused, not
            // acknowledged, and resent.
            assert!(sum(&|r| r.stats.out_of_window) > 0, "the commit point must push back");
        }
        FaultMix::Every => {
            let faults = r.iter().fold(tether_fault::FaultCounters::default(), |mut sum, r| {
                sum.accumulate(&r.links.faults);
                sum
            });
            // Each message fault kind of Li et al. [CI] struck, and all
            // were masked.
            for kind in tether_fault::FaultKind::MESSAGE {
                assert!(faults.of(kind) > 0, "{} never struck: {faults:?}", kind.name());
            }
            assert!(sum(&|r| r.duplicates_discarded) > 0);
            assert!(sum(&|r| r.checksum_failures) > 0);
        }
        // A surviving rail: every message delivered (check_mix demands
        // it), and the dead rail's data moved.
        FaultMix::RailCut => {
            assert!(
                r.iter().all(|r| r.links.cut > 0 && r.stats.failovers > 0),
                "the cut must bite and fail over"
            )
        }
        FaultMix::RailsBothCut => {
            // With no rail left the cut streams fail their tail, reported
            // exactly (the checker's delivered-or-reported rule).
            assert!(r.iter().all(|r| r.failed > 0), "losing both rails must fail messages");
            assert!(r.iter().all(|r| r.stats.failovers > 0), "the first cut fails over to the second rail");
        }
        FaultMix::RailFlap => {
            let failovers = sum(&|r| r.stats.failovers);
            assert!(failovers >= 100, "flaps move data back and forth: {failovers} failovers");
        }
        FaultMix::RailLossy => assert!(r.iter().all(|r| r.retransmits > 0)),
        FaultMix::SoftStateLoss | FaultMix::EngineStateLoss => {
            // Engines rebuilt from hard state mid-stream, under loss,
            // reordering and duplication: every message delivered exactly
            // once, in order (check_mix demands it), and the losses struck.
            assert!(r.iter().all(|r| r.soft_losses >= 4), "every run loses soft state at least 4 times");
            assert!(sum(&|r| r.retransmits) > 0);
            // The NACK-reliable hold is soft: receivers skipped what went
            // with it, and their senders reported it lost.
            assert!(sum(&|r| r.stats.nacked_lost) > 0 && sum(&|r| r.stats.nacked_lost_sent) > 0);
        }
        FaultMix::RailFaults => {
            assert!(r.iter().all(|r| r.links.faults.dropped > 0 && r.links.faults.modified > 0));
            assert!(sum(&|r| r.checksum_failures) > 0);
            assert!(r.iter().all(|r| r.stats.failovers > 0), "the cut rail fails over");
        }
        FaultMix::RestartAckLoss => {
            // A receiver restarts while all it sends is lost: no message
            // reaches both of its incarnations, none is reported certainly
            // lost that arrived. The case really struck: messages the old
            // incarnation took and never acknowledged were reported in doubt.
            assert!(r.iter().all(|r| r.links.cut > 0), "node 1's ACKs were cut in every run");
            assert!(
                sum(&|r| r.in_doubt_delivered) > 0,
                "the old incarnation took messages whose ACKs were lost"
            );
        }
        FaultMix::Authenticated => {
            // Corrupted datagrams are refused by their MAC, not a checksum.
            assert!(sum(&|r| r.stats.mac_failures) > 0, "corruption must reach the MAC check");
            assert!(r.iter().all(|r| r.soft_losses > 0));
        }
        FaultMix::ForgedEpochs => {
            // Up to four forgeries a run (one planned past the run's last
            // datagram is not sent); each carry-over fails at most the one
            // message its point cut in two (certainly not delivered), and
            // nothing else fails.
            assert!(r.iter().all(|r| r.links.forged >= 1), "a forgery in every run");
            assert!(sum(&|r| r.links.forged) >= 3 * r.len() as u64, "most forgeries sent");
            assert_eq!(sum(&|r| r.in_doubt_delivered), 0, "no failure in doubt");
            assert!(sum(&|r| r.stats.streams_reset) > 0, "forged epochs were taken and overtaken");
            let (failed, resets) = (sum(&|r| r.failed), sum(&|r| r.stats.streams_reset));
            assert!(failed <= resets, "{failed} messages failed in {resets} resynchronisations");
        }
        FaultMix::Swarm => {
            let distinct: std::collections::BTreeSet<_> =
                r.iter().map(|r| r.config.split(' ').nth(2)).collect();
            assert!(distinct.len() >= 3, "worlds differ in size: {distinct:?}");
        }
        FaultMix::CallsServerCrash => {
            // No call ran twice, every call ended, every final state is
            // true of its handler (the run's violations, in check_mix).
            // Before the log was kept across a restart, seed 0 already had
            // a call run twice.
            let calls: Vec<_> = r.iter().map(|r| r.calls.expect("a calls run reports its calls")).collect();
            let sum = |f: fn(&tether_sim::calls::CallsReport) -> u64| calls.iter().map(f).sum::<u64>();
            let crashes: u64 = calls.iter().map(|c| u64::from(c.crashes)).sum();
            eprintln!(
                "calls_server_crash: {} runs, {crashes} crashes, {} calls: ran {}, did not run {}, unknown {}",
                r.len(),
                sum(|c| c.calls),
                sum(|c| c.ran),
                sum(|c| c.not_run),
                sum(|c| c.unknown)
            );
            assert!(crashes >= r.len() as u64 * 4, "{crashes} crashes");
            assert!(sum(|c| c.ran) > sum(|c| c.calls) / 2, "most calls ran");
            assert!(sum(|c| c.not_run) > 0 && sum(|c| c.unknown) > 0, "every kind of end is reached");
        }
        FaultMix::Membership => {
            // Crashes struck and were detected within the bound (checked
            // per run), cut members came back, and every live member ended
            // in the last view (delivered = sent, checked by check_mix).
            let crashes: u64 = r.iter().filter_map(|r| r.membership.as_ref()).map(|m| m.crashes).sum();
            let removed: usize =
                r.iter().filter_map(|r| r.membership.as_ref()).map(|m| m.removal_ms.len()).sum();
            assert!(crashes > 20 && removed as u64 == crashes, "{removed} of {crashes} crashes removed");
            let cut: u64 = r.iter().filter_map(|r| r.membership.as_ref()).map(|m| m.cut_removals).sum();
            assert!(cut > 0, "a cut member was removed and joined again in some run");
        }
        FaultMix::Membership1000 => {
            // A thousand members: every crash removed (within the bound,
            // checked per run), cut members back, and a member's load after
            // the start-up close to a small cluster's: what a member sends
            // and receives does not grow with N.
            let m: Vec<_> = r.iter().filter_map(|r| r.membership.as_ref()).collect();
            assert!(m.iter().all(|m| m.members == 1_000), "a thousand members");
            let crashes: u64 = m.iter().map(|m| m.crashes).sum();
            let removed: usize = m.iter().map(|m| m.removal_ms.len()).sum();
            assert!(crashes >= 40 && removed as u64 == crashes, "{removed} of {crashes} crashes removed");
            assert!(m.iter().map(|m| m.cut_removals).sum::<u64>() > 0, "a cut-off part removed and back");
            let small: Vec<_> = swarm(FaultMix::Membership, 0..4, |_| {});
            let small: Vec<_> = small.iter().filter_map(|r| r.membership.as_ref()).collect();
            let small_mean = small.iter().map(|m| m.load.member).sum::<f64>() / small.len() as f64;
            let small_max = small.iter().map(|m| m.load.member_max).fold(0.0, f64::max);
            for m in &m {
                // 1,000 seeds: mean 655 against 545 at 6-16 members, the
                // busiest 1,324 (a member back from the cut, catching up).
                assert!(
                    m.load.member <= 1.5 * small_mean && m.load.member_max <= 3.0 * small_max,
                    "a member's messages/s at 1,000 members: mean {:.0}, busiest {:.0}; at 6-16: {small_mean:.0}, {small_max:.0}",
                    m.load.member,
                    m.load.member_max
                );
            }
        }
        FaultMix::FabricMove | FaultMix::FabricMove1000 => fabric_moves(r, Growth::Linear),
        // Around a torus the switches within reach grow as the square of
        // the distance, and the search with them.
        FaultMix::FabricMoveTorus => fabric_moves(r, Growth::Rising),
        // Another fabric at every seed: each found again by its shortest
        // route, with no claim on how the probes grow.
        FaultMix::FabricMoveRandom => fabric_moves(r, Growth::Unclaimed),
        FaultMix::EngineKill => {
            // Every run killed an engine and started another, and the
            // applications there resumed with it (a host serves one or two
            // of the three; two kills close together may be one recovery);
            // every message delivered once, in order (check_mix). The
            // faults struck too.
            assert!(
                r.iter().all(|r| r.soft_losses >= 1 && r.engine_recoveries >= 1),
                "a kill and a resumption"
            );
            let (kills, resumed) = (sum(&|r| r.soft_losses), sum(&|r| r.engine_recoveries));
            assert!(resumed >= kills, "{resumed} resumptions after {kills} kills");
            assert!(sum(&|r| r.retransmits) > 0 && sum(&|r| r.checksum_failures) > 0);
            assert!(sum(&|r| r.duplicates_discarded) > 0);
        }
    }
}

/// How a fabric mix's probes must grow with the hops a node moved.
#[derive(PartialEq)]
enum Growth {
    /// Linearly ([TB] Table 3: "linear"), on a chain.
    Linear,
    /// With every hop.
    Rising,
    Unclaimed,
}

/// The fabric mixes: the move struck (datagrams lost on routes that led
/// nowhere), and afterwards every pair around the mover found a route
/// again on both rails, each the shortest there is, the peers' to the
/// mover as many switches long as the move took it; the probes a search
/// sent grow with those hops as `growth` says.
fn fabric_moves(r: &[SimReport], growth: Growth) {
    let mut probes_by_hops = std::collections::BTreeMap::<usize, Vec<u64>>::new();
    for run in r {
        let f = run.fabric.as_ref().expect("a fabric report");
        let &[(mover, hops, at_ms)] = &f.moves[..] else {
            panic!("seed {}: one move: {:?}", run.seed, f.moves)
        };
        assert!(f.no_such_port + f.books.no_route > 0, "seed {}: the move struck: {f:?}", run.seed);
        for rail in 0..2 {
            for (a, b) in [(0, mover), (2, mover), (mover, 0), (mover, 2)] {
                let after = f
                    .searches
                    .iter()
                    .filter(|s| s.at_ms >= at_ms && (s.node, s.peer, s.rail) == (a, b, rail));
                let found: Vec<_> = after.filter(|s| s.hops > 0).collect();
                let last = found.last().unwrap_or_else(|| {
                    panic!(
                        "seed {}: {a} found no route to {b} on rail {rail} after the move: {:?}",
                        run.seed, f.searches
                    )
                });
                assert_eq!(last.hops, last.shortest, "seed {}: a shortest route: {last:?}", run.seed);
                if a != mover {
                    assert_eq!(last.hops, hops, "seed {}: {hops} hops away: {last:?}", run.seed);
                    probes_by_hops.entry(hops).or_default().push(last.host_probes + last.switch_probes);
                }
            }
        }
    }
    let mean = |h: usize| {
        let v = &probes_by_hops[&h];
        v.iter().sum::<u64>() as f64 / v.len() as f64
    };
    eprintln!(
        "{:>14}  probes to find the moved node, by hops: {:?}",
        "",
        probes_by_hops.keys().map(|&h| (h, mean(h))).collect::<Vec<_>>()
    );
    if growth == Growth::Unclaimed {
        // A random fabric may have no switch 4 hops from node 0's.
        assert!(probes_by_hops.len() >= 3, "moves of 1 to 3 hops at least: {probes_by_hops:?}");
        return;
    }
    assert_eq!(probes_by_hops.len(), 4, "moves of 1 to 4 hops");
    let points: Vec<(f64, f64)> = (1..=4).map(|h| (h as f64, mean(h))).collect();
    assert!(points.windows(2).all(|w| w[1].1 > w[0].1), "each hop adds probes: {points:?}");
    if growth == Growth::Rising {
        return;
    }
    // Linear: a straight line through the four means explains nearly all
    // their spread (R^2 >= 0.97; the paper's 28/73/124/186 give 0.995,
    // a doubling per hop as on a fabric of host-less switches, 8/38/118/
    // 326, gives 0.87), and each hop adds probes.
    let (mx, my) = (2.5, points.iter().map(|p| p.1).sum::<f64>() / 4.0);
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let syy: f64 = points.iter().map(|(_, y)| (y - my).powi(2)).sum();
    let r2 = sxy * sxy / (sxx * syy);
    assert!(r2 >= 0.97, "probes linear in hops: R^2 {r2:.3} for {points:?}");
}
