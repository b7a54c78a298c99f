//! One GPU ([`Gpu`]): the datasheet figures the cost model prices steps with, read from a
//! TOML file in datasheet units ([`GpuFile`]). The catalog's GPUs (`sim/catalog/gpus/`) and a
//! scenario's `hardware.gpu_file` use the same format.

use serde::{Deserialize, Serialize};

use super::Dtype;

/// One GPU model (dense figures from the vendor datasheets).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    /// Catalog key.
    pub name: &'static str,
    /// Marketing name.
    pub display: &'static str,
    /// Device memory in bytes, as `nvidia-smi` reports the total.
    pub mem_bytes: f64,
    /// Dense 16-bit tensor-core peak, FLOP/s.
    pub flops_16: f64,
    /// Dense fp8 peak, FLOP/s (`None`: no fp8 tensor cores; fp8 runs at the 16-bit rate).
    pub flops_fp8: Option<f64>,
    /// Dense fp4 peak, FLOP/s (`None`: no fp4 tensor cores; fp4 weights are dequantized
    /// and multiplied in 16 bits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops_fp4: Option<f64>,
    /// Dense fp32 (non-tensor) peak, FLOP/s.
    pub flops_32: f64,
    /// HBM/GDDR bandwidth, bytes/s.
    pub mem_bw: f64,
    /// GPU-to-GPU link bandwidth per GPU and direction used by all-reduce, bytes/s
    /// (NVLink where the part has it, else PCIe).
    pub link_bw: f64,
    /// Host link (PCIe) bandwidth per direction, bytes/s (swap, uploads).
    pub pcie_bw: f64,
    /// GPUs that share `link_bw` (an NVLink domain: 8 in an HGX node, 72 in a GB200
    /// NVL72 rack); collectives over more use `network_bw`.
    pub nvlink_domain: u32,
    /// Scale-out network bandwidth per GPU and direction between NVLink domains, bytes/s.
    pub network_bw: f64,
    /// Fraction of `link_bw` a ring all-reduce reaches on large messages (NCCL within a
    /// node), fitted to Vidur's profiles where measured.
    pub allreduce_eff: f64,
    /// Fixed cost of one all-reduce, microseconds.
    pub allreduce_latency_us: f64,
    /// Rental price, US dollars per GPU-hour (a rough on-demand cloud figure for capacity
    /// planning; `sim plan --price` overrides it).
    pub price_per_hour: f64,
}

/// A GPU described in a TOML file (`hardware.gpu_file`), in the units of datasheets.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFile {
    /// Short name.
    pub name: String,
    /// Marketing name (default: the name).
    #[serde(default)]
    pub display: Option<String>,
    /// Device memory, GiB.
    pub memory_gib: f64,
    /// Dense 16-bit tensor-core peak, TFLOP/s.
    pub bf16_tflops: f64,
    /// Dense fp8 peak, TFLOP/s (omit when the GPU has no fp8 tensor cores).
    #[serde(default)]
    pub fp8_tflops: Option<f64>,
    /// Dense fp4 (NVFP4/MXFP4) peak, TFLOP/s (omit when the GPU has no fp4 tensor cores).
    #[serde(default)]
    pub fp4_tflops: Option<f64>,
    /// fp32 (non-tensor) peak, TFLOP/s.
    pub fp32_tflops: f64,
    /// Memory bandwidth, GB/s.
    pub memory_bandwidth_gbs: f64,
    /// GPU-to-GPU bandwidth per direction for all-reduce (NVLink, else PCIe), GB/s.
    pub interconnect_gbs: f64,
    /// Host link per direction, GB/s.
    pub pcie_gbs: f64,
    /// GPUs of one NVLink domain (default 8: an HGX node).
    #[serde(default)]
    pub nvlink_domain: Option<u32>,
    /// Scale-out network per GPU and direction, GB/s (default 50: one 400 Gb/s NIC).
    #[serde(default)]
    pub network_gbs: Option<f64>,
    /// Fraction of the interconnect an all-reduce reaches (default 0.6).
    #[serde(default)]
    pub allreduce_eff: Option<f64>,
    /// Fixed cost of one all-reduce, microseconds (default 50).
    #[serde(default)]
    pub allreduce_latency_us: Option<f64>,
    /// Rental price, USD per GPU-hour (default 0: unknown).
    #[serde(default)]
    pub price_per_hour: Option<f64>,
    /// Other names users type for a catalog GPU (`h100` for `h100-sxm`). Read from the
    /// catalog's files; a scenario's `gpu_file` may keep them (a copied catalog file is a
    /// valid `gpu_file`), where they name nothing.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Patterns of CUDA device names for a catalog GPU: every substring of one pattern must
    /// appear in the lower-cased device name (`[["h100", "pcie"]]`); the catalog GPU with the
    /// longest matching pattern is the device's. Unused in a `gpu_file`, like `aliases`.
    #[serde(default)]
    pub device_names: Vec<Vec<String>>,
}

