//! Multi-turn chat sessions (`[workload.multi_turn]`), as vLLM's and SGLang's multi-turn
//! benchmarks send them: every turn resends the system prompt and the whole history. The
//! answers are scripted, so the KV blocks a turn generates hash like the next turn's history
//! and the prefix cache can reuse them. Generated lazily in arrival order; memory follows the
//! live conversations.

use std::path::Path;

use engine::request::NANOS_PER_SEC;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};

use super::arrivals::Gaps;
use super::error::check_positive;
use super::lengths::LenSampler;
use super::streams::{stream, synthetic_token, PURPOSE_ARRIVALS};
use super::{Generated, LengthDist, SharedPrefix, WorkloadError};

/// `[workload.multi_turn]`: chat sessions whose every turn sends the system prompt, all
/// earlier user messages and answers, and a new user message (as vLLM's and SGLang's
/// multi-turn benchmarks do). The answers are scripted (their token ids are known), so the
/// KV blocks a turn generates hash like the next turn's history and the prefix cache can
/// reuse them. Open loop: turn `k + 1` arrives an exponential think time after turn `k`
/// arrived, whether or not turn `k` has finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiTurnConfig {
    /// Turns per conversation.
    pub turns: LengthDist,
    /// Tokens of each new user message.
    pub user: LengthDist,
    /// Tokens of each answer (`max_tokens` of the turn).
    pub output: LengthDist,
    /// Mean time between a turn's arrival and the next turn's (exponential), seconds.
    pub think_time_s: f64,
    /// A system prompt at the start of every conversation, one of `groups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<SharedPrefix>,
    /// A conversation ends early instead of sending a prompt longer than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt: Option<u32>,
}

impl MultiTurnConfig {
    /// Checks the distributions, the think time and the system prompt's groups.
    pub(super) fn validate(&self) -> Result<(), WorkloadError> {
        let key = "workload.multi_turn";
        self.turns.validate(&format!("{key}.turns"))?;
        self.user.validate(&format!("{key}.user"))?;
        self.output.validate(&format!("{key}.output"))?;
        check_positive(&format!("{key}.think_time_s"), self.think_time_s)?;
        if let Some(p) = self.system_prompt {
            if p.groups == 0 {
                return Err(WorkloadError::config(
                    format!("{key}.system_prompt.groups"),
                    "must be at least 1, got 0",
                ));
            }
        }
        if self.max_prompt == Some(0) {
            return Err(WorkloadError::config(
                format!("{key}.max_prompt"),
                "must be at least 1, got 0",
            ));
        }
        Ok(())
    }
}

/// Class names of a multi-turn workload: first turns and follow-up turns.
pub const MULTI_TURN_CLASSES: [&str; 2] = ["first-turn", "follow-up"];

/// Namespaces of [`synthetic_token`] for multi-turn conversations (distinct from class
/// indices, so their tokens never collide with class prefixes).
const NS_SYSTEM: u64 = 0x5359_5354_0000_0000;
const NS_CONVERSATION: u64 = 0x434F_4E56_0000_0000;

/// A live conversation of a multi-turn workload.
#[derive(Debug)]
struct Conversation {
    id: u64,
    history: Vec<u32>,
    turn: u32,
    turns_left: u32,
}

/// Multi-turn conversations, generated lazily in arrival order: one pending conversation
/// start plus a heap of pending follow-up turns (memory follows the live conversations).
#[derive(Debug)]
pub(super) struct MultiTurn {
    cfg: MultiTurnConfig,
    turns: LenSampler,
    user: LenSampler,
    output: LenSampler,
    think: Exp<f64>,
    gaps: Gaps,
    /// Time of the last conversation start, in seconds.
    t: f64,
    next_start: Option<f64>,
    arrival_rng: ChaCha8Rng,
    len_rng: ChaCha8Rng,
    think_rng: ChaCha8Rng,
    group_rng: ChaCha8Rng,
    /// Pending follow-ups: (arrival ns, sequence number, conversation id) and the time.
    pending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, u64)>>,
    pending_s: rustc_hash::FxHashMap<u64, f64>,
    live: rustc_hash::FxHashMap<u64, Conversation>,
    next_conv: u64,
    seq: u64,
}

