//! The HTTP routes (axum): OpenAI's `/v1/models`, `/v1/completions` and
//! `/v1/chat/completions` (server-sent events when `stream`), vLLM's `/health`,
//! `/tokenize`, `/detokenize`, `/version` and `/metrics`.
//!
//! In: requests; each generation becomes a [`Submission`] to the engine loop, whose events
//! a [`Session`] (`session.rs`) turns into text per choice. Out: OpenAI-shaped bodies,
//! whole or streamed, errors included (`{"error": {...}}` with a 4xx or 5xx status).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::plan::TokenLogprobs;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::api::{self, ApiError, Generation, Prompt};
use super::engine_loop::{Cmd, Event, Submission};
use super::metrics::Metrics;
use super::session::{engine_gone, started, Delta, Session};
use super::stop::{Decode, StopStrings};
use super::text::Text;

/// What every handler shares.
pub struct AppState {
    pub(super) cmds: mpsc::UnboundedSender<Cmd>,
    pub(super) text: Arc<Text>,
    model: String,
    max_model_len: u32,
    pub(super) pool_tokens: u64,
    metrics: Arc<Mutex<Metrics>>,
    in_flight: AtomicUsize,
    max_in_flight: usize,
    /// Generated tokens are the cost model's placeholders: text them as synthetic words.
    synthetic_output: bool,
    created: u64,
    next_response: AtomicUsize,
}

impl AppState {
    /// The shared state of a server.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cmds: mpsc::UnboundedSender<Cmd>,
        text: Text,
        model: String,
        max_model_len: u32,
        pool_tokens: u64,
        metrics: Arc<Mutex<Metrics>>,
        max_in_flight: usize,
        synthetic_output: bool,
    ) -> Self {
        AppState {
            cmds,
            text: Arc::new(text),
            model,
            max_model_len,
            pool_tokens,
            metrics,
            in_flight: AtomicUsize::new(0),
            max_in_flight,
            synthetic_output,
            created: unix_now(),
            next_response: AtomicUsize::new(0),
        }
    }

    /// The text of generated `ids`, `offset` the index of `ids[0]` in the completion.
    pub(super) fn decode_output(&self, ids: &[u32], offset: usize) -> String {
        if self.synthetic_output {
            Text::Synthetic.decode(ids, offset)
        } else {
            self.text.decode(ids, offset)
        }
    }

    /// [`Self::decode_output`] as the engine loop holds it (without the server's state).
    fn decoder(&self) -> Decode {
        if self.synthetic_output {
            Arc::new(|ids: &[u32], offset| Text::Synthetic.decode(ids, offset))
        } else {
            let text = self.text.clone();
            Arc::new(move |ids: &[u32], offset| text.decode(ids, offset))
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.body())).into_response()
    }
}

/// Serves until `stop` fires (or a signal, with `signals`, or the engine loop ends: a
/// failed backend leaves nothing to serve with); returns once every connection has ended.
pub async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    stop: oneshot::Receiver<()>,
    signals: bool,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let cmds = state.cmds.clone();
    let engine = state.cmds.clone();
    let app = Router::new()
        .route("/health", get(health))
        .route("/ping", get(|| async { StatusCode::OK }))
        .route("/version", get(version))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError {
                status: 404,
                message: "no such route".into(),
                param: None,
            }
        })
        .with_state(state);
    let shutdown = async move {
        if signals {
            let term = async {
                #[cfg(unix)]
                if let Ok(mut s) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                {
                    s.recv().await;
                    return;
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                _ = stop => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = term => {}
                _ = engine.closed() => {}
            }
        } else {
            tokio::select! {
                _ = stop => {}
                _ = engine.closed() => {}
            }
        }
        // Requests in flight are aborted, so that their streams end and the server drains.
        let _ = cmds.send(Cmd::Shutdown);
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// 200 while the engine runs; 503 once it has stopped (a failed backend, or shutting down).
async fn health(State(st): State<Arc<AppState>>) -> StatusCode {
    if st.cmds.is_closed() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model,
            "object": "model",
            "created": st.created,
            "owned_by": "sim",
            "root": st.model,
            "parent": null,
            "max_model_len": st.max_model_len,
            "permission": [],
        }]
    }))
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st
        .metrics
        .lock()
        .map(|m| m.exposition(&st.model))
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A body's bytes, or the error a client gets for an unreadable one.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError {
        status: e.status().as_u16(),
        message: e.body_text(),
        param: None,
    })
}

