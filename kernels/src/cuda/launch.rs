//! Launching the kernels of a step: launch configurations and the compiled sizes they must
//! match, the GEMM paths ([`Ops`]: `skinny_gemm` for a few tokens, cuBLAS otherwise), the
//! fused residual add + RMSNorm, paged attention with the flash-decoding combine, and the
//! sampling kernel.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use half::bf16;

use super::*;

/// Largest step (in tokens) that `skinny_gemm` (weight streaming, one warp per output row)
/// is compiled for; [`CudaRuntime::set_skinny_max_tokens`] picks where it replaces cuBLAS.
pub const SKINNY_MAX_TOKENS: usize = 8;
/// Default of [`CudaRuntime::set_skinny_max_tokens`]: on the H100 `skinny_gemm` beats cuBLAS
/// at one token (6.96 vs 7.79 ms a Llama-3-8B step) and loses from two on (BENCHMARKS.md).
pub const SKINNY_DEFAULT_TOKENS: usize = 1;
/// Decode-only steps of at most this many tokens replay a CUDA graph.
pub const GRAPH_MAX_TOKENS: usize = 8;
const _: () = assert!(SKINNY_DEFAULT_TOKENS <= SKINNY_MAX_TOKENS);
/// cuBLAS workspace owned by the runtime (set explicitly so that graph capture never makes
/// cuBLAS allocate).
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;
/// Warps (output rows) per block of `skinny_gemm`.
pub const SKINNY_WARPS: u32 = 8;
/// CUDA graphs kept (one per step shape); the cache is emptied when it would grow past this.
pub const MAX_GRAPHS: usize = 64;

/// The `skinny_gemm` instance for `tokens` rows (the smallest compiled T >= tokens) with a
/// bf16 or an fp32 output; None above [`SKINNY_MAX_TOKENS`].
pub fn skinny_kernel(tokens: usize, f32_out: bool) -> Option<&'static str> {
    let names = if f32_out {
        [
            "skinny_gemm_f32_1",
            "skinny_gemm_f32_2",
            "skinny_gemm_f32_4",
            "skinny_gemm_f32_8",
        ]
    } else {
        [
            "skinny_gemm_bf16_1",
            "skinny_gemm_bf16_2",
            "skinny_gemm_bf16_4",
            "skinny_gemm_bf16_8",
        ]
    };
    match tokens {
        0 | 1 => Some(names[0]),
        2 => Some(names[1]),
        3 | 4 => Some(names[2]),
        5..=SKINNY_MAX_TOKENS => Some(names[3]),
        _ => None,
    }
}

