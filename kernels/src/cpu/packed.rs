//! Block weights regrouped sixteen rows at a time for AVX-512 VNNI (llama.cpp repacks
//! for its SIMD kernels too). One `vpdpbusd` multiplies four activation bytes of a token
//! by the same four inputs of sixteen rows and adds them into sixteen i32 lanes, so a
//! 32-value block of sixteen rows costs eight instructions and no horizontal sum; the
//! scales of the sixteen rows are one f16 vector.
//!
//! Layout per (group of 16 rows, block): 16 f16 scales `d`, for 4-bit blocks 16 f16
//! offsets `m`, and [`IntBlock::LINES`] 64-byte lines of values: line `k` holds, for
//! each row `r`, at bytes `4r..4r+4`, the values that pair with activations `4k..4k+4`
//! ([`IntBlock::line_bytes`]). Rows past the matrix's last (a partial last group) are
//! zero. The bytes per block are the file's (20 for Q4_1, 34 for Q8_0).

use super::{IntBlock, QuantActs};

/// Rows a group.
pub(super) const GROUP: usize = 16;

/// One 64-byte line of a group's values.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub(super) [u8; 64]);

/// A block matrix in the grouped layout.
pub(super) struct Packed<B> {
    rows: usize,
    nb: usize,
    /// `[group][block][row]` f16 bits.
    d: Vec<u16>,
    /// Offsets `m`, as `d` (empty for blocks without one).
    m: Vec<u16>,
    /// `[group][block][line]`.
    lines: Vec<Line>,
    _block: std::marker::PhantomData<B>,
}

