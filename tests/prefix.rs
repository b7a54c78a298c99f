//! Prefix caching through the whole engine (scheduler + block manager), every scheduler and
//! eviction policy, over random workloads whose prompts share prefixes: DESIGN §3 invariants
//! 1-3 after every step, no leak, every request ends once, and hits are whole cached blocks
//! that never cover the last prompt token. Includes tiny pools, so preempted requests come
//! back and may re-hit only what is still cached.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::eviction::EvictionKind;
use engine::plan::StepOutcome;
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{
    AdmissionPolicy, QueuePolicy, Scheduler, SchedulerConfig, SchedulerKind, VictimPolicy,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    kind: SchedulerKind,
    eviction: EvictionKind,
    queue: QueuePolicy,
    admission: AdmissionPolicy,
    victim: VictimPolicy,
    watermark: u32,
    block_size: u32,
    blocks: u32,
    /// (arrival gap ns, prefix group, prompt length, output length)
    requests: Vec<(u64, u8, u32, u32)>,
}

const MAX_LEN: u32 = 96;

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just(SchedulerKind::Static),
            Just(SchedulerKind::Continuous),
            Just(SchedulerKind::Chunked)
        ],
        prop_oneof![
            Just(EvictionKind::Lru),
            Just(EvictionKind::Fifo),
            Just(EvictionKind::Lfu),
            Just(EvictionKind::Slru),
            Just(EvictionKind::Belady)
        ],
        prop::sample::select(vec![1u32, 2, 4, 8, 16]),
        1u32..4,
        prop::collection::vec((0u64..3000, 0u8..3, 1u32..64, 1u32..32), 1..24),
        (
            prop::sample::select(vec![
                QueuePolicy::Fcfs,
                QueuePolicy::Priority,
                QueuePolicy::Sjf,
                QueuePolicy::SjfOracle,
                QueuePolicy::Lpm,
            ]),
            prop::sample::select(vec![
                AdmissionPolicy::Optimistic,
                AdmissionPolicy::FullPrompt,
                AdmissionPolicy::WorstCase,
                AdmissionPolicy::MaxModelLen,
                AdmissionPolicy::Estimated,
            ]),
            prop::sample::select(vec![
                VictimPolicy::Newest,
                VictimPolicy::LowestPriority,
                VictimPolicy::FewestComputed,
            ]),
            0u32..3,
        ),
    )
        .prop_map(
            |(
                kind,
                eviction,
                block_size,
                mult,
                requests,
                (queue, admission, victim, watermark),
            )| Case {
                kind,
                eviction,
                queue,
                admission,
                victim,
                watermark,
                block_size,
                // From one max-length sequence (forces preemption) to a few.
                blocks: MAX_LEN.div_ceil(block_size) * mult,
                requests,
            },
        )
}

/// Prompt tokens: a 40-token prefix shared by the group, then request-specific tokens.
fn tokens(group: u8, id: u64, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| {
            if i < 40 {
                u32::from(group) * 1000 + i
            } else {
                100_000 + (id as u32) * 100 + i
            }
        })
        .collect()
}

