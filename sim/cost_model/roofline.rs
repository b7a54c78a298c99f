//! The roofline of one engine step ([`CostModel`], DESIGN §6): per operator of a layer,
//! `max(FLOPs / (peak x eff_compute), bytes / (bandwidth x eff_memory)) + launch overhead`
//! (a soft maximum when `overlap_exponent` is set); a step is the layers' sum plus the LM
//! head, the tensor-parallel all-reduces, pipeline hand-offs, KV block moves and the
//! framework's CPU overhead. In: a [`StepPlan`] (or the step's prefill and decode work); out:
//! a [`StepCost`] split by operator family.

use engine::plan::{StepPlan, WorkKind};

use std::sync::Arc;

use super::profiled::ProfiledCosts;
use super::routing::Routing;
use super::{
    CostParams, Deployment, CUSTOM_ALLREDUCE_LATENCY_US, CUSTOM_ALLREDUCE_MAX_BYTES,
    CUSTOM_ALLREDUCE_MAX_GPUS,
};
use crate::catalog::Dtype;

/// Fixed cost of handing a batch's hidden states to the next pipeline stage, microseconds.
pub const P2P_LATENCY_US: f64 = 10.0;

/// Time, FLOPs and bytes of one step, split by operator family.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepCost {
    /// Total seconds.
    pub seconds: f64,
    /// Linear layers (all layers), seconds.
    pub linear_s: f64,
    /// Attention (all layers), seconds.
    pub attention_s: f64,
    /// Element-wise kernels, seconds.
    pub elementwise_s: f64,
    /// All-reduces, seconds.
    pub allreduce_s: f64,
    /// LM head, seconds.
    pub lm_head_s: f64,
    /// CPU overhead, seconds (with the pipeline stages' hand-offs, `p2p_s`).
    pub overhead_s: f64,
    /// Of `overhead_s`, the hand-offs of the hidden states between pipeline stages, seconds.
    pub p2p_s: f64,
    /// KV block transfers before the step: swap over PCIe and copy-on-write copies in HBM,
    /// seconds.
    pub kv_transfer_s: f64,
    /// FLOPs per GPU.
    pub flops: f64,
    /// HBM bytes per GPU.
    pub bytes: f64,
}

/// One layer's attention work in a step: FLOPs and bytes of the prefill chunks and of the
/// decodes, and the tokens of each.
#[derive(Debug, Default)]
struct AttentionWork {
    pf_flops: f64,
    pf_bytes: f64,
    prefill_tokens: f64,
    dc_flops: f64,
    dc_bytes: f64,
    decode_tokens: f64,
    /// Query-key pairs the prefill chunks attend, in all.
    pf_attended: f64,
    /// Prefill chunks.
    prefills: f64,
    /// Whether a prefill chunk has more than one token: a chunk of one (a transferred
    /// request's last prompt token, a full prefix hit's) is shaped like a decode and runs as
    /// one, in the CUDA graphs and the MoE layers' decode kernels.
    multi_token_prefill: bool,
    /// Decoding sequences, and their contexts in all.
    decodes: f64,
    decode_ctx: f64,
}

/// Which of a layer's GEMMs [`CostModel::add_gemm`] prices: its format and efficiency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gemm {
    /// Attention projections (softmax, latent or linear attention).
    Attention,
    /// A dense MLP: a dense model's or layer's, or a mixture's shared experts.
    Mlp,
    /// A mixture's routed experts (a grouped GEMM).
    Experts,
}

/// One layer's linear layers in a step: seconds, FLOPs and bytes, with the per-GPU Q and
/// KV widths and the experts each token runs (the element-wise kernels' sizes).
#[derive(Debug, Default)]
struct LinearWork {
    seconds: f64,
    flops: f64,
    bytes: f64,
    q: f64,
    kv: f64,
    top_k: f64,
}

/// The cost model: predicts step durations for a deployment.
#[derive(Debug, Clone)]
pub struct CostModel {
    d: Deployment,
    p: CostParams,
    block_size: u32,
    window: Option<u32>,
    /// Measured operator times that replace the roofline's layers, LM head and sampler.
    profile: Option<Arc<ProfiledCosts>>,
    /// Which experts a step's tokens touch.
    routing: Routing,
    /// Read bandwidth of the KV disk tier per GPU, bytes/s.
    disk_bw: f64,
}

impl CostModel {
    /// A cost model of `d` with parameters `p` (with `p.by_gpu`'s efficiencies for `d`'s GPU,
    /// and its expert kernels' for `d`'s expert format and experts' shape).
    pub fn new(d: Deployment, p: CostParams) -> Self {
        let p = if p.by_gpu.is_empty() {
            p
        } else {
            p.on_deployment(d.gpu.name, d.dtype, super::ExpertShape::of(&d.model))
        };
        let routing = Routing::new(
            d.model.num_experts,
            d.model.experts_per_token,
            p.moe_routing_skew,
        );
        CostModel {
            d,
            p,
            block_size: 16,
            window: None,
            profile: None,
            routing,
            // One NVMe PCIe 4.0 drive per GPU (`engine.kv_disk_gbs`' default).
            disk_bw: 6e9,
        }
    }

    /// The KV disk tier's read bandwidth per GPU, bytes/s.
    pub fn with_disk_bw(mut self, bytes_per_s: f64) -> Self {
        self.disk_bw = bytes_per_s;
        self
    }

    /// Seconds to read `blocks` of the KV disk tier (before they cross PCIe).
    fn disk_read_s(&self, blocks: u32) -> f64 {
        if blocks == 0 {
            return 0.0;
        }
        f64::from(blocks) * self.block_bytes_per_gpu() / self.disk_bw
    }

    /// Sliding-window attention: each token attends to at most `window` tokens (`None`:
    /// the whole context).
    pub fn with_sliding_window(mut self, window: Option<u32>) -> Self {
        self.window = window;
        self
    }

