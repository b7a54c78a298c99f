//! What the CPU and CUDA runtimes share above their forward passes: the engine backend
//! over a runtime's step, and generating one sequence's completion (`sim generate`): a
//! prefill step of the prompt, then a decode step per token, through the paged KV cache
//! (blocks 0, 1, ... in order), until end-of-sequence or `max_tokens`.

use engine::backend::{Backend, BackendError};
use engine::plan::{SeqWork, StepOutcome, StepPlan, WorkKind};
use engine::request::SamplingParams;

/// A real runtime's step: the plan's block moves and forward pass, returning its duration
/// in ns and the drawn tokens (`num_samples` for each sampling sequence, in plan order).
pub trait StepRuntime {
    /// The backend's name (`cpu`, `cuda`).
    const NAME: &'static str;
    /// Runs one step.
    fn step(&mut self, plan: &StepPlan) -> Result<(u64, Vec<u32>), String>;
    /// Accepted drafts of the last step's verify works, in plan order (runtimes that
    /// verify speculative drafts).
    fn take_accepted(&mut self) -> Vec<u32> {
        Vec::new()
    }
    /// The log-probabilities of the last step's drawn tokens
    /// ([`engine::plan::StepOutcome::logprobs`]; runtimes that compute them).
    fn take_logprobs(&mut self) -> Vec<Option<engine::plan::TokenLogprobs>> {
        Vec::new()
    }
    /// KV blocks and block size.
    fn kv_geometry(&self) -> (u32, u32);

    /// Generates a completion of `prompt` (token ids) for one sequence ([`generate`]),
    /// drawing with `sampling`, until `eos` or `max_tokens`. `on_token` sees each token
    /// as it is drawn.
    fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: u32,
        sampling: SamplingParams,
        eos: Option<u32>,
        on_token: impl FnMut(u32),
    ) -> Result<Generation, String>
    where
        Self: Sized,
    {
        let (num_blocks, block_size) = self.kv_geometry();
        check_fits(
            prompt.len(),
            max_tokens,
            u64::from(num_blocks) * u64::from(block_size),
        )?;
        generate(
            |plan| self.step(plan),
            num_blocks,
            block_size,
            prompt,
            max_tokens,
            sampling,
            eos,
            on_token,
        )
    }
}

/// A real runtime as an engine backend: it reads and writes KV through the block tables.
pub struct RuntimeBackend<R> {
    rt: R,
}

impl<R: StepRuntime> RuntimeBackend<R> {
    /// Wraps a runtime.
    pub fn new(rt: R) -> Self {
        RuntimeBackend { rt }
    }
}

impl<R: StepRuntime> Backend for RuntimeBackend<R> {
    fn name(&self) -> &str {
        R::NAME
    }

    fn needs_block_tables(&self) -> bool {
        true
    }

    fn execute(&mut self, plan: &StepPlan) -> Result<StepOutcome, BackendError> {
        let (duration, sampled) = self.rt.step(plan).map_err(|message| BackendError {
            backend: R::NAME.into(),
            message,
        })?;
        Ok(StepOutcome {
            duration,
            interval: 0,
            sampled,
            accepted: self.rt.take_accepted(),
            mbu: 0.0,
            mfu: 0.0,
            logprobs: self.rt.take_logprobs(),
        })
    }
}

/// Verifies one verify work (speculative decoding) from the model's logits at its `1 + k`
/// positions (`row(j)` predicts position `start + 1 + j`) and its ids (the last token,
/// then the `k` drafts): drafts are accepted while [`crate::sampling::verify_draft`]
/// accepts them (greedy: equal to the argmax; sampling: Leviathan et al. with the draft
/// as a point mass), then the model's own token follows (the replacement of the first
/// rejected draft, or the bonus token drawn as a plain decode would draw it). Returns the
/// accepted count and the emitted tokens. The CPU and CUDA runtimes share it.
pub fn verify_work<'a>(
    w: &SeqWork,
    ids: &[u32],
    row: impl Fn(usize) -> &'a [f32],
) -> (u32, Vec<u32>) {
    let k = (w.len as usize)
        .saturating_sub(1)
        .min(ids.len().saturating_sub(1));
    let mut out = Vec::with_capacity(k + 1);
    for j in 0..k {
        let draft = ids[j + 1];
        let pos = w.start + 1 + j as u32;
        let u_accept = w.sampling.uniform(w.seq, pos, engine::spec::ACCEPT_DRAW);
        let u_draw = w.sampling.uniform(w.seq, pos, 0);
        match crate::sampling::verify_draft(row(j), &w.sampling, draft, u_accept, u_draw) {
            Ok(()) => out.push(draft),
            Err(t) => {
                let accepted = out.len() as u32;
                out.push(t);
                return (accepted, out);
            }
        }
    }
    let pos = w.start + 1 + k as u32;
    let bonus = crate::sampling::draw(row(k), &w.sampling, w.sampling.uniform(w.seq, pos, 0));
    out.push(bonus);
    (k as u32, out)
}

