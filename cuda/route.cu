// Router top-k (NumpyOps.route; the selection itself is route.cuh's) and the per-token combine of expert outputs.
//
// Pairs: p = t * k + j is token t's j-th expert. Every float32 step mirrors the numpy twin (__f*_rn intrinsics
// where the compiler could otherwise fuse an FMA).

#include "route.cuh"
#include "pdl.cuh"

#define COMBINE_THREADS 256

// logits [T, E]; bias [E] or null; ids, weights [T, k]. One block per token, one thread per expert
// (blockDim = E rounded up to a warp, at least 64): route_token's selection.
extern "C" __global__ void __launch_bounds__(ROUTE_MAX_EXPERTS)
route_f32(const float* __restrict__ logits, const float* __restrict__ bias, int n_expert, int k,
          int sigmoid, int n_groups, int n_group_used, int norm, int use_scale, float scale,
          int* __restrict__ ids, float* __restrict__ weights) {
    PDL_ENTRY();
    __shared__ RouteSmem rs;
    const int t = blockIdx.x, e = threadIdx.x;
    const float x = e < n_expert ? logits[(long long)t * n_expert + e] : NEG_INF;
    route_token(x, bias, n_expert, k, sigmoid, n_groups, n_group_used, norm, use_scale, scale,
                ids + (long long)t * k, weights + (long long)t * k, rs);
}

// out[t, c] = (residual[t, c] +) (sum over j ascending of w[t, j] * y[t*k + j, c] (+ y[T*k + t, c])), unfused
// float32; with `shared`, row T*k + t (after every token's k pairs) is token t's shared expert, added unweighted
// after the sum: the bits of adding it afterwards. grid (ceil(d / COMBINE_THREADS), T). Each token reads only its
// own rows: batch invariant.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
combine_f32(const float* __restrict__ y, const float* __restrict__ w, const float* __restrict__ residual,
            float* __restrict__ out, int k, int d, int shared) {
    PDL_ENTRY();
    const int t = blockIdx.y, c = blockIdx.x * COMBINE_THREADS + threadIdx.x;
    if (c >= d) return;
    out[(long long)t * d + c] = combine_value(y, w, residual, t, c, gridDim.y, k, d, shared);
}
