//! Sliding-window attention: blocks wholly before the window are freed as a sequence
//! advances, so its KV stays bounded by the window, not by its length.

use engine::block_manager::{BlockManager, NULL_BLOCK};
use engine::cores::Cores;
use engine::plan::StepOutcome;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig};

#[test]
fn a_long_sequence_holds_only_the_window() {
    let (bs, window) = (4, 8);
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 16,
        max_model_len: 256,
        block_size: bs,
        pool_tokens: 256,
        want_block_tables: true,
        sliding_window: Some(window),
        ..SchedulerConfig::default()
    };
    let bm = BlockManager::new(64, bs).with_sliding_window(window);
    let mut cores = Cores::new(Scheduler::new(cfg).expect("config"), bm);
    assert!(cores
        .scheduler
        .add_request(Request::new(0, 0, 40, 60), 0)
        .is_none());
    let (mut now, mut peak, mut done) = (0, 0, false);
    while let Some(planned) = cores.plan(now) {
        let plan = planned.plan;
        cores.block_manager.check_invariants().expect("invariants");
        peak = peak.max(cores.block_manager.num_used());
        for w in &plan.work {
            // The window of the step's first token and everything after it are live.
            let first = ((w.start + 1).saturating_sub(window) / bs) as usize;
            assert!(w.block_table[first..].iter().all(|&b| b != NULL_BLOCK));
            assert!(w.block_table[..first].iter().all(|&b| b == NULL_BLOCK));
            // Live blocks: the window plus this step's chunk, rounded to blocks.
            let live = w.block_table.iter().filter(|&&b| b != NULL_BLOCK).count() as u32;
            assert!(live <= (window + w.len).div_ceil(bs) + 1, "{w:?}");
        }
        now += 1000;
        let out = StepOutcome::simulated(&plan, 1000);
        let c = cores.commit(&plan, &out, now).expect("commit");
        done |= !c.finished.is_empty();
    }
    assert!(done);
    assert_eq!(cores.block_manager.num_used(), 0, "leak");
    // 100 tokens would need 25 blocks; the window keeps it to a handful.
    assert!(peak <= 8, "peak {peak} blocks");
}
