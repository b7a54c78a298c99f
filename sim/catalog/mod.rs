//! The hardware and model catalogs, kept as data: one TOML file per GPU in
//! `sim/catalog/gpus/` (datasheet figures, [`GpuFile`]'s keys, the format of a scenario's
//! `hardware.gpu_file`) and one per model in `sim/catalog/models/` (the keys of the model's
//! Hugging Face `config.json`, read as a `model.config` file is). `sim/build.rs` embeds every
//! file it finds there, so adding a GPU or a model is adding a file.
//!
//! In: names typed by users (`h100`, `meta-llama/Meta-Llama-3-8B`), CUDA device names, and
//! the files a scenario points at (`config.json`, GGUF, GPU TOML). Out: [`Gpu`] and
//! [`ModelSpec`] values, each file read once per process.

mod arch;
mod dtype;
mod gpu;
mod model;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

pub use arch::{Arch, LinearAttention, Mla, SlidingLayers};
pub use dtype::Dtype;
pub use gpu::{Gpu, GpuFile};
pub use model::ModelSpec;

// `GPU_FILES` and `MODEL_FILES`: (file name, text) of every catalog file, in natural order of
// the names (written by sim/build.rs).
include!(concat!(env!("OUT_DIR"), "/catalog_files.rs"));

/// A catalog GPU and the names that find it.
struct GpuEntry {
    gpu: Gpu,
    /// Other names users type (`h100` for `h100-sxm`), normalised.
    aliases: Vec<String>,
    /// Patterns of CUDA device names: every substring of one pattern must appear in the
    /// lower-cased device name; the match with the most substrings wins.
    device_names: Vec<Vec<String>>,
}

/// A catalog model file: its name, the Hugging Face id, and the `config.json` keys.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    name: String,
    hf_id: String,
    config: toml::Table,
}

fn gpu_entries() -> &'static [GpuEntry] {
    static ENTRIES: OnceLock<Vec<GpuEntry>> = OnceLock::new();
    ENTRIES.get_or_init(|| {
        GPU_FILES
            .iter()
            .map(|(file, text)| {
                parse_gpu_entry(file, text).unwrap_or_else(|e| panic!("catalog GPU {e}"))
            })
            .collect()
    })
}

/// One catalog GPU file (embedded at build time; `catalog_files_parse` tests every one).
fn parse_gpu_entry(file: &str, text: &str) -> Result<GpuEntry, String> {
    let shown = format!("sim/catalog/gpus/{file}");
    let f: GpuFile = toml::from_str(text).map_err(|e| format!("{shown}: {}", e.message()))?;
    let aliases = f.aliases.iter().map(|a| normalise(a)).collect();
    let device_names = f
        .device_names
        .iter()
        .map(|p| p.iter().map(|s| s.to_ascii_lowercase()).collect())
        .collect();
    Ok(GpuEntry {
        gpu: Gpu::from_file(f, &shown)?,
        aliases,
        device_names,
    })
}

/// One catalog model file (embedded at build time; `catalog_files_parse` tests every one).
fn parse_model_entry(file: &str, text: &str) -> Result<ModelSpec, String> {
    let shown = format!("sim/catalog/models/{file}");
    let entry: ModelEntry =
        toml::from_str(text).map_err(|e| format!("{shown}: {}", e.message()))?;
    if let Some(k) = entry
        .config
        .keys()
        .find(|k| !model::HF_CONFIG_KEYS.contains(&k.as_str()))
    {
        return Err(format!(
            "{shown}: [config] has `{k}`, which is not a config.json key sim reads ({})",
            model::HF_CONFIG_KEYS.join(", ")
        ));
    }
    let config = serde_json::to_value(&entry.config).map_err(|e| format!("{shown}: {e}"))?;
    let mut spec = ModelSpec::from_hf_value(&config, &shown)?;
    spec.name = Box::leak(entry.name.into_boxed_str());
    spec.hf_id = Box::leak(entry.hf_id.into_boxed_str());
    Ok(spec)
}

/// The GPU catalog, in natural order of the file names.
pub fn gpus() -> impl ExactSizeIterator<Item = &'static Gpu> {
    gpu_entries().iter().map(|e| &e.gpu)
}

/// The model catalog, in natural order of the file names.
pub fn models() -> &'static [ModelSpec] {
    static MODELS: OnceLock<Vec<ModelSpec>> = OnceLock::new();
    MODELS.get_or_init(|| {
        MODEL_FILES
            .iter()
            .map(|(file, text)| {
                parse_model_entry(file, text).unwrap_or_else(|e| panic!("catalog model {e}"))
            })
            .collect()
    })
}

/// Normalises a user-typed name: lower case, `_` and space become `-`.
fn normalise(name: &str) -> String {
    name.trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c == '_' || c == ' ' { '-' } else { c })
        .collect()
}

