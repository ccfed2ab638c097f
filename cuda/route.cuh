// The router's top-k (NumpyOps.route) for one token, shared by route.cu's route_f32 and gemv.cu's normed router
// product (which ranks in its last block): one thread per expert. Every float32 step mirrors the numpy twin: sums
// in numpy's pairwise order, __f*_rn intrinsics where the compiler could otherwise fuse an FMA.
#pragma once

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_USED 16
#define PW_BLOCK 128      // numpy's PW_BLOCKSIZE
#define PW_MAX_LEAVES 8   // pairwise leaves hold > 64 elements each, so 512 needs at most 8

typedef unsigned long long u64;
#define NEG_INF __int_as_float(0xff800000)  // -inf; NVRTC has no math.h INFINITY

// Monotone map of a float to uint32 (larger float -> larger key); -0 == +0, NaN below -inf
// (numpy's argsort of -x puts NaN last).
__device__ __forceinline__ unsigned order_key(float x) {
    if (x != x) return 0u;
    const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Larger key = ranks earlier: higher value first, then the lower index (a stable argsort of -x).
__device__ __forceinline__ u64 rank_key(float x, int i) {
    return ((u64)order_key(x) << 32) | (u64)(0xFFFFFFFFu - (unsigned)i);
}

__device__ __forceinline__ u64 shfl_u64(u64 v, int lane) {
    const unsigned lo = __shfl_sync(0xffffffffu, (unsigned)v, lane);
    const unsigned hi = __shfl_sync(0xffffffffu, (unsigned)(v >> 32), lane);
    return ((u64)hi << 32) | lo;
}

// numpy's pairwise_sum splits n > PW_BLOCK at n/2 rounded down to a multiple of 8; list the leaves.
__device__ int pw_leaves(int start, int n, int* starts, int* lens, int count) {
    if (n <= PW_BLOCK) {
        starts[count] = start;
        lens[count] = n;
        return count + 1;
    }
    int half = n / 2;
    half -= half % 8;
    count = pw_leaves(start, half, starts, lens, count);
    return pw_leaves(start + half, n - half, starts, lens, count);
}

__device__ float pw_combine(int n, const float* leaf_sums, int* next) {
    if (n <= PW_BLOCK) return leaf_sums[(*next)++];
    int half = n / 2;
    half -= half % 8;
    const float a = pw_combine(half, leaf_sums, next);
    return __fadd_rn(a, pw_combine(n - half, leaf_sums, next));
}

// One pairwise leaf (n <= PW_BLOCK) from its 8 strided partials r[q] = a[q] + a[q+8] + ... .
__device__ float pw_leaf_finish(const float* a, int n, const float* r) {
    float res;
    int i;
    if (n < 8) {
        res = 0.0f;
        for (i = 0; i < n; i++) res = __fadd_rn(res, a[i]);
        return res;
    }
    res = __fadd_rn(__fadd_rn(__fadd_rn(r[0], r[1]), __fadd_rn(r[2], r[3])),
                    __fadd_rn(__fadd_rn(r[4], r[5]), __fadd_rn(r[6], r[7])));
    for (i = n - n % 8; i < n; i++) res = __fadd_rn(res, a[i]);
    return res;
}

// Sum of a[0..n) (shared, n <= ROUTE_MAX_EXPERTS) in numpy's pairwise order; needs blockDim >= 64.
// Threads 8L..8L+7 build leaf L's strided partials, thread 8L finishes it, thread 0 combines.
__device__ float block_pairwise_sum(const float* a, int n, float* partials /* [8 * PW_MAX_LEAVES] */,
                                    float* leaf_sums, float* result) {
    int starts[PW_MAX_LEAVES], lens[PW_MAX_LEAVES];
    const int n_leaves = pw_leaves(0, n, starts, lens, 0);
    const int leaf = threadIdx.x / 8, q = threadIdx.x % 8;
    if (leaf < n_leaves && lens[leaf] >= 8) {
        const float* x = a + starts[leaf];
        const int end = lens[leaf] - lens[leaf] % 8;
        float r = x[q];
        for (int i = 8 + q; i < end; i += 8) r = __fadd_rn(r, x[i]);
        partials[threadIdx.x] = r;
    }
    __syncthreads();
    if (leaf < n_leaves && q == 0)
        leaf_sums[leaf] = pw_leaf_finish(a + starts[leaf], lens[leaf], partials + 8 * leaf);
    __syncthreads();
    if (threadIdx.x == 0) {
        int next = 0;
        *result = pw_combine(n, leaf_sums, &next);
    }
    __syncthreads();
    return *result;
}

__device__ float block_max(float v, float* scratch /* [32] */) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : NEG_INF;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

struct RouteSmem {  // route_token's scratch
    float probs[ROUTE_MAX_EXPERTS], sel[ROUTE_MAX_EXPERTS];
    u64 group_key[ROUTE_MAX_EXPERTS], cand[ROUTE_MAX_EXPERTS];
    float partials[8 * PW_MAX_LEAVES], leaf_sums[PW_MAX_LEAVES], scratch[32], total;
    int n_cand, top[ROUTE_MAX_USED];
    float top_w[ROUTE_MAX_USED];
};

// One token's experts from its logits: thread e < n_expert holds expert e's logit x (the others pass anything;
// blockDim at least 64 and at least n_expert). bias [E] or null; ids, weights [k]: this token's. Selection =
// probs (+ bias), optionally restricted to the n_group_used groups whose two best selections sum highest; the
// top k by selection (stable: ties to the lower expert); weights = probs of those, optionally / max(sum,
// 2^-14), optionally * scale. Every thread of the block calls it (it holds barriers).
__device__ __forceinline__ void route_token(float x, const float* __restrict__ bias, int n_expert, int k, int sigmoid,
                                            int n_groups, int n_group_used, int norm, int use_scale, float scale,
                                            int* __restrict__ ids, float* __restrict__ weights, RouteSmem& rs) {
    const int e = threadIdx.x, lane = e & 31;
    const bool real = e < n_expert;
    if (!real) x = NEG_INF;
    __syncthreads();  // a previous token's readers of the scratch are done
    if (threadIdx.x == 0) rs.n_cand = 0;

    if (sigmoid) {
        if (real) rs.probs[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
    } else {
        const float m = block_max(x, rs.scratch);
        if (real) rs.probs[e] = expf(__fsub_rn(x, m));
        __syncthreads();
        const float s = block_pairwise_sum(rs.probs, n_expert, rs.partials, rs.leaf_sums, &rs.total);
        if (real) rs.probs[e] = __fdiv_rn(rs.probs[e], s);
    }
    float my_sel = 0.0f;
    if (real) {
        my_sel = bias ? __fadd_rn(rs.probs[e], bias[e]) : rs.probs[e];
        rs.sel[e] = my_sel;
    }
    __syncthreads();

    if (n_groups > 1) {
        const int group_size = n_expert / n_groups;
        if (e < n_groups) {  // the group's two largest selections, as np.sort(...)[-2:]
            float m1 = NEG_INF, m2 = NEG_INF;
            for (int i = e * group_size; i < (e + 1) * group_size; i++) {
                const float v = rs.sel[i];
                if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) { m2 = v; }
            }
            rs.group_key[e] = rank_key(group_size == 1 ? m1 : __fadd_rn(m2, m1), e);
        }
        __syncthreads();
        if (real) {
            const u64 mine = rs.group_key[e / group_size];
            int rank = 0;
            for (int g = 0; g < n_groups; g++) rank += rs.group_key[g] > mine;
            if (rank >= n_group_used) my_sel = NEG_INF;
        }
    }

    // Only a warp's own top k can be in the block's top k: filter by rank within the warp, then rank
    // the survivors among themselves (for a true top-k member that equals its rank among all).
    const u64 key = real ? rank_key(my_sel, e) : 0ull;
    int warp_rank = 0;
    for (int s = 1; s < 32; s++) warp_rank += shfl_u64(key, (lane + s) & 31) > key;
    if (real && warp_rank < k) rs.cand[atomicAdd(&rs.n_cand, 1)] = key;  // slot order is free: ranks are not
    __syncthreads();
    if (real && warp_rank < k) {
        int rank = 0;
        for (int i = 0; i < rs.n_cand; i++) rank += rs.cand[i] > key;
        if (rank < k) {
            rs.top[rank] = e;
            rs.top_w[rank] = rs.probs[e];
        }
    }
    __syncthreads();

    if (threadIdx.x == 0) {
        float denom = 1.0f;
        if (norm) {
            float r[8];
            for (int q = 0; q < 8 && q < k; q++) r[q] = rs.top_w[q];
            for (int i = 8; i < k - k % 8; i++) r[i % 8] = __fadd_rn(r[i % 8], rs.top_w[i]);
            const float s = pw_leaf_finish(rs.top_w, k, r);  // k <= 16: one numpy leaf
            denom = (s >= 6.103515625e-5f || s != s) ? s : 6.103515625e-5f;  // np.maximum keeps NaN
        }
        for (int j = 0; j < k; j++) {
            float w = norm ? __fdiv_rn(rs.top_w[j], denom) : rs.top_w[j];
            if (use_scale) w = __fmul_rn(w, scale);
            ids[j] = rs.top[j];
            weights[j] = w;
        }
    }
}

// Token t's value in column c of the per-token expert sum (route.cu's combine_f32, gemv.cu's expert_down_combine):
// (residual[t, c] +) (sum over j ascending of w[t, j] * y[t*k + j, c] (+ y[n_tok*k + t, c])), unfused float32.
// y is read past L1 (__ldcg): in expert_down_combine other blocks of the launch wrote it.
// Up to COMBINE_AHEAD experts a token, every operand is loaded before the first add (a loop left them an L2 round
// trip a group of the compiler's unrolling apart); the adds keep their order, so the bits are the loop's.
#define COMBINE_AHEAD 16
__device__ __forceinline__ float combine_value(const float* __restrict__ y, const float* __restrict__ w,
                                               const float* __restrict__ residual, int t, int c, int n_tok, int k,
                                               int d, int shared) {
    float acc = 0.0f;
    const float sv = shared ? __ldcg(y + ((long long)n_tok * k + t) * d + c) : 0.0f;
    const float rv = residual ? residual[(long long)t * d + c] : 0.0f;
    if (k <= COMBINE_AHEAD) {
        float wv[COMBINE_AHEAD], yv[COMBINE_AHEAD];
#pragma unroll
        for (int j = 0; j < COMBINE_AHEAD; j++)
            if (j < k) wv[j] = w[t * k + j], yv[j] = __ldcg(y + ((long long)t * k + j) * d + c);
#pragma unroll
        for (int j = 0; j < COMBINE_AHEAD; j++)
            if (j < k) acc = __fadd_rn(acc, __fmul_rn(wv[j], yv[j]));
    } else {
        for (int j = 0; j < k; j++)
            acc = __fadd_rn(acc, __fmul_rn(w[t * k + j], __ldcg(y + ((long long)t * k + j) * d + c)));
    }
    if (shared) acc = __fadd_rn(acc, sv);
    if (residual) acc = __fadd_rn(rv, acc);
    return acc;
}
