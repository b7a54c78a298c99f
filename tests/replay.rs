//! `sim replay` on the LLMServingSim vLLM runs carried in `calibration/serving/`: the
//! scenario it builds (deployment, the engine's KV blocks, every request at its send time)
//! and its figures. The cost model's defaults were not fitted to these runs, so they are
//! held-out checks; VALIDATION.md lists every figure.

use std::path::Path;

use sim::driver::DriverKind;
use sim::replay::{replay, ProfileChoice, Replay, ReplayOptions};

fn run(dir: &str, out: &Path) -> Replay {
    run_with(dir, out, ProfileChoice::Off)
}

fn run_with(dir: &str, out: &Path, profiles: ProfileChoice) -> Replay {
    let observed = sim::observed::open(Path::new(dir)).unwrap_or_else(|e| panic!("{e}"));
    let opts = ReplayOptions {
        out_dir: out.to_path_buf(),
        calibration: None,
        model: None,
        gpu: None,
        gpu_file: None,
        driver: DriverKind::Inline,
        profiles,
    };
    replay(&observed, &opts).unwrap_or_else(|e| panic!("{e}"))
}

/// The figures issue 17 holds each LLMServingSim replay to (within 10% of measured).
const ISSUE_METRICS: [&str; 5] = [
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "tpot_mean_ms",
    "e2el_mean_ms",
];

fn error(r: &Replay, metric: &str) -> f64 {
    r.figure(metric)
        .unwrap_or_else(|| panic!("{metric}"))
        .error_pct()
        .expect("measured")
}

#[test]
fn llama_8b_on_rtx_pro_6000_replays_within_ten_percent() {
    let out = tempfile::tempdir().expect("tempdir");
    let r = run(
        "calibration/serving/llmservingsim/RTXPRO6000/Llama-3.1-8B",
        out.path(),
    );
    assert_eq!(r.requests, 300);
    assert_eq!(r.deployment, "llama-3.1-8b on 1 x rtx-pro-6000");
    // The issue-17 bar, met before any fitting to real runs.
    for m in ISSUE_METRICS {
        let e = error(&r, m);
        assert!(e.abs() < 10.0, "{m}: {e:+.1}%");
    }
    // The replay's files: its scenario runs again with `sim run`, its trace holds every
    // request at its send time.
    let trace = std::fs::read_to_string(out.path().join("trace.csv")).expect("trace");
    assert_eq!(trace.lines().count(), 301);
    assert!(trace
        .lines()
        .nth(1)
        .expect("row")
        .starts_with("0.000000000,"));
    let html = std::fs::read_to_string(out.path().join("replay.html")).expect("replay.html");
    assert_eq!(html.matches("<svg").count(), 3, "TTFT, TPOT and E2EL CDFs");
    assert!(html.contains("measured") && html.contains("simulated"));
    let csv = std::fs::read_to_string(out.path().join("replay.csv")).expect("replay.csv");
    assert!(csv.starts_with("metric,measured,simulated,error_pct\nttft_mean_ms,"));
}

/// The RTX 4090 run priced from LLMServingSim's operator profile of the same model on the
/// same GPU (found beside the runs): every latency the issue names within 10% of vLLM's,
/// where the roofline's datasheet peaks miss by over 20% (this card's bf16 GEMMs run at its
/// datasheet peak, above the roofline's 75%). The profile times operators, not this run, so
/// the figures are held out.
#[test]
fn the_rtx_4090_run_replays_within_ten_percent_from_its_operator_profile() {
    let out = tempfile::tempdir().expect("tempdir");
    let dir = "calibration/serving/llmservingsim/RTX4090/Llama-3.1-8B";
    let r = run_with(dir, &out.path().join("profiled"), ProfileChoice::Auto);
    let profile = r.profile.as_ref().expect("the profile beside the runs");
    assert!(
        profile.ends_with("profiles/RTX4090/meta-llama/Llama-3.1-8B/bf16"),
        "{profile:?}"
    );
    let text = std::fs::read_to_string(out.path().join("profiled/replay.toml")).expect("toml");
    assert!(text.contains("operator_profile = "), "{text}");
    let roofline = run_with(dir, &out.path().join("roofline"), ProfileChoice::Off);
    assert!(roofline.profile.is_none());
    for m in ISSUE_METRICS {
        let (e, e0) = (error(&r, m), error(&roofline, m));
        assert!(
            e.abs() < 10.0 && e.abs() < e0.abs(),
            "{m}: {e:+.1}% (roofline {e0:+.1}%)"
        );
    }
}