    /// Sum over the positions `cached + 1 ..= cached + len` of the tokens each attends to,
    /// `min(position, window)`.
    fn attended(&self, cached: u32, len: u32, window: Option<u32>) -> f64 {
        let (a, b) = (f64::from(cached) + 1.0, f64::from(cached) + f64::from(len));
        let full = |lo: f64, hi: f64| (lo + hi) * (hi - lo + 1.0) / 2.0;
        match window.map(f64::from) {
            Some(w) if b > w => {
                if a > w {
                    w * f64::from(len)
                } else {
                    full(a, w) + (b - w) * w
                }
            }
            _ => full(a, b),
        }
    }

    /// Prices a layer's operators, the LM head and the sampler from measured operator
    /// times (the profile of this model on this GPU at this degree) instead of the roofline.
    pub fn with_profile(mut self, profile: Option<Arc<ProfiledCosts>>) -> Self {
        self.profile = profile;
        self
    }

    /// Sets the KV block size in tokens (for swap and copy costs; default 16).
    pub fn with_block_size(mut self, block_size: u32) -> Self {
        self.block_size = block_size;
        self
    }

    /// The deployment.
    pub fn deployment(&self) -> &Deployment {
        &self.d
    }

    fn roofline(&self, flops: f64, bytes: f64, eff_c: f64, eff_m: f64, peak: f64) -> f64 {
        let (tc, tm) = (flops / (peak * eff_c), bytes / (self.d.gpu.mem_bw * eff_m));
        let t = match self.p.overlap_exponent {
            // A soft maximum: compute and memory traffic overlap imperfectly near the ridge.
            Some(p) if tc > 0.0 && tm > 0.0 => {
                let hi = tc.max(tm);
                hi * ((tc / hi).powf(p) + (tm / hi).powf(p)).powf(1.0 / p)
            }
            _ => tc.max(tm),
        };
        t + self.p.kernel_launch_us() * 1e-6
    }

    /// Time of one `m x k` by `k x n` GEMM in the deployment's weight format (the weight
    /// is the `k x n` operand), on the same roofline as the linear layers.
    pub fn gemm_s(&self, m: f64, k: f64, n: f64) -> f64 {
        let flops = 2.0 * m * k * n;
        let bytes = k * n * self.d.dtype.bytes() + m * (k + n) * 2.0;
        let (eff_c, eff_m) = self.gemm_effs(self.d.dtype);
        self.roofline(
            flops,
            bytes,
            eff_c,
            eff_m * self.dense_stream_eff(self.d.dtype),
            self.d.gpu.peak_flops(self.d.dtype),
        )
    }

    /// Time of one expert-parallel all-to-all (a dispatch or a combine) of a rank's
    /// `tokens` hidden states: each GPU sends its `1 / tp` share of them, each to the GPUs
    /// of the distinct expert groups its `k` experts live in (`ep (1 - (1 - 1/ep)^k)` of
    /// them, `moe_tp` GPUs each), all but its own, in 16 bits.
    pub fn all_to_all_s(&self, tokens: f64) -> f64 {
        let n = f64::from(self.d.stage_gpus());
        if n <= 1.0 || tokens <= 0.0 {
            return 0.0;
        }
        let m = &self.d.model;
        let ep = f64::from(self.d.parallel.ep.max(1));
        let k = f64::from(m.experts_per_token.max(1));
        let groups = ep * (1.0 - (1.0 - 1.0 / ep).powf(k));
        let copies = groups * f64::from(self.d.moe_tp()) * (n - 1.0) / n;
        let bytes = tokens / f64::from(self.d.tp) * f64::from(m.hidden) * 2.0 * copies;
        let eff = self.p.allreduce_eff.unwrap_or(self.d.gpu.allreduce_eff);
        bytes / (self.link_bw(self.d.stage_gpus()) * eff)
            + self
                .p
                .allreduce_latency_us
                .unwrap_or(self.d.gpu.allreduce_latency_us)
                * 1e-6
    }

    /// Bandwidth per GPU and direction among `gpus` GPUs: the GPU link (NVLink) inside
    /// its domain, the scale-out network beyond.
    fn link_bw(&self, gpus: u32) -> f64 {
        if self.one_domain(gpus) {
            self.d.gpu.link_bw
        } else {
            self.d.gpu.link_bw.min(self.d.gpu.network_bw)
        }
    }

    /// Whether `gpus` GPUs fit in one NVLink domain (one node, or a GB200 NVL72 rack).
    fn one_domain(&self, gpus: u32) -> bool {
        gpus <= self.d.gpu.nvlink_domain
    }

    /// Time of one ring all-reduce of `bytes` over `tp` GPUs.
    pub fn allreduce_s(&self, bytes: f64) -> f64 {
        let tp = f64::from(self.d.tp);
        if self.d.tp <= 1 {
            return 0.0;
        }
        let eff = self.p.allreduce_eff.unwrap_or(self.d.gpu.allreduce_eff);
        // vLLM enables its custom all-reduce over NVLink, or on two PCIe GPUs; the engines'
        // custom all-reduces need peer access, so a group beyond one NVLink domain (TP16
        // over two 8-GPU nodes) runs NCCL's; and they take at most 8 GPUs (vLLM's
        // `CustomAllreduce._SUPPORTED_WORLD_SIZES`), so TP16 in a GB200 NVL72 rack does too.
        let peer_to_peer = self.one_domain(self.d.tp)
            && self.d.tp <= CUSTOM_ALLREDUCE_MAX_GPUS
            && (self.d.gpu.link_bw > self.d.gpu.pcie_bw || self.d.tp == 2);
        let custom = self
            .p
            .custom_allreduce
            .unwrap_or(self.p.framework.has_custom_allreduce() && peer_to_peer);
        let one_shot = custom && bytes <= CUSTOM_ALLREDUCE_MAX_BYTES;
        let latency = match self.p.allreduce_latency_us {
            Some(l) => l,
            None if one_shot => CUSTOM_ALLREDUCE_LATENCY_US,
            None => self.d.gpu.allreduce_latency_us,
        };
        // A one-shot kernel reads every peer's buffer and waits on every peer's flag: its
        // fixed cost grows with the GPUs beyond a pair (the latency above is a pair's).
        let peers = if one_shot {
            self.p.allreduce_peer_us * (tp - 2.0).max(0.0)
        } else {
            0.0
        };
        2.0 * (tp - 1.0) / tp * bytes / (self.link_bw(self.d.tp) * eff) + (latency + peers) * 1e-6
    }