fn run(c: &Case) -> Result<Vec<RequestRecord>, TestCaseError> {
    let cfg = SchedulerConfig {
        kind: c.kind,
        max_num_seqs: 8,
        max_num_batched_tokens: if c.kind == SchedulerKind::Chunked {
            24
        } else {
            MAX_LEN
        },
        max_model_len: MAX_LEN,
        pool_tokens: u64::from(c.blocks * c.block_size),
        eos_token: None,
        want_block_tables: true,
        keep_tokens: false,
        block_size: c.block_size,
        prefix_caching: true,
        queue: c.queue,
        queue_aging_ns: 50_000,
        admission: c.admission,
        victim: c.victim,
        watermark_blocks: c.watermark,
        sliding_window: None,
        speculative: None,
        static_padding: false,
        max_concurrent_batches: 1,
        batch_wait: None,
        arrival_poll: None,
        chunked_prefill: true,
        max_prefill_tokens: None,
    };
    let mut sched = Scheduler::new(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut bm = BlockManager::with_prefix_caching(c.blocks, c.block_size, c.eviction.policy());
    let mut records = Vec::new();
    let mut now = 0u64;
    let mut t = 0u64;
    let mut pending: Vec<Request> = c
        .requests
        .iter()
        .enumerate()
        .map(|(i, &(gap, group, p, o))| {
            t += gap;
            Request {
                priority: i32::from(group),
                ..Request::new(i as u64, t, p, o).with_tokens(tokens(group, i as u64, p))
            }
        })
        .collect();
    pending.reverse();
    let mut steps = 0;
    while !pending.is_empty() || sched.has_work() {
        while pending.last().is_some_and(|r| r.arrival <= now) {
            if let Some(r) = pending.pop() {
                if let Some(rej) = sched.add_request(r, now) {
                    records.push(rej);
                }
            }
        }
        if !sched.has_work() {
            if let Some(r) = pending.last() {
                now = r.arrival;
            }
            continue;
        }
        let req = sched.propose(now);
        let resp = bm.reserve(&req);
        for (k, &g) in resp.granted.iter().enumerate() {
            let hit = resp.hits[k];
            prop_assert_eq!(hit % c.block_size, 0, "hits are whole blocks");
            prop_assert!(
                hit < req.entries[g].total.max(1),
                "a hit never covers the last token"
            );
        }
        let plan = sched.apply(&req, resp, now);
        prop_assert!(bm.num_used() <= c.blocks);
        bm.check_invariants().map_err(TestCaseError::fail)?;
        let out = StepOutcome::simulated(&plan, 1000 + 10 * u64::from(plan.num_batched_tokens()));
        now += out.duration;
        let result = sched
            .commit(&plan, &out, now)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        bm.release(
            &result.cache,
            &result.rollback,
            &result.forks,
            &result.to_free,
        );
        bm.check_invariants().map_err(TestCaseError::fail)?;
        records.extend(result.finished);
        steps += 1;
        prop_assert!(steps < 100_000, "the run does not drain");
    }
    prop_assert_eq!(bm.num_used(), 0, "no block in use at the end");
    prop_assert_eq!(records.len(), c.requests.len(), "every request ends once");
    records.sort_by_key(|r| r.request_id);
    for (i, r) in records.iter().enumerate() {
        prop_assert_eq!(r.request_id, i as u64);
        if !r.finish_reason.is_rejection() {
            prop_assert_eq!(r.output_len, r.max_tokens);
            prop_assert!(r.cached_tokens < r.prompt_len.max(1));
            // Worst-case admission (and static batching) reserve everything up front; only
            // priority preemption (a higher-priority arrival) may still evict.
            let worst_case =
                c.admission == AdmissionPolicy::WorstCase && c.queue != QueuePolicy::Priority;
            if worst_case || c.kind == SchedulerKind::Static {
                prop_assert_eq!(r.num_preemptions, 0);
            }
        }
    }
    if c.queue == QueuePolicy::Fcfs {
        prop_assert_eq!(sched.fcfs_violations(), 0);
    }
    Ok(records)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn prefix_caching_keeps_the_invariants(c in case()) {
        let a = run(&c)?;
        // Invariant 11: deterministic.
        let b = run(&c)?;
        prop_assert_eq!(a, b);
    }
}

#[test]
fn shared_prefixes_hit() {
    // Four requests of one group, one after another: all but the first hit the shared
    // 40-token prefix (5 blocks of 8).
    let c = Case {
        kind: SchedulerKind::Chunked,
        eviction: EvictionKind::Lru,
        queue: QueuePolicy::Fcfs,
        admission: AdmissionPolicy::Optimistic,
        victim: VictimPolicy::Newest,
        watermark: 0,
        block_size: 8,
        blocks: 64,
        requests: vec![
            (0, 1, 60, 4),
            (100_000, 1, 50, 4),
            (100_000, 1, 41, 4),
            (100_000, 1, 40, 4),
        ],
    };
    let records = run(&c).unwrap_or_else(|e| panic!("{e}"));
    let hits: Vec<u32> = records.iter().map(|r| r.cached_tokens).collect();
    // The 40-token prompt hits 32: its last token (and so its last block) is recomputed.
    assert_eq!(hits, vec![0, 40, 40, 32]);
}

/// Runs `requests` through chunked prefill with an LRU prefix cache of `blocks` blocks of
/// 16 tokens and 1 ms steps; returns the records by request id.
fn run_requests(requests: Vec<Request>, blocks: u32) -> Vec<RequestRecord> {
    let cfg = SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 4096,
        max_model_len: 16384,
        pool_tokens: u64::from(blocks) * 16,
        prefix_caching: true,
        ..SchedulerConfig::default()
    };
    let bm = BlockManager::with_prefix_caching(blocks, 16, EvictionKind::Lru.policy());
    let mut cores = Cores::new(Scheduler::new(cfg).expect("valid config"), bm);
    let records = cores.replay(requests, 1_000_000, false).expect("replay");
    assert!(records.iter().all(|r| !r.finish_reason.is_rejection()));
    assert_eq!(cores.block_manager.num_used(), 0);
    records
}

