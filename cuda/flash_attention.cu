// Prompt attention on tensor cores, FlashAttention-2 style: causal GQA over a preallocated KV cache
// [n_ctx, Hkv, D] (float32 or float16; the first n_kv rows valid), q [T, H, D] float32 at absolute
// positions pos [T], out [T, H*D] float32. Key j is visible to row t iff j <= pos[t]. Twin:
// NumpyOps.attention (the float32 CUDA-core kernel in attention.cu is the exact-math check path).
//
// A block of 8 warps serves HB heads of one KV group (HB = the heads sharing a KV head, up to 8) over
// 128 / HB positions, so every K/V tile it loads feeds 128 query rows; warp w owns 16 positions of
// head (w % HB). q, K, V and the softmax weights P enter the tensor cores as fp16 (mma.sync m16n8k16,
// float32 accumulation, operands through ldmatrix, V's transposed); the online softmax (running max
// per row in the raw-score domain, exp2 of the scaled difference) stays in the registers of the mma
// accumulator layout: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and 2t + 1
// of each 8-wide tile. The accumulator of S for keys 16k..16k+15 is exactly the A operand of the P V
// product, so P never touches shared memory.
//
// Head dims up to 128 (flash_tiled): each warp holds its q rows as mma fragments in registers for the
// whole key loop, and K/V tiles of BK keys rotate through two shared-memory stages, one sync per tile:
// a float16 cache arrives by cp.async straight into the stage the warps are not reading (BK =
// FLASH_F16_KEYS, 64 unless the wrapper builds 32); a float32 one is fetched into registers during the
// tile and converted into that stage after it (BK = 32, to bound registers). Head dim 256
// (flash_staged): q sits in shared memory beside one K/V tile of 16 keys fetched through registers (its
// q fragments alone would take 64 registers a thread).
//
// Row invariance (a row's bits must not depend on the rows sharing its launch): every row walks the
// same tiles from key 0 in order, and a tile past a row's position that its warp computes anyway
// (another row of the warp sees it) changes nothing: its scores are -inf, the running max stays, the
// rescale factor is exactly 1 (chosen, not computed), exp2(-inf) = 0 adds 0 to the sums and 0 * V to
// the output. Masking is skipped only for tiles every row of the warp sees entirely, where it is a
// no-op. Key tiles past the block's last visible key are never loaded; keys past n_kv are loaded as
// zeros (V rows past n_kv may hold anything, and 0 * NaN would poison a row).
#include "tensor_core.cuh"

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f
#define FLASH_WARPS 8
#define FLASH_ROWS (16 * FLASH_WARPS)
#define FLASH_THREADS (32 * FLASH_WARPS)
// Keys per tile of a float16 cache up to head dim 128 (the wrapper passes -DFLASH_F16_KEYS): 64 holds
// about 210 registers a thread (head dim 128), so one block (8 warps) per SM; 32 is built for two blocks
// per SM (128 registers, a few bytes spilled at head dim 128).
#ifndef FLASH_F16_KEYS
#define FLASH_F16_KEYS 64
#endif
#define FLASH_F16_BLOCKS_PER_SM (FLASH_F16_KEYS == 32 ? 2 : 1)

extern __shared__ __align__(16) unsigned char flash_smem[];

// MUFU.EX2 without exp2f's denormal scaling: ex2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned pack_floats(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower k index of the pair
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ unsigned pack2(const float* p) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    return pack_floats(v.x, v.y);
}

__device__ __forceinline__ uint2 fetch4(const float* p) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    return make_uint2(pack_floats(v.x, v.y), pack_floats(v.z, v.w));
}

__device__ __forceinline__ uint2 fetch4(const __half* p) { return *reinterpret_cast<const uint2*>(p); }

// One K and one V tile of BK keys x `cols` dims (D, or DCAP with zeros past D) of KV head g in
// registers, 4 values per item.
template <typename KV, int BK, int DCAP>
struct KVTile {
    static constexpr int ITEMS = (BK * DCAP / 4 + FLASH_THREADS - 1) / FLASH_THREADS;  // per thread
    uint2 k[ITEMS], v[ITEMS];

