//! Requests and the sequence state machine.

use serde::{Deserialize, Serialize};

/// Simulated time in integer nanoseconds. Integer time keeps event ordering exact and
/// runs byte-identical across machines.
pub type Nanos = u64;

/// Identifier of a request (and of its sequence: one request is one sequence here).
pub type SeqId = u64;

/// Nanoseconds per second, for converting user-facing seconds.
pub const NANOS_PER_SEC: f64 = 1e9;

/// How a sequence's next token is drawn from the model's logits (real backends: the cost
/// model has none). Greedy by default. The order is vLLM's: temperature, then top-k, then
/// top-p over the top-k renormalised distribution; ties at a cut are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 (or `top_k` = 1) is greedy.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0: all).
    pub top_k: u32,
    /// Keep the smallest set of top tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Seed of the request's draws.
    pub seed: u64,
    /// Return each drawn token's log-probability and those of the `k` most likely tokens
    /// (vLLM's `logprobs`, at most [`SamplingParams::MAX_LOGPROBS`]); `None`: not computed.
    pub logprobs: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`): dividing logits by
    /// them would overflow.
    pub const GREEDY_BELOW: f32 = 1e-5;

    /// Most top log-probabilities a draw returns (vLLM's default `max_logprobs`).
    pub const MAX_LOGPROBS: u32 = 20;

    /// Whether the draw is the argmax.
    pub fn is_greedy(&self) -> bool {
        // NaN is greedy too.
        self.temperature.is_nan() || self.temperature < Self::GREEDY_BELOW || self.top_k == 1
    }

    /// The top-p cut in force: in (0, 1] (a non-positive or NaN `top_p` keeps the top
    /// token only, 1e-6 of the mass).
    pub fn top_p(&self) -> f32 {
        if self.top_p >= 1.0 {
            1.0
        } else if self.top_p > 1e-6 {
            self.top_p
        } else {
            1e-6
        }
    }

    /// The uniform number in [0, 1) that draws sample `j` of sequence `seq` at `position`:
    /// a hash of (seed, seq, position, j), so a draw depends neither on the rest of the
    /// batch nor on chunking or preemption (DESIGN invariant 10), and every backend draws
    /// with the same number. 24 bits: exact in an f32.
    pub fn uniform(&self, seq: SeqId, position: u32, j: u32) -> f32 {
        let mix = |mut z: u64| {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let z = mix(mix(mix(self.seed) ^ seq) ^ (u64::from(position) << 32 | u64::from(j)));
        (z >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// One inference request as the workload yields it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Unique id, increasing in arrival order.
    pub id: SeqId,
    /// Arrival time.
    pub arrival: Nanos,
    /// Number of prompt tokens.
    pub prompt_len: u32,
    /// Prompt token ids, when a real backend or a prefix cache needs them; empty in pure
    /// simulation (the length is what the cost model needs).
    pub prompt_tokens: Vec<u32>,
    /// Maximum number of tokens to generate. In simulation this is the output length the
    /// workload drew (the request runs with `ignore_eos`, as vLLM's benchmark client does).
    pub max_tokens: u32,
    /// Stop at the end-of-sequence token (real backends); simulation ignores EOS.
    pub ignore_eos: bool,
    /// Neither end-of-sequence nor a stop token id ends the request before this many
    /// tokens (vLLM's `min_tokens`): until then real backends never draw them (their
    /// logits are masked, [`crate::plan::SeqWork::suppress`]).
    pub min_tokens: u32,
    /// Token ids that end the request like end-of-sequence (vLLM's `stop_token_ids`),
    /// `ignore_eos` or not; the id is emitted and counted.
    pub stop_token_ids: Vec<u32>,
    /// What the model answers, when the workload knows it (a multi-turn conversation whose
    /// next turn resends this answer): simulation emits these token ids instead of
    /// placeholders, so the generated blocks hash like the next turn's history. Empty: no
    /// script; real backends ignore it.
    pub scripted_output: Vec<u32>,
    /// Parallel sampling: sequences generated from this prompt (vLLM's `n`, at least 1).
    /// The prompt is computed once; after its first token the sequence forks into `n`
    /// sequences that share the prompt's KV blocks copy-on-write.
    pub n: u32,
    /// Beam search of width `n` (vLLM V0's `use_beam_search` with `best_of = n`): after
    /// every decode step the `n` beams are re-chosen from their candidates, so some beams
    /// end and others fork (sharing blocks copy-on-write). Beam choices are synthetic
    /// (seeded by the request id), as the simulator has no log-probabilities.
    pub beam_search: bool,
    /// Scheduling priority (lower value is served first by priority policies).
    pub priority: i32,
    /// Index of the request class in the workload (for per-class metrics).
    pub class: u16,
    /// The conversation (chat session) the request belongs to, as a client's session
    /// header names it, for a fleet router's session affinity; 0: none.
    pub session: u64,
    /// Prefill/decode disaggregation, decode side: the leading prompt tokens whose KV
    /// arrives computed (transferred from a prefill replica): the sequence starts with them
    /// computed, in blocks of its own, and computes only the rest (0: none).
    pub kv_ready: u32,
    /// Prefill/decode disaggregation, prefill side: when the request finishes, its blocks
    /// stay held (listed in [`crate::scheduler::CommitResult::held`]) until the transfer
    /// that reads them ends and the driver frees them.
    pub hold_kv: bool,
    /// How tokens are drawn (real backends).
    pub sampling: SamplingParams,
}

/// Whether drawing `token` as output token number `output_len` (counted from 1) ends a
/// sequence that stops as `ignore_eos`, `min_tokens` and `stop_token_ids` say (vLLM's
/// `check_stop`, after the length cap): end-of-sequence unless ignored, or a stop token id,
/// once `min_tokens` are out.
pub fn stops_at(
    token: u32,
    output_len: u32,
    eos: Option<u32>,
    ignore_eos: bool,
    min_tokens: u32,
    stop_token_ids: &[u32],
) -> bool {
    output_len >= min_tokens
        && ((!ignore_eos && Some(token) == eos) || stop_token_ids.contains(&token))
}

impl Request {
    /// Whether drawing `token` as output token number `output_len` ends this request
    /// ([`stops_at`]).
    pub fn stops_at(&self, token: u32, output_len: u32, eos: Option<u32>) -> bool {
        stops_at(
            token,
            output_len,
            eos,
            self.ignore_eos,
            self.min_tokens,
            &self.stop_token_ids,
        )
    }

    /// The token ids a draw must not pick when `generated` output tokens precede it:
    /// while `generated < min_tokens`, end-of-sequence (unless ignored) and the stop token
    /// ids, as vLLM's min-tokens logits processor masks them (so a request gives at least
    /// `min_tokens` tokens that are not stops). Empty otherwise.
    pub fn suppressed(&self, generated: u32, eos: Option<u32>) -> Vec<u32> {
        if generated >= self.min_tokens {
            return Vec::new();
        }
        let mut ids: Vec<u32> = eos.filter(|_| !self.ignore_eos).into_iter().collect();
        for &t in &self.stop_token_ids {
            if !ids.contains(&t) {
                ids.push(t);
            }
        }
        ids
    }

    /// A request as simulation workloads make them: `prompt_len` tokens without ids, exactly
    /// `max_tokens` generated (EOS ignored), one sequence, priority 0, class 0.
    pub fn new(id: SeqId, arrival: Nanos, prompt_len: u32, max_tokens: u32) -> Self {
        Request {
            id,
            arrival,
            prompt_len,
            prompt_tokens: Vec::new(),
            max_tokens,
            ignore_eos: true,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            scripted_output: Vec::new(),
            n: 1,
            beam_search: false,
            priority: 0,
            class: 0,
            session: 0,
            kv_ready: 0,
            hold_kv: false,
            sampling: SamplingParams::default(),
        }
    }

    /// The same request with these prompt token ids (its prompt length is theirs).
    pub fn with_tokens(self, prompt_tokens: Vec<u32>) -> Self {
        Request {
            prompt_len: prompt_tokens.len() as u32,
            prompt_tokens,
            ..self
        }
    }
}

/// Lifecycle state of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeqStatus {
    /// In the queue, never scheduled.
    Waiting,
    /// Admitted: holds KV blocks and is scheduled step by step.
    Running,
    /// Evicted from the running set (KV freed to be recomputed, or swapped to the CPU
    /// pool); back in the queue.
    Preempted,
    /// Ended normally.
    Finished,
    /// Refused without running. Requests refused on arrival never become live sequences:
    /// their record carries this outcome as its `finish_reason`.
    Rejected,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Produced the end-of-sequence token.
    Stop,
    /// Prompt plus `max_tokens` exceed `max_model_len` (or the whole KV pool).
    RejectedTooLong,
    /// Aborted by its client (a served request whose client hung up or matched a stop
    /// string): it ends at its next step, its blocks freed.
    Abort,
}

impl FinishReason {
    /// Short name used in CSV outputs.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::RejectedTooLong => "rejected_too_long",
            FinishReason::Abort => "abort",
        }
    }

    /// True for rejections (the request never ran).
    pub fn is_rejection(self) -> bool {
        matches!(self, FinishReason::RejectedTooLong)
    }
}

/// A live sequence inside the scheduler.
///
/// The token accounting follows vLLM V1: `num_tokens` counts prompt and generated tokens,
/// `num_computed` the tokens whose KV is in the cache. A step schedules `n <= num_tokens -
/// num_computed` tokens; when a step brings `num_computed` to `num_tokens`, the model samples
/// one new token. Preemption by recompute resets `num_computed` to 0, so the prompt and the
/// tokens generated so far are prefilled again.
#[derive(Debug, Clone)]
pub struct Sequence {
    /// The request as it arrived.
    pub request: Request,
    /// Current state.
    pub status: SeqStatus,
    /// Prompt plus generated tokens.
    pub num_tokens: u32,
    /// Tokens whose KV has been computed.
    pub num_computed: u32,
    /// Tokens generated so far.
    pub output_len: u32,
    /// Generated token ids (kept only when a real backend produces them).
    pub output_tokens: Vec<u32>,
    /// Time the sequence was first scheduled.
    pub first_scheduled: Option<Nanos>,
    /// Time of the first generated token.
    pub first_token: Option<Nanos>,
    /// Time of the latest generated token.
    pub last_token: Option<Nanos>,
    /// Times this sequence was preempted.
    pub num_preemptions: u32,
    /// Admission counter value when last admitted (orders the running set, newest last).
    pub admitted_seq: u64,
    /// Chained hashes of the prompt's full blocks (prefix caching, when the prompt carries
    /// token ids).
    pub block_hashes: Option<std::sync::Arc<[u64]>>,
    /// Chained hashes of the full blocks after the prompt's (they hold generated tokens),
    /// as the sequence computes them; kept when its token ids are known (real backends, or
    /// a scripted output).
    pub gen_hashes: Vec<u64>,
    /// Leading blocks of the table already registered in the prefix cache.
    pub hashed_blocks: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    /// Whether the KV sits in the CPU swap pool (preempted by swap: `num_computed` kept).
    pub swapped: bool,
    /// Most tokens computed before a recompute preemption: computing positions below this
    /// again is recomputation (a metric).
    pub recompute_upto: u32,
    /// Prompt tokens the prefix cache held for this sequence at the last probe (the `lpm`
    /// queue policy's key).
    pub probed_prefix: u32,
    /// Tokens in full blocks shared with the sequence it was forked from (parallel sampling
    /// or beam search), so the KV held is not counted twice.
    pub shared_tokens: u32,
}

