//! Speculative decoding (DESIGN §4, §6): the configuration, the n-gram proposer, the
//! synthetic acceptance model of simulations, dynamic k and the acceptance statistics.
//!
//! A verify step computes, for one sequence, its last sampled token and `k` draft tokens
//! (`1 + k` query tokens; the block table covers `k` lookahead slots). The backend accepts
//! the longest prefix of drafts it agrees with and adds one token of its own (the
//! correction, or the bonus token when all `k` were accepted), so a verify step emits
//! `accepted + 1` tokens. The scheduler then rolls the sequence back to its verified
//! tokens: rejected slots and the blocks that held only them are released, and only
//! verified tokens enter the prefix cache.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Where the drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// A smaller model drafts `k` tokens autoregressively (its steps cost GPU time).
    DraftModel,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the
    /// context's last n-gram (no GPU time).
    Ngram,
    /// Simulation only: acceptance drawn from the given rates, drafting free.
    Synthetic,
}

impl Method {
    /// Scenario name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::DraftModel => "draft-model",
            Method::Ngram => "ngram",
            Method::Synthetic => "synthetic",
        }
    }
}

/// The synthetic acceptance model: unconditional per-position acceptance rates `r_1 >=
/// r_2 >= ... >= r_k` (the probability that draft `i` and every draft before it are
/// accepted). Draft `i` is accepted, given draft `i - 1` was, with probability `r_i /
/// r_(i-1)` (DESIGN §4).
#[derive(Debug, Clone, PartialEq)]
pub struct Acceptance {
    rates: Arc<[f64]>,
}

impl Acceptance {
    /// From per-position rates, each in [0, 1] and non-increasing.
    pub fn from_rates(rates: &[f64]) -> Result<Acceptance, String> {
        if rates.is_empty() {
            return Err("needs at least one rate".into());
        }
        for (i, &r) in rates.iter().enumerate() {
            if !(0.0..=1.0).contains(&r) {
                return Err(format!("rate {} is {r}, not in [0, 1]", i + 1));
            }
            if i > 0 && r > rates[i - 1] {
                return Err(format!(
                    "rates must not increase: rate {} ({r}) is above rate {} ({})",
                    i + 1,
                    i,
                    rates[i - 1]
                ));
            }
        }
        Ok(Acceptance {
            rates: rates.into(),
        })
    }

    /// The same conditional rate `a` at every one of `k` positions (`r_i = a^i`).
    pub fn iid(a: f64, k: u32) -> Result<Acceptance, String> {
        if k > MAX_K {
            return Err(format!("k = {k} is above the limit of {MAX_K} drafts"));
        }
        if !(0.0..=1.0).contains(&a) {
            return Err(format!("acceptance rate {a} is not in [0, 1]"));
        }
        let rates: Vec<f64> = (1..=k.max(1) as i32).map(|i| a.powi(i)).collect();
        Acceptance::from_rates(&rates)
    }

    /// i.i.d. acceptance whose mean acceptance length (tokens per verify step with every
    /// draft of `k` verified: `1 + a + ... + a^k`) is `mean`, in [1, k + 1].
    pub fn from_mean_length(mean: f64, k: u32) -> Result<Acceptance, String> {
        let k = k.max(1);
        if k > MAX_K {
            return Err(format!("k = {k} is above the limit of {MAX_K} drafts"));
        }
        if !(1.0..=f64::from(k) + 1.0).contains(&mean) {
            return Err(format!(
                "mean acceptance length {mean} is not in [1, k + 1] = [1, {}]",
                k + 1
            ));
        }
        let length = |a: f64| (0..=k as i32).map(|i| a.powi(i)).sum::<f64>();
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if length(mid) < mean {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Acceptance::iid(0.5 * (lo + hi), k)
    }

    /// The unconditional rates `r_1..r_k` given.
    pub fn rates(&self) -> &[f64] {
        &self.rates
    }

    /// `r_i` (1-based; positions past the given rates repeat the last conditional rate).
    pub fn rate(&self, i: u32) -> f64 {
        let n = self.rates.len() as u32;
        if i == 0 {
            return 1.0;
        }
        if i <= n {
            return self.rates[i as usize - 1];
        }
        let last = self.rates[n as usize - 1];
        let cond = if n >= 2 && self.rates[n as usize - 2] > 0.0 {
            last / self.rates[n as usize - 2]
        } else {
            last
        };
        last * cond.powi((i - n) as i32)
    }

    /// Accepted drafts of `k`, drawing `u(i)` in [0, 1) for position `i` (1-based): draft
    /// `i` is accepted while `u(i) < r_i / r_(i-1)`.
    pub fn draw(&self, k: u32, mut u: impl FnMut(u32) -> f64) -> u32 {
        let mut accepted = 0;
        for i in 1..=k {
            let (prev, cur) = (self.rate(i - 1), self.rate(i));
            let cond = if prev > 0.0 { cur / prev } else { 0.0 };
            if u(i) < cond {
                accepted = i;
            } else {
                break;
            }
        }
        accepted
    }

    /// Expected tokens a verify step of `k` drafts emits: `1 + r_1 + ... + r_k`.
    pub fn expected_tokens(&self, k: u32) -> f64 {
        1.0 + (1..=k).map(|i| self.rate(i)).sum::<f64>()
    }
}

/// How `k` follows the batch (verification stops being free when decode becomes
/// compute-bound).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum DynamicK {
    /// Always `k`.
    #[default]
    Off,
    /// No speculation while more than `batch` sequences run (vLLM's
    /// `speculative_disable_by_batch_size`).
    DisableAbove {
        /// Largest batch that still speculates.
        batch: u32,
    },
    /// `k` up to `full_until` running sequences, then down linearly to 0 at `zero_at`.
    Linear {
        /// Batch size up to which the full `k` is drafted.
        full_until: u32,
        /// Batch size from which nothing is drafted.
        zero_at: u32,
    },
}