    /// Cost of a step of `num_seqs` sequences that computes `prefill` chunks `(cached,
    /// len)` and `decode` work `(context, queries)` (tokens attended including the new
    /// ones; 1 query for a decode, `1 + k` for a speculative verify, whose queries read
    /// the context's K and V once), taking logits at `samples` positions.
    pub fn step_cost(
        &self,
        prefill: impl Iterator<Item = (u32, u32)>,
        decode: impl Iterator<Item = (u32, u32)>,
        samples: u32,
        num_seqs: u32,
    ) -> StepCost {
        self.group_step_cost(prefill, decode, samples, num_seqs, None)
    }

    /// [`Self::step_cost`] on one rank of an attention-DP group whose ranks compute
    /// `group_tokens` tokens in all this step (their MoE layers run every rank's tokens);
    /// `None`: every rank computes as many as this one.
    pub fn group_step_cost(
        &self,
        prefill: impl Iterator<Item = (u32, u32)>,
        decode: impl Iterator<Item = (u32, u32)>,
        samples: u32,
        num_seqs: u32,
        group_tokens: Option<f64>,
    ) -> StepCost {
        let m = &self.d.model;
        let act = 2.0; // 16-bit activations
        let tp = f64::from(self.d.tp);
        let hidden = f64::from(m.hidden);
        let inter = f64::from(m.intermediate) / tp;
        let (a, a_slide) = self.attention_work(prefill, decode);
        let tokens = a.prefill_tokens + a.decode_tokens;
        // The tokens the routed experts compute: every attention-DP rank's.
        let dp = f64::from(self.d.parallel.dp.max(1));
        let routed = group_tokens.map_or(tokens * dp, |g| g.max(tokens));
        let lin = self.linear_layers(tokens, routed);
        // Two RMSNorms, RoPE, SwiGLU and two residual adds: five memory-bound kernels.
        let ew_bytes = tokens
            * (6.0 * hidden + 2.0 * (lin.q + lin.kv) + m.mlp_matrices() * inter * lin.top_k)
            * act;
        let ew_s = ew_bytes / (self.d.gpu.mem_bw * self.p.elementwise_memory_eff)
            + 5.0 * self.p.kernel_launch_us() * 1e-6;
        let ar_s = 2.0 * self.allreduce_s(tokens * hidden * act);
        let (head_s, head_flops, head_bytes) = self.lm_head(samples);
        // A step that prefills runs its experts' GEMMs as their own problems, outside the
        // CUDA graphs: a fixed cost per expert of the model and MoE layer. Not per local
        // expert: the measured floors do not shrink with expert parallelism (an EP8 rank's
        // prefill waits, at each layer's dispatch and combine, for the other ranks').
        let eager = a.multi_token_prefill;
        // Measured MoE kernels ran eagerly, launches included: no fitted floors on them.
        let fitted_moe = m.is_moe() && self.profile.as_ref().is_none_or(|p| !p.has_moe());
        let eager_us = if eager && fitted_moe {
            f64::from(m.moe_layers()) * f64::from(m.num_experts) * self.p.moe_prefill_expert_us
        } else {
            0.0
        };
        // Every step's MoE layers route, sort and permute their tokens: small kernels of a
        // fixed cost.
        let routing_us = if tokens > 0.0 && fitted_moe {
            f64::from(m.moe_layers()) * self.p.moe_layer_us
        } else {
            0.0
        };
        let overhead_s = (self.p.step_overhead_us()
            + self.p.per_seq_overhead_us() * f64::from(num_seqs)
            + eager_us
            + routing_us)
            * 1e-6;

        // Pipeline parallelism: a batch passes the stages one after another, handing its
        // hidden states on between stages (with micro-batches in flight the driver starts
        // the next batch once the first stage is free, `StepOutcome::interval`; one batch
        // at a time, each GPU idles (pp - 1) / pp of the step: the bubble).
        let pp = f64::from(self.d.pp.max(1));
        let p2p_s =
            (pp - 1.0) * (tokens * hidden * act / self.d.gpu.link_bw + P2P_LATENCY_US * 1e-6);
        let overhead_s = overhead_s + p2p_s;
        let layers = f64::from(m.layers);
        let (linear_s, attention_s, elementwise_s, head_s) = match &self.profile {
            // Measured: one layer's operators times the layers, plus what runs once a step.
            Some(p) => (
                self.profiled_linear_s(p, tokens, routed),
                layers * p.attention_s(a.prefill_tokens, a.pf_attended, a.decodes, a.decode_ctx),
                layers * p.elementwise_s(tokens) + p.per_step_s(tokens),
                // The logits' all-gather under TP is not in the profile.
                p.head_s(f64::from(samples)) + self.logits_gather_s(samples),
            ),
            // The roofline's attention only when it is used (the profile's replaces it).
            None => (
                lin.seconds,
                self.attention_layers_s(&a, &a_slide),
                layers * ew_s,
                head_s,
            ),
        };
        // Attention data parallelism: the attention's all-reduce stays within a rank's TP
        // group; the MoE layers dispatch tokens to their experts' GPUs and combine the
        // results (two all-to-alls), the dense layers all-reduce as usual.
        let (attn_flops, attn_bytes) = self.attention_layers_work(&a, &a_slide);
        let allreduce_s = if self.d.parallel.dp > 1 {
            let ar = self.allreduce_s(tokens * hidden * act);
            let moe = f64::from(m.moe_layers());
            layers * ar + (layers - moe) * ar + moe * 2.0 * self.all_to_all_s(tokens)
        } else {
            layers * ar_s
        };
        // A step that prefills, or decodes more tokens or draws than the CUDA graphs were
        // captured for, runs outside them: its GPUs wait for the host to launch each
        // layer, so it lasts at least the host's time (the excess counted as overhead).
        let gpu_s = linear_s + attention_s + elementwise_s + allreduce_s + head_s;
        let beyond_graphs = self
            .p
            .graph_max_tokens
            .is_some_and(|g| tokens > f64::from(g) || samples > g);
        let host_s = match self.p.eager_layer_us {
            Some(us) if eager || beyond_graphs => layers * us * 1e-6,
            _ => 0.0,
        };
        let overhead_s = overhead_s + (host_s - gpu_s).max(0.0);
        StepCost {
            seconds: gpu_s + overhead_s,
            linear_s,
            attention_s,
            elementwise_s,
            allreduce_s,
            lm_head_s: head_s,
            overhead_s,
            p2p_s,
            kv_transfer_s: 0.0,
            flops: lin.flops + attn_flops + head_flops,
            bytes: lin.bytes + attn_bytes + layers * ew_bytes + head_bytes,
        }
    }

