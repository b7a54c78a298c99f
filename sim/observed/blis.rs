//! BLIS / inference-sim TraceV2: a CSV of requests and a YAML header beside it
//! (`trace_data.csv` with `trace_header.yaml`, or `P.csv` with `P.yaml`). The header, when
//! present, is read strictly, as BLIS's loader reads it (every key known), and further
//! checked (`trace_version` 2 or 3, `time_unit` microseconds): its `server` gives the engine
//! (`type`), the model, `tensor_parallel`, `max_num_seqs`, `block_size`,
//! `gpu_memory_utilization` and `max_model_len`; requests numbered below
//! `warm_up_requests` are the client's warm-up, left out as BLIS's calibration leaves them
//! (`network`'s RTT is not modelled). CSV columns are found by name: `request_id`,
//! `input_tokens` and `prefix_length` (the prompt is their sum unless
//! `server_input_tokens`, the server's count, is above 0), `output_tokens`,
//! `send_time_us`, `first_chunk_time_us`, `last_chunk_time_us` (absolute microseconds),
//! `status` (`ok`, `error`, `timeout`). TTFT is first chunk minus send, E2EL last chunk
//! minus send, as BLIS's own calibration computes them. Under overload the client caps the
//! requests in flight, so the server sees the send times, not the scheduled arrivals; rows
//! are taken in send order.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{latency, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

/// `trace_header.yaml` (inference-sim's `TraceHeader`; unknown keys are errors, as there).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    trace_version: u32,
    time_unit: String,
    #[serde(default)]
    #[allow(dead_code)]
    created_at: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    mode: Option<String>,
    #[serde(default)]
    warm_up_requests: u64,
    #[serde(default)]
    #[allow(dead_code)]
    workload_seed: Option<i64>,
    #[serde(default)]
    #[allow(dead_code)]
    workload_spec: Option<String>,
    #[serde(default)]
    server: Option<Server>,
    #[serde(default)]
    #[allow(dead_code)]
    network: Option<Network>,
    #[serde(default)]
    #[allow(dead_code)]
    goodput_slo_targets: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    session_context_growth: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    kv_offload: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    observed_kv_metrics: Option<serde_yaml_ng::Value>,
}

/// The header's `server`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Server {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    tensor_parallel: Option<u32>,
    #[serde(default)]
    max_num_seqs: Option<u32>,
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    gpu_memory_utilization: Option<f64>,
    #[serde(default)]
    max_model_len: Option<u64>,
}

/// The header's `network`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Network {
    #[serde(default)]
    #[allow(dead_code)]
    measured_rtt_ms: Option<f64>,
}

/// The header beside the CSV at `path`, if there is one.
fn header_path(path: &Path) -> Option<PathBuf> {
    let dir = path.parent()?;
    let own = path.with_extension("yaml");
    if own.is_file() {
        return Some(own);
    }
    let shared = dir.join("trace_header.yaml");
    (path.file_name().is_some_and(|n| n == "trace_data.csv") && shared.is_file()).then_some(shared)
}

/// Reads and checks a TraceV2 header: the engine it describes and the warm-up count.
fn read_header(path: &Path) -> Result<(ObservedEngine, u64), ObservedError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    let h: Header = serde_yaml_ng::from_str(&text).map_err(|e| ObservedError {
        path: path.to_path_buf(),
        line: e.location().map(|l| l.line() as u64),
        field: None,
        message: crate::messages::concise(&e.to_string()),
    })?;
    if !(2..=3).contains(&h.trace_version) {
        return Err(ObservedError::at(
            path,
            None,
            "trace_version",
            format!("expected 2 or 3, got {}", h.trace_version),
        ));
    }
    if h.time_unit != "microseconds" && h.time_unit != "us" {
        return Err(ObservedError::at(
            path,
            None,
            "time_unit",
            format!("expected microseconds, got {:?}", h.time_unit),
        ));
    }
    let mut e = ObservedEngine::default();
    if let Some(s) = h.server {
        let positive = |name: &str, v: Option<u32>| match v {
            Some(0) => Err(ObservedError::at(
                path,
                None,
                &format!("server.{name}"),
                "must be at least 1",
            )),
            v => Ok(v),
        };
        e.engine = s.kind.filter(|k| !k.is_empty());
        e.model = s.model.filter(|m| !m.is_empty());
        e.tp = positive("tensor_parallel", s.tensor_parallel)?;
        e.max_num_seqs = positive("max_num_seqs", s.max_num_seqs)?;
        e.block_size = positive("block_size", s.block_size)?;
        e.max_model_len = match s.max_model_len {
            None => None,
            Some(v) => Some(u32::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
                ObservedError::at(
                    path,
                    None,
                    "server.max_model_len",
                    format!("expected 1 to 2^32 tokens, got {v}"),
                )
            })?),
        };
        if let Some(u) = s.gpu_memory_utilization {
            if !(u > 0.0 && u <= 1.0) {
                return Err(ObservedError::at(
                    path,
                    None,
                    "server.gpu_memory_utilization",
                    format!("must be in (0, 1], got {u}"),
                ));
            }
            e.gpu_memory_utilization = Some(u);
        }
    }
    Ok((e, h.warm_up_requests))
}

