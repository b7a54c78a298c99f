//! The small policy families the schedulers share (DESIGN §5): queue order, admission
//! reserve and preemption victim, each chosen by name per variant.

use serde::{Deserialize, Serialize};

use crate::request::{Nanos, SeqId, Sequence};

/// Order of the waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum QueuePolicy {
    /// First come, first served; preempted requests go back to the front (vLLM).
    #[default]
    Fcfs,
    /// Lower `priority` value first, ties by arrival (vLLM's priority scheduling).
    Priority,
    /// Shortest prompt first, with aging: the key halves every `queue_aging_s` of waiting,
    /// so nothing starves.
    Sjf,
    /// Shortest true output first (an oracle: the simulator knows each request's output
    /// length), with the same aging.
    SjfOracle,
    /// Longest cached prefix first (SGLang's `lpm`): requests that would hit the most
    /// prefix-cache tokens go first, ties by arrival. The match lengths come from the block
    /// manager's answer to the previous step (one step stale); with more than
    /// [`LPM_MAX_QUEUE`] waiting requests the queue falls back to FCFS, as SGLang does.
    Lpm,
}

/// Longest waiting queue that `lpm` sorts (SGLang falls back to FCFS beyond 128).
pub const LPM_MAX_QUEUE: usize = 128;

/// A waiting sequence's place in a queue policy's order, smaller first: `(primary, arrival,
/// request id, sequence id)`. The sequence id orders the members of a parallel-sampling
/// group (same request) that wait together after a preemption.
pub type QueueKey = (i64, Nanos, SeqId, SeqId);

impl QueuePolicy {
    /// Sort key of waiting sequence `id` at time `now` (smaller is served first; ties by
    /// arrival, then request and sequence id; FCFS ranks by arrival alone, though its
    /// queue keeps preempted sequences in front instead of sorting).
    pub fn key(self, id: SeqId, s: &Sequence, now: Nanos, aging_ns: u64) -> QueueKey {
        let r = &s.request;
        let aged = |len: u32| {
            let periods = now.saturating_sub(r.arrival) / aging_ns.max(1);
            i64::from(len) >> periods.min(32)
        };
        let primary = match self {
            QueuePolicy::Fcfs => 0,
            QueuePolicy::Priority => i64::from(r.priority),
            QueuePolicy::Sjf => aged(r.prompt_len),
            QueuePolicy::SjfOracle => aged(r.max_tokens),
            QueuePolicy::Lpm => -i64::from(s.probed_prefix),
        };
        (primary, r.arrival, r.id, id)
    }
}

/// How many KV slots a request must get before it is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AdmissionPolicy {
    /// Only what the first step computes (vLLM): admits the most, preempts under pressure.
    #[default]
    Optimistic,
    /// The whole prompt must fit at admission, even when it is prefilled in chunks.
    FullPrompt,
    /// Prompt + max_tokens are reserved at admission (TGI): never preempts.
    WorstCase,
    /// `max_model_len` is reserved per request, as allocators before PagedAttention did
    /// (the baseline whose waste the `kv_fragmentation` metric shows).
    MaxModelLen,
    /// SGLang's estimate: the prompt plus `ratio x` the tokens still to generate, where the
    /// ratio starts at 0.7, decays by 0.001 a step down to 0.1, and jumps back to 0.7 after
    /// a preemption. Here the estimate is reserved as blocks at admission (SGLang only
    /// budgets it), so it sits between `optimistic` and `worst-case`.
    Estimated,
}

/// SGLang's `new_token_ratio` schedule (`init_new_token_ratio`, `min_new_token_ratio`,
/// `new_token_ratio_decay`).
pub const NEW_TOKEN_RATIO: (f64, f64, f64) = (0.7, 0.1, 0.001);

impl AdmissionPolicy {
    /// Slots to reserve for a waiting sequence that computes `tokens` tokens this step
    /// (`ratio`: the current estimated new-token ratio).
    pub fn slots(self, s: &Sequence, tokens: u32, max_model_len: u32, ratio: f64) -> u32 {
        let first_step = s.num_computed + tokens;
        match self {
            AdmissionPolicy::Optimistic => first_step,
            AdmissionPolicy::FullPrompt => first_step.max(s.num_tokens),
            AdmissionPolicy::WorstCase => {
                first_step.max(s.request.prompt_len + s.request.max_tokens)
            }
            AdmissionPolicy::MaxModelLen => first_step.max(max_model_len),
            AdmissionPolicy::Estimated => {
                let left = s.request.max_tokens.saturating_sub(s.output_len);
                first_step.max(s.num_tokens + (ratio * f64::from(left)).ceil() as u32)
            }
        }
    }
}

/// Which running sequence is preempted first when blocks run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum VictimPolicy {
    /// The newest admitted (vLLM FCFS).
    #[default]
    Newest,
    /// The largest `priority` value (lowest priority) first, ties newest first.
    LowestPriority,
    /// The fewest computed tokens first (least work lost: SGLang), ties newest first.
    FewestComputed,
}

impl VictimPolicy {
    /// Sort key of a running sequence as a victim (smaller is preempted first).
    pub fn key(self, s: &Sequence) -> (i64, u64) {
        let newest = u64::MAX - s.admitted_seq;
        match self {
            VictimPolicy::Newest => (0, newest),
            VictimPolicy::LowestPriority => (-i64::from(s.request.priority), newest),
            VictimPolicy::FewestComputed => (i64::from(s.num_computed), newest),
        }
    }
}

/// What happens to a preempted sequence's KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PreemptionMode {
    /// Drop it and recompute the prompt and the tokens generated so far (vLLM V1).
    #[default]
    Recompute,
    /// Copy it to a CPU block pool over PCIe and back when the sequence resumes (vLLM V0's
    /// `preemption_mode="swap"`); falls back to recompute when the CPU pool is full.
    Swap,
}

/// How the KV pool hands out blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KvAllocator {
    /// PagedAttention: any free block, anywhere (vLLM).
    #[default]
    Paged,
    /// One contiguous run per sequence, first-fit (before PagedAttention: Orca,
    /// FasterTransformer); free space cut into short runs is lost to long requests.
    Contiguous,
}
