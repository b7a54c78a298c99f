//! Real runtimes under the engine.
//!
//! - Invariant 10 (DESIGN §3): a prompt's greedy output from the CPU runtime is the same
//!   alone, batched with others, chunked in prefill, with prefix-cache hits and after a
//!   preemption and recompute.
//! - Backend conformance: any backend, given the same step durations, leads the scheduler
//!   and block manager to the same decisions as the simulation, leaks no block and ends
//!   every request ([`conformance`]; run here on the cost model and the CPU runtime).

use std::collections::HashMap;

use engine::backend::Backend;
use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::eviction::EvictionKind;
use engine::plan::{StepOutcome, WorkKind};
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};
use engine::spec::{Acceptance, DynamicK, Method, SpecConfig, SpecStats};

/// One engine configuration.
struct Setup {
    kind: SchedulerKind,
    budget: u32,
    blocks: u32,
    prefix_caching: bool,
    /// Speculative decoding: the engine's settings and the runtime's self-speculation
    /// layers (`None`: the engine's n-gram drafts).
    spec: Option<(SpecConfig, Option<usize>)>,
}

/// Greedy speculation with `k` drafts by `method` (the acceptance is the simulation's,
/// unused by a real runtime).
fn spec(method: Method, k: u32) -> SpecConfig {
    SpecConfig {
        method,
        k,
        acceptance: Acceptance::iid(0.5, k).expect("rate"),
        class_acceptance: Vec::new(),
        ngram_min: 1,
        ngram_max: 3,
        dynamic: DynamicK::Off,
    }
}

/// Serves `requests` on the CPU runtime under `setup`; returns each request's generated
/// tokens and its record.
fn serve(
    g: &kernels::gguf::Gguf,
    setup: &Setup,
    requests: &[Request],
) -> (HashMap<u64, Vec<u32>>, Vec<RequestRecord>, SpecStats) {
    let block_size = 4;
    let mut rt = kernels::cpu::CpuRuntime::from_gguf(g, block_size, setup.blocks).expect("runtime");
    rt.set_self_speculation(setup.spec.as_ref().and_then(|(_, layers)| *layers));
    let mut backend = kernels::cpu::CpuBackend::new(rt);
    let cfg = SchedulerConfig {
        kind: setup.kind,
        max_num_seqs: 4,
        max_num_batched_tokens: setup.budget,
        max_model_len: 40,
        block_size,
        pool_tokens: u64::from(setup.blocks * block_size),
        want_block_tables: true,
        keep_tokens: true,
        prefix_caching: setup.prefix_caching,
        speculative: setup.spec.as_ref().map(|(s, _)| s.clone()),
        ..SchedulerConfig::default()
    };
    let bm = if setup.prefix_caching {
        BlockManager::with_prefix_caching(setup.blocks, block_size, EvictionKind::Lru.policy())
    } else {
        BlockManager::new(setup.blocks, block_size)
    };
    let mut cores = Cores::new(Scheduler::new(cfg).expect("config"), bm);
    let (plans, outcomes, records) = drive(&mut cores, &mut backend, requests, 1_000_000);
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    for (plan, outcome) in plans.iter().zip(&outcomes) {
        let mut drawn = outcome.sampled.iter();
        let mut accepted = outcome.accepted.iter();
        for w in plan.work.iter().filter(|w| w.sample) {
            let n = match w.kind {
                WorkKind::Verify => accepted.next().copied().unwrap_or(0) + 1,
                _ => w.num_samples.max(1),
            };
            for _ in 0..n {
                if let Some(&t) = drawn.next() {
                    tokens.entry(w.seq).or_default().push(t);
                }
            }
        }
    }
    // Tokens past max_tokens (a verify step's last ones) were never committed.
    for r in requests {
        if let Some(t) = tokens.get_mut(&r.id) {
            t.truncate(r.max_tokens as usize);
        }
    }
    let mut stats = SpecStats::default();
    for s in cores.scheduler.spec_stats() {
        stats.merge(s);
    }
    (tokens, records, stats)
}

