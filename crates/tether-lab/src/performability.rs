//! `tether model`: the performability model of Kaur [AMVIA] chapter 4 (a
//! Markov reward model of a messaging protocol broken into its components,
//! giving response time and throughput against each component's failure
//! rate, validated against fault injection), built for tether's request
//! and reply: a continuous-time Markov chain whose states are where a
//! round trip stands, whose rates come from tether's own measurements, and
//! whose accumulated reward is the round trip's time (and, as a second
//! reward, the datagrams sent again).
//!
//! **The chain.** A round trip is two legs, the request and the reply, each
//! one datagram. Leg `l`, attempt `k` (`Leg(l, k)`): the datagram is on its
//! way. With probability `1 - p` (the wire's loss rate per datagram) it
//! arrives after the one-way time `L` and the chain moves on (the reply
//! leg, or the end); with probability `p` it is lost and the sender's
//! timer fires after `RTO_k`, when attempt `k + 1` begins. The holding
//! time is the mean of the two, `(1 - p) L + p RTO_k`, and the exits are
//! split by those probabilities: a chain of exponential holding times with
//! these means has the same mean time to absorption as the real one (mean
//! value analysis, [AMVIA] section 4.4), which is what the model predicts.
//! `RTO_k` is tether's timer (`rtt.rs`): `srtt + max(4 rttvar, 100 us)`
//! doubled `k` times, clamped to the configured floor and ceiling, with
//! `rttvar` taken as small (a steady path): `srtt + 100 us`. That is the
//! timer tether should have on a steady path; `tether model` also
//! predicts with the timer each lossy run ended with (`Rates::timer_us`),
//! which tells how much of the difference is the timer's.
//!
//! Two more components fail and are repaired:
//!
//! - **the engine** (engine mode), at rate `lambda_e`: from any leg the
//!   chain goes to `EngineDown(l)` for the measured recovery time, then the
//!   leg starts again (a restored engine sends what was unacknowledged);
//! - **a rail**, at rate `lambda_r` each: with one rail the leg waits in
//!   `RailDown(l)` for the link's repair; with two, for the failover
//!   (the path judged down and the data moved), and for the repair only if
//!   the other rail fails meanwhile.
//!
//! The mean time to absorption `m` solves `Q_TT m = -1` (`Q_TT`: the
//! generator restricted to the transient states), by LU decomposition
//! (nalgebra); the datagrams sent again solve the same system with the
//! loss exits' rates as the reward.
//!
//! That chain starts with everything up and covers failures that strike
//! while the round trip is under way. A round trip that begins at a
//! random moment may also find something down already: a second Markov
//! reward model, of the components alone (the engine up or down; one rail
//! up or down; two rails both up, one failing over, one left, none), gives
//! the stationary probability of each state (`pi Q = 0`, solved the same
//! way) and, as each state's reward, how long a round trip beginning in
//! it waits before it can go. The prediction is the sum of the two; the
//! engine and the rails are taken as independent (their overlap is of
//! second order in the failure rates).

use nalgebra::{DMatrix, DVector};
use serde::Serialize;

/// What the chain is built from: measured, configured or assumed.
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    /// One leg's time, request or reply: half the error-free round trip.
    pub leg_us: f64,
    /// The smoothed round trip the timer starts from.
    pub srtt_us: f64,
    /// The timer as measured instead (an endpoint's `base_rto`, variance
    /// and clamp included), when the prediction takes it from a run;
    /// `None`: `srtt + 100 us`, a steady path's.
    pub timer_us: Option<f64>,
    /// The timer's floor and ceiling (`Config::rto_min`, `rto_max`).
    pub rto_min_us: f64,
    pub rto_max_us: f64,
    /// The probability that a datagram is lost.
    pub loss: f64,
    /// Engine failures a second (0: embedded) and the time from one to the
    /// stream moving again.
    pub engine_failures_per_s: f64,
    pub engine_recovery_us: f64,
    /// Rails, each failing this often, and how long a failed one takes to
    /// come back; with two, how long moving to the other takes.
    pub rails: usize,
    pub rail_failures_per_s: f64,
    pub rail_repair_us: f64,
    pub failover_us: f64,
}

