//! `sim speculate`: measure speculative decoding on a real GGUF model (the CPU runtime,
//! greedy): each prompt decoded plainly and speculatively, outputs checked identical,
//! acceptance and speeds reported, with the per-position rates as a scenario's `acceptance`.

use std::path::PathBuf;

/// Measure speculative decoding on a real GGUF model (the CPU runtime, greedy): each
/// prompt decoded plainly and speculatively, outputs checked identical, acceptance
/// and speeds reported, with the per-position rates as a scenario's `acceptance`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// A prompt (repeatable; default: the 12 prompts of llama.cpp's oracle).
    #[arg(long = "prompt")]
    pub prompts: Vec<String>,
    /// Send each prompt through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Draft method: `ngram` (prompt lookup by the engine) or `self` (the model's
    /// first --draft-layers layers).
    #[arg(long, default_value = "ngram")]
    pub method: String,
    /// Drafts per verify step.
    #[arg(long, default_value_t = 4)]
    pub k: u32,
    /// Layers of the self-speculation draft (`--method self`).
    #[arg(long, default_value_t = 20)]
    pub draft_layers: usize,
    /// Shortest and longest n-gram (`--method ngram`).
    #[arg(long, default_value_t = 1)]
    pub min_n: u32,
    /// Longest n-gram.
    #[arg(long, default_value_t = 4)]
    pub max_n: u32,
    /// Tokens generated per prompt (generation also stops at end-of-sequence).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
}

/// Runs `sim speculate`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        model,
        prompts,
        chat,
        method,
        k,
        draft_layers,
        min_n,
        max_n,
        max_tokens,
    } = args;
    if max_tokens == 0 {
        anyhow::bail!("--max-tokens: must be at least 1");
    }
    let (m, layers) = match method.as_str() {
        "ngram" => (engine::spec::Method::Ngram, None),
        "self" => (engine::spec::Method::DraftModel, Some(draft_layers)),
        other => anyhow::bail!("--method: `{other}` is not ngram or self"),
    };
    let spec = sim::speculate::greedy_spec(m, k, min_n, max_n)
        .map_err(|e| anyhow::anyhow!("--k/--min-n/--max-n: {e}"))?;
    let gguf = kernels::gguf::Gguf::open(&model)?;
    let tok = kernels::tokenizer::Tokenizer::from_gguf(&gguf)?;
    let layers_in_model = gguf.meta_u32("llama.block_count").unwrap_or(0) as usize;
    if let Some(l) = layers {
        if l == 0 || l >= layers_in_model {
            anyhow::bail!(
                "--draft-layers: must be from 1 to {} (the model has {layers_in_model} layers), got {l}",
                layers_in_model.saturating_sub(1)
            );
        }
    }
    let ids: Vec<Vec<u32>> = if prompts.is_empty() {
        kernels::oracle::smollm2()
            .into_iter()
            .map(|c| c.prompt_ids)
            .collect()
    } else {
        prompts
            .into_iter()
            .map(|p| {
                let text = if chat {
                    tok.apply_chat_template(
                        &[kernels::tokenizer::Message {
                            role: "user".into(),
                            content: p,
                        }],
                        true,
                    )?
                } else {
                    p
                };
                let mut v = Vec::new();
                if tok.add_bos {
                    v.extend(tok.bos);
                }
                v.extend(tok.encode(&text, true));
                Ok::<_, anyhow::Error>(v)
            })
            .collect::<Result<_, _>>()?
    };
    if ids.iter().any(Vec::is_empty) {
        anyhow::bail!("--prompt: a prompt has no tokens");
    }
    let measured = sim::speculate::measure(&gguf, &ids, max_tokens, tok.eos, spec, layers)
        .map_err(|e| anyhow::anyhow!("{}: {e}", model.display()))?;
    let name = match layers {
        Some(l) => format!("self-speculation ({l} layers)"),
        None => format!("n-gram ({min_n}-{max_n})"),
    };
    out.push_str(&sim::speculate::report(&measured, &name, k));
    Ok(())
}
