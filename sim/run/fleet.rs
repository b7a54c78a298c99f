//! Running a fleet variant (`[cluster]`): one engine per replica of every pool, a router in
//! front, all on the one clock (`crate::driver::run_fleet`).
//!
//! In: a variant whose `fleet` is set. Out, beside what a one-engine run writes
//! (`requests.csv` of every request, `summary.json` of the fleet, `steps.csv` with every
//! replica's steps in time order, `plan.json` per pool): `routes.csv` (one row per request:
//! the replica, its requests in flight, the age of the router's view, the scores),
//! `replicas.csv` and `pools.csv` (a row each), `fleet.json` (GPUs, goodput per GPU, cost
//! per million tokens, routing imbalance) and `replicas/<pool>-<i>/` with each replica's
//! `steps.csv` and `summary.json`.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use analysis::fleet::{FleetSummary, MemberRow};
use analysis::{AnalysisError, RunCollector, RunInfo, Summary};
use engine::record::{RequestRecord, StepRecord};
use engine::request::Nanos;
use indicatif::ProgressBar;

use super::{engine_parts, io_err, BackendKind, VariantResult};
use crate::driver::{run_fleet_to_end, DriverKind, Records, RunStats, Transfer, TransferCost};
use crate::router::{Decision, Router};
use crate::scenario::cluster::Fleet;
use crate::scenario::{Scenario, Variant};
use crate::workload::Workload;
use crate::SimError;

/// `routes.csv`'s columns.
const ROUTES_HEADER: [&str; 11] = [
    "request_id",
    "time_s",
    "pool",
    "replica",
    "decode_replica",
    "outstanding",
    "view_age_ms",
    "prefix_score",
    "queue_score",
    "kv_score",
    "total_score",
];

/// `transfers.csv`'s columns.
const TRANSFERS_HEADER: [&str; 9] = [
    "request_id",
    "prefill_replica",
    "decode_replica",
    "tokens",
    "bytes",
    "start_s",
    "end_s",
    "transfer_ms",
    "link_wait_ms",
];

/// The fleet's records, split three ways (the fleet, each pool, each replica), and the
/// router's decisions written as they come.
struct FleetSink {
    fleet: RunCollector,
    pools: Vec<RunCollector>,
    replicas: Vec<RunCollector>,
    pool_of: Vec<usize>,
    names: Vec<String>,
    pool_names: Vec<String>,
    routed: Vec<u64>,
    routes: Option<(csv::Writer<BufWriter<File>>, PathBuf)>,
    transfers: Option<(csv::Writer<BufWriter<File>>, PathBuf)>,
    transfer_stats: TransferStats,
}

/// Transfers' count and times.
#[derive(Debug, Default)]
struct TransferStats {
    count: u64,
    sum_ms: f64,
    wait_ms: f64,
    max_ms: f64,
    bytes: f64,
}

impl Records for FleetSink {
    fn request(&mut self, r: usize, rec: &RequestRecord) -> Result<(), AnalysisError> {
        self.fleet.record_request(rec)?;
        self.pools[self.pool_of[r]].record_request(rec)?;
        self.replicas[r].record_request(rec)
    }

    fn step(&mut self, r: usize, s: &StepRecord) -> Result<(), AnalysisError> {
        self.fleet.record_step(s)?;
        self.pools[self.pool_of[r]].record_step(s)?;
        self.replicas[r].record_step(s)
    }

    fn itl(&mut self, r: usize, gaps: &[Nanos]) {
        self.fleet.record_itl(gaps);
        self.pools[self.pool_of[r]].record_itl(gaps);
        self.replicas[r].record_itl(gaps);
    }

    fn prefilled(&mut self, r: usize, rec: &RequestRecord) -> Result<(), AnalysisError> {
        self.pools[self.pool_of[r]].record_request(rec)?;
        self.replicas[r].record_request(rec)
    }