/// What the chain predicts for one round trip.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Prediction {
    /// The mean round trip: `underway_us + waiting_us`.
    pub response_us: f64,
    /// Of it, the round trip begun with everything up (failures striking
    /// while it is under way included).
    pub underway_us: f64,
    /// Of it, the mean wait of a round trip begun at a random moment for
    /// what is down then.
    pub waiting_us: f64,
    /// One request outstanding at a time: round trips a second.
    pub throughput_per_s: f64,
    /// Datagrams sent again per round trip.
    pub resent: f64,
}

/// Attempts of a leg the chain tells apart; the last repeats itself (its
/// probability, `p^ATTEMPTS`, is below 1e-30 at p = 0.1).
const ATTEMPTS: usize = 32;

/// The floor of the timer's variance term (`rtt.rs`, `MIN_VARIANCE_NS`).
const MIN_VARIANCE_US: f64 = 100.0;

impl Rates {
    /// The timer before attempt `k + 1`, after `k` expiries.
    pub fn rto_us(&self, k: usize) -> f64 {
        let estimate = self.timer_us.unwrap_or(self.srtt_us + MIN_VARIANCE_US);
        (estimate * 2f64.powi(k.min(16) as i32)).clamp(self.rto_min_us, self.rto_max_us)
    }
}

/// The states, numbered: the legs' attempts, then each leg's engine-down
/// and rail-down states (and, with two rails, both-down).
struct Layout {
    two_rails: bool,
}

impl Layout {
    fn leg(&self, l: usize, k: usize) -> usize {
        l * ATTEMPTS + k
    }
    fn engine_down(&self, l: usize) -> usize {
        2 * ATTEMPTS + l
    }
    fn rail_down(&self, l: usize) -> usize {
        2 * ATTEMPTS + 2 + l
    }
    fn both_down(&self, l: usize) -> usize {
        2 * ATTEMPTS + 4 + l
    }
    fn len(&self) -> usize {
        2 * ATTEMPTS + if self.two_rails { 6 } else { 4 }
    }
}

