//! [`RunCollector`]: streams a run's records into CSV files and running statistics.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use engine::record::{RequestRecord, StepRecord};

use crate::error::AnalysisError;
use crate::latency::LatencyAccumulator;
use crate::rows::{CsvSink, REQUESTS_CSV_HEADER, STEPS_CSV_HEADER};
use crate::slo::Slo;
use crate::stats::{finite, ratio};
use crate::summary::{ClassSummary, SpecSummary, Summary};

/// Facts about a run that the records do not carry, given to [`RunCollector::finish`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunInfo {
    /// Scenario name.
    pub scenario: String,
    /// Variant name.
    pub variant: String,
    /// Backend name.
    pub backend: String,
    /// KV pool size in blocks.
    pub kv_pool_blocks: u32,
    /// KV blocks still in use when the run ended (reported as `leaked_blocks`).
    pub kv_blocks_in_use_at_end: u32,
    /// Cached KV blocks evicted from the prefix cache during the run.
    pub evictions: u64,
    /// Wall-clock time the simulation took (s).
    pub wall_time_s: f64,
    /// Speculative decoding's acceptance counters, by request class (empty: none).
    pub spec: Vec<engine::spec::SpecStats>,
    /// The offload tiers' counters and the prompt tokens loaded from the CPU tier and from
    /// the disk tier (`None`: no tier).
    pub offload: Option<(engine::block_manager::offload::OffloadStats, u64, u64)>,
}

/// The running statistics of one request class.
#[derive(Debug)]
struct ClassAccumulators {
    completed: u64,
    rejected: u64,
    ttft: LatencyAccumulator,
    tpot: LatencyAccumulator,
    e2el: LatencyAccumulator,
}

impl ClassAccumulators {
    fn new() -> Self {
        ClassAccumulators {
            completed: 0,
            rejected: 0,
            ttft: LatencyAccumulator::new(),
            tpot: LatencyAccumulator::new(),
            e2el: LatencyAccumulator::new(),
        }
    }
}

/// Default preemption-storm threshold: a request preempted more than this many times.
pub const DEFAULT_STORM_THRESHOLD: u32 = 5;

/// Collects a run's records as they are produced and computes its [`Summary`].
///
/// Memory does not grow with the number of requests or steps: records are folded into
/// running counts and sums and (optionally) written straight to `requests.csv` and
/// `steps.csv`. Every latency metric (TTFT, TPOT, E2EL, queueing delay and ITL overall;
/// TTFT, TPOT and E2EL per class) goes into a constant-memory accumulator: an HDR
/// histogram in nanoseconds with 3 significant digits, for percentiles with a relative
/// error below 0.1 %, plus exact integer sums, for exact means and standard deviations.
/// Goodput is counted as each request is recorded.
///
/// TPOT is recorded rounded to the nearest nanosecond (the other metrics are whole
/// nanoseconds already); the error is at most 0.5 ns, a relative error below 5e-7 for a
/// TPOT of 1 ms and below 1e-7 from 5 ms on.
pub struct RunCollector {
    slo: Slo,
    class_names: Vec<String>,
    requests_csv: Option<CsvSink>,
    steps_csv: Option<CsvSink>,

    /// Per-class statistics, by class index (grows with the largest class index seen,
    /// never with the number of requests).
    classes: Vec<ClassAccumulators>,
    completed: u64,
    num_rejected: u64,
    num_aborted: u64,
    total_input_tokens: u64,
    total_cached_tokens: u64,
    total_output_tokens: u64,
    first_arrival_ns: Option<u64>,
    last_finish_ns: Option<u64>,
    good: u64,

    num_steps: u64,
    num_preemptions: u64,
    max_request_preemptions: u32,
    num_swap_preemptions: u64,
    storm_threshold: u32,
    num_storms: u64,
    swap_in_blocks: u64,
    swap_out_blocks: u64,
    recomputed_tokens: u64,
    block_copies: u64,
    sum_external_fragmentation: f64,
    sum_seqs: u64,
    sum_batched_tokens: u64,
    sum_kv_usage: f64,
    sum_kv_tokens: u64,
    sum_kv_slots: u64,
    max_kv_usage: f64,

    ttft: LatencyAccumulator,
    tpot: LatencyAccumulator,
    e2el: LatencyAccumulator,
    queue: LatencyAccumulator,
    itl: LatencyAccumulator,
}

impl std::fmt::Debug for RunCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCollector")
            .field("slo", &self.slo)
            .field("class_names", &self.class_names)
            .field("completed", &self.completed)
            .field("num_rejected", &self.num_rejected)
            .field("num_steps", &self.num_steps)
            .field("itl", &self.itl)
            .field("writes_csv", &self.requests_csv.is_some())
            .finish_non_exhaustive()
    }
}

