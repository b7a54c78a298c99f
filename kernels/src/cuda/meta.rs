//! Host-side step metadata for the CUDA kernels: token ids, positions, KV slots, attention
//! tiles, block tables and sampling rows, packed into one `i32` buffer that is copied to the
//! device once per step. Pure functions, tested without a GPU.

use engine::plan::{SeqWork, StepPlan, WorkKind};

/// Offsets (in `i32`s) of each array inside the packed metadata buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MetaLayout {
    /// Tokens in the step.
    pub tokens: usize,
    /// Single-token attention tiles (decodes and 1-token chunks: `paged_attention`).
    pub tiles: usize,
    /// Multi-token attention tiles (prefill chunks: `prefill_attention`).
    pub ptiles: usize,
    /// Sequences in the step.
    pub seqs: usize,
    /// Block-table width (longest table in the step).
    pub max_blocks: usize,
    /// Sampled rows.
    pub samples: usize,
    /// Offset of token ids.
    pub ids: usize,
    /// Offset of positions.
    pub positions: usize,
    /// Offset of KV slots.
    pub slots: usize,
    /// Offset of the single-token tiles (4 `i32` per tile).
    pub tile_data: usize,
    /// Offset of the multi-token tiles (4 `i32` per tile).
    pub ptile_data: usize,
    /// Offset of the block tables (`seqs x max_blocks`).
    pub block_tables: usize,
    /// Offset of the sampled rows.
    pub sample_rows: usize,
    /// Tokens drawn: one per sampled row, `n` where a parallel-sampling prompt forks.
    pub draws: usize,
    /// Offset of the draws ([`DRAW_INTS`] `i32` each: logits row, top-k, temperature,
    /// top-p and the uniform number, the floats as their bits).
    pub draw_data: usize,
    /// Total length.
    pub len: usize,
}

/// `i32`s per draw in the metadata.
pub const DRAW_INTS: usize = 5;

/// Step metadata, host side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepMeta {
    /// Where each array lives in `data`.
    pub layout: MetaLayout,
    /// The packed buffer.
    pub data: Vec<i32>,
}

/// Token id used for position `pos` of a sequence whose prompt carries no token ids
/// (synthetic workloads): a fixed hash, so runs are reproducible.
pub fn synthetic_token(seq: u64, pos: u32, vocab: u32) -> u32 {
    let mut z = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(pos);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % u64::from(vocab.max(1))) as u32
}

impl StepMeta {
    /// Builds the metadata of `plan` for a KV cache of `block_size`-token blocks, attention
    /// tiles of up to `q_tile` tokens and a vocabulary of `vocab` ids.
    pub fn build(plan: &StepPlan, block_size: u32, q_tile: u32, vocab: u32) -> StepMeta {
        Self::build_padded(plan, block_size, q_tile, vocab, false)
    }

