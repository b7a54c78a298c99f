//! The Azure LLM inference trace 2023 (`format = "azure"`): a CSV with
//! `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps like `2023-11-16 18:17:03.9799600`;
//! a request arrives at its timestamp minus the first row's.

use std::path::PathBuf;

use chrono::NaiveDateTime;
use engine::request::NANOS_PER_SEC;

use super::csv_rows::CsvRows;
use super::{TraceReader, TraceRequest};
use crate::workload::WorkloadError;

/// Timestamp format of the Azure traces.
const TS_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.f";

/// An Azure trace being streamed.
#[derive(Debug)]
struct AzureTrace {
    rows: CsvRows,
    /// First timestamp (arrivals are relative to it).
    first: Option<NaiveDateTime>,
    /// Previous timestamp (rows must not go back in time).
    prev: Option<NaiveDateTime>,
}

pub(super) fn open(
    path: PathBuf,
    time_scale: f64,
) -> Result<(Box<dyn TraceReader>, Option<u64>), WorkloadError> {
    let columns = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];
    let (rows, count) = CsvRows::open(path, columns, time_scale)?;
    let trace = AzureTrace {
        rows,
        first: None,
        prev: None,
    };
    Ok((Box::new(trace), count))
}

impl TraceReader for AzureTrace {
    fn next_request(&mut self) -> Result<Option<TraceRequest>, WorkloadError> {
        let (first, prev) = (&mut self.first, &mut self.prev);
        self.rows.next(|text| {
            let ts = NaiveDateTime::parse_from_str(text, TS_FORMAT).map_err(|e| {
                format!("expected a timestamp like 2023-11-16 18:17:03.9799600 ({e})")
            })?;
            if let Some(p) = *prev {
                if ts < p {
                    return Err(format!("earlier than the previous row ({p})"));
                }
            }
            *prev = Some(ts);
            let delta = ts - *first.get_or_insert(ts);
            Ok(match delta.num_nanoseconds() {
                Some(ns) => ns as f64 / NANOS_PER_SEC,
                None => delta.num_milliseconds() as f64 / 1e3,
            })
        })
    }

    fn clamped_prompts(&self) -> u64 {
        self.rows.clamped_prompts
    }

    fn clamped_outputs(&self) -> u64 {
        self.rows.clamped_outputs
    }
}
