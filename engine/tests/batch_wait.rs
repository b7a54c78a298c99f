//! TensorRT-LLM's batch waiting (`batch_wait_timeout_iters`, `batch_wait_max_tokens_ratio`)
//! under the chunked scheduler, on a cost-free backend of 1 us steps: a prompt arriving
//! while another request decodes waits the timeout's steps, unless the step's tokens reach
//! the ratio of the budget or nothing decodes any more; with nothing decoding it starts at
//! once, and without batch waiting in the very next step.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{BatchWait, Scheduler, SchedulerConfig, SchedulerKind};

const STEP: u64 = 1000;

/// Replays `requests` with `wait`, checking the pool after every step.
fn replay(requests: Vec<Request>, wait: Option<BatchWait>) -> Vec<RequestRecord> {
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 256,
        block_size: 4,
        pool_tokens: 1024,
        batch_wait: wait,
        ..SchedulerConfig::default()
    };
    let mut cores = Cores::new(
        Scheduler::new(cfg).expect("config"),
        BlockManager::new(256, 4),
    );
    let records = cores.replay(requests, STEP, true).expect("replay");
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    records
}

/// Steps from `r`'s arrival to its first scheduled step's start.
fn waited(r: &RequestRecord) -> u64 {
    (r.first_scheduled_ns.expect("scheduled") - r.arrival_ns) / STEP
}

/// A decodes from its second step on (8-token prompt, 30 tokens); B (`b_prompt` tokens)
/// arrives at 5.5 steps, while A decodes.
fn two(b_prompt: u32) -> Vec<Request> {
    vec![
        Request::new(0, 0, 8, 30),
        Request::new(1, 5 * STEP + STEP / 2, b_prompt, 4),
    ]
}

#[test]
fn without_batch_waiting_a_prompt_starts_at_the_next_step() {
    let r = replay(two(8), None);
    assert_eq!(waited(&r[1]), 0, "{:?}", r[1]);
}

#[test]
fn a_prompt_waits_the_timeout_while_others_decode() {
    let wait = BatchWait {
        timeout_iters: 3,
        max_tokens_ratio: 1.0,
    };
    let r = replay(two(8), Some(wait));
    // Held back in 3 steps, started in the 4th after its arrival.
    assert_eq!(waited(&r[1]), 3, "{:?}", r[1]);
    // A alone at the start: nothing decodes, so it was not held.
    assert_eq!(waited(&r[0]), 0, "{:?}", r[0]);
    assert!(r.iter().all(|x| x.generated_tokens == x.output_len));
}

#[test]
fn enough_tokens_release_the_prompt_at_once() {
    let wait = BatchWait {
        timeout_iters: 100,
        max_tokens_ratio: 0.25,
    };
    // 40 prompt tokens + A's decode = 41 >= 16 of the 64-token budget.
    let r = replay(two(40), Some(wait));
    assert_eq!(waited(&r[1]), 0, "{:?}", r[1]);
    // 8 + 1 = 9 < 16: it waits until A, its only decode, has finished (30 steps after
    // its prefill at step 0), not the 100 steps of the timeout.
    let r = replay(two(8), Some(wait));
    let a_done = r[0].finish_ns;
    assert!(
        r[1].first_scheduled_ns.expect("scheduled") >= a_done,
        "started while A decoded: {:?}",
        r[1]
    );
    assert!(waited(&r[1]) < 40, "{:?}", r[1]);
}

#[test]
fn a_timeout_of_zero_never_holds_back() {
    let wait = BatchWait {
        timeout_iters: 0,
        max_tokens_ratio: 0.9,
    };
    let r = replay(two(8), Some(wait));
    assert_eq!(waited(&r[1]), 0, "{:?}", r[1]);
}

#[test]
fn batch_waiting_needs_the_chunked_scheduler() {
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Continuous,
        max_num_batched_tokens: 4096,
        batch_wait: Some(BatchWait {
            timeout_iters: 20,
            max_tokens_ratio: 0.9,
        }),
        ..SchedulerConfig::default()
    };
    let e = Scheduler::new(cfg).err().expect("refused").to_string();
    assert!(e.contains("engine.batch_wait_timeout_iters"), "{e}");
    let cfg = SchedulerConfig {
        batch_wait: Some(BatchWait {
            timeout_iters: 20,
            max_tokens_ratio: 1.5,
        }),
        ..SchedulerConfig::default()
    };
    let e = Scheduler::new(cfg).err().expect("refused").to_string();
    assert!(e.contains("engine.batch_wait_max_tokens_ratio"), "{e}");
}
