//! Ending requests early (`Scheduler::abort`, what `sim serve` does when a client hangs up
//! or a stop string matches): a request decoding, one mid-prompt in chunked prefill, one
//! still queued and a parallel-sampling one each end at their next step with the reason
//! given, every block comes back, and the requests beside them run as before; one choice of
//! a parallel-sampling request ends alone (`Scheduler::abort_choice`); the token an aborted
//! sequence draws at its last step adds no inter-token gap.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::StepOutcome;
use engine::record::RequestRecord;
use engine::request::{FinishReason, Request};
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};

/// A chunked scheduler (16-token steps, 4-token blocks) over a 256-block pool.
fn cores(max_num_seqs: u32) -> Cores {
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs,
        max_num_batched_tokens: 16,
        max_model_len: 256,
        block_size: 4,
        pool_tokens: 1024,
        ..SchedulerConfig::default()
    };
    Cores::new(
        Scheduler::new(cfg).expect("config"),
        BlockManager::new(256, 4),
    )
}

/// Runs `requests` (all arriving at 0), calling `abort(step, now, cores)` before each step
/// (the records it returns are those of requests that left the queue at once); returns
/// the records by request id and the steps run.
fn run(
    requests: Vec<Request>,
    max_num_seqs: u32,
    abort: impl Fn(u64, u64, &mut Cores) -> Vec<RequestRecord>,
) -> (Vec<RequestRecord>, u64) {
    let mut cores = cores(max_num_seqs);
    for r in requests {
        assert!(cores.scheduler.add_request(r, 0).is_none());
    }
    let (mut now, mut step, mut records) = (0, 0, Vec::new());
    loop {
        records.extend(abort(step, now, &mut cores));
        let Some(planned) = cores.plan(now) else {
            break;
        };
        now += 1000;
        let out = StepOutcome::simulated(&planned.plan, 1000);
        let done = cores.commit(&planned.plan, &out, now).expect("commit");
        cores.block_manager.check_invariants().expect("invariants");
        records.extend(done.finished);
        step += 1;
        assert!(step < 1000, "runaway");
    }
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    records.sort_by_key(|r| r.request_id);
    (records, step)
}

#[test]
fn aborted_requests_end_at_their_next_step_and_free_their_blocks() {
    let requests = vec![
        Request::new(0, 0, 8, 50),  // decoding when aborted
        Request::new(1, 0, 60, 10), // mid-prompt (16-token chunks) when aborted
        Request::new(2, 0, 8, 10),  // runs beside them, untouched
        Request {
            n: 3,
            ..Request::new(3, 0, 8, 40)
        }, // forked into 3 when stopped
        Request::new(4, 0, 8, 10),  // still queued (max_num_seqs) when aborted
    ];
    let (records, _) = run(requests, 6, |step, now, cores| {
        let mut out = Vec::new();
        if step == 2 {
            out.extend(cores.scheduler.abort(1, FinishReason::Abort, now));
        }
        if step == 6 {
            out.extend(cores.scheduler.abort(0, FinishReason::Abort, now));
            out.extend(cores.scheduler.abort(3, FinishReason::Stop, now));
        }
        assert!(out.is_empty(), "running requests end at their next step");
        out
    });
    assert_eq!(records.len(), 5, "one record per request");
    let r = |id: usize| &records[id];
    assert_eq!(r(0).finish_reason, FinishReason::Abort);
    assert!(r(0).output_len > 0 && r(0).output_len < 50, "{:?}", r(0));
    assert_eq!(r(1).finish_reason, FinishReason::Abort);
    assert_eq!(r(1).output_len, 0, "ended before its prompt was computed");
    assert_eq!(r(2).finish_reason, FinishReason::Length);
    assert_eq!(r(2).output_len, 10);
    assert_eq!(r(3).finish_reason, FinishReason::Stop);
    assert!(r(3).output_len < 40);
    assert_eq!(r(4).finish_reason, FinishReason::Length);
}

