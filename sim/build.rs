//! Embeds the catalogs (`sim/catalog/gpus/*.toml`, `sim/catalog/models/*.toml`): writes
//! `$OUT_DIR/catalog_files.rs` with `GPU_FILES` and `MODEL_FILES`, the (file name, text) of
//! every file in natural order of the names (`llama-2-7b` before `llama-2-13b`), so that a
//! new GPU or model is a new file and nothing else.

use std::path::{Path, PathBuf};

/// The names' runs of digits compare as numbers, the rest as text.
fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut n = u64::from(c.to_digit(10).unwrap_or(0));
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            key.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    // Names equal but for leading zeros fall back to plain order: a fixed order always.
    files.sort_by_key(|p| {
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        (natural_key(&stem), stem)
    });
    files
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut out = String::new();
    for (konst, sub) in [("GPU_FILES", "gpus"), ("MODEL_FILES", "models")] {
        let dir = root.join("sim/catalog").join(sub);
        println!("cargo:rerun-if-changed={}", dir.display());
        out.push_str(&format!("/// The catalog's `{sub}/*.toml` files.\n"));
        out.push_str(&format!("const {konst}: &[(&str, &str)] = &[\n"));
        for f in toml_files(&dir) {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            out.push_str(&format!(
                "    ({name:?}, include_str!({:?})),\n",
                f.display().to_string()
            ));
        }
        out.push_str("];\n");
    }
    let dest =
        PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("catalog_files.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}
