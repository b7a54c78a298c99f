//! Drawing a token from a row of logits on the CPU, with the semantics of the CUDA runtime's
//! `sample_draws`: greedy (the argmax, lowest index on ties) at temperature 0 or top-k 1;
//! otherwise vLLM's order: softmax at the temperature, keep the `top_k` largest logits
//! (ties at the cut kept), then the smallest top set whose mass reaches `top_p` of the
//! kept mass (ties kept), and take the token where the kept mass, accumulated in
//! vocabulary order, passes `u` times its total (inverse CDF: the same `u` gives the same
//! token on every backend, up to rounding at a boundary).

use engine::request::SamplingParams;

/// The argmax of a row (lowest index on ties; NaN never wins; 0 for a row without a
/// value above -infinity), as the CUDA kernel computes it.
pub fn argmax(logits: &[f32]) -> u32 {
    let (mut best, mut value) = (0usize, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > value {
            (best, value) = (i, v);
        }
    }
    best as u32
}

/// The kept set of a non-greedy draw: tokens whose logit is at least `cut`, each weighing
/// `exp((logit - max) / temperature)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kept {
    /// Smallest kept logit (`-inf`: every non-NaN token).
    pub cut: f32,
    /// The largest logit.
    pub max: f64,
    /// 1 / temperature.
    pub inv_t: f64,
    /// Whether the top-p cut lies within `tol` (relative) of a level boundary, where float
    /// rounding elsewhere may legitimately cut one level higher or lower.
    pub ambiguous: bool,
}

impl Kept {
    /// The unnormalised probability of a logit.
    pub fn weight(&self, v: f32) -> f64 {
        ((f64::from(v) - self.max) * self.inv_t).exp()
    }

    /// Whether a logit is kept (never a masked one, at -infinity: its probability is 0).
    pub fn keeps(&self, v: f32) -> bool {
        v >= self.cut && v > f32::NEG_INFINITY
    }
}

/// The log-probabilities of `token` and of the `top` most likely tokens under the raw
/// logits `row` (log-softmax in f64; most likely first, lower id first on ties; NaN logits
/// count as -infinity).
pub fn logprobs(row: &[f32], token: u32, top: u32) -> engine::plan::TokenLogprobs {
    let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let max = row
        .iter()
        .map(|&v| clean(v))
        .fold(f32::NEG_INFINITY, f32::max);
    let max = if max.is_finite() { f64::from(max) } else { 0.0 };
    let sum: f64 = row.iter().map(|&v| (f64::from(clean(v)) - max).exp()).sum();
    let lse = max + sum.ln();
    let lp = |v: f32| (f64::from(clean(v)) - lse) as f32;
    // The top `k` by one pass over the row, kept sorted (k is at most a few tens).
    let k = (top as usize).min(row.len());
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &v) in row.iter().enumerate() {
            let v = clean(v);
            if best.len() == k && best.last().is_some_and(|&(_, w)| v <= w) {
                continue;
            }
            let at = best.partition_point(|&(_, w)| w >= v);
            best.insert(at, (i as u32, v));
            best.truncate(k);
        }
    }
    engine::plan::TokenLogprobs {
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| lp(v)),
        top: best.into_iter().map(|(i, v)| (i, lp(v))).collect(),
    }
}

/// The log-probabilities of a step's drawn tokens ([`engine::plan::StepOutcome::logprobs`]):
/// `drawn` in plan order (`num_samples` per sampling work, `accepted + 1` per verify work,
/// `accepted` in plan order), read from `logits` (`vocab` wide, one row per sampled
/// position as [`suppress_plan`] lays them out) for the works that ask. Empty when none
/// asks.
pub fn step_logprobs(
    logits: &[f32],
    vocab: usize,
    work: &[engine::plan::SeqWork],
    drawn: &[u32],
    accepted: &[u32],
) -> Vec<Option<engine::plan::TokenLogprobs>> {
    if work.iter().all(|w| w.sampling.logprobs.is_none()) {
        return Vec::new();
    }
    let (mut out, mut row, mut d) = (Vec::with_capacity(drawn.len()), 0usize, 0usize);
    let mut acc = accepted.iter();
    for w in work {
        // (rows of the work, tokens drawn and whether each reads its own row)
        let (rows, count, own_row) = if w.kind == engine::plan::WorkKind::Verify {
            let a = acc.next().copied().unwrap_or(0) as usize;
            (w.len as usize, a + 1, true)
        } else if w.sample {
            (1, w.num_samples.max(1) as usize, false)
        } else {
            (0, 0, false)
        };
        for j in 0..count {
            let lp = w.sampling.logprobs.and_then(|top| {
                let r = row + if own_row { j } else { 0 };
                let at = logits.get(r * vocab..(r + 1) * vocab)?;
                let t = *drawn.get(d + j)?;
                Some(logprobs(
                    at,
                    t,
                    top.min(engine::request::SamplingParams::MAX_LOGPROBS),
                ))
            });
            out.push(lp);
        }
        row += rows;
        d += count;
    }
    out
}

