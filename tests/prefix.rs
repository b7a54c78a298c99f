//! Prefix caching through the whole engine (scheduler + block manager), every scheduler and
//! eviction policy, over random workloads whose prompts share prefixes: DESIGN §3 invariants
//! 1-3 after every step, no leak, every request ends once, and hits are whole cached blocks
//! that never cover the last prompt token. Includes tiny pools, so preempted requests come
//! back and may re-hit only what is still cached.

use engine::block_manager::BlockManager;
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
                id: i as u64,
                arrival: t,
                prompt_len: p,
                prompt_tokens: tokens(group, i as u64, p),
                max_tokens: o,
                ignore_eos: true,
                scripted_output: Vec::new(),
                priority: i32::from(group),
                class: 0,
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
        let duration = 1000 + 10 * u64::from(plan.num_batched_tokens());
        now += duration;
        let sampled = vec![0u32; plan.work.iter().filter(|w| w.sample).count()];
        let out = StepOutcome {
            duration,
            sampled,
            mbu: 0.0,
            mfu: 0.0,
        };
        let result = sched
            .commit(&plan, &out, now)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        bm.cache_blocks(&result.cache);
        bm.free_all(&result.to_free);
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