#[test]
fn a_queued_request_aborted_leaves_the_queue_at_once() {
    // One sequence at a time: requests 1 and 2 wait behind request 0 (1 in the queue's
    // head, 2 still in the backlog behind it).
    let requests = vec![
        Request::new(0, 0, 8, 20),
        Request::new(1, 0, 8, 20),
        Request::new(2, 0, 8, 20),
    ];
    let (records, steps) = run(requests, 1, |step, now, cores| {
        if step == 1 {
            let a = cores.scheduler.abort(2, FinishReason::Abort, now);
            let b = cores.scheduler.abort(1, FinishReason::Abort, now);
            assert!(a.is_some() && b.is_some(), "queued requests leave at once");
            return a.into_iter().chain(b).collect();
        }
        Vec::new()
    });
    assert_eq!(records[0].finish_reason, FinishReason::Length);
    for r in &records[1..] {
        assert_eq!(r.finish_reason, FinishReason::Abort);
        assert_eq!((r.output_len, r.first_scheduled_ns), (0, None));
    }
    // Request 0's 20 tokens only: nothing was computed for the others.
    assert_eq!(steps, 20);
}

#[test]
fn one_choice_of_a_parallel_request_ends_alone() {
    // Three choices of 30 tokens; choice 1 stops (a stop string in its text) at step 5,
    // choice 0 (the request's own sequence) at step 8; choice 2 runs to the end. A choice
    // not live (9) is ignored.
    let requests = vec![Request {
        n: 3,
        ..Request::new(0, 0, 8, 30)
    }];
    let (records, steps) = run(requests, 6, |step, _, cores| {
        let running = cores.scheduler.num_running();
        match step {
            5 => {
                assert_eq!(running, 3);
                cores.scheduler.abort_choice(0, 1, FinishReason::Stop);
                cores.scheduler.abort_choice(0, 9, FinishReason::Stop);
            }
            6 | 7 => assert_eq!(running, 2, "choice 1 ended at its next step"),
            8 => cores.scheduler.abort_choice(0, 0, FinishReason::Stop),
            9..=29 => assert_eq!(running, 1, "choice 2 alone"),
            _ => {}
        }
        Vec::new()
    });
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.output_len, 30, "the longest choice");
    // Step 0 computes the prompt and samples the three first tokens; choice 1 ends with
    // the token of step 5 (6 tokens), choice 0 with step 8's (9), choice 2 at 30.
    assert_eq!(r.generated_tokens, 6 + 9 + 30);
    assert_eq!(steps, 30);
}

#[test]
fn a_token_drawn_after_the_abort_adds_no_inter_token_gap() {
    // One request decoding alone: every step draws one token, one gap after the first;
    // the token its aborted sequence draws at its last step reaches no client.
    let (mut gaps, mut record) = (0usize, None);
    let mut cores = cores(4);
    assert!(cores
        .scheduler
        .add_request(Request::new(0, 0, 8, 50), 0)
        .is_none());
    let mut now = 0;
    for step in 0..100 {
        if step == 6 {
            assert!(cores.scheduler.abort(0, FinishReason::Stop, now).is_none());
        }
        let Some(planned) = cores.plan(now) else {
            break;
        };
        now += 1000;
        let out = StepOutcome::simulated(&planned.plan, 1000);
        let done = cores.commit(&planned.plan, &out, now).expect("commit");
        gaps += cores.scheduler.take_itl_gaps().count();
        record = done.finished.into_iter().next().or(record);
    }
    let r = record.expect("the request ends");
    assert_eq!(r.finish_reason, FinishReason::Stop);
    // Tokens drawn: one a step from the prefill on, the aborted step's included.
    assert_eq!(r.output_len, 7, "{r:?}");
    assert_eq!(gaps, 5, "a gap for tokens 2-6, none for the 7th");
}
