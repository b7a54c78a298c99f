// CUDA kernels of the Llama forward pass over the engine's paged KV cache.
//
// Compiled at run time with NVRTC for the device's architecture. The model shape enters as
// macros (-DHEAD_DIM=.. -DGQA_GROUP=..), so the attention kernel's loops have constant trip
// counts. Activations are bf16 with fp32 arithmetic; the KV cache is bf16 laid out as the
// block manager's blocks: [num_blocks][kv_heads][block_size][HEAD_DIM] for K and for V of
// each layer.

#include <cuda_bf16.h>
#include <mma.h>

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GQA_GROUP
#define GQA_GROUP 4
#endif
// Query tokens per paged_attention tile (the host sends it single-token tiles only) and
// keys per shared-memory tile.
#ifndef Q_TILE
#define Q_TILE 1
#endif
#define K_TILE 32
#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ROWS (Q_TILE * GQA_GROUP)
// Row stride of the K tile in shared memory, in bf16: HEAD_DIM + 2 makes the stride an odd
// number of 4-byte words, so 32 lanes reading 32 different keys hit 32 different banks.
#define K_STRIDE (HEAD_DIM + 2)

// -infinity (NVRTC has no <math.h> INFINITY).
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf(const __nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 to_bf(const float x) { return __float2bfloat16(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Deterministic pseudo-random bf16 weights in [-scale, scale] (synthetic-weight mode):
// a 64-bit mix of (seed, index), so any shape is generated on the device without a host
// copy and the same seed gives the same weights.
extern "C" __global__ void fill_uniform_bf16(__nv_bfloat16* out, unsigned long long n,
                                             unsigned long long seed, float scale) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        unsigned long long z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        out[i] = to_bf((2.0f * u - 1.0f) * scale);
    }
}

// Fills a bf16 buffer with a constant (norm weights of synthetic models, poison values).
extern "C" __global__ void fill_const_bf16(__nv_bfloat16* out, unsigned long long n, float v) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = to_bf(v);
}

// out[t] = table[ids[t]] (rows of `hidden` elements), into the fp32 residual stream.
extern "C" __global__ void embed_gather(float* out, const __nv_bfloat16* table,
                                        const int* ids, int hidden) {
    const int t = blockIdx.x;
    const __nv_bfloat16* row = table + (long long)ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[(long long)t * hidden + i] = bf(row[i]);
}

// Block-wide sum for RMSNorm (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x >> 5;
    v = (threadIdx.x < nwarps) ? part[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) part[0] = v;
    __syncthreads();
    const float r = part[0];
    __syncthreads();
    return r;
}

// residual += delta (if has_delta); out = RMSNorm(residual) * w. The residual stream is
// fp32; the normalised output feeds bf16 GEMMs. One block per token.
extern "C" __global__ void add_rmsnorm(__nv_bfloat16* out, float* residual,
                                       const __nv_bfloat16* delta, int has_delta,
                                       const __nv_bfloat16* w, int hidden, float eps) {
    const long long base = (long long)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float x = residual[base + i];
        if (has_delta) {
            x += bf(delta[base + i]);
            residual[base + i] = x;
        }
        ss += x * x;
    }
    const float inv = rsqrtf(block_sum(ss) / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[base + i] = to_bf(residual[base + i] * inv * bf(w[i]));
}