/// The Qwen3-30B-A3B run (two RTX PRO 6000s, data parallel 2 with expert parallelism)
/// priced from its operator profile, experts from the profile's `moe.csv`: both
/// data-parallel ranks are engines of a one-replica fleet, stepping in lockstep behind vLLM's
/// least-loaded balancing, their all-to-alls over the link the run's cluster description
/// gives (16 GB/s, 20 us). TPOT and E2EL land within 5% of vLLM's, throughput too; TTFT,
/// mostly queueing in a run near saturation, within 15% (issue 18's bar; on the roofline,
/// whose fitted MoE floors make every prefilling step slow, it is nearly three times the
/// measured). Nothing was fitted to this run.
#[test]
fn the_mixture_of_experts_run_replays_from_its_operator_profile_with_both_ranks() {
    let out = tempfile::tempdir().expect("tempdir");
    let dir = "calibration/serving/llmservingsim/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507";
    let r = run_with(dir, out.path(), ProfileChoice::Auto);
    assert_eq!(r.requests, 300);
    let profile = r.profile.as_ref().expect("the profile beside the runs");
    assert!(
        profile.ends_with("profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"),
        "{profile:?}"
    );
    let text = std::fs::read_to_string(out.path().join("replay.toml")).expect("toml");
    assert!(text.contains("[cluster.pools.ranks]"), "{text}");
    assert!(text.contains("routing = \"least-outstanding\""), "{text}");
    for m in ["tpot_mean_ms", "e2el_mean_ms", "throughput_rps"] {
        let e = error(&r, m);
        assert!(e.abs() < 5.0, "{m}: {e:+.1}%");
    }
    let e = error(&r, "ttft_mean_ms");
    assert!(e.abs() < 15.0, "ttft_mean_ms: {e:+.1}%");
    assert!(text.contains("allreduce_eff = 0.250000"), "{text}");
}

/// The Qwen3-32B TP2 run priced from its operator profile, its all-reduces over the link the
/// run's cluster description gives (16 GB/s and 20 us: PCIe between the two cards, a quarter
/// of the catalog's datasheet 64 GB/s): every figure issue 17 names within 10% (on the
/// datasheet link it was 25% fast).
#[test]
fn the_tensor_parallel_run_replays_within_ten_percent_over_its_described_link() {
    let out = tempfile::tempdir().expect("tempdir");
    let dir = "calibration/serving/llmservingsim/RTXPRO6000/Qwen3-32B";
    let r = run_with(dir, out.path(), ProfileChoice::Auto);
    let text = std::fs::read_to_string(out.path().join("replay.toml")).expect("toml");
    assert!(text.contains("allreduce_latency_us = 20"), "{text}");
    for m in ISSUE_METRICS {
        let e = error(&r, m);
        assert!(e.abs() < 10.0, "{m}: {e:+.1}%");
    }
}

