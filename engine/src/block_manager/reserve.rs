//! [`BlockManager::reserve`]: one step's reservation, granting the scheduler's entries in
//! order (growing running sequences, admitting waiting ones under the admission reserve
//! and the watermark), preempting victims when blocks run out.

use super::*;

impl BlockManager {
    /// Grows `seq`'s table to cover `slots` tokens, first giving it private copies of the
    /// shared blocks it writes from position `write_from` on (copy-on-write, listed in
    /// `copies`); false (and no change) if the free pool is too small.
    pub(super) fn try_grow(
        &mut self,
        seq: SeqId,
        slots: u32,
        write_from: u32,
        copies: &mut Vec<(u32, u32)>,
    ) -> bool {
        self.drop_outside_window(seq, write_from);
        self.drop_side_outside_window(seq, write_from);
        let side_need = self.side_need(seq, slots, write_from) as usize;
        let want = self.blocks_for(slots) as usize;
        let first = (write_from / self.block_size) as usize;
        let (have, shared) = match self.tables.get(&seq) {
            Some(t) => {
                let end = want.min(t.len());
                let shared: Vec<usize> = (first.min(end)..end)
                    .filter(|&i| t[i] != NULL_BLOCK && self.ref_counts[t[i] as usize] > 1)
                    .collect();
                (t.len(), shared)
            }
            None => (0, Vec::new()),
        };
        if want <= have && shared.is_empty() {
            if side_need > self.num_free() as usize {
                return false;
            }
            self.grow_side(seq, slots, write_from, copies);
            return true;
        }
        let need = want.saturating_sub(have) + shared.len();
        if need + side_need > self.num_free() as usize {
            return false;
        }
        let mut fresh = Vec::with_capacity(need);
        if self.extents.is_some() && want > have {
            // One run for the growth, right after the table's last block (or anywhere for
            // a new table); copies are single blocks.
            let after = self.tables.get(&seq).and_then(|t| t.last().copied());
            let Some(run) = self.take_run((want - have) as u32, after) else {
                // No room right after it: move the whole sequence to a run that fits
                // (copying every block, as a realloc does), if there is one.
                let moved = have > 0 && self.relocate(seq, want, copies);
                if moved {
                    self.grow_side(seq, slots, write_from, copies);
                }
                return moved;
            };
            // The run first, so that a copy does not take the block the run needs.
            for _ in 0..shared.len() {
                let Some(b) = self.take_block() else { break };
                fresh.push(b);
            }
            fresh.extend(run);
        } else {
            for _ in 0..need {
                // At least `need` blocks are free: checked above.
                let Some(b) = self.take_block() else {
                    break;
                };
                fresh.push(b);
            }
        }
        let mut fresh = fresh.into_iter();
        let table = self.tables.entry(seq).or_default();
        for i in shared {
            let Some(dst) = fresh.next() else { break };
            let src = table[i];
            // Still held by the other tables (ref count was > 1).
            self.ref_counts[src as usize] -= 1;
            table[i] = dst;
            copies.push((src, dst));
            self.copy_sources.push(src);
        }
        table.extend(fresh);
        self.grow_side(seq, slots, write_from, copies);
        true
    }

    /// Whether a whole-only prompt (`e.whole`) cannot run this step: the tokens the prefix
    /// cache (and its offload tier) does not hold exceed the step's `tokens`. Freeing blocks
    /// would not help, so it is checked before admission and priority preemption.
    fn whole_blocked(&self, e: &ReserveEntry) -> bool {
        if !e.whole || self.is_swapped(e.seq) {
            return false;
        }
        let hit = self.usable_hashes(e).map_or(0, |hashes| {
            let (hits, _) = self.prefix_hits(hashes);
            (hits + self.offload_hits(hashes, hits)) * self.block_size
        });
        hit + e.tokens < e.total
    }

