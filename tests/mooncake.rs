//! The prefix cache against the Mooncake conversation trace's own sharing: with a cache
//! large enough to keep everything and requests served one at a time, the tokens served
//! from the cache match the prefix repeats computed directly from the trace's hash ids.

use std::collections::HashSet;
use std::path::Path;

use engine::block_manager::BlockManager;
use engine::eviction::EvictionKind;
use engine::plan::StepOutcome;
use engine::scheduler::{
    AdmissionPolicy, QueuePolicy, Scheduler, SchedulerConfig, SchedulerKind, VictimPolicy,
};
use sim::workload::{TraceConfig, TraceFormat, Workload, WorkloadConfig};

const TRACE: &str = "traces/mooncake_conversation_trace.jsonl";
const REQUESTS: usize = 1500;
const BLOCK: u32 = 16;

/// Prefix hit tokens computed from the hash ids alone: a request reuses its leading
/// 512-token blocks whose id prefix appeared before, up to its last full 16-token block
/// before the last token (which is always recomputed).
fn expected_hits() -> (u64, u64) {
    let text = std::fs::read_to_string(TRACE).expect("trace");
    let mut seen: HashSet<Vec<u64>> = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for line in text.lines().take(REQUESTS) {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        let n = v["input_length"].as_u64().expect("input_length");
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .expect("hash_ids")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect();
        let k = (1..=ids.len())
            .take_while(|&i| seen.contains(&ids[..i]))
            .count() as u64;
        for i in 1..=ids.len() {
            seen.insert(ids[..i].to_vec());
        }
        total += n;
        hit += (k * 512).min((n - 1) / u64::from(BLOCK) * u64::from(BLOCK));
    }
    (hit, total)
}

#[test]
fn unbounded_cache_hits_what_the_trace_repeats() {
    let cfg = WorkloadConfig {
        num_requests: Some(REQUESTS as u64),
        duration_s: None,
        arrival: None,
        trace: Some(TraceConfig {
            format: TraceFormat::Mooncake,
            path: TRACE.into(),
            time_scale: 1.0,
        }),
        classes: Vec::new(),
        multi_turn: None,
        generated_shared_prefix: None,
    };
    let workload = Workload::open(&cfg, Path::new("."), 0).expect("workload");
    let sched_cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 1,
        max_num_batched_tokens: 65_536,
        max_model_len: 1 << 20,
        pool_tokens: 1 << 30,
        eos_token: None,
        want_block_tables: false,
        keep_tokens: false,
        block_size: BLOCK,
        prefix_caching: true,
        queue: QueuePolicy::Fcfs,
        queue_aging_ns: 1,
        admission: AdmissionPolicy::Optimistic,
        victim: VictimPolicy::Newest,
        watermark_blocks: 0,
        sliding_window: None,
    };
    let mut sched = Scheduler::new(sched_cfg).expect("scheduler");
    // Room for every prompt of the slice: nothing is ever evicted.
    let mut bm = BlockManager::with_prefix_caching(2_000_000, BLOCK, EvictionKind::Lru.policy());
    let (mut hit, mut total) = (0u64, 0u64);
    for req in workload {
        let mut req = req.expect("request");
        req.max_tokens = 1; // only the prompts matter here
        total += u64::from(req.prompt_len);
        assert!(sched.add_request(req, 0).is_none());
        while sched.has_work() {
            let r = sched.propose(0);
            let resp = bm.reserve(&r);
            let plan = sched.apply(&r, resp, 0);
            let sampled = vec![0; plan.num_samples()];
            let out = StepOutcome {
                duration: 1,
                sampled,
                mbu: 0.0,
                mfu: 0.0,
            };
            let res = sched.commit(&plan, &out, 0).expect("commit");
            bm.cache_blocks(&res.cache);
            bm.free_all(&res.to_free);
            for rec in res.finished {
                hit += u64::from(rec.cached_tokens);
            }
        }
    }
    assert_eq!(
        bm.evictions(),
        0,
        "the cache must be large enough to keep everything"
    );
    let (want_hit, want_total) = expected_hits();
    assert_eq!(total, want_total);
    let (rate, want) = (
        hit as f64 / total as f64,
        want_hit as f64 / want_total as f64,
    );
    // The 16-token blocks can also reuse the full 16-token blocks of a shared partial
    // 512-token block, so the cache may hit slightly more than the 512-block count.
    assert!(
        hit >= want_hit && rate - want < 0.02,
        "hit rate {rate:.4} vs {want:.4} from the hash ids"
    );
    assert!(want > 0.25, "the trace shares prefixes: {want}");
    println!("prefix hit rate {rate:.4}, from the hash ids {want:.4}");
}

/// The whole trace (12,031 requests) through the block manager with 512-token blocks, one
/// block per hash id and a pool that never evicts: the tokens served from the cache equal
/// the prefix repeats of the hash ids exactly, and about 37% of block references repeat.
#[test]
fn whole_trace_hits_its_repeated_blocks() {
    use engine::block_manager::{CacheBlocks, EntryKind, ReserveEntry, ReserveRequest};
    use engine::prefix::chain_hash;
    const B: u64 = 512;
    let text = std::fs::read_to_string(TRACE).expect("trace");
    let mut bm = BlockManager::with_prefix_caching(400_000, B as u32, EvictionKind::Lru.policy());
    let mut seen: HashSet<Vec<u64>> = HashSet::new();
    let (mut hit, mut want, mut total, mut refs, mut repeats) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut ids_seen: HashSet<u64> = HashSet::new();
    for (seq, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        let n = v["input_length"].as_u64().expect("input_length").max(1);
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .expect("hash_ids")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect();
        // Expected: the leading ids whose prefix appeared before, capped below the last
        // token (a full hit recomputes it).
        let k = (1..=ids.len())
            .take_while(|&i| seen.contains(&ids[..i]))
            .count() as u64;
        for i in 1..=ids.len() {
            seen.insert(ids[..i].to_vec());
        }
        want += (k * B).min((n - 1) / B * B);
        total += n;
        refs += ids.len() as u64;
        repeats += ids.iter().filter(|&&h| !ids_seen.insert(h)).count() as u64;
        // The engine: chained block hashes over the full 512-token blocks of the prompt.
        let full = (n / B) as usize;
        let mut parent = 0;
        let hashes: Vec<u64> = ids
            .iter()
            .take(full)
            .map(|&h| {
                parent = chain_hash(parent, &[h as u32, (h >> 32) as u32]);
                parent
            })
            .collect();
        let n = n as u32;
        let r = bm.reserve(&ReserveRequest {
            entries: vec![ReserveEntry {
                seq: seq as u64,
                kind: EntryKind::Waiting,
                slots: n,
                tokens: n,
                total: n,
                hashes: Some(hashes.clone().into()),
                write_from: 0,
            }],
            ..ReserveRequest::default()
        });
        assert_eq!(r.granted, vec![0], "request {seq} did not fit");
        hit += u64::from(r.hits[0]);
        bm.cache_blocks(&[CacheBlocks {
            seq: seq as u64,
            first: 0,
            hashes,
        }]);
        bm.free(seq as u64);
    }
    assert_eq!(bm.evictions(), 0);
    assert_eq!(hit, want, "cache hits vs prefix repeats of the hash ids");
    let block_repeats = repeats as f64 / refs as f64;
    assert!((0.36..0.37).contains(&block_repeats), "{block_repeats}");
    println!(
        "whole trace: token hit rate {:.4}, block repeats {block_repeats:.4}",
        hit as f64 / total as f64
    );
}
