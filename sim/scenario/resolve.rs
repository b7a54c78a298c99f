//! From a configuration to what a run needs ([`super::Variant`]): the model and GPU from the
//! catalog or a file, every engine value checked, the deployment, its memory plan and the
//! scheduler's limits; `[speculative]` into the engine's settings and the draft model's
//! deployment. Errors are one line naming the key.

use std::path::{Path, PathBuf};

use engine::scheduler::{KvAllocator, PreemptionMode, SchedulerConfig, SchedulerKind};

use super::{DynamicKConfig, EngineConfig, ScenarioConfig, SpecMethod, Variant};
use crate::catalog::{find_gpu, find_model, gpu_from_file, model_from_file, Dtype};
use crate::cost_model::{memory_plan, Deployment, MemoryInputs, MemoryPlan};

/// A synthetic acceptance from `acceptance` rates or a `mean_acceptance_length` for `k`
/// drafts (exactly one; `what` prefixes errors).
pub fn acceptance_from(
    what: &str,
    rates: &Option<Vec<f64>>,
    mean: Option<f64>,
    k: u32,
) -> Result<Option<engine::spec::Acceptance>, String> {
    match (rates, mean) {
        (Some(r), None) => engine::spec::Acceptance::from_rates(r)
            .map(Some)
            .map_err(|e| format!("{what}acceptance: {e}")),
        (None, Some(m)) => engine::spec::Acceptance::from_mean_length(m, k)
            .map(Some)
            .map_err(|e| format!("{what}mean_acceptance_length: {e}")),
        (Some(_), Some(_)) => Err(format!(
            "{what}acceptance and {what}mean_acceptance_length: give one, not both"
        )),
        (None, None) => Ok(None),
    }
}

/// A catalog entry named by `keys.0` or one described in the file `keys.1` (relative to
/// `base_dir`): exactly one must be given; errors name the key.
fn catalog_or_file<T: 'static>(
    keys: (&str, &str, &str),
    (name, file): (&Option<String>, &Option<PathBuf>),
    base_dir: &Path,
    find: impl Fn(&str) -> Result<&'static T, String>,
    load: impl Fn(&Path) -> Result<&'static T, String>,
) -> Result<&'static T, String> {
    let (name_key, file_key, file_what) = keys;
    match (name, file) {
        (Some(n), None) => find(n).map_err(|e| format!("{name_key}: {e}; or give {file_key}")),
        (None, Some(path)) => load(&base_dir.join(path)).map_err(|e| format!("{file_key}: {e}")),
        (Some(_), Some(_)) => Err(format!("give {name_key} or {file_key}, not both")),
        (None, None) => Err(format!(
            "missing: give {name_key} (the catalog) or {file_key} ({file_what})"
        )),
    }
}

/// A catalog model by name, or an error listing the catalog.
fn catalog_model(n: &str) -> Result<&'static crate::catalog::ModelSpec, String> {
    find_model(n).ok_or_else(|| {
        let names: Vec<&str> = crate::catalog::models().iter().map(|m| m.name).collect();
        crate::messages::unknown_name("model", n, &names, "sim models")
    })
}

