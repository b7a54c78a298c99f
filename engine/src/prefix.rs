//! Chained block hashes for prefix caching (DESIGN §5): the hash of a full block covers its
//! parent's hash and its own token ids, so equal hashes mean equal prefixes and a cache hit
//! is always a contiguous prefix of full blocks.

/// One step of the chain: mixes `parent` with the block's `tokens` (64-bit, deterministic
/// across runs and machines; collisions are negligible at simulator scales).
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = parent ^ 0x9E37_79B9_7F4A_7C15;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01B3);
        h ^= h >> 29;
    }
    // Final avalanche (SplitMix64's).
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// Hashes of the full `block_size`-token blocks of `tokens`, chained from the first.
pub fn block_hashes(tokens: &[u32], block_size: u32) -> Vec<u64> {
    let mut parent = 0u64;
    tokens
        .chunks_exact(block_size.max(1) as usize)
        .map(|b| {
            parent = chain_hash(parent, b);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_equal_hashes() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[20] = 999; // differs in the second block of 16
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        assert_eq!(ha.len(), 2); // full blocks only
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // Chained: the same block after a different parent hashes differently.
        assert_ne!(chain_hash(1, &a[..16]), chain_hash(2, &a[..16]));
    }
}
