//! n-gram speculative decoding (vLLM's prompt lookup) with a real backend's tokens: the
//! engine drafts from the sequence's own ids, a fake greedy model that repeats a 3-token
//! cycle verifies them, and the output is what plain decoding gives. A synthetic prompt
//! has no ids in the engine (the runtime makes its own), so its lookup searches the
//! output alone: it must still draft once the output repeats (it drafted nothing at all on
//! the GPU before, 2026-11-27).

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::plan::{StepOutcome, WorkKind};
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};
use engine::spec::{Acceptance, DynamicK, Method, SpecConfig, SpecStats};

/// The fake model's greedy token at position `p` of any sequence.
fn model(p: u32) -> u32 {
    [10, 11, 12][(p % 3) as usize]
}

/// Runs `requests` to the end with n-gram drafts of up to `k` tokens verified greedily
/// against [`model`]; returns each request's output and the acceptance counters.
fn run(requests: Vec<Request>, k: u32) -> (Vec<Vec<u32>>, SpecStats) {
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 256,
        block_size: 4,
        pool_tokens: 1024,
        keep_tokens: true,
        speculative: Some(SpecConfig {
            method: Method::Ngram,
            k,
            acceptance: Acceptance::iid(0.0, k).expect("rate"),
            class_acceptance: Vec::new(),
            ngram_min: 1,
            ngram_max: 3,
            dynamic: DynamicK::Off,
        }),
        ..SchedulerConfig::default()
    };
    let n = requests.len();
    let mut cores = Cores::new(
        Scheduler::new(cfg).expect("config"),
        BlockManager::new(256, 4),
    );
    for r in requests {
        assert!(cores.scheduler.add_request(r, 0).is_none());
    }
    let mut outputs = vec![Vec::new(); n];
    let mut now = 0;
    while let Some(planned) = cores.plan(now) {
        now += 1000;
        let mut out = StepOutcome::simulated(&planned.plan, 1000);
        out.sampled.clear();
        out.accepted.clear();
        for w in planned.plan.work.iter().filter(|w| w.sample) {
            let seq = w.seq as usize;
            if w.kind == WorkKind::Verify {
                // token_ids: the last token, then the drafts (positions start + 1 ...).
                let drafts = &w.token_ids[1..];
                assert!(!drafts.is_empty(), "a verify work without drafts");
                let accepted = drafts
                    .iter()
                    .enumerate()
                    .take_while(|&(i, &d)| d == model(w.start + 1 + i as u32))
                    .count() as u32;
                let emitted: Vec<u32> = (0..=accepted).map(|i| model(w.start + 1 + i)).collect();
                out.accepted.push(accepted);
                outputs[seq].extend(&emitted);
                out.sampled.extend(emitted);
            } else {
                let t = model(w.start + w.len);
                outputs[seq].push(t);
                out.sampled.push(t);
            }
        }
        cores.commit(&planned.plan, &out, now).expect("commit");
        assert!(now < 1_000_000, "runaway");
    }
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    let mut stats = SpecStats::default();
    for s in cores.scheduler.spec_stats() {
        stats.merge(s);
    }
    (outputs, stats)
}

#[test]
fn a_synthetic_prompt_drafts_from_its_output() {
    // Prompts of 8 and 30 tokens without ids, 40 output tokens each.
    let requests = vec![Request::new(0, 0, 8, 40), Request::new(1, 0, 30, 40)];
    let (outputs, stats) = run(requests, 4);
    for (i, (o, len)) in outputs.iter().zip([8u32, 30]).enumerate() {
        // What plain greedy decoding gives, token for token (a step past the end would
        // add more).
        let want: Vec<u32> = (len..len + 40).map(model).collect();
        assert_eq!(o, &want, "request {i}");
    }
    // After the first cycle every lookup finds the cycle and every draft is right, so
    // most of the 80 tokens come from verify steps.
    assert!(stats.num_drafts > 0, "no drafts: {stats:?}");
    assert_eq!(
        stats.num_accepted_tokens, stats.num_draft_tokens,
        "{stats:?}"
    );
    assert!(stats.mean_acceptance_length() > 3.0, "{stats:?}");
}

#[test]
fn prompt_ids_feed_the_lookup_before_any_output() {
    // A prompt holding the cycle: its first decode already has a match in the prompt.
    let prompt: Vec<u32> = (0..12).map(model).collect();
    let (outputs, stats) = run(vec![Request::new(0, 0, 0, 20).with_tokens(prompt)], 3);
    assert_eq!(outputs[0], (12..32).map(model).collect::<Vec<_>>());
    // 20 tokens: the prefill's, then verify steps of up to 4 (3 drafts + 1), the last
    // ones cut by max_tokens; no plain decode in between.
    assert!(stats.num_drafts >= 5, "{stats:?}");
    assert_eq!(
        stats.num_accepted_tokens, stats.num_draft_tokens,
        "{stats:?}"
    );
}