/// Every request of the workload `cfg` under `seed`.
fn requests_of(cfg: &sim::workload::WorkloadConfig, seed: u64) -> Vec<Request> {
    sim::workload::Workload::open(cfg, std::path::Path::new("."), seed)
        .expect("open")
        .collect::<Result<_, _>>()
        .expect("requests")
}

/// Multi-turn conversations with a cache that never evicts and turns far apart: every
/// follow-up turn hits exactly the full blocks its previous turn computed (its prompt and
/// the answer's blocks, cached as they were generated, up to the answer's last token,
/// which is never computed), capped below its own last token.
#[test]
fn multi_turn_follow_ups_hit_the_previous_turn_and_its_answer() {
    use sim::workload::{MultiTurnConfig, WorkloadConfig};
    let toml = r#"
        num_requests = 400
        arrival = { process = "poisson", rate = 0.5 }
        [multi_turn]
        turns = { dist = "uniform", min = 1, max = 6 }
        user = { dist = "uniform", min = 1, max = 300 }
        output = { dist = "uniform", min = 1, max = 300 }
        think_time_s = 200.0
        system_prompt = { tokens = 100, groups = 3 }
    "#;
    let cfg: WorkloadConfig = toml::from_str(toml).expect("workload toml");
    let _: &MultiTurnConfig = cfg.multi_turn.as_ref().expect("multi_turn");
    let requests = requests_of(&cfg, 7);
    let records = run_requests(requests.clone(), 1 << 20);
    let (mut follow_ups, mut hit_answer) = (0, 0);
    for (r, rec) in requests.iter().zip(&records) {
        assert_eq!(rec.output_len, r.max_tokens);
        assert_eq!(r.scripted_output.len() as u32, r.max_tokens);
        if r.class == 0 {
            // A first turn can only share the system prompt with earlier conversations.
            assert!(rec.cached_tokens <= 96, "{rec:?}");
            continue;
        }
        // The previous turn: the request whose prompt + answer start this prompt.
        let prev = requests[..r.id as usize]
            .iter()
            .rev()
            .find(|p| {
                let n = p.prompt_tokens.len() + p.scripted_output.len();
                r.prompt_tokens.len() > n
                    && r.prompt_tokens[..p.prompt_tokens.len()] == p.prompt_tokens[..]
                    && r.prompt_tokens[p.prompt_tokens.len()..n] == p.scripted_output[..]
            })
            .expect("a follow-up has a previous turn");
        let computed = prev.prompt_len + prev.max_tokens - 1;
        let expected = (computed.min(r.prompt_len - 1) / 16) * 16;
        assert_eq!(rec.cached_tokens, expected, "request {}", r.id);
        follow_ups += 1;
        if expected > prev.prompt_len / 16 * 16 {
            hit_answer += 1;
        }
    }
    assert!(follow_ups > 100, "{follow_ups}");
    // Most follow-ups reuse blocks that were generated, not only prompt blocks.
    assert!(hit_answer * 2 > follow_ups, "{hit_answer} of {follow_ups}");
}

