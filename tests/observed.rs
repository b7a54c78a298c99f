//! Readers of real engines' runs (`sim::observed`): the LLMServingSim vLLM runs carried in
//! `calibration/serving/` against the measured figures that project printed for them
//! (`validation/summary.txt`, its "vLLM" column), aiconfigurator's `silicon.csv`, small
//! fixtures of vLLM bench JSON, BLIS TraceV2 and the plain CSV, and bad files.

use std::path::{Path, PathBuf};

use sim::observed::{self, ObservedRun};

const RUNS: &str = "calibration/serving/llmservingsim";

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// The measured column of a `validation/summary.txt` row (e.g. `TTFT Mean`).
fn measured(dir: &Path, row: &str) -> f64 {
    let text = std::fs::read_to_string(dir.join("validation/summary.txt")).expect("summary");
    let line = text
        .lines()
        .find(|l| l.starts_with(row))
        .unwrap_or_else(|| panic!("{row}"));
    line[row.len()..]
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .expect("number")
}

#[test]
fn llmservingsim_runs_read_as_vllm_measured_them() {
    for (run, gpu, tp, seqs) in [
        ("RTX4090/Llama-3.1-8B", "NVIDIA GeForce RTX 4090", 1, 256),
        ("RTXPRO6000/Llama-3.1-8B", "RTXPRO6000", 1, 128),
        ("RTXPRO6000/Qwen3-32B", "RTXPRO6000", 2, 128),
    ] {
        let dir = PathBuf::from(RUNS).join(run);
        let r: ObservedRun = observed::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.format, "llmservingsim");
        assert_eq!(r.requests.len(), 300);
        assert_eq!(r.engine.gpu.as_deref(), Some(gpu));
        assert_eq!(r.engine.tp, Some(tp));
        assert_eq!(r.engine.max_num_seqs, Some(seqs));
        assert_eq!(r.engine.max_num_batched_tokens, Some(2048));
        assert_eq!(r.requests[0].send_s, Some(0.0));
        // The testbed's link, from the cluster description beside the run.
        assert_eq!(r.engine.link_gbs, Some(16.0));
        let latency = if gpu == "RTXPRO6000" { 20.0 } else { 1.0 };
        assert_eq!(r.engine.link_latency_us, Some(latency));
        assert!(r.requests.windows(2).all(|w| w[0].send_s <= w[1].send_s));
        // The means LLMServingSim printed for the same run, to their 0.1 ms rounding.
        let ttft = mean(r.requests.iter().filter_map(|q| q.ttft_ms));
        let e2el = mean(r.requests.iter().filter_map(|q| q.e2el_ms));
        let tpot = mean(r.requests.iter().filter_map(|q| q.tpot_ms()));
        assert!(
            (ttft - measured(&dir, "TTFT Mean")).abs() < 0.06,
            "{run}: TTFT {ttft}"
        );
        assert!(
            (e2el - measured(&dir, "Latency Mean")).abs() < 0.06,
            "{run}: E2EL {e2el}"
        );
        assert!(
            (tpot - measured(&dir, "TPOT Mean")).abs() < 0.06,
            "{run}: TPOT {tpot}"
        );
    }
    // The RTX 4090 run also records the KV cache vLLM allocated.
    let r = observed::open(&PathBuf::from(RUNS).join("RTX4090/Llama-3.1-8B")).expect("run");
    assert_eq!(r.engine.num_gpu_blocks, Some(2588));
    assert_eq!(r.engine.block_size, Some(16));
    assert_eq!(r.engine.gpu_memory_utilization, Some(0.9));
    assert_eq!(r.engine.prefix_caching, Some(true));
    assert_eq!(r.engine.chunked_prefill, Some(true));
    assert_eq!(r.engine.version.as_deref(), Some("0.19.0"));
}

#[test]
fn silicon_rows_read_with_their_concurrency() {
    let rows = observed::silicon::read(Path::new("calibration/serving/aiconfigurator/silicon.csv"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rows.len(), 3052);
    let agg = rows.iter().filter(|r| r.mode == "agg").count();
    assert_eq!(agg, 2179, "as Python's csv module counts them");
    let r = rows
        .iter()
        .find(|r| {
            r.id == "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_1024x128_c8_tp1_epnone_1"
        })
        .expect("row");
    assert_eq!(
        (r.isl, r.osl, r.concurrency, r.tp),
        (1024, 128, Some(8), Some(1))
    );
    assert!((r.ttft_ms - 190.9545068625).abs() < 1e-9);
    assert!((r.tpot_ms - 7.94357745).abs() < 1e-9);
    // Every aggregated row says its concurrency in the source note but the 10 of
    // aiconfigurator's January 2026 gap-analysis job, whose ids do not name it either
    // (`_c_`): their `batch_size` is not taken for their clients.
    let unsaid: Vec<&str> = rows
        .iter()
        .filter(|r| r.mode == "agg" && r.concurrency.is_none())
        .map(|r| r.id.as_str())
        .collect();
    assert_eq!(unsaid.len(), 10, "{unsaid:?}");
    assert!(unsaid.iter().all(|id| id.contains("_c_tp")), "{unsaid:?}");
    assert!(rows
        .iter()
        .filter(|r| r.mode == "agg" && r.concurrency.is_none())
        .all(|r| r.batch_size.is_some()));
    let d = rows.iter().find(|r| r.mode == "disagg").expect("disagg");
    assert!(d.concurrency.is_some() && d.tp.is_none());
    // A disaggregated row's pools: 1 prefill worker of 4 attention-DP ranks, experts over 4
    // GPUs; 5 decode workers of 8 GPUs, attention TP 8 and experts EP 8, 2 clients each.
    let d = rows
        .iter()
        .find(|r| r.id == "dsr1_b200_trtllm_fp4_disagg_1024x1024_c10_cfg320")
        .expect("row");
    let pools = d.disagg.expect("pools");
    assert_eq!(
        (pools.prefill.workers, pools.prefill.parallel.attention_dp),
        (Some(1), Some(4))
    );
    assert_eq!(pools.prefill.parallel.moe_ep, Some(4));
    assert_eq!(
        (
            pools.decode.workers,
            pools.decode.parallel.tp,
            pools.decode.parallel.moe_ep,
            pools.decode.batch_size
        ),
        (Some(5), Some(8), Some(8), Some(2))
    );
    assert!(rows
        .iter()
        .all(|r| r.disagg.is_some() == (r.mode == "disagg")));
    // The gap-analysis rows without silicon_concurrency name their clients in the id, or
    // do not say.
    let named = rows
        .iter()
        .find(|r| r.id.contains("trtllm_disagg_15000x500_c480_"))
        .expect("row");
    assert_eq!(named.concurrency, Some(480));
    assert!(rows
        .iter()
        .any(|r| r.mode == "disagg" && r.id.contains("_c_tp") && r.concurrency.is_none()));
}

/// Without `silicon_concurrency`, a row's clients are the `c<N>` token right after its
/// lengths in the id; `_c_` (or none) says nothing, whatever other token starts with `c`; a
/// count out of range there is an error naming the file, line and field.
#[test]
fn silicon_clients_from_the_id() {
    let small = std::fs::read_to_string("tests/data/observed/silicon-small.csv").expect("csv");
    let mut lines = small.lines();
    let header = lines.next().expect("header");
    let row = lines.next().expect("row");
    let (id, rest) = row.split_once(',').expect("id");
    assert!(id.contains("_1024x128_c8_"), "{id}");
    let (_, rest) = rest.split_once(',').expect("source");
    let with = |id: &str| format!("{id},source_file=x.csv,{rest}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("silicon.csv");
    let text = [
        header.to_string(),
        with(id),
        with(&id.replace("_c8_", "_c_")),
        with(&format!("c4_{}", id.replace("_c8_", "_c_"))),
    ]
    .join("\n");
    std::fs::write(&path, text + "\n").expect("write");
    let rows = observed::silicon::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let clients: Vec<Option<u32>> = rows.iter().map(|r| r.concurrency).collect();
    assert_eq!(clients, [Some(8), None, None]);
    std::fs::write(
        &path,
        format!("{header}\n{}\n", with(&id.replace("_c8_", "_c0_"))),
    )
    .expect("write");
    let e = observed::silicon::read(&path)
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("silicon.csv:2: id: _c<N>_: expected a positive integer"),
        "{e}"
    );
}

/// The aggregated rows that record their clients nowhere are not simulated with a guess at
/// them (their `batch_size` is the deployment's batch size): every one is skipped, by that
/// reason.
#[test]
fn silicon_rows_without_their_clients_are_skipped() {
    let rows = observed::silicon::read(Path::new("calibration/serving/aiconfigurator/silicon.csv"))
        .unwrap_or_else(|e| panic!("{e}"));
    let unsaid: Vec<_> = rows
        .into_iter()
        .filter(|r| r.mode == "agg" && r.concurrency.is_none())
        .collect();
    let (checks, skipped) =
        sim::cost_model::validation::silicon::silicon_checks(&unsaid, None).expect("planned");
    assert!(checks.is_empty());
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].0.contains("clients not recorded"), "{skipped:?}");
    assert_eq!(skipped[0].1, 10);
}

