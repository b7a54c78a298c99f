//! Arrival processes of generated workloads ([`ArrivalConfig`]: Poisson, gamma with a
//! burstiness, all at once, closed loop) and the inter-arrival gaps they draw from the
//! arrival stream. A closed loop's requests are all ready at time 0: the driver's client
//! ([`crate::driver::Client`]) sends each when one of its `concurrency` slots frees.

use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma};
use serde::{Deserialize, Serialize};

use super::error::check_positive;
use super::WorkloadError;

/// Arrival process of a synthetic workload (`arrival = { process = "...", ... }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "process", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ArrivalConfig {
    /// Poisson process: exponential inter-arrival times with mean `1 / rate`.
    Poisson {
        /// Requests per second.
        rate: f64,
    },
    /// Gamma inter-arrival times with shape `burstiness` and scale
    /// `1 / (rate * burstiness)`: mean `1 / rate`, coefficient of variation
    /// `1 / sqrt(burstiness)`. Burstiness 1 is Poisson; below 1 is burstier.
    Gamma {
        /// Requests per second.
        rate: f64,
        /// Gamma shape parameter.
        burstiness: f64,
    },
    /// Every request arrives at time 0 (offline batch); needs `num_requests`.
    AllAtOnce {},
    /// A closed loop of `concurrency` clients (vLLM's `bench serve --max-concurrency` with
    /// an infinite rate, aiconfigurator's rows' clients): each sends a request, waits for
    /// its last token, thinks `think_time_s`, and sends the next. Needs `num_requests`.
    ClosedLoop {
        /// Requests in flight at once (clients).
        concurrency: u32,
        /// Pause between a client's request ending and its next being sent (seconds).
        #[serde(default)]
        think_time_s: f64,
        /// The clients start one by one over this time (seconds; default 0: all at once,
        /// so that with fixed lengths their requests run in lockstep, wave after wave).
        #[serde(default)]
        ramp_up_s: f64,
        /// Spread of a client's turnaround (seconds; default 0): each pause is `think_time_s`
        /// plus a uniform draw in `[0, think_jitter_s)` from the scenario's seed. A real
        /// client's turnaround (its own bookkeeping, HTTP, the server's tokenizer) varies
        /// by milliseconds, which is what lets fixed-length clients drift in and out of
        /// step.
        #[serde(default)]
        think_jitter_s: f64,
    },
}

/// Most clients a closed loop may have (a slot each is kept while they think).
pub const MAX_CONCURRENCY: u32 = 1 << 20;

impl ArrivalConfig {
    /// Checks the parameters (`num_requests`: the workload's, which `all-at-once` needs).
    pub(super) fn validate(&self, num_requests: Option<u64>) -> Result<(), WorkloadError> {
        match self {
            ArrivalConfig::Poisson { rate } => check_positive("workload.arrival.rate", *rate)?,
            ArrivalConfig::Gamma { rate, burstiness } => {
                check_positive("workload.arrival.rate", *rate)?;
                check_positive("workload.arrival.burstiness", *burstiness)?;
            }
            ArrivalConfig::AllAtOnce {} => {
                if num_requests.is_none() {
                    return Err(WorkloadError::config(
                        "workload.num_requests",
                        "required with arrival process \"all-at-once\"",
                    ));
                }
            }
            ArrivalConfig::ClosedLoop {
                concurrency,
                think_time_s,
                ramp_up_s,
                think_jitter_s,
            } => {
                if !(think_jitter_s.is_finite() && *think_jitter_s >= 0.0 && *think_jitter_s <= 1e6)
                {
                    return Err(WorkloadError::config(
                        "workload.arrival.think_jitter_s",
                        format!("must be 0 to 1e6 seconds, got {think_jitter_s}"),
                    ));
                }
                if !(ramp_up_s.is_finite() && *ramp_up_s >= 0.0 && *ramp_up_s <= 1e6) {
                    return Err(WorkloadError::config(
                        "workload.arrival.ramp_up_s",
                        format!("must be 0 to 1e6 seconds, got {ramp_up_s}"),
                    ));
                }
                if !(1..=MAX_CONCURRENCY).contains(concurrency) {
                    return Err(WorkloadError::config(
                        "workload.arrival.concurrency",
                        format!("must be 1 to {MAX_CONCURRENCY}, got {concurrency}"),
                    ));
                }
                if !(think_time_s.is_finite() && *think_time_s >= 0.0 && *think_time_s <= 1e6) {
                    return Err(WorkloadError::config(
                        "workload.arrival.think_time_s",
                        format!("must be 0 to 1e6 seconds, got {think_time_s}"),
                    ));
                }
                if num_requests.is_none() {
                    return Err(WorkloadError::config(
                        "workload.num_requests",
                        "required with arrival process \"closed-loop\"",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Inter-arrival time distribution.
#[derive(Debug, Clone)]
pub(super) enum Gaps {
    Exp(Exp<f64>),
    Gamma(Gamma<f64>),
    Zero,
}

impl Gaps {
    /// The gaps of an arrival process.
    pub(super) fn new(arrival: &ArrivalConfig) -> Result<Gaps, WorkloadError> {
        Ok(match arrival {
            ArrivalConfig::Poisson { rate } => Gaps::Exp(Exp::new(*rate).map_err(|e| {
                WorkloadError::config("workload.arrival.rate", format!("invalid: {e}"))
            })?),
            ArrivalConfig::Gamma { rate, burstiness } => Gaps::Gamma(
                Gamma::new(*burstiness, 1.0 / (rate * burstiness)).map_err(|e| {
                    WorkloadError::config("workload.arrival", format!("invalid gamma: {e}"))
                })?,
            ),
            ArrivalConfig::AllAtOnce {} | ArrivalConfig::ClosedLoop { .. } => Gaps::Zero,
        })
    }

    /// Draws the next inter-arrival gap (seconds).
    pub(super) fn draw(&self, rng: &mut ChaCha8Rng) -> f64 {
        match self {
            Gaps::Exp(d) => d.sample(rng),
            Gaps::Gamma(d) => d.sample(rng),
            Gaps::Zero => 0.0,
        }
    }
}
