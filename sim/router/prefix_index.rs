//! The router's estimate of what each replica caches (llm-d's approximate prefix-cache
//! scorer): the prompts it sent to a replica, hashed in chained blocks of its own size,
//! remembered in a bounded LRU per replica. In: a routed prompt's tokens and its replica.
//! Out: per replica, how many of a new prompt's leading blocks it is believed to hold.
//! It never hears of evictions, so it can be wrong, as the real one is.
//!
//! A reverse map (block hash -> replicas holding it) makes a lookup cost the prompt's
//! blocks times the holders, not the blocks times every replica.

use engine::request::Request;
use lru::LruCache;
use rustc_hash::FxHashMap;

use crate::scenario::cluster::PrefixIndexConfig;

/// Block hashes per replica, and who holds each hash.
pub struct PrefixIndex {
    cfg: PrefixIndexConfig,
    lrus: Vec<LruCache<u64, ()>>,
    holders: FxHashMap<u64, Vec<u32>>,
}

impl PrefixIndex {
    /// An empty index over `replicas` replicas.
    pub fn new(cfg: PrefixIndexConfig, replicas: usize) -> Self {
        PrefixIndex {
            cfg,
            // Grown as blocks come, bounded by hand (a preallocated LRU would take
            // `blocks_per_replica` entries per replica up front).
            lrus: (0..replicas).map(|_| LruCache::unbounded()).collect(),
            holders: FxHashMap::default(),
        }
    }

    /// The chained hashes of the leading full blocks of `req`'s prompt (at most
    /// `max_blocks`); empty when the request carries no token ids.
    pub fn hashes(&self, req: &Request) -> Vec<u64> {
        let bs = self.cfg.block_size as usize;
        let n = req
            .prompt_tokens
            .len()
            .min(bs * self.cfg.max_blocks as usize);
        engine::prefix::block_hashes(&req.prompt_tokens[..n], self.cfg.block_size)
    }

    /// Per replica, the leading blocks of `hashes` it is believed to hold.
    pub fn matches(&self, hashes: &[u64], out: &mut [u32]) {
        out.fill(0);
        let mut alive: Vec<u32> = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            let Some(hs) = self.holders.get(h) else {
                break;
            };
            if i == 0 {
                alive.extend_from_slice(hs);
            } else {
                alive.retain(|r| hs.contains(r));
            }
            if alive.is_empty() {
                break;
            }
            for &r in &alive {
                if let Some(m) = out.get_mut(r as usize) {
                    *m = i as u32 + 1;
                }
            }
        }
    }

    /// `replica` was sent a prompt with `hashes`: it now holds them, the leading blocks the
    /// most recent (a prefix is only useful whole, so its tail goes first); blocks pushed
    /// out of its LRU leave it.
    pub fn insert(&mut self, replica: usize, hashes: &[u64]) {
        let cap = self.cfg.blocks_per_replica as usize;
        let Some(lru) = self.lrus.get_mut(replica) else {
            return;
        };
        let r = replica as u32;
        for &h in hashes.iter().rev() {
            if lru.push(h, ()).is_none() {
                self.holders.entry(h).or_default().push(r);
            }
            if lru.len() > cap {
                if let Some((old, ())) = lru.pop_lru() {
                    if let Some(hs) = self.holders.get_mut(&old) {
                        hs.retain(|&x| x != r);
                        if hs.is_empty() {
                            self.holders.remove(&old);
                        }
                    }
                }
            }
        }
    }

    /// Tokens per hashed block.
    pub fn block_size(&self) -> u32 {
        self.cfg.block_size
    }

    /// Blocks remembered for `replica`.
    #[cfg(test)]
    fn len(&self, replica: usize) -> usize {
        self.lrus.get(replica).map_or(0, LruCache::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(cap: u32) -> PrefixIndex {
        PrefixIndex::new(
            PrefixIndexConfig {
                block_size: 2,
                blocks_per_replica: cap,
                max_blocks: 8,
            },
            3,
        )
    }

    #[test]
    fn matches_are_leading_blocks_per_replica() {
        let mut ix = index(100);
        let req = |t: &[u32]| Request::new(0, 0, 1, 1).with_tokens(t.to_vec());
        let a = ix.hashes(&req(&[1, 2, 3, 4, 5, 6]));
        assert_eq!(a.len(), 3);
        ix.insert(0, &a);
        ix.insert(1, &a[..1]);
        let mut out = [0; 3];
        ix.matches(&ix.hashes(&req(&[1, 2, 3, 4, 9, 9, 9])), &mut out);
        assert_eq!(out, [2, 1, 0]);
        // A differing first block matches nothing, whatever follows.
        ix.matches(&ix.hashes(&req(&[0, 2, 3, 4])), &mut out);
        assert_eq!(out, [0, 0, 0]);
        // At most max_blocks are hashed.
        let long: Vec<u32> = (0..100).collect();
        assert_eq!(ix.hashes(&req(&long)).len(), 8);
    }

    #[test]
    fn the_lru_bounds_each_replica_and_forgets_holders() {
        let mut ix = index(2);
        let h = ix.hashes(&Request::new(0, 0, 1, 1).with_tokens((0..8).collect()));
        ix.insert(2, &h);
        assert_eq!(ix.len(2), 2);
        let mut out = [0; 3];
        // The tail was pushed out: the two leading blocks still match.
        ix.matches(&h, &mut out);
        assert_eq!(out, [0, 0, 2]);
        assert_eq!(ix.holders.len(), 2);
    }
}