fn check_model(st: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if *m != st.model => Err(ApiError {
            status: 404,
            message: format!("The model `{m}` does not exist."),
            param: Some("model".into()),
        }),
        _ => Ok(()),
    }
}

fn chat_messages(msgs: Vec<(String, String)>) -> Vec<kernels::tokenizer::Message> {
    msgs.into_iter()
        .map(|(role, content)| kernels::tokenizer::Message { role, content })
        .collect()
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body_bytes(body)?;
    let b = api::TokenizeBody::parse(&bytes)?;
    check_model(&st, &b.model)?;
    let tokens = match (b.chat()?, &b.prompt) {
        (Some(msgs), _) => {
            let text = st
                .text
                .chat(&chat_messages(msgs))
                .map_err(|e| ApiError::bad("messages", e))?;
            st.text.encode(&text, b.add_special_tokens.unwrap_or(false))
        }
        (None, Some(p)) => st.text.encode(p, b.add_special_tokens.unwrap_or(true)),
        (None, None) => Vec::new(),
    };
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": st.max_model_len,
        "tokens": tokens,
        "token_strs": null,
    })))
}

async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body_bytes(body)?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let b: api::DetokenizeBody = serde_path_to_error::deserialize(de).map_err(api::body_error)?;
    check_model(&st, &b.model)?;
    let vocab = st.text.vocab_size();
    if let Some(bad) = b.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            "tokens",
            format!("token id {bad} is outside the vocabulary (0..{vocab})"),
        ));
    }
    Ok(Json(json!({ "prompt": st.text.detokenize(&b.tokens) })))
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, body, false)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, body, true)
        .await
        .unwrap_or_else(|e| e.into_response())
}

/// Holds one of the server's request slots until dropped.
struct Permit(Arc<AppState>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A log-probability as JSON: vLLM writes -infinity (a masked token) as -9999.
fn lp_value(v: f32) -> f64 {
    if v.is_finite() {
        f64::from(v)
    } else {
        -9999.0
    }
}

/// A completion choice's `logprobs` (OpenAI's legacy shape): each token's text, its
/// log-probability, the top tokens' (the drawn one included, as vLLM does) and its offset
/// in characters; `offset` is the text offset of the first, moved past the last.
fn completion_logprobs(text: &Text, lps: &[(u32, TokenLogprobs)], offset: &mut usize) -> Value {
    let mut tokens = Vec::with_capacity(lps.len());
    let mut values = Vec::with_capacity(lps.len());
    let mut tops = Vec::with_capacity(lps.len());
    let mut offsets = Vec::with_capacity(lps.len());
    for (id, lp) in lps {
        let (s, _) = text.token(*id);
        offsets.push(*offset);
        *offset += s.chars().count();
        let mut top = serde_json::Map::new();
        for &(t, v) in &lp.top {
            top.insert(text.token(t).0, json!(lp_value(v)));
        }
        top.insert(s.clone(), json!(lp_value(lp.logprob)));
        tokens.push(s);
        values.push(lp_value(lp.logprob));
        tops.push(Value::Object(top));
    }
    json!({"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops})
}

/// A chat choice's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(text: &Text, lps: &[(u32, TokenLogprobs)]) -> Value {
    let entry = |id: u32, v: f32| {
        let (s, b) = text.token(id);
        json!({"token": s, "logprob": lp_value(v), "bytes": b})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|(id, lp)| {
            let mut e = entry(*id, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, v)| entry(t, v)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// The token ids of one prompt, checked against the vocabulary and `max_model_len`, and
/// the `max_tokens` it gets (vLLM's defaults when unset: 16 for completions, the rest of
/// the context for chat).
fn prompt_tokens(
    st: &AppState,
    g: &Generation,
    prompt: &Prompt,
    chat: bool,
) -> Result<(Vec<u32>, u32), ApiError> {
    let ids = match prompt {
        Prompt::Text(t) => st.text.encode(t, true),
        Prompt::Ids(ids) => {
            let vocab = st.text.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::bad(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary (0..{vocab})"),
                ));
            }
            ids.clone()
        }
        Prompt::Chat(msgs) => {
            let text = st
                .text
                .chat(&chat_messages(msgs.clone()))
                .map_err(|e| ApiError::bad("messages", e))?;
            // The template holds whatever special tokens the model wants (vLLM encodes
            // chats with add_special_tokens false, so no second BOS).
            st.text.encode(&text, false)
        }
    };
    if ids.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt has no tokens"));
    }
    let p = ids.len() as u64;
    let limit = u64::from(st.max_model_len);
    if p >= limit {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "This model's maximum context length is {limit} tokens. However, your prompt has {p} tokens; reduce the length of the prompt."
            ),
        ));
    }
    let max_tokens = match g.max_tokens {
        Some(m) => m,
        None if chat => (limit - p) as u32,
        None => 16u32.min((limit - p) as u32),
    };
    if p + u64::from(max_tokens) > limit {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({p} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or completion.",
                p + u64::from(max_tokens)
            ),
        ));
    }
    Ok((ids, max_tokens))
}

