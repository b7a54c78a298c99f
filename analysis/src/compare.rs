//! Comparing variants: the terminal table and `comparison.csv`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use comfy_table::{presets, CellAlignment, Table};

use crate::error::AnalysisError;
use crate::summary::{create_parent, Summary};

/// A comparison table (comfy-table, plain ASCII) with one column per variant.
///
/// Rows: completed and rejected requests, request/output/total throughput, goodput, mean,
/// p50 and p99 of TTFT, TPOT, ITL and E2EL (ms), mean queueing delay, preemptions, mean
/// and max KV usage, steps, and the gains over the first variant: request throughput
/// divided by the first's, and the first's mean and p99 TTFT divided by the variant's. The text depends only on the summaries (no terminal width detection).
pub fn comparison_table(summaries: &[Summary]) -> String {
    let mut table = Table::new();
    table.load_preset(presets::ASCII_FULL_CONDENSED);
    let mut header = vec!["metric".to_owned()];
    header.extend(summaries.iter().map(|s| s.variant.clone()));
    table.set_header(header);

    type Getter = fn(&Summary) -> String;
    let rows: [(&str, Getter); 31] = [
        ("completed", |s| s.completed.to_string()),
        ("rejected", |s| s.num_rejected.to_string()),
        ("request throughput (req/s)", |s| {
            format!("{:.3}", s.request_throughput)
        }),
        ("output throughput (tok/s)", |s| {
            format!("{:.2}", s.output_throughput)
        }),
        ("total throughput (tok/s)", |s| {
            format!("{:.2}", s.total_token_throughput)
        }),
        ("goodput (req/s)", |s| match s.request_goodput {
            Some(g) => format!("{g:.3}"),
            None => "-".to_owned(),
        }),
        ("mean TTFT (ms)", |s| format!("{:.2}", s.mean_ttft_ms)),
        ("p50 TTFT (ms)", |s| format!("{:.2}", s.median_ttft_ms)),
        ("p99 TTFT (ms)", |s| format!("{:.2}", s.p99_ttft_ms)),
        ("mean TPOT (ms)", |s| format!("{:.2}", s.mean_tpot_ms)),
        ("p50 TPOT (ms)", |s| format!("{:.2}", s.median_tpot_ms)),
        ("p99 TPOT (ms)", |s| format!("{:.2}", s.p99_tpot_ms)),
        ("mean ITL (ms)", |s| format!("{:.2}", s.mean_itl_ms)),
        ("p50 ITL (ms)", |s| format!("{:.2}", s.median_itl_ms)),
        ("p99 ITL (ms)", |s| format!("{:.2}", s.p99_itl_ms)),
        ("mean E2EL (ms)", |s| format!("{:.2}", s.mean_e2el_ms)),
        ("p50 E2EL (ms)", |s| format!("{:.2}", s.median_e2el_ms)),
        ("p99 E2EL (ms)", |s| format!("{:.2}", s.p99_e2el_ms)),
        ("mean queueing delay (ms)", |s| {
            format!("{:.2}", s.mean_queue_ms)
        }),
        ("preemptions", |s| s.num_preemptions.to_string()),
        ("  of which swapped", |s| s.num_swap_preemptions.to_string()),
        ("recomputed tokens", |s| s.recomputed_tokens.to_string()),
        ("swapped-out blocks", |s| s.swap_out_blocks.to_string()),
        ("preemption storms", |s| s.num_preemption_storms.to_string()),
        ("prefix cache hit rate", |s| {
            format!("{:.1}%", s.prefix_cache_hit_rate * 100.0)
        }),
        ("evicted blocks", |s| s.num_evictions.to_string()),
        ("mean KV usage", |s| {
            format!("{:.1}%", s.mean_kv_usage * 100.0)
        }),
        ("KV fragmentation", |s| {
            format!("{:.1}%", s.kv_fragmentation * 100.0)
        }),
        ("KV external fragmentation", |s| {
            format!("{:.1}%", s.kv_external_fragmentation * 100.0)
        }),
        ("max KV usage", |s| {
            format!("{:.1}%", s.max_kv_usage * 100.0)
        }),
        ("steps", |s| s.num_steps.to_string()),
    ];
    for (name, get) in rows {
        let mut row = vec![name.to_owned()];
        row.extend(summaries.iter().map(get));
        table.add_row(row);
    }
    if summaries.iter().any(|s| s.speculative.is_some()) {
        type SpecGetter = fn(&crate::summary::SpecSummary) -> String;
        let spec_rows: [(&str, SpecGetter); 3] = [
            ("spec acceptance rate", |s| {
                format!("{:.1}%", s.acceptance_rate * 100.0)
            }),
            ("spec mean acceptance length", |s| {
                format!("{:.3}", s.mean_acceptance_length)
            }),
            ("spec verify steps", |s| s.num_drafts.to_string()),
        ];
        for (name, get) in spec_rows {
            let mut row = vec![name.to_owned()];
            row.extend(
                summaries
                    .iter()
                    .map(|s| s.speculative.as_ref().map_or("-".to_owned(), get)),
            );
            table.add_row(row);
        }
    }

    if let Some(first) = summaries.first() {
        // Ratios read "how many times better than the first variant": higher throughput
        // divided by the baseline, the baseline's latency divided by the variant's.
        let ratio_row = |label: &str, get: fn(&Summary) -> f64, higher_is_better: bool| {
            let base = get(first);
            let mut row = vec![format!("{label} vs {}", first.variant)];
            row.extend(summaries.iter().map(|s| {
                let r = if higher_is_better {
                    get(s) / base
                } else {
                    base / get(s)
                };
                if r.is_finite() {
                    format!("{r:.3}x")
                } else {
                    "-".to_owned()
                }
            }));
            row
        };
        table.add_row(ratio_row(
            "request throughput gain",
            |s| s.request_throughput,
            true,
        ));
        table.add_row(ratio_row("mean TTFT reduction", |s| s.mean_ttft_ms, false));
        table.add_row(ratio_row("p99 TTFT reduction", |s| s.p99_ttft_ms, false));
    }

    for i in 1..=summaries.len() {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
}

/// Writes `comparison.csv` to `path` (creating the parent directory if needed): a header
/// and one row per variant with the summary's scalar fields (everything but `slo` and
/// `classes`; speculative decoding's numbers as `spec_*` columns, zeros without it),
/// floats with 6 decimals and an empty cell for a missing goodput.
pub fn write_comparison_csv(path: &Path, summaries: &[Summary]) -> Result<(), AnalysisError> {
    create_parent(path)?;
    let file = File::create(path).map_err(|e| AnalysisError::io(path, e))?;
    let mut w = csv::Writer::from_writer(BufWriter::new(file));
    let rows: Vec<Vec<(String, String)>> = summaries.iter().map(Summary::scalar_fields).collect();
    let header: Vec<String> = match rows.first() {
        Some(first) => first.iter().map(|(k, _)| k.clone()).collect(),
        None => Summary::default()
            .scalar_fields()
            .into_iter()
            .map(|(k, _)| k)
            .collect(),
    };
    w.write_record(&header)
        .map_err(|e| AnalysisError::csv(path, e))?;
    for row in &rows {
        w.write_record(row.iter().map(|(_, v)| v))
            .map_err(|e| AnalysisError::csv(path, e))?;
    }
    let mut inner = w
        .into_inner()
        .map_err(|e| AnalysisError::io(path, e.into_error()))?;
    inner.flush().map_err(|e| AnalysisError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{read_summary_json, write_summary_json};

    fn summary(variant: &str, throughput: f64, ttft: f64) -> Summary {
        Summary {
            scenario: "sc".into(),
            variant: variant.into(),
            backend: "sim".into(),
            completed: 10,
            request_throughput: throughput,
            mean_ttft_ms: ttft,
            mean_kv_usage: 0.4567,
            ..Summary::default()
        }
    }

    /// A fresh directory under the system temp dir for this test.
    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("analysis-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn table_has_a_column_per_variant_and_ratio_rows() {
        let t = comparison_table(&[summary("base", 2.0, 100.0), summary("fast", 3.0, 50.0)]);
        let header = t.lines().nth(1).expect("header line");
        assert!(header.contains("metric") && header.contains("base") && header.contains("fast"));
        let row = |label: &str| {
            t.lines()
                .find(|l| l.contains(label))
                .unwrap_or_else(|| panic!("no row {label} in\n{t}"))
                .to_owned()
        };
        assert!(row("request throughput gain vs base").contains("1.500x"));
        assert!(row("mean TTFT reduction vs base").contains("2.000x"));
        assert!(row("goodput (req/s)").contains('-'));
        assert!(row("mean KV usage").contains("45.7%"));
        for label in [
            "p99 ITL (ms)",
            "p50 E2EL (ms)",
            "mean queueing delay (ms)",
            "steps",
        ] {
            row(label);
        }
        // A zero baseline gives "-", not inf or NaN.
        let t = comparison_table(&[summary("zero", 0.0, 0.0), summary("x", 1.0, 1.0)]);
        assert!(!t.contains("inf") && !t.contains("NaN"));
        // Deterministic.
        assert_eq!(
            t,
            comparison_table(&[summary("zero", 0.0, 0.0), summary("x", 1.0, 1.0)])
        );
        assert!(comparison_table(&[]).contains("metric"));
    }

    #[test]
    fn comparison_csv_has_the_summary_scalar_fields() {
        let dir = temp_dir("cmp");
        let path = dir.join("comparison.csv");
        let mut a = summary("a", 1.0, 2.0);
        a.request_goodput = Some(0.25);
        let b = summary("b", 1.5, 3.0);
        write_comparison_csv(&path, &[a.clone(), b]).expect("written");
        let text = std::fs::read_to_string(&path).expect("readable");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);

        let header: Vec<&str> = lines[0].split(',').collect();
        let json = serde_json::to_value(&a).expect("serialises");
        let mut keys: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "slo" && *k != "classes")
            .collect();
        // The nested `speculative` object (absent here) is flattened into spec_* columns.
        let mut sorted_header: Vec<&str> = header
            .iter()
            .copied()
            .filter(|h| !h.starts_with("spec_"))
            .collect();
        assert_eq!(header.iter().filter(|h| h.starts_with("spec_")).count(), 6);
        keys.sort_unstable();
        sorted_header.sort_unstable();
        assert_eq!(sorted_header, keys);
        assert_eq!(
            &header[..4],
            ["scenario", "variant", "backend", "completed"]
        );
        assert!(lines[1].starts_with("sc,a,sim,10,0,0,0.000000,0,0.000000,1.000000,"));
        let goodput_col = header
            .iter()
            .position(|h| *h == "request_goodput")
            .expect("goodput column");
        assert_eq!(lines[1].split(',').nth(goodput_col), Some("0.250000"));
        assert_eq!(lines[2].split(',').nth(goodput_col), Some(""));

        // Empty input still gets the header.
        write_comparison_csv(&path, &[]).expect("written");
        let text = std::fs::read_to_string(&path).expect("readable");
        assert_eq!(text.lines().next(), Some(lines[0]));

        let json_path = dir.join("v").join("summary.json");
        write_summary_json(&json_path, &a).expect("written");
        assert_eq!(read_summary_json(&json_path).expect("read back"), a);
        let err = read_summary_json(&dir.join("missing.json")).expect_err("missing");
        assert!(err.to_string().contains("missing.json"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
