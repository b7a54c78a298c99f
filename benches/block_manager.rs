//! Block-manager operations with prefix caching on: 256-sequence decode steps (append: one
//! slot per sequence, a new block every 16 tokens, newly full blocks cached), with 16
//! sequences finishing (freed tail first) and 16 new ones admitted through the prefix cache
//! (a shared 512-token system prompt) every step. `Throughput::Elements` counts
//! sequence-steps.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use engine::block_manager::{BlockManager, CacheBlocks, EntryKind, ReserveEntry, ReserveRequest};
use engine::eviction::EvictionKind;
use engine::prefix::block_hashes;

const SEQS: u64 = 256;
const BLOCK: u32 = 16;

struct Live {
    id: u64,
    len: u32,
    hashes: Arc<[u64]>,
}

fn prompt(id: u64) -> Vec<u32> {
    // 512 shared tokens + 256 of the request's own.
    (0..768u32)
        .map(|i| {
            if i < 512 {
                i
            } else {
                1_000_000 + (id as u32) * 1000 + i
            }
        })
        .collect()
}

fn admit(bm: &mut BlockManager, id: u64) -> Live {
    let p = prompt(id);
    let hashes: Arc<[u64]> = block_hashes(&p, BLOCK).into();
    let len = p.len() as u32;
    let r = bm.reserve(&ReserveRequest {
        entries: vec![ReserveEntry {
            seq: id,
            kind: EntryKind::Waiting,
            slots: len,
            tokens: len,
            total: len,
            hashes: Some(hashes.clone()),
            write_from: 0,
            lookahead: 0,
            whole: false,
        }],
        ..ReserveRequest::default()
    });
    assert_eq!(r.granted.len(), 1, "pool too small");
    bm.cache_blocks(&[CacheBlocks {
        seq: id,
        first: 0,
        hashes: hashes.to_vec(),
    }]);
    Live { id, len, hashes }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("block_manager");
    group.throughput(Throughput::Elements(SEQS));
    for kind in [EvictionKind::Lru, EvictionKind::Lfu] {
        let mut bm = BlockManager::with_prefix_caching(40_000, BLOCK, kind.policy());
        let mut next = 0u64;
        let mut live: Vec<Live> = (0..SEQS)
            .map(|_| {
                next += 1;
                admit(&mut bm, next)
            })
            .collect();
        let mut step = 0u64;
        group.bench_function(format!("decode_step_256_seqs/{kind:?}"), |b| {
            b.iter(|| {
                step += 1;
                let entries = live
                    .iter()
                    .map(|s| ReserveEntry {
                        seq: s.id,
                        kind: EntryKind::Running,
                        slots: s.len + 1,
                        tokens: 1,
                        total: s.len + 1,
                        hashes: None,
                        write_from: s.len,
                        lookahead: 0,
                        whole: false,
                    })
                    .collect();
                let victims = live.iter().rev().map(|s| s.id).collect();
                let r = bm.reserve(&ReserveRequest {
                    entries,
                    victims,
                    ..ReserveRequest::default()
                });
                debug_assert!(r.preempted.is_empty());
                for s in &mut live {
                    s.len += 1;
                }
                // 16 finish, 16 arrive (hitting the shared system prompt).
                let done: Vec<u64> = live.drain(..16).map(|s| s.id).collect();
                bm.free_all(&done);
                for _ in 0..16 {
                    next += 1;
                    live.push(admit(&mut bm, next));
                }
                let _ = &live[0].hashes;
                r.blocks_used
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