/// Checks one configuration and computes its deployment, memory plan and scheduler limits.
pub(super) fn resolve(
    name: &str,
    config: ScenarioConfig,
    base_dir: &Path,
) -> Result<Variant, String> {
    let model = match (&config.model.gguf, &config.model.name, &config.model.config) {
        (Some(path), None, None) => crate::catalog::model_from_gguf(&base_dir.join(path))
            .map_err(|e| format!("model.gguf: {e}"))?,
        (Some(_), _, _) => {
            return Err("give one of model.name, model.config and model.gguf".into());
        }
        _ => catalog_or_file(
            (
                "model.name",
                "model.config",
                "a Hugging Face config.json, or model.gguf",
            ),
            (&config.model.name, &config.model.config),
            base_dir,
            catalog_model,
            model_from_file,
        )?,
    };
    let gpu = catalog_or_file(
        (
            "hardware.gpu",
            "hardware.gpu_file",
            "a GPU described in TOML",
        ),
        (&config.hardware.gpu, &config.hardware.gpu_file),
        base_dir,
        |g| {
            find_gpu(g).ok_or_else(|| {
                let names: Vec<&str> = crate::catalog::gpus().map(|g| g.name).collect();
                crate::messages::unknown_name("GPU", g, &names, "sim gpus")
            })
        },
        gpu_from_file,
    )?;
    let tp = config.hardware.tp;
    if tp == 0 || model.heads % tp != 0 {
        return Err(format!(
            "hardware.tp: must divide the model's {} attention heads, got {tp}",
            model.heads
        ));
    }
    let e = &config.engine;
    check_engine(e)?;
    if e.adp_balance_timeout_iters > 0 && config.hardware.dp <= 1 {
        return Err(format!(
            "engine.adp_balance_timeout_iters: balances new prompts over attention data-parallel ranks, but hardware.dp is {} (set hardware.dp > 1 or leave it 0)",
            config.hardware.dp
        ));
    }
    let slo = &config.slo;
    for (key, bound) in [
        ("slo.ttft_ms", slo.ttft_ms),
        ("slo.tpot_ms", slo.tpot_ms),
        ("slo.e2el_ms", slo.e2el_ms),
    ] {
        if let Some(x) = bound.filter(|x| !(*x > 0.0 && x.is_finite())) {
            return Err(format!(
                "{key}: must be a positive number of milliseconds, got {x}"
            ));
        }
    }
    config.cost.validate()?;
    let max_model_len = e.max_model_len.unwrap_or(model.max_position);
    if max_model_len == 0 {
        return Err("engine.max_model_len: must be at least 1".into());
    }
    // vLLM's defaults: 2,048 tokens a step with chunked prefill, else room for the longest
    // sequence.
    let max_num_batched_tokens = e.max_num_batched_tokens.unwrap_or(match e.scheduler {
        SchedulerKind::Chunked if e.enable_chunked_prefill => 2048,
        _ => max_model_len.max(2048),
    });
    // The KV cache stays 16-bit unless asked otherwise (vLLM's kv_cache_dtype = "auto" for
    // quantized weights), in the weights' float format for float weights.
    let kv_dtype = config.model.kv_dtype.unwrap_or(match config.model.dtype {
        d @ (Dtype::Fp32 | Dtype::Fp16 | Dtype::Bf16) => d,
        _ => Dtype::Bf16,
    });
    if !kv_dtype.is_kv_format() {
        return Err(format!(
            "model.kv_dtype: {} is a weight format; the KV cache takes fp16, bf16, fp8, int8 or fp32",
            kv_dtype.as_str()
        ));
    }
    let pp = config.hardware.pp;
    if pp == 0 || pp > model.layers {
        return Err(format!(
            "hardware.pp: must be from 1 to the model's {} layers, got {pp}",
            model.layers
        ));
    }
    let parallel = parallel_of(&config.hardware, model, tp)?;
    let deployment = Deployment {
        parallel,
        model: model.clone(),
        gpu: gpu.clone(),
        tp,
        pp,
        dtype: config.model.dtype,
        kv_dtype,
    };
    let (speculative, draft) = resolve_speculative(&config, &deployment, base_dir)?;
    let profile = match &config.cost.operator_profile {
        Some(dir) => Some(std::sync::Arc::new(operator_profile(
            &base_dir.join(dir),
            &deployment,
        )?)),
        None => None,
    };
    // A self-speculation draft is part of the target: nothing more to hold.
    let own_draft = draft.as_ref().filter(|d| {
        !(d.model.name == deployment.model.name && d.model.layers < deployment.model.layers)
    });
    let memory = memory_plan(
        &deployment,
        &MemoryInputs {
            // An MTP module shares the target's embedding and LM head.
            draft_weight_bytes: own_draft.map_or(0.0, |d| {
                let shared = config
                    .speculative
                    .as_ref()
                    .is_some_and(|sp| sp.method == SpecMethod::Mtp);
                d.weight_bytes_per_gpu()
                    - if shared {
                        d.embedding_bytes_per_gpu()
                    } else {
                        0.0
                    }
            }),
            draft_kv_bytes_per_token: own_draft.map_or(0.0, |d| d.kv_bytes_per_token()),
            gpu_memory_utilization: e.gpu_memory_utilization,
            block_size: e.block_size,
            max_num_batched_tokens,
            max_num_seqs: e.max_num_seqs,
            max_model_len,
            runtime_overhead_bytes: e.runtime_overhead_gib * 1024.0 * 1024.0 * 1024.0,
            num_gpu_blocks_override: e.num_gpu_blocks_override,
            disable_hybrid: e.disable_sliding_window,
        },
    )
    .map_err(|f| f.to_string())?;
    let mut memory = memory;
    if !memory.side_groups.is_empty() {
        // vLLM's hybrid allocator is paged and V1 recomputes preempted requests.
        if e.kv_allocator == KvAllocator::Contiguous {
            return Err(format!(
                "engine.kv_allocator: {} keeps sliding-window or linear-attention layers in their own block tables, which the contiguous allocator has not; use \"paged\"",
                model.name
            ));
        }
        if e.preemption_mode == PreemptionMode::Swap {
            return Err(format!(
                "engine.preemption_mode: {} keeps sliding-window or linear-attention layers in their own block tables, which are not swapped (vLLM V1 recomputes); use \"recompute\"",
                model.name
            ));
        }
        // The tiers hold the main table's blocks; a prefix found there would still miss
        // the side groups' pages, so it would never be loaded: say so rather than run a
        // tier that does nothing.
        if e.kv_offload_gib > 0.0 {
            return Err(format!(
                "engine.kv_offload_gib: {} keeps sliding-window or linear-attention layers in their own block tables, which the offload tiers do not hold; set it to 0 (or engine.disable_sliding_window = true where the model allows)",
                model.name
            ));
        }
    }
    if u64::from(memory.num_blocks) > MAX_POOL_BLOCKS {
        return Err(format!(
            "the KV pool would hold {} blocks ({} tokens of {} bytes each): more than the {MAX_POOL_BLOCKS} blocks the simulator tracks ({:.0} GB of device memory for {:.1} MB of KV per token); check the GPU's memory, or set engine.num_gpu_blocks_override",
            memory.num_blocks,
            memory.pool_tokens,
            memory.kv_bytes_per_token,
            deployment.gpu.mem_bytes / 1e9,
            memory.kv_bytes_per_token / 1e6
        ));
    }
    if e.preemption_mode == PreemptionMode::Swap {
        (memory.swap_bytes, memory.num_cpu_blocks) = host_blocks(
            "engine.swap_space_gib",
            e.swap_space_gib,
            memory.block_bytes,
        )?;
    }
    if e.kv_offload_gib > 0.0 {
        (memory.offload_bytes, memory.offload_blocks) = host_blocks(
            "engine.kv_offload_gib",
            e.kv_offload_gib,
            memory.block_bytes,
        )?;
    }
    if e.kv_disk_gib > 0.0 {
        (memory.disk_bytes, memory.disk_blocks) =
            host_blocks("engine.kv_disk_gib", e.kv_disk_gib, memory.block_bytes)?;
    }
    check_prompt_parts(&config.workload, max_model_len)?;
    let mut scheduler = scheduler_config(
        e,
        &memory,
        max_num_batched_tokens,
        max_model_len,
        model.sliding_window,
        speculative,
    );
    // Micro-batches in flight: one per pipeline stage unless set (speculative decoding
    // runs one batch at a time).
    scheduler.max_concurrent_batches = match e.max_concurrent_batches {
        Some(n) if n > 1 && e.kv_allocator == KvAllocator::Contiguous => {
            return Err(format!(
                "engine.max_concurrent_batches: {n} micro-batches need the paged allocator (engine.kv_allocator = \"paged\"): a contiguous run that cannot grow in place would preempt itself over and over while the others run"
            ));
        }
        Some(n) => n,
        None if scheduler.speculative.is_some()
            || e.kv_allocator == KvAllocator::Contiguous
            || e.scheduler == SchedulerKind::Static =>
        {
            1
        }
        None => deployment.pp.max(1),
    };
    scheduler.validate().map_err(|e| e.to_string())?;
    Ok(Variant {
        name: name.to_string(),
        config,
        deployment,
        memory,
        scheduler,
        draft,
        fit: None,
        profile,
        fleet: None,
    })
}

