//! One model's shape ([`ModelSpec`]): what the cost model, the memory plan and the real
//! runtimes need of a transformer, read from a Hugging Face `config.json` (the catalog's
//! `sim/catalog/models/*.toml` hold the same keys) or a GGUF file's metadata; parameter
//! counts per layer, per token and in all.

use serde::Serialize;

use super::arch::{Arch, LinearAttention, Mla, SlidingLayers};

/// A decoder-only transformer's shape (Llama's by default: RMSNorm, RoPE, GQA, SwiGLU; or
/// a two-matrix MLP, [`ModelSpec::gated_mlp`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Catalog key.
    pub name: &'static str,
    /// Hugging Face repository it describes.
    pub hf_id: &'static str,
    /// Decoder layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// Key/value heads (GQA when fewer than `heads`).
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// MLP intermediate size.
    pub intermediate: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Context length the model was trained for (default `max_model_len`).
    pub max_position: u32,
    /// Whether the LM head shares the embedding matrix.
    pub tied_embeddings: bool,
    /// RoPE base frequency (`rope_theta`).
    pub rope_theta: f32,
    /// Sliding attention window in tokens (`sliding_window` of the HF config; `None`: full
    /// attention).
    pub sliding_window: Option<u32>,
    /// Experts per MoE layer (1: a dense MLP).
    pub num_experts: u32,
    /// Experts each token is routed to (top-k).
    pub experts_per_token: u32,
    /// A gated MLP (gate, up and down projections: SwiGLU, GeGLU), as Llama's; `false`:
    /// two matrices (up, down) around a GELU or ReLU, as GPT-2's, OPT's or Phi-2's. Written
    /// to `plan.json` only when `false`.
    #[serde(skip_serializing_if = "is_true")]
    pub gated_mlp: bool,
    /// Rows of a learned position embedding (OPT's 2 + `max_position_embeddings`, GPT-2's
    /// `n_positions`); 0 with rotary or ALiBi positions. Written to `plan.json` only when
    /// not 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub position_embeddings: u32,
    /// Latent attention, mixed layer types, dense-first layers, shared experts and MTP
    /// layers ([`Arch`]); written to `plan.json` only when the model has any.
    #[serde(skip_serializing_if = "Arch::is_plain")]
    pub arch: Arch,
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The Llama-family `config.json` keys [`ModelSpec::from_hf_value`] reads (other families'
/// spellings aside): a catalog model file's `[config]` may hold only these, so that a
/// misspelt key is an error, not a default.
pub const HF_CONFIG_KEYS: [&str; 43] = [
    "_name_or_path",
    "attn_output_gate",
    "decoder_sparse_step",
    "experts_per_token",
    "first_k_dense_replace",
    "full_attention_interval",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "kv_lora_rank",
    "layer_types",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "mamba_ssm_dtype",
    "max_position_embeddings",
    "mlp_only_layers",
    "model_type",
    "moe_intermediate_size",
    "moe_layer_freq",
    "mtp_num_hidden_layers",
    "n_routed_experts",
    "n_shared_experts",
    "num_attention_heads",
    "num_experts",
    "num_experts_per_tok",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_local_experts",
    "num_nextn_predict_layers",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "rope_theta",
    "shared_expert_intermediate_size",
    "sliding_window",
    "sliding_window_pattern",
    "tie_word_embeddings",
    "use_sliding_window",
    "v_head_dim",
    "vocab_size",
];

impl ModelSpec {
    /// Reads a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2 and other
    /// Llama-like architectures): `num_hidden_layers`, `hidden_size`,
    /// `num_attention_heads`, `intermediate_size` and `vocab_size` are required;
    /// `num_key_value_heads` (default: the heads), `head_dim` (default: hidden / heads),
    /// `max_position_embeddings` (default 4096), `tie_word_embeddings`, `rope_theta`
    /// (default 10000), `sliding_window` (ignored when `use_sliding_window` is false) and
    /// the experts (`num_local_experts` or `num_experts`, with `num_experts_per_tok`) are
    /// read when present. Errors name the file and the key.
    pub fn from_hf_config(path: &std::path::Path) -> Result<ModelSpec, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{shown}: not JSON: {e}"))?;
        ModelSpec::from_hf_value(&v, &shown.to_string())
    }

    /// [`ModelSpec::from_hf_config`] of a parsed `config.json` (or a catalog entry's
    /// `[config]` table); `shown` prefixes errors and names the model when the config has
    /// no `_name_or_path`.
    pub fn from_hf_value(v: &serde_json::Value, shown: &str) -> Result<ModelSpec, String> {
        // A multimodal checkpoint (Qwen3.5) keeps the language model's keys under
        // `text_config`; the top level adds what it does not say (`tie_word_embeddings`).
        let merged;
        let v = match v.get("text_config").and_then(|t| t.as_object()) {
            Some(text) => {
                let mut m = text.clone();
                if let Some(top) = v.as_object() {
                    for (k, x) in top {
                        if k != "text_config" && k != "vision_config" {
                            m.entry(k.clone()).or_insert_with(|| x.clone());
                        }
                    }
                }
                merged = serde_json::Value::Object(m);
                &merged
            }
            None => v,
        };
        let family = family_of(v).map_err(|e| format!("{shown}: {e}"))?;
        let num = |key: &str| -> Result<Option<u32>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        format!("{shown}: `{key}` must be a non-negative integer, got {x}")
                    }),
            }
        };
        // The family's first spelling the file has: (key, value).
        let first = |keys: &[&'static str]| -> Result<Option<(&'static str, u32)>, String> {
            for &k in keys {
                if let Some(n) = num(k)? {
                    return Ok(Some((k, n)));
                }
            }
            Ok(None)
        };
        // A dimension: present, positive and at most `max`.
        let dim = |keys: &[&'static str], max: u32| -> Result<u32, String> {
            match first(keys)? {
                Some((k, n)) if n == 0 || n > max => {
                    Err(format!("{shown}: `{k}` must be from 1 to {max}, got {n}"))
                }
                Some((_, n)) => Ok(n),
                None => Err(format!("{shown}: missing `{}`", keys.join("` or `"))),
            }
        };
        let hidden = dim(family.keys.hidden, 1 << 18)?;
        let heads = dim(family.keys.heads, 1 << 14)?;
        let multi_query = v.get("multi_query").and_then(|x| x.as_bool()) == Some(true);
        let kv_heads = match first(&["num_key_value_heads", "num_kv_heads"])? {
            Some((k, n)) if n == 0 || n > heads => {
                return Err(format!(
                    "{shown}: `{k}` must be from 1 to the {heads} attention heads, got {n}"
                ))
            }
            Some((_, n)) => n,
            None if multi_query => 1,
            None => heads,
        };
        if heads % kv_heads != 0 {
            return Err(format!(
                "{shown}: `num_attention_heads` ({heads}) is not a multiple of `num_key_value_heads` ({kv_heads})"
            ));
        }
        let head_dim = match num("head_dim")? {
            Some(d) if d > 0 && d <= 1 << 12 => d,
            Some(d) => {
                return Err(format!(
                    "{shown}: `head_dim` must be from 1 to {}, got {d}",
                    1 << 12
                ))
            }
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(format!(
                    "{shown}: `hidden_size` ({hidden}) is not a multiple of `num_attention_heads` ({heads}); give `head_dim`"
                ))
            }
        };
        let num_experts = match first(&["num_local_experts", "num_experts", "n_routed_experts"])? {
            Some((k, e)) if e > 1 << 12 => {
                return Err(format!(
                    "{shown}: `{k}` must be at most {}, got {e}",
                    1 << 12
                ))
            }
            Some((_, e)) => e.max(1),
            None => 1,
        };
        // Qwen-MoE sizes its experts with `moe_intermediate_size`; Mixtral with
        // `intermediate_size`; GPT-2, Falcon and BLOOM may leave the width implied.
        let intermediate = match num("moe_intermediate_size")? {
            Some(n) if n > 0 && num_experts > 1 => n,
            _ => match (
                first(family.keys.intermediate)?,
                num("expansion_ratio")?.or(family.intermediate_factor),
            ) {
                (None, Some(f)) => hidden.checked_mul(f).ok_or_else(|| {
                    format!("{shown}: {f} x the hidden size ({hidden}) overflows")
                })?,
                _ => dim(family.keys.intermediate, 1 << 20)?,
            },
        };
        let experts_per_token = match first(&["num_experts_per_tok", "experts_per_token"])? {
            Some((k, n)) if num_experts > 1 && (n == 0 || n > num_experts) => {
                return Err(format!(
                    "{shown}: `{k}` must be from 1 to the {num_experts} experts, got {n}"
                ))
            }
            Some((_, n)) if num_experts > 1 => n,
            _ => 1,
        };
        let layers = dim(family.keys.layers, 1 << 12)?;
        let arch = read_arch(v, &num, layers, num_experts, intermediate, shown)?;
        // MLA: every head's query/key width; its KV is the latent (`arch.mla`), shared.
        let (head_dim, kv_heads) = match &arch.mla {
            Some(mla) => (mla.qk_head_dim(), heads),
            None => (head_dim, kv_heads),
        };
        let vocab = dim(&["vocab_size"], 1 << 24)?;
        let max_position = match first(family.keys.positions)? {
            Some((k, 0)) => return Err(format!("{shown}: `{k}` must be positive, got 0")),
            Some((_, n)) => n,
            None => 4096,
        };
        let uses_window = v.get("use_sliding_window").and_then(|x| x.as_bool()) != Some(false);
        let name = v
            .get("_name_or_path")
            .and_then(|x| x.as_str())
            .filter(|s| !s.is_empty())
            .map_or_else(|| shown.to_string(), str::to_string);
        Ok(ModelSpec {
            // Read once per process: the catalog at first use, a file by `model_from_file`.
            name: Box::leak(name.clone().into_boxed_str()),
            hf_id: Box::leak(name.into_boxed_str()),
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            max_position,
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(|x| x.as_bool())
                .unwrap_or(family.tied_default),
            rope_theta: v
                .get("rope_theta")
                .or_else(|| v.get("rope_parameters").and_then(|r| r.get("rope_theta")))
                .and_then(|x| x.as_f64())
                .unwrap_or(10000.0) as f32,
            // A window of 0 (or none) means full attention; a model that mixes sliding
            // and full layers keeps its window with the sliding layers (`arch.sliding`).
            sliding_window: if uses_window && arch.sliding.is_none() && !has_full_layers(v) {
                num("sliding_window")?.filter(|&w| w > 0)
            } else {
                None
            },
            num_experts,
            experts_per_token,
            gated_mlp: family.gated,
            position_embeddings: family
                .learned_positions
                .map_or(0, |offset| max_position.saturating_add(offset)),
            arch,
        })
    }

    /// Reads the metadata of a GGUF Llama model (`general.architecture = llama`): the
    /// shape through [`kernels::cuda::gguf_shape`], `llama.context_length` (default 4096)
    /// and the name. Errors name the file.
    pub fn from_gguf(path: &std::path::Path) -> Result<ModelSpec, String> {
        let g = kernels::gguf::Gguf::open(path).map_err(|e| e.to_string())?;
        let s = kernels::cuda::gguf_shape(&g).map_err(|e| e.to_string())?;
        let name = g
            .metadata
            .get("general.name")
            .and_then(kernels::gguf::Value::as_str)
            .filter(|n| !n.is_empty())
            .map_or_else(|| path.display().to_string(), str::to_string);
        Ok(ModelSpec {
            // Read once per process (`model_from_gguf`), like the catalog's static entries.
            name: Box::leak(name.clone().into_boxed_str()),
            hf_id: Box::leak(name.into_boxed_str()),
            layers: s.layers,
            hidden: s.hidden,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            intermediate: s.intermediate,
            vocab: s.vocab,
            max_position: g.meta_u32("llama.context_length").unwrap_or(4096).max(1),
            tied_embeddings: s.tied_embeddings,
            rope_theta: s.rope_theta,
            sliding_window: None,
            num_experts: 1,
            experts_per_token: 1,
            gated_mlp: true,
            position_embeddings: 0,
            arch: Arch::default(),
        })
    }

    /// The shape the real runtimes need (Llama architecture, RMSNorm epsilon 1e-5).
    pub fn llama_shape(&self) -> kernels::cuda::LlamaShape {
        kernels::cuda::LlamaShape {
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: self.intermediate,
            vocab: self.vocab,
            rope_theta: self.rope_theta,
            rms_eps: 1e-5,
            tied_embeddings: self.tied_embeddings,
            rope_interleaved: false,
        }
    }

    /// Parameters of one softmax-attention layer's projections (Q with its output gate,
    /// K, V, O); for latent attention, its projections ([`Mla::params`]).
    pub fn attention_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        if let Some(mla) = &self.arch.mla {
            return mla.params(h, f64::from(self.heads));
        }
        let q = f64::from(self.heads) * f64::from(self.head_dim);
        let kv = f64::from(self.kv_heads) * f64::from(self.head_dim);
        let gate = if self.arch.attn_output_gate { q } else { 0.0 };
        h * (q + gate + 2.0 * kv) + q * h
    }

    /// Layers whose attention is linear (Gated DeltaNet); the others are softmax
    /// attention (full, sliding or latent).
    pub fn linear_layers(&self) -> u32 {
        self.arch.linear.map_or(0, |l| l.layers)
    }

    /// Layers whose KV cache grows with every token: all but a hybrid model's sliding and
    /// linear layers (a model whose every layer slides keeps them here, its window freeing
    /// blocks in the block manager).
    pub fn full_attention_layers(&self) -> u32 {
        self.layers - self.linear_layers() - self.arch.sliding.map_or(0, |s| s.layers)
    }

    /// Values per token the cache holds over the layers whose cache grows with every
    /// token: K and V of each KV head, or latent attention's latent and RoPE key (a hybrid
    /// model's sliding and linear layers keep a bounded state instead).
    pub fn kv_values_per_token(&self) -> f64 {
        let layers = f64::from(self.full_attention_layers());
        match &self.arch.mla {
            Some(mla) => layers * f64::from(mla.cache_width()),
            None => layers * 2.0 * f64::from(self.kv_heads) * f64::from(self.head_dim),
        }
    }

    /// Parameters of every layer's attention.
    pub fn attention_params_total(&self) -> f64 {
        let softmax = f64::from(self.layers - self.linear_layers()) * self.attention_params();
        let linear = self.arch.linear.map_or(0.0, |l| {
            f64::from(l.layers) * l.params(f64::from(self.hidden))
        });
        softmax + linear
    }

    /// Matrices of the MLP: gate, up and down (3) when gated, up and down (2) otherwise.
    pub fn mlp_matrices(&self) -> f64 {
        if self.gated_mlp {
            3.0
        } else {
            2.0
        }
    }

    /// Whether the MLP is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.num_experts > 1
    }

    /// Layers whose MLP is a mixture of experts (all but `arch.dense_layers`); 0 for a
    /// dense model.
    pub fn moe_layers(&self) -> u32 {
        if self.is_moe() {
            self.layers - self.arch.dense_layers
        } else {
            0
        }
    }

    /// Parameters of one MLP of width `width`.
    fn mlp_of(&self, width: u32) -> f64 {
        self.mlp_matrices() * f64::from(self.hidden) * f64::from(width)
    }

    /// Parameters of every routed expert of every layer (what expert parallelism splits).
    pub fn expert_params_total(&self) -> f64 {
        f64::from(self.moe_layers()) * f64::from(self.num_experts) * self.mlp_of(self.intermediate)
    }

    /// Parameters of the MLPs that are not routed experts: a dense model's MLPs; a mixture
    /// of experts' dense layers, shared experts and routers.
    pub fn dense_mlp_params_total(&self) -> f64 {
        if !self.is_moe() {
            return f64::from(self.layers) * self.mlp_of(self.intermediate);
        }
        f64::from(self.arch.dense_layers) * self.mlp_of(self.arch.dense_intermediate)
            + f64::from(self.moe_layers()) * self.mlp_of(self.arch.shared_expert_intermediate)
            + self.router_params_total()
    }

    /// Parameters of a mixture of experts' routers (`hidden x experts` a MoE layer); 0 for
    /// a dense model.
    pub fn router_params_total(&self) -> f64 {
        if !self.is_moe() {
            return 0.0;
        }
        f64::from(self.moe_layers()) * f64::from(self.hidden) * f64::from(self.num_experts)
    }

    /// Parameters of every layer's linear layers (attention, MLPs, experts, routers).
    pub fn linear_params_total(&self) -> f64 {
        self.attention_params_total() + self.dense_mlp_params_total() + self.expert_params_total()
    }

    /// Parameters a token uses: the attention, its `experts_per_token` experts, the shared
    /// experts, the dense layers and the embeddings (Mixtral-8x7B: 12.9B of 46.7B).
    pub fn active_params(&self) -> f64 {
        let k = f64::from(self.experts_per_token.max(1).min(self.num_experts.max(1)));
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        let routed = f64::from(self.moe_layers()) * k * self.mlp_of(self.intermediate);
        self.attention_params_total()
            + self.dense_mlp_params_total()
            + routed
            + heads * self.embedding_params()
    }

    /// Parameters of the embedding (and of the LM head when untied).
    pub fn embedding_params(&self) -> f64 {
        f64::from(self.vocab) * f64::from(self.hidden)
    }

    /// Total parameters of the main model (norm weights and learned position embeddings
    /// included; MTP layers not, as model cards count them: [`ModelSpec::mtp_params`]).
    pub fn params(&self) -> f64 {
        let norms = f64::from(self.hidden) * f64::from(2 * self.layers + 1)
            + f64::from(self.position_embeddings) * f64::from(self.hidden);
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        self.linear_params_total() + heads * self.embedding_params() + norms
    }

    /// The model's first `n` layers (a self-speculation draft): DeepSeek's dense layers come
    /// first; sliding and linear layers are counted as evenly interleaved (rounded up), and
    /// at least one full-attention layer is kept, so a one-layer draft is full attention.
    pub fn first_layers(&self, n: u32) -> ModelSpec {
        let n = n.clamp(1, self.layers);
        let mut m = self.clone();
        let share = |count: u32| -> u32 {
            // Evenly interleaved layers of a kind among `layers`: those among the first n.
            ((u64::from(count) * u64::from(n)).div_ceil(u64::from(self.layers))) as u32
        };
        m.layers = n;
        m.arch.dense_layers = self.arch.dense_layers.min(n);
        if let Some(s) = m.arch.sliding.as_mut() {
            s.layers = share(s.layers).min(n.saturating_sub(1));
        }
        if let Some(l) = m.arch.linear.as_mut() {
            l.layers = share(l.layers).min(n.saturating_sub(1));
        }
        if m.arch.sliding.is_some_and(|s| s.layers == 0) {
            m.arch.sliding = None;
        }
        if m.arch.linear.is_some_and(|l| l.layers == 0) {
            m.arch.linear = None;
        }
        if m.is_moe() && m.arch.dense_layers == m.layers {
            // Only dense layers: the draft has no experts.
            m.num_experts = 1;
            m.experts_per_token = 1;
            m.intermediate = self.arch.dense_intermediate;
            m.arch.dense_layers = 0;
            m.arch.dense_intermediate = 0;
            m.arch.shared_expert_intermediate = 0;
        }
        m
    }

    /// The multi-token-prediction module as a draft model (`speculative.method = "mtp"`):
    /// `arch.mtp_layers` decoder layers of the model's last kind (latent or full attention,
    /// its experts) with the shared embedding and LM head, named `<name>-mtp`. `None` when
    /// the model has none.
    pub fn mtp_draft(&self) -> Option<ModelSpec> {
        if self.arch.mtp_layers == 0 {
            return None;
        }
        let mut m = self.clone();
        m.name = Box::leak(format!("{}-mtp", self.name).into_boxed_str());
        m.layers = self.arch.mtp_layers;
        m.arch.dense_layers = 0;
        m.arch.dense_intermediate = 0;
        m.arch.sliding = None;
        m.arch.linear = None;
        m.arch.mtp_layers = 0;
        Some(m)
    }

    /// Parameters of the multi-token-prediction layers (DeepSeek's MTP module: a decoder
    /// layer of the model's last kind, the projection of the embedding and hidden state
    /// (2h x h) and its norms; the embedding and LM head are shared).
    pub fn mtp_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let k = f64::from(self.arch.mtp_layers);
        let mlp = if self.is_moe() {
            f64::from(self.num_experts) * self.mlp_of(self.intermediate)
                + h * f64::from(self.num_experts)
                + self.mlp_of(self.arch.shared_expert_intermediate)
        } else {
            self.mlp_of(self.intermediate)
        };
        k * (self.attention_params() + mlp + 2.0 * h * h + 5.0 * h)
    }
}

