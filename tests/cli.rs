//! The `sim` binary on good and bad input: bad input gives one line naming the file and
//! the key or line, exit code 2, and never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .output()
        .expect("run the sim binary")
}

/// Runs `sim` with `args`, checks that it succeeded and returns its stdout.
fn sim_ok(args: &[&str]) -> String {
    let out = sim(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write fixture");
    p
}

const GOOD: &str = r#"
name = "tiny"
[model]
name = "llama-3-8b"
[hardware]
gpu = "h100-sxm"
[engine]
scheduler = "chunked"
[workload]
num_requests = 50
arrival = { process = "poisson", rate = 5.0 }
[[workload.class]]
name = "chat"
prompt = { dist = "uniform", min = 10, max = 200 }
output = { dist = "fixed", value = 20 }
[[variant]]
name = "static"
engine.scheduler = "static"
[[variant]]
name = "chunked"
"#;

/// Runs `sim validate` on `text` and returns (exit code, stderr).
fn validate(text: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "scenario.toml", text);
    let out = sim(&["validate", p.to_str().expect("utf-8 path")]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn assert_bad(text: &str, needles: &[&str]) {
    let (code, err, _) = validate(text);
    assert_eq!(code, Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("scenario.toml"), "names the file: {err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

#[test]
fn validate_prints_the_memory_plan() {
    let (code, err, out) = validate(GOOD);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "weights / GPU    16.06 GB",
        "KV per token     131072 bytes",
        "blocks x 16 tokens",
        "max concurrency",
        "variant `static`",
        "variant `chunked`",
    ] {
        assert!(out.contains(needle), "`{needle}` missing:\n{out}");
    }
}

#[test]
fn malformed_toml_names_the_line() {
    assert_bad(
        &GOOD.replace("num_requests = 50", "num_requests = = 50"),
        &["line 10", "extra `=`"],
    );
}

#[test]
fn unknown_key_is_rejected() {
    assert_bad(
        &GOOD.replace("scheduler = \"chunked\"", "schedular = \"chunked\""),
        &["unknown field `schedular`", "line"],
    );
    assert_bad(
        &GOOD.replace("engine.scheduler = \"static\"", "engine.max_num_seq = 4"),
        &["variant `static`", "max_num_seq"],
    );
}

#[test]
fn negative_rate_is_rejected() {
    assert_bad(
        &GOOD.replace("rate = 5.0", "rate = -5.0"),
        &["workload.arrival.rate", "-5"],
    );
}

#[test]
fn model_that_does_not_fit_reports_the_numbers() {
    assert_bad(
        &GOOD
            .replace("llama-3-8b", "llama-2-70b")
            .replace("[model]", "[model]\ndtype = \"fp16\""),
        &[
            "does not fit",
            "138.0 GB of weights",
            "77.0 GB usable",
            "h100-sxm",
        ],
    );
}

#[test]
fn unknown_names_point_at_the_catalog() {
    // A near miss is named; the whole list is where `sim gpus` / `sim models` print it.
    assert_bad(
        &GOOD.replace("h100-sxm", "tpu-v9"),
        &["hardware.gpu", "tpu-v9", "`sim gpus` lists the"],
    );
    assert_bad(
        &GOOD.replace("llama-3-8b", "gpt-9"),
        &["model.name", "gpt-9", "`sim models` lists the"],
    );
    assert_bad(
        &GOOD.replace("llama-3-8b", "llama-3.1-8"),
        &["model.name", "did you mean `llama-3.1-8b`?"],
    );
}

#[test]
fn budget_too_small_without_chunking_is_rejected() {
    assert_bad(
        &GOOD.replace(
            "engine.scheduler = \"static\"",
            "engine.scheduler = \"static\"\nengine.max_num_batched_tokens = 512",
        ),
        &["variant `static`", "max_num_batched_tokens", "512", "8192"],
    );
}

#[test]
fn trace_with_a_bad_row_names_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,abc,109\n",
    );
    let text = GOOD
        .replace(
            "arrival = { process = \"poisson\", rate = 5.0 }",
            "trace = { format = \"azure\", path = \"trace.csv\" }",
        )
        .replace("num_requests = 50\n", "")
        .replace(
            "[[workload.class]]\nname = \"chat\"\nprompt = { dist = \"uniform\", min = 10, max = 200 }\noutput = { dist = \"fixed\", value = 20 }\n",
            "",
        );
    let p = write(dir.path(), "scenario.toml", &text);
    let out_dir = dir.path().join("out");
    let out = sim(&[
        "run",
        p.to_str().expect("utf-8"),
        "--out",
        out_dir.to_str().expect("utf-8"),
        "--quiet",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("trace.csv:3"), "{err}");
    assert!(
        err.contains("ContextTokens") && err.contains("abc"),
        "{err}"
    );
}

#[test]
fn missing_file_is_an_error_not_a_panic() {
    let out = sim(&["run", "/nonexistent/scenario.toml", "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/scenario.toml"), "{err}");
}

#[test]
fn generate_rejects_bad_input_with_one_line() {
    for (model, extra, needle) in [
        ("/nonexistent/m.gguf", "--seed=1", "/nonexistent/m.gguf"),
        ("m.gguf", "--backend=model", "no logits"),
        ("m.gguf", "--top-p=1.5", "--top-p"),
        ("m.gguf", "--temperature=-1", "--temperature"),
    ] {
        let args = ["generate", "--model", model, "--prompt", "hi", extra];
        let out = sim(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

#[test]
fn run_writes_the_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "scenario.toml", GOOD);
    let out_dir = dir.path().join("out");
    let out = sim(&[
        "run",
        p.to_str().expect("utf-8"),
        "--out",
        out_dir.to_str().expect("utf-8"),
        "--quiet",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("mean TTFT (ms)") && stdout.contains("static"),
        "{stdout}"
    );
    for v in ["static", "chunked"] {
        for f in [
            "requests.csv",
            "steps.csv",
            "summary.json",
            "plan.json",
            "timing.json",
        ] {
            assert!(out_dir.join(v).join(f).is_file(), "{v}/{f}");
        }
        let requests = std::fs::read_to_string(out_dir.join(v).join("requests.csv")).expect("csv");
        assert_eq!(requests.lines().count(), 51, "header + 50 requests");
    }
    assert!(out_dir.join("comparison.csv").is_file());
}

#[test]
fn catalogs_list() {
    let models = sim(&["models"]);
    assert_eq!(models.status.code(), Some(0));
    let text = String::from_utf8_lossy(&models.stdout);
    for m in ["llama-2-70b", "llama-3-8b", "mistral-7b", "smollm2-135m"] {
        assert!(text.contains(m), "{m}");
    }
    let gpus = sim(&["gpus"]);
    let text = String::from_utf8_lossy(&gpus.stdout);
    for g in [
        "a100-40gb",
        "a100-80gb",
        "h100-sxm",
        "h100-pcie",
        "h200",
        "l40s",
    ] {
        assert!(text.contains(g), "{g}");
    }
}

#[test]
fn readme_scenario_example_is_valid() {
    // The README's scenario block must parse and validate as written.
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let start = readme.find("```toml\n").expect("a ```toml block") + "```toml\n".len();
    let len = readme[start..].find("```").expect("end of the block");
    let (code, err, out) = validate(&readme[start..start + len]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("variant `static`") && out.contains("variant `chunked`"),
        "{out}"
    );
}

#[test]
fn horizon_and_override_errors_name_the_file() {
    let huge = GOOD.replace(
        "[hardware]",
        "[engine]\nnum_gpu_blocks_override = 4000000000\n[hardware]",
    );
    let huge = huge.replace("[engine]\nscheduler = \"chunked\"\n", "");
    assert_bad(&huge, &["num_gpu_blocks_override", "4000000000", "fit"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "scenario.toml",
        &GOOD.replace("rate = 5.0", "rate = 1e-300"),
    );
    let out = sim(&[
        "run",
        p.to_str().expect("utf-8"),
        "--quiet",
        "--out",
        dir.path().join("o").to_str().expect("utf-8"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("scenario.toml") && err.contains("workload.arrival.rate"),
        "{err}"
    );
}

#[test]
fn quantized_70b_fits_and_weight_formats_are_not_kv_formats() {
    // 4-bit AWQ Llama-2-70B (~36 GB) fits one H100, where fp16 (138 GB) does not.
    let int4 = GOOD
        .replace("llama-3-8b", "llama-2-70b")
        .replace("[model]", "[model]\ndtype = \"int4\"");
    let (code, err, out) = validate(&int4);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("int4"), "{out}");
    assert_bad(
        &GOOD.replace("[model]", "[model]\nkv_dtype = \"q4_0\""),
        &["model.kv_dtype", "q4_0", "weight format"],
    );
    assert_bad(
        &GOOD.replace("[model]", "[model]\ndtype = \"int3\""),
        &["line 4", "int3", "int4-g32", "q4_k_m"],
    );
}

#[test]
fn a_hugging_face_config_json_is_a_model() {
    let config = std::fs::canonicalize("tests/data/mixtral_config.json").expect("fixture");
    let text = GOOD
        .replace(
            "name = \"llama-3-8b\"",
            &format!("config = {:?}", config.display().to_string()),
        )
        .replace("gpu = \"h100-sxm\"", "gpu = \"h100-sxm\"\ntp = 2");
    let (code, err, out) = validate(&text);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Mixtral-8x7B"), "{out}");
    // Both, or neither, is an error naming the keys.
    assert_bad(
        &text.replace("[model]", "[model]\nname = \"llama-3-8b\""),
        &["model.name", "model.config"],
    );
    assert_bad(
        &GOOD.replace("name = \"llama-3-8b\"", "config = \"missing.json\""),
        &["model.config", "missing.json"],
    );
}

#[test]
fn a_gpu_can_come_from_a_toml_file() {
    let gpu = std::fs::canonicalize("tests/data/h100_nvl.toml").expect("fixture");
    let text = GOOD.replace(
        "gpu = \"h100-sxm\"",
        &format!("gpu_file = {:?}", gpu.display().to_string()),
    );
    let (code, err, out) = validate(&text);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("h100-nvl"), "{out}");
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(
        dir.path(),
        "gpu.toml",
        &std::fs::read_to_string(&gpu)
            .expect("fixture")
            .replace("memory_bandwidth_gbs = 3900", "memory_bandwidth_gbs = -1"),
    );
    assert_bad(
        &GOOD.replace(
            "gpu = \"h100-sxm\"",
            &format!("gpu_file = {:?}", bad.display().to_string()),
        ),
        &[
            "hardware.gpu_file",
            "gpu.toml",
            "memory_bandwidth_gbs",
            "-1",
        ],
    );
}

#[test]
fn plan_finds_the_rate_each_deployment_sustains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = GOOD.to_string() + "[slo]\nttft_ms = 300\ntpot_ms = 40\n";
    let p = write(dir.path(), "scenario.toml", &text);
    let out = sim(&[
        "plan",
        p.to_str().expect("utf-8"),
        "--rate",
        "30",
        "--requests",
        "100",
        "--gpu",
        "h100-sxm",
        "--gpu",
        "a100-40gb",
        "--dtype",
        "bf16",
        "--dtype",
        "int4",
        "--price",
        "h100-sxm=2.0",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // One row per deployment with a positive sustained rate, replicas and a cost.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("h100-sxm") || l.starts_with("a100-40gb"))
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    let rate = |row: &str| -> f64 {
        row.split_whitespace()
            .nth(3)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    for row in &rows {
        assert!(rate(row) > 0.0, "{row}");
    }
    // An H100 sustains more than an A100-40GB.
    assert!(rate(rows[0]) > rate(rows[2]), "{stdout}");
    // Without an SLO there is nothing to plan for.
    assert_bad_cmd(&["plan", "--rate", "30"], GOOD, &["slo"]);
}

fn assert_bad_cmd(args: &[&str], text: &str, needles: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "scenario.toml", text);
    let mut all: Vec<&str> = vec![args[0], p.to_str().expect("utf-8")];
    all.extend(&args[1..]);
    let out = sim(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

#[test]
fn review_fixes_reject_bad_cost_and_gpu_values() {
    assert_bad(
        &GOOD.replace(
            "[[variant]]\nname = \"static\"",
            "[cost]\noverlap_exponent = 0\n[[variant]]\nname = \"static\"",
        ),
        &["cost.overlap_exponent", "at least 1"],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let gpu = std::fs::read_to_string("tests/data/h100_nvl.toml").expect("fixture")
        + "allreduce_eff = nan\n";
    let bad = write(dir.path(), "gpu.toml", &gpu);
    assert_bad(
        &GOOD.replace(
            "gpu = \"h100-sxm\"",
            &format!("gpu_file = {:?}", bad.display().to_string()),
        ),
        &["allreduce_eff", "NaN"],
    );
    // `sim plan` needs a synthetic workload and known GPUs for its prices.
    let slo = GOOD.to_string() + "[slo]\nttft_ms = 300\n";
    assert_bad_cmd(
        &["plan", "--rate", "5", "--price", "tpu-v9=1"],
        &slo,
        &["--price", "tpu-v9"],
    );
    assert_bad_cmd(
        &["plan", "--rate", "5", "--requests", "0"],
        &slo,
        &["--requests"],
    );
}

#[test]
fn speculative_and_sweep_errors_name_the_key() {
    let with = |extra: &str| format!("{GOOD}\n{extra}");
    assert_bad(
        &with("[speculative]\nmethod = \"draft-model\"\ndraft_model = \"llama-3.2-1b\"\n"),
        &["speculative", "mean_acceptance_length"],
    );
    assert_bad(
        &with("[speculative]\nmethod = \"draft-model\"\ndraft_model = \"smollm2-135m\"\nmean_acceptance_length = 2.0\n"),
        &["speculative.draft_model", "vocabulary"],
    );
    assert_bad(
        &with("[speculative]\nmethod = \"synthetic\"\nacceptance = [0.5, 0.9]\n"),
        &["speculative.acceptance", "must not increase"],
    );
    assert_bad(
        &with("[speculative]\nmethod = \"synthetic\"\nk = 2\nmean_acceptance_length = 4.0\n"),
        &["mean_acceptance_length", "[1, 3]"],
    );
    assert_bad(
        &with("[sweep]\n\"engine.max_num_seq\" = [1, 2]\n"),
        &["sweep point", "max_num_seq"],
    );
    assert_bad(
        &with("[sweep]\n\"workload.arrival.rate\" = 3\n"),
        &["sweep.workload.arrival.rate", "array"],
    );
    let (code, err, out) = validate(&with(
        "[speculative]\nmethod = \"draft-model\"\ndraft_model = \"llama-3.2-1b\"\nmean_acceptance_length = 2.0\n[sweep]\n\"workload.arrival.rate\" = [1, 2]\n",
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("at each of the 2 sweep points"), "{out}");
}

/// `sim run` writes a self-contained `report.html` (inline SVG plots, no script, nothing
/// fetched), `sim report` rebuilds it identically from the files, and it renders in
/// headless Chromium with every plot and no console error (`scripts/check-report.sh`;
/// skipped where Chromium is not installed).
#[test]
fn run_writes_a_self_contained_report_that_renders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "scenario.toml", GOOD);
    let out = dir.path().join("out");
    let o = sim(&[
        "run",
        p.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = out.join("report.html");
    let html = std::fs::read_to_string(&report).expect("report.html");
    assert!(html.matches("<svg").count() >= 7, "plots missing");
    for forbidden in [
        "<script",
        "src=\"http",
        "href=\"http",
        "@import",
        "url(http",
    ] {
        assert!(!html.contains(forbidden), "not self-contained: {forbidden}");
    }
    for section in [
        "Comparison",
        "Warnings",
        "TTFT CDF",
        "KV cache usage",
        "Memory plan",
        "Scenario",
    ] {
        assert!(html.contains(section), "{section} missing");
    }
    std::fs::remove_file(&report).expect("rm");
    let o = sim(&["report", out.to_str().expect("utf-8")]);
    assert!(o.status.success());
    assert_eq!(std::fs::read_to_string(&report).expect("rebuilt"), html);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check-report.sh");
    let check = Command::new(script)
        .arg(&out)
        .output()
        .expect("run the script");
    match check.status.code() {
        Some(0) => {}
        Some(2) => eprintln!(
            "skipped the browser check: {}",
            String::from_utf8_lossy(&check.stderr)
        ),
        _ => panic!(
            "report does not render cleanly: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        ),
    }
}

/// `--seeds N` runs replicas into `seed-*` folders and reports 95% intervals; `sim
/// compare` of a result set with itself finds no change (p = 1), and names missing
/// results.
#[test]
fn seeds_and_compare() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "scenario.toml", GOOD);
    let out = dir.path().join("out");
    let o = sim(&[
        "run",
        p.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
        "--seeds",
        "3",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("static (n = 3)") && text.contains("±"),
        "{text}"
    );
    for s in 0..3 {
        assert!(out.join(format!("seed-{s}/chunked/summary.json")).exists());
    }
    let csv = dir.path().join("cmp.csv");
    let o = sim(&[
        "compare",
        out.to_str().expect("utf-8"),
        out.to_str().expect("utf-8"),
        "--out",
        csv.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = std::fs::read_to_string(&csv).expect("csv");
    let line = rows
        .lines()
        .find(|l| l.starts_with("chunked,request_throughput,"))
        .expect("row");
    let cells: Vec<&str> = line.split(',').collect();
    assert_eq!(cells[8], "0.000000", "{line}");
    assert_eq!(cells[9], "1.000000", "{line}");
    let o = sim(&[
        "compare",
        out.to_str().expect("utf-8"),
        dir.path().to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no results here"));
}

/// Without a GPU, the GPU-side commands of the calibration loop say so and name the
/// commands to run on one; recorded steps refit without a GPU.
#[test]
fn calibration_and_fidelity_explain_the_gpu_they_need() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calib = dir.path().join("c.toml");
    let c = calib.to_str().expect("utf-8");
    if kernels::cuda::probe().is_err() {
        let o = sim(&[
            "calibrate",
            "--backend",
            "cuda",
            "--model",
            "llama-3-8b",
            "--out",
            c,
        ]);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("found none") && err.contains("On a GPU machine run"),
            "{err}"
        );
        let p = write(dir.path(), "scenario.toml", GOOD);
        let o = sim(&["fidelity", p.to_str().expect("utf-8"), "--calibration", c]);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("sim calibrate --backend cuda"), "{err}");
    }
    let steps = write(
        dir.path(),
        "steps.csv",
        "batch,ctx,tokens,ms\n1,512,0,6.803\n8,2048,0,8.673\n64,1024,0,12.001\n1,0,2048,68.03\n",
    );
    let o = sim(&[
        "calibrate",
        "--steps",
        steps.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--out",
        c,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&calib).expect("written");
    assert!(
        text.contains("[cost]")
            && text.contains("gemm_memory_eff")
            && text.contains("calibrate --steps")
    );
    // The calibration feeds a run.
    let p = write(dir.path(), "scenario.toml", GOOD);
    let out = dir.path().join("out");
    let o = sim(&[
        "run",
        p.to_str().expect("utf-8"),
        "--calibration",
        c,
        "--out",
        out.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan = std::fs::read_to_string(out.join("chunked/plan.json")).expect("plan");
    assert!(plan.contains("\"step_overhead_us\""), "{plan}");
}

/// README's printed excerpt of `sim run scenarios/mixed.toml` is what the run prints: every
/// line of the block under the `<!-- excerpt of: ... -->` marker is a line of the output.
#[test]
fn readme_excerpt_matches_the_run() {
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let marker = "<!-- excerpt of: sim run scenarios/mixed.toml -->";
    let block = readme
        .split_once(marker)
        .expect("README has the excerpt marker")
        .1
        .split("```")
        .nth(1)
        .expect("a code block follows the marker");
    let excerpt: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(excerpt.len() >= 4, "{excerpt:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("mixed");
    // The inline driver gives the actors' results (tests/scenarios.rs), faster.
    let out = sim(&[
        "run",
        "scenarios/mixed.toml",
        "--quiet",
        "--driver",
        "inline",
        "--out",
        out_dir.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    for line in excerpt {
        assert!(
            lines.contains(&line),
            "README's line\n{line}\nis not in the output of `sim run scenarios/mixed.toml`:\n{printed}"
        );
    }
}

/// A calibration that records k-fold fits (`[fit]`): `sim run` prints and writes the
/// bands, `sim plan` the range of each deployment's sustainable rate.
#[test]
fn calibrations_with_folds_give_bands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cal = write(
        dir.path(),
        "observed.toml",
        "[cost]\nstep_overhead_us = 300.0\nrequest_overhead_ms = 10.0\n\
         [fit]\nsource = \"test\"\n\
         folds = [{ step_overhead_us = 300.0, request_overhead_ms = 10.0 }, { step_overhead_us = 2500.0, request_overhead_ms = 10.0 }]\n\
         ttft_error_50 = [-0.2, 0.1]\nttft_error_90 = [-0.5, 0.4]\n\
         tpot_error_50 = [-0.05, 0.05]\ntpot_error_90 = [-0.2, 0.2]\n",
    );
    let p = write(
        dir.path(),
        "scenario.toml",
        &(GOOD.to_string() + "[slo]\nttft_ms = 300\ntpot_ms = 40\n"),
    );
    let out_dir = dir.path().join("out");
    let stdout = sim_ok(&[
        "run",
        p.to_str().expect("utf-8"),
        "--calibration",
        cal.to_str().expect("utf-8"),
        "--out",
        out_dir.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert!(stdout.contains("uncertainty"), "{stdout}");
    let csv = std::fs::read_to_string(out_dir.join("bands.csv")).expect("bands.csv");
    // A header, then 10 metrics for each of the 2 variants.
    assert_eq!(csv.lines().count(), 21, "{csv}");
    let tpot = csv
        .lines()
        .find(|l| l.starts_with("chunked,tpot_mean,"))
        .expect("chunked TPOT band");
    let f: Vec<f64> = tpot
        .split(',')
        .skip(3)
        .map(|x| x.parse().expect("number"))
        .collect();
    // predicted, folds low/high, runs, held-out 50% low/high, 90% low/high: the 2.5 ms
    // step of the second fold makes its TPOT longer; the 90% range holds the 50% one.
    assert!(f[1] <= f[0] && f[0] < f[2], "{tpot}");
    assert_eq!(f[3], 1.0, "{tpot}");
    assert!(
        f[6] <= f[4] && f[4] <= f[0] && f[0] <= f[5] && f[5] <= f[7],
        "{tpot}"
    );

    let stdout = sim_ok(&[
        "plan",
        p.to_str().expect("utf-8"),
        "--rate",
        "30",
        "--requests",
        "100",
        "--calibration",
        cal.to_str().expect("utf-8"),
    ]);
    let band = stdout
        .lines()
        .skip_while(|l| !l.starts_with("uncertainty"))
        .find(|l| l.starts_with("h100-sxm"))
        .unwrap_or_else(|| panic!("a band row: {stdout}"));
    // `h100-sxm 1 bf16 lo - hi replicas ... lo - hi replicas ...`
    let nums: Vec<f64> = band
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    assert!(nums.len() >= 9, "{band}");
    let (fold_lo, fold_hi, pess, opt) = (nums[1], nums[2], nums[5], nums[6]);
    assert!(0.0 < fold_lo && fold_lo <= fold_hi, "{band}");
    assert!(pess <= opt, "{band}");
}

/// A mixture of experts on 8 GPUs with attention data parallelism and expert parallelism.
const MOE: &str = r#"
name = "moe"
[model]
name = "deepseek-r1"
dtype = "fp8-block"
[hardware]
gpu = "h200"
tp = 1
dp = 8
ep = 8
[workload]
num_requests = 10
arrival = { process = "closed-loop", concurrency = 4 }
[[workload.class]]
name = "chat"
prompt = { dist = "fixed", value = 512 }
output = { dist = "fixed", value = 16 }
"#;

#[test]
fn validate_prints_each_layer_groups_cache() {
    let (code, err, out) = validate(MOE);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "8 x h200",
        "tp = 1, pp = 1, attention dp = 8, ep = 8",
        "latent attention (MLA)         70272 bytes / token (61 layers x (512 latent + 64 RoPE key) x 2 B",
        "8 of 256 experts and the shared expert",
    ] {
        assert!(out.contains(needle), "`{needle}` missing:\n{out}");
    }
    let hybrid = MOE
        .replace("deepseek-r1", "gpt-oss-120b")
        .replace("fp8-block", "mxfp4")
        .replace("dp = 8\nep = 8", "dp = 1\nep = 1");
    let (code, err, out) = validate(&hybrid);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "full attention                 36864 bytes / token (18 layers)",
        "sliding attention              5.31 MB / sequence",
        "1 sliding group(s) of 9 pages while decoding",
    ] {
        assert!(out.contains(needle), "`{needle}` missing:\n{out}");
    }
    // The hybrid allocator's side tables are paged and recomputed, as in vLLM V1.
    assert_bad(
        &hybrid.replace(
            "[workload]",
            "[engine]\nkv_allocator = \"contiguous\"\nenable_prefix_caching = false\n[workload]",
        ),
        &["engine.kv_allocator", "gpt-oss-120b", "own block tables"],
    );
    assert_bad(
        &hybrid.replace(
            "[workload]",
            "[engine]\npreemption_mode = \"swap\"\n[workload]",
        ),
        &["engine.preemption_mode", "\"recompute\""],
    );
    // Sliding layers counted as full attention: no side groups, a page of all 36 layers.
    let (code, err, out) = validate(&hybrid.replace(
        "[workload]",
        "[engine]\ndisable_sliding_window = true\n[workload]",
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !out.contains("hybrid pages") && out.contains("1179648 bytes per block"),
        "{out}"
    );
}

#[test]
fn expert_and_data_parallel_degrees_are_checked() {
    assert_bad(
        &MOE.replace("ep = 8", "ep = 3"),
        &["hardware.ep", "256 routed experts"],
    );
    assert_bad(
        &MOE.replace("dp = 8\nep = 8", "dp = 2\nep = 4"),
        &["hardware.ep", "tp x dp = 1 x 2 = 2 GPUs"],
    );
    assert_bad(&MOE.replace("dp = 8", "dp = 0"), &["hardware.dp", "from 1"]);
    assert_bad(
        &GOOD.replace("[hardware]", "[hardware]\nep = 2"),
        &["hardware.ep", "dense"],
    );
}

#[test]
fn the_mtp_layers_draft_where_a_model_has_them() {
    let mtp = MOE.replace(
        "[workload]",
        "[speculative]\nmethod = \"mtp\"\nk = 1\nacceptance = [0.8]\n\n[workload]",
    );
    let (code, err, _) = validate(&mtp);
    assert_eq!(code, Some(0), "{err}");
    // gpt-oss has no MTP layers.
    assert_bad(
        &mtp.replace("deepseek-r1", "gpt-oss-120b")
            .replace("fp8-block", "mxfp4")
            .replace("dp = 8\nep = 8", "dp = 1\nep = 1"),
        &["speculative.method", "no multi-token-prediction layers"],
    );
}

/// `sim claims` on a real runtime needs the weights, and only the CPU runtime runs them.
#[test]
fn claims_backend_flags_are_checked() {
    let run = |args: &[&str]| {
        let out = sim(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["claims", "--backend", "cpu"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--model"), "{err}");
    let (code, err) = run(&["claims", "--model", "x.gguf"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--backend cpu"), "{err}");
    let (code, err) = run(&["claims", "--backend", "cuda"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("synthetic weights"), "{err}");
    let (code, err) = run(&["claims", "--backend", "cpu", "--model", "no-such.gguf"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no-such.gguf"), "{err}");
}

/// `sim calibrate --observed` on real runs: a folder without runs, and runs that cannot be
/// replayed, are one-line errors; an aiperf export replays on `--gpu` (it names no GPU),
/// and the calibration file it writes feeds `sim replay`, inside the output folder only.
#[test]
fn calibrate_fits_runs_it_can_replay_and_says_why_not_otherwise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("fits");
    let o = out.to_str().expect("utf-8");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let e = sim(&[
        "calibrate",
        "--observed",
        empty.to_str().expect("utf-8"),
        "--out",
        o,
    ]);
    assert_eq!(e.status.code(), Some(2));
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(err.contains("no run in the folder"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A plain CSV names neither its model nor its GPU.
    let plain = write(
        dir.path(),
        "plain.csv",
        "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n0,512,32,40,400\n0.5,256,16,30,200\n",
    );
    let e = sim(&[
        "calibrate",
        "--observed",
        plain.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--out",
        o,
    ]);
    assert_eq!(e.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&e.stderr);
    assert!(
        stderr.contains("plain.csv: the run does not name its model"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // In a folder it is skipped, and a folder of nothing replayable is an error.
    let folder = dir.path().join("runs");
    std::fs::create_dir_all(&folder).expect("mkdir");
    std::fs::copy(&plain, folder.join("plain.csv")).expect("copy");
    let e = sim(&[
        "calibrate",
        "--observed",
        folder.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--out",
        o,
    ]);
    assert_eq!(e.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&e.stdout);
    assert!(
        stdout.contains("skipped") && stdout.contains("does not name its model"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&e.stderr).contains("no run could be replayed"));
    let e = sim(&[
        "calibrate",
        "--observed",
        plain.to_str().expect("utf-8"),
        "--folds",
        "1",
    ]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("--folds: must be 2 to 20"));
    // An aiperf export of 4 clients (16 requests).
    let run = dir.path().join("artifacts");
    std::fs::create_dir_all(&run).expect("mkdir");
    let mut records = String::new();
    for i in 0..16u64 {
        let start = 1_700_000_000_000_000_000 + (i / 4) * 700_000_000 + (i % 4) * 1_000_000;
        records.push_str(&format!(
            "{{\"metadata\": {{\"session_num\": {i}, \"request_start_ns\": {start}, \"benchmark_phase\": \"profiling\", \"was_cancelled\": false}}, \"metrics\": {{\"input_sequence_length\": {{\"value\": 1024, \"unit\": \"tokens\"}}, \"output_sequence_length\": {{\"value\": 64, \"unit\": \"tokens\"}}, \"time_to_first_token\": {{\"value\": 60.0, \"unit\": \"ms\"}}, \"request_latency\": {{\"value\": 650.0, \"unit\": \"ms\"}}}}, \"error\": null}}\n"
        ));
    }
    std::fs::write(run.join("profile_export.jsonl"), records).expect("write");
    std::fs::write(
        run.join("profile_export_aiperf.json"),
        "{\"input_config\": {\"endpoint\": {\"model_names\": [\"meta-llama/Llama-3.1-8B-Instruct\"]}, \"loadgen\": {\"concurrency\": 4, \"request_count\": 16}}}",
    )
    .expect("write");
    let text = sim_ok(&[
        "calibrate",
        "--observed",
        run.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--folds",
        "2",
        "--out",
        o,
    ]);
    assert!(
        text.contains("llama-3.1-8b on h100-sxm: 1 run replayed"),
        "{text}"
    );
    assert!(
        text.contains("the memory plan's reserve is not fitted"),
        "{text}"
    );
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "replayed-llama-3.1-8b-h100-sxm.csv",
            "replayed-llama-3.1-8b-h100-sxm.toml"
        ]
    );
    let cal = out.join("replayed-llama-3.1-8b-h100-sxm.toml");
    let replayed = dir.path().join("replayed");
    let text = sim_ok(&[
        "replay",
        run.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--calibration",
        cal.to_str().expect("utf-8"),
        "--out",
        replayed.to_str().expect("utf-8"),
    ]);
    assert!(text.contains("ttft_mean_ms"), "{text}");
    // On top of an engine's calibration: its other terms are carried into the file.
    let on_top = dir.path().join("on-top");
    sim_ok(&[
        "calibrate",
        "--observed",
        run.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--folds",
        "2",
        "--calibration",
        "calibration/observed-vllm.toml",
        "--out",
        on_top.to_str().expect("utf-8"),
    ]);
    let file = std::fs::read_to_string(on_top.join("replayed-llama-3.1-8b-h100-sxm.toml"))
        .expect("written");
    let t: toml::Table = file.parse().expect("toml");
    assert_eq!(
        t["cost"]["eager_layer_us"].as_float(),
        Some(600.0),
        "{file}"
    );
    assert_eq!(
        t["cost"]["by_gpu"]["h200"]["eager_layer_us"].as_float(),
        Some(900.0)
    );
    let bad = write(dir.path(), "bad.toml", "[engine]\nmax_num_seqs = 4\n");
    let e = sim(&[
        "calibrate",
        "--observed",
        run.to_str().expect("utf-8"),
        "--gpu",
        "h100-sxm",
        "--calibration",
        bad.to_str().expect("utf-8"),
        "--out",
        o,
    ]);
    assert_eq!(e.status.code(), Some(2));
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(err.contains("bad.toml: no [cost] table"), "{err}");
}
