//! `sim speculate`: speculative decoding measured on a real model (the CPU runtime) under
//! the engine. Each prompt is served twice, with plain greedy decoding and with greedy
//! speculative decoding (n-gram drafts from the engine, or self-speculation by the
//! model's first layers); the outputs must be identical (DESIGN §3 invariant 10), and the
//! acceptance counters and decode speeds are reported. The per-position acceptance is
//! printed as the `acceptance = [...]` of a scenario's `[speculative]` section, so a
//! simulation can run on measured rates.

use engine::backend::Backend;
use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::StepOutcome;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};
use engine::spec::{Acceptance, DynamicK, Method, SpecConfig, SpecStats};

/// One served run: each request's tokens, the decode time and the counters.
#[derive(Debug, Clone, Default)]
pub struct Served {
    /// Generated tokens per request, in request order.
    pub tokens: Vec<Vec<u32>>,
    /// Time of the steps after each request's prefill, ns (the runtime's clock).
    pub decode_ns: u64,
    /// Tokens those steps produced.
    pub decode_tokens: u64,
    /// Acceptance counters (empty without speculation).
    pub spec: SpecStats,
}

/// What `sim speculate` measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Plain greedy decoding.
    pub plain: Served,
    /// Speculative decoding.
    pub speculative: Served,
}

/// Serves `prompts` one at a time (greedy, `max_tokens` each, stopping at `eos`) on a CPU
/// runtime of `g` under the engine, with speculation `spec` and self-speculation by the
/// first `draft_layers` layers.
pub fn serve(
    g: &kernels::gguf::Gguf,
    prompts: &[Vec<u32>],
    max_tokens: u32,
    eos: Option<u32>,
    spec: Option<SpecConfig>,
    draft_layers: Option<usize>,
) -> Result<Served, String> {
    let block_size = 16u32;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) as u32;
    let max_model_len = longest + max_tokens + 1;
    let k = spec.as_ref().map_or(0, |s| s.k);
    let blocks = (max_model_len + k).div_ceil(block_size) + 2;
    let mut rt =
        kernels::cpu::CpuRuntime::from_gguf(g, block_size, blocks).map_err(|e| e.to_string())?;
    rt.set_self_speculation(draft_layers);
    let mut backend = kernels::cpu::CpuBackend::new(rt);
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 1,
        max_num_batched_tokens: max_model_len.max(64),
        max_model_len,
        block_size,
        pool_tokens: u64::from(blocks * block_size),
        eos_token: eos,
        want_block_tables: true,
        keep_tokens: true,
        speculative: spec,
        ..SchedulerConfig::default()
    };
    let mut cores = Cores::new(
        Scheduler::new(cfg).map_err(|e| e.to_string())?,
        BlockManager::new(blocks, block_size),
    );
    let mut out = Served::default();
    let mut now = 0u64;
    for (i, p) in prompts.iter().enumerate() {
        let mut r = Request::new(i as u64, now, 0, max_tokens).with_tokens(p.clone());
        r.ignore_eos = eos.is_none();
        if let Some(rec) = cores.scheduler.add_request(r, now) {
            return Err(format!("prompt {i} rejected: {:?}", rec.finish_reason));
        }
        let mut tokens = Vec::new();
        while let Some(planned) = cores.plan(now) {
            let outcome = backend.execute(&planned.plan).map_err(|e| e.to_string())?;
            let prefill = planned
                .plan
                .work
                .iter()
                .any(|w| w.kind == engine::plan::WorkKind::Prefill);
            now += outcome.duration.max(1);
            let n = collect(&planned.plan, &outcome, &mut tokens);
            if !prefill {
                out.decode_ns += outcome.duration;
                out.decode_tokens += n as u64;
            }
            cores
                .commit(&planned.plan, &outcome, now)
                .map_err(|e| e.to_string())?;
        }
        tokens.truncate(max_tokens as usize);
        if let Some(pos) = eos.and_then(|e| tokens.iter().position(|&t| t == e)) {
            tokens.truncate(pos + 1);
        }
        out.tokens.push(tokens);
    }
    for s in cores.scheduler.spec_stats() {
        out.spec.merge(s);
    }
    Ok(out)
}