/// The InferenceX rows measured with multi-token prediction, which silicon.csv does not
/// record: `inferencex-speculative.csv` beside it names 200 aggregated rows of DeepSeek-R1
/// and Qwen3.5-397B, TensorRT-LLM's with 3 drafts (1 under attention data parallelism, as
/// its scripts set), SGLang's with 2 (DeepSeek-R1) or 3 (Qwen3.5); none of aiconfigurator's
/// own (aiperf) rows. A TP4 run of the same model, GPU and lengths without them is left
/// unmarked.
#[test]
fn silicon_rows_measured_with_mtp_are_marked() {
    use sim::observed::silicon::BenchClient;
    let rows = observed::silicon::read(Path::new("calibration/serving/aiconfigurator/silicon.csv"))
        .unwrap_or_else(|e| panic!("{e}"));
    let mtp: Vec<_> = rows.iter().filter(|r| r.mtp_drafts.is_some()).collect();
    assert_eq!(mtp.len(), 200);
    for r in &mtp {
        assert!(
            r.mode == "agg" && r.client == BenchClient::InferenceX && r.is_moe(),
            "{}",
            r.id
        );
        let want = match r.backend.as_str() {
            "trtllm" if r.attention_dp.unwrap_or(1) > 1 => 1,
            "trtllm" => 3,
            "sglang" if r.model.contains("Qwen3.5") => 3,
            "sglang" => 2,
            other => panic!("{}: {other}", r.id),
        };
        assert_eq!(r.mtp_drafts, Some(want), "{}", r.id);
    }
    let tpot = |id: &str| {
        let r = rows.iter().find(|r| r.id == id).expect(id);
        (r.mtp_drafts, r.tpot_ms)
    };
    // DeepSeek-R1 in NVFP4 on B200, 1k/8k from 4 clients: TP8 with MTP (InferenceX #642)
    // at 3.6 ms a token; TP4 without it (a sweep on TensorRT-LLM 1.2.0rc6.post2) at 7.9.
    let (k, with) = tpot("2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_agg_1024x8192_c4_tp8_ep1_19");
    let (none, without) =
        tpot("2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_agg_1024x8192_c4_tp4_ep1_47");
    assert_eq!((k, none), (Some(3), None));
    assert!(with < 0.5 * without, "{with} {without}");
}

/// InferenceX's dumps overlap (its 2026-03-25 and 2026-04-06 CSVs and its database export
/// hold many of the same benchmarks), and `qwen3.5-397b-gap-analysis.csv` copies 55 of its
/// Qwen3.5 rows rounded to 0.01 ms: 658 rows repeat an earlier row's measurement, each naming
/// that row, which has the same engine, GPU, lengths and clients, TTFT and TPOT within
/// 0.0051 ms, and is not itself a repeat. A repeat listed with speculative decoding has its
/// first row listed the same (15 unlisted gap-analysis copies repeat rows measured with it).
/// None of them is a dense model's aggregated row.
#[test]
fn repeated_measurements_name_their_first_row() {
    use sim::observed::silicon::BenchClient;
    let rows = observed::silicon::read(Path::new("calibration/serving/aiconfigurator/silicon.csv"))
        .unwrap_or_else(|e| panic!("{e}"));
    let by_id: std::collections::HashMap<&str, _> =
        rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let repeats: Vec<_> = rows.iter().filter(|r| r.repeats.is_some()).collect();
    assert_eq!(repeats.len(), 658);
    let mut gap_copies_of_mtp = 0;
    for r in &repeats {
        let first = by_id[r.repeats.as_deref().expect("id")];
        assert!(first.line < r.line && first.repeats.is_none(), "{}", r.id);
        assert_eq!(
            (
                &first.backend,
                &first.system,
                first.isl,
                first.osl,
                first.concurrency
            ),
            (&r.backend, &r.system, r.isl, r.osl, r.concurrency),
            "{}",
            r.id
        );
        assert!(
            (first.ttft_ms - r.ttft_ms).abs() <= 0.0051
                && (first.tpot_ms - r.tpot_ms).abs() <= 0.0051
        );
        assert!(r.is_moe() || r.mode == "disagg", "{}", r.id);
        if r.mtp_drafts.is_some() {
            assert_eq!(first.mtp_drafts, r.mtp_drafts, "{}", r.id);
        } else if first.mtp_drafts.is_some() {
            assert_eq!(r.client, BenchClient::Aiperf, "{}", r.id);
            gap_copies_of_mtp += 1;
        }
        if r.client == BenchClient::Aiperf {
            assert_eq!(first.client, BenchClient::InferenceX, "{}", r.id);
        }
    }
    assert_eq!(gap_copies_of_mtp, 15);
}