/// Solve the chain of `r`.
pub fn predict(r: &Rates) -> anyhow::Result<Prediction> {
    anyhow::ensure!((0.0..1.0).contains(&r.loss), "a loss rate in [0, 1)");
    anyhow::ensure!(r.leg_us > 0.0 && r.rto_min_us > 0.0, "positive times");
    anyhow::ensure!(matches!(r.rails, 1 | 2), "one rail or two");
    let positive = |v: f64| v.is_finite() && v > 0.0;
    anyhow::ensure!(
        positive(r.engine_recovery_us) && positive(r.rail_repair_us) && positive(r.failover_us),
        "positive, finite repair times"
    );
    anyhow::ensure!(
        r.engine_failures_per_s.is_finite()
            && r.engine_failures_per_s >= 0.0
            && r.rail_failures_per_s.is_finite()
            && r.rail_failures_per_s >= 0.0,
        "failure rates of zero or more"
    );
    let at = Layout { two_rails: r.rails == 2 };
    let n = at.len();
    let mut q = DMatrix::<f64>::zeros(n, n);
    // The second reward: datagrams sent again, earned on the loss exits.
    let mut resent_rate = DVector::<f64>::zeros(n);
    let p = r.loss;
    let (lambda_e, lambda_r) = (r.engine_failures_per_s / 1e6, r.rail_failures_per_s / 1e6);
    // Any of the rails carrying the leg failing: one rail, or the active one of two.
    for l in 0..2 {
        for k in 0..ATTEMPTS {
            let i = at.leg(l, k);
            let hold = (1.0 - p) * r.leg_us + p * r.rto_us(k);
            let out = 1.0 / hold;
            // Arrived: the reply leg, or absorbed (no column: the end).
            if l == 0 {
                q[(i, at.leg(1, 0))] += (1.0 - p) * out;
            }
            // Lost: the next attempt (the last repeats itself: no self-loop
            // in a generator, its holding time stands for the repeats).
            let next = at.leg(l, (k + 1).min(ATTEMPTS - 1));
            if next != i {
                q[(i, next)] += p * out;
            }
            resent_rate[i] = p * out;
            // Where it stays when it is lost at the last attempt: the exit
            // to absorption then comes at (1 - p) of the rate only.
            let leave = if next == i { (1.0 - p) * out } else { out };
            q[(i, i)] -= leave;
            if lambda_e > 0.0 {
                q[(i, at.engine_down(l))] += lambda_e;
                q[(i, i)] -= lambda_e;
            }
            if lambda_r > 0.0 {
                q[(i, at.rail_down(l))] += lambda_r;
                q[(i, i)] -= lambda_r;
            }
        }
        // The engine restored: the leg begins again.
        if lambda_e > 0.0 {
            let d = at.engine_down(l);
            q[(d, at.leg(l, 0))] += 1e0 / r.engine_recovery_us;
            q[(d, d)] -= 1e0 / r.engine_recovery_us;
        } else {
            q[(at.engine_down(l), at.engine_down(l))] = -1.0;
        }
        let d = at.rail_down(l);
        if r.rails == 1 {
            q[(d, at.leg(l, 0))] += 1.0 / r.rail_repair_us;
            q[(d, d)] -= 1.0 / r.rail_repair_us;
        } else {
            // Moved to the other rail after the failover, unless that one
            // fails too first; then wait for a repair.
            q[(d, at.leg(l, 0))] += 1.0 / r.failover_us;
            q[(d, d)] -= 1.0 / r.failover_us;
            if lambda_r > 0.0 {
                q[(d, at.both_down(l))] += lambda_r;
                q[(d, d)] -= lambda_r;
            }
            let b = at.both_down(l);
            q[(b, at.leg(l, 0))] += 1.0 / r.rail_repair_us;
            q[(b, b)] -= 1.0 / r.rail_repair_us;
        }
    }
    let lu = q.clone().lu();
    let minus_one = DVector::<f64>::from_element(n, -1.0);
    let m = lu.solve(&minus_one).ok_or_else(|| anyhow::anyhow!("the chain has no absorbing way out"))?;
    let resent = lu.solve(&(-resent_rate)).ok_or_else(|| anyhow::anyhow!("the chain has no way out"))?;
    let underway_us = m[at.leg(0, 0)];
    let waiting_us = waiting(r)?;
    let response_us = underway_us + waiting_us;
    Ok(Prediction {
        response_us,
        underway_us,
        waiting_us,
        throughput_per_s: 1e6 / response_us,
        resent: resent[at.leg(0, 0)],
    })
}

/// The stationary distribution of the generator `q` (`pi q = 0`, summing
/// to one).
fn stationary(q: &DMatrix<f64>) -> anyhow::Result<DVector<f64>> {
    let n = q.nrows();
    let mut a = q.transpose();
    // One balance equation is implied by the others: its row becomes the
    // normalisation.
    for j in 0..n {
        a[(n - 1, j)] = 1.0;
    }
    let mut b = DVector::<f64>::zeros(n);
    b[n - 1] = 1.0;
    a.lu().solve(&b).ok_or_else(|| anyhow::anyhow!("the components' chain has no stationary distribution"))
}

