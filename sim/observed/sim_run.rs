//! A run `sim` wrote itself: a `sim serve` folder (a served run: real requests answered by
//! the CPU or CUDA runtime, or by the cost model) or a `sim run` variant folder. Read like
//! any engine's run so that `sim replay` and `sim calibrate --observed` close the loop on
//! this machine without a GPU.
//!
//! In: the folder's `requests.csv` (one row per request, in finish order: `arrival_s`,
//! `first_scheduled_s`, `prompt_len`, `output_len`, `ttft_ms`, `e2el_ms`, `queue_ms`,
//! `finish_reason`), `plan.json` (the deployment and engine the run had), and when present
//! `summary.json` (the KV blocks the engine held) and `served.json` (the backend). Out: an
//! [`ObservedRun`] in send (arrival) order; aborted and rejected requests count as failed;
//! the client's cap on requests in flight is the most the run had at once, and a run whose
//! clients kept that many in flight throughout is a closed loop.

use std::path::Path;

use serde_json::Value;

use super::{latency, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

/// Longest gap between a request's end and its client's next send in a closed loop (s).
const REFILL_S: f64 = 0.05;

/// The end times (s) of the steps in `dir/steps.csv`, sorted (empty without the file).
fn read_step_ends(dir: &Path) -> Result<Vec<f64>, ObservedError> {
    let path = dir.join("steps.csv");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let (mut rdr, cols) = super::open_csv(&path)?;
    let (start, duration) = (cols.need("start_s")?, cols.need("duration_ms")?);
    let mut ends = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| super::malformed(&path, line, &e))?;
        let num = |c: usize, name: &str| {
            rec.get(c)
                .and_then(|t| t.trim().parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| {
                    ObservedError::at(&path, Some(line), name, "expected a non-negative number")
                })
        };
        ends.push(num(start, "start_s")? + num(duration, "duration_ms")? / 1e3);
        if ends.len() > super::MAX_REQUESTS {
            return Err(ObservedError::new(&path, "too many steps"));
        }
    }
    ends.sort_by(f64::total_cmp);
    Ok(ends)
}

/// Whether `dir` holds a run `sim` wrote.
pub fn is_sim_run(dir: &Path) -> bool {
    dir.join("requests.csv").is_file() && dir.join("plan.json").is_file()
}

fn read_json(path: &Path) -> Result<Value, ObservedError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| ObservedError::new(path, format!("not JSON: {e}")))
}

/// The backend a served run ran on (`served.json`), if the folder says.
pub fn served_backend(dir: &Path) -> Option<String> {
    let v = read_json(&dir.join("served.json")).ok()?;
    v.get("backend")?.as_str().map(str::to_string)
}

