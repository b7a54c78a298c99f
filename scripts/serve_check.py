#!/usr/bin/env python3
"""`sim serve` driven by clients no one here wrote, and the closed loop without a GPU.

Run by `.ci/run` with the Python of a venv holding `openai`, `aiperf`, `gguf` and
`tokenizers` (pinned there); exits non-zero on the first failed check. Steps:

1. The `openai` package against `sim serve GGUF` (the CPU runtime on SmolLM2): the model
   list, streamed chat and completions with the usage chunk, a whole completion with n=2.
2. AIPerf (NVIDIA's benchmark client) against the CPU runtime (streamed chat) and against
   the cost model (`scenarios/serve.toml`, streamed completions): its report is parsed and
   checked (every request succeeded, the output token counts, TTFT and ITL present), and
   the server's `/metrics` shows no KV block in use afterwards. Then the bounded load test:
   AIPerf's 64 streaming chat clients for 30 s against the cost model, nothing lost.
3. The closed loop (run first, while nothing else uses the cores; the runtime on one
   thread, `RAYON_NUM_THREADS=1`, the clients and the HTTP side on the other core): a
   served run at a ramp of loads (1, 4, 8, 16 clients) fits this machine's hardware profile
   (`sim calibrate --observed`); `sim replay` of another served run, at 6 clients, must
   predict its mean TTFT and TPOT within 15%, on one of up to three tries (each try both
   runs anew: a timing check on a shared machine, see `CLOSED_LOOP_TRIES`).

Optional (not run by `.ci/run`, each a multi-gigabyte install with torch): `--vllm BIN` runs
`vllm bench serve` against both servers and replays its saved result with `sim replay`;
`--guidellm BIN` runs GuideLLM against the cost model.

Usage: serve_check.py --sim target/debug/sim --gguf SmolLM2.gguf --work DIR [--vllm BIN] [--guidellm BIN]
"""

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def fail(msg):
    print(f"serve_check: FAILED: {msg}", flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Server:
    """`sim serve ARGS` on a free port; stopped with SIGINT (its records then written)."""

    def __init__(self, sim, args, out, log, env=None):
        self.out = out
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sim, "serve", *args, "--port", "0", "--out", out],
            stdout=self.log,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        # The first line on stderr names the address.
        line = self.proc.stderr.readline()
        if "http://" not in line:
            self.proc.wait(timeout=30)
            fail(f"sim serve {' '.join(args)} did not start: {line.strip()}")
        self.url = line.split("http://")[1].split()[0]
        self.url = "http://" + self.url
        threading.Thread(target=lambda: [self.log.write(l) for l in self.proc.stderr], daemon=True).start()
        for _ in range(600):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5)
                return
            except OSError:
                time.sleep(0.1)
        fail(f"{self.url}/health never answered")

    def metric(self, name):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        fail(f"/metrics has no {name}")

    def metric_sum(self, name):
        """The sum of a labelled counter over its label values (0 before any was counted)."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=120)
        check(rc == 0, f"sim serve exited with {rc} (log beside {self.out})")


def wait_idle(server):
    for _ in range(200):
        if server.metric("sim:kv_cache_blocks_used") == 0 and server.metric("vllm:num_requests_running") == 0:
            return
        time.sleep(0.1)
    fail("KV blocks still in use after every client finished")


def openai_checks(url):
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    chunks, text, usage = 0, "", None
    for c in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        chunks += 1
        if c.choices and c.choices[0].delta.content:
            text += c.choices[0].delta.content
        if c.usage:
            usage = c.usage
    check(text and usage and 1 <= usage.completion_tokens <= 12, f"streamed chat: {text!r} {usage}")
    check(usage.prompt_tokens > 10, f"streamed chat: the chat template's tokens missing: {usage}")
    text, usage = "", None
    for c in client.completions.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if c.choices:
            text += c.choices[0].text
        if c.usage:
            usage = c.usage
    check("Paris" in text and usage.completion_tokens == 16, f"streamed completion: {text!r} {usage}")
    # A stop string ends the text before it and is named as the stop reason (a vLLM field
    # the package keeps as an extra); min_tokens masks end-of-sequence until it is out.
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=16, temperature=0, stop=["Paris"])
    ch = r.choices[0]
    check(ch.finish_reason == "stop" and "Paris" not in ch.text and getattr(ch, "stop_reason", None) == "Paris",
          f"stop string: {r}")
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say yes."}], max_tokens=12, temperature=0,
        extra_body={"min_tokens": 12})
    check(r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length", f"min_tokens: {r}")
    # Log-probabilities, parsed into the package's own types.
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say yes."}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    check(content and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
          and abs(content[0].logprob - content[0].top_logprobs[0].logprob) < 1e-6, f"chat logprobs: {r}")
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    check(len(lp.tokens) == 4 and "".join(lp.tokens) == r.choices[0].text and len(lp.top_logprobs) == 4,
          f"completion logprobs: {r}")
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, n=2, seed=7, temperature=0.8)
    check(len(r.choices) == 2 and r.usage.completion_tokens <= 16, f"n=2: {r}")
    print(f"openai {__import__('openai').__version__}: models, streamed chat ({chunks} chunks) and completions, stop, min_tokens, logprobs, n=2: ok")


def hf_tokenizer(gguf_path, out):
    """An HF tokenizer folder from the GGUF's own vocabulary, merges and chat template
    (benchmark clients count tokens with one; the hub is not reachable from CI)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    r = GGUFReader(gguf_path)

    def field(k):
        return r.fields[k].contents()

    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    # SmolLM2's pre-tokenizer: digits one by one, then GPT-2's byte-level split.
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3])
    name = lambda k: tokens[field(k)]
    PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=name("tokenizer.ggml.bos_token_id"),
        eos_token=name("tokenizer.ggml.eos_token_id"),
        unk_token=name("tokenizer.ggml.unknown_token_id"),
        pad_token=name("tokenizer.ggml.padding_token_id"),
        chat_template=field("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    ).save_pretrained(out)


def aiperf(url, model, tokenizer, endpoint, requests, concurrency, isl, osl, out, duration=None):
    """AIPerf's `profile` against `url`: `requests` requests, or as many as `concurrency`
    clients send in `duration` seconds (every one in flight then is waited for). Checks its
    report and returns the number of requests it completed."""
    aiperf_bin = os.path.join(os.path.dirname(sys.executable), "aiperf")
    cmd = [
        aiperf_bin, "profile", "--model", model, "--url", url, "--endpoint-type", endpoint, "--streaming",
        "--tokenizer", tokenizer, "--use-server-token-count",
        "--prompt-input-tokens-mean", str(isl), "--prompt-input-tokens-stddev", "0",
        "--prompt-output-tokens-mean", str(osl), "--prompt-output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--concurrency", str(concurrency),
        "--workers-max", "2", "--random-seed", "42", "--ui", "none", "--output-artifact-dir", out,
    ]
    if duration is None:
        cmd += ["--request-count", str(requests)]
    else:
        cmd += ["--benchmark-duration", str(duration), "--benchmark-grace-period", "inf"]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    with open(out + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=900).returncode
    check(rc == 0, f"aiperf exited with {rc} (see {out}.log)")
    rep = json.load(open(os.path.join(out, "profile_export_aiperf.json")))
    ok = int(rep["request_count"]["avg"])
    errors = rep.get("error_request_count", {}).get("avg", 0)
    if duration is not None:
        requests = ok
        check(ok >= concurrency, f"aiperf: only {ok} requests in {duration} s at concurrency {concurrency}")
    check(ok == requests and errors == 0, f"aiperf: {ok} of {requests} requests succeeded, {errors} failed")
    tokens = rep["total_output_tokens"]["avg"]
    check(tokens == requests * osl, f"aiperf: {tokens} output tokens, expected {requests * osl}")
    ttft, itl = rep["time_to_first_token"], rep["inter_token_latency"]
    check(ttft["avg"] > 0 and itl["avg"] > 0 and ttft["count"] == requests, f"aiperf: TTFT {ttft} ITL {itl}")
    what = f"x {requests}" if duration is None else f"for {duration} s ({requests} requests)"
    print(
        f"aiperf {endpoint} {what} at concurrency {concurrency} on {model}: all succeeded, "
        f"{int(tokens)} output tokens, TTFT mean {ttft['avg']:.1f} ms (p99 {ttft['p99']:.1f}), ITL mean {itl['avg']:.2f} ms"
    )
    return requests


def vllm_bench(vllm_bin, url, model, tokenizer, endpoint, prompts, concurrency, isl, osl, out):
    """`vllm bench serve` (vLLM's own benchmark client) against `url`, its saved result
    (`--save-result --save-detailed`) parsed and checked: every request succeeded with
    `osl` tokens, TTFT and ITL present. Returns the result file."""
    backend = {"/v1/completions": "openai", "/v1/chat/completions": "openai-chat"}[endpoint]
    name = os.path.basename(out) + ".json"
    cmd = [
        vllm_bin, "bench", "serve", "--backend", backend, "--base-url", url, "--endpoint", endpoint,
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", str(isl), "--random-output-len", str(osl), "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0", "--seed", "42",
        "--save-result", "--save-detailed", "--result-dir", os.path.dirname(out), "--result-filename", name,
    ]
    with open(out + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=900, cwd=os.path.dirname(out)).returncode
    check(rc == 0, f"vllm bench serve exited with {rc} (see {out}.log)")
    path = os.path.join(os.path.dirname(out), name)
    rep = json.load(open(path))
    check(rep["completed"] == prompts and rep["failed"] == 0, f"vllm bench: {rep['completed']} of {prompts} completed")
    check(rep["output_lens"] == [osl] * prompts, f"vllm bench: output lengths {sorted(set(rep['output_lens']))}, expected {osl}")
    # A streamed chunk may carry several tokens (one whose text is empty, such as a special
    # token skipped in the text, goes out with the next), so a request has at most osl - 1 ITLs.
    check(all(t > 0 for t in rep["ttfts"]) and all(0 < len(i) < osl for i in rep["itls"]), "vllm bench: TTFT or ITLs missing")
    print(
        f"vllm bench serve {backend} x {prompts} at concurrency {concurrency} on {model}: all succeeded, "
        f"{rep['total_output_tokens']} output tokens, TTFT mean {rep['mean_ttft_ms']:.1f} ms, "
        f"TPOT mean {rep['mean_tpot_ms']:.2f} ms"
    )
    return path


def guidellm(guidellm_bin, url, tokenizer, streams, requests, isl, osl, out):
    """GuideLLM's `run` (concurrent streams, synthetic prompts) against `url`, its JSON
    report parsed and checked: every request succeeded with `osl` tokens, TTFT and ITL present."""
    cmd = [
        guidellm_bin, "run", "--backend", f"kind=openai_http,target={url}",
        "--profile", f"kind=concurrent,streams={streams}", "--constraint", f"kind=max_requests,count={requests}",
        "--data", f"kind=synthetic_text,prompt_tokens={isl},output_tokens={osl}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--output", f"kind=json,path={out}.json", "--disable-console-interactive",
    ]
    with open(out + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=900, cwd=os.path.dirname(out)).returncode
    check(rc == 0, f"guidellm exited with {rc} (see {out}.log)")
    m = json.load(open(out + ".json"))["benchmarks"][0]["metrics"]
    totals = m["request_totals"]
    check(totals["successful"] == requests and totals["errored"] == 0, f"guidellm: {totals}")
    tokens = m["output_token_count"]["successful"]
    check(tokens["count"] == requests and tokens["mean"] == osl, f"guidellm: output tokens {tokens['mean']}, expected {osl}")
    ttft, itl = m["time_to_first_token_ms"]["successful"], m["inter_token_latency_ms"]["successful"]
    check(ttft["count"] == requests and ttft["mean"] > 0 and itl["mean"] > 0, "guidellm: TTFT or ITL missing")
    print(
        f"guidellm run at {streams} streams x {requests} requests: all succeeded, {osl} tokens each, "
        f"TTFT mean {ttft['mean']:.1f} ms, ITL mean {itl['mean']:.2f} ms"
    )


def load(url, phases, isl, osl, seed):
    """Clients in phases [(clients, requests each)], one phase after the other, each a
    closed loop of whole completions of token-id prompts (lengths spread +-50%), the
    clients of a phase starting 0.25 s apart."""
    errors = []

    def client(c, n, start):
        time.sleep(start)
        rng = random.Random(seed * 1000 + c)
        for _ in range(n):
            prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(isl // 2, isl * 3 // 2))]
            out = rng.randint(osl // 2, osl * 3 // 2)
            body = json.dumps({"prompt": prompt, "max_tokens": out, "ignore_eos": True, "temperature": 0}).encode()
            req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
            try:
                v = json.load(urllib.request.urlopen(req, timeout=600))
                if v["usage"]["completion_tokens"] != out:
                    errors.append(f"{v['usage']} != {out}")
            except Exception as e:  # noqa: BLE001 (any failure is a failed check)
                errors.append(str(e))

    base = 0
    for clients, n in phases:
        # The clients start 0.25 s apart (a ramp-up, as benchmark clients do), so the first
        # prompts do not all arrive in one step.
        threads = [threading.Thread(target=client, args=(base + i, n, 0.25 * i)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        base += clients
    check(not errors, f"load: {errors[:3]}")


def closed_loop_attempt(sim, gguf, work):
    """One try of the closed loop in `work`: the two served runs, the fit, the replay.
    Returns the fit's summary line and the replay's figures by metric."""
    os.makedirs(work, exist_ok=True)
    fit_run, held_out = os.path.join(work, "served-ramp"), os.path.join(work, "served-6")
    for out, phases, seed in [(fit_run, [(1, 8), (4, 6), (8, 4), (16, 3)], 1), (held_out, [(6, 30)], 2)]:
        # The runtime on one core (RAYON_NUM_THREADS=1: no helper threads spinning between
        # its loops), the HTTP side and the clients on the other, so that how much the
        # clients compete with the runtime does not change with their number.
        s = Server(sim, [gguf], out, out + ".log", {"RAYON_NUM_THREADS": os.environ.get("SERVE_CHECK_THREADS", "1")})
        load(s.url, phases, 128, 48, seed)
        wait_idle(s)
        s.stop()
    cal = os.path.join(work, "calibration")
    fit = subprocess.run([sim, "calibrate", "--observed", fit_run, "--out", cal], capture_output=True, text=True)
    check(fit.returncode == 0, f"sim calibrate: {fit.stderr.strip()}")
    fit_line = fit.stdout.strip().splitlines()[0]
    rep = os.path.join(work, "replay")
    r = subprocess.run(
        [sim, "replay", held_out, "--gpu-file", os.path.join(cal, "served-hardware.toml"),
         "--calibration", os.path.join(cal, "served-cost.toml"), "--out", rep],
        capture_output=True, text=True,
    )
    check(r.returncode == 0, f"sim replay: {r.stderr.strip()}")
    figures = {row["metric"]: row for row in csv.DictReader(open(os.path.join(rep, "replay.csv")))}
    return fit_line, figures


# The closed loop times a real runtime on a shared 2-core machine: a neighbour's burst during
# one of the two served runs moves its figures by itself (CI once saw a fit whose own steps
# missed by 22% median, against 3.5-4.6% on a quiet machine). A wrong model misses on every
# try; a noisy machine rarely does twice, so the check passes on the first try that is
# within the limit, and fails only when every try misses.
CLOSED_LOOP_TRIES = 3
CLOSED_LOOP_LIMIT_PCT = 15.0


def closed_loop(sim, gguf, work, record=None):
    tries = int(os.environ.get("SERVE_CHECK_CLOSED_LOOP_TRIES", CLOSED_LOOP_TRIES))
    misses = []
    for attempt in range(1, tries + 1):
        fit_line, figures = closed_loop_attempt(sim, gguf, os.path.join(work, f"closed-loop-{attempt}"))
        print(f"closed loop, try {attempt} of {tries}: {fit_line}")
        for m in ["ttft_mean_ms", "tpot_mean_ms", "e2el_mean_ms", "throughput_rps"]:
            f = figures[m]
            print(f"  {m}: measured {float(f['measured']):.2f}, replayed {float(f['simulated']):.2f} ({float(f['error_pct']):+.1f}%)")
        off = [
            f"{m} off by {abs(float(figures[m]['error_pct'])):.1f}%"
            for m in ["ttft_mean_ms", "tpot_mean_ms"]
            if abs(float(figures[m]["error_pct"])) > CLOSED_LOOP_LIMIT_PCT
        ]
        if not off:
            break
        misses.append(f"try {attempt}: " + ", ".join(off))
        print(f"  try {attempt} missed ({', '.join(off)}; limit {CLOSED_LOOP_LIMIT_PCT:.0f}%)")
    check(len(misses) < tries, f"closed loop: every try missed the {CLOSED_LOOP_LIMIT_PCT:.0f}% limit: {'; '.join(misses)}")
    if record:
        # VALIDATION.md's section (`sim validate-model` reads it from calibration/).
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
        with open(record, "w") as f:
            f.write(f"date,{time.strftime('%Y-%m-%d')}\n")
            f.write(f"machine,{cpu.replace(',', ';')} ({os.cpu_count()} cores)\n")
            f.write(f"binary,{os.path.relpath(sim, ROOT).replace(',', ';')}\n")
            f.write(f"fit,{fit_line.split(': ', 1)[1].replace(',', ';')}\n")
            f.write("metric,measured,replayed,error_pct\n")
            for m in ["ttft_mean_ms", "ttft_p90_ms", "tpot_mean_ms", "tpot_p90_ms", "e2el_mean_ms", "throughput_rps"]:
                f.write(f"{m},{figures[m]['measured']},{figures[m]['simulated']},{figures[m]['error_pct']}\n")
    print(
        f"closed loop: the replay of the held-out served run predicts its mean TTFT and TPOT within "
        f"{CLOSED_LOOP_LIMIT_PCT:.0f}% (try {len(misses) + 1} of {tries})"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--skip-closed-loop", action="store_true")
    ap.add_argument("--only-closed-loop", action="store_true")
    ap.add_argument("--record", help="write the closed loop's figures here (calibration/served-closed-loop.csv)")
    ap.add_argument("--vllm", help="the `vllm` command of an installed vLLM: also run `vllm bench serve` against "
                    "both servers and replay its saved result with `sim replay` (not run by .ci/run: vLLM is 8.5 GB)")
    ap.add_argument("--guidellm", help="the `guidellm` command of an installed GuideLLM (0.8 or later): also run it "
                    "against the cost model (not run by .ci/run: it pulls torch, 5.9 GB)")
    a = ap.parse_args()
    sim, gguf = os.path.abspath(a.sim), os.path.abspath(a.gguf)
    os.makedirs(a.work, exist_ok=True)
    if a.only_closed_loop:
        closed_loop(sim, gguf, a.work, a.record)
        return
    if not a.skip_closed_loop:
        # First, on a quiet machine (AIPerf's worker processes outlive its runs).
        closed_loop(sim, gguf, a.work, a.record)
    tok = os.path.join(a.work, "tokenizer")
    hf_tokenizer(gguf, tok)

    cpu = Server(sim, [gguf], os.path.join(a.work, "served-cpu"), os.path.join(a.work, "served-cpu.log"))
    openai_checks(cpu.url)
    model = json.load(urllib.request.urlopen(cpu.url + "/v1/models"))["data"][0]["id"]
    aiperf(cpu.url, model, tok, "chat", 16, 2, 96, 24, os.path.join(a.work, "aiperf-cpu"))
    wait_idle(cpu)
    if a.vllm:
        vllm_bench(a.vllm, cpu.url, model, tok, "/v1/chat/completions", 16, 2, 96, 24, os.path.join(a.work, "vllm-cpu"))
        wait_idle(cpu)
    cpu.stop()

    scenario = os.path.join(ROOT, "scenarios", "serve.toml")
    sim_srv = Server(sim, [scenario, "--time-scale", "10"], os.path.join(a.work, "served-model"),
                     os.path.join(a.work, "served-model.log"))
    model = json.load(urllib.request.urlopen(sim_srv.url + "/v1/models"))["data"][0]["id"]
    aiperf(sim_srv.url, model, tok, "completions", 40, 4, 256, 64, os.path.join(a.work, "aiperf-model"))
    wait_idle(sim_srv)
    if a.guidellm:
        guidellm(a.guidellm, sim_srv.url, tok, 4, 40, 128, 32, os.path.join(a.work, "guidellm-model"))
        wait_idle(sim_srv)
    # The bounded load test: 64 concurrent streaming clients for 30 s on loopback. Nothing
    # may be lost: AIPerf counts no error and every token, the server's counters agree with
    # AIPerf's, and no KV block stays in use.
    before = sim_srv.metric_sum("vllm:request_success_total")
    done = aiperf(sim_srv.url, model, tok, "chat", None, 64, 128, 32, os.path.join(a.work, "aiperf-soak"), 30)
    wait_idle(sim_srv)
    served = sim_srv.metric_sum("vllm:request_success_total") - before
    check(served == done, f"soak: the server finished {served} requests, AIPerf {done}")
    sim_srv.stop()

    if a.vllm:
        # vLLM's client against the cost model in real time (time scale 1), then `sim replay`
        # of its saved result on the same GPU: the engine is the one that served it, so the
        # replay's TPOT and E2EL must agree; TTFT differs by the HTTP path (client-side).
        srv = Server(sim, [scenario], os.path.join(a.work, "served-model-1x"), os.path.join(a.work, "served-model-1x.log"))
        res = vllm_bench(a.vllm, srv.url, model, tok, "/v1/completions", 100, 8, 512, 64, os.path.join(a.work, "vllm-model"))
        wait_idle(srv)
        srv.stop()
        rep = os.path.join(a.work, "vllm-replay")
        r = subprocess.run([sim, "replay", res, "--gpu", "h100-sxm", "--out", rep], capture_output=True, text=True)
        check(r.returncode == 0, f"sim replay of vllm bench's result: {r.stderr.strip()}")
        figures = {row["metric"]: row for row in csv.DictReader(open(os.path.join(rep, "replay.csv")))}
        line = ", ".join(f"{m} {float(figures[m]['error_pct']):+.1f}%" for m in ["ttft_mean_ms", "tpot_mean_ms", "e2el_mean_ms"])
        print(f"sim replay of vllm bench serve's result: {line}")
        for m in ["tpot_mean_ms", "e2el_mean_ms"]:
            err = abs(float(figures[m]["error_pct"]))
            check(err <= 10.0, f"replay of vllm bench: {m} off by {err:.1f}% (> 10%)")

    print("serve_check: all checks passed")


if __name__ == "__main__":
    main()