/// Masks the token ids `ids` of a logits row (vLLM's min-tokens processor): they get
/// -infinity, so no draw picks them while another token remains. Ids outside the row are
/// left alone (the engine checks ids against the vocabulary).
pub fn suppress(row: &mut [f32], ids: &[u32]) {
    for &t in ids {
        if let Some(v) = row.get_mut(t as usize) {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// Masks, in a step's logits (`vocab` wide, one row per sampled position in plan order:
/// one for a decode or a prompt's end, `len` for a verify), the suppressed ids of each
/// work's first `suppress_rows` positions ([`engine::plan::SeqWork::suppress`]).
pub fn suppress_plan(logits: &mut [f32], vocab: usize, work: &[engine::plan::SeqWork]) {
    let mut row = 0usize;
    for w in work {
        let rows = if w.kind == engine::plan::WorkKind::Verify {
            w.len as usize
        } else if w.sample {
            1
        } else {
            0
        };
        for j in 0..rows.min(w.suppress_rows as usize) {
            if let Some(r) = logits.get_mut((row + j) * vocab..(row + j + 1) * vocab) {
                suppress(r, &w.suppress);
            }
        }
        row += rows;
    }
}

/// The top-k then top-p cuts of a non-greedy draw (None for a greedy one or a row
/// without a finite maximum), in f64; `tol` flags a top-p target within that relative
/// distance of a level boundary.
pub fn kept(logits: &[f32], params: &SamplingParams, tol: f64) -> Option<Kept> {
    if params.is_greedy() || logits.is_empty() {
        return None;
    }
    let max = f64::from(logits[argmax(logits) as usize]);
    if !max.is_finite() {
        return None;
    }
    let mut out = Kept {
        cut: f32::NEG_INFINITY,
        max,
        inv_t: 1.0 / f64::from(params.temperature),
        ambiguous: false,
    };
    let k = params.top_k as usize;
    let top_p = params.top_p();
    if !((k > 0 && k < logits.len()) || top_p < 1.0) {
        return Some(out);
    }
    // NaN is never kept (every comparison with it is false).
    let mut sorted: Vec<f32> = logits.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if k > 0 && k < sorted.len() {
        out.cut = sorted[k - 1];
    }
    if top_p < 1.0 {
        let z: f64 = sorted
            .iter()
            .filter(|&&v| out.keeps(v))
            .map(|&v| out.weight(v))
            .sum();
        let target = f64::from(top_p) * z;
        let mut acc = 0.0;
        let mut i = 0;
        while i < sorted.len() && out.keeps(sorted[i]) {
            // A level holds every tie of its value.
            let (v, before) = (sorted[i], acc);
            while i < sorted.len() && sorted[i] == v {
                acc += out.weight(v);
                i += 1;
            }
            if acc >= target {
                out.ambiguous = (acc - target).abs() < tol * z || (before - target).abs() < tol * z;
                out.cut = v;
                break;
            }
        }
    }
    Some(out)
}

/// The token drawn from `logits` with `params` and the uniform number `u` in [0, 1).
pub fn draw(logits: &[f32], params: &SamplingParams, u: f32) -> u32 {
    let best = argmax(logits);
    let Some(kept) = kept(logits, params, 0.0) else {
        return best;
    };
    let z: f64 = logits
        .iter()
        .filter(|&&v| kept.keeps(v))
        .map(|&v| kept.weight(v))
        .sum();
    let t = f64::from(u) * z;
    let mut acc = 0.0;
    let mut last = best;
    for (i, &v) in logits.iter().enumerate() {
        if kept.keeps(v) {
            acc += kept.weight(v);
            last = i as u32;
            if acc > t {
                return i as u32;
            }
        }
    }
    last
}

/// Speculative verification of a draft token `d` against the target's `logits` (Leviathan
/// et al., with the draft given as a point-mass proposal: the n-gram and greedy drafts are
/// deterministic). Greedy: `d` is accepted when it is the argmax, else the argmax replaces
/// it. Sampling: `d` is accepted with probability `p(d)` (under `params`' temperature,
/// top-k and top-p, `u_accept` the uniform number), else the replacement is drawn from `p`
/// without `d`, renormalised (`max(p - q, 0)` for a point mass `q`), with `u_draw`. Either
/// way the emitted token has exactly the target's distribution. `Ok` is an acceptance,
/// `Err` the replacement.
pub fn verify_draft(
    logits: &[f32],
    params: &SamplingParams,
    d: u32,
    u_accept: f32,
    u_draw: f32,
) -> Result<(), u32> {
    let best = argmax(logits);
    let Some(kept) = kept(logits, params, 0.0) else {
        return if best == d { Ok(()) } else { Err(best) };
    };
    let weight = |i: usize, v: f32| {
        if kept.keeps(v) {
            kept.weight(v)
        } else {
            let _ = i;
            0.0
        }
    };
    let z: f64 = logits.iter().enumerate().map(|(i, &v)| weight(i, v)).sum();
    let pd = logits
        .get(d as usize)
        .map_or(0.0, |&v| weight(d as usize, v))
        / z;
    if f64::from(u_accept) < pd {
        return Ok(());
    }
    // The rest of the mass, in vocabulary order without d.
    let rest = z * (1.0 - pd);
    let t = f64::from(u_draw) * rest;
    let (mut acc, mut last) = (0.0, best);
    for (i, &v) in logits.iter().enumerate() {
        if i as u32 == d || !kept.keeps(v) {
            continue;
        }
        acc += kept.weight(v);
        last = i as u32;
        if acc > t {
            return Err(i as u32);
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: 0,
            logprobs: None,
        }
    }

    #[test]
    fn greedy_and_cuts() {
        let logits = [1.0f32, 3.0, 3.0, 2.0, -1.0];
        assert_eq!(draw(&logits, &params(0.0, 0, 1.0), 0.9), 1);
        assert_eq!(draw(&logits, &params(1.0, 1, 1.0), 0.9), 1);
        // Top-2 keeps both 3.0s (ties at the cut count once as a level, all kept): the
        // inverse CDF over indices 1 and 2 splits u at one half.
        assert_eq!(draw(&logits, &params(1.0, 2, 1.0), 0.2), 1);
        assert_eq!(draw(&logits, &params(1.0, 2, 1.0), 0.7), 2);
        // Top-p 0.5 keeps the top level only (the two 3.0s hold 0.66 of the mass).
        for u in [0.0, 0.3, 0.6, 0.99] {
            let t = draw(&logits, &params(1.0, 0, 0.5), u);
            assert!(t == 1 || t == 2, "{t}");
        }
        // Without cuts every token can come out, in vocabulary order of u.
        assert_eq!(draw(&logits, &params(1.0, 0, 1.0), 0.0), 0);
        assert_eq!(draw(&logits, &params(1.0, 0, 1.0), 0.999_999), 4);
    }

    #[test]
    fn degenerate_inputs_fall_back_to_the_argmax() {
        let logits = [0.5f32, 2.0, f32::NAN, 1.0];
        // A temperature that would overflow 1 / T, a top-p of 0, NaN: the argmax (NaN
        // never wins).
        assert_eq!(draw(&logits, &params(1e-45, 0, 1.0), 0.7), 1);
        assert_eq!(draw(&logits, &params(1.0, 0, 0.0), 0.99), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 3.0]), 2);
        // No finite value: token 0, as the CUDA kernel answers.
        assert_eq!(argmax(&[f32::NEG_INFINITY; 4]), 0);
        assert_eq!(draw(&[f32::NEG_INFINITY; 4], &params(1.0, 0, 1.0), 0.5), 0);
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [0.0f32, 1.0, 2.0, 0.5];
        let p = params(0.7, 0, 1.0);
        let n = 20_000;
        let mut counts = [0u32; 4];
        for i in 0..n {
            counts[draw(&logits, &p, (i as f32 + 0.5) / n as f32) as usize] += 1;
        }
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| (f64::from(l - 2.0) / 0.7).exp())
            .collect();
        let z: f64 = w.iter().sum();
        for (c, w) in counts.iter().zip(&w) {
            assert!(
                (f64::from(*c) / f64::from(n) - w / z).abs() < 1e-3,
                "{counts:?}"
            );
        }
    }

    /// Rejection sampling with a point-mass draft emits exactly the target distribution:
    /// over a grid of (accept, draw) uniforms, the emitted token frequencies match the
    /// softmax (with top-k), whatever the draft token; greedy accepts the argmax only.
    #[test]
    fn verification_keeps_the_target_distribution() {
        let logits = [0.3f32, 1.5, -0.4, 2.0, 0.9];
        let p = params(0.8, 4, 1.0);
        let kept = kept(&logits, &p, 0.0).expect("non-greedy");
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| if kept.keeps(l) { kept.weight(l) } else { 0.0 })
            .collect();
        let z: f64 = w.iter().sum();
        let n = 300;
        for d in 0..logits.len() as u32 {
            let mut counts = [0u32; 5];
            for i in 0..n {
                for j in 0..n {
                    let (ua, ud) = ((i as f32 + 0.5) / n as f32, (j as f32 + 0.5) / n as f32);
                    let t = match verify_draft(&logits, &p, d, ua, ud) {
                        Ok(()) => d,
                        Err(t) => {
                            assert_ne!(t, d, "a rejected draft is never re-drawn");
                            t
                        }
                    };
                    counts[t as usize] += 1;
                }
            }
            for (c, wi) in counts.iter().zip(&w) {
                let f = f64::from(*c) / f64::from(n * n);
                assert!((f - wi / z).abs() < 5e-3, "draft {d}: {counts:?}");
            }
        }
        let greedy = params(0.0, 0, 1.0);
        assert_eq!(verify_draft(&logits, &greedy, 3, 0.9, 0.9), Ok(()));
        assert_eq!(verify_draft(&logits, &greedy, 1, 0.0, 0.0), Err(3));
    }

    #[test]
    fn suppressed_tokens_are_never_drawn() {
        let mut logits = vec![0.5f32, 4.0, 3.9, 1.0, -2.0, 4.0];
        suppress(&mut logits, &[1, 5, 99]);
        assert_eq!(logits[1], f32::NEG_INFINITY);
        assert_eq!(logits[5], f32::NEG_INFINITY);
        // Greedy falls to the best of the rest; sampling, at any u and cut, never picks
        // a masked id, even at u just below 1 (where the inverse CDF's fallback is the last
        // kept token).
        assert_eq!(draw(&logits, &params(0.0, 0, 1.0), 0.5), 2);
        for p in [
            params(1.0, 0, 1.0),
            params(2.0, 3, 0.9),
            params(0.7, 0, 0.3),
        ] {
            for k in 0..64 {
                let u = k as f32 / 64.0 + 0.0156;
                let t = draw(&logits, &p, u.min(0.999_999_9));
                assert!(t != 1 && t != 5, "{t} at {u}");
            }
        }
        // A masked draft is always rejected, and its replacement is not masked.
        for u in [0.0f32, 0.5, 0.99] {
            let r = verify_draft(&logits, &params(1.0, 0, 1.0), 5, 0.0, u);
            assert!(matches!(r, Err(t) if t != 1 && t != 5), "{r:?}");
        }
    }

    #[test]
    fn suppress_plan_masks_the_first_rows_of_each_work() {
        use engine::plan::{SeqWork, WorkKind};
        let vocab = 4;
        let work = |kind: WorkKind, len: u32, sample: bool, rows: u32| SeqWork {
            seq: 0,
            kind,
            start: 0,
            len,
            sample,
            num_samples: 1,
            block_table: Vec::new(),
            token_ids: Vec::new(),
            sampling: SamplingParams::default(),
            drafts: None,
            suppress: vec![2],
            suppress_rows: rows,
        };
        // A decode (1 row, masked), a chunk that samples nothing (no row), a verify of 3
        // (rows 2..5, the first two masked), a decode not masked (row 5).
        let plan = [
            work(WorkKind::Decode, 1, true, 1),
            work(WorkKind::Prefill, 8, false, 1),
            work(WorkKind::Verify, 3, true, 2),
            work(WorkKind::Decode, 1, true, 0),
        ];
        let mut logits = vec![1.0f32; 6 * vocab];
        suppress_plan(&mut logits, vocab, &plan);
        let masked: Vec<usize> = (0..6)
            .filter(|r| logits[r * vocab + 2] == f32::NEG_INFINITY)
            .collect();
        assert_eq!(masked, [0, 1, 2]);
        assert_eq!(
            logits.iter().filter(|v| **v == f32::NEG_INFINITY).count(),
            3
        );
    }

    #[test]
    fn logprobs_are_the_raw_log_softmax_with_the_top_first() {
        let row = [1.0f32, 3.0, 3.0, 0.5, f32::NEG_INFINITY, 2.0];
        let lp = logprobs(&row, 3, 3);
        let lse = row.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
        assert!((f64::from(lp.logprob) - (0.5 - lse)).abs() < 1e-6);
        // Ties: lower id first; the masked token has no probability.
        let ids: Vec<u32> = lp.top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, [1, 2, 5]);
        assert!((f64::from(lp.top[2].1) - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(logprobs(&row, 4, 0).logprob, f32::NEG_INFINITY);
        assert!(logprobs(&row, 0, 0).top.is_empty());
        // More asked than the row holds.
        assert_eq!(logprobs(&row, 0, 50).top.len(), row.len());
    }

    #[test]
    fn step_logprobs_follow_the_rows_of_each_draw() {
        use engine::plan::{SeqWork, WorkKind};
        let vocab = 3;
        let work = |kind: WorkKind, len: u32, n: u32, lp: Option<u32>| SeqWork {
            seq: 0,
            kind,
            start: 0,
            len,
            sample: true,
            num_samples: n,
            block_table: Vec::new(),
            token_ids: Vec::new(),
            sampling: SamplingParams {
                logprobs: lp,
                ..SamplingParams::default()
            },
            drafts: None,
            suppress: Vec::new(),
            suppress_rows: 0,
        };
        // A fork of 2 from row 0 (asked), a verify of 3 rows 1..4 with 1 accepted (2
        // tokens from rows 1 and 2, asked), a decode at row 4 (not asked).
        let plan = [
            work(WorkKind::Prefill, 5, 2, Some(1)),
            work(WorkKind::Verify, 3, 1, Some(0)),
            work(WorkKind::Decode, 1, 1, None),
        ];
        let mut logits = vec![0.0f32; 5 * vocab];
        for r in 0..5 {
            logits[r * vocab + r % vocab] = 5.0;
        }
        let drawn = [0, 1, 1, 2, 0];
        let out = step_logprobs(&logits, vocab, &plan, &drawn, &[1]);
        assert_eq!(out.len(), 5);
        let best = |r: usize| out[r].as_ref().map(|l| l.logprob > -0.1);
        // Row 0's best is token 0 (drawn first), token 1 is not.
        assert_eq!((best(0), best(1)), (Some(true), Some(false)));
        assert_eq!(out[0].as_ref().map(|l| l.top.len()), Some(1));
        // The verify's tokens read rows 1 and 2, whose best are 1 and 2.
        assert_eq!((best(2), best(3)), (Some(true), Some(true)));
        assert_eq!(out[4], None);
        // Nobody asks: nothing computed.
        let plain = [work(WorkKind::Decode, 1, 1, None)];
        assert!(step_logprobs(&logits, vocab, &plain, &[0], &[]).is_empty());
    }
}
