//! The serving engine: requests, the paged KV block manager, the schedulers, the `Backend`
//! trait and the actix actors that connect them.
//!
//! Data flow of one step (DESIGN §2): the scheduler's policy proposes which sequences run
//! and how many tokens each computes ([`scheduler::Scheduler::propose`]); the block manager
//! reserves their KV blocks in one call, preempting victims if it must
//! ([`block_manager::BlockManager::reserve`]); the scheduler turns the answer into a
//! [`plan::StepPlan`] ([`scheduler::Scheduler::apply`]); a [`backend::Backend`] executes it
//! and reports its duration; the scheduler commits the sampled tokens
//! ([`scheduler::Scheduler::commit`]) and the block manager frees finished sequences.
//!
//! The cores are plain structs (time passed in, effects returned), so tests and benches
//! drive them directly; [`actors`] wraps the same cores for the actor-based driver.
//!
//! ```
//! use engine::block_manager::BlockManager;
//! use engine::scheduler::{Scheduler, SchedulerConfig, SchedulerKind};
//! use engine::request::Request;
//!
//! let cfg = SchedulerConfig {
//!     kind: SchedulerKind::Chunked, max_num_seqs: 8, max_num_batched_tokens: 64,
//!     max_model_len: 256, pool_tokens: 1024, eos_token: None,
//!     want_block_tables: false, keep_tokens: false, block_size: 16, prefix_caching: false,
//!     queue: Default::default(), queue_aging_ns: 10_000_000_000,
//!     admission: Default::default(), victim: Default::default(), watermark_blocks: 0,
//!     sliding_window: None,
//! };
//! let mut sched = Scheduler::new(cfg).unwrap();
//! let mut bm = BlockManager::new(64, 16);
//! sched.add_request(Request { id: 0, arrival: 0, prompt_len: 100, prompt_tokens: vec![],
//!     max_tokens: 4, ignore_eos: true, scripted_output: vec![], n: 1, beam_search: false, priority: 0, class: 0 }, 0);
//! let req = sched.propose(0);
//! let resp = bm.reserve(&req);
//! let plan = sched.apply(&req, resp, 0);
//! assert_eq!(plan.num_batched_tokens(), 64); // the first chunk of the prompt
//! ```
#![warn(missing_docs)]

pub mod actors;
pub mod backend;
pub mod block_manager;
pub mod error;
pub mod eviction;
pub mod plan;
pub mod prefix;
pub mod record;
pub mod request;
pub mod scheduler;

pub use error::EngineError;
