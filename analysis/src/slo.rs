//! Service-level objectives and goodput.

use engine::record::RequestRecord;
use serde::{Deserialize, Serialize};

/// Service-level objectives; a request meets the SLO when every given bound holds.
///
/// Bounds are in milliseconds. A request meets a bound when `bound_ms / 1000 >= metric_s`,
/// exactly as vLLM's benchmark client compares them. As there, a request with fewer than
/// two output tokens has no TPOT and counts as TPOT 0 (so it meets any TPOT bound); a
/// request without a first token fails any TTFT bound.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// Bound on time to first token (ms).
    pub ttft_ms: Option<f64>,
    /// Bound on time per output token (ms).
    pub tpot_ms: Option<f64>,
    /// Bound on end-to-end latency (ms).
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// True when at least one bound is given (goodput is defined only then).
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2el_ms.is_some()
    }

    /// True when the (completed) request meets every given bound.
    pub fn is_met(&self, r: &RequestRecord) -> bool {
        self.is_met_by(r.ttft_s(), r.tpot_s(), r.e2el_s())
    }

    /// The test behind [`Slo::is_met`], on metric values in seconds.
    pub(crate) fn is_met_by(&self, ttft_s: Option<f64>, tpot_s: Option<f64>, e2el_s: f64) -> bool {
        let ttft_ok = match (self.ttft_ms, ttft_s) {
            (None, _) => true,
            (Some(bound), Some(t)) => bound / 1000.0 >= t,
            (Some(_), None) => false,
        };
        let tpot_ok = match self.tpot_ms {
            None => true,
            Some(bound) => bound / 1000.0 >= tpot_s.unwrap_or(0.0),
        };
        let e2el_ok = match self.e2el_ms {
            None => true,
            Some(bound) => bound / 1000.0 >= e2el_s,
        };
        ttft_ok && tpot_ok && e2el_ok
    }
}