impl Gpu {
    /// Reads a GPU from a TOML file ([`GpuFile`]'s keys); errors name the file and key.
    pub fn from_toml_file(path: &std::path::Path) -> Result<Gpu, String> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
        let f: GpuFile = toml::from_str(&text)
            .map_err(|e| format!("{shown}: {}", crate::messages::concise(e.message())))?;
        Gpu::from_file(f, &shown)
    }

    /// Checks the figures of a parsed [`GpuFile`] and converts them to SI units; `shown`
    /// (the file) prefixes errors.
    pub fn from_file(f: GpuFile, shown: &str) -> Result<Gpu, String> {
        // Upper bounds far above any device (a 1e300 GiB GPU is a typo, and would ask the
        // simulator for a pool it cannot track).
        let positive = [
            ("memory_gib", f.memory_gib, 1e5),
            ("bf16_tflops", f.bf16_tflops, 1e6),
            ("fp32_tflops", f.fp32_tflops, 1e6),
            ("memory_bandwidth_gbs", f.memory_bandwidth_gbs, 1e6),
            ("interconnect_gbs", f.interconnect_gbs, 1e6),
            ("pcie_gbs", f.pcie_gbs, 1e6),
            ("fp8_tflops", f.fp8_tflops.unwrap_or(1.0), 1e6),
            ("fp4_tflops", f.fp4_tflops.unwrap_or(1.0), 1e6),
            ("network_gbs", f.network_gbs.unwrap_or(1.0), 1e6),
            (
                "nvlink_domain",
                f64::from(f.nvlink_domain.unwrap_or(1)),
                1e5,
            ),
        ];
        for (k, v, max) in positive {
            if !(v > 0.0 && v <= max) {
                return Err(format!(
                    "{shown}: `{k}` must be a positive number of at most {max}, got {v:?}"
                ));
            }
        }
        if let Some(e) = f.allreduce_eff {
            if !(e > 0.0 && e <= 1.0) {
                return Err(format!(
                    "{shown}: `allreduce_eff` must be in (0, 1], got {e}"
                ));
            }
        }
        if let Some(l) = f.allreduce_latency_us {
            if !(l >= 0.0 && l.is_finite()) {
                return Err(format!(
                    "{shown}: `allreduce_latency_us` must be a non-negative number, got {l}"
                ));
            }
        }
        if let Some(p) = f.price_per_hour {
            if !(p >= 0.0 && p.is_finite()) {
                return Err(format!(
                    "{shown}: `price_per_hour` must be a non-negative number, got {p}"
                ));
            }
        }
        let display = f.display.clone().unwrap_or_else(|| f.name.clone());
        Ok(Gpu {
            // Read once per process: the catalog at first use, a file by `gpu_from_file`.
            name: Box::leak(f.name.into_boxed_str()),
            display: Box::leak(display.into_boxed_str()),
            mem_bytes: f.memory_gib * 1024.0 * MIB,
            flops_16: scaled(f.bf16_tflops, 12),
            flops_fp8: f.fp8_tflops.map(|t| scaled(t, 12)),
            flops_fp4: f.fp4_tflops.map(|t| scaled(t, 12)),
            flops_32: scaled(f.fp32_tflops, 12),
            mem_bw: scaled(f.memory_bandwidth_gbs, 9),
            link_bw: scaled(f.interconnect_gbs, 9),
            pcie_bw: scaled(f.pcie_gbs, 9),
            nvlink_domain: f.nvlink_domain.unwrap_or(8),
            network_bw: scaled(f.network_gbs.unwrap_or(50.0), 9),
            allreduce_eff: f.allreduce_eff.unwrap_or(0.6),
            allreduce_latency_us: f.allreduce_latency_us.unwrap_or(50.0),
            price_per_hour: f.price_per_hour.unwrap_or(0.0),
        })
    }

    /// Whether a GEMM unpacks weights in `dtype` to 16 bits before its tensor cores take
    /// them, as the cost model prices it: weight-only formats everywhere, fp4 without fp4
    /// tensor cores (a Hopper, where gpt-oss's MXFP4 experts run through Marlin-style
    /// kernels). fp8 without fp8 tensor cores (an A100) is priced as a 16-bit GEMM, not as
    /// dequantised.
    pub fn dequantises(&self, dtype: Dtype) -> bool {
        if dtype.is_fp4() {
            self.flops_fp4.is_none()
        } else {
            dtype.is_weight_only()
        }
    }

    /// Peak FLOP/s for matrix math in `dtype`.
    pub fn peak_flops(&self, dtype: Dtype) -> f64 {
        match dtype {
            Dtype::Fp32 => self.flops_32,
            Dtype::Fp8 | Dtype::Fp8Block => self.flops_fp8.unwrap_or(self.flops_16),
            Dtype::Nvfp4 | Dtype::Mxfp4 => self.flops_fp4.unwrap_or(self.flops_16),
            // int8 tensor cores: twice the 16-bit rate on Ampere, Ada and Hopper.
            Dtype::W8a8 => 2.0 * self.flops_16,
            // Weight-only formats multiply in 16 bits after dequantizing.
            _ => self.flops_16,
        }
    }
}

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// `value x 10^exp` rounded once: a datasheet figure such as 66.9 TFLOP/s becomes the float
/// nearest to 66.9e12, as a literal `66.9e12` would, rather than `66.9 * 1e12` (two
/// roundings, one unit in the last place off).
fn scaled(value: f64, exp: i32) -> f64 {
    format!("{value}e{exp}")
        .parse()
        .unwrap_or(value * 10f64.powi(exp))
}
