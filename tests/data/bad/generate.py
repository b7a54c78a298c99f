#!/usr/bin/env python3
"""Writes the bad-input corpus of tests/bad_inputs.rs into this folder.

Each case is a scenario file `scenarios/<name>.toml` whose first lines say what `sim` must
do with it: `# expect: <text the one-line error must contain>` and optionally
`# command: run` (default: validate). Data files the scenarios point at are in `data/`.
CLI cases are the lines of `cli.txt`: `<expected text> | <arguments>` (`{tmp}` is a fresh
folder, `{bad}` this folder). Run `python3 tests/data/bad/generate.py` after editing it;
the files it writes are committed.
"""
import os, shutil, struct

HERE = os.path.dirname(os.path.abspath(__file__))
SC = os.path.join(HERE, "scenarios")
DATA = os.path.join(HERE, "data")

BASE = {
    "name": '"bad"',
    "model": {"name": '"llama-3-8b"'},
    "hardware": {"gpu": '"h100-sxm"'},
    "engine": {"scheduler": '"chunked"'},
    "slo": {"ttft_ms": "500.0", "tpot_ms": "50.0"},
    "workload": {"num_requests": "20", "arrival": '{ process = "poisson", rate = 2.0 }'},
    "class": [{"name": '"chat"', "prompt": '{ dist = "fixed", value = 64 }',
               "output": '{ dist = "fixed", value = 16 }'}],
}


def render(s):
    out = []
    for k in ["name", "description", "seed"]:
        if k in s:
            out.append(f"{k} = {s[k]}")
    for table in ["model", "hardware", "engine", "slo", "cost", "speculative", "workload"]:
        if table in s:
            out.append(f"\n[{table}]")
            for k, v in s[table].items():
                out.append(f"{k} = {v}")
    for c in s.get("class", []):
        out.append("\n[[workload.class]]")
        for k, v in c.items():
            out.append(f"{k} = {v}")
    if "sweep" in s:
        out.append("\n[sweep]")
        for k, v in s["sweep"].items():
            out.append(f"{k} = {v}")
    for v in s.get("variant", []):
        out.append("\n[[variant]]")
        for k, val in v.items():
            out.append(f"{k} = {val}")
    return "\n".join(out) + "\n"


def mutate(path, value):
    """The base scenario with `path` (table.key, or class.key for the first class) set to
    `value` (None: removed)."""
    import copy
    s = copy.deepcopy(BASE)
    table, key = path.split(".", 1)
    if table == "class":
        t = s["class"][0]
    else:
        t = s.setdefault(table, {})
    if value is None:
        t.pop(key, None)
    else:
        t[key] = value
    return s


CASES = []


def case(name, expect, scenario=None, text=None, command="validate"):
    CASES.append((name, expect, scenario, text, command))


def m(name, path, value, expect, command="validate"):
    case(name, expect, scenario=mutate(path, value), command=command)


# --- model, hardware
m("model-unknown", "model.name", '"gpt-5"', "model.name")
m("model-name-and-config", "model.config", '"../data/phi.json"', "model.name")
m("model-dtype", "model.dtype", '"fp7"', "dtype")
m("model-kv-dtype-weight-format", "model.kv_dtype", '"int4"', "model.kv_dtype")
m("model-key", "model.size", '"8b"', "size")
case("model-missing", "model", text='name = "bad"\n[hardware]\ngpu = "h100-sxm"\n[workload]\nnum_requests = 2\narrival = { process = "poisson", rate = 1.0 }\n[[workload.class]]\nname = "c"\nprompt = { dist = "fixed", value = 4 }\noutput = { dist = "fixed", value = 4 }\n')
for cfg, expect in [("mamba.json", "mamba"), ("bert.json", "BertForMaskedLM"), ("kv0.json", "num_key_value_heads"),
                    ("maxpos0.json", "max_position_embeddings"), ("heads-huge.json", "num_attention_heads"),
                    ("not-json.json", "not JSON"), ("no-hidden.json", "hidden_size"), ("layer-type-unknown.json", "layer_types[1]"),
                    ("experts-per-token.json", "num_experts_per_tok"), ("mla-partial.json", "qk_nope_head_dim"),
                    ("head-indivisible.json", "head_dim"), ("layers0.json", "num_hidden_layers"),
                    ("vocab-string.json", "vocab_size"), ("missing.json", "missing.json")]:
    s = mutate("model.name", None)
    s["model"]["config"] = f'"../data/{cfg}"'
    case("config-" + cfg[:-5], expect, scenario=s)
for g, expect in [("missing.gguf", "missing.gguf"), ("not-gguf.gguf", "GGUF"), ("truncated.gguf", "truncated.gguf"),
                  ("block-count-huge.gguf", "blk.0"), ("embedding0.gguf", "llama.embedding_length"),
                  ("heads9-kv2.gguf", "head_count_kv"), ("arch-mamba.gguf", "general.architecture"),
                  ("vocab0.gguf", "vocab_size"), ("heads0.gguf", "llama.attention.head_count")]:
    s = mutate("model.name", None)
    s["model"]["gguf"] = f'"../data/{g}"'
    case("gguf-" + g[:-5], expect, scenario=s)
m("gpu-unknown", "hardware.gpu", '"rtx-9090"', "hardware.gpu")
m("tp-zero", "hardware.tp", "0", "hardware.tp")
m("tp-indivisible", "hardware.tp", "3", "hardware.tp")
m("pp-zero", "hardware.pp", "0", "hardware.pp")
m("pp-too-many", "hardware.pp", "1000", "hardware.pp")
m("ep-dense-model", "hardware.ep", "2", "hardware.ep")
m("dp-zero", "hardware.dp", "0", "hardware.dp")
s = mutate("hardware.tp", "8"); s["model"]["name"] = '"mixtral-8x7b"'; s["hardware"]["ep"] = "3"
case("ep-not-dividing-experts", "8 routed experts", scenario=s)
m("hardware-key", "hardware.gpus", "2", "gpus")
for f, expect in [("gpu-memory-huge.toml", "memory_gib"), ("gpu-negative.toml", "bf16_tflops"),
                  ("gpu-unknown-key.toml", "cores"), ("gpu-allreduce.toml", "allreduce_eff"),
                  ("gpu-missing-key.toml", "pcie_gbs"), ("gpu-nan.toml", "memory_bandwidth_gbs"),
                  ("missing-gpu.toml", "missing-gpu.toml")]:
    s = mutate("hardware.gpu", None)
    s["hardware"]["gpu_file"] = f'"../data/{f}"'
    case("gpufile-" + f[:-5], expect, scenario=s)
# --- engine
for key, v, expect in [("block_size", "0", "engine.block_size"), ("block_size", "3", "engine.block_size"),
                       ("block_size", "2048", "engine.block_size"), ("max_num_seqs", "0", "max_num_seqs"),
                       ("gpu_memory_utilization", "0.0", "gpu_memory_utilization"),
                       ("gpu_memory_utilization", "1.5", "gpu_memory_utilization"),
                       ("gpu_memory_utilization", "-1.0", "gpu_memory_utilization"),
                       ("gpu_memory_utilization", "nan", "gpu_memory_utilization"),
                       ("runtime_overhead_gib", "-1.0", "runtime_overhead_gib"),
                       ("runtime_overhead_gib", "1e12", "KV cache"),
                       ("watermark", "0.7", "engine.watermark"), ("queue_aging_s", "0.0", "queue_aging_s"),
                       ("swap_space_gib", "-1.0", "swap_space_gib"), ("num_gpu_blocks_override", "0", "num_gpu_blocks_override"),
                       ("num_gpu_blocks_override", "1000000000", "num_gpu_blocks_override"),
                       ("max_model_len", "0", "max_model_len"), ("scheduler", '"fifo"', "scheduler"),
                       ("eviction_policy", '"random"', "eviction_policy"), ("preemption_mode", '"drop"', "preemption_mode"),
                       ("queue_policy", '"random"', "queue_policy"), ("kv_allocator", '"buddy"', "kv_allocator"),
                       ("max_num_batched_tokens", "-5", "max_num_batched_tokens"), ("chunk", "512", "chunk")]:
    m(f"engine-{key}-{v.strip(chr(34)).replace('.', '_').replace('-', 'neg')}", f"engine.{key}", v, expect)
