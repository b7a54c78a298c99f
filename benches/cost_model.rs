//! Cost-model evaluation per step (on the hot path of every simulated step): the predicted
//! duration of a 256-sequence step, for a decode-only step and a mixed chunked-prefill step,
//! on a dense model and on Mixtral (mixture of experts) under TP2.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use engine::backend::Backend;
use engine::plan::{SeqWork, StepPlan, WorkKind};
use sim::catalog::{find_gpu, find_model, Dtype};
use sim::cost_model::{CostModel, CostModelBackend, CostParams, Deployment};

fn deployment(model: &str, tp: u32) -> Deployment {
    Deployment {
        parallel: Default::default(),
        model: find_model(model).expect("catalog model").clone(),
        gpu: find_gpu("h100-sxm").expect("catalog gpu").clone(),
        tp,
        pp: 1,
        dtype: Dtype::Bf16,
        kv_dtype: Dtype::Bf16,
    }
}

/// 256 sequences: decodes at contexts 100..2660, and (if `chunk`) one 1024-token prefill
/// chunk over 512 cached tokens in their place for the first one.
fn plan(chunk: bool) -> StepPlan {
    let work = (0..256u32)
        .map(|i| {
            let prefill = chunk && i == 0;
            SeqWork {
                seq: u64::from(i),
                kind: if prefill {
                    WorkKind::Prefill
                } else {
                    WorkKind::Decode
                },
                start: if prefill { 512 } else { 100 + 10 * i },
                len: if prefill { 1024 } else { 1 },
                sample: true,
                num_samples: 1,
                block_table: Vec::new(),
                token_ids: Vec::new(),
                sampling: Default::default(),
                drafts: None,
                suppress: Vec::new(),
                suppress_rows: 0,
            }
        })
        .collect();
    StepPlan {
        padding: Default::default(),
        work,
        ..StepPlan::default()
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("cost_model");
    g.throughput(Throughput::Elements(1));
    for (name, model, tp) in [
        ("llama-3-8b", "llama-3-8b", 1),
        ("mixtral-tp2", "mixtral-8x7b", 2),
    ] {
        let mut backend =
            CostModelBackend::new(CostModel::new(deployment(model, tp), CostParams::default()));
        for (kind, p) in [("decode_256", plan(false)), ("mixed_256", plan(true))] {
            g.bench_function(format!("{name}/{kind}"), |b| {
                b.iter(|| {
                    backend
                        .execute(std::hint::black_box(&p))
                        .map(|o| o.duration)
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