    /// FLOPs and bytes of one layer's attention over the step's prefill chunks and
    /// decodes: of a full-attention (or latent, or uniformly sliding) layer, and of a
    /// hybrid model's sliding layer when it has them.
    fn attention_work(
        &self,
        prefill: impl Iterator<Item = (u32, u32)>,
        decode: impl Iterator<Item = (u32, u32)>,
    ) -> (AttentionWork, Option<AttentionWork>) {
        let m = &self.d.model;
        let mut w = AttentionWork::default();
        let hybrid = m.arch.sliding;
        let mut s = AttentionWork::default();
        let window = self.window.map_or(f64::INFINITY, f64::from);
        for (cached, len) in prefill {
            // Causal attention: the token at position p attends to min(p, window) tokens.
            let attended = self.attended(cached, len, self.window);
            self.add_prefill(&mut w, cached, len, attended, window);
            if let Some(h) = hybrid {
                let attended = self.attended(cached, len, Some(h.window));
                self.add_prefill(&mut s, cached, len, attended, f64::from(h.window));
            }
        }
        for (ctx, queries) in decode {
            self.add_decode(&mut w, ctx, queries, window);
            if let Some(h) = hybrid {
                self.add_decode(&mut s, ctx, queries, f64::from(h.window));
            }
        }
        (w, hybrid.map(|_| s))
    }

    /// One prefill chunk (`len` tokens after `cached`, `attended` query-key pairs) of one
    /// layer. Softmax attention: FLOPs = 4 x heads x head_dim x attended; bytes: the
    /// chunk's Q/K/V/O plus the cached K/V read. Latent attention runs expanded: Q.K over
    /// the query/key width, P.V over the value width, after up-projecting the cached
    /// latent to keys and values.
    fn add_prefill(
        &self,
        w: &mut AttentionWork,
        cached: u32,
        len: u32,
        attended: f64,
        window: f64,
    ) {
        let m = &self.d.model;
        let act = 2.0; // 16-bit activations
        let kvb = self.d.kv_dtype.bytes();
        let heads = f64::from(m.heads) / f64::from(self.d.tp);
        let (c, l) = (f64::from(cached), f64::from(len));
        w.pf_attended += attended;
        w.prefill_tokens += l;
        w.prefills += 1.0;
        w.multi_token_prefill |= len > 1;
        match &m.arch.mla {
            Some(mla) => {
                let (qk, v) = (f64::from(mla.qk_head_dim()), f64::from(mla.v_head_dim));
                let up = f64::from(mla.qk_nope_head_dim + mla.v_head_dim);
                w.pf_flops += 2.0 * heads * attended * (qk + v)
                    + 2.0 * c * f64::from(mla.kv_lora_rank) * heads * up;
                w.pf_bytes += l * heads * 2.0 * (qk + v) * act
                    + c * (f64::from(mla.cache_width()) * kvb + heads * (qk + v) * act);
            }
            None => {
                let hd = f64::from(m.head_dim);
                let kv_heads = f64::from(self.d.kv_heads_per_gpu());
                w.pf_flops += 4.0 * heads * hd * attended;
                w.pf_bytes += l * (2.0 * heads + 2.0 * kv_heads) * hd * act
                    + c.min(window) * 2.0 * kv_heads * hd * kvb;
            }
        }
    }

    /// One decode (or verify: `queries` queries) at context `ctx` of one layer: a
    /// bandwidth-bound read of the context's K and V, once for all the queries. Latent
    /// attention runs absorbed: every head attends over the shared latent and RoPE key
    /// (scores over `kv_lora_rank + qk_rope_head_dim`, values over `kv_lora_rank`), reading
    /// the latent once.
    fn add_decode(&self, w: &mut AttentionWork, ctx: u32, queries: u32, window: f64) {
        let m = &self.d.model;
        let kvb = self.d.kv_dtype.bytes();
        let heads = f64::from(m.heads) / f64::from(self.d.tp);
        let (c, q) = (f64::from(ctx).min(window), f64::from(queries.max(1)));
        match &m.arch.mla {
            Some(mla) => {
                let (cache, lora) = (f64::from(mla.cache_width()), f64::from(mla.kv_lora_rank));
                w.dc_flops += 2.0 * heads * c * q * (cache + lora);
                w.dc_bytes += c * cache * kvb;
            }
            None => {
                let hd = f64::from(m.head_dim);
                let kv_heads = f64::from(self.d.kv_heads_per_gpu());
                w.dc_flops += 4.0 * heads * hd * c * q;
                w.dc_bytes += c * 2.0 * kv_heads * hd * kvb;
            }
        }
        w.decode_tokens += q;
        w.decodes += 1.0;
        w.decode_ctx += c;
    }