s = mutate("engine.preemption_mode", '"swap"'); s["engine"]["swap_space_gib"] = "1e12"
case("engine-swap-huge", "swap_space_gib", scenario=s)
s = mutate("engine.kv_allocator", '"contiguous"')
case("engine-contiguous-prefix-caching", "enable_prefix_caching", scenario=s)
s = mutate("engine.kv_allocator", '"contiguous"'); s["engine"]["enable_prefix_caching"] = "false"; s["engine"]["preemption_mode"] = '"swap"'
case("engine-contiguous-swap", "preemption_mode", scenario=s)
s = mutate("engine.scheduler", '"continuous"'); s["engine"]["static_padding"] = "true"
case("engine-static-padding-continuous", "engine.static_padding", scenario=s)
# (pipeline parallelism, where micro-batches in flight mean something)
s = mutate("engine.max_concurrent_batches", "0"); del s["engine"]["scheduler"]; s["hardware"]["pp"] = "2"
case("engine-max_concurrent_batches-0", "engine.max_concurrent_batches", scenario=s)
s = mutate("engine.max_concurrent_batches", "2"); del s["engine"]["scheduler"]
s["engine"]["kv_allocator"] = '"contiguous"'; s["engine"]["enable_prefix_caching"] = "false"; s["hardware"]["pp"] = "2"
case("engine-max_concurrent_batches-contiguous", "engine.max_concurrent_batches", scenario=s)
s = mutate("engine.max_concurrent_batches", "2"); del s["engine"]["scheduler"]; s["hardware"]["pp"] = "2"
s["speculative"] = {"method": '"draft-model"', "draft_model": '"llama-3.2-1b"', "k": "3", "mean_acceptance_length": "2.0"}
case("engine-max_concurrent_batches-speculative", "engine.max_concurrent_batches", scenario=s)
s = mutate("engine.scheduler", '"static"'); s["engine"]["max_concurrent_batches"] = "2"; s["hardware"]["pp"] = "2"
case("engine-max_concurrent_batches-static", "engine.max_concurrent_batches", scenario=s)
s = mutate("engine.scheduler", '"continuous"'); s["engine"]["batch_wait_timeout_iters"] = "20"
case("engine-batch-wait-continuous", "engine.batch_wait_timeout_iters", scenario=s)
s = mutate("engine.batch_wait_timeout_iters", "20"); s["engine"]["batch_wait_max_tokens_ratio"] = "1.5"
case("engine-batch-wait-ratio", "engine.batch_wait_max_tokens_ratio", scenario=s)
m("engine-batch-wait-ratio-alone", "engine.batch_wait_max_tokens_ratio", "-0.5", "engine.batch_wait_max_tokens_ratio")
s = mutate("engine.batch_wait_timeout_iters", "-1")
case("engine-batch-wait-negative", "batch_wait_timeout_iters", scenario=s)
m("engine-recv-interval-negative", "engine.recv_interval", "-30", "recv_interval")
s = mutate("engine.scheduler", '"continuous"'); s["engine"]["enable_chunked_prefill"] = "false"
case("engine-whole-prompts-continuous", "engine.enable_chunked_prefill", scenario=s)
s = mutate("engine.enable_chunked_prefill", "false"); s["engine"]["max_num_batched_tokens"] = "1024"
case("engine-whole-prompts-small-budget", "must hold the longest sequence", scenario=s)
m("engine-whole-prompts-not-bool", "engine.enable_chunked_prefill", '"no"', "enable_chunked_prefill")
m("engine-adp-balance-without-dp", "engine.adp_balance_timeout_iters", "60",
  "engine.adp_balance_timeout_iters: balances")
s = mutate("engine.recv_interval", "30"); s["engine"]["adp_balance_timeout_iters"] = "60"
case("engine-recv-interval-and-adp-balance", "set one", scenario=s)
m("engine-max-prefill-tokens-zero", "engine.max_prefill_tokens", "0", "engine.max_prefill_tokens: must be at least 1")
s = mutate("engine.scheduler", '"continuous"'); s["engine"]["max_prefill_tokens"] = "2524"
case("engine-max-prefill-tokens-continuous", "engine.max_prefill_tokens: limits the prompts mixed", scenario=s)
m("engine-max-prefill-tokens-negative", "engine.max_prefill_tokens", "-1", "max_prefill_tokens")
# --- workload
for path, v, expect in [("workload.num_requests", "0", "workload.num_requests"),
                        ("workload.duration_s", "-1.0", "workload.duration_s"),
                        ("workload.arrival", '{ process = "poisson", rate = 0.0 }', "workload.arrival.rate"),
                        ("workload.arrival", '{ process = "poisson", rate = -3.0 }', "workload.arrival.rate"),
                        ("workload.arrival", '{ process = "poisson", rate = nan }', "workload.arrival.rate"),
                        ("workload.arrival", '{ process = "gamma", rate = 1.0, burstiness = 0.0 }', "burstiness"),
                        ("workload.arrival", '{ process = "weibull", rate = 1.0 }', "weibull"),
                        ("workload.arrival", '{ process = "poisson", rate = 1.0, cv = 2 }', "cv"),

                        ("workload.trace", '{ format = "azure", path = "../data/azure-ok.csv" }', "workload.trace"),
                        ("workload.requests", "5", "requests"),
                        ("class.weight", "0.0", "weight"), ("class.weight", "-1.0", "weight"),
                        ("class.name", '""', "name"), ("class.prompt", None, "workload.class[0].prompt"),
                        ("class.output", None, "workload.class[0].output"),
                        ("class.prompt", '{ dist = "fixed", value = 0 }', "prompt.value"),
                        ("class.prompt", '{ dist = "uniform", min = 10, max = 5 }', "prompt.min"),
                        ("class.prompt", '{ dist = "normal", mean = 10.0, std = -1.0 }', "prompt.std"),
                        ("class.prompt", '{ dist = "lognormal", mean = 0.0, std = 1.0 }', "prompt.mean"),
                        ("class.prompt", '{ dist = "zipf", s = 1.0 }', "zipf"),
                        ("class.prompt", '{ dist = "empirical", path = "../data/missing.csv", column = "n" }', "missing.csv"),
                        ("class.prompt", '{ dist = "empirical", path = "../data/lengths.csv", column = "tokens" }', "tokens"),
                        ("class.prompt", '{ dist = "empirical", path = "../data/lengths-bad.csv", column = "n" }', "lengths-bad.csv"),
                        ("class.lengths", '{ path = "../data/lengths.csv", prompt_column = "n", output_column = "n" }', "lengths"),
                        ("class.temperature", "-1.0", "temperature"), ("class.top_p", "0.0", "top_p"),
                        ("class.top_p", "1.5", "top_p"), ("class.n", "0", "workload.class[0].n"),
                        ("class.n", "300", "workload.class[0].n"), ("class.beam_search", "true", "beam"),
                        ("class.shared_prefix", "{ tokens = 1000, groups = 0 }", "shared_prefix.groups"),
                        ("class.shared_prefix", "{ tokens = 0, groups = 2 }", "shared_prefix.tokens"),
                        ("class.shared_prefix", "{ tokens = 4000000000, groups = 4 }", "shared_prefix.tokens"),
                        ("class.priority", '"high"', "priority"), ("class.color", '"red"', "color")]:
    name = "workload-" + path.split(".")[-1] + "-" + (v or "none").strip('"{} ').replace(" ", "").replace('"', "").replace("=", "").replace(",", "-").replace(".", "_").replace("/", "")[:60]
    m(name, path, v, expect)
