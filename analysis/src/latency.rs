//! [`LatencyAccumulator`]: the statistics of a latency metric in constant memory, from an
//! HDR histogram plus exact integer sums.

use hdrhistogram::Histogram;

use crate::stats::{finite, lerp, virtual_index, MetricStats};

/// Significant decimal digits kept by the histograms.
const SIGFIG: u8 = 3;

/// The values of one latency metric (nanoseconds): TTFT, TPOT, E2EL, queueing delay or the
/// pooled inter-token gaps, overall or of one class.
///
/// Its memory does not grow with the number of values, only (logarithmically) with their
/// range. Percentiles come from the histogram (3 significant digits: relative error below
/// 0.1 %), interpolated between ranks the way numpy interpolates; the mean and standard
/// deviation come from exact integer sums of the values shifted by the first value (so the
/// variance suffers no cancellation).
pub(crate) struct LatencyAccumulator {
    hist: Histogram<u64>,
    count: u64,
    shift: u64,
    min: u64,
    max: u64,
    /// Sum of `gap - shift`.
    sum_d: i128,
    /// Sum of `(gap - shift)^2`.
    sum_d2: u128,
    /// An exact sum overflowed (needs more than ~10^20 values); fall back to the histogram.
    overflowed: bool,
}

impl std::fmt::Debug for LatencyAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyAccumulator")
            .field("count", &self.count)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl LatencyAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        // An auto-resizing histogram with 3 significant digits is always a valid
        // configuration (sigfig must be at most 5), so this cannot fail.
        let hist = Histogram::new(SIGFIG).expect("3 significant digits is a valid configuration");
        LatencyAccumulator {
            hist,
            count: 0,
            shift: 0,
            min: 0,
            max: 0,
            sum_d: 0,
            sum_d2: 0,
            overflowed: false,
        }
    }

    /// Number of values recorded.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Length of the histogram's array of counts: what its memory grows with.
    #[cfg(test)]
    pub fn histogram_slots(&self) -> usize {
        self.hist.distinct_values()
    }

    /// Records one value (nanoseconds).
    pub fn record(&mut self, ns: u64) {
        if self.count == 0 {
            self.shift = ns;
            self.min = ns;
            self.max = ns;
        }
        self.count += 1;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
        // The histogram grows as needed; only values beyond its reach (~146 years) fail,
        // and those are clamped.
        if self.hist.record(ns).is_err() {
            self.hist.saturating_record(ns);
        }
        if self.overflowed {
            return;
        }
        let d = i128::from(ns) - i128::from(self.shift);
        let abs = d.unsigned_abs();
        // |d| < 2^64, so |d|^2 < 2^128 fits.
        let d2 = abs * abs;
        match (self.sum_d.checked_add(d), self.sum_d2.checked_add(d2)) {
            (Some(s1), Some(s2)) => {
                self.sum_d = s1;
                self.sum_d2 = s2;
            }
            _ => self.overflowed = true,
        }
    }

    /// Records several values (nanoseconds).
    pub fn record_all(&mut self, values_ns: &[u64]) {
        for &v in values_ns {
            self.record(v);
        }
    }

    /// Exact mean (ns).
    fn mean_ns(&self) -> f64 {
        if self.overflowed {
            return self.hist.mean();
        }
        self.shift as f64 + self.sum_d as f64 / self.count as f64
    }

    /// Exact population standard deviation (ns).
    fn std_ns(&self) -> f64 {
        if self.overflowed {
            return self.hist.stdev();
        }
        let n = u128::from(self.count);
        let s1_abs = self.sum_d.unsigned_abs();
        // n^2 * variance = n * sum(d^2) - sum(d)^2, an exact non-negative integer.
        let exact = n
            .checked_mul(self.sum_d2)
            .zip(s1_abs.checked_mul(s1_abs))
            .map(|(a, b)| a.saturating_sub(b));
        let nf = self.count as f64;
        let var = match exact {
            Some(num) => num as f64 / (nf * nf),
            None => {
                let m = self.sum_d as f64 / nf;
                (self.sum_d2 as f64 / nf - m * m).max(0.0)
            }
        };
        var.sqrt()
    }

    /// The value of 0-based rank `k` (`k < count`) in sorted order, as the histogram knows it:
    /// the middle of its bucket, clamped to the exact minimum and maximum.
    fn value_at_rank(&self, k: u64) -> f64 {
        let mut seen = 0u64;
        for v in self.hist.iter_recorded() {
            seen += v.count_at_value();
            if seen > k {
                let mid = self.hist.median_equivalent(v.value_iterated_to());
                return mid.clamp(self.min, self.max) as f64;
            }
        }
        self.max as f64
    }

    /// The `p`-th percentile (ns), interpolated between ranks as numpy does.
    fn percentile_ns(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let (lo, hi, gamma) = virtual_index(self.count, p / 100.0);
        let a = self.value_at_rank(lo);
        let b = if hi == lo { a } else { self.value_at_rank(hi) };
        lerp(a, b, gamma)
    }

    /// Statistics in milliseconds; all zeros when nothing was recorded.
    pub fn stats(&self) -> MetricStats {
        if self.count == 0 {
            return MetricStats::default();
        }
        let ms = |ns: f64| finite(ns / 1e6);
        MetricStats {
            mean: ms(self.mean_ns()),
            median: ms(self.percentile_ns(50.0)),
            std: ms(self.std_ns()),
            p90: ms(self.percentile_ns(90.0)),
            p95: ms(self.percentile_ns(95.0)),
            p99: ms(self.percentile_ns(99.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use statrs::statistics::Statistics;

    use super::*;
    use crate::stats::{median, percentile};

    /// A small deterministic generator (xorshift64*), to avoid a dependency.
    fn gaps(n: usize) -> Vec<u64> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
                // Mostly 5..25 ms decode gaps, with a tail of long stalls.
                if r.is_multiple_of(50) {
                    50_000_000 + r % 400_000_000
                } else {
                    5_000_000 + r % 20_000_000
                }
            })
            .collect()
    }

    #[test]
    fn histogram_percentiles_within_a_tenth_of_a_percent() {
        let g = gaps(200_000);
        let mut acc = LatencyAccumulator::new();
        // Record in uneven chunks, as requests report them.
        for chunk in g.chunks(37) {
            acc.record_all(chunk);
        }
        assert_eq!(acc.count(), g.len() as u64);
        let exact: Vec<f64> = g.iter().map(|&x| x as f64 / 1e6).collect();
        let s = acc.stats();
        let close = |got: f64, want: f64| {
            assert!(((got - want) / want).abs() < 1e-3, "got {got}, want {want}");
        };
        close(s.median, median(&exact));
        close(s.p90, percentile(&exact, 90.0));
        close(s.p95, percentile(&exact, 95.0));
        close(s.p99, percentile(&exact, 99.0));
        // Mean and std are exact (up to f64 rounding).
        let mean = Statistics::mean(&exact);
        let std = Statistics::population_std_dev(&exact);
        assert!(
            ((s.mean - mean) / mean).abs() < 1e-12,
            "{} vs {mean}",
            s.mean
        );
        assert!(((s.std - std) / std).abs() < 1e-9, "{} vs {std}", s.std);
    }

    #[test]
    fn small_sets_interpolate_like_numpy() {
        let mut acc = LatencyAccumulator::new();
        acc.record_all(&[1_000_000, 3_000_000]);
        let s = acc.stats();
        // np.median([1, 3]) == 2 ms; the histogram buckets are far narrower than 0.1 %.
        assert!((s.median - 2.0).abs() < 2e-3);
        assert!((s.mean - 2.0).abs() < 1e-12);
        assert!((s.std - 1.0).abs() < 1e-12);

        // Values below 2048 ns are stored exactly.
        let mut acc = LatencyAccumulator::new();
        acc.record_all(&[100, 200, 300, 400]);
        let s = acc.stats();
        assert!((s.p90 - 370.0 / 1e6).abs() < 1e-15);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(LatencyAccumulator::new().stats(), MetricStats::default());
    }
}