    fn transfer(&mut self, t: &Transfer) -> Result<(), AnalysisError> {
        let ms = (t.end - t.start) as f64 / 1e6;
        let st = &mut self.transfer_stats;
        st.count += 1;
        st.sum_ms += ms;
        st.wait_ms += (t.wire_start - t.start) as f64 / 1e6;
        st.max_ms = st.max_ms.max(ms);
        st.bytes += t.bytes;
        self.routed[t.to] += 1;
        let Some((w, path)) = self.transfers.as_mut() else {
            return Ok(());
        };
        w.write_record([
            t.request.to_string(),
            self.names[t.from].clone(),
            self.names[t.to].clone(),
            t.tokens.to_string(),
            format!("{:.0}", t.bytes),
            format!("{:.9}", t.start as f64 / 1e9),
            format!("{:.9}", t.end as f64 / 1e9),
            format!("{ms:.6}"),
            format!("{:.6}", (t.wire_start - t.start) as f64 / 1e6),
        ])
        .map_err(|e| AnalysisError::csv(path.as_path(), e))
    }

    fn route(&mut self, d: &Decision) -> Result<(), AnalysisError> {
        self.routed[d.replica] += 1;
        let Some((w, path)) = self.routes.as_mut() else {
            return Ok(());
        };
        let opt = |x: Option<f64>| x.map_or_else(String::new, |v| format!("{v:.6}"));
        w.write_record([
            d.request.to_string(),
            format!("{:.9}", d.time as f64 / 1e9),
            self.pool_names[self.pool_of[d.replica]].clone(),
            self.names[d.replica].clone(),
            d.decode.map_or_else(String::new, |r| self.names[r].clone()),
            d.outstanding.to_string(),
            format!("{:.3}", d.view_age_ns as f64 / 1e6),
            opt(d.scores.prefix),
            opt(d.scores.queue),
            opt(d.scores.kv),
            opt(d.scores.total),
        ])
        .map_err(|e| AnalysisError::csv(path.as_path(), e))
    }
}

