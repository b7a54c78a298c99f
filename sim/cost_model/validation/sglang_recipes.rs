//! What the recipes InferenceX ran its disaggregated SGLang rows with set for their prefill
//! and decode servers, so that `sim validate-model` replays each such row under its own
//! recipe rather than one value for every pool.
//!
//! InferenceX launched these runs through NVIDIA's srt-slurm (its launchers check out the
//! `sa-submission-q1-2026` branch, squashed into NVIDIA/srt-slurm as 5063eb43; the later B200
//! fp8 8k/1k runs use the second squash, 4a22a181); its December 2025 runs (SGLang
//! 0.5.5.post2 on GB200) used Dynamo's `examples/backends/sglang/slurm_jobs` scripts, whose
//! values srt-slurm's port of them (9811bbdc, `recipies/gb200-*`) keeps. A row does not name
//! its recipe: it is matched by GPU, SGLang version, weights' format, prompt length and the
//! pools as the row labels them, which tell the recipes apart.
//!
//! In: a disaggregated row and its pools as labelled. Out: the matching [`Recipe`] (each
//! server's `--mem-fraction-static`, `--chunked-prefill-size`, `--max-prefill-tokens`,
//! `--max-running-requests` and `--scheduler-recv-interval`, the KV cache's dtype, and the
//! pools' real layouts where the row's labels were placeholders), or `None`.

use crate::observed::silicon::AggregateRow;

/// A pool's layout: `(workers, attention TP, attention-DP ranks, EP)`.
pub(crate) type Layout = (u32, u32, u32, u32);

/// One SGLang server's settings in a recipe (`None`: the recipe leaves SGLang's default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Server {
    /// `--mem-fraction-static`: weights and KV cache.
    pub mem_fraction: f64,
    /// `--chunked-prefill-size` over the whole server; under attention data parallelism
    /// SGLang divides it among the ranks (`ServerArgs`: `chunked_prefill_size // dp_size`).
    pub chunked_prefill: Option<u32>,
    /// `--max-prefill-tokens`: the new prompts' tokens one prefill batch takes.
    pub max_prefill: Option<u32>,
    /// `--max-running-requests` over the whole server; under attention data parallelism each
    /// rank holds its share (SGLang divides it by `dp_size`).
    pub max_running: Option<u32>,
    /// `--scheduler-recv-interval`.
    pub recv_interval: Option<u32>,
}

impl Server {
    /// One rank's prefill budget: the chunk size its server sets, divided among the
    /// attention-DP ranks, no more than the prefill batch's token limit.
    pub fn rank_chunk(&self, dp: u32) -> Option<u32> {
        let chunk = self.chunked_prefill.map(|c| c / dp.max(1));
        match (chunk, self.max_prefill) {
            (Some(c), Some(m)) => Some(c.min(m)),
            (c, m) => c.or(m),
        }
        .map(|t| t.max(1))
    }

    /// One rank's request cap: the server's, divided among the attention-DP ranks.
    pub fn rank_max_running(&self, dp: u32) -> Option<u32> {
        self.max_running.map(|m| (m / dp.max(1)).max(1))
    }
}

/// A recipe's settings for a row's two pools.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Recipe {
    /// The recipe file (and the commit quoted).
    pub file: &'static str,
    /// `--kv-cache-dtype fp8_e4m3` on both servers (every GB200 and B200 recipe; the H200
    /// ones leave the model's dtype).
    pub kv_fp8: bool,
    /// The prefill server's settings.
    pub prefill: Server,
    /// The decode server's settings.
    pub decode: Server,
    /// The pools as they really ran, where the row's labels were placeholders (InferenceX's
    /// December 2025 configuration: "tp, ep, and dp-attn do nothing because they are
    /// hardcoded"; its low-latency servers and its 8k/1k max-throughput prefill servers ran
    /// at TP4, and its DEP servers, mid-curve prefill and DP32 decode, with their experts
    /// over every rank where the rows say EP1); `None`: as labelled.
    pub layouts: Option<[Layout; 2]>,
}

/// A recipe and the rows it ran: their campaign, prompt length and pools as labelled.
struct Entry {
    campaign: Campaign,
    isl: u32,
    labelled: [Layout; 2],
    recipe: Recipe,
}

