//! The CUDA runtime: a Llama forward pass over the engine's paged KV cache on an NVIDIA GPU,
//! through cudarc with dynamic loading (the build needs no CUDA toolkit).
//!
//! Kernels live in `kernels.cu` and are compiled at run time with NVRTC for the device's
//! architecture, with the model's head size and GQA group as macros. GEMMs go through
//! cuBLAS in bf16 with fp32 accumulation. The KV cache of each layer is two device arrays
//! laid out as the block manager's blocks (`[block][kv_head][slot][head_dim]`), so the block
//! tables in a [`StepPlan`] address it directly. Steps are timed with CUDA events.
//!
//! Weights are synthetic (random bf16 generated on the device for any catalog shape, so
//! e.g. Llama-3-8B can be timed on an H100 without downloading weights) or a GGUF model's,
//! dequantized to bf16 at load ([`CudaRuntime::from_gguf`]).
//!
//! Without a GPU, [`probe`] and [`CudaRuntime::synthetic`] return [`CudaError::NoDriver`] (or the
//! library that is missing) instead of panicking: cudarc panics on first use of a library it
//! cannot load, so every entry point checks the libraries first.

pub mod check;
mod device;
mod launch;
pub mod meta;
mod shape;

pub use device::*;
pub use launch::*;
pub use shape::*;

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, PushKernelArg};
use engine::plan::{SeqWork, StepPlan, WorkKind};
use half::bf16;

use self::meta::{attention_splits, q_tile_for_group, StepMeta};
pub use crate::generate::{one_sequence_step, Generation};
use crate::gguf::Gguf;

struct LayerWeights {
    attn_norm: CudaSlice<bf16>,
    wqkv: CudaSlice<bf16>,
    wo: CudaSlice<bf16>,
    mlp_norm: CudaSlice<bf16>,
    w_gate_up: CudaSlice<bf16>,
    w_down: CudaSlice<bf16>,
}

/// Activation buffers for up to `tokens` tokens and `samples` sampled rows.
struct Activations {
    tokens: usize,
    samples: usize,
    /// The residual stream in fp32 (as llama.cpp keeps it): bf16 here flips near-tied
    /// greedy choices.
    residual: CudaSlice<f32>,
    h: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    q: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    delta: CudaSlice<bf16>,
    gate_up: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
    last: CudaSlice<bf16>,
    logits: CudaSlice<f32>,
    ids: CudaSlice<i32>,
}

/// A model on the GPU with its paged KV cache.
pub struct CudaRuntime {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    shape: LlamaShape,
    sm_count: u32,
    q_tile: u32,
    embed: CudaSlice<bf16>,
    lm_head: Option<CudaSlice<bf16>>,
    final_norm: CudaSlice<bf16>,
    layers: Vec<LayerWeights>,
    k_cache: Vec<CudaSlice<bf16>>,
    v_cache: Vec<CudaSlice<bf16>>,
    num_blocks: u32,
    block_size: u32,
    act: Option<Activations>,
    meta: CudaSlice<i32>,
    part_acc: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    start: CudaEvent,
    end: CudaEvent,
    keep_logits: bool,
    logits: Vec<f32>,
    /// Accepted drafts of the last step's verify works.
    accepted: Vec<u32>,
    /// Log-probabilities of the last step's drawn tokens (when a work asked).
    logprobs: Vec<Option<engine::plan::TokenLogprobs>>,
    /// Every GEMM's reduction size is a multiple of 8 (`skinny_gemm` applies).
    skinny_ok: bool,
    /// Steps of at most this many tokens use `skinny_gemm` (0: never).
    skinny_max: usize,
    _blas_workspace: CudaSlice<u8>,
    use_graphs: bool,
    /// CUDA graphs of decode steps by (layout, splits).
    graphs: HashMap<(meta::MetaLayout, u32), CudaGraph>,
    /// Sliding attention window in tokens (0: none).
    window: i32,
    swap: Option<SwapPool>,
    /// Device copy of the block moves of a step.
    xfer: CudaSlice<i32>,
}

/// The weights of a model on the device.
struct ModelWeights {
    embed: CudaSlice<bf16>,
    lm_head: Option<CudaSlice<bf16>>,
    final_norm: CudaSlice<bf16>,
    layers: Vec<LayerWeights>,
}