/// The catalog GPU of a CUDA device name (`NVIDIA H100 80GB HBM3` is `h100-sxm`), when
/// the name says which: the GPU with the most specific matching `device_names` pattern.
pub fn gpu_for_device(device: &str) -> Option<&'static str> {
    let d = device.to_ascii_lowercase();
    // The most substrings wins, then the most characters (`gb200` over `b200`).
    let mut best: Option<((usize, usize), &'static str)> = None;
    for e in gpu_entries() {
        for pattern in &e.device_names {
            let score = (
                pattern.len(),
                pattern.iter().map(String::len).sum::<usize>(),
            );
            if pattern.iter().all(|s| d.contains(s.as_str())) && best.is_none_or(|(n, _)| score > n)
            {
                best = Some((score, e.gpu.name));
            }
        }
    }
    best.map(|(_, name)| name)
}

/// Looks up a GPU by catalog key or alias (case-insensitive; `h100` means `h100-sxm`,
/// `a100` means `a100-80gb`).
pub fn find_gpu(name: &str) -> Option<&'static Gpu> {
    let n = normalise(name);
    gpu_entries()
        .iter()
        .find(|e| e.gpu.name == n || e.aliases.contains(&n))
        .map(|e| &e.gpu)
}

/// Looks up a model by catalog key or Hugging Face id (case-insensitive).
pub fn find_model(name: &str) -> Option<&'static ModelSpec> {
    let n = normalise(name);
    models()
        .iter()
        .find(|m| m.name == n || normalise(m.hf_id) == n)
}

/// Looks up the model a serving engine was given by its Hugging Face id: the id itself,
/// or its base model's, as instruct, dated and quantized checkpoints share their base's
/// shape (`nvidia/Llama-3.1-8B-Instruct-FP8` and `meta-llama/Meta-Llama-3.1-8B` are
/// `llama-3.1-8b`).
pub fn find_model_by_id(id: &str) -> Option<&'static ModelSpec> {
    let (org, name) = id.split_once('/').unwrap_or(("", id));
    let mut base = name;
    while let Some(b) = ["-Instruct", "-2507", "-FP8", "-NVFP4"]
        .iter()
        .find_map(|s| base.strip_suffix(s))
    {
        base = b;
    }
    let base = base.strip_prefix("Meta-").unwrap_or(base);
    [id.to_string(), format!("{org}/{base}"), base.to_string()]
        .iter()
        .find_map(|t| find_model(t))
}

/// Files already read by [`model_from_file`] and [`gpu_from_file`]: a scenario's variants
/// and `sim plan`'s probes resolve the same file many times; it is read (and its strings
/// kept for the process) once.
type FileCache<T> = Mutex<std::collections::HashMap<PathBuf, &'static T>>;

fn cached<T>(
    cache: &'static OnceLock<FileCache<T>>,
    path: &Path,
    load: impl FnOnce(&Path) -> Result<T, String>,
) -> Result<&'static T, String> {
    let map = cache.get_or_init(Default::default);
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&t) = map.get(&key) {
        return Ok(t);
    }
    let t: &'static T = Box::leak(Box::new(load(path)?));
    map.insert(key, t);
    Ok(t)
}

/// A model from a Hugging Face `config.json` ([`ModelSpec::from_hf_config`]), read once.
pub fn model_from_file(path: &Path) -> Result<&'static ModelSpec, String> {
    static CACHE: OnceLock<FileCache<ModelSpec>> = OnceLock::new();
    cached(&CACHE, path, ModelSpec::from_hf_config)
}

/// A model from a GGUF file's metadata ([`ModelSpec::from_gguf`]), read once.
pub fn model_from_gguf(path: &Path) -> Result<&'static ModelSpec, String> {
    static CACHE: OnceLock<FileCache<ModelSpec>> = OnceLock::new();
    cached(&CACHE, path, ModelSpec::from_gguf)
}

