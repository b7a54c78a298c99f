//! Queue policies that reorder or preempt: priority scheduling with priority preemption,
//! and SGLang's longest-prefix-match, on hand-made traces whose right answer is known.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::eviction::Lru;
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{QueuePolicy, Scheduler, SchedulerConfig};

const STEP_NS: u64 = 1000;

fn config(queue: QueuePolicy, max_num_seqs: u32, pool_tokens: u64) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: 64,
        max_model_len: 40,
        block_size: 4,
        pool_tokens,
        prefix_caching: true,
        queue,
        queue_aging_ns: 1_000_000_000,
        ..SchedulerConfig::default()
    }
}

fn request(id: u64, arrival: u64, prompt: Vec<u32>, max_tokens: u32, priority: i32) -> Request {
    Request {
        priority,
        ..Request::new(id, arrival, 0, max_tokens).with_tokens(prompt)
    }
}

/// Runs the cores with steps of `STEP_NS`; returns the records by request id.
fn drive(cfg: SchedulerConfig, num_blocks: u32, requests: Vec<Request>) -> Vec<RequestRecord> {
    let bm = BlockManager::with_prefix_caching(num_blocks, cfg.block_size, Box::<Lru>::default());
    let mut cores = Cores::new(Scheduler::new(cfg).expect("valid config"), bm);
    let records = cores.replay(requests, STEP_NS, true).expect("replay");
    assert!(
        records.iter().all(|r| !r.finish_reason.is_rejection()),
        "rejected"
    );
    assert_eq!(cores.block_manager.num_used(), 0, "leak");
    records
}

fn tokens(base: u32, n: u32) -> Vec<u32> {
    (base..base + n).collect()
}

/// Two low-priority requests (5 blocks each at the end) fill the 10-block pool; a
/// high-priority one (3 blocks) arrives.
/// Priority scheduling preempts the newest low-priority request for it at once; FCFS makes
/// it wait for a request to finish.
#[test]
fn priority_preempts_lower_priority_for_the_queue_head() {
    let trace = || {
        vec![
            request(0, 0, tokens(0, 16), 4, 5),
            request(1, 0, tokens(100, 16), 4, 5),
            request(2, 3 * STEP_NS, tokens(200, 12), 4, 0),
        ]
    };
    let prio = drive(config(QueuePolicy::Priority, 8, 40), 10, trace());
    let fcfs = drive(config(QueuePolicy::Fcfs, 8, 40), 10, trace());

    let started = |r: &RequestRecord| r.first_scheduled_ns.expect("scheduled");
    // Priority: request 2 starts the step it arrives; request 1 (newest low priority) paid.
    assert_eq!(started(&prio[2]), 3 * STEP_NS, "{prio:?}");
    assert!(prio[1].num_preemptions >= 1, "{prio:?}");
    assert_eq!(prio[2].num_preemptions, 0);
    // FCFS: no preemption for it; it waits until blocks come free.
    assert!(started(&fcfs[2]) > 3 * STEP_NS, "{fcfs:?}");
    assert!(fcfs[2].finish_ns > prio[2].finish_ns);
}

/// A request never preempts one of equal or higher priority, and never in vain: with
/// victims too small to make room it waits.
#[test]
fn priority_never_preempts_equal_priority() {
    let trace = vec![
        request(0, 0, tokens(0, 16), 4, 0),
        request(1, 0, tokens(100, 16), 4, 0),
        request(2, 3 * STEP_NS, tokens(200, 12), 4, 0),
    ];
    let recs = drive(config(QueuePolicy::Priority, 8, 40), 10, trace);
    assert!(recs[..2].iter().all(|r| r.num_preemptions == 0), "{recs:?}");
}

/// One seat. Request 0 computes prompt A; while it decodes, B (unrelated) and then A' (A's
/// first 12 tokens + its own) arrive. FCFS serves B first; `lpm` serves A' first, since the
/// block manager reported 12 cached tokens for it.
#[test]
fn lpm_serves_the_longest_cached_prefix_first() {
    let a = tokens(0, 16);
    let mut a2 = a[..12].to_vec();
    a2.extend(tokens(500, 8));
    let trace = || {
        vec![
            request(0, 0, a.clone(), 6, 0),
            request(1, STEP_NS, tokens(300, 20), 2, 0),
            request(2, 2 * STEP_NS, a2.clone(), 2, 0),
        ]
    };
    let fcfs = drive(config(QueuePolicy::Fcfs, 1, 4096), 1024, trace());
    let lpm = drive(config(QueuePolicy::Lpm, 1, 4096), 1024, trace());
    let started = |r: &RequestRecord| r.first_scheduled_ns.expect("scheduled");
    assert!(started(&fcfs[1]) < started(&fcfs[2]));
    assert!(started(&lpm[2]) < started(&lpm[1]), "{lpm:?}");
    assert_eq!(lpm[2].cached_tokens, 12);
}