/// Loads (or generates, seeded, on the device) every weight of `shape`, in a fixed order
/// (the synthetic weights' seeds depend on it): the embedding, the LM head when untied, each
/// layer's projections then its norms, the final norm.
fn load_weights(
    stream: &Arc<CudaStream>,
    k: &Kernels,
    shape: &LlamaShape,
    weights: Weights<'_>,
) -> Result<ModelWeights, CudaError> {
    let h = shape.hidden as usize;
    let alloc = |n: usize| -> Result<CudaSlice<bf16>, CudaError> {
        // SAFETY: every weight buffer is filled right after allocation.
        Ok(unsafe { stream.alloc::<bf16>(n.max(1)) }?)
    };
    let mut counter = 0u64;
    let mut fill = |buf: &mut CudaSlice<bf16>, fan_in: usize| -> Result<(), CudaError> {
        counter += 1;
        let n = buf.len() as u64;
        let seed = match weights {
            Weights::Synthetic(seed) => seed,
            Weights::Gguf(_) => 0,
        };
        let s = seed.wrapping_mul(1_000_003).wrapping_add(counter << 40);
        let scale = 1.0f32 / (fan_in.max(1) as f32).sqrt();
        let mut b = stream.launch_builder(k.get("fill_uniform_bf16"));
        b.arg(buf).arg(&n).arg(&s).arg(&scale);
        // SAFETY: the kernel writes n elements of buf.
        unsafe { b.launch(grid_for(n, 256)) }?;
        Ok(())
    };
    let ones = |n: usize| -> Result<CudaSlice<bf16>, CudaError> {
        let mut buf = alloc(n)?;
        let n64 = n as u64;
        let one = 1.0f32;
        let mut b = stream.launch_builder(k.get("fill_const_bf16"));
        b.arg(&mut buf).arg(&n64).arg(&one);
        // SAFETY: writes n elements.
        unsafe { b.launch(grid_for(n64, 256)) }?;
        Ok(buf)
    };
    let vocab = shape.vocab as usize;
    let qd = (shape.heads * shape.head_dim) as usize;
    let inter = shape.intermediate as usize;
    // Uploads host f32 values as bf16.
    let upload = |v: Vec<f32>| -> Result<CudaSlice<bf16>, CudaError> {
        let host: Vec<bf16> = v.into_iter().map(bf16::from_f32).collect();
        Ok(stream.clone_htod(&host)?)
    };
    // A weight: random, or the stacked rows of GGUF tensors ([`Gguf::stacked`]).
    let mut weight = |names: &[(String, u64)], fan_in: u64| -> Result<CudaSlice<bf16>, CudaError> {
        let rows: u64 = names.iter().map(|(_, r)| r).sum();
        match weights {
            Weights::Synthetic(_) => {
                let mut w = alloc((rows * fan_in) as usize)?;
                fill(&mut w, fan_in as usize)?;
                Ok(w)
            }
            Weights::Gguf(g) => upload(
                g.stacked(names, fan_in)
                    .map_err(|e| CudaError::Config(e.to_string()))?,
            ),
        }
    };
    let (vocab_u, h_u) = (vocab as u64, h as u64);
    let embed = weight(&[("token_embd.weight".into(), vocab_u)], h_u)?;
    let lm_head = if shape.tied_embeddings {
        None
    } else {
        Some(weight(&[("output.weight".into(), vocab_u)], h_u)?)
    };
    let kvd = u64::from(shape.kv_heads * shape.head_dim);
    let mut layers = Vec::with_capacity(shape.layers as usize);
    for l in 0..shape.layers {
        let [attn_norm, wqkv, wo, mlp_norm, w_gate_up, w_down] =
            crate::gguf::llama_layer(l, [h_u, qd as u64, kvd, inter as u64]);
        let wqkv = weight(&wqkv.0, wqkv.1)?;
        let wo = weight(&wo.0, wo.1)?;
        let w_gate_up = weight(&w_gate_up.0, w_gate_up.1)?;
        let w_down = weight(&w_down.0, w_down.1)?;
        let (attn_norm, mlp_norm) = match weights {
            Weights::Synthetic(_) => (ones(h)?, ones(h)?),
            Weights::Gguf(_) => (
                weight(&attn_norm.0, attn_norm.1)?,
                weight(&mlp_norm.0, mlp_norm.1)?,
            ),
        };
        layers.push(LayerWeights {
            attn_norm,
            wqkv,
            wo,
            mlp_norm,
            w_gate_up,
            w_down,
        });
    }
    let final_norm = match weights {
        Weights::Synthetic(_) => ones(h)?,
        Weights::Gguf(_) => weight(&[("output_norm.weight".into(), 1)], h_u)?,
    };
    Ok(ModelWeights {
        embed,
        lm_head,
        final_norm,
        layers,
    })
}

impl CudaRuntime {
    /// Loads a model of `shape` with synthetic weights (seeded, uniform in +-1/sqrt(fan-in),
    /// generated on the device), compiles the kernels, and allocates a KV cache of
    /// `num_blocks` blocks of `block_size` tokens.
    pub fn synthetic(
        shape: LlamaShape,
        seed: u64,
        block_size: u32,
        num_blocks: u32,
    ) -> Result<CudaRuntime, CudaError> {
        Self::build(shape, Weights::Synthetic(seed), block_size, num_blocks)
    }

    /// Loads a Llama-architecture GGUF model (weights dequantized to bf16 on the host and
    /// uploaded) with a KV cache of `num_blocks` blocks of `block_size` tokens.
    pub fn from_gguf(
        gguf: &Gguf,
        block_size: u32,
        num_blocks: u32,
    ) -> Result<CudaRuntime, CudaError> {
        let shape = gguf_shape(gguf)?;
        Self::build(shape, Weights::Gguf(gguf), block_size, num_blocks)
    }