/// Runs a fleet variant; see the module's note for what it writes under `out_dir`.
pub(super) fn run_fleet_variant(
    scenario: &Scenario,
    variant: &Variant,
    backend_kind: BackendKind,
    driver: DriverKind,
    out_dir: Option<&Path>,
    progress: &ProgressBar,
    on_progress: &dyn Fn(),
) -> Result<VariantResult, SimError> {
    let Some(fleet) = variant.fleet.as_ref() else {
        return Err(SimError::Scenario(crate::scenario::ScenarioError {
            file: scenario.path.display().to_string(),
            msg: format!("variant `{}` has no [cluster]", variant.name),
        }));
    };
    if backend_kind != BackendKind::Model {
        return Err(SimError::Scenario(crate::scenario::ScenarioError {
            file: scenario.path.display().to_string(),
            msg: format!(
                "variant `{}`: [cluster]: fleets run on the cost model (--backend model); a real runtime serves one replica",
                variant.name
            ),
        }));
    }
    let started = Instant::now();
    let mut workload = Workload::open(&variant.config.workload, &scenario.base_dir, scenario.seed)?;
    let classes = workload.class_names();
    let names = fleet.replica_names();
    let collector = |v: &Variant| {
        RunCollector::new(v.config.slo.clone(), classes.clone())
            .with_storm_threshold(v.config.engine.preemption_storm_threshold)
    };
    let mut sink = FleetSink {
        fleet: collector(variant),
        pools: fleet.pools.iter().map(|p| collector(&p.engine)).collect(),
        replicas: names
            .iter()
            .map(|(p, _)| collector(&fleet.pools[*p].engine))
            .collect(),
        pool_of: names.iter().map(|(p, _)| *p).collect(),
        names: names.iter().map(|(_, n)| n.clone()).collect(),
        pool_names: fleet.pools.iter().map(|p| p.name.clone()).collect(),
        routed: vec![0; names.len()],
        routes: None,
        transfers: None,
        transfer_stats: TransferStats::default(),
    };
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        sink.fleet = sink.fleet.with_csv_files(dir)?;
        for (c, name) in sink.replicas.iter_mut().zip(&sink.names) {
            let rdir = dir.join("replicas").join(name);
            std::fs::create_dir_all(&rdir).map_err(io_err(&rdir))?;
            let steps = rdir.join("steps.csv");
            let file = File::create(&steps).map_err(io_err(&steps))?;
            let taken = std::mem::replace(c, RunCollector::new(Default::default(), Vec::new()));
            *c = taken.with_csv_named(
                Box::new(std::io::sink()),
                rdir.join("requests.csv"),
                Box::new(BufWriter::new(file)),
                steps,
            );
        }
        let path = dir.join("routes.csv");
        let file = File::create(&path).map_err(io_err(&path))?;
        let mut w = csv::Writer::from_writer(BufWriter::new(file));
        w.write_record(ROUTES_HEADER)
            .map_err(|e| AnalysisError::csv(path.as_path(), e))?;
        sink.routes = Some((w, path));
        if fleet.disaggregated() {
            let path = dir.join("transfers.csv");
            let file = File::create(&path).map_err(io_err(&path))?;
            let mut w = csv::Writer::from_writer(BufWriter::new(file));
            w.write_record(TRANSFERS_HEADER)
                .map_err(|e| AnalysisError::csv(path.as_path(), e))?;
            sink.transfers = Some((w, path));
        }
        write_fleet_plan(dir, fleet)?;
    }
    let mut parts = Vec::with_capacity(names.len());
    for (p, _) in &names {
        parts.push(engine_parts(
            scenario,
            &fleet.pools[*p].engine,
            backend_kind,
        )?);
    }
    let router = Router::new(&fleet.config, &fleet.replica_roles(), scenario.seed);
    // A prompt's KV between two replicas: each GPU sends its shard over its own link (the
    // larger shard of the two pools' layouts sets the time); the driver queues transfers
    // that meet on a replica's link.
    let pool_of = sink.pool_of.clone();
    let transfer = |from: usize, to: usize, tokens: u32| {
        let (a, b) = (&fleet.pools[pool_of[from]], &fleet.pools[pool_of[to]]);
        let per_token = a
            .engine
            .memory
            .kv_bytes_per_token
            .max(b.engine.memory.kv_bytes_per_token);
        let bytes = f64::from(tokens) * per_token;
        let (bw, latency) = fleet.link(a, b);
        // A bandwidth a user set absurdly low saturates rather than overflows the clock
        // (a float-to-integer cast saturates).
        TransferCost {
            bytes,
            wire: (bytes / bw * 1e9).round() as Nanos,
            latency,
        }
    };
    let client = crate::driver::Client {
        frontend_ns: variant.config.cost.request_overhead_ns(),
        serial_request_ns: variant.config.cost.frontend_serial_ns().0,
        serial_update_ns: variant.config.cost.frontend_serial_ns().1,
        seed: scenario.seed,
        ..variant.config.workload.client()
    };
    let mut last = 0;
    let stats = run_fleet_to_end(
        driver,
        parts,
        (router, &transfer, &fleet.lockstep_groups()),
        &mut workload,
        client,
        &mut sink,
        &mut |ended| {
            if ended >= last + 256 {
                progress.set_position(ended);
                last = ended;
                on_progress();
            }
        },
    )
    .map_err(|e| SimError::Run {
        variant: variant.name.clone(),
        source: Box::new(e),
    })?;
    progress.finish_and_clear();
    for (mut w, path) in [sink.routes.take(), sink.transfers.take()]
        .into_iter()
        .flatten()
    {
        w.flush()
            .map_err(|e| AnalysisError::io(path.as_path(), e))?;
    }
    let wall = started.elapsed().as_secs_f64();
    let info = |name: &str, s: &RunStats, (cpu, disk): (u64, u64)| RunInfo {
        scenario: scenario.name.clone(),
        variant: name.to_string(),
        backend: "model".into(),
        kv_pool_blocks: s.pool_blocks,
        kv_blocks_in_use_at_end: s.blocks_in_use_at_end,
        evictions: s.evictions,
        wall_time_s: wall,
        spec: s.spec.clone(),
        offload: s.offload.map(|t| (t, cpu, disk)),
    };
    // Each pool's and the fleet's counters: their replicas' summed.
    let mut pool_stats = vec![RunStats::default(); fleet.pools.len()];
    let mut total = RunStats {
        arrived: stats.arrived,
        ended: stats.ended,
        end_time: stats.end_time,
        ..RunStats::default()
    };
    for (r, s) in stats.replicas.iter().enumerate() {
        for into in [&mut pool_stats[sink.pool_of[r]], &mut total] {
            add(into, s);
        }
    }
    // Prompt tokens each replica loaded from its CPU and disk tiers (its pool's block
    // size).
    let loaded: Vec<(u64, u64)> = stats
        .replicas
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let bs = fleet.pools[sink.pool_of[r]].engine.memory.block_size;
            s.offload.map_or((0, 0), |t| {
                (t.loads * u64::from(bs), t.disk_loads * u64::from(bs))
            })
        })
        .collect();
    let mut replica_rows = Vec::new();
    let replica_collectors = std::mem::take(&mut sink.replicas);
    for (r, c) in replica_collectors.into_iter().enumerate() {
        let name = &sink.names[r];
        let pool = &fleet.pools[sink.pool_of[r]];
        let s = c.finish(info(name, &stats.replicas[r], loaded[r]))?;
        if let Some(dir) = out_dir {
            analysis::write_summary_json(
                &dir.join("replicas").join(name).join("summary.json"),
                &s,
            )?;
        }
        replica_rows.push(MemberRow::of(
            name,
            &pool.name,
            1,
            pool.gpus_per_engine(),
            sink.routed[r],
            stats.replicas[r].evictions,
            &s,
        ));
    }
    let mut pool_rows = Vec::new();
    let pool_collectors = std::mem::take(&mut sink.pools);
    for (i, c) in pool_collectors.into_iter().enumerate() {
        let pool = &fleet.pools[i];
        let pool_loaded = (0..sink.names.len())
            .filter(|&r| sink.pool_of[r] == i)
            .map(|r| loaded[r])
            .fold((0, 0), add_pair);
        let s = c.finish(info(&pool.name, &pool_stats[i], pool_loaded))?;
        let routed = (0..sink.names.len())
            .filter(|&r| sink.pool_of[r] == i)
            .map(|r| sink.routed[r])
            .sum();
        pool_rows.push(MemberRow::of(
            &pool.name,
            &pool.name,
            pool.engines(),
            pool.gpus(),
            routed,
            pool_stats[i].evictions,
            &s,
        ));
    }
    let summary = sink.fleet.finish(info(
        &variant.name,
        &total,
        loaded.iter().copied().fold((0, 0), add_pair),
    ))?;
    let usd_per_hour: f64 = fleet
        .pools
        .iter()
        .map(|p| p.usd_per_gpu_hour * f64::from(p.gpus()))
        .sum();
    let mut fleet_summary = FleetSummary::of(
        fleet.config.routing.as_str(),
        fleet.config.refresh_ms,
        &summary,
        pool_rows.clone(),
        &replica_rows,
        Some(usd_per_hour),
    );
    let t = &sink.transfer_stats;
    if t.count > 0 {
        fleet_summary.kv_transfers = t.count;
        fleet_summary.mean_kv_transfer_ms = t.sum_ms / t.count as f64;
        fleet_summary.max_kv_transfer_ms = t.max_ms;
        fleet_summary.mean_kv_link_wait_ms = t.wait_ms / t.count as f64;
        fleet_summary.kv_transfer_gb = t.bytes / 1e9;
    }
    let warnings = warnings(variant, &summary, &total, &replica_rows, &workload);
    if let Some(dir) = out_dir {
        analysis::write_summary_json(&dir.join("summary.json"), &summary)?;
        analysis::fleet::write_members_csv(&dir.join("replicas.csv"), &replica_rows)?;
        analysis::fleet::write_members_csv(&dir.join("pools.csv"), &pool_rows)?;
        analysis::fleet::write_fleet_json(&dir.join("fleet.json"), &fleet_summary)?;
        super::write_timing(dir, driver, &summary, &total)?;
        let path = dir.join("warnings.txt");
        let text: String = warnings.iter().map(|w| format!("{w}\n")).collect();
        std::fs::write(&path, text).map_err(io_err(&path))?;
    }
    Ok(VariantResult {
        summary,
        stats: total,
        warnings,
        fleet: Some(fleet_summary),
    })
}

