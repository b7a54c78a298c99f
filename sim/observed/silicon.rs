//! Closed-loop aggregate rows: aiconfigurator's `silicon.csv` (measured deployments of
//! vLLM, SGLang and TensorRT-LLM). Each row is one benchmark: clients in a closed loop
//! (`silicon_concurrency` in `silicon_data_source`, else the id's `_c<N>_`; `batch_size` is
//! one replica's share of them, and a row that names its clients nowhere is not taken to
//! have `batch_size` of them), every request of
//! `isl` prompt and `osl` output tokens, on `tp_size` GPUs of `system`, and the measured mean
//! TTFT and TPOT (`silicon_ttft_ms`, `silicon_tpot_ms`). Aggregated (`agg`) rows run prefill
//! and decode on the same GPUs; `disagg` rows split them over a prefill and a decode pool
//! (their `prefill_*`/`decode_*` columns: workers, batch and parallelism of each phase),
//! which `sim validate-model` replays as fleets.
//!
//! What a row does not record but its benchmark ran with comes from files beside it:
//! `inferencex-speculative.csv` (`id`, `method`, `num_speculative_tokens`, `evidence`) names
//! the InferenceX rows measured with multi-token-prediction speculative decoding, as the
//! InferenceX commit whose merge triggered the row's sweep configured it (its `evidence`).

use std::path::Path;

use super::ObservedError;

/// One measured deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateRow {
    /// 1-based line in the file.
    pub line: u64,
    /// The row's id.
    pub id: String,
    /// Engine (`vllm`, `sglang`, `trtllm`).
    pub backend: String,
    /// Engine version.
    pub backend_version: String,
    /// Hugging Face model id.
    pub model: String,
    /// GPU system (`h100_sxm`, `h200_sxm`, `b200_sxm`, `gb200`, ...).
    pub system: String,
    /// `agg` or `disagg`.
    pub mode: String,
    /// Weights' quantization (`fp8`, `fp8_block`, `nvfp4`; empty: the model's own dtype).
    pub gemm_quant: String,
    /// Prompt tokens of every request.
    pub isl: u32,
    /// Output tokens of every request.
    pub osl: u32,
    /// Clients in the closed loop (`silicon_concurrency`, else the id's `_c<N>_`; `None`:
    /// a row that says neither, such as aiconfigurator's gap-analysis deployments of January
    /// 2026 (`..._4000x1000_c_tp2_...`), whose `batch_size` is the deployment's batch size
    /// and not its clients).
    pub concurrency: Option<u32>,
    /// `batch_size`: the clients one replica (one attention-DP rank) serves, when the
    /// deployment spreads `concurrency` over several (aggregated rows); in a row that records
    /// no clients, the deployment's batch size.
    pub batch_size: Option<u32>,
    /// The benchmark client that measured the row (from `silicon_data_source`).
    pub client: BenchClient,
    /// Tensor parallelism (aggregated rows).
    pub tp: Option<u32>,
    /// Pipeline parallelism (aggregated rows).
    pub pp: Option<u32>,
    /// Attention data parallelism (aggregated rows).
    pub attention_dp: Option<u32>,
    /// Expert parallelism (aggregated rows).
    pub moe_ep: Option<u32>,
    /// Tensor parallelism of the experts (aggregated rows).
    pub moe_tp: Option<u32>,
    /// The prefill and decode pools of a disaggregated row (`None`: aggregated).
    pub disagg: Option<Disaggregated>,
    /// Measured mean TTFT (ms).
    pub ttft_ms: f64,
    /// Measured mean TPOT (ms).
    pub tpot_ms: f64,
    /// Drafts per verify step of the multi-token-prediction speculative decoding the row
    /// ran with (`inferencex-speculative.csv` beside the file; `None`: none).
    pub mtp_drafts: Option<u32>,
    /// The id of an earlier row holding the same measurement (same engine, GPU, mode,
    /// lengths and clients, TTFT and TPOT within 0.0051 ms): InferenceX's 2026-03-25 and
    /// 2026-04-06 dumps and its database export overlap, and one gap-analysis file copies its
    /// rows rounded, so one benchmark can appear up to three times; counting it once keeps a
    /// k-fold's held-out rows apart from its training rows.
    pub repeats: Option<String>,
}

