//! The OpenAI API's request bodies as `sim serve` reads them, and the response bodies it
//! writes, in the shapes vLLM's OpenAI server uses (`vllm/entrypoints/openai/protocol.py`):
//! what clients such as the `openai` package and `vllm bench serve` send and parse.
//!
//! In: a request body's bytes. Out: a checked [`Generation`] or an [`ApiError`] naming the
//! field (HTTP 400), in OpenAI's error shape. Fields that only change results away from
//! their defaults (penalties, `logit_bias`, tools, ...) are accepted at their defaults
//! and refused otherwise; unknown fields are refused, as every input of this tool.

use engine::request::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error answered to a client: HTTP status and OpenAI's error body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// What went wrong.
    pub message: String,
    /// The offending field, if one.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// OpenAI's error type for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            400 => "BadRequestError",
            404 => "NotFoundError",
            413 => "BadRequestError",
            429 | 503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status,
            }
        })
    }
}

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A completion's `prompt`: text, or token ids (a list of one of either is accepted).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
    continuous_usage_stats: Option<bool>,
}

/// A chat message; `content` is text or a list of text parts.
#[derive(Debug, Clone, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
}

/// The fields both endpoints take (vLLM's sampling extensions included).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    model: Option<String>,
    prompt: Option<PromptField>,
    messages: Option<Vec<ChatMessage>>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: Option<bool>,
    min_tokens: Option<u32>,
    n: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    // Accepted at their defaults only.
    best_of: Option<u32>,
    echo: Option<bool>,
    logprobs: Option<Value>,
    top_logprobs: Option<u32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    min_p: Option<f32>,
    logit_bias: Option<Value>,
    suffix: Option<String>,
    include_stop_str_in_output: Option<bool>,
    skip_special_tokens: Option<bool>,
    spaces_between_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    // Accepted and ignored: they change nothing served.
    #[allow(dead_code)]
    user: Option<String>,
    #[allow(dead_code)]
    request_id: Option<String>,
    #[allow(dead_code)]
    priority: Option<i32>,
    // OpenAI's bookkeeping fields (vLLM ignores them too).
    #[allow(dead_code)]
    store: Option<Value>,
    #[allow(dead_code)]
    metadata: Option<Value>,
    #[allow(dead_code)]
    parallel_tool_calls: Option<Value>,
    #[allow(dead_code)]
    service_tier: Option<Value>,
}

/// The prompt of a generation.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenised by the server.
    Text(String),
    /// Token ids as sent.
    Ids(Vec<u32>),
    /// Chat messages `(role, content)`, through the chat template.
    Chat(Vec<(String, String)>),
}

/// A checked generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The model named (checked against the served one by the caller).
    pub model: Option<String>,
    /// The prompts: one for a chat; a completion may send a list (vLLM's batched
    /// completions), each generating `n` choices, indexed prompt by prompt.
    pub prompts: Vec<Prompt>,
    /// Most tokens to generate (`None`: what the context leaves, or 16 for completions).
    pub max_tokens: Option<u32>,
    /// How tokens are drawn.
    pub sampling: SamplingParams,
    /// Stop strings (not in the output).
    pub stop: Vec<String>,
    /// Token ids that end a choice (as end-of-sequence does).
    pub stop_token_ids: Vec<u32>,
    /// Generate to `max_tokens` whatever is sampled.
    pub ignore_eos: bool,
    /// Neither end-of-sequence, a stop token id nor a stop string ends a choice before
    /// this many tokens (the first two are not even drawn).
    pub min_tokens: u32,
    /// Stop strings and stop token ids stay in the text (vLLM's
    /// `include_stop_str_in_output`).
    pub include_stop: bool,
    /// The prompt's text comes first in the completion (completions only).
    pub echo: bool,
    /// Choices (parallel sampling).
    pub n: u32,
    /// Stream server-sent events.
    pub stream: bool,
    /// A last streamed chunk with the usage.
    pub include_usage: bool,
    /// The usage in every streamed chunk.
    pub continuous_usage: bool,
}

