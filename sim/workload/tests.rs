//! Unit tests of the workload sources, samplers and readers.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use engine::request::{Request, NANOS_PER_SEC};
use serde::Deserialize;

use super::csv_file::load_counts;
use super::lengths::LenSampler;
use super::streams::stream;
use super::*;

const AZURE_CONV: &str = "/work/shared/data/traces/AzureLLMInferenceTrace_conv_2023.csv";
const SHAREGPT: &str =
    "/work/shared/data/traces/etalon_sharegpt_8k_filtered_stats_llama2_tokenizer.csv";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    workload: WorkloadConfig,
}

fn parse(toml_text: &str) -> Result<WorkloadConfig, toml::de::Error> {
    toml::from_str::<Scenario>(toml_text).map(|s| s.workload)
}

fn fixed_class(name: &str, weight: f64) -> ClassConfig {
    ClassConfig {
        name: name.to_string(),
        weight,
        prompt: Some(LengthDist::Fixed { value: 10 }),
        output: Some(LengthDist::Fixed { value: 20 }),
        lengths: None,
        priority: 0,
        shared_prefix: None,
        prompt_pool: None,
        acceptance: None,
        mean_acceptance_length: None,
        n: 1,
        beam_search: false,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    }
}

fn synthetic(arrival: ArrivalConfig, n: u64, classes: Vec<ClassConfig>) -> WorkloadConfig {
    WorkloadConfig {
        num_requests: Some(n),
        duration_s: None,
        arrival: Some(arrival),
        trace: None,
        classes,
        multi_turn: None,
        generated_shared_prefix: None,
        max_in_flight: None,
        think_time_s: None,
    }
}

fn collect(cfg: &WorkloadConfig, base: &Path, seed: u64) -> Vec<Request> {
    Workload::open(cfg, base, seed)
        .expect("open")
        .collect::<Result<Vec<_>, _>>()
        .expect("requests")
}

fn gaps_s(reqs: &[Request]) -> Vec<f64> {
    let mut prev = 0u64;
    reqs.iter()
        .map(|r| {
            let g = (r.arrival - prev) as f64 / NANOS_PER_SEC;
            prev = r.arrival;
            g
        })
        .collect()
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = File::create(&path).expect("create");
    f.write_all(text.as_bytes()).expect("write");
    path
}

#[test]
fn parses_full_toml() {
    let cfg = parse(
        r#"
        [workload]
        num_requests = 2000
        duration_s = 600.0
        arrival = { process = "gamma", rate = 10, burstiness = 0.5 }
        [[workload.class]]
        name = "chat"
        weight = 3.0
        prompt = { dist = "lognormal", mean = 200.0, std = 150.0, min = 8, max = 2048 }
        output = { dist = "fixed", value = 256 }
        [[workload.class]]
        name = "batch"
        prompt = { dist = "uniform", min = 1, max = 100 }
        output = { dist = "normal", mean = 50.0, std = 5.0 }
        [[workload.class]]
        name = "joint"
        lengths = { path = "x.csv", prompt_column = "a", output_column = "b" }
        "#,
    )
    .expect("parse");
    assert_eq!(cfg.num_requests, Some(2000));
    assert_eq!(
        cfg.arrival,
        Some(ArrivalConfig::Gamma {
            rate: 10.0,
            burstiness: 0.5
        })
    );
    assert_eq!(cfg.classes.len(), 3);
    assert_eq!(cfg.classes[1].weight, 1.0);
    assert_eq!(
        cfg.classes[0].prompt,
        Some(LengthDist::LogNormal {
            mean: 200.0,
            std: 150.0,
            min: Some(8),
            max: Some(2048)
        })
    );
    cfg.validate().expect("valid");
    // Round trip through TOML.
    let text = toml::to_string(&cfg).expect("serialize");
    let back: WorkloadConfig = toml::from_str(&text).expect("reparse");
    assert_eq!(back, cfg);

    let cfg = parse(
        r#"
        [workload]
        trace = { format = "azure", path = "traces/x.csv" }
        arrival = { process = "all-at-once" }
        "#,
    )
    .expect("parse");
    assert_eq!(cfg.trace.as_ref().map(|t| t.time_scale), Some(1.0));
    assert!(cfg.validate().is_err());
}

