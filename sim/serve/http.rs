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
use engine::record::RequestRecord;
use engine::request::{FinishReason, SeqId};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::api::{self, ApiError, Generation, Prompt};
use super::engine_loop::{Cmd, Event, Submission};
use super::metrics::Metrics;
use super::text::Text;

/// What every handler shares.
pub struct AppState {
    cmds: mpsc::UnboundedSender<Cmd>,
    text: Text,
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
            text,
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

    fn decode_output(&self, ids: &[u32]) -> String {
        if self.synthetic_output {
            Text::Synthetic.decode(ids, 0)
        } else {
            self.text.decode(ids, 0)
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

/// Serves until `stop` fires (or a signal, with `signals`); returns once every connection
/// has ended.
pub async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    stop: oneshot::Receiver<()>,
    signals: bool,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let cmds = state.cmds.clone();
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
            }
        } else {
            let _ = stop.await;
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
            st.text.encode(&text, true)
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

/// One choice's text so far.
#[derive(Debug, Default)]
struct Choice {
    ids: Vec<u32>,
    /// Bytes of the decoded text already sent.
    sent: usize,
    finished: Option<&'static str>,
}

/// Text to send for one choice: new text and, on its last delta, why it ended.
#[derive(Debug)]
struct Delta {
    index: u32,
    text: String,
    finish: Option<&'static str>,
}

/// One request in flight: its events turned into text deltas.
struct Session {
    st: Arc<AppState>,
    id: SeqId,
    events: mpsc::UnboundedReceiver<Event>,
    choices: Vec<Choice>,
    stop: Vec<String>,
    stop_ids: Vec<u32>,
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
        self.choices.iter().map(|c| c.ids.len() as u32).sum()
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
                finished,
            } => Ok(Some(self.push(index, &ids, finished).into_iter().collect())),
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
                        let mut d = self.flush(i, true);
                        d.finish = Some("abort");
                        self.choices[i].finished = Some("abort");
                        out.push(d);
                    }
                }
                Ok(Some(out))
            }
        }
    }

    /// Appends a step's tokens to choice `index`; the text that is safe to send.
    fn push(&mut self, index: u32, ids: &[u32], finished: Option<FinishReason>) -> Option<Delta> {
        let i = index as usize;
        if self.choices.get(i)?.finished.is_some() {
            return None;
        }
        let mut finish = finished.map(|r| match r {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            _ => "abort",
        });
        for &t in ids {
            if self.stop_ids.contains(&t) {
                finish = Some("stop");
                break;
            }
            self.choices[i].ids.push(t);
        }
        let text = self.st.decode_output(&self.choices[i].ids);
        let c = &mut self.choices[i];
        // A stop string ends the choice before it.
        let from = c
            .sent
            .saturating_sub(self.stop.iter().map(String::len).max().unwrap_or(0));
        let from = (from..=c.sent)
            .find(|&k| text.is_char_boundary(k))
            .unwrap_or(c.sent);
        let hit = self
            .stop
            .iter()
            .filter_map(|s| {
                text.get(from..)
                    .unwrap_or_default()
                    .find(s.as_str())
                    .map(|p| from + p)
            })
            .min();
        if let Some(p) = hit {
            let out = text.get(c.sent..p).unwrap_or_default().to_string();
            c.sent = p.max(c.sent);
            c.finished = Some("stop");
            return Some(Delta {
                index,
                text: out,
                finish: Some("stop"),
            });
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
    /// still turn into a stop string or a longer character.
    fn flush(&mut self, i: usize, last: bool) -> Delta {
        let text = self.st.decode_output(&self.choices[i].ids);
        let c = &mut self.choices[i];
        let mut end = text.len();
        if !last {
            if text.ends_with('\u{FFFD}') {
                end -= '\u{FFFD}'.len_utf8();
            }
            // Hold back a tail that a stop string could start with.
            let hold = self
                .stop
                .iter()
                .flat_map(|s| {
                    (1..s.len())
                        .filter(|&k| s.is_char_boundary(k))
                        .map(move |k| &s[..k])
                })
                .filter(|p| text.get(..end).is_some_and(|t| t.ends_with(p)))
                .map(|p| p.len())
                .max()
                .unwrap_or(0);
            end -= hold;
        }
        let end = end.max(c.sent);
        let out = text.get(c.sent..end).unwrap_or_default().to_string();
        c.sent = end;
        Delta {
            index: i as u32,
            text: out,
            finish: None,
        }
    }
}

fn engine_gone() -> ApiError {
    ApiError {
        status: 503,
        message: "the engine has stopped (the server is shutting down)".into(),
        param: None,
    }
}

/// A completion or chat completion: checked, submitted, answered whole or streamed.
async fn generate(
    st: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let g = api::parse(&bytes, chat)?;
    check_model(&st, &g.model)?;
    let prompt = match &g.prompt {
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
            st.text.encode(&text, true)
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt has no tokens"));
    }
    let p = prompt.len() as u64;
    let limit = u64::from(st.max_model_len);
    if p >= limit {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "This model's maximum context length is {limit} tokens. However, your prompt has {p} tokens; reduce the length of the prompt."
            ),
        ));
    }
    // vLLM's defaults: 16 for completions, the rest of the context for chat.
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
    if st.in_flight.fetch_add(1, Ordering::SeqCst) >= st.max_in_flight {
        st.in_flight.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError {
            status: 429,
            message: format!(
                "the server has {} requests in flight, its limit (--max-concurrency)",
                st.max_in_flight
            ),
            param: None,
        });
    }
    // The engine keeps the slot until the request has ended there (a request aborted by
    // its client still counts until then).
    let permit = Permit(st.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    // The request's arrival: when it reaches the engine's queue, parsed and tokenized (the
    // time vLLM's engine stamps `queued`), so that a replay sees the order the engine saw.
    let received = Instant::now();
    st.cmds
        .send(Cmd::Submit(Box::new(Submission {
            prompt,
            max_tokens,
            ignore_eos: g.ignore_eos,
            min_tokens: g.min_tokens,
            n: g.n,
            sampling: g.sampling,
            received,
            events: tx,
            hold: Box::new(permit),
        })))
        .map_err(|_| engine_gone())?;
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
    let session = Session {
        st: st.clone(),
        id,
        events: rx,
        choices: (0..g.n).map(|_| Choice::default()).collect(),
        stop: g.stop.clone(),
        stop_ids: g.stop_token_ids.clone(),
        prompt_len: p as u32,
        ended: false,
        record: None,
    };
    let prefix = if chat { "chatcmpl" } else { "cmpl" };
    let rid = format!(
        "{prefix}-{}-{}",
        st.created,
        st.next_response.fetch_add(1, Ordering::Relaxed)
    );
    if g.stream {
        Ok(stream(session, g, chat, rid).into_response())
    } else {
        whole(session, &g, chat, rid).await
    }
}