/// Launch configuration of `skinny_gemm` for `n` output rows.
pub fn skinny_config(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(SKINNY_WARPS), 1, 1),
        block_dim: (SKINNY_WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads per block of the attention kernel (must match `ATTN_THREADS` in the source).
pub const ATTN_THREADS: u32 = 128;
/// Keys per shared-memory tile of the attention kernel (`K_TILE`).
pub const K_TILE: u32 = 32;
/// Blocks of `paged_attention` per multiprocessor that flash-decoding splits aim for: about
/// four waves of the six blocks an SM holds, so that the last, partial wave costs little.
pub const DECODE_BLOCKS_PER_SM: u32 = 24;

pub(super) fn grid_for(n: u64, threads: u32) -> LaunchConfig {
    let blocks = n.div_ceil(u64::from(threads)).clamp(1, 65_535 * 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` threads per item (token, row, draw, block pair).
pub(super) fn block_per_item(items: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (items as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Draws `draws` tokens (`sample_draws`: argmax, or temperature / top-k / top-p with the
/// draw's uniform number) from rows of `logits` into `ids`.
pub(super) fn launch_sampling(
    st: &CudaStream,
    kf: &Kernels,
    ids: &mut CudaSlice<i32>,
    logits: &CudaSlice<f32>,
    draws: &cudarc::driver::CudaView<'_, i32>,
    n: usize,
    vocab: u32,
) -> Result<(), CudaError> {
    if n == 0 {
        return Ok(());
    }
    let vocab = vocab as i32;
    let mut b = st.launch_builder(kf.get("sample_draws"));
    b.arg(ids).arg(logits).arg(draws).arg(&vocab);
    let cfg = block_per_item(n, 1024);
    // SAFETY: each draw names a row of `vocab` logits; ids holds at least n entries.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// The GEMM paths of a step: `skinny_gemm` for a few tokens, cuBLAS otherwise.
pub(super) struct Ops<'a> {
    pub(super) blas: &'a CudaBlas,
    pub(super) st: &'a CudaStream,
    pub(super) kf: &'a Kernels,
    /// Largest token count that takes `skinny_gemm` (0: none).
    pub(super) skinny_max: usize,
}

impl Ops<'_> {
    /// Launches `skinny_gemm` when `t` is small enough and `k` a multiple of 8; false when
    /// the caller must use cuBLAS.
    pub(super) fn skinny<O: cudarc::driver::DeviceRepr>(
        &self,
        out: &mut CudaSlice<O>,
        x: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        [t, k, n]: [usize; 3],
        f32_out: bool,
    ) -> Result<bool, CudaError> {
        let Some(name) =
            skinny_kernel(t, f32_out).filter(|_| t <= self.skinny_max && k.is_multiple_of(8))
        else {
            return Ok(false);
        };
        let (ti, ki, ni) = (t as i32, k as i32, n as i32);
        let mut b = self.st.launch_builder(self.kf.get(name));
        b.arg(out).arg(x).arg(w).arg(&ti).arg(&ki).arg(&ni);
        // SAFETY: w holds n x k, x at least t x k, out at least t x n elements; rows of k
        // bf16 are 16-byte aligned since k is a multiple of 8.
        unsafe { b.launch(skinny_config(n)) }?;
        Ok(true)
    }

    /// `out[t x n] = x[t x k] * w[n x k]^T` (row-major, as PyTorch's Linear).
    pub(super) fn linear(
        &self,
        out: &mut CudaSlice<bf16>,
        x: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        t: usize,
        k: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if self.skinny(out, x, w, [t, k, n], false)? {
            return Ok(());
        }
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: t as i32,
            k: k as i32,
            alpha: bf16::ONE,
            lda: k as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: n as i32,
        };
        // SAFETY: w holds n x k, x at least t x k, out at least t x n elements.
        unsafe { self.blas.gemm(cfg, w, x, out) }?;
        Ok(())
    }

    /// `out[t x n] = x[t x k] * w[n x k]^T` with fp32 output (the logits: bf16 logits would
    /// round values near 20 to steps of 0.125 and tie greedy choices).
    pub(super) fn linear_f32_out(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        t: usize,
        k: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if self.skinny(out, x, w, [t, k, n], true)? {
            return Ok(());
        }
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType_t};
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let st = self.st;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (wp, _gw) = w.device_ptr(st);
        let (xp, _gx) = x.device_ptr(st);
        let (op, _go) = out.device_ptr_mut(st);
        // SAFETY: w holds n x k, x at least t x k, out at least t x n elements; alpha and
        // beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                t as i32,
                k as i32,
                (&alpha) as *const f32 as *const _,
                wp as *const _,
                cudaDataType_t::CUDA_R_16BF,
                k as i32,
                xp as *const _,
                cudaDataType_t::CUDA_R_16BF,
                k as i32,
                (&beta) as *const f32 as *const _,
                op as *mut _,
                cudaDataType_t::CUDA_R_32F,
                n as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
        Ok(())
    }
}

/// `residual += delta` (when `add`), then `h = RMSNorm(residual) x w`, over `tokens` rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn add_rmsnorm(
    st: &CudaStream,
    kf: &Kernels,
    a: &mut Activations,
    add: bool,
    w: &CudaSlice<bf16>,
    tokens: usize,
    hidden: i32,
    eps: f32,
) -> Result<(), CudaError> {
    let add = i32::from(add);
    let mut b = st.launch_builder(kf.get("add_rmsnorm"));
    b.arg(&mut a.h)
        .arg(&mut a.residual)
        .arg(&a.delta)
        .arg(&add)
        .arg(w)
        .arg(&hidden)
        .arg(&eps);
    let cfg = block_per_item(tokens, 256);
    // SAFETY: `tokens` rows of `hidden` in every buffer (activations sized for the step).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Launches the attention of one layer for a step: `paged_attention` over the single-token
/// tiles (with `splits` flash-decoding splits and their combine) and `prefill_attention`
/// over the multi-token tiles. `dims` = (heads, kv_heads, head_dim, block_size).
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_attention(
    st: &CudaStream,
    kf: &Kernels,
    l: &meta::MetaLayout,
    meta: &CudaSlice<i32>,
    out: &mut CudaSlice<bf16>,
    part_acc: &mut CudaSlice<f32>,
    part_ml: &mut CudaSlice<f32>,
    q: &CudaSlice<bf16>,
    k_cache: &CudaSlice<bf16>,
    v_cache: &CudaSlice<bf16>,
    dims: [u32; 4],
    splits: u32,
    window: i32,
) -> Result<(), CudaError> {
    let [heads_u, kv_heads_u, head_dim, block_size] = dims;
    let positions = meta.slice(l.positions..l.positions + l.tokens);
    let tables = meta.slice(l.block_tables..l.block_tables + l.seqs * l.max_blocks);
    let (heads, kv_heads, bs) = (heads_u as i32, kv_heads_u as i32, block_size as i32);
    let max_blocks = l.max_blocks as i32;
    let nsplit = splits as i32;
    let scale = 1.0f32 / (head_dim as f32).sqrt();
    if l.tiles > 0 {
        let tiles = meta.slice(l.tile_data..l.tile_data + 4 * l.tiles);
        let mut b = st.launch_builder(kf.get("paged_attention"));
        b.arg(&mut *out)
            .arg(&mut *part_acc)
            .arg(&mut *part_ml)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(&tables)
            .arg(&max_blocks)
            .arg(&tiles)
            .arg(&positions)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&bs)
            .arg(&nsplit)
            .arg(&scale)
            .arg(&window);
        let cfg = LaunchConfig {
            grid_dim: (l.tiles as u32, kv_heads_u, splits),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: tiles, tables and positions describe this step (StepMeta); the partial
        // buffers hold tokens x heads x splits rows when splits > 1.
        unsafe { b.launch(cfg) }?;
        if splits > 1 {
            let mut b = st.launch_builder(kf.get("attn_combine"));
            b.arg(&mut *out)
                .arg(&*part_acc)
                .arg(&*part_ml)
                .arg(&tiles)
                .arg(&heads)
                .arg(&nsplit);
            let cfg = LaunchConfig {
                grid_dim: (l.tiles as u32, heads_u, 1),
                block_dim: (head_dim, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the partials of every single-token tile were written above.
            unsafe { b.launch(cfg) }?;
        }
    }
    if l.ptiles > 0 {
        let ptiles = meta.slice(l.ptile_data..l.ptile_data + 4 * l.ptiles);
        let mut b = st.launch_builder(kf.get("prefill_attention"));
        b.arg(&mut *out)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(&tables)
            .arg(&max_blocks)
            .arg(&ptiles)
            .arg(&positions)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&bs)
            .arg(&scale)
            .arg(&window);
        let cfg = LaunchConfig {
            grid_dim: (l.ptiles as u32, kv_heads_u, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: meta::prefill_smem_bytes(head_dim),
        };
        // SAFETY: as above; each multi-token tile writes its own rows of `out`.
        unsafe { b.launch(cfg) }?;
    }
    Ok(())
}
