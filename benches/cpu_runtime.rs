//! The CPU runtime on the real SmolLM2-135M-Instruct Q4_1 (issue 6's speed figures): a
//! 128-token prefill and decode steps of 1, 8, 16 and 32 sequences at context 128, the
//! same plans as `sim cpu-bench`. The model comes from `SIM_SMOLLM2_GGUF` or
//! `~/.cache/sim-models/SmolLM2-135M-Instruct.Q4_1.gguf` (`.ci/run` fetches it); without
//! it the bench says so and times nothing.

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kernels::cpu::CpuRuntime;
use kernels::gguf::Gguf;

fn model() -> Option<PathBuf> {
    let p = std::env::var_os("SIM_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/sim-models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        })?;
    p.exists().then_some(p)
}

fn bench(c: &mut Criterion) {
    let Some(path) = model() else {
        eprintln!("cpu_runtime: SmolLM2 GGUF not found (set SIM_SMOLLM2_GGUF); nothing timed");
        return;
    };
    let g = Gguf::open(&path).expect("SmolLM2 GGUF");
    // 32 sequences of 129 tokens in 16-token blocks.
    let mut rt = CpuRuntime::from_gguf(&g, 16, 32 * 9).expect("runtime");
    let plans = rt.bench_plans(128).expect("plans");
    let mut group = c.benchmark_group("cpu_runtime_smollm2");
    group.sample_size(20);
    for (name, tokens, plan) in &plans {
        group.throughput(Throughput::Elements(u64::from(*tokens)));
        group.bench_function(name.as_str(), |b| {
            b.iter(|| rt.forward(plan).expect("step"));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
