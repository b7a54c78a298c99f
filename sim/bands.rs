//! Uncertainty bands on a prediction. A calibration file written by `sim calibrate
//! --observed` records its k-fold fits and held-out errors (`[fit]`,
//! [`FitRecord`]). For every variant that runs with such a file, `sim run` reruns the
//! variant under each fold's fit of the cost terms: the spread of those runs is what the
//! fit itself is unsure of. The held-out errors give a second, wider band: the range the
//! measured value falls in when the simulator errs as it did on the central 50% or 90%
//! of the deployments each fold held out (fitted on mean TTFT and TPOT of closed loops;
//! applied to percentiles too, which is an extrapolation).
//!
//! In: the scenario and its results. Out: one [`Band`] per variant and metric, written as
//! `bands.csv` and printed as a table.

use std::fmt::Write as _;
use std::path::Path;

use analysis::Summary;
use rayon::prelude::*;

use crate::cost_model::calibration::uncertainty::FitRecord;
use crate::driver::DriverKind;
use crate::run::{run_variant, BackendKind, VariantResult};
use crate::scenario::Scenario;
use crate::SimError;

/// Which held-out error a metric's band uses.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ErrorOf {
    Ttft,
    Tpot,
    None,
}

/// The metrics a band is reported for: name, unit, value, held-out error that applies.
type Metric = (&'static str, &'static str, fn(&Summary) -> f64, ErrorOf);

const METRICS: [Metric; 10] = [
    ("ttft_mean", "ms", |s| s.mean_ttft_ms, ErrorOf::Ttft),
    ("ttft_p50", "ms", |s| s.median_ttft_ms, ErrorOf::Ttft),
    ("ttft_p90", "ms", |s| s.p90_ttft_ms, ErrorOf::Ttft),
    ("ttft_p99", "ms", |s| s.p99_ttft_ms, ErrorOf::Ttft),
    ("tpot_mean", "ms", |s| s.mean_tpot_ms, ErrorOf::Tpot),
    ("tpot_p50", "ms", |s| s.median_tpot_ms, ErrorOf::Tpot),
    ("tpot_p99", "ms", |s| s.p99_tpot_ms, ErrorOf::Tpot),
    ("e2el_mean", "ms", |s| s.mean_e2el_ms, ErrorOf::None),
    (
        "request_throughput",
        "req/s",
        |s| s.request_throughput,
        ErrorOf::None,
    ),
    (
        "output_throughput",
        "tok/s",
        |s| s.output_throughput,
        ErrorOf::None,
    ),
];

/// One variant's band on one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// Variant.
    pub variant: String,
    /// Metric (`ttft_p90`, ...).
    pub metric: &'static str,
    /// Unit.
    pub unit: &'static str,
    /// The prediction (the calibration file's fit on all its data).
    pub predicted: f64,
    /// Lowest and highest value over the prediction and the folds' fits.
    pub folds: (f64, f64),
    /// Distinct fold fits that differ from the file's `[cost]` (extra runs).
    pub fold_runs: usize,
    /// Measured-value range when the error lies in the held-out central 50% interval
    /// (TTFT and TPOT only).
    pub held_out_50: Option<(f64, f64)>,
    /// ... in the held-out central 90% interval.
    pub held_out_90: Option<(f64, f64)>,
}

