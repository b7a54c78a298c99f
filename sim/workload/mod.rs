//! Workloads: the stream of [`Request`]s a simulation serves.
//!
//! A workload is configured by the `[workload]` table of a scenario file
//! ([`WorkloadConfig`], `config.rs`) and opened into a [`Workload`], an iterator that yields
//! requests lazily, in non-decreasing arrival order (DESIGN.md §2). Its source is one of:
//!
//! - **synthetic** (`synthetic.rs`): arrivals from a process (`arrivals.rs`: Poisson, gamma
//!   with a burstiness, or all at once) and, per request, a class drawn by weight whose
//!   prompt and output lengths come from distributions (`lengths.rs`: fixed, uniform,
//!   normal, lognormal, an empirical CSV column, or joint lengths from one CSV row);
//! - **generated datasets**: multi-turn conversations (`multi_turn.rs`) and SGLang's
//!   generated shared prefix (`shared_prefix.rs`), whose prompts carry token ids;
//! - **trace replay** (`trace/`, one file per format): Azure 2023, Vidur and Mooncake traces,
//!   streamed row by row (a trace may hold millions of rows and is never loaded whole).
//!
//! Randomness is deterministic (`streams.rs`): every purpose (arrivals, class choice, the
//! lengths of each class) has its own `ChaCha8Rng` seeded from `(seed, purpose)`, so a draw
//! added in one stream never shifts another, and the same configuration and seed always
//! give the same sequence. Errors ([`WorkloadError`], `error.rs`) name the key, or the file,
//! line and column.

mod arrivals;
mod config;
mod csv_file;
mod error;
mod lengths;
mod multi_turn;
mod shared_prefix;
mod streams;
mod synthetic;
pub mod trace;

use std::path::Path;

use engine::request::{Request, SamplingParams, NANOS_PER_SEC};

pub use arrivals::ArrivalConfig;
pub use config::{
    ClassConfig, PoolSampling, PromptPool, SharedPrefix, WorkloadConfig, MAX_POOL_ENTRIES,
};
pub use error::WorkloadError;
pub use lengths::{JointLengths, LengthDist};
pub use multi_turn::{MultiTurnConfig, MULTI_TURN_CLASSES};
pub use shared_prefix::{GeneratedSharedPrefix, GSP_CLASS};
pub use streams::{stream, synthetic_token};
pub use trace::{mooncake_token, TraceConfig, TraceFormat, MOONCAKE_BLOCK_TOKENS};

use arrivals::Gaps;
use multi_turn::MultiTurn;
use shared_prefix::SharedPrefixGen;
use streams::splitmix64;
use synthetic::Synthetic;
use trace::TraceReader;

/// Latest arrival time accepted, in seconds (1e9 s, about 31 years): simulated time is kept
/// in `u64` nanoseconds, and a horizon far below `u64::MAX` leaves room for the run itself.
pub const MAX_ARRIVAL_S: f64 = 1e9;

/// Name of the single class of a trace workload.
pub const TRACE_CLASS_NAME: &str = "trace";

/// One request drawn by a source, before it gets its id: arrival (s), prompt ids (empty
/// when only the length is known), prompt length, output length, class, scripted answer.
struct Generated {
    arrival_s: f64,
    prompt: Vec<u32>,
    prompt_len: u32,
    max_tokens: u32,
    class: u16,
    script: Vec<u32>,
    /// The conversation (multi-turn workloads; 0: none).
    session: u64,
}

impl Generated {
    /// A request whose prompt ids are known (its length is theirs).
    fn with_prompt(
        arrival_s: f64,
        prompt: Vec<u32>,
        max_tokens: u32,
        class: u16,
        script: Vec<u32>,
    ) -> Generated {
        Generated {
            arrival_s,
            prompt_len: u32::try_from(prompt.len()).unwrap_or(u32::MAX),
            prompt,
            max_tokens,
            class,
            script,
            session: 0,
        }
    }
}

#[derive(Debug)]
enum Source {
    Synthetic(Box<Synthetic>),
    MultiTurn(Box<MultiTurn>),
    SharedPrefix(Box<SharedPrefixGen>),
    Trace(Box<dyn TraceReader>),
}

