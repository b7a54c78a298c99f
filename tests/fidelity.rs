//! The recorded GPU runs (`calibration/fidelity/`): each file's re-score command, run
//! without a GPU (`sim fidelity --measured`), gives its rows again: the measured figures
//! exactly (they are read from the recorded run), the cost model's within 2% (a change to
//! the cost model that moves them more should re-record the files and VALIDATION.md).
//! A `--measured` folder that is not a recorded run, or a request count other than the
//! run's, is a one-line error.

use std::process::Command;

/// `(variant, metric) -> (simulated, measured)` of a fidelity CSV, comments skipped.
fn rows(text: &str) -> Vec<((String, String), (f64, f64))> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("variant,") && !l.is_empty())
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            let num = |s: &str| s.parse::<f64>().expect("number");
            ((c[0].into(), c[1].into()), (num(c[2]), num(c[3])))
        })
        .collect()
}

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sim")
}

#[test]
fn recorded_gpu_runs_score_again_without_a_gpu() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/fidelity");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("calibration/fidelity")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    let tmp = std::env::temp_dir().join(format!("sim-fidelity-{}", std::process::id()));
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let cmd = text
            .lines()
            .find_map(|l| l.strip_prefix("# re-score without a GPU: sim "))
            .unwrap_or_else(|| panic!("{}: no re-score line", f.display()));
        let out_dir = tmp.join(f.file_stem().expect("name"));
        let mut args: Vec<&str> = cmd.split_whitespace().collect();
        let shown = out_dir.display().to_string();
        args.extend(["--out", &shown]);
        let out = sim(&args);
        assert!(
            out.status.success(),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let got = rows(&std::fs::read_to_string(out_dir.join("fidelity.csv")).expect("csv"));
        let want = rows(&text);
        assert_eq!(got.len(), want.len(), "{}", f.display());
        for ((k, (s, m)), (k2, (s2, m2))) in got.iter().zip(&want) {
            assert_eq!(k, k2, "{}", f.display());
            assert_eq!(m, m2, "{}: {k:?} measured", f.display());
            assert!(
                (s - s2).abs() <= 0.02 * s2.abs().max(1e-9),
                "{}: {k:?} simulated {s} against the recorded {s2}",
                f.display()
            );
        }
    }
    // The wrong request count, and a folder that is no recorded run.
    let runs = "calibration/fidelity/runs/cuda_window";
    let base = [
        "fidelity",
        "calibration/fidelity/runs/cuda_window/scenario.toml",
        "--calibration",
        "calibration/h200-cuda.toml",
        "--measured",
    ];
    let shown = tmp.join("bad").display().to_string();
    let out = sim(&[&base[..], &[runs, "--requests", "8", "--out", &shown]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--requests") && err.trim().lines().count() == 1,
        "{err}"
    );
    let out = sim(&[
        &base[..],
        &["calibration", "--requests", "16", "--out", &shown],
    ]
    .concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("summary.json") && err.trim().lines().count() == 1,
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).ok();
}