/// Every step a backend executes under a fixed clock: `(plans, sampled tokens, records)`
/// from serving `requests` on `cores` with `backend`, each step's duration replaced by
/// `step_ns` so that only the backend's tokens could change what the engine does. The pool
/// invariants are checked after every step.
fn drive(
    cores: &mut Cores,
    backend: &mut dyn Backend,
    requests: &[Request],
    step_ns: u64,
) -> (
    Vec<engine::plan::StepPlan>,
    Vec<StepOutcome>,
    Vec<RequestRecord>,
) {
    let mut plans = Vec::new();
    let mut sampled = Vec::new();
    let mut records = Vec::new();
    let mut pending = requests.iter().cloned().peekable();
    let mut now = 0u64;
    for _ in 0..10_000 {
        while let Some(r) = pending.next_if(|r| r.arrival <= now) {
            records.extend(cores.scheduler.add_request(r, now));
        }
        let Some(planned) = cores.plan(now) else {
            match pending.peek() {
                Some(r) => {
                    now = r.arrival;
                    continue;
                }
                None => break,
            }
        };
        let mut outcome = backend.execute(&planned.plan).expect("step");
        assert_eq!(
            outcome.sampled.len(),
            StepOutcome::expected_samples(&planned.plan, &outcome.accepted),
            "{}: one token per draw, accepted drafts + 1 per verify",
            backend.name()
        );
        outcome.duration = step_ns;
        now += step_ns;
        let result = cores.commit(&planned.plan, &outcome, now).expect("commit");
        records.extend(result.finished);
        cores
            .block_manager
            .check_invariants()
            .expect("pool invariants");
        sampled.push(outcome);
        plans.push(planned.plan);
    }
    records.sort_by_key(|r| r.request_id);
    (plans, sampled, records)
}

/// [`drive`]'s plans without their token ids (which differ between backends; the
/// decisions must not) and its records.
fn conformance(
    cores: &mut Cores,
    backend: &mut dyn Backend,
    requests: &[Request],
    step_ns: u64,
) -> (Vec<engine::plan::StepPlan>, Vec<RequestRecord>) {
    let (mut plans, _, records) = drive(cores, backend, requests, step_ns);
    for w in plans.iter_mut().flat_map(|p| p.work.iter_mut()) {
        w.token_ids.clear();
    }
    (plans, records)
}