    /// Seconds of every layer's attention kernels: the full-attention layers, a hybrid
    /// model's sliding layers, and its linear-attention layers.
    fn attention_layers_s(&self, a: &AttentionWork, slide: &Option<AttentionWork>) -> f64 {
        let m = &self.d.model;
        let full = f64::from(m.full_attention_layers());
        let mut s = full * self.attention_s(a);
        if let (Some(h), Some(w)) = (m.arch.sliding, slide) {
            s += f64::from(h.layers) * self.attention_s(w);
        }
        if let Some(l) = m.arch.linear {
            let (flops, bytes) = self.linear_attention_work(a);
            let t = self.roofline(
                flops,
                bytes,
                self.p.attn_compute_eff,
                self.p.attn_memory_eff,
                self.d.gpu.peak_flops(Dtype::Bf16),
            );
            s += f64::from(l.layers) * t;
        }
        s
    }

    /// (FLOPs, bytes) of every layer's attention, summed over the layer kinds as
    /// [`CostModel::attention_layers_s`] sums seconds.
    fn attention_layers_work(
        &self,
        a: &AttentionWork,
        slide: &Option<AttentionWork>,
    ) -> (f64, f64) {
        let m = &self.d.model;
        let full = f64::from(m.full_attention_layers());
        let mut flops = full * (a.pf_flops + a.dc_flops);
        let mut bytes = full * (a.pf_bytes + a.dc_bytes);
        if let (Some(h), Some(w)) = (m.arch.sliding, slide) {
            flops += f64::from(h.layers) * (w.pf_flops + w.dc_flops);
            bytes += f64::from(h.layers) * (w.pf_bytes + w.dc_bytes);
        }
        if let Some(l) = m.arch.linear {
            let (f, b) = self.linear_attention_work(a);
            flops += f64::from(l.layers) * f;
            bytes += f64::from(l.layers) * b;
        }
        (flops, bytes)
    }

    /// (FLOPs, bytes) of one Gated DeltaNet layer on one GPU over the step's tokens: per
    /// token and value head, the delta-rule state update and the output read (6 x key_dim
    /// x value_dim), the short convolution, and in prefill the chunked form's intra-chunk
    /// attention (chunks of 64); bytes: each sequence's state read and written once, and
    /// the token's q/k/v/z in and output out.
    fn linear_attention_work(&self, a: &AttentionWork) -> (f64, f64) {
        let Some(l) = self.d.model.arch.linear else {
            return (0.0, 0.0);
        };
        const CHUNK: f64 = 64.0;
        let act = 2.0;
        let tp = f64::from(self.d.tp);
        let tokens = a.prefill_tokens + a.decode_tokens;
        let vh = f64::from(l.value_heads) / tp;
        let (kd, vd) = (f64::from(l.key_head_dim), f64::from(l.value_head_dim));
        let flops = tokens * vh * kd * vd * 6.0
            + tokens * l.qkv_width() / tp * f64::from(l.conv_kernel) * 2.0
            + a.prefill_tokens * CHUNK * vh * (kd + vd) * 2.0;
        let seqs = a.prefills + a.decodes;
        let bytes = seqs * 2.0 * l.state_bytes_per_seq(self.d.tp)
            + tokens * (l.qkv_width() + 2.0 * l.value_width()) / tp * act;
        (flops, bytes)
    }

    /// Seconds of one layer's attention kernels (prefill and decode run as two).
    fn attention_s(&self, a: &AttentionWork) -> f64 {
        let peak16 = self.d.gpu.peak_flops(Dtype::Bf16);
        let mut attn_s = 0.0;
        if a.prefill_tokens > 0.0 {
            attn_s += self.roofline(
                a.pf_flops,
                a.pf_bytes,
                self.p.attn_compute_eff
                    * self
                        .p
                        .prefill_attention_scale
                        .unwrap_or(self.p.framework.prefill_attention_scale()),
                self.p.attn_memory_eff,
                peak16,
            );
        }
        if a.decode_tokens > 0.0 {
            attn_s += self.roofline(
                a.dc_flops,
                a.dc_bytes,
                self.p.attn_compute_eff,
                self.p.attn_memory_eff,
                peak16,
            );
        }
        attn_s
    }

    /// The GEMM efficiencies (compute, memory) of weights in `dtype` on this GPU.
    fn gemm_effs(&self, dtype: Dtype) -> (f64, f64) {
        match dtype {
            // fp8 and fp4 GEMMs reach their own fractions of their peaks (scales, narrower
            // tiles); their weight streaming is `dense_stream_eff`'s.
            d if d.is_fp8() && self.d.gpu.flops_fp8.is_some() => (
                self.p.gemm_compute_eff * self.p.fp8_compute_eff,
                self.p.gemm_memory_eff,
            ),
            d if d.is_fp4() && self.d.gpu.flops_fp4.is_some() => (
                self.p.gemm_compute_eff * self.p.fp4_compute_eff,
                self.p.gemm_memory_eff,
            ),
            d if !self.d.gpu.dequantises(d) => (self.p.gemm_compute_eff, self.p.gemm_memory_eff),
            // Weight-only formats, and fp4 without fp4 tensor cores (Marlin), are unpacked
            // to 16 bits.
            d => (
                self.p.gemm_compute_eff * self.p.dequant_compute_eff,
                self.p.gemm_memory_eff
                    * if d.bytes() >= 1.0 {
                        self.p.w8_memory_eff
                    } else {
                        self.p.w4_memory_eff
                    },
            ),
        }
    }

