//! Real weights: llama.cpp's oracle tokens and logits through the CUDA runtime (`sim
//! cuda-oracle`), and the CUDA runtime (bf16) against the CPU runtime (f32) teacher-forced
//! on the same tokens.

use std::path::Path;

use super::*;
use crate::cuda::{CudaError, CudaRuntime};
use crate::gguf::Gguf;

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
            let plan = crate::cuda::one_sequence_step(
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
