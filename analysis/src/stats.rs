//! Percentiles, medians and the six-number summary of a metric.

/// The `p`-th percentile (0..=100) of `values`, with numpy's default linear interpolation
/// (`numpy.percentile(values, p)`, method `"linear"`), which is what vLLM reports.
///
/// `values` need not be sorted. An empty slice, or a NaN `p`, gives 0; `p` is clamped to
/// `0..=100`.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let sorted = sorted_copy(values);
    percentile_sorted(&sorted, p)
}

/// The median of `values` as `numpy.median` computes it: the middle value, or the mean of
/// the two middle values. An empty slice gives 0.
pub fn median(values: &[f64]) -> f64 {
    let sorted = sorted_copy(values);
    median_sorted(&sorted)
}

/// `values` sorted ascending (NaNs last, by `f64::total_cmp`).
pub(crate) fn sorted_copy(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    v
}

/// [`percentile`] of an already sorted slice.
pub(crate) fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 0 || p.is_nan() {
        return 0.0;
    }
    let q = p.clamp(0.0, 100.0) / 100.0;
    let (lo, hi, gamma) = virtual_index(n as u64, q);
    // `lo` and `hi` are below `n`, so they fit in usize.
    lerp(sorted[lo as usize], sorted[hi as usize], gamma)
}

/// numpy's linear-method indexing for `n > 0` values at quantile `q` in `[0, 1]`: the two
/// neighbouring 0-based ranks and the interpolation weight of the upper one.
pub(crate) fn virtual_index(n: u64, q: f64) -> (u64, u64, f64) {
    let last = n - 1;
    let virtual_idx = last as f64 * q;
    if virtual_idx >= last as f64 {
        return (last, last, 0.0);
    }
    let floor = virtual_idx.floor();
    let gamma = virtual_idx - floor;
    // 0 <= floor < last, so the conversion is exact.
    let lo = floor as u64;
    (lo, lo + 1, gamma)
}

/// numpy's `_lerp`: `a + (b - a) * t`, computed from the nearer end for accuracy.
pub(crate) fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if t >= 0.5 {
        b - diff * (1.0 - t)
    } else {
        a + diff * t
    }
}

/// [`median`] of an already sorted slice.
pub(crate) fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Replaces a non-finite value by 0 (JSON cannot hold NaN or infinities).
pub(crate) fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// `num / den`, or 0 when the quotient is not finite (for example a zero duration).
pub(crate) fn ratio(num: f64, den: f64) -> f64 {
    finite(num / den)
}

/// Mean, median, standard deviation and the 90th, 95th and 99th percentiles of a metric,
/// in milliseconds (computed by [`crate::latency::LatencyAccumulator::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MetricStats {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

#[cfg(test)]
impl MetricStats {
    /// Exact statistics of `values_s` (seconds), reported in milliseconds as vLLM does
    /// (`np.mean(values) * 1000` and so on); an empty set gives all zeros. The reference the
    /// tests hold the collector's histogram-based statistics against.
    pub fn from_seconds(values_s: &[f64]) -> Self {
        if values_s.is_empty() {
            return MetricStats::default();
        }
        use statrs::statistics::Statistics;

        let sorted = sorted_copy(values_s);
        MetricStats {
            mean: finite(Statistics::mean(values_s) * 1000.0),
            median: finite(median_sorted(&sorted) * 1000.0),
            std: finite(Statistics::population_std_dev(values_s) * 1000.0),
            p90: finite(percentile_sorted(&sorted, 90.0) * 1000.0),
            p95: finite(percentile_sorted(&sorted, 95.0) * 1000.0),
            p99: finite(percentile_sorted(&sorted, 99.0) * 1000.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values worked out by hand from numpy's definition: virtual index
    // (n - 1) * p / 100 on the sorted data, linear interpolation between neighbours.

    #[test]
    fn percentile_matches_numpy_linear() {
        let a = [1.0, 2.0, 3.0, 4.0];
        // np.percentile([1, 2, 3, 4], 50) == 2.5 (index 1.5)
        assert_eq!(percentile(&a, 50.0), 2.5);
        // index 2.7 -> 3 + 0.7 * (4 - 3)
        assert_eq!(percentile(&a, 90.0), 3.7);
        // index 2.97 -> 3.97
        assert!((percentile(&a, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&a, 0.0), 1.0);
        assert_eq!(percentile(&a, 100.0), 4.0);

        let b = [50.0, 15.0, 40.0, 20.0, 35.0]; // unsorted on purpose
                                                // np.percentile([15, 20, 35, 40, 50], 30) == 23.0 (index 1.2: 20 + 0.2 * 15)
        assert!((percentile(&b, 30.0) - 23.0).abs() < 1e-12);
        // index 1.6: 20 + 0.6 * 15 == 29.0
        assert!((percentile(&b, 40.0) - 29.0).abs() < 1e-12);
        // index 2.0 exactly: 35.0
        assert_eq!(percentile(&b, 50.0), 35.0);
        // index 3.8: 40 + 0.8 * 10 == 48.0
        assert!((percentile(&b, 95.0) - 48.0).abs() < 1e-12);

        // np.percentile([0, 10], 25) == 2.5
        assert_eq!(percentile(&[0.0, 10.0], 25.0), 2.5);
        // one value: every percentile is that value
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        // np.percentile(np.arange(1, 11), 99) == 9.91 (index 8.91)
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((percentile(&ten, 99.0) - 9.91).abs() < 1e-12);
        // np.percentile(np.arange(1, 11), 95) == 9.55
        assert!((percentile(&ten, 95.0) - 9.55).abs() < 1e-12);
        // np.percentile(np.arange(1, 11), 90) == 9.1
        assert!((percentile(&ten, 90.0) - 9.1).abs() < 1e-12);
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[1.0, 2.0], f64::NAN), 0.0);
        assert_eq!(percentile(&[1.0, 2.0], 150.0), 2.0);
        assert_eq!(percentile(&[1.0, 2.0], -5.0), 1.0);
    }

    #[test]
    fn median_matches_numpy() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        // np.median([1, 2, 3, 4]) == 2.5
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn metric_stats_population_std_and_ms() {
        // seconds 0.1, 0.2, 0.3, 0.4: mean 250 ms, np.std (ddof=0) = sqrt(0.0125) s
        let s = MetricStats::from_seconds(&[0.4, 0.1, 0.3, 0.2]);
        assert!((s.mean - 250.0).abs() < 1e-9);
        assert!((s.median - 250.0).abs() < 1e-9);
        assert!((s.std - 0.0125f64.sqrt() * 1000.0).abs() < 1e-9);
        assert!((s.p90 - 370.0).abs() < 1e-9);
        assert!((s.p99 - 397.0).abs() < 1e-9);
        assert_eq!(MetricStats::from_seconds(&[]), MetricStats::default());
        assert_eq!(MetricStats::from_seconds(&[0.5]).std, 0.0);
    }
}
