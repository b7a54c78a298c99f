//! Real execution runtimes for the serving engine (DESIGN §7).
//!
//! This crate will hold the backends that really run a model behind the same
//! [`engine::backend::Backend`] trait as the cost model: the GGUF reader and tokenizer, the
//! Llama forward pass over the engine's paged KV cache on the CPU, and the CUDA kernels
//! (cudarc, NVRTC, cuBLAS). Until those land, `sim` runs with the cost-model backend only
//! (`--backend model`); the crate is part of the workspace so the dependency direction
//! (`kernels` imports `engine`, never the reverse) is fixed from the start.
#![warn(missing_docs)]

pub use engine::backend::Backend;