    fn build(
        shape: LlamaShape,
        weights: Weights<'_>,
        block_size: u32,
        num_blocks: u32,
    ) -> Result<CudaRuntime, CudaError> {
        shape.validate()?;
        let ctx = open_device()?;
        // One stream, no cross-stream tracking needed. Not the legacy default stream: that
        // one cannot be captured into a CUDA graph.
        // SAFETY: every buffer of this runtime is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        let blas_workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
        {
            use cudarc::driver::DevicePtr;
            let (ws, _g) = blas_workspace.device_ptr(&stream);
            // SAFETY: the workspace lives as long as the handle (both in the runtime) and
            // is used on the handle's stream only.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ws as *mut _,
                    CUBLAS_WORKSPACE_BYTES,
                )
                .result()?;
            }
        }
        let k = compile(&ctx, shape.head_dim, shape.group())?;
        let sm_count = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as u32;
        let (free, _) = ctx.mem_get_info()?;
        let need = shape.weight_bytes()
            + u64::from(num_blocks) * u64::from(block_size) * shape.kv_bytes_per_token();
        if need > free as u64 {
            return Err(CudaError::Config(format!(
                "the model ({:.2} GB of weights) and its KV cache ({} blocks, {:.2} GB) need {:.2} GB but the GPU has {:.2} GB free",
                shape.weight_bytes() as f64 / 1e9,
                num_blocks,
                (need - shape.weight_bytes()) as f64 / 1e9,
                need as f64 / 1e9,
                free as f64 / 1e9
            )));
        }
        let ModelWeights {
            embed,
            lm_head,
            final_norm,
            layers,
        } = load_weights(&stream, &k, &shape, weights)?;
        let cache_len =
            num_blocks as usize * block_size as usize * (shape.kv_heads * shape.head_dim) as usize;
        let mut k_cache = Vec::with_capacity(shape.layers as usize);
        let mut v_cache = Vec::with_capacity(shape.layers as usize);
        for _ in 0..shape.layers {
            k_cache.push(stream.alloc_zeros::<bf16>(cache_len.max(1))?);
            v_cache.push(stream.alloc_zeros::<bf16>(cache_len.max(1))?);
        }
        let start = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        let meta = stream.alloc_zeros::<i32>(1)?;
        let part_acc = stream.alloc_zeros::<f32>(1)?;
        let part_ml = stream.alloc_zeros::<f32>(1)?;
        let xfer = stream.alloc_zeros::<i32>(1)?;
        stream.synchronize()?;
        let skinny_ok = [
            shape.hidden,
            shape.heads * shape.head_dim,
            shape.intermediate,
        ]
        .iter()
        .all(|k| k.is_multiple_of(8));
        Ok(CudaRuntime {
            skinny_ok,
            skinny_max: SKINNY_DEFAULT_TOKENS,
            _blas_workspace: blas_workspace,
            use_graphs: true,
            graphs: HashMap::new(),
            window: 0,
            swap: None,
            xfer,
            q_tile: q_tile_for_group(shape.group()),
            ctx,
            stream,
            blas,
            k,
            shape,
            sm_count,
            embed,
            lm_head,
            final_norm,
            layers,
            k_cache,
            v_cache,
            num_blocks,
            block_size,
            act: None,
            meta,
            part_acc,
            part_ml,
            start,
            end,
            keep_logits: false,
            logits: Vec::new(),
            accepted: Vec::new(),
            logprobs: Vec::new(),
        })
    }

    /// KV blocks that fit in `free_bytes` of device memory for this shape.
    pub fn blocks_that_fit(shape: &LlamaShape, block_size: u32, free_bytes: u64) -> u32 {
        let per_block = u64::from(block_size) * shape.kv_bytes_per_token();
        (free_bytes / per_block.max(1)).min(u64::from(u32::MAX)) as u32
    }

    /// Keep the logits of the sampled rows of each step (for correctness checks).
    pub fn keep_logits(&mut self, on: bool) {
        self.keep_logits = on;
    }

    /// Logits of the last step's sampled rows (`samples x vocab`), when kept.
    pub fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Free device memory in bytes right now.
    pub fn free_memory(&self) -> Result<usize, CudaError> {
        Ok(self.ctx.mem_get_info()?.0)
    }

    /// The model shape.
    pub fn shape(&self) -> &LlamaShape {
        &self.shape
    }

    /// Multiprocessors of the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// KV blocks and block size.
    pub fn kv_geometry(&self) -> (u32, u32) {
        (self.num_blocks, self.block_size)
    }

    fn ensure_activations(&mut self, tokens: usize, samples: usize) -> Result<(), CudaError> {
        if let Some(a) = &self.act {
            if a.tokens >= tokens && a.samples >= samples {
                return Ok(());
            }
        }
        // Grow to the next power of two so that a run settles after a few steps. Captured
        // graphs hold the old buffers' addresses.
        self.graphs.clear();
        let tokens = tokens.next_power_of_two().max(16);
        let samples = samples.next_power_of_two().max(16);
        let s = &self.shape;
        let h = s.hidden as usize;
        let z = |n: usize| self.stream.alloc_zeros::<bf16>(n.max(1));
        self.act = None; // free the old buffers first
        self.act = Some(Activations {
            tokens,
            samples,
            residual: self.stream.alloc_zeros::<f32>(tokens * h)?,
            h: z(tokens * h)?,
            qkv: z(tokens * s.qkv_dim() as usize)?,
            q: z(tokens * (s.heads * s.head_dim) as usize)?,
            attn: z(tokens * (s.heads * s.head_dim) as usize)?,
            delta: z(tokens * h)?,
            gate_up: z(tokens * 2 * s.intermediate as usize)?,
            act: z(tokens * s.intermediate as usize)?,
            last: z(samples * h)?,
            logits: self.stream.alloc_zeros::<f32>(samples * s.vocab as usize)?,
            ids: self.stream.alloc_zeros::<i32>(samples)?,
        });
        Ok(())
    }

    /// Replays a CUDA graph for decode steps of up to [`SKINNY_MAX_TOKENS`] tokens (on by
    /// default); off, every kernel is launched one by one.
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        self.graphs.clear();
    }

    /// Runs a prefill and a decode step through the first KV blocks (that the engine later
    /// overwrites) so that cuBLAS's lazy kernel loading and the first graph capture happen
    /// before the timed run, as vLLM's start-up profiling does: the first real step would
    /// otherwise take ~100 ms more.
    pub fn warm_up(&mut self) -> Result<(), CudaError> {
        let len = (4 * self.block_size).min(self.num_blocks.saturating_mul(self.block_size));
        if len < 2 {
            return Ok(());
        }
        let blocks: Vec<u32> = (0..len.div_ceil(self.block_size)).collect();
        let greedy = engine::request::SamplingParams::default();
        self.forward(&one_sequence_step(0, len - 1, &blocks, &[], greedy))?;
        self.forward(&one_sequence_step(len - 1, 1, &blocks, &[], greedy))?;
        Ok(())
    }

    /// Steps of at most `tokens` tokens multiply by the weights with `skinny_gemm`, larger
    /// ones with cuBLAS (0: cuBLAS always; capped at [`SKINNY_MAX_TOKENS`]).
    pub fn set_skinny_max_tokens(&mut self, tokens: usize) {
        self.skinny_max = tokens.min(SKINNY_MAX_TOKENS);
        self.graphs.clear();
    }

    /// Sliding-window attention over the last `window` positions (Mistral); the block
    /// tables may then hold NULL blocks before the window.
    pub fn set_sliding_window(&mut self, window: Option<u32>) {
        self.window = window.map_or(0, |w| w.min(i32::MAX as u32) as i32);
        self.graphs.clear();
    }

    /// Adds a CPU swap pool of `cpu_blocks` KV blocks (all layers, K and V) in pinned host
    /// memory mapped into the device's address space, for swap preemption.
    pub fn with_swap_space(&mut self, cpu_blocks: u32) -> Result<(), CudaError> {
        self.swap = None;
        if cpu_blocks == 0 {
            return Ok(());
        }
        let len = cpu_blocks as usize * self.block_elems() * 2 * self.shape.layers as usize;
        let flags = cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP
            | cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the pool is only read where swap-outs wrote it first (the block manager
        // swaps in only blocks it swapped out).
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<bf16>(len, flags) }?;
        let ptr = host.as_mut_ptr()?;
        let mut dev: cudarc::driver::sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live pinned allocation made with DEVICEMAP.
        unsafe {
            cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr.cast(), 0).result()?;
        }
        self.swap = Some(SwapPool {
            _host: host,
            dev,
            blocks: cpu_blocks,
        });
        Ok(())
    }

    /// bf16 elements of one KV block of one layer's K (or V) cache.
    fn block_elems(&self) -> usize {
        (self.shape.kv_heads * self.block_size * self.shape.head_dim) as usize
    }

    /// Moves KV blocks before a step, in the plan's order: swap-outs to the CPU pool, then
    /// copy-on-write block copies, then swap-ins. One `copy_blocks` launch per layer, K and
    /// V, and kind of move.
    fn transfers(&mut self, plan: &StepPlan) -> Result<(), CudaError> {
        if !plan.has_transfers() {
            return Ok(());
        }
        let cpu_blocks = self.swap.as_ref().map_or(0, |s| s.blocks);
        let swaps = plan.swap_in.len() + plan.swap_out.len();
        if swaps > 0 && self.swap.is_none() {
            return Err(CudaError::Config(format!(
                "step {}: the plan swaps {swaps} blocks but the runtime has no CPU swap pool (engine.swap_space_gib)",
                plan.step
            )));
        }
        let check = |what: &str, b: u32, limit: u32| {
            if b >= limit {
                Err(CudaError::Config(format!(
                    "step {}: {what} block {b} is outside its pool ({limit} blocks)",
                    plan.step
                )))
            } else {
                Ok(())
            }
        };
        let mut data = Vec::with_capacity(2 * (swaps + plan.block_copies.len()));
        for &(g, c) in &plan.swap_out {
            check("swap-out GPU", g, self.num_blocks)?;
            check("swap-out CPU", c, cpu_blocks)?;
            data.extend([g as i32, c as i32]);
        }
        for &(s, d) in &plan.block_copies {
            check("copy source", s, self.num_blocks)?;
            check("copy destination", d, self.num_blocks)?;
            data.extend([s as i32, d as i32]);
        }
        for &(c, g) in &plan.swap_in {
            check("swap-in CPU", c, cpu_blocks)?;
            check("swap-in GPU", g, self.num_blocks)?;
            data.extend([c as i32, g as i32]);
        }
        if self.xfer.len() < data.len() {
            self.xfer = self
                .stream
                .alloc_zeros::<i32>(data.len().next_power_of_two())?;
        }
        self.stream.memcpy_htod(&data, &mut self.xfer)?;
        use cudarc::driver::DevicePtr;
        let elems = self.block_elems();
        let block_elems = elems as i64;
        let bytes_per_layer_kv = u64::from(cpu_blocks) * elems as u64 * 2;
        let pool = self.swap.as_ref().map_or(0, |s| s.dev);
        let st = &self.stream;
        let f = self.k.get("copy_blocks");
        let groups = [
            (0usize, plan.swap_out.len(), 0u8),
            (plan.swap_out.len(), plan.block_copies.len(), 1),
            (
                plan.swap_out.len() + plan.block_copies.len(),
                plan.swap_in.len(),
                2,
            ),
        ];
        for (first, n, kind) in groups {
            if n == 0 {
                continue;
            }
            let pairs = self.xfer.slice(2 * first..2 * (first + n));
            for li in 0..self.shape.layers as usize {
                for (kv, cache) in [&self.k_cache[li], &self.v_cache[li]]
                    .into_iter()
                    .enumerate()
                {
                    let (gpu, _g) = cache.device_ptr(st);
                    let cpu = pool + (2 * li as u64 + kv as u64) * bytes_per_layer_kv;
                    let (dst, src) = match kind {
                        0 => (cpu, gpu),
                        1 => (gpu, gpu),
                        _ => (gpu, cpu),
                    };
                    let mut b = st.launch_builder(f);
                    b.arg(&dst).arg(&src).arg(&pairs).arg(&block_elems);
                    let cfg = block_per_item(n, 256);
                    // SAFETY: every pair was checked against its pool above; a block of
                    // block_elems bf16 (a multiple of 8: head_dim is) starts at each index.
                    unsafe { b.launch(cfg) }?;
                }
            }
        }
        Ok(())
    }

    /// Runs one step of the forward pass (after the plan's block moves); returns its
    /// duration (CUDA events, ns) and the drawn tokens: `num_samples` for each sampling
    /// sequence, in plan order (argmax, or as its sampling parameters say).
    pub fn forward(&mut self, plan: &StepPlan) -> Result<(u64, Vec<u32>), CudaError> {
        self.accepted.clear();
        self.logprobs.clear();
        let window = (self.window > 0).then_some(self.window as u32);
        crate::generate::check_plan(
            plan,
            self.num_blocks,
            self.block_size,
            window,
            self.shape.vocab,
            true,
        )
        .map_err(CudaError::Config)?;
        if let Some(w) = plan.work.iter().find(|w| {
            w.kind == engine::plan::WorkKind::Verify && w.token_ids.len() != w.len as usize
        }) {
            return Err(CudaError::Config(format!(
                "sequence {}: the CUDA runtime verifies the engine's drafts (n-gram); drafting by a model (self-speculation) runs on the CPU runtime",
                w.seq
            )));
        }
        let (bs, q_tile, vocab) = (self.block_size, self.q_tile, self.shape.vocab);
        let mut meta = StepMeta::build(plan, bs, q_tile, vocab);
        let graph = self.use_graphs
            && plan.num_verify() == 0
            && meta.layout.ptiles == 0
            && meta.layout.tokens <= GRAPH_MAX_TOKENS
            && meta.layout.draws <= GRAPH_MAX_TOKENS;
        if graph {
            meta = StepMeta::build_padded(plan, bs, q_tile, vocab, true);
        }
        let l = meta.layout;
        if l.tokens == 0 {
            // A step of block moves only (swap-outs of preempted sequences).
            self.start.record(&self.stream)?;
            self.transfers(plan)?;
            self.end.record(&self.stream)?;
            self.stream.synchronize()?;
            let ms = self.start.elapsed_ms(&self.end)?;
            return Ok(((f64::from(ms) * 1e6).round() as u64, Vec::new()));
        }
        self.ensure_activations(l.tokens, l.samples.max(l.draws))?;
        if self.meta.len() < l.len {
            self.meta = self.stream.alloc_zeros::<i32>(l.len.next_power_of_two())?;
            self.graphs.clear();
        }
        let s = &self.shape;
        // Graph steps size their splits for the padded table, so that one graph serves
        // contexts up to its width.
        let max_context = if graph {
            (l.max_blocks as u32).saturating_mul(bs)
        } else {
            meta.max_context()
        };
        let splits = if l.tiles == 0 {
            1
        } else {
            attention_splits(
                l.tiles,
                s.kv_heads,
                max_context,
                DECODE_BLOCKS_PER_SM * self.sm_count,
                4 * K_TILE,
            )
        };
        if splits > 1 {
            let rows = l.tiles * s.heads as usize * splits as usize;
            if self.part_acc.len() < rows * s.head_dim as usize {
                self.part_acc = self
                    .stream
                    .alloc_zeros::<f32>((rows * s.head_dim as usize).next_power_of_two())?;
                self.part_ml = self
                    .stream
                    .alloc_zeros::<f32>((2 * rows).next_power_of_two())?;
                self.graphs.clear();
            }
        }
        // Capture before the timed region: vLLM captures its graphs at start-up.
        if graph && !self.graphs.contains_key(&(l, splits)) {
            self.capture(&l, splits)?;
        }
        self.start.record(&self.stream)?;
        self.transfers(plan)?;
        self.stream.memcpy_htod(&meta.data, &mut self.meta)?;
        match self.graphs.get(&(l, splits)).filter(|_| graph) {
            Some(g) => g.launch()?,
            None => self.enqueue(&l, splits)?,
        }
        self.end.record(&self.stream)?;
        let (sampled, host_ns) = if l.samples > 0 {
            self.collect_samples(plan, &l)?
        } else {
            (Vec::new(), 0)
        };
        self.stream.synchronize()?;
        let ms = self.start.elapsed_ms(&self.end)?;
        Ok((
            ((f64::from(ms) * 1e6).round().max(1.0) as u64).saturating_add(host_ns),
            sampled,
        ))
    }

    /// Captures the kernels of a step of layout `l` into a CUDA graph (the cache emptied
    /// when it is full) and uploads it.
    fn capture(&mut self, l: &meta::MetaLayout, splits: u32) -> Result<(), CudaError> {
        if self.graphs.len() >= MAX_GRAPHS {
            self.graphs.clear();
        }
        self.stream.begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )?;
        let enqueued = self.enqueue(l, splits);
        let captured = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        enqueued?;
        let g = captured?.ok_or_else(|| {
            CudaError::Config("CUDA graph capture of a decode step returned no graph".into())
        })?;
        g.upload()?;
        self.graphs.insert((*l, splits), g);
        Ok(())
    }

    /// The tokens of a step's sampled rows, in plan order: the sampling kernel's draws, and
    /// for verify works the host's verification of their logits rows (whose time, returned
    /// in ns, counts in the step's).
    fn collect_samples(
        &mut self,
        plan: &StepPlan,
        l: &meta::MetaLayout,
    ) -> Result<(Vec<u32>, u64), CudaError> {
        let mut sampled = Vec::new();
        let mut host_ns = 0u64;
        let Some(a) = self.act.as_ref() else {
            return Err(CudaError::Config("activation buffers missing".into()));
        };
        let mut host = vec![0i32; a.ids.len()];
        self.stream.memcpy_dtoh(&a.ids, &mut host)?;
        let vocab = self.shape.vocab as usize;
        let verifies = plan.num_verify() > 0;
        // Greedy verify works (n-gram's usual case) are verified from the kernel's draws,
        // each row's argmax, as plain decoding takes them; the others need their rows on
        // the host (a 128k vocabulary: 0.5 MB per row, about 0.7 ms per sequence on the
        // H200 when every verify was done there).
        let greedy_verify = |w: &SeqWork| {
            w.kind == WorkKind::Verify && w.sampling.is_greedy() && w.suppress_rows == 0
        };
        let host_verifies = plan
            .work
            .iter()
            .any(|w| w.kind == WorkKind::Verify && !greedy_verify(w));
        // Draws that must mask stops (min_tokens) are redrawn on the host from masked rows,
        // as verify works are verified there: the kernel's draw ignores masks.
        let suppresses = plan.work.iter().any(|w| w.suppress_rows > 0);
        let wants_logprobs = plan.work.iter().any(|w| w.sampling.logprobs.is_some());
        // Host verification is part of the step (vLLM verifies inside its step), as are
        // the log-probabilities computed there.
        let host_started = std::time::Instant::now();
        let mut logits = if self.keep_logits || host_verifies || suppresses || wants_logprobs {
            self.stream
                .clone_dtoh(&a.logits.slice(0..l.samples * vocab))?
        } else {
            Vec::new()
        };
        // Log-probabilities are the raw logits': kept aside when masks change them.
        let raw = (wants_logprobs && suppresses).then(|| logits.clone());
        if suppresses {
            crate::sampling::suppress_plan(&mut logits, vocab, &plan.work);
        }
        let draws: Vec<u32> = host[..l.draws]
            .iter()
            .map(|&x| {
                u32::try_from(x)
                    .ok()
                    .filter(|&t| t < self.shape.vocab)
                    .ok_or_else(|| {
                        CudaError::Config(format!("the sampling kernel returned token {x}"))
                    })
            })
            .collect::<Result<_, _>>()?;
        if verifies || suppresses {
            // Verify works are verified on the host from their logits rows, as the
            // CPU runtime does; masked draws are drawn there too; the other works keep the
            // kernel's draws.
            let (mut row, mut d) = (0usize, 0usize);
            for w in &plan.work {
                if w.kind == WorkKind::Verify {
                    let (accepted, tokens) = if greedy_verify(w) {
                        let rows = &draws[d..d + w.len as usize];
                        crate::generate::verify_greedy(w, &w.token_ids, rows)
                    } else {
                        crate::generate::verify_work(w, &w.token_ids, |j| {
                            &logits[(row + j) * vocab..(row + j + 1) * vocab]
                        })
                    };
                    sampled.extend(tokens);
                    self.accepted.push(accepted);
                    row += w.len as usize;
                    d += w.len as usize;
                } else if w.sample {
                    let n = w.num_samples.max(1) as usize;
                    if w.suppress_rows > 0 {
                        let at = &logits[row * vocab..(row + 1) * vocab];
                        let pos = w.start + w.len;
                        for j in 0..n as u32 {
                            let u = w.sampling.uniform(w.seq, pos, j);
                            sampled.push(crate::sampling::draw(at, &w.sampling, u));
                        }
                    } else {
                        sampled.extend_from_slice(&draws[d..d + n]);
                    }
                    row += 1;
                    d += n;
                }
            }
        } else {
            sampled = draws;
        }
        self.logprobs = if wants_logprobs {
            crate::sampling::step_logprobs(
                raw.as_deref().unwrap_or(&logits),
                vocab,
                &plan.work,
                &sampled,
                &self.accepted,
            )
        } else {
            Vec::new()
        };
        if verifies || suppresses || wants_logprobs {
            host_ns = host_started.elapsed().as_nanos() as u64;
        }
        if self.keep_logits {
            self.logits = logits;
        }
        Ok((sampled, host_ns))
    }

    /// Enqueues the kernels of one step whose metadata (layout `l`) is in `self.meta`:
    /// embedding, the layers, and for sampled rows the final norm, LM head and argmax.
    fn enqueue(&mut self, l: &meta::MetaLayout, splits: u32) -> Result<(), CudaError> {
        let Some(a) = self.act.as_mut() else {
            return Err(CudaError::Config("activation buffers missing".into()));
        };
        let ids = self.meta.slice(l.ids..l.ids + l.tokens);
        let positions = self.meta.slice(l.positions..l.positions + l.tokens);
        let slots = self.meta.slice(l.slots..l.slots + l.tokens);
        let sample_rows = self
            .meta
            .slice(l.sample_rows..l.sample_rows + l.samples.max(1));
        let s = &self.shape;
        let t = l.tokens;
        let (h, qd) = (s.hidden as usize, (s.heads * s.head_dim) as usize);
        let inter = s.intermediate as usize;
        let hidden = s.hidden as i32;
        let tok_cfg = |threads: u32| block_per_item(t, threads);
        let st = &self.stream;
        let kf = &self.k;
        let ops = Ops {
            blas: &self.blas,
            st,
            kf,
            skinny_max: if self.skinny_ok { self.skinny_max } else { 0 },
        };
        {
            let mut b = st.launch_builder(kf.get("embed_gather"));
            b.arg(&mut a.residual)
                .arg(&self.embed)
                .arg(&ids)
                .arg(&hidden);
            // SAFETY: t rows of `hidden`; ids < vocab.
            unsafe { b.launch(tok_cfg(256)) }?;
        }
        let (heads, kv_heads, bs) = (s.heads as i32, s.kv_heads as i32, self.block_size as i32);
        let (eps, theta) = (s.rms_eps, s.rope_theta);
        let interleaved = i32::from(s.rope_interleaved);
        for (li, lw) in self.layers.iter().enumerate() {
            // Layer 0 normalises the embeddings; later layers first add the MLP output.
            add_rmsnorm(st, kf, a, li > 0, &lw.attn_norm, t, hidden, eps)?;
            ops.linear(&mut a.qkv, &a.h, &lw.wqkv, t, h, s.qkv_dim() as usize)?;
            {
                let mut b = st.launch_builder(kf.get("rope_write_kv"));
                b.arg(&a.qkv)
                    .arg(&mut a.q)
                    .arg(&mut self.k_cache[li])
                    .arg(&mut self.v_cache[li])
                    .arg(&positions)
                    .arg(&slots)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&bs)
                    .arg(&theta)
                    .arg(&interleaved);
                // SAFETY: slots address blocks < num_blocks (checked in forward).
                unsafe { b.launch(tok_cfg(128)) }?;
            }
            launch_attention(
                st,
                kf,
                l,
                &self.meta,
                &mut a.attn,
                &mut self.part_acc,
                &mut self.part_ml,
                &a.q,
                &self.k_cache[li],
                &self.v_cache[li],
                [s.heads, s.kv_heads, s.head_dim, self.block_size],
                splits,
                self.window,
            )?;
            ops.linear(&mut a.delta, &a.attn, &lw.wo, t, qd, h)?;
            add_rmsnorm(st, kf, a, true, &lw.mlp_norm, t, hidden, eps)?;
            ops.linear(&mut a.gate_up, &a.h, &lw.w_gate_up, t, h, 2 * inter)?;
            {
                let tl = t as i64;
                let it = inter as i32;
                let mut b = st.launch_builder(kf.get("silu_mul"));
                b.arg(&mut a.act).arg(&a.gate_up).arg(&tl).arg(&it);
                // SAFETY: t x inter outputs from t x 2 inter inputs.
                unsafe { b.launch(grid_for((t * inter) as u64, 256)) }?;
            }
            ops.linear(&mut a.delta, &a.act, &lw.w_down, t, inter, h)?;
        }
        if l.samples > 0 {
            add_rmsnorm(st, kf, a, true, &self.final_norm, t, hidden, eps)?;
            {
                let mut b = st.launch_builder(kf.get("gather_rows"));
                b.arg(&mut a.last).arg(&a.h).arg(&sample_rows).arg(&hidden);
                let cfg = block_per_item(l.samples, 256);
                // SAFETY: sample rows index tokens of this step.
                unsafe { b.launch(cfg) }?;
            }
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            ops.linear_f32_out(&mut a.logits, &a.last, head, l.samples, h, s.vocab as usize)?;
            let draws = self
                .meta
                .slice(l.draw_data..l.draw_data + meta::DRAW_INTS * l.draws);
            launch_sampling(st, kf, &mut a.ids, &a.logits, &draws, l.draws, s.vocab)?;
        }
        Ok(())
    }
}

