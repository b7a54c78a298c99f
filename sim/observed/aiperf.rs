//! NVIDIA aiperf's per-request export (`profile_export.jsonl` in its artifact folder,
//! written by default from aiperf 0.3): one JSON record a line with
//! - `metadata`: `request_start_ns` (wall clock, when the HTTP request went out),
//!   `request_end_ns` (its last response; the run's duration runs from the first send to
//!   the last end), `benchmark_phase` (`warmup` records are skipped; aiperf leaves them out
//!   itself), `was_cancelled`, `conversation_id` (the dataset entry it sent: requests of
//!   one entry sent the same prompt, which a replay's prefix cache can serve again);
//! - `metrics`, each `{"value": ..., "unit": ...}`: `time_to_first_token` and
//!   `request_latency` (ms; `s`, `us` and `ns` are converted), `input_sequence_length` and
//!   `output_sequence_length` (tokens; a failed request may carry only `error_isl`);
//! - `error`: `null` when the request succeeded.
//!
//! aiperf's TTFT ends at the first chunk with text, and its lengths are counted by its own
//! tokenizer. `profile_export_aiperf.json` beside the records, when present, gives the
//! run's settings (`input_config.endpoint.model_names`, `input_config.loadgen.concurrency`
//! and `request_rate`): a concurrency without a rate is a closed loop of that many clients.
//! Keys this reader does not use are ignored (aiperf adds keys between versions); requests
//! are taken in the order they were sent.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::{latency, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

/// The records' file name in an aiperf artifact folder.
pub const RECORDS_FILE: &str = "profile_export.jsonl";
/// The run's summary and settings beside it.
pub const SUMMARY_FILE: &str = "profile_export_aiperf.json";