// Applies RoPE to the Q and K heads of `qkv` ([T][(heads + 2 kv_heads) HEAD_DIM]), writes
// the rotated Q to q_out ([T][heads][HEAD_DIM]) and K, V into the paged cache at each
// token's slot (slot = block * block_size + offset). interleaved = 1: pairs (2i, 2i+1)
// (GGUF); 0: pairs (i, i + HEAD_DIM/2) (Hugging Face rotate_half).
// One block per token; threads cover (head, pair).
extern "C" __global__ void rope_write_kv(const __nv_bfloat16* qkv, __nv_bfloat16* q_out,
                                         __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                         const int* positions, const int* slots, int heads,
                                         int kv_heads, int block_size, float theta,
                                         int interleaved) {
    const int t = blockIdx.x;
    const int half = HEAD_DIM / 2;
    const long long row = (long long)t * (heads + 2 * kv_heads) * HEAD_DIM;
    const float pos = (float)positions[t];
    const int slot = slots[t];
    const long long blk = slot / block_size, off = slot % block_size;
    for (int idx = threadIdx.x; idx < (heads + kv_heads) * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        const float freq = powf(theta, -2.0f * (float)i / (float)HEAD_DIM);
        float s, c;
        sincosf(pos * freq, &s, &c);
        const int a = interleaved ? 2 * i : i;
        const int b = interleaved ? 2 * i + 1 : i + half;
        const __nv_bfloat16* src = qkv + row + (long long)h * HEAD_DIM;
        const float x0 = bf(src[a]), x1 = bf(src[b]);
        const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
        if (h < heads) {
            __nv_bfloat16* dst = q_out + ((long long)t * heads + h) * HEAD_DIM;
            dst[a] = to_bf(y0);
            dst[b] = to_bf(y1);
        } else {
            const int kh = h - heads;
            __nv_bfloat16* dst = k_cache + ((blk * kv_heads + kh) * block_size + off) * HEAD_DIM;
            dst[a] = to_bf(y0);
            dst[b] = to_bf(y1);
        }
    }
    // V is copied unrotated.
    for (int idx = threadIdx.x; idx < kv_heads * HEAD_DIM; idx += blockDim.x) {
        const int kh = idx / HEAD_DIM, d = idx % HEAD_DIM;
        v_cache[((blk * kv_heads + kh) * block_size + off) * HEAD_DIM + d] =
            qkv[row + (long long)(heads + kv_heads + kh) * HEAD_DIM + d];
    }
}

// out[t][i] = silu(gate_up[t][i]) * gate_up[t][inter + i].
extern "C" __global__ void silu_mul(__nv_bfloat16* out, const __nv_bfloat16* gate_up,
                                    long long tokens, int inter) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long n = tokens * inter;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const long long t = i / inter, j = i % inter;
        const float g = bf(gate_up[t * 2 * inter + j]);
        const float u = bf(gate_up[t * 2 * inter + inter + j]);
        out[i] = to_bf(g / (1.0f + __expf(-g)) * u);
    }
}

