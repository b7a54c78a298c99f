//! What sets a model apart from a uniform Llama layer stack ([`Arch`]): DeepSeek's
//! multi-head latent attention ([`Mla`]), layers that mix sliding-window and full attention
//! (gpt-oss, Gemma 2/3), linear-attention layers with a fixed per-sequence state
//! (Qwen3-Next / Qwen3.5's Gated DeltaNet, [`LinearAttention`]), dense MLPs before the
//! mixture-of-experts layers, shared experts and multi-token-prediction layers. Read from a
//! Hugging Face `config.json` by [`super::ModelSpec::from_hf_value`]; out: per-layer
//! parameter counts and the KV or state each layer keeps, which the memory plan and the
//! roofline sum per layer group.

use serde::Serialize;

/// The parts of a model's shape a plain Llama does not have; all default (absent) for one.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Arch {
    /// Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2) in every layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
    /// Layers that attend over a sliding window while the others attend over everything
    /// (gpt-oss: every other layer, window 128). A model whose every layer slides
    /// (Mistral-7B) keeps its window in `ModelSpec::sliding_window` instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding: Option<SlidingLayers>,
    /// Linear-attention layers (Gated DeltaNet) among the full-attention ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linear: Option<LinearAttention>,
    /// Layers of a mixture of experts whose MLP is dense (DeepSeek's
    /// `first_k_dense_replace`, Qwen-MoE's `mlp_only_layers`).
    #[serde(skip_serializing_if = "is_zero")]
    pub dense_layers: u32,
    /// Their MLP width (`intermediate_size`; the experts' is `moe_intermediate_size`).
    #[serde(skip_serializing_if = "is_zero")]
    pub dense_intermediate: u32,
    /// Width of the shared experts every token also runs (DeepSeek's `n_shared_experts` x
    /// `moe_intermediate_size`, Qwen's `shared_expert_intermediate_size`); 0: none.
    #[serde(skip_serializing_if = "is_zero")]
    pub shared_expert_intermediate: u32,
    /// Multi-token-prediction layers (`num_nextn_predict_layers`, `mtp_num_hidden_layers`):
    /// stored with the weights, usable as a speculative draft; not counted in
    /// `ModelSpec::params` (model cards count the main model).
    #[serde(skip_serializing_if = "is_zero")]
    pub mtp_layers: u32,
    /// The query projection also produces a sigmoid gate on the attention output
    /// (Qwen3-Next / Qwen3.5 `attn_output_gate`): twice the query width.
    #[serde(skip_serializing_if = "is_false")]
    pub attn_output_gate: bool,
}

