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
//! use engine::scheduler::{Scheduler, SchedulerConfig};
//! use engine::request::Request;
//!
//! let cfg = SchedulerConfig {
//!     max_num_seqs: 8, max_num_batched_tokens: 64, max_model_len: 256, pool_tokens: 1024,
//!     ..SchedulerConfig::default()
//! };
//! let mut sched = Scheduler::new(cfg).unwrap();
//! let mut bm = BlockManager::new(64, 16);
//! sched.add_request(Request::new(0, 0, 100, 4), 0);
//! let req = sched.propose(0);
//! let resp = bm.reserve(&req);
//! let plan = sched.apply(&req, resp, 0);
//! assert_eq!(plan.num_batched_tokens(), 64); // the first chunk of the prompt
//! ```
#![warn(missing_docs)]

pub mod actors;
pub mod backend;
pub mod block_manager;
pub mod cores;
pub mod error;
pub mod eviction;
pub mod plan;
pub mod prefix;
pub mod record;
pub mod request;
pub mod scheduler;
pub mod spec;

pub use error::EngineError;
