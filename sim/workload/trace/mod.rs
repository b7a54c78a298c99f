//! Trace replay: the requests of a recorded trace, streamed in arrival order (a trace may
//! hold millions of rows and is never loaded whole). Each format is one file implementing
//! [`TraceReader`]; [`open`] picks it by [`TraceFormat`]. A new format is a new file, a
//! `TraceFormat` variant and its line in [`open`].
//!
//! In: `trace = { format, path, time_scale }`. Out: [`TraceRequest`]s (arrival in seconds
//! from the first row, scaled; prompt and output lengths; prompt token ids where the format
//! has them) and the count of rows whose zero lengths were raised to 1.

mod azure;
mod csv_rows;
mod mooncake;
mod vidur;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use mooncake::{mooncake_token, MOONCAKE_BLOCK_TOKENS};

use super::error::{check_path, check_positive};
use super::WorkloadError;

/// Largest trace file (in bytes) whose requests are counted when it is opened (for
/// [`crate::workload::Workload::expected_len`]); larger traces report no expected length.
pub(super) const COUNT_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Longest prompt a trace row may give when the format carries its token ids (Mooncake):
/// 2^24 tokens, 64 MB of ids, far beyond any model's context.
pub(super) const MAX_PROMPT_TOKENS: u32 = 1 << 24;

/// Whether a trace file is small enough to count its requests up front.
fn countable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() <= COUNT_MAX_BYTES)
}

/// A trace to replay (`trace = { format = "...", path = "...", time_scale = 1.0 }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// The file's format.
    pub format: TraceFormat,
    /// Path of the trace file, relative to the scenario's folder.
    pub path: PathBuf,
    /// Multiplies inter-arrival times (0.5 replays at twice the rate).
    #[serde(default = "default_time_scale")]
    pub time_scale: f64,
}

fn default_time_scale() -> f64 {
    1.0
}

impl TraceConfig {
    /// Checks the path and the time scale.
    pub(super) fn validate(&self) -> Result<(), WorkloadError> {
        check_path("workload.trace.path", &self.path)?;
        check_positive("workload.trace.time_scale", self.time_scale)
    }
}

/// The format of a trace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`, with
    /// timestamps like `2023-11-16 18:17:03.9799600`; arrival = timestamp - first
    /// timestamp.
    Azure,
    /// Vidur-style trace: `arrived_at,num_prefill_tokens,num_decode_tokens` (more
    /// columns allowed); `arrived_at` is the arrival in seconds from time 0.
    Vidur,
    /// Mooncake trace (JSON lines): `timestamp` (ms), `input_length`, `output_length`,
    /// `hash_ids` (ids of 512-token prompt blocks; equal ids mean equal content). Prompts get
    /// token ids generated from their hash ids, so shared prefixes really share tokens.
    Mooncake,
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRequest {
    /// Arrival, seconds from the trace's start (time scale applied).
    pub arrival_s: f64,
    /// Prompt tokens (at least 1).
    pub prompt_len: u32,
    /// Output tokens asked for (at least 1).
    pub max_tokens: u32,
    /// The prompt's token ids, when the format gives its content (empty otherwise).
    pub prompt_tokens: Vec<u32>,
}

/// A trace format's reader: the requests of one file, in the file's order (which must be
/// arrival order), with errors naming the file, line and column.
pub trait TraceReader: std::fmt::Debug + Send {
    /// The next request; `None` at the end of the file.
    fn next_request(&mut self) -> Result<Option<TraceRequest>, WorkloadError>;
    /// Rows read so far whose prompt length was 0 and was raised to 1.
    fn clamped_prompts(&self) -> u64;
    /// Rows read so far whose output length was 0 and was raised to 1.
    fn clamped_outputs(&self) -> u64;
}

/// Opens the trace of `cfg` (its path relative to `base_dir`): the reader, and the number of
/// requests the file holds when counting them is cheap (for a progress bar).
pub fn open(
    cfg: &TraceConfig,
    base_dir: &Path,
) -> Result<(Box<dyn TraceReader>, Option<u64>), WorkloadError> {
    let path = base_dir.join(&cfg.path);
    match cfg.format {
        TraceFormat::Azure => azure::open(path, cfg.time_scale),
        TraceFormat::Vidur => vidur::open(path, cfg.time_scale),
        TraceFormat::Mooncake => mooncake::open(path, cfg.time_scale),
    }
}