/// Appends the tokens a step drew to `tokens`; returns how many.
fn collect(plan: &engine::plan::StepPlan, outcome: &StepOutcome, tokens: &mut Vec<u32>) -> usize {
    let mut drawn = outcome.sampled.iter();
    let mut accepted = outcome.accepted.iter();
    let mut n = 0;
    for w in plan.work.iter().filter(|w| w.sample) {
        let count = match w.kind {
            engine::plan::WorkKind::Verify => accepted.next().copied().unwrap_or(0) + 1,
            _ => w.num_samples.max(1),
        };
        for _ in 0..count {
            if let Some(&t) = drawn.next() {
                tokens.push(t);
                n += 1;
            }
        }
    }
    n
}

/// Greedy speculation of `k` drafts by `method` (n-gram sizes `min_n..=max_n`).
pub fn greedy_spec(method: Method, k: u32, min_n: u32, max_n: u32) -> Result<SpecConfig, String> {
    let spec = SpecConfig {
        method,
        k,
        // The simulation's acceptance; a real runtime verifies for itself.
        acceptance: Acceptance::iid(0.5, k)?,
        class_acceptance: Vec::new(),
        ngram_min: min_n,
        ngram_max: max_n,
        dynamic: DynamicK::Off,
    };
    spec.validate()?;
    Ok(spec)
}

/// Runs both and checks invariant 10 (identical greedy tokens).
pub fn measure(
    g: &kernels::gguf::Gguf,
    prompts: &[Vec<u32>],
    max_tokens: u32,
    eos: Option<u32>,
    spec: SpecConfig,
    draft_layers: Option<usize>,
) -> Result<Measured, String> {
    let plain = serve(g, prompts, max_tokens, eos, None, None)?;
    let speculative = serve(g, prompts, max_tokens, eos, Some(spec), draft_layers)?;
    for (i, (a, b)) in plain.tokens.iter().zip(&speculative.tokens).enumerate() {
        if a != b {
            return Err(format!(
                "prompt {i}: speculative decoding changed the greedy output (invariant 10): {a:?} vs {b:?}"
            ));
        }
    }
    Ok(Measured { plain, speculative })
}

/// The report: counters, speeds and the scenario line to feed the rates back.
pub fn report(m: &Measured, method: &str, k: u32) -> String {
    let s = &m.speculative.spec;
    let speed = |x: &Served| {
        if x.decode_ns == 0 {
            0.0
        } else {
            x.decode_tokens as f64 / (x.decode_ns as f64 * 1e-9)
        }
    };
    let per: Vec<String> = s.per_position().iter().map(|r| format!("{r:.3}")).collect();
    let mut out = String::new();
    out.push_str(&format!(
        "{} prompts, {} tokens each way; outputs identical to plain greedy decoding\n",
        m.plain.tokens.len(),
        m.plain.tokens.iter().map(Vec::len).sum::<usize>()
    ));
    out.push_str(&format!(
        "{method}, k = {k}: {} verify steps, {} drafted, {} accepted: acceptance rate {:.3}, mean acceptance length {:.3} (SGLang accept length {:.3})\n",
        s.num_drafts,
        s.num_draft_tokens,
        s.num_accepted_tokens,
        s.acceptance_rate(),
        s.mean_acceptance_length(),
        s.accept_length()
    ));
    out.push_str(&format!("per-position acceptance: [{}]\n", per.join(", ")));
    out.push_str(&format!(
        "decode on this CPU: plain {:.1} tok/s, speculative {:.1} tok/s ({:.2}x)\n",
        speed(&m.plain),
        speed(&m.speculative),
        speed(&m.speculative) / speed(&m.plain).max(f64::MIN_POSITIVE)
    ));
    if s.num_drafts > 0 {
        // Unconditional per-position rates are non-increasing by construction.
        out.push_str(&format!(
            "as a scenario's measured rates:\n[speculative]\nk = {}\nacceptance = [{}]\n",
            per.len(),
            per.join(", ")
        ));
    }
    out
}