impl RunCollector {
    /// A collector measuring goodput against `slo`; `class_names[i]` names class index `i`
    /// (a class index without a name is called `class<i>`).
    pub fn new(slo: Slo, class_names: Vec<String>) -> Self {
        RunCollector {
            slo,
            class_names,
            requests_csv: None,
            steps_csv: None,
            classes: Vec::new(),
            completed: 0,
            num_rejected: 0,
            num_aborted: 0,
            total_input_tokens: 0,
            total_cached_tokens: 0,
            total_output_tokens: 0,
            first_arrival_ns: None,
            last_finish_ns: None,
            good: 0,
            num_steps: 0,
            num_preemptions: 0,
            max_request_preemptions: 0,
            num_swap_preemptions: 0,
            storm_threshold: DEFAULT_STORM_THRESHOLD,
            num_storms: 0,
            swap_in_blocks: 0,
            swap_out_blocks: 0,
            recomputed_tokens: 0,
            block_copies: 0,
            sum_external_fragmentation: 0.0,
            sum_seqs: 0,
            sum_batched_tokens: 0,
            sum_kv_usage: 0.0,
            sum_kv_tokens: 0,
            sum_kv_slots: 0,
            max_kv_usage: 0.0,
            ttft: LatencyAccumulator::new(),
            tpot: LatencyAccumulator::new(),
            e2el: LatencyAccumulator::new(),
            queue: LatencyAccumulator::new(),
            itl: LatencyAccumulator::new(),
        }
    }

    /// Counts a request preempted more than `n` times as a preemption storm.
    pub fn with_storm_threshold(mut self, n: u32) -> Self {
        self.storm_threshold = n;
        self
    }

    /// Stream rows into requests.csv / steps.csv writers (any io::Write, e.g.
    /// `BufWriter<File>` or `Vec<u8>`).
    ///
    /// Each gets a header row (also when no row follows); [`RunCollector::finish`] flushes
    /// them. Errors name the outputs `requests.csv` and `steps.csv`.
    pub fn with_csv(self, requests: Box<dyn Write>, steps: Box<dyn Write>) -> Self {
        self.with_csv_named(
            requests,
            PathBuf::from("requests.csv"),
            steps,
            PathBuf::from("steps.csv"),
        )
    }

    /// Creates `dir` (if needed) and streams rows into `dir/requests.csv` and
    /// `dir/steps.csv`, through buffered writers; errors name the full paths.
    pub fn with_csv_files(self, dir: &Path) -> Result<Self, AnalysisError> {
        std::fs::create_dir_all(dir).map_err(|e| AnalysisError::io(dir, e))?;
        let open = |name: &str| -> Result<(Box<dyn Write>, PathBuf), AnalysisError> {
            let path = dir.join(name);
            let file = File::create(&path).map_err(|e| AnalysisError::io(&path, e))?;
            Ok((Box::new(BufWriter::new(file)), path))
        };
        let (requests, requests_path) = open("requests.csv")?;
        let (steps, steps_path) = open("steps.csv")?;
        Ok(self.with_csv_named(requests, requests_path, steps, steps_path))
    }

    /// [`RunCollector::with_csv`] with the paths errors name.
    pub fn with_csv_named(
        mut self,
        requests: Box<dyn Write>,
        requests_path: PathBuf,
        steps: Box<dyn Write>,
        steps_path: PathBuf,
    ) -> Self {
        self.requests_csv = Some(CsvSink::new(requests, requests_path, &REQUESTS_CSV_HEADER));
        self.steps_csv = Some(CsvSink::new(steps, steps_path, &STEPS_CSV_HEADER));
        self
    }

    /// Records one finished (completed or rejected) request and writes its CSV row.
    ///
    /// Fails, recording nothing, when a time in the record precedes its arrival or the
    /// finish precedes the first token.
    pub fn record_request(&mut self, r: &RequestRecord) -> Result<(), AnalysisError> {
        validate_request(r)?;
        if let Some(sink) = self.requests_csv.as_mut() {
            sink.request_row(r, &class_name(&self.class_names, r.class))?;
        }
        self.max_request_preemptions = self.max_request_preemptions.max(r.num_preemptions);
        if r.num_preemptions > self.storm_threshold {
            self.num_storms += 1;
        }

        self.first_arrival_ns = Some(
            self.first_arrival_ns
                .map_or(r.arrival_ns, |t| t.min(r.arrival_ns)),
        );
        self.last_finish_ns = Some(
            self.last_finish_ns
                .map_or(r.finish_ns, |t| t.max(r.finish_ns)),
        );

        let idx = usize::from(r.class);
        if self.classes.len() <= idx {
            self.classes.resize_with(idx + 1, ClassAccumulators::new);
        }
        let class = &mut self.classes[idx];

        if r.finish_reason.is_rejection() {
            class.rejected += 1;
            self.num_rejected += 1;
            return Ok(());
        }
        if r.finish_reason == engine::request::FinishReason::Abort {
            // Cut short by its client: its latencies and tokens describe no full request.
            self.num_aborted += 1;
            return Ok(());
        }

        self.completed += 1;
        class.completed += 1;
        self.total_input_tokens += u64::from(r.prompt_len);
        self.total_cached_tokens += u64::from(r.cached_tokens);
        // Every sequence's tokens count (n > 1 generates several per request).
        self.total_output_tokens += u64::from(r.generated_tokens.max(r.output_len));
        if self.slo.is_met(r) {
            self.good += 1;
        }
        // `validate_request` has checked that no time precedes the arrival and that the
        // first token does not follow the finish, so these differences do not underflow.
        if let Some(first) = r.first_token_ns {
            let ttft = first - r.arrival_ns;
            self.ttft.record(ttft);
            class.ttft.record(ttft);
        }
        if let Some(tpot) = tpot_ns(r) {
            self.tpot.record(tpot);
            class.tpot.record(tpot);
        }
        let e2el = r.finish_ns - r.arrival_ns;
        self.e2el.record(e2el);
        class.e2el.record(e2el);
        if let Some(sched) = r.first_scheduled_ns {
            self.queue.record(sched - r.arrival_ns);
        }
        Ok(())
    }

