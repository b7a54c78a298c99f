//! The runtime's mechanics against host models (`sim cuda-check`): block copies and
//! swaps, CUDA graphs against eager steps, speculative verification against plain greedy
//! decoding, and the sampling kernel against the host's sampler.

use engine::plan::{SeqWork, StepPlan, WorkKind};
use half::bf16;

use super::*;
use crate::cuda::{compile, open_device, CudaError, CudaRuntime, LlamaShape};

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
pub(super) fn tiny_shape() -> LlamaShape {
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
    let step = |start: u32, ids: &[u32], verify: bool| {
        one_work_plan(start, ids, verify, &table, block_size)
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
    cases.push(verify_mixed_step(
        &shape, seed, block_size, &prompt, &step, &one,
    )?);
    Ok(cases)
}

/// A step of one sequence's work: `ids` from position `start` (a verify of `ids[1..]` as
/// drafts when `verify`, else a decode or a prefill), its blocks the head of `table`.
fn one_work_plan(
    start: u32,
    ids: &[u32],
    verify: bool,
    table: &[u32],
    block_size: u32,
) -> StepPlan {
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
            suppress: Vec::new(),
            suppress_rows: 0,
        }],
        ..StepPlan::default()
    }
}

/// A mixed step: a verify work, a decode, a prefill chunk that samples nothing and a
/// prompt that forks into two samples. The drawn tokens come back in plan order: the
/// verify's accepted drafts and own token, one decode token, two prompt samples.
fn verify_mixed_step(
    shape: &LlamaShape,
    seed: u64,
    block_size: u32,
    prompt: &[u32],
    step: &dyn Fn(u32, &[u32], bool) -> StepPlan,
    one: &dyn Fn(Vec<u32>) -> Result<u32, CudaError>,
) -> Result<RuntimeCase, CudaError> {
    let vocab = shape.vocab as usize;
    let mut rt = CudaRuntime::synthetic(shape.clone(), seed, block_size, 32)?;
    rt.keep_logits(true);
    let blocks = |s: u32, n: u32| -> Vec<u32> { (8 * s..8 * s + n).collect() };
    let mut prefill = |seq: u64, ids: &[u32]| -> Result<u32, CudaError> {
        let mut p = step(0, ids, false);
        p.work[0].seq = seq;
        p.work[0].block_table = blocks(seq as u32, 2);
        one(rt.forward(&p)?.1)
    };
    let t0 = prefill(0, prompt)?;
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
    Ok(RuntimeCase {
        name: "verify in a mixed step (decode, silent chunk, forked prompt)".into(),
        rel_err: 0.0,
        bad,
        total: want.len(),
    })
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
        rt.set_skinny_max_tokens(if skinny {
            crate::cuda::SKINNY_MAX_TOKENS
        } else {
            0
        });
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
                    suppress: Vec::new(),
                    suppress_rows: 0,
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
pub(super) fn reference_accepts(
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
        logprobs: None,
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
        let mut draws = Vec::with_capacity(rows * per_row * crate::cuda::meta::DRAW_INTS);
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
        crate::cuda::launch_sampling(
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
