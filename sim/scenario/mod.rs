//! Scenario files: a base configuration plus `[[variant]]` overrides, all run on the same
//! request stream.
//!
//! ```toml
//! name = "mixed"
//! seed = 42
//! [model]
//! name = "llama-3-8b"
//! dtype = "bf16"
//! [hardware]
//! gpu = "h100-sxm"
//! tp = 1
//! [engine]
//! scheduler = "chunked"
//! [workload]
//! ...
//! [[variant]]
//! name = "static"
//! engine.scheduler = "static"
//! ```
//! Unknown keys anywhere are errors; a variant may override any table but `workload` and
//! `seed` (the request stream is shared by construction), except the client's cap
//! `workload.max_in_flight`.

pub mod cluster;
mod config;
mod resolve;
mod tables;

use std::path::{Path, PathBuf};

use engine::scheduler::SchedulerConfig;

pub use config::{
    DynamicKConfig, EngineConfig, HardwareConfig, ModelConfig, ScenarioConfig, SpecMethod,
    SpeculativeConfig,
};
pub use resolve::acceptance_from;

use crate::cost_model::calibration::uncertainty::FitRecord;
use crate::cost_model::{Deployment, MemoryPlan};
use resolve::resolve;
use tables::{expand_calibration, line_col, merge, set_dotted, sweep_dimensions};

/// An error in a scenario file: one line naming the file and the key or line.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {msg}")]
pub struct ScenarioError {
    /// The scenario file.
    pub file: String,
    /// What is wrong and where.
    pub msg: String,
}

/// One variant, resolved and checked: what a run needs.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Variant name.
    pub name: String,
    /// Its full configuration.
    pub config: ScenarioConfig,
    /// Model on hardware.
    pub deployment: Deployment,
    /// The memory plan.
    pub memory: MemoryPlan,
    /// The scheduler's limits.
    pub scheduler: SchedulerConfig,
    /// Speculative decoding's draft model on the same GPUs (`method = "draft-model"`).
    pub draft: Option<Deployment>,
    /// The calibration file's record of its k-fold fits and held-out errors, when it has
    /// one (`sim run` reports bands from it).
    pub fit: Option<FitRecord>,
    /// Measured operator times the cost model prices steps with (`[cost]
    /// operator_profile`), read once per variant.
    pub profile: Option<std::sync::Arc<crate::cost_model::profiled::ProfiledCosts>>,
    /// The fleet, when the configuration has a `[cluster]`: its pools resolved like
    /// variants (the variant's own deployment is then the scenario's base engine, unused).
    pub fleet: Option<cluster::Fleet>,
}

/// A loaded scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Scenario name.
    pub name: String,
    /// The file it came from.
    pub path: PathBuf,
    /// The folder relative paths are resolved against.
    pub base_dir: PathBuf,
    /// Seed.
    pub seed: u64,
    /// The base configuration.
    pub base: ScenarioConfig,
    /// Variants (the base alone, named `base`, when the file has none).
    pub variants: Vec<Variant>,
    /// The base configuration's calibration record (see [`Variant::fit`]).
    pub fit: Option<FitRecord>,
    /// The `[sweep]` dimensions, in file order: a dotted key and its values (empty: no
    /// sweep).
    pub sweep: Vec<(String, Vec<toml::Value>)>,
    /// The file's table, for re-resolving it at a sweep point.
    raw: toml::Table,
    /// The seed given on the command line, if any.
    seed_override: Option<u64>,
}

impl Scenario {
    /// Checks a modified configuration (e.g. another GPU or rate for capacity planning)
    /// and computes its deployment, memory plan and limits, as for a variant of the file;
    /// a configuration with a `[cluster]` gets its fleet resolved too.
    pub fn resolve_config(
        &self,
        name: &str,
        config: ScenarioConfig,
    ) -> Result<Variant, ScenarioError> {
        let err = |msg: String| ScenarioError {
            file: self.path.display().to_string(),
            msg,
        };
        config.workload.validate().map_err(|e| err(e.to_string()))?;
        let fleet = match &config.cluster {
            Some(_) => {
                // The pools merge their tables over the configuration as a table, as they
                // do over a file's.
                let table = match toml::Value::try_from(&config) {
                    Ok(toml::Value::Table(t)) => t,
                    Ok(_) => return Err(err(format!("{name}: not a table"))),
                    Err(e) => return Err(err(format!("{name}: {e}"))),
                };
                resolve_fleet(&table, &config, &self.base_dir)
                    .map_err(|m| err(format!("{name}: {m}")))?
            }
            None => None,
        };
        let mut v =
            resolve(name, config, &self.base_dir).map_err(|m| err(format!("{name}: {m}")))?;
        v.fleet = fleet;
        Ok(v)
    }
}

