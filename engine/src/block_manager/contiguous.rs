//! The contiguous allocator (`kv_allocator = "contiguous"`, before PagedAttention): each
//! sequence holds one run of consecutive blocks, first fit, grown in place or moved when
//! its neighbour is taken; kept as a baseline so that fragmentation is shown, not asserted.

use super::*;

impl BlockManager {
    /// Longest run of free blocks (all free blocks when paged: any of them will do).
    pub fn largest_free_run(&self) -> u32 {
        match &self.extents {
            Some(e) => e.values().copied().max().unwrap_or(0),
            None => self.num_free(),
        }
    }

    /// Takes `n` free blocks as one run: starting right after `after` (growing a run in
    /// place), or first-fit anywhere. `None` (and no change) if no run fits.
    pub(super) fn take_run(&mut self, n: u32, after: Option<u32>) -> Option<Vec<u32>> {
        let extents = self.extents.as_mut()?;
        let start = match after {
            Some(last) => {
                let s = last.checked_add(1)?;
                (extents.get(&s).copied()? >= n).then_some(s)?
            }
            None => extents.iter().find(|(_, &len)| len >= n).map(|(&s, _)| s)?,
        };
        let len = extents.remove(&start)?;
        if len > n {
            extents.insert(start + n, len - n);
        }
        self.extent_free -= n;
        for b in start..start + n {
            self.ref_counts[b as usize] = 1;
        }
        self.used += n;
        Some((start..start + n).collect())
    }

    /// Returns block `b` to the contiguous allocator's extents, merging neighbours.
    pub(super) fn release_extent(&mut self, b: u32) {
        let Some(extents) = self.extents.as_mut() else {
            return;
        };
        let (mut start, mut len) = (b, 1);
        if let Some((&s, &l)) = extents.range(..b).next_back() {
            if s + l == b {
                extents.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = extents.remove(&(b + 1)) {
            len += l;
        }
        extents.insert(start, len);
        self.extent_free += 1;
    }

    /// Contiguous allocator: moves `seq` to a new run of `want` blocks, copying its blocks
    /// there (the old ones are freed once the step's copies have read them). False (and no
    /// change) if no run is long enough.
    pub(super) fn relocate(
        &mut self,
        seq: SeqId,
        want: usize,
        copies: &mut Vec<(u32, u32)>,
    ) -> bool {
        let Some(run) = self.take_run(want as u32, None) else {
            return false;
        };
        let old = self.tables.insert(seq, run.clone()).unwrap_or_default();
        for (&src, &dst) in old.iter().zip(&run) {
            copies.push((src, dst));
            self.copy_sources.push(src);
        }
        for &b in old.iter().rev() {
            self.unref(b);
        }
        true
    }
}
