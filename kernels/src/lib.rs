//! Real execution runtimes for the serving engine (DESIGN §7).
//!
//! Backends here run a model for real behind the same [`engine::backend::Backend`] trait as
//! the cost model, so the scheduler, block manager and worker above them are one code path.
//!
//! - [`cuda`]: the CUDA runtime (cudarc with dynamic loading, kernels compiled at run time
//!   with NVRTC, GEMMs through cuBLAS, CUDA-event timing), with synthetic weights for any
//!   Llama-architecture shape. It builds on machines without CUDA; at run time a missing
//!   driver is a clear error, never a panic.
//!
//! - [`gguf`]: the GGUF reader (metadata, tensors, dequantization), through which the CUDA
//!   runtime loads real weights.
//! - [`tokenizer`]: the model file's byte-level BPE tokenizer and chat template.
//! - [`cpu`]: the CPU runtime (quantized weights, AVX-512 VNNI / AVX2 kernels, a spinning
//!   thread team) over the same paged KV layout.
//! - [`sampling`], [`generate`], [`oracle`]: token draws, the generation loop and engine
//!   backend shared by both runtimes, and llama.cpp's reference outputs.
#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;
pub mod generate;
pub mod gguf;
pub mod oracle;
pub mod sampling;
pub mod tokenizer;

pub use engine::backend::Backend;
