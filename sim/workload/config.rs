//! The `[workload]` table ([`WorkloadConfig`]) and its request classes ([`ClassConfig`]),
//! as scenario files spell them, and their validation: every value and combination of keys
//! is checked before anything is opened, errors naming the dotted key.

use serde::{Deserialize, Serialize};

use super::error::{check_path, check_positive};
use super::{
    ArrivalConfig, GeneratedSharedPrefix, JointLengths, LengthDist, MultiTurnConfig, TraceConfig,
    WorkloadError,
};

/// The `[workload]` table of a scenario file.
///
/// Either `arrival` plus at least one `[[workload.class]]` (a synthetic workload, which
/// also needs `num_requests` or `duration_s`), or `trace` alone (replay; `num_requests`
/// and `duration_s` are then optional caps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Stop after this many requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_requests: Option<u64>,
    /// Stop generating arrivals after this simulated time, in seconds: a request whose
    /// arrival is later than this is not yielded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Arrival process of a synthetic workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<ArrivalConfig>,
    /// Trace to replay instead of `arrival` and the classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceConfig>,
    /// Request classes of a synthetic workload (`[[workload.class]]`).
    #[serde(default, rename = "class", skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassConfig>,
    /// Multi-turn conversations (`[workload.multi_turn]`): `arrival` starts conversations,
    /// each turn resends the whole history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_turn: Option<MultiTurnConfig>,
    /// SGLang's generated-shared-prefix dataset (`[workload.generated_shared_prefix]`):
    /// `arrival` paces its requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_shared_prefix: Option<GeneratedSharedPrefix>,
    /// Most requests in flight at once, as a benchmark client caps them (vLLM's `bench
    /// serve --max-concurrency`): a request that arrives with every slot taken is sent when
    /// one frees, and its latencies count from then (the engine sees the send time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// With `max_in_flight`: a request that waited for a slot is sent this long after the
    /// slot frees (the client's turnaround: reading the answer, sending the next request,
    /// the server parsing it). 0 by default; `sim replay` of a served closed loop sets the
    /// one it measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think_time_s: Option<f64>,
}

/// One request class of a synthetic workload (`[[workload.class]]`).
///
/// Lengths come either from `prompt` and `output` (independent distributions) or from
/// `lengths` (joint prompt and output lengths from one CSV row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Class name, used in per-class metrics.
    pub name: String,
    /// Relative weight of the class (default 1).
    #[serde(default = "default_one")]
    pub weight: f64,
    /// Distribution of the prompt length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<LengthDist>,
    /// Distribution of the output length (`max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<LengthDist>,
    /// Joint prompt and output lengths, sampled as whole CSV rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<JointLengths>,
    /// Scheduling priority of the class's requests (lower is served first by the `priority`
    /// queue policy; default 0).
    #[serde(default)]
    pub priority: i32,
    /// Parallel sampling: completions per request (vLLM's `n`; default 1). The prompt is
    /// prefilled once and its KV shared copy-on-write by the `n` sequences.
    #[serde(default = "one_seq")]
    pub n: u32,
    /// Beam search of width `n` (vLLM V0's `use_beam_search`): beams are re-chosen after
    /// every token, so some end and others fork copy-on-write (choices are synthetic).
    #[serde(default)]
    pub beam_search: bool,
    /// Sampling temperature of real backends (default 0: greedy); the cost model ignores it.
    #[serde(default)]
    pub temperature: f32,
    /// Top-k cut of real backends' sampling (default 0: none).
    #[serde(default)]
    pub top_k: u32,
    /// Top-p (nucleus) cut of real backends' sampling, in (0, 1] (default 1: none).
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// Speculative decoding's synthetic acceptance for this class's requests (replaces
    /// `speculative.acceptance`: code accepts more drafts than chat): per-position rates...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Vec<f64>>,
    /// ...or a mean acceptance length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_acceptance_length: Option<f64>,
    /// A system prompt shared by the class's requests: each request draws one of `groups`
    /// prefixes of `tokens` tokens and puts it before its own prompt (whose length the
    /// `prompt` distribution gives), so the prefix cache sees real sharing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_prefix: Option<SharedPrefix>,
    /// A benchmark client's finite dataset: the class's requests draw their prompts (and
    /// requested output lengths) from `size` entries made once from the class's length
    /// distributions, so an entry sent again repeats its prompt token for token and the
    /// prefix cache can serve it whole. aiperf's synthetic prompts are 100 such entries
    /// (drawn at random up to 0.2, shuffled from 0.3). After `shared_prefix` when both are
    /// given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pool: Option<PromptPool>,
}

/// `prompt_pool = { size = 100, sampling = "shuffle" }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptPool {
    /// Distinct entries (at most [`MAX_POOL_ENTRIES`]).
    pub size: u32,
    /// How each request picks its entry.
    #[serde(default)]
    pub sampling: PoolSampling,
}