/// One engine's parallelism as a row records it (empty or 0: not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Parallelism {
    /// Tensor parallelism (of attention, and of everything in a dense model).
    pub tp: Option<u32>,
    /// Pipeline parallelism.
    pub pp: Option<u32>,
    /// Attention data parallelism.
    pub attention_dp: Option<u32>,
    /// Tensor parallelism of the experts.
    pub moe_tp: Option<u32>,
    /// Expert parallelism.
    pub moe_ep: Option<u32>,
}

/// One phase's pool of a disaggregated row (`prefill_*` or `decode_*` columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stage {
    /// Workers (engines) in the pool (`None`: the row does not say).
    pub workers: Option<u32>,
    /// Requests one worker's rank batches (`None`: the row does not say).
    pub batch_size: Option<u32>,
    /// Each worker's parallelism.
    pub parallel: Parallelism,
}

/// The two pools of a disaggregated row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Disaggregated {
    /// Prompts run here, their KV sent on.
    pub prefill: Stage,
    /// Output tokens are generated here.
    pub decode: Stage,
}

/// The client that measured a row, which sets the request stream to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchClient {
    /// InferenceX's fork of vLLM's `benchmark_serving` (its dumps: `source_file=<date>.csv`,
    /// `db-dump/...`): `--random-range-ratio 0.8`, so prompt and output lengths are uniform
    /// in `[0.8 L, L]`, `10 x concurrency` requests.
    InferenceX,
    /// aiconfigurator's gap analysis (`...gap-analysis...` sources), run with aiperf:
    /// every request exactly `isl`/`osl` tokens (`--isl-stddev 0`, `ignore_eos`), `10 x
    /// concurrency` requests after `2 x concurrency` warm-up requests.
    Aiperf,
}

impl AggregateRow {
    /// The parallelism of an aggregated row's engine.
    pub fn parallel(&self) -> Parallelism {
        Parallelism {
            tp: self.tp,
            pp: self.pp,
            attention_dp: self.attention_dp,
            moe_tp: self.moe_tp,
            moe_ep: self.moe_ep,
        }
    }

    /// Whether the row's model is a catalog mixture of experts.
    pub fn is_moe(&self) -> bool {
        crate::catalog::find_model_by_id(&self.model).is_some_and(|m| m.num_experts > 1)
    }
}

impl BenchClient {
    /// The client a `silicon_data_source` names.
    pub fn from_source(source: &str) -> BenchClient {
        if source.contains("gap-analysis") {
            BenchClient::Aiperf
        } else {
            BenchClient::InferenceX
        }
    }
}

/// The largest token count, client count or parallel size a row may give (100 million).
pub const MAX_COUNT: u32 = 100_000_000;