// Paged attention over the block tables, for prefill chunks and decodes alike
// (FlashAttention-style tiling with an online softmax, flash-decoding splits over the
// context).
//
// A tile is up to Q_TILE consecutive query tokens of one sequence: tiles[4 * i] = (sequence
// index, first token index in the step, number of tokens, unused). Token t sits at absolute
// position positions[t] and attends causally to keys [0, positions[t]]. The block (tile,
// kv head, split) loads K_TILE keys at a time of one KV head into shared memory, reading
// each key once for all GQA_GROUP query heads of that KV head and all tile tokens, and
// covers the split's share of the context. With one split it writes the normalised output;
// with several it writes (acc, max, sum) partials that attn_combine merges.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
paged_attention(__nv_bfloat16* out, float* part_acc, float* part_ml,
                const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                const __nv_bfloat16* v_cache, const int* block_tables, int max_blocks,
                const int* tiles, const int* positions, int heads, int kv_heads,
                int block_size, int num_splits, float scale, int window) {
    __shared__ float q_s[ROWS][HEAD_DIM];
    __shared__ __align__(16) __nv_bfloat16 k_s[K_TILE][K_STRIDE];
    __shared__ __align__(16) __nv_bfloat16 v_s[K_TILE][HEAD_DIM];
    __shared__ float p_s[ROWS][K_TILE + 1];
    __shared__ float row_scale[ROWS];

    const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int seq = tiles[4 * tile], tok0 = tiles[4 * tile + 1], ntok = tiles[4 * tile + 2];
    const int rows = ntok * GQA_GROUP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ctx = positions[tok0 + ntok - 1] + 1;  // keys needed by the last token
    // Sliding window: the first token needs keys from lo on (earlier blocks may be NULL).
    const int lo = window > 0 ? max(0, positions[tok0] + 1 - window) : 0;
    const int lo_tile = lo / K_TILE * K_TILE;
    const int span = ctx - lo_tile;
    const int per_split = ((span + num_splits - 1) / num_splits + K_TILE - 1) / K_TILE * K_TILE;
    const int k_begin = lo_tile + split * per_split;
    const int k_end = min(ctx, k_begin + per_split);
    const int* table = block_tables + (long long)seq * max_blocks;

    // Query rows r = token * GQA_GROUP + g, pre-scaled by 1/sqrt(d).
    for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += ATTN_THREADS) {
        const int r = i / HEAD_DIM, d = i % HEAD_DIM;
        float v = 0.0f;
        if (r < rows) {
            const int t = tok0 + r / GQA_GROUP, h = kvh * GQA_GROUP + r % GQA_GROUP;
            v = bf(q[((long long)t * heads + h) * HEAD_DIM + d]) * scale;
        }
        q_s[r][d] = v;
    }

    // K/V tiles move in 16-byte chunks: each thread owns CPT chunks of K and of V, loaded
    // into registers one tile ahead (the next tile's loads overlap this tile's math).
    constexpr int CHUNKS_PER_ROW = HEAD_DIM * 2 / 16;
    constexpr int CPT = K_TILE * CHUNKS_PER_ROW / ATTN_THREADS;
    uint4 kreg[CPT], vreg[CPT];
    auto load_tile = [&](int kt) {
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int idx = threadIdx.x + c * ATTN_THREADS;
            const int k = idx / CHUNKS_PER_ROW, ch = idx % CHUNKS_PER_ROW;
            const int kpos = kt + k;
            uint4 kz = make_uint4(0, 0, 0, 0), vz = make_uint4(0, 0, 0, 0);
            if (kpos >= lo && kpos < k_end) {
                const long long blk = table[kpos / block_size];
                const long long base =
                    ((blk * kv_heads + kvh) * block_size + kpos % block_size) * HEAD_DIM;
                kz = reinterpret_cast<const uint4*>(k_cache + base)[ch];
                vz = reinterpret_cast<const uint4*>(v_cache + base)[ch];
            }
            kreg[c] = kz;
            vreg[c] = vz;
        }
    };
    auto store_tile = [&]() {
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int idx = threadIdx.x + c * ATTN_THREADS;
            const int k = idx / CHUNKS_PER_ROW, ch = idx % CHUNKS_PER_ROW;
            unsigned int* kd = reinterpret_cast<unsigned int*>(&k_s[k][ch * 8]);
            kd[0] = kreg[c].x;
            kd[1] = kreg[c].y;
            kd[2] = kreg[c].z;
            kd[3] = kreg[c].w;
            reinterpret_cast<uint4*>(&v_s[k][0])[ch] = vreg[c];
        }
    };

    // Each warp owns rows warp, warp + ATTN_WARPS, ...; lane covers dimension pairs
    // (64 j + 2 lane, 64 j + 2 lane + 1).
    constexpr int RPW = (ROWS + ATTN_WARPS - 1) / ATTN_WARPS;
    constexpr int PAIRS = HEAD_DIM / 64;
    float acc[RPW][2 * PAIRS];
    float m_run[RPW], l_run[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        m_run[i] = NEG_INF;
        l_run[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 2 * PAIRS; j++) acc[i][j] = 0.0f;
    }
    if (k_begin < k_end) load_tile(k_begin);
    __syncthreads();

    for (int kt = k_begin; kt < k_end; kt += K_TILE) {
        store_tile();
        __syncthreads();
        if (kt + K_TILE < k_end) load_tile(kt + K_TILE);

        // Scores: lane = key, warp's rows; causal and range masks.
        const int kpos = kt + lane;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int r = warp + i * ATTN_WARPS;
            if (r >= rows) break;
            const int qpos = positions[tok0 + r / GQA_GROUP];
            float s = NEG_INF;
            if (kpos < k_end && kpos <= qpos && (window <= 0 || kpos > qpos - window)) {
                s = 0.0f;
#pragma unroll 16
                for (int d = 0; d < HEAD_DIM; d += 2) {
                    const float2 kk = __bfloat1622float2(
                        *reinterpret_cast<const __nv_bfloat162*>(&k_s[lane][d]));
                    s += q_s[r][d] * kk.x + q_s[r][d + 1] * kk.y;
                }
            }
            const float m_new = fmaxf(m_run[i], warp_max(s));
            // A row may see no valid key in this tile (its token precedes the tile).
            const float p = (m_new == NEG_INF) ? 0.0f : __expf(s - m_new);
            const float alpha = (m_run[i] == NEG_INF) ? 0.0f : __expf(m_run[i] - m_new);
            l_run[i] = l_run[i] * alpha + warp_sum(p);
            m_run[i] = m_new;
            p_s[r][lane] = p;
            if (lane == 0) row_scale[r] = alpha;
        }
        __syncwarp();

        // acc = acc * alpha + P V over this tile (rows are warp-private).
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int r = warp + i * ATTN_WARPS;
            if (r >= rows) break;
            const float alpha = row_scale[r];
#pragma unroll
            for (int j = 0; j < 2 * PAIRS; j++) acc[i][j] *= alpha;
