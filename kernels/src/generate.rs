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
            sampled,
            mbu: 0.0,
            mfu: 0.0,
        })
    }
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