/// A bad `inferencex-speculative.csv` is one line naming the file, the line and the field.
#[test]
fn bad_speculative_files_name_the_line_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The small file's rows and the disaggregated file's (one header).
    let mut silicon =
        std::fs::read_to_string("tests/data/observed/silicon-small.csv").expect("csv");
    let more = std::fs::read_to_string("tests/data/observed/silicon-disagg.csv").expect("csv");
    silicon.push_str(more.split_once('\n').expect("header").1);
    let id = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_trtllm_agg_1024x128_c8_tp1_epnone_1";
    let disagg = "dsr1_b200_trtllm_fp4_disagg_1024x1024_c10_cfg320";
    let head = "id,method,num_speculative_tokens,evidence\n";
    for (i, (body, expect)) in [
        (
            format!("{head}{id},mtp,3,x\nnot_a_row,mtp,3,x\n"),
            ":3: id: \"not_a_row\" is not a row",
        ),
        (
            format!("{head}{id},eagle,3,x\n"),
            ":2: method: expected mtp",
        ),
        (
            format!("{head}{id},mtp,0,x\n"),
            ":2: num_speculative_tokens: expected 1 to 8",
        ),
        (
            format!("{head}{id},mtp,three,x\n"),
            ":2: num_speculative_tokens",
        ),
        (format!("{head}{id},mtp,3,\n"), ":2: evidence: empty"),
        (format!("{head}{id},mtp,3,x\n{id},mtp,1,y\n"), ":3: id: "),
        (
            format!("id,method,num_speculative_tokens,evidence,acceptance\n{id},mtp,3,x,0.7\n"),
            ":1: acceptance: unknown column",
        ),
        (
            format!("id,method,evidence\n{id},mtp,x\n"),
            ":1: num_speculative_tokens",
        ),
        (
            format!("{head}{disagg},mtp,3,x\n"),
            ":2: id: \"dsr1_b200_trtllm_fp4_disagg_1024x1024_c10_cfg320\" is a disaggregated row",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir_all(&sub).expect("mkdir");
        std::fs::write(sub.join("silicon.csv"), &silicon).expect("write");
        std::fs::write(sub.join(observed::silicon::SPECULATIVE_FILE), body).expect("write");
        let e = observed::silicon::read(&sub.join("silicon.csv")).expect_err(expect);
        let msg = e.to_string();
        assert!(
            msg.contains(expect)
                && msg.contains("inferencex-speculative.csv")
                && !msg.contains('\n'),
            "{msg}"
        );
    }
    // A copy of a row (another id, the same measurement) is a repeat: listing the copy
    // alone would run the kept row without the drafts.
    let sub = dir.path().join("copy");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let line = silicon.lines().find(|l| l.starts_with(id)).expect("row");
    let copy = line.replacen(id, "the_copy", 1);
    std::fs::write(sub.join("silicon.csv"), format!("{silicon}{copy}\n")).expect("write");
    std::fs::write(
        sub.join(observed::silicon::SPECULATIVE_FILE),
        format!("{head}the_copy,mtp,3,x\n"),
    )
    .expect("write");
    let e = observed::silicon::read(&sub.join("silicon.csv")).expect_err("a lone copy");
    assert!(
        e.to_string()
            .contains(":2: id: \"the_copy\" repeats the measurement of"),
        "{e}"
    );
    let rows = observed::silicon::read(&{
        std::fs::write(
            sub.join(observed::silicon::SPECULATIVE_FILE),
            format!("{head}{id},mtp,3,x\nthe_copy,mtp,3,x\n"),
        )
        .expect("write");
        sub.join("silicon.csv")
    })
    .expect("both listed");
    let copy = rows.iter().find(|r| r.id == "the_copy").expect("copy");
    assert_eq!(
        (copy.repeats.as_deref(), copy.mtp_drafts),
        (Some(id), Some(3))
    );

    // A good one marks the row.
    let sub = dir.path().join("good");
    std::fs::create_dir_all(&sub).expect("mkdir");
    std::fs::write(sub.join("silicon.csv"), &silicon).expect("write");
    std::fs::write(
        sub.join(observed::silicon::SPECULATIVE_FILE),
        format!("{head}{id},mtp,2,a script\n"),
    )
    .expect("write");
    let rows = observed::silicon::read(&sub.join("silicon.csv")).expect("rows");
    let marked: Vec<_> = rows
        .iter()
        .filter_map(|r| r.mtp_drafts.map(|k| (r.id.as_str(), k)))
        .collect();
    assert_eq!(marked, [(id, 2)]);
}

/// The disaggregated rows of `file` (which holds `rows` rows) replayed as fleets under the
/// default cost model: the checks and the skipped rows by reason.
fn replay_fleets(
    file: &str,
    rows: usize,
) -> (
    Vec<sim::cost_model::validation::silicon::SiliconCheck>,
    sim::cost_model::validation::silicon::Skipped,
) {
    let read = observed::silicon::read(Path::new(file)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read.len(), rows);
    sim::cost_model::validation::disagg::disagg_checks(&read, &|_| Default::default())
        .expect("replayed")
}

/// A disaggregated deployment replayed as the fleet it ran as (DeepSeek-R1 in NVFP4 on
/// B200: one prefill worker of 4 attention-DP ranks, five decode workers of 8 GPUs), at 10 and
/// 90 clients. Nothing was fitted to these rows: at 10 clients the replay is within 25% of
/// the measured TTFT and TPOT (it comes out within 5% and 11%); more clients queue longer
/// for the one prefill worker and batch more per decode step, so both grow, as measured.
/// A row without worker counts is skipped with the reason; an aggregated row is not the
/// fleet check's.
#[test]
fn disaggregated_rows_replay_as_fleets() {
    let (checks, skipped) = replay_fleets("tests/data/observed/silicon-disagg.csv", 4);
    assert_eq!(checks.len(), 2, "{skipped:?}");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].0.contains("worker counts"), "{skipped:?}");
    assert_eq!(skipped[0].1, 1);
    let (few, many) = (&checks[0], &checks[1]);
    assert_eq!(few.row.concurrency, Some(10));
    // Most of this row's TTFT is the prefill pool's MoE floor (fitted to the aggregated
    // rows, per expert of the model: 119 ms a prefill here; per expert an EP4 rank holds
    // it would be 30). Simulated TTFT is 92 ms without it and 259 ms with it, against
    // 169 measured: the bound spans that uncertainty (-46% to +53%), TPOT's is 25%.
    assert!(
        few.ttft_error().abs() < 0.6 && few.tpot_error().abs() < 0.25,
        "TTFT {:.0} vs {:.0} ms, TPOT {:.2} vs {:.2} ms",
        few.ttft_ms,
        few.row.ttft_ms,
        few.tpot_ms,
        few.row.tpot_ms
    );
    assert!(many.row.ttft_ms > few.row.ttft_ms && many.row.tpot_ms > few.row.tpot_ms);
    assert!(
        many.ttft_ms > few.ttft_ms && many.tpot_ms > few.tpot_ms,
        "{:.0} -> {:.0} ms, {:.2} -> {:.2} ms",
        few.ttft_ms,
        many.ttft_ms,
        few.tpot_ms,
        many.tpot_ms
    );
}

/// Disaggregated SGLang rows replayed under the recipes InferenceX ran them with
/// (`sglang_recipes`): DeepSeek-R1 in fp8 at TP4 on GB200 fits only at its recipe's
/// `mem-fraction-static` of 0.95 with an fp8 KV cache (at 0.82 its 169 GB of weights a
/// GPU do not), and a December 2025 row whose pools are labelled four attention-DP ranks
/// ran TP4 servers (its decode TPOT came out 49% long under the labels). Nothing was
/// fitted to either row: both within 25% on TPOT, and TTFT within 30% (they come out
/// 8% and 20% short).
#[test]
fn disaggregated_sglang_rows_run_their_recipes() {
    let (checks, skipped) = replay_fleets("tests/data/observed/silicon-disagg-sglang.csv", 2);
    assert_eq!(checks.len(), 2, "{skipped:?}");
    for c in &checks {
        assert!(
            c.ttft_error().abs() < 0.3 && c.tpot_error().abs() < 0.25,
            "{}: TTFT {:.0} vs {:.0} ms, TPOT {:.2} vs {:.2} ms",
            c.row.id,
            c.ttft_ms,
            c.row.ttft_ms,
            c.tpot_ms,
            c.row.tpot_ms
        );
    }
}

