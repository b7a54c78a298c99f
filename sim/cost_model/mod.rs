//! The cost model: what a step of the engine costs on a GPU, and how much KV cache the GPU
//! holds, predicted instead of measured (DESIGN §5-6).
//!
//! - [`Deployment`] (`deployment.rs`): a catalog model on catalog GPUs, with TP/PP and formats.
//! - [`memory_plan`] (`memory.rs`): weights, activations, overhead and the KV pool in blocks.
//! - [`CostModel`] (`roofline.rs`): each operator on the roofline, summed into a step.
//! - [`Routing`] (`routing.rs`): the distinct experts a step's tokens touch (uniform or
//!   skewed routing).
//! - [`CostParams`] and [`Framework`] (`params.rs`, `framework.rs`): efficiencies and the
//!   serving framework's CPU overheads, a scenario's `[cost]` table.
//! - [`profiled::ProfiledCosts`] (`profiled/`): measured operator times in place of the
//!   roofline's layers, where a profile of the model on the GPU exists.
//! - [`CostModelBackend`] (`backend.rs`): the cost model as the engine's backend.
//! - [`calibration`]: fits of the parameters to operator profiles, published rows and
//!   measured steps (`sim calibrate`); [`validation`]: the fitted model against every
//!   measurement (`sim validate-model`, VALIDATION.md) and against a real backend
//!   (`sim fidelity`).
//!
//! In: a [`Deployment`], [`CostParams`] and step plans. Out: step durations with their
//! FLOPs and bytes, and memory plans.

mod backend;
pub mod calibration;
mod deployment;
mod framework;
mod measurements;
mod memory;
mod params;
pub mod profiled;
mod roofline;
mod routing;
pub mod validation;

pub use backend::CostModelBackend;
pub use deployment::{kv_cache_bytes, Deployment, KvGroup, PageLayout, Parallel};
pub use framework::{
    Framework, CUSTOM_ALLREDUCE_LATENCY_US, CUSTOM_ALLREDUCE_MAX_BYTES, CUSTOM_ALLREDUCE_MAX_GPUS,
    VLLM_2023_PROFILE,
};
pub use memory::{memory_plan, FitError, MemoryInputs, MemoryPlan};
pub use params::{CostParams, ExpertCost, ExpertFormat, ExpertShape, GpuCost};
pub use roofline::{CostModel, StepCost, P2P_LATENCY_US};
pub use routing::Routing;