m("workload-arrival-beyond-horizon", "workload.arrival", '{ process = "poisson", rate = 1e-12 }', "horizon", command="run")
s = mutate("workload.arrival", '{ process = "all-at-once" }'); del s["workload"]["num_requests"]
case("workload-all-at-once-no-count", "workload.num_requests", scenario=s)
s = mutate("workload.arrival", '{ process = "closed-loop", concurrency = 4 }'); del s["workload"]["num_requests"]
case("workload-closed-loop-no-count", "workload.num_requests", scenario=s)
for i, (v, expect) in enumerate([('{ process = "closed-loop", concurrency = 0 }', "concurrency"),
                  ('{ process = "closed-loop", concurrency = 4000000000 }', "concurrency"),
                  ('{ process = "closed-loop" }', "concurrency"),
                  ('{ process = "closed-loop", concurrency = 4, think_time_s = -1.0 }', "think_time_s"),
                  ('{ process = "closed-loop", concurrency = 4, think_time_s = nan }', "think_time_s"),
                  ('{ process = "closed-loop", concurrency = 4, rate = 2.0 }', "rate"),
                  ('{ process = "closed-loop", concurrency = 4, ramp_up_s = -1.0 }', "ramp_up_s"),
                  ('{ process = "closed-loop", concurrency = 4, think_jitter_s = -0.01 }', "think_jitter_s"),
                  ('{ process = "closed-loop", concurrency = 4, think_jitter_s = inf }', "think_jitter_s")]):
    m("workload-closed-loop-%d-%s" % (i, expect), "workload.arrival", v, expect)
for v in ["0", "-1", "2000000"]:
    m("workload-max-in-flight-" + v, "workload.max_in_flight", v, "max_in_flight")
s = mutate("workload.arrival", '{ process = "closed-loop", concurrency = 4 }'); s["workload"]["max_in_flight"] = "2"
case("workload-max-in-flight-closed-loop", "max_in_flight", scenario=s)
m("workload-think-time-without-cap", "workload.think_time_s", "0.5", "workload.think_time_s")
s = mutate("workload.max_in_flight", "4"); s["workload"]["think_time_s"] = "-1.0"
case("workload-think-time-negative", "workload.think_time_s", scenario=s)
s = mutate("workload.num_requests", None)
case("workload-no-count", "workload.num_requests", scenario=s)
s = dict(mutate("workload.num_requests", "5")); s["class"] = []
case("workload-no-class", "workload.class", scenario=s)
s = mutate("workload.num_requests", "5"); s["class"] = [BASE["class"][0], BASE["class"][0]]
case("workload-duplicate-class", "duplicate", scenario=s)
for kv, expect in [("turns = { dist = \"fixed\", value = 2 }\nuser = { dist = \"fixed\", value = 4 }\noutput = { dist = \"fixed\", value = 4 }\nthink_time_s = 0.0", "think_time_s"),
                   ("turns = { dist = \"fixed\", value = 0 }\nuser = { dist = \"fixed\", value = 4 }\noutput = { dist = \"fixed\", value = 4 }\nthink_time_s = 1.0", "turns.value"),
                   ("turns = { dist = \"fixed\", value = 2 }\nuser = { dist = \"fixed\", value = 4 }\noutput = { dist = \"fixed\", value = 4 }\nthink_time_s = 1.0\nmax_prompt = 0", "max_prompt"),
                   ("turns = { dist = \"fixed\", value = 2 }\nuser = { dist = \"fixed\", value = 4 }\noutput = { dist = \"fixed\", value = 4 }\nthink_time_s = 1.0\nsystem_prompt = { tokens = 10, groups = 0 }", "system_prompt.groups"),
                   ("turns = { dist = \"fixed\", value = 2 }\nuser = { dist = \"fixed\", value = 4 }\noutput = { dist = \"fixed\", value = 4 }\nthink_time_s = 1.0\nsystem_prompt = { tokens = 100000, groups = 1 }", "system_prompt.tokens")]:
    text = render({k: v for k, v in BASE.items() if k != "class"}) + "\n[workload.multi_turn]\n" + kv + "\n"
    case("multi-turn-" + expect.replace(".", "-").replace("_", "-"), expect, text=text)
for kv, expect in [("groups = 0", "generated_shared_prefix.groups"), ("groups = 100000\nprompts_per_group = 100000", "2^26"),
                   ("system_prompt_len = 100000", "system_prompt_len")]:
    text = render({k: v for k, v in BASE.items() if k != "class"}) + "\n[workload.generated_shared_prefix]\n" + kv + "\n"
    case("gsp-" + kv.split(" ")[0].replace("_", "-") + ("-huge" if "100000" in kv else ""), expect, text=text)
text = render({k: v for k, v in BASE.items() if k != "class"}) + "\n[workload.multi_turn]\nturns = { dist = \"fixed\", value = 2 }\nuser = { dist = \"fixed\", value = 4 }\noutput = { dist = \"fixed\", value = 4 }\nthink_time_s = 1.0\n\n[workload.generated_shared_prefix]\n"
case("multi-turn-and-gsp", "not both", text=text)
# traces (validate reads every row)
TRACES = [
    ("azure-bad-count.csv", "azure", "ContextTokens"), ("azure-negative.csv", "azure", "GeneratedTokens"),
    ("azure-decreasing.csv", "azure", "earlier than the previous row"), ("azure-bad-time.csv", "azure", "TIMESTAMP"),
    ("azure-missing-column.csv", "azure", "GeneratedTokens"), ("azure-header-only.csv", "azure", "no requests"),
    ("azure-empty.csv", "azure", "azure-empty.csv"), ("azure-unterminated-quote.csv", "azure", "azure-unterminated-quote.csv"),
    ("azure-invalid-utf8.csv", "azure", "azure-invalid-utf8.csv"), ("azure-missing-value.csv", "azure", "missing value"),
    ("azure-huge-count.csv", "azure", "too large"), ("vidur-negative.csv", "vidur", "arrived_at"),
    ("vidur-decreasing.csv", "vidur", "earlier than the previous row"), ("vidur-nan.csv", "vidur", "arrived_at"),
    ("mooncake-bad-json.jsonl", "mooncake", "not a Mooncake trace row"), ("mooncake-decreasing.jsonl", "mooncake", "timestamp"),
    ("mooncake-capacity.jsonl", "mooncake", "hash_ids"), ("mooncake-huge.jsonl", "mooncake", "input_length"),
    ("mooncake-missing-field.jsonl", "mooncake", "hash_ids"), ("mooncake-empty.jsonl", "mooncake", "no requests"),
    ("missing-trace.csv", "azure", "missing-trace.csv"),
]
for f, fmt, expect in TRACES:
    text = render({k: v for k, v in BASE.items() if k not in ("class", "workload")}) + f'\n[workload]\ntrace = {{ format = "{fmt}", path = "../data/{f}" }}\n'
    case("trace-" + f.rsplit(".", 1)[0], expect, text=text)
text = render({k: v for k, v in BASE.items() if k not in ("class", "workload")}) + '\n[workload]\ntrace = { format = "azure", path = "../data/azure-ok.csv", time_scale = 0.0 }\n'
case("trace-time-scale-zero", "time_scale", text=text)
text = render({k: v for k, v in BASE.items() if k not in ("class", "workload")}) + '\n[workload]\ntrace = { format = "sharegpt", path = "../data/azure-ok.csv" }\n'
case("trace-format-unknown", "sharegpt", text=text)
text = render({k: v for k, v in BASE.items() if k not in ("workload",)}) + '\n[workload]\ntrace = { format = "azure", path = "../data/azure-ok.csv" }\n'
case("trace-with-classes", "workload.class", text=text)
# --- slo, cost, speculative
for key, v, expect in [("ttft_ms", "-1.0", "slo.ttft_ms"), ("tpot_ms", "nan", "slo.tpot_ms"), ("e2el_ms", "0.0", "slo.e2el_ms"),
                       ("itl_ms", "5.0", "itl_ms")]:
    m(f"slo-{key}-{v.replace('.', '_').replace('-', 'neg')}", f"slo.{key}", v, expect)