    __device__ __forceinline__ void fetch(const KV* __restrict__ kc, const KV* __restrict__ vc, int k0, int n_kv,
                                          size_t row_stride, int D, int cols) {
        const int d4 = cols / 4;
#pragma unroll
        for (int u = 0; u < ITEMS; ++u) {
            const int idx = threadIdx.x + u * FLASH_THREADS, j = idx / d4, c = 4 * (idx - j * d4);
            k[u] = v[u] = make_uint2(0u, 0u);
            if (idx < BK * d4 && k0 + j < n_kv && c < D) {
                k[u] = fetch4(kc + (k0 + j) * row_stride + c);
                v[u] = fetch4(vc + (k0 + j) * row_stride + c);
            }
        }
    }

    __device__ __forceinline__ void store(__half* sk, __half* sv, int cols, int ld) const {
        const int d4 = cols / 4;
#pragma unroll
        for (int u = 0; u < ITEMS; ++u) {
            const int idx = threadIdx.x + u * FLASH_THREADS, j = idx / d4, c = 4 * (idx - j * d4);
            if (idx < BK * d4) {
                *reinterpret_cast<uint2*>(sk + j * ld + c) = k[u];
                *reinterpret_cast<uint2*>(sv + j * ld + c) = v[u];
            }
        }
    }
};

// Copies a K and a V tile [BK][DCAP] of a float16 cache into shared memory (row stride DCAP + 8) by
// cp.async, 16 bytes per item; columns past D and rows past n_kv are zero-filled (their source clamped to
// the head's first element, which a zero-byte copy does not read). Thread i copies column chunk
// i % (DCAP / 8) of rows i / (DCAP / 8) + u * (256 / (DCAP / 8)); its offsets are fixed per tile.
template <int BK, int DCAP>
struct TileCopier {
    static constexpr int CHUNKS = DCAP / 8, ROWS_PER_PASS = FLASH_THREADS / CHUNKS, LD = DCAP + 8;
    static_assert(FLASH_THREADS % CHUNKS == 0 && BK % ROWS_PER_PASS == 0, "passes must tile BK x DCAP exactly");
    int row, col, shared_offset;
    size_t global_offset, pass_stride;

    __device__ __forceinline__ explicit TileCopier(size_t row_stride)
        : row(threadIdx.x / CHUNKS), col(8 * (threadIdx.x % CHUNKS)), shared_offset(row * LD + col),
          global_offset(row * row_stride + col), pass_stride(ROWS_PER_PASS * row_stride) {}

    __device__ __forceinline__ void issue(const __half* __restrict__ kh, const __half* __restrict__ vh, __half* sk,
                                          int k0, int n_kv, size_t row_stride, int D) const {
        const size_t base = (size_t)k0 * row_stride + global_offset;
        const int rows_left = col < D ? n_kv - k0 - row : 0;  // this thread's rows of the tile below n_kv
#pragma unroll
        for (int u = 0; u < BK / ROWS_PER_PASS; ++u) {
            const bool valid = u * ROWS_PER_PASS < rows_left;
            const size_t src = valid ? base + u * pass_stride : 0;
            __half* dst = sk + shared_offset + u * ROWS_PER_PASS * LD;
            cp_async_16(dst, kh + src, valid ? 16 : 0);
            cp_async_16(dst + BK * LD, vh + src, valid ? 16 : 0);
        }
    }
};

// The KV head, query head and first position (row of q) of this warp. Grid (H / HB, ceil(T / (128 / HB))):
// the position blocks run last to first, so with ascending positions the longest blocks start first.
__device__ __forceinline__ void flash_warp_rows(int H, int Hkv, int HB, int warp, int& g, int& h, int& t0) {
    const int G = H / Hkv, per_group = G / HB;
    g = blockIdx.x / per_group;
    h = g * G + (blockIdx.x % per_group) * HB + warp % HB;
    t0 = (gridDim.y - 1 - blockIdx.y) * (FLASH_ROWS / HB) + 16 * (warp / HB);
}