/// Host memory of `gib` GiB (the swap pool, the offload tiers) in bytes and in KV blocks of
/// `block_bytes`, at most [`MAX_POOL_BLOCKS`] (`key` names the setting in errors).
fn host_blocks(key: &str, gib: f64, block_bytes: f64) -> Result<(f64, u32), String> {
    let bytes = gib * 1024.0 * 1024.0 * 1024.0;
    let blocks = (bytes / block_bytes).floor();
    if blocks > MAX_POOL_BLOCKS as f64 {
        return Err(format!(
            "{key}: {gib} GiB is {blocks:.0} blocks of {block_bytes} bytes, more than the {MAX_POOL_BLOCKS} the simulator tracks"
        ));
    }
    Ok((bytes, blocks as u32))
}

/// `[cost] operator_profile`: the profile of the deployment's model on its GPU at its
/// tensor-parallel degree, checked against the deployment it prices.
fn operator_profile(
    dir: &Path,
    d: &Deployment,
) -> Result<crate::cost_model::profiled::ProfiledCosts, String> {
    let key = "cost.operator_profile";
    if d.pp > 1 {
        return Err(format!(
            "{key}: measured operator times price one stage of the whole model; pipeline parallelism (hardware.pp = {}) is not supported with them",
            d.pp
        ));
    }
    if !d.model.arch.is_plain() {
        return Err(format!(
            "{key}: {} is not a uniform stack of Llama-style layers (latent, sliding-window or linear attention, shared experts, MTP layers, a gated attention output, or dense and MoE layers mixed); measured operator times price one uniform layer",
            d.model.name
        ));
    }
    // A profile at TP N times one GPU's shard of every layer, experts split N ways: with
    // expert parallelism the experts are split otherwise.
    if d.model.is_moe() && d.moe_tp() != d.tp {
        return Err(format!(
            "{key}: the profile times each expert split over {} GPUs (its tensor-parallel degree), but this deployment splits each over {} (hardware.tp x dp / ep); measured operator times price experts split as the attention is",
            d.tp,
            d.moe_tp()
        ));
    }
    let p =
        crate::observed::operator_profile::open(dir, d.tp).map_err(|e| format!("{key}: {e}"))?;
    if let Some(m) = crate::catalog::find_model_by_id(&p.model) {
        if m.name != d.model.name {
            return Err(format!(
                "{key}: {} profiles {} ({}), not the scenario's model {}",
                dir.display(),
                p.model,
                m.name,
                d.model.name
            ));
        }
    }
    if let Some(g) = crate::catalog::gpu_for_device(&p.gpu) {
        if g != d.gpu.name {
            return Err(format!(
                "{key}: {} was measured on {} ({g}), not the scenario's GPU {}",
                dir.display(),
                p.gpu,
                d.gpu.name
            ));
        }
    }
    match (d.model.is_moe(), &p.moe) {
        (true, None) => {
            return Err(format!(
                "{key}: {} is a mixture of experts, but {} has no moe.csv to time its experts",
                d.model.name,
                p.dir.display()
            ))
        }
        (false, Some(_)) => {
            return Err(format!(
                "{key}: {} times a mixture of experts (moe.csv), but {} is dense",
                p.dir.display(),
                d.model.name
            ))
        }
        (true, Some(rows)) => {
            let most = rows.iter().map(|(k, _)| k[1]).max().unwrap_or(0);
            if most > d.model.num_experts {
                return Err(format!(
                    "{key}: {}/moe.csv times up to {most} activated experts, but {} has {}",
                    p.dir.display(),
                    d.model.name,
                    d.model.num_experts
                ));
            }
        }
        (false, None) => {}
    }
    let sixteen = matches!(d.dtype, Dtype::Bf16 | Dtype::Fp16);
    if let Some(v) = p.variant.as_deref() {
        if (v == "bf16" || v == "fp16") != sixteen {
            return Err(format!(
                "{key}: {} holds {v} weights' times, but the scenario's weights are {}",
                dir.display(),
                d.dtype.as_str()
            ));
        }
    }
    Ok(crate::cost_model::profiled::ProfiledCosts::new(&p))
}

