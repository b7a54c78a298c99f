//! The fleet section of a run's report (variants with a `fleet.json`): the fleet's figures,
//! requests routed and load per replica over time, KV transfer times, and the prefix-cache
//! hit rate by tier (GPU, CPU offload, disk) where a tier exists.

use std::path::Path;

use super::{read_steps, table, VariantData, SIZE};
use crate::error::AnalysisError;
use crate::fleet::{read_fleet_json, FleetSummary, MemberRow};
use crate::plots::{cdf, svg, Chart, Series};

/// Replicas whose load is drawn, at most (a legend of more is unreadable).
const MAX_LOAD_SERIES: usize = 16;

/// What a fleet variant's folder holds beyond a one-engine run's files.
#[derive(Debug, Clone)]
pub struct FleetData {
    /// `fleet.json`.
    pub summary: FleetSummary,
    /// `replicas.csv`.
    pub replicas: Vec<MemberRow>,
    /// Per replica (at most [`MAX_LOAD_SERIES`]): `(time s, running + waiting)`, averaged
    /// to at most 800 points.
    pub load: Vec<(String, Vec<(f64, f64)>)>,
    /// `transfers.csv`'s transfer times, ms.
    pub transfer_ms: Vec<f64>,
}

/// A fleet variant's data from its folder (`None`: not a fleet).
pub fn read_fleet(dir: &Path) -> Result<Option<FleetData>, AnalysisError> {
    let path = dir.join("fleet.json");
    if !path.exists() {
        return Ok(None);
    }
    let summary = read_fleet_json(&path)?;
    let rpath = dir.join("replicas.csv");
    let mut replicas: Vec<MemberRow> = Vec::new();
    let mut r = csv::Reader::from_path(&rpath).map_err(|e| AnalysisError::csv(&rpath, e))?;
    for row in r.deserialize() {
        replicas.push(row.map_err(|e| AnalysisError::csv(&rpath, e))?);
    }
    let mut load = Vec::new();
    for m in replicas.iter().take(MAX_LOAD_SERIES) {
        let steps = dir.join("replicas").join(&m.name).join("steps.csv");
        if !steps.exists() {
            continue;
        }
        let (rows, _) = read_steps(&steps)?;
        load.push((
            m.name.clone(),
            rows.iter().map(|s| (s[0], s[2] + s[3])).collect(),
        ));
    }
    let mut transfer_ms = Vec::new();
    let tpath = dir.join("transfers.csv");
    if tpath.exists() {
        super::csv_columns(&tpath, ["transfer_ms"], |r| transfer_ms.push(r[0]))?;
    }
    Ok(Some(FleetData {
        summary,
        replicas,
        load,
        transfer_ms,
    }))
}

