//! The prefix cache against the Mooncake conversation trace's own sharing: with a cache
//! large enough to keep everything and requests served one at a time, the tokens served
//! from the cache match the prefix repeats computed directly from the trace's hash ids.

use std::collections::HashSet;
use std::path::Path;

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::eviction::EvictionKind;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig};
use sim::workload::{TraceConfig, TraceFormat, Workload, WorkloadConfig};

const TRACE: &str = "traces/mooncake_conversation_trace.jsonl";
const REQUESTS: usize = 1500;
const BLOCK: u32 = 16;

/// The trace's rows: (prompt tokens, hash ids of its 512-token blocks).
fn trace_rows() -> Vec<(u64, Vec<u64>)> {
    let text = std::fs::read_to_string(TRACE).expect("trace");
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            let ids = v["hash_ids"]
                .as_array()
                .expect("hash_ids")
                .iter()
                .map(|x| x.as_u64().expect("id"))
                .collect();
            (v["input_length"].as_u64().expect("input_length"), ids)
        })
        .collect()
}

/// Prefix hit tokens computed from the hash ids alone, and the prompt tokens, over `rows`
/// served in order: a request reuses its leading 512-token blocks whose id prefix appeared
/// before, up to its last full `block`-token block before the last token (which is always
/// recomputed).
fn expected_hits(rows: &[(u64, Vec<u64>)], block: u64) -> (u64, u64) {
    let mut seen: HashSet<&[u64]> = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for (n, ids) in rows {
        let n = (*n).max(1);
        let k = (1..=ids.len())
            .take_while(|&i| seen.contains(&ids[..i]))
            .count() as u64;
        seen.extend((1..=ids.len()).map(|i| &ids[..i]));
        total += n;
        hit += (k * 512).min((n - 1) / block * block);
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
        max_in_flight: None,
        think_time_s: None,
    };
    let workload = Workload::open(&cfg, Path::new("."), 0).expect("workload");
    let sched_cfg = SchedulerConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: 65_536,
        max_model_len: 1 << 20,
        pool_tokens: 1 << 30,
        block_size: BLOCK,
        prefix_caching: true,
        queue_aging_ns: 1,
        ..SchedulerConfig::default()
    };
    // Room for every prompt of the slice: nothing is ever evicted.
    let bm = BlockManager::with_prefix_caching(2_000_000, BLOCK, EvictionKind::Lru.policy());
    let mut cores = Cores::new(Scheduler::new(sched_cfg).expect("scheduler"), bm);
    // One request at a time, one output token each: only the prompts matter here.
    let requests = workload.enumerate().map(|(i, req)| Request {
        arrival: i as u64 * 1_000_000_000,
        max_tokens: 1,
        ..req.expect("request")
    });
    let records = cores.replay(requests, 1, false).expect("replay");
    let hit: u64 = records.iter().map(|r| u64::from(r.cached_tokens)).sum();
    let total: u64 = records.iter().map(|r| u64::from(r.prompt_len)).sum();
    assert_eq!(
        cores.block_manager.evictions(),
        0,
        "the cache must be large enough to keep everything"
    );
    let (want_hit, want_total) = expected_hits(&trace_rows()[..REQUESTS], u64::from(BLOCK));
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
    let rows = trace_rows();
    let (want, total) = expected_hits(&rows, B);
    let mut bm = BlockManager::with_prefix_caching(400_000, B as u32, EvictionKind::Lru.policy());
    let (mut hit, mut refs, mut repeats) = (0u64, 0u64, 0u64);
    let mut ids_seen: HashSet<u64> = HashSet::new();
    for (seq, (n, ids)) in rows.iter().enumerate() {
        let n = (*n).max(1);
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
                lookahead: 0,
                whole: false,
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