/// `[speculative]` of one configuration: the engine's settings (acceptance per class from
/// the workload's classes) and the draft model's deployment (same GPUs and formats).
fn resolve_speculative(
    config: &ScenarioConfig,
    target: &Deployment,
    base_dir: &Path,
) -> Result<(Option<engine::spec::SpecConfig>, Option<Deployment>), String> {
    use engine::spec::{DynamicK, Method, SpecConfig};
    let Some(sp) = config.speculative.as_ref() else {
        return Ok((None, None));
    };
    let method = match sp.method {
        SpecMethod::None => return Ok((None, None)),
        SpecMethod::DraftModel | SpecMethod::Mtp => Method::DraftModel,
        SpecMethod::Ngram => Method::Ngram,
        SpecMethod::Synthetic => Method::Synthetic,
    };
    if sp.k == 0 || sp.k > engine::spec::MAX_K {
        return Err(format!(
            "speculative.k: must be from 1 to {}, got {}",
            engine::spec::MAX_K,
            sp.k
        ));
    }
    let acceptance = acceptance_from(
        "speculative.",
        &sp.acceptance,
        sp.mean_acceptance_length,
        sp.k,
    )?
    .ok_or_else(|| {
        "speculative: give acceptance (per-position rates) or mean_acceptance_length: the simulator draws acceptances from them".to_string()
    })?;
    let mut class_acceptance = Vec::new();
    for (i, c) in config.workload.classes.iter().enumerate() {
        let what = format!("workload.classes[{i}] ({}).", c.name);
        class_acceptance.push(acceptance_from(
            &what,
            &c.acceptance,
            c.mean_acceptance_length,
            sp.k,
        )?);
    }
    let dynamic = match sp.dynamic_k {
        None => DynamicK::Off,
        Some(DynamicKConfig {
            disable_above: Some(b),
            full_until: None,
            zero_at: None,
        }) => DynamicK::DisableAbove { batch: b },
        Some(DynamicKConfig {
            disable_above: None,
            full_until: Some(f),
            zero_at: Some(z),
        }) => DynamicK::Linear {
            full_until: f,
            zero_at: z,
        },
        Some(_) => return Err(
            "speculative.dynamic_k: give { disable_above = N } or { full_until = A, zero_at = B }"
                .into(),
        ),
    };
    let spec = SpecConfig {
        method,
        k: sp.k,
        acceptance,
        class_acceptance,
        ngram_min: sp.min_n,
        ngram_max: sp.max_n,
        dynamic,
    };
    spec.validate()?;
    let self_draft = match sp.self_draft_layers {
        Some(n) if n == 0 || n >= target.model.layers => {
            return Err(format!(
                "speculative.self_draft_layers: must be from 1 to {} (the target has {} layers), got {n}",
                target.model.layers - 1,
                target.model.layers
            ))
        }
        other => other,
    };
    let draft = if sp.method == SpecMethod::Mtp {
        // The MTP layers: their own weights and KV (one layer's), the embedding and LM
        // head shared.
        let model = target.model.mtp_draft().ok_or_else(|| {
            format!(
                "speculative.method = \"mtp\": {} has no multi-token-prediction layers (num_nextn_predict_layers / mtp_num_hidden_layers)",
                target.model.name
            )
        })?;
        Some(Deployment {
            model,
            ..target.clone()
        })
    } else if method == Method::DraftModel
        && sp.draft_model.is_none()
        && sp.draft_config.is_none()
        && self_draft.is_some()
    {
        // Self-speculation: the target's first layers, its weights and KV cache shared.
        let model = target.model.first_layers(self_draft.unwrap_or(1));
        Some(Deployment {
            model,
            ..target.clone()
        })
    } else if method == Method::DraftModel {
        let model = catalog_or_file(
            (
                "speculative.draft_model",
                "speculative.draft_config",
                "a Hugging Face config.json",
            ),
            (&sp.draft_model, &sp.draft_config),
            base_dir,
            catalog_model,
            model_from_file,
        )?;
        let tp = sp.draft_tp.unwrap_or(target.tp);
        if tp > 0 && tp <= target.tp && model.heads % tp != 0 {
            return Err(format!(
                "speculative.draft_tp: must divide the draft model's {} attention heads, got {tp}",
                model.heads
            ));
        }
        if tp == 0 || tp > target.tp {
            return Err(format!(
                "speculative.draft_tp: must be from 1 to the target's tp ({}), got {tp}",
                target.tp
            ));
        }
        if model.vocab != target.model.vocab {
            return Err(format!(
                "speculative.draft_model: {} has a vocabulary of {} tokens, the target {} has {}: a draft must share the target's tokenizer",
                model.name, model.vocab, target.model.name, target.model.vocab
            ));
        }
        Some(Deployment {
            parallel: Default::default(),
            model: model.clone(),
            tp,
            pp: 1,
            ..target.clone()
        })
    } else {
        // A variant that switches to n-gram keeps the base's draft keys: unused here.
        None
    };
    Ok((Some(spec), draft))
}