    /// Admits waiting entry `i` (`e`): through the prefix cache, by swapping it back in, or
    /// with fresh blocks; false (and no change) if it does not fit or would break the
    /// watermark.
    pub(super) fn try_admit(
        &mut self,
        i: usize,
        e: &ReserveEntry,
        watermark: u32,
        resp: &mut ReserveResponse,
    ) -> bool {
        // Admission keeps `watermark` blocks free, unless nothing holds blocks: then
        // nothing would ever free them (liveness).
        if watermark > 0 && self.used > 0 && self.admission_need(e) + watermark > self.num_free() {
            return false;
        }
        if self.is_swapped(e.seq) {
            // Swapped out: its KV comes back from the CPU pool (no prefix lookup).
            if !self.try_swap_in(e.seq, e.slots, resp) {
                return false;
            }
            resp.granted.push(i);
            resp.hits.push(0);
            return true;
        }
        let hit = match self.usable_hashes(e) {
            Some(hashes) => {
                let (tokens, total, slots) = (e.tokens, e.total, e.slots);
                let Some(hit) = self.admit_with_prefix(e.seq, hashes, |hit| {
                    slots.max(hit + tokens.min(total - hit))
                }) else {
                    return false;
                };
                hit
            }
            None => {
                if !self.try_grow(e.seq, e.slots, e.write_from, &mut resp.block_copies) {
                    return false;
                }
                0
            }
        };
        resp.granted.push(i);
        resp.hits.push(hit);
        if let Some(p) = self.policy.as_mut() {
            p.on_admitted(e.seq);
        }
        true
    }

    /// Free blocks a waiting entry uses up when admitted, as [`Self::try_admit`] takes them:
    /// prefix hits on evictable blocks and fresh blocks, the live blocks of a swapped table,
    /// or the growth of a table.
    pub(super) fn admission_need(&self, e: &ReserveEntry) -> u32 {
        if let Some(src) = self.cpu.as_ref().and_then(|c| c.tables.get(&e.seq)) {
            let nulls = src.iter().filter(|&&c| c == NULL_BLOCK).count() as u32;
            return self.blocks_for(e.slots).max(src.len() as u32) - nulls;
        }
        if let Some(hashes) = self.usable_hashes(e) {
            let (hits, hits_free) = self.prefix_hits(hashes);
            let loads = self.offload_hits(hashes, hits);
            let (tokens, total) = (e.tokens, e.total);
            let hit = (hits + loads) * self.block_size;
            let slots = e.slots.max(hit + tokens.min(total - hit));
            let want = self.blocks_for(slots).max(hits + loads);
            let (_, side, side_free) = self.side_admission(e.seq, hashes, hits, slots);
            return want - hits + hits_free + side + side_free;
        }
        let have = self.tables.get(&e.seq).map_or(0, |t| t.len() as u32);
        self.blocks_for(e.slots).saturating_sub(have) + self.side_need(e.seq, e.slots, e.write_from)
    }

    /// Whether preempting every not-yet-preempted candidate in `victims` would free enough
    /// blocks for `e` to be admitted (its need plus the watermark; blocks shared with
    /// others do not come free), so that priority preemption never evicts in vain.
    pub(super) fn priority_room(
        &self,
        e: &ReserveEntry,
        watermark: u32,
        victims: &[SeqId],
        preempted: &[SeqId],
    ) -> bool {
        let need = self.admission_need(e) + watermark;
        let mut room = self.num_free();
        for v in victims
            .iter()
            .filter(|v| **v != e.seq && !preempted.contains(v))
        {
            room += self
                .table(*v)
                .iter()
                .filter(|&&b| b != NULL_BLOCK && self.ref_counts[b as usize] == 1)
                .count() as u32
                + self.side_private(*v);
        }
        room >= need
    }