#[test]
fn vllm_bench_json_reads_in_send_order_with_failures_kept() {
    let r = observed::open(Path::new("tests/data/observed/vllm_bench.json")).expect("reads");
    assert_eq!(r.format, "vllm-bench");
    assert_eq!(r.engine.engine.as_deref(), Some("vllm"));
    assert_eq!(r.engine.max_concurrency, Some(2));
    assert_eq!(r.engine.request_rate, None, "\"inf\" is no rate");
    let ids: Vec<&str> = r.requests.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, ["1", "2", "0"], "sorted by start_times");
    let sends: Vec<f64> = r.requests.iter().map(|q| q.send_s.unwrap()).collect();
    assert_eq!(sends, [0.0, 0.5, 1.0]);
    let first = &r.requests[2];
    assert_eq!((first.prompt_len, first.output_len), (500, 4));
    assert!((first.ttft_ms.unwrap() - 100.0).abs() < 1e-9);
    assert!((first.e2el_ms.unwrap() - 160.0).abs() < 1e-9, "TTFT + ITLs");
    let failed = &r.requests[1];
    assert!(!failed.ok && failed.ttft_ms.is_none());
}

#[test]
fn tracev2_and_plain_csv_read() {
    let r = observed::open(Path::new("tests/data/observed/tracev2.csv")).expect("reads");
    assert_eq!(r.format, "tracev2");
    let ids: Vec<&str> = r.requests.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, ["0", "1", "2"], "in send order");
    // The server's prompt count wins; else input + prefix.
    assert_eq!(r.requests[0].prompt_len, 305);
    assert_eq!(r.requests[1].prompt_len, 300);
    assert_eq!(r.requests[1].send_s, Some(0.002));
    assert!((r.requests[1].ttft_ms.unwrap() - 50.0).abs() < 1e-9);
    assert!((r.requests[1].e2el_ms.unwrap() - 150.0).abs() < 1e-9);
    assert!(!r.requests[2].ok);

    let r = observed::open(Path::new("tests/data/observed/plain.csv")).expect("reads");
    assert_eq!(r.format, "csv");
    assert_eq!(r.requests[1].send_s, Some(0.5));
    assert_eq!(r.requests[0].queue_ms, Some(3.0));
    assert!((r.requests[0].tpot_ms().unwrap() - 10.0).abs() < 1e-9);
    assert!(!r.requests[2].ok);
}

/// A TraceV2 trace with its header (`trace_data.csv` beside `trace_header.yaml`): the
/// header names the deployment, and its warm-up requests (the first sent) are left out.
#[test]
fn tracev2_headers_give_the_deployment_and_drop_the_warm_up() {
    let r = observed::open(Path::new("tests/data/observed/blis/trace_data.csv")).expect("reads");
    assert_eq!(r.format, "tracev2");
    let e = &r.engine;
    assert_eq!(e.engine.as_deref(), Some("vllm"));
    assert_eq!(e.model.as_deref(), Some("meta-llama/Llama-3.1-8B-Instruct"));
    assert_eq!(
        (e.tp, e.max_num_seqs, e.block_size, e.max_model_len),
        (Some(1), Some(64), Some(16), Some(8192))
    );
    assert_eq!(e.gpu_memory_utilization, Some(0.9));
    let ids: Vec<&str> = r.requests.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, ["1", "2"], "request 0 was the warm-up");
    assert_eq!(
        r.requests[0].send_s,
        Some(0.0),
        "times count from the first measured send"
    );

    // A header that BLIS itself would refuse is one line naming the file and the key.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = std::fs::read_to_string("tests/data/observed/blis/trace_data.csv").expect("csv");
    let good = std::fs::read_to_string("tests/data/observed/blis/trace_header.yaml").expect("yaml");
    for (i, (header, expect)) in [
        (
            good.replace("mode: real", "mode: real\nsampling: greedy"),
            "unknown field `sampling`",
        ),
        (
            good.replace("microseconds", "milliseconds"),
            "time_unit: expected microseconds",
        ),
        (
            good.replace("trace_version: 2", "trace_version: 9"),
            "trace_version: expected 2 or 3",
        ),
        (good.replace("0.9", "1.5"), "server.gpu_memory_utilization"),
        (
            good.replace("max_num_seqs: 64", "max_num_seqs: 0"),
            "server.max_num_seqs",
        ),
        (
            good.replace("warm_up_requests: 1", "warm_up_requests: 5"),
            "no requests after the header's warm_up_requests",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir_all(&sub).expect("mkdir");
        std::fs::write(sub.join("trace_data.csv"), &data).expect("write");
        std::fs::write(sub.join("trace_header.yaml"), header).expect("write");
        let e = observed::open(&sub.join("trace_data.csv")).expect_err(expect);
        let msg = e.to_string();
        assert!(msg.contains(expect) && !msg.contains('\n'), "{msg}");
    }
}

