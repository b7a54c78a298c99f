//! One model's shape ([`ModelSpec`]): what the cost model, the memory plan and the real
//! runtimes need of a transformer, read from a Hugging Face `config.json` (the catalog's
//! `sim/catalog/models/*.toml` hold the same keys) or a GGUF file's metadata; parameter
//! counts per layer, per token and in all.

use serde::Serialize;

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
        let num_experts = match first(&["num_local_experts", "num_experts"])? {
            Some((k, e)) if e > 1 << 12 => {
                return Err(format!(
                    "{shown}: `{k}` must be at most {}, got {e}",
                    1 << 12
                ))
            }
            Some((_, e)) => e.max(1),
            None => 1,
        };
        if num("shared_expert_intermediate_size")?.is_some_and(|n| n > 0) {
            return Err(format!(
                "{shown}: shared experts (`shared_expert_intermediate_size`, Qwen-MoE) are not modelled yet"
            ));
        }
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
        let experts_per_token = num("num_experts_per_tok")?
            .unwrap_or(1)
            .clamp(1, num_experts);
        let layers = dim(family.keys.layers, 1 << 12)?;
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
            gated_mlp: family.gated,
            position_embeddings: family
                .learned_positions
                .map_or(0, |offset| max_position.saturating_add(offset)),
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
        let q = f64::from(self.heads) * f64::from(self.head_dim);
        let kv = f64::from(self.kv_heads) * f64::from(self.head_dim);
        h * (q + 2.0 * kv) + q * h
    }

    /// Matrices of the MLP: gate, up and down (3) when gated, up and down (2) otherwise.
    pub fn mlp_matrices(&self) -> f64 {
        if self.gated_mlp {
            3.0
        } else {
            2.0
        }
    }

    /// Parameters of one layer's MLP: every expert's gate (when gated), up and down
    /// projections, plus the router when there are several experts.
    pub fn mlp_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let e = f64::from(self.num_experts.max(1));
        let router = if self.num_experts > 1 { h * e } else { 0.0 };
        e * self.mlp_matrices() * h * f64::from(self.intermediate) + router
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
            * (self.attention_params() + k * self.mlp_matrices() * h * f64::from(self.intermediate))
            + heads * self.embedding_params()
    }

    /// Parameters of the embedding (and of the LM head when untied).
    pub fn embedding_params(&self) -> f64 {
        f64::from(self.vocab) * f64::from(self.hidden)
    }

    /// Total parameters (norm weights and learned position embeddings included).
    pub fn params(&self) -> f64 {
        let norms = f64::from(self.hidden) * f64::from(2 * self.layers + 1)
            + f64::from(self.position_embeddings) * f64::from(self.hidden);
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        f64::from(self.layers) * self.layer_linear_params()
            + heads * self.embedding_params()
            + norms
    }
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
