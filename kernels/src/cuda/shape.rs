//! The shape of a Llama-architecture model as the CUDA and CPU runtimes need it
//! ([`LlamaShape`]), read from a GGUF file's metadata ([`gguf_shape`]) or given for a
//! catalog model, and where the weights come from.

use super::*;
use crate::gguf::Gguf;

/// A Llama-architecture shape (what the forward pass needs to know of a model).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaShape {
    /// Decoder layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// MLP intermediate size.
    pub intermediate: u32,
    /// Vocabulary.
    pub vocab: u32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// LM head shares the embedding.
    pub tied_embeddings: bool,
    /// RoPE pairs (2i, 2i+1) as in GGUF, instead of (i, i + d/2).
    pub rope_interleaved: bool,
}

impl LlamaShape {
    /// Query heads per KV head.
    pub fn group(&self) -> u32 {
        self.heads / self.kv_heads.max(1)
    }

    /// Width of the fused QKV projection.
    pub fn qkv_dim(&self) -> u32 {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Weight bytes in bf16.
    pub fn weight_bytes(&self) -> u64 {
        let h = u64::from(self.hidden);
        let per_layer = h * u64::from(self.qkv_dim())
            + u64::from(self.heads * self.head_dim) * h
            + 3 * h * u64::from(self.intermediate)
            + 2 * h;
        let embed = u64::from(self.vocab) * h;
        let head = if self.tied_embeddings { 0 } else { embed };
        2 * (u64::from(self.layers) * per_layer + embed + head + h)
    }

    /// KV bytes per token (all layers, bf16).
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * 2 * u64::from(self.layers) * u64::from(self.kv_heads) * u64::from(self.head_dim)
    }

    pub(super) fn validate(&self) -> Result<(), CudaError> {
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(CudaError::Config(format!(
                "heads ({}) must be a multiple of kv_heads ({})",
                self.heads, self.kv_heads
            )));
        }
        if self.group() > 32 {
            return Err(CudaError::Config(format!(
                "GQA group {} is larger than the attention kernel's 32 rows",
                self.group()
            )));
        }
        Ok(())
    }
}

/// Where the weights come from.
#[derive(Clone, Copy)]
pub(super) enum Weights<'a> {
    /// Random (seeded) on the device.
    Synthetic(u64),
    /// A GGUF file.
    Gguf(&'a Gguf),
}

/// The Llama shape described by a GGUF file's metadata (`llama.*` keys).
pub fn gguf_shape(g: &Gguf) -> Result<LlamaShape, CudaError> {
    let e = |e: crate::gguf::GgufError| CudaError::Config(e.to_string());
    let arch = g
        .metadata
        .get("general.architecture")
        .and_then(crate::gguf::Value::as_str)
        .unwrap_or("");
    if arch != "llama" {
        return Err(CudaError::Config(format!(
            "{}: general.architecture is `{arch}`, only `llama` is supported",
            g.path().display()
        )));
    }
    let hidden = g.meta_u32("llama.embedding_length").map_err(e)?;
    let heads = g.meta_u32("llama.attention.head_count").map_err(e)?;
    let vocab = match g.meta_u32("llama.vocab_size") {
        Ok(v) => v,
        Err(_) => g.tensor("token_embd.weight").map_err(e)?.dims[1] as u32,
    };
    let shape = LlamaShape {
        layers: g.meta_u32("llama.block_count").map_err(e)?,
        hidden,
        heads,
        kv_heads: g.meta_u32("llama.attention.head_count_kv").unwrap_or(heads),
        head_dim: hidden / heads.max(1),
        intermediate: g.meta_u32("llama.feed_forward_length").map_err(e)?,
        vocab,
        rope_theta: g.meta_f64("llama.rope.freq_base").unwrap_or(10000.0) as f32,
        rms_eps: g
            .meta_f64("llama.attention.layer_norm_rms_epsilon")
            .unwrap_or(1e-5) as f32,
        // SmolLM2 has no output.weight: the embedding doubles as the LM head.
        tied_embeddings: !g.tensors.contains_key("output.weight"),
        // GGUF Llama Q/K weights are permuted for interleaved RoPE pairs.
        rope_interleaved: true,
    };
    check_gguf(g, &shape)?;
    Ok(shape)
}

/// The metadata's shape against itself and against the file's tensors, before anything is
/// allocated for it: no zero dimension, heads a multiple of the KV heads and dividing the
/// hidden size, and every tensor the forward pass reads present with the shape the metadata
/// implies (so a `block_count` of 2^31 is an error naming the first missing layer).
fn check_gguf(g: &Gguf, s: &LlamaShape) -> Result<(), CudaError> {
    let path = g.path().display();
    let bad = |msg: String| CudaError::Config(format!("{path}: {msg}"));
    for (key, v) in [
        ("llama.block_count", s.layers),
        ("llama.embedding_length", s.hidden),
        ("llama.attention.head_count", s.heads),
        ("llama.attention.head_count_kv", s.kv_heads),
        ("llama.feed_forward_length", s.intermediate),
        ("llama.vocab_size", s.vocab),
    ] {
        if v == 0 {
            return Err(bad(format!("`{key}` is 0")));
        }
    }
    if !s.hidden.is_multiple_of(s.heads) {
        return Err(bad(format!(
            "`llama.embedding_length` ({}) is not a multiple of `llama.attention.head_count` ({})",
            s.hidden, s.heads
        )));
    }
    if !s.heads.is_multiple_of(s.kv_heads) {
        return Err(bad(format!(
            "`llama.attention.head_count` ({}) is not a multiple of `llama.attention.head_count_kv` ({})",
            s.heads, s.kv_heads
        )));
    }
    let (h, inter, vocab) = (
        u64::from(s.hidden),
        u64::from(s.intermediate),
        u64::from(s.vocab),
    );
    let qd = u64::from(s.heads) * u64::from(s.head_dim);
    let kvd = u64::from(s.kv_heads) * u64::from(s.head_dim);
    let expect = |name: &str, dims: &[u64]| -> Result<(), CudaError> {
        let t = g.tensor(name).map_err(|_| {
            bad(format!(
                "tensor `{name}` is not in the file, but the metadata (llama.block_count {}) needs it",
                s.layers
            ))
        })?;
        if t.dims != dims {
            return Err(bad(format!(
                "tensor `{name}` has shape {:?}, the metadata implies {dims:?}",
                t.dims
            )));
        }
        Ok(())
    };
    expect("token_embd.weight", &[h, vocab])?;
    if g.tensors.contains_key("output.weight") {
        expect("output.weight", &[h, vocab])?;
    }
    expect("output_norm.weight", &[h])?;
    for l in 0..s.layers {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        expect(&n("attn_norm"), &[h])?;
        expect(&n("attn_q"), &[h, qd])?;
        expect(&n("attn_k"), &[h, kvd])?;
        expect(&n("attn_v"), &[h, kvd])?;
        expect(&n("attn_output"), &[qd, h])?;
        expect(&n("ffn_norm"), &[h])?;
        expect(&n("ffn_gate"), &[h, inter])?;
        expect(&n("ffn_up"), &[h, inter])?;
        expect(&n("ffn_down"), &[inter, h])?;
    }
    Ok(())
}