#[test]
fn unknown_keys_are_rejected() {
    let cases = [
        "[workload]\nnum_requests = 1\nbogus = 1\n",
        "[workload]\narrival = { process = \"poisson\", rate = 1.0, burstiness = 2.0 }\n",
        "[workload]\narrival = { process = \"all-at-once\", rate = 1.0 }\n",
        "[workload]\narrival = { process = \"weibull\", rate = 1.0 }\n",
        "[workload]\ntrace = { format = \"azure\", path = \"x\", speed = 2 }\n",
        "[workload]\ntrace = { format = \"sharegpt\", path = \"x\" }\n",
        "[[workload.class]]\nname = \"a\"\ncolour = \"red\"\n",
        "[[workload.class]]\nname = \"a\"\nprompt = { dist = \"fixed\", value = 3, min = 1 }\n",
        "[[workload.class]]\nname = \"a\"\nlengths = { path = \"x\", prompt_column = \"a\", output_column = \"b\", c = 1 }\n",
    ];
    for case in cases {
        let err = parse(case).expect_err(case);
        let msg = err.to_string();
        assert!(
            msg.contains("unknown") || msg.contains("variant"),
            "{case}: {msg}"
        );
    }
}

#[test]
fn sampling_parameters_reach_requests_with_a_seed_per_request() {
    let mut class = fixed_class("hot", 1.0);
    class.temperature = 0.8;
    class.top_k = 40;
    class.top_p = 0.95;
    let cfg = synthetic(ArrivalConfig::Poisson { rate: 5.0 }, 4, vec![class]);
    let reqs: Vec<Request> = Workload::open(&cfg, Path::new("."), 9)
        .expect("workload")
        .map(|r| r.expect("request"))
        .collect();
    assert_eq!(reqs.len(), 4);
    for r in &reqs {
        assert_eq!(
            (r.sampling.temperature, r.sampling.top_k, r.sampling.top_p),
            (0.8, 40, 0.95)
        );
    }
    // Seeds differ per request and follow the scenario seed.
    assert_ne!(reqs[0].sampling.seed, reqs[1].sampling.seed);
    let again: Vec<u64> = Workload::open(&cfg, Path::new("."), 9)
        .expect("workload")
        .map(|r| r.expect("request").sampling.seed)
        .collect();
    assert_eq!(
        again,
        reqs.iter().map(|r| r.sampling.seed).collect::<Vec<_>>()
    );
    let other = Workload::open(&cfg, Path::new("."), 10)
        .expect("workload")
        .map(|r| r.expect("request").sampling.seed)
        .next();
    assert_ne!(other, Some(reqs[0].sampling.seed));
    // The uniform numbers: in [0, 1), a function of (seed, seq, position, sample).
    let sp = reqs[0].sampling;
    let u = sp.uniform(3, 17, 0);
    assert!((0.0..1.0).contains(&u));
    assert_eq!(u, sp.uniform(3, 17, 0));
    assert_ne!(u, sp.uniform(3, 17, 1));
    assert_ne!(u, sp.uniform(4, 17, 0));
    assert!(!sp.is_greedy());
    let mean = (0..10_000)
        .map(|p| f64::from(sp.uniform(1, p, 0)))
        .sum::<f64>()
        / 1e4;
    assert!((mean - 0.5).abs() < 0.01, "{mean}");
}