/// Checks the engine's values that do not depend on the model.
fn check_engine(e: &EngineConfig) -> Result<(), String> {
    if !(1..=1024).contains(&e.block_size) || !e.block_size.is_power_of_two() {
        return Err(format!(
            "engine.block_size: must be a power of two from 1 to 1024, got {}",
            e.block_size
        ));
    }
    if !(e.gpu_memory_utilization > 0.0 && e.gpu_memory_utilization <= 1.0) {
        return Err(format!(
            "engine.gpu_memory_utilization: must be in (0, 1], got {}",
            e.gpu_memory_utilization
        ));
    }
    if !(e.runtime_overhead_gib >= 0.0 && e.runtime_overhead_gib.is_finite()) {
        return Err(format!(
            "engine.runtime_overhead_gib: must be a non-negative number, got {}",
            e.runtime_overhead_gib
        ));
    }
    if !(0.0..0.5).contains(&e.watermark) {
        return Err(format!(
            "engine.watermark: must be a fraction in [0, 0.5), got {}",
            e.watermark
        ));
    }
    if !(e.queue_aging_s > 0.0 && e.queue_aging_s.is_finite()) {
        return Err(format!(
            "engine.queue_aging_s: must be a positive number of seconds, got {}",
            e.queue_aging_s
        ));
    }
    if !(e.kv_offload_gib >= 0.0 && e.kv_offload_gib.is_finite()) {
        return Err(format!(
            "engine.kv_offload_gib: must be a non-negative number of GiB, got {}",
            e.kv_offload_gib
        ));
    }
    if e.kv_offload_gib > 0.0 && !e.enable_prefix_caching {
        return Err(
            "engine.kv_offload_gib: the offload tier lies under the prefix cache; set enable_prefix_caching = true"
                .into(),
        );
    }
    if !(e.kv_disk_gib >= 0.0 && e.kv_disk_gib.is_finite()) {
        return Err(format!(
            "engine.kv_disk_gib: must be a non-negative number of GiB, got {}",
            e.kv_disk_gib
        ));
    }
    if e.kv_disk_gib > 0.0 && e.kv_offload_gib <= 0.0 {
        return Err(
            "engine.kv_disk_gib: the disk tier lies under the CPU tier; set engine.kv_offload_gib too"
                .into(),
        );
    }
    if !(e.kv_disk_gbs > 0.0 && e.kv_disk_gbs.is_finite()) {
        return Err(format!(
            "engine.kv_disk_gbs: must be a positive bandwidth in GB/s, got {}",
            e.kv_disk_gbs
        ));
    }
    if !(e.swap_space_gib >= 0.0 && e.swap_space_gib.is_finite()) {
        return Err(format!(
            "engine.swap_space_gib: must be a non-negative number of GiB, got {}",
            e.swap_space_gib
        ));
    }
    if e.kv_allocator == KvAllocator::Contiguous {
        if e.enable_prefix_caching {
            return Err(
                "engine.kv_allocator: the contiguous allocator shares no blocks, so it has no prefix caching: set engine.enable_prefix_caching = false".into(),
            );
        }
        if e.preemption_mode == PreemptionMode::Swap {
            return Err(
                "engine.preemption_mode: swap needs the paged allocator (engine.kv_allocator = \"paged\")".into(),
            );
        }
    }
    if e.recv_interval > 1 && e.adp_balance_timeout_iters > 0 {
        return Err(format!(
            "engine.adp_balance_timeout_iters: SGLang's receive interval (engine.recv_interval = {}) and TensorRT-LLM's attention-DP balancing ({}) both hold arrivals back; set one",
            e.recv_interval, e.adp_balance_timeout_iters
        ));
    }
    if e.num_gpu_blocks_override == Some(0) {
        return Err("engine.num_gpu_blocks_override: must be at least 1".into());
    }
    Ok(())
}

