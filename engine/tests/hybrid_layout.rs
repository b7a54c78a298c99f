//! Hybrid layouts (vLLM's hybrid KV cache manager): a full-attention table beside a
//! sliding-window group, whose pages outside the window are freed, and a linear-attention
//! group, whose state is a fixed number of pages per sequence; prefix hits must find the
//! sliding group's window cached; forks copy the state before writing it.

use std::sync::Arc;

use engine::block_manager::{
    BlockManager, CacheBlocks, EntryKind, ReserveEntry, ReserveRequest, SideGroup, NULL_BLOCK,
};
use engine::eviction::EvictionKind;
use engine::prefix::block_hashes;
use engine::request::SeqId;

fn entry(seq: SeqId, kind: EntryKind, from: u32, slots: u32) -> ReserveEntry {
    ReserveEntry {
        seq,
        kind,
        slots,
        tokens: slots - from,
        total: slots,
        hashes: None,
        write_from: from,
        lookahead: 0,
        whole: false,
    }
}

fn reserve(bm: &mut BlockManager, entries: Vec<ReserveEntry>) -> Vec<usize> {
    let victims = entries.iter().map(|e| e.seq).rev().collect();
    let r = bm.reserve(&ReserveRequest {
        entries,
        victims,
        ..ReserveRequest::default()
    });
    bm.check_invariants().expect("invariants");
    r.granted
}

fn live(t: &[u32]) -> usize {
    t.iter().filter(|&&b| b != NULL_BLOCK).count()
}

/// gpt-oss' layout: the full group grows with the sequence, the sliding group (window 8,
/// blocks of 4) holds the window plus the step's block, whatever the length.
#[test]
fn the_sliding_group_holds_only_the_window() {
    let mut bm = BlockManager::new(64, 4).with_side_groups(vec![SideGroup::Sliding { window: 8 }]);
    assert_eq!(
        reserve(&mut bm, vec![entry(1, EntryKind::Waiting, 0, 16)]),
        [0]
    );
    // The prefill writes 16 tokens: every block of both groups is live.
    assert_eq!(live(&bm.side_tables(1)[0]), 4);
    assert_eq!(bm.num_used(), 8);
    for pos in 16..100 {
        assert_eq!(
            reserve(&mut bm, vec![entry(1, EntryKind::Running, pos, pos + 1)]),
            [0]
        );
        let side = &bm.side_tables(1)[0];
        assert_eq!(side.len(), bm.table(1).len());
        // The write at `pos` attends to pos-7..=pos: at most 3 blocks of 4.
        assert!(live(side) <= 3, "pos {pos}: {side:?}");
        let first = ((pos + 1 - 8) / 4) as usize;
        assert!(side[..first].iter().all(|&b| b == NULL_BLOCK));
        assert!(side[first..].iter().all(|&b| b != NULL_BLOCK));
    }
    assert_eq!(bm.num_used(), 25 + live(&bm.side_tables(1)[0]) as u32);
    bm.free(1);
    assert_eq!(bm.num_used(), 0);
    bm.check_invariants().expect("invariants");
}

/// Qwen3.5's layout: each sequence holds its linear state (2 pages) however long it is,
/// and the pool admits as many sequences as their full-attention blocks plus states fit.
#[test]
fn the_state_group_takes_its_pages_per_sequence() {
    let mut bm = BlockManager::new(12, 4).with_side_groups(vec![SideGroup::State { pages: 2 }]);
    // 8 tokens = 2 blocks + 2 state pages each: three sequences fill 12 pages.
    for s in 1..=3 {
        assert_eq!(
            reserve(&mut bm, vec![entry(s, EntryKind::Waiting, 0, 8)]),
            [0]
        );
        assert_eq!(bm.side_tables(s)[0].len(), 2);
    }
    assert_eq!(bm.num_free(), 0);
    assert!(reserve(&mut bm, vec![entry(4, EntryKind::Waiting, 0, 1)]).is_empty());
    // Decoding: the state stays 2 pages; seq 3 (newest) is preempted for seq 1's block.
    let r = bm.reserve(&ReserveRequest {
        entries: vec![entry(1, EntryKind::Running, 8, 9)],
        victims: vec![3, 2, 1],
        ..ReserveRequest::default()
    });
    assert_eq!((r.granted, r.preempted), (vec![0], vec![3]));
    assert_eq!((bm.table(1).len(), bm.side_tables(1)[0].len()), (3, 2));
    assert!(bm.side_tables(3).is_empty());
    // Seq 3's 2 blocks and 2 state pages came free; seq 1 took one.
    assert_eq!(bm.num_free(), 3);
    bm.check_invariants().expect("invariants");
}

