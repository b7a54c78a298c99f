//! Models from real Hugging Face `config.json` files: the families `sim` reads (gated and
//! two-matrix MLPs, learned positions) give the parameter counts the model cards state,
//! and what `sim` does not model is refused by name.

use sim::catalog::ModelSpec;

fn spec(json: &str) -> Result<ModelSpec, String> {
    let v: serde_json::Value = serde_json::from_str(json).expect("fixture is JSON");
    ModelSpec::from_hf_value(&v, "config.json")
}

fn fixture(name: &str) -> ModelSpec {
    ModelSpec::from_hf_config(&std::path::Path::new("tests/data/configs").join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn two_matrix_mlps_count_their_parameters() {
    // Phi-2 (fc1/fc2 around GELU, untied head): 2.78 B on its model card.
    let phi = fixture("phi-2.json");
    assert!(!phi.gated_mlp);
    assert!(
        (phi.params() / 1e9 - 2.78).abs() < 0.0278,
        "{}",
        phi.params()
    );
    // OPT-13B (ReLU, `ffn_dim`, tied head, 2 + 2048 learned positions): 12.85 B.
    let opt = fixture("opt-13b.json");
    assert!(!opt.gated_mlp && opt.tied_embeddings);
    assert_eq!((opt.intermediate, opt.position_embeddings), (20480, 2050));
    assert!(
        (opt.params() / 1e9 - 12.85).abs() < 0.1285,
        "{}",
        opt.params()
    );
}

#[test]
fn gpt2_style_keys_and_implied_widths() {
    // GPT-2 small: n_embd 768, 12 layers, an MLP of 4 x 768, 1024 learned positions: 124 M.
    let g = spec(
        r#"{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
            "n_positions": 1024, "vocab_size": 50257}"#,
    )
    .unwrap();
    assert_eq!(
        (g.hidden, g.intermediate, g.max_position),
        (768, 3072, 1024)
    );
    assert!((g.params() / 1e6 - 124.4).abs() < 1.5, "{}", g.params());
    // StarCoder (GPT-BigCode): multi-query attention, one KV head.
    let s = spec(
        r#"{"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40,
            "n_positions": 8192, "multi_query": true, "vocab_size": 49152}"#,
    )
    .unwrap();
    assert_eq!(s.kv_heads, 1);
}

#[test]
fn what_sim_does_not_model_is_refused_by_name() {
    for (json, needle) in [
        (
            r#"{"model_type": "mamba", "d_model": 2560, "n_layer": 64, "vocab_size": 50280}"#,
            "model_type `mamba`",
        ),
        (
            r#"{"architectures": ["BertForMaskedLM"], "hidden_size": 768, "num_attention_heads": 12,
                "num_hidden_layers": 12, "intermediate_size": 3072, "vocab_size": 30522}"#,
            "BertForMaskedLM",
        ),
        (
            r#"{"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 0,
                "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000}"#,
            "num_key_value_heads",
        ),
        (
            r#"{"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 0}"#,
            "max_position_embeddings",
        ),
        (
            r#"{"hidden_size": 4096, "num_attention_heads": 67108864, "head_dim": 64,
                "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000}"#,
            "num_attention_heads",
        ),
    ] {
        let e = spec(json).expect_err(needle);
        assert!(e.contains(needle) && e.starts_with("config.json"), "{e}");
    }
}

/// Qwen3's mixtures of experts, as the catalog holds them and as their `config.json` reads:
/// the published totals (235 B with 22 B active; 30.5 B with 3.3 B active) within 2%.
#[test]
fn qwen3_moe_sizes_match_their_model_cards() {
    for (name, config, total, active) in [
        ("qwen3-235b-a22b", "Qwen--Qwen3-235B-A22B", 235.0, 22.0),
        ("qwen3-30b-a3b", "Qwen--Qwen3-30B-A3B", 30.5, 3.3),
    ] {
        let m = sim::catalog::find_model(name).expect("catalog");
        let path = format!("calibration/serving/aiconfigurator/model_configs/{config}_config.json");
        let read =
            sim::catalog::ModelSpec::from_hf_config(std::path::Path::new(&path)).expect("config");
        assert_eq!(
            read.params(),
            m.params(),
            "{name}: catalog and config.json agree"
        );
        assert_eq!((m.num_experts, m.experts_per_token), (128, 8), "{name}");
        let (p, a) = (m.params() / 1e9, m.active_params() / 1e9);
        assert!((p - total).abs() < 0.02 * total, "{name}: {p} B");
        assert!((a - active).abs() < 0.02 * active, "{name}: {a} B active");
    }
}