#pragma unroll 8
            for (int k = 0; k < K_TILE; k++) {
                const float p = p_s[r][k];
#pragma unroll
                for (int j = 0; j < PAIRS; j++) {
                    const float2 vv = __bfloat1622float2(
                        *reinterpret_cast<const __nv_bfloat162*>(&v_s[k][64 * j + 2 * lane]));
                    acc[i][2 * j] += p * vv.x;
                    acc[i][2 * j + 1] += p * vv.y;
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp + i * ATTN_WARPS;
        if (r >= rows) break;
        const int t = tok0 + r / GQA_GROUP, h = kvh * GQA_GROUP + r % GQA_GROUP;
        if (num_splits == 1) {
            const float inv = l_run[i] > 0.0f ? 1.0f / l_run[i] : 0.0f;
            __nv_bfloat16* o = out + ((long long)t * heads + h) * HEAD_DIM;
#pragma unroll
            for (int j = 0; j < PAIRS; j++)
                *reinterpret_cast<__nv_bfloat162*>(o + 64 * j + 2 * lane) =
                    __floats2bfloat162_rn(acc[i][2 * j] * inv, acc[i][2 * j + 1] * inv);
        } else {
            // Partials are indexed by tile (split launches hold single-token tiles only).
            const long long p = ((long long)tile * heads + h) * num_splits + split;
#pragma unroll
            for (int j = 0; j < PAIRS; j++) {
                part_acc[p * HEAD_DIM + 64 * j + 2 * lane] = acc[i][2 * j];
                part_acc[p * HEAD_DIM + 64 * j + 2 * lane + 1] = acc[i][2 * j + 1];
            }
            if (lane == 0) {
                part_ml[2 * p] = m_run[i];
                part_ml[2 * p + 1] = l_run[i];
            }
        }
    }
}

// Merges the splits of paged_attention: one block per (single-token tile, head), HEAD_DIM
// threads.
extern "C" __global__ void attn_combine(__nv_bfloat16* out, const float* part_acc,
                                        const float* part_ml, const int* tiles, int heads,
                                        int num_splits) {
    const long long t = tiles[4 * blockIdx.x + 1];
    const long long th = (long long)blockIdx.x * heads + blockIdx.y;
    float m = NEG_INF;
    for (int s = 0; s < num_splits; s++) m = fmaxf(m, part_ml[2 * (th * num_splits + s)]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < num_splits; s++) {
        const long long p = th * num_splits + s;
        const float ms = part_ml[2 * p];
        if (ms == NEG_INF) continue;
        const float w = __expf(ms - m);
        num += w * part_acc[p * HEAD_DIM + threadIdx.x];
        den += w * part_ml[2 * p + 1];
    }
    out[(t * heads + blockIdx.y) * HEAD_DIM + threadIdx.x] = to_bf(den > 0.0f ? num / den : 0.0f);
}