/// The most entries a prompt pool may hold: 4,194,304 (each keeps its two lengths and a
/// place in the shuffle, 12 bytes: 48 MiB at most).
pub const MAX_POOL_ENTRIES: u32 = 1 << 22;

/// How a request picks its prompt pool entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolSampling {
    /// Every entry once in a random order, then again in a new order (aiperf from 0.3).
    #[default]
    Shuffle,
    /// Uniformly at random, with replacement (aiperf up to 0.2).
    Random,
    /// In order, then again from the first (a dataset replayed as written).
    Sequential,
}

/// `shared_prefix = { tokens = 1000, groups = 4 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedPrefix {
    /// Tokens of each shared prefix.
    pub tokens: u32,
    /// Distinct prefixes (requests pick one uniformly).
    #[serde(default = "one_group")]
    pub groups: u32,
}

fn one_group() -> u32 {
    1
}

fn one_seq() -> u32 {
    1
}

fn default_top_p() -> f32 {
    1.0
}

fn default_one() -> f64 {
    1.0
}

impl WorkloadConfig {
    /// The benchmark client that sends the requests: a closed loop's clients, or
    /// `max_in_flight`, or no cap at all (the engine's front end, a cost parameter, is
    /// set by the run).
    pub fn client(&self) -> crate::driver::Client {
        match self.arrival {
            Some(ArrivalConfig::ClosedLoop {
                concurrency,
                think_time_s,
                ramp_up_s,
                think_jitter_s,
            }) => crate::driver::Client {
                max_in_flight: Some(concurrency),
                think_ns: (think_time_s * 1e9).round() as u64,
                ramp_ns: (ramp_up_s * 1e9).round() as u64,
                jitter_ns: (think_jitter_s * 1e9).round() as u64,
                ..crate::driver::Client::default()
            },
            _ => crate::driver::Client {
                max_in_flight: self.max_in_flight,
                think_ns: (self.think_time_s.unwrap_or(0.0) * 1e9).round() as u64,
                ..crate::driver::Client::default()
            },
        }
    }

    /// Checks every value and the combination of keys, without touching files.
    ///
    /// Errors name the key, e.g. `workload.arrival.rate: must be a positive number, got -3`.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.num_requests == Some(0) {
            return Err(WorkloadError::config(
                "workload.num_requests",
                "must be at least 1, got 0",
            ));
        }
        if let Some(d) = self.duration_s {
            check_positive("workload.duration_s", d)?;
        }
        if let Some(m) = self.max_in_flight {
            if !(1..=super::arrivals::MAX_CONCURRENCY).contains(&m) {
                return Err(WorkloadError::config(
                    "workload.max_in_flight",
                    format!("must be 1 to {}, got {m}", super::arrivals::MAX_CONCURRENCY),
                ));
            }
            if matches!(self.arrival, Some(ArrivalConfig::ClosedLoop { .. })) {
                return Err(WorkloadError::config(
                    "workload.max_in_flight",
                    "not with arrival process \"closed-loop\", whose concurrency caps the requests in flight",
                ));
            }
        }
        if let Some(t) = self.think_time_s {
            if !(t.is_finite() && (0.0..=1e6).contains(&t)) {
                return Err(WorkloadError::config(
                    "workload.think_time_s",
                    format!("must be 0 to 1e6 seconds, got {t}"),
                ));
            }
            if self.max_in_flight.is_none() {
                return Err(WorkloadError::config(
                    "workload.think_time_s",
                    "only with workload.max_in_flight (a closed loop's think time is workload.arrival.think_time_s)",
                ));
            }
        }
        match (&self.arrival, &self.trace) {
            (Some(_), Some(_)) => Err(WorkloadError::config(
                "workload.trace",
                "give either workload.arrival (synthetic) or workload.trace (replay), not both",
            )),
            (None, None) => Err(WorkloadError::config(
                "workload.arrival",
                "missing: give workload.arrival (synthetic) or workload.trace (replay)",
            )),
            (None, Some(trace)) => self.validate_trace(trace),
            (Some(arrival), None) => self.validate_generated(arrival),
        }
    }

    /// A trace replay: the trace gives every length, nothing else may.
    fn validate_trace(&self, trace: &TraceConfig) -> Result<(), WorkloadError> {
        trace.validate()?;
        if !self.classes.is_empty() {
            return Err(WorkloadError::config(
                "workload.class",
                "not allowed with workload.trace (the trace gives the lengths)",
            ));
        }
        if self.multi_turn.is_some() || self.generated_shared_prefix.is_some() {
            return Err(WorkloadError::config(
                "workload.trace",
                "not allowed with a generated workload (multi_turn or generated_shared_prefix)",
            ));
        }
        Ok(())
    }

    /// A generated workload: the arrival process, then one generator (multi-turn,
    /// generated shared prefix) or the classes.
    fn validate_generated(&self, arrival: &ArrivalConfig) -> Result<(), WorkloadError> {
        arrival.validate(self.num_requests)?;
        let generators = [
            ("workload.multi_turn", self.multi_turn.is_some()),
            (
                "workload.generated_shared_prefix",
                self.generated_shared_prefix.is_some(),
            ),
        ];
        let chosen: Vec<&str> = generators
            .iter()
            .filter(|(_, on)| *on)
            .map(|(k, _)| *k)
            .collect();
        match chosen.as_slice() {
            [] => {}
            [one] => {
                if !self.classes.is_empty() {
                    return Err(WorkloadError::config(
                        "workload.class",
                        format!("not allowed with {one} (it gives the lengths)"),
                    ));
                }
            }
            _ => {
                return Err(WorkloadError::config(
                    chosen[1],
                    format!("give one of {}, not both", chosen.join(" and ")),
                ))
            }
        }
        if let Some(g) = &self.generated_shared_prefix {
            return g.validate();
        }
        if self.num_requests.is_none() && self.duration_s.is_none() {
            return Err(WorkloadError::config(
                "workload.num_requests",
                "a synthetic workload needs workload.num_requests or workload.duration_s",
            ));
        }
        if let Some(m) = &self.multi_turn {
            return m.validate();
        }
        self.validate_classes()
    }

    fn validate_classes(&self) -> Result<(), WorkloadError> {
        if self.classes.is_empty() {
            return Err(WorkloadError::config(
                "workload.class",
                "a synthetic workload needs at least one [[workload.class]]",
            ));
        }
        if self.classes.len() > usize::from(u16::MAX) + 1 {
            return Err(WorkloadError::config(
                "workload.class",
                format!(
                    "at most {} classes, got {}",
                    usize::from(u16::MAX) + 1,
                    self.classes.len()
                ),
            ));
        }
        for (i, class) in self.classes.iter().enumerate() {
            let key = format!("workload.class[{i}]");
            if class.name.is_empty() {
                return Err(WorkloadError::config(
                    format!("{key}.name"),
                    "must not be empty",
                ));
            }
            if self.classes[..i].iter().any(|c| c.name == class.name) {
                return Err(WorkloadError::config(
                    format!("{key}.name"),
                    format!("duplicate class name {:?}", class.name),
                ));
            }
            class.validate(&key)?;
        }
        Ok(())
    }
}