    /// Records one engine step and writes its CSV row.
    ///
    /// Fails, recording nothing, when its KV usage, MBU or MFU is not finite.
    pub fn record_step(&mut self, s: &StepRecord) -> Result<(), AnalysisError> {
        for (value, reason) in [
            (s.kv_usage, "kv_usage is not finite"),
            (s.mbu, "mbu is not finite"),
            (s.mfu, "mfu is not finite"),
            (
                s.kv_external_fragmentation,
                "kv_external_fragmentation is not finite",
            ),
        ] {
            if !value.is_finite() {
                return Err(AnalysisError::InvalidStep {
                    step: s.step,
                    reason,
                });
            }
        }
        if let Some(sink) = self.steps_csv.as_mut() {
            sink.step_row(s)?;
        }
        self.num_steps += 1;
        self.num_preemptions += u64::from(s.num_preempted);
        self.num_swap_preemptions += u64::from(s.num_swapped);
        self.swap_in_blocks += u64::from(s.swap_in_blocks);
        self.swap_out_blocks += u64::from(s.swap_out_blocks);
        self.recomputed_tokens += u64::from(s.recomputed_tokens);
        self.block_copies += u64::from(s.block_copies);
        self.sum_external_fragmentation += s.kv_external_fragmentation;
        self.sum_seqs += u64::from(s.num_seqs);
        self.sum_batched_tokens += u64::from(s.num_batched_tokens);
        self.sum_kv_usage += s.kv_usage;
        self.sum_kv_tokens += s.kv_tokens;
        self.sum_kv_slots += s.kv_slots;
        self.max_kv_usage = self.max_kv_usage.max(s.kv_usage);
        Ok(())
    }

    /// Records inter-token gaps (ns): every gap between consecutive tokens of a request.
    pub fn record_itl(&mut self, gaps_ns: &[u64]) {
        self.itl.record_all(gaps_ns);
    }