// Head dims up to DCAP = 64 or 128: q fragments in registers, K/V tiles of BK keys in two shared-memory
// stages [stage][K, V][BK][DCAP + 8] fp16, filled by cp.async (ASYNC, float16 cache) or through registers.
// A smaller D (a multiple of 32) runs at DCAP with zeros past D in q and in the tiles: the extra
// products are exact zeros, and the loops carry no runtime bounds to split them into small blocks.
template <typename KV, int DCAP, int BK, bool ASYNC>
__device__ __forceinline__ void flash_tiled(const float* __restrict__ q, const KV* __restrict__ kc,
                                            const KV* __restrict__ vc, const int* __restrict__ pos,
                                            float* __restrict__ out, int T, int H, int Hkv, int D, int n_kv, int HB,
                                            float scale) {
    constexpr int NT = BK / 8, OT = DCAP / 8, QT = DCAP / 16;
    constexpr int LD = DCAP + 8;  // 16 bytes of padding: ldmatrix's 8 row addresses hit distinct banks
    constexpr int STAGE = 2 * BK * LD;  // halves: a K and a V tile
    __shared__ int s_last[FLASH_WARPS];
    __half* const s_kv = reinterpret_cast<__half*>(flash_smem);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tc = lane & 3;
    int g, h, t0;
    flash_warp_rows(H, Hkv, HB, warp, g, h, t0);
    const int r0 = t0 + gr, r1 = r0 + 8;  // this lane's two rows
    const int p0 = r0 < T ? min(pos[r0], n_kv - 1) : -1, p1 = r1 < T ? min(pos[r1], n_kv - 1) : -1;
    int warp_last = max(p0, p1), warp_first = min(p0, p1);
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) {  // over the 8 row groups
        warp_last = max(warp_last, __shfl_xor_sync(FULL_MASK, warp_last, m));
        warp_first = min(warp_first, __shfl_xor_sync(FULL_MASK, warp_first, m));
    }
    if (lane == 0) s_last[warp] = warp_last;

    // The A fragments of the warp's 16 rows of q (rounded to fp16 once), straight from global memory.
    unsigned qf[QT][4];