impl Scenario {
    /// Reads, parses and checks a scenario file; `seed` overrides the file's seed.
    pub fn load(path: &Path, seed: Option<u64>) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let err = |msg: String| ScenarioError {
            file: file.clone(),
            msg,
        };
        let src = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let raw: toml::Table = toml::from_str(&src).map_err(|e| {
            let msg = e.message().trim().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let (line, col) = line_col(&src, span.start);
                    err(format!("line {line}, column {col}: {msg}"))
                }
                None => err(msg),
            }
        })?;
        Scenario::from_table(path, Some(&src), raw, seed)
    }

    /// A scenario from text, as [`Scenario::load`] reads a file (`path`: the name errors
    /// give, whose folder relative paths start from): what `sim` builds in memory (the
    /// closed-loop checks of `sim validate-model`) loads like a file.
    pub fn from_text(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
        let raw: toml::Table = toml::from_str(text).map_err(|e| ScenarioError {
            file: path.display().to_string(),
            msg: e.message().trim().replace('\n', " "),
        })?;
        Scenario::from_table(path, Some(text), raw, None)
    }

    /// [`Scenario::load`] with a calibration file (`sim run --calibration FILE`): as if
    /// the scenario's `[cost]` had `calibration = FILE`, under its own `[cost]` keys.
    pub fn load_calibrated(
        path: &Path,
        seed: Option<u64>,
        calibration: &Path,
    ) -> Result<Scenario, ScenarioError> {
        let abs = std::path::absolute(calibration).map_err(|e| ScenarioError {
            file: path.display().to_string(),
            msg: format!("--calibration: {e}"),
        })?;
        Scenario::load_with(
            path,
            seed,
            &[(
                "cost.calibration",
                toml::Value::String(abs.display().to_string()),
            )],
        )
    }

    /// [`Scenario::load`] with dotted keys set as if the file had them (`--calibration`,
    /// `sim claims --model`).
    pub fn load_with(
        path: &Path,
        seed: Option<u64>,
        overrides: &[(&str, toml::Value)],
    ) -> Result<Scenario, ScenarioError> {
        let err = |msg: String| ScenarioError {
            file: path.display().to_string(),
            msg,
        };
        let src = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let mut raw: toml::Table = toml::from_str(&src).map_err(|e| err(e.to_string()))?;
        for (key, value) in overrides {
            set_dotted(&mut raw, key, value.clone()).map_err(err)?;
        }
        Scenario::from_table(path, None, raw, seed)
    }

    /// The scenario at one point of its sweep: the file with `overrides` (dotted keys and
    /// values) applied to its base configuration, the variants on top.
    pub fn at_point(&self, overrides: &[(String, toml::Value)]) -> Result<Scenario, ScenarioError> {
        let mut raw = self.raw.clone();
        raw.remove("sweep");
        for (key, value) in overrides {
            set_dotted(&mut raw, key, value.clone()).map_err(|msg| ScenarioError {
                file: self.path.display().to_string(),
                msg: format!("sweep: {msg}"),
            })?;
        }
        let point = overrides
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut s =
            Scenario::from_table(&self.path, None, raw, self.seed_override).map_err(|e| {
                ScenarioError {
                    file: e.file,
                    msg: format!("sweep point ({point}): {}", e.msg),
                }
            })?;
        s.raw = self.raw.clone();
        s.sweep = self.sweep.clone();
        Ok(s)
    }

    /// Parses and checks a scenario table (`src`, the file's text, places parse errors
    /// by line).
    fn from_table(
        path: &Path,
        src: Option<&str>,
        raw: toml::Table,
        seed: Option<u64>,
    ) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let err = |msg: String| ScenarioError {
            file: file.clone(),
            msg,
        };
        let seed_override = seed;
        let file_table = raw.clone();
        let sweep = sweep_dimensions(raw.get("sweep")).map_err(err)?;
        // A parse error placed by line and column, with the key it concerns when serde can
        // tell (`line 14, column 16: workload.num_requests: invalid type ...`).
        let at_line = |e: toml::de::Error, key: Option<String>| {
            let msg = crate::messages::concise(e.message());
            let msg = match key {
                Some(k) => format!("{k}: {msg}"),
                None => msg,
            };
            match e.span() {
                Some(span) if src.is_some() => {
                    let (line, col) = line_col(src.unwrap_or_default(), span.start);
                    err(format!("line {line}, column {col}: {msg}"))
                }
                _ => err(msg),
            }
        };
        let mut raw = raw;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        // Variants merge into the file as written: their own `cost.calibration` must not
        // lose to keys the base's calibration file brought in.
        let unexpanded = raw.clone();
        let calibrated = expand_calibration(&mut raw, &base_dir).map_err(err)?;
        let fit = calibrated.clone().flatten();
        let base: ScenarioConfig = match src {
            // Without a calibration file, errors keep the file's line and column.
            Some(src) if calibrated.is_none() => toml::from_str(src).map_err(|e| {
                let key = serde_path_to_error::deserialize::<_, ScenarioConfig>(
                    toml::Value::Table(raw.clone()),
                )
                .err()
                .map(|pe| pe.path().to_string())
                .filter(|k| !k.is_empty() && k != ".");
                at_line(e, key)
            })?,
            _ => {
                serde_path_to_error::deserialize(toml::Value::Table(raw.clone())).map_err(|e| {
                    let path = e.path().to_string();
                    err(format!(
                        "{path}: {}",
                        crate::messages::concise(e.into_inner().message())
                    ))
                })?
            }
        };
        let name = base.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(|| "scenario".into(), |s| s.to_string_lossy().into_owned())
        });
        check_folder_name("name", &name).map_err(err)?;
        let seed = seed.unwrap_or(base.seed);
        base.workload.validate().map_err(|e| err(e.to_string()))?;

        let mut variants = Vec::new();
        if base.variant.is_empty() {
            let mut v = resolve("base", base.clone(), &base_dir).map_err(err)?;
            v.fit = fit.clone();
            v.fleet = resolve_fleet(&unexpanded, &base, &base_dir).map_err(err)?;
            variants.push(v);
        }
        for (i, over) in base.variant.iter().enumerate() {
            let vname = match over.get("name") {
                Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
                _ => {
                    return Err(err(format!(
                        "variant #{}: needs a `name` (a non-empty string)",
                        i + 1
                    )))
                }
            };
            check_folder_name(&format!("variant `{vname}`: name"), &vname).map_err(err)?;
            let mut over = over.clone();
            over.remove("name");
            // The client's cap on requests in flight (and its think time) are the workload
            // keys a variant may set: the request stream stays the same, only when each is
            // sent changes.
            let client_only = over
                .get("workload")
                .and_then(|w| w.as_table())
                .is_some_and(|w| {
                    w.keys()
                        .all(|k| k == "max_in_flight" || k == "think_time_s")
                });
            for forbidden in ["workload", "seed", "variant", "name", "sweep"] {
                if over.contains_key(forbidden) && !(forbidden == "workload" && client_only) {
                    return Err(err(format!(
                        "variant `{vname}`: `{forbidden}` cannot be overridden (variants share one request stream)"
                    )));
                }
            }
            let mut merged = unexpanded.clone();
            merged.remove("variant");
            merged.remove("sweep");
            merge(&mut merged, &over);
            let merged_raw = merged.clone();
            let variant_fit = expand_calibration(&mut merged, &base_dir)
                .map_err(|m| err(format!("variant `{vname}`: {m}")))?
                .flatten();
            let cfg: ScenarioConfig = serde_path_to_error::deserialize(toml::Value::Table(merged))
                .map_err(|e| {
                    let path = e.path().to_string();
                    let msg = crate::messages::concise(e.into_inner().message());
                    if path.is_empty() || path == "." {
                        err(format!("variant `{vname}`: {msg}"))
                    } else {
                        err(format!("variant `{vname}`: {path}: {msg}"))
                    }
                })?;
            if variants.iter().any(|v: &Variant| v.name == vname) {
                return Err(err(format!("variant `{vname}` is defined twice")));
            }
            let mut v = resolve(&vname, cfg, &base_dir)
                .map_err(|m| err(format!("variant `{vname}`: {m}")))?;
            v.fit = variant_fit;
            v.fleet = resolve_fleet(&merged_raw, &v.config, &base_dir)
                .map_err(|m| err(format!("variant `{vname}`: {m}")))?;
            variants.push(v);
        }
        Ok(Scenario {
            name,
            path: path.to_path_buf(),
            base_dir,
            seed,
            base,
            variants,
            fit,
            sweep,
            raw: file_table,
            seed_override,
        })
    }

    /// The swept keys, in file order.
    pub fn sweep_keys(&self) -> Vec<String> {
        self.sweep.iter().map(|(k, _)| k.clone()).collect()
    }

    /// Every point of the sweep, in order (the last key varies fastest): the dotted keys
    /// and their values at that point. One empty point without a sweep.
    pub fn sweep_points(&self) -> Vec<Vec<(String, toml::Value)>> {
        let mut points: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
        for (key, values) in &self.sweep {
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.push((key.clone(), v.clone()));
                        q
                    })
                })
                .collect();
        }
        points
    }
}

