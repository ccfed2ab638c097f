// Routed experts of a prompt on tensor cores: grouped GEMMs over the (token, expert) pairs sorted by
// expert, against fp16 copies of the experts' matrices, mma.sync m16n8k16 with float32 accumulation.
//
// Pairs p = token * k + j (token's j-th expert); `order` lists them sorted by expert, so expert e's
// pairs are the sorted rows offsets[e]..offsets[e+1]. Experts run in chunks of fixed expert-id ranges
// [lo, hi) whose weights were dequantized into [C, N, K] fp16 buffers (slot c = the c-th expert of
// the range that has pairs). A tile is (slot, first sorted row, end of that expert's rows): one
// expert's rows only, so a block reads one expert's matrix.
//
// Row invariance: each output element is one thread's accumulator over K in a fixed order (no split
// K, nothing summed across rows), and the combine adds a token's experts in ascending expert id with
// one rounding per step. So a token's result does not depend on which other tokens share the batch:
// a prompt's FFN run over every micro-batch at once equals it run micro-batch by micro-batch, bit for bit.
#include <cuda_fp16.h>

#define MP_BM 64      // rows (pairs) per tile
#define MP_BN 64      // output columns per tile
#define MP_BK 32      // K per step
#define MP_LD 40      // shared row stride in halves: the 8 rows a fragment load touches hit distinct banks
#define MP_THREADS 128  // 4 warps, 2 x 2, each 32 x 32 of the tile
#define COMBINE_THREADS 256

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned ld32(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }

// The A operand: a tile row is either a token's float32 hidden row (gate/up: row r of the sorted
// pairs reads x[order[r] / k]) or an fp16 row of the chunk's intermediate (down: h[r - base]).
struct RowsF32 {
    const float* x;
    const int* order;
    int k;
    __device__ __forceinline__ void fetch(int r, int col, uint4& v) const {  // 8 values from col as fp16
        const float* src = x + (size_t)(order[r] / k) * width + col;
        const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
        __half2 h[4] = {__floats2half2_rn(a.x, a.y), __floats2half2_rn(a.z, a.w), __floats2half2_rn(b.x, b.y),
                        __floats2half2_rn(b.z, b.w)};
        v = *reinterpret_cast<uint4*>(h);
    }
    int width;
};

struct RowsF32Direct {  // a dense product's rows: row r is x[r]
    const float* x;
    int width;
    __device__ __forceinline__ void fetch(int r, int col, uint4& v) const {
        const float* src = x + (size_t)r * width + col;
        const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
        __half2 h[4] = {__floats2half2_rn(a.x, a.y), __floats2half2_rn(a.z, a.w), __floats2half2_rn(b.x, b.y),
                        __floats2half2_rn(b.z, b.w)};
        v = *reinterpret_cast<uint4*>(h);
    }
};

struct RowsF16 {
    const __half* h;
    int base;
    int width;
    __device__ __forceinline__ void fetch(int r, int col, uint4& v) const {
        v = *reinterpret_cast<const uint4*>(h + (size_t)(r - base) * width + col);
    }
};

// Registers one thread stages per K step: 2 x 8 values of A and 2 x 8 of each B (64 x 32 each / 128).
template <int NB>
struct Stage {
    uint4 a[2];
    uint4 b[NB][2];
};

template <class A, int NB>
__device__ __forceinline__ void fetch_step(const A& rows, const __half* const (&w)[NB], int r0, int r_end, int n0,
                                           int N, int K, int k0, Stage<NB>& s) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int idx = threadIdx.x + u * MP_THREADS, row = idx >> 2, col = (idx & 3) * 8;
        if (r0 + row < r_end)
            rows.fetch(r0 + row, k0 + col, s.a[u]);
        else
            s.a[u] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int m = 0; m < NB; ++m)
            s.b[m][u] = n0 + row < N ? *reinterpret_cast<const uint4*>(w[m] + (size_t)(n0 + row) * K + k0 + col)
                                     : make_uint4(0u, 0u, 0u, 0u);
    }
}