    /// As [`StepMeta::build`]; with `pad_tables`, the block-table width is rounded up to a
    /// power of two, so that decode steps keep one layout (and one CUDA graph) while their
    /// contexts grow.
    pub fn build_padded(
        plan: &StepPlan,
        block_size: u32,
        q_tile: u32,
        vocab: u32,
        pad_tables: bool,
    ) -> StepMeta {
        let tokens: usize = plan.work.iter().map(|w| w.len as usize).sum();
        let seqs = plan.work.len();
        let widest = plan
            .work
            .iter()
            .map(|w| w.block_table.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let max_blocks = if pad_tables {
            widest.next_power_of_two()
        } else {
            widest
        };
        let q_tile = q_tile.max(1);
        // A verify work's few query tokens (the last token and the drafts) each take a
        // single-token tile of the split decode kernel: as one tile of the prefill kernel
        // they would run one block per KV head over the whole context, which cost about
        // 3 ms a step for Llama-3-8B on the H200 (32 layers of 8 blocks).
        let tile_of = |w: &engine::plan::SeqWork| {
            if w.kind == WorkKind::Verify {
                1
            } else {
                q_tile
            }
        };
        let tile_counts = |w: &engine::plan::SeqWork| {
            let q_tile = tile_of(w);
            let full = w.len / q_tile;
            let rest = w.len % q_tile;
            // Single-token tiles: a 1-token chunk, or a 1-token remainder of a longer one.
            let singles = usize::from(rest == 1) + usize::from(q_tile == 1) * full as usize;
            let multis = if q_tile == 1 {
                0
            } else {
                full as usize + usize::from(rest > 1)
            };
            (singles, multis)
        };
        let (tiles, ptiles) = plan
            .work
            .iter()
            .map(tile_counts)
            .fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
        // A verify work (speculative decoding) takes logits at each of its positions, one
        // draw each (a greedy work is verified from these draws, others on the host from
        // the logits).
        let rows_of = |w: &SeqWork| -> usize {
            match (w.kind, w.sample) {
                (WorkKind::Verify, _) => w.len as usize,
                (_, true) => 1,
                _ => 0,
            }
        };
        let samples: usize = plan.work.iter().map(rows_of).sum();
        let draws: usize = plan
            .work
            .iter()
            .map(|w| match w.kind {
                WorkKind::Verify => w.len as usize,
                _ if w.sample => w.num_samples.max(1) as usize,
                _ => 0,
            })
            .sum();
        let mut l = MetaLayout {
            tokens,
            tiles,
            ptiles,
            seqs,
            max_blocks,
            samples,
            draws,
            ..MetaLayout::default()
        };
        l.ids = 0;
        l.positions = l.ids + tokens;
        l.slots = l.positions + tokens;
        l.tile_data = l.slots + tokens;
        l.ptile_data = l.tile_data + 4 * tiles;
        l.block_tables = l.ptile_data + 4 * ptiles;
        l.sample_rows = l.block_tables + seqs * max_blocks;
        l.draw_data = l.sample_rows + samples;
        l.len = l.draw_data + DRAW_INTS * draws;
        let mut data = vec![0i32; l.len];
        let (mut t, mut tile, mut ptile, mut sample) = (0usize, 0usize, 0usize, 0usize);
        let mut draw = 0usize;
        for (s, w) in plan.work.iter().enumerate() {
            let row = &mut data[l.block_tables + s * max_blocks..][..w.block_table.len()];
            for (dst, &b) in row.iter_mut().zip(&w.block_table) {
                *dst = b as i32;
            }
            let first = t;
            for p in w.start..w.start + w.len {
                let i = (p - w.start) as usize;
                let id = w
                    .token_ids
                    .get(i)
                    .copied()
                    .unwrap_or_else(|| synthetic_token(w.seq, p, vocab));
                data[l.ids + t] = (id % vocab.max(1)) as i32;
                data[l.positions + t] = p as i32;
                let block = w
                    .block_table
                    .get((p / block_size) as usize)
                    .copied()
                    .unwrap_or(0);
                data[l.slots + t] = (block * block_size + p % block_size) as i32;
                t += 1;
            }
            let mut tok = first;
            while tok < t {
                let n = (t - tok).min(tile_of(w) as usize);
                let at = if n == 1 {
                    tile += 1;
                    l.tile_data + 4 * (tile - 1)
                } else {
                    ptile += 1;
                    l.ptile_data + 4 * (ptile - 1)
                };
                data[at] = s as i32;
                data[at + 1] = tok as i32;
                data[at + 2] = n as i32;
                tok += n;
            }
            if w.kind == WorkKind::Verify {
                for r in 0..w.len as usize {
                    data[l.sample_rows + sample] = (first + r) as i32;
                    // Row r predicts position start + 1 + r.
                    let u = w.sampling.uniform(w.seq, w.start + 1 + r as u32, 0);
                    write_draw(&mut data[l.draw_data + DRAW_INTS * draw..], sample, w, u);
                    draw += 1;
                    sample += 1;
                }
            } else if w.sample {
                data[l.sample_rows + sample] = (t - 1) as i32;
                // The drawn token's position is the one after the step's last.
                let pos = w.start + w.len;
                for j in 0..w.num_samples.max(1) {
                    let u = w.sampling.uniform(w.seq, pos, j);
                    write_draw(&mut data[l.draw_data + DRAW_INTS * draw..], sample, w, u);
                    draw += 1;
                }
                sample += 1;
            }
        }
        StepMeta { layout: l, data }
    }

    /// Longest context any token of the step attends to.
    pub fn max_context(&self) -> u32 {
        let l = &self.layout;
        self.data[l.positions..l.positions + l.tokens]
            .iter()
            .map(|&p| p as u32 + 1)
            .max()
            .unwrap_or(0)
    }
}

/// Number of flash-decoding splits of the context: enough blocks to fill `target_blocks`
/// (a few per multiprocessor), each split covering at least `min_keys` keys.
pub fn attention_splits(
    tiles: usize,
    kv_heads: u32,
    max_context: u32,
    target_blocks: u32,
    min_keys: u32,
) -> u32 {
    let blocks = (tiles as u64 * u64::from(kv_heads)).max(1);
    if blocks >= u64::from(target_blocks) {
        return 1;
    }
    let want = u64::from(target_blocks).div_ceil(blocks) as u32;
    let most = max_context.div_ceil(min_keys.max(1)).max(1);
    want.min(most).clamp(1, 64)
}

/// Query tokens per multi-token (prefill) attention tile for a GQA group: the tensor-core
/// kernel's tile holds 64 query rows (tokens x query heads of one KV head).
pub fn q_tile_for_group(group: u32) -> u32 {
    (64 / group.max(1)).max(1)
}

/// Dynamic shared memory of `prefill_attention` for a head size (must match the layout in
/// `kernels.cu`: Q, K and V tiles, scores, probabilities, per-warp output staging).
pub fn prefill_smem_bytes(head_dim: u32) -> u32 {
    let (pm, pkt, warps) = (64, 32, 8);
    let pld = head_dim + 8;
    (pm + 2 * pkt) * pld * 2 + pm * (pkt + 4) * 4 + pm * (pkt + 8) * 2 + warps * 256 * 4
}

/// One draw's [`DRAW_INTS`] at the start of `d`: its logits row, then `w`'s top-k,
/// temperature (0 when greedy) and top-p as f32 bits, and the uniform number `u`.
fn write_draw(d: &mut [i32], row: usize, w: &SeqWork, u: f32) {
    let sp = &w.sampling;
    d[0] = row as i32;
    d[1] = sp.top_k.min(i32::MAX as u32) as i32;
    d[2] = if sp.is_greedy() {
        0.0f32
    } else {
        sp.temperature
    }
    .to_bits() as i32;
    d[3] = sp.top_p().to_bits() as i32;
    d[4] = u.to_bits() as i32;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(seq: u64, start: u32, len: u32, sample: bool, table: Vec<u32>) -> SeqWork {
        SeqWork {
            seq,
            kind: if len == 1 && start > 0 {
                WorkKind::Decode
            } else {
                WorkKind::Prefill
            },
            start,
            len,
            sample,
            num_samples: 1,
            block_table: table,
            token_ids: Vec::new(),
            sampling: Default::default(),
            drafts: None,
            suppress: Vec::new(),
            suppress_rows: 0,
        }
    }

    #[test]
    fn packs_slots_tiles_and_samples() {
        let plan = StepPlan {
            work: vec![
                work(7, 0, 10, true, vec![5, 9]), // prefill 10 tokens, block size 8
                work(8, 20, 1, true, vec![1, 2, 3]), // decode at position 20
                work(9, 16, 4, false, vec![4, 6, 0]), // a chunk [16, 20)
            ],
            ..StepPlan::default()
        };
        let m = StepMeta::build(&plan, 8, 4, 1000);
        let l = m.layout;
        assert_eq!((l.tokens, l.seqs, l.max_blocks, l.samples), (15, 3, 3, 2));
        // Tiles of at most 4 tokens: 10 -> 4 + 4 + 2 (multi-token), 1 (single), 4 (multi).
        assert_eq!((l.tiles, l.ptiles), (1, 4));
        let singles: Vec<&[i32]> = m.data[l.tile_data..l.ptile_data].chunks(4).collect();
        let multis: Vec<&[i32]> = m.data[l.ptile_data..l.block_tables].chunks(4).collect();
        assert_eq!(multis[0][..3], [0, 0, 4]);
        assert_eq!(multis[2][..3], [0, 8, 2]);
        assert_eq!(singles[0][..3], [1, 10, 1]);
        assert_eq!(multis[3][..3], [2, 11, 4]);
        // A 5-token chunk with tiles of 4 leaves a single-token remainder.
        let odd = StepMeta::build(
            &StepPlan {
                work: vec![work(1, 0, 5, true, vec![0])],
                ..StepPlan::default()
            },
            8,
            4,
            100,
        );
        assert_eq!((odd.layout.tiles, odd.layout.ptiles), (1, 1));
        // Position 9 of seq 7 is in its second block (9): slot 9 * 8 + 1.
        assert_eq!(m.data[l.slots + 9], 73);
        // The decode at position 20 is in block 3 (table index 2): slot 3 * 8 + 4.
        assert_eq!(m.data[l.slots + 10], 28);
        assert_eq!(m.data[l.positions + 10], 20);
        // Sampled rows: the last token of seq 7 (row 9) and the decode (row 10).
        assert_eq!(m.data[l.sample_rows..l.draw_data], [9, 10]);
        // One greedy draw per sampled row: (row, top-k 0, temperature 0, top-p 1, u).
        assert_eq!(l.draws, 2);
        let d = &m.data[l.draw_data..];
        assert_eq!(d[..4], [0, 0, 0, 1.0f32.to_bits() as i32]);
        assert_eq!(d[5..9], [1, 0, 0, 1.0f32.to_bits() as i32]);
        assert!((0.0..1.0).contains(&f32::from_bits(d[4] as u32)));
        // Block tables are padded to the widest.
        assert_eq!(m.data[l.block_tables..l.block_tables + 3], [5, 9, 0]);
        assert_eq!(m.max_context(), 21);
        // Token ids are stable and within the vocabulary.
        assert!(m.data[..15].iter().all(|&id| (0..1000).contains(&id)));
        assert_eq!(m, StepMeta::build(&plan, 8, 4, 1000));
    }

    /// A verify work (speculative decoding) takes logits at every position, one draw each
    /// with the uniform number of the position it predicts; graph-free plans keep the
    /// other works' rows after it.
    #[test]
    fn verify_work_samples_every_position() {
        let mut v = work(3, 10, 4, true, vec![0, 1]);
        v.kind = WorkKind::Verify;
        v.token_ids = vec![5, 6, 7, 8];
        v.drafts = Some(engine::spec::Drafts {
            k: 3,
            tokens: vec![6, 7, 8],
            acceptance: engine::spec::Acceptance::iid(0.5, 3).expect("rate"),
        });
        let plan = StepPlan {
            work: vec![v.clone(), work(1, 9, 1, true, vec![2, 3])],
            ..StepPlan::default()
        };
        let m = StepMeta::build(&plan, 8, 4, 100);
        let l = m.layout;
        assert_eq!((l.tokens, l.samples, l.draws), (5, 5, 5));
        // The verify's 4 tokens and the decode: five single-token tiles, no prefill tile.
        assert_eq!((l.tiles, l.ptiles), (5, 0));
        let tiles: Vec<&[i32]> = m.data[l.tile_data..l.ptile_data].chunks(4).collect();
        for (i, t) in tiles.iter().enumerate() {
            assert_eq!(t[..3], [i32::from(i == 4), i as i32, 1], "tile {i}");
        }
        assert_eq!(m.data[l.sample_rows..l.sample_rows + 5], [0, 1, 2, 3, 4]);
        assert_eq!(m.data[l.ids..l.ids + 4], [5, 6, 7, 8]);
        for r in 0..4 {
            let d = &m.data[l.draw_data + r * DRAW_INTS..][..DRAW_INTS];
            assert_eq!(d[0], r as i32);
            let u = v.sampling.uniform(3, 11 + r as u32, 0);
            assert_eq!(d[4], u.to_bits() as i32, "row {r}");
        }
    }

    #[test]
    fn parallel_sampling_draws_n_tokens_with_their_own_numbers() {
        let mut w = work(4, 0, 6, true, vec![2]);
        w.num_samples = 3;
        w.sampling = engine::request::SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            seed: 11,
            logprobs: None,
        };
        let plan = StepPlan {
            work: vec![work(1, 9, 1, true, vec![0, 1]), w.clone()],
            ..StepPlan::default()
        };
        let m = StepMeta::build(&plan, 8, 4, 100);
        let l = m.layout;
        assert_eq!((l.samples, l.draws), (2, 4));
        assert_eq!(l.len, l.draw_data + 4 * DRAW_INTS);
        let draw = |i: usize| &m.data[l.draw_data + i * DRAW_INTS..][..DRAW_INTS];
        // The greedy row first, then three draws of the second sampled row.
        assert_eq!(draw(0)[..3], [0, 0, 0]);
        for j in 0..3 {
            let d = draw(1 + j);
            assert_eq!(
                d[..4],
                [1, 40, 0.8f32.to_bits() as i32, 0.9f32.to_bits() as i32]
            );
            // Position 6 is the token after the prompt's six.
            assert_eq!(
                f32::from_bits(d[4] as u32),
                w.sampling.uniform(4, 6, j as u32)
            );
        }
        assert_ne!(draw(1)[4], draw(2)[4]);
    }

