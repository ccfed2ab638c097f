// Prefill MoE plumbing around batched GEMMs: tokens grouped by expert, padded to a common row count,
// so a chunk of experts runs as one strided-batched GEMM per matrix instead of one GEMM per expert.
//
// Layout: pairs p = token * k + j (token's j-th expert); `order` lists the pairs sorted by expert and
// `offsets[e]..offsets[e+1]` are expert e's entries. A chunk is C experts listed in `experts` (those
// with tokens); row i of the chunk's c-th expert is padded slot [c, i] of a [C, max_rows, width] buffer.
#include <cuda_fp16.h>

#define PAD_THREADS 256

// out[c, i, :] = fp16(x[token of the i-th pair of expert experts[c], :]), zeros past that expert's pairs.
extern "C" __global__ void gather_padded_f16(const float* __restrict__ x, const int* __restrict__ order,
                                             const int* __restrict__ offsets, const int* __restrict__ experts,
                                             int k, int max_rows, int width, __half* __restrict__ out) {
    const int i = blockIdx.x, c = blockIdx.y, e = experts[c];
    const int begin = offsets[e], count = offsets[e + 1] - begin;
    __half* dst = out + ((long long)c * max_rows + i) * width;
    if (i >= count) {
        for (int col = threadIdx.x; col < width; col += PAD_THREADS) dst[col] = __float2half_rn(0.0f);
        return;
    }
    const float* src = x + (long long)(order[begin + i] / k) * width;
    for (int col = threadIdx.x; col < width; col += PAD_THREADS) dst[col] = __float2half_rn(src[col]);
}

// h = fp16(silu(g) * u) elementwise over [C, max_rows, n]; silu(g) = g / (1 + exp(-g)) as everywhere.
extern "C" __global__ void swiglu_to_f16(const float* __restrict__ g, const float* __restrict__ u,
                                         __half* __restrict__ h, long long n) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        const float gv = g[idx];
        h[idx] = __float2half_rn(gv / (1.0f + expf(-gv)) * u[idx]);
    }
}

// y_pairs[pair, :] = y[c, i, :] for the real rows of the chunk: each pair's expert output lands in
// its own row, and a per-token combine then sums a token's experts in a fixed order.
extern "C" __global__ void scatter_pairs(const float* __restrict__ y, const int* __restrict__ order,
                                         const int* __restrict__ offsets, const int* __restrict__ experts,
                                         int max_rows, int width, float* __restrict__ y_pairs) {
    const int i = blockIdx.x, c = blockIdx.y, e = experts[c];
    const int begin = offsets[e], count = offsets[e + 1] - begin;
    if (i >= count) return;
    const float* src = y + ((long long)c * max_rows + i) * width;
    float* dst = y_pairs + (long long)order[begin + i] * width;
    for (int col = threadIdx.x; col < width; col += PAD_THREADS) dst[col] = src[col];
}
