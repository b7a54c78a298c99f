//! Operations on a scenario's raw TOML table, before it is typed: merging a variant over
//! the base, setting a dotted key (sweep points, `--calibration`), expanding
//! `cost.calibration` into the calibration file's keys, reading `[sweep]` as dimensions, and
//! placing a parse error by line and column.

use std::path::Path;

use crate::cost_model::calibration::uncertainty::FitRecord;
use crate::cost_model::CostParams;

/// 1-based line and column of byte offset `at` in `src`.
pub(super) fn line_col(src: &str, at: usize) -> (usize, usize) {
    let before = &src[..at.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Replaces `cost.calibration = "file.toml"` (a `sim calibrate` output, relative to the
/// scenario's folder) by that file's `[cost]` keys, under the scenario's own `[cost]` keys,
/// which win. Returns `None` when no file was named, else the file's `[fit]` record (if it
/// has one: `sim calibrate --observed` writes it).
pub(super) fn expand_calibration(
    table: &mut toml::Table,
    base_dir: &Path,
) -> Result<Option<Option<FitRecord>>, String> {
    let Some(toml::Value::Table(cost)) = table.get_mut("cost") else {
        return Ok(None);
    };
    let Some(value) = cost.remove("calibration") else {
        return Ok(None);
    };
    let toml::Value::String(rel) = value else {
        return Err(
            "cost.calibration: expected the path of a TOML file with a [cost] table (a `sim calibrate` output)"
                .into(),
        );
    };
    let file = base_dir.join(&rel);
    let shown = file.display();
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cost.calibration: {shown}: cannot read: {e}"))?;
    let parsed: toml::Table = toml::from_str(&text).map_err(|e| {
        format!(
            "cost.calibration: {shown}: {}",
            crate::messages::concise(e.message())
        )
    })?;
    let Some(toml::Value::Table(from_file)) = parsed.get("cost") else {
        return Err(format!("cost.calibration: {shown}: no [cost] table"));
    };
    // Check the file's keys on their own, so that an error names the file.
    serde_path_to_error::deserialize::<_, CostParams>(toml::Value::Table(from_file.clone()))
        .map_err(|e| {
            let key = e.path().to_string();
            format!(
                "cost.calibration: {shown}: [cost] {key}: {}",
                e.into_inner().message().trim()
            )
        })?;
    let mut fit = FitRecord::from_file_table(&parsed)
        .map_err(|e| format!("cost.calibration: {shown}: {e}"))?;
    if let Some(f) = fit.as_mut() {
        f.pinned = cost.keys().cloned().collect();
    }
    let mut merged = from_file.clone();
    merge(&mut merged, cost);
    *cost = merged;
    Ok(Some(fit))
}

/// Merges `over` into `base` recursively (tables merge, other values replace).
pub(super) fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The `[sweep]` table as dimensions: each array leaf (at any depth, so both `"a.b" =
/// [..]` and `[sweep.a] b = [..]` work) is a dotted key and its values.
pub(super) fn sweep_dimensions(
    table: Option<&toml::Value>,
) -> Result<Vec<(String, Vec<toml::Value>)>, String> {
    fn walk(
        prefix: &str,
        t: &toml::Table,
        out: &mut Vec<(String, Vec<toml::Value>)>,
    ) -> Result<(), String> {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => walk(&key, sub, out)?,
                toml::Value::Array(values) if !values.is_empty() => {
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(format!("sweep.{key}: given twice"));
                    }
                    let root = key.split('.').next().unwrap_or_default();
                    if ["variant", "sweep", "name"].contains(&root) {
                        return Err(format!("sweep.{key}: `{root}` cannot be swept"));
                    }
                    out.push((key, values.clone()));
                }
                _ => {
                    return Err(format!(
                        "sweep.{key}: expected a non-empty array of the values to sweep"
                    ))
                }
            }
        }
        Ok(())
    }
    let Some(value) = table else {
        return Ok(Vec::new());
    };
    let toml::Value::Table(t) = value else {
        return Err("sweep: expected a table of keys and value arrays".into());
    };
    let mut out = Vec::new();
    walk("", t, &mut out)?;
    Ok(out)
}

/// Sets the dotted key `key` of `table` to `value`, creating tables on the way. A
/// numeric part indexes an array of tables (`workload.class.0.output`: the first class's
/// output).
pub(super) fn set_dotted(
    table: &mut toml::Table,
    key: &str,
    value: toml::Value,
) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("{key}: empty part in the key"));
    }
    let mut root = toml::Value::Table(std::mem::take(table));
    let r = set_in(&mut root, &parts, 0, key, value);
    if let toml::Value::Table(t) = root {
        *table = t;
    }
    r
}

fn set_in(
    v: &mut toml::Value,
    parts: &[&str],
    i: usize,
    key: &str,
    value: toml::Value,
) -> Result<(), String> {
    let Some(&p) = parts.get(i) else {
        *v = value;
        return Ok(());
    };
    let here = || parts[..i].join(".");
    let index = p.bytes().all(|b| b.is_ascii_digit());
    match v {
        toml::Value::Table(t) => {
            if index && !t.contains_key(p) {
                return Err(format!(
                    "{key}: `{}` has no array to index with {p}",
                    here()
                ));
            }
            let entry = t
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            set_in(entry, parts, i + 1, key, value)
        }
        toml::Value::Array(a) => {
            let n = a.len();
            let idx: usize = p.parse().ok().filter(|_| index).ok_or_else(|| {
                format!(
                    "{key}: `{}` is an array: index it by number (0 to {})",
                    here(),
                    n.saturating_sub(1)
                )
            })?;
            let item = a
                .get_mut(idx)
                .ok_or_else(|| format!("{key}: `{}` has {n} entries, no index {idx}", here()))?;
            set_in(item, parts, i + 1, key, value)
        }
        _ => Err(format!("{key}: `{}` is not a table", here())),
    }
}
