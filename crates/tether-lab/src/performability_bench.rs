//! `tether model`: the performability model (`performability`, Kaur
//! [AMVIA] chapter 4) with its rates measured in the same run, its
//! predicted round trip set against the one measured under the same fault
//! rates (the validation of [AMVIA] section 4.7: fault injection against
//! the model), then what it predicts where this machine cannot measure:
//! engine and rail failures, embedded against engine mode, one rail
//! against two.
//!
//! Measured here: the error-free round trip (`tether pingpong` on
//! loopback: its mean is the two legs, and the smoothed RTT the timer
//! starts from) and, at each fault rate, the round trip with each datagram
//! dropped as it is sent with that probability. Taken from tether's other
//! measurements (defaults, with where they come from): the engine's
//! recovery time and the round trip's cost through engines, the rails'
//! failover time. Assumed: how long a failed link takes to come back.

use serde::Serialize;

use crate::args;
use crate::net::NetOpts;
use crate::performability::{predict, Prediction, Rates};
use crate::pingpong;
use crate::summary::Summary;

#[derive(Debug, Clone, clap::Args)]
pub struct ModelOpts {
    /// Fault rates to validate at, comma-separated: the probability that a
    /// datagram is dropped as it is sent (the campaigns' grid).
    #[arg(long, value_delimiter = ',', default_values_t = [1e-4, 1e-3, 1e-2, 1e-1], allow_negative_numbers = true,
          value_parser = args::rate)]
    pub rates: Vec<f64>,
    /// Message size in bytes (one datagram: the chain's legs are one each).
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true, value_parser = args::size(8))]
    pub size: usize,
    /// Round trips a measurement.
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(100, 10_000_000, "round trips", ""))]
    pub count: u64,
    /// Measurements at each rate: the median of their means is the figure.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 100, "runs", ""))]
    pub runs: usize,
    /// From an engine's failure to the stream moving again, ms [default:
    /// `tether campaign --engine --classes kill`, 1 KiB every 200 us,
    /// median recovery on 2026-12-02].
    #[arg(long, default_value_t = 3.016, allow_negative_numbers = true, value_parser = positive_ms)]
    pub engine_recovery_ms: f64,
    /// The round trip through engines against embedded [default: `tether
    /// bench engine`, 8 B, 2026-12-02].
    #[arg(long, default_value_t = 2.49, allow_negative_numbers = true, value_parser = positive_ms)]
    pub engine_rtt_ratio: f64,
    /// From a rail's failure to the data moving to the other, ms [default:
    /// the two-rail cut test's median gap, docs/RESULTS.md "Rails"].
    #[arg(long, default_value_t = 2.642, allow_negative_numbers = true, value_parser = positive_ms)]
    pub failover_ms: f64,
    /// How long a failed link takes to come back, ms (assumed: a link
    /// reset or a cable replugged).
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true, value_parser = positive_ms)]
    pub rail_repair_ms: f64,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

fn positive_ms(text: &str) -> Result<f64, String> {
    let v: f64 = text.trim().parse().map_err(|_| "not a number".to_string())?;
    if !(v.is_finite() && v > 0.0 && v <= 3.6e6) {
        return Err("must be above 0 and at most an hour".into());
    }
    Ok(v)
}

/// The bar: predicted within this much of measured at every rate.
pub const WITHIN: f64 = 0.15;

/// One fault rate: the chain's round trip and the measured one.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub rate: f64,
    pub predicted_us: f64,
    /// The median over runs of each run's mean round trip, with the runs'
    /// least and most.
    pub measured_us: f64,
    pub measured_min_us: f64,
    pub measured_max_us: f64,
    /// (predicted - measured) / measured.
    pub difference: f64,
    pub predicted_resent: f64,
    /// The measuring endpoint's smoothed round trip at the end of the
    /// lossy runs (median): what its timer started from by then.
    pub srtt_end_us: f64,
    /// Its timer without back-off at the end of the lossy runs (median).
    pub timer_end_us: f64,
    /// The prediction with each run's own end timer in place of the
    /// steady path's (median over runs), and its difference.
    pub predicted_with_timer_us: f64,
    pub difference_with_timer: f64,
}

/// A what-if: the setting, the failure rate, and the prediction.
#[derive(Debug, Clone, Serialize)]
pub struct WhatIf {
    pub setting: &'static str,
    pub failures_per_s: f64,
    pub loss: f64,
    pub prediction: Prediction,
}