/// A fork shares the parent's pages; the state is written every step, so the child's
/// next step copies it (and the shared sliding block it writes into).
#[test]
fn a_fork_copies_the_state_before_writing_it() {
    let mut bm = BlockManager::new(32, 4).with_side_groups(vec![
        SideGroup::Sliding { window: 8 },
        SideGroup::State { pages: 1 },
    ]);
    reserve(&mut bm, vec![entry(1, EntryKind::Waiting, 0, 6)]);
    bm.fork(1, 2);
    bm.check_invariants().expect("invariants");
    let state = bm.side_tables(1)[1][0];
    let r = bm.reserve(&ReserveRequest {
        entries: vec![entry(2, EntryKind::Running, 6, 7)],
        victims: vec![2, 1],
        ..ReserveRequest::default()
    });
    assert_eq!(r.granted, [0]);
    let copied: Vec<u32> = r.block_copies.iter().map(|&(src, _)| src).collect();
    // Main block 1 (positions 4..8), sliding block 1 and the state.
    assert_eq!(copied.len(), 3, "{:?}", r.block_copies);
    assert!(copied.contains(&state));
    assert_ne!(bm.side_tables(2)[1][0], state);
    bm.check_invariants().expect("invariants");
    bm.free(1);
    bm.free(2);
    assert_eq!(bm.num_used(), 0);
}

/// Prefix caching with a sliding group: a second request with the same prompt hits only
/// where the sliding group still holds the window before the hit cached; with a state
/// group there is no state at a block boundary, so no hit.
#[test]
fn prefix_hits_need_the_window_cached_in_every_group() {
    let prompt: Vec<u32> = (0..40).collect();
    let hashes: Arc<[u64]> = block_hashes(&prompt, 4).into();
    let waiting = |seq: SeqId| ReserveEntry {
        hashes: Some(hashes.clone()),
        ..entry(seq, EntryKind::Waiting, 0, 40)
    };
    let compute = |bm: &mut BlockManager, seq: SeqId| {
        bm.cache_blocks(&[CacheBlocks {
            seq,
            first: 0,
            hashes: hashes.to_vec(),
        }]);
    };
    for policy in [
        EvictionKind::Lru,
        EvictionKind::Fifo,
        EvictionKind::Lfu,
        EvictionKind::Slru,
    ] {
        let mut bm = BlockManager::with_prefix_caching(64, 4, policy.policy())
            .with_side_groups(vec![SideGroup::Sliding { window: 8 }]);
        let r = bm.reserve(&ReserveRequest {
            entries: vec![waiting(1)],
            ..ReserveRequest::default()
        });
        assert_eq!(r.hits, [0]);
        compute(&mut bm, 1);
        // The whole prompt was written in one step: every sliding page was cached, so the
        // hit is the usual 9 blocks (the last token is recomputed), sharing pages 6..9 of
        // the sliding group (the window before position 36).
        let r = bm.reserve(&ReserveRequest {
            entries: vec![waiting(2)],
            ..ReserveRequest::default()
        });
        assert_eq!(r.hits, [36], "{policy:?}");
        let (a, b) = (&bm.side_tables(1)[0], &bm.side_tables(2)[0]);
        assert_eq!(a[7..9], b[7..9]);
        assert!(b[..7].iter().all(|&x| x == NULL_BLOCK), "{b:?}");
        bm.check_invariants().expect("invariants");
        bm.free(1);
        bm.free(2);
        bm.check_invariants().expect("invariants");

        // A linear-attention group beside it: no hit.
        let mut bm = BlockManager::with_prefix_caching(64, 4, policy.policy())
            .with_side_groups(vec![SideGroup::State { pages: 1 }]);
        bm.reserve(&ReserveRequest {
            entries: vec![waiting(1)],
            ..ReserveRequest::default()
        });
        compute(&mut bm, 1);
        let r = bm.reserve(&ReserveRequest {
            entries: vec![waiting(2)],
            ..ReserveRequest::default()
        });
        assert_eq!(r.hits, [0], "{policy:?}");
        bm.check_invariants().expect("invariants");
    }
}

/// The most a sequence's side tables hold: the window and a step's tokens in blocks (one
/// more for the block the window straddles), plus the states.
#[test]
fn max_side_pages_bounds_a_sequence() {
    let bm = BlockManager::new(1, 16).with_side_groups(vec![
        SideGroup::Sliding { window: 128 },
        SideGroup::State { pages: 3 },
    ]);
    // (128 + 2048) / 16 = 136, + 1, + 3.
    assert_eq!(bm.max_side_pages(2048), 140);
}
