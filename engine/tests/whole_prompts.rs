//! The chunked scheduler without chunked prefill (`chunked_prefill = false`, vLLM's and
//! TensorRT-LLM's `enable_chunked_prefill: false`), on a cost-free backend of 1 us steps: a
//! new prompt joins a step beside the decodes only whole, the first prompt that does not fit
//! what is left of the budget ends the step's admissions (FCFS: a shorter one behind it
//! waits too), and every prompt is prefilled in one step; with prefix caching, only its
//! uncached tokens must fit (as vLLM counts them). The configuration checks refuse the
//! setting under another scheduler and a budget that cannot hold the longest sequence.

use engine::block_manager::BlockManager;
use engine::cores::Cores;
use engine::eviction::Lru;
use engine::record::RequestRecord;
use engine::request::Request;
use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};

const STEP: u64 = 1000;

fn config(chunked_prefill: bool) -> SchedulerConfig {
    SchedulerConfig {
        kind: SchedulerKind::Chunked,
        max_num_seqs: 8,
        max_num_batched_tokens: 100,
        max_model_len: 100,
        block_size: 4,
        pool_tokens: 1024,
        chunked_prefill,
        ..SchedulerConfig::default()
    }
}

/// Replays A (60-token prompt), B (60) and C (30), all arriving at 0, checking that every
/// block comes back.
fn replay(chunked_prefill: bool) -> Vec<RequestRecord> {
    let mut cores = Cores::new(
        Scheduler::new(config(chunked_prefill)).expect("config"),
        BlockManager::new(256, 4),
    );
    let requests = vec![
        Request::new(0, 0, 60, 4),
        Request::new(1, 0, 60, 4),
        Request::new(2, 0, 30, 4),
    ];
    let records = cores.replay(requests, STEP, true).expect("replay");
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    assert!(
        records.iter().all(|r| r.generated_tokens == 4),
        "{records:?}"
    );
    records
}

#[test]
fn chunked_prefill_splits_the_second_prompt_to_fill_the_budget() {
    let r = replay(true);
    // Step 0: A's 60 tokens and 40 of B's; step 1: A's decode, B's last 20, C's 30.
    assert_eq!(r[1].first_scheduled_ns, Some(0), "{:?}", r[1]);
    assert_eq!(r[1].first_token_ns, Some(2 * STEP), "{:?}", r[1]);
    assert_eq!(r[2].first_scheduled_ns, Some(STEP), "{:?}", r[2]);
}

#[test]
fn without_it_a_prompt_joins_a_step_only_whole() {
    let r = replay(false);
    // Step 0: A alone (B's 60 tokens do not fit the 40 left, and C, which would, waits
    // behind B); step 1: A's decode with B and C whole (1 + 60 + 30 tokens).
    assert_eq!(r[0].first_token_ns, Some(STEP), "{:?}", r[0]);
    assert_eq!(r[1].first_scheduled_ns, Some(STEP), "{:?}", r[1]);
    assert_eq!(r[2].first_scheduled_ns, Some(STEP), "{:?}", r[2]);
    for x in &r {
        // Every prompt prefilled in the one step it was first scheduled in.
        assert_eq!(
            x.first_token_ns,
            x.first_scheduled_ns.map(|t| t + STEP),
            "{x:?}"
        );
    }
}

#[test]
fn whole_prompts_need_the_chunked_scheduler_and_room_for_the_longest() {
    let cfg = SchedulerConfig {
        kind: SchedulerKind::Continuous,
        max_num_batched_tokens: 4096,
        chunked_prefill: false,
        ..SchedulerConfig::default()
    };
    let e = Scheduler::new(cfg).err().expect("refused").to_string();
    assert!(e.contains("engine.enable_chunked_prefill"), "{e}");
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 99,
        ..config(false)
    };
    let e = Scheduler::new(cfg).err().expect("refused").to_string();
    assert!(
        e.contains("engine.max_num_batched_tokens") && e.contains("(99)") && e.contains("100"),
        "{e}"
    );
}

/// E (a 60-token prompt) and three short requests start together and decode for 40 steps
/// (4 tokens a step); D arrives at 5.5 steps with E's 60 tokens and 39 more: 99 tokens do
/// not fit the 96 the decodes leave, the 39 beyond E's cached blocks do.
fn cached_head(prefix_caching: bool) -> Vec<RequestRecord> {
    let cfg = SchedulerConfig {
        prefix_caching,
        ..config(false)
    };
    let bm = if prefix_caching {
        BlockManager::with_prefix_caching(256, 4, Box::<Lru>::default())
    } else {
        BlockManager::new(256, 4)
    };
    let mut cores = Cores::new(Scheduler::new(cfg).expect("config"), bm);
    let e_tokens: Vec<u32> = (1000..1060).collect();
    let d_tokens: Vec<u32> = e_tokens.iter().copied().chain(2000..2039).collect();
    let short = |id: u64| {
        Request::new(id, 0, 10, 40).with_tokens((0..10).map(|t| t + 100 * id as u32).collect())
    };
    let requests = vec![
        Request::new(0, 0, 60, 40).with_tokens(e_tokens),
        short(1),
        short(2),
        short(3),
        Request::new(4, 5 * STEP + STEP / 2, 99, 1).with_tokens(d_tokens),
    ];
    let records = cores.replay(requests, STEP, true).expect("replay");
    assert_eq!(cores.block_manager.num_used(), 0, "every block comes back");
    records
}

#[test]
fn with_prefix_caching_only_the_uncached_tokens_must_fit() {
    let hit = cached_head(true);
    let d = hit.iter().find(|r| r.request_id == 4).expect("D");
    assert_eq!(d.first_scheduled_ns, Some(6 * STEP), "{d:?}");
    assert_eq!(d.cached_tokens, 60, "{d:?}");
    let miss = cached_head(false);
    let d = miss.iter().find(|r| r.request_id == 4).expect("D");
    // Without the cache D waits until the decodes beside it end (40 steps).
    assert!(d.first_scheduled_ns >= Some(40 * STEP), "{d:?}");
}