/// A bad run file in a temporary folder: `(file name, content, text the error must name)`.
const BAD: &[(&str, &str, &str)] = &[
    ("a.csv", "send_s,prompt_len,output_len,ttft_ms\n1,2,3,4\n", "e2el_ms"),
    ("b.csv", "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n1,2,3,4,5\n0.5,2,3,4,5\n", ":3: send_s: times must not go back"),
    ("c.csv", "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n1,2,3,-4,5\n", ":2: ttft_ms"),
    ("d.csv", "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n1,2,3,40,5\n", ":2: e2el_ms"),
    ("e.csv", "send_s,prompt_len,output_len,ttft_ms,e2el_ms,color\n1,2,3,4,5,red\n", ":1: color: unknown column"),
    ("f.csv", "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n1,two,3,4,5\n", ":2: prompt_len"),
    ("g.csv", "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n", "no requests"),
    ("h.csv", "a,b\n1,2\n", "send_time_us"),
    ("i.json", "{\"input_lens\": [1, 2], \"output_lens\": [1], \"ttfts\": [0.1, 0.1], \"itls\": [[], []]}", "output_lens: 1 entries for 2 requests"),
    ("j.json", "{\"input_lens\": [1], \"output_lens\": [1], \"ttfts\": [0.1]}", "itls: missing"),
    ("k.json", "{\"input_lens\": [1], \"output_lens\": [1], \"ttfts\": [-0.1], \"itls\": [[]]}", "ttfts[0]"),
    ("l.json", "{\"input_lens\": [1, ", "json"),
    ("m.txt", "x", "unknown run format"),
    ("n.csv", "request_id,input_tokens,output_tokens,send_time_us,first_chunk_time_us,last_chunk_time_us,status\n1,10,5,1000,500,2000,ok\n", ":2: first_chunk_time_us"),
    ("o.csv", "request_id,input_tokens,output_tokens,send_time_us,first_chunk_time_us\n", "last_chunk_time_us: column not found"),
    // aiperf's per-request records.
    ("p.jsonl", "{\"metadata\": {\"benchmark_phase\": \"profiling\"}, \"metrics\": {}, \"error\": null}\n", ":1: metadata.request_start_ns: missing"),
    ("q.jsonl", "\n{\"metadata\": {\"request_start_ns\": 5}, \"metrics\": {\"input_sequence_length\": {\"value\": 9, \"unit\": \"tokens\"}, \"output_sequence_length\": {\"value\": 3, \"unit\": \"tokens\"}, \"time_to_first_token\": {\"value\": 4, \"unit\": \"furlongs\"}, \"request_latency\": {\"value\": 9, \"unit\": \"ms\"}}, \"error\": null}\n", ":2: metrics.time_to_first_token: unit `furlongs`"),
    ("r.jsonl", "{\"metadata\": {\"request_start_ns\": 5}, \"metrics\": {\"input_sequence_length\": {\"value\": 9, \"unit\": \"tokens\"}, \"output_sequence_length\": {\"value\": 3, \"unit\": \"tokens\"}, \"time_to_first_token\": {\"value\": 40, \"unit\": \"ms\"}, \"request_latency\": {\"value\": 9, \"unit\": \"ms\"}}, \"error\": null}\n", ":1: metrics.request_latency: 9 ms is below"),
    ("s.jsonl", "{\"metadata\": ", ":1: json"),
    ("x.jsonl", "{\"metadata\": {\"request_start_ns\": 5, \"request_end_ns\": 3}, \"metrics\": {}, \"error\": {\"message\": \"boom\"}}\n", ":1: metadata.request_end_ns: 3 is before"),
    ("t.jsonl", "\n", "no requests"),
    ("u.jsonl", "{\"metadata\": {\"request_start_ns\": 5}, \"metrics\": {\"input_sequence_length\": {\"value\": 9, \"unit\": \"tokens\"}, \"output_sequence_length\": {\"value\": 3, \"unit\": \"tokens\"}, \"request_latency\": {\"value\": 9, \"unit\": \"ms\"}}, \"error\": null}\n", "metrics.time_to_first_token: missing: TTFT needs a streamed run"),
    ("v.jsonl", "{\"metadata\": {\"request_start_ns\": 5}, \"metrics\": {\"input_sequence_length\": {\"value\": 9.5, \"unit\": \"tokens\"}}, \"error\": null}\n", ":1: metrics.input_sequence_length: expected a whole number of tokens"),
    ("w.jsonl", "{\"metadata\": {\"request_start_ns\": 5}, \"metrics\": {\"input_sequence_length\": {\"value\": 9, \"unit\": \"tokens\"}, \"output_sequence_length\": {\"value\": 3, \"unit\": \"tokens\"}, \"time_to_first_token\": {\"value\": -4, \"unit\": \"ms\"}, \"request_latency\": {\"value\": 9, \"unit\": \"ms\"}}, \"error\": null}\n", ":1: metrics.time_to_first_token: must be a finite, non-negative latency"),
];

