//! The backend that executes a variant's steps ([`BackendKind`]): the cost model of its
//! deployment (with the draft model's cost under speculative decoding), the CPU runtime (a
//! GGUF's weights or synthetic weights of the model's shape, KV capped in host memory), or
//! the CUDA runtime (synthetic weights, KV capped by the GPU's free memory). Real runtimes
//! report the number of KV blocks they really hold, which the engine then plans with.

use engine::backend::Backend;
use engine::scheduler::PreemptionMode;

use crate::catalog::Dtype;
use crate::cost_model::{CostModel, CostModelBackend};
use crate::scenario::{Scenario, Variant};
use crate::SimError;

/// Which backend executes the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendKind {
    /// The roofline cost model of the scenario's GPUs (no GPU needed).
    #[default]
    Model,
    /// Real kernels on the local NVIDIA GPU (synthetic weights of the scenario's model).
    Cuda,
    /// The CPU reference runtime: the weights of `model.gguf`, or synthetic weights of the
    /// scenario's model shape.
    Cpu,
}

/// The backend of `variant` and the KV blocks it holds (the memory plan's pool for the cost
/// model; what a real runtime could allocate, at most that).
pub(super) fn build(
    kind: BackendKind,
    scenario: &Scenario,
    variant: &Variant,
) -> Result<(Box<dyn Backend>, u32), SimError> {
    Ok(match kind {
        BackendKind::Model => (Box::new(cost_model(variant)), variant.memory.num_blocks),
        BackendKind::Cuda => {
            let (rt, blocks) = cuda_runtime(variant, scenario.seed)?;
            (Box::new(kernels::cuda::CudaBackend::new(rt)), blocks)
        }
        BackendKind::Cpu => {
            let (rt, blocks) = cpu_runtime(variant, scenario, scenario.seed)?;
            (Box::new(kernels::cpu::CpuBackend::new(rt)), blocks)
        }
    })
}

/// The cost model of a variant, with its draft model's cost when it speculates with one.
fn cost_model(variant: &Variant) -> CostModelBackend {
    let backend = CostModelBackend::new(
        CostModel::new(variant.deployment.clone(), variant.config.cost.clone())
            .with_block_size(variant.memory.block_size)
            .with_sliding_window(variant.scheduler.sliding_window)
            .with_profile(variant.profile.clone())
            .with_disk_bw(variant.config.engine.kv_disk_gbs * 1e9),
    );
    match &variant.draft {
        Some(d) => {
            let t = &variant.deployment.model;
            let shares_kv = d.model.name == t.name && d.model.layers < t.layers;
            backend.with_draft(
                CostModel::new(d.clone(), variant.config.cost.clone())
                    .with_block_size(variant.memory.block_size),
                shares_kv,
            )
        }
        None => backend,
    }
}

/// Host memory the CPU runtime's KV cache may take (f32 K and V of every layer).
const CPU_KV_BUDGET_BYTES: u64 = 2 << 30;

/// A real runtime that cannot be built for a variant, as the run's error.
fn runtime_err(variant: &Variant, backend: &str, message: String) -> SimError {
    SimError::Run {
        variant: variant.name.clone(),
        source: Box::new(crate::driver::DriverError::Backend(
            engine::backend::BackendError {
                backend: backend.into(),
                message,
            },
        )),
    }
}

