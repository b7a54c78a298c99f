//! The fleet against aiconfigurator's disaggregated rows (`mode = disagg` in
//! `silicon.csv`): each row that records its pools (workers, and each worker's tensor,
//! attention-data and expert parallelism, in the `prefill_*` and `decode_*` columns) is
//! replayed as the fleet it ran as — a prefill pool and a decode pool of the row's workers,
//! every attention-DP rank an engine of the fleet (a worker's ranks stepping in lockstep),
//! the workers taken in turn (Dynamo's default) with SGLang's prefill servers placing a
//! request on a random attention-DP rank (its random bootstrap room modulo the ranks),
//! every other stage its ranks in turn, each prompt's KV sent to its decode rank over
//! NVLink when both pools fit in one NVLink domain (a GB200 NVL72 rack) and over RDMA
//! otherwise — and its mean TTFT and TPOT set
//! against the measured ones. The clients, the request stream and each engine's serving
//! defaults are the aggregated rows' ([`super::silicon`]): the row's `silicon_concurrency`
//! clients in a closed loop (or the `_c<N>_` its id names), InferenceX's lengths uniform in
//! `[0.8 L, L]` or aiperf's fixed ones. Nothing in the cost model
//! or the fleet was fitted to these rows, so every error is held out.
//!
//! In: the CSV's rows. Out: one [`SiliconCheck`] per replayed row, and the skipped counts.

use super::sglang_recipes::{Layout, Recipe, Server};
use super::silicon::{
    base_config, catalog_of, check_rows, engine_defaults, layout, run_quietly, sglang_memory_share,
    trtllm_memory_share, EngineCost, SiliconCheck, Skipped,
};
use crate::observed::silicon::{AggregateRow, Stage};
use crate::scenario::cluster::{
    ClusterConfig, DisaggregationConfig, Link, PoolConfig, PrefixIndexConfig, Role, RoutingKind,
    ScorerWeights,
};
use crate::scenario::{Scenario, Variant};

/// Requests each closed loop runs, in multiples of its clients: InferenceX's `10 x
/// concurrency`, all clients starting at once (the first wave's prompts queue together at
/// the prefill pool, as they did in the measured runs).
pub const WAVES: u64 = 10;

/// A row's two pools: `(workers, attention TP, attention-DP ranks, EP)` each, the link,
/// and the clients.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Planned {
    model: &'static str,
    gpu: &'static str,
    dtype: crate::catalog::Dtype,
    prefill: Layout,
    decode: Layout,
    link: Link,
    clients: u32,
    /// The recipe an SGLang row ran ([`super::sglang_recipes`]).
    recipe: Option<&'static Recipe>,
}

impl Planned {
    /// The recipe's server for `role`'s pool, where an SGLang recipe matched.
    fn server(&self, role: Role) -> Option<Server> {
        self.recipe.map(|r| match role {
            Role::Prefill => r.prefill,
            _ => r.decode,
        })
    }

    /// SGLang's `mem-fraction-static` for `role`'s pool: its recipe's, else the common value.
    fn sglang_fraction(&self, role: Role) -> f64 {
        self.server(role)
            .map_or(SGLANG_DISAGG_MEM_FRACTION, |s| s.mem_fraction)
    }
}

/// What a disaggregated row resolves to, or why it is not replayed.
fn plan(row: &AggregateRow) -> Result<Planned, String> {
    let d = row
        .disagg
        .ok_or_else(|| "aggregated (one engine, not a fleet)".to_string())?;
    if row.repeats.is_some() {
        return Err(super::silicon::REPEATED.into());
    }
    let (model, gpu, dtype) = catalog_of(row)?;
    let moe = crate::catalog::find_model(model).is_some_and(|m| m.is_moe());
    let pool = |s: &Stage| -> Result<Layout, String> {
        if s.parallel.pp.unwrap_or(1) > 1 {
            return Err("pipeline parallelism".into());
        }
        let workers = s
            .workers
            .ok_or_else(|| "worker counts not recorded (InferenceX's dumps)".to_string())?;
        let (tp, dp, ep) = layout(&s.parallel, moe)?;
        Ok((workers, tp, dp, ep))
    };
    let (mut prefill, mut decode) = (pool(&d.prefill)?, pool(&d.decode)?);
    let recipe = super::sglang_recipes::find(row, [prefill, decode]);
    if let Some([p, d]) = recipe.and_then(|r| r.layouts) {
        (prefill, decode) = (p, d);
    }
    let clients = row
        .concurrency
        .ok_or_else(|| super::silicon::NO_CLIENTS.to_string())?;
    let domain = crate::catalog::find_gpu(gpu).map_or(8, |g| g.nvlink_domain);
    let link = if pool_gpus(prefill) + pool_gpus(decode) <= u64::from(domain) {
        Link::Nvlink
    } else {
        Link::Rdma
    };
    Ok(Planned {
        model,
        gpu,
        dtype,
        prefill,
        decode,
        link,
        clients,
        recipe,
    })
}

