//! `sim plan`: capacity planning: the highest request rate one replica sustains under the
//! scenario's SLO (p90 TTFT <= slo.ttft_ms, p99 TPOT <= slo.tpot_ms), for each GPU x TP x
//! weight format; the replicas a target rate needs and the cost per million tokens.

use std::path::PathBuf;

use sim::scenario::Scenario;

/// Capacity planning: the highest request rate one replica sustains under the
/// scenario's SLO (p90 TTFT <= slo.ttft_ms, p99 TPOT <= slo.tpot_ms), for each GPU x TP
/// x weight format; the replicas a target rate needs and the cost per million tokens.
#[derive(clap::Args)]
pub struct Args {
    /// Scenario TOML file (its base configuration: model, engine, workload, SLO).
    pub scenario: PathBuf,
    /// Target request rate, req/s.
    #[arg(long, allow_negative_numbers = true)]
    pub rate: f64,
    /// GPUs to compare (repeatable; default: the scenario's).
    #[arg(long = "gpu")]
    pub gpus: Vec<String>,
    /// Tensor-parallel degrees (repeatable; default: the scenario's).
    #[arg(long = "tp")]
    pub tps: Vec<u32>,
    /// Weight formats (repeatable; default: the scenario's).
    #[arg(long = "dtype")]
    pub dtypes: Vec<String>,
    /// Requests simulated per probed rate (the rate found is re-checked with 4x as many; see
    /// the "steady at" column).
    #[arg(long, default_value_t = sim::plan::DEFAULT_PROBE_REQUESTS)]
    pub requests: u64,
    /// Price override, GPU=USD per GPU-hour (repeatable).
    #[arg(long = "price")]
    pub prices: Vec<String>,
    /// A calibration file (a `sim calibrate` output), as if the scenario's `[cost]` had
    /// `calibration = FILE`; one with k-fold fits (`sim calibrate --observed`) also gives
    /// each row's band.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

/// Runs `sim plan`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        scenario,
        rate,
        gpus,
        tps,
        dtypes,
        requests,
        prices,
        calibration,
    } = args;
    if requests == 0 {
        anyhow::bail!("--requests: must be at least 1");
    }
    if !(rate > 0.0 && rate.is_finite()) {
        anyhow::bail!("--rate: must be a positive number of requests per second, got {rate}");
    }
    let scn = match &calibration {
        Some(c) => Scenario::load_calibrated(&scenario, None, c)?,
        None => Scenario::load(&scenario, None)?,
    };
    let base = &scn.base;
    let dtypes = dtypes
        .iter()
        .map(|d| {
            toml::Value::String(d.clone())
                .try_into::<sim::catalog::Dtype>()
                .map_err(|_| anyhow::anyhow!("--dtype: unknown weight format `{d}`"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let prices = prices
        .iter()
        .map(|p| {
            let (g, v) = p
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--price: expected GPU=USD, got `{p}`"))?;
            let v: f64 = v
                .parse()
                .map_err(|_| anyhow::anyhow!("--price: `{v}` is not a number"))?;
            if !(v >= 0.0 && v.is_finite()) {
                anyhow::bail!(
                    "--price: {g}: must be a non-negative number of USD per GPU-hour, got {v}"
                );
            }
            if sim::catalog::find_gpu(g).is_none() {
                anyhow::bail!("--price: unknown GPU `{g}` (see `sim gpus`)");
            }
            Ok((g.to_string(), v))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let inputs = sim::plan::PlanInputs {
        target_rate: rate,
        gpus: if gpus.is_empty() {
            base.hardware.gpu.iter().cloned().collect()
        } else {
            gpus
        },
        tps: if tps.is_empty() {
            vec![base.hardware.tp]
        } else {
            tps
        },
        dtypes: if dtypes.is_empty() {
            vec![base.model.dtype]
        } else {
            dtypes
        },
        requests,
        prices,
    };
    if inputs.gpus.is_empty() {
        anyhow::bail!(
            "--gpu: the scenario describes its GPU in a file; name catalog GPUs to compare"
        );
    }
    for g in &inputs.gpus {
        if sim::catalog::find_gpu(g).is_none() {
            anyhow::bail!("--gpu: unknown GPU `{g}` (see `sim gpus`)");
        }
    }
    if let Some(tp) = inputs.tps.iter().find(|&&tp| tp == 0) {
        anyhow::bail!("--tp: must be at least 1, got {tp}");
    }
    let rows = sim::plan::plan(&scn, &inputs)?;
    outln!(out, "{}", sim::plan::table(&rows, rate).trim_end());
    let bands = sim::plan::plan_bands(&scn, &inputs, &rows)?;
    if bands.iter().any(Option::is_some) {
        outln!(
            out,
            "{}",
            sim::plan::band_table(&rows, &bands, rate).trim_end()
        );
    }
    // Every combination skipped: nothing was planned, which is an error, not a table.
    if let Some(why) = rows
        .iter()
        .map(|r| r.skipped.as_deref())
        .collect::<Option<Vec<_>>>()
    {
        anyhow::bail!(
            "no GPU x TP x format combination fits: {}",
            why.first().copied().unwrap_or("nothing to plan")
        );
    }
    Ok(())
}