#[derive(Debug, Serialize)]
pub struct ModelReport {
    pub size: usize,
    pub count: u64,
    /// The error-free round trip measured (median of the runs' means).
    pub free_rtt_us: f64,
    pub rates: Rates,
    pub checks: Vec<Check>,
    pub worst_difference: f64,
    pub within_bar: bool,
    pub engine: Vec<WhatIf>,
    pub rails: Vec<WhatIf>,
}

/// One pingpong of `o` (its `run`-th seed): its mean round trip, and the
/// endpoint's smoothed round trip and timer at the end.
fn measure(o: &NetOpts, count: u64, run: usize) -> anyhow::Result<(f64, f64, f64)> {
    let o = NetOpts { seed: o.seed + run as u64, ..o.clone() };
    let r = pingpong::reliable_loopback(&o, count)?;
    anyhow::ensure!(r.corrupted == 0, "{} round trips came back corrupted", r.corrupted);
    Ok((r.rtt_us.mean, r.srtt_us.unwrap_or(f64::NAN), r.rto_us.unwrap_or(f64::NAN)))
}

pub fn run(o: &ModelOpts, net: NetOpts, tell: &dyn Fn(&str)) -> anyhow::Result<ModelReport> {
    anyhow::ensure!(
        o.size + 64 <= net.mtu,
        "--size {} does not fit one datagram of {} B: the chain's legs are one datagram each",
        o.size,
        net.mtu
    );
    let net = NetOpts { size: o.size, ..net };
    let config = net.config();
    let rates = |free_us: f64| Rates {
        leg_us: free_us / 2.0,
        srtt_us: free_us,
        timer_us: None,
        rto_min_us: config.rto_min.as_secs_f64() * 1e6,
        rto_max_us: config.rto_max.as_secs_f64() * 1e6,
        loss: 0.0,
        engine_failures_per_s: 0.0,
        engine_recovery_us: o.engine_recovery_ms * 1e3,
        rails: 1,
        rail_failures_per_s: 0.0,
        rail_repair_us: o.rail_repair_ms * 1e3,
        failover_us: o.failover_ms * 1e3,
    };
    // Each lossy run beside an error-free one, in turn first, and each
    // prediction from its own pair's error-free round trip: this machine's
    // speed drifts within minutes by more than a low rate's effect.
    let (mut checks, mut frees) = (Vec::new(), Vec::new());
    for &rate in &o.rates {
        tell(&format!("round trips at rate {rate}, and without errors"));
        let lossy = NetOpts { faults: vec![format!("drop:p={rate},side=send")], ..net.clone() };
        let (mut predicted, mut measured, mut srtt, mut resent) = (Vec::new(), Vec::new(), Vec::new(), 0.0);
        let (mut timers, mut with_timer) = (Vec::new(), Vec::new());
        for run in 0..o.runs {
            let ((free, _, _), (got, s, timer)) = if run % 2 == 0 {
                let free = measure(&net, o.count, run)?;
                (free, measure(&lossy, o.count, run)?)
            } else {
                let got = measure(&lossy, o.count, run)?;
                (measure(&net, o.count, run)?, got)
            };
            frees.push(free);
            let p = predict(&Rates { loss: rate, ..rates(free) })?;
            predicted.push(p.response_us);
            // The datagrams resent depend on the loss alone.
            resent = p.resent;
            measured.push(got);
            srtt.push(s);
            if timer.is_finite() {
                timers.push(timer);
                with_timer
                    .push(predict(&Rates { loss: rate, timer_us: Some(timer), ..rates(free) })?.response_us);
            }
        }
        let t = Summary::of(&with_timer);
        let (p, m) = (Summary::of(&predicted).expect("runs"), Summary::of(&measured).expect("runs"));
        checks.push(Check {
            rate,
            predicted_us: p.median,
            measured_us: m.median,
            measured_min_us: m.min,
            measured_max_us: m.max,
            difference: (p.median - m.median) / m.median,
            predicted_resent: resent,
            srtt_end_us: Summary::of(&srtt).map_or(f64::NAN, |s| s.median),
            timer_end_us: Summary::of(&timers).map_or(f64::NAN, |s| s.median),
            predicted_with_timer_us: t.as_ref().map_or(f64::NAN, |t| t.median),
            difference_with_timer: t.map_or(f64::NAN, |t| (t.median - m.median) / m.median),
        });
    }
    let free = Summary::of(&frees).expect("at least one rate");
    let rates = rates(free.median);
    let worst_difference = checks.iter().map(|c| c.difference.abs()).fold(0.0, f64::max);
    // Embedded against engine mode: the engine's legs are longer and the
    // engine fails; the application's own process is not modelled (it
    // fails embedded and attached alike).
    let engine_legs = Rates {
        leg_us: rates.leg_us * o.engine_rtt_ratio,
        srtt_us: rates.srtt_us * o.engine_rtt_ratio,
        ..rates.clone()
    };
    let mut engine = Vec::new();
    for loss in [0.0, 1e-3] {
        engine.push(WhatIf {
            setting: "embedded",
            failures_per_s: 0.0,
            loss,
            prediction: predict(&Rates { loss, ..rates.clone() })?,
        });
        for f in [0.0, 0.1, 1.0, 10.0, 100.0] {
            let r = Rates { loss, engine_failures_per_s: f, ..engine_legs.clone() };
            engine.push(WhatIf { setting: "engine", failures_per_s: f, loss, prediction: predict(&r)? });
        }
    }
    let mut rails = Vec::new();
    for f in [0.01, 0.1, 1.0, 10.0] {
        for (setting, n) in [("one rail", 1), ("two rails", 2)] {
            let r = Rates { rails: n, rail_failures_per_s: f, ..rates.clone() };
            rails.push(WhatIf { setting, failures_per_s: f, loss: 0.0, prediction: predict(&r)? });
        }
    }
    Ok(ModelReport {
        size: o.size,
        count: o.count,
        free_rtt_us: free.median,
        rates,
        checks,
        worst_difference,
        within_bar: worst_difference <= WITHIN,
        engine,
        rails,
    })
}