#[test]
fn validation_names_keys() {
    let check = |cfg: &WorkloadConfig, key: &str| {
        let err = cfg.validate().expect_err(key).to_string();
        assert!(err.starts_with(key), "expected {key}, got {err}");
    };
    let mut cfg = synthetic(
        ArrivalConfig::Poisson { rate: -3.0 },
        10,
        vec![fixed_class("a", 1.0)],
    );
    assert_eq!(
        cfg.validate().expect_err("rate").to_string(),
        "workload.arrival.rate: must be a positive number, got -3"
    );
    cfg.arrival = Some(ArrivalConfig::Poisson { rate: f64::NAN });
    check(&cfg, "workload.arrival.rate");
    cfg.arrival = Some(ArrivalConfig::Gamma {
        rate: 1.0,
        burstiness: 0.0,
    });
    check(&cfg, "workload.arrival.burstiness");
    cfg.arrival = Some(ArrivalConfig::Poisson { rate: 1.0 });
    cfg.classes[0].weight = 0.0;
    check(&cfg, "workload.class[0].weight");
    cfg.classes[0].weight = 1.0;
    cfg.classes[0].prompt = Some(LengthDist::Uniform { min: 5, max: 4 });
    check(&cfg, "workload.class[0].prompt.min");
    cfg.classes[0].prompt = Some(LengthDist::LogNormal {
        mean: 10.0,
        std: -1.0,
        min: None,
        max: None,
    });
    check(&cfg, "workload.class[0].prompt.std");
    cfg.classes[0].prompt = Some(LengthDist::Fixed { value: 0 });
    check(&cfg, "workload.class[0].prompt.value");
    cfg.classes[0].prompt = Some(LengthDist::Fixed { value: 10 });
    cfg.classes[0].temperature = -0.5;
    check(&cfg, "workload.class[0].temperature");
    cfg.classes[0].temperature = 0.7;
    cfg.classes[0].top_p = 0.0;
    check(&cfg, "workload.class[0].top_p");
    cfg.classes[0].top_p = 1.0;
    assert!(cfg.validate().is_ok());
    cfg.classes[0].prompt = None;
    check(&cfg, "workload.class[0].prompt");
    cfg.classes = vec![fixed_class("a", 1.0), fixed_class("a", 1.0)];
    check(&cfg, "workload.class[1].name");
    cfg.classes.clear();
    check(&cfg, "workload.class");
    cfg.classes = vec![fixed_class("a", 1.0)];
    cfg.num_requests = None;
    check(&cfg, "workload.num_requests");
    cfg.duration_s = Some(10.0);
    cfg.validate().expect("duration alone is enough");
    cfg.arrival = Some(ArrivalConfig::AllAtOnce {});
    check(&cfg, "workload.num_requests");
    cfg.trace = Some(TraceConfig {
        format: TraceFormat::Azure,
        path: "x.csv".into(),
        time_scale: 1.0,
    });
    check(&cfg, "workload.trace");
    cfg.arrival = None;
    check(&cfg, "workload.class");
    cfg.classes.clear();
    cfg.validate().expect("trace alone");
    if let Some(t) = cfg.trace.as_mut() {
        t.time_scale = 0.0;
    }
    check(&cfg, "workload.trace.time_scale");
    cfg.trace = None;
    check(&cfg, "workload.arrival");
}

#[test]
fn poisson_mean_inter_arrival() {
    let rate = 10.0;
    let n = 20_000;
    let cfg = synthetic(
        ArrivalConfig::Poisson { rate },
        n,
        vec![fixed_class("a", 1.0)],
    );
    let reqs = collect(&cfg, Path::new("."), 7);
    assert_eq!(reqs.len() as u64, n);
    let (mean, std) = mean_std(&gaps_s(&reqs));
    let se = (1.0 / rate) / (n as f64).sqrt();
    assert!((mean - 1.0 / rate).abs() < 3.0 * se, "mean {mean}");
    assert!((std * rate - 1.0).abs() < 0.05, "cv {}", std * rate);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.id, i as u64);
        assert_eq!((r.prompt_len, r.max_tokens, r.class), (10, 20, 0));
        assert!(r.ignore_eos && r.prompt_tokens.is_empty() && r.priority == 0);
    }
    assert!(reqs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
}

#[test]
fn gamma_burstiness_sets_cv() {
    let rate = 10.0;
    let b = 0.25;
    let cfg = synthetic(
        ArrivalConfig::Gamma {
            rate,
            burstiness: b,
        },
        50_000,
        vec![fixed_class("a", 1.0)],
    );
    let reqs = collect(&cfg, Path::new("."), 3);
    let (mean, std) = mean_std(&gaps_s(&reqs));
    let cv = std / mean;
    let expected = 1.0 / f64::sqrt(b);
    assert!((cv - expected).abs() < 0.1 * expected, "cv {cv}");
    assert!((mean * rate - 1.0).abs() < 0.05, "mean {mean}");
}

#[test]
fn duration_stops_arrivals_and_all_at_once() {
    let mut cfg = synthetic(
        ArrivalConfig::Poisson { rate: 100.0 },
        1,
        vec![fixed_class("a", 1.0)],
    );
    cfg.num_requests = None;
    cfg.duration_s = Some(10.0);
    let w = Workload::open(&cfg, Path::new("."), 1).expect("open");
    assert_eq!(w.expected_len(), None);
    let reqs = w.collect::<Result<Vec<_>, _>>().expect("requests");
    assert!((900..1100).contains(&reqs.len()), "{}", reqs.len());
    assert!(reqs.iter().all(|r| r.arrival <= 10_000_000_000));

    let cfg = synthetic(ArrivalConfig::AllAtOnce {}, 50, vec![fixed_class("a", 1.0)]);
    let w = Workload::open(&cfg, Path::new("."), 1).expect("open");
    assert_eq!(w.expected_len(), Some(50));
    let reqs = w.collect::<Result<Vec<_>, _>>().expect("requests");
    assert_eq!(reqs.len(), 50);
    assert!(reqs.iter().all(|r| r.arrival == 0));
}