for key, v, expect in [("gemm_compute_eff", "0.0", "gemm_compute_eff"), ("gemm_memory_eff", "1.5", "gemm_memory_eff"), ("fp8_memory_eff", "0.0", "cost.fp8_memory_eff"), ("fp4_memory_eff", "1.2", "cost.fp4_memory_eff"),
                       ("allreduce_peer_us", "-2.0", "cost.allreduce_peer_us"), ("allreduce_peer_us", "inf", "cost.allreduce_peer_us"),
                       ("overlap_exponent", "0.5", "overlap_exponent"), ("step_overhead_us", "-1.0", "step_overhead_us"),
                       ("framework", '"tgi"', "tgi"), ("calibration", '"../data/missing-calibration.toml"', "missing-calibration.toml"),
                       ("calibration", '"../data/calibration-bad.toml"', "gemm_memory_eff"), ("warp_eff", "0.5", "warp_eff"),
                       ("kernel_launch_us", "nan", "kernel_launch_us"), ("moe_routing_skew", "-0.5", "moe_routing_skew"),
                       ("moe_routing_skew", "nan", "moe_routing_skew"), ("moe_layer_us", "-3.0", "moe_layer_us"),
                       ("eager_layer_us", "-100.0", "cost.eager_layer_us"), ("eager_layer_us", "nan", "cost.eager_layer_us"),
                       ("graph_max_tokens", "0", "cost.graph_max_tokens"), ("graph_max_tokens", "-8", "graph_max_tokens"),
                       ("graph_max_tokens", "512", "needs cost.eager_layer_us"),
                       ("frontend_request_ms", "-1.0", "cost.frontend_request_ms"), ("frontend_request_ms", "nan", "cost.frontend_request_ms"),
                       ("frontend_update_us", "-5.0", "cost.frontend_update_us"), ("frontend_update_us", "1e9", "cost.frontend_update_us")]:
    m(f"cost-{key}-{v.strip(chr(34)).replace('.', '_').replace('/', '').replace('-', 'neg')[:20]}", f"cost.{key}", v, expect)
# Efficiencies scoped to one GPU: a GPU the catalog lacks, a key it does not scope, a value out of range.
for name, v, expect in [("gpu", '{ z100 = { fp8_compute_eff = 0.5 } }', "cost.by_gpu.z100"),
                        ("key", '{ b200 = { step_overhead_us = 5.0 } }', "step_overhead_us"),
                        ("range", '{ b200 = { fp8_compute_eff = 1.5 } }', "cost.by_gpu.b200.fp8_compute_eff"),
                        ("memory-range", '{ b200 = { fp4_memory_eff = 0.0 } }', "cost.by_gpu.b200.fp4_memory_eff"),
                        ("twice", '{ b200 = { fp8_compute_eff = 0.5 }, hgx-b200 = { fp4_compute_eff = 0.5 } }', "given twice"),
                        # ... and per expert format: a format it does not name, a key it does not scope, out of range.
                        ("experts-format", '{ h200 = { experts = { fp6 = { moe_gemm_eff = 0.5 } } } }', "cost.by_gpu.h200.experts.fp6"),
                        ("experts-key", '{ h200 = { experts = { fp8 = { moe_layer_us = 5.0 } } } }', "moe_layer_us"),
                        ("experts-range", '{ h200 = { experts = { fp8 = { moe_compute_eff = 1.5 } } } }', "cost.by_gpu.h200.experts.fp8.moe_compute_eff"),
                        ("experts-floor", '{ h200 = { experts = { fp4 = { moe_prefill_expert_us = -4.0 } } } }', "cost.by_gpu.h200.experts.fp4.moe_prefill_expert_us")]:
    m(f"cost-by-gpu-{name}", "cost.by_gpu", v, expect)
# A calibration's [fit] record (sim calibrate --observed): a bad error interval, fold or key.
for name, expect in [("error", "ttft_error_90"), ("fold", "folds[1]"), ("key", "fit_quality")]:
    m(f"cost-calibration-fit-{name}", "cost.calibration", f'"../data/calibration-fit-{name}.toml"', expect)
# Operator profiles ([cost] operator_profile, LLMServingSim's profiler layout): each case
# breaks one thing of a good profile of llama-3-8b on an H100 (written by profile_files).
PROFILE_META = {"model": "meta-llama/Meta-Llama-3-8B", "gpu": "NVIDIA H100 80GB HBM3", "variant": "bf16",
                "tp_degrees": "[1]"}
PROFILE_MOE_DENSE = "layer,tokens,time_us\nqkv_proj,1,10\no_proj,1,5\nlayernorm,1,2\n"
PROFILE_CASES = {
    # name: (meta changes, {file: text or None to leave it out}, tp folder, expect)
    "no-meta": (None, {}, "tp1", "meta.yaml"),
    "meta-not-yaml": ({"model": "[unclosed"}, {}, "tp1", "meta.yaml"),
    "no-tp": ({}, {}, "tp2", "tensor-parallel degree 1"),
    "dense-header": ({}, {"dense.csv": "op,tokens,time_us\nqkv_proj,1,10\n"}, "tp1", "header"),
    "dense-time": ({}, {"dense.csv": "layer,tokens,time_us\nqkv_proj,1,-10\n"}, "tp1", "time_us"),
    "dense-tokens": ({}, {"dense.csv": "layer,tokens,time_us\nqkv_proj,many,10\n"}, "tp1", "tokens"),
    "dense-unknown-op": ({}, {"dense.csv": "DENSE+moe_gate,1,5\n"}, "tp1", "moe_gate"),
    "dense-no-down": ({}, {"dense.csv": "layer,tokens,time_us\nqkv_proj,1,10\no_proj,1,5\ngate_up_proj,1,20\nlayernorm,1,2\n"}, "tp1", "down_proj"),
    "dense-twice": ({}, {"dense.csv": "DENSE+qkv_proj,1,11\n"}, "tp1", "measured twice"),
    "attention-twice": ({}, {"attention.csv": "ATTN+0,0,1,16,6\n"}, "tp1", "measured twice"),
    "attention-empty-row": ({}, {"attention.csv": "ATTN+0,0,0,0,6\n"}, "tp1", "prefill chunk or decodes"),
    "attention-size": ({}, {"attention.csv": "ATTN+-16,0,0,0,6\n"}, "tp1", "prefill_chunk"),
    "attention-missing": ({}, {"attention.csv": None}, "tp1", "attention.csv"),
    "sequence-op": ({}, {"per_sequence.csv": "layer,sequences,time_us\nlm_head,1,100\nlogits_softcap,1,3\n"}, "tp1", "per_sequence.csv:3: layer"),
    "model-mismatch": ({"model": "Qwen/Qwen3-32B"}, {}, "tp1", "not the scenario's model"),
    "gpu-mismatch": ({"gpu": "NVIDIA GeForce RTX 4090"}, {}, "tp1", "not the scenario's GPU"),
    "variant-fp8": ({"variant": "fp8"}, {}, "tp1", "weights"),
    "moe-header": ({}, {"moe.csv": "tokens,experts,time_us\n16,8,50\n"}, "tp1", "moe.csv:1: header"),
    "moe-no-experts": ({}, {"moe.csv": "tokens,activated_experts,time_us\n16,0,50\n"}, "tp1", "moe.csv:2: activated_experts"),
    "moe-twice": ({}, {"moe.csv": "tokens,activated_experts,time_us\n16,8,50\n16,8,51\n"}, "tp1", "measured twice"),
    "moe-for-dense": ({}, {"moe.csv": "tokens,activated_experts,time_us\n16,8,50\n"}, "tp1", "is dense"),
    # Qwen3-30B-A3B's profiles: with the base scenario's Llama they are another model's.
    "moe-missing": ({"model": "Qwen/Qwen3-30B-A3B-Instruct-2507"}, {}, "tp1", "not the scenario's model"),
    "moe-wide": ({"model": "Qwen/Qwen3-30B-A3B-Instruct-2507"}, {"dense.csv": PROFILE_MOE_DENSE, "moe.csv": "tokens,activated_experts,time_us\n16,8,50\n64,256,900\n"}, "tp1", "not the scenario's model"),
}
PROFILE_DENSE = "layer,tokens,time_us\n" + "".join(f"{op},{n},{t * n ** 0.5:.3f}\n" for op, t in
    [("qkv_proj", 10), ("o_proj", 5), ("gate_up_proj", 20), ("down_proj", 10), ("layernorm", 2)] for n in (1, 16, 256))
