//! Measurements of the GPU and the CUDA runtime (`sim cuda-bench`, `sim calibrate --backend
//! cuda`): the ceilings (HBM bandwidth, bf16 GEMM rate), the attention and sampling
//! kernels and whole steps, each time reported against its floor.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PushKernelArg};
use engine::plan::{SeqWork, StepPlan, WorkKind};
use half::bf16;

use super::*;
use crate::cuda::meta::{attention_splits, q_tile_for_group, StepMeta};
use crate::cuda::{compile, open_device, CudaError, CudaRuntime, LlamaShape, K_TILE};

/// One benchmark line: measured time against its floor.
#[derive(Debug, Clone)]
pub struct BenchLine {
    /// What was measured.
    pub name: String,
    /// Median time, ms.
    pub ms: f64,
    /// The floor, ms (bytes / measured bandwidth or FLOPs / measured GEMM rate).
    pub floor_ms: f64,
    /// How the floor was computed.
    pub floor: String,
}

/// Median of `iters` timed runs of `f` on the stream (after `warmup` untimed runs).
pub(super) fn time_ms(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        a.record(stream)?;
        f()?;
        b.record(stream)?;
        b.synchronize()?;
        times.push(f64::from(a.elapsed_ms(&b)?));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Measured ceilings of the device.
#[derive(Debug, Clone, Copy)]
pub struct Ceilings {
    /// Device-to-device copy bandwidth, bytes/s (read + written).
    pub hbm_bw: f64,
    /// bf16 GEMM rate (8192^3, cuBLAS), FLOP/s.
    pub gemm_flops: f64,
}

/// Measures HBM bandwidth with a 2 GiB device-to-device copy and the bf16 GEMM rate with an
/// 8192^3 cuBLAS product on random data.
pub fn ceilings() -> Result<Ceilings, CudaError> {
    let ctx = open_device()?;
    let stream = ctx.default_stream();
    let n = 1usize << 30; // bf16 elements: 2 GiB
    let src = stream.alloc_zeros::<bf16>(n)?;
    let mut dst = stream.alloc_zeros::<bf16>(n)?;
    let copy_ms = time_ms(&ctx, &stream, 2, 10, || {
        stream.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;
    drop((src, dst));
    let m = 8192usize;
    let mut rng = SplitMix::new(7);
    let host: Vec<bf16> = (0..m * m).map(|_| bf16::from_f32(rng.uniform())).collect();
    let a = stream.clone_htod(&host)?;
    let b = stream.clone_htod(&host)?;
    let mut c = stream.alloc_zeros::<bf16>(m * m)?;
    let blas = CudaBlas::new(stream.clone())?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: m as i32,
        k: m as i32,
        alpha: bf16::ONE,
        lda: m as i32,
        ldb: m as i32,
        beta: bf16::ZERO,
        ldc: m as i32,
    };
    let gemm_ms = time_ms(&ctx, &stream, 3, 10, || {
        // SAFETY: three m x m buffers.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }?;
        Ok(())
    })?;
    Ok(Ceilings {
        hbm_bw: 2.0 * (n * 2) as f64 / (copy_ms * 1e-3),
        gemm_flops: 2.0 * (m as f64).powi(3) / (gemm_ms * 1e-3),
    })
}

/// Times the attention kernels of one layer on `plan` (random K/V/Q generated on the device).
pub(super) fn bench_attention(
    shape: &LlamaShape,
    plan: StepPlan,
    block_size: u32,
) -> Result<(f64, u32, f64), CudaError> {
    let ctx = open_device()?;
    let stream = ctx.default_stream();
    let kernels = compile(&ctx, shape.head_dim, shape.group())?;
    let blocks = plan
        .work
        .iter()
        .flat_map(|w| w.block_table.iter())
        .max()
        .map_or(1, |&b| b + 1);
    let cache = (blocks * block_size * shape.kv_heads * shape.head_dim) as u64;
    let meta = StepMeta::build(&plan, block_size, q_tile_for_group(shape.group()), 1 << 20);
    let l = meta.layout;
    let splits = if l.tiles == 0 {
        1
    } else {
        attention_splits(
            l.tiles,
            shape.kv_heads,
            meta.max_context(),
            crate::cuda::DECODE_BLOCKS_PER_SM
                * ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )? as u32,
            4 * K_TILE,
        )
    };
    let fill = |buf: &mut CudaSlice<bf16>, seed: u64| -> Result<(), CudaError> {
        let n = buf.len() as u64;
        let scale = 1.0f32;
        let mut b = stream.launch_builder(kernels.get("fill_uniform_bf16"));
        b.arg(buf).arg(&n).arg(&seed).arg(&scale);
        // SAFETY: writes n elements.
        unsafe { b.launch(crate::cuda::grid_for(n, 256)) }?;
        Ok(())
    };
    let qn = l.tokens * (shape.heads * shape.head_dim) as usize;
    // SAFETY: each buffer is filled right away.
    let mut k = unsafe { stream.alloc::<bf16>(cache as usize) }?;
    let mut v = unsafe { stream.alloc::<bf16>(cache as usize) }?;
    let mut q = unsafe { stream.alloc::<bf16>(qn) }?;
    fill(&mut k, 1)?;
    fill(&mut v, 2)?;
    fill(&mut q, 3)?;
    let p = Problem {
        plan,
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        block_size,
        num_blocks: blocks,
        window: 0,
        q: Vec::new(),
        k: Vec::new(),
        v: Vec::new(),
    };
    let meta_dev = stream.clone_htod(&meta.data)?;
    let mut out = stream.alloc_zeros::<bf16>(qn)?;
    let rows = l.tiles.max(1) * shape.heads as usize * splits as usize;
    let mut part_acc = stream.alloc_zeros::<f32>(rows * shape.head_dim as usize)?;
    let mut part_ml = stream.alloc_zeros::<f32>(2 * rows)?;
    let ms = time_ms(&ctx, &stream, 3, 20, || {
        run_attention(
            &stream,
            &kernels,
            &p,
            &meta,
            &q,
            &k,
            &v,
            &mut out,
            &mut part_acc,
            &mut part_ml,
            &meta_dev,
            splits,
        )
    })?;
    Ok((ms, splits, cache as f64 * 2.0 * 2.0))
}

/// Paged decode attention alone (one layer), `batch` sequences of `ctx` tokens; floor: the
/// K and V bytes over the measured bandwidth.
pub fn bench_decode_attention(
    shape: &LlamaShape,
    batch: u32,
    ctx_len: u32,
    block_size: u32,
    hbm_bw: f64,
) -> Result<BenchLine, CudaError> {
    let (ms, splits, bytes) = bench_attention(
        shape,
        batch_decode_plan(batch, ctx_len, block_size),
        block_size,
    )?;
    Ok(BenchLine {
        name: format!("decode attention, 1 layer, batch {batch} x {ctx_len} ctx ({splits} splits)"),
        ms,
        floor_ms: bytes / hbm_bw * 1e3,
        floor: format!("{:.2} GB of K+V / HBM bw", bytes / 1e9),
    })
}

/// Causal prefill attention alone (one layer) of one `tokens`-token prompt; floor: its
/// FLOPs over the measured GEMM rate.
pub fn bench_prefill_attention(
    shape: &LlamaShape,
    tokens: u32,
    block_size: u32,
    gemm_flops: f64,
) -> Result<BenchLine, CudaError> {
    let (ms, _, _) = bench_attention(shape, single_seq_plan(0, tokens, block_size), block_size)?;
    let t = f64::from(tokens);
    let flops = 4.0 * f64::from(shape.heads * shape.head_dim) * t * t / 2.0;
    Ok(BenchLine {
        name: format!("prefill attention, 1 layer, {tokens} tokens (causal)"),
        ms,
        floor_ms: flops / gemm_flops * 1e3,
        floor: format!("{:.1} GFLOP / GEMM rate", flops / 1e9),
    })
}

/// `sample_draws` on `draws` rows of a `vocab` vocabulary with temperature 0.8, top-k 50
/// and top-p 0.95 (both cuts: the slowest case); floor: one read of the logits.
pub fn bench_sampling(draws: usize, vocab: u32, hbm_bw: f64) -> Result<BenchLine, CudaError> {
    let ctx = open_device()?;
    let stream = ctx.default_stream();
    let kernels = compile(&ctx, 64, 1)?;
    let mut rng = SplitMix::new(7);
    let v = vocab as usize;
    let logits: Vec<f32> = (0..draws * v).map(|_| rng.uniform() * 12.0).collect();
    let mut data = Vec::new();
    for r in 0..draws {
        data.extend([
            r as i32,
            50,
            0.8f32.to_bits() as i32,
            0.95f32.to_bits() as i32,
            0.5f32.to_bits() as i32,
        ]);
    }
    let logits_dev = stream.clone_htod(&logits)?;
    let data_dev = stream.clone_htod(&data)?;
    let mut ids = stream.alloc_zeros::<i32>(draws)?;
    let view = data_dev.slice(0..data.len());
    let ms = time_ms(&ctx, &stream, 3, 20, || {
        crate::cuda::launch_sampling(
            &stream,
            &kernels,
            &mut ids,
            &logits_dev,
            &view,
            draws,
            vocab,
        )
    })?;
    let bytes = (draws * v * 4) as f64;
    Ok(BenchLine {
        name: format!("sampling, {draws} draws x vocab {vocab}, T 0.8 top-k 50 top-p 0.95"),
        ms,
        floor_ms: bytes / hbm_bw * 1e3,
        floor: format!("{:.1} MB of logits read once / HBM bw", bytes / 1e6),
    })
}

pub(super) fn single_seq_plan(start: u32, len: u32, block_size: u32) -> StepPlan {
    let table: Vec<u32> = (0..(start + len).div_ceil(block_size)).collect();
    crate::cuda::one_sequence_step(start, len, &table, &[], Default::default())
}

pub(super) fn batch_decode_plan(batch: u32, ctx: u32, block_size: u32) -> StepPlan {
    let n = ctx.div_ceil(block_size);
    StepPlan {
        work: (0..batch)
            .map(|i| SeqWork {
                seq: u64::from(i),
                kind: WorkKind::Decode,
                start: ctx - 1,
                len: 1,
                sample: true,
                num_samples: 1,
                block_table: (i * n..(i + 1) * n).collect(),
                token_ids: Vec::new(),
                sampling: Default::default(),
                drafts: None,
                suppress: Vec::new(),
                suppress_rows: 0,
            })
            .collect(),
        ..StepPlan::default()
    }
}

/// Whole forward steps of a synthetic model: batch-1 decode (floor: weight bytes / HBM
/// bandwidth), batch-64 decode, and a 2048-token prefill (floor: FLOPs / GEMM rate).
pub fn bench_steps(
    shape: &LlamaShape,
    ceil: Ceilings,
    block_size: u32,
) -> Result<Vec<BenchLine>, CudaError> {
    let blocks_needed = (64 * 1024u32).div_ceil(block_size) + 2048u32.div_ceil(block_size);
    let mut rt = CudaRuntime::synthetic(shape.clone(), 1, block_size, blocks_needed)?;
    let ctx = rt.ctx.clone();
    let stream = rt.stream.clone();
    let mut lines = Vec::new();
    let weights = shape.weight_bytes() as f64;
    let decode1 = single_seq_plan(511, 1, block_size);
    // The embedding table is not read by a decode step (one row is); the floor
    // counts all weight bytes, the tighter one does not.
    let embed = f64::from(shape.vocab) * f64::from(shape.hidden) * 2.0;
    rt.set_skinny_max_tokens(crate::cuda::SKINNY_MAX_TOKENS);
    rt.set_graphs(false);
    let ms = time_ms(&ctx, &stream, 3, 20, || rt.forward(&decode1).map(|_| ()))?;
    lines.push(BenchLine {
        name: "decode step, batch 1, ctx 512, skinny_gemm, eager launches".into(),
        ms,
        floor_ms: weights / ceil.hbm_bw * 1e3,
        floor: format!("{:.2} GB of weights / HBM bw", weights / 1e9),
    });
    rt.set_graphs(true);
    let ms = time_ms(&ctx, &stream, 3, 20, || rt.forward(&decode1).map(|_| ()))?;
    lines.push(BenchLine {
        name: "decode step, batch 1, ctx 512, skinny_gemm, CUDA graph".into(),
        ms,
        floor_ms: weights / ceil.hbm_bw * 1e3,
        floor: format!("{:.2} GB of weights / HBM bw", weights / 1e9),
    });
    lines.push(BenchLine {
        name: "  the same against the bytes a decode step reads".into(),
        ms,
        floor_ms: (weights - embed) / ceil.hbm_bw * 1e3,
        floor: format!(
            "{:.2} GB of weights less the embedding table / HBM bw",
            (weights - embed) / 1e9
        ),
    });
    // Where skinny_gemm stops paying: batches of 1-8 decodes, both GEMM paths, graphs on.
    for batch in [1u32, 2, 4, 8] {
        let plan = batch_decode_plan(batch, 2048, block_size);
        let kv = f64::from(batch) * 2048.0 * shape.kv_bytes_per_token() as f64;
        for (gemm, max) in [
            ("skinny_gemm", crate::cuda::SKINNY_MAX_TOKENS),
            ("cuBLAS", 0),
        ] {
            rt.set_skinny_max_tokens(max);
            let ms = time_ms(&ctx, &stream, 3, 20, || rt.forward(&plan).map(|_| ()))?;
            lines.push(BenchLine {
                name: format!("decode step, batch {batch}, ctx 2048, {gemm}, CUDA graph"),
                ms,
                floor_ms: (weights - embed + kv) / ceil.hbm_bw * 1e3,
                floor: format!(
                    "{:.2} GB weights (less embedding) + KV / HBM bw",
                    (weights - embed + kv) / 1e9
                ),
            });
        }
    }
    rt.set_skinny_max_tokens(crate::cuda::SKINNY_DEFAULT_TOKENS);
    let decode64 = batch_decode_plan(64, 1024, block_size);
    let kv = 64.0 * 1024.0 * shape.kv_bytes_per_token() as f64;
    let ms = time_ms(&ctx, &stream, 3, 20, || rt.forward(&decode64).map(|_| ()))?;
    lines.push(BenchLine {
        name: "decode step, batch 64, ctx 1024".into(),
        ms,
        floor_ms: (weights + kv) / ceil.hbm_bw * 1e3,
        floor: format!("{:.2} GB weights + KV / HBM bw", (weights + kv) / 1e9),
    });
    let t = 2048u32;
    let prefill = single_seq_plan(0, t, block_size);
    let ms = time_ms(&ctx, &stream, 2, 10, || rt.forward(&prefill).map(|_| ()))?;
    let h = f64::from(shape.hidden);
    let per_layer = h * f64::from(shape.qkv_dim())
        + f64::from(shape.heads * shape.head_dim) * h
        + 3.0 * h * f64::from(shape.intermediate);
    // 2 FLOPs per weight per token, all layers (the LM head runs for one token only).
    let linear = 2.0 * per_layer * f64::from(shape.layers);
    let attn = 4.0 * f64::from(shape.heads * shape.head_dim) * f64::from(t) * f64::from(t) / 2.0
        * f64::from(shape.layers);
    let flops = linear * f64::from(t) + attn;
    lines.push(BenchLine {
        name: format!("prefill step, {t} tokens"),
        ms,
        floor_ms: flops / ceil.gemm_flops * 1e3,
        floor: format!("{:.1} TFLOP / GEMM rate", flops / 1e12),
    });
    Ok(lines)
}

/// One measured step of [`measure_step_grid`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// Sequences (1 for a prefill).
    pub batch: u32,
    /// Context of each decode (tokens attended, the new one included); 0 for a prefill.
    pub ctx: u32,
    /// Tokens of the prefill; 0 for a decode step.
    pub tokens: u32,
    /// Median step time, ms (CUDA events).
    pub ms: f64,
}

