//! Expert routing: how many distinct experts a step's tokens touch, which decides the
//! expert weights a decode step reads.
//!
//! Each token picks `k` of `E` routed experts. With uniform routing (Vidur's and BLIS's
//! assumption) `T` tokens touch `E (1 - (1 - k/E)^T)` experts on average. Real routers are
//! skewed: a few experts take much of the traffic, so a batch touches fewer of them. The
//! skew knob (`cost.moe_routing_skew`, `s >= 0`) ranks expert popularity as Zipf's law,
//! `p_i ∝ i^-s`; a token picks expert `i` with probability `q_i = min(1, k p_i)`, and `T`
//! tokens touch `sum_i 1 - (1 - q_i)^T` experts. `s = 0` is uniform routing exactly.
//!
//! In: the model's `E` and `k`, the skew. Out: [`Routing::distinct`] for any token count:
//! a closed form when uniform; under skew a table for whole counts up to
//! [`TABLE_TOKENS`] (what decode steps have) and a geometric grid beyond (16 points per
//! doubling, interpolated: the count is smooth and concave in the tokens), built once.

use std::sync::Arc;

/// Whole token counts whose distinct experts a skewed [`Routing`] tabulates.
pub const TABLE_TOKENS: usize = 1024;

/// The routing of one model's MoE layers.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    experts: f64,
    top_k: f64,
    /// `ln(1 - q_i)` per expert (`None`: uniform routing, a closed form).
    ln_miss: Option<Arc<[f64]>>,
    /// Under skew, the distinct experts of 0..=TABLE_TOKENS tokens.
    table: Option<Arc<[f64]>>,
    /// Under skew, the distinct experts of `TABLE_TOKENS x 2^(j / 16)` tokens.
    grid: Option<Arc<[f64]>>,
}

/// Grid points per doubling beyond the table.
const PER_DOUBLING: f64 = 16.0;

/// Doublings the grid spans beyond the table (to 2^34 tokens; beyond, the last point).
const DOUBLINGS: usize = 24;

impl Routing {
    /// Routing of `top_k` of `experts` experts with Zipf exponent `skew` (0: uniform).
    pub fn new(experts: u32, top_k: u32, skew: f64) -> Self {
        let e = experts.max(1);
        let k = f64::from(top_k.clamp(1, e));
        let ln_miss = (skew > 0.0).then(|| {
            let weights: Vec<f64> = (1..=e).map(|i| f64::from(i).powf(-skew)).collect();
            let total: f64 = weights.iter().sum();
            weights
                .iter()
                .map(|w| {
                    let q = (k * w / total).min(1.0);
                    // A certain pick never misses: ln 0 is -inf, exp(-inf x T) is 0.
                    (1.0 - q).ln()
                })
                .collect()
        });
        let table = ln_miss.as_ref().map(|ln: &Arc<[f64]>| {
            (0..=TABLE_TOKENS)
                .map(|t| sum_touched(ln, t as f64))
                .collect()
        });
        let grid = ln_miss.as_ref().map(|ln: &Arc<[f64]>| {
            (0..=DOUBLINGS * PER_DOUBLING as usize)
                .map(|j| sum_touched(ln, grid_tokens(j as f64)))
                .collect()
        });
        Routing {
            experts: f64::from(e),
            top_k: k,
            ln_miss,
            table,
            grid,
        }
    }

    /// Expected distinct experts `tokens` tokens touch (at least `k` for any token; 0 for
    /// none).
    pub fn distinct(&self, tokens: f64) -> f64 {
        if tokens <= 0.0 {
            return 0.0;
        }
        match (&self.ln_miss, &self.table, &self.grid) {
            (Some(ln), Some(table), Some(grid)) => {
                let whole = tokens as usize;
                match table.get(whole) {
                    Some(&d) if whole as f64 == tokens => d,
                    Some(_) => sum_touched(ln, tokens),
                    None => {
                        // Between grid points j and j + 1, linear in log2(tokens).
                        let x = (tokens / TABLE_TOKENS as f64).log2() * PER_DOUBLING;
                        let j = (x.floor() as usize).min(grid.len() - 1);
                        let (a, b) = (grid[j], grid[(j + 1).min(grid.len() - 1)]);
                        a + (b - a) * (x - j as f64).clamp(0.0, 1.0)
                    }
                }
            }
            _ => self.experts * (1.0 - (1.0 - self.top_k / self.experts).powf(tokens)),
        }
    }
}

/// Tokens of grid point `j`.
fn grid_tokens(j: f64) -> f64 {
    TABLE_TOKENS as f64 * (j / PER_DOUBLING).exp2()
}

/// `sum_i 1 - (1 - q_i)^T` from the `ln(1 - q_i)`.
fn sum_touched(ln_miss: &[f64], tokens: f64) -> f64 {
    ln_miss.iter().map(|l| 1.0 - (l * tokens).exp()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_routing_is_the_closed_form_and_skew_touches_fewer() {
        let uniform = Routing::new(256, 8, 0.0);
        // One token: its k experts; 64 tokens: 256 (1 - (31/32)^64) = 222.6.
        assert!((uniform.distinct(1.0) - 8.0).abs() < 1e-9);
        assert!((uniform.distinct(64.0) - 256.0 * (1.0 - (31.0f64 / 32.0).powi(64))).abs() < 1e-9);
        // A vanishing skew approaches the closed form.
        let tiny = Routing::new(256, 8, 1e-9);
        assert!((tiny.distinct(64.0) - uniform.distinct(64.0)).abs() < 1e-3);
        // Skewed routing touches fewer experts at every batch, and all of them eventually.
        let skewed = Routing::new(256, 8, 1.0);
        // The table and the sum agree, and fractional counts fall between whole ones.
        assert_eq!(
            skewed.distinct(64.0),
            sum_touched(skewed.ln_miss.as_ref().unwrap(), 64.0)
        );
        assert!(skewed.distinct(64.5) > skewed.distinct(64.0));
        assert!(skewed.distinct(64.5) < skewed.distinct(65.0));
        // Beyond the table the grid's interpolation is within 0.1 experts of the sum.
        for t in [1500.0, 5000.0, 77_777.0] {
            let exact = sum_touched(skewed.ln_miss.as_ref().unwrap(), t);
            assert!(
                (skewed.distinct(t) - exact).abs() < 0.1,
                "{t}: {} vs {exact}",
                skewed.distinct(t)
            );
        }
        for t in [1.0, 4.0, 16.0, 64.0, 256.0] {
            assert!(skewed.distinct(t) < uniform.distinct(t) + 1e-9, "{t}");
        }
        assert!(skewed.distinct(1e7) > 255.9);
        assert_eq!(skewed.distinct(0.0), 0.0);
        // A token's hottest experts are certain picks when k p_i >= 1.
        let hot = Routing::new(8, 2, 3.0);
        assert!(hot.distinct(1.0) <= 2.0 + 1e-9);
    }
}
