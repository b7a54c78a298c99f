//! Checks and measurements that need a GPU (`sim cuda-check`, `sim cuda-bench`).
//!
//! The attention check follows the method of the lent-GPU notes: fresh random inputs for
//! every case, an output poisoned before the run (so an unwritten element shows), a float64
//! reference on the host, and the relative error ‖out − ref‖ / ‖ref‖. The benchmarks report
//! each time as a ratio to its floor: bytes over the measured HBM bandwidth, or FLOPs over
//! the measured bf16 GEMM rate.

use std::path::Path;
use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PushKernelArg};
use engine::plan::{SeqWork, StepPlan, WorkKind};
use half::bf16;

use super::meta::{attention_splits, q_tile_for_group, StepMeta};
use super::{compile, open_device, CudaError, CudaRuntime, LlamaShape, K_TILE};
use crate::gguf::Gguf;

/// SplitMix64: a small deterministic generator for test inputs.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / 16_777_216.0) * 2.0 - 1.0
    }

    /// Uniform integer in [lo, hi].
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }
}

/// One attention check case and its result.
#[derive(Debug, Clone)]
pub struct AttentionCase {
    /// Description of the shapes.
    pub name: String,
    /// Relative error against the float64 reference.
    pub rel_err: f64,
    /// Output elements never written (still poisoned) or not finite.
    pub bad: usize,
    /// Flash-decoding splits used.
    pub splits: u32,
}

/// A random paged-attention problem: sequences with contexts, the query chunk each computes
/// (decode = 1 token), random block tables over a shuffled pool.
struct Problem {
    plan: StepPlan,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    num_blocks: u32,
    /// Sliding window in tokens (0: none); blocks wholly before it are NULL in the tables.
    window: u32,
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
}

fn random_problem(
    rng: &mut SplitMix,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    seqs: &[(u32, u32)],
    window: u32,
) -> Problem {
    // seqs: (context after the step, tokens computed in the step).
    let blocks_needed: u32 = seqs.iter().map(|&(c, _)| c.div_ceil(block_size)).sum();
    let num_blocks = blocks_needed + 3;
    let mut pool: Vec<u32> = (0..num_blocks).collect();
    for i in (1..pool.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        pool.swap(i, j);
    }
    let mut next = 0usize;
    let work = seqs
        .iter()
        .enumerate()
        .map(|(i, &(ctx, len))| {
            let n = ctx.div_ceil(block_size) as usize;
            let mut table = pool[next..next + n].to_vec();
            next += n;
            if window > 0 {
                // As the block manager does: blocks wholly before the first written token's
                // window are freed and NULL in the table.
                let lo = (ctx - len + 1).saturating_sub(window);
                for b in table.iter_mut().take((lo / block_size) as usize) {
                    *b = engine::block_manager::NULL_BLOCK;
                }
            }
            SeqWork {
                seq: i as u64,
                kind: if len == 1 {
                    WorkKind::Decode
                } else {
                    WorkKind::Prefill
                },
                start: ctx - len,
                len,
                sample: true,
                num_samples: 1,
                block_table: table,
                token_ids: Vec::new(),
                sampling: Default::default(),
                drafts: None,
            }
        })
        .collect();
    let tokens: u32 = seqs.iter().map(|&(_, l)| l).sum();
    let gen = |rng: &mut SplitMix, n: usize| -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32(rng.uniform())).collect()
    };
    let cache = (num_blocks * block_size * kv_heads * head_dim) as usize;
    Problem {
        plan: StepPlan {
            work,
            ..StepPlan::default()
        },
        heads,
        kv_heads,
        head_dim,
        block_size,
        num_blocks,
        window,
        q: gen(rng, (tokens * heads * head_dim) as usize),
        k: gen(rng, cache),
        v: gen(rng, cache),
    }
}

