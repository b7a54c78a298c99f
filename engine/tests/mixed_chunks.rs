//! SGLang's mixed chunks (`max_prefill_tokens` on the chunked scheduler, its
//! `--max-prefill-tokens` with `--enable-mixed-chunk`), on a cost-free backend of 1 us
//! steps: the step's first prefill takes what the token budget leaves beside the decodes,
//! whatever the limit; a later new prompt joins only if it fits the limit less the step's
//! tokens so far (FCFS: the first that does not ends the step's admissions), where vLLM's
//! chunked prefill would fill the budget with a chunk of it. The configuration checks
//! refuse a zero limit and the limit under another scheduler.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};

const STEP: u64 = 1000;

fn config(max_prefill_tokens: Option<u32>) -> SchedulerConfig {
    SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 8,
        max_num_batched_tokens: 100,
        max_model_len: 200,
        block_size: 4,
        pool_tokens: 1024,
        max_prefill_tokens,
        ..SchedulerConfig::default()
    }
}

/// Replays `requests` (all generating 4 tokens), checking that every block comes back.
fn replay(max_prefill_tokens: Option<u32>, requests: Vec<Request>) -> Vec<RequestRecord> {
    let mut cores = Cores::new(
        Scheduler::new(config(max_prefill_tokens)).expect("config"),
        BlockManager::new(256, 4),
    );
    let records = cores.replay(requests, STEP, true).expect("replay");
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    assert!(
        records.iter().all(|r| r.generated_tokens == 4),
        "{records:?}"
    );
    records
}

/// A (a 60-token prompt), B (30) and C (10), all arriving at 0.
fn three() -> Vec<Request> {
    vec![
        Request::new(0, 0, 60, 4),
        Request::new(1, 0, 30, 4),
        Request::new(2, 0, 10, 4),
    ]
}

#[test]
fn the_first_prompt_joins_past_the_limit_and_the_next_only_if_it_fits() {
    let r = replay(Some(50), three());
    // Step 0: A's 60 tokens alone, past the 50 (B's 30 do not fit the nothing left).
    assert_eq!(r[0].first_token_ns, Some(STEP), "{:?}", r[0]);
    // Step 1: A's decode leaves 49: B's 30 fit, then C's 10 fit the 19 left.
    for x in &r[1..] {
        assert_eq!(x.first_scheduled_ns, Some(STEP), "{x:?}");
        assert_eq!(x.first_token_ns, Some(2 * STEP), "{x:?}");
    }
}

#[test]
fn without_the_limit_the_budget_takes_all_three_at_once() {
    let r = replay(None, three());
    for x in &r {
        assert_eq!(x.first_scheduled_ns, Some(0), "{x:?}");
        assert_eq!(x.first_token_ns, Some(STEP), "{x:?}");
    }
}

#[test]
fn a_running_prompts_next_chunk_is_the_steps_first_prefill() {
    // A (150 tokens) is chunked at the 100-token budget; its last 50 are step 1's first
    // prefill, which leaves 5 of the 55: B's 10 wait for step 2, where vLLM's chunked
    // prefill would take them in step 1.
    let requests = || vec![Request::new(0, 0, 150, 4), Request::new(1, 0, 10, 4)];
    let r = replay(Some(55), requests());
    assert_eq!(r[0].first_token_ns, Some(2 * STEP), "{:?}", r[0]);
    assert_eq!(r[1].first_scheduled_ns, Some(2 * STEP), "{:?}", r[1]);
    let r = replay(None, requests());
    assert_eq!(r[1].first_scheduled_ns, Some(STEP), "{:?}", r[1]);
}

#[test]
fn the_limit_needs_the_chunked_scheduler_and_at_least_a_token() {
    let e = Scheduler::new(config(Some(0)))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("engine.max_prefill_tokens"), "{e}");
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Continuous,
        max_num_batched_tokens: 4096,
        ..config(Some(1000))
    };
    let e = Scheduler::new(cfg).err().expect("refused").to_string();
    assert!(
        e.contains("engine.max_prefill_tokens") && e.contains("continuous"),
        "{e}"
    );
}
