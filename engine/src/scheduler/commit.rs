//! Step 3 of a scheduler step ([`Scheduler::commit`]): the backend's outcome committed at
//! the step's end: sampled tokens appended (verify steps rolled back to their accepted
//! drafts, parallel samples forked, beams re-chosen), newly full blocks offered to the prefix
//! cache, finished sequences' records returned with the blocks to free.

use super::*;

impl Scheduler {
    /// Step 3: commits the backend's outcome at time `now` (the step's end). One loop over
    /// the plan's works, each sequence looked up once: this is the engine's hottest path
    /// (per step and sequence), so the verify and sampling branches stay inline.
    pub fn commit(
        &mut self,
        plan: &StepPlan,
        outcome: &StepOutcome,
        now: Nanos,
    ) -> Result<CommitResult, EngineError> {
        if !self.in_flight.is_empty() {
            // The step's requests may be scheduled again (also when its outcome is bad).
            for w in &plan.work {
                if let Some(s) = self.seqs.get(&w.seq) {
                    self.in_flight.remove(&s.request.id);
                }
            }
        }
        check_outcome(plan, outcome)?;
        let mut result = CommitResult::default();
        let mut sampled = outcome.sampled.iter();
        let mut accepted = outcome.accepted.iter();
        let mut sampled_groups: Vec<SeqId> = Vec::new();
        let mut unforked: Vec<SeqId> = Vec::new();
        let bs = self.cfg.block_size;
        for w in &plan.work {
            let Some(s) = self.seqs.get_mut(&w.seq) else {
                return Err(EngineError::Backend(format!(
                    "step {}: sequence {} is not live",
                    plan.step, w.seq
                )));
            };
            if w.kind == WorkKind::Verify {
                // The last token and the accepted drafts are verified; the model's own
                // token follows them. Rejected slots are rolled back below.
                let k = w.len.saturating_sub(1);
                let a = accepted.next().copied().unwrap_or(0);
                if a > k {
                    return Err(EngineError::Backend(format!(
                        "step {}: sequence {} accepted {a} of {k} drafts",
                        plan.step, w.seq
                    )));
                }
                let tokens: Vec<u32> = (0..=a)
                    .map(|_| sampled.next().copied().unwrap_or(crate::backend::SIM_TOKEN))
                    .collect();
                let computed = s.num_computed + 1 + a;
                let (keep, eos) = (self.cfg.keep_tokens, self.cfg.eos_token);
                let (mut reason, mut emitted) = (None, 0u32);
                let gaps = self.itl_gaps.len();
                for (j, &t) in tokens.iter().enumerate() {
                    // One inter-token gap per step: the tokens arrive together.
                    reason = append_token(s, t, now, keep, eos, &mut self.itl_gaps, j == 0);
                    emitted += 1;
                    if reason.is_none() {
                        reason = aborted(&self.aborting, &self.aborting_seqs, s.request.id, w.seq);
                        if reason.is_some() {
                            // Aborted before this step: its tokens reach no client.
                            self.itl_gaps.truncate(gaps);
                        }
                    }
                    if reason.is_some() {
                        break;
                    }
                }
                // (A request that ended inside the accepted drafts has fewer tokens.)
                s.num_computed = computed.min(s.num_tokens);
                register_full_blocks(s, bs, w.seq, &mut result.cache);
                record_spec(&mut self.spec_stats, s.request.class, k, a, emitted);
                if let Some(g) = self.groups.get_mut(&s.request.id) {
                    g.generated += emitted;
                }
                match reason {
                    None => result.rollback.push((w.seq, s.num_computed)),
                    Some(reason) => {
                        s.status = SeqStatus::Finished;
                        result.to_free.push(w.seq);
                        if let Some(rec) = self.finish(w.seq, reason, now) {
                            result.finished.push(rec);
                        }
                    }
                }
                continue;
            }
            s.num_computed += w.len;
            // Newly full blocks join the prefix cache (before any free below): the prompt's,
            // and those holding generated tokens when their ids are known.
            register_full_blocks(s, bs, w.seq, &mut result.cache);
            if !w.sample {
                if let Some(reason) =
                    aborted(&self.aborting, &self.aborting_seqs, s.request.id, w.seq)
                {
                    // Ended mid-prompt: no token, the chunk's blocks freed.
                    s.status = SeqStatus::Finished;
                    result.to_free.push(w.seq);
                    if let Some(rec) = self.finish(w.seq, reason, now) {
                        result.finished.push(rec);
                    }
                }
                continue;
            }
            let k = w.num_samples.max(1) as usize;
            let tokens: Vec<u32> = (0..k)
                .map(|_| sampled.next().copied().unwrap_or(crate::backend::SIM_TOKEN))
                .collect();
            // Parallel sampling: the prompt's first `n` tokens fork the sequence; the
            // children share its blocks (forked in the block manager with this commit).
            let mut children = Vec::new();
            if k > 1 {
                for (j, &t) in tokens.iter().enumerate().skip(1) {
                    let mut c = s.clone();
                    c.request.n = 1;
                    // Preemptions before the fork were the parent's (counted once).
                    c.num_preemptions = 0;
                    c.shared_tokens = s.num_computed / self.cfg.block_size * self.cfg.block_size;
                    let id = child_id(s.request.id, j as u32);
                    c.admitted_seq = self.admissions;
                    self.admissions += 1;
                    children.push((id, c, t));
                }
                if let Some(g) = self.groups.get_mut(&s.request.id) {
                    g.members.extend(children.iter().map(|(id, _, _)| *id));
                }
            }
            if let Some(g) = self.groups.get_mut(&s.request.id) {
                g.generated += k as u32;
                if g.beam {
                    sampled_groups.push(s.request.id);
                }
            }
            let keep = self.cfg.keep_tokens;
            let eos = self.cfg.eos_token;
            let mut outcomes = Vec::with_capacity(k);
            let aborted = self.aborting.get(&s.request.id).copied();
            let abort = |r: Option<FinishReason>| r.or(aborted);
            let own = self.aborting_seqs.get(&w.seq).copied();
            let gaps = self.itl_gaps.len();
            let ended = append_token(s, tokens[0], now, keep, eos, &mut self.itl_gaps, true);
            if ended.is_none() && abort(None).or(own).is_some() {
                // Aborted before this step (a client gone, a stop string found by the
                // server): the token reaches no client, nor does its gap count.
                self.itl_gaps.truncate(gaps);
            }
            let reason = abort(ended).or(own);
            outcomes.push((w.seq, reason));
            for (id, mut c, t) in children {
                let reason = abort(append_token(
                    &mut c,
                    t,
                    now,
                    keep,
                    eos,
                    &mut self.itl_gaps,
                    true,
                ));
                if reason.is_none() {
                    result.forks.push((w.seq, id));
                    self.running.push(id);
                }
                self.seqs.insert(id, c);
                outcomes.push((id, reason));
            }
            for (id, reason) in outcomes {
                let Some(reason) = reason else { continue };
                if let Some(s) = self.seqs.get_mut(&id) {
                    s.status = SeqStatus::Finished;
                }
                // A child that ends at its first token was never forked: nothing to free.
                if id == w.seq || result.forks.iter().any(|&(_, c)| c == id) {
                    result.to_free.push(id);
                } else {
                    unforked.push(id);
                }
                if let Some(rec) = self.finish(id, reason, now) {
                    result.finished.push(rec);
                }
            }
        }
        sampled_groups.dedup();
        for rid in sampled_groups {
            self.reselect_beams(rid, plan, &mut result);
        }
        // Held KV (a prefill replica's, until its transfer ends) is not freed now.
        let seqs = &self.seqs;
        let held: Vec<SeqId> = result
            .to_free
            .iter()
            .copied()
            .filter(|id| seqs.get(id).is_some_and(|s| s.request.hold_kv))
            .collect();
        self.drop_finished(&result, &unforked);
        if !held.is_empty() {
            result.to_free.retain(|id| !held.contains(id));
            result.held = held;
        }
        Ok(result)
    }