/// Reads every row of an aiconfigurator `silicon.csv`.
pub fn read(path: &Path) -> Result<Vec<AggregateRow>, ObservedError> {
    let (mut rdr, cols) = super::open_csv(path)?;
    let (id, backend, version, model, system, mode) = (
        cols.need("id")?,
        cols.need("backend")?,
        cols.need("backend_version")?,
        cols.need("model_path")?,
        cols.need("system")?,
        cols.need("mode")?,
    );
    let (quant, isl, osl, batch, ttft, tpot) = (
        cols.need("gemm_quant_mode")?,
        cols.need("isl")?,
        cols.need("osl")?,
        cols.need("batch_size")?,
        cols.need("silicon_ttft_ms")?,
        cols.need("silicon_tpot_ms")?,
    );
    let (source, tp, pp, adp, ep, mtp) = (
        cols.col("silicon_data_source"),
        cols.col("tp_size"),
        cols.col("pp_size"),
        cols.col("attention_dp_size"),
        cols.col("moe_ep_size"),
        cols.col("moe_tp_size"),
    );
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| super::malformed(path, line, &e))?;
        let text = |c: usize| rec.get(c).map(str::trim).unwrap_or("").to_string();
        // Token counts, clients and GPUs add up in the simulated engine's budgets (clients +
        // prompt + output), so each is held far below where a sum could overflow.
        let count = |t: &str, name: &str| -> Result<u32, ObservedError> {
            t.parse::<u32>()
                .ok()
                .filter(|&x| x > 0 && x <= MAX_COUNT)
                .ok_or_else(|| {
                    ObservedError::at(
                        path,
                        Some(line),
                        name,
                        format!("expected a positive integer up to {MAX_COUNT}, got {t:?}"),
                    )
                })
        };
        let int = |c: usize, name: &str| count(&text(c), name);
        let opt_int = |c: Option<usize>, name: &str| -> Result<Option<u32>, ObservedError> {
            // Empty or 0: not given (a size that does not apply to the row).
            match c {
                Some(c) if !text(c).is_empty() && text(c) != "0" => int(c, name).map(Some),
                _ => Ok(None),
            }
        };
        let ms = |c: usize, name: &str| -> Result<f64, ObservedError> {
            let t = text(c);
            t.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| {
                    ObservedError::at(
                        path,
                        Some(line),
                        name,
                        format!("expected a positive latency, got {t:?}"),
                    )
                })
        };
        let mode_text = text(mode);
        let stage = |phase: &str| -> Result<Stage, ObservedError> {
            let c = |k: &str| cols.col(&format!("{phase}_{k}"));
            let n = |k: &str| opt_int(c(k), &format!("{phase}_{k}"));
            Ok(Stage {
                workers: n("num_workers")?,
                batch_size: n("batch_size")?,
                parallel: Parallelism {
                    tp: n("tp_size")?,
                    pp: n("pp_size")?,
                    attention_dp: n("attention_dp_size")?,
                    moe_tp: n("moe_tp_size")?,
                    moe_ep: n("moe_ep_size")?,
                },
            })
        };
        let disagg = if mode_text == "disagg" {
            Some(Disaggregated {
                prefill: stage("prefill")?,
                decode: stage("decode")?,
            })
        } else {
            None
        };
        // A row without `silicon_concurrency` (aiconfigurator's gap analysis) may name its
        // clients in its id (`..._15000x500_c480_...`); some do not (`_c_`), and then their
        // clients were not recorded (an aggregated row's `batch_size` is the engine's batch
        // size there: its TPOT is far from what that many clients on one replica give).
        let recorded = source.and_then(|c| {
            text(c).split(';').find_map(|kv| {
                kv.trim()
                    .strip_prefix("silicon_concurrency=")
                    .map(|v| v.trim().to_string())
            })
        });
        let concurrency = match recorded {
            Some(v) => Some(count(&v, "silicon_data_source: silicon_concurrency")?),
            None => id_clients(&text(id))
                .map(|n| count(n, "id: _c<N>_"))
                .transpose()?,
        };
        rows.push(AggregateRow {
            line,
            id: text(id),
            backend: text(backend),
            backend_version: text(version),
            model: text(model),
            system: text(system),
            gemm_quant: text(quant),
            isl: int(isl, "isl")?,
            osl: int(osl, "osl")?,
            concurrency,
            // 0 or empty: not given (disaggregated rows count per phase).
            batch_size: if text(batch).is_empty() || text(batch) == "0" {
                None
            } else {
                Some(int(batch, "batch_size")?)
            },
            client: BenchClient::from_source(&source.map(text).unwrap_or_default()),
            tp: opt_int(tp, "tp_size")?,
            pp: opt_int(pp, "pp_size")?,
            attention_dp: opt_int(adp, "attention_dp_size")?,
            moe_ep: opt_int(ep, "moe_ep_size")?,
            moe_tp: opt_int(mtp, "moe_tp_size")?,
            disagg,
            ttft_ms: ms(ttft, "silicon_ttft_ms")?,
            tpot_ms: ms(tpot, "silicon_tpot_ms")?,
            mode: mode_text,
            mtp_drafts: None,
            repeats: None,
        });
    }
    if rows.is_empty() {
        return Err(ObservedError::new(path, "no rows"));
    }
    mark_repeats(&mut rows);
    let speculative = path.with_file_name(SPECULATIVE_FILE);
    if speculative.is_file() {
        read_speculative(&speculative, &mut rows)?;
    }
    Ok(rows)
}

/// The clients an id names: the digits of the `c<N>` token right after its lengths
/// (`..._disagg_15000x500_c480_...`); `None` where that token is `c` alone (`_c_`) or absent.
fn id_clients(id: &str) -> Option<&str> {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let lengths = |t: &str| {
        t.split_once('x')
            .is_some_and(|(i, o)| digits(i) && digits(o))
    };
    let mut tokens = id.split('_');
    tokens.find(|t| lengths(t))?;
    tokens.next()?.strip_prefix('c').filter(|n| digits(n))
}

