//! Per-request and per-step records: what a run emits for the analysis crate.

use serde::{Deserialize, Serialize};

use crate::request::{FinishReason, Nanos, SeqId};

/// One row of `requests.csv`: everything measured about one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Request id.
    pub request_id: SeqId,
    /// Class index in the workload.
    pub class: u16,
    /// Arrival time (ns).
    pub arrival_ns: Nanos,
    /// First time the request was scheduled (ns); absent for rejected requests.
    pub first_scheduled_ns: Option<Nanos>,
    /// Time of the first output token (ns).
    pub first_token_ns: Option<Nanos>,
    /// Time the request ended (ns).
    pub finish_ns: Nanos,
    /// Prompt tokens.
    pub prompt_len: u32,
    /// Generated tokens.
    pub output_len: u32,
    /// Requested maximum of generated tokens.
    pub max_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    /// Times the request was preempted.
    pub num_preemptions: u32,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

impl RequestRecord {
    /// Time to first token in seconds.
    pub fn ttft_s(&self) -> Option<f64> {
        self.first_token_ns.map(|t| ns_to_s(t - self.arrival_ns))
    }

    /// End-to-end latency in seconds.
    pub fn e2el_s(&self) -> f64 {
        ns_to_s(self.finish_ns - self.arrival_ns)
    }

    /// Time per output token in seconds: (E2EL - TTFT) / (output_len - 1), for
    /// output_len > 1 (DESIGN §4, vLLM's definition).
    pub fn tpot_s(&self) -> Option<f64> {
        let first = self.first_token_ns?;
        if self.output_len > 1 {
            Some(ns_to_s(self.finish_ns - first) / f64::from(self.output_len - 1))
        } else {
            None
        }
    }

    /// Queueing delay (first scheduled - arrival) in seconds.
    pub fn queue_s(&self) -> Option<f64> {
        self.first_scheduled_ns
            .map(|t| ns_to_s(t - self.arrival_ns))
    }
}

/// One row of `steps.csv`: one engine step (one batch through the backend).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step number, from 0.
    pub step: u64,
    /// Start time (ns).
    pub start_ns: Nanos,
    /// Duration reported by the backend (ns).
    pub duration_ns: Nanos,
    /// Sequences in the batch.
    pub num_seqs: u32,
    /// Tokens in the batch (prefill + decode).
    pub num_batched_tokens: u32,
    /// Prefill tokens in the batch.
    pub num_prefill_tokens: u32,
    /// Decode tokens in the batch.
    pub num_decode_tokens: u32,
    /// Requests waiting after scheduling.
    pub num_waiting: u32,
    /// Requests running after scheduling.
    pub num_running: u32,
    /// Sequences preempted while scheduling this step.
    pub num_preempted: u32,
    /// KV blocks in use after scheduling.
    pub kv_blocks_used: u32,
    /// KV usage = blocks in use / pool size.
    pub kv_usage: f64,
    /// Model bandwidth utilisation of the step (cost model), 0 when unknown.
    pub mbu: f64,
    /// Model FLOPs utilisation of the step (cost model), 0 when unknown.
    pub mfu: f64,
    /// Tokens the running sequences hold in the KV cache after this step.
    pub kv_tokens: u64,
    /// Token slots of the blocks in use (`kv_blocks_used x block_size`): the gap to
    /// `kv_tokens` is reserved but unused KV (fragmentation).
    pub kv_slots: u64,
    /// Of `num_preempted`, the sequences preempted by swapping to the CPU pool (the others
    /// recompute).
    pub num_swapped: u32,
    /// Blocks copied CPU -> GPU before the step.
    pub swap_in_blocks: u32,
    /// Blocks copied GPU -> CPU before the step.
    pub swap_out_blocks: u32,
    /// Copy-on-write block copies before the step.
    pub block_copies: u32,
    /// Tokens computed again because a recompute preemption dropped their KV.
    pub recomputed_tokens: u32,
}

/// Converts nanoseconds to seconds.
pub fn ns_to_s(ns: Nanos) -> f64 {
    ns as f64 / crate::request::NANOS_PER_SEC
}
