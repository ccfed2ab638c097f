// Prompt attention on tensor cores, FlashAttention-2 style: causal GQA over a preallocated KV cache
// [n_ctx, Hkv, D] (float32 or float16; the first n_kv rows valid), q [T, H, D] float32 at absolute
// positions pos [T], out [T, H*D] float32. Key j is visible to row t iff j <= pos[t]. Twin:
// NumpyOps.attention (the float32 CUDA-core kernel in attention.cu is the exact-math check path).
//
// A block owns 16 * WARPS query rows of one head; warp w owns rows 16w..16w+15. Per key tile of BK
// keys, q, K and V sit in shared memory as fp16 (q rounded once; K/V converted on load), S = q K^T
// and O += P V run as mma.sync m16n8k16 with fp32 accumulation, and the online softmax (running max
// and sum per row, in the raw-score domain, exp2 of the scaled difference) stays in the registers
// of the mma accumulator layout: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns
// 2t and 2t + 1 of each 8-wide tile. The accumulator of S for keys 16k..16k+15 is exactly the A
// operand layout of the P V product, so P never touches shared memory. Key tiles past the block's
// last visible key are never loaded; keys past n_kv are loaded as zeros (V rows past n_kv may hold
// anything, and 0 * NaN would poison a row).
#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.4426950408889634f

extern __shared__ __align__(16) unsigned char flash_smem[];

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_floats(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower k index of the pair
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ unsigned pack_halves(__half lo, __half hi) {
    __half2 h = __halves2half2(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ void store4(__half* dst, const float* src) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(v.x, v.y);
    *reinterpret_cast<__half2*>(dst + 2) = __floats2half2_rn(v.z, v.w);
}

__device__ __forceinline__ void store4(__half* dst, const __half* src) {
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
}

__device__ __forceinline__ void zero4(__half* dst) { *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u); }

// rows x D values of one head into shared memory as fp16 rows of stride ld; row r is source row
// first + r at src + (row * stride_rows) * D, zeros from row `limit` on.
template <typename S>
__device__ __forceinline__ void load_rows(__half* dst, const S* __restrict__ src, int rows, int first, int limit,
                                          size_t row_stride, int D, int ld) {
    const int d4 = D / 4;
    for (int idx = threadIdx.x; idx < rows * d4; idx += blockDim.x) {
        const int r = idx / d4, c = 4 * (idx - r * d4), row = first + r;
        if (row < limit)
            store4(dst + r * ld + c, src + row * row_stride + c);
        else
            zero4(dst + r * ld + c);
    }
}

template <typename KV, int DCAP, int WARPS, int BK>
__device__ __forceinline__ void flash_prefill(const float* __restrict__ q, const KV* __restrict__ kc,
                                              const KV* __restrict__ vc, const int* __restrict__ pos,
                                              float* __restrict__ out, int T, int H, int Hkv, int D, int n_kv,
                                              float scale) {
    constexpr int BQ = 16 * WARPS, NT = BK / 8, OT = DCAP / 8;
    __shared__ int s_pos[BQ];
    __shared__ int s_last[WARPS];
    const int ld = D + 8;  // 4 words of padding: the 8 rows a fragment load touches hit distinct banks
    __half* sq = reinterpret_cast<__half*>(flash_smem);
    __half* sk = sq + BQ * ld;
    __half* sv = sk + BK * ld;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tc = lane & 3;
    const int h = blockIdx.y, g = h / (H / Hkv), row0 = blockIdx.x * BQ;

    for (int i = threadIdx.x; i < BQ; i += blockDim.x) s_pos[i] = row0 + i < T ? min(pos[row0 + i], n_kv - 1) : -1;
    load_rows(sq, q + (size_t)h * D, BQ, row0, T, (size_t)H * D, D, ld);
    const KV* kh = kc + (size_t)g * D;
    const KV* vh = vc + (size_t)g * D;
    __syncthreads();
    if (lane == 0) {
        int last = -1;
        for (int i = 0; i < 16; ++i) last = max(last, s_pos[16 * warp + i]);
        s_last[warp] = last;
    }
    __syncthreads();
    int key_end = 0;
    for (int w = 0; w < WARPS; ++w) key_end = max(key_end, s_last[w] + 1);
    const int warp_last = s_last[warp];
    const int p0 = s_pos[16 * warp + gr], p1 = s_pos[16 * warp + gr + 8];
    const float sl2 = scale * LOG2E;

    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;  // running max (raw scores) and partial sums
    float o[OT][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int k0 = 0; k0 < key_end; k0 += BK) {
        __syncthreads();  // every warp is done with the previous tile
        load_rows(sk, kh, BK, k0, n_kv, (size_t)Hkv * D, D, ld);
        load_rows(sv, vh, BK, k0, n_kv, (size_t)Hkv * D, D, ld);
        __syncthreads();
        if (k0 > warp_last) continue;  // no key of this tile is visible to any of the warp's rows

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DCAP / 16; ++kk) {
            if (16 * kk >= D) break;
            const __half* qa = sq + (16 * warp + gr) * ld + 16 * kk + 2 * tc;
            const unsigned a[4] = {*reinterpret_cast<const unsigned*>(qa),
                                   *reinterpret_cast<const unsigned*>(qa + 8 * ld),
                                   *reinterpret_cast<const unsigned*>(qa + 8),
                                   *reinterpret_cast<const unsigned*>(qa + 8 * ld + 8)};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const __half* kb = sk + (8 * j + gr) * ld + 16 * kk + 2 * tc;
                mma_16816(s[j], a, *reinterpret_cast<const unsigned*>(kb), *reinterpret_cast<const unsigned*>(kb + 8));
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
        // A row's 64 scores live in the 4 lanes of its group.
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
            const __half* vb = sv + (16 * kk + 2 * tc) * ld + gr;
#pragma unroll
            for (int n = 0; n < OT; ++n) {
                if (8 * n >= D) break;
                const __half* v = vb + 8 * n;
                mma_16816(o[n], a, pack_halves(v[0], v[ld]), pack_halves(v[8 * ld], v[9 * ld]));
            }
        }
    }

    l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
    const int r0 = row0 + 16 * warp + gr, r1 = r0 + 8;
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

// (WARPS, BK) per head-dim cap keep shared memory ((16 WARPS + 2 BK) (D + 8) fp16) under the 99 KiB
// a block may use on consumer cards (sm_86/sm_89), and the accumulators in registers.
#define FLASH_KERNEL(KVT, TAG, DCAP, WARPS, BK)                                                           \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                              \
        flash_prefill_##TAG##_d##DCAP(const float* q, const KVT* kc, const KVT* vc, const int* pos,       \
                                      float* out, int T, int H, int Hkv, int D, int n_kv, float scale) {  \
        flash_prefill<KVT, DCAP, WARPS, BK>(q, kc, vc, pos, out, T, H, Hkv, D, n_kv, scale);              \
    }

FLASH_KERNEL(float, f32, 64, 8, 64)
FLASH_KERNEL(float, f32, 128, 8, 64)
FLASH_KERNEL(float, f32, 256, 4, 32)
FLASH_KERNEL(__half, f16, 64, 8, 64)
FLASH_KERNEL(__half, f16, 128, 8, 64)
FLASH_KERNEL(__half, f16, 256, 4, 32)