/// Adds a replica's counters to a pool's or the fleet's.
fn add(into: &mut RunStats, s: &RunStats) {
    into.steps += s.steps;
    into.blocks_in_use_at_end = into
        .blocks_in_use_at_end
        .saturating_add(s.blocks_in_use_at_end);
    into.pool_blocks = into.pool_blocks.saturating_add(s.pool_blocks);
    into.evictions += s.evictions;
    into.end_time = into.end_time.max(s.end_time);
    if into.spec.len() < s.spec.len() {
        into.spec.resize(s.spec.len(), Default::default());
    }
    for (a, b) in into.spec.iter_mut().zip(&s.spec) {
        a.merge(b);
    }
    if let Some(t) = s.offload {
        let o = into.offload.get_or_insert_with(Default::default);
        o.capacity = o.capacity.saturating_add(t.capacity);
        o.blocks = o.blocks.saturating_add(t.blocks);
        o.stores += t.stores;
        o.loads += t.loads;
        o.evictions += t.evictions;
        o.disk_capacity = o.disk_capacity.saturating_add(t.disk_capacity);
        o.disk_blocks = o.disk_blocks.saturating_add(t.disk_blocks);
        o.disk_stores += t.disk_stores;
        o.disk_loads += t.disk_loads;
        o.disk_evictions += t.disk_evictions;
    }
}