#[derive(Deserialize)]
struct Record {
    metadata: Option<Metadata>,
    #[serde(default)]
    metrics: HashMap<String, Metric>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Metadata {
    request_start_ns: Option<u64>,
    request_end_ns: Option<u64>,
    benchmark_phase: Option<String>,
    #[serde(default)]
    was_cancelled: bool,
    conversation_id: Option<String>,
}

#[derive(Deserialize)]
struct Metric {
    value: serde_json::Value,
    unit: Option<String>,
}

#[derive(Deserialize)]
struct Summary {
    input_config: Option<InputConfig>,
}

#[derive(Deserialize)]
struct InputConfig {
    endpoint: Option<Endpoint>,
    loadgen: Option<Loadgen>,
}

#[derive(Deserialize)]
struct Endpoint {
    model_names: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Loadgen {
    concurrency: Option<u32>,
    request_rate: Option<f64>,
}

/// Reads an aiperf run: its artifact folder or its `profile_export.jsonl`.
pub(super) fn read(path: &Path) -> Result<ObservedRun, ObservedError> {
    let records = if path.is_dir() {
        path.join(RECORDS_FILE)
    } else {
        path.to_path_buf()
    };
    let mut sent: Vec<(u64, u64, ObservedRequest)> = Vec::new();
    // The last response of the run (ns), when every record says when it ended.
    let mut last_end: Option<u64> = Some(0);
    super::for_json_lines(&records, |n, r: Record| {
        if let Some((start, end, req)) = request(&records, n, r)? {
            last_end = last_end.zip(end).map(|(a, b)| a.max(b));
            sent.push((start, n, req));
        }
        Ok(())
    })?;
    if sent.is_empty() {
        return Err(ObservedError::new(&records, "no requests"));
    }
    // Written as they ended: taken in the order they were sent.
    sent.sort_by_key(|&(start, line, _)| (start, line));
    let first = sent.first().map_or(0, |s| s.0);
    let requests = super::sent_in_order(sent, 1e9);
    let dir = records.parent().unwrap_or(Path::new("."));
    let mut engine = settings(&dir.join(SUMMARY_FILE))?;
    engine.duration_s = last_end
        .filter(|&end| end > first)
        .map(|end| (end - first) as f64 * 1e-9);
    Ok(ObservedRun {
        path: path.to_path_buf(),
        format: "aiperf",
        engine,
        requests,
    })
}

/// One record as a request with its send and end times (ns), or `None` for a warmup record.
fn request(
    path: &Path,
    line: u64,
    r: Record,
) -> Result<Option<(u64, Option<u64>, ObservedRequest)>, ObservedError> {
    let meta = r
        .metadata
        .ok_or_else(|| ObservedError::at(path, Some(line), "metadata", "missing"))?;
    if meta.benchmark_phase.as_deref() == Some("warmup") {
        return Ok(None);
    }
    let start = meta.request_start_ns.ok_or_else(|| {
        ObservedError::at(path, Some(line), "metadata.request_start_ns", "missing")
    })?;
    let ok = r.error.as_ref().is_none_or(serde_json::Value::is_null) && !meta.was_cancelled;
    let metrics = &r.metrics;
    let tokens = |key: &str| -> Result<Option<u32>, ObservedError> {
        metrics
            .get(key)
            .map(|m| count(path, line, key, m))
            .transpose()
    };
    let ms = |key: &str| -> Result<Option<f64>, ObservedError> {
        metrics
            .get(key)
            .map(|m| millis(path, line, key, m))
            .transpose()
    };
    let need = |key: &str, why: &str| {
        ObservedError::at(
            path,
            Some(line),
            &format!("metrics.{key}"),
            format!("missing{why}"),
        )
    };
    let prompt = tokens("input_sequence_length")?.or(tokens("error_isl")?);
    let (prompt_len, output_len, ttft_ms, e2el_ms) = if ok {
        let prompt = prompt.ok_or_else(|| need("input_sequence_length", ""))?;
        if prompt == 0 {
            return Err(ObservedError::at(
                path,
                Some(line),
                "metrics.input_sequence_length",
                "must be at least 1",
            ));
        }
        let output = match tokens("output_sequence_length")? {
            Some(o) => o,
            None => {
                tokens("output_token_count")?.ok_or_else(|| need("output_sequence_length", ""))?
            }
        };
        let ttft = ms("time_to_first_token")?.ok_or_else(|| {
            need(
                "time_to_first_token",
                ": TTFT needs a streamed run (aiperf `--streaming`)",
            )
        })?;
        let e2el = ms("request_latency")?.ok_or_else(|| need("request_latency", ""))?;
        if e2el < ttft {
            return Err(ObservedError::at(
                path,
                Some(line),
                "metrics.request_latency",
                format!("{e2el} ms is below the time to first token ({ttft} ms)"),
            ));
        }
        (prompt, output, Some(ttft), Some(e2el))
    } else {
        (prompt.unwrap_or(0), 0, None, None)
    };
    if let Some(end) = meta.request_end_ns.filter(|&e| e < start) {
        return Err(ObservedError::at(
            path,
            Some(line),
            "metadata.request_end_ns",
            format!("{end} is before the request's start ({start})"),
        ));
    }
    Ok(Some((
        start,
        meta.request_end_ns,
        ObservedRequest {
            id: format!("line {line}"),
            send_s: None,
            prompt_len,
            output_len,
            prompt_tokens: Vec::new(),
            prompt_key: meta.conversation_id.as_deref().map(|c| {
                use std::hash::{Hash, Hasher};
                let mut h = rustc_hash::FxHasher::default();
                c.hash(&mut h);
                h.finish()
            }),
            ok,
            ttft_ms,
            e2el_ms,
            queue_ms: None,
        },
    )))
}

/// A token count: a whole number of `tokens` (no unit: tokens).
fn count(path: &Path, line: u64, key: &str, m: &Metric) -> Result<u32, ObservedError> {
    let field = format!("metrics.{key}");
    if let Some(u) = m.unit.as_deref().filter(|u| *u != "tokens") {
        return Err(ObservedError::at(
            path,
            Some(line),
            &field,
            format!("unit `{u}`: expected tokens"),
        ));
    }
    m.value
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| {
            ObservedError::at(
                path,
                Some(line),
                &field,
                format!("expected a whole number of tokens, got {}", m.value),
            )
        })
}

/// A latency in milliseconds, from `ms` (the default), `s`, `us` or `ns`.
fn millis(path: &Path, line: u64, key: &str, m: &Metric) -> Result<f64, ObservedError> {
    let field = format!("metrics.{key}");
    let scale = match m.unit.as_deref().unwrap_or("ms") {
        "ms" => 1.0,
        "s" | "sec" => 1e3,
        "us" => 1e-3,
        "ns" => 1e-6,
        u => {
            return Err(ObservedError::at(
                path,
                Some(line),
                &field,
                format!("unit `{u}`: expected ms, s, us or ns"),
            ))
        }
    };
    let v = m.value.as_f64().ok_or_else(|| {
        ObservedError::at(
            path,
            Some(line),
            &field,
            format!("expected a number, got {}", m.value),
        )
    })?;
    latency(path, Some(line), &field, v * scale)
}

/// What `profile_export_aiperf.json` says about the run (nothing when it is absent).
fn settings(path: &Path) -> Result<ObservedEngine, ObservedError> {
    if !path.is_file() {
        return Ok(ObservedEngine::default());
    }
    let s: Summary = super::read_json(path)?;
    let cfg = s.input_config;
    let loadgen = cfg.as_ref().and_then(|c| c.loadgen.as_ref());
    let concurrency = loadgen.and_then(|l| l.concurrency);
    let rate = loadgen.and_then(|l| l.request_rate);
    super::check_positive(
        path,
        &[
            ("input_config.loadgen.request_rate", rate),
            (
                "input_config.loadgen.concurrency",
                concurrency.map(f64::from),
            ),
        ],
    )?;
    let model = cfg
        .as_ref()
        .and_then(|c| c.endpoint.as_ref())
        .and_then(|e| e.model_names.as_ref())
        .and_then(|m| m.first().cloned());
    Ok(ObservedEngine {
        model,
        max_concurrency: concurrency,
        request_rate: rate,
        closed_loop: concurrency.is_some() && rate.is_none(),
        ..ObservedEngine::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record in aiperf's shape (`error` and lengths given as JSON).
    fn record(start_ns: u64, phase: &str, ttft: f64, e2el: f64, error: &str) -> String {
        format!(
            "{{\"metadata\": {{\"session_num\": 0, \"conversation_id\": null, \"request_start_ns\": {start_ns}, \"request_end_ns\": {}, \"worker_id\": \"worker_1\", \"benchmark_phase\": \"{phase}\", \"was_cancelled\": false}}, \"metrics\": {{\"input_sequence_length\": {{\"value\": 100, \"unit\": \"tokens\"}}, \"output_sequence_length\": {{\"value\": 20, \"unit\": \"tokens\"}}, \"time_to_first_token\": {{\"value\": {ttft}, \"unit\": \"ms\"}}, \"request_latency\": {{\"value\": {e2el}, \"unit\": \"ms\"}}, \"inter_chunk_latency\": {{\"value\": [1.5, 1.6], \"unit\": \"ms\"}}}}, \"error\": {error}}}\n",
            start_ns + 5_000_000,
        )
    }

    /// Records written as they ended are taken in the order they were sent; warmup records
    /// are left out, a failed request keeps its place; the settings file makes a closed
    /// loop of its concurrency.
    #[test]
    fn aiperf_records_read_in_send_order_with_the_runs_settings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = record(3_000_000_000, "profiling", 40.0, 300.0, "null")
            + &record(1_000_000_000, "warmup", 90.0, 900.0, "null")
            + &record(2_000_000_000, "profiling", 30.5, 250.0, "null")
            + "\n"
            + &record(
                2_500_000_000,
                "profiling",
                0.0,
                0.0,
                "{\"code\": 500, \"type\": \"Error\", \"message\": \"boom\"}",
            );
        std::fs::write(dir.path().join(RECORDS_FILE), text).expect("write");
        let run = read(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run.format, "aiperf");
        let got: Vec<_> = run
            .requests
            .iter()
            .map(|r| {
                (
                    r.send_s,
                    r.ok,
                    r.prompt_len,
                    r.output_len,
                    r.ttft_ms,
                    r.e2el_ms,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (Some(0.0), true, 100, 20, Some(30.5), Some(250.0)),
                (Some(0.5), false, 100, 0, None, None),
                (Some(1.0), true, 100, 20, Some(40.0), Some(300.0)),
            ]
        );
        assert!(!run.engine.closed_loop && run.engine.model.is_none());
        // First send (2.0 s) to last end (3.005 s).
        let d = run.engine.duration_s.expect("duration");
        assert!((d - 1.005).abs() < 1e-9, "{d}");
        std::fs::write(
            dir.path().join(SUMMARY_FILE),
            "{\"input_config\": {\"endpoint\": {\"model_names\": [\"Qwen/Qwen3-32B\"], \"type\": \"chat\"}, \"loadgen\": {\"concurrency\": 8, \"request_count\": 160}}, \"records\": {}}",
        )
        .expect("write");
        let run = read(&dir.path().join(RECORDS_FILE)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run.engine.model.as_deref(), Some("Qwen/Qwen3-32B"));
        assert_eq!(run.engine.max_concurrency, Some(8));
        assert!(run.engine.closed_loop);
        // Seconds and nanoseconds are converted.
        let text = record(1, "profiling", 40.0, 300.0, "null")
            .replace(
                "\"value\": 40, \"unit\": \"ms\"",
                "\"value\": 0.04, \"unit\": \"s\"",
            )
            .replace(
                "\"value\": 300, \"unit\": \"ms\"",
                "\"value\": 300000000, \"unit\": \"ns\"",
            );
        std::fs::write(dir.path().join(RECORDS_FILE), text).expect("write");
        let run = read(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let r = &run.requests[0];
        assert!((r.ttft_ms.unwrap_or(0.0) - 40.0).abs() < 1e-9, "{r:?}");
        assert!((r.e2el_ms.unwrap_or(0.0) - 300.0).abs() < 1e-9, "{r:?}");
    }
}