/// Float64 reference of causal paged attention for every token and head.
fn reference(p: &Problem) -> Vec<f64> {
    let (hq, hk, d, bs) = (
        p.heads as usize,
        p.kv_heads as usize,
        p.head_dim as usize,
        p.block_size as usize,
    );
    let group = hq / hk;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::new();
    for w in &p.plan.work {
        for pos in w.start..w.start + w.len {
            let t = out.len() / (hq * d);
            for h in 0..hq {
                let kh = h / group;
                let q = &p.q[(t * hq + h) * d..][..d];
                let key = |j: usize| {
                    let blk = w.block_table[j / bs] as usize;
                    ((blk * hk + kh) * bs + j % bs) * d
                };
                let n = pos as usize + 1;
                let lo = if p.window > 0 {
                    n.saturating_sub(p.window as usize)
                } else {
                    0
                };
                let scores: Vec<f64> = (lo..n)
                    .map(|j| {
                        let k = &p.k[key(j)..][..d];
                        q.iter()
                            .zip(k)
                            .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for dd in 0..d {
                    let acc: f64 = (lo..n)
                        .map(|j| e[j - lo] * f64::from(p.v[key(j) + dd].to_f32()))
                        .sum();
                    out.push(acc / z);
                }
            }
        }
    }
    out
}

/// Runs the attention kernels once on the device.
#[allow(clippy::too_many_arguments)]
fn run_attention(
    stream: &Arc<CudaStream>,
    kernels: &super::Kernels,
    p: &Problem,
    meta: &StepMeta,
    q: &CudaSlice<bf16>,
    k: &CudaSlice<bf16>,
    v: &CudaSlice<bf16>,
    out: &mut CudaSlice<bf16>,
    part_acc: &mut CudaSlice<f32>,
    part_ml: &mut CudaSlice<f32>,
    meta_dev: &CudaSlice<i32>,
    splits: u32,
) -> Result<(), CudaError> {
    super::launch_attention(
        stream,
        kernels,
        &meta.layout,
        meta_dev,
        out,
        part_acc,
        part_ml,
        q,
        k,
        v,
        [p.heads, p.kv_heads, p.head_dim, p.block_size],
        splits,
        p.window as i32,
    )
}

struct DeviceProblem {
    meta: StepMeta,
    meta_dev: CudaSlice<i32>,
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    part_acc: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
}

fn upload(
    stream: &Arc<CudaStream>,
    p: &Problem,
    max_splits: u32,
) -> Result<DeviceProblem, CudaError> {
    let meta = StepMeta::build(
        &p.plan,
        p.block_size,
        q_tile_for_group(p.heads / p.kv_heads),
        1 << 20,
    );
    let rows = meta.layout.tiles.max(1) * p.heads as usize * max_splits as usize;
    Ok(DeviceProblem {
        meta_dev: stream.clone_htod(&meta.data)?,
        q: stream.clone_htod(&p.q)?,
        k: stream.clone_htod(&p.k)?,
        v: stream.clone_htod(&p.v)?,
        out: stream.alloc_zeros::<bf16>(p.q.len())?,
        part_acc: stream.alloc_zeros::<f32>((rows * p.head_dim as usize).max(1))?,
        part_ml: stream.alloc_zeros::<f32>((2 * rows).max(1))?,
        meta,
    })
}

/// Checks the paged-attention kernel against a float64 reference on random problems: head
/// sizes 64 and 128, GQA groups 1, 3, 4 and 8, block sizes 8 to 32, decodes and prefill
/// chunks over cached context, with and without flash-decoding splits.
pub fn attention_check(seed: u64) -> Result<Vec<AttentionCase>, CudaError> {
    let ctx = open_device()?;
    let stream = ctx.default_stream();
    let mut rng = SplitMix::new(seed);
    let mut cases = Vec::new();
    // (heads, kv_heads, head_dim)
    for (heads, kv_heads, head_dim) in [
        (9, 3, 64),
        (32, 8, 128),
        (8, 8, 128),
        (16, 2, 128),
        (8, 1, 64),
    ] {
        let kernels = compile(&ctx, head_dim, heads / kv_heads)?;
        for block_size in [8u32, 16, 32] {
            // A mix: decodes at varied contexts, a prefill from scratch, a chunk over cache.
            let mut seqs = vec![
                (rng.range(1, 40), 1),
                (rng.range(200, 700), 1),
                (rng.range(30, 90), rng.range(20, 30)),
            ];
            let c = rng.range(100, 300);
            seqs.push((c, c));
            seqs.push((rng.range(1, 3), 1));
            // Sliding windows shorter and longer than the contexts, on 16-token blocks.
            let window = if block_size == 16 {
                rng.range(20, 120)
            } else {
                0
            };
            let p = random_problem(
                &mut rng, heads, kv_heads, head_dim, block_size, &seqs, window,
            );
            let want = reference(&p);
            for splits in [1u32, 4] {
                let mut d = upload(&stream, &p, splits)?;
                // Poison: a huge value an unwritten element keeps.
                let poison = vec![bf16::from_f32(3.0e38); p.q.len()];
                stream.memcpy_htod(&poison, &mut d.out)?;
                run_attention(
                    &stream,
                    &kernels,
                    &p,
                    &d.meta,
                    &d.q,
                    &d.k,
                    &d.v,
                    &mut d.out,
                    &mut d.part_acc,
                    &mut d.part_ml,
                    &d.meta_dev,
                    splits,
                )?;
                stream.synchronize()?;
                let got = stream.clone_dtoh(&d.out)?;
                let mut num = 0.0f64;
                let mut den = 0.0f64;
                let mut bad = 0;
                for (g, w) in got.iter().zip(&want) {
                    let g = f64::from(g.to_f32());
                    if !g.is_finite() || g.abs() > 1e30 {
                        bad += 1;
                        continue;
                    }
                    num += (g - w) * (g - w);
                    den += w * w;
                }
                cases.push(AttentionCase {
                    name: if window > 0 {
                        format!(
                            "heads {heads}/{kv_heads} d{head_dim} block {block_size} window {window}"
                        )
                    } else {
                        format!(
                            "heads {heads}/{kv_heads} d{head_dim} block {block_size} (blocks {})",
                            p.num_blocks
                        )
                    },
                    rel_err: (num / den.max(1e-300)).sqrt(),
                    bad,
                    splits,
                });
            }
        }
    }
    Ok(cases)
}

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
fn time_ms(
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
fn bench_attention(
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
            super::DECODE_BLOCKS_PER_SM
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
        unsafe { b.launch(super::grid_for(n, 256)) }?;
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
        super::launch_sampling(
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

fn single_seq_plan(start: u32, len: u32, block_size: u32) -> StepPlan {
    let table: Vec<u32> = (0..(start + len).div_ceil(block_size)).collect();
    super::one_sequence_step(start, len, &table, &[], Default::default())
}

fn batch_decode_plan(batch: u32, ctx: u32, block_size: u32) -> StepPlan {
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
    rt.set_skinny_max_tokens(super::SKINNY_MAX_TOKENS);
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
        for (gemm, max) in [("skinny_gemm", super::SKINNY_MAX_TOKENS), ("cuBLAS", 0)] {
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
    rt.set_skinny_max_tokens(super::SKINNY_DEFAULT_TOKENS);
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

/// One oracle prompt run through the CUDA runtime with the real model.
#[derive(Debug, Clone)]
pub struct OracleCase {
    /// The prompt (shortened for display).
    pub prompt: String,
    /// Greedy tokens generated.
    pub generated: usize,
    /// Leading tokens equal to llama.cpp's.
    pub matched: usize,
    /// Logit margin (top-1 minus top-2, ours) at the first differing position.
    pub margin_at_divergence: Option<f32>,
    /// Largest |our logit - llama.cpp's| over the oracle's top-8 ids at the first four
    /// generated positions (compared only while the tokens agree).
    pub max_logit_err: f32,
}

/// Runs every case of a llama.cpp oracle file (`shared/oracle/*.json`: `prompt_ids`,
/// `greedy_ids`, `top_logits`) through the CUDA runtime with the model's real weights: one
/// prefill step of the prompt, then greedy decode steps, each through the paged KV cache.
pub fn oracle_check(gguf: &Gguf, oracle: &Path) -> Result<Vec<OracleCase>, CudaError> {
    let cases = crate::oracle::read(oracle).map_err(CudaError::Config)?;
    let block_size = 16u32;
    let blocks = 256u32; // 4096 tokens
    let mut rt = CudaRuntime::from_gguf(gguf, block_size, blocks)?;
    rt.keep_logits(true);
    let vocab = rt.shape().vocab as usize;
    let mut out = Vec::new();
    for case in &cases {
        let (prompt_ids, want, tops) = (&case.prompt_ids, &case.greedy_ids, &case.tops);
        if prompt_ids.is_empty() || prompt_ids.len() + want.len() > (blocks * block_size) as usize {
            continue;
        }
        // Oracle top logits per generated position index (0 = after the prompt).
        let p0 = prompt_ids.len() as u64 - 1;
        let mut tokens = prompt_ids.clone();
        let mut generated = Vec::new();
        let mut margin_at_divergence = None;
        let mut max_logit_err = 0.0f32;
        for step in 0..want.len() {
            let (start, len) = if step == 0 {
                (0, prompt_ids.len() as u32)
            } else {
                (tokens.len() as u32 - 1, 1)
            };
            let mut plan = single_seq_plan(start, len, block_size);
            plan.work[0].token_ids = tokens[start as usize..(start + len) as usize].to_vec();
            let (_, sampled) = rt.forward(&plan)?;
            let tok = sampled.first().copied().unwrap_or(0);
            let logits = rt.last_logits();
            let agree_so_far = generated.iter().zip(want).all(|(a, b)| a == b);
            if agree_so_far {
                if let Some((_, top_ids, top_vals)) =
                    tops.iter().find(|(pos, _, _)| *pos == p0 + step as u64)
                {
                    for (id, v) in top_ids.iter().zip(top_vals) {
                        if let Some(ours) = logits.get(*id as usize) {
                            max_logit_err = max_logit_err.max((ours - v).abs());
                        }
                    }
                }
                if tok != want[step] && margin_at_divergence.is_none() {
                    let mut sorted: Vec<f32> = logits[..vocab.min(logits.len())].to_vec();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    margin_at_divergence = Some(sorted[0] - sorted.get(1).copied().unwrap_or(0.0));
                }
            }
            generated.push(tok);
            tokens.push(tok);
        }
        let matched = generated
            .iter()
            .zip(want)
            .take_while(|(a, b)| a == b)
            .count();
        out.push(OracleCase {
            prompt: case.label(),
            generated: generated.len(),
            matched,
            margin_at_divergence,
            max_logit_err,
        });
    }
    Ok(out)
}

/// A check of the runtime's own machinery (block moves, CUDA graphs) against a host model.
#[derive(Debug, Clone)]
pub struct RuntimeCase {
    /// What was checked.
    pub name: String,
    /// Relative error (0 where the check is exact).
    pub rel_err: f64,
    /// Elements that differ from the expectation (exact checks) or are not finite.
    pub bad: usize,
    /// Elements compared.
    pub total: usize,
}

/// A small Llama shape for runtime checks (two layers, GQA 2, head size 64).
fn tiny_shape() -> LlamaShape {
    LlamaShape {
        layers: 2,
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 512,
        vocab: 1000,
        rope_theta: 10_000.0,
        rms_eps: 1e-5,
        tied_embeddings: false,
        rope_interleaved: false,
    }
}

/// Block moves (`copy_blocks`): swap-outs to the pinned CPU pool, copy-on-write copies and
/// swap-ins, in one step and across steps, on caches of fresh random values; every block of
/// every layer's K and V cache is compared with a host model of the same moves (exact).
pub fn transfer_check(seed: u64) -> Result<Vec<RuntimeCase>, CudaError> {
    let (block_size, num_blocks, cpu_blocks) = (16u32, 32u32, 8u32);
    let mut rt = CudaRuntime::synthetic(tiny_shape(), seed, block_size, num_blocks)?;
    rt.with_swap_space(cpu_blocks)?;
    let mut rng = SplitMix::new(seed);
    let elems = rt.block_elems();
    let layers = rt.shape.layers as usize;
    // Host model: caches[layer * 2 + kv][block], pool[layer * 2 + kv][cpu block].
    let mut caches: Vec<Vec<bf16>> = Vec::new();
    for li in 0..layers {
        for kv in 0..2 {
            let v: Vec<bf16> = (0..elems * num_blocks as usize)
                .map(|_| bf16::from_f32(rng.uniform()))
                .collect();
            let dev = if kv == 0 {
                &mut rt.k_cache[li]
            } else {
                &mut rt.v_cache[li]
            };
            rt.stream.memcpy_htod(&v, dev)?;
            caches.push(v);
        }
    }
    let mut pool = vec![vec![bf16::ZERO; elems * cpu_blocks as usize]; 2 * layers];
    type Pairs = Vec<(u32, u32)>;
    // (swap-outs, copies, swap-ins) of each step.
    let steps: [(Pairs, Pairs, Pairs); 2] = [
        // Swap out 3 and 5, copy 7 to 9 and 10, swap in what was just swapped out of 3.
        (vec![(3, 0), (5, 1)], vec![(7, 9), (7, 10)], vec![(0, 20)]),
        // Reuse freed block 3 for a copy, bring 5 back from the previous step's swap-out.
        (vec![(11, 2)], vec![(12, 3)], vec![(1, 21), (2, 22)]),
    ];
    let mut cases = Vec::new();
    for (i, (out, copies, back)) in steps.into_iter().enumerate() {
        let plan = StepPlan {
            step: i as u64,
            swap_out: out.clone(),
            block_copies: copies.clone(),
            swap_in: back.clone(),
            ..StepPlan::default()
        };
        rt.forward(&plan)?;
        for c in 0..2 * layers {
            let (cache, cpu) = (&mut caches[c], &mut pool[c]);
            for &(g, p) in &out {
                let src = cache[g as usize * elems..][..elems].to_vec();
                cpu[p as usize * elems..][..elems].copy_from_slice(&src);
            }
            for &(a, b) in &copies {
                let src = cache[a as usize * elems..][..elems].to_vec();
                cache[b as usize * elems..][..elems].copy_from_slice(&src);
            }
            for &(p, g) in &back {
                let src = cpu[p as usize * elems..][..elems].to_vec();
                cache[g as usize * elems..][..elems].copy_from_slice(&src);
            }
        }
        let mut bad = 0;
        let mut total = 0;
        for li in 0..layers {
            for kv in 0..2 {
                let dev = if kv == 0 {
                    &rt.k_cache[li]
                } else {
                    &rt.v_cache[li]
                };
                let got = rt.stream.clone_dtoh(dev)?;
                let want = &caches[li * 2 + kv];
                total += want.len();
                bad += got
                    .iter()
                    .zip(want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
            }
        }
        cases.push(RuntimeCase {
            name: format!(
                "step {i}: {} swap-out, {} copy, {} swap-in blocks",
                out.len(),
                copies.len(),
                back.len()
            ),
            rel_err: 0.0,
            bad,
            total,
        });
    }
    Ok(cases)
}
/// Speculative decoding on the GPU (invariant 10): greedy plain decoding of a synthetic
/// model gives a reference continuation; verify steps whose drafts are that continuation
/// accept every draft and add the next token, and verify steps whose drafts are wrong
/// from some position accept exactly the right prefix and emit the right token there.
/// `bad` counts emitted tokens that differ from plain decoding or wrong accepted counts.
pub fn verify_check(seed: u64) -> Result<Vec<RuntimeCase>, CudaError> {
    let shape = tiny_shape();
    let block_size = 16u32;
    let mut rng = SplitMix::new(seed ^ 0x5bec);
    let prompt: Vec<u32> = (0..19).map(|_| rng.range(0, shape.vocab)).collect();
    let k = 4u32;
    let steps = 12u32;
    let table: Vec<u32> = (0..8).collect();
    let step = |start: u32, ids: &[u32], verify: bool| -> StepPlan {
        let len = ids.len() as u32;
        StepPlan {
            work: vec![SeqWork {
                seq: 0,
                kind: if verify {
                    WorkKind::Verify
                } else if start > 0 && len == 1 {
                    WorkKind::Decode
                } else {
                    WorkKind::Prefill
                },
                start,
                len,
                sample: true,
                num_samples: 1,
                block_table: table[..(start + len).div_ceil(block_size) as usize].to_vec(),
                token_ids: ids.to_vec(),
                sampling: Default::default(),
                drafts: verify.then(|| engine::spec::Drafts {
                    k: len - 1,
                    tokens: ids[1..].to_vec(),
                    acceptance: engine::spec::Acceptance::iid(0.5, len - 1)
                        .unwrap_or_else(|_| unreachable!("a rate in [0, 1]")),
                }),
            }],
            ..StepPlan::default()
        }
    };
    // The reference: plain greedy decoding.
    let mut rt = CudaRuntime::synthetic(shape.clone(), seed, block_size, 8)?;
    let one = |t: Vec<u32>| {
        t.first()
            .copied()
            .ok_or_else(|| CudaError::Config("a sampling step drew no token".into()))
    };
    let mut plain = vec![one(rt.forward(&step(0, &prompt, false))?.1)?];
    let p0 = prompt.len() as u32;
    for pos in p0..p0 + steps + k + 1 {
        let last = plain[plain.len() - 1];
        plain.push(one(rt.forward(&step(pos, &[last], false))?.1)?);
    }
    let mut cases = Vec::new();
    let vocab = shape.vocab as usize;
    for (name, wrong_at) in [("right drafts", None), ("a wrong 3rd draft", Some(2usize))] {
        let mut rt = CudaRuntime::synthetic(shape.clone(), seed, block_size, 8)?;
        rt.keep_logits(true);
        rt.forward(&step(0, &prompt, false))?;
        let (mut bad, mut total, mut agree) = (0usize, 0usize, 0usize);
        let mut out = vec![plain[0]];
        let mut pos = prompt.len() as u32;
        while out.len() < steps as usize {
            let n = out.len();
            let mut ids = vec![out[n - 1]];
            ids.extend_from_slice(&plain[n..n + k as usize]);
            if let Some(w) = wrong_at {
                ids[1 + w] = (ids[1 + w] + 1) % shape.vocab;
            }
            let (_, emitted) = rt.forward(&step(pos, &ids, true))?;
            let accepted = rt.accepted.first().copied().unwrap_or(u32::MAX);
            // Exact: greedy verification against this step's own logits rows.
            let rows = rt.last_logits();
            let argmax = |j: usize| crate::sampling::argmax(&rows[j * vocab..(j + 1) * vocab]);
            let mut want = Vec::new();
            for j in 0..k as usize {
                if ids[j + 1] != argmax(j) {
                    break;
                }
                want.push(ids[j + 1]);
            }
            let want_accepted = want.len() as u32;
            want.push(argmax(want.len()));
            total += want.len();
            bad += usize::from(accepted != want_accepted);
            bad += emitted.iter().zip(&want).filter(|(a, b)| a != b).count()
                + emitted.len().abs_diff(want.len());
            agree += emitted
                .iter()
                .enumerate()
                .filter(|&(i, &t)| plain.get(n + i) == Some(&t))
                .count();
            out.extend_from_slice(&emitted);
            pos += 1 + accepted.min(k);
        }
        // Plain decoding runs other kernels (the batch-1 GEMM path, split-K attention),
        // so a near-tie may flip: agreement with it is reported, not required.
        cases.push(RuntimeCase {
            name: format!(
                "verify with {name}: greedy acceptance ({agree}/{} tokens as plain decoding)",
                out.len() - 1
            ),
            rel_err: 0.0,
            bad,
            total,
        });
    }
    // A mixed step: a verify work, a decode, a prefill chunk that samples nothing and a
    // prompt that forks into two samples. The drawn tokens come back in plan order:
    // the verify's accepted drafts and own token, one decode token, two prompt samples.
    let mut rt = CudaRuntime::synthetic(shape.clone(), seed, block_size, 32)?;
    rt.keep_logits(true);
    let blocks = |s: u32, n: u32| -> Vec<u32> { (8 * s..8 * s + n).collect() };
    let mut prefill = |seq: u64, ids: &[u32]| -> Result<u32, CudaError> {
        let mut p = step(0, ids, false);
        p.work[0].seq = seq;
        p.work[0].block_table = blocks(seq as u32, 2);
        one(rt.forward(&p)?.1)
    };
    let t0 = prefill(0, &prompt)?;
    let t1 = prefill(1, &prompt[..7])?;
    let p0 = prompt.len() as u32;
    let mut verify = step(p0, &[t0, 1, 2, 3], true);
    verify.work[0].block_table = blocks(0, 2);
    let mut decode = step(7, &[t1], false);
    decode.work[0].seq = 1;
    decode.work[0].block_table = blocks(1, 1);
    let mut chunk = step(0, &prompt[..9], false);
    chunk.work[0].seq = 2;
    chunk.work[0].sample = false;
    chunk.work[0].block_table = blocks(2, 1);
    let mut fork = step(0, &prompt[..5], false);
    fork.work[0].seq = 3;
    fork.work[0].num_samples = 2;
    fork.work[0].block_table = blocks(3, 1);
    let plan = StepPlan {
        work: vec![
            verify.work[0].clone(),
            decode.work[0].clone(),
            chunk.work[0].clone(),
            fork.work[0].clone(),
        ],
        ..StepPlan::default()
    };
    let (_, drawn) = rt.forward(&plan)?;
    let accepted = rt.accepted.first().copied().unwrap_or(u32::MAX) as usize;
    let rows = rt.last_logits();
    let argmax = |j: usize| crate::sampling::argmax(&rows[j * vocab..(j + 1) * vocab]);
    // Rows: 4 of the verify, then the decode, then the prompt (the chunk has none).
    let mut want: Vec<u32> = (1..=3u32)
        .take_while(|&d| argmax(d as usize - 1) == d)
        .collect();
    let want_accepted = want.len();
    want.push(argmax(want_accepted));
    want.push(argmax(4));
    // Two greedy samples of the prompt's last row: both its argmax.
    want.extend([argmax(5), argmax(5)]);
    let mut bad = usize::from(accepted != want_accepted) + drawn.len().abs_diff(want.len());
    bad += drawn.iter().zip(&want).filter(|(a, b)| a != b).count();
    bad += usize::from(rt.accepted.len() != 1);
    cases.push(RuntimeCase {
        name: "verify in a mixed step (decode, silent chunk, forked prompt)".into(),
        rel_err: 0.0,
        bad,
        total: want.len(),
    });
    Ok(cases)
}

/// CUDA graphs and `skinny_gemm`: the same prefill and 40 teacher-forced decode steps (their
/// tables crossing block and padding boundaries) run three ways on one synthetic model:
/// graphs (replays of captured decode steps), the same kernels launched eagerly (must agree
/// bit for bit), and cuBLAS GEMMs without graphs (must agree within bf16 rounding).
pub fn graph_check(seed: u64) -> Result<Vec<RuntimeCase>, CudaError> {
    let shape = tiny_shape();
    let block_size = 16u32;
    let mut rng = SplitMix::new(seed ^ 0x5eed);
    let prompt = 23u32;
    let total = prompt + 40;
    let ids: Vec<u32> = (0..total).map(|_| rng.range(0, shape.vocab)).collect();
    // Two sequences decoding together (batch 2), shuffled tables.
    let tables: Vec<Vec<u32>> = vec![
        (0..8).map(|b| 2 * b + 1).collect(),
        (0..8).map(|b| 2 * b).collect(),
    ];
    let run = |graphs: bool, skinny: bool| -> Result<Vec<f32>, CudaError> {
        let mut rt = CudaRuntime::synthetic(shape.clone(), seed, block_size, 16)?;
        rt.set_graphs(graphs);
        rt.set_skinny_max_tokens(if skinny { super::SKINNY_MAX_TOKENS } else { 0 });
        rt.keep_logits(true);
        let mut logits = Vec::new();
        let mut pos = 0u32;
        while pos < total {
            let len = if pos == 0 { prompt } else { 1 };
            let work = tables
                .iter()
                .enumerate()
                .map(|(s, t)| SeqWork {
                    seq: s as u64,
                    kind: if len == 1 {
                        WorkKind::Decode
                    } else {
                        WorkKind::Prefill
                    },
                    start: pos,
                    len,
                    sample: true,
                    num_samples: 1,
                    block_table: t[..(pos + len).div_ceil(block_size) as usize].to_vec(),
                    token_ids: ids[pos as usize..(pos + len) as usize]
                        .iter()
                        .map(|&i| (i + s as u32) % shape.vocab)
                        .collect(),
                    sampling: Default::default(),
                    drafts: None,
                })
                .collect();
            let plan = StepPlan {
                step: u64::from(pos),
                work,
                ..StepPlan::default()
            };
            rt.forward(&plan)?;
            if pos > 0 {
                logits.extend_from_slice(rt.last_logits());
            }
            pos += len;
        }
        Ok(logits)
    };
    let graphs = run(true, true)?;
    let eager = run(false, true)?;
    let cublas = run(false, false)?;
    let cublas_graphs = run(true, false)?;
    let compare = |name: &str, a: &[f32], b: &[f32], exact: bool| {
        let mut num = 0.0f64;
        let mut den = 0.0f64;
        let mut bad = usize::from(a.len() != b.len());
        for (x, y) in a.iter().zip(b) {
            if !x.is_finite() || (exact && x.to_bits() != y.to_bits()) {
                bad += 1;
            }
            num += f64::from(x - y).powi(2);
            den += f64::from(*y).powi(2);
        }
        RuntimeCase {
            name: name.into(),
            rel_err: (num / den.max(1e-300)).sqrt(),
            bad,
            total: a.len(),
        }
    };
    Ok(vec![
        compare(
            "decode logits: graph replays vs eager",
            &graphs,
            &eager,
            true,
        ),
        compare(
            "decode logits: skinny_gemm vs cuBLAS",
            &eager,
            &cublas,
            false,
        ),
        compare(
            "decode logits: cuBLAS graph replays vs eager",
            &cublas_graphs,
            &cublas,
            true,
        ),
    ])
}

/// Whether `g` is a correct draw (`sample_draws`) from `row` with the uniform number `u`,
/// by a float64 reference: `g` must pass the top-k and top-p cuts, and its interval of the
/// kept mass (accumulated in vocabulary order) must hold `u` times the total, within `tol`
/// of the total (float32 sums on the device). None when a top-p cut lies within `tol` of its
/// target, where float32 rounding may legitimately cut one level higher or lower.
fn reference_accepts(
    row: &[f32],
    [temperature, top_p, u]: [f32; 3],
    top_k: u32,
    g: usize,
) -> Option<bool> {
    let tol = 1e-5;
    let params = engine::request::SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: 0,
    };
    let Some(kept) = crate::sampling::kept(row, &params, tol) else {
        return Some(g == crate::sampling::argmax(row) as usize);
    };
    if kept.ambiguous {
        return None;
    }
    if g >= row.len() || !kept.keeps(row[g]) {
        return Some(false);
    }
    let mass = |r: &[f32]| -> f64 {
        r.iter()
            .filter(|&&v| kept.keeps(v))
            .map(|&v| kept.weight(v))
            .sum()
    };
    let (z, below) = (mass(row), mass(&row[..g]));
    let t = f64::from(u) * z;
    Some(below - tol * z <= t && t <= below + kept.weight(row[g]) + tol * z)
}

/// `sample_draws` against a float64 inverse CDF with the same uniform numbers: greedy,
/// temperature alone, top-k, top-p and both, on vocabularies of 1,000 to 128,256 with fresh
/// random logits (some rounded to create ties at the cuts), 32 draws on each of 8 rows. Rows whose
/// top-p cut is within float32 rounding of its target are skipped, not compared.
pub fn sampling_check(seed: u64) -> Result<Vec<RuntimeCase>, CudaError> {
    let ctx = open_device()?;
    let stream = ctx.default_stream();
    let kernels = compile(&ctx, 64, 1)?;
    let mut rng = SplitMix::new(seed ^ 0x5a3);
    let mut cases = Vec::new();
    // (vocab, temperature, top_k, top_p, logits rounded to 1/8)
    let params: [(u32, f32, u32, f32, bool); 8] = [
        (1000, 0.0, 0, 1.0, false),
        (1000, 1.0, 0, 1.0, false),
        (5000, 1.0, 1, 1.0, true),
        (49_152, 0.7, 50, 1.0, false),
        (49_152, 1.0, 0, 0.9, false),
        (32_000, 1.5, 0, 0.5, true),
        (128_256, 0.8, 40, 0.95, false),
        (128_256, 1.0, 200, 0.8, true),
    ];
    let (rows, per_row) = (8usize, 32usize);
    for (vocab, temperature, top_k, top_p, ties) in params {
        let v = vocab as usize;
        let logits: Vec<f32> = (0..rows * v)
            .map(|_| {
                // Roughly normal (sum of four uniforms), scale 3, as real logits spread.
                let x: f32 = (0..4).map(|_| rng.uniform()).sum::<f32>() * 3.0;
                if ties {
                    (x * 8.0).round() / 8.0
                } else {
                    x
                }
            })
            .collect();
        let mut draws = Vec::with_capacity(rows * per_row * super::meta::DRAW_INTS);
        let mut us = Vec::new();
        for r in 0..rows {
            for _ in 0..per_row {
                let u = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
                us.push((r, u));
                draws.extend([
                    r as i32,
                    top_k as i32,
                    temperature.to_bits() as i32,
                    top_p.to_bits() as i32,
                    u.to_bits() as i32,
                ]);
            }
        }
        let n = us.len();
        let logits_dev = stream.clone_htod(&logits)?;
        let draws_dev = stream.clone_htod(&draws)?;
        let mut ids = stream.clone_htod(&vec![-7i32; n])?;
        super::launch_sampling(
            &stream,
            &kernels,
            &mut ids,
            &logits_dev,
            &draws_dev.slice(0..draws.len()),
            n,
            vocab,
        )?;
        stream.synchronize()?;
        let got = stream.clone_dtoh(&ids)?;
        let (mut bad, mut compared) = (0, 0);
        for (&(r, u), &g) in us.iter().zip(&got) {
            let row = &logits[r * v..(r + 1) * v];
            let g = usize::try_from(g).unwrap_or(usize::MAX);
            if let Some(ok) = reference_accepts(row, [temperature, top_p, u], top_k, g) {
                compared += 1;
                bad += usize::from(!ok);
            }
        }
        // Too many skipped rows would make the check vacuous. (With 49,152 tokens a level
        // near a top-p cut holds ~1/50,000 of the mass, so some rows are skipped.)
        bad += usize::from(compared * 2 < n);
        cases.push(RuntimeCase {
            name: format!(
                "sampling: vocab {vocab} T {temperature} top-k {top_k} top-p {top_p}{} ({} of {n} compared)",
                if ties { " ties" } else { "" },
                compared
            ),
            rel_err: 0.0,
            bad,
            total: compared,
        });
    }
    Ok(cases)
}

/// The CUDA runtime against the CPU runtime on one oracle prompt, both fed llama.cpp's
/// greedy tokens (teacher forcing) for up to 16 positions.
#[derive(Debug, Clone)]
pub struct RuntimePair {
    /// The prompt (shortened for display).
    pub prompt: String,
    /// Positions compared.
    pub positions: usize,
    /// Positions where both runtimes' argmax agree.
    pub same_argmax: usize,
    /// Largest gap (CPU logits) between the CPU's argmax and the CUDA runtime's choice
    /// where they differ.
    pub gap_at_difference: f32,
    /// Largest difference of logits relative to the top one, over the CPU's top 8.
    pub max_logit_diff: f32,
}

/// Runs every oracle prompt through both real runtimes ([`crate::cpu::CpuRuntime`] with
/// f32 activations, [`crate::cpu::Precision::F32`], and the CUDA runtime in bf16) and
/// compares their logits position by position.
pub fn cpu_cuda_agreement(gguf: &Gguf, oracle: &Path) -> Result<Vec<RuntimePair>, CudaError> {
    let cases = crate::oracle::read(oracle).map_err(CudaError::Config)?;
    let (block_size, blocks) = (16u32, 64u32);
    let cpu_err = |e: crate::cpu::CpuError| CudaError::Config(e.to_string());
    let mut out = Vec::new();
    for case in &cases {
        let (prompt, want) = (&case.prompt_ids, &case.greedy_ids);
        if prompt.is_empty() || prompt.len() + want.len() > (blocks * block_size) as usize {
            continue;
        }
        let mut gpu = CudaRuntime::from_gguf(gguf, block_size, blocks)?;
        gpu.keep_logits(true);
        let mut cpu =
            crate::cpu::CpuRuntime::from_gguf(gguf, block_size, blocks).map_err(cpu_err)?;
        cpu.keep_logits(true);
        // The float reference: f32 activations, not the 8-bit ones of its fast path.
        cpu.set_precision(crate::cpu::Precision::F32);
        let table: Vec<u32> = (0..blocks).collect();
        let mut ids = prompt.clone();
        let mut pair = RuntimePair {
            prompt: case.label(),
            positions: 0,
            same_argmax: 0,
            gap_at_difference: 0.0,
            max_logit_diff: 0.0,
        };
        for (k, &tok) in want.iter().take(16).enumerate() {
            let start = if k == 0 { 0 } else { ids.len() - 1 };
            let len = (ids.len() - start) as u32;
            let used = (start as u32 + len).div_ceil(block_size) as usize;
            let plan = super::one_sequence_step(
                start as u32,
                len,
                &table[..used],
                &ids[start..],
                Default::default(),
            );
            let (_, g) = gpu.forward(&plan)?;
            let (_, c) = cpu.forward(&plan).map_err(cpu_err)?;
            let (lg, lc) = (gpu.last_logits(), cpu.last_logits());
            pair.positions += 1;
            let top = crate::sampling::argmax(lc) as usize;
            if g == c {
                pair.same_argmax += 1;
            } else if let Some(&gi) = g.first() {
                pair.gap_at_difference = pair.gap_at_difference.max(lc[top] - lc[gi as usize]);
            }
            let mut order: Vec<usize> = (0..lc.len()).collect();
            order.sort_by(|&a, &b| lc[b].total_cmp(&lc[a]));
            for &i in order.iter().take(8) {
                let d = ((lg[i] - lg[top]) - (lc[i] - lc[top])).abs();
                pair.max_logit_diff = pair.max_logit_diff.max(d);
            }
            ids.push(tok);
        }
        out.push(pair);
    }
    Ok(out)
}
