//! Parallel sampling (`n > 1`): the prompt is computed once, the sequence forks into `n`
//! that share its blocks, and the first write into a shared block copies it.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::{StepOutcome, StepPlan};
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig};

/// Runs one request to the end; returns every plan, the blocks in use after each, and the
/// request's record.
fn run(req: Request, num_blocks: u32) -> (Vec<StepPlan>, Vec<usize>, RequestRecord) {
    let cfg = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 64,
        block_size: 4,
        pool_tokens: 256,
        want_block_tables: true,
        ..SchedulerConfig::default()
    };
    let mut cores = Cores::new(
        Scheduler::new(cfg).expect("config"),
        BlockManager::new(num_blocks, 4),
    );
    assert!(cores.scheduler.add_request(req, 0).is_none());
    let (mut plans, mut used, mut records) = (Vec::new(), Vec::new(), Vec::new());
    let mut now = 0;
    while let Some(planned) = cores.plan(now) {
        cores.block_manager.check_invariants().expect("invariants");
        used.push(cores.block_manager.num_used() as usize);
        now += 1000;
        let out = StepOutcome::simulated(&planned.plan, 1000);
        let done = cores.commit(&planned.plan, &out, now).expect("commit");
        cores.block_manager.check_invariants().expect("invariants");
        records.extend(done.finished);
        plans.push(planned.plan);
        assert!(plans.len() < 1000);
    }
    assert_eq!(cores.block_manager.num_used(), 0, "leak");
    assert_eq!(records.len(), 1, "one record per request");
    (plans, used, records.remove(0))
}

fn request(prompt_len: u32, max_tokens: u32, n: u32) -> Request {
    beam(prompt_len, max_tokens, n, false)
}

fn beam(prompt_len: u32, max_tokens: u32, n: u32, beam_search: bool) -> Request {
    Request {
        n,
        beam_search,
        ..Request::new(0, 0, prompt_len, max_tokens)
    }
}

#[test]
fn three_samples_share_the_prompt_and_copy_its_partial_block() {
    // 10 prompt tokens in blocks of 4: two full blocks and a partial one, shared by three.
    let (plans, used, rec) = run(request(10, 5, 3), 64);
    // Step 0 prefills the prompt once and samples 3 first tokens.
    assert_eq!(plans[0].work.len(), 1);
    assert_eq!(plans[0].work[0].len, 10);
    assert_eq!(plans[0].num_samples(), 3);
    assert_eq!(used[0], 3);
    // Step 1: the three sequences write position 10 into the shared third block: the
    // first two copy it, the last writes in place. The full blocks stay shared.
    let p = &plans[1];
    assert_eq!(p.work.len(), 3);
    assert_eq!(p.block_copies.len(), 2, "{p:?}");
    let shared = p.work[2].block_table[2];
    assert!(p.block_copies.iter().all(|&(src, _)| src == shared));
    let tables: Vec<&[u32]> = p.work.iter().map(|w| &w.block_table[..]).collect();
    for t in &tables {
        assert_eq!(t[..2], tables[0][..2], "full prompt blocks shared");
    }
    assert_eq!(used[1], 5);
    // No further copies: every later write goes to a private block.
    assert!(plans[2..].iter().all(|p| p.block_copies.is_empty()));
    assert_eq!(rec.output_len, 5);
    assert_eq!(rec.generated_tokens, 15);
}

#[test]
fn a_prompt_ending_on_a_block_boundary_needs_no_copy() {
    let (plans, _, rec) = run(request(8, 3, 4), 64);
    assert!(plans.iter().all(|p| p.block_copies.is_empty()));
    assert_eq!(rec.generated_tokens, 12);
}

#[test]
fn forked_sequences_preempt_and_recompute_on_a_small_pool() {
    // 6 blocks: the prompt (3 blocks) plus 3 children growing to 20 tokens each cannot all
    // fit, so children are preempted, recompute, and everything still ends once.
    let (plans, _, rec) = run(request(10, 10, 3), 8);
    assert!(plans.iter().any(|p| !p.preempted.is_empty()));
    assert!(rec.num_preemptions > 0);
    assert_eq!(rec.output_len, 10);
    assert_eq!(rec.generated_tokens, 30);
}

#[test]
fn beam_search_forks_and_ends_beams_every_step() {
    // Width 4, 10 prompt tokens, 13 steps of decoding: beams are re-chosen after every
    // token, so forks happen mid-sequence and their shared partial blocks are copied.
    let (plans, used, rec) = run(beam(10, 14, 4, true), 64);
    for p in &plans[1..] {
        assert_eq!(p.work.len(), 4, "always 4 beams: {p:?}");
    }
    let copies: usize = plans[2..].iter().map(|p| p.block_copies.len()).sum();
    assert!(copies > 0, "re-chosen beams share blocks and copy on write");
    // Forked beams share their history: fewer blocks than 4 private copies would need.
    let private = 4 * (10u32 + 14).div_ceil(4) as usize;
    assert!(used.iter().all(|&u| u < private), "{used:?}");
    assert_eq!(rec.output_len, 14);
    assert_eq!(rec.generated_tokens, 4 * 14);
}