PROFILE_ATTN = "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n16,0,0,0,8\n16,512,0,0,12\n0,0,1,16,5\n0,0,4,512,9\n16,0,1,16,10\n"
PROFILE_SEQ = "layer,sequences,time_us\nlm_head,1,100\nlm_head,64,120\nsampler,1,10\n"


def profile_files(root):
    """Writes one profile folder per case under `root`."""
    for name, (meta, files, tp, _) in PROFILE_CASES.items():
        d = os.path.join(root, name)
        os.makedirs(os.path.join(d, tp))
        if meta is not None:
            m = dict(PROFILE_META, **meta)
            with open(os.path.join(d, "meta.yaml"), "w") as fh:
                fh.write("profiler_version: 1.0.0\n" + "".join(f"{k}: {v}\n" for k, v in m.items()))
        base = {"dense.csv": PROFILE_DENSE, "attention.csv": PROFILE_ATTN, "per_sequence.csv": PROFILE_SEQ}
        extra = [(f, t) for f, t in files.items() if f not in base]
        for f, text in list(base.items()) + extra:
            text = files.get(f, text)
            if text is None:
                continue
            if text.startswith("DENSE+"):
                text = PROFILE_DENSE + text[len("DENSE+"):]
            elif text.startswith("ATTN+"):
                text = PROFILE_ATTN + text[len("ATTN+"):]
            with open(os.path.join(d, tp, f), "w") as fh:
                fh.write(text)


for name, (_, _, _, expect) in PROFILE_CASES.items():
    m(f"cost-operator-profile-{name}", "cost.operator_profile", f'"../data/profiles/{name}"', expect)
s = mutate("cost.operator_profile", '"../data/profiles/good"'); s["hardware"]["pp"] = "2"
case("cost-operator-profile-pipeline", "pipeline", scenario=s)
for profile, change, expect in [("moe-missing", {}, "no moe.csv"), ("moe-wide", {}, "up to 256 activated experts"),
                                ("good", {"tp": "2", "ep": "2"}, "split")]:
    s = mutate("cost.operator_profile", f'"../data/profiles/{profile}"'); s["model"]["name"] = '"qwen3-30b-a3b"'
    s["hardware"].update(change)
    case(f"cost-operator-profile-qwen3-moe-{profile}", expect, scenario=s)
PROFILE_CASES["good"] = ({}, {}, "tp1", "")
SPEC = {"method": '"synthetic"', "k": "4", "acceptance": "[0.8, 0.6]"}
for change, expect in [({"method": '"magic"'}, "magic"), ({"k": "0"}, "speculative.k"), ({"k": "100"}, "speculative.k"),
                       ({"acceptance": None}, "acceptance"), ({"mean_acceptance_length": "2.0"}, "mean_acceptance_length"),
                       ({"acceptance": "[0.5, 0.9]"}, "acceptance"), ({"acceptance": "[1.5]"}, "acceptance"),
                       ({"method": '"draft-model"', "draft_model": '"gpt-9"'}, "speculative.draft_model"),
                       ({"method": '"draft-model"', "draft_model": '"llama-2-7b"'}, "vocabulary"),
                       ({"method": '"draft-model"', "draft_model": '"llama-3.2-1b"', "draft_tp": "0"}, "draft_tp"),
                       ({"method": '"draft-model"', "self_draft_layers": "0"}, "self_draft_layers"),
                       ({"method": '"draft-model"', "self_draft_layers": "500"}, "self_draft_layers"),
                       ({"dynamic_k": "{ disable_above = 4, full_until = 2 }"}, "dynamic_k"),
                       ({"ngram_size": "3"}, "ngram_size")]:
    s = mutate("engine.scheduler", '"chunked"')
    sp = dict(SPEC); sp.update(change)
    s["speculative"] = {k: v for k, v in sp.items() if v is not None}
    case("spec-" + "-".join(f"{k}{v}" for k, v in change.items()).replace('"', "").replace(" ", "").replace("[", "").replace("]", "").replace(",", "_").replace(".", "_").replace("{", "").replace("}", "").replace("=", "")[:40], expect, scenario=s)
s = mutate("hardware.tp", "4"); s["model"]["name"] = '"llama-3-70b"'; s["speculative"] = {"method": '"draft-model"', "draft_model": '"llama-3.2-1b"', "draft_tp": "3", "acceptance": "[0.8]"}
case("spec-draft-tp-indivisible", "draft_tp", scenario=s)
# --- sweeps and variants
for sweep, expect in [({'"workload.arrival.rate"': "[]"}, "sweep"), ({'"name"': '["a", "b"]'}, "name"),
                      ({'"engine.block_size"': "16"}, "sweep"), ({'"engine.block_size"': "[16, 7]"}, "engine.block_size"),
                      ({'"model.name.x"': "[1]"}, "model.name"), ({'"workload.arrival.rate"': "[1.0, -2.0]"}, "workload.arrival.rate"),
                      ({'"workload.class.5.weight"': "[1.0]"}, "no index 5"), ({'"workload.class.x.weight"': "[1.0]"}, "index it by number"),
                      ({'"workload..rate"': "[1.0]"}, "empty part"), ({'"engine.0.block_size"': "[16]"}, "no array to index"),
                      ({'"workload.class.+0.weight"': "[1.0]"}, "index it by number")]:
    s = mutate("engine.scheduler", '"chunked"'); s["sweep"] = sweep
    case("sweep-" + "".join(sweep.values()).replace('"', "").replace("[", "").replace("]", "").replace(",", "_").replace(" ", "").replace(".", "_").replace("-", "neg")[:20] + "-" + list(sweep)[0].strip('"').replace(".", "-"), expect, scenario=s)
for variants, expect in [([{"engine.scheduler": '"static"'}], "name"), ([{"name": '"../escaped"'}], "../escaped"),
                         ([{"name": '"/abs"'}], "/abs"), ([{"name": '"a/b"'}], "a/b"), ([{"name": '".."'}], ".."),
                         ([{"name": '"v"', "workload.num_requests": "5"}], "workload"),
                         ([{"name": '"v"'}, {"name": '"v"'}], "defined twice"),
                         ([{"name": '"v"', "engine.block_size": "3"}], "engine.block_size"),
                         ([{"name": '"v"', "engine.colour": '"red"'}], "colour"), ([{"name": '"v"', "seed": "3"}], "seed")]:
    s = mutate("engine.scheduler", '"chunked"'); s["variant"] = variants
    case("variant-" + expect.replace("/", "slash").replace(".", "dot").replace(" ", "-"), expect, scenario=s)
