//! Capacity planning (`sim plan`): for a scenario's workload and SLOs, the highest Poisson
//! request rate one replica sustains while p90 TTFT and p99 TPOT stay within the SLO, found
//! by simulation, for each GPU x TP x weight format of a grid; then the replicas a target
//! rate needs and the cost per million output tokens.

use std::fmt::Write as _;

use indicatif::ProgressBar;

use crate::catalog::Dtype;
use crate::driver::DriverKind;
use crate::run::{run_variant, BackendKind};
use crate::scenario::Scenario;
use crate::workload::ArrivalConfig;
use crate::SimError;

/// One deployment of the grid and what it sustains.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRow {
    /// GPU catalog name.
    pub gpu: String,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Pipeline-parallel degree (the scenario's).
    pub pp: u32,
    /// Weight format.
    pub dtype: Dtype,
    /// Why it was not simulated (does not fit, invalid TP...).
    pub skipped: Option<String>,
    /// Highest rate (req/s) meeting the SLO (0 when even the lowest probed rate fails).
    pub max_rate: f64,
    /// Output tokens/s at that rate.
    pub output_tps: f64,
    /// Replicas needed for the target rate.
    pub replicas: u32,
    /// Requests of the longest probe that confirmed `max_rate` (4x those the search
    /// used; see [`plan`]).
    pub confirmed_at: u64,
    /// Whether that confirmation held: `false` when the rate still failed at the longest
    /// probe tried (a queue still growing), so `max_rate` is an upper bound.
    pub steady: bool,
    /// USD per GPU-hour.
    pub price_per_hour: f64,
}

impl PlanRow {
    /// USD per million output tokens at the sustained rate (`None` without a price or a
    /// sustainable rate).
    pub fn usd_per_million_tokens(&self) -> Option<f64> {
        (self.output_tps > 0.0 && self.price_per_hour > 0.0).then(|| {
            self.price_per_hour * f64::from(self.tp * self.pp) / 3600.0 / self.output_tps * 1e6
        })
    }
}

/// The plan's inputs.
#[derive(Debug, Clone)]
pub struct PlanInputs {
    /// Target request rate (req/s) for the replica count.
    pub target_rate: f64,
    /// GPUs of the grid.
    pub gpus: Vec<String>,
    /// TP degrees of the grid.
    pub tps: Vec<u32>,
    /// Weight formats of the grid.
    pub dtypes: Vec<Dtype>,
    /// Requests per probe run.
    pub requests: u64,
    /// Price overrides: (GPU, USD per GPU-hour).
    pub prices: Vec<(String, f64)>,
}

/// Whether a run meets the SLO (p90 TTFT and p99 TPOT within the scenario's bounds) and
/// completed everything it was given.
fn meets(s: &analysis::Summary, ttft_ms: Option<f64>, tpot_ms: Option<f64>) -> bool {
    s.num_rejected == 0
        && ttft_ms.is_none_or(|b| s.p90_ttft_ms <= b)
        && tpot_ms.is_none_or(|b| s.p99_tpot_ms <= b)
}

/// Runs the grid. Each probe simulates `requests` requests at one Poisson rate (the
/// scenario's arrival process with its rate replaced; gamma keeps its burstiness); the
/// sustainable rate is bracketed by doubling (or halving) from 0.25 req/s and bisected to 1%.
///
/// A short probe overrates a replica whose requests are long: arrivals end before the
/// queue has grown to its steady size, so the SLO holds on a transient. The rate found is
/// therefore probed again with 4x the requests (and, failing, 5% lower); when both fail
/// there, the search repeats below them with 4x the requests, up to [`MAX_SEARCH_REQUESTS`] per probe (past that the last
/// rate found is reported as not steady, an upper bound).
pub fn plan(scn: &Scenario, inp: &PlanInputs) -> Result<Vec<PlanRow>, SimError> {
    let slo = &scn.base.slo;
    plan_with(scn, inp, None, slo.ttft_ms, slo.tpot_ms)
}

/// Requests per probe unless told otherwise (`sim plan --requests`).
pub const DEFAULT_PROBE_REQUESTS: u64 = 400;

/// The most requests per probe a search escalates to after failed steady-state checks (the
/// check itself probes 4x its search's requests).
pub const MAX_SEARCH_REQUESTS: u64 = 25_600;