/// SGLang's generated-shared-prefix dataset: with a cache that never evicts, every request
/// but the first of its group hits the whole system prompt.
#[test]
fn generated_shared_prefix_hits_the_system_prompt() {
    use sim::workload::WorkloadConfig;
    let toml = r#"
        arrival = { process = "poisson", rate = 2.0 }
        [generated_shared_prefix]
        groups = 8
        prompts_per_group = 6
        system_prompt_len = 200
        question_len = 40
        output_len = 8
    "#;
    let cfg: WorkloadConfig = toml::from_str(toml).expect("workload toml");
    let requests = requests_of(&cfg, 3);
    assert_eq!(requests.len(), 48);
    assert!(requests
        .iter()
        .all(|r| r.prompt_len == 240 && r.max_tokens == 8));
    let records = run_requests(requests.clone(), 1 << 16);
    let mut seen = std::collections::HashSet::new();
    for (r, rec) in requests.iter().zip(&records) {
        let group = r.prompt_tokens[..200].to_vec();
        let expected = if seen.insert(group) { 0 } else { 192 };
        assert_eq!(rec.cached_tokens, expected, "request {}", r.id);
    }
    assert_eq!(seen.len(), 8);
}

/// The CPU offload tier on multi-turn chat (`scenarios/offload.toml`, its first 1,200
/// requests): the GPU cache of 4,000 blocks drops histories before their next turn; a
/// 64 GiB tier under it keeps them, so a turn loads its history over PCIe instead of
/// recomputing it. The hit rate rises by more than 20 points, most of it from the tier,
/// and mean TTFT falls; the tier never holds more than its capacity.
#[test]
fn offload_tier_raises_the_multi_turn_hit_rate() {
    let scn = sim::scenario::Scenario::load(std::path::Path::new("scenarios/offload.toml"), None)
        .expect("loads");
    let opts = sim::run::RunOptions {
        driver: sim::driver::DriverKind::Inline,
        requests: Some(1200),
        only: vec!["gpu-only".into(), "cpu-lru".into()],
        ..sim::run::RunOptions::default()
    };
    let results = sim::run::run_scenario(&scn, &opts).expect("runs");
    let get = |v: &str| summary_of(&results, v);
    let (gpu, cpu) = (get("gpu-only"), get("cpu-lru"));
    assert!(gpu.offload.is_none());
    let tier = cpu.offload.expect("tier figures");
    assert_hits_rise(cpu, gpu);
    assert!(tier.cpu_hit_rate > 0.15, "{tier:?}");
    assert!((tier.gpu_hit_rate + tier.cpu_hit_rate - cpu.prefix_cache_hit_rate).abs() < 1e-9);
    assert!(tier.blocks_at_end <= tier.capacity_blocks);
    assert_eq!(tier.capacity_blocks, 32_768, "64 GiB of 2 MiB blocks");
    assert!(cpu.mean_ttft_ms < gpu.mean_ttft_ms);
    assert_eq!(cpu.leaked_blocks, 0);
    // The actors read the same tier counters.
    let actors = sim::run::run_scenario(
        &scn,
        &sim::run::RunOptions {
            driver: sim::driver::DriverKind::Actors,
            only: vec!["cpu-lru".into()],
            ..opts.clone()
        },
    )
    .expect("runs");
    let a = &actors[0].summary;
    assert_eq!(a.offload, cpu.offload);
    assert_eq!(a.mean_ttft_ms, cpu.mean_ttft_ms);
}

/// `more`'s prefix-cache hit rate is over 20 points above `less`'s.
fn assert_hits_rise(more: &analysis::Summary, less: &analysis::Summary) {
    assert!(
        more.prefix_cache_hit_rate > less.prefix_cache_hit_rate + 0.2,
        "{} vs {}",
        more.prefix_cache_hit_rate,
        less.prefix_cache_hit_rate
    );
}

/// The summary of variant `v` among `results`.
fn summary_of<'a>(results: &'a [sim::run::VariantResult], v: &str) -> &'a analysis::Summary {
    &results
        .iter()
        .find(|r| r.summary.variant == v)
        .expect("variant")
        .summary
}