#[test]
fn backends_conform_to_the_engine() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let g = kernels::gguf::Gguf::open(&path).expect("gguf");
    let (block_size, blocks) = (4u32, 12u32);
    // Staggered arrivals, prompts of 5-21 tokens (ids inside the vocabulary), a cache too
    // small for all of them: chunked prefill, preemption and recompute all happen.
    let requests: Vec<Request> = (0..6u64)
        .map(|i| {
            let ids: Vec<u32> = (0..5 + 3 * i as u32)
                .map(|j| 100 + 37 * j + i as u32)
                .collect();
            Request::new(i, i * 2_000_000, 0, 6 + i as u32 % 3).with_tokens(ids)
        })
        .collect();
    let cores = || {
        let cfg = SchedulerConfig {
            kind: SchedulerKind::Chunked,
            max_num_seqs: 4,
            max_num_batched_tokens: 12,
            max_model_len: 40,
            block_size,
            pool_tokens: u64::from(blocks * block_size),
            want_block_tables: true,
            keep_tokens: true,
            ..SchedulerConfig::default()
        };
        Cores::new(
            Scheduler::new(cfg).expect("config"),
            BlockManager::new(blocks, block_size),
        )
    };
    let step_ns = 1_000_000;
    // The reference: the simulation's placeholder tokens.
    struct Simulated;
    impl Backend for Simulated {
        fn name(&self) -> &str {
            "simulated"
        }
        fn needs_block_tables(&self) -> bool {
            true
        }
        fn execute(
            &mut self,
            plan: &engine::plan::StepPlan,
        ) -> Result<engine::plan::StepOutcome, engine::backend::BackendError> {
            Ok(engine::plan::StepOutcome::simulated(plan, 1))
        }
    }
    let (want_plans, want_records) = conformance(&mut cores(), &mut Simulated, &requests, step_ns);
    // The cost model (its own durations are replaced too).
    let model = sim::catalog::find_model("smollm2-135m")
        .expect("catalog model")
        .clone();
    let gpu = sim::catalog::find_gpu("h100-sxm")
        .expect("catalog gpu")
        .clone();
    let mut costed = sim::cost_model::CostModelBackend::new(sim::cost_model::CostModel::new(
        sim::cost_model::Deployment {
            parallel: Default::default(),
            model,
            gpu,
            tp: 1,
            pp: 1,
            dtype: sim::catalog::Dtype::Bf16,
            kv_dtype: sim::catalog::Dtype::Bf16,
        },
        sim::cost_model::CostParams::default(),
    ));
    let (plans, _) = conformance(&mut cores(), &mut costed, &requests, step_ns);
    assert_eq!(
        plans, want_plans,
        "the cost model changed the engine's decisions"
    );
    let rt = kernels::cpu::CpuRuntime::from_gguf(&g, block_size, blocks).expect("runtime");
    let mut cpu = kernels::cpu::CpuBackend::new(rt);
    let mut served = cores();
    let (plans, records) = conformance(&mut served, &mut cpu, &requests, step_ns);
    // No leak: every block is back in the pool.
    assert_eq!(served.block_manager.num_used(), 0);
    assert_eq!(
        plans, want_plans,
        "the CPU runtime changed the engine's decisions"
    );
    assert_eq!(records.len(), requests.len());
    assert_eq!(
        records
            .iter()
            .map(|r| (r.request_id, r.num_preemptions, r.output_len))
            .collect::<Vec<_>>(),
        want_records
            .iter()
            .map(|r| (r.request_id, r.num_preemptions, r.output_len))
            .collect::<Vec<_>>()
    );
    assert!(
        records.iter().any(|r| r.num_preemptions > 0),
        "nothing was preempted"
    );
}

#[test]
fn greedy_output_does_not_depend_on_batching_chunking_caching_or_preemption() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let g = kernels::gguf::Gguf::open(&path).expect("gguf");
    let tok = kernels::tokenizer::Tokenizer::from_gguf(&g).expect("tokenizer");
    let system = "You are a helpful assistant. Answer briefly.";
    let prompts = [
        format!("{system} The capital of France is"),
        format!("{system} Photosynthesis is the process by which"),
        "1, 2, 3, 4, 5, 6,".to_string(),
        format!("{system} Once upon a time"),
    ];
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request::new(i as u64, 0, 0, 10).with_tokens(tok.encode(p, true)))
        .collect();
    // Alone: one request at a time, whole prompts, a roomy cache.
    let roomy = Setup {
        kind: SchedulerKind::Continuous,
        budget: 256,
        blocks: 64,
        prefix_caching: false,
        spec: None,
    };
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| {
            let (t, _, _) = serve(&g, &roomy, std::slice::from_ref(r));
            t[&r.id].clone()
        })
        .collect();
    assert!(alone.iter().all(|t| t.len() == 10));
    // Batched together; chunked in 7-token pieces with prefix caching (the requests share
    // the system prompt's blocks); and on a cache too small for all of them at once, so
    // that some are preempted and recomputed.
    let setups = [
        ("batched", roomy),
        (
            "chunked + prefix cache",
            Setup {
                kind: SchedulerKind::Chunked,
                budget: 7,
                blocks: 64,
                prefix_caching: true,
                spec: None,
            },
        ),
        (
            "preempted",
            Setup {
                kind: SchedulerKind::Chunked,
                budget: 16,
                blocks: 14,
                prefix_caching: false,
                spec: None,
            },
        ),
        // Speculative decoding with greedy verification (invariant 10): n-gram drafts
        // from the engine, and self-speculation by the model's first 10 layers, batched
        // with prefix caching.
        (
            "speculative n-gram",
            Setup {
                kind: SchedulerKind::Chunked,
                budget: 64,
                blocks: 64,
                prefix_caching: true,
                spec: Some((spec(Method::Ngram, 3), None)),
            },
        ),
        (
            "self-speculation",
            Setup {
                kind: SchedulerKind::Continuous,
                budget: 256,
                blocks: 64,
                prefix_caching: false,
                spec: Some((spec(Method::DraftModel, 3), Some(10))),
            },
        ),
    ];
    for (name, setup) in &setups {
        let (tokens, records, stats) = serve(&g, setup, &requests);
        if setup.spec.is_some() {
            assert!(stats.num_drafts > 0, "{name}: nothing was verified");
            eprintln!(
                "{name}: {} verify steps, acceptance rate {:.2}, mean acceptance length {:.2}",
                stats.num_drafts,
                stats.acceptance_rate(),
                stats.mean_acceptance_length()
            );
        }
        for (r, want) in requests.iter().zip(&alone) {
            assert_eq!(&tokens[&r.id], want, "{name}: request {}", r.id);
        }
        match *name {
            "chunked + prefix cache" => assert!(
                records.iter().any(|r| r.cached_tokens > 0),
                "{name}: no prefix-cache hit"
            ),
            "preempted" => assert!(
                records.iter().any(|r| r.num_preemptions > 0),
                "{name}: nothing was preempted"
            ),
            _ => {}
        }
    }
}