/// Whether this CPU runs the grouped kernels.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::isa_cap() >= 2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl<B: IntBlock> Packed<B> {
    /// Regroups row-major blocks (`rows` rows of `nb` blocks).
    pub(super) fn new(blocks: &[B], rows: usize, nb: usize) -> Packed<B> {
        let groups = rows.div_ceil(GROUP);
        let mut p = Packed {
            rows,
            nb,
            d: vec![0; groups * nb * GROUP],
            m: if B::OFFSET {
                vec![0; groups * nb * GROUP]
            } else {
                Vec::new()
            },
            lines: vec![Line([0; 64]); groups * nb * B::LINES],
            _block: std::marker::PhantomData,
        };
        for (r, row) in blocks.chunks_exact(nb).take(rows).enumerate() {
            let (g, lane) = (r / GROUP, r % GROUP);
            for (b, blk) in row.iter().enumerate() {
                let gb = g * nb + b;
                let (d, m) = blk.scale_parts();
                p.d[gb * GROUP + lane] = d;
                if B::OFFSET {
                    p.m[gb * GROUP + lane] = m;
                }
                for k in 0..B::LINES {
                    p.lines[gb * B::LINES + k].0[4 * lane..4 * lane + 4]
                        .copy_from_slice(&blk.line_bytes(k));
                }
            }
        }
        // Padding rows: values that multiply to zero.
        for g in rows / GROUP..groups {
            for lane in rows % GROUP..GROUP {
                for b in 0..nb {
                    for k in 0..B::LINES {
                        p.lines[(g * nb + b) * B::LINES + k].0[4 * lane..4 * lane + 4]
                            .copy_from_slice(&B::ZERO_BYTES);
                    }
                }
            }
        }
        p
    }

    /// Block `b` of row `r`, as the file stored it.
    pub(super) fn block(&self, r: usize, b: usize) -> B {
        debug_assert!(r < self.rows && b < self.nb);
        let (g, lane) = (r / GROUP, r % GROUP);
        let gb = g * self.nb + b;
        let m = if B::OFFSET {
            self.m[gb * GROUP + lane]
        } else {
            0
        };
        B::from_parts(self.d[gb * GROUP + lane], m, |k| {
            let line = &self.lines[gb * B::LINES + k].0;
            [
                line[4 * lane],
                line[4 * lane + 1],
                line[4 * lane + 2],
                line[4 * lane + 3],
            ]
        })
    }

    /// Rows of the matrix.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// `out[t][n]` for `t` tokens of 8-bit activations: groups split over the threads,
    /// tokens in tiles of [`super::TILE`] per group.
    pub(super) fn matmul(&self, acts: &QuantActs, t: usize) -> Vec<f32> {
        let (n, groups) = (self.rows, self.rows.div_ceil(GROUP));
        // `[group][token][lane]`, scattered to `[token][row]` below; each member streams
        // a contiguous stretch of groups, which the prefetchers follow.
        let mut by_group = vec![0.0f32; groups * t * GROUP];
        super::team().for_each_chunk(&mut by_group, t * GROUP, |g, out| {
            for (c, tile) in out.chunks_mut(super::TILE * GROUP).enumerate() {
                self.group(g, acts, c * super::TILE, tile);
            }
        });
        let mut out = vec![0.0f32; t * n];
        for (g, block) in by_group.chunks(t * GROUP).enumerate() {
            let lanes = GROUP.min(n - g * GROUP);
            for (ti, vals) in block.chunks(GROUP).enumerate() {
                out[ti * n + g * GROUP..][..lanes].copy_from_slice(&vals[..lanes]);
            }
        }
        out
    }

    /// Group `g` against `out.len() / 16` tokens from `t0`.
    fn group(&self, g: usize, acts: &QuantActs, t0: usize, out: &mut [f32]) {
        let tokens = out.len() / GROUP;
        assert!(
            available()
                && (1..=super::TILE).contains(&tokens)
                && g < self.rows.div_ceil(GROUP)
                && (t0 + tokens) * self.nb <= acts.d.len()
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected and the tokens are in `acts` (asserted).
        unsafe {
            match tokens {
                1 => vnni::group::<B, 1>(self, g, acts, t0, out),
                2 => vnni::group::<B, 2>(self, g, acts, t0, out),
                3 => vnni::group::<B, 3>(self, g, acts, t0, out),
                _ => vnni::group::<B, { super::TILE }>(self, g, acts, t0, out),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{IntBlock, Packed, QuantActs, GROUP};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have AVX-512 F, BW and VNNI; `acts` must hold tokens `t0..t0 + N`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn group<B: IntBlock, const N: usize>(
        p: &Packed<B>,
        g: usize,
        acts: &QuantActs,
        t0: usize,
        out: &mut [f32],
    ) {
        let nb = p.nb;
        let (q, dx, sx, qsum) = (
            acts.q.as_ptr(),
            acts.d.as_ptr(),
            acts.s.as_ptr(),
            acts.sum.as_ptr(),
        );
        let nibble = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let gb = g * nb + b;
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.d.as_ptr().add(gb * GROUP).cast()));
            let m = if B::OFFSET {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.m.as_ptr().add(gb * GROUP).cast()))
            } else {
                _mm512_setzero_ps()
            };
            let lines = p.lines.as_ptr().add(gb * B::LINES).cast::<__m512i>();
            // Eight vectors: vector k pairs with activations 4k..4k+4 (a 4-bit line
            // holds inputs 4k.. in its low nibbles and 16+4k.. in its high ones).
            let mut w = [_mm512_setzero_si512(); 8];
            if B::LINES == 4 {
                for k in 0..4 {
                    let v = _mm512_load_si512(lines.add(k));
                    w[k] = _mm512_and_si512(v, nibble);
                    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
                }
            } else {
                for (k, wk) in w.iter_mut().enumerate() {
                    *wk = _mm512_load_si512(lines.add(k));
                }
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let i = (t0 + j) * nb + b;
                let x = q.add(32 * i).cast::<i32>();
                // Two chains, for the instruction's latency.
                let (mut a0, mut a1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for k in (0..8).step_by(2) {
                    a0 =
                        _mm512_dpbusd_epi32(a0, w[k], _mm512_set1_epi32(x.add(k).read_unaligned()));
                    a1 = _mm512_dpbusd_epi32(
                        a1,
                        w[k + 1],
                        _mm512_set1_epi32(x.add(k + 1).read_unaligned()),
                    );
                }
                let mut a = _mm512_add_epi32(a0, a1);
                if B::BIAS != 0 {
                    // 8-bit values are stored plus 128 (the instruction's first operand
                    // is unsigned): take 128 times the activations' sum back.
                    a = _mm512_sub_epi32(a, _mm512_set1_epi32(B::BIAS * *qsum.add(i)));
                }
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(*dx.add(i)));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), scale, *acc);
                if B::OFFSET {
                    *acc = _mm512_fmadd_ps(m, _mm512_set1_ps(*sx.add(i)), *acc);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out[j * GROUP..][..GROUP].as_mut_ptr(), *acc);
        }
    }
}