// Prefill attention on tensor cores (WMMA bf16, fp32 accumulation) for tiles of several
// query tokens: the tile's PM = 64 query rows (tokens x GQA heads of one KV head) against K/V
// tiles of 32 keys read through the block table, by 8 warps. Two passes over the keys: the
// first finds each row's softmax max and sum, the second accumulates P V with the final
// normalisation, so the accumulators never need rescaling. Causal per row. Shared memory is
// dynamic (more than 48 KB): see prefill_smem_bytes on the host.
#define PM 64
#define PKT 32
#define PLD (HEAD_DIM + 8)
#define PSLD (PKT + 4)
#define PPLD (PKT + 8)
#define PWARPS 8
extern "C" __global__ void __launch_bounds__(PWARPS * 32)
prefill_attention(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                  const __nv_bfloat16* v_cache, const int* block_tables, int max_blocks,
                  const int* tiles, const int* positions, int heads, int kv_heads,
                  int block_size, float scale, int window) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 (*q_s)[PLD] = reinterpret_cast<__nv_bfloat16 (*)[PLD]>(smem);
    __nv_bfloat16 (*k_s)[PLD] = reinterpret_cast<__nv_bfloat16 (*)[PLD]>(smem + PM * PLD * 2);
    __nv_bfloat16 (*v_s)[PLD] =
        reinterpret_cast<__nv_bfloat16 (*)[PLD]>(smem + (PM + PKT) * PLD * 2);
    unsigned char* rest = smem + (PM + 2 * PKT) * PLD * 2;
    float (*s_s)[PSLD] = reinterpret_cast<float (*)[PSLD]>(rest);
    rest += PM * PSLD * 4;
    __nv_bfloat16 (*p_s)[PPLD] = reinterpret_cast<__nv_bfloat16 (*)[PPLD]>(rest);
    rest += PM * PPLD * 2;
    float* stage = reinterpret_cast<float*>(rest);  // 16 x 16 floats per warp

    // Later tiles of a prompt attend to more keys: start them first so the causal
    // imbalance does not leave a tail of long blocks.
    const int tile = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y;
    const int seq = tiles[4 * tile], tok0 = tiles[4 * tile + 1], ntok = tiles[4 * tile + 2];
    const int rows = ntok * GQA_GROUP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ctx = positions[tok0 + ntok - 1] + 1;
    // Sliding window: keys before lo are outside every row's window (their blocks may be NULL).
    const int lo = window > 0 ? max(0, positions[tok0] + 1 - window) : 0;
    const int k0 = lo / PKT * PKT;
    const int* table = block_tables + (long long)seq * max_blocks;

    for (int i = threadIdx.x; i < PM * HEAD_DIM; i += PWARPS * 32) {
        const int r = i / HEAD_DIM, d = i % HEAD_DIM;
        __nv_bfloat16 v = to_bf(0.0f);
        if (r < rows) {
            const int t = tok0 + r / GQA_GROUP, h = kvh * GQA_GROUP + r % GQA_GROUP;
            v = q[((long long)t * heads + h) * HEAD_DIM + d];
        }
        q_s[r][d] = v;
    }
    // K/V tiles move in 16-byte chunks, fetched into registers one tile ahead so that the
    // next tile's global loads overlap this tile's math (two dependent loads each: the
    // block table, then the cache).
    constexpr int CHUNKS_PER_ROW = HEAD_DIM * 2 / 16;
    constexpr int CPT = PKT * CHUNKS_PER_ROW / (PWARPS * 32);
    uint4 kreg[CPT], vreg[CPT];
    auto fetch = [&](int kt, bool with_v) {
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int idx = threadIdx.x + c * PWARPS * 32;
            const int k = idx / CHUNKS_PER_ROW, ch = idx % CHUNKS_PER_ROW;
            const int kpos = kt + k;
            uint4 kz = make_uint4(0, 0, 0, 0), vz = make_uint4(0, 0, 0, 0);
            if (kpos >= lo && kpos < ctx) {
                const long long blk = table[kpos / block_size];
                const long long base =
                    ((blk * kv_heads + kvh) * block_size + kpos % block_size) * HEAD_DIM;
                kz = reinterpret_cast<const uint4*>(k_cache + base)[ch];
                if (with_v) vz = reinterpret_cast<const uint4*>(v_cache + base)[ch];
            }
            kreg[c] = kz;
            vreg[c] = vz;
        }
    };
    auto put = [&](bool with_v) {
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int idx = threadIdx.x + c * PWARPS * 32;
            const int k = idx / CHUNKS_PER_ROW, ch = idx % CHUNKS_PER_ROW;
            reinterpret_cast<uint4*>(&k_s[k][0])[ch] = kreg[c];
            if (with_v) reinterpret_cast<uint4*>(&v_s[k][0])[ch] = vreg[c];
        }
    };
    // S = Q K^T for this key tile: warp w computes the 16x16 block (w / 2, w % 2).
    auto scores = [&]() {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        wmma::fill_fragment(c, 0.0f);
        const int wm = warp >> 1, wn = warp & 1;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM; kk += 16) {
            wmma::load_matrix_sync(a, &q_s[wm * 16][kk], PLD);
            wmma::load_matrix_sync(b, &k_s[wn * 16][kk], PLD);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(&s_s[wm * 16][wn * 16], c, PSLD, wmma::mem_row_major);
    };
    // Softmax bookkeeping: four threads per row (64 rows x 4 = 256 threads), each over 8 of
    // the tile's 32 keys; the row's max and sum live in the registers of its four threads.
    const int my_row = threadIdx.x >> 2, quarter = threadIdx.x & 3;
    const bool row_ok = my_row < rows;
    const int my_qpos = row_ok ? positions[tok0 + my_row / GQA_GROUP] : -1;
    // Scaled, masked scores of this thread's 8 keys of the current tile.
    auto my_scores = [&](int kt, float (&sv)[8]) {
        const float4 a = *reinterpret_cast<const float4*>(&s_s[my_row][quarter * 8]);
        const float4 b = *reinterpret_cast<const float4*>(&s_s[my_row][quarter * 8 + 4]);
        const float raw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int kpos = kt + quarter * 8 + i;
            const bool in_window = window <= 0 || kpos > my_qpos - window;
            sv[i] = (kpos < ctx && kpos <= my_qpos && in_window) ? raw[i] * scale : NEG_INF;
        }
    };
    float m_r = NEG_INF, l_r = 0.0f;
    __syncthreads();

    // Pass 1: softmax max and sum of every row.
    fetch(k0, false);
    for (int kt = k0; kt < ctx; kt += PKT) {
        put(false);
        __syncthreads();
        if (kt + PKT < ctx) fetch(kt + PKT, false);
        scores();
        __syncthreads();
        float sv[8];
        my_scores(kt, sv);
        float mx = NEG_INF;
#pragma unroll
        for (int i = 0; i < 8; i++) mx = fmaxf(mx, sv[i]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_r, mx);
        float sum = 0.0f;
        if (m_new != NEG_INF) {
#pragma unroll
            for (int i = 0; i < 8; i++) sum += (sv[i] == NEG_INF) ? 0.0f : __expf(sv[i] - m_new);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (m_new != NEG_INF) {
            l_r = l_r * (m_r == NEG_INF ? 0.0f : __expf(m_r - m_new)) + sum;
            m_r = m_new;
        }
        __syncthreads();
    }
    const float inv_l = l_r > 0.0f ? 1.0f / l_r : 0.0f;

    // Pass 2: O = sum over key tiles of softmax(S) V, on tensor cores. Warp w owns the
    // 16-row block w % 4 and half of the 16-column blocks.
    constexpr int CB = HEAD_DIM / 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[CB];
#pragma unroll
    for (int j = 0; j < CB; j++) wmma::fill_fragment(o[j], 0.0f);
    const int om = warp & 3, on = (warp >> 2) * CB;
    fetch(k0, true);
    for (int kt = k0; kt < ctx; kt += PKT) {
        put(true);
        __syncthreads();
        if (kt + PKT < ctx) fetch(kt + PKT, true);
        scores();
        __syncthreads();
        {
            float sv[8];
            my_scores(kt, sv);
            __align__(16) __nv_bfloat16 pv[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                pv[i] = to_bf(sv[i] == NEG_INF ? 0.0f : __expf(sv[i] - m_r) * inv_l);
            *reinterpret_cast<uint4*>(&p_s[my_row][quarter * 8]) = *reinterpret_cast<uint4*>(pv);
        }
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
#pragma unroll
        for (int kk = 0; kk < PKT; kk += 16) {
            wmma::load_matrix_sync(a, &p_s[om * 16][kk], PPLD);
#pragma unroll
            for (int j = 0; j < CB; j++) {
                wmma::load_matrix_sync(b, &v_s[kk][(on + j) * 16], PLD);
                wmma::mma_sync(o[j], a, b, o[j]);
            }
        }
        __syncthreads();
    }
    // Each warp writes its fragments through its own 16 x 16 staging tile.
    float* st = stage + warp * 256;
#pragma unroll
    for (int j = 0; j < CB; j++) {
        wmma::store_matrix_sync(st, o[j], 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int r = om * 16 + e / 16, d = (on + j) * 16 + e % 16;
            if (r < rows) {
                const int t = tok0 + r / GQA_GROUP, h = kvh * GQA_GROUP + r % GQA_GROUP;
                out[((long long)t * heads + h) * HEAD_DIM + d] = to_bf(st[e]);
            }
        }
        __syncwarp();
    }
}

// out[i] = in[rows[i]] (rows of `hidden`): the last token of each sampling sequence.
extern "C" __global__ void gather_rows(__nv_bfloat16* out, const __nv_bfloat16* in,
                                       const int* rows, int hidden) {
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x)
        out[(long long)i * hidden + j] = in[(long long)rows[i] * hidden + j];
}