    /// The weight-streaming efficiency of a dense GEMM in `dtype` relative to a 16-bit
    /// one's: `fp8_memory_eff` and `fp4_memory_eff` on their tensor cores (fitted to the
    /// dense models' fp8 and NVFP4 rows), 1 otherwise. The routed experts' grouped GEMMs
    /// do not take it: `moe_gemm_eff`, fitted to the mixture-of-experts rows, is their
    /// streaming, and applying both made those rows' fp4 decodes slower still where they
    /// were already slow (TensorRT-LLM's gpt-oss-120b on B200: TPOT +19% -> +53% signed
    /// median; BENCHMARKS, stop 53).
    fn dense_stream_eff(&self, dtype: Dtype) -> f64 {
        match dtype {
            d if d.is_fp8() && self.d.gpu.flops_fp8.is_some() => self.p.fp8_memory_eff,
            d if d.is_fp4() && self.d.gpu.flops_fp4.is_some() => self.p.fp4_memory_eff,
            _ => 1.0,
        }
    }

    /// Adds one layer's GEMM of `tokens x k` by `k x n` to `w`, run `runs` times per token
    /// (a token's experts) over weights read `reads` times (the experts the step touches);
    /// `kind` [`Gemm::Experts`]: an MoE grouped GEMM, at `moe_gemm_eff` of a dense GEMM's
    /// efficiency (a few tokens per expert, gathered and scattered), its compute side at
    /// `moe_compute_eff` where that is set.
    #[allow(clippy::too_many_arguments)]
    fn add_gemm(
        &self,
        w: &mut LinearWork,
        tokens: f64,
        k: f64,
        n: f64,
        runs: f64,
        reads: f64,
        kind: Gemm,
    ) {
        let act = 2.0; // 16-bit activations
                       // The MLPs in the deployment's format; the attention projections may be kept in 16
                       // bits (fp4 mixtures of experts).
        let dtype = match kind {
            Gemm::Attention => self.d.attention_dtype(),
            Gemm::Mlp | Gemm::Experts => self.d.dtype,
        };
        let (gemm_eff, weight_mem_eff) = self.gemm_effs(dtype);
        let (scale, stream) = if kind == Gemm::Experts {
            (
                self.p.moe_compute_eff.unwrap_or(self.p.moe_gemm_eff),
                self.p.moe_gemm_eff,
            )
        } else {
            (1.0, self.dense_stream_eff(dtype))
        };
        let flops = 2.0 * tokens * k * n * runs;
        let bytes = k * n * dtype.bytes() * reads + tokens * (k + n) * act * runs;
        w.seconds += self.roofline(
            flops,
            bytes,
            gemm_eff * scale,
            weight_mem_eff * stream,
            self.d.gpu.peak_flops(dtype),
        );
        w.flops += flops;
        w.bytes += bytes;
    }

    /// One softmax-attention layer's projections on one GPU: Q (with its output gate),
    /// K, V and O; or latent attention's down-projections (replicated), up-projections
    /// and O.
    fn attention_projections(&self, w: &mut LinearWork, tokens: f64) {
        let m = &self.d.model;
        let tp = f64::from(self.d.tp);
        let hidden = f64::from(m.hidden);
        match &m.arch.mla {
            Some(mla) => {
                let heads = f64::from(m.heads) / tp;
                let q_in = if mla.q_lora_rank > 0 {
                    let r = f64::from(mla.q_lora_rank);
                    self.add_gemm(w, tokens, hidden, r, 1.0, 1.0, Gemm::Attention);
                    r
                } else {
                    hidden
                };
                let (kv_lora, cache) = (f64::from(mla.kv_lora_rank), f64::from(mla.cache_width()));
                let (nope, v) = (f64::from(mla.qk_nope_head_dim), f64::from(mla.v_head_dim));
                self.add_gemm(
                    w,
                    tokens,
                    q_in,
                    heads * f64::from(mla.qk_head_dim()),
                    1.0,
                    1.0,
                    Gemm::Attention,
                );
                self.add_gemm(w, tokens, hidden, cache, 1.0, 1.0, Gemm::Attention);
                // kv_b: the new tokens' keys and values in prefill; absorbed into the query
                // and output in decode, at the same FLOPs per token.
                self.add_gemm(
                    w,
                    tokens,
                    kv_lora,
                    heads * (nope + v),
                    1.0,
                    1.0,
                    Gemm::Attention,
                );
                self.add_gemm(w, tokens, heads * v, hidden, 1.0, 1.0, Gemm::Attention);
            }
            None => {
                let gate = if m.arch.attn_output_gate { 2.0 } else { 1.0 };
                self.add_gemm(
                    w,
                    tokens,
                    hidden,
                    gate * w.q + 2.0 * w.kv,
                    1.0,
                    1.0,
                    Gemm::Attention,
                );
                self.add_gemm(w, tokens, w.q, hidden, 1.0, 1.0, Gemm::Attention);
            }
        }
    }

    /// One layer's MLP on one GPU: a dense MLP of `width`, or the routed experts (every
    /// expert some token picked is read: with uniform routing, `E (1 - (1 - k/E)^T)`
    /// distinct experts for `T` tokens, 2 for one decode token of Mixtral, all 8 beyond a
    /// few dozen tokens; fewer under skewed routing, [`Routing`]; experts split over TP),
    /// the shared experts and the router.
    fn mlp(&self, w: &mut LinearWork, tokens: f64, all: f64, width: u32, experts: bool) {
        let m = &self.d.model;
        let hidden = f64::from(m.hidden);
        // Every attention data-parallel rank's tokens (`all`) meet in the routed experts;
        // each GPU holds `1 / ep` of the experts, each split `moe_tp` ways.
        let (routed, inter, runs, reads) = if experts {
            let ep = f64::from(self.d.parallel.ep.max(1));
            let k = f64::from(m.experts_per_token.clamp(1, m.num_experts));
            (
                all,
                f64::from(width) / f64::from(self.d.moe_tp()),
                k / ep,
                self.routing.distinct(all) / ep,
            )
        } else {
            (tokens, f64::from(width) / f64::from(self.d.tp), 1.0, 1.0)
        };
        // Gate and up together when gated, the up projection alone otherwise.
        let up = (m.mlp_matrices() - 1.0) * inter;
        let kind = if experts { Gemm::Experts } else { Gemm::Mlp };
        self.add_gemm(w, routed, hidden, up, runs, reads, kind);
        self.add_gemm(w, routed, inter, hidden, runs, reads, kind);
        if experts {
            // The shared experts: a dense MLP of the rank's own tokens.
            if m.arch.shared_expert_intermediate > 0 {
                self.mlp(w, tokens, tokens, m.arch.shared_expert_intermediate, false);
            }
            let (seconds, flops, bytes) = self.router(tokens);
            w.seconds += seconds;
            w.flops += flops;
            w.bytes += bytes;
        }
    }

