//! SGLang's `--scheduler-recv-interval` on a cost-free backend of 1 us steps: while a
//! request decodes, an arrival waits in the socket until the scheduler has run the
//! interval's decode steps since its last poll; it polls right after a step that prefilled
//! and at once when idle, so an arrival then starts in the next step, as it does without
//! the interval.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::record::RequestRecord;
use engine::request::{FinishReason, Request};
use engine::scheduler::{ArrivalPoll, Scheduler, SchedulerConfig, SchedulerKind};

const STEP: u64 = 1000;

/// SGLang's receive interval (`after_prefill`; 0: off).
fn sglang(interval: u32) -> Option<ArrivalPoll> {
    (interval > 0).then_some(ArrivalPoll {
        interval,
        after_prefill: true,
    })
}

fn scheduler(kind: SchedulerKind, arrival_poll: Option<ArrivalPoll>) -> Scheduler {
    let cfg = SchedulerConfig {
        kind,
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: 256,
        block_size: 4,
        pool_tokens: 1024,
        arrival_poll,
        ..SchedulerConfig::default()
    };
    Scheduler::new(cfg).expect("config")
}

/// Replays `requests` under `kind` with `poll`, checking the pool after every step.
fn replay(
    kind: SchedulerKind,
    requests: Vec<Request>,
    poll: Option<ArrivalPoll>,
) -> Vec<RequestRecord> {
    let mut cores = Cores::new(scheduler(kind, poll), BlockManager::new(256, 4));
    let records = cores.replay(requests, STEP, true).expect("replay");
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    records
}

/// Whole steps from `r`'s arrival to its first scheduled step's start.
fn waited(r: &RequestRecord) -> u64 {
    (r.first_scheduled_ns.expect("scheduled") - r.arrival_ns) / STEP
}

/// A prefills in step 0 and decodes from step 1 (8-token prompt, 30 tokens); B arrives at
/// `at` steps.
fn two(at: f64) -> Vec<Request> {
    vec![
        Request::new(0, 0, 8, 30),
        Request::new(1, (at * STEP as f64) as u64, 8, 4),
    ]
}

#[test]
fn without_the_interval_an_arrival_starts_at_the_next_step() {
    for kind in [SchedulerKind::Continuous, SchedulerKind::Chunked] {
        for interval in [0, 1] {
            let r = replay(kind, two(1.5), sglang(interval));
            assert_eq!(waited(&r[1]), 0, "{kind:?} {interval}: {:?}", r[1]);
        }
    }
}

#[test]
fn an_arrival_while_others_decode_waits_for_the_next_poll() {
    // Polls: at step 1 (after A's prefill), then every 5 decode steps: at step 6.
    // B arrives at 1.5 steps and is taken in at step 6: 4.5 steps later.
    for kind in [SchedulerKind::Continuous, SchedulerKind::Chunked] {
        let r = replay(kind, two(1.5), sglang(5));
        assert_eq!(
            r[1].first_scheduled_ns,
            Some(6 * STEP),
            "{kind:?}: {:?}",
            r[1]
        );
        // Arriving just before the poll, it barely waits.
        let r = replay(kind, two(5.5), sglang(5));
        assert_eq!(waited(&r[1]), 0, "{kind:?}: {:?}", r[1]);
        assert_eq!(r[1].first_scheduled_ns, Some(6 * STEP));
    }
}

#[test]
fn the_scheduler_polls_after_a_prefill_and_when_idle() {
    // B arrives during A's prefill: polled at the next step.
    let r = replay(SchedulerKind::Continuous, two(0.5), sglang(30));
    assert_eq!(r[1].first_scheduled_ns, Some(STEP), "{:?}", r[1]);
    // An arrival at an idle engine starts at once, even with a long interval.
    let requests = vec![Request::new(0, 0, 8, 3), Request::new(1, 20 * STEP, 8, 3)];
    let r = replay(SchedulerKind::Continuous, requests, sglang(30));
    assert_eq!(r[1].first_scheduled_ns, Some(20 * STEP), "{:?}", r[1]);
}

#[test]
fn the_interval_counts_decode_steps_not_arrivals() {
    // Four arrivals between two polls all start together at the poll, in arrival order.
    let mut requests = vec![Request::new(0, 0, 8, 40)];
    for (k, at) in [1.2, 2.2, 3.2, 4.2].iter().enumerate() {
        requests.push(Request::new(k as u64 + 1, (at * STEP as f64) as u64, 8, 4));
    }
    let r = replay(SchedulerKind::Continuous, requests, sglang(5));
    for rec in &r[1..] {
        assert_eq!(rec.first_scheduled_ns, Some(6 * STEP), "{rec:?}");
    }
}

#[test]
fn an_arrival_not_yet_polled_can_be_aborted_and_counts_as_waiting() {
    let mut s = scheduler(SchedulerKind::Continuous, sglang(30));
    assert!(s.add_request(Request::new(7, 0, 8, 4), 0).is_none());
    assert_eq!(s.num_waiting(), 1);
    assert!(s.has_work());
    let rec = s
        .abort(7, FinishReason::Abort, 500)
        .expect("an unpolled request ends at once");
    assert_eq!(rec.finish_ns, 500);
    assert_eq!(s.num_waiting(), 0);
    assert!(!s.has_work());
}

#[test]
fn a_timeout_poll_counts_prefill_steps_too() {
    // TensorRT-LLM's attention-DP timeout: every step counts, a prefill too. The idle
    // poll at step 0 restarts the count, which reaches 5 at step 5 and again at step 10:
    // B arriving at 1.5 steps starts at step 5 (not 6, as after SGLang's prefill poll),
    // and arriving at 5.5 at step 10.
    let timeout = Some(ArrivalPoll {
        interval: 5,
        after_prefill: false,
    });
    let r = replay(SchedulerKind::Chunked, two(1.5), timeout);
    assert_eq!(r[1].first_scheduled_ns, Some(5 * STEP), "{:?}", r[1]);
    let r = replay(SchedulerKind::Chunked, two(5.5), timeout);
    assert_eq!(r[1].first_scheduled_ns, Some(10 * STEP), "{:?}", r[1]);
}

#[test]
fn a_zero_interval_is_refused() {
    let cfg = SchedulerConfig {
        arrival_poll: Some(ArrivalPoll {
            interval: 0,
            after_prefill: false,
        }),
        ..SchedulerConfig::default()
    };
    let e = Scheduler::new(cfg).err().expect("refused").to_string();
    assert!(e.contains("interval"), "{e}");
}

#[test]
fn a_timeout_poll_releases_when_nothing_decodes() {
    // TensorRT-LLM's balancing releases held prompts on a rank with no generation request:
    // A (200 tokens) prefills in chunks of 100 over steps 0 and 1, so B, arriving at 0.5
    // steps, is taken in at step 1 and starts at step 2, beside A's first decode, not at
    // the timeout's fifth step.
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 8,
        max_num_batched_tokens: 100,
        max_model_len: 256,
        block_size: 4,
        pool_tokens: 1024,
        arrival_poll: Some(ArrivalPoll {
            interval: 5,
            after_prefill: false,
        }),
        ..SchedulerConfig::default()
    };
    let mut cores = Cores::new(
        Scheduler::new(cfg).expect("config"),
        BlockManager::new(256, 4),
    );
    let requests = vec![Request::new(0, 0, 200, 10), Request::new(1, STEP / 2, 8, 4)];
    let r = cores.replay(requests, STEP, true).expect("replay");
    assert_eq!(r[1].first_scheduled_ns, Some(2 * STEP), "{:?}", r[1]);
}