/// A catalog model and the same model read from its shipped `config.json` agree.
fn catalog_and_config(name: &str, config: &str) -> ModelSpec {
    let m = sim::catalog::find_model(name).expect("catalog").clone();
    let path = format!("calibration/serving/aiconfigurator/model_configs/{config}_config.json");
    let read = ModelSpec::from_hf_config(std::path::Path::new(&path)).expect("config");
    assert_eq!(read.params(), m.params(), "{name}: catalog and config.json");
    assert_eq!(read.arch, m.arch, "{name}: catalog and config.json");
    m
}

#[test]
fn todays_mixtures_of_experts_match_their_model_cards() {
    // Totals within 2% of the model cards (DeepSeek-V3: 671 B main model, 37 B active;
    // gpt-oss-120b: 116.8 B; Qwen3.5-397B-A17B: 397 B). Active counts are stated rounded
    // to the billion (17 B: 16.5-17.5) and gpt-oss's 5.1 B counts the unembedding alone.
    let ds = catalog_and_config("deepseek-r1", "deepseek-ai--DeepSeek-R1");
    let (p, a) = (ds.params() / 1e9, ds.active_params() / 1e9);
    assert!((p - 671.0).abs() < 0.02 * 671.0, "DeepSeek-R1 {p} B");
    assert!((a - 37.0).abs() < 0.02 * 37.0, "DeepSeek-R1 {a} B active");
    // The MTP module: 685 B in all on the Hugging Face page, which counts its own copy of
    // the embedding and head (2 x 0.93 B).
    let with_mtp = (ds.params() + ds.mtp_params() + 2.0 * ds.embedding_params()) / 1e9;
    assert!(
        (with_mtp - 685.0).abs() < 0.02 * 685.0,
        "with MTP {with_mtp} B"
    );
    let mla = ds.arch.mla.expect("latent attention");
    assert_eq!((mla.kv_lora_rank, mla.qk_rope_head_dim), (512, 64));
    assert_eq!(
        (
            ds.arch.dense_layers,
            ds.moe_layers(),
            ds.arch.dense_intermediate
        ),
        (3, 58, 18432)
    );
    assert_eq!(ds.arch.shared_expert_intermediate, 2048);
    // One copy of 576 values per token and layer, not 2 x 128 heads x 128.
    assert_eq!(ds.kv_values_per_token(), 61.0 * 576.0);

    let oss = catalog_and_config("gpt-oss-120b", "openai--gpt-oss-120b");
    let (p, a) = (oss.params() / 1e9, oss.active_params() / 1e9);
    assert!((p - 116.8).abs() < 0.02 * 116.8, "gpt-oss {p} B");
    let unembedding_only = a - oss.embedding_params() / 1e9;
    assert!((unembedding_only - 5.1).abs() < 0.02 * 5.1, "gpt-oss {a} B");
    let s = oss.arch.sliding.expect("sliding layers");
    assert_eq!(
        (s.window, s.layers, oss.full_attention_layers()),
        (128, 18, 18)
    );
    assert_eq!(oss.sliding_window, None, "the full layers see everything");

    let q = catalog_and_config("qwen3.5-397b-a17b", "Qwen--Qwen3.5-397B-A17B");
    let (p, a) = (q.params() / 1e9, q.active_params() / 1e9);
    assert!((p - 397.0).abs() < 0.02 * 397.0, "Qwen3.5 {p} B");
    assert!((16.5..17.5).contains(&a), "Qwen3.5 {a} B active");
    let l = q.arch.linear.expect("linear attention");
    assert_eq!((l.layers, q.full_attention_layers()), (45, 15));
    assert!(q.arch.attn_output_gate && q.arch.mtp_layers == 1);
}