/// `sim speculate`'s measurement on real prompts (llama.cpp's oracle prompts): n-gram and
/// self-speculation leave the greedy output unchanged, and the measured per-position
/// acceptance is a valid synthetic acceptance for a simulation.
#[test]
fn measured_acceptance_feeds_back_into_a_simulation() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let g = kernels::gguf::Gguf::open(&path).expect("gguf");
    let prompts: Vec<Vec<u32>> = kernels::oracle::smollm2()
        .into_iter()
        .take(4)
        .map(|c| c.prompt_ids)
        .collect();
    for (method, layers) in [(Method::Ngram, None), (Method::DraftModel, Some(16))] {
        let spec = sim::speculate::greedy_spec(method, 3, 1, 4).expect("spec");
        let m = sim::speculate::measure(&g, &prompts, 24, None, spec, layers)
            .expect("identical outputs");
        let s = &m.speculative.spec;
        assert!(s.num_drafts > 0, "{method:?}: nothing verified");
        let rates = s.per_position();
        let a = Acceptance::from_rates(&rates).expect("non-increasing rates in [0, 1]");
        assert!((a.expected_tokens(3) - s.mean_acceptance_length()).abs() < 1e-9);
        let text = sim::speculate::report(&m, "x", 3);
        assert!(text.contains("acceptance = ["), "{text}");
    }
}

/// Writes `<dir>/<name>.toml`: 4 requests of 8-40 prompt tokens and `output` tokens each
/// on the GGUF at `gguf`, then `extra` (further tables).
fn gguf_scenario(
    dir: &std::path::Path,
    gguf: &std::path::Path,
    name: &str,
    output: u32,
    extra: &str,
) -> std::path::PathBuf {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            r#"
name = "{name}"
[model]
gguf = "{}"
[hardware]
gpu = "h100-sxm"
[engine]
max_model_len = 256
[workload]
num_requests = 4
arrival = {{ process = "poisson", rate = 50.0 }}
[[workload.class]]
name = "chat"
prompt = {{ dist = "uniform", min = 8, max = 40 }}
output = {{ dist = "fixed", value = {output} }}
{extra}"#,
            gguf.display()
        ),
    )
    .expect("write the scenario");
    file
}

/// `sim run --backend cpu` of a scenario with self-speculation: the real model drafts
/// with its first layers, the engine verifies, every request completes, and the run's
/// summary carries the measured acceptance.
#[test]
fn a_speculative_scenario_runs_on_the_cpu_runtime() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = gguf_scenario(
        dir.path(),
        &path,
        "spec-cpu",
        12,
        r#"[speculative]
method = "draft-model"
self_draft_layers = 12
k = 3
mean_acceptance_length = 2.0
[[variant]]
name = "plain"
speculative.method = "none"
[[variant]]
name = "self-spec"
"#,
    );
    let scn = sim::scenario::Scenario::load(&file, None).expect("loads");
    let opts = sim::run::RunOptions {
        backend: sim::run::BackendKind::Cpu,
        driver: sim::driver::DriverKind::Inline,
        parallel: false,
        ..sim::run::RunOptions::default()
    };
    let results = sim::run::run_scenario(&scn, &opts).expect("runs");
    for r in &results {
        assert_eq!(r.summary.completed, 4, "{}", r.summary.variant);
        assert_eq!(r.summary.total_output_tokens, 48);
        assert_eq!(r.summary.leaked_blocks, 0);
    }
    let spec = results[1]
        .summary
        .speculative
        .as_ref()
        .expect("acceptance measured");
    assert!(spec.num_drafts > 0 && spec.num_accepted_tokens <= spec.num_draft_tokens);
    assert!(results[0].summary.speculative.is_none());
}

