//! Step costs from measured operator times ([`ProfiledCosts`], `[cost] operator_profile`):
//! what Vidur and LLMServingSim price steps with. Where a profile of the model on the GPU
//! exists (LLMServingSim's profiler for vLLM, read by [`crate::observed::operator_profile`]),
//! the cost model takes a layer's linear layers, element-wise kernels and attention, and the
//! LM head and sampler, from it by interpolation ([`grid::Grid`]); the all-reduces, pipeline
//! hand-offs, KV block moves and the framework's CPU time stay on the roofline, which the
//! profile does not measure.
//!
//! Attention is measured as one kernel over one prefill chunk (with its cached KV) and `n`
//! decodes of equal context. A step's chunks are summed into one chunk whose cached length
//! gives the same attended pairs (several fresh prompts attend fewer pairs than one chunk of
//! their length: the prefill's share of the time is scaled down instead), and its decodes
//! take their mean context, one query each: the profile's `skew*.csv` corrections for
//! unequal contexts are not applied, nor is a speculative verify's extra queries' cost.
//!
//! In: an [`OperatorProfile`] and the step's sizes; out: seconds per layer or per step.

pub mod grid;

use std::path::PathBuf;

use grid::Grid;

use crate::observed::operator_profile::{OperatorProfile, LAYER_OPS, STEP_OPS};

/// Interpolated operator times of one model on one GPU at one tensor-parallel degree.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfiledCosts {
    /// The folder the times came from.
    pub dir: PathBuf,
    /// Linear layers of one layer, by tokens.
    linear: Vec<Grid>,
    /// Element-wise kernels of one layer and how often each runs, by tokens.
    elementwise: Vec<(Grid, f64)>,
    /// Kernels run once a step, by tokens.
    per_step: Vec<Grid>,
    /// One layer's attention: prefill chunk, its cached KV, decodes, their KV.
    attention: Grid,
    /// LM head and sampler, by sequences sampled.
    head: Vec<Grid>,
}

fn grid1(rows: &[(u32, f64)]) -> Grid {
    let rows: Vec<_> = rows.iter().map(|&(n, t)| (vec![f64::from(n)], t)).collect();
    // The reader rejects repeated sizes.
    Grid::new(1, &rows).unwrap_or_else(|_| unreachable!("sizes are unique"))
}

impl ProfiledCosts {
    /// Builds the interpolation tables of a checked profile.
    pub fn new(p: &OperatorProfile) -> ProfiledCosts {
        let linear = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"];
        let mut out = ProfiledCosts {
            dir: p.dir.clone(),
            linear: Vec::new(),
            elementwise: Vec::new(),
            per_step: Vec::new(),
            attention: Grid::new(4, &[]).unwrap_or_else(|_| unreachable!("no rows")),
            head: p.per_sequence.values().map(|r| grid1(r)).collect(),
        };
        for (op, rows) in &p.dense {
            let g = grid1(rows);
            if linear.contains(&op.as_str()) {
                out.linear.push(g);
            } else if STEP_OPS.contains(&op.as_str()) {
                out.per_step.push(g);
            } else if LAYER_OPS.contains(&op.as_str()) {
                // Two RMSNorms a layer: before attention and before the MLP.
                let times = if op == "layernorm" { 2.0 } else { 1.0 };
                out.elementwise.push((g, times));
            }
        }
        let rows: Vec<_> = p
            .attention
            .iter()
            .map(|&(k, t)| (k.iter().map(|&x| f64::from(x)).collect(), t))
            .collect();
        out.attention = Grid::new(4, &rows).unwrap_or_else(|_| unreachable!("points are unique"));
        out
    }

    /// One layer's linear layers over `tokens` tokens.
    pub fn linear_s(&self, tokens: f64) -> f64 {
        self.linear.iter().map(|g| g.at(&[tokens])).sum()
    }

    /// One layer's element-wise kernels (norms, RoPE, activation) over `tokens` tokens.
    pub fn elementwise_s(&self, tokens: f64) -> f64 {
        self.elementwise
            .iter()
            .map(|(g, n)| n * g.at(&[tokens]))
            .sum()
    }

    /// The kernels run once a step (embedding, final norm) over `tokens` tokens.
    pub fn per_step_s(&self, tokens: f64) -> f64 {
        self.per_step.iter().map(|g| g.at(&[tokens])).sum()
    }