const fn e(campaign: Campaign, isl: u32, labelled: [Layout; 2], recipe: Recipe) -> Entry {
    Entry {
        campaign,
        isl,
        labelled,
        recipe,
    }
}

const fn server(
    mem_fraction: f64,
    chunked_prefill: Option<u32>,
    max_prefill: Option<u32>,
    max_running: Option<u32>,
    recv_interval: Option<u32>,
) -> Server {
    Server {
        mem_fraction,
        chunked_prefill,
        max_prefill,
        max_running,
        recv_interval,
    }
}

const fn recipe(file: &'static str, kv_fp8: bool, prefill: Server, decode: Server) -> Recipe {
    Recipe {
        file,
        kv_fp8,
        prefill,
        decode,
        layouts: None,
    }
}

const fn relabel(r: Recipe, layouts: [Layout; 2]) -> Recipe {
    Recipe {
        layouts: Some(layouts),
        ..r
    }
}

// GB200 (srt-slurm 5063eb43 unless noted; attention `trtllm_mla`, radix cache off).
const GB200_FP4_1K_MID: Recipe = recipe(
    "gb200-fp4/1k1k/mid-curve.yaml @5063eb43",
    true,
    server(0.84, Some(65_536), Some(32_768), Some(30_000), None),
    server(0.83, Some(786_432), None, Some(67_584), None),
);
const GB200_FP4_1K_LOW: Recipe = recipe(
    "gb200-fp4/1k1k/low-latency.yaml @5063eb43",
    true,
    server(0.95, Some(8192), None, Some(512), Some(10)),
    server(0.95, Some(8192), None, None, Some(10)),
);
const GB200_FP4_8K_LOW: Recipe = recipe(
    "gb200-fp4/8k1k/low-latency.yaml @5063eb43",
    true,
    server(0.95, Some(24_576), None, Some(512), Some(10)),
    server(0.95, Some(8192), None, None, Some(10)),
);
const GB200_FP4_8K_MAX: Recipe = recipe(
    "recipies/gb200-fp4/8k1k/max-tpt.yaml @9811bbdc (prefill TP4 without attention DP)",
    true,
    server(0.95, Some(131_072), Some(524_288), Some(30_000), None),
    server(0.83, Some(24_576), None, Some(16_384), None),
);
const GB200_FP8_1K_LOW: Recipe = recipe(
    "gb200-fp8/1k1k/low-latency.yaml @5063eb43",
    true,
    server(0.95, Some(8192), None, Some(512), Some(10)),
    server(0.95, Some(8192), None, Some(128), Some(10)),
);
const GB200_FP8_1K_LOW_1P4D: Recipe = recipe(
    "recipies/gb200-fp8/1k1k/low-latency.yaml @9811bbdc (1p4d)",
    true,
    server(0.95, Some(8192), None, Some(512), Some(10)),
    server(0.95, Some(8192), None, Some(512), Some(10)),
);
const GB200_FP8_1K_ULTRA: Recipe = recipe(
    "gb200-fp8/1k1k/ultra-tpt.yaml @5063eb43",
    true,
    server(0.75, Some(131_072), None, Some(8192), None),
    server(0.82, Some(36_864), None, Some(5120), None),
);
const GB200_FP8_1K_MAX: Recipe = recipe(
    "gb200-fp8/1k1k/max-tpt.yaml @5063eb43",
    true,
    server(0.75, Some(131_072), None, Some(30_000), None),
    server(0.82, Some(36_864), None, Some(45_000), None),
);
const GB200_FP8_8K_MID: Recipe = recipe(
    "gb200-fp8/8k1k/mid-curve.yaml @5063eb43 (Dynamo's 8k1k-max-tpt.sh for 0.5.5.post2)",
    true,
    server(0.80, Some(131_072), None, Some(30_000), None),
    server(0.82, Some(36_864), None, Some(8192), None),
);
const GB200_FP8_8K_LOW: Recipe = recipe(
    "gb200-fp8/8k1k/low-latency.yaml @5063eb43",
    true,
    server(0.80, Some(24_576), None, Some(512), Some(10)),
    server(0.80, Some(8192), None, Some(512), Some(10)),
);

