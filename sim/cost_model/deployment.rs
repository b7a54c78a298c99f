//! A model on hardware ([`Deployment`]): weights per GPU under tensor and pipeline
//! parallelism, KV heads and bytes per token on each GPU. The memory plan and the roofline
//! both start from it.

use engine::block_manager::SideGroup;
use serde::Serialize;

use crate::catalog::{Dtype, Gpu, ModelSpec};

/// A model deployed on hardware: everything the cost and memory formulas need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Deployment {
    /// Model shape.
    pub model: ModelSpec,
    /// GPU type.
    pub gpu: Gpu,
    /// Tensor-parallel degree (GPUs per pipeline stage).
    pub tp: u32,
    /// Pipeline-parallel degree (stages, each holding `ceil(layers / pp)` layers).
    pub pp: u32,
    /// Weight format.
    pub dtype: Dtype,
    /// KV-cache format.
    pub kv_dtype: Dtype,
    /// Attention data parallelism and expert parallelism (none by default); written to
    /// `plan.json` only when set.
    #[serde(skip_serializing_if = "Parallel::is_none")]
    pub parallel: Parallel,
}

/// How a mixture of experts spreads over a replica's GPUs beside tensor parallelism
/// (DeepSeek's serving recipe: attention data-parallel ranks in front of experts split
/// over every GPU). A replica's `tp x dp` GPUs of a stage are `moe_tp x ep` for the
/// experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Parallel {
    /// Attention data-parallel ranks: each runs its own sequences (its own scheduler and
    /// KV pool) with attention over `tp` GPUs, all meeting in every MoE layer; 1: none.
    pub dp: u32,
    /// Expert-parallel degree: the routed experts are split `ep` ways, each group of GPUs
    /// holding `num_experts / ep` whole experts (split `moe_tp` ways); 1: experts split by
    /// tensor parallelism only.
    pub ep: u32,
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel { dp: 1, ep: 1 }
    }
}

impl Parallel {
    /// Whether neither is used.
    pub fn is_none(&self) -> bool {
        *self == Parallel::default()
    }
}

impl Deployment {
    /// Weight bytes held by each GPU: linear layers and embeddings split over TP (latent
    /// attention's down-projections replicated, as vLLM keeps them), norms replicated.
    pub fn weight_bytes_per_gpu(&self) -> f64 {
        let m = &self.model;
        let tp = f64::from(self.tp);
        // Parameter counts are integers below 2^53, so these sums and the per-layer share
        // are exact.
        let replicated = m.arch.mla.map_or(0.0, |mla| {
            f64::from(m.layers) * mla.replicated_params(f64::from(m.hidden))
        });
        // The MLPs (routed and shared experts, dense layers) in the deployment's format;
        // the attention projections and the routers in `attention_dtype`.
        let experts = m.expert_params_total();
        let attention_bytes = self.attention_dtype().bytes();
        let mlps = m.dense_mlp_params_total() - m.router_params_total();
        let attention = m.linear_params_total() - replicated - experts - mlps;
        // Routed experts are split over the stage's GPUs (`moe_tp x ep`), the rest over TP
        // (replicated over attention data-parallel ranks).
        let experts_share = f64::from(self.stage_gpus()) / tp;
        let per_layer = (attention * attention_bytes
            + mlps * self.dtype.bytes()
            + experts * self.dtype.bytes() / experts_share)
            / f64::from(m.layers);
        let per_layer_replicated = replicated / f64::from(m.layers);
        let stage = f64::from(self.layers_per_stage());
        let linear = stage * per_layer;
        let heads = if m.tied_embeddings { 1.0 } else { 2.0 };
        // Under pipeline parallelism the first stage holds the embedding and the last the
        // LM head: a stage holds at most one of them.
        let stage_heads = if self.pp > 1 { 1.0 } else { heads };
        let embeddings = stage_heads * m.embedding_params() * self.dtype.embedding_bytes();
        // Norm weights stay in 16 bits (and are negligible).
        let norms = (m.params() - m.linear_params_total() - heads * m.embedding_params()) * 2.0;
        (linear + embeddings) / tp + stage * per_layer_replicated * attention_bytes + norms
    }

    /// Bytes of the embedding and LM head on each GPU (split over TP; a pipeline stage
    /// holds one of them).
    pub fn embedding_bytes_per_gpu(&self) -> f64 {
        let m = &self.model;
        let heads = match (m.tied_embeddings, self.pp > 1) {
            (true, _) | (false, true) => 1.0,
            (false, false) => 2.0,
        };
        heads * m.embedding_params() * self.dtype.embedding_bytes() / f64::from(self.tp)
    }

