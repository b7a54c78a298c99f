//! sim's plain run CSV, for engines without a reader of their own. One row per request,
//! in send order, a header naming the columns:
//!
//! | column | required | meaning |
//! |---|---|---|
//! | `send_s` | yes | when the request reached the engine (s, any origin; must not go back) |
//! | `prompt_len` | yes | prompt tokens |
//! | `output_len` | yes | output tokens generated |
//! | `ttft_ms` | yes | time to first token (empty when the request failed) |
//! | `e2el_ms` | yes | send to last token (empty when the request failed) |
//! | `request_id` | no | the run's name for it (default: the row number) |
//! | `queue_ms` | no | engine-side queueing delay |
//! | `status` | no | `ok` (default) or anything else for a failed request |

use std::path::Path;

use super::{latency, relative_sends, ObservedEngine, ObservedError, ObservedRequest, ObservedRun};

/// Reads a plain run CSV.
pub(super) fn read(path: &Path) -> Result<ObservedRun, ObservedError> {
    let (mut rdr, cols) = super::open_csv(path)?;
    let known = [
        "send_s",
        "prompt_len",
        "output_len",
        "ttft_ms",
        "e2el_ms",
        "request_id",
        "queue_ms",
        "status",
    ];
    cols.only(&known)?;
    let (send, prompt, output, ttft, e2el) = (
        cols.need("send_s")?,
        cols.need("prompt_len")?,
        cols.need("output_len")?,
        cols.need("ttft_ms")?,
        cols.need("e2el_ms")?,
    );
    let (id, queue, status) = (
        cols.col("request_id"),
        cols.col("queue_ms"),
        cols.col("status"),
    );
    let mut requests = Vec::new();
    let mut sends = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| super::malformed(path, line, &e))?;
        if requests.len() >= super::MAX_REQUESTS {
            return Err(ObservedError::new(
                path,
                format!("more than {} requests", super::MAX_REQUESTS),
            ));
        }
        let text = |c: usize| rec.get(c).map(str::trim).unwrap_or("");
        let num = |c: usize, name: &str| -> Result<f64, ObservedError> {
            let t = text(c);
            t.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| {
                    ObservedError::at(
                        path,
                        Some(line),
                        name,
                        format!("expected a number, got {t:?}"),
                    )
                })
        };
        let tokens = |c: usize, name: &str| -> Result<u32, ObservedError> {
            let t = text(c);
            t.parse::<u32>().map_err(|_| {
                ObservedError::at(
                    path,
                    Some(line),
                    name,
                    format!("expected a token count, got {t:?}"),
                )
            })
        };
        let ok = status.is_none_or(|c| text(c).is_empty() || text(c) == "ok");
        let opt_latency = |c: usize, name: &str| -> Result<Option<f64>, ObservedError> {
            if !ok && text(c).is_empty() {
                return Ok(None);
            }
            Ok(Some(latency(path, Some(line), name, num(c, name)?)?))
        };
        let p = tokens(prompt, "prompt_len")?;
        if p == 0 {
            return Err(ObservedError::at(
                path,
                Some(line),
                "prompt_len",
                "must be at least 1",
            ));
        }
        let (t, e) = (opt_latency(ttft, "ttft_ms")?, opt_latency(e2el, "e2el_ms")?);
        if let (Some(t), Some(e)) = (t, e) {
            if e < t {
                return Err(ObservedError::at(
                    path,
                    Some(line),
                    "e2el_ms",
                    format!("{e} is less than ttft_ms {t}"),
                ));
            }
        }
        let q = match queue {
            Some(c) if !text(c).is_empty() => {
                Some(latency(path, Some(line), "queue_ms", num(c, "queue_ms")?)?)
            }
            _ => None,
        };
        sends.push((Some(line), num(send, "send_s")?));
        requests.push(ObservedRequest {
            id: id.map_or_else(|| (line - 1).to_string(), |c| text(c).to_string()),
            send_s: None,
            prompt_len: p,
            output_len: tokens(output, "output_len")?,
            prompt_tokens: Vec::new(),
            prompt_key: None,
            ok,
            ttft_ms: t,
            e2el_ms: e,
            queue_ms: q,
        });
    }
    if requests.is_empty() {
        return Err(ObservedError::new(path, "no requests"));
    }
    for (r, t) in requests
        .iter_mut()
        .zip(relative_sends(path, &sends, "send_s")?)
    {
        r.send_s = Some(t);
    }
    Ok(ObservedRun {
        path: path.to_path_buf(),
        format: "csv",
        engine: ObservedEngine::default(),
        requests,
    })
}