/// [`verify_work`] of a greedy work from its rows' argmaxes alone (what the GPU's sampling
/// kernel draws at each row): drafts are accepted while they equal their row's argmax, then
/// the argmax of the first rejected row, or of the last row, follows. The same tokens as
/// [`verify_work`] on the rows themselves, without copying the logits to the host.
pub fn verify_greedy(w: &SeqWork, ids: &[u32], argmax: &[u32]) -> (u32, Vec<u32>) {
    let k = (w.len as usize)
        .saturating_sub(1)
        .min(ids.len().saturating_sub(1))
        .min(argmax.len().saturating_sub(1));
    let accepted = (0..k).take_while(|&j| ids[j + 1] == argmax[j]).count();
    let mut out: Vec<u32> = ids.iter().skip(1).take(accepted).copied().collect();
    out.extend(argmax.get(accepted));
    (accepted as u32, out)
}

/// What a generation produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Generation {
    /// Tokens drawn, the end-of-sequence token included when it came.
    pub tokens: Vec<u32>,
    /// Time of the prefill step (the runtime's clock), ns.
    pub prefill_ns: u64,
    /// Time of the decode steps, ns.
    pub decode_ns: u64,
    /// Decode steps run (tokens after the first).
    pub decode_steps: u32,
}

/// Checks a plan before a real runtime runs it: every table entry is NULL or a block
/// below `num_blocks`; every position a chunk writes or attends to (from the window's
/// start, or 0) has a real block; token ids are inside the vocabulary; no empty chunk
/// samples. A plan that fails would write into another sequence's KV or read freed
/// blocks, so it is an error, not a clamp.
pub fn check_plan(
    plan: &StepPlan,
    num_blocks: u32,
    block_size: u32,
    window: Option<u32>,
    vocab: u32,
    verifies: bool,
) -> Result<(), String> {
    let null = engine::block_manager::NULL_BLOCK;
    let bs = block_size.max(1);
    for w in &plan.work {
        if w.kind == engine::plan::WorkKind::Verify {
            if !verifies {
                return Err(format!(
                    "sequence {} verifies speculative drafts, which this runtime does not run (the CPU runtime does)",
                    w.seq
                ));
            }
            let k = w.drafts.as_ref().map_or(0, |d| d.k);
            if k == 0 || w.len != 1 + k || !w.sample {
                return Err(format!(
                    "sequence {}: a verify step of {} tokens for {k} drafts",
                    w.seq, w.len
                ));
            }
            if !(w.token_ids.len() <= 1 || w.token_ids.len() as u32 == w.len) {
                return Err(format!(
                    "sequence {}: {} token ids for a verify step of 1 + {k} tokens",
                    w.seq,
                    w.token_ids.len()
                ));
            }
        }
        if let Some(&b) = w
            .block_table
            .iter()
            .find(|&&b| b != null && b >= num_blocks)
        {
            return Err(format!(
                "block {b} of sequence {} is outside the KV cache ({num_blocks} blocks)",
                w.seq
            ));
        }
        if w.sample && w.len == 0 {
            return Err(format!("sequence {} samples from an empty chunk", w.seq));
        }
        let lo = window.map_or(0, |win| (w.start + 1).saturating_sub(win));
        for i in lo / bs..(w.start + w.len).div_ceil(bs) {
            if !matches!(w.block_table.get(i as usize), Some(&b) if b != null) {
                return Err(format!(
                    "sequence {}: positions {}-{} have no KV block (table entry {i})",
                    w.seq,
                    i * bs,
                    (i + 1) * bs - 1
                ));
            }
        }
        if let Some(&id) = w.token_ids.iter().find(|&&id| id >= vocab) {
            return Err(format!(
                "sequence {}: token id {id} is outside the vocabulary ({vocab})",
                w.seq
            ));
        }
    }
    Ok(())
}

/// A step of one sequence (id 0) computing positions `[start, start + len)` of `token_ids`
/// (empty: synthetic ids) over `table`, and drawing one token after them.
pub fn one_sequence_step(
    start: u32,
    len: u32,
    table: &[u32],
    token_ids: &[u32],
    sampling: SamplingParams,
) -> StepPlan {
    StepPlan {
        work: vec![SeqWork {
            seq: 0,
            kind: if len == 1 && start > 0 {
                WorkKind::Decode
            } else {
                WorkKind::Prefill
            },
            start,
            len,
            sample: true,
            num_samples: 1,
            block_table: table.to_vec(),
            token_ids: token_ids.to_vec(),
            sampling,
            drafts: None,
            suppress: Vec::new(),
            suppress_rows: 0,
        }],
        ..StepPlan::default()
    }
}

/// Why a generation cannot start: the prompt is empty or does not fit with `max_tokens`
/// into `capacity` tokens of KV cache.
pub fn check_fits(prompt: usize, max_tokens: u32, capacity: u64) -> Result<(), String> {
    if prompt == 0 {
        return Err("the prompt has no tokens".into());
    }
    if max_tokens == 0 {
        return Err("max_tokens must be at least 1".into());
    }
    if prompt as u64 + u64::from(max_tokens) > capacity {
        return Err(format!(
            "{prompt} prompt tokens + {max_tokens} new tokens do not fit the KV cache of {capacity} tokens"
        ));
    }
    Ok(())
}

