//! Vidur-style traces (`format = "vidur"`): a CSV with
//! `arrived_at,num_prefill_tokens,num_decode_tokens` (more columns allowed); `arrived_at`
//! is the arrival in seconds from time 0.

use std::path::PathBuf;

use super::csv_rows::CsvRows;
use super::{TraceReader, TraceRequest};
use crate::workload::WorkloadError;

/// A Vidur trace being streamed.
#[derive(Debug)]
struct VidurTrace {
    rows: CsvRows,
    /// Previous `arrived_at` (rows must not go back in time).
    prev: Option<f64>,
}

pub(super) fn open(
    path: PathBuf,
    time_scale: f64,
) -> Result<(Box<dyn TraceReader>, Option<u64>), WorkloadError> {
    let columns = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"];
    let (rows, count) = CsvRows::open(path, columns, time_scale)?;
    Ok((Box::new(VidurTrace { rows, prev: None }), count))
}

impl TraceReader for VidurTrace {
    fn next_request(&mut self) -> Result<Option<TraceRequest>, WorkloadError> {
        let prev = &mut self.prev;
        self.rows.next(|text| {
            let secs = match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => v,
                _ => return Err("expected a non-negative number of seconds".to_string()),
            };
            if let Some(p) = *prev {
                if secs < p {
                    return Err(format!("earlier than the previous row ({p})"));
                }
            }
            *prev = Some(secs);
            Ok(secs)
        })
    }

    fn clamped_prompts(&self) -> u64 {
        self.rows.clamped_prompts
    }

    fn clamped_outputs(&self) -> u64 {
        self.rows.clamped_outputs
    }
}