    /// Serves one step's reservation: grants entries in order, preempting victims when a
    /// running entry does not fit (recompute: the victim's blocks are freed).
    pub fn reserve(&mut self, req: &ReserveRequest) -> ReserveResponse {
        self.tick += 1;

        let evictions_before = self.evictions;
        let mut resp = ReserveResponse::default();
        let mut victims = req.victims.iter().copied().peekable();
        let mut preempted: Vec<SeqId> = Vec::new();
        let is_preempted = |p: &[SeqId], s: SeqId| p.contains(&s);

        let running = req
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EntryKind::Running);
        let waiting = req
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EntryKind::Waiting);

        let mut serve_running =
            |bm: &mut Self, resp: &mut ReserveResponse, preempted: &mut Vec<SeqId>| {
                for (i, e) in running.clone() {
                    if is_preempted(preempted, e.seq) {
                        continue;
                    }
                    loop {
                        let have = bm.tables.get(&e.seq).map_or(0, |t| t.len() as u32);
                        if bm.try_grow(e.seq, e.slots, e.write_from, &mut resp.block_copies) {
                            resp.granted.push(i);
                            resp.hits.push(0);
                            if e.lookahead > 0 {
                                // Blocks from here on hold only draft slots.
                                let without = bm.blocks_for(e.slots - e.lookahead.min(e.slots));
                                bm.lookahead.insert(e.seq, have.max(without));
                            }
                            break;
                        }
                        // Skip candidates already preempted this step.
                        let victim = loop {
                            match victims.next() {
                                Some(v) if is_preempted(preempted, v) => continue,
                                other => break other,
                            }
                        };
                        let Some(v) = victim else {
                            // No victim left: this entry cannot run; preempt it (or, with
                            // steps in flight, let it wait for them).
                            if req.defer_stuck {
                                resp.deferred = true;
                            } else {
                                bm.preempt(e.seq, resp);
                                preempted.push(e.seq);
                            }
                            break;
                        };
                        bm.preempt(v, resp);
                        preempted.push(v);
                        revoke(resp, req, v);
                        if v == e.seq {
                            break;
                        }
                    }
                }
            };
        let watermark = req.watermark_blocks;
        let serve_waiting =
            |bm: &mut Self, resp: &mut ReserveResponse, preempted: &mut Vec<SeqId>| {
                let mut prio = req.priority_victims.iter().copied();
                for (n, (i, e)) in waiting.clone().enumerate() {
                    // Priority preemption (vLLM V0): the head of the queue may evict
                    // running sequences of lower priority, lowest first, if all of them
                    // together would make room (decided once, before evicting anyone).
                    let mut may_preempt = None;
                    if bm.whole_blocked(e) {
                        // FCFS: a prompt that must run whole and does not fit the step
                        // stops admission (no preemption would make it fit).
                        return;
                    }
                    loop {
                        if bm.try_admit(i, e, watermark, resp) {
                            break;
                        }
                        let may = *may_preempt.get_or_insert_with(|| {
                            n == 0
                                && !req.priority_victims.is_empty()
                                && bm.priority_room(e, watermark, &req.priority_victims, preempted)
                        });
                        if may {
                            if let Some(v) = prio.find(|&v| v != e.seq && !preempted.contains(&v)) {
                                bm.preempt(v, resp);
                                preempted.push(v);
                                revoke(resp, req, v);
                                continue;
                            }
                        }
                        // FCFS within the queue's order: the first that does not fit stops
                        // admission.
                        return;
                    }
                }
            };

        match req.order {
            ReserveOrder::RunningFirst => {
                serve_running(self, &mut resp, &mut preempted);
                // (No admission behind a running entry that waits for blocks.)
                if (preempted.is_empty() || !req.priority_victims.is_empty()) && !resp.deferred {
                    serve_waiting(self, &mut resp, &mut preempted);
                }
            }
            ReserveOrder::WaitingFirstExclusive => {
                serve_waiting(self, &mut resp, &mut preempted);
                if resp.granted.is_empty() {
                    serve_running(self, &mut resp, &mut preempted);
                }
            }
        }
        // Entry order (waiting entries may have been served first).
        let mut order: Vec<(usize, u32)> = resp
            .granted
            .iter()
            .copied()
            .zip(resp.hits.iter().copied())
            .collect();
        order.sort_unstable();
        resp.granted = order.iter().map(|&(g, _)| g).collect();
        resp.hits = order.iter().map(|&(_, h)| h).collect();
        resp.evicted = (self.evictions - evictions_before) as u32;
        if req.want_tables {
            resp.tables = resp
                .granted
                .iter()
                .map(|&g| self.table(req.entries[g].seq).to_vec())
                .collect();
        }
        resp.preempted = preempted;
        resp.blocks_used = self.used;
        resp.offload_loads = std::mem::take(&mut self.offload_loads);
        resp.disk_loads = std::mem::take(&mut self.disk_loads);
        if let Some(cpu) = self.cpu.as_mut() {
            let released = std::mem::take(&mut cpu.released);
            cpu.free.extend(released);
        }
        self.copy_sources.clear();
        for b in std::mem::take(&mut self.deferred) {
            self.release_block(b);
        }
        if self.extents.is_some() && self.extent_free > 0 {
            resp.external_fragmentation =
                1.0 - f64::from(self.largest_free_run()) / f64::from(self.extent_free);
        }
        if self.policy.is_some() {
            resp.probe_hits = req
                .probe
                .iter()
                .map(|(seq, hashes)| (*seq, self.prefix_hits(hashes).0 * self.block_size))
                .collect();
        }
        resp
    }
}