    /// Flushes writers and computes the summary.
    pub fn finish(mut self, info: RunInfo) -> Result<Summary, AnalysisError> {
        if let Some(sink) = self.requests_csv.take() {
            sink.finish()?;
        }
        if let Some(sink) = self.steps_csv.take() {
            sink.finish()?;
        }

        let completed = self.completed;
        let duration = match (self.first_arrival_ns, self.last_finish_ns) {
            (Some(first), Some(last)) => engine::record::ns_to_s(last.saturating_sub(first)),
            _ => 0.0,
        };
        let ttft = self.ttft.stats();
        let tpot = self.tpot.stats();
        let e2el = self.e2el.stats();
        let queue = self.queue.stats();
        let itl = self.itl.stats();

        let mut classes = self.class_summaries();
        for (c, s) in classes.iter_mut().zip(&info.spec) {
            c.speculative = SpecSummary::of(s);
        }
        let mut all = engine::spec::SpecStats::default();
        for s in &info.spec {
            all.merge(s);
        }
        let steps = self.num_steps as f64;
        let total_requests = completed + self.num_rejected;
        let offload = info.offload.map(|(t, cpu, disk)| {
            let input = self.total_input_tokens as f64;
            let (cpu, disk) = (cpu as f64, disk as f64);
            crate::summary::OffloadSummary {
                capacity_blocks: t.capacity,
                blocks_at_end: t.blocks,
                stores: t.stores,
                loads: t.loads,
                evictions: t.evictions,
                gpu_hit_rate: ratio(
                    (self.total_cached_tokens as f64 - cpu - disk).max(0.0),
                    input,
                ),
                cpu_hit_rate: ratio(cpu, input),
                disk: (t.disk_capacity > 0).then(|| crate::summary::DiskTierSummary {
                    capacity_blocks: t.disk_capacity,
                    blocks_at_end: t.disk_blocks,
                    stores: t.disk_stores,
                    loads: t.disk_loads,
                    evictions: t.disk_evictions,
                    hit_rate: ratio(disk, input),
                }),
            }
        });

        Ok(Summary {
            scenario: info.scenario,
            variant: info.variant,
            backend: info.backend,
            completed,
            num_rejected: self.num_rejected,
            num_aborted: self.num_aborted,
            total_input_tokens: self.total_input_tokens,
            prefix_cache_hit_rate: ratio(
                self.total_cached_tokens as f64,
                self.total_input_tokens as f64,
            ),
            total_output_tokens: self.total_output_tokens,
            duration,
            request_throughput: ratio(completed as f64, duration),
            output_throughput: ratio(self.total_output_tokens as f64, duration),
            total_token_throughput: ratio(
                (self.total_input_tokens + self.total_output_tokens) as f64,
                duration,
            ),
            request_goodput: self.slo.is_set().then(|| ratio(self.good as f64, duration)),
            slo: self.slo,

            mean_ttft_ms: ttft.mean,
            median_ttft_ms: ttft.median,
            std_ttft_ms: ttft.std,
            p90_ttft_ms: ttft.p90,
            p95_ttft_ms: ttft.p95,
            p99_ttft_ms: ttft.p99,

            mean_tpot_ms: tpot.mean,
            median_tpot_ms: tpot.median,
            std_tpot_ms: tpot.std,
            p90_tpot_ms: tpot.p90,
            p95_tpot_ms: tpot.p95,
            p99_tpot_ms: tpot.p99,

            mean_itl_ms: itl.mean,
            median_itl_ms: itl.median,
            std_itl_ms: itl.std,
            p90_itl_ms: itl.p90,
            p95_itl_ms: itl.p95,
            p99_itl_ms: itl.p99,

            mean_e2el_ms: e2el.mean,
            median_e2el_ms: e2el.median,
            std_e2el_ms: e2el.std,
            p90_e2el_ms: e2el.p90,
            p95_e2el_ms: e2el.p95,
            p99_e2el_ms: e2el.p99,

            mean_queue_ms: queue.mean,
            median_queue_ms: queue.median,
            std_queue_ms: queue.std,
            p90_queue_ms: queue.p90,
            p95_queue_ms: queue.p95,
            p99_queue_ms: queue.p99,

            num_steps: self.num_steps,
            num_preemptions: self.num_preemptions,
            max_request_preemptions: self.max_request_preemptions,
            num_swap_preemptions: self.num_swap_preemptions,
            num_recompute_preemptions: self.num_preemptions - self.num_swap_preemptions,
            num_preemption_storms: self.num_storms,
            preemption_storm_threshold: self.storm_threshold,
            swap_out_blocks: self.swap_out_blocks,
            swap_in_blocks: self.swap_in_blocks,
            recomputed_tokens: self.recomputed_tokens,
            block_copies: self.block_copies,
            mean_batch_size: ratio(self.sum_seqs as f64, steps),
            mean_batched_tokens: ratio(self.sum_batched_tokens as f64, steps),
            mean_kv_usage: ratio(self.sum_kv_usage, steps),
            kv_fragmentation: if self.sum_kv_slots == 0 {
                0.0
            } else {
                (1.0 - self.sum_kv_tokens as f64 / self.sum_kv_slots as f64).max(0.0)
            },
            kv_external_fragmentation: ratio(self.sum_external_fragmentation, steps),
            max_kv_usage: finite(self.max_kv_usage),
            kv_pool_blocks: info.kv_pool_blocks,
            leaked_blocks: info.kv_blocks_in_use_at_end,
            num_evictions: info.evictions,
            speculative: SpecSummary::of(&all),
            offload,
            wall_time_s: finite(info.wall_time_s),
            sim_speed: if info.wall_time_s > 0.0 {
                ratio(total_requests as f64, info.wall_time_s)
            } else {
                0.0
            },
            classes,
        })
    }

    /// Per-class summaries, one for every named class and every class index seen.
    fn class_summaries(&self) -> Vec<ClassSummary> {
        let n = self.class_names.len().max(self.classes.len());
        let empty = ClassAccumulators::new();
        (0..n)
            .map(|i| {
                // `i < n` comes from class indices (u16) or from `class_names`; beyond
                // u16::MAX only names without records can occur.
                let name = match u16::try_from(i) {
                    Ok(c) => class_name(&self.class_names, c).into_owned(),
                    Err(_) => self.class_names.get(i).cloned().unwrap_or_default(),
                };
                let c = self.classes.get(i).unwrap_or(&empty);
                ClassSummary::new(
                    name,
                    c.completed,
                    c.rejected,
                    c.ttft.stats(),
                    c.tpot.stats(),
                    c.e2el.stats(),
                )
            })
            .collect()
    }

    /// What the collector's memory grows with: the number of per-class entries and the
    /// lengths of all histogram count arrays.
    #[cfg(test)]
    fn footprint(&self) -> usize {
        let hists = [&self.ttft, &self.tpot, &self.e2el, &self.queue, &self.itl]
            .into_iter()
            .chain(
                self.classes
                    .iter()
                    .flat_map(|c| [&c.ttft, &c.tpot, &c.e2el]),
            )
            .map(LatencyAccumulator::histogram_slots)
            .sum::<usize>();
        self.classes.len() + hists
    }
}

/// Time per output token in whole nanoseconds, (finish - first token) / (output_len - 1)
/// rounded to the nearest nanosecond (halves up), for a request with a first token and more
/// than one output token (vLLM's definition, as [`RequestRecord::tpot_s`]).
///
/// Needs `first_token_ns <= finish_ns` (checked by [`validate_request`]).
fn tpot_ns(r: &RequestRecord) -> Option<u64> {
    let first = r.first_token_ns?;
    if r.output_len <= 1 {
        return None;
    }
    let span = r.finish_ns - first;
    let k = u64::from(r.output_len - 1);
    // The remainder is below k < 2^32, so doubling it cannot overflow.
    let round_up = (span % k) * 2 >= k;
    Some(span / k + u64::from(round_up))
}