#pragma unroll
    for (int kk = 0; kk < QT; ++kk) {
        qf[kk][0] = qf[kk][1] = qf[kk][2] = qf[kk][3] = 0u;
        const int c = 16 * kk + 2 * tc;
        if (16 * kk < D) {
            if (r0 < T) {
                const float* qr = q + ((size_t)r0 * H + h) * D + c;
                qf[kk][0] = pack2(qr);
                qf[kk][2] = pack2(qr + 8);
            }
            if (r1 < T) {
                const float* qr = q + ((size_t)r1 * H + h) * D + c;
                qf[kk][1] = pack2(qr);
                qf[kk][3] = pack2(qr + 8);
            }
        }
    }
    __syncthreads();
    int key_end = 0;
    for (int w = 0; w < FLASH_WARPS; ++w) key_end = max(key_end, s_last[w] + 1);

    const float sl2 = scale * LOG2E;
    const size_t row_stride = (size_t)Hkv * D;
    const KV* kh = kc + (size_t)g * D;
    const KV* vh = vc + (size_t)g * D;
    const int lr = lane & 7, lm = lane >> 3;  // ldmatrix: this lane's row within its matrix, and the matrix

    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;  // running max (raw scores) and partial sums
    float o[OT][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    KVTile<KV, BK, DCAP> staged;  // the float32 cache's next tile, converted to fp16
    const TileCopier<BK, DCAP> copier(row_stride);  // the float16 cache's
    if (key_end > 0) {
        if constexpr (ASYNC) {
            copier.issue(kh, vh, s_kv, 0, n_kv, row_stride, D);
        } else {
            staged.fetch(kh, vh, 0, n_kv, row_stride, D, DCAP);
            staged.store(s_kv, s_kv + BK * LD, DCAP, LD);
        }
    }
    if constexpr (ASYNC) cp_async_commit();
    for (int k0 = 0, stage = 0; k0 < key_end; k0 += BK, stage ^= 1) {
        if constexpr (ASYNC) cp_async_wait<0>();  // this thread's part of tile k0 (the only group in flight)
        // Tile k0 is in its stage for every warp, and every warp is done with the other stage (tile k0 - BK).
        __syncthreads();
        const __half* sk = s_kv + stage * STAGE;
        const __half* sv = sk + BK * LD;
        __half* nk = s_kv + (stage ^ 1) * STAGE;
        const bool more = k0 + BK < key_end;
        if constexpr (ASYNC) {
            if (more) copier.issue(kh, vh, nk, k0 + BK, n_kv, row_stride, D);
            cp_async_commit();
        } else {
            if (more) staged.fetch(kh, vh, k0 + BK, n_kv, row_stride, D, DCAP);  // lands during this tile
        }

        if (k0 <= warp_last) {  // else no key of this tile is visible to any of the warp's rows
            float s[NT][4];
#pragma unroll
            for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < QT; ++kk) {
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned b[4];  // keys 8j.. and 8(j+1).., dims 16kk.. and 16kk+8..
                    ldsm_x4(b, sk + (8 * (j + (lm >> 1)) + lr) * LD + 16 * kk + (lm & 1) * 8);
                    mma_16816(s[j], qf[kk], b[0], b[1]);
                    mma_16816(s[j + 1], qf[kk], b[2], b[3]);
                }
            }

            if (k0 + BK - 1 > warp_first) {  // some key of the tile is past some row's position
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int key = k0 + 8 * j + 2 * tc;
                    s[j][0] = key <= p0 ? s[j][0] : NEG_INF;
                    s[j][1] = key + 1 <= p0 ? s[j][1] : NEG_INF;
                    s[j][2] = key <= p1 ? s[j][2] : NEG_INF;
                    s[j][3] = key + 1 <= p1 ? s[j][3] : NEG_INF;
                }
            }
            float mx0 = m0, mx1 = m1;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
            }
            // A row's scores of this tile live in the 4 lanes of its group.
            mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
            // Exactly 1 when the max stays (a tile with nothing visible to the row must change nothing).
            const float al0 = mx0 == m0 ? 1.f : fast_exp2((m0 - mx0) * sl2);
            const float al1 = mx1 == m1 ? 1.f : fast_exp2((m1 - mx1) * sl2);
            m0 = mx0;
            m1 = mx1;
            // exp2(s * sl2 - max * sl2) as one FMA; a row with no visible key yet has only -inf scores -> 0.
            const float ms0 = mx0 == NEG_INF ? 0.f : mx0 * sl2, ms1 = mx1 == NEG_INF ? 0.f : mx1 * sl2;
            float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                s[j][0] = fast_exp2(fmaf(s[j][0], sl2, -ms0));
                s[j][1] = fast_exp2(fmaf(s[j][1], sl2, -ms0));
                s[j][2] = fast_exp2(fmaf(s[j][2], sl2, -ms1));
                s[j][3] = fast_exp2(fmaf(s[j][3], sl2, -ms1));
                rs0 += s[j][0] + s[j][1];
                rs1 += s[j][2] + s[j][3];
            }
            l0 = l0 * al0 + rs0;
            l1 = l1 * al1 + rs1;
            if (__any_sync(FULL_MASK, al0 != 1.f || al1 != 1.f)) {  // past the first tiles the max mostly stays
#pragma unroll
                for (int n = 0; n < OT; ++n) {
                    o[n][0] *= al0;
                    o[n][1] *= al0;
                    o[n][2] *= al1;
                    o[n][3] *= al1;
                }
            }

#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const unsigned a[4] = {pack_floats(s[2 * kk][0], s[2 * kk][1]), pack_floats(s[2 * kk][2], s[2 * kk][3]),
                                       pack_floats(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                       pack_floats(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int n = 0; n < OT; n += 2) {
                    unsigned b[4];  // keys 16kk.. and 16kk+8.., dims 8n.. and 8(n+1)..
                    ldsm_x4_trans(b, sv + (16 * kk + (lm & 1) * 8 + lr) * LD + 8 * (n + (lm >> 1)));
                    mma_16816(o[n], a, b[0], b[1]);
                    mma_16816(o[n + 1], a, b[2], b[3]);
                }
            }
        }
        if constexpr (!ASYNC) {
            if (more) staged.store(nk, nk + BK * LD, DCAP, LD);  // the next sync publishes it
        }
    }

    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;  // rows past T (l = 0) are not written
#pragma unroll
    for (int n = 0; n < OT; ++n) {
        if (8 * n >= D) break;
        const int col = 8 * n + 2 * tc;
        if (r0 < T)
            *reinterpret_cast<float2*>(out + ((size_t)r0 * H + h) * D + col) = make_float2(o[n][0] * inv0, o[n][1] * inv0);
        if (r1 < T)
            *reinterpret_cast<float2*>(out + ((size_t)r1 * H + h) * D + col) = make_float2(o[n][2] * inv1, o[n][3] * inv1);
    }
}