template <int NB>
__device__ __forceinline__ void store_step(const Stage<NB>& s, __half* sa, __half* sb) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int idx = threadIdx.x + u * MP_THREADS, row = idx >> 2, col = (idx & 3) * 8;
        *reinterpret_cast<uint4*>(sa + row * MP_LD + col) = s.a[u];
#pragma unroll
        for (int m = 0; m < NB; ++m) *reinterpret_cast<uint4*>(sb + (m * MP_BN + row) * MP_LD + col) = s.b[m][u];
    }
}

// acc[m][i][j]: matrix m, warp rows 16 i, warp columns 8 j of the warp's 32 x 32.
template <class A, int NB>
__device__ __forceinline__ void tile_products(const A& rows, const __half* const (&w)[NB], int r0, int r_end, int n0,
                                              int N, int K, float (&acc)[NB][2][4][4]) {
    __shared__ __align__(16) __half sa[MP_BM * MP_LD];
    __shared__ __align__(16) __half sb[NB * MP_BN * MP_LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
#pragma unroll
    for (int m = 0; m < NB; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[m][i][j][0] = acc[m][i][j][1] = acc[m][i][j][2] = acc[m][i][j][3] = 0.f;

    Stage<NB> s;
    fetch_step(rows, w, r0, r_end, n0, N, K, 0, s);
    for (int k0 = 0; k0 < K; k0 += MP_BK) {
        __syncthreads();  // the previous step's fragments are read
        store_step(s, sa, sb);
        __syncthreads();
        if (k0 + MP_BK < K) fetch_step(rows, w, r0, r_end, n0, N, K, k0 + MP_BK, s);  // in flight under the mma
#pragma unroll
        for (int kk = 0; kk < MP_BK; kk += 16) {
            unsigned a[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const __half* p = sa + (wm + 16 * i + g) * MP_LD + kk + 2 * t;
                a[i][0] = ld32(p);
                a[i][1] = ld32(p + 8 * MP_LD);
                a[i][2] = ld32(p + 8);
                a[i][3] = ld32(p + 8 * MP_LD + 8);
            }
#pragma unroll
            for (int m = 0; m < NB; ++m)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const __half* p = sb + (m * MP_BN + wn + 8 * j + g) * MP_LD + kk + 2 * t;
                    const unsigned b0 = ld32(p), b1 = ld32(p + 8);
                    mma_16816(acc[m][0][j], a[0], b0, b1);
                    mma_16816(acc[m][1][j], a[1], b0, b1);
                }
        }
    }
}

// Calls store(r, n, i, j, m) for each (row, column pair) this thread accumulated inside [r0, r_end) x
// [n0, N): columns n and n + 1 of row r are acc[..][i][j][m] and acc[..][i][j][m + 1].
template <class Store>
__device__ __forceinline__ void for_each_pair(int r0, int r_end, int n0, int N, Store store) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = r0 + wm + 16 * i + g + 8 * half, n = n0 + wn + 8 * j + 2 * t;
                if (r < r_end && n < N) store(r, n, i, j, 2 * half);
            }
}

// h[r - base, n] = fp16(silu(x_r . gate[n]) * (x_r . up[n])) for the tile's rows, silu(g) = g / (1 + exp(-g)).
// grid (tiles, ceil(N / MP_BN)); tiles[3 i ..] = (slot, first sorted row, that expert's end row). N is even.
extern "C" __global__ void __launch_bounds__(MP_THREADS)
    moe_gate_up(const float* __restrict__ x, const int* __restrict__ order, int k, const int* __restrict__ tiles,
                const __half* __restrict__ gate, const __half* __restrict__ up, int N, int K, int base,
                __half* __restrict__ h) {
    const int* tile = tiles + 3 * blockIdx.x;
    const int slot = tile[0], r0 = tile[1], r_end = tile[2], n0 = blockIdx.y * MP_BN;
    const __half* const w[2] = {gate + (size_t)slot * N * K, up + (size_t)slot * N * K};
    float acc[2][2][4][4];
    tile_products(RowsF32{x, order, k, K}, w, r0, r_end, n0, N, K, acc);
    for_each_pair(r0, r_end, n0, N, [&](int r, int n, int i, int j, int m) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float gv = acc[0][i][j][m + e], uv = acc[1][i][j][m + e];
            v[e] = gv / (1.0f + expf(-gv)) * uv;
        }
        *reinterpret_cast<__half2*>(h + (size_t)(r - base) * N + n) = __floats2half2_rn(v[0], v[1]);
    });
}