impl DynamicK {
    /// Drafts per sequence when `running` sequences run.
    pub fn k(self, k: u32, running: usize) -> u32 {
        let b = running as f64;
        match self {
            DynamicK::Off => k,
            DynamicK::DisableAbove { batch } => {
                if running > batch as usize {
                    0
                } else {
                    k
                }
            }
            DynamicK::Linear {
                full_until,
                zero_at,
            } => {
                if b <= f64::from(full_until) {
                    k
                } else if b >= f64::from(zero_at) {
                    0
                } else {
                    let f = (f64::from(zero_at) - b) / f64::from(zero_at - full_until);
                    (f64::from(k) * f).round() as u32
                }
            }
        }
    }
}

/// Speculative decoding of one engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    /// Where drafts come from.
    pub method: Method,
    /// Drafts per verify step (at most; dynamic k and the request's remaining tokens may
    /// lower it).
    pub k: u32,
    /// Synthetic acceptance of simulations (and of a real backend's draft model when it is
    /// simulated).
    pub acceptance: Acceptance,
    /// Per request class, an acceptance that replaces `acceptance` (code accepts more than
    /// chat).
    pub class_acceptance: Vec<Option<Acceptance>>,
    /// n-gram sizes tried, longest first (`method = ngram`).
    pub ngram_min: u32,
    /// Largest n-gram tried.
    pub ngram_max: u32,
    /// How `k` follows the batch.
    pub dynamic: DynamicK,
}

impl SpecConfig {
    /// Checks the limits; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.k == 0 || self.k > MAX_K {
            return Err(format!(
                "speculative.k must be from 1 to {MAX_K}, got {}",
                self.k
            ));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(format!(
                "speculative n-gram sizes must satisfy 1 <= min_n <= max_n (got {} and {})",
                self.ngram_min, self.ngram_max
            ));
        }
        if let DynamicK::Linear {
            full_until,
            zero_at,
        } = self.dynamic
        {
            if zero_at <= full_until {
                return Err(format!(
                    "speculative.dynamic_k: zero_at ({zero_at}) must be above full_until ({full_until})"
                ));
            }
        }
        Ok(())
    }

    /// The acceptance of request class `class`.
    pub fn acceptance_of(&self, class: usize) -> &Acceptance {
        self.class_acceptance
            .get(class)
            .and_then(Option::as_ref)
            .unwrap_or(&self.acceptance)
    }
}

/// The most drafts per verify step a configuration may ask for.
pub const MAX_K: u32 = 64;

/// One sequence's drafts in a verify step.
#[derive(Debug, Clone, PartialEq)]
pub struct Drafts {
    /// Drafts verified: the work computes the last token and these (`len = 1 + k`).
    pub k: u32,
    /// Their ids when the engine proposed them (n-gram on real tokens); empty when the
    /// backend drafts itself (a real draft model) or in simulation.
    pub tokens: Vec<u32>,
    /// The acceptance a simulated backend draws from.
    pub acceptance: Acceptance,
}

/// Sample index of the uniform numbers behind synthetic acceptance (above any real
/// sample's index, so no draw is shared with token sampling).
pub const ACCEPT_DRAW: u32 = 0x5EC0_0000;

/// Accepted drafts of a simulated verify step: [`Acceptance::draw`] with the request's
/// seeded uniform numbers at the step's positions, so the same seed gives the same
/// acceptances whatever the batch.
pub fn simulated_accepted(
    drafts: &Drafts,
    sampling: &crate::request::SamplingParams,
    seq: crate::request::SeqId,
    start: u32,
) -> u32 {
    drafts.acceptance.draw(drafts.k, |i| {
        f64::from(sampling.uniform(seq, start, ACCEPT_DRAW + i))
    })
}