// Block-wide argmax of a row (lowest index on ties); every thread gets the result.
__device__ void row_argmax(const float* row, int vocab, float& best, int& index) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    // NaN never wins; a row without a finite maximum gives 0 (as the CPU runtime).
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float v = row[j];
        if (v > bv || (v == bv && j < bi)) { bv = v; bi = j; }
    }
    if (bv == NEG_INF) bi = 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
    __syncthreads();
    bv = best_v[0];
    bi = best_i[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++)
        if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) { bv = best_v[w]; bi = best_i[w]; }
    __syncthreads();
    best = bv;
    index = (bv == NEG_INF) ? 0 : bi;
}

// Order-preserving integer key of a float (larger float, larger key).
__device__ __forceinline__ unsigned int fkey(const float f) {
    const unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Calls f(index, value) for this thread's share of a row: 16-byte loads when the row is
// 16-byte aligned (vocab a multiple of 4), so each pass of the cut searches issues a
// quarter of the loads.
template <typename F>
__device__ __forceinline__ void for_row(const float* row, int vocab, F f) {
    if ((vocab & 3) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int j = threadIdx.x; j < (vocab >> 2); j += blockDim.x) {
            const float4 v = r4[j];
            f(4 * j, v.x);
            f(4 * j + 1, v.y);
            f(4 * j + 2, v.z);
            f(4 * j + 3, v.w);
        }
    } else {
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) f(j, row[j]);
    }
}