/// The fleet section (empty when no variant is a fleet).
pub fn fleet_section(variants: &[VariantData]) -> String {
    let fleets: Vec<(&str, &FleetData)> = variants
        .iter()
        .filter_map(|v| v.fleet.as_ref().map(|f| (v.name.as_str(), f)))
        .collect();
    let mut b = String::new();
    if !fleets.is_empty() {
        b.push_str("<h2>Fleet</h2>\n");
        let mut header = vec!["".to_string()];
        header.extend(fleets.iter().map(|(n, _)| n.to_string()));
        type Get = fn(&FleetSummary) -> String;
        let rows: [(&str, Get); 9] = [
            ("routing (refresh ms)", |f| {
                format!("{} ({})", f.routing, f.refresh_ms)
            }),
            ("replicas / GPUs", |f| {
                format!("{} / {}", f.replicas, f.gpus)
            }),
            ("goodput per GPU (req/s)", |f| {
                f.request_goodput_per_gpu
                    .map_or("-".into(), |g| format!("{g:.3}"))
            }),
            ("output tok/s per GPU", |f| {
                format!("{:.1}", f.output_throughput_per_gpu)
            }),
            ("$ per hour", |f| {
                f.usd_per_hour.map_or("-".into(), |v| format!("{v:.2}"))
            }),
            ("$ per million output tokens", |f| {
                f.usd_per_million_output_tokens
                    .map_or("-".into(), |v| format!("{v:.3}"))
            }),
            ("routing imbalance (max / mean)", |f| {
                format!("{:.3}", f.routing_imbalance)
            }),
            ("prefix cache hit rate", |f| {
                format!("{:.1}%", 100.0 * f.prefix_cache_hit_rate)
            }),
            ("KV transfers (mean / max ms; mean link wait ms)", |f| {
                if f.kv_transfers == 0 {
                    "-".into()
                } else {
                    format!(
                        "{} ({:.2} / {:.2}; {:.2})",
                        f.kv_transfers,
                        f.mean_kv_transfer_ms,
                        f.max_kv_transfer_ms,
                        f.mean_kv_link_wait_ms
                    )
                }
            }),
        ];
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|(label, get)| {
                let mut r = vec![label.to_string()];
                r.extend(fleets.iter().map(|(_, f)| get(&f.summary)));
                r
            })
            .collect();
        b.push_str(&table(&header, &body));
        b.push_str("<div class=\"plots\">\n");
        for (name, f) in &fleets {
            // Requests routed per replica, as points (replica index, requests).
            let routed = Chart {
                title: format!("{name}: requests per replica"),
                x_label: "replica".into(),
                y_label: "requests routed".into(),
                series: vec![Series {
                    name: "routed".into(),
                    points: f
                        .replicas
                        .iter()
                        .enumerate()
                        .map(|(i, r)| (i as f64, r.routed as f64))
                        .collect(),
                }],
                ..Chart::default()
            };
            b.push_str(&svg(&routed, SIZE));
            let load = Chart {
                title: format!("{name}: load per replica (running + waiting)"),
                x_label: "time (s)".into(),
                y_label: "requests".into(),
                series: f
                    .load
                    .iter()
                    .map(|(r, pts)| Series {
                        name: r.clone(),
                        points: pts.clone(),
                    })
                    .collect(),
                ..Chart::default()
            };
            b.push_str(&svg(&load, SIZE));
        }
        if fleets.iter().any(|(_, f)| !f.transfer_ms.is_empty()) {
            let chart = Chart {
                title: "KV transfer time CDF".into(),
                x_label: "transfer (ms)".into(),
                y_label: "fraction of transfers".into(),
                series: fleets
                    .iter()
                    .filter(|(_, f)| !f.transfer_ms.is_empty())
                    .map(|(n, f)| Series {
                        name: n.to_string(),
                        points: cdf(&f.transfer_ms, 400),
                    })
                    .collect(),
                ..Chart::default()
            };
            b.push_str(&svg(&chart, SIZE));
        }
        b.push_str("</div>\n");
    }
    // Hit rate by tier, for every variant with an offload tier (fleets or not).
    let tiered: Vec<&VariantData> = variants
        .iter()
        .filter(|v| v.summary.offload.is_some())
        .collect();
    if !tiered.is_empty() {
        b.push_str("<h2>Prefix-cache hits by tier</h2>\n");
        let disk = tiered
            .iter()
            .any(|v| v.summary.offload.is_some_and(|o| o.disk.is_some()));
        let mut header: Vec<String> = [
            "variant",
            "GPU hit rate",
            "CPU tier hit rate",
            "tier blocks (held / capacity)",
            "stores",
            "loads",
            "evictions",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if disk {
            header.extend(
                [
                    "disk tier hit rate",
                    "disk blocks (held / capacity)",
                    "disk loads",
                ]
                .map(String::from),
            );
        }
        let rows: Vec<Vec<String>> = tiered
            .iter()
            .filter_map(|v| {
                let o = v.summary.offload?;
                let mut row = vec![
                    v.name.clone(),
                    format!("{:.1}%", 100.0 * o.gpu_hit_rate),
                    format!("{:.1}%", 100.0 * o.cpu_hit_rate),
                    format!("{} / {}", o.blocks_at_end, o.capacity_blocks),
                    o.stores.to_string(),
                    o.loads.to_string(),
                    o.evictions.to_string(),
                ];
                if disk {
                    let d = o.disk.unwrap_or_default();
                    row.extend([
                        format!("{:.1}%", 100.0 * d.hit_rate),
                        format!("{} / {}", d.blocks_at_end, d.capacity_blocks),
                        d.loads.to_string(),
                    ]);
                }
                Some(row)
            })
            .collect();
        b.push_str(&table(&header, &rows));
    }
    b
}
