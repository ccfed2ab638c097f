// Prompt attention on tensor cores, FlashAttention-2 style: causal GQA over a preallocated KV cache
// [n_ctx, Hkv, D] (float32 or float16; the first n_kv rows valid), q [T, H, D] float32 at absolute
// positions pos [T], out [T, H*D] float32. Key j is visible to row t iff j <= pos[t]. Twin:
// NumpyOps.attention (the float32 CUDA-core kernel in attention.cu is the exact-math check path).
//
// A block of 8 warps serves HB heads of one KV group (HB = the heads sharing a KV head, up to 8) over
// 128 / HB positions, so every K/V tile it loads feeds 128 query rows; warp w owns 16 positions of
// head (w % HB). Per key tile of BK keys, q, K and V sit in shared memory as fp16 (q rounded once;
// K/V converted as they arrive), S = q K^T and O += P V run as mma.sync m16n8k16 with float32
// accumulation (operands through ldmatrix; V's transposed), and the online softmax (running max and
// sum per row in the raw-score domain, exp2 of the scaled difference) stays in the registers of the
// mma accumulator layout: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and
// 2t + 1 of each 8-wide tile. The accumulator of S for keys 16k..16k+15 is exactly the A operand of
// the P V product, so P never touches shared memory. The next tile's K/V are fetched into registers
// while the current one computes. Key tiles past the block's last visible key are never loaded; keys
// past n_kv are loaded as zeros (V rows past n_kv may hold anything, and 0 * NaN would poison a row).
#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f
#define FLASH_WARPS 8
#define FLASH_ROWS (16 * FLASH_WARPS)
#define FLASH_THREADS (32 * FLASH_WARPS)

extern __shared__ __align__(16) unsigned char flash_smem[];

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 fp16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const __half* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const __half* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ unsigned pack_floats(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower k index of the pair
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ uint2 fetch4(const float* p) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    return make_uint2(pack_floats(v.x, v.y), pack_floats(v.z, v.w));
}

__device__ __forceinline__ uint2 fetch4(const __half* p) { return *reinterpret_cast<const uint2*>(p); }

// One K and one V tile of BK keys x D dims of KV head g in registers, 4 values per item.
template <typename KV, int BK, int DCAP>
struct KVTile {
    static constexpr int ITEMS = (BK * DCAP / 4 + FLASH_THREADS - 1) / FLASH_THREADS;  // per thread
    uint2 k[ITEMS], v[ITEMS];

    __device__ __forceinline__ void fetch(const KV* __restrict__ kc, const KV* __restrict__ vc, int k0, int n_kv,
                                          size_t row_stride, int D) {
        const int d4 = D / 4;
#pragma unroll
        for (int u = 0; u < ITEMS; ++u) {
            const int idx = threadIdx.x + u * FLASH_THREADS, j = idx / d4, c = 4 * (idx - j * d4);
            k[u] = v[u] = make_uint2(0u, 0u);
            if (idx < BK * d4 && k0 + j < n_kv) {
                k[u] = fetch4(kc + (k0 + j) * row_stride + c);
                v[u] = fetch4(vc + (k0 + j) * row_stride + c);
            }
        }
    }

    __device__ __forceinline__ void store(__half* sk, __half* sv, int D, int ld) const {
        const int d4 = D / 4;
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

template <typename KV, int DCAP, int BK>
__device__ __forceinline__ void flash_prefill(const float* __restrict__ q, const KV* __restrict__ kc,
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
    const int G = H / Hkv, P = FLASH_ROWS / HB;               // heads per KV head, positions per block
    const int g = blockIdx.y / (G / HB), h = g * G + (blockIdx.y % (G / HB)) * HB + warp % HB;
    const int t0 = blockIdx.x * P + 16 * (warp / HB);         // this warp's first position (row of q)

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
    if (key_end > 0) tile.fetch(kh, vh, 0, n_kv, row_stride, D);
    for (int k0 = 0; k0 < key_end; k0 += BK) {
        __syncthreads();  // every warp is done with the previous tile
        tile.store(sk, sv, D, ld);
        __syncthreads();
        if (k0 + BK < key_end) tile.fetch(kh, vh, k0 + BK, n_kv, row_stride, D);  // lands during this tile
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

// BK per head-dim cap keeps shared memory ((128 + 2 BK) (D + 8) fp16) under the 99 KiB a block may
// use on consumer cards (sm_86/sm_89), and the accumulators plus the prefetched tile in registers.
// grid (ceil(T / (128 / HB)), Hkv * (H / Hkv) / HB), 256 threads; HB divides both H / Hkv and 8.
#define FLASH_KERNEL(KVT, TAG, DCAP, BK)                                                                  \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS)                                          \
        flash_prefill_##TAG##_d##DCAP(const float* q, const KVT* kc, const KVT* vc, const int* pos,       \
                                      float* out, int T, int H, int Hkv, int D, int n_kv, int HB,         \
                                      float scale) {                                                      \
        flash_prefill<KVT, DCAP, BK>(q, kc, vc, pos, out, T, H, Hkv, D, n_kv, HB, scale);                 \
    }

FLASH_KERNEL(float, f32, 64, 32)
FLASH_KERNEL(float, f32, 128, 32)
FLASH_KERNEL(float, f32, 256, 16)
FLASH_KERNEL(__half, f16, 64, 32)
FLASH_KERNEL(__half, f16, 128, 32)
FLASH_KERNEL(__half, f16, 256, 16)