// Token draws: draws[5 i .. 5 i + 5] = (logits row, top_k, temperature, top_p, u), the floats
// as bits. Temperature 0 or top_k 1: the argmax. Otherwise vLLM's order: softmax at the
// temperature, keep the top_k largest logits (0: all; ties at the cut kept), then the
// smallest top set whose renormalised mass reaches top_p, and take the token where the
// kept mass, accumulated in vocabulary order, passes u times its total (inverse CDF: the
// same u always gives the same token). Both cuts are exact thresholds on the logits' order
// keys, found bit by bit (32 passes over the row each) without sorting. One block per draw.
extern "C" __global__ void __launch_bounds__(1024)
sample_draws(int* ids, const float* logits, const int* draws, int vocab) {
    __shared__ float chunk_mass[1024];
    __shared__ float total_s;
    __shared__ int pick, last_kept;
    if (threadIdx.x == 0) {
        pick = -1;
        last_kept = -1;
    }
    const int* d = draws + 5 * blockIdx.x;
    const float* row = logits + (long long)d[0] * vocab;
    const int top_k = d[1];
    const float temp = __int_as_float(d[2]), top_p = __int_as_float(d[3]);
    const float u = __int_as_float(d[4]);
    float m;
    int best;
    row_argmax(row, vocab, m, best);
    if (!(temp > 0.0f) || top_k == 1) {
        if (threadIdx.x == 0) ids[blockIdx.x] = best;
        return;
    }
    const float inv_t = 1.0f / temp;
    // Top-k: the largest key K with count(key >= K) >= top_k.
    unsigned int kk = 0;
    if (top_k > 0 && top_k < vocab) {
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned int cand = kk | (1u << bit);
            float c = 0.0f;
            for_row(row, vocab, [&](int, float x) { c += fkey(x) >= cand ? 1.0f : 0.0f; });
            if (block_sum(c) >= (float)top_k) kk = cand;
        }
    }
    // Top-p: the largest key K >= kk whose kept mass reaches top_p of the top-k mass.
    unsigned int cut = kk;
    if (top_p < 1.0f) {
        float z = 0.0f;
        for_row(row, vocab, [&](int, float x) {
            if (fkey(x) >= kk) z += __expf((x - m) * inv_t);
        });
        const float target = top_p * block_sum(z);
        unsigned int kp = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned int cand = kp | (1u << bit);
            const unsigned int th = max(cand, kk);
            float s = 0.0f;
            for_row(row, vocab, [&](int, float x) {
                if (fkey(x) >= th) s += __expf((x - m) * inv_t);
            });
            if (block_sum(s) >= target) kp = cand;
        }
        cut = max(kp, kk);
    }
    // Inverse CDF in vocabulary order over contiguous per-thread chunks: thread 0 scans
    // the chunk masses, the chunk holding u * total finds the token.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int lo = min(vocab, (int)threadIdx.x * chunk), hi = min(vocab, lo + chunk);
    float mass = 0.0f;
    int last = -1;
    for (int j = lo; j < hi; j++)
        if (fkey(row[j]) >= cut) { mass += __expf((row[j] - m) * inv_t); last = j; }
    chunk_mass[threadIdx.x] = mass;
    atomicMax(&last_kept, last);
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < (int)blockDim.x; t++) {
            const float c = chunk_mass[t];
            chunk_mass[t] = total;  // exclusive prefix
            total += c;
        }
        total_s = total;
    }
    __syncthreads();
    const float target = u * total_s;
    const float prefix = chunk_mass[threadIdx.x];
    const float next = threadIdx.x + 1 < blockDim.x ? chunk_mass[threadIdx.x + 1] : total_s;
    // Exactly one chunk owns the target (next is the same float sum the scan made).
    if (mass > 0.0f && prefix <= target && target < next) {
        float acc = prefix;
        int got = last;
        for (int j = lo; j < hi; j++) {
            if (fkey(row[j]) >= cut) {
                acc += __expf((row[j] - m) * inv_t);
                if (acc > target) { got = j; break; }
            }
        }
        pick = got;
    }
    __syncthreads();
    // u * total rounded up to the total: the last kept token (the argmax if none is).
    if (threadIdx.x == 0) ids[blockIdx.x] = pick >= 0 ? pick : (last_kept >= 0 ? last_kept : best);
}