/// Prompt lookup (vLLM's n-gram proposer): for `n` from `max_n` down to `min_n`, the
/// context's last `n` tokens are searched earlier in the context; at the latest match,
/// the (up to `k`) tokens that followed it are the drafts. Empty when nothing matches.
pub fn ngram_propose(context: &[u32], min_n: u32, max_n: u32, k: u32) -> Vec<u32> {
    let len = context.len();
    for n in (min_n.max(1)..=max_n).rev() {
        let n = n as usize;
        if n >= len {
            continue;
        }
        let pattern = &context[len - n..];
        // Latest earlier occurrence whose continuation is inside the context.
        for start in (0..len - n).rev() {
            if &context[start..start + n] == pattern {
                let from = start + n;
                let to = (from + k as usize).min(len);
                return context[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// Acceptance counters (vLLM V1's definitions, DESIGN §4).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpecStats {
    /// Verify steps with at least one draft (vLLM's `num_drafts`).
    pub num_drafts: u64,
    /// Draft tokens verified.
    pub num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: u64,
    /// Tokens the verify steps emitted (accepted drafts plus the target's own token, less
    /// any cut by the end of a request).
    pub num_emitted_tokens: u64,
    /// Accepted drafts at each position (index 0: the first draft).
    pub accepted_per_position: Vec<u64>,
}

impl SpecStats {
    /// Records a verify step of `k` drafts of which `accepted` were accepted, emitting
    /// `emitted` tokens.
    pub fn record(&mut self, k: u32, accepted: u32, emitted: u32) {
        if k == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += u64::from(k);
        self.num_accepted_tokens += u64::from(accepted);
        self.num_emitted_tokens += u64::from(emitted);
        if self.accepted_per_position.len() < k as usize {
            self.accepted_per_position.resize(k as usize, 0);
        }
        for p in &mut self.accepted_per_position[..accepted as usize] {
            *p += 1;
        }
    }

    /// Adds another set of counters.
    pub fn merge(&mut self, other: &SpecStats) {
        self.num_drafts += other.num_drafts;
        self.num_draft_tokens += other.num_draft_tokens;
        self.num_accepted_tokens += other.num_accepted_tokens;
        self.num_emitted_tokens += other.num_emitted_tokens;
        if self.accepted_per_position.len() < other.accepted_per_position.len() {
            self.accepted_per_position
                .resize(other.accepted_per_position.len(), 0);
        }
        for (a, b) in self
            .accepted_per_position
            .iter_mut()
            .zip(&other.accepted_per_position)
        {
            *a += b;
        }
    }

    /// Acceptance rate: accepted / drafted tokens (the bonus token excluded).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.num_accepted_tokens, self.num_draft_tokens)
    }

    /// Mean acceptance length: `1 + accepted / drafts`.
    pub fn mean_acceptance_length(&self) -> f64 {
        1.0 + ratio(self.num_accepted_tokens, self.num_drafts)
    }

    /// Per-position acceptance: accepted at position `i` / drafts (non-increasing).
    pub fn per_position(&self) -> Vec<f64> {
        self.accepted_per_position
            .iter()
            .map(|&a| ratio(a, self.num_drafts))
            .collect()
    }

    /// SGLang's accept length: tokens emitted per verify step, the target's own included.
    pub fn accept_length(&self) -> f64 {
        ratio(self.num_emitted_tokens, self.num_drafts)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_length_inverts_and_rates_are_checked() {
        for (mean, k) in [(1.0, 4), (2.5, 4), (5.0, 4), (1.8, 1), (3.0, 7)] {
            let a = Acceptance::from_mean_length(mean, k).unwrap();
            assert!((a.expected_tokens(k) - mean).abs() < 1e-9, "{mean} {k}");
        }
        assert!(Acceptance::from_mean_length(5.5, 4).is_err());
        assert!(Acceptance::from_rates(&[0.8, 0.9]).is_err());
        assert!(Acceptance::from_rates(&[1.2]).is_err());
        assert!(Acceptance::from_rates(&[]).is_err());
        let a = Acceptance::from_rates(&[0.8, 0.6]).unwrap();
        // Past the given rates, the last conditional rate (0.75) repeats.
        assert!((a.rate(3) - 0.45).abs() < 1e-12);
    }

    #[test]
    fn ngram_takes_the_longest_latest_match() {
        let ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3];
        // "2 3" last occurred at 5..7, followed by 7 8 5.
        assert_eq!(ngram_propose(&ctx, 1, 3, 3), vec![7, 8, 5]);
        // A 3-gram "5 2 3" never occurred before: falls back to the 2-gram.
        assert_eq!(ngram_propose(&ctx, 2, 3, 2), vec![7, 8]);
        assert!(ngram_propose(&[4, 5, 6], 1, 3, 4).is_empty());
        // The continuation stops at the end of the context.
        assert_eq!(ngram_propose(&[1, 1, 1], 1, 1, 5), vec![1]);
    }

    #[test]
    fn dynamic_k_lowers_k_with_the_batch() {
        let lin = DynamicK::Linear {
            full_until: 8,
            zero_at: 24,
        };
        assert_eq!(lin.k(4, 8), 4);
        assert_eq!(lin.k(4, 16), 2);
        assert_eq!(lin.k(4, 24), 0);
        assert_eq!(DynamicK::DisableAbove { batch: 4 }.k(3, 5), 0);
        assert_eq!(DynamicK::Off.k(3, 500), 3);
    }
}