#[test]
fn bad_run_files_give_one_line_naming_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, content, want) in BAD {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        let err = observed::open(&path).expect_err(name).to_string();
        assert!(err.contains(name), "{name}: {err}");
        assert!(err.contains(want), "{name}: want {want:?} in {err}");
        assert!(!err.contains('\n') && err.len() <= 300, "{name}: {err}");
    }
    // LLMServingSim runs: timestamps out of order, a missing field, a missing file.
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("vllm")).expect("mkdir");
    std::fs::write(run.join("vllm/meta.json"), "{\"model\": \"m\"}").expect("write");
    let line = |q: f64, s: f64, f: f64, l: f64| {
        format!("{{\"request_id\": \"r\", \"input_toks\": 5, \"output_toks\": 2, \"queued_ts\": {q}, \"scheduled_ts\": {s}, \"first_token_ts\": {f}, \"last_token_ts\": {l}}}\n")
    };
    for (content, want) in [
        (
            line(1.0, 1.1, 1.2, 1.3) + &line(1.5, 1.1, 1.2, 1.3),
            "requests.jsonl:2: first_token_ts: must be a finite, non-negative latency",
        ),
        (line(1.0, 1.1, 0.9, 1.3), "requests.jsonl:1: first_token_ts"),
        (
            "{\"request_id\": \"r\"}\n".to_string(),
            "requests.jsonl:1: json: missing field `input_toks`",
        ),
    ] {
        std::fs::write(run.join("vllm/requests.jsonl"), content).expect("write");
        let err = observed::open(&run).expect_err(want).to_string();
        assert!(err.contains(want), "want {want:?} in {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    // The cluster description's link: a positive bandwidth and latency.
    std::fs::write(run.join("vllm/requests.jsonl"), line(1.0, 1.1, 1.2, 1.3)).expect("write");
    for (content, want) in [
        (
            "{\"link_bw\": -16}",
            "config.json: link_bw: must be a positive number",
        ),
        ("{\"link_latency\": 0}", "config.json: link_latency"),
        ("{\"link_bw\": \"fast\"}", "config.json:1: json"),
    ] {
        std::fs::write(run.join("config.json"), content).expect("write");
        let err = observed::open(&run).expect_err(want).to_string();
        assert!(err.contains(want), "want {want:?} in {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    std::fs::remove_file(run.join("config.json")).expect("rm");
    std::fs::remove_file(run.join("vllm/requests.jsonl")).expect("rm");
    let err = observed::open(&run).expect_err("missing").to_string();
    assert!(err.contains("requests.jsonl: cannot read"), "{err}");
}

/// The `aiperf-turnaround` stage on twelve TensorRT-LLM rows measured with aiperf: one fit
/// for the engine, a spread per fold from the candidates, every row held out once, the
/// landscape over every candidate, and a file whose table `sim validate-model`'s values
/// come from. The spread moves the simulated TTFT: a closed loop of identical requests
/// bunches differently when its clients' requests reach the engine at different times.
#[test]
fn the_aiperf_turnaround_is_fitted_per_engine_with_held_out_errors() {
    use sim::cost_model::calibration::turnaround::{fit_turnaround, toml as file_text, CANDIDATES};
    use sim::cost_model::validation::silicon::EngineCost;
    let rows =
        observed::silicon::read(Path::new("tests/data/observed/silicon-small.csv")).expect("rows");
    let fits = fit_turnaround(&rows, 3, &EngineCost::default()).expect("fits");
    assert_eq!(fits.len(), 1);
    let f = &fits[0];
    assert_eq!((f.engine.as_str(), f.fit.rows), ("trtllm", 12));
    assert!(CANDIDATES.contains(&f.fit.value));
    assert_eq!(f.fit.fold_values.len(), 3);
    assert!(f.fit.fold_values.iter().all(|v| CANDIDATES.contains(v)));
    assert_eq!(
        (f.fit.held_out_ttft.len(), f.fit.baseline_ttft.len()),
        (12, 12)
    );
    assert_eq!(f.fit.landscape.len(), CANDIDATES.len());
    let (lockstep, spread) = (
        f.fit.landscape[0].1,
        f.fit.landscape[CANDIDATES.len() - 1].1,
    );
    assert!((lockstep - spread).abs() > 1e-3, "{:?}", f.fit.landscape);
    let text = file_text(&fits, "silicon-small.csv", 3);
    assert!(text.contains("held-out"), "{text}");
    let table: toml::Table = text.parse().expect("toml");
    assert_eq!(
        table["aiperf_turnaround_ms"]["trtllm"].as_float(),
        Some(f.fit.value),
        "{text}"
    );
}

/// `sim calibrate --observed` on twelve TensorRT-LLM rows (H100/H200, at most 8 clients):
/// one engine, a fit per fold, every row held out once, and the fitted costs lower the
/// held-out TTFT error below the defaults'. The fp8 GEMMs run at the 16-bit efficiency here
/// (`fp8_compute_eff` = 1), where these rows' TTFT is short.
#[test]
fn the_front_end_cost_is_fitted_with_held_out_errors() {
    use sim::cost_model::calibration::observed::{
        campaign_of, fit_engine_costs, fit_rows_csv, fit_toml, median_abs,
        ALLREDUCE_EFF_CANDIDATES, CANDIDATES_MS, EAGER_CANDIDATES_US, FP4_CANDIDATES,
        FP8_CANDIDATES,
    };
    let rows =
        observed::silicon::read(Path::new("tests/data/observed/silicon-small.csv")).expect("rows");
    assert_eq!(rows.len(), 12);
    let fp8_at_16_bit = sim::cost_model::validation::silicon::EngineCost {
        fp8_compute_eff: Some(1.0),
        ..Default::default()
    };
    let fits = fit_engine_costs(&rows, 3, &fp8_at_16_bit, None).expect("fits");
    assert_eq!(fits.len(), 1);
    let f = &fits[0];
    assert_eq!((f.engine.as_str(), f.rows), ("trtllm", 12));
    assert_eq!(f.fold_fits.len(), 3);
    assert_eq!(f.held_out_ttft.len(), 12);
    assert!(CANDIDATES_MS.contains(&f.request_overhead_ms));
    assert!(EAGER_CANDIDATES_US.contains(&f.eager_layer_us));
    for (list, candidates) in [
        (&f.by_gpu.fp8, &FP8_CANDIDATES[..]),
        (&f.by_gpu.fp4, &FP4_CANDIDATES[..]),
        (&f.by_gpu.allreduce, &ALLREDUCE_EFF_CANDIDATES[..]),
    ] {
        assert!(
            list.iter()
                .all(|(g, e)| f.gpus.contains(g) && candidates.contains(&Some(*e))),
            "{f:?}"
        );
    }
    // Uncalibrated, every row's TTFT is short at these 8 clients; the fitted terms (a CPU
    // overhead per step, a front-end cost or an eager floor under the prefills) make it up,
    // taking the held-out signed median towards zero.
    assert!(f.baseline_ttft.iter().all(|e| *e < 0.0), "{f:?}");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
    };
    assert!(
        median(&f.held_out_ttft).abs() < median(&f.baseline_ttft).abs(),
        "{f:?}"
    );
    assert!(median_abs(&f.held_out_ttft) < median_abs(&f.baseline_ttft));
    // A setting the rows do not record is chosen per campaign, among the rows' own.
    for (c, _) in f
        .fold_fits
        .iter()
        .flat_map(|ff| &ff.unrecorded)
        .chain(&f.unrecorded)
    {
        assert!(rows.iter().any(|r| &campaign_of(r) == c), "{c}");
    }
    // Every row's held-out errors, once each, under its fold's fit.
    let csv = fit_rows_csv(f).expect("rows csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "id,fold,ttft_error,tpot_error,default_ttft_error,default_tpot_error"
    );
    assert_eq!(lines.len(), 13, "{csv}");
    let mut ids: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap_or(""))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 12, "{csv}");
    assert!(rows.iter().all(|r| ids.contains(&r.id.as_str())));
    let toml = fit_toml(f, "silicon-small.csv", 3);
    assert!(toml.contains("[cost]\nframework = \"tensorrt-llm\"\nstep_overhead_us = "));
    assert!(toml.contains("\neager_layer_us = "));
    assert!(toml.contains("\nrequest_overhead_ms = "));
    // An engine's own fp8 and all-reduce efficiencies are written, per GPU, only where
    // they moved from the defaults.
    let parsed: toml::Table = toml::from_str(&toml).expect("valid TOML");
    let by_gpu = parsed["cost"].get("by_gpu");
    for (list, key) in [
        (&f.by_gpu.fp8, "fp8_compute_eff"),
        (&f.by_gpu.fp4, "fp4_compute_eff"),
        (&f.by_gpu.allreduce, "allreduce_eff"),
    ] {
        for (g, e) in list {
            let got = by_gpu.and_then(|t| t[*g][key].as_float());
            assert_eq!(got, Some((e * 100.0).round() / 100.0), "{toml}");
        }
    }
    assert_eq!(
        toml.contains("[cost.by_gpu."),
        !f.by_gpu.fp8.is_empty()
            || !f.by_gpu.fp4.is_empty()
            || !f.by_gpu.allreduce.is_empty()
            || !f.by_gpu.eager.is_empty(),
        "{toml}"
    );
    // The engine keys it names are the ones the shipped TensorRT-LLM fit names.
    let engine_line = "[engine] scheduler = \"chunked\", admission = \"worst-case\",\n# max_num_batched_tokens = 8192.\n";
    assert!(toml.contains(engine_line), "{toml}");
    let shipped = std::fs::read_to_string("calibration/observed-trtllm.toml").expect("shipped fit");
    assert!(shipped.contains(engine_line), "{shipped}");

    // The file records its folds; a scenario calibrated with it gets bands from them.
    let parsed: toml::Table = toml::from_str(&toml).expect("calibration file parses");
    let record = sim::cost_model::calibration::uncertainty::FitRecord::from_file_table(&parsed)
        .expect("valid [fit]")
        .expect("[fit] present");
    assert_eq!(record.folds.len(), 3);
    assert!(record.ttft_error_90[0] <= record.ttft_error_50[0]);
    assert!(record.ttft_error_50[1] <= record.ttft_error_90[1]);
    // Make the folds disagree, so that the band needs a run of its own.
    let toml = toml.replacen(
        &format!(
            "{{ step_overhead_us = {:.1}",
            f.fold_fits[0].step_overhead_us
        ),
        "{ step_overhead_us = 4000.0",
        1,
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("observed-trtllm.toml"), &toml).expect("write");
    let scenario = dir.path().join("s.toml");
    std::fs::write(
        &scenario,
        r#"
name = "banded"
[model]
name = "llama-3.1-8b"
[hardware]
gpu = "h100-sxm"
[cost]
calibration = "observed-trtllm.toml"
[workload]
num_requests = 40
arrival = { process = "closed-loop", concurrency = 8 }
[[workload.class]]
name = "fixed"
prompt = { dist = "fixed", value = 1024 }
output = { dist = "fixed", value = 64 }
"#,
    )
    .expect("write");
    let scn = sim::scenario::Scenario::load(&scenario, None).expect("scenario");
    assert!(scn.variants[0].fit.is_some());
    let opts = sim::run::RunOptions {
        out_dir: None,
        driver: sim::driver::DriverKind::Inline,
        only: Vec::new(),
        progress: false,
        parallel: false,
        backend: sim::run::BackendKind::Model,
        requests: None,
    };
    let results = sim::run::run_scenario(&scn, &opts).expect("run");
    let bands = sim::bands::bands(&scn, &results, None).expect("bands");
    let tpot = bands
        .iter()
        .find(|b| b.metric == "tpot_mean")
        .expect("a TPOT band");
    assert!(tpot.fold_runs >= 1);
    // A 4 ms step overhead in one fold makes that fold's steps slower.
    assert!(tpot.folds.0 <= tpot.predicted && tpot.predicted < tpot.folds.1);
    let (lo, hi) = tpot.held_out_90.expect("held-out band");
    assert!(lo <= hi && lo > 0.0);
    let table = sim::bands::table(&bands);
    assert!(table.contains("tpot_mean"));
}

