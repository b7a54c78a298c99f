//! `GET /metrics`: the server's live counters, gauges and histograms in the Prometheus text
//! format under vLLM's metric names, so that dashboards, autoscalers and benchmark clients
//! built for a vLLM server read this one. In: each finished request's record, each step's
//! inter-token gaps and queue state (from the engine loop). Out: the exposition text.
//! Histograms use vLLM's bucket bounds; counters carry `_total` as Python's client writes
//! them; every sample is labelled `model_name`.

use std::fmt::Write as _;

use analysis::prometheus::{E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS};
use engine::record::RequestRecord;
use engine::request::FinishReason;

/// A cumulative histogram of seconds.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            self.counts[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// The server's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    running: u64,
    waiting: u64,
    kv_usage: f64,
    kv_blocks_used: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    prefix_queries: u64,
    prefix_hits: u64,
    preemptions: u64,
    /// Finished requests by reason: stop, length, abort.
    finished: [u64; 3],
    rejected: u64,
    ttft: Histogram,
    itl: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            kv_blocks_used: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            preemptions: 0,
            finished: [0; 3],
            rejected: 0,
            ttft: Histogram::new(&TTFT_BUCKETS),
            itl: Histogram::new(&TPOT_BUCKETS),
            tpot: Histogram::new(&TPOT_BUCKETS),
            e2e: Histogram::new(&E2E_BUCKETS),
            queue: Histogram::new(&E2E_BUCKETS),
        }
    }
}

impl Metrics {
    /// The queue and KV state after a step (or once the engine is idle).
    pub fn set_state(&mut self, running: u64, waiting: u64, blocks_used: u32, pool_blocks: u32) {
        self.running = running;
        self.waiting = waiting;
        self.kv_blocks_used = u64::from(blocks_used);
        self.kv_usage = f64::from(blocks_used) / f64::from(pool_blocks.max(1));
    }

    /// Inter-token gaps of a step, in nanoseconds.
    pub fn observe_itl(&mut self, gaps_ns: &[u64]) {
        for &g in gaps_ns {
            self.itl.observe(g as f64 / 1e9);
        }
    }

    /// A request ended.
    pub fn observe(&mut self, r: &RequestRecord) {
        if r.finish_reason.is_rejection() {
            self.rejected += 1;
            return;
        }
        self.prompt_tokens += u64::from(r.prompt_len);
        self.generation_tokens += u64::from(r.generated_tokens);
        self.prefix_queries += u64::from(r.prompt_len);
        self.prefix_hits += u64::from(r.cached_tokens);
        self.preemptions += u64::from(r.num_preemptions);
        let i = match r.finish_reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            _ => 2,
        };
        self.finished[i] += 1;
        if i == 2 {
            // Cut short by its client: no latency describes it.
            return;
        }
        let s = |ns: u64| ns as f64 / 1e9;
        if let Some(t) = r.ttft_s() {
            self.ttft.observe(t);
        }
        if let Some(t) = r.tpot_s() {
            self.tpot.observe(t);
        }
        if let Some(first) = r.first_scheduled_ns {
            self.queue.observe(s(first.saturating_sub(r.arrival_ns)));
        }
        self.e2e.observe(r.e2el_s());
    }

    /// KV blocks in use (what a test checks returns to 0 once the server is idle).
    pub fn kv_blocks_used(&self) -> u64 {
        self.kv_blocks_used
    }

    /// The exposition text, every sample labelled `model_name`.
    pub fn exposition(&self, model: &str) -> String {
        let label = format!(
            "model_name=\"{}\"",
            model
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        );
        let mut out = String::new();
        // Counters as Python's client writes them in format 0.0.4: every line named
        // `..._total`, the `# TYPE` line included (parsers match the family by it).
        let mut one = |kind: &str, name: &str, help: &str, value: f64| {
            let name = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{{label}}} {value}");
        };
        one(
            "gauge",
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            self.running as f64,
        );
        one(
            "gauge",
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            self.waiting as f64,
        );
        one(
            "gauge",
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            self.kv_usage,
        );
        one(
            "gauge",
            "sim:kv_cache_blocks_used",
            "KV-cache blocks in use.",
            self.kv_blocks_used as f64,
        );
        one(
            "counter",
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            self.prompt_tokens as f64,
        );
        one(
            "counter",
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            self.generation_tokens as f64,
        );
        one(
            "counter",
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_queries as f64,
        );
        one(
            "counter",
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            self.prefix_hits as f64,
        );
        one(
            "counter",
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            self.preemptions as f64,
        );
        one(
            "counter",
            "sim:request_rejected",
            "Requests rejected on arrival (longer than max_model_len or the KV pool).",
            self.rejected as f64,
        );
        let name = "vllm:request_success_total";
        let _ = writeln!(
            out,
            "# HELP {name} Count of successfully processed requests.\n# TYPE {name} counter"
        );
        for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{finished_reason=\"{reason}\",{label}}} {}",
                self.finished[i]
            );
        }
        let hists = [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &self.itl,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                &self.tpot,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &self.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                &self.queue,
            ),
        ];
        for (name, help, h) in hists {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            let mut cum = 0;
            for (b, c) in h.bounds.iter().zip(&h.counts) {
                cum += c;
                // Bounds as Python prints floats (`1.0`), as vLLM exposes them.
                let _ = writeln!(out, "{name}_bucket{{le=\"{b:?}\",{label}}} {cum}");
            }
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\",{label}}} {}", h.count);
            let _ = writeln!(out, "{name}_sum{{{label}}} {}", h.sum);
            let _ = writeln!(out, "{name}_count{{{label}}} {}", h.count);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counters_end_in_total() {
        let mut m = Metrics::default();
        let rec = |first: u64, end: u64, reason| RequestRecord {
            request_id: 0,
            class: 0,
            arrival_ns: 0,
            first_scheduled_ns: Some(0),
            first_token_ns: Some(first),
            finish_ns: end,
            prompt_len: 10,
            output_len: 5,
            generated_tokens: 5,
            max_tokens: 5,
            cached_tokens: 4,
            num_preemptions: 0,
            finish_reason: reason,
        };
        m.observe(&rec(30_000_000, 1_000_000_000, FinishReason::Length));
        m.observe(&rec(700_000_000, 4_000_000_000, FinishReason::Stop));
        // An aborted request counts, but in no latency histogram.
        m.observe(&rec(5_000_000_000, 6_000_000_000, FinishReason::Abort));
        m.observe_itl(&[20_000_000]);
        let text = m.exposition("smol");
        assert!(text.contains("vllm:prompt_tokens_total{model_name=\"smol\"} 30"));
        assert!(text.contains("# TYPE vllm:prompt_tokens_total counter"));
        assert!(text.contains("# TYPE vllm:request_success_total counter"));
        assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"smol\"} 12"));
        assert!(text.contains(
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"smol\"} 1"
        ));
        assert!(text.contains(
            "vllm:request_success_total{finished_reason=\"abort\",model_name=\"smol\"} 1"
        ));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"0.04\",model_name=\"smol\"} 1"
        ));
        assert!(text
            .contains("vllm:time_to_first_token_seconds_bucket{le=\"1.0\",model_name=\"smol\"} 2"));
        assert!(text.contains("vllm:inter_token_latency_seconds_count{model_name=\"smol\"} 1"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"smol\"} 2"
        ));
    }
}