/// Whether the file lists its layers' types (`layer_types`) and none slides: a
/// `sliding_window` key beside them is then unused (Qwen3's configs carry one).
fn has_full_layers(v: &serde_json::Value) -> bool {
    v.get("layer_types")
        .and_then(|t| t.as_array())
        .is_some_and(|t| !t.iter().any(|x| x.as_str() == Some("sliding_attention")))
        || v.get("sliding_window_pattern").and_then(|p| p.as_u64()) == Some(1)
}

/// The [`Arch`] of a `config.json`: latent attention, the layer types, which layers of a
/// mixture of experts are dense, shared experts and MTP layers. Errors name the key.
fn read_arch(
    v: &serde_json::Value,
    num: &dyn Fn(&str) -> Result<Option<u32>, String>,
    layers: u32,
    num_experts: u32,
    expert_width: u32,
    shown: &str,
) -> Result<Arch, String> {
    let positive = |key: &str| -> Result<u32, String> {
        match num(key)? {
            Some(n) if n > 0 && n <= 1 << 16 => Ok(n),
            Some(n) => Err(format!(
                "{shown}: `{key}` must be from 1 to {}, got {n}",
                1 << 16
            )),
            None => Err(format!("{shown}: missing `{key}`")),
        }
    };
    let mut arch = Arch::default();
    if num("kv_lora_rank")?.is_some_and(|r| r > 0) {
        arch.mla = Some(Mla {
            q_lora_rank: num("q_lora_rank")?.unwrap_or(0),
            kv_lora_rank: positive("kv_lora_rank")?,
            qk_nope_head_dim: positive("qk_nope_head_dim")?,
            qk_rope_head_dim: positive("qk_rope_head_dim")?,
            v_head_dim: positive("v_head_dim")?,
        });
    }
    // Layer types: listed (gpt-oss, Gemma 3, Qwen3.5), or every `full_attention_interval`-th
    // layer full and the rest linear (Qwen3-Next), or every `sliding_window_pattern`-th
    // layer global and the rest sliding (Gemma 3's older configs).
    let (mut sliding, mut linear) = (0u32, 0u32);
    match v.get("layer_types") {
        None | Some(serde_json::Value::Null) => {
            if let Some(every) = num("sliding_window_pattern")? {
                if every == 0 {
                    return Err(format!(
                        "{shown}: `sliding_window_pattern` must be positive, got 0"
                    ));
                }
                sliding = layers - layers / every;
            }
            if let Some(every) = num("full_attention_interval")? {
                if every == 0 {
                    return Err(format!(
                        "{shown}: `full_attention_interval` must be positive, got 0"
                    ));
                }
                linear = layers - layers / every;
            }
        }
        Some(serde_json::Value::Array(types)) => {
            if types.len() != layers as usize {
                return Err(format!(
                    "{shown}: `layer_types` lists {} layers, but `num_hidden_layers` is {layers}",
                    types.len()
                ));
            }
            for (i, t) in types.iter().enumerate() {
                match t.as_str() {
                    Some("full_attention") | Some("attention") => {}
                    Some("sliding_attention") => sliding += 1,
                    Some("linear_attention") => linear += 1,
                    _ => {
                        return Err(format!(
                            "{shown}: `layer_types[{i}]` is {t}, not a layer type sim models (full_attention, sliding_attention, linear_attention)"
                        ))
                    }
                }
            }
        }
        Some(x) => {
            return Err(format!(
                "{shown}: `layer_types` must be a list of layer types, got {x}"
            ))
        }
    }
    if sliding > 0 && sliding < layers {
        let window = match num("sliding_window")? {
            Some(w) if w > 0 => w,
            _ => {
                return Err(format!(
                    "{shown}: `layer_types` has sliding_attention layers but no positive `sliding_window`"
                ))
            }
        };
        arch.sliding = Some(SlidingLayers {
            window,
            layers: sliding,
        });
    }
    if linear >= layers {
        return Err(format!(
            "{shown}: every layer is linear attention; at least one full-attention layer is needed (`layer_types`, `full_attention_interval`)"
        ));
    }
    if linear > 0 {
        if arch.mla.is_some() || sliding > 0 {
            return Err(format!(
                "{shown}: linear-attention layers beside latent or sliding attention are not modelled"
            ));
        }
        let state_bytes = match v.get("mamba_ssm_dtype").and_then(|x| x.as_str()) {
            None | Some("bfloat16" | "float16" | "auto") => 2,
            Some("float32") => 4,
            Some(d) => {
                return Err(format!(
                    "{shown}: `mamba_ssm_dtype` must be float32, bfloat16 or float16, got {d}"
                ))
            }
        };
        arch.linear = Some(LinearAttention {
            layers: linear,
            key_heads: positive("linear_num_key_heads")?,
            value_heads: positive("linear_num_value_heads")?,
            key_head_dim: positive("linear_key_head_dim")?,
            value_head_dim: positive("linear_value_head_dim")?,
            conv_kernel: num("linear_conv_kernel_dim")?.unwrap_or(4),
            state_bytes,
        });
    }
    if num_experts > 1 {
        // DeepSeek: layers from `first_k_dense_replace` on, every `moe_layer_freq`-th, are
        // MoE; Qwen-MoE: every `decoder_sparse_step`-th layer not in `mlp_only_layers`.
        let first_k = num("first_k_dense_replace")?.unwrap_or(0);
        let freq = num("moe_layer_freq")?.unwrap_or(1).max(1);
        let step = num("decoder_sparse_step")?.unwrap_or(1).max(1);
        let mlp_only: Vec<u64> = match v.get("mlp_only_layers") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64().ok_or_else(|| {
                        format!("{shown}: `mlp_only_layers` must list layer numbers, got {x}")
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(x) => {
                return Err(format!(
                    "{shown}: `mlp_only_layers` must list layer numbers, got {x}"
                ))
            }
        };
        let moe = (0..layers)
            .filter(|&i| {
                i >= first_k
                    && (i - first_k) % freq == 0
                    && (i + 1) % step == 0
                    && !mlp_only.contains(&u64::from(i))
            })
            .count() as u32;
        if moe == 0 {
            return Err(format!(
                "{shown}: {num_experts} experts but no layer is a mixture of experts (`first_k_dense_replace`, `mlp_only_layers`)"
            ));
        }
        arch.dense_layers = layers - moe;
        if arch.dense_layers > 0 {
            arch.dense_intermediate = positive("intermediate_size")?;
        }
        arch.shared_expert_intermediate = match num("shared_expert_intermediate_size")? {
            Some(n) => n,
            None => {
                let n = num("n_shared_experts")?.unwrap_or(0);
                n.checked_mul(expert_width)
                    .filter(|&w| w <= 1 << 20)
                    .ok_or_else(|| {
                        format!(
                            "{shown}: `n_shared_experts` ({n}) x `moe_intermediate_size` ({expert_width}) must be at most {}",
                            1 << 20
                        )
                    })?
            }
        };
    }
    arch.mtp_layers = match num("num_nextn_predict_layers")? {
        Some(n) => n,
        None => num("mtp_num_hidden_layers")?.unwrap_or(0),
    };
    if arch.mtp_layers > layers {
        return Err(format!(
            "{shown}: {} multi-token-prediction layers (`num_nextn_predict_layers` / `mtp_num_hidden_layers`) but only {layers} layers",
            arch.mtp_layers
        ));
    }
    arch.attn_output_gate = v.get("attn_output_gate").and_then(|x| x.as_bool()) == Some(true);
    Ok(arch)
}

/// How a family of `config.json` files (one `model_type` or several) spells a shape, and
/// the MLP it builds.
struct Family {
    /// `model_type` values (`architectures` names map to them, `LlamaForCausalLM` to
    /// `llama`).
    types: &'static [&'static str],
    /// Gate, up and down projections (SwiGLU, GeGLU), or up and down only.
    gated: bool,
    /// `tie_word_embeddings` when the file does not say (the family's transformers
    /// default).
    tied_default: bool,
    /// How the file spells the shape's keys.
    keys: Keys,
    /// The MLP width as a multiple of the hidden size when the file gives none.
    intermediate_factor: Option<u32>,
    /// Learned position embeddings: rows beyond the trained context (OPT keeps 2 more);
    /// `None`: rotary or ALiBi positions, no weights.
    learned_positions: Option<u32>,
}

