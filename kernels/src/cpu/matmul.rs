//! Matrix products of the CPU runtime: [`Weight`] (f32, or GGUF blocks row by row or in
//! the grouped layout of `packed.rs`), the row kernels (AVX2 or scalar, picked once from
//! the CPU and `SIM_CPU_ISA`), and the f32 products, all split over the thread team.

use super::blocks::*;
use super::packed;
use super::team::team;

/// Tokens multiplied together against each weight block: the block's bytes are loaded
/// and unpacked once per tile, and the tile's accumulators stay in registers.
pub(super) const TILE: usize = 4;

/// The row kernels llama.cpp-style: per block, integer products summed to eight i32
/// lanes, converted and accumulated in f32 lanes with the two scales, and one horizontal
/// sum per row and token at the end.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{IntBlock, QuantActs};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    unsafe fn hsum_ps(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `out[j]` for tokens `t0 .. t0 + N` of `acts` against one weight row.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `acts` must hold tokens up to `t0 + N` of
    /// `row.len()` blocks each.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row<B: IntBlock, const N: usize>(
        row: &[B],
        acts: &QuantActs,
        t0: usize,
        out: &mut [f32],
    ) {
        let nb = row.len();
        assert!(acts.d.len() >= (t0 + N) * nb && out.len() >= N);
        let (q, d, s) = (acts.q.as_ptr(), acts.d.as_ptr(), acts.s.as_ptr());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut offsets = [0.0f32; N];
        for (b, blk) in row.iter().enumerate() {
            let w = blk.lanes();
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(blk.scale_bits()));
            let (bd, bm) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            for j in 0..N {
                let i = (t0 + j) * nb + b;
                // SAFETY: i < acts.d.len() (asserted above), and q holds 32 bytes a block.
                let xv = _mm256_loadu_si256(q.add(32 * i).cast());
                let (u, sx) = B::operands(w, xv);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, sx), ones);
                let scale = _mm256_set1_ps(bd * *d.add(i));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
                if B::OFFSET {
                    offsets[j] += bm * *s.add(i);
                }
            }
        }
        for j in 0..N {
            out[j] = hsum_ps(acc[j]) + offsets[j];
        }
    }
}

/// Which row kernel the CPU runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// The most capable kernel family `SIM_CPU_ISA` allows (`avx512`, the default; `avx2`;
/// `scalar`), to measure and test the fallbacks on a CPU that has more.
pub(super) fn isa_cap() -> u8 {
    static CAP: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("SIM_CPU_ISA").as_deref() {
        Ok("scalar") => 0,
        Ok("avx2") => 1,
        Ok("avx512") | Err(_) => 2,
        Ok(other) => {
            eprintln!(
                "warning: SIM_CPU_ISA={other:?} is not one of avx512, avx2, scalar; using the best kernels this CPU has"
            );
            2
        }
    })
}

impl Kernel {
    pub(super) fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if isa_cap() >= 1
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Kernel::Avx2;
        }
        Kernel::Scalar
    }
}

/// One weight row against the tokens `t0 .. t0 + out.len()` of `acts` (at most [`TILE`]):
/// `out[j] = sum_b d_b dx sum(q qx) + m_b sx`.
pub(super) fn row_dots<B: IntBlock>(
    row: &[B],
    acts: &QuantActs,
    t0: usize,
    out: &mut [f32],
    k: Kernel,
) {
    match k {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2, FMA and F16C were detected; block_matmul passes whole tokens of `acts`.
        Kernel::Avx2 => unsafe {
            assert!((1..=TILE).contains(&out.len()));
            match out.len() {
                1 => simd::row::<B, 1>(row, acts, t0, out),
                2 => simd::row::<B, 2>(row, acts, t0, out),
                3 => simd::row::<B, 3>(row, acts, t0, out),
                _ => simd::row::<B, TILE>(row, acts, t0, out),
            }
        },
        Kernel::Scalar => {
            let nb = row.len();
            for (j, o) in out.iter_mut().enumerate() {
                *o = row
                    .iter()
                    .enumerate()
                    .map(|(b, blk)| {
                        let i = (t0 + j) * nb + b;
                        let (d, m) = blk.scales();
                        d * acts.d[i] * blk.idot(&acts.q[32 * i..32 * i + 32]) as f32
                            + m * acts.s[i]
                    })
                    .sum();
            }
        }
    }
}