    /// One MoE layer's router over `tokens` tokens: a tiny (hidden x experts) GEMM, and a
    /// top-k. (seconds, FLOPs, bytes)
    fn router(&self, tokens: f64) -> (f64, f64, f64) {
        let m = &self.d.model;
        let (gemm_eff, weight_mem_eff) = self.gemm_effs(self.d.attention_dtype());
        let (hidden, e) = (f64::from(m.hidden), f64::from(m.num_experts));
        let (flops, bytes) = (2.0 * tokens * hidden * e, hidden * e * 2.0);
        let seconds = self.roofline(
            flops,
            bytes,
            gemm_eff,
            weight_mem_eff,
            self.d.gpu.peak_flops(self.d.attention_dtype()),
        );
        (seconds, flops, bytes)
    }

    /// One linear-attention (Gated DeltaNet) layer's projections on one GPU: q, k, v, the
    /// gate z, the b and a gates; and the output.
    fn linear_attention_projections(&self, w: &mut LinearWork, tokens: f64) {
        let Some(l) = self.d.model.arch.linear else {
            return;
        };
        let tp = f64::from(self.d.tp);
        let hidden = f64::from(self.d.model.hidden);
        let width = (l.qkv_width() + l.value_width() + 2.0 * f64::from(l.value_heads)) / tp;
        self.add_gemm(w, tokens, hidden, width, 1.0, 1.0, Gemm::Attention);
        self.add_gemm(
            w,
            tokens,
            l.value_width() / tp,
            hidden,
            1.0,
            1.0,
            Gemm::Attention,
        );
    }

    /// Every layer's linear layers from an operator profile: a dense model's layers; or a
    /// mixture of experts' attention projections, then per MoE layer its routed experts on
    /// this GPU (`routed / ep` tokens over the rank's share of the distinct experts that
    /// `routed` tokens activate) and the router on the roofline. The scenario checks admit
    /// only uniform stacks with a profile, so every layer of a mixture of experts is a MoE
    /// layer without shared experts.
    fn profiled_linear_s(&self, p: &ProfiledCosts, tokens: f64, routed: f64) -> f64 {
        let m = &self.d.model;
        let layers = f64::from(m.layers);
        if !(m.is_moe() && p.has_moe()) {
            return layers * p.linear_s(tokens);
        }
        debug_assert!(m.arch.is_plain(), "a profile prices uniform MoE layers");
        let ep = f64::from(self.d.parallel.ep.max(1));
        let experts = p.moe_s(routed / ep, self.routing.distinct(routed) / ep);
        layers * (p.attention_linear_s(tokens) + experts + self.router(tokens).0)
    }

    /// Every layer's linear layers for `tokens` tokens, in all: the attention projections
    /// (Q/K/V/O, latent or linear) and the MLPs (dense, or routed and shared experts with
    /// the router; the routed experts compute `routed` tokens, every attention-DP rank's).
    /// A uniform stack is one layer's sum times the layers.
    fn linear_layers(&self, tokens: f64, routed: f64) -> LinearWork {
        let m = &self.d.model;
        let tp = f64::from(self.d.tp);
        let top_k = if m.is_moe() {
            f64::from(m.experts_per_token.clamp(1, m.num_experts))
        } else {
            1.0
        };
        let empty = || LinearWork {
            q: f64::from(m.heads * m.head_dim) / tp,
            kv: f64::from(m.kv_heads * m.head_dim) / tp,
            top_k,
            ..LinearWork::default()
        };
        let layers = f64::from(m.layers);
        let (linear, dense) = (m.linear_layers(), m.arch.dense_layers);
        let mut w = empty();
        if linear == 0 && dense == 0 {
            self.attention_projections(&mut w, tokens);
            self.mlp(&mut w, tokens, routed, m.intermediate, m.is_moe());
            w.seconds *= layers;
            w.flops *= layers;
            w.bytes *= layers;
            return w;
        }
        // Mixed layers: each kind's layer times its count.
        let mut total = empty();
        let mut add = |part: LinearWork, count: u32| {
            let c = f64::from(count);
            total.seconds += c * part.seconds;
            total.flops += c * part.flops;
            total.bytes += c * part.bytes;
        };
        self.attention_projections(&mut w, tokens);
        add(w, m.layers - linear);
        let mut w = empty();
        self.linear_attention_projections(&mut w, tokens);
        add(w, linear);
        let mut w = empty();
        self.mlp(&mut w, tokens, tokens, m.arch.dense_intermediate, false);
        add(w, dense);
        let mut w = empty();
        self.mlp(&mut w, tokens, routed, m.intermediate, m.is_moe());
        add(w, m.layers - dense);
        total
    }

    /// (seconds, FLOPs, bytes) of the LM head over `samples` positions, with the
    /// all-gather of the logits under tensor parallelism.
    /// The all-gather of `samples` rows of fp32 logits over the tensor-parallel GPUs.
    fn logits_gather_s(&self, samples: u32) -> f64 {
        if samples == 0 {
            return 0.0;
        }
        let tp = f64::from(self.d.tp);
        let vocab = f64::from(self.d.model.vocab) / tp;
        self.allreduce_s(f64::from(samples) * vocab * 4.0 / tp)
    }