/// The server slots reserved for one HTTP request's prompts: each submission takes one
/// (its [`Permit`] frees it when the engine has ended that request); the ones never taken
/// are freed when this is dropped (a failed submission, a client gone mid-way).
struct Reserved {
    st: Arc<AppState>,
    left: usize,
}

impl Reserved {
    fn take(&mut self) -> Permit {
        self.left = self.left.saturating_sub(1);
        Permit(self.st.clone())
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.st.in_flight.fetch_sub(self.left, Ordering::SeqCst);
    }
}

/// Sends one prompt to the engine, holding `permit` there; the channel of its events.
fn send(
    st: &AppState,
    g: &Generation,
    prompt: Vec<u32>,
    max_tokens: u32,
    stop_ids: &[u32],
    permit: Permit,
) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    // The request's arrival: when it reaches the engine's queue, parsed and tokenized (the
    // time vLLM's engine stamps `queued`), so that a replay sees the order the engine saw.
    let received = Instant::now();
    st.cmds
        .send(Cmd::Submit(Box::new(Submission {
            prompt,
            max_tokens,
            ignore_eos: g.ignore_eos,
            min_tokens: g.min_tokens,
            stop_token_ids: stop_ids.to_vec(),
            stop: (!g.stop.is_empty()).then(|| StopStrings {
                strings: g.stop.clone(),
                decode: st.decoder(),
                include_stop: g.include_stop,
            }),
            n: g.n,
            sampling: g.sampling,
            received,
            events: tx,
            // The engine keeps the slot until the request has ended there (a request
            // aborted by its client still counts until then).
            hold: Box::new(permit),
        })))
        .map_err(|_| engine_gone())?;
    Ok(rx)
}

/// One prompt's part of an answer: its session, the index of its first choice in the
/// answer (prompt `k` of a batch holds choices `k n .. (k + 1) n`), and its text for
/// `echo`.
struct Part {
    session: Session,
    base: u32,
    echoed: Option<String>,
}

/// A completion or chat completion: checked, submitted (one engine request per prompt of a
/// batched completion), answered whole or streamed.
async fn generate(
    st: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let g = api::parse(&bytes, chat)?;
    check_model(&st, &g.model)?;
    if st.synthetic_output && g.sampling.logprobs.is_some() {
        return Err(ApiError::bad(
            "logprobs",
            "`logprobs` needs a real runtime (--backend cpu or cuda): the cost model draws no tokens",
        ));
    }
    let vocab = st.text.vocab_size();
    if let Some(bad) = g.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            "stop_token_ids",
            format!("token id {bad} is outside the vocabulary (0..{vocab})"),
        ));
    }
    if g.prompts.len() > st.max_in_flight {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "{} prompts in one request, more than the server runs at once (--max-concurrency {})",
                g.prompts.len(),
                st.max_in_flight
            ),
        ));
    }
    // Every prompt is checked before any is submitted.
    let prompts = g
        .prompts
        .iter()
        .map(|p| prompt_tokens(&st, &g, p, chat))
        .collect::<Result<Vec<_>, _>>()?;
    let k = prompts.len();
    if st.in_flight.fetch_add(k, Ordering::SeqCst) + k > st.max_in_flight {
        st.in_flight.fetch_sub(k, Ordering::SeqCst);
        return Err(ApiError {
            status: 429,
            message: format!(
                "the server has {} requests in flight, its limit (--max-concurrency)",
                st.max_in_flight
            ),
            param: None,
        });
    }
    // Simulated tokens are placeholders that no stop token id names.
    let stop_ids = if st.synthetic_output {
        Vec::new()
    } else {
        g.stop_token_ids.clone()
    };
    let mut reserved = Reserved {
        st: st.clone(),
        left: k,
    };
    // Every prompt reaches the engine's queue before any answer is awaited, so that a
    // batch is scheduled together.
    let mut sent = Vec::with_capacity(k);
    for (ids, max_tokens) in prompts {
        let len = ids.len() as u32;
        sent.push((
            send(&st, &g, ids, max_tokens, &stop_ids, reserved.take())?,
            len,
        ));
    }
    drop(reserved);
    let mut parts = Vec::with_capacity(k);
    for (i, ((rx, len), prompt)) in sent.into_iter().zip(&g.prompts).enumerate() {
        // (A failure drops the sessions started so far, which aborts them; the engine ends
        // the requests whose channels closed.)
        let session = started(&st, &g, rx, len, &stop_ids).await?;
        // echo: the prompt's text, as the client sent it or as its ids decode.
        let echoed = match (prompt, g.echo) {
            (Prompt::Text(t), true) => Some(t.clone()),
            (Prompt::Ids(ids), true) => Some(st.text.detokenize(ids)),
            _ => None,
        };
        parts.push(Part {
            session,
            base: i as u32 * g.n,
            echoed,
        });
    }
    let prefix = if chat { "chatcmpl" } else { "cmpl" };
    let rid = format!(
        "{prefix}-{}-{}",
        st.created,
        st.next_response.fetch_add(1, Ordering::Relaxed)
    );
    if g.stream {
        Ok(stream(st, parts, g, chat, rid).into_response())
    } else {
        whole(st, parts, &g, chat, rid).await
    }
}

