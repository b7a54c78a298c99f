//! The report of one run: the comparison table, warnings, latency CDFs, the engine's state
//! over time, the memory plans and the scenario, from the variants' files.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{esc, page, read_run, table, VariantData, SIZE};
use crate::error::AnalysisError;
use crate::plots::{cdf, downsample, svg, Chart, Series};
use crate::summary::Summary;

/// The comparison table's rows: `(label, getter)`.
type Row = (&'static str, fn(&Summary) -> String);

const COMPARISON: [Row; 16] = [
    ("completed", |s| s.completed.to_string()),
    ("rejected", |s| s.num_rejected.to_string()),
    ("request throughput (req/s)", |s| {
        format!("{:.3}", s.request_throughput)
    }),
    ("output throughput (tok/s)", |s| {
        format!("{:.1}", s.output_throughput)
    }),
    ("goodput (req/s)", |s| {
        s.request_goodput.map_or("-".into(), |g| format!("{g:.3}"))
    }),
    ("mean / p99 TTFT (ms)", |s| {
        format!("{:.1} / {:.1}", s.mean_ttft_ms, s.p99_ttft_ms)
    }),
    ("mean / p99 TPOT (ms)", |s| {
        format!("{:.2} / {:.2}", s.mean_tpot_ms, s.p99_tpot_ms)
    }),
    ("mean / p99 ITL (ms)", |s| {
        format!("{:.2} / {:.2}", s.mean_itl_ms, s.p99_itl_ms)
    }),
    ("mean / p99 E2EL (ms)", |s| {
        format!("{:.1} / {:.1}", s.mean_e2el_ms, s.p99_e2el_ms)
    }),
    ("preemptions (swapped)", |s| {
        format!("{} ({})", s.num_preemptions, s.num_swap_preemptions)
    }),
    ("prefix cache hit rate", |s| {
        format!("{:.1}%", 100.0 * s.prefix_cache_hit_rate)
    }),
    ("mean / max KV usage", |s| {
        format!(
            "{:.1}% / {:.1}%",
            100.0 * s.mean_kv_usage,
            100.0 * s.max_kv_usage
        )
    }),
    ("mean batch (seqs / tokens)", |s| {
        format!("{:.1} / {:.1}", s.mean_batch_size, s.mean_batched_tokens)
    }),
    ("spec acceptance (rate / mean length)", |s| {
        s.speculative.as_ref().map_or("-".into(), |x| {
            format!(
                "{:.1}% / {:.2}",
                100.0 * x.acceptance_rate,
                x.mean_acceptance_length
            )
        })
    }),
    ("leaked blocks", |s| s.leaked_blocks.to_string()),
    ("steps", |s| s.num_steps.to_string()),
];

/// The run's report page (see the module docs).
pub fn run_report(dir: &Path, variants: &[VariantData]) -> String {
    let scenario = variants
        .first()
        .map(|v| v.summary.scenario.clone())
        .unwrap_or_default();
    let mut b = String::new();
    let _ = writeln!(b, "<h1>{}</h1>", esc(&scenario));
    if let Ok(text) = std::fs::read_to_string(dir.join("scenario.toml")) {
        if let Some(desc) = text
            .lines()
            .find_map(|l| l.strip_prefix("description = "))
            .map(|d| d.trim_matches('"'))
        {
            let _ = writeln!(b, "<p>{}</p>", esc(desc));
        }
    }
    // Comparison.
    b.push_str("<h2>Comparison</h2>\n");
    let mut header = vec!["metric".to_string()];
    header.extend(variants.iter().map(|v| v.name.clone()));
    let rows: Vec<Vec<String>> = COMPARISON
        .iter()
        .map(|(label, get)| {
            let mut r = vec![label.to_string()];
            r.extend(variants.iter().map(|v| get(&v.summary)));
            r
        })
        .collect();
    b.push_str(&table(&header, &rows));
    // Warnings.
    let warnings: Vec<&String> = variants.iter().flat_map(|v| &v.warnings).collect();
    b.push_str("<h2>Warnings</h2>\n");
    if warnings.is_empty() {
        b.push_str("<p>None: no leak, rejection, preemption storm or adjusted trace row.</p>\n");
    } else {
        b.push_str("<ul>\n");
        for w in warnings {
            let _ = writeln!(b, "<li class=\"warn\">{}</li>", esc(w));
        }
        b.push_str("</ul>\n");
    }
    // Latency CDFs.
    b.push_str(&latency_charts(variants));
    // Over time.
    b.push_str(&over_time_charts(variants));
    // Fleets: routing, load per replica, transfers; hits by tier.
    b.push_str(&super::fleet::fleet_section(variants));
    // Memory plans.
    b.push_str("<h2>Memory plan</h2>\n");
    b.push_str(&memory_table(&header, variants));
    // The scenario.
    if let Ok(text) = std::fs::read_to_string(dir.join("scenario.toml")) {
        let _ = writeln!(b, "<h2>Scenario</h2>\n<pre>{}</pre>", esc(&text));
    }
    page(&format!("{scenario}: report"), &b)
}

/// The latency section: TTFT, TPOT and E2EL CDFs of every variant, with the SLO bounds.
fn latency_charts(variants: &[VariantData]) -> String {
    let mut b = String::new();
    b.push_str("<h2>Latency distributions</h2>\n<div class=\"plots\">\n");
    let slo = variants
        .first()
        .map(|v| v.summary.slo.clone())
        .unwrap_or_default();
    type Metric = (&'static str, fn(&VariantData) -> &Vec<f64>, Option<f64>);
    let metrics: [Metric; 3] = [
        ("TTFT", |v| &v.ttft_ms, slo.ttft_ms),
        ("TPOT", |v| &v.tpot_ms, slo.tpot_ms),
        ("E2EL", |v| &v.e2el_ms, slo.e2el_ms),
    ];
    for (name, get, bound) in metrics {
        let chart = Chart {
            title: format!("{name} CDF"),
            x_label: format!("{name} (ms)"),
            y_label: "fraction of requests".into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: cdf(get(v), 400),
                })
                .collect(),
            hlines: Vec::new(),
            marks: bound
                .map(|x| vec![(format!("SLO {x} ms"), x, 0.0)])
                .unwrap_or_default(),
            log_x: false,
        };
        // Latencies over orders of magnitude read better on a log axis.
        let (lo, hi) = chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
        let chart = Chart {
            log_x: lo > 0.0 && hi / lo > 30.0,
            ..chart
        };
        b.push_str(&svg(&chart, SIZE));
    }
    b.push_str("</div>\n");
    b
}

