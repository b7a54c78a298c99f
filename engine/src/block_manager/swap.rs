//! Preemption: a victim's blocks are freed (recompute) or copied to the CPU swap pool
//! over PCIe (swap), and a swapped sequence's blocks come back when it is resumed.

use super::*;

impl BlockManager {
    /// Preempts `seq`: swaps its blocks out when the CPU pool has room for all of them
    /// (the copies go in `resp.swap_out`), then frees its GPU blocks. Without room or
    /// without a pool the KV is dropped and the sequence will recompute it.
    pub(super) fn preempt(&mut self, seq: SeqId, resp: &mut ReserveResponse) {
        self.lookahead.remove(&seq);
        let n = self.table(seq).len();
        // Copy-on-write copies planned for this sequence earlier in the step are dropped:
        // their destination holds nothing yet, so a swap reads the source instead.
        let mut pending: FxHashMap<u32, u32> = FxHashMap::default();
        if !resp.block_copies.is_empty() {
            let table = self.table(seq);
            let side = self.side_tables(seq);
            resp.block_copies.retain(|&(src, dst)| {
                let mine = table.contains(&dst) || side.iter().any(|t| t.contains(&dst));
                if mine {
                    pending.insert(dst, src);
                }
                !mine
            });
        }
        let mut dst = Vec::new();
        let live = self.table(seq).iter().filter(|&&b| b != NULL_BLOCK).count();
        // A hybrid layout's sequences recompute (vLLM V1 does not swap).
        let swappable = self.side.is_empty();
        if let (Some(cpu), Some(table)) = (&mut self.cpu, self.tables.get(&seq)) {
            if swappable && live > 0 && live <= cpu.free.len() {
                dst.reserve(n);
                for &g in table {
                    if g == NULL_BLOCK {
                        // Out of the window: nothing to keep.
                        dst.push(NULL_BLOCK);
                        continue;
                    }
                    let Some(c) = cpu.free.pop() else { break };
                    resp.swap_out
                        .push((pending.get(&g).copied().unwrap_or(g), c));
                    dst.push(c);
                }
            }
        }
        self.free(seq);
        let swapped = !dst.is_empty();
        if let (Some(cpu), true) = (&mut self.cpu, swapped) {
            cpu.tables.insert(seq, dst);
        }
        if swapped {
            resp.swapped.push(seq);
        } else if let Some(p) = self.policy.as_mut() {
            // A recomputing sequence will look its prefix up again.
            p.on_preempted(seq);
        }
    }

    /// Swaps `seq` back in: takes GPU blocks for its swapped table, grown to cover `slots`,
    /// and lists the copies in `resp.swap_in`. False (and no change) if they do not fit.
    pub(super) fn try_swap_in(
        &mut self,
        seq: SeqId,
        slots: u32,
        resp: &mut ReserveResponse,
    ) -> bool {
        let Some(src) = self.cpu.as_ref().and_then(|c| c.tables.get(&seq)) else {
            return false;
        };
        let (n, nulls) = (src.len(), src.iter().filter(|&&c| c == NULL_BLOCK).count());
        let want = (self.blocks_for(slots) as usize).max(n);
        if want - nulls > self.num_free() as usize {
            return false;
        }
        let Some(src) = self.cpu.as_mut().and_then(|c| c.tables.remove(&seq)) else {
            return false;
        };
        let mut table = Vec::with_capacity(want);
        for i in 0..want {
            if src.get(i) == Some(&NULL_BLOCK) {
                table.push(NULL_BLOCK);
                continue;
            }
            // `want - nulls` blocks are free: checked above.
            let Some(b) = self.take_block() else { break };
            if let Some(&c) = src.get(i) {
                resp.swap_in.push((c, b));
            }
            table.push(b);
        }
        if let Some(cpu) = self.cpu.as_mut() {
            cpu.released
                .extend(src.iter().rev().filter(|&&c| c != NULL_BLOCK));
        }
        self.tables.insert(seq, table);
        true
    }
}