/// Marks each row whose measurement an earlier row already holds ([`AggregateRow::repeats`]):
/// the same engine, GPU, mode, lengths and clients, and TTFT and TPOT within 0.0051 ms
/// (the dumps print one float with different digits past the 12th, and
/// `qwen3.5-397b-gap-analysis.csv` copies InferenceX's Qwen3.5 rows rounded to 0.01 ms).
fn mark_repeats(rows: &mut [AggregateRow]) {
    const SAME_MS: f64 = 0.0051;
    type Bucket = Vec<(f64, f64, String)>;
    let mut seen: std::collections::HashMap<String, Bucket> = std::collections::HashMap::new();
    for r in rows.iter_mut() {
        let key = format!(
            "{}|{}|{}|{}|{}|{:?}",
            r.backend, r.system, r.mode, r.isl, r.osl, r.concurrency
        );
        let bucket = seen.entry(key).or_default();
        match bucket
            .iter()
            .find(|(t, p, _)| (t - r.ttft_ms).abs() <= SAME_MS && (p - r.tpot_ms).abs() <= SAME_MS)
        {
            Some((_, _, id)) => r.repeats = Some(id.clone()),
            None => bucket.push((r.ttft_ms, r.tpot_ms, r.id.clone())),
        }
    }
}

/// The file beside `silicon.csv` that names the rows measured with speculative decoding.
pub const SPECULATIVE_FILE: &str = "inferencex-speculative.csv";

/// Marks the rows `path` names as measured with multi-token prediction: every id must be an
/// aggregated row of the file beside it, once, with `method = mtp`, 1 to 8 drafts and its
/// evidence, and a row that repeats another's measurement must be listed as that one is.
pub fn read_speculative(path: &Path, rows: &mut [AggregateRow]) -> Result<(), ObservedError> {
    let (mut rdr, cols) = super::open_csv(path)?;
    let known = ["id", "method", "num_speculative_tokens", "evidence"];
    cols.only(&known)?;
    let (id, method, drafts, evidence) = (
        cols.need("id")?,
        cols.need("method")?,
        cols.need("num_speculative_tokens")?,
        cols.need("evidence")?,
    );
    let index: std::collections::HashMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.clone(), i))
        .collect();
    let mut listed = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| super::malformed(path, line, &e))?;
        let text = |c: usize| rec.get(c).map(str::trim).unwrap_or("");
        let at = |field: &str, msg: String| ObservedError::at(path, Some(line), field, msg);
        let row = *index.get(text(id)).ok_or_else(|| {
            at(
                "id",
                format!("{:?} is not a row of the silicon.csv beside it", text(id)),
            )
        })?;
        if text(method) != "mtp" {
            return Err(at(
                "method",
                format!(
                    "expected mtp (the model's multi-token-prediction layers as the draft), got {:?}",
                    text(method)
                ),
            ));
        }
        let k = text(drafts)
            .parse::<u32>()
            .ok()
            .filter(|k| (1..=8).contains(k))
            .ok_or_else(|| {
                at(
                    "num_speculative_tokens",
                    format!("expected 1 to 8 drafts, got {:?}", text(drafts)),
                )
            })?;
        if text(evidence).is_empty() {
            return Err(at(
                "evidence",
                "empty: say where the setting comes from".to_string(),
            ));
        }
        if rows[row].mode != "agg" {
            return Err(at(
                "id",
                format!(
                    "{:?} is a disaggregated row (only aggregated rows are simulated with speculative decoding)",
                    text(id)
                ),
            ));
        }
        if rows[row].mtp_drafts.replace(k).is_some() {
            return Err(at("id", format!("{:?} is listed twice", text(id))));
        }
        listed.push((row, line));
    }
    // A repeat is skipped and its first row simulated: listing the one without the other
    // would leave the measurement simulated without the drafts it ran with.
    for (row, line) in listed {
        let r = &rows[row];
        if let Some(first) = r.repeats.as_deref().and_then(|f| index.get(f)) {
            if rows[*first].mtp_drafts != r.mtp_drafts {
                return Err(ObservedError::at(
                    path,
                    Some(line),
                    "id",
                    format!(
                        "{:?} repeats the measurement of {:?}, which is not listed with the same drafts",
                        r.id, rows[*first].id
                    ),
                ));
            }
        }
    }
    Ok(())
}
