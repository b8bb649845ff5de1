//! Many seeds per fault mix: every run must end with zero violations of the
//! guarantees, and where no link dies and no node restarts, with every
//! message delivered. A failure prints the seed to replay it.

use tether_sim::{replay_line, swarm, FaultMix, SimReport};

/// Seeds per mix: 23 message mixes x 100 = 2300 runs per `cargo test`
/// (the calls mix has a test of its own, below).
const SEEDS: u64 = 100;

fn check_mix(mix: FaultMix) -> Vec<SimReport> {
    let reports = swarm(mix, 0..SEEDS, |_| {});
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
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        reports.len(),
        failures.join("\n")
    );
    reports
}

#[test]
fn clean() {
    let r = check_mix(FaultMix::Clean);
    assert!(r.iter().all(|r| r.retransmits == 0), "no faults, no retransmission");
}

#[test]
fn loss_20pct() {
    let r = check_mix(FaultMix::Loss20);
    assert!(r.iter().all(|r| r.links.faults.dropped > 0 && r.retransmits > 0));
}

#[test]
fn heavy_reorder() {
    let r = check_mix(FaultMix::HeavyReorder);
    // Every datagram delayed 0-400 us on a 20 us link, nothing lost: at
    // most 1% of data frames go again (issue 14's bar; a count of later
    // segments acknowledged resent each about thirteen times).
    let resent: u64 = r.iter().map(|r| r.stats.retransmits).sum();
    let first: u64 = r.iter().map(|r| r.stats.data_frames_sent - r.stats.retransmits).sum();
    assert!(resent * 100 <= first, "{resent} resends of {first} data frames under reordering alone");
}

#[test]
fn duplicate() {
    let r = check_mix(FaultMix::Duplicate);
    assert!(r.iter().map(|r| r.duplicates_discarded).sum::<u64>() > 0);
    assert!(r.iter().all(|r| r.retransmits == 0), "duplication alone loses nothing");
}

#[test]
fn corrupt() {
    let r = check_mix(FaultMix::Corrupt);
    assert!(r.iter().all(|r| r.links.faults.modified > 0));
    assert!(r.iter().map(|r| r.checksum_failures).sum::<u64>() > 0);
}

#[test]
fn dead_link() {
    let r = check_mix(FaultMix::DeadLink);
    // The cut streams fail their tail; every other stream delivers in full.
    assert!(r.iter().all(|r| r.failed > 0 && r.links.cut > 0), "the cut must bite in every run");
}

#[test]
fn flaky() {
    check_mix(FaultMix::Flaky);
}

#[test]
fn go_back_n() {
    check_mix(FaultMix::GoBackN);
}

#[test]
fn restart() {
    let r = check_mix(FaultMix::Restart);
    assert!(r.iter().map(|r| r.stale_dropped + r.failed + r.lost_in_crash).sum::<u64>() > 0);
}

#[test]
fn tight() {
    let r = check_mix(FaultMix::Tight);
    assert!(r.iter().all(|r| r.retransmits > 0), "faults and tiny windows force repair");
    // The slow reader fills delivery queues: data is refused, not acknowledged, and resent.
    assert!(r.iter().map(|r| r.stats.out_of_window).sum::<u64>() > 0, "the commit point must push back");
}

#[test]
fn every_fault() {
    let r = check_mix(FaultMix::Every);
    let faults = r.iter().fold(tether_fault::FaultCounters::default(), |mut sum, r| {
        sum.accumulate(&r.links.faults);
        sum
    });
    // Each message fault kind of Li et al. [CI] struck, and all were masked.
    for kind in tether_fault::FaultKind::MESSAGE {
        assert!(faults.of(kind) > 0, "{} never struck: {faults:?}", kind.name());
    }
    assert!(r.iter().map(|r| r.duplicates_discarded).sum::<u64>() > 0);
    assert!(r.iter().map(|r| r.checksum_failures).sum::<u64>() > 0);
}

// Multi-rail mixes (two rails between every pair of nodes): a rail cut,
// both cut in turn, a flapping rail, a lossy rail, striping, a restart.

#[test]
fn rail_cut() {
    // A surviving rail: every message delivered (check_mix demands it),
    // and the dead rail's data moved.
    let r = check_mix(FaultMix::RailCut);
    assert!(r.iter().all(|r| r.links.cut > 0 && r.stats.failovers > 0), "the cut must bite and fail over");
}

#[test]
fn rails_both_cut() {
    let r = check_mix(FaultMix::RailsBothCut);
    // With no rail left the cut streams fail their tail, reported exactly
    // (the checker's delivered-or-reported rule), the others deliver.
    assert!(r.iter().all(|r| r.failed > 0), "losing both rails must fail messages");
    assert!(r.iter().all(|r| r.stats.failovers > 0), "the first cut fails over to the second rail");
}