#[test]
fn weights_and_caches_of_todays_formats() {
    use sim::catalog::Dtype;
    use sim::cost_model::{Deployment, Parallel};
    let at = |name: &str, dtype: Dtype, tp: u32, parallel: Parallel| Deployment {
        model: sim::catalog::find_model(name).unwrap().clone(),
        gpu: sim::catalog::find_gpu("b200").unwrap().clone(),
        tp,
        pp: 1,
        dtype,
        kv_dtype: Dtype::Bf16,
        parallel,
    };
    // gpt-oss-120b's checkpoint: the experts in MXFP4 (4.25 bits), the rest in bf16:
    // 60.8 GiB on its model card.
    let oss = at("gpt-oss-120b", Dtype::Mxfp4, 1, Parallel::default());
    let gib = oss.weight_bytes_per_gpu() / f64::from(1u32 << 30);
    assert!((gib - 60.8).abs() < 0.02 * 60.8, "gpt-oss {gib} GiB");
    // Its growing cache is the 18 full layers'; each sliding layer keeps its window
    // (128 tokens: 8 blocks of 16, and the block the window straddles).
    assert_eq!(oss.kv_bytes_per_token(), 18.0 * 2.0 * 8.0 * 64.0 * 2.0);
    let groups = oss.kv_groups(16);
    assert_eq!(groups.len(), 2);
    assert_eq!(
        groups[1].bytes_per_seq,
        18.0 * 2.0 * 8.0 * 64.0 * 2.0 * 144.0
    );
    // Qwen3.5: 15 full layers (2 KV heads of 256), 45 linear ones with a float32 state of
    // 64 value heads x 128 x 128 and a 3-token convolution window per sequence.
    let q = at("qwen3.5-397b-a17b", Dtype::Fp8, 1, Parallel::default());
    assert_eq!(q.kv_bytes_per_token(), 15.0 * 2.0 * 2.0 * 256.0 * 2.0);
    let state =
        45.0 * (64.0 * 128.0 * 128.0 * 4.0 + 3.0 * (2.0 * 16.0 * 128.0 + 64.0 * 128.0) * 2.0);
    assert_eq!(q.seq_state_bytes(16), state);
    // DeepSeek-R1 in fp8 on 8 GPUs: the latent cache is whole on every GPU; the experts
    // split 8 ways by expert parallelism or by tensor parallelism hold the same bytes, and
    // attention data parallelism replicates attention, so it holds more.
    let tp8 = at("deepseek-r1", Dtype::Fp8Block, 8, Parallel::default());
    assert_eq!(tp8.kv_bytes_per_token(), 61.0 * 576.0 * 2.0);
    let ep8 = at("deepseek-r1", Dtype::Fp8Block, 8, Parallel { dp: 1, ep: 8 });
    let dp8 = at("deepseek-r1", Dtype::Fp8Block, 1, Parallel { dp: 8, ep: 8 });
    assert_eq!(tp8.weight_bytes_per_gpu(), ep8.weight_bytes_per_gpu());
    assert!(dp8.weight_bytes_per_gpu() > tp8.weight_bytes_per_gpu() + 5e9);
    assert_eq!(dp8.num_gpus(), 8);
    assert_eq!((dp8.moe_tp(), ep8.moe_tp()), (1, 1));
    // The whole checkpoint (fp8 with block scales, embeddings in bf16): 671 B weights.
    let all = tp8.weight_bytes_per_gpu() * 8.0 / 1e9;
    assert!(
        (all - 690.0).abs() < 0.03 * 690.0,
        "DeepSeek-R1 fp8 {all} GB"
    );
    // NVIDIA's NVFP4 checkpoint (TensorRT Model Optimizer's DeepSeek recipe): attention
    // and the LM head stay in bf16, every MLP is NVFP4 (4 bits and an fp8 scale per 16):
    // 653.9 B routed-expert, 2.55 B shared-expert and 1.19 B dense-layer parameters at
    // 0.5625 bytes (369.9 GB); 11.41 B attention and 0.11 B router parameters and the
    // 1.85 B of the embedding and LM head at 2 bytes (26.7 GB): 396.7 GB counted once. Every
    // GPU holds a whole copy of latent attention's down-projections (q_a and kv_a, 0.92 B
    // parameters, 1.85 GB), so the 8 hold 7 copies more: 409.6 GB. (With the dense MLPs and
    // shared experts in bf16, 415.0.)
    let fp4 = at("deepseek-r1", Dtype::Nvfp4, 8, Parallel::default());
    let all = fp4.weight_bytes_per_gpu() * 8.0 / 1e9;
    assert!(
        (all - 409.6).abs() < 0.002 * 409.6,
        "DeepSeek-R1 NVFP4 {all} GB"
    );
}