/// The settings a row does not record, which `sim calibrate --observed` chooses per
/// campaign, do to a closed loop what they say: on three TensorRT-LLM rows at 8 clients, a
/// held slot makes one request wait for another to finish (TTFT grows by about an eighth
/// of a request's duration, TPOT hardly moves), a pool of 100 prompts drawn with
/// replacement lets the prefix cache serve the repeats (TTFT falls), a step of one prompt
/// changes only the rows whose budget held two (1,024-token prompts, not 2,048), and a
/// campaign's serial front end caps the tokens delivered (8 updates of 5 ms a step: TPOT
/// at least 40 ms).
#[test]
fn unrecorded_settings_move_a_closed_loop_as_they_say() {
    use sim::cost_model::validation::silicon::{silicon_checks_with, EngineCost, Unrecorded};
    let rows =
        observed::silicon::read(Path::new("tests/data/observed/silicon-small.csv")).expect("rows");
    let rows = &rows[..3];
    let under_cost = |cost: EngineCost| {
        let (checks, skipped) = silicon_checks_with(rows, None, &|_, _| cost).expect("simulated");
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(checks.len(), 3);
        checks
    };
    let under = |unrecorded: Unrecorded| {
        under_cost(EngineCost {
            unrecorded,
            ..Default::default()
        })
    };
    let recorded = under(Unrecorded::AsRecorded);
    let held = under(Unrecorded::HeldSlot);
    let pooled = under(Unrecorded::PromptPool);
    for ((r, h), p) in recorded.iter().zip(&held).zip(&pooled) {
        let clients = f64::from(r.row.batch_size.expect("clients"));
        let duration = r.ttft_ms + f64::from(r.row.osl - 1) * r.tpot_ms;
        let wait = (h.ttft_ms - r.ttft_ms) / (duration / clients);
        assert!(
            (0.4..1.6).contains(&wait),
            "{wait} of a request's share: {r:?} {h:?}"
        );
        assert!((h.tpot_ms / r.tpot_ms - 1.0).abs() < 0.1, "{r:?} {h:?}");
        assert!(p.ttft_ms < r.ttft_ms * 0.95, "{r:?} {p:?}");
    }
    let one = under(Unrecorded::OnePrompt);
    for (r, o) in recorded.iter().zip(&one) {
        let two_fit = 2 * r.row.isl <= r.row.isl + 1500;
        assert_eq!(o.ttft_ms != r.ttft_ms, two_fit, "{r:?} {o:?}");
    }
    let fronted = under_cost(EngineCost {
        frontend_update_us: Some(5000.0),
        ..Default::default()
    });
    for (r, f) in recorded.iter().zip(&fronted) {
        assert!(r.tpot_ms < 40.0 && f.tpot_ms >= 40.0 * 0.95, "{r:?} {f:?}");
    }
    let names: Vec<&str> = Unrecorded::ALL.iter().map(|u| u.name()).collect();
    assert_eq!(
        names,
        ["as-recorded", "held-slot", "prompt-pool", "one-prompt"]
    );
}

/// SGLang's prefill batches run alone and first: with aiperf's fixed lengths the clients stay
/// in step, each wave's prefills queue behind one another, and TTFT grows with the clients.
/// Uncalibrated, three measured deployments (Qwen3-32B on 8 H100s, 16, 64 and 128 clients,
/// 1,024 prompt and 256 output tokens) come out within 35% on TTFT and 25% on TPOT; with
/// InferenceX's random lengths instead (clients drifting apart) the same rows would queue
/// far less and TTFT would be under half.
#[test]
fn sglang_waves_queue_their_prefills() {
    use sim::cost_model::validation::silicon::silicon_checks;
    use sim::observed::silicon::BenchClient;
    let rows =
        observed::silicon::read(Path::new("tests/data/observed/silicon-sglang.csv")).expect("rows");
    assert!(rows.iter().all(|r| r.client == BenchClient::Aiperf));
    let (checks, skipped) = silicon_checks(&rows, None).expect("simulated");
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(checks.len(), 3);
    for c in &checks {
        assert!(
            c.ttft_error().abs() < 0.35 && c.tpot_error().abs() < 0.25,
            "{}: TTFT {:.0} vs {:.0} ms, TPOT {:.1} vs {:.1} ms",
            c.row.id,
            c.ttft_ms,
            c.row.ttft_ms,
            c.tpot_ms,
            c.row.tpot_ms
        );
    }
    assert!(checks[0].ttft_ms < checks[1].ttft_ms && checks[1].ttft_ms < checks[2].ttft_ms);
    let drifted: Vec<_> = rows
        .iter()
        .cloned()
        .map(|mut r| {
            r.client = BenchClient::InferenceX;
            r
        })
        .collect();
    let (apart, _) = silicon_checks(&drifted, None).expect("simulated");
    for (a, b) in checks.iter().zip(&apart) {
        assert!(
            b.ttft_ms < 0.5 * a.ttft_ms,
            "{}: {:.0} ms in step, {:.0} ms apart",
            a.row.id,
            a.ttft_ms,
            b.ttft_ms
        );
    }
}

/// A shipped fit file's text, its table and its `[fit]` record, after checking that the
/// `.rows.csv` beside it lists as many rows as its header says it fitted (the number just
/// before `marker`).
fn shipped_fit(
    path: &Path,
    marker: &str,
) -> (
    String,
    toml::Table,
    sim::cost_model::calibration::uncertainty::FitRecord,
) {
    let text = std::fs::read_to_string(path).expect("shipped fit");
    let table: toml::Table = toml::from_str(&text).expect("calibration file parses");
    let record = sim::cost_model::calibration::uncertainty::FitRecord::from_file_table(&table)
        .expect("valid [fit]")
        .expect("[fit] present");
    let rows = std::fs::read_to_string(path.with_extension("rows.csv")).expect("rows file");
    let fitted = text
        .split(marker)
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .expect("the header counts the rows");
    assert_eq!(rows.lines().count(), fitted + 1, "{}", path.display());
    (text, table, record)
}

/// The cost terms a scenario of `model` in `dtype` over 8 `gpu`s runs with under the
/// calibration file `path` (its `[cost.by_gpu]` entry for that GPU applied, with its
/// `experts` terms for that format), and whether it carries the file's `[fit]`.
fn calibrated_cost(
    model: &str,
    dtype: sim::catalog::Dtype,
    gpu: &str,
    path: &Path,
) -> (sim::cost_model::CostParams, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("s.toml");
    std::fs::write(
        &scenario,
        format!(
            "name = \"calibrated\"\n[model]\nname = \"{model}\"\ndtype = \"{}\"\n[hardware]\ngpu = \"{gpu}\"\ntp = 8\n[cost]\ncalibration = {:?}\n[workload]\nnum_requests = 4\narrival = {{ process = \"closed-loop\", concurrency = 4 }}\n[[workload.class]]\nname = \"fixed\"\nprompt = {{ dist = \"fixed\", value = 1024 }}\noutput = {{ dist = \"fixed\", value = 64 }}\n",
            dtype.as_str(),
            std::path::absolute(path).expect("path").display().to_string()
        ),
    )
    .expect("write");
    let scn = sim::scenario::Scenario::load(&scenario, None).expect("scenario");
    let v = &scn.variants[0];
    (
        v.config.cost.on_deployment(
            gpu,
            dtype,
            sim::catalog::find_model(model).and_then(sim::cost_model::ExpertShape::of),
        ),
        v.fit.is_some(),
    )
}

