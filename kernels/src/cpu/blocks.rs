//! The GGUF's weight blocks as the CPU runtime keeps them ([`Q4`] for Q4_0/Q4_1, [`Q8`]
//! for Q8_0, at the file's size), their integer dot products with 8-bit activations
//! ([`IntBlock`], [`quantize_acts`], llama.cpp's Q8_1 rounding), and unpacking to f32.

/// A 4-bit block of 32 weights as the file's Q4_1 (20 bytes: decode is bound by memory
/// traffic, so the scales stay f16): value = q * d + m (a Q4_0 block is stored with m =
/// -8 d, exact in f16); nibble i of byte j is weight j (low) or j + 16 (high).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub(super) struct Q4 {
    /// `d` and `m`, f16 bits.
    pub(super) dm: [u16; 2],
    pub(super) qs: [u8; 16],
}

/// An 8-bit block of 32 weights as the file's Q8_0 (34 bytes): value = q * d.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub(super) struct Q8 {
    /// f16 bits.
    pub(super) d: u16,
    pub(super) qs: [i8; 32],
}

pub(super) fn f32_of(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// A step's activations rounded to 8 bits per 32-value block, as llama.cpp's Q8_1: block
/// `i` (token-major) has scale `d[i]`, values `q[32 i..32 i + 32]` and `s[i] = d[i] *
/// sum(q)` (both rounded to f16, as llama.cpp stores them). Each token is rounded on its own, so a sequence's numbers do not depend on
/// the rest of the batch.
pub(super) struct QuantActs {
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    pub(super) q: Vec<i8>,
    /// `sum(q)` of each block, exact.
    pub(super) sum: Vec<i32>,
}

pub(super) fn quantize_acts(x: &[f32]) -> QuantActs {
    let n = x.len() / 32;
    let mut out = QuantActs {
        d: Vec::with_capacity(n),
        s: Vec::with_capacity(n),
        q: Vec::with_capacity(32 * n),
        sum: Vec::with_capacity(n),
    };
    for c in x.chunks_exact(32) {
        let amax = c.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for &v in c {
            let q = (v * id).round() as i8;
            sum += i32::from(q);
            out.q.push(q);
        }
        // llama.cpp keeps both in f16 (block_q8_1's d and s).
        let f16 = |v: f32| half::f16::from_f32(v).to_f32();
        out.d.push(f16(d));
        out.s.push(f16(d * sum as f32));
        out.sum.push(sum);
    }
    out
}

/// A block format multiplied in integers by 8-bit activations: the scalar product (the
/// reference, and the path of CPUs without AVX2), and the operands of the AVX2 kernels.
pub(super) trait IntBlock: Sized + Sync {
    /// Whether blocks have an offset `m` (whose share is `m` times the activations' sum).
    const OFFSET: bool;
    /// 64-byte lines a block of sixteen rows takes in the grouped layout
    /// ([`packed`]).
    const LINES: usize;
    /// What the grouped layout adds to each value to make it unsigned.
    const BIAS: i32;
    /// The grouped layout's bytes of a zero value (padding rows).
    const ZERO_BYTES: [u8; 4];
    /// `(d, m)` as f16 bits.
    fn scale_parts(&self) -> (u16, u16);
    /// The four bytes of line `k` in the grouped layout (values that pair with
    /// activations `4k..4k+4`).
    fn line_bytes(&self, k: usize) -> [u8; 4];
    /// The block back from [`IntBlock::scale_parts`] and its lines.
    fn from_parts(d: u16, m: u16, line: impl Fn(usize) -> [u8; 4]) -> Self;
    /// `sum_j q_j x_j` over the block's 32 values.
    fn idot(&self, x: &[i8]) -> i32;
    /// `(d, m)`: the block's value is `d * q + m`.
    fn scales(&self) -> (f32, f32);
    /// `d` and `m` as f16 bits in the low and high half (for the SIMD conversion).
    fn scale_bits(&self) -> i32;
    /// The 32 weights in f32.
    fn unpack_f32(&self) -> [f32; 32];
    /// The weights as 32 bytes, once per block (shared by the tokens of a tile).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn lanes(&self) -> std::arch::x86_64::__m256i;
    /// Unsigned and signed bytes whose pairwise products are `q_j x_j` (`maddubs`
    /// multiplies unsigned by signed).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn operands(
        w: std::arch::x86_64::__m256i,
        x: std::arch::x86_64::__m256i,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i);
}