// Head dim cap 256: q in shared memory [128][D + 8] fp16 beside one K and one V tile [BK][D + 8], the next
// tile fetched into registers during the current one (two syncs per tile).
template <typename KV, int DCAP, int BK>
__device__ __forceinline__ void flash_staged(const float* __restrict__ q, const KV* __restrict__ kc,
                                             const KV* __restrict__ vc, const int* __restrict__ pos,
                                             float* __restrict__ out, int T, int H, int Hkv, int D, int n_kv,
                                             int HB, float scale) {
    constexpr int NT = BK / 8, OT = DCAP / 8;
    __shared__ int s_pos[FLASH_ROWS];
    __shared__ int s_last[FLASH_WARPS];
    const int ld = D + 8;  // 16 bytes of padding: ldmatrix's 8 row addresses hit distinct banks
    __half* sq = reinterpret_cast<__half*>(flash_smem);
    __half* sk = sq + FLASH_ROWS * ld;
    __half* sv = sk + BK * ld;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tc = lane & 3;
    int g, h, t0;
    flash_warp_rows(H, Hkv, HB, warp, g, h, t0);

    // Warp w's 16 rows of q (its head, its positions) into sq rows 16w.., and their key limits.
    if (lane < 16) s_pos[16 * warp + lane] = t0 + lane < T ? min(pos[t0 + lane], n_kv - 1) : -1;
    for (int idx = lane; idx < 16 * (D / 4); idx += 32) {
        const int r = idx / (D / 4), c = 4 * (idx - r * (D / 4));
        uint2 v = make_uint2(0u, 0u);
        if (t0 + r < T) v = fetch4(q + ((size_t)(t0 + r) * H + h) * D + c);
        *reinterpret_cast<uint2*>(sq + (16 * warp + r) * ld + c) = v;
    }
    __syncthreads();
    if (lane == 0) {
        int last = -1;
        for (int i = 0; i < 16; ++i) last = max(last, s_pos[16 * warp + i]);
        s_last[warp] = last;
    }
    __syncthreads();
    int key_end = 0;
    for (int w = 0; w < FLASH_WARPS; ++w) key_end = max(key_end, s_last[w] + 1);
    const int warp_last = s_last[warp];
    const int p0 = s_pos[16 * warp + gr], p1 = s_pos[16 * warp + gr + 8];
    const float sl2 = scale * LOG2E;
    const size_t row_stride = (size_t)Hkv * D;
    const KV* kh = kc + (size_t)g * D;
    const KV* vh = vc + (size_t)g * D;
    const int lr = lane & 7, lm = lane >> 3;  // ldmatrix: this lane's row within its matrix, and the matrix

    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;  // running max (raw scores) and partial sums
    float o[OT][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    KVTile<KV, BK, DCAP> tile;
    if (key_end > 0) tile.fetch(kh, vh, 0, n_kv, row_stride, D, D);
    for (int k0 = 0; k0 < key_end; k0 += BK) {
        __syncthreads();  // every warp is done with the previous tile
        tile.store(sk, sv, D, ld);
        __syncthreads();
        if (k0 + BK < key_end) tile.fetch(kh, vh, k0 + BK, n_kv, row_stride, D, D);  // lands during this tile
        if (k0 > warp_last) continue;  // no key of this tile is visible to any of the warp's rows

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DCAP / 16; ++kk) {
            if (16 * kk >= D) break;
            unsigned a[4];
            ldsm_x4(a, sq + (16 * warp + (lm & 1) * 8 + lr) * ld + 16 * kk + (lm >> 1) * 8);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                unsigned b[4];  // keys 8j.. and 8(j+1).., dims 16kk.. and 16kk+8..
                ldsm_x4(b, sk + (8 * (j + (lm >> 1)) + lr) * ld + 16 * kk + (lm & 1) * 8);
                mma_16816(s[j], a, b[0], b[1]);
                mma_16816(s[j + 1], a, b[2], b[3]);
            }
        }

        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int key = k0 + 8 * j + 2 * tc;
            s[j][0] = key <= p0 ? s[j][0] : NEG_INF;
            s[j][1] = key + 1 <= p0 ? s[j][1] : NEG_INF;
            s[j][2] = key <= p1 ? s[j][2] : NEG_INF;
            s[j][3] = key + 1 <= p1 ? s[j][3] : NEG_INF;
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        // A row's scores of this tile live in the 4 lanes of its group.
        mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
        const float mu0 = mx0 == NEG_INF ? 0.f : mx0, mu1 = mx1 == NEG_INF ? 0.f : mx1;  // rows with no key yet
        const float al0 = exp2f((m0 - mu0) * sl2), al1 = exp2f((m1 - mu1) * sl2);
        m0 = mx0;
        m1 = mx1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            s[j][0] = exp2f((s[j][0] - mu0) * sl2);
            s[j][1] = exp2f((s[j][1] - mu0) * sl2);
            s[j][2] = exp2f((s[j][2] - mu1) * sl2);
            s[j][3] = exp2f((s[j][3] - mu1) * sl2);
            rs0 += s[j][0] + s[j][1];
            rs1 += s[j][2] + s[j][3];
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
#pragma unroll
        for (int n = 0; n < OT; ++n) {
            o[n][0] *= al0;
            o[n][1] *= al0;
            o[n][2] *= al1;
            o[n][3] *= al1;
        }

#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const unsigned a[4] = {pack_floats(s[2 * kk][0], s[2 * kk][1]), pack_floats(s[2 * kk][2], s[2 * kk][3]),
                                   pack_floats(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_floats(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < OT; n += 2) {
                if (8 * n >= D) break;
                unsigned b[4];  // keys 16kk.. and 16kk+8.., dims 8n.. and 8(n+1)..
                ldsm_x4_trans(b, sv + (16 * kk + (lm & 1) * 8 + lr) * ld + 8 * (n + (lm >> 1)));
                mma_16816(o[n], a, b[0], b[1]);
                mma_16816(o[n + 1], a, b[2], b[3]);
            }
        }
    }

    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    const int r0 = t0 + gr, r1 = r0 + 8;