#[test]
fn lognormal_mean_and_std() {
    let dist = LengthDist::LogNormal {
        mean: 200.0,
        std: 150.0,
        min: None,
        max: None,
    };
    let sampler = LenSampler::new(&dist, Path::new("."), "k").expect("sampler");
    let mut rng = stream(11, 5);
    let xs: Vec<f64> = (0..50_000)
        .map(|_| f64::from(sampler.sample(&mut rng)))
        .collect();
    let (mean, std) = mean_std(&xs);
    assert!((mean - 200.0).abs() < 0.02 * 200.0, "mean {mean}");
    assert!((std - 150.0).abs() < 0.05 * 150.0, "std {std}");

    let clamped = LenSampler::new(
        &LengthDist::LogNormal {
            mean: 200.0,
            std: 150.0,
            min: Some(8),
            max: Some(300),
        },
        Path::new("."),
        "k",
    )
    .expect("sampler");
    assert!((0..10_000)
        .map(|_| clamped.sample(&mut rng))
        .all(|v| (8..=300).contains(&v)));
    // A normal far below zero is still at least 1.
    let low = LenSampler::new(
        &LengthDist::Normal {
            mean: -100.0,
            std: 1.0,
            min: None,
            max: None,
        },
        Path::new("."),
        "k",
    )
    .expect("sampler");
    assert!((0..100).all(|_| low.sample(&mut rng) == 1));
    let uni = LenSampler::new(&LengthDist::Uniform { min: 3, max: 5 }, Path::new("."), "k")
        .expect("sampler");
    let vs: Vec<u32> = (0..1000).map(|_| uni.sample(&mut rng)).collect();
    assert!(vs.iter().all(|v| (3..=5).contains(v)));
    assert!([3, 4, 5].iter().all(|x| vs.contains(x)));
}

#[test]
fn class_weights_proportions() {
    let n = 30_000u64;
    let weights = [3.0, 1.0, 0.5];
    let classes = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| fixed_class(&format!("c{i}"), w))
        .collect();
    let cfg = synthetic(ArrivalConfig::Poisson { rate: 5.0 }, n, classes);
    let w = Workload::open(&cfg, Path::new("."), 99).expect("open");
    assert_eq!(w.class_names(), vec!["c0", "c1", "c2"]);
    let reqs = w.collect::<Result<Vec<_>, _>>().expect("requests");
    let total: f64 = weights.iter().sum();
    for (i, &wt) in weights.iter().enumerate() {
        let p = wt / total;
        let count = reqs.iter().filter(|r| usize::from(r.class) == i).count() as f64;
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (count - n as f64 * p).abs() < 3.0 * sigma,
            "class {i}: {count} vs {}",
            n as f64 * p
        );
    }
}

fn mixed_cfg() -> WorkloadConfig {
    synthetic(
        ArrivalConfig::Gamma {
            rate: 4.0,
            burstiness: 0.5,
        },
        1000,
        vec![
            ClassConfig {
                name: "chat".into(),
                weight: 2.0,
                prompt: Some(LengthDist::LogNormal {
                    mean: 200.0,
                    std: 150.0,
                    min: Some(8),
                    max: Some(2048),
                }),
                output: Some(LengthDist::Uniform { min: 1, max: 500 }),
                lengths: None,
                priority: 0,
                shared_prefix: None,
                prompt_pool: None,
                acceptance: None,
                mean_acceptance_length: None,
                n: 1,
                beam_search: false,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            },
            ClassConfig {
                name: "code".into(),
                weight: 1.0,
                prompt: Some(LengthDist::Normal {
                    mean: 1000.0,
                    std: 300.0,
                    min: None,
                    max: None,
                }),
                output: Some(LengthDist::Fixed { value: 64 }),
                lengths: None,
                priority: 0,
                shared_prefix: None,
                prompt_pool: None,
                acceptance: None,
                mean_acceptance_length: None,
                n: 1,
                beam_search: false,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            },
        ],
    )
}