/// Reads a `sim` run folder.
pub(super) fn read(dir: &Path) -> Result<ObservedRun, ObservedError> {
    let plan_path = dir.join("plan.json");
    let plan = read_json(&plan_path)?;
    let field = |v: &Value, key: &str| -> Result<Value, ObservedError> {
        key.split('.')
            .try_fold(v, |v, k| v.get(k))
            .cloned()
            .ok_or_else(|| ObservedError::at(&plan_path, None, key, "missing"))
    };
    let u32_of = |v: Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    let model = field(&plan, "deployment.model")?;
    let engine_cfg = field(&plan, "engine")?;
    let mut engine = ObservedEngine {
        engine: Some("sim".into()),
        version: Some(env!("CARGO_PKG_VERSION").into()),
        model: model
            .get("hf_id")
            .or_else(|| model.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string),
        gpu: field(&plan, "deployment.gpu.name")?
            .as_str()
            .map(str::to_string),
        tp: u32_of(field(&plan, "deployment.tp")?),
        max_num_seqs: engine_cfg.get("max_num_seqs").cloned().and_then(u32_of),
        max_num_batched_tokens: engine_cfg
            .get("max_num_batched_tokens")
            .cloned()
            .and_then(u32_of),
        max_model_len: u32_of(field(&plan, "memory.max_model_len")?),
        block_size: u32_of(field(&plan, "memory.block_size")?),
        num_gpu_blocks: u32_of(field(&plan, "memory.num_blocks")?),
        gpu_memory_utilization: engine_cfg
            .get("gpu_memory_utilization")
            .and_then(Value::as_f64),
        prefix_caching: engine_cfg
            .get("enable_prefix_caching")
            .and_then(Value::as_bool),
        scheduler: engine_cfg
            .get("scheduler")
            .and_then(Value::as_str)
            .map(str::to_string),
        chunked_prefill: engine_cfg
            .get("enable_chunked_prefill")
            .and_then(Value::as_bool),
        ..ObservedEngine::default()
    };
    // A model read from a GGUF is named by its file's metadata: the catalog model of the
    // same shape names it for a replay.
    let known = |id: &str| {
        crate::catalog::find_model_by_id(id).is_some() || crate::catalog::find_model(id).is_some()
    };
    if !engine.model.as_deref().is_some_and(known) {
        let dim = |k: &str| model.get(k).and_then(Value::as_u64);
        let same = crate::catalog::models().iter().find(|m| {
            dim("hidden") == Some(u64::from(m.hidden))
                && dim("layers") == Some(u64::from(m.layers))
                && dim("heads") == Some(u64::from(m.heads))
                && dim("kv_heads") == Some(u64::from(m.kv_heads))
                && dim("intermediate") == Some(u64::from(m.intermediate))
                && dim("vocab") == Some(u64::from(m.vocab))
        });
        if let Some(m) = same {
            engine.model = Some(m.hf_id.to_string());
        }
    }
    // The blocks the engine really held (a real runtime may hold fewer than planned).
    let summary = dir.join("summary.json");
    if summary.is_file() {
        if let Some(b) = read_json(&summary)?
            .get("kv_pool_blocks")
            .cloned()
            .and_then(u32_of)
        {
            engine.num_gpu_blocks = Some(b);
        }
    }
    let path = dir.join("requests.csv");
    let (mut rdr, cols) = super::open_csv(&path)?;
    let finish_col = cols.need("finish_s")?;
    let (arrival, prompt, output, ttft, e2el, queue, reason, id) = (
        cols.need("arrival_s")?,
        cols.need("prompt_len")?,
        cols.need("output_len")?,
        cols.need("ttft_ms")?,
        cols.need("e2el_ms")?,
        cols.need("queue_ms")?,
        cols.need("finish_reason")?,
        cols.need("request_id")?,
    );
    let mut rows: Vec<(f64, ObservedRequest)> = Vec::new();
    // (time, +1 arrival / -1 end): the most requests in flight at once.
    let mut spans: Vec<(f64, i32)> = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| super::malformed(&path, line, &e))?;
        if rows.len() >= super::MAX_REQUESTS {
            return Err(ObservedError::new(
                &path,
                format!("more than {} requests", super::MAX_REQUESTS),
            ));
        }
        let text = |c: usize| rec.get(c).map(str::trim).unwrap_or("");
        let num = |c: usize, name: &str| -> Result<Option<f64>, ObservedError> {
            let t = text(c);
            if t.is_empty() {
                return Ok(None);
            }
            t.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    ObservedError::at(
                        &path,
                        Some(line),
                        name,
                        format!("expected a number, got {t:?}"),
                    )
                })
        };
        let tokens = |c: usize, name: &str| -> Result<u32, ObservedError> {
            text(c).parse::<u32>().map_err(|_| {
                ObservedError::at(
                    &path,
                    Some(line),
                    name,
                    format!("expected a token count, got {:?}", text(c)),
                )
            })
        };
        let ok = matches!(text(reason), "length" | "stop");
        let lat = |c: usize, name: &str| -> Result<Option<f64>, ObservedError> {
            match num(c, name)? {
                Some(v) if ok => Ok(Some(latency(&path, Some(line), name, v)?)),
                _ => Ok(None),
            }
        };
        let send = num(arrival, "arrival_s")?
            .ok_or_else(|| ObservedError::at(&path, Some(line), "arrival_s", "missing"))?;
        let end = num(finish_col, "finish_s")?.unwrap_or(send);
        spans.push((send, 1));
        spans.push((end.max(send), -1));
        rows.push((
            send,
            ObservedRequest {
                id: text(id).to_string(),
                send_s: None,
                prompt_len: tokens(prompt, "prompt_len")?,
                output_len: tokens(output, "output_len")?,
                prompt_tokens: Vec::new(),
                prompt_key: None,
                ok,
                ttft_ms: lat(ttft, "ttft_ms")?,
                e2el_ms: lat(e2el, "e2el_ms")?,
                queue_ms: lat(queue, "queue_ms")?,
            },
        ));
    }
    if rows.is_empty() {
        return Err(ObservedError::new(&path, "no requests"));
    }
    // The clients of a served run are taken as a closed loop capped at the most requests
    // they had in flight (benchmark clients run so): a replay that runs slower than the
    // engine then does not pile up more requests than the clients ever sent at once.
    spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut in_flight = 0i32;
    let mut most = 0i32;
    for (_, d) in &spans {
        in_flight += d;
        most = most.max(in_flight);
    }
    // (A `sim run` folder's client is its scenario's: only served runs infer theirs.)
    let served = dir.join("served.json").is_file();
    engine.max_concurrency = u32::try_from(most).ok().filter(|&m| m > 0 && served);
    // A saturated closed loop (every request after the first `most` sent as another ended,
    // as benchmark clients at a fixed concurrency send them): replayed as such, since send
    // times replayed open-loop would let a replay slower or faster than the engine drift
    // away from the load the engine saw.
    // A refill: one of the first `most` sends, or a send within 50 ms of a request's end
    // (a client's round trip; several requests may end in one step, their clients
    // sending again one by one).
    let (mut arrivals, mut refills) = (0i32, 0usize);
    let mut last_end = f64::NEG_INFINITY;
    // (Only a served run's refills have a turnaround to measure.)
    let step_ends = if served {
        read_step_ends(dir)?
    } else {
        Vec::new()
    };
    let mut gaps = Vec::new();
    for &(t, d) in &spans {
        if d > 0 {
            if arrivals < most {
                refills += 1;
            } else if t - last_end <= REFILL_S {
                refills += 1;
                // The end of the step that ended the request (its record is stamped
                // when the runtime finished; the step runs on through the commit).
                let k = step_ends.partition_point(|&e| e < last_end - 1e-9);
                if let Some(&e) = step_ends.get(k) {
                    gaps.push(t - e);
                }
            }
            arrivals += 1;
        } else {
            last_end = t;
        }
    }
    engine.closed_loop = served && most > 1 && refills * 10 >= rows.len() * 9;
    if engine.closed_loop && !gaps.is_empty() {
        gaps.sort_by(f64::total_cmp);
        engine.refill_gap_s = Some(gaps[gaps.len() / 2].max(0.0));
    }
    // Rows are written as requests finish: send order is arrival order.
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let t0 = rows[0].0;
    let last_end = rows
        .iter()
        .filter_map(|(s, r)| r.e2el_ms.map(|e| s + e / 1e3))
        .fold(t0, f64::max);
    engine.duration_s = Some(last_end - t0);
    let requests = rows
        .into_iter()
        .map(|(s, mut r)| {
            r.send_s = Some(s - t0);
            r
        })
        .collect();
    Ok(ObservedRun {
        path: dir.to_path_buf(),
        format: "sim",
        engine,
        requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A served folder with these `(arrival_s, finish_s)` requests.
    fn folder(spans: &[(f64, f64)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from(
            "request_id,class,arrival_s,first_scheduled_s,first_token_s,finish_s,prompt_len,output_len,generated_tokens,max_tokens,cached_tokens,num_preemptions,ttft_ms,tpot_ms,e2el_ms,queue_ms,finish_reason\n",
        );
        for (i, &(a, f)) in spans.iter().enumerate() {
            let ttft = (f - a) * 100.0;
            csv.push_str(&format!(
                "{i},served,{a},{a},{},{f},10,10,10,10,0,0,{ttft},1,{},0,length\n",
                a + ttft / 1e3,
                (f - a) * 1e3
            ));
        }
        std::fs::write(dir.path().join("requests.csv"), csv).expect("write");
        let plan = r#"{"deployment": {"model": {"name": "llama-3-8b", "hf_id": "meta-llama/Meta-Llama-3-8B"}, "gpu": {"name": "h100-sxm"}, "tp": 1},
            "engine": {"max_num_seqs": 8, "scheduler": "chunked"}, "memory": {"max_model_len": 512, "block_size": 16, "num_blocks": 100}}"#;
        std::fs::write(dir.path().join("plan.json"), plan).expect("write");
        std::fs::write(dir.path().join("served.json"), r#"{"backend": "cpu"}"#).expect("write");
        dir
    }

    #[test]
    fn a_saturated_closed_loop_is_told_from_an_open_one() {
        // Three clients, each sending its next request 2 ms after its last ended; two of
        // them end in the same step.
        let mut spans = Vec::new();
        for c in 0..3 {
            let mut t = 0.001 * f64::from(c);
            for k in 0..6 {
                let end = if c < 2 { 1.0 + f64::from(k) } else { t + 0.7 };
                spans.push((t, end));
                t = end + 0.002;
            }
        }
        let dir = folder(&spans);
        let run = read(dir.path()).expect("reads");
        assert_eq!(run.engine.max_concurrency, Some(3));
        assert!(run.engine.closed_loop);
        // Without steps.csv no turnaround is known; with it, the refills came 1.5 ms after
        // the end of the step (which ran 0.5 ms past its requests' records).
        assert_eq!(run.engine.refill_gap_s, None);
        let mut ends: Vec<f64> = spans.iter().map(|s| s.1).collect();
        ends.sort_by(f64::total_cmp);
        ends.dedup();
        let mut steps = String::from("step,start_s,duration_ms\n");
        for (k, e) in ends.iter().enumerate() {
            steps.push_str(&format!("{k},{:.6},10.5\n", e - 0.01));
        }
        std::fs::write(dir.path().join("steps.csv"), steps).expect("write");
        let run = read(dir.path()).expect("reads");
        let gap = run.engine.refill_gap_s.expect("a turnaround");
        assert!((gap - 0.0015).abs() < 1e-6, "{gap}");
        assert!(run.requests.windows(2).all(|w| w[0].send_s <= w[1].send_s));
        // Open loop: sends every 0.3 s whatever ends.
        let spans: Vec<(f64, f64)> = (0..20)
            .map(|i| (0.3 * f64::from(i), 0.3 * f64::from(i) + 0.45))
            .collect();
        let run = read(folder(&spans).path()).expect("reads");
        assert_eq!(run.engine.max_concurrency, Some(2));
        assert!(!run.engine.closed_loop);
    }
}