/// An opened workload: an iterator of requests in non-decreasing arrival order.
///
/// Requests are produced lazily; only the current trace row is in memory. Ids are
/// `0, 1, 2, ...` in arrival order. After an error the iterator ends.
#[derive(Debug)]
pub struct Workload {
    source: Source,
    class_names: Vec<String>,
    class_priorities: Vec<i32>,
    class_n: Vec<u32>,
    class_beam: Vec<bool>,
    class_sampling: Vec<SamplingParams>,
    /// Seeds each request's sampling (with its id).
    seed: u64,
    num_requests: Option<u64>,
    duration_s: Option<f64>,
    expected_len: Option<u64>,
    next_id: u64,
    done: bool,
}

impl Workload {
    /// Validates `cfg`, loads the empirical and joint-length CSVs, opens the trace (if
    /// any), and seeds the random streams from `seed`. Relative paths are resolved
    /// against `base_dir` (the scenario file's folder).
    pub fn open(
        cfg: &WorkloadConfig,
        base_dir: &Path,
        seed: u64,
    ) -> Result<Workload, WorkloadError> {
        cfg.validate()?;
        let (source, class_names, expected_len) = match (&cfg.trace, &cfg.arrival) {
            (Some(trace), _) => {
                let (reader, rows) = trace::open(trace, base_dir)?;
                if rows == Some(0) {
                    return Err(WorkloadError::config(
                        "workload.trace",
                        format!("{} holds no requests", base_dir.join(&trace.path).display()),
                    ));
                }
                let expected = match (rows, cfg.num_requests) {
                    (Some(r), Some(n)) => Some(r.min(n)),
                    (r, n) => r.or(n),
                };
                (
                    Source::Trace(reader),
                    vec![TRACE_CLASS_NAME.to_string()],
                    expected,
                )
            }
            (None, Some(arrival)) => {
                let gaps = Gaps::new(arrival)?;
                match (&cfg.multi_turn, &cfg.generated_shared_prefix) {
                    (Some(m), _) => (
                        Source::MultiTurn(Box::new(MultiTurn::new(m, gaps, base_dir, seed)?)),
                        MULTI_TURN_CLASSES.iter().map(|c| c.to_string()).collect(),
                        cfg.num_requests,
                    ),
                    (None, Some(g)) => (
                        Source::SharedPrefix(Box::new(SharedPrefixGen::new(g, gaps, seed))),
                        vec![GSP_CLASS.to_string()],
                        Some(cfg.num_requests.map_or(g.len(), |r| r.min(g.len()))),
                    ),
                    (None, None) => (
                        Source::Synthetic(Box::new(Synthetic::open(cfg, gaps, base_dir, seed)?)),
                        cfg.classes.iter().map(|c| c.name.clone()).collect(),
                        cfg.num_requests,
                    ),
                }
            }
            (None, None) => {
                return Err(WorkloadError::config(
                    "workload.arrival",
                    "missing: give workload.arrival (synthetic) or workload.trace (replay)",
                ))
            }
        };
        Ok(Workload {
            source,
            class_priorities: cfg.classes.iter().map(|c| c.priority).collect(),
            class_n: cfg.classes.iter().map(|c| c.n).collect(),
            class_beam: cfg.classes.iter().map(|c| c.beam_search).collect(),
            class_sampling: cfg
                .classes
                .iter()
                .map(|c| SamplingParams {
                    temperature: c.temperature,
                    top_k: c.top_k,
                    top_p: c.top_p,
                    seed: 0,
                    logprobs: None,
                })
                .collect(),
            seed,
            class_names,
            num_requests: cfg.num_requests,
            duration_s: cfg.duration_s,
            expected_len,
            next_id: 0,
            done: false,
        })
    }

    /// Names of the classes, indexed by [`Request::class`]; a trace has one class,
    /// `"trace"`.
    pub fn class_names(&self) -> Vec<String> {
        self.class_names.clone()
    }

