//! Prefix caching against what the blocks really hold: a fuzz over every scheduler, eviction,
//! queue, admission and victim policy that tracks the tokens in each block, plus regression
//! tests for the Belady tie-break, its unhittable last prompt block, and prompt token lists
//! longer than the prompt.

use std::collections::HashMap;

/// What a KV slot holds in the shadow model: (sequence, position, prompt token if any).
type Slot = (u64, u32, Option<u32>);

use engine::block_manager::{BlockManager, CacheBlocks, EntryKind, ReserveEntry, ReserveRequest};
use engine::cores::Cores;
use engine::eviction::{Belady, EvictionKind, EvictionPolicy, Lru};
use engine::plan::StepOutcome;
use engine::prefix::block_hashes;
use engine::request::Request;
use engine::scheduler::{
    AdmissionPolicy, QueuePolicy, Scheduler, SchedulerConfig, SchedulerKind, VictimPolicy,
};

fn waiting(seq: u64, tokens: &[u32], bs: u32) -> ReserveEntry {
    let n = tokens.len() as u32;
    ReserveEntry {
        seq,
        kind: EntryKind::Waiting,
        slots: n,
        tokens: n,
        total: n,
        hashes: Some(block_hashes(tokens, bs).into()),
        write_from: 0,
        lookahead: 0,
        whole: false,
    }
}

fn admit(bm: &mut BlockManager, e: ReserveEntry) -> engine::block_manager::ReserveResponse {
    bm.reserve(&ReserveRequest {
        entries: vec![e],
        want_tables: true,
        ..ReserveRequest::default()
    })
}

/// Seq 1 computes prompt A (3 full blocks + 1 token) and finishes; seq 3 (another prompt)
/// forces one eviction; seq 2 (prompt A again, arriving later) is admitted. Belady must
/// hit at least as much as LRU: both have the same single future user for all three cached
/// blocks, so the tie must evict the deepest block (as every other policy does), not the
/// root (which makes the two deeper blocks unreachable).
fn scenario(policy: Box<dyn EvictionPolicy>) -> u32 {
    let bs = 4;
    let a: Vec<u32> = (0..13).collect();
    let b: Vec<u32> = (100..109).collect();
    let mut bm = BlockManager::with_prefix_caching(5, bs, policy);
    admit(&mut bm, waiting(1, &a, bs));
    bm.cache_blocks(&[CacheBlocks {
        seq: 1,
        first: 0,
        hashes: block_hashes(&a, bs),
    }]);
    bm.free(1);
    let r = admit(&mut bm, waiting(3, &b, bs));
    assert_eq!(r.granted, vec![0]);
    assert_eq!(r.evicted, 1);
    bm.free(3);
    let r = admit(&mut bm, waiting(2, &a, bs));
    assert_eq!(r.granted, vec![0]);
    bm.check_invariants().unwrap();
    r.hits[0]
}

#[test]
fn belady_tie_break_evicts_root_of_chain() {
    let bs = 4;
    let a: Vec<u32> = (0..13).collect();
    let b: Vec<u32> = (100..109).collect();
    let lru = scenario(Box::<Lru>::default());
    let belady = scenario(Box::new(Belady::from_requests(
        bs,
        vec![
            (1, 0, a.len() as u32, block_hashes(&a, bs)),
            (3, 1, b.len() as u32, block_hashes(&b, bs)),
            (2, 5, a.len() as u32, block_hashes(&a, bs)),
        ],
    )));
    assert_eq!(
        lru, 8,
        "LRU evicts the deepest block, the first two still hit"
    );
    assert!(
        belady >= lru,
        "Belady (offline optimum) hit {belady} tokens, LRU {lru}"
    );
}

// ---------------------------------------------------------------------------------------
// Randomized end-to-end run with a shadow of each block's content: a hit must return
// blocks holding exactly the prompt tokens it claims.

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MAX_LEN: u32 = 96;