#[test]
fn determinism() {
    let cfg = mixed_cfg();
    let a = collect(&cfg, Path::new("."), 42);
    let b = collect(&cfg, Path::new("."), 42);
    assert_eq!(a.len(), 1000);
    assert_eq!(a, b);
    let c = collect(&cfg, Path::new("."), 43);
    assert_ne!(a, c);
    assert_ne!(
        a.iter().map(|r| r.arrival).collect::<Vec<_>>(),
        c.iter().map(|r| r.arrival).collect::<Vec<_>>()
    );
    // Streams are independent: changing one class's distribution leaves arrivals,
    // class choices and the other class's lengths unchanged.
    let mut cfg2 = cfg.clone();
    cfg2.classes[1].prompt = Some(LengthDist::Uniform { min: 1, max: 9 });
    let d = collect(&cfg2, Path::new("."), 42);
    for (x, y) in a.iter().zip(&d) {
        assert_eq!((x.arrival, x.class), (y.arrival, y.class));
        if x.class == 0 {
            assert_eq!(x, y);
        }
    }
}

#[test]
fn azure_inline_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_file(
        dir.path(),
        "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:17:03.9799600,4808,10\n\
         2023-11-16 18:17:04.0319600,3180,8\n\
         2023-11-16 18:17:04.0319600,100,0\n\
         2023-11-16 18:17:05.5,7,1\n",
    );
    let cfg = WorkloadConfig {
        num_requests: None,
        duration_s: None,
        arrival: None,
        trace: Some(TraceConfig {
            format: TraceFormat::Azure,
            path: "azure.csv".into(),
            time_scale: 1.0,
        }),
        classes: vec![],
        multi_turn: None,
        generated_shared_prefix: None,
        max_in_flight: None,
        think_time_s: None,
    };
    let mut w = Workload::open(&cfg, dir.path(), 0).expect("open");
    assert_eq!(w.class_names(), vec!["trace"]);
    assert_eq!(w.expected_len(), Some(4));
    let reqs: Vec<Request> = w.by_ref().collect::<Result<_, _>>().expect("rows");
    assert_eq!(w.clamped_outputs(), 1);
    assert_eq!(w.clamped_prompts(), 0);
    let got: Vec<(u64, u64, u32, u32)> = reqs
        .iter()
        .map(|r| (r.id, r.arrival, r.prompt_len, r.max_tokens))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 0, 4808, 10),
            (1, 52_000_000, 3180, 8),
            (2, 52_000_000, 100, 1),
            (3, 1_520_040_000, 7, 1),
        ]
    );
    // time_scale halves the gaps; caps apply.
    let mut cfg2 = cfg.clone();
    if let Some(t) = cfg2.trace.as_mut() {
        t.time_scale = 0.5;
    }
    cfg2.num_requests = Some(3);
    let w = Workload::open(&cfg2, dir.path(), 0).expect("open");
    assert_eq!(w.expected_len(), Some(3));
    let arr: Vec<u64> = w.map(|r| r.expect("row").arrival).collect();
    assert_eq!(arr, vec![0, 26_000_000, 26_000_000]);
    let mut cfg3 = cfg.clone();
    cfg3.duration_s = Some(1.0);
    assert_eq!(
        Workload::open(&cfg3, dir.path(), 0).expect("open").count(),
        3
    );
}

#[test]
fn trace_errors_name_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:03.9799600,4808,10\n\
             2023-11-16 18:17:04.0319600,abc,8\n",
            3,
            "ContextTokens",
            "abc",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:03.9799600,4808,10\n\
             2023-11-16 18:17:02.0,1,8\n",
            3,
            "TIMESTAMP",
            "2023-11-16 18:17:02.0",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:03.9799600,4808,10\n\
             2023-11-16 18:17:04.0,1,8\n\
             2023-11-16 18:17:05.0,1\n",
            4,
            "GeneratedTokens",
            "",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             yesterday,1,2\n",
            2,
            "TIMESTAMP",
            "yesterday",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:03.9799600,-5,10\n",
            2,
            "ContextTokens",
            "-5",
        ),
    ];
    for (i, (text, line, column, bad)) in cases.into_iter().enumerate() {
        let name = format!("bad{i}.csv");
        write_file(dir.path(), &name, text);
        let cfg = WorkloadConfig {
            num_requests: None,
            duration_s: None,
            arrival: None,
            trace: Some(TraceConfig {
                format: TraceFormat::Azure,
                path: name.clone().into(),
                time_scale: 1.0,
            }),
            classes: vec![],
            multi_turn: None,
            generated_shared_prefix: None,
            max_in_flight: None,
            think_time_s: None,
        };
        let mut w = Workload::open(&cfg, dir.path(), 0).expect("open");
        let err = w
            .by_ref()
            .find_map(|r| r.err())
            .expect("an error")
            .to_string();
        assert!(err.contains(&format!("{name}:{line}:")), "{err}");
        assert!(err.contains(&format!("`{column}`")), "{err}");
        assert!(err.contains(&format!("{bad:?}")), "{err}");
        assert!(w.next().is_none(), "iteration ends after an error");
    }
    // Missing column in the header, and a missing file.
    write_file(dir.path(), "hdr.csv", "TIMESTAMP,ContextTokens\nx,1\n");
    let mut cfg = WorkloadConfig {
        num_requests: None,
        duration_s: None,
        arrival: None,
        trace: Some(TraceConfig {
            format: TraceFormat::Azure,
            path: "hdr.csv".into(),
            time_scale: 1.0,
        }),
        classes: vec![],
        multi_turn: None,
        generated_shared_prefix: None,
        max_in_flight: None,
        think_time_s: None,
    };
    let err = Workload::open(&cfg, dir.path(), 0)
        .expect_err("missing column")
        .to_string();
    assert!(
        err.contains("hdr.csv") && err.contains("GeneratedTokens"),
        "{err}"
    );
    if let Some(t) = cfg.trace.as_mut() {
        t.path = "nope.csv".into();
    }
    let err = Workload::open(&cfg, dir.path(), 0)
        .expect_err("missing file")
        .to_string();
    assert!(err.contains("nope.csv"), "{err}");
}