/// [`plan`] with the cost terms replaced (`cost`: one fold's fit) and the SLO's bounds
/// given (scaled by a held-out error).
fn plan_with(
    scn: &Scenario,
    inp: &PlanInputs,
    cost: Option<&crate::cost_model::CostParams>,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
) -> Result<Vec<PlanRow>, SimError> {
    let slo = &scn.base.slo;
    if slo.ttft_ms.is_none() && slo.tpot_ms.is_none() {
        return Err(SimError::Scenario(crate::scenario::ScenarioError {
            file: scn.path.display().to_string(),
            msg: "slo: `sim plan` needs slo.ttft_ms (bound on p90 TTFT) and/or slo.tpot_ms (bound on p99 TPOT)".into(),
        }));
    }
    if scn.base.workload.trace.is_some() {
        return Err(SimError::Scenario(crate::scenario::ScenarioError {
            file: scn.path.display().to_string(),
            msg: "workload.trace: `sim plan` varies the request rate, so it needs a synthetic workload (workload.arrival and classes)".into(),
        }));
    }
    let mut rows = Vec::new();
    for gpu in &inp.gpus {
        for &tp in &inp.tps {
            for &dtype in &inp.dtypes {
                let mut cfg = scn.base.clone();
                if let Some(c) = cost {
                    cfg.cost = c.clone();
                }
                cfg.hardware.gpu = Some(gpu.clone());
                cfg.hardware.gpu_file = None;
                cfg.hardware.tp = tp;
                cfg.model.dtype = dtype;
                cfg.workload.num_requests = Some(inp.requests);
                cfg.workload.duration_s = None;
                // One replica is planned (the replicas the rate needs are counted from it),
                // not the scenario's fleet.
                cfg.cluster = None;
                let mut row = PlanRow {
                    gpu: gpu.clone(),
                    tp,
                    pp: cfg.hardware.pp,
                    dtype,
                    skipped: None,
                    max_rate: 0.0,
                    output_tps: 0.0,
                    replicas: 0,
                    confirmed_at: 0,
                    steady: false,
                    price_per_hour: 0.0,
                };
                // The summary of `n` requests at `rate` when they meet the SLO.
                let meets_at = |rate: f64, n: u64| -> Result<Option<analysis::Summary>, SimError> {
                    let mut c = cfg.clone();
                    c.workload.num_requests = Some(n);
                    c.workload.arrival = Some(match c.workload.arrival {
                        Some(ArrivalConfig::Gamma { burstiness, .. }) => {
                            ArrivalConfig::Gamma { rate, burstiness }
                        }
                        _ => ArrivalConfig::Poisson { rate },
                    });
                    let v = match scn.resolve_config("plan", c) {
                        Ok(v) => v,
                        Err(_) => return Ok(None),
                    };
                    let r = run_variant(
                        scn,
                        &v,
                        BackendKind::Model,
                        DriverKind::Inline,
                        None,
                        &ProgressBar::hidden(),
                        &|| {},
                    )?;
                    Ok(Some(r.summary).filter(|s| meets(s, ttft_ms, tpot_ms)))
                };
                // Does the deployment resolve at all (fits, valid TP)?
                let mut check = cfg.clone();
                check.workload.arrival = Some(ArrivalConfig::Poisson { rate: 1.0 });
                match scn.resolve_config("plan", check) {
                    Ok(v) => {
                        // Prices are matched on the catalog's name of the GPU.
                        let name = v.deployment.gpu.name;
                        row.price_per_hour = inp
                            .prices
                            .iter()
                            .find(|(g, _)| {
                                crate::catalog::find_gpu(g).is_some_and(|c| c.name == name)
                            })
                            .map_or(v.deployment.gpu.price_per_hour, |&(_, p)| p);
                    }
                    Err(e) => {
                        row.skipped = Some(e.msg.rsplit(": ").next().unwrap_or(&e.msg).to_string());
                        rows.push(row);
                        continue;
                    }
                }
                let settled = settle(&meets_at, inp.requests)?;
                row.max_rate = settled.rate;
                row.output_tps = settled.output_tps;
                row.confirmed_at = settled.confirmed_at;
                row.steady = settled.steady;
                if row.max_rate > 0.0 {
                    row.replicas = (inp.target_rate / row.max_rate).ceil().max(1.0) as u32;
                }
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// Where the search for a sustainable rate settled.
#[derive(Debug, Clone, Copy, Default)]
struct Settled {
    /// The rate (0 when none meets the SLO).
    rate: f64,
    /// Output tokens/s of the run that confirmed it (or found it, unconfirmed).
    output_tps: f64,
    /// Requests of the confirming probe.
    confirmed_at: u64,
    /// Whether the confirmation held.
    steady: bool,
}

/// Searches with `requests` per probe, then confirms the rate found with 4x the requests
/// (or 5% lower, [`MARGIN`]); when neither holds, searches below them with 4x the requests,
/// up to [`MAX_SEARCH_REQUESTS`] (or `requests`, if more).
fn settle(
    meets_at: &dyn Fn(f64, u64) -> Result<Option<analysis::Summary>, SimError>,
    requests: u64,
) -> Result<Settled, SimError> {
    let mut n = requests;
    let (mut start, mut fails_at) = (0.25, None);
    let mut settled = Settled::default();
    loop {
        let Some((rate, summary)) = search(meets_at, n, start, fails_at)? else {
            // Refuted down to a thousandth of the first rate tried.
            return Ok(Settled::default());
        };
        settled.rate = rate;
        settled.output_tps = summary.output_throughput;
        settled.confirmed_at = n.saturating_mul(4);
        for r in [rate, rate * (1.0 - MARGIN)] {
            if let Some(s) = meets_at(r, settled.confirmed_at)? {
                return Ok(Settled {
                    rate: r,
                    output_tps: s.output_throughput,
                    confirmed_at: settled.confirmed_at,
                    steady: true,
                });
            }
        }
        if settled.confirmed_at > MAX_SEARCH_REQUESTS.max(requests) {
            return Ok(settled);
        }
        // Both failed with more requests: search below them with as many.
        fails_at = Some(rate * (1.0 - MARGIN));
        start = rate * (1.0 - MARGIN) / 2.0;
        n = settled.confirmed_at;
    }
}

/// Relative width of the bracket at which a search stops bisecting.
const PRECISION: f64 = 0.01;

/// How far below a rate a longer probe may confirm it: near the bound a longer probe samples
/// more of the latency tail, so the rate found is accepted 5% lower rather than searched again.
const MARGIN: f64 = 0.05;

/// The highest rate meeting the SLO with `n` requests per probe, and that probe's summary:
/// from `start`, doubled while the SLO holds (up to 4096 req/s; not past `fails_at`, a rate
/// known to fail) or halved until it does (down to `start / 1024`), then bisected to
/// [`PRECISION`]. `None` when even the lowest rate tried fails.
fn search(
    meets_at: &dyn Fn(f64, u64) -> Result<Option<analysis::Summary>, SimError>,
    n: u64,
    start: f64,
    fails_at: Option<f64>,
) -> Result<Option<(f64, analysis::Summary)>, SimError> {
    let (mut lo, mut hi, mut best);
    if let Some(s) = meets_at(start, n)? {
        (lo, best) = (start, s);
        hi = match fails_at {
            Some(f) => f,
            None => loop {
                if lo >= 4096.0 {
                    return Ok(Some((lo, best)));
                }
                match meets_at(2.0 * lo, n)? {
                    Some(s) => (lo, best) = (2.0 * lo, s),
                    None => break 2.0 * lo,
                }
            },
        };
    } else {
        hi = start;
        loop {
            let l = hi / 2.0;
            if l < start / 1024.0 {
                return Ok(None);
            }
            match meets_at(l, n)? {
                Some(s) => {
                    (lo, best) = (l, s);
                    break;
                }
                None => hi = l,
            }
        }
    }
    while hi - lo > PRECISION * hi {
        let mid = (lo + hi) / 2.0;
        match meets_at(mid, n)? {
            Some(s) => (lo, best) = (mid, s),
            None => hi = mid,
        }
    }
    Ok(Some((lo, best)))
}

/// How sure a plan row is, from a calibration file's `[fit]`: the rate sustained under each
/// fold's fit of the cost terms, and under the SLO moved by the held-out error's central
/// 50% interval (if the simulator errs by `e`, a measured bound `B` is a simulated bound
/// `B (1 + e)`: the low end of the interval is the pessimistic plan, the high end the
/// optimistic one).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanBand {
    /// Lowest and highest sustained rate over the prediction and the folds' fits.
    pub fold_rates: (f64, f64),
    /// Sustained rate with the pessimistic and the optimistic SLO bounds.
    pub held_out_rates: (f64, f64),
}

/// The band of every row of `rows` (the plan with the calibration's own fit), `None` per
/// row without a sustainable rate; empty when the scenario's calibration records no fit.
pub fn plan_bands(
    scn: &Scenario,
    inp: &PlanInputs,
    rows: &[PlanRow],
) -> Result<Vec<Option<PlanBand>>, SimError> {
    let Some(fit) = &scn.fit else {
        return Ok(Vec::new());
    };
    let slo = &scn.base.slo;
    let mut folds: Vec<Vec<PlanRow>> = Vec::new();
    let others = fit.other_fits(&scn.base.cost).map_err(|msg| {
        SimError::Scenario(crate::scenario::ScenarioError {
            file: scn.path.display().to_string(),
            msg: format!("cost.calibration: {msg}"),
        })
    })?;
    for cost in others {
        folds.push(plan_with(scn, inp, Some(&cost), slo.ttft_ms, slo.tpot_ms)?);
    }
    let scaled = |side: usize| {
        plan_with(
            scn,
            inp,
            None,
            slo.ttft_ms.map(|b| b * (1.0 + fit.ttft_error_50[side])),
            slo.tpot_ms.map(|b| b * (1.0 + fit.tpot_error_50[side])),
        )
    };
    let (pessimistic, optimistic) = (scaled(0)?, scaled(1)?);
    Ok(rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (r.skipped.is_none()).then(|| {
                let (lo, hi) = folds
                    .iter()
                    .map(|f| f[i].max_rate)
                    .fold((r.max_rate, r.max_rate), |(lo, hi), x| {
                        (lo.min(x), hi.max(x))
                    });
                PlanBand {
                    fold_rates: (lo, hi),
                    held_out_rates: (pessimistic[i].max_rate, optimistic[i].max_rate),
                }
            })
        })
        .collect())
}

/// The bands as a table: the sustained rate's range and the replicas each end needs.
pub fn band_table(rows: &[PlanRow], bands: &[Option<PlanBand>], target_rate: f64) -> String {
    let mut s = String::from(
        "uncertainty (the calibration's k-fold fits; the SLO moved by its held-out error, central 50%):\n",
    );
    let _ = writeln!(
        s,
        "{:<16} {:>3} {:<9} {:>20} {:>12} {:>20} {:>12}",
        "gpu", "tp", "weights", "req/s over folds", "replicas", "req/s held-out", "replicas"
    );
    let replicas = |rate: f64| {
        if rate > 0.0 {
            ((target_rate / rate).ceil().max(1.0) as u32).to_string()
        } else {
            "-".into()
        }
    };
    for (r, b) in rows.iter().zip(bands) {
        let Some(b) = b else { continue };
        let _ = writeln!(
            s,
            "{:<16} {:>3} {:<9} {:>20} {:>12} {:>20} {:>12}",
            r.gpu,
            r.tp,
            r.dtype.as_str(),
            format!("{:.2} - {:.2}", b.fold_rates.0, b.fold_rates.1),
            format!(
                "{} - {}",
                replicas(b.fold_rates.1),
                replicas(b.fold_rates.0)
            ),
            format!("{:.2} - {:.2}", b.held_out_rates.0, b.held_out_rates.1),
            format!(
                "{} - {}",
                replicas(b.held_out_rates.1),
                replicas(b.held_out_rates.0)
            ),
        );
    }
    s
}

/// The plan as a table.
pub fn table(rows: &[PlanRow], target_rate: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<16} {:>3} {:<9} {:>14} {:>12} {:>9} {:>6} {:>10} {:>12} {:>11}",
        "gpu",
        "tp",
        "weights",
        "max req/s",
        "out tok/s",
        "replicas",
        "GPUs",
        "$/hour",
        "$/M tokens",
        "steady at"
    );
    for r in rows {
        if let Some(why) = &r.skipped {
            let _ = writeln!(
                s,
                "{:<16} {:>3} {:<9} skipped: {why}",
                r.gpu,
                r.tp,
                r.dtype.as_str()
            );
            continue;
        }
        let gpus = r.replicas * r.tp * r.pp;
        let per_million = r
            .usd_per_million_tokens()
            .map_or_else(|| "-".to_string(), |c| format!("{c:.3}"));
        let _ = writeln!(
            s,
            "{:<16} {:>3} {:<9} {:>14.2} {:>12.0} {:>9} {:>6} {:>10.2} {:>12} {:>11}",
            r.gpu,
            r.tp,
            r.dtype.as_str(),
            r.max_rate,
            r.output_tps,
            if r.max_rate > 0.0 {
                r.replicas.to_string()
            } else {
                "-".into()
            },
            if r.max_rate > 0.0 {
                gpus.to_string()
            } else {
                "-".into()
            },
            r.price_per_hour * f64::from(gpus),
            per_million,
            match (r.max_rate > 0.0, r.steady) {
                (false, _) => "-".to_string(),
                (true, true) => format!("{} req", r.confirmed_at),
                (true, false) => format!("no: {}", r.confirmed_at),
            }
        );
    }
    let _ = writeln!(
        s,
        "(replicas and GPUs for {target_rate} req/s; the SLO bounds p90 TTFT and p99 TPOT; each rate re-checked with 4x the probe's requests, 'steady at')"
    );
    if rows.iter().any(|r| r.max_rate > 0.0 && !r.steady) {
        let _ = writeln!(
            s,
            "'no: N': the rate still broke the SLO at N requests per probe (the queue was still growing): an upper bound"
        );
    }
    s
}
