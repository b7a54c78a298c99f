//! Prefix-aware routing as llm-d's inference scheduler does it: weighted scorers, each
//! giving every replica a score in [0, 1], the highest weighted mean wins (ties at random).
//! - prefix: the fraction of the prompt's leading blocks the router's index believes the
//!   replica caches ([`PrefixIndex`], updated as it routes: always current, never told of
//!   evictions);
//! - queue: waiting requests, min-max normalised over the replicas (fewest: 1);
//! - kv: 1 - KV-cache usage;
//! - outstanding (off by default): requests in flight by the router's count, min-max
//!   normalised.
//!
//! Queue and KV come from the replicas' exports, read every `refresh_ms`: between reads
//! every decision sees the same numbers, so a burst can pile onto one replica, as it does
//! in a real gateway.

use engine::request::Request;
use rand_chacha::ChaCha8Rng;

use super::{argmin_random, Choice, PrefixIndex, ReplicaView, RoutingPolicy, Scores};
use crate::scenario::cluster::ScorerWeights;

/// Weighted scorers over a prefix index.
pub struct PrefixAware {
    w: ScorerWeights,
    index: PrefixIndex,
    matched: Vec<u32>,
}

impl PrefixAware {
    /// The policy with these weights and an empty index.
    pub fn new(w: ScorerWeights, index: PrefixIndex) -> Self {
        PrefixAware {
            w,
            index,
            matched: Vec::new(),
        }
    }
}

/// `1 - (x - min) / (max - min)`: 1 for the least loaded, 0 for the most; 1 for all when
/// they are equal.
fn min_max(x: f64, min: f64, max: f64) -> f64 {
    if max > min {
        1.0 - (x - min) / (max - min)
    } else {
        1.0
    }
}

impl RoutingPolicy for PrefixAware {
    fn choose(&mut self, req: &Request, views: &[ReplicaView], rng: &mut ChaCha8Rng) -> Choice {
        let hashes = self.index.hashes(req);
        self.matched.resize(views.len(), 0);
        self.index.matches(&hashes, &mut self.matched);
        let range = |f: &dyn Fn(&ReplicaView) -> f64| {
            views
                .iter()
                .map(f)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                    (lo.min(x), hi.max(x))
                })
        };
        let (qlo, qhi) = range(&|v| f64::from(v.load.waiting));
        let (olo, ohi) = range(&|v| f64::from(v.outstanding));
        let w = self.w;
        let sum = w.prefix + w.queue + w.kv + w.outstanding;
        let blocks = hashes.len().max(1) as f64;
        let score = |i: usize| {
            let v = &views[i];
            let s = Scores {
                prefix: Some(f64::from(self.matched[i]) / blocks),
                queue: Some(min_max(f64::from(v.load.waiting), qlo, qhi)),
                kv: Some((1.0 - v.load.kv_usage).clamp(0.0, 1.0)),
                total: None,
            };
            let o = min_max(f64::from(v.outstanding), olo, ohi);
            let total = (w.prefix * s.prefix.unwrap_or(0.0)
                + w.queue * s.queue.unwrap_or(0.0)
                + w.kv * s.kv.unwrap_or(0.0)
                + w.outstanding * o)
                / sum;
            Scores {
                total: Some(total),
                ..s
            }
        };
        // Highest total: the smallest negated total, ties at random.
        let best = argmin_random(
            (0..views.len()).map(|i| -score(i).total.unwrap_or(0.0)),
            rng,
        )
        .unwrap_or(0);
        self.index.insert(best, &hashes);
        Choice {
            replica: best,
            scores: score(best),
        }
    }
}