#[test]
fn vidur_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_file(
        dir.path(),
        "v.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n\
         0.5,100,20,x\n\
         0.75,200,0,y\n\
         2.0,300.0,30,z\n",
    );
    let cfg = WorkloadConfig {
        num_requests: None,
        duration_s: None,
        arrival: None,
        trace: Some(TraceConfig {
            format: TraceFormat::Vidur,
            path: "v.csv".into(),
            time_scale: 2.0,
        }),
        classes: vec![],
        multi_turn: None,
        generated_shared_prefix: None,
        max_in_flight: None,
        think_time_s: None,
    };
    let mut w = Workload::open(&cfg, dir.path(), 0).expect("open");
    let reqs: Vec<Request> = w.by_ref().collect::<Result<_, _>>().expect("rows");
    assert_eq!(w.clamped_outputs(), 1);
    let got: Vec<(u64, u32, u32)> = reqs
        .iter()
        .map(|r| (r.arrival, r.prompt_len, r.max_tokens))
        .collect();
    assert_eq!(
        got,
        vec![
            (1_000_000_000, 100, 20),
            (1_500_000_000, 200, 1),
            (4_000_000_000, 300, 30)
        ]
    );
    write_file(
        dir.path(),
        "v2.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,1,1\n0.5,1,1\n",
    );
    let mut cfg2 = cfg.clone();
    if let Some(t) = cfg2.trace.as_mut() {
        t.path = "v2.csv".into();
    }
    let err = Workload::open(&cfg2, dir.path(), 0)
        .expect("open")
        .find_map(|r| r.err())
        .expect("error")
        .to_string();
    assert!(
        err.contains("v2.csv:3:") && err.contains("arrived_at"),
        "{err}"
    );
}

#[test]
fn real_azure_conv_trace() {
    let path = Path::new(AZURE_CONV);
    if !path.exists() {
        eprintln!("skipping: {AZURE_CONV} not found");
        return;
    }
    let cfg = WorkloadConfig {
        num_requests: None,
        duration_s: None,
        arrival: None,
        trace: Some(TraceConfig {
            format: TraceFormat::Azure,
            path: path.to_path_buf(),
            time_scale: 1.0,
        }),
        classes: vec![],
        multi_turn: None,
        generated_shared_prefix: None,
        max_in_flight: None,
        think_time_s: None,
    };
    let mut w = Workload::open(&cfg, Path::new("/nonexistent-base"), 0).expect("open");
    assert_eq!(w.expected_len(), Some(19_366));
    let mut n = 0u64;
    let mut prev = 0u64;
    for r in w.by_ref() {
        let r = r.expect("row");
        if n == 0 {
            assert_eq!(r.arrival, 0);
        }
        assert_eq!(r.id, n);
        assert!(r.arrival >= prev);
        assert!(r.prompt_len >= 1 && r.max_tokens >= 1);
        prev = r.arrival;
        n += 1;
    }
    assert_eq!(n, 19_366);
    assert!(prev > 0);
}