m("offload-negative", "engine.kv_offload_gib", "-1.0", "engine.kv_offload_gib")
m("offload-store", "engine.kv_offload_store", '"sometimes"', "sometimes")
m("offload-policy", "engine.kv_offload_policy", '"mru"', "mru")
s = mutate("engine.kv_offload_gib", "8.0"); s["engine"]["enable_prefix_caching"] = "false"
case("offload-without-prefix-cache", "enable_prefix_caching", scenario=s)
m("offload-huge", "engine.kv_offload_gib", "1e12", "engine.kv_offload_gib")
s = mutate("engine.kv_offload_gib", "8.0"); s["model"]["name"] = '"gpt-oss-120b"'; s["model"]["dtype"] = '"mxfp4"'; s["hardware"]["gpu"] = '"h200"'
case("offload-hybrid-model", "engine.kv_offload_gib", scenario=s)
m("disk-negative", "engine.kv_disk_gib", "-1.0", "engine.kv_disk_gib")
m("disk-without-cpu-tier", "engine.kv_disk_gib", "64.0", "engine.kv_offload_gib")
s = mutate("engine.kv_offload_gib", "8.0"); s["engine"]["kv_disk_gbs"] = "0.0"
case("disk-bandwidth-zero", "engine.kv_disk_gbs", scenario=s)
s = mutate("engine.kv_offload_gib", "8.0"); s["engine"]["kv_disk_gib"] = "1e12"
case("disk-huge", "engine.kv_disk_gib", scenario=s)
# --- fleets ([cluster])
for name, cluster, expect in [
        ("no-pools", '[cluster]\nrouting = "round-robin"\n', "pools"),
        ("empty-pools", '[cluster]\npools = {}\n', "at least one pool"),
        ("replicas-0", '[cluster.pools.a]\nreplicas = 0\n', "cluster.pools.a.replicas"),
        ("replicas-huge", '[cluster.pools.a]\nreplicas = 1000000\n', "cluster.pools.a.replicas"),
        ("replicas-sum", '[cluster.pools.a]\nreplicas = 3000\n[cluster.pools.b]\nreplicas = 3000\n', "6000 replicas"),
        ("routing-unknown", '[cluster]\nrouting = "random"\n[cluster.pools.a]\nreplicas = 2\n', "random"),
        ("refresh-negative", '[cluster]\nrefresh_ms = -5\n[cluster.pools.a]\nreplicas = 2\n', "cluster.refresh_ms"),
        ("weights-zero", '[cluster.scorers]\nprefix = 0\nqueue = 0\nkv = 0\n[cluster.pools.a]\nreplicas = 2\n', "cluster.scorers"),
        ("weight-nan", '[cluster.scorers]\nprefix = nan\n[cluster.pools.a]\nreplicas = 2\n', "cluster.scorers.prefix"),
        ("scorer-unknown", '[cluster.scorers]\nlatency = 1\n[cluster.pools.a]\nreplicas = 2\n', "latency"),
        ("key-unknown", '[cluster]\ncolour = "red"\n[cluster.pools.a]\nreplicas = 2\n', "colour"),
        ("pool-key-unknown", '[cluster.pools.a]\nreplicas = 2\ngpus = 4\n', "gpus"),
        ("pool-engine-key", '[cluster.pools.a]\nreplicas = 2\nengine = { max_num_seq = 4 }\n', "max_num_seq"),
        ("pool-engine-value", '[cluster.pools.a]\nreplicas = 2\nengine = { block_size = 7 }\n', "cluster.pools.a"),
        ("pool-gpu-unknown", '[cluster.pools.a]\nreplicas = 2\nhardware = { gpu = "h900" }\n', "cluster.pools.a"),
        ("pool-name-slash", '[cluster.pools."a/b"]\nreplicas = 2\n', "a/b"),
        ("price-negative", '[cluster]\nusd_per_gpu_hour = -1.0\n[cluster.pools.a]\nreplicas = 2\n', "cluster.usd_per_gpu_hour"),
        ("index-block-0", '[cluster.prefix_index]\nblock_size = 0\n[cluster.pools.a]\nreplicas = 2\n', "cluster.prefix_index.block_size"),
        ("variant-routing", '[cluster.pools.a]\nreplicas = 2\n\n[[variant]]\nname = "v"\ncluster.routing = "fastest"\n', "fastest")]:
    case("cluster-" + name, expect, text=render(BASE) + "\n" + cluster)
# --- whole files
case("toml-syntax", "line", text='name = "bad"\n[model\nname = "x"\n')
case("toml-unknown-top-key", "colour", text=render(BASE) + 'colour = "red"\n')
case("toml-empty", "model", text="")
case("toml-binary", "bad", text="\x00\x01\x02 not toml \x7f\n")
case("scenario-name-escapes", "name", text=render(dict(BASE, name='"../../x"')))
case("toml-seed-negative", "seed", text=render(dict(BASE, seed="-1")))
case("toml-wrong-type", "workload.num_requests", text=render(mutate("workload.num_requests", '"many"')))