impl MultiTurn {
    pub(super) fn new(
        cfg: &MultiTurnConfig,
        gaps: Gaps,
        base_dir: &Path,
        seed: u64,
    ) -> Result<Self, WorkloadError> {
        let key = "workload.multi_turn";
        let think = Exp::new(1.0 / cfg.think_time_s).map_err(|e| {
            WorkloadError::config(format!("{key}.think_time_s"), format!("invalid: {e}"))
        })?;
        Ok(MultiTurn {
            turns: LenSampler::new(&cfg.turns, base_dir, &format!("{key}.turns"))?,
            user: LenSampler::new(&cfg.user, base_dir, &format!("{key}.user"))?,
            output: LenSampler::new(&cfg.output, base_dir, &format!("{key}.output"))?,
            cfg: cfg.clone(),
            think,
            gaps,
            t: 0.0,
            next_start: None,
            arrival_rng: stream(seed, PURPOSE_ARRIVALS),
            len_rng: stream(seed, 0x3_0000),
            think_rng: stream(seed, 0x3_0001),
            group_rng: stream(seed, 0x3_0002),
            pending: std::collections::BinaryHeap::new(),
            pending_s: rustc_hash::FxHashMap::default(),
            live: rustc_hash::FxHashMap::default(),
            next_conv: 0,
            seq: 0,
        })
    }

    /// The next turn in arrival order (ties: earlier-scheduled first).
    pub(super) fn next(&mut self) -> Generated {
        let start = *self.next_start.get_or_insert_with(|| {
            self.t += self.gaps.draw(&mut self.arrival_rng);
            self.t
        });
        let follow = self
            .pending
            .peek()
            .map(|std::cmp::Reverse((_, _, c))| (*c, self.pending_s[c]));
        let (conv, t) = match follow {
            Some((c, t)) if t <= start => {
                self.pending.pop();
                self.pending_s.remove(&c);
                (c, t)
            }
            _ => {
                self.next_start = None;
                let id = self.next_conv;
                self.next_conv += 1;
                let mut history = Vec::new();
                if let Some(sp) = self.cfg.system_prompt {
                    let g = self.group_rng.random_range(0..sp.groups.max(1));
                    history.extend(
                        (0..sp.tokens).map(|j| synthetic_token(NS_SYSTEM, u64::from(g), j)),
                    );
                }
                let turns = self.turns.sample(&mut self.len_rng).max(1);
                self.live.insert(
                    id,
                    Conversation {
                        id,
                        history,
                        turn: 0,
                        turns_left: turns,
                    },
                );
                (id, start)
            }
        };
        let mut c = self.live.remove(&conv).unwrap_or(Conversation {
            id: conv,
            history: Vec::new(),
            turn: 0,
            turns_left: 1,
        });
        let ns = NS_CONVERSATION ^ c.id;
        let u = self.user.sample(&mut self.len_rng);
        c.history
            .extend((0..u).map(|j| synthetic_token(ns, 2 * u64::from(c.turn), j)));
        let prompt = c.history.clone();
        let o = self.output.sample(&mut self.len_rng);
        let script: Vec<u32> = (0..o)
            .map(|j| synthetic_token(ns, 2 * u64::from(c.turn) + 1, j))
            .collect();
        c.history.extend_from_slice(&script);
        let class = u16::from(c.turn > 0);
        let session = c.id + 1;
        c.turn += 1;
        c.turns_left -= 1;
        let fits = self
            .cfg
            .max_prompt
            .is_none_or(|m| c.history.len() < m as usize);
        if c.turns_left > 0 && fits {
            let next = t + self.think.sample(&mut self.think_rng);
            let key = (next * NANOS_PER_SEC).round() as u64;
            self.pending.push(std::cmp::Reverse((key, self.seq, c.id)));
            self.seq += 1;
            self.pending_s.insert(c.id, next);
            self.live.insert(c.id, c);
        }
        Generated {
            session,
            ..Generated::with_prompt(t, prompt, o, class, script)
        }
    }
}