/// The scheduler's limits and policies for an engine configuration and its memory plan.
fn scheduler_config(
    e: &EngineConfig,
    memory: &MemoryPlan,
    max_num_batched_tokens: u32,
    max_model_len: u32,
    model_window: Option<u32>,
    speculative: Option<engine::spec::SpecConfig>,
) -> SchedulerConfig {
    SchedulerConfig {
        kind: e.scheduler,
        max_num_seqs: e.max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        pool_tokens: memory.pool_tokens,
        eos_token: None,
        want_block_tables: false,
        keep_tokens: false,
        block_size: e.block_size,
        prefix_caching: e.enable_prefix_caching,
        queue: e.queue_policy,
        queue_aging_ns: (e.queue_aging_s * 1e9) as u64,
        admission: e.admission,
        victim: e.preemption_victim,
        watermark_blocks: (e.watermark * f64::from(memory.num_blocks)).ceil() as u32,
        sliding_window: if e.disable_sliding_window || e.kv_allocator == KvAllocator::Contiguous {
            None
        } else {
            model_window
        },
        speculative,
        static_padding: e.static_padding,
        max_concurrent_batches: 1,
        // As TensorRT-LLM enables it: either knob set (a ratio without a timeout releases
        // every step, as there); a ratio that is not a share fails the scheduler's checks.
        batch_wait: (e.batch_wait_timeout_iters > 0 || e.batch_wait_max_tokens_ratio != 0.0)
            .then_some(engine::scheduler::BatchWait {
                timeout_iters: e.batch_wait_timeout_iters,
                max_tokens_ratio: e.batch_wait_max_tokens_ratio,
            }),
        chunked_prefill: e.enable_chunked_prefill,
        max_prefill_tokens: e.max_prefill_tokens,
        arrival_poll: if e.recv_interval > 1 {
            Some(engine::scheduler::ArrivalPoll {
                interval: e.recv_interval,
                after_prefill: true,
            })
        } else {
            (e.adp_balance_timeout_iters > 0).then_some(engine::scheduler::ArrivalPoll {
                interval: e.adp_balance_timeout_iters,
                after_prefill: false,
            })
        },
    }
}

