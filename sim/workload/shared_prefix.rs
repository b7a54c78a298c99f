//! SGLang's `generated-shared-prefix` benchmark dataset (`[workload.generated_shared_prefix]`):
//! `groups` system prompts, each followed by `prompts_per_group` distinct questions, the
//! requests shuffled (seeded) and paced by the arrival process.

use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::arrivals::Gaps;
use super::streams::{stream, synthetic_token, PURPOSE_ARRIVALS};
use super::{Generated, WorkloadError};

/// `[workload.generated_shared_prefix]`: SGLang's `generated-shared-prefix` benchmark
/// dataset. `groups` system prompts of `system_prompt_len` tokens, each followed by
/// `prompts_per_group` distinct questions of `question_len` tokens; every request asks for
/// `output_len` tokens; the `groups x prompts_per_group` requests are shuffled (seeded).
/// SGLang's defaults: 64 groups, 16 prompts per group, 2048, 128 and 256 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratedSharedPrefix {
    /// Number of system prompts.
    #[serde(default = "gsp_groups")]
    pub groups: u32,
    /// Questions per system prompt.
    #[serde(default = "gsp_prompts_per_group")]
    pub prompts_per_group: u32,
    /// Tokens of each system prompt.
    #[serde(default = "gsp_system_prompt_len")]
    pub system_prompt_len: u32,
    /// Tokens of each question.
    #[serde(default = "gsp_question_len")]
    pub question_len: u32,
    /// Output tokens of each request.
    #[serde(default = "gsp_output_len")]
    pub output_len: u32,
}

fn gsp_groups() -> u32 {
    64
}
fn gsp_prompts_per_group() -> u32 {
    16
}
fn gsp_system_prompt_len() -> u32 {
    2048
}
fn gsp_question_len() -> u32 {
    128
}
fn gsp_output_len() -> u32 {
    256
}

impl GeneratedSharedPrefix {
    /// Checks that every count is at least 1 and the dataset at most 2^26 requests.
    pub(super) fn validate(&self) -> Result<(), WorkloadError> {
        for (k, v) in [
            ("groups", self.groups),
            ("prompts_per_group", self.prompts_per_group),
            ("system_prompt_len", self.system_prompt_len),
            ("question_len", self.question_len),
            ("output_len", self.output_len),
        ] {
            if v == 0 {
                return Err(WorkloadError::config(
                    format!("workload.generated_shared_prefix.{k}"),
                    "must be at least 1, got 0",
                ));
            }
        }
        if u64::from(self.groups) * u64::from(self.prompts_per_group) > 1 << 26 {
            return Err(WorkloadError::config(
                "workload.generated_shared_prefix.groups",
                "groups x prompts_per_group must be at most 2^26",
            ));
        }
        Ok(())
    }

    /// Requests in the dataset.
    pub(super) fn len(&self) -> u64 {
        u64::from(self.groups) * u64::from(self.prompts_per_group)
    }
}

/// Class name of the generated-shared-prefix workload.
pub const GSP_CLASS: &str = "shared-prefix";

/// Namespaces of [`synthetic_token`] for the dataset's system prompts and questions
/// (distinct from class indices and from multi-turn conversations).
const NS_GSP_SYSTEM: u64 = 0x4753_5053_0000_0000;
const NS_GSP_QUESTION: u64 = 0x4753_5051_0000_0000;

/// SGLang's generated-shared-prefix dataset: a seeded shuffle of (group, question) pairs.
#[derive(Debug)]
pub(super) struct SharedPrefixGen {
    cfg: GeneratedSharedPrefix,
    order: Vec<(u32, u32)>,
    pos: usize,
    gaps: Gaps,
    t: f64,
    arrival_rng: ChaCha8Rng,
}

impl SharedPrefixGen {
    pub(super) fn new(cfg: &GeneratedSharedPrefix, gaps: Gaps, seed: u64) -> Self {
        use rand::seq::SliceRandom;
        let mut order: Vec<(u32, u32)> = (0..cfg.groups)
            .flat_map(|g| (0..cfg.prompts_per_group).map(move |q| (g, q)))
            .collect();
        order.shuffle(&mut stream(seed, 0x4_0000));
        SharedPrefixGen {
            cfg: *cfg,
            order,
            pos: 0,
            gaps,
            t: 0.0,
            arrival_rng: stream(seed, PURPOSE_ARRIVALS),
        }
    }

    pub(super) fn next(&mut self) -> Option<Generated> {
        let &(g, q) = self.order.get(self.pos)?;
        self.pos += 1;
        self.t += self.gaps.draw(&mut self.arrival_rng);
        let c = &self.cfg;
        let prompt: Vec<u32> =
            (0..c.system_prompt_len)
                .map(|j| synthetic_token(NS_GSP_SYSTEM, u64::from(g), j))
                .chain((0..c.question_len).map(|j| {
                    synthetic_token(NS_GSP_QUESTION, (u64::from(g) << 32) | u64::from(q), j)
                }))
                .collect();
        Some(Generated::with_prompt(
            self.t,
            prompt,
            c.output_len,
            0,
            Vec::new(),
        ))
    }
}