/// The fleet of a configuration with a `[cluster]` (`None` without one): every pool is the
/// configuration (`table`, as written, before its calibration file is read) with the pool's
/// tables merged over it, checked and resolved like a variant.
fn resolve_fleet(
    table: &toml::Table,
    config: &ScenarioConfig,
    base_dir: &Path,
) -> Result<Option<cluster::Fleet>, String> {
    let Some(cl) = &config.cluster else {
        return Ok(None);
    };
    cl.validate()?;
    let mut pools = Vec::new();
    let mut engines = 0u64;
    for (name, pool) in &cl.pools {
        let key = format!("cluster.pools.{name}");
        let mut t = table.clone();
        for k in ["cluster", "variant", "sweep"] {
            t.remove(k);
        }
        let mut over = toml::Table::new();
        for (k, tab) in pool.overrides() {
            over.insert(k.into(), toml::Value::Table(tab.clone()));
        }
        merge(&mut t, &over);
        let fit = expand_calibration(&mut t, base_dir)
            .map_err(|m| format!("{key}: {m}"))?
            .flatten();
        let cfg: ScenarioConfig =
            serde_path_to_error::deserialize(toml::Value::Table(t)).map_err(|e| {
                let path = e.path().to_string();
                format!(
                    "{key}.{path}: {}",
                    crate::messages::concise(e.into_inner().message())
                )
            })?;
        let mut engine = resolve(name, cfg, base_dir).map_err(|m| format!("{key}: {m}"))?;
        engine.fit = fit;
        // Attention data parallelism: each rank of each replica is an engine of the fleet
        // (its own scheduler and KV cache), its MoE layers priced with every rank's tokens
        // of the step (the driver sums them); the router spreads requests over the ranks.
        let ranks = engine.deployment.parallel.dp.max(1);
        engines += u64::from(pool.replicas) * u64::from(ranks);
        if engines > u64::from(cluster::MAX_REPLICAS) {
            return Err(format!(
                "{key}: {engines} engines in all (replicas x hardware.dp ranks), more than the {} a fleet may have",
                cluster::MAX_REPLICAS
            ));
        }
        pools.push(cluster::Pool {
            name: name.clone(),
            replicas: pool.replicas,
            ranks,
            usd_per_gpu_hour: pool
                .usd_per_gpu_hour
                .or(cl.usd_per_gpu_hour)
                .unwrap_or(engine.deployment.gpu.price_per_hour),
            role: pool.role,
            engine: Box::new(engine),
        });
    }
    Ok(Some(cluster::Fleet {
        config: cl.clone(),
        pools,
    }))
}

/// A scenario's or a variant's name names a results folder (`results/<scenario>/<variant>`):
/// it must stay one folder inside the output folder. Errors say which `key`.
pub(crate) fn check_folder_name(key: &str, name: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{key}: {why}, got {name:?}"));
    if name.is_empty() || name == "." || name == ".." {
        return bad("must name a folder (not empty, `.` or `..`)");
    }
    if name.contains(['/', '\\']) {
        return bad("names a results folder, so it may not hold `/` or `\\`");
    }
    if name.chars().any(char::is_control) {
        return bad("may not hold control characters");
    }
    if name.len() > 200 {
        return bad("must be at most 200 bytes long");
    }
    Ok(())
}
