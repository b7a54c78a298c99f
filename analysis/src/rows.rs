//! Rows of `requests.csv` and `steps.csv`, streamed through a CSV writer.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use engine::record::{RequestRecord, StepRecord};

use crate::error::AnalysisError;

/// Columns of `requests.csv`, in order.
pub const REQUESTS_CSV_HEADER: [&str; 17] = [
    "request_id",
    "class",
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_len",
    "output_len",
    "generated_tokens",
    "max_tokens",
    "cached_tokens",
    "num_preemptions",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "queue_ms",
    "finish_reason",
];

/// Columns of `steps.csv`, in order.
pub const STEPS_CSV_HEADER: [&str; 22] = [
    "step",
    "start_s",
    "duration_ms",
    "num_seqs",
    "num_batched_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_waiting",
    "num_running",
    "num_preempted",
    "kv_blocks_used",
    "kv_usage",
    "mbu",
    "mfu",
    "kv_tokens",
    "kv_slots",
    "num_swapped",
    "swap_in_blocks",
    "swap_out_blocks",
    "block_copies",
    "recomputed_tokens",
    "kv_external_fragmentation",
];

/// A CSV output being streamed: the writer, its (logical) path for error messages, and
/// whether the header row is out yet.
pub(crate) struct CsvSink {
    writer: csv::Writer<Box<dyn Write>>,
    path: PathBuf,
    header: &'static [&'static str],
    header_written: bool,
    /// Scratch buffer for formatting one field.
    buf: String,
}

impl CsvSink {
    /// A sink writing to `out`, called `path` in error messages.
    pub fn new(out: Box<dyn Write>, path: PathBuf, header: &'static [&'static str]) -> Self {
        CsvSink {
            writer: csv::Writer::from_writer(out),
            path,
            header,
            header_written: false,
            buf: String::new(),
        }
    }

    /// Writes the header row if it is not out yet.
    fn ensure_header(&mut self) -> Result<(), AnalysisError> {
        if !self.header_written {
            self.writer
                .write_record(self.header)
                .map_err(|e| AnalysisError::csv(&self.path, e))?;
            self.header_written = true;
        }
        Ok(())
    }

    /// Writes one field formatted by `f` into the scratch buffer.
    fn field(&mut self, f: impl FnOnce(&mut String)) -> Result<(), AnalysisError> {
        self.buf.clear();
        f(&mut self.buf);
        self.writer
            .write_field(&self.buf)
            .map_err(|e| AnalysisError::csv(&self.path, e))
    }

    /// Ends the current row.
    fn end_row(&mut self) -> Result<(), AnalysisError> {
        self.writer
            .write_record(None::<&[u8]>)
            .map_err(|e| AnalysisError::csv(&self.path, e))
    }

    /// Writes the `requests.csv` row of `r`; `class` is the class's name.
    pub fn request_row(&mut self, r: &RequestRecord, class: &str) -> Result<(), AnalysisError> {
        self.ensure_header()?;
        self.field(|b| push_display(b, r.request_id))?;
        self.field(|b| b.push_str(class))?;
        self.field(|b| push_ns_as_s(b, r.arrival_ns))?;
        self.field(|b| {
            if let Some(t) = r.first_scheduled_ns {
                push_ns_as_s(b, t);
            }
        })?;
        self.field(|b| {
            if let Some(t) = r.first_token_ns {
                push_ns_as_s(b, t);
            }
        })?;
        self.field(|b| push_ns_as_s(b, r.finish_ns))?;
        self.field(|b| push_display(b, r.prompt_len))?;
        self.field(|b| push_display(b, r.output_len))?;
        self.field(|b| push_display(b, r.generated_tokens))?;
        self.field(|b| push_display(b, r.max_tokens))?;
        self.field(|b| push_display(b, r.cached_tokens))?;
        self.field(|b| push_display(b, r.num_preemptions))?;
        // Latencies that are whole nanoseconds are printed exactly; the caller has checked
        // that no time precedes the arrival.
        self.field(|b| {
            if let Some(t) = r.first_token_ns {
                push_ns_as_ms(b, t.saturating_sub(r.arrival_ns));
            }
        })?;
        self.field(|b| {
            if let Some(t) = r.tpot_s() {
                push_fixed6(b, t * 1000.0);
            }
        })?;
        self.field(|b| push_ns_as_ms(b, r.finish_ns.saturating_sub(r.arrival_ns)))?;
        self.field(|b| {
            if let Some(t) = r.first_scheduled_ns {
                push_ns_as_ms(b, t.saturating_sub(r.arrival_ns));
            }
        })?;
        self.field(|b| b.push_str(r.finish_reason.as_str()))?;
        self.end_row()
    }

    /// Writes the `steps.csv` row of `s`.
    pub fn step_row(&mut self, s: &StepRecord) -> Result<(), AnalysisError> {
        self.ensure_header()?;
        self.field(|b| push_display(b, s.step))?;
        self.field(|b| push_ns_as_s(b, s.start_ns))?;
        self.field(|b| push_ns_as_ms(b, s.duration_ns))?;
        self.field(|b| push_display(b, s.num_seqs))?;
        self.field(|b| push_display(b, s.num_batched_tokens))?;
        self.field(|b| push_display(b, s.num_prefill_tokens))?;
        self.field(|b| push_display(b, s.num_decode_tokens))?;
        self.field(|b| push_display(b, s.num_waiting))?;
        self.field(|b| push_display(b, s.num_running))?;
        self.field(|b| push_display(b, s.num_preempted))?;
        self.field(|b| push_display(b, s.kv_blocks_used))?;
        self.field(|b| push_fixed6(b, s.kv_usage))?;
        self.field(|b| push_fixed6(b, s.mbu))?;
        self.field(|b| push_fixed6(b, s.mfu))?;
        self.field(|b| push_display(b, s.kv_tokens))?;
        self.field(|b| push_display(b, s.kv_slots))?;
        self.field(|b| push_display(b, s.num_swapped))?;
        self.field(|b| push_display(b, s.swap_in_blocks))?;
        self.field(|b| push_display(b, s.swap_out_blocks))?;
        self.field(|b| push_display(b, s.block_copies))?;
        self.field(|b| push_display(b, s.recomputed_tokens))?;
        self.field(|b| push_fixed6(b, s.kv_external_fragmentation))?;
        self.end_row()
    }

    /// Writes the header if no row was written, then flushes everything to the writer.
    pub fn finish(mut self) -> Result<(), AnalysisError> {
        self.ensure_header()?;
        self.writer
            .flush()
            .map_err(|e| AnalysisError::io(&self.path, e))
    }
}

/// Appends `x` with `Display`. Writing to a `String` cannot fail.
fn push_display(b: &mut String, x: impl std::fmt::Display) {
    let _ = write!(b, "{x}");
}

/// Appends nanoseconds as seconds with 9 decimals (exact).
pub(crate) fn push_ns_as_s(b: &mut String, ns: u64) {
    let _ = write!(b, "{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
}

/// Appends nanoseconds as milliseconds with 6 decimals (exact).
pub(crate) fn push_ns_as_ms(b: &mut String, ns: u64) {
    let _ = write!(b, "{}.{:06}", ns / 1_000_000, ns % 1_000_000);
}

/// Appends a float with 6 decimals.
pub(crate) fn push_fixed6(b: &mut String, x: f64) {
    let _ = write!(b, "{x:.6}");
}
