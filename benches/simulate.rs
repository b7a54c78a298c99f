//! Simulator speed: simulated requests per wall second (criterion, `Throughput::Elements`
//! counts requests), for the Azure conv trace replayed at its own rate and a synthetic
//! workload, with both drivers. The million-request run is `sim bench
//! scenarios/synthetic_1m.toml` (too long for criterion's repetitions); see BENCHMARKS.md.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use indicatif::ProgressBar;
use sim::driver::DriverKind;
use sim::run::{run_variant, BackendKind};
use sim::scenario::Scenario;

fn bench_scenario(c: &mut Criterion, path: &str, variant: &str, requests: Option<u64>) {
    let scn = match Scenario::load(Path::new(path), None) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let mut v = scn
        .variants
        .iter()
        .find(|v| v.name == variant)
        .unwrap_or_else(|| panic!("variant {variant}"))
        .clone();
    if requests.is_some() {
        v.config.workload.num_requests = requests;
    }
    let bar = ProgressBar::hidden();
    let n = run_variant(
        &scn,
        &v,
        BackendKind::Model,
        DriverKind::Inline,
        None,
        &bar,
        &|| {},
    )
    .map(|r| r.summary.completed + r.summary.num_rejected)
    .unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group(format!("simulate/{}", scn.name));
    group.throughput(Throughput::Elements(n));
    group.sample_size(10);
    for driver in [DriverKind::Inline, DriverKind::Actors] {
        group.bench_function(format!("{variant}/{driver:?}"), |b| {
            b.iter(|| {
                run_variant(&scn, &v, BackendKind::Model, driver, None, &bar, &|| {})
                    .map(|r| r.stats.steps)
            })
        });
    }
    group.finish();
}

fn simulate(c: &mut Criterion) {
    bench_scenario(c, "scenarios/azure_conv.toml", "chunked", None);
    bench_scenario(c, "scenarios/synthetic_1m.toml", "base", Some(50_000));
}

criterion_group!(benches, simulate);
criterion_main!(benches);