/// How a choice is rendered: the endpoint and whether log-probabilities were asked.
#[derive(Clone, Copy)]
struct Render {
    chat: bool,
    logprobs: bool,
}

impl Render {
    /// The `logprobs` of a choice or chunk; `offset`: a completion's text offset.
    fn logprobs(&self, text: &Text, lps: &[(u32, TokenLogprobs)], offset: &mut usize) -> Value {
        match (self.logprobs, self.chat) {
            (false, _) => Value::Null,
            (true, true) => chat_logprobs(text, lps),
            (true, false) => completion_logprobs(text, lps, offset),
        }
    }
}

/// A non-streamed answer: every choice's text, once all have finished.
async fn whole(
    st: Arc<AppState>,
    parts: Vec<Part>,
    g: &Generation,
    chat: bool,
    rid: String,
) -> Result<Response, ApiError> {
    let render = Render {
        chat,
        logprobs: g.sampling.logprobs.is_some(),
    };
    let (mut choices, mut prompt_tokens, mut completion_tokens) = (Vec::new(), 0u32, 0u32);
    // The sessions run side by side in the engine; their answers are read in turn.
    let mut parts = parts;
    for part in &mut parts {
        let s = &mut part.session;
        let n = s.choices.len();
        let mut texts = vec![part.echoed.clone().unwrap_or_default(); n];
        let mut reasons = vec![(None, None); n];
        let mut lps: Vec<Vec<(u32, TokenLogprobs)>> = vec![Vec::new(); n];
        while let Some(deltas) = s.next().await? {
            for d in deltas {
                texts[d.index as usize].push_str(&d.text);
                lps[d.index as usize].extend(d.logprobs);
                if d.finish.is_some() {
                    reasons[d.index as usize] = (d.finish, d.stop_reason);
                }
            }
        }
        for (i, ((text, (reason, stop_reason)), lps)) in
            texts.into_iter().zip(reasons).zip(lps).enumerate()
        {
            let index = part.base + i as u32;
            let logprobs = render.logprobs(&st.text, &lps, &mut 0);
            choices.push(if chat {
                json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "stop_reason": stop_reason,
                })
            } else {
                json!({
                    "index": index,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                    "stop_reason": stop_reason,
                })
            });
        }
        prompt_tokens += s.prompt_len;
        completion_tokens += s.completion_tokens();
    }
    Ok(Json(json!({
        "id": rid,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": unix_now(),
        "model": st.model,
        "choices": choices,
        "usage": api::usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

/// What every chunk of one streamed answer shares.
struct Chunks {
    rid: String,
    object: &'static str,
    created: u64,
    model: String,
    render: Render,
    continuous_usage: bool,
}

impl Chunks {
    /// One chunk's `data:`.
    fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> String {
        let mut v = json!({
            "id": self.rid,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v.to_string()
    }

    /// A chunk's choice for delta `d` of the part whose first choice is `base` (`first`: a
    /// chat's opening chunk, with the role).
    fn choice(&self, text: &Text, d: &Delta, base: u32, first: bool, offset: &mut usize) -> Value {
        let logprobs = self.render.logprobs(text, &d.logprobs, offset);
        let index = base + d.index;
        if self.render.chat {
            let delta = if first {
                json!({"role": "assistant", "content": d.text})
            } else if d.text.is_empty() && d.finish.is_some() {
                json!({})
            } else {
                json!({"content": d.text})
            };
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": d.finish, "stop_reason": d.stop_reason})
        } else {
            json!({"index": index, "text": d.text, "logprobs": logprobs, "finish_reason": d.finish, "stop_reason": d.stop_reason})
        }
    }
}

/// Streams one part's chunks into `tx` until its choices end; its token counts, or `None`
/// when the client hung up or the engine failed (the error then went in the stream).
async fn pump(part: Part, c: Arc<Chunks>, tx: mpsc::Sender<String>) -> Option<(u32, u32)> {
    let Part {
        session: mut s,
        base,
        echoed,
    } = part;
    let st = s.st.clone();
    let text = &st.text;
    let n = s.choices.len();
    let mut offsets = vec![0usize; n];
    let blank = |i: usize| Delta {
        index: i as u32,
        text: String::new(),
        finish: None,
        stop_reason: None,
        logprobs: Vec::new(),
    };
    if let Some(prompt) = &echoed {
        // echo: the prompt first, a chunk per choice, as vLLM sends it.
        for (i, offset) in offsets.iter_mut().enumerate() {
            let d = Delta {
                text: prompt.clone(),
                ..blank(i)
            };
            let ch = c.choice(text, &d, base, false, offset);
            tx.send(c.chunk(vec![ch], None)).await.ok()?;
        }
    }
    if c.render.chat {
        // The role first, as vLLM sends it.
        for (i, offset) in offsets.iter_mut().enumerate() {
            let ch = c.choice(text, &blank(i), base, true, offset);
            tx.send(c.chunk(vec![ch], None)).await.ok()?;
        }
    }
    loop {
        let next = tokio::select! {
            n = s.next() => n,
            // The client hung up: dropping the session aborts the request.
            _ = tx.closed() => return None,
        };
        match next {
            Ok(Some(deltas)) => {
                for d in deltas {
                    if d.text.is_empty() && d.finish.is_none() && d.logprobs.is_empty() {
                        continue;
                    }
                    let usage = c
                        .continuous_usage
                        .then(|| api::usage(s.prompt_len, s.completion_tokens()));
                    let ch = c.choice(text, &d, base, false, &mut offsets[d.index as usize]);
                    tx.send(c.chunk(vec![ch], usage)).await.ok()?;
                }
            }
            Ok(None) => return Some((s.prompt_len, s.completion_tokens())),
            Err(e) => {
                // Headers are sent: the error goes in the stream, as vLLM does.
                let _ = tx.send(e.body().to_string()).await;
                return None;
            }
        }
    }
}

/// A streamed answer: a chunk per step and choice (the parts of a batch side by side), the
/// usage if asked, `[DONE]`.
fn stream(
    st: Arc<AppState>,
    parts: Vec<Part>,
    g: Generation,
    chat: bool,
    rid: String,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = mpsc::channel::<String>(64);
    let c = Arc::new(Chunks {
        rid,
        object: if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        },
        created: unix_now(),
        model: st.model.clone(),
        render: Render {
            chat,
            logprobs: g.sampling.logprobs.is_some(),
        },
        continuous_usage: g.continuous_usage,
    });
    tokio::spawn(async move {
        let pumps: Vec<_> = parts
            .into_iter()
            .map(|p| tokio::spawn(pump(p, c.clone(), tx.clone())))
            .collect();
        let (mut prompt, mut completion, mut complete) = (0u32, 0u32, true);
        for p in pumps {
            match p.await {
                Ok(Some((a, b))) => {
                    prompt += a;
                    completion += b;
                }
                _ => complete = false,
            }
        }
        if tx.is_closed() {
            return;
        }
        if g.include_usage && complete {
            let usage = api::usage(prompt, completion);
            let _ = tx.send(c.chunk(Vec::new(), Some(usage))).await;
        }
        let _ = tx.send("[DONE]".into()).await;
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let data = rx.recv().await?;
        Some((Ok(SseEvent::default().data(data)), rx))
    });
    Sse::new(events)
}
