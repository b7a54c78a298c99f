//! One request's answer as text: the engine loop's [`Event`]s for a request (its tokens,
//! step by step, per choice; its record) turned into text deltas per choice, as vLLM's
//! detokenizer does: the text decoded incrementally, cut at a stop string or a stop token
//! id (the loop has ended the choice in the engine there), a tail that could still start a
//! stop string held back, log-probabilities kept with the tokens that reach the text.
//!
//! In: a started request's events. Out: [`Delta`]s, the usage and the record. A session
//! dropped before its request ends (the client hung up) aborts the request, which frees its
//! blocks at the next step.

use std::sync::Arc;

use engine::plan::TokenLogprobs;
use engine::record::RequestRecord;
use engine::request::{FinishReason, SeqId};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api::{ApiError, Generation};
use super::engine_loop::{Cmd, Event};
use super::http::AppState;
use super::stop::OutputText;

/// One choice's text so far ([`OutputText`]: decoded incrementally as vLLM's detokenizer
/// does, so a long completion costs the same per token as a short one) and what of it was
/// sent.
#[derive(Debug, Default)]
pub(super) struct Choice {
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
pub(super) struct Delta {
    pub(super) index: u32,
    pub(super) text: String,
    pub(super) finish: Option<&'static str>,
    pub(super) stop_reason: Option<Value>,
    /// The log-probabilities of the tokens this delta sends (when asked).
    pub(super) logprobs: Vec<(u32, TokenLogprobs)>,
}

/// One request in flight: its events turned into text deltas.
pub(super) struct Session {
    /// The server's state (its text, for the answer's log-probabilities).
    pub(super) st: Arc<AppState>,
    id: SeqId,
    events: mpsc::UnboundedReceiver<Event>,
    /// Each choice's text.
    pub(super) choices: Vec<Choice>,
    stop: Vec<String>,
    stop_ids: Vec<u32>,
    /// Stop strings are looked for only once a choice has more tokens than this (vLLM).
    min_tokens: u32,
    ignore_eos: bool,
    /// Stop strings and stop token ids stay in the text.
    include_stop: bool,
    /// Prompt tokens (the usage's).
    pub(super) prompt_len: u32,
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
    /// Output tokens of every choice so far (the usage's).
    pub(super) fn completion_tokens(&self) -> u32 {
        self.choices.iter().map(|c| c.out.ids.len() as u32).sum()
    }

    fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finished.is_some())
    }

    /// The next deltas; `None` once every choice has finished.
    pub(super) async fn next(&mut self) -> Result<Option<Vec<Delta>>, ApiError> {
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

/// The session of a prompt sent, once the engine has taken it.
pub(super) async fn started(
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

pub(super) fn engine_gone() -> ApiError {
    ApiError {
        status: 503,
        message: "the engine has stopped (the server is shutting down)".into(),
        param: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::metrics::Metrics;
    use crate::serve::text::Text;
    use std::sync::Mutex;

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
