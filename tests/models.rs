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