/// SGLang's `mem-fraction-static` for a disaggregated row no recipe matches
/// ([`super::sglang_recipes`]): the value of InferenceX's GB200 DEP decode servers, which
/// stop 72 gave every pool.
const SGLANG_DISAGG_MEM_FRACTION: f64 = 0.82;

/// The GPUs of a replayed disaggregated row's prefill pool (workers x attention TP x
/// attention-DP ranks); `None` for a row that is not replayed.
pub(crate) fn prefill_gpus(row: &AggregateRow) -> Option<u64> {
    plan(row).ok().map(|p| pool_gpus(p.prefill))
}

/// A pool's GPUs: workers x attention TP x attention-DP ranks.
fn pool_gpus((workers, tp, dp, _): Layout) -> u64 {
    u64::from(workers) * u64::from(tp) * u64::from(dp)
}

/// One pool's `[cluster.pools.<name>]`: its workers, the layout, and the engine's keys
/// that depend on it.
fn pool(
    role: Role,
    (workers, tp, dp, ep): Layout,
    (row, p): (&AggregateRow, &Planned),
    memory_utilization: Option<f64>,
) -> PoolConfig {
    let mut hardware = toml::Table::new();
    for (k, v) in [("tp", tp), ("dp", dp), ("ep", ep)] {
        hardware.insert(k.into(), toml::Value::Integer(i64::from(v)));
    }
    let mut e = crate::scenario::EngineConfig::default();
    engine_defaults(&mut e, &row.backend);
    let server = p.server(role);
    if row.backend == "sglang" {
        // Every recipe InferenceX ran its disaggregated SGLang rows with sets
        // `mem-fraction-static` (0.6-0.95); SGLang's own heuristic
        // ([`super::silicon::sglang_mem_fraction_static`]) would leave a DP32 decode rank
        // almost nothing.
        e.gpu_memory_utilization = p.sglang_fraction(role);
    }
    let mut engine = toml::Table::new();
    let util = memory_utilization.unwrap_or(e.gpu_memory_utilization);
    engine.insert("gpu_memory_utilization".into(), toml::Value::Float(util));
    if let Some(n) = server.and_then(|s| s.recv_interval) {
        engine.insert("recv_interval".into(), toml::Value::Integer(i64::from(n)));
    }
    let chunked = |engine: &mut toml::Table| {
        let kind = engine::scheduler::SchedulerKind::Chunked.as_str();
        engine.insert("scheduler".into(), toml::Value::String(kind.to_string()));
    };
    let mut budget = e.max_num_batched_tokens.unwrap_or(8192);
    let chunk = server.and_then(|s| s.rank_chunk(dp));
    if let (Some(chunk), Role::Prefill) = (chunk, role) {
        // The recipe's prefill chunk, each rank its share: SGLang prefills a prompt longer
        // than what is left of it in pieces, the rest of it first in the next batch, which
        // the chunked scheduler does on a pool that only prefills.
        chunked(&mut engine);
        budget = chunk;
    } else if e.scheduler == engine::scheduler::SchedulerKind::Continuous {
        if role == Role::Decode {
            // SGLang's decode servers add a request whose KV has arrived to the running
            // batch (no prefill batch of its own, which would pause every decode): the
            // mixed steps of the chunked scheduler.
            chunked(&mut engine);
        } else {
            // The simulator's prefill-first scheduler prefills whole prompts (SGLang chunks
            // the rare prompt beyond its 8,192 tokens): its budget must hold the longest,
            // as for the aggregated rows.
            budget = budget.max(row.isl + row.osl);
        }
    }
    // The recipe's request cap, each rank its share, where it sets one (a prefill server's
    // caps the requests one prefill batch takes); else room for every rank's share of the
    // clients (a rank may hold them all at once). And a budget that can decode them all in
    // one step.
    let ranks = workers.saturating_mul(dp).max(1);
    let seqs = match server.and_then(|s| s.rank_max_running(dp)) {
        Some(cap) if role == Role::Prefill => cap.min(budget),
        Some(cap) => cap,
        None => e.max_num_seqs.max(p.clients.div_ceil(ranks)),
    };
    engine.insert("max_num_seqs".into(), toml::Value::Integer(i64::from(seqs)));
    engine.insert(
        "max_num_batched_tokens".into(),
        toml::Value::Integer(i64::from(budget.max(seqs))),
    );
    PoolConfig {
        replicas: workers,
        role,
        usd_per_gpu_hour: None,
        model: None,
        hardware: Some(hardware),
        engine: Some(engine),
        cost: None,
        speculative: None,
    }
}