/// How the CPU runtime multiplies by block weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Activations rounded to 8 bits and integer block products, as llama.cpp (fast).
    #[default]
    Int8,
    /// Blocks unpacked to f32 and f32 activations: the float reference the GPU runtime is
    /// compared with.
    F32,
}

/// `out[t][n]` over block rows (`k / 32` blocks each), rows split over the threads. With
/// [`Precision::Int8`] the activations are rounded to 8 bits ([`quantize_acts`]) and a
/// block's share is `d dx sum(q qx) + m sx`, in integers inside the block ([`row_dots`]:
/// AVX2 where the CPU has it, the same sums otherwise); with [`Precision::F32`] each
/// block is unpacked to f32 and multiplied with the f32 activations.
pub(super) fn block_matmul<B: IntBlock>(
    blocks: &[B],
    x: &[f32],
    [t, k, n]: [usize; 3],
    precision: Precision,
) -> Vec<f32> {
    let nb = k / 32;
    let acts = (precision == Precision::Int8).then(|| quantize_acts(x));
    let kernel = Kernel::detect();
    let mut out_t = vec![0.0f32; n * t];
    // Each member streams a contiguous stretch of rows, which the prefetchers follow.
    team().for_each_chunk(&mut out_t, t, |r, col| {
        let row = &blocks[r * nb..(r + 1) * nb];
        match &acts {
            Some(acts) => {
                for (c, tile) in col.chunks_mut(TILE).enumerate() {
                    row_dots(row, acts, c * TILE, tile, kernel);
                }
            }
            None => {
                for (b, blk) in row.iter().enumerate() {
                    let w = blk.unpack_f32();
                    for (ti, o) in col.iter_mut().enumerate() {
                        *o += dot(&w, &x[ti * k + 32 * b..][..32]);
                    }
                }
            }
        }
    });
    transpose(&out_t, t, n)
}

/// [`block_matmul`] for the grouped layout: [`packed::Packed::matmul`] (AVX-512 VNNI) for
/// [`Precision::Int8`]; with [`Precision::F32`] the blocks are unpacked row by row.
pub(super) fn packed_matmul<B: IntBlock>(
    p: &packed::Packed<B>,
    x: &[f32],
    [t, k, n]: [usize; 3],
    precision: Precision,
) -> Vec<f32> {
    debug_assert_eq!(n, p.rows());
    if precision == Precision::Int8 {
        return p.matmul(&quantize_acts(x), t);
    }
    let nb = k / 32;
    let mut out_t = vec![0.0f32; n * t];
    team().for_each_chunk(&mut out_t, t, |r, col| {
        for b in 0..nb {
            let w = p.block(r, b).unpack_f32();
            for (ti, o) in col.iter_mut().enumerate() {
                *o += dot(&w, &x[ti * k + 32 * b..][..32]);
            }
        }
    });
    transpose(&out_t, t, n)
}

/// A weight matrix, row-major `[out][in]` as PyTorch's Linear: f32, or the GGUF file's
/// 32-value blocks (Q4_0/Q4_1, Q8_0), multiplied in
/// integers against 8-bit activations as llama.cpp does ([`block_matmul`]).
pub(super) enum Weight {
    F32(Vec<f32>),
    Q4(Vec<Q4>),
    Q8(Vec<Q8>),
    /// Q4 blocks in the grouped layout of the AVX-512 VNNI kernels.
    P4(packed::Packed<Q4>),
    /// Q8 blocks likewise.
    P8(packed::Packed<Q8>),
}