/// One random engine run (scheduler, eviction policy, pool, arrivals all drawn from
/// `seed`) with every invariant checked after every step. Long (about 180 lines) on
/// purpose: the run is one loop whose state a reader follows top to bottom, and a failure
/// reproduces from the seed alone.
fn run_fuzz(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let kinds = [
        SchedulerKind::Static,
        SchedulerKind::Continuous,
        SchedulerKind::Chunked,
    ];
    let evs = [
        EvictionKind::Lru,
        EvictionKind::Fifo,
        EvictionKind::Lfu,
        EvictionKind::Slru,
        EvictionKind::Belady,
    ];
    let queues = [
        QueuePolicy::Fcfs,
        QueuePolicy::Priority,
        QueuePolicy::Sjf,
        QueuePolicy::SjfOracle,
    ];
    let adms = [
        AdmissionPolicy::Optimistic,
        AdmissionPolicy::FullPrompt,
        AdmissionPolicy::WorstCase,
    ];
    let vics = [
        VictimPolicy::Newest,
        VictimPolicy::LowestPriority,
        VictimPolicy::FewestComputed,
    ];
    let kind = kinds[rng.below(3) as usize];
    let ev = evs[rng.below(5) as usize];
    let bs = [1u32, 2, 4, 8, 16][rng.below(5) as usize];
    let blocks = MAX_LEN.div_ceil(bs) * (1 + rng.below(3) as u32);
    let n = 1 + rng.below(24);
    let mut t = 0;
    let mut reqs = Vec::new();
    for i in 0..n {
        t += rng.below(3000);
        let group = rng.below(3) as u32;
        let p = 1 + rng.below(63) as u32;
        let o = 1 + rng.below(31) as u32;
        let toks: Vec<u32> = (0..p)
            .map(|j| {
                if j < 40 {
                    group * 1000 + j
                } else {
                    100_000 + (i as u32) * 100 + j
                }
            })
            .collect();
        reqs.push(Request {
            priority: group as i32,
            ..Request::new(i, t, p, o).with_tokens(toks)
        });
    }
    // Every third chunked case mixes whole prompts only (its budget then holds the longest
    // sequence): a prompt is admitted when its uncached part fits what decodes leave.
    let whole = kind == SchedulerKind::Chunked && seed.is_multiple_of(3);
    let cfg = SchedulerConfig {
        kind,
        max_num_seqs: 8,
        max_num_batched_tokens: if kind == SchedulerKind::Chunked && !whole {
            24
        } else {
            MAX_LEN
        },
        max_model_len: MAX_LEN,
        pool_tokens: u64::from(blocks * bs),
        eos_token: None,
        want_block_tables: true,
        keep_tokens: false,
        block_size: bs,
        prefix_caching: true,
        queue: queues[rng.below(4) as usize],
        queue_aging_ns: 50_000,
        admission: adms[rng.below(3) as usize],
        victim: vics[rng.below(3) as usize],
        watermark_blocks: rng.below(3) as u32,
        sliding_window: None,
        speculative: None,
        static_padding: false,
        max_concurrent_batches: 1,
        batch_wait: None,
        arrival_poll: None,
        chunked_prefill: !whole,
        max_prefill_tokens: None,
    };
    let desc = format!("seed {seed} cfg {cfg:?} ev {ev:?} blocks {blocks}");
    let policy: Box<dyn EvictionPolicy> = if ev == EvictionKind::Belady {
        Box::new(Belady::from_requests(
            bs,
            reqs.iter().map(|r| {
                (
                    r.id,
                    r.arrival,
                    r.prompt_len,
                    block_hashes(&r.prompt_tokens, bs),
                )
            }),
        ))
    } else {
        ev.policy()
    };
    let prompts: HashMap<u64, Vec<u32>> = reqs
        .iter()
        .map(|r| (r.id, r.prompt_tokens.clone()))
        .collect();
    let mut sched = Scheduler::new(cfg).map_err(|e| e.to_string())?;
    let mut bm = BlockManager::with_prefix_caching(blocks, bs, policy);
    // Shadow content: block -> slot -> (seq, position) or prompt token.
    let mut content: Vec<Vec<Option<Slot>>> = vec![vec![None; bs as usize]; blocks as usize];
    let mut pending = reqs.clone();
    pending.reverse();
    let mut now = 0;
    let mut steps = 0;
    while !pending.is_empty() || sched.has_work() {
        while pending.last().is_some_and(|r| r.arrival <= now) {
            let r = pending.pop().unwrap();
            sched.add_request(r, now);
        }
        if !sched.has_work() {
            now = pending.last().unwrap().arrival;
            continue;
        }
        let req = sched.propose(now);
        let resp = bm.reserve(&req);
        if resp.hits.len() != resp.granted.len() {
            return Err(format!("{desc}: hits/granted lengths differ"));
        }
        for (k, &g) in resp.granted.iter().enumerate() {
            let hit = resp.hits[k];
            let e = &req.entries[g];
            if hit == 0 {
                continue;
            }
            if e.kind != EntryKind::Waiting {
                return Err(format!("{desc}: running entry with a hit"));
            }
            let table = &resp.tables[k];
            let prompt = &prompts[&e.seq];
            for p in 0..hit {
                let b = table[(p / bs) as usize];
                let c = content[b as usize][(p % bs) as usize];
                let tok = c.and_then(|c| c.2);
                if tok != prompt.get(p as usize).copied() {
                    return Err(format!(
                        "{desc}: seq {} hit {hit}: block {b} slot {} holds {c:?}, prompt token {:?}",
                        e.seq,
                        p % bs,
                        prompt.get(p as usize)
                    ));
                }
            }
        }
        let plan = sched.apply(&req, resp, now);
        bm.check_invariants().map_err(|e| format!("{desc}: {e}"))?;
        for w in &plan.work {
            let prompt = &prompts[&w.seq];
            for p in w.start..w.start + w.len {
                let b = w.block_table[(p / bs) as usize];
                let tok = if (p as usize) < prompt.len() {
                    Some(prompt[p as usize])
                } else {
                    None
                };
                content[b as usize][(p % bs) as usize] = Some((w.seq, p, tok));
            }
        }
        let out = StepOutcome::simulated(&plan, 1000 + 10 * u64::from(plan.num_batched_tokens()));
        now += out.duration;
        let result = sched.commit(&plan, &out, now).map_err(|e| e.to_string())?;
        bm.release(
            &result.cache,
            &result.rollback,
            &result.forks,
            &result.to_free,
        );
        bm.check_invariants().map_err(|e| format!("{desc}: {e}"))?;
        steps += 1;
        if steps > 100_000 {
            return Err(format!("{desc}: does not drain"));
        }
    }
    if bm.num_used() != 0 {
        return Err(format!("{desc}: leak"));
    }
    Ok(())
}

