//! Mooncake traces (`format = "mooncake"`, JSON lines): `timestamp` (ms), `input_length`,
//! `output_length` and `hash_ids`, the ids of the prompt's 512-token blocks (equal ids mean
//! equal content). Prompts get token ids generated from their hash ids, so shared prefixes
//! really share tokens and the prefix cache sees Mooncake's reuse.

use std::fs::File;
use std::path::PathBuf;

use serde::Deserialize;

use super::{TraceReader, TraceRequest};
use crate::workload::WorkloadError;

/// Tokens per Mooncake hash id.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// Token id `i` of the Mooncake block with hash id `h`: a fixed hash into a 32,000-token
/// vocabulary, so equal hash ids give equal token sequences.
pub fn mooncake_token(h: u64, i: usize) -> u32 {
    let mut z = h
        .wrapping_mul(MOONCAKE_BLOCK_TOKENS as u64)
        .wrapping_add(i as u64)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 32_000) as u32
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// A Mooncake JSON-lines trace, streamed line by line.
#[derive(Debug)]
struct MooncakeReader {
    path: PathBuf,
    lines: std::io::Lines<std::io::BufReader<File>>,
    line: u64,
    time_scale: f64,
    prev_ms: f64,
    clamped_outputs: u64,
    clamped_prompts: u64,
}

pub(super) fn open(
    path: PathBuf,
    time_scale: f64,
) -> Result<(Box<dyn TraceReader>, Option<u64>), WorkloadError> {
    use std::io::BufRead;
    let file = File::open(&path).map_err(|source| WorkloadError::Io {
        path: path.clone(),
        source,
    })?;
    // One request per line, counted in a streaming pass (files up to 256 MiB).
    let count = if super::countable(&path) {
        count_lines(&path)
    } else {
        None
    };
    let reader = MooncakeReader {
        path,
        lines: std::io::BufReader::new(file).lines(),
        line: 0,
        time_scale,
        prev_ms: 0.0,
        clamped_outputs: 0,
        clamped_prompts: 0,
    };
    Ok((Box::new(reader), count))
}

impl TraceReader for MooncakeReader {
    fn next_request(&mut self) -> Result<Option<TraceRequest>, WorkloadError> {
        loop {
            let Some(line) = self.lines.next() else {
                return Ok(None);
            };
            self.line += 1;
            let line = line.map_err(|source| WorkloadError::Io {
                path: self.path.clone(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |column: &str, text: &str, message: String| WorkloadError::BadValue {
                path: self.path.clone(),
                line: self.line,
                column: column.into(),
                text: crate::workload::error::quoted(text),
                message,
            };
            let row: MooncakeRow = serde_json::from_str(&line)
                .map_err(|e| bad("json", &line, format!("not a Mooncake trace row: {e}")))?;
            if !(row.timestamp.is_finite() && row.timestamp >= self.prev_ms) {
                return Err(bad(
                    "timestamp",
                    &row.timestamp.to_string(),
                    format!(
                        "must be a finite time not before the previous row ({} ms)",
                        self.prev_ms
                    ),
                ));
            }
            self.prev_ms = row.timestamp;
            let to_u32 = |v: u64, col: &str| {
                u32::try_from(v).map_err(|_| bad(col, &v.to_string(), "too large".into()))
            };
            let mut prompt = to_u32(row.input_length, "input_length")?;
            let mut output = to_u32(row.output_length, "output_length")?;
            if prompt > super::MAX_PROMPT_TOKENS {
                return Err(bad(
                    "input_length",
                    &prompt.to_string(),
                    format!(
                        "more than the {} prompt tokens a replayed request may have",
                        super::MAX_PROMPT_TOKENS
                    ),
                ));
            }
            let capacity = row.hash_ids.len() * MOONCAKE_BLOCK_TOKENS;
            if prompt as usize > capacity {
                return Err(bad(
                    "hash_ids",
                    &format!("{} ids", row.hash_ids.len()),
                    format!(
                        "{} blocks of {MOONCAKE_BLOCK_TOKENS} tokens cannot hold input_length {prompt}",
                        row.hash_ids.len()
                    ),
                ));
            }
            if prompt == 0 {
                prompt = 1;
                self.clamped_prompts += 1;
            }
            if output == 0 {
                output = 1;
                self.clamped_outputs += 1;
            }
            let tokens = (0..prompt as usize)
                .map(|i| {
                    let h = row
                        .hash_ids
                        .get(i / MOONCAKE_BLOCK_TOKENS)
                        .copied()
                        .unwrap_or(0);
                    mooncake_token(h, i % MOONCAKE_BLOCK_TOKENS)
                })
                .collect();
            return Ok(Some(TraceRequest {
                arrival_s: row.timestamp / 1000.0 * self.time_scale,
                prompt_len: prompt,
                max_tokens: output,
                prompt_tokens: tokens,
            }));
        }
    }

    fn clamped_prompts(&self) -> u64 {
        self.clamped_prompts
    }

    fn clamped_outputs(&self) -> u64 {
        self.clamped_outputs
    }
}

/// The newlines of a file, read in chunks (`None` if it cannot be read).
fn count_lines(path: &std::path::Path) -> Option<u64> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, File::open(path).ok()?);
    let mut n = 0u64;
    loop {
        let buf = reader.fill_buf().ok()?;
        if buf.is_empty() {
            return Some(n);
        }
        n += buf.iter().filter(|&&c| c == b'\n').count() as u64;
        let len = buf.len();
        reader.consume(len);
    }
}
