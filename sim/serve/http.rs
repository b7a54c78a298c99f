//! The HTTP routes (axum): OpenAI's `/v1/models`, `/v1/completions` and
//! `/v1/chat/completions` (server-sent events when `stream`), vLLM's `/health`,
//! `/tokenize`, `/detokenize`, `/version` and `/metrics`.
//!
//! In: requests; each generation becomes a [`Submission`] to the engine loop, whose
//! [`Event`]s a [`Session`] turns into text per choice (stop strings and stop token ids
//! applied here, as vLLM's detokenizer does). Out: OpenAI-shaped bodies, errors included
//! (`{"error": {...}}` with a 4xx or 5xx status). A session dropped before its request ends
//! (the client hung up) aborts the request, which frees its blocks at the next step.

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
use engine::record::RequestRecord;
use engine::request::{FinishReason, SeqId};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::api::{self, ApiError, Generation, Prompt};
use super::engine_loop::{Cmd, Event, Submission};
use super::metrics::Metrics;
use super::stop::{Decode, OutputText, StopStrings};
use super::text::Text;

/// What every handler shares.
pub struct AppState {
    cmds: mpsc::UnboundedSender<Cmd>,
    text: Arc<Text>,
    model: String,
    max_model_len: u32,
    pool_tokens: u64,
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
    fn decode_output(&self, ids: &[u32], offset: usize) -> String {
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

/// One choice's text so far ([`OutputText`]: decoded incrementally as vLLM's detokenizer
/// does, so a long completion costs the same per token as a short one) and what of it was
/// sent.
#[derive(Debug, Default)]
struct Choice {
    /// Output token ids (all counted in the usage, a stop token id included) and their text.
    out: OutputText,
    /// Bytes of the text already sent.
    sent: usize,
    finished: Option<&'static str>,
    /// What stopped the choice, when not end-of-sequence: the stop string or token id.
    stop_reason: Option<Value>,
    /// Log-probabilities of tokens not sent yet (when asked), with their ids.
    logprobs: Vec<(u32, TokenLogprobs)>,
}

/// Text to send for one choice: new text and, on its last delta, why it ended.
#[derive(Debug)]
struct Delta {
    index: u32,
    text: String,
    finish: Option<&'static str>,
    stop_reason: Option<Value>,
    /// The log-probabilities of the tokens this delta sends (when asked).
    logprobs: Vec<(u32, TokenLogprobs)>,
}

/// One request in flight: its events turned into text deltas.
struct Session {
    st: Arc<AppState>,
    id: SeqId,
    events: mpsc::UnboundedReceiver<Event>,
    choices: Vec<Choice>,
    stop: Vec<String>,
    stop_ids: Vec<u32>,
    /// Stop strings are looked for only once a choice has more tokens than this (vLLM).
    min_tokens: u32,
    ignore_eos: bool,
    /// Stop strings and stop token ids stay in the text.
    include_stop: bool,
    prompt_len: u32,
    /// The engine has ended the request (or been told to).
    ended: bool,
    record: Option<RequestRecord>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.ended {
            // The client went away: the request's blocks are freed at the next step.
            let _ = self.st.cmds.send(Cmd::Abort(self.id, FinishReason::Abort));
        }
    }
}

impl Session {
    fn completion_tokens(&self) -> u32 {
        self.choices.iter().map(|c| c.out.ids.len() as u32).sum()
    }

    fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finished.is_some())
    }

    /// The next deltas; `None` once every choice has finished.
    async fn next(&mut self) -> Result<Option<Vec<Delta>>, ApiError> {
        if self.all_finished() {
            if !self.ended {
                // Stopped here (a stop string): the engine ends the request too.
                self.ended = true;
                let _ = self.st.cmds.send(Cmd::Abort(self.id, FinishReason::Stop));
            }
            return Ok(None);
        }
        let Some(ev) = self.events.recv().await else {
            self.ended = true;
            return Err(engine_gone());
        };
        match ev {
            Event::Started(_) => Ok(Some(Vec::new())),
            Event::Failed(msg) => {
                self.ended = true;
                Err(ApiError {
                    status: 500,
                    message: format!("the engine failed: {msg}"),
                    param: None,
                })
            }
            Event::Tokens {
                index,
                ids,
                logprobs,
                finished,
                scheduler,
            } => Ok(Some(
                self.push(index, &ids, logprobs, finished, scheduler)
                    .into_iter()
                    .collect(),
            )),
            Event::Done(rec) => {
                self.ended = true;
                let reason = rec.finish_reason;
                self.record = Some(rec);
                if reason == FinishReason::RejectedTooLong {
                    return Err(ApiError::bad(
                        "max_tokens",
                        format!(
                            "the request needs more KV cache than the engine holds ({} tokens)",
                            self.st.pool_tokens
                        ),
                    ));
                }
                // Whatever was held back goes out now; unfinished choices were aborted.
                let mut out = Vec::new();
                for i in 0..self.choices.len() {
                    if self.choices[i].finished.is_none() {
                        let end = self.choices[i].out.ids.len();
                        self.advance(i, end, true);
                        self.choices[i].finished = Some("abort");
                        let mut d = self.flush(i, true);
                        d.finish = Some("abort");
                        out.push(d);
                    }
                }
                Ok(Some(out))
            }
        }
    }

    /// Decodes choice `i`'s tokens up to `end` into its text; the decode waits while the
    /// new tokens end inside a character, unless `last`.
    fn advance(&mut self, i: usize, end: usize, last: bool) {
        let st = &self.st;
        self.choices[i].out.advance(
            &|ids: &[u32], offset| st.decode_output(ids, offset),
            end,
            last,
        );
    }

    /// Appends a step's tokens to choice `index`; the text that is safe to send.
    fn push(
        &mut self,
        index: u32,
        ids: &[u32],
        logprobs: Vec<TokenLogprobs>,
        finished: Option<FinishReason>,
        scheduler: Option<FinishReason>,
    ) -> Option<Delta> {
        let i = index as usize;
        if self.choices.get(i)?.finished.is_some() {
            return None;
        }
        let finish = finished.map(|r| match r {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            _ => "abort",
        });
        self.choices[i].out.ids.extend_from_slice(ids);
        // A stop token id (not end-of-sequence) the scheduler stopped on is the stop reason,
        // and is left out of the text unless asked for, as vLLM does (one that is also the
        // max_tokens-th token ended the choice by length, and stays in the text).
        let mut end = self.choices[i].out.ids.len();
        if scheduler == Some(FinishReason::Stop) {
            if let Some(&t) = ids.last() {
                let eos = !self.ignore_eos && Some(t) == self.st.text.eos();
                if !eos && self.stop_ids.contains(&t) {
                    self.choices[i].stop_reason = Some(json!(t));
                    if !self.include_stop {
                        end -= 1;
                    }
                }
            }
        }
        // Log-probabilities go with the tokens that reach the text.
        let from = self.choices[i].out.ids.len() - ids.len();
        let c = &mut self.choices[i];
        for (k, lp) in logprobs.into_iter().enumerate() {
            if from + k < end {
                c.logprobs.push((ids[k], lp));
            }
        }
        self.advance(i, end, finish.is_some());
        let c = &mut self.choices[i];
        // A stop string ends the choice at it (after it, with include_stop_str_in_output).
        if let Some((p, k)) = c.out.find_stop(&self.stop, self.min_tokens) {
            let s = &self.stop[k];
            let cut = if self.include_stop { p + s.len() } else { p };
            c.out.text.truncate(cut);
            c.stop_reason = Some(json!(s));
            c.finished = Some("stop");
            if !self.all_finished() {
                // The other choices go on; this one's sequence ends in the engine (which
                // has ended it already, having found the same string in the same tokens).
                let _ = self.st.cmds.send(Cmd::StopChoice(self.id, index));
            }
            let mut d = self.flush(i, true);
            d.finish = Some("stop");
            return Some(d);
        }
        if finish.is_some() {
            c.finished = finish;
            let mut d = self.flush(i, true);
            d.finish = finish;
            return Some(d);
        }
        Some(self.flush(i, false))
    }

    /// The text of choice `i` not sent yet: all of it when `last`, else what cannot
    /// still turn into a stop string.
    fn flush(&mut self, i: usize, last: bool) -> Delta {
        let c = &mut self.choices[i];
        let mut end = c.out.text.len();
        if !last && !self.include_stop {
            // Hold back a tail that a stop string could start with.
            let text = &c.out.text;
            let hold = self
                .stop
                .iter()
                .flat_map(|s| {
                    (1..s.len())
                        .filter(|&k| s.is_char_boundary(k))
                        .map(move |k| &s[..k])
                })
                .filter(|p| text.ends_with(p))
                .map(|p| p.len())
                .max()
                .unwrap_or(0);
            end -= hold;
        }
        let end = end.max(c.sent);
        let out = c.out.text.get(c.sent..end).unwrap_or_default().to_string();
        c.sent = end;
        Delta {
            index: i as u32,
            text: out,
            finish: None,
            stop_reason: if last { c.stop_reason.clone() } else { None },
            logprobs: std::mem::take(&mut c.logprobs),
        }
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

fn engine_gone() -> ApiError {
    ApiError {
        status: 503,
        message: "the engine has stopped (the server is shutting down)".into(),
        param: None,
    }
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

/// The session of a prompt sent, once the engine has taken it.
async fn started(
    st: &Arc<AppState>,
    g: &Generation,
    mut rx: mpsc::UnboundedReceiver<Event>,
    prompt_len: u32,
    stop_ids: &[u32],
) -> Result<Session, ApiError> {
    let id = match rx.recv().await {
        Some(Event::Started(id)) => id,
        Some(Event::Failed(msg)) => {
            return Err(ApiError {
                status: 503,
                message: msg,
                param: None,
            })
        }
        _ => return Err(engine_gone()),
    };
    Ok(Session {
        st: st.clone(),
        id,
        events: rx,
        choices: (0..g.n).map(|_| Choice::default()).collect(),
        stop: g.stop.clone(),
        stop_ids: stop_ids.to_vec(),
        min_tokens: g.min_tokens,
        ignore_eos: g.ignore_eos,
        include_stop: g.include_stop,
        prompt_len,
        ended: false,
        record: None,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A session over the synthetic text (token `k` of a choice decodes to the word at
    /// position `k`, whatever its id), fed by hand.
    fn session(stop: &[&str], stop_ids: &[u32], min_tokens: u32, include_stop: bool) -> Session {
        let (cmds, _) = mpsc::unbounded_channel();
        let (_, events) = mpsc::unbounded_channel();
        let st = AppState::new(
            cmds,
            Text::Synthetic,
            "m".into(),
            4096,
            1 << 16,
            Arc::new(Mutex::new(Metrics::default())),
            8,
            true,
        );
        Session {
            st: Arc::new(st),
            id: 0,
            events,
            choices: vec![Choice::default()],
            stop: stop.iter().map(|s| s.to_string()).collect(),
            stop_ids: stop_ids.to_vec(),
            min_tokens,
            ignore_eos: false,
            include_stop,
            prompt_len: 3,
            // Nothing to abort when dropped.
            ended: true,
            record: None,
        }
    }

    /// Feeds `steps` (token counts) of placeholder ids, the last step ending with
    /// `last`; returns the text sent and the last delta's finish and stop reason.
    fn feed(
        s: &mut Session,
        steps: &[usize],
        last: Option<FinishReason>,
    ) -> (String, Option<&'static str>, Option<Value>) {
        let mut text = String::new();
        let mut end = (None, None);
        for (k, &n) in steps.iter().enumerate() {
            let fin = if k + 1 == steps.len() { last } else { None };
            if let Some(d) = s.push(0, &vec![3; n], Vec::new(), fin, fin) {
                text.push_str(&d.text);
                if d.finish.is_some() {
                    end = (d.finish, d.stop_reason);
                    break;
                }
            }
        }
        (text, end.0, end.1)
    }

    fn words(n: usize) -> String {
        Text::Synthetic.decode(&vec![0; n], 0)
    }

    #[test]
    fn incremental_text_equals_the_whole_decode() {
        let mut s = session(&[], &[], 0, false);
        let steps = [1, 3, 2, 1, 5, 4, 1];
        let (text, fin, why) = feed(&mut s, &steps, Some(FinishReason::Length));
        assert_eq!(text, words(17));
        assert_eq!((fin, why), (Some("length"), None));
        assert_eq!(s.completion_tokens(), 17);
        // Each decode sees at most the last two steps' tokens.
        assert_eq!((s.choices[0].out.prefix, s.choices[0].out.read), (16, 17));
    }

    #[test]
    fn stop_strings_across_steps_are_held_back_and_cut() {
        // " to in" spans tokens 4 and 5: " to" is held back, then cut with " in".
        let mut s = session(&[" to in", "zzz"], &[], 0, false);
        let mut sent = Vec::new();
        for _ in 0..6 {
            let d = s.push(0, &[3], Vec::new(), None, None).expect("delta");
            sent.push(d.text.clone());
            if d.finish.is_some() {
                assert_eq!(d.finish, Some("stop"));
                assert_eq!(d.stop_reason, Some(json!(" to in")));
                break;
            }
        }
        assert_eq!(sent, [" the", " of", " and", "", ""]);
        assert_eq!(s.completion_tokens(), 5);
        // Kept in the output when asked, and nothing held back then.
        let mut s = session(&[" to in"], &[], 0, true);
        let (text, fin, why) = feed(&mut s, &[1, 1, 1, 1, 1, 1], None);
        assert_eq!(text, words(5));
        assert_eq!((fin, why), (Some("stop"), Some(json!(" to in"))));
    }

    #[test]
    fn stop_strings_wait_for_min_tokens() {
        // " of" is word 2 (and 18); with min_tokens 2 the first is not looked at (vLLM
        // looks once a choice has more tokens than min_tokens, in the new text only).
        let mut s = session(&[" of"], &[], 0, false);
        let (text, fin, _) = feed(&mut s, &[1; 20], Some(FinishReason::Length));
        assert_eq!((text.as_str(), fin), (" the", Some("stop")));
        let mut s = session(&[" of"], &[], 2, false);
        let (text, fin, why) = feed(&mut s, &[1; 20], Some(FinishReason::Length));
        assert_eq!(text, words(17));
        assert_eq!((fin, why), (Some("stop"), Some(json!(" of"))));
        // Strings of different lengths: a short one inside text that min_tokens kept from
        // the search is not found later through the long one's window (" of" is word 2;
        // nothing cut before what was sent).
        let mut s = session(&[" of", " zzzzz"], &[], 2, false);
        let (text, fin, _) = feed(&mut s, &[1, 1, 1, 1], Some(FinishReason::Length));
        assert_eq!((text, fin), (words(4), Some("length")));
        // Within one step past min_tokens, a match in that step counts.
        let mut s = session(&[" of"], &[], 1, false);
        let (text, _, _) = feed(&mut s, &[3], None);
        assert_eq!(text, " the");
    }

    #[test]
    fn stop_token_ids_are_counted_not_shown_and_named() {
        let mut s = session(&[], &[3], 0, false);
        let (text, fin, why) = feed(&mut s, &[2, 1], Some(FinishReason::Stop));
        assert_eq!(text, words(2));
        assert_eq!((fin, why), (Some("stop"), Some(json!(3))));
        assert_eq!(s.completion_tokens(), 3);
        // End-of-sequence (here: a Stop on an id that is no stop id) has no stop reason.
        let mut s = session(&[], &[9], 0, false);
        let mut d = None;
        for ids in [vec![3, 3], vec![4]] {
            let fin = (ids == [4]).then_some(FinishReason::Stop);
            d = s.push(0, &ids, Vec::new(), fin, fin);
        }
        let d = d.expect("delta");
        assert_eq!((d.finish, d.stop_reason), (Some("stop"), None));
        // The stop token's text is kept when asked.
        let mut s = session(&[], &[3], 0, true);
        let (text, _, why) = feed(&mut s, &[2, 1], Some(FinishReason::Stop));
        assert_eq!((text, why), (words(3), Some(json!(3))));
        // A stop token id that is also the max_tokens-th token ended the choice by length:
        // its text stays, and a stop string the loop found in it is the stop reason.
        let stop = Some(FinishReason::Stop);
        for (scheduler, text, why) in [
            (Some(FinishReason::Length), words(1), json!(" of")),
            (stop, words(1), json!(3)),
        ] {
            let mut s = session(&[" of"], &[3], 0, false);
            let d = s.push(0, &[3, 3], Vec::new(), stop, scheduler);
            let d = d.expect("delta");
            assert_eq!(
                (d.text, d.finish, d.stop_reason),
                (text, stop.map(|_| "stop"), Some(why))
            );
        }
    }
}