CLI = [
    ("--requests", "run {bad}/ok.toml --requests 0 --out {tmp}"),
    ("--seeds", "run {bad}/ok.toml --seeds 0 --out {tmp}"),
    ("--seeds", "run {bad}/ok.toml --seeds 2 --seed 18446744073709551615 --out {tmp}"),
    ("--shard", "run {bad}/ok.toml --shard 2/2 --out {tmp}"),
    ("--shard", "run {bad}/ok.toml --shard x --out {tmp}"),
    ("--shard", "run {bad}/ok.toml --shard 0/0 --out {tmp}"),
    ("--variant", "run {bad}/ok.toml --variant nope --out {tmp}"),
    ("--backend", "run {bad}/ok.toml --backend tpu --out {tmp}"),
    ("--driver", "run {bad}/ok.toml --driver magic --out {tmp}"),
    ("missing-calibration.toml", "run {bad}/ok.toml --calibration {bad}/data/missing-calibration.toml --out {tmp}"),
    ("missing.toml", "run {bad}/missing.toml --out {tmp}"),
    ("missing.toml", "validate {bad}/missing.toml"),
    ("--requests", "bench {bad}/ok.toml --requests 0"),
    ("--rate", "plan {bad}/ok.toml --rate 0"),
    ("--rate", "plan {bad}/ok.toml --rate -1"),
    ("--rate", "plan {bad}/ok.toml --rate nan"),
    ("--gpu", "plan {bad}/ok.toml --rate 1 --gpu rtx-9090"),
    ("--tp", "plan {bad}/ok.toml --rate 1 --tp 0"),
    ("attention heads", "plan {bad}/ok.toml --rate 1 --tp 3 --requests 20"),
    ("--price", "plan {bad}/ok.toml --rate 1 --price h100"),
    ("--price", "plan {bad}/ok.toml --rate 1 --price h100-sxm=-1"),
    ("--price", "plan {bad}/ok.toml --rate 1 --price tpu=1"),
    ("--dtype", "plan {bad}/ok.toml --rate 1 --dtype fp7"),
    ("--requests", "plan {bad}/ok.toml --rate 1 --requests 0"),
    ("--temperature", "generate --model {bad}/data/not-gguf.gguf --prompt hi --temperature -1"),
    ("--top-p", "generate --model {bad}/data/not-gguf.gguf --prompt hi --top-p 0"),
    ("--backend", "generate --model {bad}/data/not-gguf.gguf --prompt hi --backend model"),
    ("missing.gguf", "generate --model {bad}/data/missing.gguf --prompt hi"),
    ("directory", "generate --model {bad}/data --prompt hi"),
    ("GGUF", "generate --model {bad}/data/not-gguf.gguf --prompt hi"),
    ("--max-tokens", "speculate --model {bad}/data/not-gguf.gguf --max-tokens 0"),
    ("--method", "speculate --model {bad}/data/not-gguf.gguf --method magic"),
    ("--prompt", "cpu-bench --model {bad}/data/not-gguf.gguf --prompt 0"),
    ("--model", "cuda-bench --model gpt-9"),
    ("--model", "calibrate --steps {bad}/data/steps.csv --gpu h100-sxm --model gpt-9"),
    ("--gpu", "calibrate --steps {bad}/data/steps.csv --gpu tpu"),
    ("--gpu", "calibrate --steps {bad}/data/steps.csv"),
    ("missing-steps.csv", "calibrate --steps {bad}/data/missing-steps.csv --gpu h100-sxm --out {tmp}/c.toml"),
    ("steps-bad.csv", "calibrate --steps {bad}/data/steps-bad.csv --gpu h100-sxm --out {tmp}/c.toml"),
    ("unknown GPU", "calibrate --from {bad}/data/gemm-bad-gpu.csv --out {tmp}/c.toml"),
    ("--backend", "calibrate --backend model"),
    ("--backend", "fidelity {bad}/ok.toml --calibration {bad}/data/missing-calibration.toml --backend model"),
    ("summary.json", "report {tmp}"),
    ("missing-dir", "report {tmp}/missing-dir"),
    ("no results", "compare {bad}/data {bad}/scenarios"),
    ("missing-dir", "compare {tmp}/missing-dir {tmp}"),
    ("merge", "merge {tmp} --out {tmp}/m"),
    ("unknown run format", "replay {bad}/cli.txt --out {tmp}"),
    ("no run replayed", "replay {bad}/data --out {tmp}"),
    ("no runs found", "replay {bad}/scenarios --out {tmp}"),
    ("steps.csv: unknown CSV run", "replay {bad}/data/steps.csv --out {tmp}"),
    ("run-bad.csv:3: send_s", "replay {bad}/data/run-bad.csv --out {tmp}"),
    ("--model tpu-llm", "replay {bad}/data/run-ok.csv --model tpu-llm --out {tmp}"),
    ("does not name its GPU", "replay {bad}/data/run-ok.csv --model llama-3-8b --out {tmp}"),
    ("--gpu rtx-9090", "replay {bad}/data/run-ok.csv --model llama-3-8b --gpu rtx-9090 --out {tmp}"),
    ("run-bench-old.json: the run has no send times and no request_rate", "replay {bad}/data/run-bench-old.json --model llama-3-8b --gpu h100 --out {tmp}"),
    ("run-bench-burstiness.json: burstiness: must be a positive number", "replay {bad}/data/run-bench-burstiness.json --model llama-3-8b --gpu h100 --out {tmp}"),
    ("plan.json: deployment.model: missing", "replay {bad}/data/served-broken --out {tmp}"),
    ("not a run served on a real runtime", "calibrate --observed {bad}/data/served-model --out {tmp}"),
    ("up to 100000000", "calibrate --observed {bad}/data/silicon-huge-isl.csv --only engines --out {tmp}"),
    ("silicon-zero-clients.csv:2: silicon_data_source: silicon_concurrency: expected a positive integer", "calibrate --observed {bad}/data/silicon-zero-clients.csv --only engines --out {tmp}"),
    ("--gpu-file", "replay {bad}/data/run-ok.csv --model llama-3-8b --gpu-file {tmp}/missing.toml --out {tmp}"),
    ("--time-scale: must be a positive number", "serve {bad}/ok.toml --time-scale 0 --port 0 --out {tmp}/s"),
    ("--time-scale: only the cost model", "serve {bad}/ok.toml --time-scale 2 --backend cpu --port 0 --out {tmp}/s"),
    ("--max-concurrency", "serve {bad}/ok.toml --max-concurrency 0 --out {tmp}/s"),
    ("--variant: no variant named `nope`", "serve {bad}/ok.toml --variant nope --port 0 --out {tmp}/s"),
    ("--gpu/--max-model-len", "serve {bad}/ok.toml --gpu a100-80gb --out {tmp}/s"),
    ("missing.gguf: no such file", "serve {tmp}/missing.gguf --out {tmp}/s"),
    ("not-gguf.gguf", "serve {bad}/data/not-gguf.gguf --port 0 --out {tmp}/s"),
]

GPU_OK = {"name": '"g"', "memory_gib": "80", "bf16_tflops": "989", "fp32_tflops": "67",
          "memory_bandwidth_gbs": "3350", "interconnect_gbs": "450", "pcie_gbs": "64"}


def gpu_file(**change):
    g = dict(GPU_OK); g.update(change)
    return "".join(f"{k} = {v}\n" for k, v in g.items() if v is not None)


LLAMA = '{"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000'


def gguf(meta, tensors=(), magic=b"GGUF", truncate=0):
    """A GGUF v3 file with these metadata (key -> ('u32'|'str', value)) and tensor infos
    (name, dims), no tensor data."""
    offsets, data_len = {}, 0
    for name, dims in tensors:
        n = 4
        for d in dims:
            n *= d
        offsets[name] = data_len
        data_len += (n + 31) // 32 * 32
    b = bytearray(magic)
    b += struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, (t, v) in meta.items():
        kb = k.encode(); b += struct.pack("<Q", len(kb)) + kb
        if t == "u32":
            b += struct.pack("<II", 4, v)
        else:
            vb = v.encode(); b += struct.pack("<IQ", 8, len(vb)) + vb
    for name, dims in tensors:
        nb = name.encode(); b += struct.pack("<Q", len(nb)) + nb
        b += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        b += struct.pack("<IQ", 0, offsets[name])  # f32
    while len(b) % 32:
        b += b"\0"
    b += bytes(data_len)
    if truncate:
        b = b[:truncate]
    return bytes(b)


def llama_meta(**change):
    meta = {"general.architecture": ("str", "llama"), "llama.block_count": ("u32", 2),
            "llama.embedding_length": ("u32", 64), "llama.attention.head_count": ("u32", 4),
            "llama.attention.head_count_kv": ("u32", 2), "llama.feed_forward_length": ("u32", 128),
            "llama.vocab_size": ("u32", 100)}
    for k, v in change.items():
        key = k.replace("__", ".")
        if v is None:
            meta.pop(key, None)
        else:
            meta[key] = v
    return meta


