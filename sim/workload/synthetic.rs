//! The class-based synthetic workload (`arrival` plus `[[workload.class]]`): arrivals from
//! the arrival process, each request's class drawn by weight, its prompt and output lengths
//! from the class's distributions, and an optional shared system prompt per class.

use std::path::Path;

use rand::distr::weighted::WeightedIndex;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::Distribution;

use super::arrivals::Gaps;
use super::csv_file::load_counts;
use super::lengths::{ClassLengths, ClassSampler, LenSampler};
use super::streams::{
    purpose_output, purpose_prompt, stream, synthetic_token, PURPOSE_ARRIVALS, PURPOSE_CLASS,
};
use super::{Generated, SharedPrefix, WorkloadConfig, WorkloadError};

/// A synthetic workload's state.
#[derive(Debug, Clone)]
pub(super) struct Synthetic {
    /// Per class: its shared prefix and the stream choosing the group.
    prefixes: Vec<Option<(SharedPrefix, ChaCha8Rng)>>,
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
        let (mut p, o) = self.classes[class].sample();
        let mut prompt = Vec::new();
        if let Some((prefix, rng)) = self.prefixes.get_mut(class).and_then(Option::as_mut) {
            let group = rng.random_range(0..prefix.groups.max(1));
            prompt = (0..prefix.tokens)
                .map(|j| synthetic_token(class as u64, u64::from(group), j))
                .chain((0..p).map(|j| synthetic_token(u64::MAX - id, 0, j)))
                .collect();
            p = p.saturating_add(prefix.tokens);
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
