//! Step costs from measured operator times ([`ProfiledCosts`], `[cost] operator_profile`):
//! what Vidur and LLMServingSim price steps with. Where a profile of the model on the GPU
//! exists (LLMServingSim's profiler for vLLM, read by [`crate::observed::operator_profile`]),
//! the cost model takes a layer's linear layers, element-wise kernels and attention, and the
//! LM head and sampler, from it by interpolation ([`grid::Grid`]); the all-reduces and
//! all-to-alls, a mixture of experts' router GEMM, pipeline hand-offs, KV block moves and the
//! framework's CPU time stay on the roofline, which the profile does not measure.
//!
//! Attention is measured as one kernel over one prefill chunk (with its cached KV) and `n`
//! decodes of equal context. A step's chunks are summed into one chunk whose cached length
//! gives the same attended pairs (several fresh prompts attend fewer pairs than one chunk of
//! their length: the prefill's share of the time is scaled down instead), and its decodes
//! take their mean context, one query each: the profile's `skew*.csv` corrections for
//! unequal contexts are not applied, nor is a speculative verify's extra queries' cost.
//!
//! A mixture of experts' profile times one MoE layer's routed experts by tokens and the
//! distinct experts they activate (`moe.csv`: every expert on the profiled GPU, each split as
//! the profile's tensor-parallel degree splits the attention; a deployment whose experts are
//! split otherwise is refused by the scenario checks). An
//! expert-parallel rank computes `1 / ep` of the step's token-expert pairs on `1 / ep` of the
//! experts: the time of `routed / ep` tokens on the rank's share of the distinct experts.
//! The measured kernels run eagerly, launches included, so the cost model's fitted MoE
//! floors (`moe_prefill_expert_us`, `moe_layer_us`) are not added to them.
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
    /// The attention's linear layers (Q/K/V, O) of one layer, by tokens.
    attention_linear: Vec<Grid>,
    /// The dense MLP's linear layers (gate and up, down) of one layer, by tokens (none in
    /// a mixture of experts' profile).
    mlp_linear: Vec<Grid>,
    /// One MoE layer's routed experts by tokens and activated experts (`None`: dense).
    moe: Option<Grid>,
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
        let mut out = ProfiledCosts {
            dir: p.dir.clone(),
            attention_linear: Vec::new(),
            mlp_linear: Vec::new(),
            moe: p.moe.as_ref().map(|rows| {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|&(k, t)| (k.iter().map(|&x| f64::from(x)).collect(), t))
                    .collect();
                Grid::new(2, &rows).unwrap_or_else(|_| unreachable!("points are unique"))
            }),
            elementwise: Vec::new(),
            per_step: Vec::new(),
            attention: Grid::new(4, &[]).unwrap_or_else(|_| unreachable!("no rows")),
            head: p.per_sequence.values().map(|r| grid1(r)).collect(),
        };
        for (op, rows) in &p.dense {
            let g = grid1(rows);
            if ["qkv_proj", "o_proj"].contains(&op.as_str()) {
                out.attention_linear.push(g);
            } else if ["gate_up_proj", "down_proj"].contains(&op.as_str()) {
                out.mlp_linear.push(g);
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

    /// One dense layer's linear layers (attention projections and MLP) over `tokens` tokens.
    pub fn linear_s(&self, tokens: f64) -> f64 {
        self.attention_linear_s(tokens)
            + self.mlp_linear.iter().map(|g| g.at(&[tokens])).sum::<f64>()
    }

    /// One layer's attention projections (Q/K/V and O) over `tokens` tokens.
    pub fn attention_linear_s(&self, tokens: f64) -> f64 {
        self.attention_linear.iter().map(|g| g.at(&[tokens])).sum()
    }

    /// Whether the profile times a mixture of experts' routed experts (`moe.csv`).
    pub fn has_moe(&self) -> bool {
        self.moe.is_some()
    }

    /// One MoE layer's routed experts over `tokens` tokens activating `experts` distinct
    /// experts (0 without work or without `moe.csv`).
    pub fn moe_s(&self, tokens: f64, experts: f64) -> f64 {
        match &self.moe {
            Some(g) if tokens > 0.0 => g.at(&[tokens, experts.max(1.0)]),
            _ => 0.0,
        }
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
            moe: None,
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
    fn moe_layers_interpolate_by_tokens_and_experts() {
        let mut p = profile();
        assert!(!ProfiledCosts::new(&p).has_moe());
        assert_eq!(ProfiledCosts::new(&p).moe_s(8.0, 8.0), 0.0);
        p.dense.remove("gate_up_proj");
        p.dense.remove("down_proj");
        p.moe = Some(vec![
            ([1, 8], 50e-6),
            ([16, 8], 60e-6),
            ([16, 64], 420e-6),
            ([64, 8], 70e-6),
            ([64, 64], 430e-6),
        ]);
        let c = ProfiledCosts::new(&p);
        assert!(c.has_moe());
        // Only the attention projections are linear layers now.
        assert!((c.linear_s(1.0) - 2e-6).abs() < 1e-15);
        assert!((c.moe_s(16.0, 64.0) - 420e-6).abs() < 1e-15);
        // Between experts: linear; a slice of one point (1 token) holds its time.
        assert!((c.moe_s(16.0, 36.0) - 240e-6).abs() < 1e-12);
        assert!((c.moe_s(1.0, 8.0) - 50e-6).abs() < 1e-15);
        // Between tokens: each slice at the experts asked, then linear.
        assert!((c.moe_s(40.0, 64.0) - 425e-6).abs() < 1e-12);
        // No tokens, no time; fewer experts than measured cost the fewest measured.
        assert_eq!(c.moe_s(0.0, 8.0), 0.0);
        assert!((c.moe_s(16.0, 2.0) - 60e-6).abs() < 1e-15);
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