/// The name of class index `class`: its entry in `names`, or `class<index>`.
fn class_name(names: &[String], class: u16) -> Cow<'_, str> {
    match names.get(usize::from(class)) {
        Some(name) => Cow::Borrowed(name.as_str()),
        None => Cow::Owned(format!("class{class}")),
    }
}

/// Checks the orderings the latency arithmetic relies on.
fn validate_request(r: &RequestRecord) -> Result<(), AnalysisError> {
    let bad = |reason| {
        Err(AnalysisError::InvalidRequest {
            request_id: r.request_id,
            reason,
        })
    };
    if r.finish_ns < r.arrival_ns {
        return bad("finish precedes arrival");
    }
    if r.first_scheduled_ns.is_some_and(|t| t < r.arrival_ns) {
        return bad("first scheduling precedes arrival");
    }
    if let Some(t) = r.first_token_ns {
        if t < r.arrival_ns {
            return bad("first token precedes arrival");
        }
        if t > r.finish_ns {
            return bad("first token follows finish");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use engine::request::FinishReason;

    use super::*;
    use crate::stats::MetricStats;

    /// A writer whose bytes the test can read after the collector is done with it.
    #[derive(Clone, Default)]
    struct Shared(Rc<RefCell<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.borrow().clone()).expect("CSV output is UTF-8")
        }
    }

    const MS: u64 = 1_000_000;

    #[allow(clippy::too_many_arguments)]
    fn req(
        id: u64,
        class: u16,
        arrival: u64,
        sched: Option<u64>,
        first: Option<u64>,
        finish: u64,
        prompt: u32,
        output: u32,
        reason: FinishReason,
    ) -> RequestRecord {
        RequestRecord {
            request_id: id,
            class,
            arrival_ns: arrival,
            first_scheduled_ns: sched,
            first_token_ns: first,
            finish_ns: finish,
            prompt_len: prompt,
            output_len: output,
            generated_tokens: output,
            max_tokens: if reason.is_rejection() { 100 } else { output },
            cached_tokens: 0,
            num_preemptions: 0,
            finish_reason: reason,
        }
    }

    /// Three completed requests and one rejection, worked out by hand:
    ///
    /// | id | class | arrival | sched | first token | finish | out | TTFT | TPOT | E2EL |
    /// |----|-------|---------|-------|-------------|--------|-----|------|------|------|
    /// | 0  | chat  | 0       | 1 ms  | 100 ms      | 1.1 s  | 11  | 100  | 100  | 1100 |
    /// | 1  | code  | 0.5 s   | 0.5 s | 0.7 s       | 1.7 s  | 5   | 200  | 250  | 1200 |
    /// | 2  | chat  | 1.0 s   | 1.05 s| 1.3 s       | 1.3 s  | 1   | 300  | -    | 300  |
    /// | 3  | code  | 2.0 s   | -     | -           | 2.0 s  | 0   | rejected           |
    fn records() -> Vec<RequestRecord> {
        vec![
            req(
                0,
                0,
                0,
                Some(MS),
                Some(100 * MS),
                1100 * MS,
                100,
                11,
                FinishReason::Length,
            ),
            req(
                1,
                1,
                500 * MS,
                Some(500 * MS),
                Some(700 * MS),
                1700 * MS,
                200,
                5,
                FinishReason::Stop,
            ),
            req(
                2,
                0,
                1000 * MS,
                Some(1050 * MS),
                Some(1300 * MS),
                1300 * MS,
                50,
                1,
                FinishReason::Length,
            ),
            req(
                3,
                1,
                2000 * MS,
                None,
                None,
                2000 * MS,
                5000,
                0,
                FinishReason::RejectedTooLong,
            ),
        ]
    }

    fn steps() -> Vec<StepRecord> {
        vec![
            StepRecord {
                step: 0,
                start_ns: 0,
                duration_ns: 1_500_000,
                num_seqs: 2,
                num_batched_tokens: 300,
                num_prefill_tokens: 200,
                num_decode_tokens: 100,
                num_waiting: 0,
                num_running: 2,
                num_preempted: 1,
                kv_blocks_used: 10,
                kv_usage: 0.25,
                mbu: 0.1,
                mfu: 0.05,
                kv_tokens: 120,
                kv_slots: 160,
                ..StepRecord::default()
            },
            StepRecord {
                step: 1,
                start_ns: 1_500_000,
                duration_ns: 20_000_001,
                num_seqs: 4,
                num_batched_tokens: 4,
                num_prefill_tokens: 0,
                num_decode_tokens: 4,
                num_waiting: 3,
                num_running: 4,
                num_preempted: 2,
                kv_blocks_used: 20,
                kv_usage: 0.5,
                mbu: 0.123_456_789,
                mfu: 0.0,
                kv_tokens: 300,
                kv_slots: 320,
                ..StepRecord::default()
            },
        ]
    }

    fn info() -> RunInfo {
        RunInfo {
            scenario: "s".into(),
            variant: "v".into(),
            backend: "sim".into(),
            kv_pool_blocks: 40,
            kv_blocks_in_use_at_end: 0,
            evictions: 0,
            wall_time_s: 0.5,
            spec: Vec::new(),
            offload: None,
        }
    }

    fn run(slo: Slo) -> Summary {
        let mut c = RunCollector::new(slo, vec!["chat".into(), "code".into()]);
        for r in records() {
            c.record_request(&r).expect("valid record");
        }
        for s in steps() {
            c.record_step(&s).expect("valid step");
        }
        c.finish(info()).expect("summary")
    }

    /// Exact values (means, standard deviations), up to f64 rounding.
    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-9, "got {got}, want {want}");
    }

    /// Percentiles and medians, which come from HDR histograms: within 0.1 % relative.
    fn close_pct(got: f64, want: f64) {
        assert!(
            (got - want).abs() <= 1e-3 * want.abs(),
            "got {got}, want {want} (0.1 %)"
        );
    }

    #[test]
    fn summary_of_hand_made_records() {
        let s = run(Slo::default());
        assert_eq!(s.completed, 3);
        assert_eq!(s.num_rejected, 1);
        assert_eq!(s.total_input_tokens, 350);
        assert_eq!(s.total_output_tokens, 17);
        // Makespan includes the rejection: 2.0 s - 0.
        assert_eq!(s.duration, 2.0);
        assert_eq!(s.request_throughput, 1.5);
        assert_eq!(s.output_throughput, 8.5);
        assert_eq!(s.total_token_throughput, 183.5);
        assert_eq!(s.request_goodput, None);

        close(s.mean_ttft_ms, 200.0);
        close_pct(s.median_ttft_ms, 200.0);
        close(s.std_ttft_ms, (0.02f64 / 3.0).sqrt() * 1000.0);
        close_pct(s.p99_ttft_ms, 298.0); // index 1.98: 200 + 0.98 * 100

        // TPOT leaves out request 2 (one output token): [100, 250] ms.
        close(s.mean_tpot_ms, 175.0);
        close_pct(s.median_tpot_ms, 175.0);
        close(s.std_tpot_ms, 75.0);
        close_pct(s.p90_tpot_ms, 235.0); // index 0.9: 100 + 0.9 * 150

        close(s.mean_e2el_ms, 2600.0 / 3.0);
        close_pct(s.median_e2el_ms, 1100.0);
        close(s.mean_queue_ms, 17.0);
        close_pct(s.median_queue_ms, 1.0);

        assert_eq!(s.num_steps, 2);
        assert_eq!(s.num_preemptions, 3);
        assert_eq!(s.mean_batch_size, 3.0);
        assert_eq!(s.mean_batched_tokens, 152.0);
        assert_eq!(s.mean_kv_usage, 0.375);
        assert_eq!(s.max_kv_usage, 0.5);
        assert_eq!(s.kv_pool_blocks, 40);
        assert_eq!(s.leaked_blocks, 0);
        assert_eq!(s.sim_speed, 8.0); // 4 requests in 0.5 s

        assert_eq!(s.classes.len(), 2);
        let chat = &s.classes[0];
        assert_eq!(
            (chat.name.as_str(), chat.completed, chat.rejected),
            ("chat", 2, 0)
        );
        close(chat.mean_ttft_ms, 200.0);
        close(chat.mean_tpot_ms, 100.0);
        close_pct(chat.median_e2el_ms, 700.0);
        let code = &s.classes[1];
        assert_eq!(
            (code.name.as_str(), code.completed, code.rejected),
            ("code", 1, 1)
        );
        // A single value is reported exactly (the histogram is clamped to the exact
        // minimum and maximum).
        close(code.p99_tpot_ms, 250.0);
    }

    #[test]
    fn tpot_is_rounded_to_the_nearest_nanosecond() {
        let tpot = |first: u64, finish: u64, output: u32| {
            tpot_ns(&req(
                0,
                0,
                0,
                Some(0),
                Some(first),
                finish,
                1,
                output,
                FinishReason::Length,
            ))
        };
        assert_eq!(tpot(0, 10, 4), Some(3)); // 3.33 ns
        assert_eq!(tpot(0, 11, 4), Some(4)); // 3.67 ns
        assert_eq!(tpot(0, 3, 3), Some(2)); // 1.5 ns: halves round up
        assert_eq!(tpot(5, 5, 2), Some(0));
        assert_eq!(tpot(0, u64::MAX, 3), Some(u64::MAX / 2 + 1));
        assert_eq!(tpot(0, 1000, 1), None);
        assert_eq!(tpot(0, 1000, 0), None);
    }

    /// `n` completed or rejected requests over 3 classes, with latencies drawn by a small
    /// deterministic generator (xorshift64*) within fixed ranges; the first request of each
    /// class carries the largest latencies, so later ones fit in the histograms' range.
    fn synthetic(n: u64) -> impl Iterator<Item = RequestRecord> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |m: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D) % m
        };
        (0..n).map(move |i| {
            let class = (i % 3) as u16;
            let arrival = i * 5 * MS;
            if i >= 3 && next(100) == 0 {
                return req(
                    i,
                    class,
                    arrival,
                    None,
                    None,
                    arrival,
                    9000,
                    0,
                    FinishReason::RejectedTooLong,
                );
            }
            let (queue, ttft, output, tpot) = if i < 3 {
                (2000 * MS, 5000 * MS, 1001, 50 * MS)
            } else {
                (
                    next(2000 * MS),
                    next(5000 * MS),
                    1 + next(1000) as u32,
                    next(50 * MS),
                )
            };
            let ttft = ttft.max(queue);
            let finish = arrival + ttft + tpot * u64::from(output.saturating_sub(1));
            req(
                i,
                class,
                arrival,
                Some(arrival + queue),
                Some(arrival + ttft),
                finish,
                100 + (i % 50) as u32,
                output,
                FinishReason::Stop,
            )
        })
    }

    #[test]
    fn memory_does_not_grow_with_requests() {
        const N: u64 = 200_000;
        let slo = Slo {
            ttft_ms: Some(2500.0),
            tpot_ms: Some(30.0),
            e2el_ms: None,
        };
        let mut c = RunCollector::new(slo.clone(), vec!["a".into(), "b".into(), "c".into()]);
        let (mut ttfts, mut tpots, mut e2els, mut queues) = (vec![], vec![], vec![], vec![]);
        let mut good = 0u64;
        let mut footprint_after_warmup = None;
        for (i, r) in synthetic(N).enumerate() {
            c.record_request(&r).expect("valid record");
            if !r.finish_reason.is_rejection() {
                ttfts.extend(r.ttft_s());
                tpots.extend(r.tpot_s());
                e2els.push(r.e2el_s());
                queues.extend(r.queue_s());
                good += u64::from(slo.is_met(&r));
            }
            if i == 999 {
                footprint_after_warmup = Some(c.footprint());
            }
        }
        // 199,000 more requests and not one more histogram slot or per-class entry.
        assert_eq!(Some(c.footprint()), footprint_after_warmup);
        assert_eq!(c.classes.len(), 3);

        let s = c.finish(info()).expect("summary");
        assert_eq!(s.completed + s.num_rejected, N);
        assert_eq!(s.completed, e2els.len() as u64);
        assert!(s.num_rejected > 1000);
        assert_eq!(s.request_goodput, Some(good as f64 / s.duration));
        assert!(good > 0 && good < s.completed);

        // Means and standard deviations are exact (up to f64 rounding; TPOT up to its
        // rounding to whole nanoseconds); percentiles are within 0.1 %.
        let rel = |got: f64, want: f64, tol: f64| {
            assert!(
                (got - want).abs() <= tol * want.abs(),
                "got {got}, want {want}"
            );
        };
        for (values, got, mean_tol) in [
            (
                &ttfts,
                [
                    s.mean_ttft_ms,
                    s.std_ttft_ms,
                    s.median_ttft_ms,
                    s.p90_ttft_ms,
                    s.p95_ttft_ms,
                    s.p99_ttft_ms,
                ],
                1e-12,
            ),
            (
                &tpots,
                [
                    s.mean_tpot_ms,
                    s.std_tpot_ms,
                    s.median_tpot_ms,
                    s.p90_tpot_ms,
                    s.p95_tpot_ms,
                    s.p99_tpot_ms,
                ],
                1e-7,
            ),
            (
                &e2els,
                [
                    s.mean_e2el_ms,
                    s.std_e2el_ms,
                    s.median_e2el_ms,
                    s.p90_e2el_ms,
                    s.p95_e2el_ms,
                    s.p99_e2el_ms,
                ],
                1e-12,
            ),
            (
                &queues,
                [
                    s.mean_queue_ms,
                    s.std_queue_ms,
                    s.median_queue_ms,
                    s.p90_queue_ms,
                    s.p95_queue_ms,
                    s.p99_queue_ms,
                ],
                1e-12,
            ),
        ] {
            let exact = MetricStats::from_seconds(values);
            rel(got[0], exact.mean, mean_tol);
            rel(got[1], exact.std, mean_tol);
            rel(got[2], exact.median, 1e-3);
            rel(got[3], exact.p90, 1e-3);
            rel(got[4], exact.p95, 1e-3);
            rel(got[5], exact.p99, 1e-3);
        }
    }

    #[test]
    fn goodput_counts_requests_meeting_every_bound() {
        // TTFT <= 250 ms and TPOT <= 200 ms: only request 0 (1 in 2 s).
        let s = run(Slo {
            ttft_ms: Some(250.0),
            tpot_ms: Some(200.0),
            e2el_ms: None,
        });
        assert_eq!(s.request_goodput, Some(0.5));

        // TPOT <= 100 ms: request 0 exactly on the bound, request 2 has no TPOT and
        // counts as 0 (vLLM), request 1 fails.
        let s = run(Slo {
            tpot_ms: Some(100.0),
            ..Slo::default()
        });
        assert_eq!(s.request_goodput, Some(1.0));

        // E2EL <= 1 s: only request 2.
        let s = run(Slo {
            e2el_ms: Some(1000.0),
            ..Slo::default()
        });
        assert_eq!(s.request_goodput, Some(0.5));
    }

    #[test]
    fn csv_rows_are_exact() {
        let (rq, st) = (Shared::default(), Shared::default());
        let mut c = RunCollector::new(Slo::default(), vec!["chat".into(), "code".into()])
            .with_csv(Box::new(rq.clone()), Box::new(st.clone()));
        for r in records() {
            c.record_request(&r).expect("valid record");
        }
        for s in steps() {
            c.record_step(&s).expect("valid step");
        }
        c.finish(info()).expect("summary");

        let requests = rq.text();
        let lines: Vec<&str> = requests.lines().collect();
        assert_eq!(
            lines[0],
            "request_id,class,arrival_s,first_scheduled_s,first_token_s,finish_s,prompt_len,\
             output_len,generated_tokens,max_tokens,cached_tokens,num_preemptions,ttft_ms,tpot_ms,e2el_ms,\
             queue_ms,finish_reason"
        );
        assert_eq!(
            lines[1],
            "0,chat,0.000000000,0.001000000,0.100000000,1.100000000,100,11,11,11,0,0,\
             100.000000,100.000000,1100.000000,1.000000,length"
        );
        assert_eq!(
            lines[3],
            "2,chat,1.000000000,1.050000000,1.300000000,1.300000000,50,1,1,1,0,0,\
             300.000000,,300.000000,50.000000,length"
        );
        assert_eq!(
            lines[4],
            "3,code,2.000000000,,,2.000000000,5000,0,0,100,0,0,,,0.000000,,rejected_too_long"
        );
        assert_eq!(lines.len(), 5);

        let steps = st.text();
        let lines: Vec<&str> = steps.lines().collect();
        assert_eq!(
            lines[0],
            "step,start_s,duration_ms,num_seqs,num_batched_tokens,num_prefill_tokens,\
             num_decode_tokens,num_waiting,num_running,num_preempted,kv_blocks_used,\
             kv_usage,mbu,mfu,kv_tokens,kv_slots,num_swapped,swap_in_blocks,swap_out_blocks,\
             block_copies,recomputed_tokens,kv_external_fragmentation"
        );
        assert_eq!(
            lines[1],
            "0,0.000000000,1.500000,2,300,200,100,0,2,1,10,0.250000,0.100000,0.050000,120,160,0,0,0,0,0,0.000000"
        );
        assert_eq!(
            lines[2],
            "1,0.001500000,20.000001,4,4,0,4,3,4,2,20,0.500000,0.123457,0.000000,300,320,0,0,0,0,0,0.000000"
        );
    }

    #[test]
    fn empty_run_has_headers_zeros_and_serialises() {
        let (rq, st) = (Shared::default(), Shared::default());
        let c = RunCollector::new(
            Slo {
                ttft_ms: Some(100.0),
                ..Slo::default()
            },
            vec!["only".into()],
        )
        .with_csv(Box::new(rq.clone()), Box::new(st.clone()));
        let s = c
            .finish(RunInfo {
                wall_time_s: 0.0,
                ..RunInfo::default()
            })
            .expect("summary");
        assert_eq!(rq.text().lines().count(), 1);
        assert_eq!(st.text().lines().count(), 1);
        assert_eq!(s.request_goodput, Some(0.0));
        assert_eq!(s.classes.len(), 1);

        let json = serde_json::to_value(&s).expect("serialises");
        fn check(v: &serde_json::Value) {
            match v {
                serde_json::Value::Number(n) => {
                    assert!(n.as_f64().is_some_and(f64::is_finite), "{n}")
                }
                serde_json::Value::Array(a) => a.iter().for_each(check),
                serde_json::Value::Object(o) => o.values().for_each(check),
                _ => {}
            }
        }
        check(&json);
        let text = serde_json::to_string(&s).expect("serialises");
        assert!(!text.contains("NaN") && !text.contains("null,\"slo\""));
        let back: Summary = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, s);
    }

    #[test]
    fn inconsistent_records_are_errors_not_panics() {
        let mut c = RunCollector::new(Slo::default(), Vec::new());
        let mut r = records()[0].clone();
        r.first_token_ns = Some(2000 * MS); // after the finish
        let err = c.record_request(&r).expect_err("rejected");
        assert!(err.to_string().contains("request 0"), "{err}");
        let mut r = records()[1].clone();
        r.arrival_ns = 600 * MS; // after the first scheduling
        assert!(c.record_request(&r).is_err());
        let mut s = steps()[0].clone();
        s.kv_usage = f64::NAN;
        assert!(c.record_step(&s).is_err());
        let sum = c.finish(RunInfo::default()).expect("summary");
        assert_eq!((sum.completed, sum.num_steps), (0, 0));
    }

    #[test]
    fn unnamed_class_indices_get_a_name() {
        let mut c = RunCollector::new(Slo::default(), Vec::new());
        for r in records() {
            c.record_request(&r).expect("valid record");
        }
        let s = c.finish(info()).expect("summary");
        let names: Vec<&str> = s.classes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["class0", "class1"]);
    }

    #[test]
    fn itl_goes_into_the_summary() {
        let mut c = RunCollector::new(Slo::default(), Vec::new());
        c.record_itl(&[10 * MS, 20 * MS]);
        c.record_itl(&[30 * MS]);
        let s = c.finish(info()).expect("summary");
        close(s.mean_itl_ms, 20.0);
        close(s.std_itl_ms, (200.0f64 / 3.0).sqrt());
        assert!((s.median_itl_ms - 20.0).abs() < 0.02);
    }
}