/// Most choices a request may ask for.
pub const MAX_N: u32 = 16;

/// Most stop token ids (and stop strings) a request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// Most prompts one completions request may list.
pub const MAX_PROMPTS: usize = 256;

/// Parses and checks a `/v1/completions` (`chat == false`) or `/v1/chat/completions` body.
pub fn parse(bytes: &[u8], chat: bool) -> Result<Generation, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let body: Body = serde_path_to_error::deserialize(de).map_err(body_error)?;
    let default_only = |name: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(ApiError::bad(
                name,
                format!("`{name}` is not supported by sim serve except at its default"),
            ))
        }
    };
    let echo = body.echo.unwrap_or(false);
    if echo && chat {
        return Err(ApiError::bad(
            "echo",
            "`echo` is supported by sim serve for completions only",
        ));
    }
    let logprobs = parse_logprobs(&body.logprobs, body.top_logprobs, chat)?;
    if echo && logprobs.is_some() {
        return Err(ApiError::bad(
            "echo",
            "`echo` with `logprobs` asks for the prompt's log-probabilities, which sim serve does not compute",
        ));
    }
    default_only(
        "frequency_penalty",
        body.frequency_penalty.unwrap_or(0.0) == 0.0,
    )?;
    default_only(
        "presence_penalty",
        body.presence_penalty.unwrap_or(0.0) == 0.0,
    )?;
    default_only(
        "repetition_penalty",
        body.repetition_penalty.unwrap_or(1.0) == 1.0,
    )?;
    default_only("min_p", body.min_p.unwrap_or(0.0) == 0.0)?;
    default_only(
        "logit_bias",
        match &body.logit_bias {
            None | Some(Value::Null) => true,
            Some(Value::Object(m)) => m.is_empty(),
            _ => false,
        },
    )?;
    default_only("suffix", body.suffix.is_none())?;
    default_only(
        "skip_special_tokens",
        body.skip_special_tokens != Some(false),
    )?;
    default_only(
        "spaces_between_special_tokens",
        body.spaces_between_special_tokens != Some(false),
    )?;
    default_only(
        "add_generation_prompt",
        body.add_generation_prompt != Some(false),
    )?;
    default_only("tools", body.tools.as_ref().is_none_or(|t| t.is_empty()))?;
    default_only(
        "tool_choice",
        matches!(&body.tool_choice, None | Some(Value::Null))
            || body.tool_choice == Some(json!("none"))
            || body.tool_choice == Some(json!("auto")),
    )?;
    default_only(
        "response_format",
        matches!(&body.response_format, None | Some(Value::Null))
            || body.response_format == Some(json!({"type": "text"})),
    )?;
    let prompts = if chat {
        if body.prompt.is_some() {
            return Err(ApiError::bad(
                "prompt",
                "chat completions take `messages`, not `prompt`",
            ));
        }
        let messages = body
            .messages
            .ok_or_else(|| ApiError::bad("messages", "`messages` is required"))?;
        if messages.is_empty() {
            return Err(ApiError::bad("messages", "`messages` must not be empty"));
        }
        let mut out = Vec::with_capacity(messages.len());
        for (i, m) in messages.into_iter().enumerate() {
            if !matches!(
                m.role.as_str(),
                "system" | "user" | "assistant" | "developer"
            ) {
                return Err(ApiError::bad(
                    &format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role: expected system, user, assistant or developer, got `{}`",
                        m.role
                    ),
                ));
            }
            let text = message_text(m.content, i)?;
            let role = if m.role == "developer" {
                "system".to_string()
            } else {
                m.role
            };
            out.push((role, text));
        }
        vec![Prompt::Chat(out)]
    } else {
        if body.messages.is_some() {
            return Err(ApiError::bad(
                "messages",
                "completions take `prompt`, not `messages` (use /v1/chat/completions)",
            ));
        }
        let prompts: Vec<Prompt> = match body.prompt {
            None => return Err(ApiError::bad("prompt", "`prompt` is required")),
            Some(PromptField::Text(t)) => vec![Prompt::Text(t)],
            Some(PromptField::Ids(ids)) => vec![Prompt::Ids(ids)],
            Some(PromptField::Texts(v)) => v.into_iter().map(Prompt::Text).collect(),
            Some(PromptField::IdLists(v)) => v.into_iter().map(Prompt::Ids).collect(),
        };
        if prompts
            .iter()
            .any(|p| matches!(p, Prompt::Ids(ids) if ids.is_empty()))
        {
            return Err(ApiError::bad("prompt", "the prompt has no tokens"));
        }
        if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "a list of 1 to {MAX_PROMPTS} prompts is expected, got {}",
                    prompts.len()
                ),
            ));
        }
        prompts
    };
    let temperature = body.temperature.unwrap_or(1.0);
    if !temperature.is_finite() || !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(
            "temperature",
            format!("`temperature` must be in [0, 2], got {temperature}"),
        ));
    }
    let top_p = body.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            "top_p",
            format!("`top_p` must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match body.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 && k <= i64::from(u32::MAX) => k as u32,
        Some(k) => {
            return Err(ApiError::bad(
                "top_k",
                format!("`top_k` must be -1 (off) or positive, got {k}"),
            ))
        }
    };
    if body.max_tokens.is_some() && body.max_completion_tokens.is_some() {
        return Err(ApiError::bad(
            "max_completion_tokens",
            "give `max_tokens` or `max_completion_tokens`, not both",
        ));
    }
    let max_tokens = body.max_tokens.or(body.max_completion_tokens);
    if max_tokens == Some(0) {
        return Err(ApiError::bad(
            "max_tokens",
            "`max_tokens` must be at least 1",
        ));
    }
    let n = body.n.unwrap_or(1);
    if n == 0 || n > MAX_N {
        return Err(ApiError::bad(
            "n",
            format!("`n` must be in 1..={MAX_N}, got {n}"),
        ));
    }
    if let Some(b) = body.best_of {
        if b != n {
            return Err(ApiError::bad(
                "best_of",
                format!("`best_of` must equal `n` ({n}) in sim serve, got {b}"),
            ));
        }
    }
    let min_tokens = body.min_tokens.unwrap_or(0);
    if let Some(m) = max_tokens {
        if min_tokens > m {
            return Err(ApiError::bad(
                "min_tokens",
                format!("`min_tokens` ({min_tokens}) must not exceed `max_tokens` ({m})"),
            ));
        }
    }
    let stop = match body.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "`stop` strings must not be empty"));
    }
    // Each draw before min_tokens masks these, and each sampled token is looked up in them:
    // a short sorted list.
    let mut stop_token_ids = body.stop_token_ids.unwrap_or_default();
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::bad(
            "stop_token_ids",
            format!(
                "at most {MAX_STOP_TOKEN_IDS} distinct stop token ids, got {}",
                stop_token_ids.len()
            ),
        ));
    }
    if stop.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::bad(
            "stop",
            format!(
                "at most {MAX_STOP_TOKEN_IDS} stop strings, got {}",
                stop.len()
            ),
        ));
    }
    let stream = body.stream.unwrap_or(false);
    let opts = body.stream_options.unwrap_or_default();
    if !stream && (opts.include_usage.is_some() || opts.continuous_usage_stats.is_some()) {
        return Err(ApiError::bad(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    Ok(Generation {
        model: body.model,
        prompts,
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: body.seed.unwrap_or(0),
            logprobs,
        },
        stop,
        stop_token_ids,
        ignore_eos: body.ignore_eos.unwrap_or(false),
        min_tokens,
        include_stop: body.include_stop_str_in_output.unwrap_or(false),
        echo,
        n,
        stream,
        include_usage: opts.include_usage.unwrap_or(false),
        continuous_usage: opts.continuous_usage_stats.unwrap_or(false),
    })
}

/// The top log-probabilities asked for, as each endpoint spells it: completions'
/// `logprobs` (an integer), chat's `logprobs` (true) with `top_logprobs` (an integer,
/// default 0); at most [`SamplingParams::MAX_LOGPROBS`]. `None`: not asked.
fn parse_logprobs(
    logprobs: &Option<Value>,
    top_logprobs: Option<u32>,
    chat: bool,
) -> Result<Option<u32>, ApiError> {
    let most = SamplingParams::MAX_LOGPROBS;
    let within = |name: &str, k: u64| {
        if k <= u64::from(most) {
            Ok(k as u32)
        } else {
            Err(ApiError::bad(
                name,
                format!("`{name}` must be 0 to {most} (the server's max_logprobs), got {k}"),
            ))
        }
    };
    if chat {
        let on = match logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(v) => {
                return Err(ApiError::bad(
                    "logprobs",
                    format!("chat completions take `logprobs` true or false, got {v}"),
                ))
            }
        };
        return match (on, top_logprobs) {
            (false, Some(k)) if k > 0 => Err(ApiError::bad(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            )),
            (false, _) => Ok(None),
            (true, k) => within("top_logprobs", u64::from(k.unwrap_or(0))).map(Some),
        };
    }
    if top_logprobs.is_some() {
        return Err(ApiError::bad(
            "top_logprobs",
            "completions take `logprobs` (an integer), not `top_logprobs`",
        ));
    }
    match logprobs {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k) => within("logprobs", k).map(Some),
            None => Err(ApiError::bad(
                "logprobs",
                format!("`logprobs` must be 0 to {most}, got {n}"),
            )),
        },
        Some(v) => Err(ApiError::bad(
            "logprobs",
            format!("completions take `logprobs` as an integer (0 to {most}), got {v}"),
        )),
    }
}

