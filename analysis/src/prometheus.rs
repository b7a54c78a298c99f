//! `metrics.prom`: a run's final counters, gauges and histograms in the Prometheus text
//! exposition format, under vLLM's metric names (`vllm:...`, V1 names with their V0
//! aliases where they differ), so dashboards and notebooks built for a vLLM server read a
//! simulated run. Histograms use vLLM's bucket bounds; label `model_name` carries the
//! scenario and `variant` the variant.

use std::fmt::Write as _;

use crate::report::VariantData;

/// vLLM's bucket bounds (seconds) for time to first token.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// For time per output token.
pub const TPOT_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// For end-to-end latency.
pub const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A label set's text, `{model_name="...",variant="..."}` plus `extra`.
fn labels(v: &VariantData, extra: &str) -> String {
    let q = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let mut l = format!(
        "model_name=\"{}\",variant=\"{}\"",
        q(&v.summary.scenario),
        q(&v.name)
    );
    if !extra.is_empty() {
        l.push(',');
        l.push_str(extra);
    }
    format!("{{{l}}}")
}

fn counter(out: &mut String, v: &VariantData, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    let _ = writeln!(out, "{name}{} {value}", labels(v, ""));
}

fn gauge(out: &mut String, v: &VariantData, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    let _ = writeln!(out, "{name}{} {value}", labels(v, ""));
}

fn histogram(
    out: &mut String,
    v: &VariantData,
    name: &str,
    help: &str,
    bounds: &[f64],
    values_ms: &[f64],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let secs: Vec<f64> = values_ms.iter().map(|x| x / 1000.0).collect();
    for b in bounds {
        let n = secs.iter().filter(|&&s| s <= *b).count();
        let _ = writeln!(
            out,
            "{name}_bucket{} {n}",
            // Bounds as Python prints floats (`1.0`), as vLLM exposes them.
            labels(v, &format!("le=\"{b:?}\""))
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{} {}",
        labels(v, "le=\"+Inf\""),
        secs.len()
    );
    let _ = writeln!(
        out,
        "{name}_sum{} {}",
        labels(v, ""),
        secs.iter().sum::<f64>()
    );
    let _ = writeln!(out, "{name}_count{} {}", labels(v, ""), secs.len());
}

/// The exposition text of one variant's run.
pub fn exposition(v: &VariantData) -> String {
    let s = &v.summary;
    let mut out = String::new();
    counter(
        &mut out,
        v,
        "vllm:num_preemptions_total",
        "Cumulative number of preemptions.",
        s.num_preemptions as f64,
    );
    counter(
        &mut out,
        v,
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
        s.total_input_tokens as f64,
    );
    counter(
        &mut out,
        v,
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        s.total_output_tokens as f64,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter"
    );
    let _ = writeln!(
        out,
        "vllm:request_success_total{} {}",
        labels(v, "finished_reason=\"length\""),
        s.completed
    );
    counter(
        &mut out,
        v,
        "sim:request_rejected_total",
        "Requests rejected on arrival (longer than max_model_len or the KV pool).",
        s.num_rejected as f64,
    );
    // Prefix cache: queried and hit tokens (vLLM V1).
    let queries = s.total_input_tokens as f64;
    counter(
        &mut out,
        v,
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of tokens.",
        queries,
    );
    counter(
        &mut out,
        v,
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of tokens.",
        (s.prefix_cache_hit_rate * queries).round(),
    );
    gauge(
        &mut out,
        v,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage, mean over the run's steps (1 = full).",
        s.mean_kv_usage,
    );
    gauge(
        &mut out,
        v,
        "vllm:gpu_cache_usage_perc",
        "KV-cache usage (vLLM V0's name), mean over the run's steps.",
        s.mean_kv_usage,
    );
    let last = v.last_step.unwrap_or([0.0; 6]);
    gauge(
        &mut out,
        v,
        "vllm:num_requests_running",
        "Requests running at the last step.",
        last[2],
    );
    gauge(
        &mut out,
        v,
        "vllm:num_requests_waiting",
        "Requests waiting at the last step.",
        last[3],
    );
    histogram(
        &mut out,
        v,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &TTFT_BUCKETS,
        &v.ttft_ms,
    );
    histogram(
        &mut out,
        v,
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        &TPOT_BUCKETS,
        &v.tpot_ms,
    );
    histogram(
        &mut out,
        v,
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        &E2E_BUCKETS,
        &v.e2el_ms,
    );
    if let Some(sp) = &s.speculative {
        counter(
            &mut out,
            v,
            "vllm:spec_decode_num_drafts_total",
            "Number of spec decoding drafts.",
            sp.num_drafts as f64,
        );
        counter(
            &mut out,
            v,
            "vllm:spec_decode_num_draft_tokens_total",
            "Number of draft tokens.",
            sp.num_draft_tokens as f64,
        );
        counter(
            &mut out,
            v,
            "vllm:spec_decode_num_accepted_tokens_total",
            "Number of accepted tokens.",
            sp.num_accepted_tokens as f64,
        );
        let _ = writeln!(
            out,
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.\n# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"
        );
        for (i, r) in sp.acceptance_per_position.iter().enumerate() {
            let n = (r * sp.num_drafts as f64).round();
            let _ = writeln!(
                out,
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{} {n}",
                labels(v, &format!("position=\"{i}\""))
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::Summary;

    #[test]
    fn exposition_has_vllm_names_and_cumulative_buckets() {
        let v = VariantData {
            name: "chunked".into(),
            summary: Summary {
                scenario: "mixed".into(),
                num_preemptions: 3,
                completed: 2,
                ..Summary::default()
            },
            ttft_ms: vec![30.0, 700.0],
            tpot_ms: vec![20.0],
            e2el_ms: vec![1000.0, 4000.0],
            steps: vec![[1.0, 0.5, 4.0, 2.0, 100.0, 0.0]],
            last_step: Some([1.0, 0.5, 4.0, 2.0, 100.0, 0.0]),
            plan: None,
            warnings: Vec::new(),
            hit_rate: Vec::new(),
            fleet: None,
        };
        let t = exposition(&v);
        assert!(
            t.contains("vllm:num_preemptions_total{model_name=\"mixed\",variant=\"chunked\"} 3")
        );
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"mixed\",variant=\"chunked\",le=\"0.04\"} 1"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"mixed\",variant=\"chunked\",le=\"+Inf\"} 2"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_count{model_name=\"mixed\",variant=\"chunked\"} 2"
        ));
        assert!(t.contains("vllm:num_requests_waiting{model_name=\"mixed\",variant=\"chunked\"} 2"));
        // Every sample line is `name{labels} value`.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').expect("value");
            value.parse::<f64>().expect("a number");
            assert!(line.starts_with("vllm:") || line.starts_with("sim:"));
        }
    }
}