/// A GPU from a TOML file ([`Gpu::from_toml_file`]), read once.
pub fn gpu_from_file(path: &Path) -> Result<&'static Gpu, String> {
    static CACHE: OnceLock<FileCache<Gpu>> = OnceLock::new();
    cached(&CACHE, path, Gpu::from_toml_file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_files_parse() {
        // Every embedded file, with errors reported instead of the first-use panic.
        let gpus: Vec<GpuEntry> = GPU_FILES
            .iter()
            .map(|(f, t)| parse_gpu_entry(f, t).unwrap())
            .collect();
        let models: Vec<ModelSpec> = MODEL_FILES
            .iter()
            .map(|(f, t)| parse_model_entry(f, t).unwrap())
            .collect();
        assert!(gpus.len() >= 7 && models.len() >= 10);
        // Each file is named for its key, and keys and aliases are unique.
        for ((file, _), e) in GPU_FILES.iter().zip(&gpus) {
            assert_eq!(*file, format!("{}.toml", e.gpu.name));
        }
        for ((file, _), m) in MODEL_FILES.iter().zip(&models) {
            assert_eq!(*file, format!("{}.toml", m.name));
        }
        let mut names: Vec<&str> = gpus
            .iter()
            .flat_map(|e| std::iter::once(e.gpu.name).chain(e.aliases.iter().map(String::as_str)))
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a GPU name or alias is given twice");
        let mut ids: Vec<String> = models.iter().map(|m| normalise(m.hf_id)).collect();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "a Hugging Face id is given twice");
        // A misspelt key is an error, not a silent default.
        let typo = "name = \"x\"\nhf_id = \"y\"\n[config]\nhead_dimm = 64\n";
        let e = parse_model_entry("x.toml", typo).unwrap_err();
        assert!(e.contains("head_dimm"), "{e}");
        // Every GPU's own device name finds it again.
        for e in &gpus {
            assert_eq!(
                gpu_for_device(e.gpu.display),
                Some(e.gpu.name),
                "{}",
                e.gpu.display
            );
        }
    }

    #[test]
    fn catalog_figures() {
        // Datasheet figures, converted without a second rounding.
        let h100 = find_gpu("h100").unwrap();
        assert_eq!(h100.mem_bytes, 81559.0 * 1024.0 * 1024.0);
        assert_eq!(h100.flops_16, 989.4e12);
        assert_eq!(h100.flops_fp8, Some(1978.9e12));
        assert_eq!(h100.flops_32, 66.9e12);
        assert_eq!(h100.mem_bw, 3.35e12);
        assert_eq!(find_gpu("a100-80gb").unwrap().mem_bw, 2.039e12);
        assert_eq!(find_gpu("l40s").unwrap().flops_16, 362.05e12);
        let mixtral = find_model("mixtral-8x7b").unwrap();
        assert_eq!((mixtral.num_experts, mixtral.experts_per_token), (8, 2));
        assert_eq!(find_model("mistral-7b").unwrap().sliding_window, Some(4096));
        assert_eq!(find_model("llama-3.2-1b").unwrap().head_dim, 64);
        assert!(find_model("smollm2-135m").unwrap().tied_embeddings);
    }

    #[test]
    fn llama2_70b_is_about_69b_params() {
        let m = find_model("Llama-2-70B").unwrap();
        // 68.98e9 with the HF shapes (the "70B" is rounded).
        assert!((m.params() / 1e9 - 68.98).abs() < 0.05, "{}", m.params());
    }

    #[test]
    fn llama3_8b_params() {
        let m = find_model("meta-llama/Meta-Llama-3-8B").unwrap();
        assert!((m.params() / 1e9 - 8.03).abs() < 0.01, "{}", m.params());
    }

    #[test]
    fn smollm2_params() {
        let m = find_model("smollm2-135m").unwrap();
        assert!((m.params() / 1e6 - 134.5).abs() < 0.5, "{}", m.params());
    }

    #[test]
    fn aliases() {
        assert_eq!(find_gpu("H100").unwrap().name, "h100-sxm");
        assert_eq!(find_gpu("A100_40GB").unwrap().name, "a100-40gb");
        assert_eq!(find_gpu("a100").unwrap().name, "a100-80gb");
        assert!(find_gpu("tpu-v5").is_none());
    }

    #[test]
    fn engines_model_ids_find_their_base_model() {
        for (id, name) in [
            ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
            ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
            ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"),
            ("meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b"),
            ("nvidia/Qwen3-32B-NVFP4", "qwen3-32b"),
            ("Qwen/Qwen3-32B", "qwen3-32b"),
            ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
            ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b"),
            ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
            ("nvidia/DeepSeek-R1-NVFP4", "deepseek-r1"),
            ("openai/gpt-oss-120b", "gpt-oss-120b"),
            ("Qwen/Qwen3.5-397B-A17B", "qwen3.5-397b-a17b"),
            ("moonshotai/Kimi-K2-Instruct", "kimi-k2"),
        ] {
            assert_eq!(find_model_by_id(id).map(|m| m.name), Some(name), "{id}");
        }
        assert!(find_model_by_id("mistralai/Mistral-Large-Instruct-2411").is_none());
    }

    #[test]
    fn device_names() {
        for (device, gpu) in [
            ("NVIDIA H100 80GB HBM3", "h100-sxm"),
            ("NVIDIA H100 PCIe", "h100-pcie"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
            ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
            ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
            ("NVIDIA B200", "b200"),
            ("NVIDIA GB200", "gb200"),
            ("NVIDIA GeForce RTX 4090", "rtx-4090"),
            (
                "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                "rtx-pro-6000",
            ),
            ("NVIDIA L40S", "l40s"),
        ] {
            assert_eq!(gpu_for_device(device), Some(gpu), "{device}");
        }
        assert_eq!(gpu_for_device("Tesla T4"), None);
    }
}