/// Runs the generation loop over `forward` (a step in, its duration in ns and drawn tokens
/// out) with a cache of `num_blocks` blocks of `block_size` tokens (checked with
/// [`check_fits`] by the caller). `on_token` sees each token as it is drawn.
#[allow(clippy::too_many_arguments)]
pub fn generate<E>(
    mut forward: impl FnMut(&StepPlan) -> Result<(u64, Vec<u32>), E>,
    num_blocks: u32,
    block_size: u32,
    prompt: &[u32],
    max_tokens: u32,
    sampling: SamplingParams,
    eos: Option<u32>,
    mut on_token: impl FnMut(u32),
) -> Result<Generation, E> {
    let blocks: Vec<u32> = (0..num_blocks).collect();
    let step = |start: u32, ids: &[u32]| {
        let used = ((start + ids.len() as u32).div_ceil(block_size) as usize).min(blocks.len());
        one_sequence_step(start, ids.len() as u32, &blocks[..used], ids, sampling)
    };
    let mut out = Generation::default();
    let (ns, first) = forward(&step(0, prompt))?;
    out.prefill_ns = ns;
    let mut next = first.first().copied();
    let mut pos = prompt.len() as u32;
    while let Some(tok) = next {
        out.tokens.push(tok);
        on_token(tok);
        if Some(tok) == eos || out.tokens.len() as u32 >= max_tokens {
            break;
        }
        let (ns, drawn) = forward(&step(pos, &[tok]))?;
        out.decode_ns += ns;
        out.decode_steps += 1;
        next = drawn.first().copied();
        pos += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::block_manager::NULL_BLOCK;

    #[test]
    fn plans_that_would_touch_foreign_or_freed_kv_are_errors() {
        let greedy = SamplingParams::default();
        let ok = |p: &StepPlan, window| check_plan(p, 8, 4, window, 100, false);
        // Positions 0-9 over blocks 3, 5, 6.
        assert!(ok(&one_sequence_step(0, 10, &[3, 5, 6], &[], greedy), None).is_ok());
        // A block outside the cache, a missing one, a NULL one read without a window.
        let e = ok(&one_sequence_step(0, 10, &[3, 9, 6], &[], greedy), None).unwrap_err();
        assert!(e.contains("block 9"), "{e}");
        let e = ok(&one_sequence_step(0, 10, &[3, 5], &[], greedy), None).unwrap_err();
        assert!(e.contains("positions 8-11"), "{e}");
        let freed = [NULL_BLOCK, 5, 6];
        let e = ok(&one_sequence_step(9, 1, &freed, &[], greedy), None).unwrap_err();
        assert!(e.contains("positions 0-3"), "{e}");
        // With a 4-token window position 9 reads 6-9 only: the NULL block is out of reach.
        assert!(ok(&one_sequence_step(9, 1, &freed, &[], greedy), Some(4)).is_ok());
        // Token ids outside the vocabulary; an empty sampled chunk.
        let e = ok(&one_sequence_step(0, 2, &[3], &[1, 100], greedy), None).unwrap_err();
        assert!(e.contains("token id 100"), "{e}");
        let e = ok(&one_sequence_step(0, 0, &[3], &[], greedy), None).unwrap_err();
        assert!(e.contains("empty chunk"), "{e}");
    }

    proptest::proptest! {
        /// A greedy verify work gives the same tokens from its rows' argmaxes (the GPU's
        /// draws) as from the rows: drafts drawn near the argmaxes so that runs of
        /// acceptances, a rejection at any position and full acceptance all occur; ties
        /// included (logits from a handful of levels).
        #[test]
        fn greedy_verification_from_argmaxes_matches_the_rows(
            k in 1usize..6,
            levels in proptest::collection::vec(0u8..4, 6 * 12),
            hits in proptest::collection::vec(0u8..4, 6),
        ) {
            let vocab = 12;
            let rows: Vec<Vec<f32>> = (0..=k)
                .map(|j| levels[j * vocab..(j + 1) * vocab].iter().map(|&v| f32::from(v)).collect())
                .collect();
            let argmax: Vec<u32> = rows.iter().map(|r| crate::sampling::argmax(r)).collect();
            // Draft j is its row's argmax unless `hits` says otherwise.
            let mut ids = vec![7u32];
            ids.extend((0..k).map(|j| if hits[j] > 0 { argmax[j] } else { (argmax[j] + 1) % vocab as u32 }));
            let mut plan = one_sequence_step(20, 1 + k as u32, &[0; 8], &ids, SamplingParams::default());
            let w = &mut plan.work[0];
            w.kind = WorkKind::Verify;
            let want = verify_work(w, &ids, |j| &rows[j]);
            proptest::prop_assert_eq!(verify_greedy(w, &ids, &argmax), want);
        }
    }
}
