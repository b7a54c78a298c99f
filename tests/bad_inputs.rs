//! The regression corpus of bad inputs (`tests/data/bad/`, written by its `generate.py`):
//! every case must end with exit code 2 and one line on stderr that names the file (or the
//! flag) and says what is wrong, in at most ~300 characters besides the folders of the
//! paths; never a panic or an abort. And random scenarios drawn from the schema's keys with
//! edge values either run or fail the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;

fn bad_dir() -> PathBuf {
    std::fs::canonicalize("tests/data/bad").expect("tests/data/bad")
}

/// Checks one failed run of the binary: exit 2, one line containing every needle, short.
fn check(what: &str, out: &std::process::Output, needles: &[&str], folders: &[&Path]) {
    let err = String::from_utf8_lossy(&out.stderr);
    let err = err.trim_end();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{what}: exit {:?}, stderr: {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err}");
    assert!(err.starts_with("error: "), "{what}: {err}");
    for n in needles {
        assert!(err.contains(n), "{what}: `{n}` not in: {err}");
    }
    let mut short = err.to_string();
    for f in folders {
        short = short.replace(&format!("{}/", f.display()), "");
    }
    assert!(
        short.len() <= 300,
        "{what}: {} characters: {err}",
        short.len()
    );
}

#[test]
fn every_bad_scenario_is_one_clear_line() {
    let bad = bad_dir();
    let scenarios = bad.join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&scenarios)
        .expect("scenarios")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 150, "{} cases", files.len());
    let tmp = tempfile::tempdir().expect("tempdir");
    for f in &files {
        let text = String::from_utf8_lossy(&std::fs::read(f).expect("case")).into_owned();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: no `# expect:` line", f.display()));
        let command = text
            .lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("# command: "))
            .unwrap_or("validate");
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let out_dir = tmp.path().join(&name);
        let mut args = vec![command.to_string(), f.display().to_string()];
        if command == "run" {
            args.extend([
                "--quiet".into(),
                "--out".into(),
                out_dir.display().to_string(),
            ]);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_sim"))
            .args(&args)
            .output()
            .expect("run sim");
        check(
            &name,
            &out,
            &[expect, &name],
            &[&bad.join("scenarios/../data"), &scenarios, &bad],
        );
    }
}

#[test]
fn every_bad_command_line_is_one_clear_line() {
    let bad = bad_dir();
    let text = std::fs::read_to_string(bad.join("cli.txt")).expect("cli.txt");
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (expect, args) = line.split_once('|').expect("`expect | args`");
        let tmp = tempfile::tempdir().expect("tempdir");
        let args: Vec<String> = args
            .trim()
            .split(' ')
            .map(|a| {
                a.replace("{tmp}", &tmp.path().display().to_string())
                    .replace("{bad}", &bad.display().to_string())
            })
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_sim"))
            .args(&args)
            .output()
            .expect("run sim");
        check(
            line,
            &out,
            &[expect.trim()],
            &[&bad.join("data"), &bad, tmp.path()],
        );
        n += 1;
    }
    assert!(n >= 40, "{n} cases");
}

/// Edge values a key may get.
fn edge_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1".to_string()),
        Just("3".to_string()),
        Just("4294967296".to_string()),
        Just("9223372036854775807".to_string()),
        Just("0.0".to_string()),
        Just("-0.5".to_string()),
        Just("0.5".to_string()),
        Just("1e300".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("\"\"".to_string()),
        Just("\"x\"".to_string()),
        Just("true".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
    ]
}

/// Keys of the schema, as `table.key` (a table of `class` is the first workload class).
const KEYS: &[&str] = &[
    "model.dtype",
    "model.kv_dtype",
    "hardware.tp",
    "hardware.pp",
    "engine.block_size",
    "engine.max_num_seqs",
    "engine.max_num_batched_tokens",
    "engine.max_model_len",
    "engine.gpu_memory_utilization",
    "engine.num_gpu_blocks_override",
    "engine.watermark",
    "engine.swap_space_gib",
    "engine.runtime_overhead_gib",
    "workload.num_requests",
    "workload.duration_s",
    "slo.ttft_ms",
    "slo.tpot_ms",
    "cost.gemm_compute_eff",
    "cost.step_overhead_us",
    "cost.overlap_exponent",
    "class.weight",
    "class.n",
    "class.temperature",
    "class.top_p",
    "class.priority",
];

fn scenario(overrides: &[(usize, String)]) -> String {
    let mut tables: Vec<(&str, Vec<(String, String)>)> = vec![
        ("model", vec![("name".into(), "\"llama-3-8b\"".into())]),
        ("hardware", vec![("gpu".into(), "\"h100-sxm\"".into())]),
        ("engine", vec![("scheduler".into(), "\"chunked\"".into())]),
        ("slo", vec![]),
        ("cost", vec![]),
        (
            "workload",
            vec![
                ("num_requests".into(), "20".into()),
                (
                    "arrival".into(),
                    "{ process = \"poisson\", rate = 5.0 }".into(),
                ),
            ],
        ),
        (
            "[workload.class]",
            vec![
                ("name".into(), "\"c\"".into()),
                ("prompt".into(), "{ dist = \"fixed\", value = 32 }".into()),
                ("output".into(), "{ dist = \"fixed\", value = 8 }".into()),
            ],
        ),
    ];
    for (k, v) in overrides {
        let (table, key) = KEYS[*k].split_once('.').expect("table.key");
        let table = if table == "class" {
            "[workload.class]"
        } else {
            table
        };
        let t = &mut tables
            .iter_mut()
            .find(|(n, _)| *n == table)
            .expect("table")
            .1;
        t.retain(|(k, _)| k != key);
        t.push((key.to_string(), v.clone()));
    }
    let mut s = String::from("name = \"random\"\n");
    for (name, kv) in tables {
        s.push_str(&format!("[{name}]\n"));
        for (k, v) in kv {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random scenarios: loading and (when they load) a short inline run either work or
    /// fail with a one-line error; nothing panics.
    #[test]
    fn random_scenarios_run_or_fail_in_one_line(
        overrides in proptest::collection::vec((0..KEYS.len(), edge_value()), 1..4)
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("random.toml");
        std::fs::write(&path, scenario(&overrides)).expect("write");
        match sim::scenario::Scenario::load(&path, None) {
            Err(e) => {
                let text = e.to_string();
                prop_assert_eq!(text.lines().count(), 1, "{}", text);
                prop_assert!(text.contains("random.toml"), "{}", text);
            }
            Ok(scn) => {
                let opts = sim::run::RunOptions {
                    driver: sim::driver::DriverKind::Inline,
                    requests: Some(20),
                    ..sim::run::RunOptions::default()
                };
                if let Err(e) = sim::run::run_scenario(&scn, &opts) {
                    let text = e.to_string();
                    prop_assert_eq!(text.lines().count(), 1, "{}", text);
                }
            }
        }
    }
}