/// A non-streamed answer: every choice's text, once all have finished.
async fn whole(
    mut s: Session,
    g: &Generation,
    chat: bool,
    rid: String,
) -> Result<Response, ApiError> {
    let mut texts = vec![String::new(); s.choices.len()];
    let mut reasons = vec![None; s.choices.len()];
    while let Some(deltas) = s.next().await? {
        for d in deltas {
            texts[d.index as usize].push_str(&d.text);
            if d.finish.is_some() {
                reasons[d.index as usize] = d.finish;
            }
        }
    }
    let choices: Vec<Value> = texts
        .into_iter()
        .zip(reasons)
        .enumerate()
        .map(|(i, (text, reason))| {
            if chat {
                json!({
                    "index": i,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": null,
                    "finish_reason": reason,
                    "stop_reason": null,
                })
            } else {
                json!({
                    "index": i,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": reason,
                    "stop_reason": null,
                })
            }
        })
        .collect();
    let _ = g;
    Ok(Json(json!({
        "id": rid,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": unix_now(),
        "model": s.st.model,
        "choices": choices,
        "usage": api::usage(s.prompt_len, s.completion_tokens()),
    }))
    .into_response())
}

/// A streamed answer: a chunk per step and choice, the usage if asked, `[DONE]`.
fn stream(
    mut s: Session,
    g: Generation,
    chat: bool,
    rid: String,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let created = unix_now();
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let model = s.st.model.clone();
        let chunk = |choices: Vec<Value>, usage: Option<Value>| {
            let mut v = json!({
                "id": rid,
                "object": object,
                "created": created,
                "model": model,
                "choices": choices,
            });
            if let Some(u) = usage {
                v["usage"] = u;
            }
            v.to_string()
        };
        let choice = |d: &Delta, first: bool| {
            if chat {
                let delta = if first {
                    json!({"role": "assistant", "content": d.text})
                } else if d.text.is_empty() && d.finish.is_some() {
                    json!({})
                } else {
                    json!({"content": d.text})
                };
                json!({"index": d.index, "delta": delta, "logprobs": null, "finish_reason": d.finish})
            } else {
                json!({"index": d.index, "text": d.text, "logprobs": null, "finish_reason": d.finish, "stop_reason": null})
            }
        };
        if chat {
            // The role first, as vLLM sends it.
            for i in 0..s.choices.len() {
                let d = Delta {
                    index: i as u32,
                    text: String::new(),
                    finish: None,
                };
                if tx.send(chunk(vec![choice(&d, true)], None)).await.is_err() {
                    return;
                }
            }
        }
        loop {
            let next = tokio::select! {
                n = s.next() => n,
                // The client hung up: dropping the session aborts the request.
                _ = tx.closed() => return,
            };
            match next {
                Ok(Some(deltas)) => {
                    for d in deltas {
                        if d.text.is_empty() && d.finish.is_none() {
                            continue;
                        }
                        let usage = g
                            .continuous_usage
                            .then(|| api::usage(s.prompt_len, s.completion_tokens()));
                        if tx
                            .send(chunk(vec![choice(&d, false)], usage))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // Headers are sent: the error goes in the stream, as vLLM does.
                    let _ = tx.send(e.body().to_string()).await;
                    break;
                }
            }
        }
        if g.include_usage {
            let usage = api::usage(s.prompt_len, s.completion_tokens());
            let _ = tx.send(chunk(Vec::new(), Some(usage))).await;
        }
        let _ = tx.send("[DONE]".into()).await;
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let data = rx.recv().await?;
        Some((Ok(SseEvent::default().data(data)), rx))
    });
    Sse::new(events)
}