/// Reads a TraceV2 CSV.
pub(super) fn read(path: &Path) -> Result<ObservedRun, ObservedError> {
    let (mut rdr, cols) = super::open_csv(path)?;
    let id = cols.need("request_id")?;
    let input = cols.need("input_tokens")?;
    let output = cols.need("output_tokens")?;
    let send = cols.need("send_time_us")?;
    let first = cols.need("first_chunk_time_us")?;
    let last = cols.need("last_chunk_time_us")?;
    let (prefix, server_input, status) = (
        cols.col("prefix_length"),
        cols.col("server_input_tokens"),
        cols.col("status"),
    );
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| super::malformed(path, line, &e))?;
        if rows.len() >= super::MAX_REQUESTS {
            return Err(ObservedError::new(
                path,
                format!("more than {} requests", super::MAX_REQUESTS),
            ));
        }
        let text = |c: usize, name: &str| {
            rec.get(c)
                .map(str::trim)
                .ok_or_else(|| ObservedError::at(path, Some(line), name, "missing"))
        };
        let int = |c: usize, name: &str| -> Result<u64, ObservedError> {
            let t = text(c, name)?;
            t.parse::<u64>().map_err(|_| {
                ObservedError::at(
                    path,
                    Some(line),
                    name,
                    format!("expected a non-negative integer, got {t:?}"),
                )
            })
        };
        let tokens = |c: usize, name: &str| -> Result<u32, ObservedError> {
            u32::try_from(int(c, name)?)
                .map_err(|_| ObservedError::at(path, Some(line), name, "more than 2^32 tokens"))
        };
        let ok = match status {
            Some(c) => text(c, "status")? == "ok",
            None => true,
        };
        let server = match server_input {
            Some(c) => tokens(c, "server_input_tokens")?,
            None => 0,
        };
        let prompt = if server > 0 {
            server
        } else {
            let p = match prefix {
                Some(c) => tokens(c, "prefix_length")?,
                None => 0,
            };
            tokens(input, "input_tokens")?.saturating_add(p)
        };
        if prompt == 0 && ok {
            return Err(ObservedError::at(
                path,
                Some(line),
                "input_tokens",
                "a prompt of 0 tokens",
            ));
        }
        let sent = int(send, "send_time_us")?;
        let (ttft, e2el) = if ok {
            let us = |c: usize, name: &str| -> Result<f64, ObservedError> {
                let t = int(c, name)?;
                latency(path, Some(line), name, (t as f64 - sent as f64) / 1e3)
            };
            let ttft = us(first, "first_chunk_time_us")?;
            let e2el = us(last, "last_chunk_time_us")?;
            if e2el < ttft {
                return Err(ObservedError::at(
                    path,
                    Some(line),
                    "last_chunk_time_us",
                    "before the first chunk",
                ));
            }
            (Some(ttft), Some(e2el))
        } else {
            (None, None)
        };
        rows.push((
            sent,
            line,
            ObservedRequest {
                id: text(id, "request_id")?.to_string(),
                send_s: None,
                prompt_len: prompt,
                output_len: tokens(output, "output_tokens")?,
                prompt_tokens: Vec::new(),
                prompt_key: None,
                ok,
                ttft_ms: ttft,
                e2el_ms: e2el,
                queue_ms: None,
            },
        ));
    }
    let (engine, warm_up) = match header_path(path) {
        Some(h) => read_header(&h)?,
        None => (ObservedEngine::default(), 0),
    };
    rows.sort_by_key(|r| (r.0, r.1));
    // The client's warm-up requests are those numbered below the count, as BLIS's
    // calibration filters them (`blis observe` itself does not record them).
    if warm_up > 0 {
        rows.retain(|r| r.2.id.parse::<u64>().map_or(true, |id| id >= warm_up));
    }
    if rows.is_empty() {
        return Err(ObservedError::new(
            path,
            if warm_up > 0 {
                "no requests after the header's warm_up_requests"
            } else {
                "no requests"
            },
        ));
    }
    let requests = super::sent_in_order(rows, 1e6);
    Ok(ObservedRun {
        path: path.to_path_buf(),
        format: "tracev2",
        engine,
        requests,
    })
}