/// A profile beside the run that cannot price it (here a mixture of experts' profile
/// without its `moe.csv`) is not an error when the replay found it itself: the roofline
/// prices the steps, and the replay says why.
#[test]
fn a_profile_found_beside_a_run_that_cannot_price_it_falls_back_to_the_roofline() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path();
    let copy_dir = |from: &Path, to: &Path, skip: &[&str]| {
        for entry in walk(from) {
            let rel = entry.strip_prefix(from).expect("under");
            if skip.iter().any(|s| rel.ends_with(s)) {
                continue;
            }
            let dest = to.join(rel);
            std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
            std::fs::copy(&entry, &dest).expect("copy");
        }
    };
    let run = "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507";
    let profile = "profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507";
    let base = Path::new("calibration/serving/llmservingsim");
    copy_dir(&base.join(run), &root.join(run), &[]);
    copy_dir(&base.join(profile), &root.join(profile), &["moe.csv"]);
    let out = root.join("out");
    let r = run_with(
        root.join(run).to_str().expect("utf-8"),
        &out,
        ProfileChoice::Auto,
    );
    assert!(r.profile.is_none());
    let note = r.note.as_deref().expect("a note");
    assert!(note.contains("no moe.csv"), "{note}");
    let text = std::fs::read_to_string(out.join("replay.toml")).expect("toml");
    assert!(!text.contains("operator_profile"), "{text}");
    assert!(error(&r, "tpot_mean_ms").is_finite());
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn the_rtx_4090_run_replays_with_the_kv_blocks_vllm_allocated() {
    let out = tempfile::tempdir().expect("tempdir");
    let r = run(
        "calibration/serving/llmservingsim/RTX4090/Llama-3.1-8B",
        out.path(),
    );
    let kv = r.figure("kv_blocks").expect("kv_blocks");
    assert_eq!(kv.measured, 2588.0);
    // The memory plan's own prediction, with the reserve fitted to this count (in-sample:
    // the one run that records its blocks), is within 2% of vLLM's.
    assert!((kv.simulated - 2588.0).abs() <= 0.02 * 2588.0, "{kv:?}");
    // The replay holds vLLM's 2,588 blocks, with the reserve they imply.
    let reserve = r.reserve_gib.expect("reserve");
    assert!((0.6..0.72).contains(&reserve), "{reserve}");
    let text = std::fs::read_to_string(out.path().join("replay.toml")).expect("toml");
    assert!(text.contains("num_gpu_blocks_override = 2588"), "{text}");
    let scn = sim::scenario::Scenario::load(&out.path().join("replay.toml"), None).expect("loads");
    assert_eq!(scn.variants[0].memory.num_blocks, 2588);
    assert!(error(&r, "ttft_mean_ms").is_finite());
}

/// A vLLM bench run saved before vLLM 0.15 has no `start_times`. At request rate `inf` the
/// client sent every request at once under its `max_concurrency`, which the replay does; at
/// a finite rate the sends are re-drawn from its rate and burstiness. Either way the replay
/// says so, and its measured throughput is the run's own (`duration`). Without a rate
/// there is nothing to go on: one line saying so.
#[test]
fn vllm_bench_runs_without_send_times_replay_from_their_settings() {
    let text = std::fs::read_to_string("tests/data/observed/vllm_bench.json").expect("fixture");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json.as_object_mut().expect("object").remove("start_times");
    let dir = tempfile::tempdir().expect("tempdir");
    let replay_of = |json: &serde_json::Value, name: &str| {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, json.to_string()).expect("write");
        let observed = sim::observed::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let opts = ReplayOptions {
            out_dir: dir.path().join(name),
            calibration: None,
            model: Some("llama-3.1-8b".into()),
            gpu: Some("h100-sxm".into()),
            gpu_file: None,
            driver: DriverKind::Inline,
            profiles: ProfileChoice::Auto,
        };
        replay(&observed, &opts)
    };
    let r = replay_of(&json, "inf").unwrap_or_else(|e| panic!("{e}"));
    let note = r.note.as_deref().expect("a note");
    assert!(note.contains("at most 2 in flight"), "{note}");
    assert_eq!(r.requests, 2);
    // The fixture's duration is 1.9 s for its 2 successful requests.
    let tput = r.figure("throughput_rps").expect("throughput");
    assert!((tput.measured - 2.0 / 1.9).abs() < 1e-9, "{tput:?}");
    let scenario = std::fs::read_to_string(dir.path().join("inf/replay.toml")).expect("scenario");
    assert!(scenario.contains("max_in_flight = 2"), "{scenario}");

    // Without the run's duration there is no measured throughput to set against.
    let mut no_duration = json.clone();
    no_duration
        .as_object_mut()
        .expect("object")
        .remove("duration");
    let r = replay_of(&no_duration, "no-duration").unwrap_or_else(|e| panic!("{e}"));
    assert!(r.figure("throughput_rps").is_none());

    json["request_rate"] = serde_json::json!(4.0);
    json["burstiness"] = serde_json::json!(0.5);
    let r = replay_of(&json, "rate").unwrap_or_else(|e| panic!("{e}"));
    assert!(r.note.expect("a note").contains("re-drawn at its 4 req/s"));

    json.as_object_mut().expect("object").remove("request_rate");
    let e = replay_of(&json, "none").expect_err("no rate, no send times");
    assert!(e.to_string().contains("no request_rate"), "{e}");
}