impl Arch {
    /// Whether the model is a uniform stack of Llama layers (nothing here set).
    pub fn is_plain(&self) -> bool {
        *self == Arch::default()
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// DeepSeek's multi-head latent attention: keys and values are compressed into a latent of
/// `kv_lora_rank` values plus a shared RoPE key of `qk_rope_head_dim`, which is all the KV
/// cache holds per token and layer (one copy for all heads, not split by tensor
/// parallelism).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mla {
    /// Rank of the query compression (0: queries projected directly, as DeepSeek-V2-Lite).
    pub q_lora_rank: u32,
    /// Rank of the key/value latent.
    pub kv_lora_rank: u32,
    /// Per-head query/key dimension without RoPE.
    pub qk_nope_head_dim: u32,
    /// Per-head (queries) and shared (key) RoPE dimension.
    pub qk_rope_head_dim: u32,
    /// Per-head value dimension.
    pub v_head_dim: u32,
}

impl Mla {
    /// Values the cache holds per token and layer: the latent and the RoPE key (576 for
    /// DeepSeek-V3, against 2 x 128 heads x 128 = 32,768 for the same heads uncompressed).
    pub fn cache_width(&self) -> u32 {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Per-head query/key dimension (192 for DeepSeek-V3).
    pub fn qk_head_dim(&self) -> u32 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Parameters of one layer's attention with `heads` heads over `hidden`: the query path
    /// (`q_a`, its norm, `q_b`, or one `q_proj`), `kv_a_proj_with_mqa`, its norm, `kv_b`
    /// and the output projection.
    pub fn params(&self, hidden: f64, heads: f64) -> f64 {
        self.replicated_params(hidden) + self.split_params(hidden, heads)
    }

    /// The down-projections each tensor-parallel GPU holds whole (`q_a_proj`,
    /// `kv_a_proj_with_mqa` and their norms): vLLM replicates them.
    pub fn replicated_params(&self, hidden: f64) -> f64 {
        let q_lora = f64::from(self.q_lora_rank);
        let kv_a = hidden * f64::from(self.cache_width()) + f64::from(self.kv_lora_rank);
        let q_a = if self.q_lora_rank > 0 {
            hidden * q_lora + q_lora
        } else {
            0.0
        };
        q_a + kv_a
    }

    /// The up- and output projections split over tensor parallelism by heads.
    pub fn split_params(&self, hidden: f64, heads: f64) -> f64 {
        let q_in = if self.q_lora_rank > 0 {
            f64::from(self.q_lora_rank)
        } else {
            hidden
        };
        let q_b = q_in * heads * f64::from(self.qk_head_dim());
        let kv_b = f64::from(self.kv_lora_rank)
            * heads
            * f64::from(self.qk_nope_head_dim + self.v_head_dim);
        let o = heads * f64::from(self.v_head_dim) * hidden;
        q_b + kv_b + o
    }
}

/// Layers attending over a sliding window among full-attention layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlidingLayers {
    /// Tokens each of them attends to.
    pub window: u32,
    /// How many layers slide.
    pub layers: u32,
}

/// Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): per sequence and layer a
/// recurrent state of `value_heads x key_head_dim x value_head_dim` values and a short
/// convolution's last `conv_kernel - 1` inputs, whatever the context length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LinearAttention {
    /// How many layers are linear.
    pub layers: u32,
    /// Key (and query) heads.
    pub key_heads: u32,
    /// Value heads.
    pub value_heads: u32,
    /// Key head dimension.
    pub key_head_dim: u32,
    /// Value head dimension.
    pub value_head_dim: u32,
    /// Width of the causal convolution over q, k and v.
    pub conv_kernel: u32,
    /// Bytes per value of the recurrent state (`mamba_ssm_dtype`: 4 for float32, else 2).
    pub state_bytes: u32,
}

impl LinearAttention {
    /// Width of the q, k and v projections together (the convolution's channels).
    pub fn qkv_width(&self) -> f64 {
        2.0 * f64::from(self.key_heads) * f64::from(self.key_head_dim) + self.value_width()
    }

    /// Width of the value heads (the gate `z` and the output's input).
    pub fn value_width(&self) -> f64 {
        f64::from(self.value_heads) * f64::from(self.value_head_dim)
    }

    /// Parameters of one layer: the q/k/v/z projection, the `b` and `a` gates, the
    /// convolution, the per-head decay terms, the gated norm and the output projection.
    pub fn params(&self, hidden: f64) -> f64 {
        let vh = f64::from(self.value_heads);
        hidden * (self.qkv_width() + self.value_width())
            + hidden * 2.0 * vh
            + self.qkv_width() * f64::from(self.conv_kernel)
            + 2.0 * vh
            + f64::from(self.value_head_dim)
            + self.value_width() * hidden
    }

    /// Bytes of one sequence's state in one layer on one of `tp` GPUs (heads split): the
    /// recurrent state and the convolution's window in 16 bits.
    pub fn state_bytes_per_seq(&self, tp: u32) -> f64 {
        let tp = f64::from(tp.max(1));
        let recurrent = f64::from(self.value_heads)
            * f64::from(self.key_head_dim)
            * f64::from(self.value_head_dim)
            * f64::from(self.state_bytes);
        let conv = f64::from(self.conv_kernel.saturating_sub(1)) * self.qkv_width() * 2.0;
        (recurrent + conv) / tp
    }
}