    /// Removes the finished sequences from the running set and the live ones: those whose
    /// blocks are freed, and children that ended at their first token (`unforked`). Only
    /// these are touched, so that a step's cost does not grow with the waiting queue.
    fn drop_finished(&mut self, result: &CommitResult, unforked: &[SeqId]) {
        if !result.to_free.is_empty() {
            let seqs = &self.seqs;
            self.running.retain(|id| {
                seqs.get(id)
                    .is_some_and(|s| s.status != SeqStatus::Finished)
            });
            for id in &result.to_free {
                self.seqs.remove(id);
            }
        }
        // Children that ended at their first token hold no blocks but are done too.
        for id in unforked {
            self.seqs.remove(id);
        }
    }

    /// Beam search: once every beam of request `rid` has a new token (and none finished),
    /// the `n` beams of the next step are chosen among their continuations. A synthetic
    /// choice stands in for the top-`n` by log-probability: new beam `j` continues old beam
    /// `floor(n u^2)` (`u` uniform, seeded by request, step and `j`), so the best beams
    /// are often continued twice or more and the worst die. A beam continued `k` times
    /// forks `k - 1` children (sharing its blocks copy-on-write); a beam not continued is
    /// freed.
    fn reselect_beams(&mut self, rid: SeqId, plan: &StepPlan, result: &mut CommitResult) {
        let Some(g) = self.groups.get(&rid) else {
            return;
        };
        let members = g.members.clone();
        let w = members.len();
        let in_step = |m: &SeqId| plan.work.iter().any(|x| x.seq == *m && x.sample);
        let running = |m: &SeqId| {
            self.seqs
                .get(m)
                .is_some_and(|s| s.status == SeqStatus::Running)
        };
        if w < 2 || !members.iter().all(|m| in_step(m) && running(m)) {
            return;
        }
        // Only beams in step with each other (a preempted one may lag behind).
        let step = self.seqs[&members[0]].output_len;
        if members.iter().any(|m| self.seqs[m].output_len != step) {
            return;
        }
        let mut times = vec![0u32; w];
        for j in 0..w {
            let u = beam_draw(rid, step, j as u32);
            times[((w as f64 * u * u) as usize).min(w - 1)] += 1;
        }
        let mut next_members = Vec::with_capacity(w);
        let mut killed_preemptions = 0;
        for (i, &m) in members.iter().enumerate() {
            if times[i] == 0 {
                if let Some(s) = self.seqs.get_mut(&m) {
                    s.status = SeqStatus::Finished;
                    killed_preemptions += s.num_preemptions;
                }
                result.to_free.push(m);
                continue;
            }
            next_members.push(m);
            for _ in 1..times[i] {
                let Some(parent) = self.seqs.get(&m) else {
                    break;
                };
                let mut c = parent.clone();
                c.num_preemptions = 0;
                c.shared_tokens = parent.num_computed / self.cfg.block_size * self.cfg.block_size;
                c.admitted_seq = self.admissions;
                self.admissions += 1;
                let Some(g) = self.groups.get_mut(&rid) else {
                    break;
                };
                let id = child_id(rid, g.next_child);
                g.next_child += 1;
                result.forks.push((m, id));
                self.running.push(id);
                self.seqs.insert(id, c);
                next_members.push(id);
            }
        }
        if let Some(g) = self.groups.get_mut(&rid) {
            g.members = next_members;
            g.preemptions += killed_preemptions;
        }
    }

