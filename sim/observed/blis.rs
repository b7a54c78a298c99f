//! BLIS / inference-sim TraceV2 CSV (`blis observe --trace-output P` writes `P.csv` and a
//! `P.yaml` header; only the CSV is read here). Columns are found by name: `request_id`,
//! `input_tokens` and `prefix_length` (the prompt is their sum unless
//! `server_input_tokens`, the server's count, is above 0), `output_tokens`,
//! `send_time_us`, `first_chunk_time_us`, `last_chunk_time_us` (absolute microseconds),
//! `status` (`ok`, `error`, `timeout`). TTFT is first chunk minus send, E2EL last chunk
//! minus send, as BLIS's own calibration computes them. Under overload the client caps the
//! requests in flight, so the server sees the send times, not the scheduled arrivals; rows
//! are taken in send order.

use std::path::Path;

use super::{latency, relative_sends, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

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
                ok,
                ttft_ms: ttft,
                e2el_ms: e2el,
                queue_ms: None,
            },
        ));
    }
    if rows.is_empty() {
        return Err(ObservedError::new(path, "no requests"));
    }
    rows.sort_by_key(|r| (r.0, r.1));
    // Relative to the first send in integer microseconds (absolute ones lose precision as f64).
    let t0 = rows[0].0;
    let sends: Vec<(Option<u64>, f64)> = rows
        .iter()
        .map(|r| (Some(r.1), (r.0 - t0) as f64 / 1e6))
        .collect();
    let rel = relative_sends(path, &sends, "send_time_us")?;
    let requests = rows
        .into_iter()
        .zip(rel)
        .map(|((_, _, mut r), t)| {
            r.send_s = Some(t);
            r
        })
        .collect();
    Ok(ObservedRun {
        path: path.to_path_buf(),
        format: "tracev2",
        engine: ObservedEngine::default(),
        requests,
    })
}
