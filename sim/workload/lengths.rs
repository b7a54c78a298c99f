//! Token-length distributions ([`LengthDist`]: fixed, uniform, normal, lognormal, an
//! empirical CSV column) and joint lengths ([`JointLengths`]: whole CSV rows), as configured
//! and as samplers drawing from a class's seeded streams.

use std::path::{Path, PathBuf};

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use serde::{Deserialize, Serialize};

use super::csv_file::load_counts;
use super::error::{check_bounds, check_non_negative, check_path, check_positive};
use super::WorkloadError;

/// Distribution of a token length (`{ dist = "...", ... }`).
///
/// Samples are rounded to integers, clamped to `[min, max]` when given, and at least 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LengthDist {
    /// Always `value`.
    Fixed {
        /// The length.
        value: u32,
    },
    /// Uniform over the integers `min..=max`.
    Uniform {
        /// Smallest length.
        min: u32,
        /// Largest length.
        max: u32,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
        /// Lower clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
    /// Lognormal whose own mean and standard deviation (not those of its logarithm) are
    /// given.
    #[serde(rename = "lognormal")]
    LogNormal {
        /// Mean of the distribution.
        mean: f64,
        /// Standard deviation of the distribution.
        std: f64,
        /// Lower clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
    /// The values of one column of a CSV (with a header), sampled uniformly with
    /// replacement.
    Empirical {
        /// Path of the CSV, relative to the scenario's folder.
        path: PathBuf,
        /// Column name.
        column: String,
        /// Lower clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
    },
}

/// Joint prompt and output lengths: a CSV row drawn uniformly with replacement gives both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JointLengths {
    /// Path of the CSV (with a header), relative to the scenario's folder.
    pub path: PathBuf,
    /// Column of the prompt length.
    pub prompt_column: String,
    /// Column of the output length.
    pub output_column: String,
}

impl LengthDist {
    /// Checks the parameters; `key` is the dotted key of this distribution.
    pub(super) fn validate(&self, key: &str) -> Result<(), WorkloadError> {
        match self {
            LengthDist::Fixed { value } => {
                if *value == 0 {
                    return Err(WorkloadError::config(
                        format!("{key}.value"),
                        "must be at least 1, got 0",
                    ));
                }
            }
            LengthDist::Uniform { min, max } => check_bounds(key, Some(*min), Some(*max))?,
            LengthDist::Normal {
                mean,
                std,
                min,
                max,
            } => {
                if !mean.is_finite() {
                    return Err(WorkloadError::config(
                        format!("{key}.mean"),
                        format!("must be a finite number, got {mean}"),
                    ));
                }
                check_non_negative(&format!("{key}.std"), *std)?;
                check_bounds(key, *min, *max)?;
            }
            LengthDist::LogNormal {
                mean,
                std,
                min,
                max,
            } => {
                check_positive(&format!("{key}.mean"), *mean)?;
                check_non_negative(&format!("{key}.std"), *std)?;
                check_bounds(key, *min, *max)?;
            }
            LengthDist::Empirical {
                path,
                column,
                min,
                max,
            } => {
                check_path(&format!("{key}.path"), path)?;
                if column.is_empty() {
                    return Err(WorkloadError::config(
                        format!("{key}.column"),
                        "must not be empty",
                    ));
                }
                check_bounds(key, *min, *max)?;
            }
        }
        Ok(())
    }
}

/// Rounds `x`, clamps it to `[lo, hi]` and to at least 1.
fn to_len(x: f64, lo: u32, hi: u32) -> u32 {
    // `as` saturates (NaN gives 0), then the clamp applies the bounds.
    let v = x.round() as u32;
    v.clamp(lo, hi).max(1)
}

/// Bounds `[lo, hi]` with defaults `[1, u32::MAX]`.
pub(super) fn bounds(min: Option<u32>, max: Option<u32>) -> (u32, u32) {
    let lo = min.unwrap_or(1);
    let hi = max.unwrap_or(u32::MAX).max(lo);
    (lo, hi)
}

