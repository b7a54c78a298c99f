//! The rows of a CSV trace (Azure, Vidur): a time column, a prompt-length column and an
//! output-length column found by name in the header, read one record at a time; the format
//! turns the time column's text into seconds.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::TraceRequest;
use crate::workload::csv_file::{
    column_indices, count_rows, field, open_csv, parse_count, record_line,
};
use crate::workload::WorkloadError;

/// A CSV trace being streamed.
#[derive(Debug)]
pub(super) struct CsvRows {
    path: PathBuf,
    reader: csv::Reader<File>,
    record: csv::StringRecord,
    /// (time, prompt length, output length) column names and their indices.
    columns: [&'static str; 3],
    idx: [usize; 3],
    time_scale: f64,
    pub(super) clamped_outputs: u64,
    pub(super) clamped_prompts: u64,
}

impl CsvRows {
    /// Opens `path`, finds `columns` in its header and counts its rows when the file is at
    /// most 256 MiB.
    pub(super) fn open(
        path: PathBuf,
        columns: [&'static str; 3],
        time_scale: f64,
    ) -> Result<(CsvRows, Option<u64>), WorkloadError> {
        let mut reader = open_csv(&path)?;
        let idx = column_indices(&mut reader, &path, columns)?;
        let rows = if super::countable(&path) {
            Some(count_rows(&path)?)
        } else {
            None
        };
        let csv = CsvRows {
            path,
            reader,
            record: csv::StringRecord::new(),
            columns,
            idx,
            time_scale,
            clamped_outputs: 0,
            clamped_prompts: 0,
        };
        Ok((csv, rows))
    }

    /// Reads the next row; `None` at the end of the file. `seconds` turns the time column's
    /// text into seconds from the trace's start, or says what is wrong with it.
    pub(super) fn next(
        &mut self,
        seconds: impl FnOnce(&str) -> Result<f64, String>,
    ) -> Result<Option<TraceRequest>, WorkloadError> {
        let more = self
            .reader
            .read_record(&mut self.record)
            .map_err(|e| WorkloadError::csv(&self.path, &e))?;
        if !more {
            return Ok(None);
        }
        let [c_time, c_prompt, c_output] = self.columns;
        let record = &self.record;
        let path: &Path = &self.path;
        let time_text = field(record, self.idx[0], path, c_time)?;
        let rel_secs = seconds(time_text).map_err(|message| WorkloadError::BadValue {
            path: path.to_path_buf(),
            line: record_line(record),
            column: c_time.to_string(),
            text: crate::workload::error::quoted(time_text),
            message,
        })?;
        let prompt_text = field(record, self.idx[1], path, c_prompt)?;
        let prompt = parse_count(prompt_text, record, path, c_prompt)?;
        let output_text = field(record, self.idx[2], path, c_output)?;
        let output = parse_count(output_text, record, path, c_output)?;
        if prompt == 0 {
            self.clamped_prompts += 1;
        }
        if output == 0 {
            self.clamped_outputs += 1;
        }
        Ok(Some(TraceRequest {
            arrival_s: rel_secs * self.time_scale,
            prompt_len: prompt.max(1),
            max_tokens: output.max(1),
            prompt_tokens: Vec::new(),
        }))
    }
}