pub fn print(r: &ModelReport, o: &ModelOpts) {
    println!(
        "tether model (Kaur [AMVIA] chapter 4): a round trip of {} B as a Markov chain, its rates measured here: error-free round trip {:.2} us (median of the error-free runs' means, {} beside each rate), timer {}..{} us from srtt + 100 us",
        r.size, r.free_rtt_us, o.runs, r.rates.rto_min_us, r.rates.rto_max_us
    );
    println!("\npredicted against measured (each datagram dropped as it is sent with the rate's probability; {} round trips a run):", r.count);
    println!(
        "{:>8}  {:>14}  {:>26}  {:>10}  {:>14}  {:>14}  {:>14}  {:>22}",
        "rate",
        "predicted us",
        "measured us (min-max)",
        "difference",
        "resent / trip",
        "srtt at end us",
        "timer at end us",
        "with that timer us (%)"
    );
    for c in &r.checks {
        println!(
            "{:>8}  {:>14.2}  {:>26}  {:>9.1}%  {:>14.4}  {:>14.1}  {:>15.1}  {:>22}",
            c.rate,
            c.predicted_us,
            format!("{:.2} ({:.2}-{:.2})", c.measured_us, c.measured_min_us, c.measured_max_us),
            c.difference * 100.0,
            c.predicted_resent,
            c.srtt_end_us,
            c.timer_end_us,
            format!("{:.2} ({:+.1}%)", c.predicted_with_timer_us, c.difference_with_timer * 100.0)
        );
    }
    println!(
        "worst difference {:.1}% (bar: within {:.0}% at every rate): {}",
        r.worst_difference * 100.0,
        WITHIN * 100.0,
        if r.within_bar { "met" } else { "missed" }
    );
    println!(
        "\nembedded against engine mode (the engine's round trip {:.2}x embedded, recovery {} ms; predicted round trip us, round trips a second):",
        o.engine_rtt_ratio, o.engine_recovery_ms
    );
    for w in &r.engine {
        println!(
            "  loss {:>6}  {:>8}  {:>6} failures/s  {:>10.2} us  {:>10.0}/s",
            w.loss, w.setting, w.failures_per_s, w.prediction.response_us, w.prediction.throughput_per_s
        );
    }
    println!(
        "\none rail against two (failover {} ms, a failed link back after {} ms; no loss):",
        o.failover_ms, o.rail_repair_ms
    );
    for w in &r.rails {
        println!(
            "  {:>9}  {:>6} failures/s a rail  {:>10.2} us  {:>10.0}/s",
            w.setting, w.failures_per_s, w.prediction.response_us, w.prediction.throughput_per_s
        );
    }
}
