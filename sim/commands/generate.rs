//! `sim generate`: generate a completion with a real GGUF model (e.g. SmolLM2-135M-Instruct
//! Q4_1): the prompt goes through the model's tokenizer (and chat template with --chat); the
//! text streams to stdout, the token counts and speeds follow.

use std::path::PathBuf;

use sim::run::BackendKind;

/// Generate a completion with a real GGUF model (e.g. SmolLM2-135M-Instruct Q4_1): the
/// prompt goes through the model's tokenizer (and chat template with --chat); the text
/// streams to stdout, the token counts and speeds follow.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// The prompt.
    #[arg(long)]
    pub prompt: String,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat; default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate (generation also stops at end-of-sequence).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Top-k cut (0: none).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Top-p cut in (0, 1] (1: none).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Backend that runs the model: cpu (the reference runtime) or cuda.
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// Print the prompt's and the completion's token ids too.
    #[arg(long)]
    pub ids: bool,
}

/// Runs `sim generate`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        model,
        prompt,
        chat,
        system,
        max_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        backend,
        ids,
    } = args;
    if backend == BackendKind::Model {
        anyhow::bail!(
            "--backend model: the cost model has no logits to generate from; use --backend cpu or cuda"
        );
    }
    if !temperature.is_finite() || temperature < 0.0 {
        anyhow::bail!("--temperature: must be 0 (greedy) or positive, got {temperature}");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        anyhow::bail!("--top-p: must be in (0, 1], got {top_p}");
    }
    let gguf = kernels::gguf::Gguf::open(&model)?;
    let tok = kernels::tokenizer::Tokenizer::from_gguf(&gguf)?;
    let text = if chat {
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(kernels::tokenizer::Message {
                role: "system".into(),
                content: s,
            });
        }
        messages.push(kernels::tokenizer::Message {
            role: "user".into(),
            content: prompt,
        });
        tok.apply_chat_template(&messages, true)?
    } else {
        prompt
    };
    let mut prompt_ids = Vec::new();
    if tok.add_bos {
        prompt_ids.extend(tok.bos);
    }
    prompt_ids.extend(tok.encode(&text, true));
    let block_size = 16u32;
    let need = prompt_ids.len() as u64 + u64::from(max_tokens);
    let context = gguf
        .meta_u32("llama.context_length")
        .map_or(u64::from(u32::MAX), u64::from);
    if need > context {
        anyhow::bail!(
            "{} prompt tokens + --max-tokens {max_tokens} = {need} exceed the model's context of {context} tokens",
            prompt_ids.len()
        );
    }
    let blocks = (need.div_ceil(u64::from(block_size)) + 1) as u32;
    let sampling = engine::request::SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
        logprobs: None,
    };
    // Stream the text: decode everything drawn so far and print what is new, holding
    // back a trailing partial UTF-8 character.
    let mut stdout = std::io::stdout().lock();
    let mut drawn = Vec::new();
    let mut printed = 0usize;
    let on_token = |t| {
        drawn.push(t);
        let s = tok.decode(&drawn, false);
        if s.len() > printed && !s.ends_with('\u{FFFD}') {
            let _ = std::io::Write::write_all(
                &mut stdout,
                s.as_bytes().get(printed..).unwrap_or_default(),
            );
            let _ = std::io::Write::flush(&mut stdout);
            printed = s.len();
        }
    };
    use kernels::generate::StepRuntime as _;
    let gen = if backend == BackendKind::Cpu {
        let mut rt = kernels::cpu::CpuRuntime::from_gguf(&gguf, block_size, blocks)?;
        rt.generate(&prompt_ids, max_tokens, sampling, tok.eos, on_token)
            .map_err(anyhow::Error::msg)?
    } else {
        let mut rt = kernels::cuda::CudaRuntime::from_gguf(&gguf, block_size, blocks)?;
        rt.warm_up()?;
        rt.generate(&prompt_ids, max_tokens, sampling, tok.eos, on_token)
            .map_err(anyhow::Error::msg)?
    };
    let s = tok.decode(&gen.tokens, false);
    if s.len() > printed {
        let _ =
            std::io::Write::write_all(&mut stdout, s.as_bytes().get(printed..).unwrap_or_default());
    }
    let _ = std::io::Write::write_all(&mut stdout, b"\n");
    let stop = if gen.tokens.last().copied() == tok.eos && tok.eos.is_some() {
        "end of sequence"
    } else {
        "max tokens"
    };
    if ids {
        outln!(out, "prompt ids: {prompt_ids:?}");
        outln!(out, "completion ids: {:?}", gen.tokens);
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    outln!(
        out,
        "prompt {} tokens, prefill {:.1} ms ({:.0} tok/s); generated {} tokens, decode {:.1} ms ({:.1} tok/s); stopped at {stop}",
        prompt_ids.len(),
        ms(gen.prefill_ns),
        prompt_ids.len() as f64 / (gen.prefill_ns.max(1) as f64 / 1e9),
        gen.tokens.len(),
        ms(gen.decode_ns),
        f64::from(gen.decode_steps) / (gen.decode_ns.max(1) as f64 / 1e9)
    );
    Ok(())
}