#[test]
fn rail_flap() {
    let r = check_mix(FaultMix::RailFlap);
    let failovers = r.iter().map(|r| r.stats.failovers).sum::<u64>();
    assert!(failovers >= 100, "flaps move data back and forth: {failovers} failovers");
}

#[test]
fn rail_lossy_30pct() {
    let r = check_mix(FaultMix::RailLossy);
    assert!(r.iter().all(|r| r.retransmits > 0));
}

#[test]
fn rail_stripe_cut() {
    check_mix(FaultMix::RailStripe);
}

#[test]
fn rail_restart() {
    let r = check_mix(FaultMix::RailRestart);
    assert!(r.iter().map(|r| r.stale_dropped + r.failed + r.lost_in_crash).sum::<u64>() > 0);
}

#[test]
fn restart_ack_loss() {
    // A receiver restarts while all it sends is lost: no message reaches
    // both of its incarnations (check_mix's checker refuses that, keyed
    // by incarnation), none is reported certainly lost that arrived. The
    // case really struck: messages the old incarnation took and never
    // acknowledged were reported in doubt.
    let r = check_mix(FaultMix::RestartAckLoss);
    assert!(r.iter().all(|r| r.links.cut > 0), "node 1's ACKs were cut in every run");
    let in_doubt: u64 = r.iter().map(|r| r.in_doubt_delivered).sum();
    assert!(in_doubt > 0, "the old incarnation took messages whose ACKs were lost");
}

#[test]
fn soft_state_loss() {
    // Engines rebuilt from hard state mid-stream, under loss, reordering
    // and duplication: every message delivered exactly once, in order
    // (check_mix demands it), and the losses really struck.
    let r = check_mix(FaultMix::SoftStateLoss);
    assert!(r.iter().all(|r| r.soft_losses >= 4), "every run loses soft state at least 4 times");
    assert!(r.iter().map(|r| r.retransmits).sum::<u64>() > 0);
}

#[test]
fn rail_faults() {
    // Message faults on every rail's interface, and a rail cut: every
    // message delivered (check_mix demands it), the faults struck.
    let r = check_mix(FaultMix::RailFaults);
    assert!(r.iter().all(|r| r.links.faults.dropped > 0 && r.links.faults.modified > 0));
    assert!(r.iter().map(|r| r.checksum_failures).sum::<u64>() > 0);
    assert!(r.iter().all(|r| r.stats.failovers > 0), "the cut rail fails over");
}

#[test]
fn swarm_of_worlds() {
    // Each seed its own world; worlds where nothing can legitimately fail
    // must deliver everything (check_mix), the others report exactly.
    let r = check_mix(FaultMix::Swarm);
    let distinct: std::collections::BTreeSet<_> = r.iter().map(|r| r.config.split(' ').nth(2)).collect();
    assert!(distinct.len() >= 3, "worlds differ in size: {distinct:?}");
}

/// Calls through the real core while the server node crashes and restarts
/// on its log (issue 15), at 120 seeds: no call ran twice, every call
/// ended, and every final state is true of its handler (the checks are the
/// run's violations). Before the log was kept across a restart, seed 0
/// already had a call run twice.
#[test]
fn calls_server_crash() {
    let reports = swarm(FaultMix::CallsServerCrash, 0..120, |_| {});
    let failures: Vec<String> = reports
        .iter()
        .filter(|r| !r.ok() || r.delivered != r.sent)
        .map(|r| format!("{}: {:?}", replay_line(r), &r.violations[..r.violations.len().min(3)]))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let calls: Vec<_> = reports.iter().map(|r| r.calls.expect("a calls run reports its calls")).collect();
    let sum = |f: fn(&tether_sim::calls::CallsReport) -> u64| calls.iter().map(f).sum::<u64>();
    let crashes: u64 = calls.iter().map(|c| u64::from(c.crashes)).sum();
    eprintln!(
        "calls_server_crash: 120 runs, {crashes} crashes, {} calls: ran {}, did not run {}, unknown {}",
        sum(|c| c.calls),
        sum(|c| c.ran),
        sum(|c| c.not_run),
        sum(|c| c.unknown)
    );
    assert!(crashes >= 120 * 4, "{crashes} crashes");
    assert!(sum(|c| c.ran) > sum(|c| c.calls) / 2, "most calls ran");
    assert!(sum(|c| c.not_run) > 0 && sum(|c| c.unknown) > 0, "every kind of end is reached");
}
