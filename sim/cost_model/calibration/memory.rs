//! The memory plan's runtime reserve (`engine.runtime_overhead_gib`: what vLLM's profile
//! run finds beside the weights and the activation peak — CUDA graphs' pool, cuBLAS and
//! NCCL workspaces, the allocator's slack) fitted to the KV blocks real engines allocated
//! (`sim calibrate --observed` on runs that record `num_gpu_blocks`).
//!
//! Each run implies the reserve that makes the plan hold exactly its blocks
//! ([`crate::replay::memory_check`]); the fit is their median, rounded to 0.01 GiB. Each
//! run's held-out prediction uses the median of the other runs' reserves; a single run has
//! none, and the fit is then in-sample only, which the report says. In: the runs' checks;
//! out: a [`ReserveFit`] and its file, whose value the shipped default is.

use std::fmt::Write as _;

use crate::replay::MemoryCheck;

/// The fitted reserve and each run's prediction.
#[derive(Debug, Clone)]
pub struct ReserveFit {
    /// The runs.
    pub checks: Vec<MemoryCheck>,
    /// The reserve fitted on every run, GiB.
    pub value_gib: f64,
    /// Each run's blocks predicted with the other runs' reserve (`None`: no other run).
    pub held_out: Vec<Option<u32>>,
}

/// Fits the reserve to `checks` (`None` when there are none).
pub fn fit_runtime_reserve(checks: Vec<MemoryCheck>) -> Option<ReserveFit> {
    if checks.is_empty() {
        return None;
    }
    let reserves: Vec<f64> = checks.iter().map(|c| c.reserve_gib).collect();
    let value_gib = (analysis::median(&reserves) * 100.0).round() / 100.0;
    let held_out = (0..checks.len())
        .map(|i| {
            let others: Vec<f64> = reserves
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &r)| r)
                .collect();
            (!others.is_empty()).then(|| checks[i].blocks_with_reserve(analysis::median(&others)))
        })
        .collect();
    Some(ReserveFit {
        checks,
        value_gib,
        held_out,
    })
}

impl ReserveFit {
    /// One line per run: the engine's blocks, the reserve they imply, the blocks predicted
    /// with the fit (in-sample) and with the other runs' fit (held out).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "runtime_overhead_gib = {:.2} fitted to the KV blocks of {} run{}",
            self.value_gib,
            self.checks.len(),
            if self.checks.len() == 1 {
                " (one run: in-sample only)"
            } else {
                "s"
            }
        );
        for (c, h) in self.checks.iter().zip(&self.held_out) {
            let fitted = c.blocks_with_reserve(self.value_gib);
            let pct = |b: u32| {
                100.0 * (f64::from(b) - f64::from(c.measured_blocks)) / f64::from(c.measured_blocks)
            };
            let held = h.map_or("held out: none (no other run)".to_string(), |b| {
                format!("held out {b} ({:+.1}%)", pct(b))
            });
            let _ = writeln!(
                s,
                "  {}: engine {} blocks, implied reserve {:.3} GiB; fit {fitted} ({:+.1}%), {held}",
                c.run.display(),
                c.measured_blocks,
                c.reserve_gib,
                pct(fitted)
            );
        }
        s
    }

    /// The file: the value under `[engine]`, the runs and their errors in the header.
    pub fn toml(&self, source: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# The memory plan's runtime reserve, fitted by `sim calibrate --observed {source}`"
        );
        let _ = writeln!(
            s,
            "# (vLLM 0.19's profile run: weights + max(forward at the token budget, sampler over max_num_seqs) + this reserve)."
        );
        for line in self.table().lines() {
            let _ = writeln!(s, "# {}", line.trim());
        }
        let _ = writeln!(
            s,
            "# The shipped default of `engine.runtime_overhead_gib` is this value (a test ties them)."
        );
        let _ = writeln!(s, "[engine]\nruntime_overhead_gib = {:.2}", self.value_gib);
        s
    }
}
