//! The class-based synthetic workload (`arrival` plus `[[workload.class]]`): arrivals from
//! the arrival process, each request's class drawn by weight, its prompt and output lengths
//! from the class's distributions, an optional shared system prompt per class, and an
//! optional prompt pool per class (a benchmark client's finite dataset: each request takes
//! one of the pool's entries, whose prompt tokens and lengths were fixed when the pool was
//! made, so a repeated entry repeats its prompt token for token).

use std::path::Path;

use rand::distr::weighted::WeightedIndex;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::Distribution;

use super::arrivals::Gaps;
use super::csv_file::load_counts;
use super::lengths::{ClassLengths, ClassSampler, LenSampler};
use super::streams::{
    purpose_output, purpose_pool, purpose_prompt, stream, synthetic_token, PURPOSE_ARRIVALS,
    PURPOSE_CLASS,
};
use super::{Generated, PoolSampling, PromptPool, SharedPrefix, WorkloadConfig, WorkloadError};

/// Where pool entries' tokens live among the synthetic tokens' `b` values: above every
/// shared prefix's group (a `u32`), so an entry never repeats a system prompt's tokens.
const POOL_TOKENS: u64 = 1 << 40;

/// One class's prompt pool: its entries' (prompt, output) lengths, and where the sampling
/// stands.
#[derive(Debug, Clone)]
struct Pool {
    entries: Vec<(u32, u32)>,
    sampling: PoolSampling,
    /// The current pass's order (shuffle), and the next place in it (shuffle, sequential).
    order: Vec<u32>,
    pos: usize,
    rng: ChaCha8Rng,
}

impl Pool {
    /// `cfg.size` entries drawn from `sampler` (its lengths), picked later with `rng`.
    fn new(cfg: PromptPool, sampler: &mut ClassSampler, rng: ChaCha8Rng) -> Pool {
        // `validate` keeps the size at 1 or more; an empty pool could pick nothing.
        let entries = (0..cfg.size.max(1)).map(|_| sampler.sample()).collect();
        Pool {
            entries,
            sampling: cfg.sampling,
            order: Vec::new(),
            pos: 0,
            rng,
        }
    }

    /// The next request's entry.
    fn pick(&mut self) -> u32 {
        let n = self.entries.len() as u32;
        match self.sampling {
            PoolSampling::Random => self.rng.random_range(0..n),
            PoolSampling::Sequential => {
                let i = (self.pos % self.entries.len()) as u32;
                self.pos = self.pos.wrapping_add(1);
                i
            }
            PoolSampling::Shuffle => {
                if self.pos >= self.order.len() {
                    // A new pass: every entry once, in an order of its own.
                    self.order = (0..n).collect();
                    self.order.shuffle(&mut self.rng);
                    self.pos = 0;
                }
                let i = self.order[self.pos];
                self.pos += 1;
                i
            }
        }
    }
}

/// A synthetic workload's state.
#[derive(Debug, Clone)]
pub(super) struct Synthetic {
    /// Per class: its shared prefix and the stream choosing the group.
    prefixes: Vec<Option<(SharedPrefix, ChaCha8Rng)>>,
    /// Per class: its prompt pool.
    pools: Vec<Option<Pool>>,
    gaps: Gaps,
    /// Time of the last arrival, in seconds.
    t: f64,
    arrival_rng: ChaCha8Rng,
    class_rng: ChaCha8Rng,
    class_index: WeightedIndex<f64>,
    classes: Vec<ClassSampler>,
}

impl Synthetic {
    /// The classes' samplers and streams under `seed` (lengths files read now).
    pub(super) fn open(
        cfg: &WorkloadConfig,
        gaps: Gaps,
        base_dir: &Path,
        seed: u64,
    ) -> Result<Synthetic, WorkloadError> {
        let class_index = WeightedIndex::new(cfg.classes.iter().map(|c| c.weight))
            .map_err(|e| WorkloadError::config("workload.class.weight", format!("{e}")))?;
        let mut classes = Vec::with_capacity(cfg.classes.len());
        for (i, class) in cfg.classes.iter().enumerate() {
            let key = format!("workload.class[{i}]");
            let lengths = match (&class.prompt, &class.output, &class.lengths) {
                (Some(p), Some(o), None) => ClassLengths::Separate(
                    LenSampler::new(p, base_dir, &format!("{key}.prompt"))?,
                    LenSampler::new(o, base_dir, &format!("{key}.output"))?,
                ),
                (None, None, Some(j)) => ClassLengths::Joint(load_counts(
                    &base_dir.join(&j.path),
                    [j.prompt_column.as_str(), j.output_column.as_str()],
                )?),
                _ => {
                    return Err(WorkloadError::config(
                        format!("{key}.prompt"),
                        "give prompt and output, or lengths",
                    ))
                }
            };
            classes.push(ClassSampler {
                lengths,
                prompt_rng: stream(seed, purpose_prompt(i)),
                output_rng: stream(seed, purpose_output(i)),
            });
        }
        // Each pool's entries take their lengths from the class's streams, which a pooled
        // class uses for nothing else.
        let pools = cfg
            .classes
            .iter()
            .zip(classes.iter_mut())
            .enumerate()
            .map(|(i, (c, sampler))| {
                c.prompt_pool
                    .map(|p| Pool::new(p, sampler, stream(seed, purpose_pool(i))))
            })
            .collect();
        Ok(Synthetic {
            prefixes: cfg
                .classes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    c.shared_prefix
                        .map(|p| (p, stream(seed, 0x2_0000 + i as u64)))
                })
                .collect(),
            pools,
            gaps,
            t: 0.0,
            arrival_rng: stream(seed, PURPOSE_ARRIVALS),
            class_rng: stream(seed, PURPOSE_CLASS),
            class_index,
            classes,
        })
    }

    /// The next request (`id`: its id, which names its own prompt tokens after a shared
    /// prefix).
    pub(super) fn next(&mut self, id: u64) -> Generated {
        let t = self.t + self.gaps.draw(&mut self.arrival_rng);
        self.t = t;
        let class = if self.classes.len() == 1 {
            0
        } else {
            self.class_index.sample(&mut self.class_rng)
        };
        // The request's own prompt: a pool entry's (tokens named by the entry, the same
        // each time it is sent) or its own (tokens named by its id).
        let (mut p, o, own, pooled) = match self.pools.get_mut(class).and_then(Option::as_mut) {
            Some(pool) => {
                let e = pool.pick();
                let (p, o) = pool.entries[e as usize];
                (p, o, (class as u64, POOL_TOKENS + u64::from(e)), true)
            }
            None => {
                let (p, o) = self.classes[class].sample();
                (p, o, (u64::MAX - id, 0), false)
            }
        };
        let mut prompt = Vec::new();
        if let Some((prefix, rng)) = self.prefixes.get_mut(class).and_then(Option::as_mut) {
            let group = rng.random_range(0..prefix.groups.max(1));
            prompt = (0..prefix.tokens)
                .map(|j| synthetic_token(class as u64, u64::from(group), j))
                .chain((0..p).map(|j| synthetic_token(own.0, own.1, j)))
                .collect();
            p = p.saturating_add(prefix.tokens);
        } else if pooled {
            prompt = (0..p).map(|j| synthetic_token(own.0, own.1, j)).collect();
        }
        Generated {
            arrival_s: t,
            prompt,
            prompt_len: p,
            max_tokens: o,
            // validate() caps the class count at u16::MAX + 1.
            class: u16::try_from(class).unwrap_or(u16::MAX),
            script: Vec::new(),
            session: 0,
        }
    }
}