/// Builds the CPU runtime of a variant: the weights of `model.gguf`, or synthetic weights
/// of its model's shape, with the memory plan's KV pool capped at [`CPU_KV_BUDGET_BYTES`]
/// of host memory.
fn cpu_runtime(
    variant: &Variant,
    scenario: &Scenario,
    seed: u64,
) -> Result<(kernels::cpu::CpuRuntime, u32), SimError> {
    let cpu_err = |message: String| runtime_err(variant, "cpu", message);
    let d = &variant.deployment;
    if d.tp != 1 || d.pp != 1 || d.model.is_moe() || !d.model.arch.is_plain() {
        return Err(cpu_err(format!(
            "model {} with tp = {}, pp = {}: the CPU runtime runs dense models on one device",
            d.model.name, d.tp, d.pp
        )));
    }
    if !d.model.gated_mlp {
        return Err(cpu_err(format!(
            "model {}: the CPU runtime runs Llama-architecture models (a gated MLP); this one's MLP has two matrices",
            d.model.name
        )));
    }
    let m = &variant.memory;
    let shape = d.model.llama_shape();
    let per_block = u64::from(m.block_size)
        * 2
        * u64::from(shape.layers)
        * u64::from(shape.kv_heads * shape.head_dim)
        * 4;
    let blocks = m
        .num_blocks
        .min((CPU_KV_BUDGET_BYTES / per_block.max(1)).max(1) as u32);
    let mut rt = match &variant.config.model.gguf {
        Some(path) => {
            let g = kernels::gguf::Gguf::open(&scenario.base_dir.join(path))
                .map_err(|e| cpu_err(e.to_string()))?;
            kernels::cpu::CpuRuntime::from_gguf(&g, m.block_size, blocks)
        }
        None => kernels::cpu::CpuRuntime::synthetic(shape, seed, m.block_size, blocks),
    }
    .map_err(|e| cpu_err(e.to_string()))?;
    rt.set_sliding_window(variant.scheduler.sliding_window);
    if variant.config.engine.preemption_mode == PreemptionMode::Swap {
        // Host memory too: the swap pool is capped like the KV cache.
        rt.with_swap_space(m.num_cpu_blocks.min(blocks));
    }
    // A real draft model: self-speculation by the target's first layers (n-gram drafts
    // come from the engine).
    let spec = variant.scheduler.speculative.as_ref();
    if spec.is_some_and(|s| s.method == engine::spec::Method::DraftModel) {
        let layers = variant
            .config
            .speculative
            .as_ref()
            .and_then(|s| s.self_draft_layers)
            .ok_or_else(|| {
                cpu_err(
                    "speculative.method = \"draft-model\" on the CPU runtime drafts by self-speculation: set speculative.self_draft_layers (the target's first N layers)"
                        .into(),
                )
            })?;
        rt.set_self_speculation(Some(layers as usize));
    }
    if spec.is_some_and(|s| s.method == engine::spec::Method::Synthetic) {
        return Err(cpu_err(
            "speculative.method = \"synthetic\" has no drafts to verify: use ngram or draft-model with a real backend"
                .into(),
        ));
    }
    Ok((rt, blocks))
}

/// Builds the CUDA runtime of a variant (synthetic weights of its model) and the number of
/// KV blocks it holds: the memory plan's pool, capped by what the GPU really has free after
/// the weights, the activation peak and 1 GiB of headroom.
fn cuda_runtime(
    variant: &Variant,
    seed: u64,
) -> Result<(kernels::cuda::CudaRuntime, u32), SimError> {
    let cuda_err = |e: kernels::cuda::CudaError| runtime_err(variant, "cuda", e.to_string());
    if variant
        .scheduler
        .speculative
        .as_ref()
        .is_some_and(|s| s.method != engine::spec::Method::Ngram)
    {
        return Err(cuda_err(kernels::cuda::CudaError::Config(
            "[speculative]: the CUDA runtime verifies the engine's n-gram drafts (method = \"ngram\"); a draft model (self-speculation) runs on --backend cpu, synthetic acceptance on --backend model".into(),
        )));
    }
    if variant.deployment.pp != 1 {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "hardware.pp = {}: the CUDA backend runs on one GPU (no pipeline stages yet)",
            variant.deployment.pp
        ))));
    }
    if variant.deployment.tp != 1 {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "hardware.tp = {}: the CUDA backend runs on one GPU (tensor parallelism needs NCCL, not built yet)",
            variant.deployment.tp
        ))));
    }
    let d = &variant.deployment;
    if d.model.is_moe() || !d.model.gated_mlp || !d.model.arch.is_plain() {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "model {}: the CUDA runtime runs dense Llama-architecture models only (no mixture of experts, two-matrix MLP, latent, sliding or linear attention yet)",
            d.model.name
        ))));
    }
    if !matches!(d.dtype, Dtype::Bf16 | Dtype::Fp16) {
        return Err(cuda_err(kernels::cuda::CudaError::Config(format!(
            "model.dtype = {}: the CUDA runtime runs 16-bit weights (set model.dtype = \"bf16\")",
            d.dtype.as_str()
        ))));
    }
    let shape = variant.deployment.model.llama_shape();
    let info = kernels::cuda::probe().map_err(cuda_err)?;
    let m = &variant.memory;
    let free = info.free_mem as f64 * m.gpu_memory_utilization
        - shape.weight_bytes() as f64
        - m.activation_bytes
        - 1024.0 * 1024.0 * 1024.0;
    let fit =
        kernels::cuda::CudaRuntime::blocks_that_fit(&shape, m.block_size, free.max(0.0) as u64);
    let blocks = m.num_blocks.min(fit);
    let mut rt = kernels::cuda::CudaRuntime::synthetic(shape, seed, m.block_size, blocks)
        .map_err(cuda_err)?;
    rt.set_sliding_window(variant.scheduler.sliding_window);
    if variant.config.engine.preemption_mode == PreemptionMode::Swap {
        rt.with_swap_space(m.num_cpu_blocks).map_err(cuda_err)?;
    }
    rt.warm_up().map_err(cuda_err)?;
    Ok((rt, blocks))
}