/// A disk tier under a small CPU tier (`scenarios/offload.toml`, its first 1,200 requests):
/// the 8 GiB CPU tier drops most histories, 64 GiB of disk keeps them, so the hit rate rises
/// by more than 20 points, nearly all of it read from disk (the hit rates by tier add up
/// to the prefix cache's). Whether that pays depends on the disk: reading a 2 MiB block at
/// 6 GB/s (0.35 ms) costs about what recomputing its 16 tokens does on an H100, while a
/// 25 GB/s array cuts mean TTFT below the CPU tier alone's.
#[test]
fn a_disk_tier_keeps_what_the_cpu_tier_drops() {
    let scn = sim::scenario::Scenario::load(std::path::Path::new("scenarios/offload.toml"), None)
        .expect("loads");
    let opts = sim::run::RunOptions {
        driver: sim::driver::DriverKind::Inline,
        requests: Some(1200),
        only: vec![
            "cpu-small-lru".into(),
            "cpu-small-disk".into(),
            "cpu-small-fast-disk".into(),
        ],
        ..sim::run::RunOptions::default()
    };
    let results = sim::run::run_scenario(&scn, &opts).expect("runs");
    let get = |v: &str| summary_of(&results, v);
    let (cpu, slow, fast) = (
        get("cpu-small-lru"),
        get("cpu-small-disk"),
        get("cpu-small-fast-disk"),
    );
    assert!(cpu.offload.expect("tier").disk.is_none());
    for s in [slow, fast] {
        let tier = s.offload.expect("tier");
        let disk = tier.disk.expect("disk tier");
        assert_hits_rise(s, cpu);
        assert!(disk.hit_rate > 0.15, "{disk:?}");
        assert!(
            (tier.gpu_hit_rate + tier.cpu_hit_rate + disk.hit_rate - s.prefix_cache_hit_rate).abs()
                < 1e-9
        );
        assert_eq!(disk.capacity_blocks, 32_768, "64 GiB of 2 MiB blocks");
        assert!(disk.blocks_at_end <= disk.capacity_blocks && disk.loads > 0);
        assert_eq!(s.leaked_blocks, 0);
    }
    assert!(
        fast.mean_ttft_ms < slow.mean_ttft_ms,
        "the disk's reads are priced"
    );
    assert!(fast.mean_ttft_ms < cpu.mean_ttft_ms);
}

/// A benchmark client's prompt pool (aiperf's 100 synthetic prompts, here 4): with a cache
/// that never evicts, the first request of each entry computes its prompt and every later
/// one hits all of it but the last token's block; without the pool, no prompt shares a
/// block with another.
#[test]
fn a_prompt_pool_hits_each_entry_after_its_first_use() {
    use sim::workload::WorkloadConfig;
    let toml = r#"
        num_requests = 40
        arrival = { process = "poisson", rate = 0.5 }
        [[class]]
        name = "pool"
        prompt = { dist = "uniform", min = 40, max = 200 }
        output = { dist = "uniform", min = 1, max = 20 }
        prompt_pool = { size = 4, sampling = "random" }
    "#;
    let cfg: WorkloadConfig = toml::from_str(toml).expect("workload toml");
    let requests = requests_of(&cfg, 3);
    let records = run_requests(requests.clone(), 1 << 20);
    let mut seen = std::collections::HashSet::new();
    let mut hits = 0;
    for (r, rec) in requests.iter().zip(&records) {
        if seen.insert(r.prompt_tokens.clone()) {
            assert_eq!(rec.cached_tokens, 0, "request {}", r.id);
        } else {
            assert_eq!(
                rec.cached_tokens,
                (r.prompt_len - 1) / 16 * 16,
                "request {}",
                r.id
            );
            hits += 1;
        }
    }
    assert_eq!(seen.len(), 4);
    assert_eq!(hits, 36);
    let unpooled = toml.replace("prompt_pool = { size = 4, sampling = \"random\" }", "");
    let cfg: WorkloadConfig = toml::from_str(&unpooled).expect("workload toml");
    let requests = requests_of(&cfg, 3);
    let records = run_requests(requests, 1 << 20);
    assert!(records.iter().all(|r| r.cached_tokens == 0));
}