/// `sim fidelity` end to end on the CPU runtime: the same scenario measured and simulated
/// with a calibration file, every metric of every variant compared in `fidelity.csv`.
#[test]
fn fidelity_compares_a_real_backend_with_the_cost_model() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = gguf_scenario(dir.path(), &path, "fid", 8, "");
    let calib = dir.path().join("calib.toml");
    std::fs::write(
        &calib,
        "[cost]\ngemm_memory_eff = 0.8\nstep_overhead_us = 50\n",
    )
    .expect("write");
    let out = dir.path().join("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(["fidelity", file.to_str().expect("utf-8"), "--calibration"])
        .arg(&calib)
        .args(["--backend", "cpu", "--out"])
        .arg(&out)
        .output()
        .expect("run sim");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(out.join("fidelity.csv")).expect("fidelity.csv");
    assert_eq!(csv.lines().count(), 1 + 14, "{csv}");
    assert!(csv.contains("base,p50 step time (ms),"), "{csv}");
    assert!(
        out.join("measured/base/steps.csv").exists()
            && out.join("simulated/base/steps.csv").exists()
    );
}

/// `sim claims --backend cpu`: the claims the CPU runtime can show (`scenarios/claims/cpu/`),
/// judged from measured runs of the real model. Wall-clock ratios are not pinned (timed
/// tests are not ours); what the engine decides is: greedy self-speculation emits the same
/// tokens alone and batched, so the acceptance at light and heavy load is the same, and a
/// round's measured cost and the perfect-draft speed-up are tied by `(k + 1) / cost`.
#[test]
fn claims_measured_on_the_cpu_runtime() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/claims/cpu");
    let backend = sim::run::BackendKind::Cpu;
    let files = sim::claims::claim_files(&dir, &[], backend).expect("claim files");
    assert_eq!(files.len(), sim::claims::known(backend).len());
    let opts = sim::claims::ClaimOptions {
        requests: Some(4),
        backend,
        model: Some(path),
        ..Default::default()
    };
    let rows: Vec<_> = files
        .iter()
        .flat_map(|f| sim::claims::evaluate(f, &opts).expect("judged"))
        .collect();
    assert!(rows
        .iter()
        .all(|r| r.claim.contains("measured on the CPU runtime")));
    let batching: Vec<_> = rows.iter().filter(|r| r.scenario == "batching").collect();
    // Padding is not executed by real runtimes: only the paged static baseline is measured.
    assert_eq!(batching.len(), 1);
    assert_eq!(batching[0].figures.len(), 4, "{:?}", batching[0]);
    assert!(batching[0]
        .figures
        .iter()
        .all(|(_, r)| r.is_finite() && *r > 0.0));
    let spec: Vec<_> = rows
        .iter()
        .filter(|r| r.scenario == "speculative")
        .collect();
    assert_eq!(spec.len(), 2);
    let fig = |i: usize, n: &str| spec[i].figure(n).unwrap_or_else(|| panic!("{n}"));
    let alpha = fig(0, "alpha_light");
    assert!((0.0..=1.0).contains(&alpha));
    assert_eq!(alpha, fig(1, "alpha_heavy"));
    // k = 2 in cpu/speculative.toml.
    let round = fig(0, "round_cost_steps");
    assert!(round > 0.0);
    assert!((fig(0, "speedup_if_all_accepted") - 3.0 / round).abs() < 1e-9);
}