#[test]
fn fuzz_hit_content_matches_prompt() {
    for seed in 1..3000 {
        if let Err(e) = run_fuzz(seed) {
            panic!("{e}");
        }
    }
}

/// A request whose prompt is exactly k full blocks can hit at most k - 1 of them (the last
/// token is recomputed), yet Belady counts it as a pending user of its last block too, so it
/// protects a block that can never be hit and evicts one that will be: the "upper bound"
/// then hits less than LRU.
fn unhittable_scenario(policy: Box<dyn EvictionPolicy>) -> u32 {
    let bs = 4;
    let a9: Vec<u32> = (0..9).collect(); // blocks h0, h1 + 1 token
    let c5: Vec<u32> = (500..505).collect(); // block c0 + 1 token
    let d: Vec<u32> = (900..912).collect(); // 3 blocks
    let a8: Vec<u32> = (0..8).collect(); // exactly h0, h1: only h0 can hit
    let mut bm = BlockManager::with_prefix_caching(5, bs, policy);
    for (seq, p) in [(1u64, &a9), (4, &c5)] {
        admit(&mut bm, waiting(seq, p, bs));
        bm.cache_blocks(&[CacheBlocks {
            seq,
            first: 0,
            hashes: block_hashes(p, bs),
        }]);
    }
    bm.free(1);
    bm.free(4);
    let r = admit(&mut bm, waiting(6, &d, bs));
    assert_eq!((r.granted.len(), r.evicted), (1, 1));
    bm.free(6);
    let r2 = admit(&mut bm, waiting(2, &a8, bs));
    let r5 = admit(&mut bm, waiting(5, &c5, bs));
    assert_eq!((r2.granted.len(), r5.granted.len()), (1, 1));
    bm.check_invariants().unwrap();
    r2.hits[0] + r5.hits[0]
}

#[test]
fn belady_protects_unhittable_last_prompt_block() {
    let bs = 4;
    let lru = unhittable_scenario(Box::<Lru>::default());
    let belady = unhittable_scenario(Box::new(Belady::from_requests(
        bs,
        vec![
            (1, 0, 9, block_hashes(&(0..9).collect::<Vec<u32>>(), bs)),
            (4, 0, 5, block_hashes(&(500..505).collect::<Vec<u32>>(), bs)),
            (
                6,
                1,
                12,
                block_hashes(&(900..912).collect::<Vec<u32>>(), bs),
            ),
            (2, 5, 8, block_hashes(&(0..8).collect::<Vec<u32>>(), bs)),
            (
                5,
                10,
                5,
                block_hashes(&(500..505).collect::<Vec<u32>>(), bs),
            ),
        ],
    )));
    assert_eq!(lru, 8);
    assert!(belady >= lru, "Belady hit {belady} tokens, LRU {lru}");
}

/// `Request::prompt_tokens` longer than `prompt_len` (nothing checks it): the scheduler hashes
/// blocks past the prompt, registers a block holding generated tokens under a prompt-token
/// hash, and a later request hits it.
#[test]
fn prompt_tokens_longer_than_prompt_len_poison_the_cache() {
    let bs = 4;
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        max_model_len: 64,
        pool_tokens: 64,
        block_size: bs,
        prefix_caching: true,
        queue_aging_ns: 1,
        ..SchedulerConfig::default()
    };
    let bm = BlockManager::with_prefix_caching(16, bs, Box::<Lru>::default());
    let mut cores = Cores::new(Scheduler::new(cfg).unwrap(), bm);
    // Prompt token lists longer than the prompts (the ids are not re-counted).
    let mk = |id: u64, len: u32, toks: Vec<u32>, out: u32| Request {
        prompt_tokens: toks,
        ..Request::new(id, 0, len, out)
    };
    let mut cached = Vec::new();
    let mut now = 0;
    assert!(cores
        .scheduler
        .add_request(mk(0, 4, (0..8).collect(), 6), 0)
        .is_none());
    let mut second_added = false;
    while let Some(planned) = cores.plan(now) {
        now += 10;
        let out = StepOutcome::simulated(&planned.plan, 10);
        let res = cores.commit(&planned.plan, &out, now).unwrap();
        cached.extend(res.finished.iter().map(|r| (r.request_id, r.cached_tokens)));
        if !cores.scheduler.has_work() && !second_added {
            second_added = true;
            cores
                .scheduler
                .add_request(mk(1, 9, (0..9).collect(), 1), now);
        }
    }
    // Request 0's prompt is 4 tokens: only 4 tokens of request 1 can really be cached.
    assert_eq!(cached, vec![(0, 0), (1, 4)]);
}
