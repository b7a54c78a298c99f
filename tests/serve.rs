//! `sim serve` driven over HTTP on loopback: OpenAI's response shapes (whole and streamed),
//! parallel sampling and stop strings, bad requests answered with 4xx and OpenAI's error
//! body, a client hanging up mid-stream (its request aborted, its blocks freed), the
//! concurrency limit, 64 concurrent clients with nothing lost, the records written as
//! `sim run` writes them; and on the CPU runtime, greedy completions served over HTTP
//! equal to `sim generate`'s, alone and under 16 concurrent clients.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;

use serde_json::{json, Value};
use sim::run::BackendKind;
use sim::scenario::Scenario;
use sim::serve::{ServeOptions, Server};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// POSTs JSON; returns the status and the body.
fn post(base: &str, path: &str, body: &str) -> (u16, Value) {
    let mut r = agent()
        .post(format!("{base}{path}"))
        .content_type("application/json")
        .send(body)
        .expect("request");
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn get(base: &str, path: &str) -> (u16, String) {
    let mut r = agent()
        .get(format!("{base}{path}"))
        .call()
        .expect("request");
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().expect("body"))
}

/// A streamed request's `data:` payloads, read to `[DONE]` (or `limit` of them).
fn stream(base: &str, path: &str, body: &Value, limit: usize) -> Vec<String> {
    let r = agent()
        .post(format!("{base}{path}"))
        .content_type("application/json")
        .send(body.to_string())
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let reader = BufReader::new(r.into_body().into_reader());
    let mut out = Vec::new();
    for line in reader.lines() {
        let line = line.expect("line");
        if let Some(data) = line.strip_prefix("data: ") {
            out.push(data.to_string());
            if data == "[DONE]" || out.len() >= limit {
                break;
            }
        }
    }
    out
}

/// A sample of a metric (without labels) from `/metrics`.
fn metric(base: &str, name: &str, labels: &str) -> f64 {
    let (_, text) = get(base, "/metrics");
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(labels) && l[name.len()..].starts_with('{'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}{labels} not in /metrics:\n{text}"))
}