#[test]
fn empirical_and_joint_lengths() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_file(dir.path(), "lens.csv", "p,o\n10,1\n20,2\n30,0\n");
    let mut cfg = synthetic(
        ArrivalConfig::Poisson { rate: 1.0 },
        2000,
        vec![
            ClassConfig {
                name: "emp".into(),
                weight: 1.0,
                prompt: Some(LengthDist::Empirical {
                    path: "lens.csv".into(),
                    column: "p".into(),
                    min: None,
                    max: Some(25),
                }),
                output: Some(LengthDist::Fixed { value: 5 }),
                lengths: None,
                priority: 0,
                shared_prefix: None,
                prompt_pool: None,
                acceptance: None,
                mean_acceptance_length: None,
                n: 1,
                beam_search: false,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            },
            ClassConfig {
                name: "joint".into(),
                weight: 1.0,
                prompt: None,
                output: None,
                lengths: Some(JointLengths {
                    path: "lens.csv".into(),
                    prompt_column: "p".into(),
                    output_column: "o".into(),
                }),
                priority: 0,
                shared_prefix: None,
                prompt_pool: None,
                acceptance: None,
                mean_acceptance_length: None,
                n: 1,
                beam_search: false,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            },
        ],
    );
    let reqs = collect(&cfg, dir.path(), 5);
    let emp: Vec<u32> = reqs
        .iter()
        .filter(|r| r.class == 0)
        .map(|r| r.prompt_len)
        .collect();
    assert!(emp.iter().all(|v| [10, 20, 25].contains(v)));
    assert!([10, 20, 25].iter().all(|v| emp.contains(v)));
    let joint: Vec<(u32, u32)> = reqs
        .iter()
        .filter(|r| r.class == 1)
        .map(|r| (r.prompt_len, r.max_tokens))
        .collect();
    assert!(joint
        .iter()
        .all(|p| [(10, 1), (20, 2), (30, 1)].contains(p)));

    // Missing and empty columns, bad values.
    write_file(dir.path(), "empty.csv", "p,o\n");
    write_file(dir.path(), "bad.csv", "p,o\n1,2\nx,3\n");
    let cases = [
        ("lens.csv", "q", "column `q` not found"),
        ("empty.csv", "p", "has no values"),
        ("bad.csv", "p", "bad.csv:3: column `p`"),
    ];
    for (file, column, expected) in cases {
        cfg.classes[0].prompt = Some(LengthDist::Empirical {
            path: file.into(),
            column: column.into(),
            min: None,
            max: None,
        });
        let err = Workload::open(&cfg, dir.path(), 5)
            .expect_err(expected)
            .to_string();
        assert!(err.contains(file) && err.contains(expected), "{err}");
    }
}

#[test]
fn real_sharegpt_joint_lengths() {
    let path = Path::new(SHAREGPT);
    if !path.exists() {
        eprintln!("skipping: {SHAREGPT} not found");
        return;
    }
    let cfg = synthetic(
        ArrivalConfig::Poisson { rate: 10.0 },
        5000,
        vec![ClassConfig {
            name: "sharegpt".into(),
            weight: 1.0,
            prompt: None,
            output: None,
            lengths: Some(JointLengths {
                path: path.to_path_buf(),
                prompt_column: "num_prefill_tokens".into(),
                output_column: "num_decode_tokens".into(),
            }),
            priority: 0,
            shared_prefix: None,
            prompt_pool: None,
            acceptance: None,
            mean_acceptance_length: None,
            n: 1,
            beam_search: false,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }],
    );
    let reqs = collect(&cfg, Path::new("."), 1);
    assert_eq!(reqs.len(), 5000);
    assert!(reqs.iter().all(|r| r.prompt_len >= 1 && r.max_tokens >= 1));
    let distinct: std::collections::HashSet<u32> = reqs.iter().map(|r| r.prompt_len).collect();
    assert!(distinct.len() > 100);
    // Prompt and output come from the same row: total of the pair must be a row
    // total in the file (checked for the first few).
    let rows = load_counts(path, ["num_prefill_tokens", "num_decode_tokens"]).expect("rows");
    for r in reqs.iter().take(50) {
        assert!(rows
            .iter()
            .any(|[p, o]| (*p).max(1) == r.prompt_len && (*o).max(1) == r.max_tokens));
    }
}