// B200 (srt-slurm 5063eb43 unless noted; `flashinfer_trtllm` experts, radix cache off).
const B200_FP8_TEP8: Recipe = recipe(
    "b200-fp8/{1k1k,8k1k}/stp/low-latency-tep8-{1p1d,1p4d}.yaml @5063eb43",
    true,
    server(0.85, Some(32_768), Some(32_768), Some(512), None),
    server(0.85, Some(32_768), Some(32_768), Some(512), None),
);
const B200_FP8_DEP8: Recipe = recipe(
    "b200-fp8/8k1k/stp/max-tpt-dep8-{1p1d,2p1d}.yaml @5063eb43",
    true,
    server(0.85, Some(32_768), Some(32_768), Some(1024), None),
    server(0.85, None, None, Some(1024), None),
);
/// `b200-fp8/8k1k_stp_maxtpt_{0..3}.yaml` @4a22a181: prefill DP8 attention without expert
/// parallelism, one request a rank; the decode servers' request caps 128 to 1,024.
const fn b200_fp8_stp_maxtpt(file: &'static str, decode_running: u32) -> Recipe {
    recipe(
        file,
        true,
        server(0.60, Some(65_536), Some(8192), Some(8), None),
        server(0.75, None, None, Some(decode_running), None),
    )
}
const B200_FP4_8K_7P2D: Recipe = recipe(
    "b200-fp4/8k1k/stp/max-tpt-dep4-7p-dep8-2d.yaml @5063eb43",
    true,
    server(0.85, Some(65_536), Some(65_536), Some(1024), None),
    server(0.85, Some(32_768), Some(32_768), Some(2048), None),
);
const fn b200_fp4_1k_dep4(file: &'static str, running: u32) -> Recipe {
    recipe(
        file,
        true,
        server(0.85, Some(32_768), Some(32_768), Some(running), None),
        server(0.85, None, None, Some(running), None),
    )
}
const B200_FP4_8K_DEP4_TEP8: Recipe = recipe(
    "b200-fp4/8k1k/stp/low-latency-dep4-1p-tep8-1d.yaml @5063eb43",
    true,
    server(0.85, Some(32_768), Some(32_768), Some(1024), None),
    server(0.85, None, None, Some(512), None),
);
const B200_FP4_8K_TP4_TP8: Recipe = recipe(
    "b200-fp4/8k1k/stp/low-latency-tp4-1p-tp8-1d.yaml @5063eb43",
    true,
    server(0.85, Some(32_768), Some(32_768), Some(512), None),
    server(0.85, None, None, Some(512), None),
);

// H200 (srt-slurm 5063eb43; KV in the model's dtype, `flashinfer` attention).
const H200_FP8_8K_1P1D_DEP: Recipe = recipe(
    "h200/8k1k/bs128-1p1d-dep.yaml @5063eb43",
    false,
    server(0.75, Some(163_840), Some(163_840), Some(16), None),
    server(0.88, None, None, Some(256), None),
);