/// The over-time section: KV usage, running and waiting requests, batch size, and the
/// cumulative prefix-cache hit rate and preemptions where there are any.
fn over_time_charts(variants: &[VariantData]) -> String {
    let mut b = String::new();
    b.push_str("<h2>Over time</h2>\n<div class=\"plots\">\n");
    type Over = (&'static str, &'static str, usize);
    let over: [Over; 4] = [
        ("KV cache usage", "fraction of blocks", 1),
        ("Running requests", "sequences", 2),
        ("Waiting requests", "requests", 3),
        ("Batch size", "tokens per step", 4),
    ];
    for (title, y, i) in over {
        let chart = Chart {
            title: title.into(),
            x_label: "time (s)".into(),
            y_label: y.into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: downsample(
                        &v.steps.iter().map(|s| (s[0], s[i])).collect::<Vec<_>>(),
                        800,
                    ),
                })
                .collect(),
            ..Chart::default()
        };
        b.push_str(&svg(&chart, SIZE));
    }
    if variants.iter().any(|v| !v.hit_rate.is_empty()) {
        let chart = Chart {
            title: "Prefix cache hit rate (cumulative)".into(),
            x_label: "arrival time (s)".into(),
            y_label: "cached / prompt tokens".into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: downsample(&v.hit_rate, 800),
                })
                .collect(),
            ..Chart::default()
        };
        b.push_str(&svg(&chart, SIZE));
    }
    if variants.iter().any(|v| v.summary.num_preemptions > 0) {
        let chart = Chart {
            title: "Preemptions (cumulative)".into(),
            x_label: "time (s)".into(),
            y_label: "preemptions".into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: downsample(
                        &v.steps.iter().map(|s| (s[0], s[5])).collect::<Vec<_>>(),
                        800,
                    ),
                })
                .collect(),
            ..Chart::default()
        };
        b.push_str(&svg(&chart, SIZE));
    }
    b.push_str("</div>\n");
    b
}

/// The memory plans of the variants as a table (from their `plan.json`).
fn memory_table(header: &[String], variants: &[VariantData]) -> String {
    let keys = [
        ("weight_bytes", "weights (GB)", 1e-9),
        ("activation_bytes", "activations (GB)", 1e-9),
        ("kv_budget_bytes", "KV budget (GB)", 1e-9),
        ("kv_bytes_per_token", "KV bytes per token", 1.0),
        ("num_blocks", "KV blocks", 1.0),
        ("pool_tokens", "KV tokens", 1.0),
        (
            "max_concurrency_at_max_len",
            "concurrency at max length",
            1.0,
        ),
    ];
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(k, label, scale)| {
            let mut r = vec![label.to_string()];
            r.extend(variants.iter().map(|v| {
                v.plan
                    .as_ref()
                    .and_then(|p| p.get("memory")?.get(*k)?.as_f64())
                    .map_or("-".into(), |x| {
                        let x = x * scale;
                        if x.fract() == 0.0 && x.abs() < 1e15 {
                            format!("{x:.0}")
                        } else {
                            format!("{x:.2}")
                        }
                    })
            }));
            r
        })
        .collect();
    table(header, &rows)
}

/// Writes `dir/report.html` for a run folder, and each variant's `metrics.prom`
/// ([`crate::prometheus`]); returns the report's path.
pub fn write_run_report(dir: &Path) -> Result<PathBuf, AnalysisError> {
    let variants = read_run(dir)?;
    if variants.is_empty() {
        let failed: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| AnalysisError::io(dir, e))?
            .filter_map(Result::ok)
            .filter(|e| e.path().join("FAILED").exists())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let why = if failed.is_empty() {
            "no variant folder with a summary.json (is it the folder `sim run` wrote?)".to_string()
        } else {
            format!(
                "no finished run; these runs failed (see their FAILED file): {}",
                failed.join(", ")
            )
        };
        return Err(super::bad(dir, why));
    }
    for v in &variants {
        let path = dir.join(&v.name).join("metrics.prom");
        std::fs::write(&path, crate::prometheus::exposition(v))
            .map_err(|e| AnalysisError::io(&path, e))?;
    }
    let html = run_report(dir, &variants);
    let path = dir.join("report.html");
    std::fs::write(&path, html).map_err(|e| AnalysisError::io(&path, e))?;
    Ok(path)
}