#pragma unroll
    for (int n = 0; n < OT; ++n) {
        if (8 * n >= D) break;
        const int col = 8 * n + 2 * tc;
        if (r0 < T)
            *reinterpret_cast<float2*>(out + ((size_t)r0 * H + h) * D + col) = make_float2(o[n][0] / l0, o[n][1] / l0);
        if (r1 < T)
            *reinterpret_cast<float2*>(out + ((size_t)r1 * H + h) * D + col) = make_float2(o[n][2] / l1, o[n][3] / l1);
    }
}

// Shared memory (dynamic): flash_tiled 2 stages x (K, V) x BK x (DCAP + 8) fp16 (69,632 bytes at DCAP =
// 128, BK = 64), flash_staged (128 + 2 BK) (D + 8) fp16 (84,480 at D = 256): under the 99 KiB a block
// may use on consumer cards (sm_86/sm_89). BK per cache type and cap also bounds registers
// (accumulators, q fragments, scores, and the float32 cache's prefetched tile).
// grid (H / HB, ceil(T / (128 / HB))), 256 threads; HB divides both H / Hkv and 8.
#define FLASH_KERNEL(KVT, TAG, DCAP, BLOCKS_PER_SM, BODY, ...)                                           \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, BLOCKS_PER_SM)                           \
        flash_prefill_##TAG##_d##DCAP(const float* q, const KVT* kc, const KVT* vc, const int* pos,       \
                                      float* out, int T, int H, int Hkv, int D, int n_kv, int HB,         \
                                      float scale) {                                                      \
        BODY<KVT, DCAP, __VA_ARGS__>(q, kc, vc, pos, out, T, H, Hkv, D, n_kv, HB, scale);                 \
    }

FLASH_KERNEL(float, f32, 64, 1, flash_tiled, 32, false)
FLASH_KERNEL(float, f32, 128, 1, flash_tiled, 32, false)
FLASH_KERNEL(float, f32, 256, 1, flash_staged, 16)
FLASH_KERNEL(__half, f16, 64, FLASH_F16_BLOCKS_PER_SM, flash_tiled, FLASH_F16_KEYS, true)
FLASH_KERNEL(__half, f16, 128, FLASH_F16_BLOCKS_PER_SM, flash_tiled, FLASH_F16_KEYS, true)
FLASH_KERNEL(__half, f16, 256, 1, flash_staged, 16)
