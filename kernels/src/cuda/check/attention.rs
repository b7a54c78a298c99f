//! The paged-attention kernel against a float64 reference on random inputs (`sim
//! cuda-check`): fresh inputs per case, the output poisoned before the run (so an unwritten
//! element shows), and the relative error ‖out − ref‖ / ‖ref‖.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use engine::plan::{SeqWork, StepPlan, WorkKind};
use half::bf16;

use super::*;
use crate::cuda::meta::{q_tile_for_group, StepMeta};
use crate::cuda::{compile, open_device, CudaError};

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
pub(super) struct Problem {
    pub(super) plan: StepPlan,
    pub(super) heads: u32,
    pub(super) kv_heads: u32,
    pub(super) head_dim: u32,
    pub(super) block_size: u32,
    pub(super) num_blocks: u32,
    /// Sliding window in tokens (0: none); blocks wholly before it are NULL in the tables.
    pub(super) window: u32,
    pub(super) q: Vec<bf16>,
    pub(super) k: Vec<bf16>,
    pub(super) v: Vec<bf16>,
}

pub(super) fn random_problem(
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
                suppress: Vec::new(),
                suppress_rows: 0,
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
pub(super) fn reference(p: &Problem) -> Vec<f64> {
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
pub(super) fn run_attention(
    stream: &Arc<CudaStream>,
    kernels: &crate::cuda::Kernels,
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
    crate::cuda::launch_attention(
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

pub(super) struct DeviceProblem {
    pub(super) meta: StepMeta,
    pub(super) meta_dev: CudaSlice<i32>,
    pub(super) q: CudaSlice<bf16>,
    pub(super) k: CudaSlice<bf16>,
    pub(super) v: CudaSlice<bf16>,
    pub(super) out: CudaSlice<bf16>,
    pub(super) part_acc: CudaSlice<f32>,
    pub(super) part_ml: CudaSlice<f32>,
}

pub(super) fn upload(
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