/// Two counts added element-wise.
fn add_pair((a, b): (u64, u64), (c, d): (u64, u64)) -> (u64, u64) {
    (a + c, b + d)
}

/// `plan.json` of a fleet: the router's settings and each pool's deployment, memory plan,
/// engine and cost settings.
fn write_fleet_plan(dir: &Path, fleet: &Fleet) -> Result<(), SimError> {
    let pools: Vec<serde_json::Value> = fleet
        .pools
        .iter()
        .map(|p| {
            serde_json::json!({
                "pool": p.name,
                "replicas": p.replicas,
                "usd_per_gpu_hour": p.usd_per_gpu_hour,
                "deployment": p.engine.deployment,
                "memory": p.engine.memory,
                "engine": p.engine.config.engine,
                "cost": p.engine.config.cost,
            })
        })
        .collect();
    let plan = serde_json::json!({ "cluster": fleet.config, "pools": pools });
    super::write_json(&dir.join("plan.json"), &plan)
}

/// What the user should know of a fleet run: leaks, rejections (by replica), storms,
/// adjusted trace rows.
fn warnings(
    variant: &Variant,
    summary: &Summary,
    stats: &RunStats,
    replicas: &[MemberRow],
    workload: &Workload,
) -> Vec<String> {
    let by_replica: Vec<String> = replicas
        .iter()
        .filter(|r| r.rejected > 0)
        .map(|r| format!("{} {}", r.name, r.rejected))
        .collect();
    let detail = format!(": {}", by_replica.join(", "));
    super::outcome_warnings(
        &variant.name,
        summary,
        stats,
        workload,
        ("a replica's max_model_len", &detail),
    )
}
