//! `vllm bench serve --save-result --save-detailed` JSON (vLLM's `benchmarks/serve.py`,
//! 0.10 to 0.19): the run's settings (`backend` or `endpoint_type`, `model_id`,
//! `request_rate` — a number or `"inf"` —, `max_concurrency`) and per-request arrays in
//! dataset order: `input_lens`, `output_lens` (tokens), `ttfts` (s), `itls` (s, one list per
//! request), `errors` (`""` when it succeeded), and from vLLM 0.15 `start_times` (the
//! client's `perf_counter` when it sent the request, s). E2EL is `latencies` when saved
//! (newer vLLM), else TTFT plus the ITLs. A failed request keeps its place with output 0.
//! `burstiness` and `duration` (s) are kept for replays of runs without `start_times`.

use std::path::Path;

use serde::Deserialize;

use super::{latency, relative_sends, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

#[derive(Deserialize)]
struct Bench {
    backend: Option<String>,
    endpoint_type: Option<String>,
    model_id: Option<String>,
    request_rate: Option<serde_json::Value>,
    max_concurrency: Option<u32>,
    input_lens: Option<Vec<u32>>,
    output_lens: Option<Vec<u32>>,
    ttfts: Option<Vec<f64>>,
    itls: Option<Vec<Vec<f64>>>,
    errors: Option<Vec<String>>,
    start_times: Option<Vec<f64>>,
    latencies: Option<Vec<f64>>,
    burstiness: Option<f64>,
    duration: Option<f64>,
}

/// Reads a vLLM bench result file.
pub(super) fn read(path: &Path) -> Result<ObservedRun, ObservedError> {
    let b: Bench = super::read_json(path)?;
    let need = |field: &str| {
        ObservedError::at(
            path,
            None,
            field,
            "missing: save the run with `vllm bench serve --save-result --save-detailed`",
        )
    };
    let input = b.input_lens.ok_or_else(|| need("input_lens"))?;
    let output = b.output_lens.ok_or_else(|| need("output_lens"))?;
    let ttfts = b.ttfts.ok_or_else(|| need("ttfts"))?;
    let itls = b.itls.ok_or_else(|| need("itls"))?;
    let errors = b.errors.unwrap_or_default();
    let n = input.len();
    if n == 0 {
        return Err(ObservedError::at(path, None, "input_lens", "no requests"));
    }
    if n > super::MAX_REQUESTS {
        return Err(ObservedError::at(
            path,
            None,
            "input_lens",
            format!("more than {} requests", super::MAX_REQUESTS),
        ));
    }
    let same_len = |field: &str, len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(ObservedError::at(
                path,
                None,
                field,
                format!("{len} entries for {n} requests in `input_lens`"),
            ))
        }
    };
    same_len("output_lens", output.len())?;
    same_len("ttfts", ttfts.len())?;
    same_len("itls", itls.len())?;
    if !errors.is_empty() {
        same_len("errors", errors.len())?;
    }
    if let Some(s) = &b.start_times {
        same_len("start_times", s.len())?;
    }
    if let Some(l) = &b.latencies {
        same_len("latencies", l.len())?;
    }
    let mut requests = Vec::with_capacity(n);
    for i in 0..n {
        let field = |name: &str| format!("{name}[{i}]");
        let ok = errors.get(i).is_none_or(|e| e.is_empty());
        if ok && input[i] == 0 {
            return Err(ObservedError::at(
                path,
                None,
                &field("input_lens"),
                "must be at least 1",
            ));
        }
        let (ttft_ms, e2el_ms) = if ok {
            let ttft = latency(path, None, &field("ttfts"), ttfts[i] * 1e3)?;
            let e2el = match &b.latencies {
                Some(l) => latency(path, None, &field("latencies"), l[i] * 1e3)?,
                None => {
                    let mut sum = 0.0;
                    for (j, g) in itls[i].iter().enumerate() {
                        sum += latency(path, None, &format!("itls[{i}][{j}]"), g * 1e3)?;
                    }
                    ttft + sum
                }
            };
            (Some(ttft), Some(e2el))
        } else {
            (None, None)
        };
        requests.push(ObservedRequest {
            id: i.to_string(),
            send_s: None,
            prompt_len: input[i],
            output_len: output[i],
            prompt_tokens: Vec::new(),
            prompt_key: None,
            ok,
            ttft_ms,
            e2el_ms,
            queue_ms: None,
        });
    }
    if let Some(starts) = &b.start_times {
        // Sent in dataset order, unless concurrency reordered them: sort by the send time.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &c| starts[a].total_cmp(&starts[c]));
        let sends: Vec<(Option<u64>, f64)> = order.iter().map(|&i| (None, starts[i])).collect();
        if let Some(bad) = starts.iter().position(|t| !t.is_finite()) {
            return Err(ObservedError::at(
                path,
                None,
                &format!("start_times[{bad}]"),
                "must be a finite time",
            ));
        }
        let rel = relative_sends(path, &sends, "start_times")?;
        let mut sorted: Vec<ObservedRequest> = order.iter().map(|&i| requests[i].clone()).collect();
        for (r, t) in sorted.iter_mut().zip(rel) {
            r.send_s = Some(t);
        }
        requests = sorted;
    }
    super::check_positive(
        path,
        &[("burstiness", b.burstiness), ("duration", b.duration)],
    )?;
    let rate = match &b.request_rate {
        Some(serde_json::Value::Number(x)) => x.as_f64().filter(|r| r.is_finite() && *r > 0.0),
        _ => None,
    };
    Ok(ObservedRun {
        path: path.to_path_buf(),
        format: "vllm-bench",
        engine: ObservedEngine {
            engine: b.backend.or(b.endpoint_type),
            model: b.model_id,
            max_concurrency: b.max_concurrency,
            request_rate: rate,
            all_at_once: matches!(&b.request_rate, Some(serde_json::Value::String(r)) if r == "inf"),
            burstiness: b.burstiness,
            duration_s: b.duration,
            ..ObservedEngine::default()
        },
        requests,
    })
}
