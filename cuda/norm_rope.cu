// RMS norm, NEOX rotary embedding, SwiGLU and residual add on float32 activations.
// Each mirrors its NumpyOps twin operation by operation: double where the twin uses float64,
// and __f*_rn intrinsics for float32 steps so the compiler cannot fuse them into FMAs that
// round differently from numpy.

#include <cuda_fp16.h>

#include "rms_norm.cuh"
#include "pdl.cuh"

// x, out [rows, n]; w [n]. One block of RMS_NORM_THREADS per row.
extern "C" __global__ void __launch_bounds__(RMS_NORM_THREADS)
rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
             int n, double eps) {
    PDL_ENTRY();
    __shared__ double warp_sums[RMS_NORM_THREADS / 32];
    __shared__ float row_scale;
    const float* xr = x + (size_t)blockIdx.x * n;
    float* outr = out + (size_t)blockIdx.x * n;
    const float scale = rms_scale(xr, n, eps, warp_sums, &row_scale);
    for (int i = threadIdx.x; i < n; i += RMS_NORM_THREADS)
        outr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// x, out [tokens, heads, head_dim]; positions [tokens]. One thread per element: thread d < n_rot/2
// writes the rotated pair (d, d + n_rot/2), threads past n_rot copy, the rest idle.
extern "C" __global__ void
rope_neox_f32(const float* __restrict__ x, const int* __restrict__ positions, float* __restrict__ out,
              long long total, int heads, int head_dim, int n_rot, double base) {
    PDL_ENTRY();
    const int half = n_rot / 2;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int d = (int)(idx % head_dim);
        if (d >= n_rot) {
            out[idx] = x[idx];
            continue;
        }
        if (d >= half) continue;
        const long long token = idx / head_dim / heads;
        const double inv_freq = pow(base, (-(double)d * 2.0) / (double)n_rot);
        const double theta = (double)positions[token] * inv_freq;
        double sin_d, cos_d;
        sincos(theta, &sin_d, &cos_d);
        const float c = (float)cos_d, s = (float)sin_d;
        const float x0 = x[idx], x1 = x[idx + half];
        out[idx] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        out[idx + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}

__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_kv(__half* p, float v) { *p = __float2half_rn(v); }  // astype's rounding

// rope_neox_f32 on q and on k, and the K/V cache writes of kv_store, in one launch (a decode step made 6).
// Per token the index space is its q heads, then its k heads, then its v heads, head_dim each: q is rotated
// into q_out [tokens, hq, head_dim]; k rotated and v as it is are written to row positions[token] of
// k_buf, v_buf [S, hk, head_dim] (float, or half rounded to nearest even). The same operations as
// rope_neox_f32 and the cache's conversion, so the same bits as the launches it replaces.
template <typename KV>
__device__ __forceinline__ void rope_store(const float* __restrict__ q, const float* __restrict__ k,
                                           const float* __restrict__ v, const int* __restrict__ positions,
                                           float* __restrict__ q_out, KV* __restrict__ k_buf,
                                           KV* __restrict__ v_buf, long long total, int hq, int hk,
                                           int head_dim, int n_rot, double base) {
    const int half = n_rot / 2, per_token = (hq + 2 * hk) * head_dim;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long token = idx / per_token;
        const int r = (int)(idx % per_token), head = r / head_dim, d = r % head_dim;
        const long long row = (long long)positions[token];
        if (head >= hq + hk) {  // v: stored as it is
            const int h = head - hq - hk;
            store_kv(v_buf + (row * hk + h) * head_dim + d, v[(token * hk + h) * head_dim + d]);
            continue;
        }
        const bool is_q = head < hq;
        const float* src = is_q ? q + (token * hq + head) * head_dim : k + (token * hk + head - hq) * head_dim;
        if (d >= n_rot) {
            if (is_q) q_out[(token * hq + head) * head_dim + d] = src[d];
            else store_kv(k_buf + (row * hk + head - hq) * head_dim + d, src[d]);
            continue;
        }
        if (d >= half) continue;
        const double inv_freq = pow(base, (-(double)d * 2.0) / (double)n_rot);
        const double theta = (double)row * inv_freq;
        double sin_d, cos_d;
        sincos(theta, &sin_d, &cos_d);
        const float c = (float)cos_d, s = (float)sin_d;
        const float x0 = src[d], x1 = src[d + half];
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        if (is_q) {
            float* out = q_out + (token * hq + head) * head_dim;
            out[d] = y0;
            out[d + half] = y1;
        } else {
            KV* out = k_buf + (row * hk + head - hq) * head_dim;
            store_kv(out + d, y0);
            store_kv(out + d + half, y1);
        }
    }
}

#define ROPE_STORE(KV, SUFFIX)                                                                              \
    extern "C" __global__ void rope_store_##SUFFIX(                                                         \
        const float* q, const float* k, const float* v, const int* positions, float* q_out, KV* k_buf,     \
        KV* v_buf, long long total, int hq, int hk, int head_dim, int n_rot, double base) {                \
        PDL_ENTRY();                                                                                       \
        rope_store<KV>(q, k, v, positions, q_out, k_buf, v_buf, total, hq, hk, head_dim, n_rot, base);     \
    }
ROPE_STORE(float, f32)
ROPE_STORE(__half, f16)

// out = gate / (1 + exp(-gate)) * up, elementwise over n floats.
extern "C" __global__ void
swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out,
           long long n) {
    PDL_ENTRY();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
    }
}

// out = a + b, elementwise over n floats (the residual add).
extern "C" __global__ void
add_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, long long n) {
    PDL_ENTRY();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(a[i], b[i]);
}