/// The CPU swap pool: pinned host memory laid out `[layer][K, V][cpu block][block]`, and
/// its address on the device.
struct SwapPool {
    _host: cudarc::driver::PinnedHostSlice<bf16>,
    dev: cudarc::driver::sys::CUdeviceptr,
    blocks: u32,
}

impl crate::generate::StepRuntime for CudaRuntime {
    const NAME: &'static str = "cuda";
    fn step(&mut self, plan: &StepPlan) -> Result<(u64, Vec<u32>), String> {
        self.forward(plan).map_err(|e| e.to_string())
    }
    fn take_accepted(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.accepted)
    }
    fn take_logprobs(&mut self) -> Vec<Option<engine::plan::TokenLogprobs>> {
        std::mem::take(&mut self.logprobs)
    }
    fn kv_geometry(&self) -> (u32, u32) {
        (self.num_blocks, self.block_size)
    }
}

/// The CUDA runtime as an engine backend.
pub type CudaBackend = crate::generate::RuntimeBackend<CudaRuntime>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes of the catalog: (head_dim, GQA group).
    const SHAPES: [(u32, u32); 5] = [(128, 4), (128, 1), (128, 8), (64, 3), (64, 8)];

    #[test]
    fn launch_configurations_fit_the_devices() {
        for (head_dim, group) in SHAPES {
            // Dynamic shared memory of the prefill kernel: under the opt-in limit of A100
            // (163 KB) and H100 (227 KB), and its 64-row tile holds whole tokens.
            assert!(meta::prefill_smem_bytes(head_dim) <= 163 * 1024);
            let q_tile = q_tile_for_group(group);
            assert!(q_tile * group <= 64 && q_tile >= 1);
            // The decode kernel's static shared memory (Q rows in fp32, K/V tiles, P):
            // under the 48 KB static limit for every GQA group the kernel accepts.
            let rows = group;
            let static_smem = rows * head_dim * 4
                + K_TILE * (head_dim + 2) * 2
                + K_TILE * head_dim * 2
                + rows * (K_TILE + 1) * 4
                + rows * 4;
            assert!(
                static_smem <= 48 * 1024,
                "{head_dim}/{group}: {static_smem}"
            );
            assert_eq!(head_dim % 64, 0);
        }
        assert_eq!(arch_for((9, 0)), "sm_90");
        assert_eq!(arch_for((8, 0)), "sm_80");
        assert_eq!(arch_for((8, 9)), "sm_89");
    }

    #[test]
    fn skinny_kernels_cover_their_token_counts() {
        for t in 1..=SKINNY_MAX_TOKENS {
            for f32_out in [false, true] {
                let Some(name) = skinny_kernel(t, f32_out) else {
                    panic!("no skinny_gemm for {t} tokens");
                };
                assert!(KERNEL_NAMES.contains(&name), "{name} is not loaded");
                let cap: usize = name
                    .rsplit('_')
                    .next()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                // The smallest compiled instance that holds t rows (powers of two).
                assert!(cap >= t && cap < 2 * t, "{t} tokens -> {name}");
                assert_eq!(name.contains("f32"), f32_out);
            }
        }
        assert_eq!(skinny_kernel(SKINNY_MAX_TOKENS + 1, false), None);
        // One warp per output row, every row covered, no block beyond the last row.
        for n in [1usize, 8, 576, 4097, 128_256] {
            let c = skinny_config(n);
            let rows = c.grid_dim.0 as usize * (c.block_dim.0 / 32) as usize;
            assert!(rows >= n && rows < n + SKINNY_WARPS as usize, "{n}");
        }
    }

    #[test]
    fn shapes_are_validated() {
        let mut s = LlamaShape {
            layers: 1,
            hidden: 64,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            intermediate: 128,
            vocab: 100,
            rope_theta: 1e4,
            rms_eps: 1e-5,
            tied_embeddings: true,
            rope_interleaved: true,
        };
        assert!(s.validate().is_ok());
        assert_eq!(s.qkv_dim(), 15 * 64);
        s.kv_heads = 4;
        assert!(s.validate().is_err());
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // On machines without a GPU (CI) every entry point answers with an error.
        if libraries_present().is_err() {
            assert!(probe().is_err());
            assert!(attention_check_needs_device());
        }
    }

    fn attention_check_needs_device() -> bool {
        check::attention_check(1).is_err()
    }

    /// Compiles every kernel with NVRTC for sm_80 and sm_90 and each catalog head size and
    /// GQA group. Needs only the NVRTC library and the CUDA headers, no GPU: `.ci/run`
    /// fetches them from PyPI and runs this test.
    #[test]
    #[ignore = "needs libnvrtc and the CUDA headers (SIM_CUDA_INCLUDE); .ci/run provides them"]
    fn kernels_compile_with_nvrtc() {
        assert!(nvrtc_present(), "libnvrtc not found on LD_LIBRARY_PATH");
        for arch in ["sm_80", "sm_90"] {
            for (head_dim, group) in SHAPES {
                let ptx = match compile_ptx(arch, head_dim, group) {
                    Ok(p) => p.to_src(),
                    Err(e) => panic!("{arch} d{head_dim} g{group}: {e}"),
                };
                for name in KERNEL_NAMES {
                    assert!(
                        ptx.contains(&format!(".entry {name}(")),
                        "{arch} d{head_dim} g{group}: no entry {name}"
                    );
                }
            }
        }
    }
}
