//! Seeded random streams, one per purpose (arrivals, class choice, each class's lengths,
//! each generator's draws): a `ChaCha8Rng` seeded from `(seed, purpose)` through SplitMix64,
//! so a draw added in one stream never shifts another; and [`synthetic_token`], the fixed
//! hash that gives generated prompts token ids without storing any.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// One step of SplitMix64 (Steele, Lea, Flood 2014) on `x`.
pub(super) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Purpose of the arrival stream.
pub(super) const PURPOSE_ARRIVALS: u64 = 1;
/// Purpose of the class-choice stream.
pub(super) const PURPOSE_CLASS: u64 = 2;

/// Purpose of the prompt-length (or joint-length) stream of class `i`.
pub(super) fn purpose_prompt(i: usize) -> u64 {
    0x1_0000 + 2 * i as u64
}

/// Purpose of the output-length stream of class `i`.
pub(super) fn purpose_output(i: usize) -> u64 {
    0x1_0000 + 2 * i as u64 + 1
}

/// Purpose of the stream that picks class `i`'s prompt pool entries (above every other
/// class-indexed purpose: classes number at most 65,536).
pub(super) fn purpose_pool(i: usize) -> u64 {
    0x10_0000 + i as u64
}

/// A generator for `purpose`, independent of every other purpose under the same seed.
pub fn stream(seed: u64, purpose: u64) -> ChaCha8Rng {
    let mut state = splitmix64(seed) ^ splitmix64(purpose.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut key = [0u8; 32];
    for chunk in key.chunks_exact_mut(8) {
        state = splitmix64(state);
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// Token `j` of a synthetic prompt part: a fixed hash of (`a`, `b`, `j`) into a 32,000-token
/// vocabulary, so equal parts share tokens without storing any.
pub fn synthetic_token(a: u64, b: u64, j: u32) -> u32 {
    (splitmix64(
        splitmix64(a ^ 0x5EED)
            .wrapping_add(b)
            .wrapping_mul(0x1_0000_0001)
            ^ u64::from(j),
    ) % 32_000) as u32
}