/// Most KV blocks a simulated pool (GPU or CPU swap) may hold: 2^24, 268M tokens at 16 a
/// block, far beyond any device, while the block manager's bookkeeping stays under ~1 GB.
pub const MAX_POOL_BLOCKS: u64 = 1 << 24;

/// Generated prompt parts (a class's shared prefix, a multi-turn system prompt, SGLang's
/// shared-prefix dataset) longer than `max_model_len`: every request would be rejected, and
/// its token ids are built for each request, so they are refused up front.
fn check_prompt_parts(
    w: &crate::workload::WorkloadConfig,
    max_model_len: u32,
) -> Result<(), String> {
    let too_long = |key: String, tokens: u64| {
        if tokens > u64::from(max_model_len) {
            Err(format!(
                "{key}: {tokens} tokens, longer than max_model_len ({max_model_len}): every request would be rejected"
            ))
        } else {
            Ok(())
        }
    };
    for (i, c) in w.classes.iter().enumerate() {
        if let Some(p) = c.shared_prefix {
            too_long(
                format!("workload.class[{i}].shared_prefix.tokens"),
                u64::from(p.tokens),
            )?;
        }
    }
    if let Some(m) = &w.multi_turn {
        if let Some(p) = m.system_prompt {
            too_long(
                "workload.multi_turn.system_prompt.tokens".into(),
                u64::from(p.tokens),
            )?;
        }
    }
    if let Some(g) = &w.generated_shared_prefix {
        too_long(
            "workload.generated_shared_prefix.system_prompt_len + question_len".into(),
            u64::from(g.system_prompt_len) + u64::from(g.question_len),
        )?;
    }
    Ok(())
}