/// Spellings of the hidden size, the attention heads, the layers, the MLP width and the
/// trained context, first found wins.
struct Keys {
    hidden: &'static [&'static str],
    heads: &'static [&'static str],
    layers: &'static [&'static str],
    intermediate: &'static [&'static str],
    positions: &'static [&'static str],
}

/// Llama's spellings, which most families share.
const STANDARD: Keys = Keys {
    hidden: &["hidden_size"],
    heads: &["num_attention_heads"],
    layers: &["num_hidden_layers"],
    intermediate: &["intermediate_size"],
    positions: &["max_position_embeddings"],
};

/// The families `sim` models: Llama's gated MLP (the default: a config without
/// `model_type`, as the catalog's, is read as Llama), and the two-matrix MLPs.
const FAMILIES: &[Family] = &[
    Family {
        types: &[
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "gemma",
            "gemma2",
            "phi3",
            "yi",
            "internlm2",
            "olmo",
            "olmo2",
            "granite",
            "stablelm",
            "deepseek",
            "deepseek_v2",
            "deepseek_v3",
            "kimi_k2",
            "gpt_oss",
            "qwen3_next",
            "qwen3_5",
            "qwen3_5_text",
            "qwen3_5_moe",
            "qwen3_5_moe_text",
            "gemma3",
            "gemma3_text",
            "cohere",
            "smollm3",
        ],
        gated: true,
        tied_default: false,
        keys: STANDARD,
        intermediate_factor: None,
        learned_positions: None,
    },
    Family {
        // Phi-1/1.5/2 (fc1, fc2 around GELU), GPT-NeoX/Pythia, StarCoder2.
        types: &["phi", "gpt_neox", "starcoder2"],
        gated: false,
        tied_default: false,
        keys: STANDARD,
        intermediate_factor: None,
        learned_positions: None,
    },
    Family {
        // OPT: `ffn_dim`, ReLU, the LM head tied to the embedding.
        types: &["opt"],
        gated: false,
        tied_default: true,
        keys: Keys {
            intermediate: &["ffn_dim"],
            ..STANDARD
        },
        intermediate_factor: None,
        learned_positions: Some(2),
    },
    Family {
        // GPT-2 and StarCoder (GPT-BigCode, multi-query): `n_embd`, `n_inner` or 4 x.
        types: &["gpt2", "gpt_bigcode"],
        gated: false,
        tied_default: true,
        keys: Keys {
            hidden: &["n_embd", "hidden_size"],
            heads: &["n_head", "num_attention_heads"],
            layers: &["n_layer", "num_hidden_layers"],
            intermediate: &["n_inner"],
            positions: &["n_positions", "max_position_embeddings"],
        },
        intermediate_factor: Some(4),
        learned_positions: Some(0),
    },
    Family {
        // Falcon (multi-query or grouped KV heads) and BLOOM: a 4 x GELU MLP.
        types: &["falcon", "bloom"],
        gated: false,
        tied_default: true,
        keys: Keys {
            hidden: &["hidden_size", "n_embed"],
            heads: &["num_attention_heads", "n_head"],
            layers: &["num_hidden_layers", "n_layer"],
            intermediate: &["ffn_hidden_size"],
            positions: &["max_position_embeddings", "seq_length"],
        },
        intermediate_factor: Some(4),
        learned_positions: None,
    },
    Family {
        // MPT: `d_model`, `expansion_ratio` (default 4) x GELU.
        types: &["mpt"],
        gated: false,
        tied_default: true,
        keys: Keys {
            hidden: &["d_model"],
            heads: &["n_heads"],
            layers: &["n_layers"],
            intermediate: &[],
            positions: &["max_seq_len"],
        },
        intermediate_factor: Some(4),
        learned_positions: None,
    },
];

