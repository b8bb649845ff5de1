//! Medians, extremes and percentiles of repeated measurements: the machine
//! is shared and noisy, so every figure is reported as a distribution.

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub p99: f64,
    pub mean: f64,
    pub n: usize,
}

impl Summary {
    /// `None` for an empty sample.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some(Summary {
            median: at(0.5),
            min: v[0],
            max: v[v.len() - 1],
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            n: v.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_statistics() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.mean, s.n), (3.0, 1.0, 5.0, 3.0, 5));
        assert!(Summary::of(&[]).is_none());
    }
}