    /// The format of the attention projections and the MoE routers: the deployment's,
    /// except that a mixture of experts in fp4 keeps them in 16 bits. gpt-oss's MXFP4
    /// checkpoint quantizes its experts only; NVIDIA's NVFP4 DeepSeek-R1 (TensorRT Model
    /// Optimizer's `examples/deepseek/ptq.py`) leaves `*attn*` and the LM head unquantized
    /// and every MLP (dense layers, shared and routed experts) in NVFP4.
    pub fn attention_dtype(&self) -> Dtype {
        if self.model.is_moe() && self.dtype.is_fp4() {
            Dtype::Bf16
        } else {
            self.dtype
        }
    }

    /// Layers of the largest pipeline stage.
    pub fn layers_per_stage(&self) -> u32 {
        self.model.layers.div_ceil(self.pp.max(1))
    }

    /// GPUs of one replica (`tp x dp x pp`).
    pub fn num_gpus(&self) -> u32 {
        self.stage_gpus() * self.pp.max(1)
    }

    /// GPUs of one pipeline stage: `tp x dp`, which the experts split `moe_tp x ep`.
    pub fn stage_gpus(&self) -> u32 {
        self.tp * self.parallel.dp.max(1)
    }

    /// How many ways each routed expert is split by tensor parallelism: the stage's GPUs
    /// over the expert-parallel degree.
    pub fn moe_tp(&self) -> u32 {
        (self.stage_gpus() / self.parallel.ep.max(1)).max(1)
    }

    /// KV heads stored on each GPU (at least one: a head is replicated when TP exceeds the
    /// KV head count).
    pub fn kv_heads_per_gpu(&self) -> u32 {
        (self.model.kv_heads / self.tp).max(1)
    }

    /// Of `layers` spread over the pipeline, those of the largest stage.
    fn stage_share(&self, layers: u32) -> u32 {
        layers.div_ceil(self.pp.max(1))
    }

    /// KV bytes per token on one GPU of the layers whose cache grows with every token
    /// (what a KV block holds): 2 (K and V) x layers x kv_heads x head_dim x bytes; for
    /// latent attention, layers x (kv_lora_rank + qk_rope_head_dim) x bytes, whole on every
    /// tensor-parallel GPU. A hybrid model's sliding and linear layers keep a bounded state
    /// per sequence instead ([`Deployment::seq_state_bytes`]).
    pub fn kv_bytes_per_token(&self) -> f64 {
        let m = &self.model;
        let layers = self.stage_share(m.full_attention_layers());
        match &m.arch.mla {
            Some(mla) => f64::from(layers) * f64::from(mla.cache_width()) * self.kv_dtype.bytes(),
            None => kv_cache_bytes(
                layers,
                self.kv_heads_per_gpu(),
                m.head_dim,
                1,
                1,
                self.kv_dtype.bytes(),
            ),
        }
    }

    /// KV per token of one sliding-window layer on one GPU.
    fn sliding_bytes_per_token_per_layer(&self) -> f64 {
        kv_cache_bytes(
            1,
            self.kv_heads_per_gpu(),
            self.model.head_dim,
            1,
            1,
            self.kv_dtype.bytes(),
        )
    }

    /// Bytes one sequence holds on one GPU whatever its length, with blocks of
    /// `block_size` tokens: the sliding layers' window (whole blocks, one more for the
    /// block a window straddles) and the linear layers' recurrent and convolution state.
    pub fn seq_state_bytes(&self, block_size: u32) -> f64 {
        self.kv_groups(block_size)
            .iter()
            .map(|g| g.bytes_per_seq)
            .sum()
    }

