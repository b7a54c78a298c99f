//! `sim bench`'s measurement: each variant run once, one after another, nothing written,
//! timed by the wall clock (simulated requests and steps per second), and the process's peak
//! memory.

use indicatif::ProgressBar;

use super::{run_variant, BackendKind};
use crate::driver::DriverKind;
use crate::scenario::Scenario;
use crate::SimError;

/// One benchmark measurement of a variant.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// Variant.
    pub variant: String,
    /// Requests simulated (completed + rejected).
    pub requests: u64,
    /// Steps simulated.
    pub steps: u64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Simulated seconds.
    pub simulated_s: f64,
}

/// Runs each selected variant once, sequentially, writing nothing, and times it
/// (`sim bench`); `requests` overrides the workload's `num_requests`.
pub fn bench_scenario(
    scenario: &Scenario,
    driver: DriverKind,
    only: &[String],
    requests: Option<u64>,
) -> Result<Vec<BenchResult>, SimError> {
    let mut out = Vec::new();
    for v in scenario
        .variants
        .iter()
        .filter(|v| only.is_empty() || only.contains(&v.name))
    {
        let mut v = v.clone();
        if requests.is_some() {
            v.config.workload.num_requests = requests;
        }
        let bar = ProgressBar::hidden();
        let r = run_variant(scenario, &v, BackendKind::Model, driver, None, &bar, &|| {})?;
        out.push(BenchResult {
            variant: v.name.clone(),
            requests: r.summary.completed + r.summary.num_rejected,
            steps: r.stats.steps,
            wall_s: r.summary.wall_time_s,
            simulated_s: r.stats.end_time as f64 / 1e9,
        });
    }
    Ok(out)
}

/// Peak resident memory of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
