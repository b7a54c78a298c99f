//! Stop token ids and `min_tokens` (vLLM's `check_stop` and min-tokens logits processor):
//! a sampled stop token id ends a request like end-of-sequence, `ignore_eos` or not; until
//! `min_tokens` are out the scheduler asks real backends to mask end-of-sequence and the stop
//! ids (`SeqWork::suppress`) in exactly the draws that would leave the request short, and
//! nothing ends it. The backend here is a fake model that always wants to stop: it draws
//! the first id it is not forbidden, from each request's preference list.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::StepOutcome;
use engine::record::RequestRecord;
use engine::request::{FinishReason, Request};
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};

const EOS: u32 = 7;
const STOP: u32 = 9;
const PLAIN: u32 = 5;

/// Runs `requests` to the end with a backend that draws, for each, the first id of its
/// preferences that the draw does not mask; returns the records by id and, per request,
/// the `suppress` lists its draws carried.
fn run(requests: Vec<(Request, &[u32])>) -> (Vec<RequestRecord>, Vec<Vec<Vec<u32>>>) {
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 256,
        block_size: 4,
        pool_tokens: 1024,
        eos_token: Some(EOS),
        keep_tokens: true,
        ..SchedulerConfig::default()
    };
    let n = requests.len();
    let mut cores = Cores::new(
        Scheduler::new(cfg).expect("config"),
        BlockManager::new(256, 4),
    );
    let prefs: Vec<Vec<u32>> = requests.iter().map(|(_, p)| p.to_vec()).collect();
    for (r, _) in requests {
        assert!(cores.scheduler.add_request(r, 0).is_none());
    }
    let (mut now, mut records, mut masks) = (0, Vec::new(), vec![Vec::new(); n]);
    while let Some(planned) = cores.plan(now) {
        now += 1000;
        let mut out = StepOutcome::simulated(&planned.plan, 1000);
        out.sampled.clear();
        for w in planned.plan.work.iter().filter(|w| w.sample) {
            let forbidden = if w.suppress_rows > 0 {
                w.suppress.clone()
            } else {
                Vec::new()
            };
            masks[w.seq as usize].push(forbidden.clone());
            let t = prefs[w.seq as usize]
                .iter()
                .copied()
                .find(|t| !forbidden.contains(t))
                .unwrap_or(PLAIN);
            out.sampled
                .extend(std::iter::repeat_n(t, w.num_samples as usize));
        }
        let done = cores.commit(&planned.plan, &out, now).expect("commit");
        records.extend(done.finished);
        assert!(now < 1_000_000, "runaway");
    }
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    records.sort_by_key(|r| r.request_id);
    (records, masks)
}

fn request(id: u64, min_tokens: u32, ignore_eos: bool, stop: &[u32]) -> Request {
    Request {
        ignore_eos,
        min_tokens,
        stop_token_ids: stop.to_vec(),
        ..Request::new(id, 0, 0, 20).with_tokens(vec![1, 2, 3, 4, 5, 6])
    }
}

#[test]
fn stop_token_ids_end_requests_and_min_tokens_masks_them_first() {
    let wants_eos: &[u32] = &[EOS, STOP, PLAIN];
    let wants_stop: &[u32] = &[STOP, EOS, PLAIN];
    let (records, masks) = run(vec![
        // EOS at the first draw.
        (request(0, 0, false, &[]), wants_eos),
        // EOS masked for 3 draws, then drawn: 4 tokens.
        (request(1, 3, false, &[]), wants_eos),
        // EOS and STOP masked for 2 draws; then EOS.
        (request(2, 2, false, &[STOP]), wants_eos),
        // EOS ignored: STOP ends it at once.
        (request(3, 0, true, &[STOP]), wants_stop),
        // EOS ignored, STOP masked for 4 draws (EOS drawn, and ignored), then STOP.
        (request(4, 4, true, &[STOP]), wants_stop),
        // EOS ignored, no stop ids: the length cap.
        (request(5, 3, true, &[]), wants_eos),
    ]);
    let got: Vec<(u32, FinishReason)> = records
        .iter()
        .map(|r| (r.output_len, r.finish_reason))
        .collect();
    use FinishReason::{Length, Stop};
    assert_eq!(
        got,
        [
            (1, Stop),
            (4, Stop),
            (3, Stop),
            (1, Stop),
            (5, Stop),
            (20, Length)
        ]
    );
    // The masks: exactly the draws before min_tokens, with EOS unless ignored and the
    // stop ids.
    assert_eq!(masks[0], vec![Vec::<u32>::new()]);
    assert_eq!(masks[1], [vec![EOS], vec![EOS], vec![EOS], vec![]]);
    assert_eq!(masks[2], [vec![EOS, STOP], vec![EOS, STOP], vec![]]);
    assert_eq!(masks[3], vec![Vec::<u32>::new()]);
    assert_eq!(
        masks[4],
        [vec![STOP], vec![STOP], vec![STOP], vec![STOP], vec![]]
    );
    // Ignoring EOS with no stop ids masks nothing, min_tokens or not.
    assert!(masks[5].iter().all(Vec::is_empty));
    assert_eq!(masks[5].len(), 20);
}