/// A campaign of runs: GPU (`system`), SGLang version, weights' format (`gemm_quant_mode`).
type Campaign = (&'static str, &'static str, &'static str);
const GB200_058_FP4: Campaign = ("gb200", "0.5.8", "nvfp4");
const GB200_058P1_FP8: Campaign = ("gb200", "0.5.8.post1", "fp8");
const GB200_055_FP8: Campaign = ("gb200", "0.5.5.post2", "fp8");
const GB200_055_FP4: Campaign = ("gb200", "0.5.5.post2", "nvfp4");
const B200_FP8: Campaign = ("b200_sxm", "0.5.8.post1", "fp8");
const B200_FP4: Campaign = ("b200_sxm", "0.5.8.post1", "nvfp4");
const H200_FP8: Campaign = ("h200_sxm", "0.5.8.post1", "fp8");

/// Every disaggregated SGLang configuration of `silicon.csv` that records its pools, with
/// its recipe: `e(campaign, prompt tokens, [prefill, decode] as labelled, recipe)`.
#[rustfmt::skip]
const ENTRIES: &[Entry] = &[
    // GB200, January-February 2026 (SGLang 0.5.8 and 0.5.8.post1).
    e(GB200_058_FP4, 1024, [(4, 1, 4, 4), (1, 1, 32, 32)], GB200_FP4_1K_MID),
    e(GB200_058_FP4, 1024, [(1, 4, 1, 1), (2, 4, 1, 1)], GB200_FP4_1K_LOW),
    e(GB200_058_FP4, 8192, [(1, 4, 1, 1), (4, 4, 1, 1)], GB200_FP4_8K_LOW),
    e(GB200_058P1_FP8, 1024, [(1, 4, 1, 1), (1, 4, 1, 1)], GB200_FP8_1K_LOW),
    e(GB200_058P1_FP8, 1024, [(1, 1, 8, 8), (1, 1, 8, 8)], GB200_FP8_1K_ULTRA),
    e(GB200_058P1_FP8, 1024, [(2, 1, 8, 8), (1, 1, 32, 32)], GB200_FP8_1K_MAX),
    e(GB200_058P1_FP8, 8192, [(5, 1, 8, 8), (1, 1, 32, 32)], GB200_FP8_8K_MID),
    e(GB200_058P1_FP8, 8192, [(1, 8, 1, 1), (1, 8, 1, 1)], GB200_FP8_8K_LOW),
    // GB200, December 2025 (SGLang 0.5.5.post2): labels partly placeholders.
    e(GB200_055_FP8, 1024, [(1, 1, 4, 1), (4, 1, 4, 1)], relabel(GB200_FP8_1K_LOW_1P4D, [(1, 4, 1, 1), (4, 4, 1, 1)])),
    e(GB200_055_FP4, 1024, [(1, 1, 4, 1), (2, 1, 4, 1)], relabel(GB200_FP4_1K_LOW, [(1, 4, 1, 1), (2, 4, 1, 1)])),
    e(GB200_055_FP4, 1024, [(4, 1, 4, 1), (1, 1, 32, 1)], relabel(GB200_FP4_1K_MID, [(4, 1, 4, 4), (1, 1, 32, 32)])),
    e(GB200_055_FP8, 8192, [(5, 1, 8, 1), (1, 1, 32, 1)], relabel(GB200_FP8_8K_MID, [(5, 1, 8, 8), (1, 1, 32, 32)])),
    e(GB200_055_FP4, 8192, [(1, 4, 1, 1), (4, 1, 4, 1)], relabel(GB200_FP4_8K_LOW, [(1, 4, 1, 1), (4, 4, 1, 1)])),
    e(GB200_055_FP4, 8192, [(10, 1, 4, 1), (1, 1, 32, 1)], relabel(GB200_FP4_8K_MAX, [(10, 4, 1, 1), (1, 1, 32, 32)])),
    // B200 (SGLang 0.5.8.post1).
    e(B200_FP8, 1024, [(1, 8, 1, 8), (1, 8, 1, 8)], B200_FP8_TEP8),
    e(B200_FP8, 8192, [(1, 8, 1, 8), (1, 8, 1, 8)], B200_FP8_TEP8),
    e(B200_FP8, 8192, [(1, 8, 1, 8), (4, 8, 1, 8)], B200_FP8_TEP8),
    e(B200_FP8, 8192, [(1, 1, 8, 8), (1, 1, 8, 8)], B200_FP8_DEP8),
    e(B200_FP8, 8192, [(2, 1, 8, 8), (1, 1, 8, 8)], B200_FP8_DEP8),
    e(B200_FP8, 8192, [(1, 1, 8, 1), (2, 1, 8, 8)], b200_fp8_stp_maxtpt("b200-fp8/8k1k_stp_maxtpt_0.yaml @4a22a181", 128)),
    e(B200_FP8, 8192, [(1, 1, 8, 1), (1, 1, 8, 8)], b200_fp8_stp_maxtpt("b200-fp8/8k1k_stp_maxtpt_1.yaml @4a22a181", 256)),
    e(B200_FP8, 8192, [(2, 1, 8, 1), (1, 1, 8, 8)], b200_fp8_stp_maxtpt("b200-fp8/8k1k_stp_maxtpt_2.yaml @4a22a181", 512)),
    e(B200_FP8, 8192, [(3, 1, 8, 1), (1, 1, 8, 8)], b200_fp8_stp_maxtpt("b200-fp8/8k1k_stp_maxtpt_3.yaml @4a22a181", 1024)),
    e(B200_FP4, 8192, [(7, 1, 4, 4), (2, 1, 8, 8)], B200_FP4_8K_7P2D),
    e(B200_FP4, 1024, [(1, 1, 4, 4), (1, 1, 8, 8)], b200_fp4_1k_dep4("b200-fp4/1k1k/stp/max-tpt-dep4-1p-dep8-1d.yaml @5063eb43", 1024)),
    e(B200_FP4, 1024, [(1, 1, 4, 4), (2, 1, 8, 8)], b200_fp4_1k_dep4("b200-fp4/1k1k/stp/max-tpt-dep4-1p-dep8-2d.yaml @5063eb43", 512)),
    e(B200_FP4, 8192, [(1, 1, 4, 4), (1, 8, 1, 8)], B200_FP4_8K_DEP4_TEP8),
    e(B200_FP4, 8192, [(1, 4, 1, 1), (1, 8, 1, 1)], B200_FP4_8K_TP4_TP8),
    // H200 (SGLang 0.5.8.post1).
    e(H200_FP8, 8192, [(1, 8, 1, 1), (1, 1, 8, 8)], H200_FP8_8K_1P1D_DEP),
];

/// The recipe a disaggregated SGLang row of DeepSeek ran, matched by its GPU, version,
/// weights' format, prompt length and labelled pools; `None` when none matches. Every
/// recipe is a 1k/1k or 8k/1k one: a row with other outputs matches none.
pub(crate) fn find(row: &AggregateRow, labelled: [Layout; 2]) -> Option<&'static Recipe> {
    if row.backend != "sglang" || !row.model.starts_with("deepseek-ai/DeepSeek") || row.osl != 1024
    {
        return None;
    }
    ENTRIES
        .iter()
        .find(|e| {
            e.campaign
                == (
                    row.system.as_str(),
                    row.backend_version.as_str(),
                    row.gemm_quant.as_str(),
                )
                && e.isl == row.isl
                && e.labelled == labelled
        })
        .map(|e| &e.recipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_the_chunk_and_the_request_cap() {
        // GB200 fp8 1k/1k max-tpt prefill: 131,072 tokens over DEP8 is 16,384 a rank.
        let p = GB200_FP8_1K_MAX.prefill;
        assert_eq!(p.rank_chunk(8), Some(16_384));
        assert_eq!(p.rank_max_running(8), Some(3750));
        // B200 fp8 8k/1k max-tpt: 65,536 over DP8 is 8,192, which max-prefill-tokens also
        // sets; one request a rank.
        let s = b200_fp8_stp_maxtpt("x", 128);
        assert_eq!(s.prefill.rank_chunk(8), Some(8192));
        assert_eq!(s.prefill.rank_max_running(8), Some(1));
        // Its two DEP8 decode servers: 128 requests each, 16 a rank.
        assert_eq!(s.decode.rank_max_running(8), Some(16));
        // A TP server keeps the whole chunk; a decode server with no chunk setting has none.
        assert_eq!(GB200_FP4_8K_LOW.prefill.rank_chunk(1), Some(24_576));
        assert_eq!(B200_FP8_DEP8.decode.rank_chunk(8), None);
        assert_eq!(GB200_FP4_1K_LOW.decode.rank_max_running(1), None);
    }

    #[test]
    fn every_entry_is_told_apart() {
        for (i, a) in ENTRIES.iter().enumerate() {
            for b in &ENTRIES[i + 1..] {
                assert!(
                    (a.campaign, a.isl, a.labelled) != (b.campaign, b.isl, b.labelled),
                    "two recipes for one configuration: {} and {}",
                    a.recipe.file,
                    b.recipe.file
                );
            }
            let r = &a.recipe;
            for s in [r.prefill, r.decode] {
                assert!(s.mem_fraction > 0.5 && s.mem_fraction < 1.0, "{}", r.file);
            }
            // Relabelled pools keep the row's GPU count (workers x TP x DP).
            if let Some(real) = r.layouts {
                for (l, g) in a.labelled.iter().zip(real.iter()) {
                    assert_eq!(l.0 * l.1 * l.2, g.0 * g.1 * g.2, "{}", r.file);
                }
            }
        }
    }
}