impl IntBlock for Q4 {
    const OFFSET: bool = true;
    const LINES: usize = 4;
    const BIAS: i32 = 0;
    const ZERO_BYTES: [u8; 4] = [0; 4];
    fn scale_parts(&self) -> (u16, u16) {
        (self.dm[0], self.dm[1])
    }
    fn line_bytes(&self, k: usize) -> [u8; 4] {
        // Byte j holds value j (low nibble) and j + 16 (high): line k's bytes 4k..4k+4
        // pair with activations 4k.. and 16 + 4k...
        [
            self.qs[4 * k],
            self.qs[4 * k + 1],
            self.qs[4 * k + 2],
            self.qs[4 * k + 3],
        ]
    }
    fn from_parts(d: u16, m: u16, line: impl Fn(usize) -> [u8; 4]) -> Q4 {
        let mut qs = [0u8; 16];
        for (k, c) in qs.chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&line(k));
        }
        Q4 { dm: [d, m], qs }
    }
    fn idot(&self, x: &[i8]) -> i32 {
        (0..16)
            .map(|j| {
                i32::from(self.qs[j] & 0x0f) * i32::from(x[j])
                    + i32::from(self.qs[j] >> 4) * i32::from(x[j + 16])
            })
            .sum()
    }
    fn scales(&self) -> (f32, f32) {
        (f32_of(self.dm[0]), f32_of(self.dm[1]))
    }
    fn scale_bits(&self) -> i32 {
        (u32::from(self.dm[0]) | u32::from(self.dm[1]) << 16) as i32
    }
    fn unpack_f32(&self) -> [f32; 32] {
        self.unpack()
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // Low nibbles are values 0-15, high nibbles 16-31.
        let bytes = _mm_loadu_si128(self.qs.as_ptr().cast());
        let mask = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(bytes, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
        _mm256_set_m128i(hi, lo)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn operands(
        w: std::arch::x86_64::__m256i,
        x: std::arch::x86_64::__m256i,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
        // Nibbles are unsigned already; 15 x 127 x 2 fits maddubs' i16.
        (w, x)
    }
}

impl IntBlock for Q8 {
    const OFFSET: bool = false;
    const LINES: usize = 8;
    const BIAS: i32 = 128;
    const ZERO_BYTES: [u8; 4] = [0x80; 4];
    fn scale_parts(&self) -> (u16, u16) {
        (self.d, 0)
    }
    fn line_bytes(&self, k: usize) -> [u8; 4] {
        std::array::from_fn(|j| (self.qs[4 * k + j] as u8) ^ 0x80)
    }
    fn from_parts(d: u16, _m: u16, line: impl Fn(usize) -> [u8; 4]) -> Q8 {
        let mut qs = [0i8; 32];
        for (k, c) in qs.chunks_exact_mut(4).enumerate() {
            for (o, b) in c.iter_mut().zip(line(k)) {
                *o = (b ^ 0x80) as i8;
            }
        }
        Q8 { d, qs }
    }
    fn idot(&self, x: &[i8]) -> i32 {
        self.qs
            .iter()
            .zip(&x[..32])
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum()
    }
    fn scales(&self) -> (f32, f32) {
        (f32_of(self.d), 0.0)
    }
    fn scale_bits(&self) -> i32 {
        i32::from(self.d)
    }
    fn unpack_f32(&self) -> [f32; 32] {
        self.unpack()
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes(&self) -> std::arch::x86_64::__m256i {
        std::arch::x86_64::_mm256_loadu_si256(self.qs.as_ptr().cast())
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn operands(
        w: std::arch::x86_64::__m256i,
        x: std::arch::x86_64::__m256i,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
        use std::arch::x86_64::*;
        // |w| times x with w's sign; x never holds -128 (whose negation overflows), as
        // [`quantize_acts`] rounds to +-127.
        (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    }
}

impl Q4 {
    pub(super) fn unpack(&self) -> [f32; 32] {
        let (d, m) = self.scales();
        let mut w = [0.0f32; 32];
        for j in 0..16 {
            w[j] = f32::from(self.qs[j] & 0x0f) * d + m;
            w[j + 16] = f32::from(self.qs[j] >> 4) * d + m;
        }
        w
    }
}

impl Q8 {
    pub(super) fn unpack(&self) -> [f32; 32] {
        let d = f32_of(self.d);
        self.qs.map(|q| f32::from(q) * d)
    }
}