impl Sequence {
    /// A new waiting sequence for `request`.
    pub fn new(request: Request) -> Self {
        let num_tokens = request.prompt_len;
        // Transferred KV counts as computed; the last prompt token is always computed here,
        // for its logits.
        let num_computed = request.kv_ready.min(num_tokens.saturating_sub(1));
        Sequence {
            request,
            status: SeqStatus::Waiting,
            num_tokens,
            num_computed,
            output_len: 0,
            output_tokens: Vec::new(),
            first_scheduled: None,
            first_token: None,
            last_token: None,
            num_preemptions: 0,
            admitted_seq: 0,
            block_hashes: None,
            gen_hashes: Vec::new(),
            hashed_blocks: 0,
            cached_tokens: 0,
            swapped: false,
            recompute_upto: 0,
            probed_prefix: 0,
            shared_tokens: 0,
        }
    }

    /// Tokens still to compute before the next sample.
    pub fn remaining(&self) -> u32 {
        self.num_tokens - self.num_computed
    }

    /// Token id at position `pos` (prompt, then generated tokens), when known.
    pub fn token_at(&self, pos: u32) -> Option<u32> {
        let p = pos as usize;
        let prompt = self.request.prompt_len as usize;
        if p < prompt {
            self.request.prompt_tokens.get(p).copied()
        } else {
            self.output_tokens.get(p - prompt).copied()
        }
    }

    /// Seats (`max_num_seqs` slots) the sequence takes when admitted: `n` for a
    /// parallel-sampling request before its fork, else 1.
    pub fn seats(&self) -> u32 {
        if self.output_len == 0 {
            self.request.n.max(1)
        } else {
            1
        }
    }

    /// Hash of full block `i` (prompt blocks, then generated ones), when known.
    pub fn block_hash(&self, i: usize) -> Option<u64> {
        let prompt = self.block_hashes.as_deref().unwrap_or(&[]);
        match prompt.get(i) {
            Some(&h) => Some(h),
            None => self.gen_hashes.get(i - prompt.len()).copied(),
        }
    }

    /// Number of full blocks whose hash is known.
    pub fn num_block_hashes(&self) -> usize {
        self.block_hashes.as_deref().map_or(0, <[u64]>::len) + self.gen_hashes.len()
    }

    /// True when the next step of this sequence is a plain decode (one new token after
    /// the last generated one); false during prefill or a recompute after preemption.
    pub fn is_decode(&self) -> bool {
        self.output_len > 0 && self.remaining() == 1
    }
}