/// Reruns each calibrated variant of `results` under its calibration's other fold fits
/// (model backend, inline driver, no files) and returns the bands; empty when no variant
/// runs with a calibration file that records folds. `requests` overrides the request
/// count as the main run did.
pub fn bands(
    scenario: &Scenario,
    results: &[VariantResult],
    requests: Option<u64>,
) -> Result<Vec<Band>, SimError> {
    // (result index, fit, the fold's cost terms) for every extra run.
    let mut jobs = Vec::new();
    let mut fits: Vec<(usize, &FitRecord, usize)> = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let Some(v) = scenario
            .variants
            .iter()
            .find(|v| v.name == r.summary.variant)
        else {
            continue;
        };
        let Some(fit) = &v.fit else { continue };
        let others = fit.other_fits(&v.config.cost).map_err(|msg| {
            SimError::Scenario(crate::scenario::ScenarioError {
                file: scenario.path.display().to_string(),
                msg: format!("variant `{}`: cost.calibration: {msg}", v.name),
            })
        })?;
        fits.push((i, fit, others.len()));
        for cost in others {
            let mut cfg = v.config.clone();
            cfg.cost = cost;
            if requests.is_some() {
                cfg.workload.num_requests = requests;
            }
            jobs.push((i, cfg));
        }
    }
    let runs: Vec<Result<(usize, Summary), SimError>> = jobs
        .into_par_iter()
        .map(|(i, cfg)| {
            let name = &results[i].summary.variant;
            let v = scenario.resolve_config(name, cfg)?;
            let r = run_variant(
                scenario,
                &v,
                BackendKind::Model,
                DriverKind::Inline,
                None,
                &indicatif::ProgressBar::hidden(),
                &|| {},
            )?;
            Ok((i, r.summary))
        })
        .collect();
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    for (i, fit, fold_runs) in fits {
        let main = &results[i].summary;
        for (metric, unit, value, error_of) in METRICS {
            let predicted = value(main);
            let (lo, hi) = runs
                .iter()
                .filter(|(j, _)| *j == i)
                .map(|(_, s)| value(s))
                .fold((predicted, predicted), |(lo, hi), x| (lo.min(x), hi.max(x)));
            let errs = match error_of {
                ErrorOf::Ttft => Some((fit.ttft_error_50, fit.ttft_error_90)),
                ErrorOf::Tpot => Some((fit.tpot_error_50, fit.tpot_error_90)),
                ErrorOf::None => None,
            };
            out.push(Band {
                variant: main.variant.clone(),
                metric,
                unit,
                predicted,
                folds: (lo, hi),
                fold_runs,
                held_out_50: errs.map(|(e50, _)| FitRecord::measured_range(predicted, e50)),
                held_out_90: errs.map(|(_, e90)| FitRecord::measured_range(predicted, e90)),
            });
        }
    }
    Ok(out)
}

/// Writes `bands.csv` (one row per variant and metric).
pub fn write_csv(path: &Path, bands: &[Band]) -> Result<(), SimError> {
    let io = |e: csv::Error| SimError::Io {
        path: path.display().to_string(),
        source: e.into(),
    };
    let mut w = csv::Writer::from_path(path).map_err(io)?;
    w.write_record([
        "variant",
        "metric",
        "unit",
        "predicted",
        "folds_low",
        "folds_high",
        "fold_runs",
        "held_out_50_low",
        "held_out_50_high",
        "held_out_90_low",
        "held_out_90_high",
    ])
    .map_err(io)?;
    let opt = |r: Option<(f64, f64)>, hi: bool| {
        r.map_or(String::new(), |(l, h)| {
            format!("{:.4}", if hi { h } else { l })
        })
    };
    for b in bands {
        w.write_record([
            b.variant.clone(),
            b.metric.to_string(),
            b.unit.to_string(),
            format!("{:.4}", b.predicted),
            format!("{:.4}", b.folds.0),
            format!("{:.4}", b.folds.1),
            b.fold_runs.to_string(),
            opt(b.held_out_50, false),
            opt(b.held_out_50, true),
            opt(b.held_out_90, false),
            opt(b.held_out_90, true),
        ])
        .map_err(io)?;
    }
    w.flush().map_err(|e| SimError::Io {
        path: path.display().to_string(),
        source: e,
    })
}

/// The bands as a text table.
pub fn table(bands: &[Band]) -> String {
    let mut s = String::from(
        "uncertainty (the calibration's k-fold fits; the measured value when the error is as in the central 50% / 90% of its held-out deployments):\n",
    );
    let _ = writeln!(
        s,
        "{:<14} {:<27} {:>10} {:>21} {:>21} {:>21}",
        "variant", "metric", "predicted", "folds", "held-out 50%", "held-out 90%"
    );
    let range = |r: Option<(f64, f64)>| {
        r.map_or("-".to_string(), |(l, h)| format!("{} - {}", fmt(l), fmt(h)))
    };
    for b in bands {
        let _ = writeln!(
            s,
            "{:<14} {:<27} {:>10} {:>21} {:>21} {:>21}",
            b.variant,
            format!("{} ({})", b.metric, b.unit),
            fmt(b.predicted),
            format!("{} - {}", fmt(b.folds.0), fmt(b.folds.1)),
            range(b.held_out_50),
            range(b.held_out_90),
        );
    }
    s
}

/// Three significant figures, at least one decimal below 100.
fn fmt(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}