/// A prompt pool's requests repeat its entries token for token: shuffled, every run of
/// `size` requests from a pass's start holds each entry once; in order, request `i` and
/// `i + size` are the same prompt; at random, only the pool's entries appear. Lengths are
/// fixed per entry (drawn from the class's distributions once), and the same seed gives
/// the same requests.
#[test]
fn a_prompt_pool_repeats_its_entries() {
    use std::collections::HashSet;
    let mut class = fixed_class("pool", 1.0);
    class.prompt = Some(LengthDist::Uniform { min: 10, max: 60 });
    class.output = Some(LengthDist::Uniform { min: 1, max: 9 });
    for sampling in [
        PoolSampling::Shuffle,
        PoolSampling::Sequential,
        PoolSampling::Random,
    ] {
        class.prompt_pool = Some(PromptPool { size: 5, sampling });
        let cfg = synthetic(
            ArrivalConfig::Poisson { rate: 5.0 },
            23,
            vec![class.clone()],
        );
        let reqs = collect(&cfg, Path::new("."), 4);
        assert_eq!(reqs.len(), 23);
        let key = |r: &Request| (r.prompt_tokens.clone(), r.max_tokens);
        for r in &reqs {
            assert_eq!(r.prompt_tokens.len() as u32, r.prompt_len, "{sampling:?}");
        }
        let distinct: HashSet<_> = reqs.iter().map(key).collect();
        // Every prompt is one of the five entries, each with its own output length.
        let prompts: HashSet<_> = reqs.iter().map(|r| r.prompt_tokens.clone()).collect();
        assert_eq!(distinct.len(), prompts.len(), "{sampling:?}");
        match sampling {
            PoolSampling::Shuffle => {
                assert_eq!(prompts.len(), 5);
                for pass in reqs.chunks(5).filter(|c| c.len() == 5) {
                    let seen: HashSet<_> = pass.iter().map(key).collect();
                    assert_eq!(seen.len(), 5, "each pass takes every entry once");
                }
            }
            PoolSampling::Sequential => {
                assert_eq!(prompts.len(), 5);
                for (a, b) in reqs.iter().zip(&reqs[5..]) {
                    assert_eq!(key(a), key(b));
                }
            }
            PoolSampling::Random => assert!(prompts.len() <= 5 && prompts.len() >= 2),
        }
        let again = collect(&cfg, Path::new("."), 4);
        assert_eq!(
            again.iter().map(key).collect::<Vec<_>>(),
            reqs.iter().map(key).collect::<Vec<_>>()
        );
    }
    // With a shared prefix, the pool's prompt follows it, and no entry starts like the
    // system prompt.
    class.prompt_pool = Some(PromptPool {
        size: 3,
        sampling: PoolSampling::Shuffle,
    });
    class.shared_prefix = Some(SharedPrefix {
        tokens: 16,
        groups: 1,
    });
    let cfg = synthetic(ArrivalConfig::Poisson { rate: 5.0 }, 9, vec![class]);
    let reqs = collect(&cfg, Path::new("."), 4);
    let own: HashSet<_> = reqs
        .iter()
        .map(|r| r.prompt_tokens[16..].to_vec())
        .collect();
    assert_eq!(own.len(), 3);
    assert!(reqs
        .iter()
        .all(|r| r.prompt_tokens[..16] == reqs[0].prompt_tokens[..16]));
    assert!(own
        .iter()
        .all(|o| o[..] != reqs[0].prompt_tokens[..o.len().min(16)]));
}

/// A pool's size is checked before anything is made, and its keys are the documented ones.
#[test]
fn prompt_pool_errors_name_the_key() {
    let mut class = fixed_class("pool", 1.0);
    for size in [0, MAX_POOL_ENTRIES + 1] {
        class.prompt_pool = Some(PromptPool {
            size,
            sampling: PoolSampling::Shuffle,
        });
        let cfg = synthetic(ArrivalConfig::Poisson { rate: 5.0 }, 3, vec![class.clone()]);
        let err = Workload::open(&cfg, Path::new("."), 1)
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("workload.class[0].prompt_pool.size") && err.contains("4194304"),
            "{err}"
        );
    }
    for (text, expected) in [
        (
            "prompt_pool = { size = 10, sampling = \"fifo\" }",
            "unknown variant `fifo`",
        ),
        (
            "prompt_pool = { size = 10, entries = 4 }",
            "unknown field `entries`",
        ),
    ] {
        let toml_text = format!(
            "[workload]\nnum_requests = 3\narrival = {{ process = \"poisson\", rate = 1.0 }}\n[[workload.class]]\nname = \"c\"\nprompt = {{ dist = \"fixed\", value = 8 }}\noutput = {{ dist = \"fixed\", value = 8 }}\n{text}\n"
        );
        let err = parse(&toml_text).expect_err("refused").to_string();
        assert!(err.contains(expected), "{err}");
    }
}