__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = to_bf(v); }

// Skinny GEMM for decode steps: out[t][n] = sum_k x[t][k] w[n][k] for t < tokens <= T.
// Weight-streaming bound (each weight is used T times at most): one warp per output row,
// each lane reading 16 bytes (8 weights) per load with several loads in flight, the
// activations (T x k, a few KB) served from L1/L2. k is a multiple of 8 (host-checked).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    // Streamed once: do not keep the weights in L1.
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// acc[t] += dot(8 weights, 8 activations of row t at chunk i).
template <int T>
__device__ __forceinline__ void skinny_dot(float (&acc)[T], const uint4 wv, const __nv_bfloat16* x,
                                           int tokens, int k, int i) {
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
    float2 wf[4];
#pragma unroll
    for (int j = 0; j < 4; j++) wf[j] = __bfloat1622float2(wp[j]);
#pragma unroll
    for (int t = 0; t < T; t++) {
        if (t < tokens) {
            const uint4 xv = reinterpret_cast<const uint4*>(x + (long long)t * k)[i];
            const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 xf = __bfloat1622float2(xp[j]);
                acc[t] += wf[j].x * xf.x + wf[j].y * xf.y;
            }
        }
    }
}

template <int T, typename OutT>
__device__ __forceinline__ void skinny_gemm(OutT* out, const __nv_bfloat16* x,
                                            const __nv_bfloat16* w, int tokens, int k, int n) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= n) return;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (long long)row * k);
    const int k8 = k >> 3;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    // Four 16-byte weight loads in flight per lane before the first use.
    constexpr int U = 4;
    int i = lane;
    for (; i + 32 * (U - 1) < k8; i += 32 * U) {
        uint4 wv[U];
#pragma unroll
        for (int u = 0; u < U; u++) wv[u] = load_stream(wr + i + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) skinny_dot<T>(acc, wv[u], x, tokens, k, i + 32 * u);
    }
    for (; i < k8; i += 32) skinny_dot<T>(acc, load_stream(wr + i), x, tokens, k, i);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0 && t < tokens) store_out(out + (long long)t * n + row, v);
    }
}

#define SKINNY(T)                                                                             \
    extern "C" __global__ void skinny_gemm_bf16_##T(__nv_bfloat16* out,                      \
                                                    const __nv_bfloat16* x,                  \
                                                    const __nv_bfloat16* w, int tokens,      \
                                                    int k, int n) {                          \
        skinny_gemm<T, __nv_bfloat16>(out, x, w, tokens, k, n);                               \
    }                                                                                         \
    extern "C" __global__ void skinny_gemm_f32_##T(float* out, const __nv_bfloat16* x,       \
                                                   const __nv_bfloat16* w, int tokens, int k, \
                                                   int n) {                                   \
        skinny_gemm<T, float>(out, x, w, tokens, k, n);                                       \
    }
SKINNY(1)
SKINNY(2)
SKINNY(4)
SKINNY(8)

// Copies whole KV blocks of one layer's K or V cache: pairs[2 i] of src to pairs[2 i + 1] of
// dst, block_elems bf16 each (a multiple of 8). Copy-on-write uses src == dst (the GPU
// cache); swapping uses the mapped pinned host pool on one side. One thread block per pair.
extern "C" __global__ void copy_blocks(__nv_bfloat16* dst, const __nv_bfloat16* src,
                                       const int* pairs, long long block_elems) {
    const long long s = pairs[2 * blockIdx.x], d = pairs[2 * blockIdx.x + 1];
    const uint4* from = reinterpret_cast<const uint4*>(src + s * block_elems);
    uint4* to = reinterpret_cast<uint4*>(dst + d * block_elems);
    for (long long i = threadIdx.x; i < block_elems / 8; i += blockDim.x) to[i] = from[i];
}
