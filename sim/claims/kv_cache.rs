//! Claim 2: the KV cache arithmetic of a 70B-class model (25.6 GB for 32 sequences of
//! 4,096 tokens, 51.5 GB for one 128K-token request, 8x less with GQA than MHA).
//!
//! In: `kv_cache.toml`, variants `gqa` (8 KV heads) and `mha` (64). The bytes per token
//! come from the memory plans (per GPU x GPUs), the peak of a run of 32 sequences of
//! 4,096 tokens from the block manager (its peak usage x pool blocks x block bytes).
//! Out: three rows, each with the article's figure, the formula's product, and the
//! simulator's.

use super::{figs, gb, summary, times, ClaimRow, Ctx, Verdict};
use crate::SimError;

pub(super) fn evaluate(ctx: &Ctx<'_>) -> Result<Vec<ClaimRow>, SimError> {
    let gqa = ctx.variant("gqa")?;
    let mha = ctx.variant("mha")?;
    let gpus = |v: &crate::scenario::Variant| f64::from(v.deployment.num_gpus());
    let per_token = gqa.memory.kv_bytes_per_token * gpus(gqa);
    let per_token_mha = mha.memory.kv_bytes_per_token * gpus(mha);
    let m = &gqa.deployment.model;
    // The article's formula from the model's shape.
    let formula = |tokens: f64| {
        2.0 * f64::from(m.layers) * f64::from(m.kv_heads) * f64::from(m.head_dim) * tokens * 2.0
    };

    // 32 x 4,096: the run's peak.
    let runs = ctx.run(&["gqa"])?;
    let s = summary(&runs, "gqa")?;
    let peak =
        s.max_kv_usage * f64::from(gqa.memory.num_blocks) * gqa.memory.block_bytes * gpus(gqa);
    let batch = per_token * 4096.0 * 32.0;
    let mut rows = vec![ClaimRow {
        scenario: String::new(),
        figures: figs(&[("bytes_per_token", per_token), ("batch_bytes", batch), ("peak_bytes", peak), ("formula_bytes", formula(4096.0 * 32.0))]),
        claim: "KV of a 70B-class GQA model, 32 sequences x 4,096 tokens, fp16".into(),
        article: "2x80x8x128x4096x32x2 = 25.6 GB".into(),
        simulated: format!(
            "formula {}; memory plan {}; the run's peak {}",
            gb(formula(4096.0 * 32.0)),
            gb(batch),
            gb(peak)
        ),
        verdict: Verdict::holds_if((batch / 25.6e9 - 1.0).abs() < 0.1),
        why: format!(
            "the formula is right but the article's product is not: 2x{}x{}x{}x4096x32x2 is {:.0} bytes ({:.1} GiB), not 27,487,051,776 (25.6 GiB)",
            m.layers,
            m.kv_heads,
            m.head_dim,
            formula(4096.0 * 32.0),
            formula(4096.0 * 32.0) / f64::from(1u32 << 30)
        ),
    }];

    // One 128K-token request.
    let long = per_token * 131072.0;
    let fits = gqa.memory.max_model_len >= 131072 && gqa.memory.max_concurrency_at_max_len >= 1.0;
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("request_bytes", long), ("fits", if fits { 1.0 } else { 0.0 })]),
        claim: "one 128K-token request of the same shape".into(),
        article: "≈ 51.5 GB, more than the int4 weights".into(),
        simulated: format!(
            "{} ({} such requests fit in the pool of {} x {})",
            gb(long),
            if fits {
                format!("{:.0}", gqa.memory.max_concurrency_at_max_len.floor())
            } else {
                "no".into()
            },
            gqa.deployment.num_gpus(),
            gqa.deployment.gpu.name
        ),
        verdict: Verdict::holds_if((long / 51.5e9 - 1.0).abs() < 0.1),
        why: format!(
            "131,072 tokens x {:.0} bytes a token is {} (the same product as 32 x 4,096); it still exceeds a 70B model's ~35-37 GB of int4 weights, as the article says",
            per_token,
            gb(long)
        ),
    });

    // GQA against MHA, in one pool (the MHA model's own is smaller: its K and V
    // projections are 8x larger too).
    let ratio = per_token_mha / per_token;
    let pool = gqa.memory.pool_tokens as f64 * per_token;
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("mha_over_gqa", ratio), ("mha_seq_bytes", per_token_mha * 4096.0)]),
        claim: "grouped-query attention cuts KV 8x against multi-head".into(),
        article: "8x (64 query heads, 8 KV heads); MHA 10.7 GB per 4,096-token sequence".into(),
        simulated: format!(
            "{} per token; MHA {} per 4,096-token sequence; 4,096-token sequences in the GQA model's {} pool: {:.0} with GQA, {:.0} with MHA",
            times(ratio),
            gb(per_token_mha * 4096.0),
            gb(pool),
            (pool / (per_token * 4096.0)).floor(),
            (pool / (per_token_mha * 4096.0)).floor()
        ),
        verdict: Verdict::holds_if((ratio - 8.0).abs() < 0.01),
        why: "KV bytes scale with the KV heads, so 64 / 8 = 8x; a pool holds 8x the tokens".into(),
    });
    Ok(rows)
}