// y[r - base, n] = h_r . down[n] (float32) for the tile's rows. N is even.
extern "C" __global__ void __launch_bounds__(MP_THREADS)
    moe_down(const __half* __restrict__ h, const int* __restrict__ tiles, const __half* __restrict__ down, int N,
             int K, int base, float* __restrict__ y) {
    const int* tile = tiles + 3 * blockIdx.x;
    const int slot = tile[0], r0 = tile[1], r_end = tile[2], n0 = blockIdx.y * MP_BN;
    const __half* const w[1] = {down + (size_t)slot * N * K};
    float acc[1][2][4][4];
    tile_products(RowsF16{h, base, K}, w, r0, r_end, n0, N, K, acc);
    for_each_pair(r0, r_end, n0, N, [&](int r, int n, int i, int j, int m) {
        *reinterpret_cast<float2*>(y + (size_t)(r - base) * N + n) = make_float2(acc[0][i][j][m], acc[0][i][j][m + 1]);
    });
}

// out[t, n] = x_t . w[n] (float32) for a dense [T, K] x [N, K]^T product, the same tiles and the same
// per-element order as the experts' products, so a prompt's dense projections are row-invariant too.
// grid (ceil(T / MP_BM), ceil(N / MP_BN)).
extern "C" __global__ void __launch_bounds__(MP_THREADS)
    linear_rows(const float* __restrict__ x, const __half* __restrict__ w16, int T, int N, int K,
                float* __restrict__ out) {
    const int r0 = blockIdx.x * MP_BM, n0 = blockIdx.y * MP_BN;
    const __half* const w[1] = {w16};
    float acc[1][2][4][4];
    tile_products(RowsF32Direct{x, K}, w, r0, T, n0, N, K, acc);
    for_each_pair(r0, T, n0, N, [&](int r, int n, int i, int j, int m) {
        if (n + 1 < N && (N & 1) == 0)  // float2 stores need an even row stride
            *reinterpret_cast<float2*>(out + (size_t)r * N + n) = make_float2(acc[0][i][j][m], acc[0][i][j][m + 1]);
        else
            for (int e = 0; e < 2 && n + e < N; ++e) out[(size_t)r * N + n + e] = acc[0][i][j][m + e];
    });
}

// out[t, :] += weights[t, j] * y[inv[t k + j] - base, :] for each of token t's experts in [lo, hi), in
// ascending expert id, one multiply and one add per step (NumpyOps.moe's order and roundings).
// grid (T), COMBINE_THREADS threads.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    moe_combine_range(const float* __restrict__ y, const int* __restrict__ ids, const float* __restrict__ weights,
                      const int* __restrict__ inv, int k, int lo, int hi, int base, int width,
                      float* __restrict__ out) {
    const int tok = blockIdx.x;
    const int* tid = ids + (size_t)tok * k;
    int prev = -1;
    float* orow = out + (size_t)tok * width;
    for (;;) {  // the next expert of this token in the range, by ascending id (k is small)
        int best = -1, e_best = hi;
        for (int j = 0; j < k; ++j) {
            const int e = tid[j];
            if (e >= lo && e < e_best && e > prev) best = j, e_best = e;
        }
        if (best < 0) return;
        prev = e_best;
        const float wt = weights[(size_t)tok * k + best];
        const float* yrow = y + (size_t)(inv[(size_t)tok * k + best] - base) * width;
        for (int col = threadIdx.x; col < width; col += COMBINE_THREADS)
            orow[col] = __fadd_rn(orow[col], __fmul_rn(wt, yrow[col]));
    }
}