/// The fleet of `row` resolved; `Err(why)` when it cannot be configured (most often, a
/// pool does not fit its GPUs).
fn resolve(
    scn: &Scenario,
    row: &AggregateRow,
    p: &Planned,
    cost: EngineCost,
    memory: [Option<f64>; 2],
) -> Result<Variant, String> {
    let mut cfg = base_config(scn, row, (p.model, p.gpu, p.dtype), cost, p.clients);
    cfg.workload.num_requests = Some(WAVES * u64::from(p.clients));
    engine_defaults(&mut cfg.engine, &row.backend);
    if p.recipe.is_some_and(|r| r.kv_fp8) {
        cfg.model.kv_dtype = Some(crate::catalog::Dtype::Fp8);
    }
    if row.backend == "sglang" {
        // The decode pool's fraction: the whole configuration resolves on its layout.
        cfg.engine.gpu_memory_utilization = p.sglang_fraction(Role::Decode);
    }
    if cfg.engine.scheduler == engine::scheduler::SchedulerKind::Continuous {
        cfg.engine.max_num_batched_tokens = Some(8192.max(row.isl + row.osl));
    }
    // The configuration itself must resolve too (its engine is not run): on the decode
    // pool's layout.
    (_, cfg.hardware.tp, cfg.hardware.dp, cfg.hardware.ep) = p.decode;
    let mut pools = std::collections::BTreeMap::new();
    // Where a request lands: Dynamo's router takes the workers in turn (its default), and
    // a worker with attention-DP ranks places it on one of them. SGLang's prefill servers
    // take rank `bootstrap_room % dp`, the room a random 63-bit number from the frontend
    // (Dynamo's and SGLang's `_generate_bootstrap_room`): a random rank, so the lockstep
    // ranks of a prefill server are unevenly loaded, and the busiest sets the step. Its
    // decode servers, and TensorRT-LLM's ranks (attention-DP balancing), take them in
    // turn. One draw over every rank of the pool stands for both levels.
    let prefill_routing = if row.backend == "sglang" {
        RoutingKind::Random
    } else {
        RoutingKind::RoundRobin
    };
    pools.insert(
        "prefill".to_string(),
        pool(Role::Prefill, p.prefill, (row, p), memory[0]),
    );
    pools.insert(
        "decode".to_string(),
        pool(Role::Decode, p.decode, (row, p), memory[1]),
    );
    cfg.cluster = Some(ClusterConfig {
        routing: prefill_routing,
        refresh_ms: 50.0,
        scorers: ScorerWeights::default(),
        prefix_index: PrefixIndexConfig::default(),
        usd_per_gpu_hour: None,
        disaggregation: DisaggregationConfig {
            link: p.link,
            decode_routing: Some(RoutingKind::RoundRobin),
            ..DisaggregationConfig::default()
        },
        pools,
    });
    scn.resolve_config(&row.id, cfg).map_err(|e| e.msg)
}

/// One closed-loop run of `row`'s fleet; `Err(why)` when it cannot be configured.
fn simulate(
    scn: &Scenario,
    row: &AggregateRow,
    p: &Planned,
    cost: EngineCost,
) -> Result<Result<analysis::Summary, String>, crate::SimError> {
    let mut v = match resolve(scn, row, p, cost, [None, None]) {
        Ok(v) => v,
        Err(why) => return Ok(Err(why)),
    };
    if row.backend == "trtllm" || row.backend == "sglang" {
        // TensorRT-LLM's KV cache takes 0.9 of what weights and activations leave, and
        // SGLang's fraction holds weights and KV, in each pool (as for the aggregated rows).
        let Some(fleet) = &v.fleet else {
            return Ok(Err(format!("{}: resolved without its pools", row.id)));
        };
        let share = |name: &str| {
            fleet.pools.iter().find(|p| p.name == name).map(|p| {
                if row.backend == "trtllm" {
                    trtllm_memory_share(&p.engine.memory)
                } else {
                    sglang_memory_share(&p.engine.memory)
                }
            })
        };
        let memory = [share("prefill"), share("decode")];
        v = match resolve(scn, row, p, cost, memory) {
            Ok(v) => v,
            Err(why) => return Ok(Err(why)),
        };
    }
    run_quietly(scn, &v).map(Ok)
}

/// Replays every disaggregated row it can as a fleet (in parallel), with the default cost
/// model and `cost(backend)`'s terms over it. Aggregated rows are ignored.
pub fn disagg_checks(
    rows: &[AggregateRow],
    cost: &(dyn Fn(&str) -> EngineCost + Sync),
) -> Result<(Vec<SiliconCheck>, Skipped), crate::SimError> {
    let scn = super::silicon::template()?;
    check_rows(
        rows.iter().filter(|r| r.disagg.is_some()),
        plan,
        |p| (p.model, p.gpu),
        |row, p| simulate(&scn, row, p, cost(&row.backend)),
        "a pool does not fit the simulator's memory plan",
    )
}