impl Weight {
    /// Reads a GGUF block tensor's bytes (Q4_0, Q4_1 or Q8_0); `None` for other types,
    /// and for a Q4_0 tensor with a scale whose `-8 d` leaves f16's range (none in
    /// practice), which then load as f32.
    pub(super) fn from_blocks(ty: crate::gguf::GgmlType, data: &[u8]) -> Option<Weight> {
        use crate::gguf::GgmlType;
        let bits = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let size = if ty == GgmlType::Q4_0 { 18 } else { 20 };
                data.chunks_exact(size)
                    .map(|b| {
                        let d = bits(b, 0);
                        let (m, qs) = if ty == GgmlType::Q4_0 {
                            // Times a power of two: exact unless it overflows.
                            let m = half::f16::from_f32(-8.0 * f32_of(d));
                            (m.is_finite().then_some(m.to_bits())?, &b[2..18])
                        } else {
                            (bits(b, 2), &b[4..20])
                        };
                        let mut q = [0u8; 16];
                        q.copy_from_slice(qs);
                        Some(Q4 { dm: [d, m], qs: q })
                    })
                    .collect::<Option<Vec<_>>>()
                    .map(Weight::Q4)
            }
            GgmlType::Q8_0 => Some(Weight::Q8(
                data.chunks_exact(34)
                    .map(|b| {
                        let mut q = [0i8; 32];
                        for (o, &v) in q.iter_mut().zip(&b[2..34]) {
                            *o = v as i8;
                        }
                        Q8 {
                            d: bits(b, 0),
                            qs: q,
                        }
                    })
                    .collect(),
            )),
            _ => None,
        }
    }

    /// `out[t][n] = sum_k x[t][k] w[n][k]`.
    pub(super) fn matmul(
        &self,
        x: &[f32],
        t: usize,
        k: usize,
        n: usize,
        precision: Precision,
    ) -> Vec<f32> {
        if t == 0 || n == 0 {
            return Vec::new();
        }
        match self {
            Weight::F32(w) => matmul(x, w, t, k, n),
            Weight::Q4(blocks) => block_matmul(blocks, x, [t, k, n], precision),
            Weight::Q8(blocks) => block_matmul(blocks, x, [t, k, n], precision),
            Weight::P4(p) => packed_matmul(p, x, [t, k, n], precision),
            Weight::P8(p) => packed_matmul(p, x, [t, k, n], precision),
        }
    }

    /// The grouped layout where this CPU has its kernels (`k` inputs a row).
    pub(super) fn packed_for_cpu(self, k: usize) -> Weight {
        let nb = k / 32;
        if !packed::available() || nb == 0 {
            return self;
        }
        match self {
            Weight::Q4(b) => Weight::P4(packed::Packed::new(&b, b.len() / nb, nb)),
            Weight::Q8(b) => Weight::P8(packed::Packed::new(&b, b.len() / nb, nb)),
            w => w,
        }
    }

    /// Row `i` (`k` wide) as f32 (the embedding gather).
    pub(super) fn row(&self, i: usize, k: usize) -> Vec<f32> {
        let nb = k / 32;
        match self {
            Weight::F32(w) => w[i * k..(i + 1) * k].to_vec(),
            Weight::Q4(blocks) => blocks[i * nb..(i + 1) * nb]
                .iter()
                .flat_map(Q4::unpack)
                .collect(),
            Weight::Q8(blocks) => blocks[i * nb..(i + 1) * nb]
                .iter()
                .flat_map(Q8::unpack)
                .collect(),
            Weight::P4(p) => (0..nb).flat_map(|b| p.block(i, b).unpack()).collect(),
            Weight::P8(p) => (0..nb).flat_map(|b| p.block(i, b).unpack()).collect(),
        }
    }
}

/// `out[t][n] = sum_k x[t][k] w[n][k]` for `t` rows of `k` inputs and `n` outputs, the
/// output rows split over the threads.
pub(super) fn matmul(x: &[f32], w: &[f32], t: usize, k: usize, n: usize) -> Vec<f32> {
    if t == 0 || n == 0 {
        return Vec::new();
    }
    // Output-major so that each thread owns whole weight rows (read once per step).
    let mut out_t = vec![0.0f32; n * t];
    team().for_each_chunk(&mut out_t, t, |r, col| {
        let wr = &w[r * k..(r + 1) * k];
        for (ti, o) in col.iter_mut().enumerate() {
            *o = dot(&x[ti * k..(ti + 1) * k], wr);
        }
    });
    transpose(&out_t, t, n)
}

/// `[n][t]` to `[t][n]`.
pub(super) fn transpose(out_t: &[f32], t: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; t * n];
    for (ni, col) in out_t.chunks(t).enumerate() {
        for (ti, v) in col.iter().enumerate() {
            out[ti * n + ni] = *v;
        }
    }
    out
}

/// Dot product with eight independent accumulators over exact chunks of eight, which the
/// compiler turns into SIMD without bounds checks.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    acc.iter().sum::<f32>() + tail
}
