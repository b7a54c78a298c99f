//! The device and its libraries: probing the driver, NVRTC and cuBLAS without panicking
//! when they are missing ([`probe`], [`libraries_present`]), the device's architecture,
//! and compiling `kernels.cu` with NVRTC for it ([`compile`]); the runtime's errors
//! ([`CudaError`]).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::CompileOptions;

use super::*;

/// The kernel sources, compiled at run time.
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// Names of the kernels in [`KERNELS_CU`].
pub const KERNEL_NAMES: [&str; 20] = [
    "fill_uniform_bf16",
    "fill_const_bf16",
    "embed_gather",
    "add_rmsnorm",
    "rope_write_kv",
    "silu_mul",
    "paged_attention",
    "attn_combine",
    "prefill_attention",
    "gather_rows",
    "sample_draws",
    "skinny_gemm_bf16_1",
    "skinny_gemm_bf16_2",
    "skinny_gemm_bf16_4",
    "skinny_gemm_bf16_8",
    "skinny_gemm_f32_1",
    "skinny_gemm_f32_2",
    "skinny_gemm_f32_4",
    "skinny_gemm_f32_8",
    "copy_blocks",
];

/// Errors of the CUDA runtime.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library is not on this machine.
    #[error("no CUDA driver found (libcuda could not be loaded): --backend cuda needs an NVIDIA GPU and its driver")]
    NoDriver,
    /// A CUDA library other than the driver is missing.
    #[error("CUDA library {0} could not be loaded (set LD_LIBRARY_PATH to the CUDA 13 libraries, e.g. /usr/local/cuda/lib64)")]
    MissingLibrary(&'static str),
    /// The driver reports no device.
    #[error("no CUDA device found")]
    NoDevice,
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// Run-time compilation failed.
    #[error("NVRTC compilation of kernels.cu failed: {0}")]
    Compile(String),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// The model or the request does not fit or is not supported.
    #[error("{0}")]
    Config(String),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(format!("{e:?}"))
    }
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        CudaError::Blas(format!("{e:?}"))
    }
}

/// Checks that the driver, NVRTC and cuBLAS libraries can be loaded, without touching them
/// otherwise (cudarc panics on first use of a library it cannot find).
pub fn libraries_present() -> Result<(), CudaError> {
    // SAFETY: these only try to open the shared libraries.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Err(CudaError::NoDriver);
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Err(CudaError::MissingLibrary("NVRTC (libnvrtc)"));
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Err(CudaError::MissingLibrary("cuBLAS (libcublas)"));
        }
    }
    Ok(())
}

/// What `sim doctor` reports about the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total memory, bytes.
    pub total_mem: usize,
    /// Free memory, bytes.
    pub free_mem: usize,
    /// Multiprocessors.
    pub sm_count: i32,
    /// Driver API version (e.g. 13000).
    pub driver_version: i32,
}

pub(super) fn open_device() -> Result<Arc<CudaContext>, CudaError> {
    libraries_present()?;
    if CudaContext::device_count()? < 1 {
        return Err(CudaError::NoDevice);
    }
    Ok(CudaContext::new(0)?)
}

/// Probes the first GPU: libraries, device properties, and a compile of the kernels.
pub fn probe() -> Result<DeviceInfo, CudaError> {
    let ctx = open_device()?;
    // Buffers freed by an earlier runtime go back to the stream-ordered pool; a context
    // synchronisation releases them to the device before we read the free memory.
    ctx.synchronize()?;
    let (free_mem, total_mem) = ctx.mem_get_info()?;
    let sm_count = ctx.attribute(
        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?;
    let mut driver_version = 0;
    // SAFETY: writes one int.
    unsafe {
        cudarc::driver::sys::cuDriverGetVersion(&mut driver_version);
    }
    let info = DeviceInfo {
        name: ctx.name()?,
        compute_capability: ctx.compute_capability()?,
        total_mem,
        free_mem,
        sm_count,
        driver_version,
    };
    compile(&ctx, 128, 4)?;
    Ok(info)
}

/// The architecture string NVRTC compiles for, from the compute capability.
pub fn arch_for(cc: (i32, i32)) -> &'static str {
    match cc {
        (9, 0) => "sm_90",
        (8, 9) => "sm_89",
        (8, 6) => "sm_86",
        (8, 0) => "sm_80",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        (major, _) if major >= 9 => "sm_90",
        _ => "sm_80",
    }
}