/// A `sim run` of whole prompts (`enable_chunked_prefill = false`) replays as one: the
/// replay's scenario keeps the setting (plan.json records it).
#[test]
fn a_run_without_chunked_prefill_replays_without_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scn =
        sim::scenario::Scenario::load(Path::new("scenarios/mixed.toml"), None).expect("loads");
    let opts = sim::run::RunOptions {
        out_dir: Some(dir.path().join("run")),
        driver: DriverKind::Inline,
        only: vec!["whole-prompts".into()],
        requests: Some(200),
        ..sim::run::RunOptions::default()
    };
    sim::run::run_scenario(&scn, &opts).expect("runs");
    let run = dir.path().join("run").join("whole-prompts");
    let observed = sim::observed::open(&run).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(observed.engine.chunked_prefill, Some(false));
    let out = dir.path().join("replay");
    let opts = ReplayOptions {
        out_dir: out.clone(),
        calibration: None,
        model: None,
        gpu: None,
        gpu_file: None,
        driver: DriverKind::Inline,
        profiles: ProfileChoice::Off,
    };
    replay(&observed, &opts).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(out.join("replay.toml")).expect("replay.toml");
    assert!(text.contains("enable_chunked_prefill = false"), "{text}");
}

/// An aiperf artifact folder (`profile_export.jsonl` and `profile_export_aiperf.json`)
/// replays as the closed loop its settings name: every profiling record a request, the
/// model from the settings, the GPU given. Records that name their dataset entry
/// (`conversation_id`) replay with that entry's prompt, so repeats hit the prefix cache and
/// the simulated TTFT falls; without the ids every prompt is its own.
#[test]
fn an_aiperf_run_replays_as_its_closed_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let replay_of = |ids: bool| {
        let run_dir = dir.path().join(format!("artifacts-{ids}"));
        std::fs::create_dir_all(&run_dir).expect("mkdir");
        let mut records = String::new();
        // 4 clients, 3 rounds each, 2,048-token prompts from 3 entries and 64-token
        // answers; written as they ended (round by round, the clients' order reversed).
        for round in 0..3u64 {
            for client in (0..4u64).rev() {
                let start = 1_700_000_000_000_000_000 + round * 900_000_000 + client * 1_000_000;
                let conversation = if ids {
                    format!("\"conv-{}\"", (round * 4 + client) % 3)
                } else {
                    "null".into()
                };
                records.push_str(&format!(
                    "{{\"metadata\": {{\"session_num\": {}, \"conversation_id\": {conversation}, \"request_start_ns\": {start}, \"benchmark_phase\": \"profiling\", \"was_cancelled\": false}}, \"metrics\": {{\"input_sequence_length\": {{\"value\": 2048, \"unit\": \"tokens\"}}, \"output_sequence_length\": {{\"value\": 64, \"unit\": \"tokens\"}}, \"time_to_first_token\": {{\"value\": 45.0, \"unit\": \"ms\"}}, \"request_latency\": {{\"value\": 650.0, \"unit\": \"ms\"}}}}, \"error\": null}}\n",
                    round * 4 + client
                ));
            }
        }
        std::fs::write(run_dir.join("profile_export.jsonl"), records).expect("write");
        std::fs::write(
            run_dir.join("profile_export_aiperf.json"),
            "{\"input_config\": {\"endpoint\": {\"model_names\": [\"meta-llama/Llama-3.1-8B-Instruct\"]}, \"loadgen\": {\"concurrency\": 4, \"request_count\": 12}}}",
        )
        .expect("write");
        let observed = sim::observed::open(&run_dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(observed.format, "aiperf");
        assert_eq!(observed.requests.len(), 12);
        let out = dir.path().join(format!("replay-{ids}"));
        let opts = ReplayOptions {
            out_dir: out.clone(),
            calibration: None,
            model: None,
            gpu: Some("h100-sxm".into()),
            gpu_file: None,
            driver: DriverKind::Inline,
            profiles: ProfileChoice::Auto,
        };
        let r = replay(&observed, &opts).unwrap_or_else(|e| panic!("{e}"));
        (r, out)
    };
    let (unique, out) = replay_of(false);
    assert_eq!(unique.requests, 12);
    let note = unique.note.as_deref().expect("a note");
    assert!(note.contains("a closed loop of 4 clients"), "{note}");
    assert!(out.join("trace.csv").is_file());
    let ttft = unique.figure("ttft_mean_ms").expect("ttft");
    assert!((ttft.measured - 45.0).abs() < 1e-9, "{ttft:?}");
    let (pooled, out) = replay_of(true);
    let trace = std::fs::read_to_string(out.join("trace.jsonl")).expect("trace");
    let ids: std::collections::HashSet<&str> = trace
        .lines()
        .map(|l| &l[l.find("hash_ids").expect("ids")..])
        .collect();
    assert_eq!((trace.lines().count(), ids.len()), (12, 3));
    let cached = pooled.figure("ttft_mean_ms").expect("ttft").simulated;
    assert!(
        cached < 0.8 * ttft.simulated,
        "with the entries {cached} ms, unique {} ms",
        ttft.simulated
    );
}