    /// Expected number of requests, for a progress bar: `num_requests` for a synthetic
    /// workload (`None` when only `duration_s` bounds it); for a trace, its row count
    /// (counted at open for files up to 256 MiB) capped by `num_requests`. With a
    /// `duration_s` cap the true count can be lower.
    pub fn expected_len(&self) -> Option<u64> {
        self.expected_len
    }

    /// Number of trace rows read so far whose output length was 0 and was raised to 1.
    /// Report it as a warning once the iteration has ended; always 0 for generated
    /// workloads.
    pub fn clamped_outputs(&self) -> u64 {
        match &self.source {
            Source::Trace(t) => t.clamped_outputs(),
            Source::Synthetic(_) | Source::MultiTurn(_) | Source::SharedPrefix(_) => 0,
        }
    }

    /// Number of trace rows read so far whose prompt length was 0 and was raised to 1
    /// (report it as a warning, like [`Workload::clamped_outputs`]).
    pub fn clamped_prompts(&self) -> u64 {
        match &self.source {
            Source::Trace(t) => t.clamped_prompts(),
            Source::Synthetic(_) | Source::MultiTurn(_) | Source::SharedPrefix(_) => 0,
        }
    }

    /// The next request from the source, given its id and the class's settings.
    fn next_request(&mut self) -> Result<Option<Request>, WorkloadError> {
        if self.num_requests.is_some_and(|n| self.next_id >= n) {
            return Ok(None);
        }
        let g = match &mut self.source {
            Source::Synthetic(s) => s.next(self.next_id),
            Source::MultiTurn(m) => m.next(),
            Source::SharedPrefix(m) => match m.next() {
                Some(g) => g,
                None => return Ok(None),
            },
            Source::Trace(r) => match r.next_request()? {
                Some(t) => Generated {
                    arrival_s: t.arrival_s,
                    prompt: t.prompt_tokens,
                    prompt_len: t.prompt_len,
                    max_tokens: t.max_tokens,
                    class: 0,
                    script: Vec::new(),
                    session: 0,
                },
                None => return Ok(None),
            },
        };
        if self.duration_s.is_some_and(|d| g.arrival_s > d) {
            return Ok(None);
        }
        let Generated {
            arrival_s,
            prompt: prompt_tokens,
            prompt_len,
            max_tokens,
            class,
            script: scripted_output,
            session,
        } = g;
        if arrival_s.is_nan() || arrival_s > MAX_ARRIVAL_S {
            let key = match self.source {
                Source::Synthetic(_) | Source::MultiTurn(_) | Source::SharedPrefix(_) => {
                    "workload.arrival.rate"
                }
                Source::Trace(_) => "workload.trace",
            };
            return Err(WorkloadError::Config {
                key: key.into(),
                message: format!(
                    "request {} would arrive at {arrival_s:.3e} s, beyond the simulator's horizon of {MAX_ARRIVAL_S:.0e} s (about 31 years): the rate is too small or the timestamps too far apart",
                    self.next_id
                ),
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(Some(Request {
            id,
            // Within the horizon the conversion is exact to the nanosecond; rounding keeps
            // the order non-decreasing.
            arrival: (arrival_s * NANOS_PER_SEC).round() as u64,
            prompt_len,
            prompt_tokens,
            max_tokens,
            ignore_eos: true,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            scripted_output,
            n: self.class_n.get(usize::from(class)).copied().unwrap_or(1),
            beam_search: self
                .class_beam
                .get(usize::from(class))
                .copied()
                .unwrap_or(false),
            priority: self
                .class_priorities
                .get(usize::from(class))
                .copied()
                .unwrap_or(0),
            class,
            session,
            kv_ready: 0,
            hold_kv: false,
            sampling: SamplingParams {
                seed: splitmix64(self.seed ^ splitmix64(id)),
                ..self
                    .class_sampling
                    .get(usize::from(class))
                    .copied()
                    .unwrap_or_default()
            },
        }))
    }
}

impl Iterator for Workload {
    type Item = Result<Request, WorkloadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_request() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for Workload {}

#[cfg(test)]
mod tests;