/// The mean wait, before it can go, of a round trip begun at a random
/// moment: the components' stationary probabilities times each state's
/// wait (exponential repairs: what is left of one is its whole mean).
fn waiting(r: &Rates) -> anyhow::Result<f64> {
    let (le, lr) = (r.engine_failures_per_s / 1e6, r.rail_failures_per_s / 1e6);
    let (rec, rep, fo) = (r.engine_recovery_us, r.rail_repair_us, r.failover_us);
    let mut wait = 0.0;
    if le > 0.0 {
        let q = DMatrix::from_row_slice(2, 2, &[-le, le, 1.0 / rec, -1.0 / rec]);
        wait += stationary(&q)?[1] * rec;
    }
    if lr > 0.0 && r.rails == 1 {
        let q = DMatrix::from_row_slice(2, 2, &[-lr, lr, 1.0 / rep, -1.0 / rep]);
        wait += stationary(&q)?[1] * rep;
    } else if lr > 0.0 {
        // Both up; one failed, the data moving to the other; one left;
        // none (the first repaired rail takes the data after a failover).
        let (a, f, t) = (lr, 1.0 / fo, 1.0 / rep);
        #[rustfmt::skip]
        let q = DMatrix::from_row_slice(4, 4, &[
            -2.0 * a, 2.0 * a,       0.0,     0.0,
            t,        -(f + a + t),  f,       a,
            t,        0.0,           -(t + a), a,
            0.0,      2.0 * t,       0.0,     -2.0 * t,
        ]);
        let pi = stationary(&q)?;
        wait += pi[1] * fo + pi[3] * (rep / 2.0 + fo);
    }
    Ok(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(loss: f64) -> Rates {
        Rates {
            leg_us: 15.0,
            srtt_us: 30.0,
            timer_us: None,
            rto_min_us: 1000.0,
            rto_max_us: 250_000.0,
            loss,
            engine_failures_per_s: 0.0,
            engine_recovery_us: 3000.0,
            rails: 1,
            rail_failures_per_s: 0.0,
            rail_repair_us: 1e6,
            failover_us: 3000.0,
        }
    }

    /// Without failures the chain is two legs; with loss alone, each leg is
    /// a sum over attempts that can be written out: the chain must agree.
    #[test]
    fn the_chain_agrees_with_the_sums_it_stands_for() {
        let free = predict(&rates(0.0)).unwrap();
        assert!((free.response_us - 30.0).abs() < 1e-6, "{free:?}");
        assert!(free.resent.abs() < 1e-9);
        for p in [1e-3, 1e-2, 0.1, 0.3] {
            let r = rates(p);
            // E[leg] = sum_k p^k ((1-p) L + p RTO_k); E[resent] = sum_k p^(k+1).
            let leg: f64 =
                (0..200).map(|k| p.powi(k as i32) * ((1.0 - p) * r.leg_us + p * r.rto_us(k))).sum();
            let again: f64 = (1..200).map(|k| p.powi(k)).sum();
            let got = predict(&r).unwrap();
            assert!(
                (got.response_us - 2.0 * leg).abs() / (2.0 * leg) < 1e-9,
                "p {p}: {got:?} against {}",
                2.0 * leg
            );
            assert!((got.resent - 2.0 * again).abs() < 1e-9, "p {p}: {got:?}");
        }
    }

    #[test]
    fn failures_cost_what_their_repairs_take_and_a_second_rail_saves_most() {
        let base = predict(&rates(0.0)).unwrap().response_us;
        // An engine failing 10 times a second, 3 ms each: a 30 us round trip
        // meets one with probability about 30e-6 * 10 * 2 legs... tiny.
        // Under way: each leg begins again after a failure, L (1 + lambda R)
        // each; begun at a random moment: down with probability
        // lambda R / (1 + lambda R), for R.
        let engine = Rates { engine_failures_per_s: 10.0, ..rates(0.0) };
        let e = predict(&engine).unwrap();
        let lr = 10.0 / 1e6 * 3000.0;
        assert!((e.underway_us - base * (1.0 + lr)).abs() < 1e-6, "{e:?}");
        assert!((e.waiting_us - lr / (1.0 + lr) * 3000.0).abs() < 1e-6, "{e:?}");
        assert!((e.response_us - e.underway_us - e.waiting_us).abs() < 1e-9);
        let one = Rates { rail_failures_per_s: 100.0, ..rates(0.0) };
        let two = Rates { rails: 2, ..one.clone() };
        let (one, two) = (predict(&one).unwrap().response_us, predict(&two).unwrap().response_us);
        assert!(base < two && two < one, "{base} < {two} < {one}");
        // One rail failing 100 times a second, each repair a second: down
        // u / (1 + u) of the time (u = 100); a round trip begun then waits
        // the repair.
        let u = 100.0 / 1e6 * 1e6;
        let want = u / (1.0 + u) * 1e6;
        let got = predict(&Rates { rail_failures_per_s: 100.0, ..rates(0.0) }).unwrap().waiting_us;
        assert!((got - want).abs() / want < 1e-9, "{got} against {want}");
    }
}