/// Compiler options of the kernels for a head size and GQA group.
pub fn compile_options(arch: &'static str, head_dim: u32, group: u32) -> CompileOptions {
    CompileOptions {
        arch: Some(arch),
        include_paths: cuda_include_paths(),
        options: vec![
            format!("-DHEAD_DIM={head_dim}"),
            format!("-DGQA_GROUP={group}"),
            // Single-token tiles only reach paged_attention.
            "-DQ_TILE=1".into(),
            "-std=c++17".into(),
        ],
        ..CompileOptions::default()
    }
}

/// Folders holding `cuda_bf16.h` and `mma.h` (NVRTC needs the toolkit headers):
/// `SIM_CUDA_INCLUDE`, `$CUDA_HOME/include`, `/usr/local/cuda/include`.
pub(super) fn cuda_include_paths() -> Vec<String> {
    let mut paths = Vec::new();
    if let Ok(dir) = std::env::var("SIM_CUDA_INCLUDE") {
        paths.push(dir);
    }
    if let Ok(home) = std::env::var("CUDA_HOME").or_else(|_| std::env::var("CUDA_PATH")) {
        paths.push(format!("{home}/include"));
    }
    for p in ["/usr/local/cuda/include", "/usr/include"] {
        paths.push(p.into());
    }
    paths
        .into_iter()
        .filter(|p| std::path::Path::new(p).join("cuda_bf16.h").exists())
        .collect()
}

/// The compiled kernels.
#[derive(Debug, Clone)]
pub struct Kernels {
    pub(super) f: Vec<CudaFunction>,
}

impl Kernels {
    pub(super) fn get(&self, name: &str) -> &CudaFunction {
        // Names come from KERNEL_NAMES, all loaded by `compile`.
        let i = KERNEL_NAMES.iter().position(|n| *n == name).unwrap_or(0);
        &self.f[i]
    }
}

/// Whether the NVRTC library can be loaded (it needs no GPU and no driver).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `kernels.cu` to PTX with NVRTC for `arch` and a model's head size and GQA group.
pub fn compile_ptx(
    arch: &'static str,
    head_dim: u32,
    group: u32,
) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary("NVRTC (libnvrtc)"));
    }
    cudarc::nvrtc::compile_ptx_with_opts(KERNELS_CU, compile_options(arch, head_dim, group))
        .map_err(|e| CudaError::Compile(format!("{e:?}")))
}

/// Compiles `kernels.cu` for the device and loads every kernel.
pub fn compile(ctx: &Arc<CudaContext>, head_dim: u32, group: u32) -> Result<Kernels, CudaError> {
    if !head_dim.is_multiple_of(64) || head_dim > 256 {
        return Err(CudaError::Config(format!(
            "head_dim {head_dim} is not supported by the attention kernel (64, 128, 192 or 256)"
        )));
    }
    let ptx = compile_ptx(arch_for(ctx.compute_capability()?), head_dim, group)?;
    let module = ctx.load_module(ptx)?;
    let f = KERNEL_NAMES
        .iter()
        .map(|n| module.load_function(n))
        .collect::<Result<Vec<_>, _>>()?;
    let k = Kernels { f };
    // prefill_attention uses more than the default 48 KB of dynamic shared memory.
    let bytes = meta::prefill_smem_bytes(head_dim) as i32;
    // SAFETY: sets an attribute of a loaded function.
    unsafe {
        cudarc::driver::sys::cuFuncSetAttribute(
            k.get("prefill_attention").cu_function(),
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes,
        )
        .result()?;
    }
    Ok(k)
}
