// The RMS norm's row scale, shared by norm_rope.cu's rms_norm_f32 and gemv.cu's normed products, so a product
// that norms its own x (one launch fewer) sees the bits rms_norm_f32 writes.
#pragma once

#define RMS_NORM_THREADS 256

__device__ __forceinline__ double rms_warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// 1 / sqrt(mean(xr^2) + eps) of the n values at xr, summed as RMS_NORM_THREADS threads sum them whatever the
// block's size (a multiple of 32): virtual thread v adds xr[v], xr[v + RMS_NORM_THREADS], ... in double (a float
// squared is exact there, so only the sums round), then each virtual warp's shuffle tree, then warp 0's over
// the warp sums. A smaller block plays the missing warps' parts in turn; a larger one leaves its extra warps idle.
// Every thread returns the scale; warp_sums [RMS_NORM_THREADS / 32] and scale are the block's shared scratch.
__device__ __forceinline__ float rms_scale(const float* __restrict__ xr, int n, double eps, double* warp_sums,
                                           float* scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int vw = warp; vw < RMS_NORM_THREADS / 32; vw += warps) {
        double sum_sq = 0.0;
        for (int i = vw * 32 + lane; i < n; i += RMS_NORM_THREADS) {
            const double v = (double)xr[i];
            sum_sq += v * v;
        }
        sum_sq = rms_warp_sum(sum_sq);
        if (lane == 0) warp_sums[vw] = sum_sq;
    }
    __syncthreads();
    if (warp == 0) {
        double sum_sq = lane < RMS_NORM_THREADS / 32 ? warp_sums[lane] : 0.0;
        sum_sq = rms_warp_sum(sum_sq);
        if (lane == 0) *scale = (float)(1.0 / sqrt(sum_sq / (double)n + eps));
    }
    __syncthreads();
    const float s = *scale;
    __syncthreads();  // every thread has read it before a next call writes it
    return s;
}