    fn lm_head(&self, samples: u32) -> (f64, f64, f64) {
        let m = &self.d.model;
        let tp = f64::from(self.d.tp);
        let hidden = f64::from(m.hidden);
        let peak = self.d.gpu.peak_flops(self.d.dtype);
        let s = f64::from(samples);
        let vocab = f64::from(m.vocab) / tp;
        let head_flops = 2.0 * s * hidden * vocab;
        let head_bytes = hidden * vocab * self.d.dtype.embedding_bytes() + s * vocab * 4.0;
        let head_s = if samples > 0 {
            self.roofline(
                head_flops,
                head_bytes,
                self.p.gemm_compute_eff,
                self.p.gemm_memory_eff,
                peak,
            ) + self.logits_gather_s(samples)
        } else {
            0.0
        };
        (head_s, head_flops, head_bytes)
    }

    /// Bytes of one KV block on one GPU.
    pub fn block_bytes_per_gpu(&self) -> f64 {
        self.d.kv_bytes_per_token() * f64::from(self.block_size)
    }

    /// Time to move KV blocks before a step: `swapped` blocks over the host link (each GPU
    /// moves its shard over its own PCIe link, in parallel) and `copied` blocks inside HBM
    /// (read + write), as vLLM's swap and copy kernels do.
    pub fn kv_transfer_s(&self, swapped: usize, copied: usize) -> f64 {
        let b = self.block_bytes_per_gpu();
        let mut t = 0.0;
        if swapped > 0 {
            t += swapped as f64 * b / self.d.gpu.pcie_bw + self.p.kernel_launch_us() * 1e-6;
        }
        if copied > 0 {
            t += 2.0 * copied as f64 * b / (self.d.gpu.mem_bw * self.p.elementwise_memory_eff)
                + self.p.kernel_launch_us() * 1e-6;
        }
        t
    }

    /// Cost of a step plan.
    pub fn plan_cost(&self, plan: &StepPlan) -> StepCost {
        if plan.work.is_empty() {
            // Only block moves (swap-outs of a step that preempted without running).
            let t = self.kv_transfer_s(
                plan.swap_in.len() + plan.swap_out.len() + plan.offload_loads as usize,
                plan.block_copies.len(),
            ) + self.disk_read_s(plan.disk_loads);
            return StepCost {
                seconds: t,
                kv_transfer_s: t,
                ..StepCost::default()
            };
        }
        // A padded static batch computes its pad tokens like real ones (and a logits row
        // for each finished member's pad row); in decode every row attends over the padded
        // context (Hugging Face's attention over the left-padded tensor).
        let pad = &plan.padding;
        let prefill = plan
            .work
            .iter()
            .filter(|w| w.kind == WorkKind::Prefill)
            .map(|w| (w.start, w.len))
            .chain(pad.prefill.iter().copied());
        let decode = plan
            .work
            .iter()
            .filter(|w| w.kind != WorkKind::Prefill)
            .map(|w| (w.context_len().max(pad.context), w.len))
            .chain(pad.decode.iter().map(|&c| (c, 1)));
        let samples = (plan.num_logit_rows() + pad.decode.len()) as u32;
        let rows = (plan.work.len() + pad.decode.len()) as u32;
        let group = plan.moe_group_tokens.map(f64::from);
        let mut c = self.group_step_cost(prefill, decode, samples, rows, group);
        if pad.context > 0 {
            // Hugging Face's `DynamicCache` appends a step's keys and values with a
            // concatenation: every layer's cache of every row is read and written again.
            let bytes =
                2.0 * f64::from(rows) * f64::from(pad.context) * self.d.kv_bytes_per_token();
            let t = bytes / (self.d.gpu.mem_bw * self.p.elementwise_memory_eff)
                + f64::from(self.d.layers_per_stage()) * self.p.kernel_launch_us() * 1e-6;
            c.elementwise_s += t;
            c.bytes += bytes;
            c.seconds += t;
        }
        c.kv_transfer_s = self.kv_transfer_s(
            plan.swap_in.len() + plan.swap_out.len() + plan.offload_loads as usize,
            plan.block_copies.len(),
        ) + self.disk_read_s(plan.disk_loads);
        c.seconds += c.kv_transfer_s;
        c
    }
}

impl CostModel {
    /// Seconds a draft model (this cost model) spends on a step of `plan`: it prefills
    /// the step's prompt chunks too (it needs their KV), and drafts the `k` tokens of each
    /// verify work in `k` autoregressive steps over the verifying sequences (step `j`
    /// decodes at context `start + 1 + j`), the first step together with the prefills.
    /// A draft that shares the target's KV (self-speculation by its first layers) has no
    /// prefill of its own (`shares_kv`). The draft's rounds run inside the engine step,
    /// so they pay the GPU work, not the step's CPU overhead again.
    pub fn draft_seconds(&self, plan: &StepPlan, shares_kv: bool) -> f64 {
        let verify: Vec<(u32, u32)> = plan
            .work
            .iter()
            .filter(|w| w.kind == WorkKind::Verify)
            .map(|w| (w.start, w.len.saturating_sub(1)))
            .collect();
        let has_prefill = !shares_kv && plan.work.iter().any(|w| w.kind == WorkKind::Prefill);
        let rounds = verify.iter().map(|&(_, k)| k).max().unwrap_or(0);
        let mut s = 0.0;
        for j in 0..rounds.max(u32::from(has_prefill)) {
            let prefill = plan
                .work
                .iter()
                .filter(|w| has_prefill && j == 0 && w.kind == WorkKind::Prefill)
                .map(|w| (w.start, w.len));
            let decode = verify
                .iter()
                .filter(|&&(_, k)| k > j)
                .map(|&(start, _)| (start + 1 + j, 1));
            let n = verify.iter().filter(|&&(_, k)| k > j).count() as u32;
            let seqs = n + if has_prefill && j == 0 {
                plan.work
                    .iter()
                    .filter(|w| w.kind == WorkKind::Prefill)
                    .count() as u32
            } else {
                0
            };
            let c = self.step_cost(prefill, decode, n, seqs);
            s += c.seconds - c.overhead_s;
        }
        s
    }
}
