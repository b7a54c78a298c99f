//! [`RunCollector`]: streams a run's records into CSV files and running statistics.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use engine::record::{RequestRecord, StepRecord};

use crate::error::AnalysisError;
use crate::itl::ItlAccumulator;
use crate::rows::{CsvSink, REQUESTS_CSV_HEADER, STEPS_CSV_HEADER};
use crate::slo::Slo;
use crate::stats::{finite, ratio, MetricStats};
use crate::summary::{ClassSummary, Summary};

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
    /// Wall-clock time the simulation took (s).
    pub wall_time_s: f64,
}

/// The metrics kept for one completed request (seconds).
#[derive(Debug, Clone, Copy)]
struct RequestSample {
    class: u16,
    ttft_s: Option<f64>,
    tpot_s: Option<f64>,
    e2el_s: f64,
    queue_s: Option<f64>,
}

/// Collects a run's records as they are produced and computes its [`Summary`].
///
/// Memory does not grow with the number of steps: step records are folded into sums and
/// (optionally) written straight to `steps.csv`. A few numbers are kept per completed
/// request for exact percentiles; inter-token gaps go into an HDR histogram.
pub struct RunCollector {
    slo: Slo,
    class_names: Vec<String>,
    requests_csv: Option<CsvSink>,
    steps_csv: Option<CsvSink>,

    samples: Vec<RequestSample>,
    /// Rejected requests per class index.
    rejected: Vec<u64>,
    num_rejected: u64,
    total_input_tokens: u64,
    total_output_tokens: u64,
    first_arrival_ns: Option<u64>,
    last_finish_ns: Option<u64>,
    good: u64,

    num_steps: u64,
    num_preemptions: u64,
    sum_seqs: u64,
    sum_batched_tokens: u64,
    sum_kv_usage: f64,
    max_kv_usage: f64,

    itl: ItlAccumulator,
}

