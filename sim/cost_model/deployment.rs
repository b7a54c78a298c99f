//! A model on hardware ([`Deployment`]): weights per GPU under tensor and pipeline
//! parallelism, KV heads and bytes per token on each GPU. The memory plan and the roofline
//! both start from it.

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
}

impl Deployment {
    /// Weight bytes held by each GPU (linear layers and embeddings split over TP, norms
    /// replicated).
    pub fn weight_bytes_per_gpu(&self) -> f64 {
        let m = &self.model;
        let linear =
            f64::from(self.layers_per_stage()) * m.layer_linear_params() * self.dtype.bytes();
        let heads = if m.tied_embeddings { 1.0 } else { 2.0 };
        // Under pipeline parallelism the first stage holds the embedding and the last the
        // LM head: a stage holds at most one of them.
        let stage_heads = if self.pp > 1 { 1.0 } else { heads };
        let embeddings = stage_heads * m.embedding_params() * self.dtype.embedding_bytes();
        // Norm weights stay in 16 bits (and are negligible).
        let norms = (m.params()
            - f64::from(m.layers) * m.layer_linear_params()
            - heads * m.embedding_params())
            * 2.0;
        (linear + embeddings) / f64::from(self.tp) + norms
    }

    /// Layers of the largest pipeline stage.
    pub fn layers_per_stage(&self) -> u32 {
        self.model.layers.div_ceil(self.pp.max(1))
    }

    /// GPUs of one replica (`tp x pp`).
    pub fn num_gpus(&self) -> u32 {
        self.tp * self.pp.max(1)
    }

    /// KV heads stored on each GPU (at least one: a head is replicated when TP exceeds the
    /// KV head count).
    pub fn kv_heads_per_gpu(&self) -> u32 {
        (self.model.kv_heads / self.tp).max(1)
    }

    /// KV bytes per token on one GPU: 2 (K and V) x layers x kv_heads x head_dim x bytes.
    pub fn kv_bytes_per_token(&self) -> f64 {
        kv_cache_bytes(
            self.layers_per_stage(),
            self.kv_heads_per_gpu(),
            self.model.head_dim,
            1,
            1,
            self.kv_dtype.bytes(),
        )
    }
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