DATA_FILES = {
    "mamba.json": '{"model_type": "mamba", "d_model": 2560, "n_layer": 64, "vocab_size": 50280}\n',
    "bert.json": '{"architectures": ["BertForMaskedLM"], "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12, "intermediate_size": 3072, "vocab_size": 30522}\n',
    "kv0.json": LLAMA + ', "num_key_value_heads": 0}\n',
    "maxpos0.json": LLAMA + ', "max_position_embeddings": 0}\n',
    "heads-huge.json": '{"hidden_size": 4096, "num_attention_heads": 67108864, "head_dim": 64, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000}\n',
    "not-json.json": "hidden_size: 4096\n",
    "no-hidden.json": '{"num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000}\n',
    "layer-type-unknown.json": '{"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 2, "intermediate_size": 11008, "vocab_size": 32000, "layer_types": ["full_attention", "mamba"]}\n',
    "experts-per-token.json": LLAMA + ', "num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 1408}\n',
    "mla-partial.json": LLAMA + ', "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1408, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128}\n',
    "head-indivisible.json": '{"hidden_size": 4000, "num_attention_heads": 48, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000}\n',
    "layers0.json": '{"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 0, "intermediate_size": 11008, "vocab_size": 32000}\n',
    "vocab-string.json": '{"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": "32k"}\n',
    "phi.json": '{"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 10240, "vocab_size": 51200}\n',
    "gpu-memory-huge.toml": gpu_file(memory_gib="1e300"),
    "gpu-negative.toml": gpu_file(bf16_tflops="-989"),
    "gpu-unknown-key.toml": gpu_file(cores="16896"),
    "gpu-allreduce.toml": gpu_file(allreduce_eff="2.0"),
    "gpu-missing-key.toml": gpu_file(pcie_gbs=None),
    "gpu-nan.toml": gpu_file(memory_bandwidth_gbs="nan"),
    "azure-ok.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,10\n2023-11-16 18:17:04.0000000,200,20\n",
    "azure-bad-count.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,10\n2023-11-16 18:17:04.0000000,lots,20\n",
    "azure-negative.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,-10\n",
    "azure-decreasing.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.0000000,100,10\n2023-11-16 18:17:03.0000000,100,10\n",
    "azure-bad-time.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:17,100,10\n",
    "azure-missing-column.csv": "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,100\n",
    "azure-header-only.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n",
    "azure-empty.csv": "",
    "azure-unterminated-quote.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,\"100,10\n" + "2023-11-16 18:17:04.0000000,100,10\n" * 2000,
    "azure-missing-value.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,,10\n",
    "azure-huge-count.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,1e20,10\n",
    "vidur-negative.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\n-1.0,100,10\n",
    "vidur-decreasing.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\n2.0,100,10\n1.0,100,10\n",
    "vidur-nan.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\nNaN,100,10\n",
    "mooncake-bad-json.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n{"timestamp": 1, oops}\n',
    "mooncake-decreasing.jsonl": '{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n',
    "mooncake-capacity.jsonl": '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1]}\n',
    "mooncake-huge.jsonl": '{"timestamp": 0, "input_length": 1000000000, "output_length": 5, "hash_ids": [1]}\n',
    "mooncake-missing-field.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
    "mooncake-empty.jsonl": "",
    "lengths.csv": "n\n10\n20\n",
    "lengths-bad.csv": "n\n10\nten\n",
    "calibration-bad.toml": "[cost]\ngemm_memory_eff = 7.0\n",
    "calibration-fit-error.toml": "[cost]\nstep_overhead_us = 100.0\n[fit]\nsource = \"test\"\nfolds = [{ step_overhead_us = 100.0 }, { step_overhead_us = 300.0 }]\nttft_error_50 = [-0.1, 0.1]\nttft_error_90 = [-1.5, 0.2]\ntpot_error_50 = [-0.1, 0.1]\ntpot_error_90 = [-0.2, 0.2]\n",
    "calibration-fit-fold.toml": "[cost]\nstep_overhead_us = 100.0\n[fit]\nsource = \"test\"\nfolds = [{ step_overhead_us = 100.0 }, { step_overhead = 300.0 }]\nttft_error_50 = [-0.1, 0.1]\nttft_error_90 = [-0.2, 0.2]\ntpot_error_50 = [-0.1, 0.1]\ntpot_error_90 = [-0.2, 0.2]\n",
    "calibration-fit-key.toml": "[cost]\nstep_overhead_us = 100.0\n[fit]\nsource = \"test\"\nfolds = [{ step_overhead_us = 100.0 }, { step_overhead_us = 300.0 }]\nttft_error_50 = [-0.1, 0.1]\nttft_error_90 = [-0.2, 0.2]\ntpot_error_50 = [-0.1, 0.1]\ntpot_error_90 = [-0.2, 0.2]\nfit_quality = 1\n",
    "steps.csv": "batch,ctx,tokens,ms\n1,512,0,6.8\n",
    "steps-bad.csv": "batch,ctx,tokens,ms\n1,512,0,fast\n",
    "gemm-bad-gpu.csv": "gpu,m,k,n,ms\ntpu-v5,64,4096,4096,0.1\n",
    # An aiconfigurator row whose prompt length would overflow the engine's token budgets.
    "silicon-huge-isl.csv": 'id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,decode_moe_tp_size,decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms\nqwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_trtllm_agg_1024x128_c8_tp1_epnone_1,source_file=/Users/harrli/projects/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/Qwen_Qwen3-32B.csv; silicon_concurrency=8,trtllm,1.0.0rc3,Qwen/Qwen3-32B,h100_sxm,fp8,agg,4294967295,128,fp8,fp8,8,1,1,,1,1,,,,,,,,,,,,,,,271.98266371874996,18.6519943125\n',
    "silicon-zero-clients.csv": 'id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,decode_moe_tp_size,decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms\nqwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_trtllm_agg_1024x128_c8_tp1_epnone_1,source_file=/Users/harrli/projects/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/Qwen_Qwen3-32B.csv; silicon_concurrency=0,trtllm,1.0.0rc3,Qwen/Qwen3-32B,h100_sxm,fp8,agg,1024,128,fp8,fp8,8,1,1,,1,1,,,,,,,,,,,,,,,271.98266371874996,18.6519943125\n',
    "run-ok.csv": "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n0,100,10,20,120\n",
    "run-bad.csv": "send_s,prompt_len,output_len,ttft_ms,e2el_ms\n1,100,10,20,120\n0.5,100,10,20,120\n",
    "run-bench-burstiness.json": '{"request_rate": 2.0, "burstiness": -1.0, "input_lens": [100], "output_lens": [10], "ttfts": [0.02], "itls": [[0.01]], "errors": [""]}',
    "run-bench-old.json": '{"input_lens": [100], "output_lens": [10], "ttfts": [0.02], "itls": [[0.01]], "errors": [""]}',
    # Folders `sim serve` writes: one served by the cost model (nothing measured to fit),
    # one whose plan.json lacks the deployment.
    "served-model/requests.csv": "request_id,class,arrival_s,first_scheduled_s,first_token_s,finish_s,prompt_len,output_len,generated_tokens,max_tokens,cached_tokens,num_preemptions,ttft_ms,tpot_ms,e2el_ms,queue_ms,finish_reason\n",
    "served-model/plan.json": "{}\n",
    "served-model/served.json": '{"backend": "model"}\n',
    "served-broken/requests.csv": "request_id,class,arrival_s,first_scheduled_s,first_token_s,finish_s,prompt_len,output_len,generated_tokens,max_tokens,cached_tokens,num_preemptions,ttft_ms,tpot_ms,e2el_ms,queue_ms,finish_reason\n",
    "served-broken/plan.json": '{"engine": {}}\n',
}
GGUF_FILES = {
    "not-gguf.gguf": b"this is not a GGUF file at all\n",
    "truncated.gguf": gguf(llama_meta(), truncate=40),
    "block-count-huge.gguf": gguf(llama_meta(llama__block_count=("u32", 2**31)), [("token_embd.weight", [64, 100]), ("output_norm.weight", [64])]),
    "embedding0.gguf": gguf(llama_meta(llama__embedding_length=("u32", 0))),
    "heads9-kv2.gguf": gguf(llama_meta(**{"llama__attention__head_count": ("u32", 9), "llama__attention__head_count_kv": ("u32", 2), "llama__embedding_length": ("u32", 72)})),
    "arch-mamba.gguf": gguf(llama_meta(general__architecture=("str", "mamba"))),
    "vocab0.gguf": gguf(llama_meta(llama__vocab_size=("u32", 0))),
    "heads0.gguf": gguf(llama_meta(llama__attention__head_count=("u32", 0))),
}

if __name__ == "__main__":
    for d in (SC, DATA):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    names = set()
    for name, expect, scenario, text, command in CASES:
        assert name not in names, name
        names.add(name)
        body = text if text is not None else render(scenario)
        head = f"# expect: {expect}\n" + (f"# command: {command}\n" if command != "validate" else "")
        with open(os.path.join(SC, name + ".toml"), "w") as f:
            f.write(head + body)
    for f, text in DATA_FILES.items():
        os.makedirs(os.path.dirname(os.path.join(DATA, f)), exist_ok=True)
        with open(os.path.join(DATA, f), "w") as fh:
            fh.write(text)
    for f, data in GGUF_FILES.items():
        with open(os.path.join(DATA, f), "wb") as fh:
            fh.write(data)
    profile_files(os.path.join(DATA, "profiles"))
    with open(os.path.join(DATA, "azure-invalid-utf8.csv"), "wb") as fh:
        fh.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,1\xff\xfe0,10\n")
    with open(os.path.join(HERE, "ok.toml"), "w") as f:
        f.write(render(BASE))
    with open(os.path.join(HERE, "cli.txt"), "w") as f:
        f.write("# <text the one-line error must contain> | <arguments> ({tmp}: a fresh folder, {bad}: this folder)\n")
        for expect, args in CLI:
            f.write(f"{expect} | {args}\n")
    print(f"{len(CASES)} scenario cases, {len(CLI)} CLI cases")