    /// The pool's pages with blocks of `block_size` tokens, a draft's KV of
    /// `draft_kv_bytes_per_token` beside the target's, and sliding layers kept apart
    /// (`hybrid`; false: they hold every token, as vLLM's
    /// `--disable-hybrid-kv-cache-manager` does).
    ///
    /// vLLM groups layers so that every group has as many layers as the smallest kind and
    /// pages one size. Here the full-attention layers are one group (the smallest kind in
    /// every hybrid model of the catalog: gpt-oss 18 of 36, Qwen3.5 15 of 60); the
    /// sliding and linear layers make `ceil(their count / that)` groups of as many layers,
    /// the last padded. A linear group's state takes whole pages (vLLM instead grows the
    /// attention block until a page holds a state: the same bytes up to the rounding).
    pub fn page_layout(
        &self,
        block_size: u32,
        draft_kv_bytes_per_token: f64,
        hybrid: bool,
    ) -> PageLayout {
        let m = &self.model;
        let bs = f64::from(block_size.max(1));
        let full = self.stage_share(m.full_attention_layers()).max(1);
        let per_layer = self.kv_bytes_per_token() / f64::from(full);
        let mut side = Vec::new();
        let mut page_bytes = (self.kv_bytes_per_token() + draft_kv_bytes_per_token) * bs;
        if let Some(s) = m.arch.sliding {
            let layers = self.stage_share(s.layers);
            let sliding = self.sliding_bytes_per_token_per_layer();
            if hybrid {
                page_bytes =
                    (f64::from(full) * per_layer.max(sliding) + draft_kv_bytes_per_token) * bs;
                side.extend(
                    (0..layers.div_ceil(full)).map(|_| SideGroup::Sliding { window: s.window }),
                );
            } else {
                page_bytes += f64::from(layers) * sliding * bs;
            }
        }
        if let Some(l) = m.arch.linear {
            let layers = self.stage_share(l.layers);
            let state = f64::from(full) * l.state_bytes_per_seq(self.tp);
            let pages = if page_bytes > 0.0 {
                (state / page_bytes).ceil().min(f64::from(u32::MAX)) as u32
            } else {
                0
            };
            side.extend((0..layers.div_ceil(full)).map(|_| SideGroup::State {
                pages: pages.max(1),
            }));
        }
        PageLayout { page_bytes, side }
    }

    /// The cache of each kind of layer on one GPU (what `sim validate` prints).
    pub fn kv_groups(&self, block_size: u32) -> Vec<KvGroup> {
        let m = &self.model;
        let mut groups = vec![KvGroup {
            kind: match (&m.arch.mla, m.sliding_window) {
                (Some(_), _) => "latent attention (MLA)",
                (None, Some(_)) => "sliding attention (every layer)",
                (None, None) => "full attention",
            },
            layers: self.stage_share(m.full_attention_layers()),
            bytes_per_token: self.kv_bytes_per_token(),
            bytes_per_seq: 0.0,
        }];
        if let Some(s) = m.arch.sliding {
            let layers = self.stage_share(s.layers);
            let bs = block_size.max(1);
            let window_tokens = (f64::from(s.window.div_ceil(bs)) + 1.0) * f64::from(bs);
            let per_token = f64::from(layers) * self.sliding_bytes_per_token_per_layer();
            groups.push(KvGroup {
                kind: "sliding attention",
                layers,
                bytes_per_token: 0.0,
                bytes_per_seq: per_token * window_tokens,
            });
        }
        if let Some(l) = m.arch.linear {
            let layers = self.stage_share(l.layers);
            groups.push(KvGroup {
                kind: "linear attention state",
                layers,
                bytes_per_token: 0.0,
                bytes_per_seq: f64::from(layers) * l.state_bytes_per_seq(self.tp),
            });
        }
        groups
    }
}

/// How the KV pool of one GPU is paged (vLLM's hybrid KV cache manager): every pool block
/// is a page of `page_bytes`; the full-attention layers' table grows with the sequence, and
/// the [`SideGroup`]s beside it are groups of as many sliding or linear-attention layers.
#[derive(Debug, Clone, PartialEq)]
pub struct PageLayout {
    /// Bytes of one pool block on one GPU.
    pub page_bytes: f64,
    /// The groups beside the full-attention table (empty for a uniform model).
    pub side: Vec<SideGroup>,
}

/// One kind of layer's cache on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvGroup {
    /// What the layers are.
    pub kind: &'static str,
    /// How many (of the largest pipeline stage).
    pub layers: u32,
    /// Bytes per token of context (0: bounded).
    pub bytes_per_token: f64,
    /// Bytes per sequence whatever its length (the window's blocks, a recurrent state).
    pub bytes_per_seq: f64,
}

/// Bytes of a KV cache: 2 x layers x kv_heads x head_dim x tokens x sequences x bytes.
pub fn kv_cache_bytes(
    layers: u32,
    kv_heads: u32,
    head_dim: u32,
    tokens: u64,
    seqs: u64,
    bytes: f64,
) -> f64 {
    2.0 * f64::from(layers)
        * f64::from(kv_heads)
        * f64::from(head_dim)
        * tokens as f64
        * seqs as f64
        * bytes
}