/// Waits (up to 20 s) for the server's KV blocks in use and running requests to be 0.
fn wait_idle(base: &str) {
    for _ in 0..400 {
        if metric(base, "sim:kv_cache_blocks_used", "") == 0.0
            && metric(base, "vllm:num_requests_running", "") == 0.0
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the server did not return to idle (blocks still in use)");
}

const SCENARIO: &str = r#"
name = "served"
[model]
name = "llama-3-8b"
[hardware]
gpu = "h100-sxm"
[engine]
max_model_len = 512
[workload]
num_requests = 1
arrival = { process = "poisson", rate = 1 }
[[workload.class]]
name = "x"
prompt = { dist = "fixed", value = 8 }
output = { dist = "fixed", value = 8 }
"#;

fn start(scn: &Scenario, backend: BackendKind, scale: f64, max: usize, out: &Path) -> Server {
    sim::serve::start(
        scn,
        ServeOptions {
            variant: scn.variants[0].clone(),
            backend,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            time_scale: scale,
            out_dir: Some(out.to_path_buf()),
            model_name: "m".into(),
            max_concurrency: max,
            handle_signals: false,
        },
    )
    .expect("server starts")
}

#[test]
fn the_cost_model_serves_the_openai_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scn = Scenario::from_text(&dir.path().join("served.toml"), SCENARIO).expect("scenario");
    let server = start(&scn, BackendKind::Model, 20.0, 64, &dir.path().join("out"));
    let base = format!("http://{}", server.addr());

    assert_eq!(get(&base, "/health").0, 200);
    let (_, models) = get(&base, "/v1/models");
    let models: Value = serde_json::from_str(&models).expect("json");
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(models["data"][0]["max_model_len"], 512);

    // A whole completion: max_tokens tokens, one synthetic word each.
    let (s, v) = post(
        &base,
        "/v1/completions",
        r#"{"model":"m","prompt":"one two three","max_tokens":8}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        8
    );

    // A streamed chat: the role first, a chunk per token, the usage, [DONE].
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}});
    let chunks = stream(&base, "/v1/chat/completions", &body, 100);
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    let parsed: Vec<Value> = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| serde_json::from_str(c).expect("chunk json"))
        .collect();
    assert_eq!(parsed[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(parsed
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let content: Vec<&str> = parsed
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(content.len(), 5);
    let last = &parsed[parsed.len() - 1];
    assert_eq!(last["choices"].as_array().map(Vec::len), Some(0));
    assert_eq!(last["usage"]["completion_tokens"], 5);
    assert_eq!(
        parsed[parsed.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );

    // Parallel sampling and a stop string.
    let (s, v) = post(
        &base,
        "/v1/completions",
        r#"{"prompt":"a b","max_tokens":6,"n":3}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["usage"]["completion_tokens"], 18);
    // A stop string ends the request in the engine in the step that completes it, so the
    // records say stop (with the tokens the client got) even when the scheduler ends the
    // request by length in that same step (max_tokens 3), and however fast it steps on.
    for (max_tokens, stop, text) in [(3, " and", " the of"), (400, " to", " the of and")] {
        let (s, v) = post(
            &base,
            "/v1/completions",
            &format!(r#"{{"prompt":"a b","max_tokens":{max_tokens},"stop":["{stop}"]}}"#),
        );
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], text);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["choices"][0]["stop_reason"], stop);
    }
    // echo: the prompt first, whole or streamed.
    let (s, v) = post(
        &base,
        "/v1/completions",
        r#"{"prompt":"a b","max_tokens":3,"echo":true}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "a b the of and");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let body = json!({"prompt": "a b", "max_tokens": 2, "echo": true, "stream": true});
    let got = stream(&base, "/v1/completions", &body, 100);
    let first: Value = serde_json::from_str(&got[0]).expect("json");
    assert_eq!(first["choices"][0]["text"], "a b", "{got:?}");
    // A list of prompts (batched completions): n choices each, indexed prompt by prompt.
    let (s, v) = post(
        &base,
        "/v1/completions",
        r#"{"prompt":["a b","c d e"],"max_tokens":3,"n":2}"#,
    );
    assert_eq!(s, 200, "{v}");
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .filter_map(|c| c["index"].as_u64())
        .collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    let body = json!({"prompt": ["a", "b c"], "max_tokens": 2, "stream": true,
                      "stream_options": {"include_usage": true}});
    let got = stream(&base, "/v1/completions", &body, 100);
    assert_eq!(got.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = got[..got.len() - 1]
        .iter()
        .map(|c| serde_json::from_str(c).expect("json"))
        .collect();
    let mut seen: Vec<u64> = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["finish_reason"] == "length")
        .filter_map(|c| c["index"].as_u64())
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1], "{got:?}");
    assert_eq!(
        chunks.last().expect("usage")["usage"]["completion_tokens"],
        4
    );

    // Tokenize and detokenize.
    let (s, v) = post(&base, "/tokenize", r#"{"prompt":"hello world"}"#);
    assert_eq!((s, v["count"].as_u64()), (200, Some(4)));
    let (s, v) = post(&base, "/detokenize", r#"{"tokens":[0,1]}"#);
    assert_eq!((s, v["prompt"].as_str()), (200, Some(" the of")));

    // Bad requests: 4xx with OpenAI's error body.
    let long: Vec<u32> = (0..600).collect();
    let bad = [
        ("/v1/completions", "{not json".to_string(), 400),
        (
            "/v1/completions",
            r#"{"model":"other","prompt":"x"}"#.into(),
            404,
        ),
        ("/v1/completions", json!({"prompt": long}).to_string(), 400),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":0}"#.into(),
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":600}"#.into(),
            400,
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","frobnicate":1}"#.into(),
            400,
        ),
        ("/v1/chat/completions", r#"{"messages":"hi"}"#.into(), 400),
        ("/detokenize", r#"{"tokens":[99999999]}"#.into(), 400),
        (
            "/v1/completions",
            r#"{"prompt":"x","stop_token_ids":[99999999]}"#.into(),
            400,
        ),
        // The cost model draws no real tokens: no log-probabilities.
        (
            "/v1/completions",
            r#"{"prompt":"x","logprobs":2}"#.into(),
            400,
        ),
    ];
    for (path, body, status) in bad {
        let (s, v) = post(&base, path, &body);
        assert_eq!(s, status, "{path} {body}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert_eq!(v["error"]["code"], status);
    }
    assert_eq!(get(&base, "/no/such/route").0, 404);

    // A client that hangs up mid-stream: its request is aborted and its blocks freed.
    let body = json!({"prompt": "x y z", "max_tokens": 400, "stream": true});
    let got = stream(&base, "/v1/completions", &body, 3);
    assert_eq!(got.len(), 3);
    wait_idle(&base);
    assert_eq!(metric(&base, "vllm:request_success_total", "abort"), 1.0);

    // 64 concurrent clients, 4 requests each: every one answered in full.
    let clients: Vec<_> = (0..64)
        .map(|c| {
            let base = base.clone();
            std::thread::spawn(move || {
                for k in 0..4 {
                    let body = format!(
                        r#"{{"prompt":"client {c} request {k}","max_tokens":{}}}"#,
                        4 + (c + k) % 8
                    );
                    let (s, v) = post(&base, "/v1/completions", &body);
                    assert_eq!(s, 200, "{v}");
                    assert_eq!(v["usage"]["completion_tokens"], 4 + (c + k) % 8);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    wait_idle(&base);
    // 256 and the completion, the chat, the parallel sampling, the two echoes and the two
    // batches of two ran to max_tokens; the stop strings ended two, the hang-up another.
    assert_eq!(metric(&base, "vllm:request_success_total", "length"), 265.0);
    assert_eq!(metric(&base, "vllm:request_success_total", "\"stop"), 2.0);
    assert_eq!(metric(&base, "vllm:request_success_total", "abort"), 1.0);

    let summary = server.stop().expect("stops");
    // The hang-up is counted apart, out of the latencies.
    assert_eq!((summary.completed, summary.num_aborted), (267, 1));
    let csv = std::fs::read_to_string(dir.path().join("out/requests.csv")).expect("requests.csv");
    assert_eq!(csv.lines().count(), 269);
    // The stopped requests' records hold the tokens their clients got: 3 and 4.
    let col = |name: &str| {
        let header = csv.lines().next().expect("header");
        header.split(',').position(|c| c == name).expect("column")
    };
    let (gen, why) = (col("generated_tokens"), col("finish_reason"));
    let mut stopped: Vec<&str> = csv
        .lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[why] == "stop")
        .map(|f| f[gen])
        .collect();
    stopped.sort_unstable();
    assert_eq!(stopped, ["3", "4"]);
    assert!(dir.path().join("out/summary.json").exists());
    assert!(dir.path().join("out/steps.csv").exists());
    // `sim replay` reads the served run like any other: by arrival, the aborted one failed.
    let run = sim::observed::open(&dir.path().join("out")).expect("a served run reads");
    assert_eq!(run.format, "sim");
    assert_eq!(run.requests.len(), 268);
    assert_eq!(run.requests.iter().filter(|r| !r.ok).count(), 1);
    assert!(run.requests.windows(2).all(|w| w[0].send_s <= w[1].send_s));
    assert_eq!(
        run.engine.model.as_deref(),
        Some("meta-llama/Meta-Llama-3-8B")
    );
    assert_eq!(run.engine.max_model_len, Some(512));
}

#[test]
fn requests_beyond_the_concurrency_limit_get_429() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scn = Scenario::from_text(&dir.path().join("served.toml"), SCENARIO).expect("scenario");
    // Real time: a 400-token request lasts seconds.
    let server = start(&scn, BackendKind::Model, 1.0, 1, &dir.path().join("out"));
    let base = format!("http://{}", server.addr());
    let r = agent()
        .post(format!("{base}/v1/completions"))
        .content_type("application/json")
        .send(json!({"prompt": "x", "max_tokens": 400, "stream": true}).to_string())
        .expect("request");
    let mut lines = BufReader::new(r.into_body().into_reader()).lines();
    assert!(lines.next().is_some());
    let (s, v) = post(&base, "/v1/completions", r#"{"prompt":"y","max_tokens":2}"#);
    assert_eq!(s, 429, "{v}");
    drop(lines);
    wait_idle(&base);
    let (s, _) = post(&base, "/v1/completions", r#"{"prompt":"y","max_tokens":2}"#);
    assert_eq!(s, 200);
    // A batch of more prompts than the server ever runs at once could never be served:
    // a 400, not a 429 to retry; the slots stay free.
    let (s, v) = post(
        &base,
        "/v1/completions",
        r#"{"prompt":["a","b"],"max_tokens":2}"#,
    );
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{v}"
    );
    let (s, _) = post(
        &base,
        "/v1/completions",
        r#"{"prompt":["y"],"max_tokens":2}"#,
    );
    assert_eq!(s, 200);
    server.stop().expect("stops");
}

#[test]
fn greedy_completions_served_over_http_equal_generate() {
    let Some(path) = crate::smollm2() else {
        eprintln!("skipped: no SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models)");
        return;
    };
    let cases: Vec<_> = kernels::oracle::smollm2().into_iter().take(8).collect();
    // What `sim generate` prints: the runtime alone, one prompt at a time.
    let g = kernels::gguf::Gguf::open(&path).expect("gguf");
    let tok = kernels::tokenizer::Tokenizer::from_gguf(&g).expect("tokenizer");
    let max_tokens = 24u32;
    let generated: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| {
            use kernels::generate::StepRuntime as _;
            let mut ids = Vec::new();
            if tok.add_bos {
                ids.extend(tok.bos);
            }
            ids.extend(tok.encode(&c.prompt, true));
            let blocks = (ids.len() as u32 + max_tokens).div_ceil(16) + 1;
            let mut rt = kernels::cpu::CpuRuntime::from_gguf(&g, 16, blocks).expect("runtime");
            let out = rt
                .generate(&ids, max_tokens, Default::default(), tok.eos, |_| {})
                .expect("generate");
            out.tokens
        })
        .collect();
    let expected: Vec<String> = generated.iter().map(|t| tok.decode(t, false)).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let scn = sim::serve::gguf_scenario(&path, "h100-sxm", Some(1024), None).expect("scenario");
    let server = start(&scn, BackendKind::Cpu, 1.0, 64, &dir.path().join("out"));
    let base = format!("http://{}", server.addr());
    let ask = |prompt: &str| {
        let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
        let (s, v) = post(&base, "/v1/completions", &body.to_string());
        assert_eq!(s, 200, "{v}");
        v["choices"][0]["text"].as_str().expect("text").to_string()
    };
    for (c, want) in cases.iter().zip(&expected) {
        assert_eq!(&ask(&c.prompt), want, "alone: {}", c.label());
    }
    // 16 concurrent clients: batching changes no token.
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|k| {
                let i = k % cases.len();
                let ask = &ask;
                let (c, want) = (&cases[i], &expected[i]);
                s.spawn(move || assert_eq!(&ask(&c.prompt), want, "batched: {}", c.label()))
            })
            .collect();
        for h in handles {
            h.join().expect("client");
        }
    });
    // A stop token id ends the completion at it (counted in the usage, left out of the
    // text, named as the stop reason); with min_tokens past it, it cannot be drawn there.
    let toks = &generated[0];
    let k = (2..toks.len())
        .find(|&k| !toks[..k].contains(&toks[k]) && Some(toks[k]) != tok.eos)
        .expect("a token that does not come earlier");
    let body = |min_tokens: usize| {
        json!({"prompt": cases[0].prompt, "max_tokens": max_tokens, "temperature": 0,
               "stop_token_ids": [toks[k]], "min_tokens": min_tokens})
        .to_string()
    };
    let (s, v) = post(&base, "/v1/completions", &body(0));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], tok.decode(&toks[..k], false));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], toks[k]);
    assert_eq!(v["usage"]["completion_tokens"], k + 1);
    let (s, v) = post(&base, "/v1/completions", &body(k + 1));
    assert_eq!(s, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().expect("text");
    assert!(text.starts_with(&tok.decode(&toks[..k], false)), "{v}");
    let n = v["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
    assert!(n >= k + 2, "the stop id was masked at draw {k}: {v}");

    // Log-probabilities: the raw log-softmax of the runtime's logits (the first token's
    // equal the runtime's own, run alone), the greedy token the most likely.
    let first_row = {
        use kernels::generate::StepRuntime as _;
        let mut ids = Vec::new();
        if tok.add_bos {
            ids.extend(tok.bos);
        }
        ids.extend(tok.encode(&cases[0].prompt, true));
        let blocks = (ids.len() as u32 + 2).div_ceil(16) + 1;
        let mut rt = kernels::cpu::CpuRuntime::from_gguf(&g, 16, blocks).expect("runtime");
        rt.keep_logits(true);
        rt.generate(&ids, 1, Default::default(), tok.eos, |_| {})
            .expect("generate");
        rt.last_logits().to_vec()
    };
    let want = kernels::sampling::logprobs(&first_row, toks[0], 3);
    let body = json!({"prompt": cases[0].prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3});
    let (s, v) = post(&base, "/v1/completions", &body.to_string());
    assert_eq!(s, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 8, "{lp}");
    let values: Vec<f64> = lp["token_logprobs"]
        .as_array()
        .expect("token_logprobs")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect();
    assert!(
        (values[0] - f64::from(want.logprob)).abs() < 2e-3,
        "{values:?} {want:?}"
    );
    for (k, top) in lp["top_logprobs"]
        .as_array()
        .expect("tops")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("a map");
        assert!(top.len() <= 4 && top.len() >= 3, "{top:?}");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        assert!(
            (best - values[k]).abs() < 1e-6,
            "greedy draws the most likely: {top:?}"
        );
        assert!(values[k] <= 0.0);
    }
    let joined: String = tokens.iter().filter_map(Value::as_str).collect();
    assert_eq!(joined, v["choices"][0]["text"].as_str().expect("text"));
    let offsets = lp["text_offset"].as_array().expect("offsets");
    assert_eq!(offsets[0], 0);
    // Chat: content entries with bytes and the top alternatives.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                      "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (s, v) = post(&base, "/v1/chat/completions", &body.to_string());
    assert_eq!(s, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    let n = v["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
    assert_eq!(
        content.len(),
        n,
        "one entry a token (end-of-sequence too): {v}"
    );
    for e in content {
        assert!(e["bytes"].is_array() && e["logprob"].as_f64().is_some_and(|x| x <= 0.0));
        assert_eq!(e["top_logprobs"].as_array().map(Vec::len), Some(2), "{e}");
    }
    // Four sampled choices, each ended by the stop string "e" at its own token: the loop
    // ends each choice's sequence in the engine before the next step (the request with
    // the last), and the record holds the tokens the client was counted.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 40, "n": 4,
                      "temperature": 1.0, "seed": 3, "stop": ["e"]});
    let (s, v) = post(&base, "/v1/completions", &body.to_string());
    assert_eq!(s, 200, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    for c in choices {
        assert_eq!(c["finish_reason"], "stop", "{v}");
        assert!(!c["text"].as_str().expect("text").contains('e'), "{v}");
    }
    let usage = v["usage"]["completion_tokens"].as_u64().expect("usage");
    wait_idle(&base);
    let summary = server.stop().expect("stops");
    assert_eq!(summary.completed, 29);
    assert!(summary.mean_ttft_ms > 0.0);
    let csv = std::fs::read_to_string(dir.path().join("out/requests.csv")).expect("requests.csv");
    let header: Vec<&str> = csv.lines().next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|&c| c == name).expect("column");
    let row: Vec<&str> = csv
        .lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f[col("max_tokens")] == "40")
        .expect("the sampled request's record");
    assert_eq!(row[col("finish_reason")], "stop");
    assert_eq!(row[col("generated_tokens")], usage.to_string(), "{row:?}");
}