#[test]
fn bad_architectures_are_refused_by_name() {
    let base = r#""model_type": "qwen3_moe", "hidden_size": 1024, "num_attention_heads": 8,
        "num_hidden_layers": 4, "intermediate_size": 2048, "vocab_size": 1000"#;
    let err = |extra: &str| spec(&format!("{{{base}, {extra}}}")).unwrap_err();
    let e = err(r#""num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 256"#);
    assert!(
        e.contains("num_experts_per_tok") && e.contains("8 experts"),
        "{e}"
    );
    let e =
        err(r#""layer_types": ["full_attention", "mamba", "full_attention", "full_attention"]"#);
    assert!(e.contains("layer_types[1]") && e.contains("mamba"), "{e}");
    let e = err(r#""layer_types": ["full_attention"]"#);
    assert!(e.contains("lists 1 layers"), "{e}");
    let e = err(
        r#""layer_types": ["sliding_attention", "full_attention", "full_attention", "full_attention"]"#,
    );
    assert!(e.contains("sliding_window"), "{e}");
    let e = err(r#""kv_lora_rank": 512, "qk_rope_head_dim": 64"#);
    assert!(e.contains("qk_nope_head_dim"), "{e}");
    let e = err(
        r#""layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]"#,
    );
    assert!(e.contains("linear_num_key_heads"), "{e}");
    // A shared expert is read now, not refused.
    let ok = spec(&format!(
        r#"{{{base}, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 512}}"#
    ))
    .unwrap();
    assert_eq!(ok.arch.shared_expert_intermediate, 512);
}

#[test]
fn huge_architecture_values_are_errors_not_overflows() {
    let base = r#""model_type": "deepseek_v3", "hidden_size": 1024, "num_attention_heads": 8,
        "num_hidden_layers": 4, "intermediate_size": 2048, "vocab_size": 1000,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 4096"#;
    let e = spec(&format!("{{{base}, \"n_shared_experts\": 4000000000}}")).unwrap_err();
    assert!(e.contains("n_shared_experts"), "{e}");
    let e = spec(&format!(
        "{{{base}, \"num_nextn_predict_layers\": 4000000000}}"
    ))
    .unwrap_err();
    assert!(e.contains("num_nextn_predict_layers"), "{e}");
    let e = spec(&format!(
        r#"{{{base}, "full_attention_interval": 8, "linear_num_key_heads": 4,
            "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64}}"#
    ))
    .unwrap_err();
    assert!(e.contains("at least one full-attention layer"), "{e}");
    // Linear-attention widths at their bounds stay finite.
    let q = spec(&format!(
        r#"{{{base}, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            "linear_num_key_heads": 65536, "linear_num_value_heads": 65536,
            "linear_key_head_dim": 65536, "linear_value_head_dim": 65536}}"#
    ))
    .unwrap();
    assert!(q.params().is_finite());
}

/// Kimi-K2 (DeepSeek-V3's architecture with 384 experts and 64 heads): 1.04 T parameters
/// and 32.6 B active per the model card (stated as "1 T" and "32 B"), the same 576-value
/// latent cache per token and layer as DeepSeek's.
#[test]
fn kimi_k2_matches_its_model_card() {
    let m = sim::catalog::find_model("kimi-k2").expect("catalog");
    let (p, a) = (m.params() / 1e9, m.active_params() / 1e9);
    assert!((p - 1040.0).abs() < 0.02 * 1040.0, "{p} B");
    assert!((a - 32.6).abs() < 0.02 * 32.6, "{a} B active");
    let mla = m.arch.mla.expect("latent attention");
    assert_eq!(mla.cache_width(), 576);
    assert_eq!(
        (m.arch.dense_layers, m.moe_layers(), m.arch.mtp_layers),
        (1, 60, 0)
    );
}

/// Gemma 3's local/global layers (27B: 62 layers, every 6th global, the others attending
/// over 1,024 tokens), from `sliding_window_pattern` or `layer_types` alike: 10 global
/// layers grow with the context; the pool pages them as vLLM groups them, a full group of
/// 10 layers and ceil(52 / 10) = 6 sliding groups beside it.
#[test]
fn gemma3_local_and_global_layers() {
    let base = r#""model_type": "gemma3_text", "num_hidden_layers": 62, "hidden_size": 5376,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
        "intermediate_size": 21504, "vocab_size": 262208, "sliding_window": 1024"#;
    let pattern = spec(&format!("{{{base}, \"sliding_window_pattern\": 6}}")).expect("pattern");
    let types: Vec<&str> = (0..62)
        .map(|i| {
            if (i + 1) % 6 == 0 {
                "\"full_attention\""
            } else {
                "\"sliding_attention\""
            }
        })
        .collect();
    let listed = spec(&format!(
        "{{{base}, \"layer_types\": [{}]}}",
        types.join(",")
    ))
    .expect("listed");
    assert_eq!(pattern.arch, listed.arch);
    let s = pattern.arch.sliding.expect("sliding layers");
    assert_eq!(
        (s.window, s.layers, pattern.full_attention_layers()),
        (1024, 52, 10)
    );
    assert_eq!(pattern.sliding_window, None, "not a uniform window");
    let d = sim::cost_model::Deployment {
        parallel: Default::default(),
        model: pattern,
        gpu: sim::catalog::find_gpu("h100-sxm").expect("gpu").clone(),
        tp: 1,
        pp: 1,
        dtype: sim::catalog::Dtype::Bf16,
        kv_dtype: sim::catalog::Dtype::Bf16,
    };
    let layout = d.page_layout(16, 0.0, true);
    assert_eq!(layout.page_bytes, 16.0 * 10.0 * 2.0 * 16.0 * 128.0 * 2.0);
    assert_eq!(
        layout.side,
        vec![engine::block_manager::SideGroup::Sliding { window: 1024 }; 6]
    );
    assert!(spec(&format!("{{{base}, \"sliding_window_pattern\": 0}}"))
        .unwrap_err()
        .contains("sliding_window_pattern"));
}