impl std::fmt::Debug for RunCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCollector")
            .field("slo", &self.slo)
            .field("class_names", &self.class_names)
            .field("completed", &self.samples.len())
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
            samples: Vec::new(),
            rejected: Vec::new(),
            num_rejected: 0,
            total_input_tokens: 0,
            total_output_tokens: 0,
            first_arrival_ns: None,
            last_finish_ns: None,
            good: 0,
            num_steps: 0,
            num_preemptions: 0,
            sum_seqs: 0,
            sum_batched_tokens: 0,
            sum_kv_usage: 0.0,
            max_kv_usage: 0.0,
            itl: ItlAccumulator::new(),
        }
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

    fn with_csv_named(
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

        self.first_arrival_ns = Some(
            self.first_arrival_ns
                .map_or(r.arrival_ns, |t| t.min(r.arrival_ns)),
        );
        self.last_finish_ns = Some(
            self.last_finish_ns
                .map_or(r.finish_ns, |t| t.max(r.finish_ns)),
        );

        if r.finish_reason.is_rejection() {
            let idx = usize::from(r.class);
            if self.rejected.len() <= idx {
                self.rejected.resize(idx + 1, 0);
            }
            self.rejected[idx] += 1;
            self.num_rejected += 1;
            return Ok(());
        }

        self.total_input_tokens += u64::from(r.prompt_len);
        self.total_output_tokens += u64::from(r.output_len);
        let sample = RequestSample {
            class: r.class,
            ttft_s: r.ttft_s(),
            tpot_s: r.tpot_s(),
            e2el_s: r.e2el_s(),
            queue_s: r.queue_s(),
        };
        if self
            .slo
            .is_met_by(sample.ttft_s, sample.tpot_s, sample.e2el_s)
        {
            self.good += 1;
        }
        self.samples.push(sample);
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
        self.sum_seqs += u64::from(s.num_seqs);
        self.sum_batched_tokens += u64::from(s.num_batched_tokens);
        self.sum_kv_usage += s.kv_usage;
        self.max_kv_usage = self.max_kv_usage.max(s.kv_usage);
        Ok(())
    }

    /// Records inter-token gaps (ns): every gap between consecutive tokens of a request.
    pub fn record_itl(&mut self, gaps_ns: &[u64]) {
        self.itl.record(gaps_ns);
    }

    /// Flushes writers and computes the summary.
    pub fn finish(mut self, info: RunInfo) -> Result<Summary, AnalysisError> {
        if let Some(sink) = self.requests_csv.take() {
            sink.finish()?;
        }
        if let Some(sink) = self.steps_csv.take() {
            sink.finish()?;
        }

        let completed = self.samples.len() as u64;
        let duration = match (self.first_arrival_ns, self.last_finish_ns) {
            (Some(first), Some(last)) => engine::record::ns_to_s(last.saturating_sub(first)),
            _ => 0.0,
        };
        let ttfts: Vec<f64> = self.samples.iter().filter_map(|s| s.ttft_s).collect();
        let tpots: Vec<f64> = self.samples.iter().filter_map(|s| s.tpot_s).collect();
        let e2els: Vec<f64> = self.samples.iter().map(|s| s.e2el_s).collect();
        let queues: Vec<f64> = self.samples.iter().filter_map(|s| s.queue_s).collect();
        let ttft = MetricStats::from_seconds(&ttfts);
        let tpot = MetricStats::from_seconds(&tpots);
        let e2el = MetricStats::from_seconds(&e2els);
        let queue = MetricStats::from_seconds(&queues);
        let itl = self.itl.stats();

        let classes = self.class_summaries();
        let steps = self.num_steps as f64;
        let total_requests = completed + self.num_rejected;

        Ok(Summary {
            scenario: info.scenario,
            variant: info.variant,
            backend: info.backend,
            completed,
            num_rejected: self.num_rejected,
            total_input_tokens: self.total_input_tokens,
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
            mean_batch_size: ratio(self.sum_seqs as f64, steps),
            mean_batched_tokens: ratio(self.sum_batched_tokens as f64, steps),
            mean_kv_usage: ratio(self.sum_kv_usage, steps),
            max_kv_usage: finite(self.max_kv_usage),
            kv_pool_blocks: info.kv_pool_blocks,
            leaked_blocks: info.kv_blocks_in_use_at_end,
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
        let max_seen = self
            .samples
            .iter()
            .map(|s| usize::from(s.class) + 1)
            .max()
            .unwrap_or(0);
        let n = self
            .class_names
            .len()
            .max(self.rejected.len())
            .max(max_seen);
        let mut per_class: Vec<[Vec<f64>; 3]> = vec![Default::default(); n];
        let mut completed = vec![0u64; n];
        for s in &self.samples {
            let c = usize::from(s.class);
            completed[c] += 1;
            let [ttft, tpot, e2el] = &mut per_class[c];
            ttft.extend(s.ttft_s);
            tpot.extend(s.tpot_s);
            e2el.push(s.e2el_s);
        }
        per_class
            .into_iter()
            .enumerate()
            .map(|(i, [ttft, tpot, e2el])| {
                // `i < n` comes from class indices (u16) or from `class_names`; beyond
                // u16::MAX only names without records can occur.
                let name = match u16::try_from(i) {
                    Ok(c) => class_name(&self.class_names, c).into_owned(),
                    Err(_) => self.class_names.get(i).cloned().unwrap_or_default(),
                };
                ClassSummary::new(
                    name,
                    completed[i],
                    self.rejected.get(i).copied().unwrap_or(0),
                    MetricStats::from_seconds(&ttft),
                    MetricStats::from_seconds(&tpot),
                    MetricStats::from_seconds(&e2el),
                )
            })
            .collect()
    }
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
            wall_time_s: 0.5,
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

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-9, "got {got}, want {want}");
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
        close(s.median_ttft_ms, 200.0);
        close(s.std_ttft_ms, (0.02f64 / 3.0).sqrt() * 1000.0);
        close(s.p99_ttft_ms, 298.0); // index 1.98: 200 + 0.98 * 100

        // TPOT leaves out request 2 (one output token): [100, 250] ms.
        close(s.mean_tpot_ms, 175.0);
        close(s.median_tpot_ms, 175.0);
        close(s.std_tpot_ms, 75.0);
        close(s.p90_tpot_ms, 235.0); // index 0.9: 100 + 0.9 * 150

        close(s.mean_e2el_ms, 2600.0 / 3.0);
        close(s.median_e2el_ms, 1100.0);
        close(s.mean_queue_ms, 17.0);
        close(s.median_queue_ms, 1.0);

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
        close(chat.median_e2el_ms, 700.0);
        let code = &s.classes[1];
        assert_eq!(
            (code.name.as_str(), code.completed, code.rejected),
            ("code", 1, 1)
        );
        close(code.p99_tpot_ms, 250.0);
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
             output_len,max_tokens,cached_tokens,num_preemptions,ttft_ms,tpot_ms,e2el_ms,\
             queue_ms,finish_reason"
        );
        assert_eq!(
            lines[1],
            "0,chat,0.000000000,0.001000000,0.100000000,1.100000000,100,11,11,0,0,\
             100.000000,100.000000,1100.000000,1.000000,length"
        );
        assert_eq!(
            lines[3],
            "2,chat,1.000000000,1.050000000,1.300000000,1.300000000,50,1,1,0,0,\
             300.000000,,300.000000,50.000000,length"
        );
        assert_eq!(
            lines[4],
            "3,code,2.000000000,,,2.000000000,5000,0,100,0,0,,,0.000000,,rejected_too_long"
        );
        assert_eq!(lines.len(), 5);

        let steps = st.text();
        let lines: Vec<&str> = steps.lines().collect();
        assert_eq!(
            lines[0],
            "step,start_s,duration_ms,num_seqs,num_batched_tokens,num_prefill_tokens,\
             num_decode_tokens,num_waiting,num_running,num_preempted,kv_blocks_used,\
             kv_usage,mbu,mfu"
        );
        assert_eq!(
            lines[1],
            "0,0.000000000,1.500000,2,300,200,100,0,2,1,10,0.250000,0.100000,0.050000"
        );
        assert_eq!(
            lines[2],
            "1,0.001500000,20.000001,4,4,0,4,3,4,2,20,0.500000,0.123457,0.000000"
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