/// The engines' mixture-of-experts fits ship as calibration files: each sets the engine's
/// grouped-GEMM efficiency, prefill floor and compute side's efficiency on the GPUs it
/// fitted (for every expert format there, or per format where they parted, or per experts'
/// shape of a format where those parted), which a scenario of a mixture of experts on that
/// GPU in that format and of that shape then runs with, records its
/// five folds for `sim run`'s bands, and lists every row it held out.
#[test]
fn shipped_moe_engine_fits_set_each_gpus_expert_kernels() {
    use sim::catalog::Dtype;
    // A model of each expert format the rows have, and of each experts' shape in fp8 and
    // fp4 (DeepSeek's 7168x2048, Qwen3-235B's 4096x1536, gpt-oss's 2880x2880).
    let models = [
        ("bf16", "qwen3-30b-a3b", Dtype::Bf16),
        ("fp8", "qwen3-235b-a22b", Dtype::Fp8Block),
        ("fp8", "deepseek-r1", Dtype::Fp8Block),
        ("fp4", "gpt-oss-120b", Dtype::Mxfp4),
        ("fp4", "deepseek-r1", Dtype::Nvfp4),
    ];
    for engine in ["sglang", "trtllm", "vllm"] {
        let path = PathBuf::from(format!("calibration/observed-moe-{engine}.toml"));
        let (_, table, record) = shipped_fit(&path, " mixture-of-experts rows of ");
        assert_eq!(record.folds.len(), 5, "{}", path.display());
        let by_gpu = table["cost"].get("by_gpu").and_then(|v| v.as_table());
        for (gpu, keys) in by_gpu.into_iter().flatten() {
            let keys = keys.as_table().expect("a GPU's entry is a table");
            let experts = keys.get("experts").and_then(|v| v.as_table());
            let key = |t: &toml::Table, k: &str| t.get(k).and_then(|v| v.as_float());
            let own =
                ["moe_gemm_eff", "moe_prefill_expert_us", "moe_compute_eff"].map(|k| key(keys, k));
            assert!(
                own.iter().any(Option::is_some) || experts.is_some_and(|e| !e.is_empty()),
                "{engine} {gpu}: no key"
            );
            // Every format entry is one checked below, and sets a term.
            for (format, terms) in experts.into_iter().flatten() {
                assert!(
                    models.iter().any(|m| m.0 == format),
                    "{engine} {gpu}: format {format}"
                );
                assert!(
                    terms.as_table().is_some_and(|t| !t.is_empty()),
                    "{engine} {gpu} {format}: no key"
                );
            }
            for (format, model, dtype) in models {
                if model == "deepseek-r1" && gpu == "h100-sxm" {
                    // 671 GB of fp8 weights do not fit 8 H100s (nor did any row run there).
                    continue;
                }
                let set = experts
                    .and_then(|e| e.get(format))
                    .and_then(|v| v.as_table());
                // The model's shape's entry, over its format's, over the GPU's own.
                let shape = sim::catalog::find_model(model)
                    .and_then(sim::cost_model::ExpertShape::of)
                    .expect("a mixture of experts")
                    .name();
                let shaped = set
                    .and_then(|t| t.get("shapes"))
                    .and_then(|v| v.as_table())
                    .and_then(|t| t.get(&shape))
                    .and_then(|v| v.as_table());
                let term = |i: usize, k: &str| {
                    shaped
                        .and_then(|t| key(t, k))
                        .or(set.and_then(|t| key(t, k)))
                        .or(own[i])
                };
                let (there, fit) = calibrated_cost(model, dtype, gpu, &path);
                let shared = sim::cost_model::CostParams::default();
                let what = format!("{engine} {gpu} {format} {shape}");
                assert_eq!(
                    there.moe_gemm_eff,
                    term(0, "moe_gemm_eff").unwrap_or(shared.moe_gemm_eff),
                    "{what}"
                );
                assert_eq!(
                    there.moe_prefill_expert_us,
                    term(1, "moe_prefill_expert_us").unwrap_or(shared.moe_prefill_expert_us),
                    "{what}"
                );
                assert_eq!(there.moe_compute_eff, term(2, "moe_compute_eff"), "{what}");
                assert!(fit);
            }
        }
    }
}

/// The engines' dense fits ship as calibration files: each sets the engine's fp8, NVFP4 and
/// all-reduce efficiencies on the GPUs it fitted them for (a scenario of a dense model on
/// that GPU then runs with them, the shared defaults elsewhere), records its five folds for
/// `sim run`'s bands (none where it kept the defaults), and lists every row it held out.
#[test]
fn shipped_engine_fits_set_each_gpus_kernels() {
    for engine in ["sglang", "trtllm", "vllm"] {
        let path = PathBuf::from(format!("calibration/observed-{engine}.toml"));
        let (text, table, record) = shipped_fit(&path, " measured closed-loop deployments of ");
        let kept = text.contains("lost to the defaults held out");
        assert_eq!(record.folds.len(), if kept { 0 } else { 5 }, "{engine}");
        let by_gpu = table["cost"].get("by_gpu").and_then(|v| v.as_table());
        for (gpu, keys) in by_gpu.into_iter().flatten() {
            let key = |k: &str| keys.get(k).and_then(|v| v.as_float());
            let (fp8, fp4, allreduce) = (
                key("fp8_compute_eff"),
                key("fp4_compute_eff"),
                key("allreduce_eff"),
            );
            assert!(
                fp8.is_some() || fp4.is_some() || allreduce.is_some(),
                "{engine} {gpu}: no key"
            );
            let (there, fit) =
                calibrated_cost("llama-3.1-70b", sim::catalog::Dtype::Bf16, gpu, &path);
            let shared = sim::cost_model::CostParams::default();
            for (got, set, default) in [
                (there.fp8_compute_eff, fp8, shared.fp8_compute_eff),
                (there.fp4_compute_eff, fp4, shared.fp4_compute_eff),
            ] {
                assert_eq!(got, set.unwrap_or(default), "{engine} {gpu}");
            }
            if allreduce.is_some() {
                assert_eq!(there.allreduce_eff, allreduce, "{engine} {gpu}");
            }
            assert!(fit || kept);
        }
        // A GPU the file does not name runs with the shared efficiencies.
        let shared = sim::cost_model::CostParams::default();
        for gpu in ["h100-sxm", "h200", "b200", "gb200"] {
            if by_gpu.is_some_and(|t| t.contains_key(gpu)) {
                continue;
            }
            let (there, _) =
                calibrated_cost("llama-3.1-70b", sim::catalog::Dtype::Bf16, gpu, &path);
            assert_eq!(
                (there.fp8_compute_eff, there.fp4_compute_eff),
                (shared.fp8_compute_eff, shared.fp4_compute_eff),
                "{engine} {gpu}"
            );
        }
    }
}
