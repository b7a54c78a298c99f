//! Step 1 of a scheduler step ([`Scheduler::propose`]): the queue ordered by its policy,
//! the scheduling policy's proposal within the step's budgets, the admission reserve and
//! prefix-cache probes, and the speculative drafts of running decodes, as one
//! [`ReserveRequest`] for the block manager.

use super::*;

impl Scheduler {
    /// Step 1: the policy's reservation request for the block manager.
    pub fn propose(&mut self, now: Nanos) -> ReserveRequest {
        self.receive(now);
        self.refill_head(now);
        // Queue order: FCFS keeps arrival order (preempted requests in front), the keyed
        // policies' head is sorted by `refill_head`, and lpm sorts a short queue by the
        // cached prefixes probed last step (beyond `LPM_MAX_QUEUE` it is FCFS).
        let (policy, aging) = (self.cfg.queue, self.cfg.queue_aging_ns);
        let lpm_fcfs = policy == QueuePolicy::Lpm && self.num_queued() > policy::LPM_MAX_QUEUE;
        if policy == QueuePolicy::Lpm && !lpm_fcfs && self.waiting.len() > 1 {
            let seqs = &self.seqs;
            self.waiting
                .make_contiguous()
                .sort_by_key(|&id| policy.key(id, &seqs[&id], now, aging));
        }
        // Chunked prefill with speculation: the running decodes' drafts come before new
        // prompts (vLLM V1 schedules running requests' spec tokens first), so the policy
        // plans within the budget they leave.
        let reserve = if self.cfg.kind == SchedulerKind::Chunked {
            self.draft_reserve()
        } else {
            0
        };
        self.policy_cfg.max_num_batched_tokens = self.cfg.max_num_batched_tokens - reserve;
        // With steps in flight (pipelined micro-batches), only the running sequences of
        // requests none of them holds are scheduled (a decode needs the token the step in
        // flight samples) or preempted.
        let pipelined = !self.in_flight.is_empty();
        if !pipelined {
            self.draining = false;
        } else if self.draining {
            // Out of blocks with steps in flight: nothing starts until they have ended.
            self.pending_tokens.clear();
            self.pending_drafts.clear();
            return ReserveRequest {
                defer_stuck: true,
                ..ReserveRequest::default()
            };
        }
        let mut held_seats = 0;
        if pipelined {
            let (seqs, in_flight) = (&self.seqs, &self.in_flight);
            self.free_running.clear();
            for id in &self.running {
                let s = &seqs[id];
                if in_flight.contains(&s.request.id) {
                    held_seats += s.seats() as usize;
                } else {
                    self.free_running.push(*id);
                }
            }
            // (The waiting head holds at most max_num_seqs + 1 sequences.)
            self.free_waiting.clear();
            self.free_waiting.extend(
                self.waiting
                    .iter()
                    .filter(|id| !in_flight.contains(&seqs[id].request.id)),
            );
        }
        let q = Queues {
            seqs: &self.seqs,
            waiting: if pipelined {
                &self.free_waiting
            } else {
                &self.waiting
            },
            running: if pipelined {
                &self.free_running
            } else {
                &self.running
            },
            held_seats,
        };
        if self.cfg.static_padding && self.running.is_empty() {
            // A static batch forms only when the last one has ended.
            self.pad = PadState::default();
        }
        let mut p = self.policy.propose(&q, &self.policy_cfg);
        // Admission reserve, and prefix-cache lookups for sequences admitted without blocks.
        let static_batch = self.cfg.kind == SchedulerKind::Static;
        for e in &mut p.entries {
            if let Some(s) = self.seqs.get(&e.seq) {
                e.total = s.num_tokens;
                e.write_from = s.num_computed;
                if e.kind == EntryKind::Waiting {
                    // Static batching reserves prompt + max_tokens itself; only a
                    // max-length reservation (HF's static cache) asks for more.
                    if !static_batch || self.cfg.admission == AdmissionPolicy::MaxModelLen {
                        let reserve = self.cfg.admission.slots(
                            s,
                            e.tokens,
                            self.cfg.max_model_len,
                            self.new_token_ratio,
                        );
                        e.slots = e.slots.max(reserve);
                    }
                    if s.num_computed == 0 && !s.swapped {
                        e.hashes = if s.gen_hashes.is_empty() {
                            s.block_hashes.clone()
                        } else {
                            // A recompute may also hit the blocks it generated.
                            let all: Vec<u64> = (0..s.num_block_hashes())
                                .filter_map(|i| s.block_hash(i))
                                .collect();
                            Some(all.into())
                        };
                    }
                }
            }
        }
        self.add_drafts(&mut p);
        self.pending_tokens = p.tokens;
        let mut victims = self.running.clone();
        if self.cfg.victim == VictimPolicy::Newest {
            victims.reverse();
        } else {
            let (seqs, victim) = (&self.seqs, self.cfg.victim);
            victims.sort_by_key(|id| victim.key(&seqs[id]));
        }
        if pipelined {
            // Only the victims preferred to every sequence a step in flight holds: a
            // sequence that would need a held one preempted waits for its commit instead
            // (`defer_stuck`), as it would have preempted it one at a time.
            let (seqs, in_flight) = (&self.seqs, &self.in_flight);
            if let Some(p) = victims
                .iter()
                .position(|id| in_flight.contains(&seqs[id].request.id))
            {
                victims.truncate(p);
            }
        }
        // Priority scheduling preempts for the queue's head: running sequences of strictly
        // lower priority (larger value), the lowest and then the newest first.
        let mut priority_victims = Vec::new();
        if self.cfg.queue == QueuePolicy::Priority {
            let head = p.entries.iter().find(|e| e.kind == EntryKind::Waiting);
            if let Some(head) = head.and_then(|e| self.seqs.get(&e.seq)) {
                let prio = head.request.priority;
                priority_victims = self
                    .running
                    .iter()
                    .copied()
                    .filter(|id| self.seqs[id].request.priority > prio)
                    .collect();
                let (seqs, in_flight) = (&self.seqs, &self.in_flight);
                priority_victims.sort_by_key(|id| VictimPolicy::LowestPriority.key(&seqs[id]));
                // (Up to the first a step in flight holds, as for `victims`.)
                if let Some(p) = priority_victims
                    .iter()
                    .position(|id| in_flight.contains(&seqs[id].request.id))
                {
                    priority_victims.truncate(p);
                }
            }
        }
        // Longest-prefix-match asks the block manager for the queue's cached prefixes.
        let probe = if policy == QueuePolicy::Lpm && !lpm_fcfs && self.cfg.prefix_caching {
            self.waiting
                .iter()
                .filter_map(|id| {
                    let s = &self.seqs[id];
                    let h = s.block_hashes.as_ref().filter(|_| s.num_computed == 0)?;
                    Some((*id, h.clone()))
                })
                .collect()
        } else {
            Vec::new()
        };
        ReserveRequest {
            probe,
            priority_victims,
            watermark_blocks: self.cfg.watermark_blocks,
            entries: p.entries,
            victims,
            order: p.order.unwrap_or(ReserveOrder::RunningFirst),
            want_tables: self.cfg.want_block_tables,
            defer_stuck: pipelined,
        }
    }

