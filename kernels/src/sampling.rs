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

/// The token drawn from `logits` with `params` and the uniform number `u` in [0, 1).
pub fn draw(logits: &[f32], params: &SamplingParams, u: f32) -> u32 {
    let best = argmax(logits);
    if params.is_greedy() || logits.is_empty() {
        return best;
    }
    let m = f64::from(logits[best as usize]);
    if !m.is_finite() {
        return best;
    }
    let inv_t = 1.0 / f64::from(params.temperature);
    let weight = |v: f32| ((f64::from(v) - m) * inv_t).exp();
    let mut cut = f32::NEG_INFINITY;
    let k = params.top_k as usize;
    let mut sorted: Vec<f32> = Vec::new();
    let top_p = params.top_p();
    if (k > 0 && k < logits.len()) || top_p < 1.0 {
        // NaN is never kept (every comparison with it is false).
        sorted = logits.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
    }
    if k > 0 && k < logits.len() {
        cut = sorted[k - 1];
    }
    if top_p < 1.0 {
        let z: f64 = sorted
            .iter()
            .filter(|&&v| v >= cut)
            .map(|&v| weight(v))
            .sum();
        let target = f64::from(top_p) * z;
        let mut acc = 0.0;
        let mut i = 0;
        while i < sorted.len() && sorted[i] >= cut {
            let v = sorted[i];
            while i < sorted.len() && sorted[i] == v {
                acc += weight(v);
                i += 1;
            }
            if acc >= target {
                cut = v;
                break;
            }
        }
    }
    let z: f64 = logits
        .iter()
        .filter(|&&v| v >= cut)
        .map(|&v| weight(v))
        .sum();
    let t = f64::from(u) * z;
    let mut acc = 0.0;
    let mut last = best;
    for (i, &v) in logits.iter().enumerate() {
        if v >= cut {
            acc += weight(v);
            last = i as u32;
            if acc > t {
                return i as u32;
            }
        }
    }
    last
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
}
