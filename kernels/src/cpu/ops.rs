//! The element-wise operations of the CPU forward pass: RMSNorm, RoPE (interleaved pairs
//! as GGUF stores Llama's Q and K, or rotate-half), and synthetic weights.

/// RMSNorm of each row of `x` (width `w.len()`), times `w`.
pub(super) fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let h = w.len();
    let mut out = vec![0.0f32; x.len()];
    for (o, r) in out.chunks_mut(h).zip(x.chunks(h)) {
        let ss: f32 = r.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(r).zip(w) {
            *o = v * inv * g;
        }
    }
    out
}

/// RoPE's (sin, cos) of each rotation pair of a head at position `pos`.
pub(super) fn rope_angles(pos: u32, theta: f32, head_dim: usize) -> Vec<(f32, f32)> {
    (0..head_dim / 2)
        .map(|i| {
            let freq = theta.powf(-2.0 * i as f32 / head_dim as f32);
            (pos as f32 * freq).sin_cos()
        })
        .collect()
}

/// Rotates one head in place by `angles` ([`rope_angles`]; pairs (2i, 2i+1) when
/// `interleaved`, as GGUF stores Llama's Q and K; (i, i + d/2) otherwise).
pub(super) fn rope(head: &mut [f32], angles: &[(f32, f32)], interleaved: bool) {
    let half = head.len() / 2;
    for (i, &(s, c)) in angles.iter().enumerate() {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * c - x1 * s;
        head[b] = x1 * c + x0 * s;
    }
}

/// Uniform deterministic weights in +-1/sqrt(fan-in) (synthetic mode).
pub(super) fn synthetic(n: usize, fan_in: usize, seed: u64) -> Vec<f32> {
    let scale = 1.0 / (fan_in.max(1) as f32).sqrt();
    (0..n as u64)
        .map(|i| {
            let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}