/// A body that is not JSON, or not the expected shape, naming the field when one is at
/// fault.
pub fn body_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    if path == "." || path == "?" || path.is_empty() {
        ApiError {
            status: 400,
            message: format!("invalid JSON body: {}", e.inner()),
            param: None,
        }
    } else {
        ApiError::bad(
            &path,
            format!("invalid request body at `{path}`: {}", e.inner()),
        )
    }
}

/// A message's text: a string, or the concatenated text of `[{"type": "text", ...}]`.
fn message_text(content: Option<Value>, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            &param,
                            format!("{param}: only text parts (`{{\"type\": \"text\", \"text\": ...}}`) are supported"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad(
            &param,
            format!("{param}: expected a string or a list of text parts"),
        )),
    }
}

/// `/tokenize`'s body: a prompt or chat messages.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeBody {
    /// The model (optional).
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// Or chat messages, through the chat template.
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    /// Add BOS (default true, for a prompt).
    pub add_special_tokens: Option<bool>,
    /// Open the assistant's turn (chat; default true).
    pub add_generation_prompt: Option<bool>,
}

impl TokenizeBody {
    /// Parses a `/tokenize` body.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let body: TokenizeBody = serde_path_to_error::deserialize(de).map_err(body_error)?;
        if body.prompt.is_some() == body.messages.is_some() {
            return Err(ApiError::bad(
                "prompt",
                "give exactly one of `prompt` and `messages`",
            ));
        }
        Ok(body)
    }

    /// The chat messages as `(role, content)`, if given.
    pub fn chat(&self) -> Result<Option<Vec<(String, String)>>, ApiError> {
        let Some(msgs) = &self.messages else {
            return Ok(None);
        };
        msgs.iter()
            .enumerate()
            .map(|(i, m)| Ok((m.role.clone(), message_text(m.content.clone(), i)?)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// `/detokenize`'s body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeBody {
    /// The model (optional).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// Token counts of a response.
pub fn usage(prompt: u32, completion: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_chat_bodies_parse_with_vllm_defaults() {
        let g = parse(
            br#"{"model":"m","prompt":"hi","max_tokens":8,"temperature":0,"stream":true,
                "stream_options":{"include_usage":true},"ignore_eos":true,"logprobs":null}"#,
            false,
        )
        .unwrap();
        assert_eq!(g.prompts, [Prompt::Text("hi".into())]);
        assert!(g.sampling.is_greedy() && g.stream && g.include_usage && g.ignore_eos);
        assert_eq!(g.max_tokens, Some(8));
        let g = parse(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"max_completion_tokens":3}"#,
            true,
        )
        .unwrap();
        assert_eq!(g.prompts, [Prompt::Chat(vec![("user".into(), "a".into())])]);
        assert_eq!(g.max_tokens, Some(3));
        assert_eq!(g.sampling.temperature, 1.0);
        assert_eq!(g.sampling.logprobs, None);
        // A list of prompts (batched completions).
        let g = parse(br#"{"prompt":["a","b"],"max_tokens":2}"#, false).unwrap();
        assert_eq!(
            g.prompts,
            [Prompt::Text("a".into()), Prompt::Text("b".into())]
        );
        let g = parse(br#"{"prompt":[[1,2],[3]]}"#, false).unwrap();
        assert_eq!(g.prompts, [Prompt::Ids(vec![1, 2]), Prompt::Ids(vec![3])]);
        // Log-probabilities as each endpoint spells them.
        let g = parse(br#"{"prompt":"x","logprobs":5}"#, false).unwrap();
        assert_eq!(g.sampling.logprobs, Some(5));
        let chat = |b: &str| parse(b.as_bytes(), true).unwrap().sampling.logprobs;
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        assert_eq!(chat(&format!(r#"{{{m},"logprobs":true}}"#)), Some(0));
        assert_eq!(
            chat(&format!(r#"{{{m},"logprobs":true,"top_logprobs":3}}"#)),
            Some(3)
        );
        assert_eq!(chat(&format!(r#"{{{m},"logprobs":false}}"#)), None);
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases: &[(&[u8], bool, &str)] = &[
            (b"{", false, ""),
            (br#"{"prompt":"x","max_tokens":0}"#, false, "max_tokens"),
            (br#"{"prompt":"x","bogus":1}"#, false, ""),
            (br#"{"prompt":"x","temperature":-1}"#, false, "temperature"),
            (br#"{"prompt":"x","top_p":0}"#, false, "top_p"),
            (br#"{"prompt":"x","n":0}"#, false, "n"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"echo":true}"#,
                true,
                "echo",
            ),
            (br#"{"prompt":"x","echo":true,"logprobs":1}"#, false, "echo"),
            (br#"{"prompt":"x","logprobs":21}"#, false, "logprobs"),
            (br#"{"prompt":"x","logprobs":true}"#, false, "logprobs"),
            (br#"{"prompt":"x","top_logprobs":2}"#, false, "top_logprobs"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                true,
                "top_logprobs",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"logprobs":3}"#,
                true,
                "logprobs",
            ),
            (
                br#"{"prompt":"x","stream_options":{"include_usage":true}}"#,
                false,
                "stream_options",
            ),
            (br#"{"messages":[]}"#, true, "messages"),
            (
                br#"{"messages":[{"role":"robot","content":"x"}]}"#,
                true,
                "messages[0].role",
            ),
            (br#"{"prompt":"x"}"#, true, "prompt"),
            (br#"{"max_tokens":4}"#, false, "prompt"),
            (br#"{"prompt":[]}"#, false, "prompt"),
            (
                format!(
                    r#"{{"prompt":"x","stop_token_ids":{:?}}}"#,
                    (0..65).collect::<Vec<u32>>()
                )
                .leak()
                .as_bytes(),
                false,
                "stop_token_ids",
            ),
        ];
        for (body, chat, param) in cases {
            let e = parse(body, *chat).unwrap_err();
            assert_eq!(e.status, 400);
            if !param.is_empty() {
                assert_eq!(e.param.as_deref(), Some(*param), "{e:?}");
            }
            assert!(e.body()["error"]["message"].is_string());
        }
        let e = parse(br#"{"prompt":"x","bogus":1}"#, false).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
    }
}
