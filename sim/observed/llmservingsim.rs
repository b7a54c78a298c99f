//! LLMServingSim's vLLM runs (`../shared/data/serving/llmservingsim/<GPU>/<model>/`):
//! `vllm/meta.json` (vLLM version, engine arguments, and in newer runs the KV cache vLLM
//! allocated and the GPU) and `vllm/requests.jsonl`, one request a line with engine-side
//! monotonic timestamps in seconds: `queued_ts` (arrival in the engine), `scheduled_ts`,
//! `first_token_ts`, `last_token_ts`, and `input_toks`, `output_toks`. TTFT is first token
//! minus queued, E2EL last token minus queued, queueing scheduled minus queued. The
//! directory's `config.json` is LLMServingSim's cluster description, not the model's: the
//! model is found by its name, and from it the link between the GPUs is read (`link_bw` in
//! GB/s, `link_latency` in ns), which the testbed's GPUs cross for their collectives. The
//! GPU is `hardware.device_name` or the parent directory's name. The workload file
//! `meta.json` names (`dataset_path`, relative to the folder above the GPU folders) gives
//! each prompt's token ids, when present.
//! Requests are taken in the order of their queue times.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

use super::{latency, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

#[derive(Deserialize)]
struct Meta {
    model: Option<String>,
    vllm_version: Option<String>,
    engine_kwargs: Option<EngineKwargs>,
    dataset_path: Option<String>,
    kv_cache: Option<KvCache>,
    hardware: Option<Hardware>,
    resolved_config: Option<ResolvedConfig>,
}

/// vLLM's resolved configuration (only what the replay needs).
#[derive(Deserialize)]
struct ResolvedConfig {
    scheduler_config: Option<SchedulerSettings>,
}

#[derive(Deserialize)]
struct SchedulerSettings {
    enable_chunked_prefill: Option<bool>,
}

#[derive(Deserialize)]
struct EngineKwargs {
    model: Option<String>,
    tensor_parallel_size: Option<u32>,
    data_parallel_size: Option<u32>,
    #[serde(default)]
    enable_expert_parallel: bool,
    max_num_seqs: Option<u32>,
    max_num_batched_tokens: Option<u32>,
    max_model_len: Option<u32>,
    dtype: Option<String>,
    enable_chunked_prefill: Option<bool>,
}

#[derive(Deserialize)]
struct KvCache {
    num_gpu_blocks: Option<u32>,
    block_size: Option<u32>,
    gpu_memory_utilization: Option<f64>,
    enable_prefix_caching: Option<bool>,
}

#[derive(Deserialize)]
struct Hardware {
    device_name: Option<String>,
}

#[derive(Deserialize)]
struct Line {
    request_id: String,
    input_toks: u32,
    output_toks: u32,
    queued_ts: f64,
    scheduled_ts: f64,
    first_token_ts: f64,
    last_token_ts: f64,
}

/// What `config.json` (LLMServingSim's cluster description) says of the link between the
/// GPUs (other keys are LLMServingSim's own).
#[derive(Deserialize)]
struct Cluster {
    link_bw: Option<f64>,
    link_latency: Option<f64>,
}

#[derive(Deserialize)]
struct WorkloadLine {
    #[serde(default)]
    input_tok_ids: Vec<u32>,
}

/// The cluster description beside the run, when there is one: its link's bandwidth and
/// latency, each positive and finite when given.
fn read_cluster(path: &Path) -> Result<Option<Cluster>, ObservedError> {
    if !path.is_file() {
        return Ok(None);
    }
    let c: Cluster = super::read_json(path)?;
    super::check_positive(
        path,
        &[("link_bw", c.link_bw), ("link_latency", c.link_latency)],
    )?;
    Ok(Some(c))
}

/// Reads the run directory `dir`.
pub(super) fn read(dir: &Path) -> Result<ObservedRun, ObservedError> {
    let meta_path = dir.join("vllm").join("meta.json");
    let meta: Meta = super::read_json(&meta_path)?;
    let cluster = read_cluster(&dir.join("config.json"))?;
    let kw = meta.engine_kwargs.as_ref();
    let kv = meta.kv_cache.as_ref();
    let gpu = meta.hardware.and_then(|h| h.device_name).or_else(|| {
        let parent = dir
            .canonicalize()
            .ok()?
            .parent()?
            .file_name()?
            .to_str()?
            .to_string();
        Some(parent)
    });
    let engine = ObservedEngine {
        engine: Some("vllm".into()),
        version: meta.vllm_version.clone(),
        model: kw.and_then(|k| k.model.clone()).or(meta.model.clone()),
        model_config: None,
        gpu,
        tp: kw.and_then(|k| k.tensor_parallel_size),
        dp: kw.and_then(|k| k.data_parallel_size),
        expert_parallel: kw.is_some_and(|k| k.enable_expert_parallel),
        max_num_seqs: kw.and_then(|k| k.max_num_seqs),
        max_num_batched_tokens: kw.and_then(|k| k.max_num_batched_tokens),
        chunked_prefill: kw.and_then(|k| k.enable_chunked_prefill).or_else(|| {
            meta.resolved_config
                .as_ref()
                .and_then(|r| r.scheduler_config.as_ref())
                .and_then(|c| c.enable_chunked_prefill)
        }),
        max_model_len: kw.and_then(|k| k.max_model_len),
        dtype: kw.and_then(|k| k.dtype.clone()),
        num_gpu_blocks: kv.and_then(|k| k.num_gpu_blocks),
        block_size: kv.and_then(|k| k.block_size),
        gpu_memory_utilization: kv.and_then(|k| k.gpu_memory_utilization),
        prefix_caching: kv.and_then(|k| k.enable_prefix_caching),
        max_concurrency: None,
        request_rate: None,
        link_gbs: cluster.as_ref().and_then(|c| c.link_bw),
        link_latency_us: cluster
            .as_ref()
            .and_then(|c| c.link_latency)
            .map(|ns| ns / 1e3),
        ..ObservedEngine::default()
    };
    let req_path = dir.join("vllm").join("requests.jsonl");
    let mut requests = Vec::new();
    let mut sends = Vec::new();
    super::for_json_lines(&req_path, |n, l: Line| {
        let ms =
            |field: &str, from: f64, to: f64| latency(&req_path, Some(n), field, (to - from) * 1e3);
        let ttft = ms("first_token_ts", l.queued_ts, l.first_token_ts)?;
        let e2el = ms("last_token_ts", l.queued_ts, l.last_token_ts)?;
        let queue = ms("scheduled_ts", l.queued_ts, l.scheduled_ts)?;
        if l.last_token_ts < l.first_token_ts || l.first_token_ts < l.scheduled_ts {
            return Err(ObservedError::at(
                &req_path,
                Some(n),
                "first_token_ts",
                "timestamps out of order: want queued <= scheduled <= first token <= last token",
            ));
        }
        if l.input_toks == 0 {
            return Err(ObservedError::at(
                &req_path,
                Some(n),
                "input_toks",
                "must be at least 1",
            ));
        }
        sends.push((Some(n), l.queued_ts));
        requests.push(ObservedRequest {
            id: l.request_id,
            send_s: None,
            prompt_len: l.input_toks,
            output_len: l.output_toks,
            prompt_tokens: Vec::new(),
            prompt_key: None,
            ok: true,
            ttft_ms: Some(ttft),
            e2el_ms: Some(e2el),
            queue_ms: Some(queue),
        });
        Ok(())
    })?;
    if requests.is_empty() {
        return Err(ObservedError::new(&req_path, "no requests"));
    }
    // In send order: the file is in request order, and under data parallelism the engines'
    // queue times interleave by microseconds.
    let t0 = sends.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    for (r, (_, t)) in requests.iter_mut().zip(&sends) {
        r.send_s = Some(t - t0);
    }
    if let Some(ds) = &meta.dataset_path {
        attach_tokens(dir, ds, &mut requests)?;
    }
    requests.sort_by(|a, b| a.send_s.unwrap_or(0.0).total_cmp(&b.send_s.unwrap_or(0.0)));
    Ok(ObservedRun {
        path: dir.to_path_buf(),
        format: "llmservingsim",
        engine,
        requests,
    })
}

/// The prompts' token ids from the workload file, line `i` for request `i`, when the file
/// is there (its lengths must match the run's).
fn attach_tokens(
    dir: &Path,
    dataset: &str,
    requests: &mut [ObservedRequest],
) -> Result<(), ObservedError> {
    let Some(root) = dir.parent().and_then(Path::parent) else {
        return Ok(());
    };
    let path = root.join(dataset);
    let Ok(file) = std::fs::File::open(&path) else {
        return Ok(());
    };
    for (i, (line, r)) in std::io::BufReader::new(file)
        .lines()
        .zip(requests.iter_mut())
        .enumerate()
    {
        let n = i as u64 + 1;
        let line = line
            .map_err(|e| ObservedError::at(&path, Some(n), "line", format!("cannot read: {e}")))?;
        let w: WorkloadLine = serde_json::from_str(&line).map_err(|e| {
            ObservedError::at(
                &path,
                Some(n),
                "json",
                crate::messages::concise(&e.to_string()),
            )
        })?;
        if !w.input_tok_ids.is_empty() {
            if w.input_tok_ids.len() != r.prompt_len as usize {
                return Err(ObservedError::at(
                    &path,
                    Some(n),
                    "input_tok_ids",
                    format!(
                        "{} token ids for request {} of {} prompt tokens",
                        w.input_tok_ids.len(),
                        r.id,
                        r.prompt_len
                    ),
                ));
            }
            r.prompt_tokens = w.input_tok_ids;
        }
    }
    Ok(())
}