    #[test]
    fn padded_tables_keep_one_layout_while_contexts_grow() {
        let decode = |pos: u32, table: Vec<u32>| StepPlan {
            work: vec![work(1, pos, 1, true, table)],
            ..StepPlan::default()
        };
        // Contexts of 3, 4 and 5 blocks of 8: one padded layout (width 4, then 8).
        let a = StepMeta::build_padded(&decode(20, vec![7, 8, 9]), 8, 1, 100, true);
        let b = StepMeta::build_padded(&decode(30, vec![7, 8, 9, 10]), 8, 1, 100, true);
        let c = StepMeta::build_padded(&decode(33, vec![7, 8, 9, 10, 11]), 8, 1, 100, true);
        assert_eq!(a.layout, b.layout);
        assert_eq!(a.layout.max_blocks, 4);
        assert_eq!(c.layout.max_blocks, 8);
        // The real entries are unchanged, the padding is zero, and nothing else moves.
        let l = a.layout;
        assert_eq!(a.data[l.block_tables..l.block_tables + 4], [7, 8, 9, 0]);
        let plain = StepMeta::build(&decode(20, vec![7, 8, 9]), 8, 1, 100);
        assert_eq!(plain.layout.max_blocks, 3);
        assert_eq!(
            plain.data[..plain.layout.block_tables],
            a.data[..l.block_tables]
        );
        assert_eq!(a.data[l.sample_rows..l.draw_data], [0]);
    }

    #[test]
    fn splits_fill_the_gpu_only_when_needed() {
        // Batch 1 decode, 8 KV heads, 32k context, 132 SMs x 2: split.
        let s = attention_splits(1, 8, 32768, 264, 256);
        assert_eq!(s, 33);
        // A full prefill needs no split.
        assert_eq!(attention_splits(256, 8, 2048, 264, 256), 1);
        // Short contexts do not split below min_keys each.
        assert_eq!(attention_splits(1, 8, 300, 264, 256), 2);
        assert_eq!(attention_splits(1, 8, 0, 264, 256), 1);
        assert_eq!(q_tile_for_group(4), 16);
        assert_eq!(q_tile_for_group(8), 8);
        assert_eq!(q_tile_for_group(64), 1);
        // Llama-3-8B's head size needs more than the 48 KB of static shared memory.
        assert_eq!(prefill_smem_bytes(128), 57_344);
        assert_eq!(prefill_smem_bytes(64), 40_960);
    }
}
