//! Sliding-window attention: blocks wholly before the window are freed as a sequence
//! advances, so its KV stays bounded by the window, not by its length.

use engine::backend::SIM_TOKEN;
use engine::block_manager::{BlockManager, NULL_BLOCK};
use engine::plan::StepOutcome;
use engine::request::Request;
use engine::scheduler::{
    AdmissionPolicy, QueuePolicy, Scheduler, SchedulerConfig, SchedulerKind, VictimPolicy,
};

#[test]
fn a_long_sequence_holds_only_the_window() {
    let (bs, window) = (4, 8);
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 4,
        max_num_batched_tokens: 16,
        max_model_len: 256,
        block_size: bs,
        pool_tokens: 256,
        eos_token: None,
        want_block_tables: true,
        keep_tokens: false,
        prefix_caching: false,
        queue: QueuePolicy::Fcfs,
        queue_aging_ns: 1_000_000_000,
        admission: AdmissionPolicy::Optimistic,
        victim: VictimPolicy::Newest,
        watermark_blocks: 0,
        sliding_window: Some(window),
    };
    let mut sched = Scheduler::new(cfg).expect("config");
    let mut bm = BlockManager::new(64, bs).with_sliding_window(window);
    let req = Request {
        id: 0,
        arrival: 0,
        prompt_len: 40,
        prompt_tokens: Vec::new(),
        max_tokens: 60,
        ignore_eos: true,
        scripted_output: Vec::new(),
        n: 1,
        beam_search: false,
        priority: 0,
        class: 0,
    };
    assert!(sched.add_request(req, 0).is_none());
    let (mut now, mut peak, mut done) = (0, 0, false);
    while sched.has_work() {
        let r = sched.propose(now);
        let resp = bm.reserve(&r);
        let plan = sched.apply(&r, resp, now);
        bm.check_invariants().expect("invariants");
        peak = peak.max(bm.num_used());
        for w in &plan.work {
            // The window of the step's first token and everything after it are live.
            let first = ((w.start + 1).saturating_sub(window) / bs) as usize;
            assert!(w.block_table[first..].iter().all(|&b| b != NULL_BLOCK));
            assert!(w.block_table[..first].iter().all(|&b| b == NULL_BLOCK));
            // Live blocks: the window plus this step's chunk, rounded to blocks.
            let live = w.block_table.iter().filter(|&&b| b != NULL_BLOCK).count() as u32;
            assert!(live <= (window + w.len).div_ceil(bs) + 1, "{w:?}");
        }
        let out = StepOutcome {
            duration: 1000,
            sampled: vec![SIM_TOKEN; plan.num_samples()],
            ..StepOutcome::default()
        };
        now += 1000;
        let c = sched.commit(&plan, &out, now).expect("commit");
        bm.free_all(&c.to_free);
        done |= !c.finished.is_empty();
    }
    assert!(done);
    assert_eq!(bm.num_used(), 0, "leak");
    // 100 tokens would need 25 blocks; the window keeps it to a handful.
    assert!(peak <= 8, "peak {peak} blocks");
}