/// The family of a `config.json`: by `model_type`, else by its `architectures` (the class
/// name without `ForCausalLM` / `LMHeadModel`), else Llama's. A model type outside
/// [`FAMILIES`] (Mamba, BERT, T5, ...) is an error naming it.
fn family_of(v: &serde_json::Value) -> Result<&'static Family, String> {
    let squash = |t: &str| t.to_ascii_lowercase().replace(['_', '-'], "");
    let (named, what) = match v.get("model_type").and_then(|x| x.as_str()) {
        Some(t) => (t.to_string(), format!("model_type `{t}`")),
        None => match v
            .get("architectures")
            .and_then(|a| a.as_array())
            .and_then(|a| a.first())
            .and_then(|x| x.as_str())
        {
            Some(a) => {
                let t = [
                    "ForCausalLM",
                    "LMHeadModel",
                    "ForConditionalGeneration",
                    "ForMaskedLM",
                    "Model",
                ]
                .iter()
                .find_map(|suffix| a.strip_suffix(suffix))
                .unwrap_or(a);
                (t.to_string(), format!("architectures `{a}`"))
            }
            None => return Ok(&FAMILIES[0]),
        },
    };
    FAMILIES
        .iter()
        .find(|f| f.types.iter().any(|k| squash(k) == squash(&named)))
        .ok_or_else(|| {
            format!(
                "{what} is not a decoder-only transformer sim models (Llama-like and GPT-like families: llama, mistral, qwen2, gemma, phi, opt, gpt2, falcon, mpt, ...; the README lists them)"
            )
        })
}
