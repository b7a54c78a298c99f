//! Checks and measurements that need a GPU (`sim cuda-check`, `sim cuda-bench`).
//!
//! The attention check follows the method of the lent-GPU notes: fresh random inputs for
//! every case, an output poisoned before the run (so an unwritten element shows), a float64
//! reference on the host, and the relative error ‖out − ref‖ / ‖ref‖. The benchmarks report
//! each time as a ratio to its floor: bytes over the measured HBM bandwidth, or FLOPs over
//! the measured bf16 GEMM rate.

mod attention;
mod bench;
mod oracle;
mod runtime;

pub use attention::*;
pub use bench::*;
pub use oracle::*;
pub use runtime::*;

/// SplitMix64: a small deterministic generator for test inputs.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / 16_777_216.0) * 2.0 - 1.0
    }

    /// Uniform integer in [lo, hi].
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }
}