/// `sim calibrate --observed` on runs: two runs made by the simulator under known terms
/// (aiperf exports at 4 and 8 req/s whose latencies are a replay's under a slow GEMM, a
/// large step overhead and a front end of 20 ms) are fitted back. The replay under the
/// defaults misses them by far (over 30% on mean TTFT); the fit's held-out replays, each
/// fifth of a run's requests predicted by the fit on the other four fifths of both runs, and
/// each run predicted by the fit on the other, land within 3% on every figure. The GEMMs'
/// compute efficiency and the front end come back exactly; the step overhead trades with the
/// weights' streaming efficiency (both a fixed cost per decode step at these loads).
#[test]
fn calibrating_to_runs_made_under_known_terms_recovers_them() {
    use sim::cost_model::calibration::replayed::{fit_runs, Figures, FitOptions, FitRun};
    let dir = tempfile::tempdir().expect("tempdir");
    let write_run = |run_dir: &Path, gap_ms: u64, latencies: &[(f64, f64)]| {
        std::fs::create_dir_all(run_dir).expect("mkdir");
        let mut records = String::new();
        for (i, (ttft, latency)) in latencies.iter().enumerate() {
            let i = i as u64;
            let start = 1_700_000_000_000_000_000 + i * gap_ms * 1_000_000;
            let (isl, osl) = (200 + (i * 397) % 3000, 16 + (i * 53) % 180);
            records.push_str(&format!(
                "{{\"metadata\": {{\"session_num\": {i}, \"request_start_ns\": {start}, \"benchmark_phase\": \"profiling\", \"was_cancelled\": false}}, \"metrics\": {{\"input_sequence_length\": {{\"value\": {isl}, \"unit\": \"tokens\"}}, \"output_sequence_length\": {{\"value\": {osl}, \"unit\": \"tokens\"}}, \"time_to_first_token\": {{\"value\": {ttft}, \"unit\": \"ms\"}}, \"request_latency\": {{\"value\": {latency}, \"unit\": \"ms\"}}}}, \"error\": null}}\n"
            ));
        }
        std::fs::write(run_dir.join("profile_export.jsonl"), records).expect("write");
        std::fs::write(
            run_dir.join("profile_export_aiperf.json"),
            format!("{{\"input_config\": {{\"endpoint\": {{\"model_names\": [\"meta-llama/Llama-3.1-8B-Instruct\"]}}, \"loadgen\": {{\"request_rate\": {}, \"request_count\": 60}}}}}}", 1000.0 / gap_ms as f64),
        )
        .expect("write");
    };
    let opts = |out: &Path, calibration: Option<std::path::PathBuf>| ReplayOptions {
        out_dir: out.to_path_buf(),
        calibration,
        model: None,
        gpu: Some("h100-sxm".into()),
        gpu_file: None,
        driver: DriverKind::Inline,
        profiles: ProfileChoice::Off,
    };
    let truth_cost = dir.path().join("truth.toml");
    std::fs::write(
        &truth_cost,
        "[cost]\ngemm_compute_eff = 0.55\nstep_overhead_us = 2000.0\nrequest_overhead_ms = 20.0\n",
    )
    .expect("write");
    // A run at one request every `gap_ms`: placeholder latencies, replayed under the known
    // terms, and the replay's latencies written as the measured ones.
    let truth_run = |name: &str, gap_ms: u64| {
        let placeholder = dir.path().join(format!("{name}-placeholder"));
        write_run(&placeholder, gap_ms, &[(1.0, 10.0); 60]);
        let observed = sim::observed::open(&placeholder).expect("run");
        let truth_out = dir.path().join(format!("{name}-truth"));
        replay(&observed, &opts(&truth_out, Some(truth_cost.clone()))).expect("replay");
        let sim_csv =
            std::fs::read_to_string(truth_out.join("sim/base/requests.csv")).expect("csv");
        let mut latencies = vec![(0.0, 0.0); 60];
        let mut lines = sim_csv.lines();
        let header: Vec<&str> = lines.next().expect("header").split(',').collect();
        let col = |n: &str| header.iter().position(|c| *c == n).expect(n);
        let (id, ttft, e2el) = (col("request_id"), col("ttft_ms"), col("e2el_ms"));
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            let i: usize = f[id].parse().expect("id");
            latencies[i] = (
                f[ttft].parse().expect("ttft"),
                f[e2el].parse().expect("e2el"),
            );
        }
        assert!(
            latencies.iter().all(|&(t, e)| t > 20.0 && e > t),
            "{latencies:?}"
        );
        let measured_dir = dir.path().join(name);
        write_run(&measured_dir, gap_ms, &latencies);
        FitRun {
            name: name.into(),
            run: sim::observed::open(&measured_dir).expect("run"),
        }
    };
    let runs = [truth_run("at-4", 250), truth_run("at-8", 125)];
    let scratch = dir.path().join("scratch");
    let fit = fit_runs(
        ("llama-3.1-8b", "h100-sxm"),
        &runs,
        &FitOptions {
            scratch: scratch.clone(),
            replay: opts(dir.path(), None),
            folds: 5,
            base: toml::Table::new(),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!scratch.exists(), "the candidates' replays are removed");
    let err = |sim: f64, measured: f64| (sim / measured - 1.0).abs();
    for r in &fit.runs {
        // The defaults miss the slow GEMMs, the step overhead and the front end.
        assert!(
            err(r.defaults.ttft_mean, r.measured.ttft_mean) > 0.3,
            "{:?} vs {:?}",
            r.defaults,
            r.measured
        );
        let other = r.other_runs.expect("held out by run");
        for (i, name) in Figures::NAMES.iter().enumerate() {
            let m = r.measured.values()[i];
            for (how, v) in [("time", r.held_out.values()[i]), ("run", other.values()[i])] {
                assert!(
                    err(v, m) < 0.03,
                    "{}: {name} held out by {how}: {v} vs {m}\n{}",
                    r.name,
                    fit.table()
                );
            }
        }
    }
    assert_eq!(
        fit.fit.get("request_overhead_ms"),
        Some(&20.0),
        "{:?}",
        fit.fit
    );
    assert_eq!(
        fit.fit.get("gemm_compute_eff"),
        Some(&0.55),
        "{:?}",
        fit.fit
    );
    assert_eq!((fit.folds.len(), fit.run_folds.len()), (5, 2));
    // The file is a calibration file a replay reads.
    let file = dir.path().join("replayed.toml");
    std::fs::write(&file, fit.toml("runs").expect("toml")).expect("write");
    let again = replay(&runs[0].run, &opts(&dir.path().join("again"), Some(file))).expect("replay");
    let e = again
        .figure("ttft_mean_ms")
        .expect("ttft")
        .error_pct()
        .expect("pct");
    assert!(e.abs() < 3.0, "{e}%");
}