/// The attention data-parallel and expert-parallel degrees of `[hardware]`, checked against
/// the model: both need a mixture of experts; `ep` must divide the routed experts and the
/// stage's `tp x dp` GPUs.
fn parallel_of(
    h: &super::config::HardwareConfig,
    model: &crate::catalog::ModelSpec,
    tp: u32,
) -> Result<crate::cost_model::Parallel, String> {
    let (dp, ep) = (h.dp, h.ep);
    if dp == 0 || dp > 1024 {
        return Err(format!("hardware.dp: must be from 1 to 1024, got {dp}"));
    }
    if ep == 0 || ep > 1024 {
        return Err(format!("hardware.ep: must be from 1 to 1024, got {ep}"));
    }
    if (dp > 1 || ep > 1) && !model.is_moe() {
        let key = if dp > 1 { "hardware.dp" } else { "hardware.ep" };
        return Err(format!(
            "{key}: attention data parallelism and expert parallelism serve a mixture of experts; {} is dense (use engine replicas for data parallelism)",
            model.name
        ));
    }
    if !model.num_experts.is_multiple_of(ep) {
        return Err(format!(
            "hardware.ep: {ep} does not divide {}'s {} routed experts",
            model.name, model.num_experts
        ));
    }
    let gpus = tp * dp;
    if !gpus.is_multiple_of(ep) {
        return Err(format!(
            "hardware.ep: {ep} does not divide the stage's tp x dp = {tp} x {dp} = {gpus} GPUs"
        ));
    }
    Ok(crate::cost_model::Parallel { dp, ep })
}