/// A length distribution ready to sample.
#[derive(Debug, Clone)]
pub(super) enum LenSampler {
    Fixed(u32),
    Uniform(u32, u32),
    Normal(Normal<f64>, u32, u32),
    LogNormal(LogNormal<f64>, u32, u32),
    Empirical(Vec<u32>, u32, u32),
}

impl LenSampler {
    pub(super) fn new(
        dist: &LengthDist,
        base_dir: &Path,
        key: &str,
    ) -> Result<Self, WorkloadError> {
        let param_err = |e: rand_distr::NormalError| {
            WorkloadError::config(key, format!("invalid distribution parameters: {e}"))
        };
        Ok(match dist {
            LengthDist::Fixed { value } => LenSampler::Fixed((*value).max(1)),
            LengthDist::Uniform { min, max } => LenSampler::Uniform(*min, (*max).max(*min)),
            LengthDist::Normal {
                mean,
                std,
                min,
                max,
            } => {
                let (lo, hi) = bounds(*min, *max);
                LenSampler::Normal(Normal::new(*mean, *std).map_err(param_err)?, lo, hi)
            }
            LengthDist::LogNormal {
                mean,
                std,
                min,
                max,
            } => {
                // Mean m and std s of the lognormal itself: sigma^2 = ln(1 + s^2/m^2),
                // mu = ln(m) - sigma^2/2.
                let sigma2 = (1.0 + (std / mean).powi(2)).ln();
                let mu = mean.ln() - sigma2 / 2.0;
                let (lo, hi) = bounds(*min, *max);
                LenSampler::LogNormal(
                    LogNormal::new(mu, sigma2.sqrt()).map_err(param_err)?,
                    lo,
                    hi,
                )
            }
            LengthDist::Empirical {
                path,
                column,
                min,
                max,
            } => {
                let full = base_dir.join(path);
                let values = load_counts(&full, [column.as_str()])?
                    .into_iter()
                    .map(|[v]| v)
                    .collect();
                let (lo, hi) = bounds(*min, *max);
                LenSampler::Empirical(values, lo, hi)
            }
        })
    }

    pub(super) fn sample(&self, rng: &mut ChaCha8Rng) -> u32 {
        match self {
            LenSampler::Fixed(v) => *v,
            LenSampler::Uniform(lo, hi) => rng.random_range(*lo..=*hi).max(1),
            LenSampler::Normal(d, lo, hi) => to_len(d.sample(rng), *lo, *hi),
            LenSampler::LogNormal(d, lo, hi) => to_len(d.sample(rng), *lo, *hi),
            LenSampler::Empirical(values, lo, hi) => {
                let v = values[rng.random_range(0..values.len())];
                v.clamp(*lo, *hi).max(1)
            }
        }
    }
}

/// Where one class's lengths come from.
#[derive(Debug, Clone)]
pub(super) enum ClassLengths {
    /// Independent prompt and output distributions.
    Separate(LenSampler, LenSampler),
    /// Whole CSV rows of (prompt, output).
    Joint(Vec<[u32; 2]>),
}

/// One class's length sampler with its random streams.
#[derive(Debug, Clone)]
pub(super) struct ClassSampler {
    pub(super) lengths: ClassLengths,
    /// Stream of prompt lengths (and of joint rows).
    pub(super) prompt_rng: ChaCha8Rng,
    /// Stream of output lengths.
    pub(super) output_rng: ChaCha8Rng,
}

impl ClassSampler {
    pub(super) fn sample(&mut self) -> (u32, u32) {
        match &self.lengths {
            ClassLengths::Separate(prompt, output) => (
                prompt.sample(&mut self.prompt_rng),
                output.sample(&mut self.output_rng),
            ),
            ClassLengths::Joint(rows) => {
                let [p, o] = rows[self.prompt_rng.random_range(0..rows.len())];
                (p.max(1), o.max(1))
            }
        }
    }
}