/// Whole forward steps of a synthetic model over a grid, with the runtime's defaults
/// (CUDA graphs for small decodes, the batch-1 GEMM path): decode steps of `batch`
/// sequences at context `ctx` for each pair of `decodes`, and one-sequence prefills of
/// each of `prefills` tokens. Median of 20 timed runs (10 for prefills) after warm-up:
/// what `sim calibrate --backend cuda` fits the cost model to.
pub fn measure_step_grid(
    shape: &LlamaShape,
    block_size: u32,
    decodes: &[(u32, u32)],
    prefills: &[u32],
) -> Result<Vec<StepTime>, CudaError> {
    let need = decodes
        .iter()
        .map(|&(b, c)| b * c.div_ceil(block_size))
        .chain(prefills.iter().map(|&t| t.div_ceil(block_size)))
        .max()
        .unwrap_or(1)
        + 2;
    let mut rt = CudaRuntime::synthetic(shape.clone(), 1, block_size, need)?;
    rt.warm_up()?;
    // The durations a run reports (the runtime's own events around the step), so that
    // the fit and `sim fidelity` measure the same thing.
    let mut median = |plan: &StepPlan, warmup: usize, iters: usize| -> Result<f64, CudaError> {
        for _ in 0..warmup {
            rt.forward(plan)?;
        }
        let mut t = Vec::with_capacity(iters);
        for _ in 0..iters {
            t.push(rt.forward(plan)?.0 as f64 / 1e6);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    };
    let mut out = Vec::new();
    for &(batch, c) in decodes {
        let plan = batch_decode_plan(batch, c, block_size);
        let ms = median(&plan, 3, 20)?;
        out.push(StepTime {
            batch,
            ctx: c,
            tokens: 0,
            ms,
        });
    }
    for &t in prefills {
        let plan = single_seq_plan(0, t, block_size);
        let ms = median(&plan, 2, 10)?;
        out.push(StepTime {
            batch: 1,
            ctx: 0,
            tokens: t,
            ms,
        });
    }
    Ok(out)
}
