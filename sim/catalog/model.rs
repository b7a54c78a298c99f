//! One model's shape ([`ModelSpec`]): what the cost model, the memory plan and the real
//! runtimes need of a transformer, read from a Hugging Face `config.json` (the catalog's
//! `sim/catalog/models/*.toml` hold the same keys) or a GGUF file's metadata; parameter
//! counts per layer, per token and in all.

use serde::Serialize;

/// A transformer shape (Llama family: RMSNorm, RoPE, GQA, SwiGLU).
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
}

/// The `config.json` keys [`ModelSpec::from_hf_value`] reads; a catalog model file's
/// `[config]` may hold only these, so that a misspelt key is an error, not a default.
pub const HF_CONFIG_KEYS: [&str; 18] = [
    "_name_or_path",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "max_position_embeddings",
    "moe_intermediate_size",
    "num_attention_heads",
    "num_experts",
    "num_experts_per_tok",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_local_experts",
    "rope_theta",
    "shared_expert_intermediate_size",
    "sliding_window",
    "tie_word_embeddings",
    "use_sliding_window",
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
        let need = |key: &str| -> Result<u32, String> {
            match num(key)? {
                Some(n) if n > 0 => Ok(n),
                Some(_) => Err(format!("{shown}: `{key}` must be positive")),
                None => Err(format!("{shown}: missing `{key}`")),
            }
        };
        let hidden = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let kv_heads = num("num_key_value_heads")?.unwrap_or(heads).max(1);
        if heads % kv_heads != 0 {
            return Err(format!(
                "{shown}: `num_attention_heads` ({heads}) is not a multiple of `num_key_value_heads` ({kv_heads})"
            ));
        }
        let head_dim = match num("head_dim")? {
            Some(d) if d > 0 => d,
            _ if hidden % heads == 0 => hidden / heads,
            _ => {
                return Err(format!(
                    "{shown}: `hidden_size` ({hidden}) is not a multiple of `num_attention_heads` ({heads}); give `head_dim`"
                ))
            }
        };
        let num_experts = match (num("num_local_experts")?, num("num_experts")?) {
            (Some(e), _) | (None, Some(e)) => e.max(1),
            (None, None) => 1,
        };
        if num("shared_expert_intermediate_size")?.is_some_and(|n| n > 0) {
            return Err(format!(
                "{shown}: shared experts (`shared_expert_intermediate_size`, Qwen-MoE) are not modelled yet"
            ));
        }
        // Qwen-MoE sizes its experts with `moe_intermediate_size`; Mixtral with
        // `intermediate_size`.
        let intermediate = match num("moe_intermediate_size")? {
            Some(n) if n > 0 && num_experts > 1 => n,
            _ => need("intermediate_size")?,
        };
        let experts_per_token = num("num_experts_per_tok")?
            .unwrap_or(1)
            .clamp(1, num_experts);
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
            layers: need("num_hidden_layers")?,
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab: need("vocab_size")?,
            max_position: num("max_position_embeddings")?.unwrap_or(4096).max(1),
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
            rope_theta: v
                .get("rope_theta")
                .and_then(|x| x.as_f64())
                .unwrap_or(10000.0) as f32,
            // A window of 0 (or none) means full attention.
            sliding_window: if uses_window {
                num("sliding_window")?.filter(|&w| w > 0)
            } else {
                None
            },
            num_experts,
            experts_per_token,
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

    /// Parameters of one decoder layer's linear layers (every expert, and the router of a
    /// mixture of experts).
    pub fn layer_linear_params(&self) -> f64 {
        self.attention_params() + self.mlp_params()
    }

    /// Parameters of one layer's attention projections (Q, K, V, O).
    pub fn attention_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let q = f64::from(self.heads * self.head_dim);
        let kv = f64::from(self.kv_heads * self.head_dim);
        h * (q + 2.0 * kv) + q * h
    }

    /// Parameters of one layer's MLP: every expert's gate, up and down projections, plus
    /// the router when there are several experts.
    pub fn mlp_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let e = f64::from(self.num_experts.max(1));
        let router = if self.num_experts > 1 { h * e } else { 0.0 };
        e * 3.0 * h * f64::from(self.intermediate) + router
    }

    /// Whether the MLP is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.num_experts > 1
    }

    /// Parameters a token uses: the attention, its `experts_per_token` experts, the
    /// embeddings (Mixtral-8x7B: 12.9B of 46.7B).
    pub fn active_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let k = f64::from(self.experts_per_token.max(1).min(self.num_experts.max(1)));
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        f64::from(self.layers)
            * (self.attention_params() + k * 3.0 * h * f64::from(self.intermediate))
            + heads * self.embedding_params()
    }

    /// Parameters of the embedding (and of the LM head when untied).
    pub fn embedding_params(&self) -> f64 {
        f64::from(self.vocab) * f64::from(self.hidden)
    }

    /// Total parameters (norm weights included).
    pub fn params(&self) -> f64 {
        let norms = f64::from(self.hidden) * f64::from(2 * self.layers + 1);
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        f64::from(self.layers) * self.layer_linear_params()
            + heads * self.embedding_params()
            + norms
    }
}