    /// Accounts a finished sequence; returns its request's record once every sequence of
    /// the request has finished.
    pub(super) fn finish(
        &mut self,
        id: SeqId,
        reason: FinishReason,
        now: Nanos,
    ) -> Option<RequestRecord> {
        self.aborting_seqs.remove(&id);
        let s = self.seqs.get(&id)?;
        let mut rec = RequestRecord {
            request_id: s.request.id,
            class: s.request.class,
            arrival_ns: s.request.arrival,
            first_scheduled_ns: s.first_scheduled,
            first_token_ns: s.first_token,
            finish_ns: now,
            prompt_len: s.request.prompt_len,
            output_len: s.output_len,
            generated_tokens: s.output_len,
            max_tokens: s.request.max_tokens,
            cached_tokens: s.cached_tokens,
            num_preemptions: s.num_preemptions,
            finish_reason: reason,
        };
        let Some(g) = self.groups.get_mut(&rec.request_id) else {
            self.aborting.remove(&rec.request_id);
            return Some(rec);
        };
        g.members.retain(|&m| m != id);
        g.output_len = g.output_len.max(s.output_len);
        g.preemptions += s.num_preemptions;
        if id == rec.request_id {
            g.first = Some(rec.clone());
        }
        if !g.members.is_empty() {
            return None;
        }
        self.aborting.remove(&rec.request_id);
        let g = self.groups.remove(&rec.request_id)?;
        // The request's record: the first sequence's times and cache hit, the longest
        // output (for TPOT) and every sequence's tokens.
        if let Some(first) = g.first {
            rec.first_scheduled_ns = first.first_scheduled_ns;
            rec.cached_tokens = first.cached_tokens;
        }
        rec.output_len = g.output_len;
        rec.generated_tokens = g.generated;
        rec.num_preemptions = g.preemptions;
        Some(rec)
    }
}

/// Checks that the backend returned an acceptance count per verify work and the tokens the
/// plan and those acceptances make.
fn check_outcome(plan: &StepPlan, outcome: &StepOutcome) -> Result<(), EngineError> {
    if outcome.accepted.len() != plan.num_verify() {
        return Err(EngineError::Backend(format!(
            "step {}: backend returned {} acceptance counts for {} verify steps",
            plan.step,
            outcome.accepted.len(),
            plan.num_verify()
        )));
    }
    let expected = StepOutcome::expected_samples(plan, &outcome.accepted);
    if outcome.sampled.len() != expected {
        return Err(EngineError::Backend(format!(
            "step {}: backend returned {} sampled tokens where the plan and its acceptances make {}",
            plan.step,
            outcome.sampled.len(),
            expected
        )));
    }
    Ok(())
}

/// Counts a verify step of `k` drafts, `accepted` of them accepted and `emitted` tokens
/// emitted, in its class's acceptance counters.
fn record_spec(
    stats: &mut Vec<crate::spec::SpecStats>,
    class: u16,
    k: u32,
    accepted: u32,
    emitted: u32,
) {
    let class = usize::from(class);
    if stats.len() <= class {
        stats.resize(class + 1, Default::default());
    }
    stats[class].record(k, accepted, emitted);
}