    /// Draft tokens the running decodes will ask for this step (at most the budget the
    /// running sequences' own tokens leave).
    fn draft_reserve(&self) -> u32 {
        let Some(spec) = &self.cfg.speculative else {
            return 0;
        };
        let k = spec.dynamic.k(spec.k, self.running.len());
        if k == 0 {
            return 0;
        }
        let total: u32 = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| s.is_decode() && !s.request.beam_search)
            .map(|s| k.min(self.draft_room(s)))
            .sum();
        // Never at the expense of the running sequences' own work (decodes and prefill
        // chunks): only of new prompts.
        let running: u32 = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|s| s.remaining())
            .sum();
        total.min(self.cfg.max_num_batched_tokens.saturating_sub(running))
    }

    /// Drafts worth verifying for `s`: none past the request's last token or the model's
    /// length.
    fn draft_room(&self, s: &Sequence) -> u32 {
        s.request
            .max_tokens
            .saturating_sub(s.output_len + 1)
            .min(self.cfg.max_model_len.saturating_sub(s.num_tokens))
    }

    /// Speculative decoding: turns the proposal's single-token decodes into verify entries
    /// of `1 + k` tokens with `k` lookahead slots. `k` follows the batch (dynamic k), never
    /// drafts past the request's last token or the model's length, and spends only the
    /// token budget the policy left (so prefills already proposed keep theirs); n-gram
    /// drafts come from the sequence's own tokens when the engine keeps them (real
    /// backends), and a sequence without a match decodes normally.
    fn add_drafts(&mut self, p: &mut Proposal) {
        self.pending_drafts.clear();
        self.pending_drafts.resize(p.entries.len(), None);
        let Some(spec) = &self.cfg.speculative else {
            return;
        };
        let k_batch = spec.dynamic.k(spec.k, self.running.len());
        if k_batch == 0 {
            return;
        }
        let used: u32 = p.tokens.iter().sum();
        let mut spare = self.cfg.max_num_batched_tokens.saturating_sub(used);
        for (i, e) in p.entries.iter_mut().enumerate() {
            if e.kind != EntryKind::Running || p.tokens[i] != 1 || spare == 0 {
                continue;
            }
            let Some(s) = self.seqs.get(&e.seq) else {
                continue;
            };
            if !s.is_decode() || s.request.beam_search {
                continue;
            }
            let mut k = k_batch.min(self.draft_room(s)).min(spare);
            let mut tokens = Vec::new();
            if spec.method == crate::spec::Method::Ngram && self.cfg.keep_tokens && k > 0 {
                // The prompt's ids and the tokens drawn so far. A synthetic prompt has no
                // ids here (the runtime makes its own), so its lookup searches the output.
                let prompt = &s.request.prompt_tokens;
                let context: std::borrow::Cow<[u32]> =
                    if prompt.len() as u32 == s.request.prompt_len {
                        [prompt.as_slice(), &s.output_tokens].concat().into()
                    } else {
                        s.output_tokens.as_slice().into()
                    };
                tokens = crate::spec::ngram_propose(&context, spec.ngram_min, spec.ngram_max, k);
                k = tokens.len() as u32;
            }
            if k == 0 {
                continue;
            }
            spare -= k;
            e.tokens += k;
            e.slots = e.slots.max(s.num_tokens + k);
            e.lookahead = k;
            p.tokens[i] += k;
            self.pending_drafts[i] = Some(crate::spec::Drafts {
                k,
                tokens,
                acceptance: spec.acceptance_of(usize::from(s.request.class)).clone(),
            });
        }
    }
}