    /// One layer's attention over `chunk` prefill tokens that attend `attended` query-key
    /// pairs in all, and `decodes` decodes of `decode_ctx` tokens of context in all.
    pub fn attention_s(&self, chunk: f64, attended: f64, decodes: f64, decode_ctx: f64) -> f64 {
        if chunk <= 0.0 && decodes <= 0.0 {
            return 0.0;
        }
        let context = if decodes > 0.0 {
            decode_ctx / decodes
        } else {
            0.0
        };
        // The cached length that makes one chunk attend as many pairs as the step's chunks.
        let cached = if chunk > 0.0 {
            attended / chunk - (chunk + 1.0) / 2.0
        } else {
            0.0
        };
        if cached >= 0.0 {
            return self.attention.at(&[chunk, cached, decodes, context]);
        }
        // Several fresh prompts attend fewer pairs than one chunk of their summed length:
        // the prefill's share of the time shrinks in proportion.
        let whole = self.attention.at(&[chunk, 0.0, decodes, context]);
        let prefill = self.attention.at(&[chunk, 0.0, 0.0, 0.0]);
        let share = attended / (chunk * (chunk + 1.0) / 2.0);
        (whole - (1.0 - share) * prefill).max(0.0)
    }

    /// The LM head and sampler over `samples` sequences.
    pub fn head_s(&self, samples: f64) -> f64 {
        if samples <= 0.0 {
            return 0.0;
        }
        self.head.iter().map(|g| g.at(&[samples])).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn profile() -> OperatorProfile {
        let ops = |names: &[&str], t: f64| -> BTreeMap<String, Vec<(u32, f64)>> {
            names
                .iter()
                .map(|n| (n.to_string(), vec![(1, t), (100, 10.0 * t)]))
                .collect()
        };
        OperatorProfile {
            dir: PathBuf::from("p"),
            model: "m".into(),
            gpu: "g".into(),
            hardware: None,
            variant: None,
            vllm_version: None,
            tp: 1,
            dense: ops(
                &[
                    "qkv_proj",
                    "o_proj",
                    "gate_up_proj",
                    "down_proj",
                    "layernorm",
                    "embedding",
                ],
                1e-6,
            ),
            attention: vec![
                ([16, 0, 0, 0], 10e-6),
                ([16, 64, 0, 0], 20e-6),
                ([0, 0, 1, 16], 5e-6),
                ([0, 0, 2, 16], 6e-6),
                ([16, 0, 1, 16], 12e-6),
            ],
            per_sequence: ops(&["lm_head", "sampler"], 100e-6),
        }
    }

    #[test]
    fn sums_each_family() {
        let c = ProfiledCosts::new(&profile());
        assert!((c.linear_s(1.0) - 4e-6).abs() < 1e-15);
        // layernorm runs twice a layer.
        assert!((c.elementwise_s(100.0) - 20e-6).abs() < 1e-15);
        assert!((c.per_step_s(1.0) - 1e-6).abs() < 1e-15);
        assert!((c.head_s(1.0) - 200e-6).abs() < 1e-15);
        assert_eq!(c.head_s(0.0), 0.0);
    }

    #[test]
    fn attention_maps_a_step_onto_the_grid() {
        let c = ProfiledCosts::new(&profile());
        // One 16-token chunk from scratch attends 16 * 17 / 2 pairs.
        assert!((c.attention_s(16.0, 136.0, 0.0, 0.0) - 10e-6).abs() < 1e-12);
        // With 64 cached tokens: 16 * 64 more pairs.
        assert!((c.attention_s(16.0, 136.0 + 1024.0, 0.0, 0.0) - 20e-6).abs() < 1e-12);
        // Two decodes of 16 tokens each.
        assert!((c.attention_s(0.0, 0.0, 2.0, 32.0) - 6e-6).abs() < 1e-12);
        assert!((c.attention_s(16.0, 136.0, 1.0, 16.0) - 12e-6).abs() < 1e-12);
        assert_eq!(c.attention_s(0.0, 0.0, 0.0, 0.0), 0.0);
        // Two fresh 8-token prompts attend 2 x 36 = 72 pairs, about half of one 16-token
        // chunk's 136: half the prefill's time.
        let t = c.attention_s(16.0, 72.0, 0.0, 0.0);
        assert!((t - 10e-6 * 72.0 / 136.0).abs() < 1e-12, "{t}");
    }
}