impl ClassConfig {
    /// Checks one class; `key` is its dotted key (`workload.class[2]`).
    fn validate(&self, key: &str) -> Result<(), WorkloadError> {
        check_positive(&format!("{key}.weight"), self.weight)?;
        if let Some(p) = self.shared_prefix {
            for (k, v) in [("groups", p.groups), ("tokens", p.tokens)] {
                if v == 0 {
                    return Err(WorkloadError::config(
                        format!("{key}.shared_prefix.{k}"),
                        "must be at least 1, got 0",
                    ));
                }
            }
        }
        if let Some(p) = self.prompt_pool {
            if p.size == 0 || p.size > MAX_POOL_ENTRIES {
                return Err(WorkloadError::config(
                    format!("{key}.prompt_pool.size"),
                    format!("must be 1 to {MAX_POOL_ENTRIES} entries, got {}", p.size),
                ));
            }
        }
        if self.beam_search && self.n < 2 {
            return Err(WorkloadError::config(
                format!("{key}.n"),
                "beam search needs a beam width n of at least 2",
            ));
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(WorkloadError::config(
                format!("{key}.temperature"),
                format!("must be 0 (greedy) or positive, got {}", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(WorkloadError::config(
                format!("{key}.top_p"),
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        if !(1..=256).contains(&self.n) {
            return Err(WorkloadError::config(
                format!("{key}.n"),
                format!("must be from 1 to 256, got {}", self.n),
            ));
        }
        match (&self.prompt, &self.output, &self.lengths) {
            (Some(p), Some(o), None) => {
                p.validate(&format!("{key}.prompt"))?;
                o.validate(&format!("{key}.output"))?;
            }
            (None, None, Some(j)) => {
                check_path(&format!("{key}.lengths.path"), &j.path)?;
                if j.prompt_column.is_empty() {
                    return Err(WorkloadError::config(
                        format!("{key}.lengths.prompt_column"),
                        "must not be empty",
                    ));
                }
                if j.output_column.is_empty() {
                    return Err(WorkloadError::config(
                        format!("{key}.lengths.output_column"),
                        "must not be empty",
                    ));
                }
            }
            (_, _, Some(_)) => {
                return Err(WorkloadError::config(
                    format!("{key}.lengths"),
                    "give either lengths or prompt and output, not both",
                ))
            }
            (None, _, None) => {
                return Err(WorkloadError::config(
                    format!("{key}.prompt"),
                    "missing: give prompt and output, or lengths",
                ))
            }
            (Some(_), None, None) => {
                return Err(WorkloadError::config(
                    format!("{key}.output"),
                    "missing: give prompt and output, or lengths",
                ))
            }
        }
        Ok(())
    }
}
