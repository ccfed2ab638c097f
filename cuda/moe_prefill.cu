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
//
// The tile engine: 8 warps, a MP_STAGES-deep ring of shared K steps (fp16 operands by cp.async, a
// float32 A through registers, rounded to fp16 on the way to shared memory), fragments by ldmatrix.
// Every element is still one mma per 16-wide K step in ascending order from zero, so the tile shape
// and the pipeline change no bit: any tile configuration gives the same output.
#include "tensor_core.cuh"

#define MP_BK 32          // K per pipeline stage
#define MP_LD 40          // shared row stride in halves (80 bytes): ldmatrix's 8 row addresses hit distinct banks
#define MP_STAGES 3       // K steps in flight: stage s + 2 lands while stage s is multiplied
#define MP_WARPS 8
#define MP_THREADS 256    // 32 * MP_WARPS
#define MP_PIECE_ROWS 64  // rows one pass of 16-byte pieces covers: MP_THREADS / (MP_BK / 8)
#define PAIR_BM 64        // pairs per tile: experts have ~40-640 pairs per call, so taller tiles waste rows
#define GATE_UP_BN 128    // columns of h per tile, of gate and of up each
#define DOWN_BN 256
#define LINEAR_BM 128     // linear_rows: 128 x 128 tiles
#define LINEAR_SMALL_BM 64  // linear_rows_64: 64 x 128, for products with too few 128-row tiles to fill the GPU
#define LINEAR_BN 128
#define COMBINE_THREADS 256

extern __shared__ __align__(16) unsigned char mp_smem[];

// The A operand's rows: a token's float32 hidden row (gate/up: sorted pair r reads x[order[r] / k]), a
// dense product's row x[r], or an fp16 row of the chunk's intermediate (down: h[r - base]).
struct GatheredRows {
    using Elem = float;
    const float* x;
    const int* order;
    int k, width;
    __device__ __forceinline__ const float* row(int r) const { return x + (size_t)(order[r] / k) * width; }
};

struct DenseRows {
    using Elem = float;
    const float* x;
    int width;
    __device__ __forceinline__ const float* row(int r) const { return x + (size_t)r * width; }
};

struct PairRows {
    using Elem = __half;
    const __half* h;
    int base, width;
    __device__ __forceinline__ const __half* row(int r) const { return h + (size_t)(r - base) * width; }
};

// A BM x (NB x BN) tile: NB matrices (gate and up, or one) of BN columns each, WARPS_M x WARPS_N warps,
// each WM rows x WN columns of every matrix: I x J mma tiles of 16 x 8.
template <int BM_, int BN_, int NB_, int WARPS_M_>
struct TileShape {
    static constexpr int BM = BM_, BN = BN_, NB = NB_, WARPS_M = WARPS_M_, WARPS_N = MP_WARPS / WARPS_M_;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, I = WM / 16, J = WN / 8;
    static constexpr int A_PIECES = BM / MP_PIECE_ROWS, B_PIECES = NB * BN / MP_PIECE_ROWS;  // per thread per stage
    static constexpr int STAGE = (BM + NB * BN) * MP_LD;  // halves: A's rows, then each matrix's BN rows
    static constexpr int SHARED_BYTES = MP_STAGES * STAGE * 2;
    static_assert(WM % 16 == 0 && WN % 16 == 0, "a warp's tile is whole 16 x 16 pieces (B loads two 8-column tiles)");
    static_assert(BM % MP_PIECE_ROWS == 0 && BN % MP_PIECE_ROWS == 0, "a pass of pieces never straddles two matrices");
    static_assert(SHARED_BYTES <= 99 * 1024, "fits one block of a consumer card (sm_86/sm_89)");
};

using GateUpTile = TileShape<PAIR_BM, GATE_UP_BN, 2, 2>;   // warps 2 x 4, each 32 x 32 of gate and of up
using DownTile = TileShape<PAIR_BM, DOWN_BN, 1, 2>;        // warps 2 x 4, each 32 x 64
using LinearTile = TileShape<LINEAR_BM, LINEAR_BN, 1, 4>;  // warps 4 x 2, each 32 x 64
using LinearTile64 = TileShape<LINEAR_SMALL_BM, LINEAR_BN, 1, 2>;  // warps 2 x 4, each 32 x 32

// acc[m][i][j]: matrix m, warp rows 16 i, warp columns 8 j of the warp's WM x WN. Rows [r0, r_end) of
// `rows` times rows [n0, n0 + BN) of each w[m] (those past N read as zeros), K a multiple of MP_BK.
template <class S, class Rows>
__device__ __forceinline__ void tile_products(const Rows& rows, const __half* const (&w)[S::NB], int r0, int r_end,
                                              int n0, int N, int K, float (&acc)[S::NB][S::I][S::J][4]) {
    constexpr bool a_f32 = sizeof(typename Rows::Elem) == 4;
    __half* smem = reinterpret_cast<__half*>(mp_smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, lr = lane & 7, lm = lane >> 3;
    const int wm = (warp / S::WARPS_N) * S::WM, wn = (warp % S::WARPS_N) * S::WN;
    // This thread's 16-byte pieces of a stage: rows piece_row + 64 u, halves piece_col .. piece_col + 7.
    const int piece_row = threadIdx.x >> 2, piece_col = (threadIdx.x & 3) * 8;
#pragma unroll
    for (int m = 0; m < S::NB; ++m)
#pragma unroll
        for (int i = 0; i < S::I; ++i)
#pragma unroll
            for (int j = 0; j < S::J; ++j) acc[m][i][j][0] = acc[m][i][j][1] = acc[m][i][j][2] = acc[m][i][j][3] = 0.f;

    const typename Rows::Elem* a_src[S::A_PIECES];  // at K = 0; rows past r_end read row r0 with 0 bytes
    int a_bytes[S::A_PIECES];
#pragma unroll
    for (int u = 0; u < S::A_PIECES; ++u) {
        const int r = r0 + piece_row + MP_PIECE_ROWS * u;
        a_src[u] = rows.row(r < r_end ? r : r0) + piece_col;
        a_bytes[u] = r < r_end ? 16 : 0;
    }
    const __half* b_src[S::B_PIECES];  // matrix 64 u / BN, its row n0 + 64 u % BN + piece_row
    int b_bytes[S::B_PIECES];
#pragma unroll
    for (int u = 0; u < S::B_PIECES; ++u) {
        const int n = n0 + MP_PIECE_ROWS * u % S::BN + piece_row;
        b_src[u] = w[MP_PIECE_ROWS * u / S::BN] + (size_t)(n < N ? n : 0) * K + piece_col;
        b_bytes[u] = n < N ? 16 : 0;
    }

    float4 a_reg[S::A_PIECES][2];  // a float32 A's next K step, loaded a stage ahead of its store
    auto fetch_a = [&](int k0) {
        if constexpr (a_f32) {
#pragma unroll
            for (int u = 0; u < S::A_PIECES; ++u) {
                if (a_bytes[u]) {
                    a_reg[u][0] = *reinterpret_cast<const float4*>(a_src[u] + k0);
                    a_reg[u][1] = *reinterpret_cast<const float4*>(a_src[u] + k0 + 4);
                } else {
                    a_reg[u][0] = a_reg[u][1] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
        }
    };
    auto put_stage = [&](int stage, int k0) {  // A (cp.async or the registers) and every B into ring slot `stage`
        __half* sa = smem + stage * S::STAGE;
        __half* sb = sa + S::BM * MP_LD;
#pragma unroll
        for (int u = 0; u < S::A_PIECES; ++u) {
            __half* dst = sa + (piece_row + MP_PIECE_ROWS * u) * MP_LD + piece_col;
            if constexpr (a_f32) {
                const float4 p = a_reg[u][0], q = a_reg[u][1];
                __half2 h[4] = {__floats2half2_rn(p.x, p.y), __floats2half2_rn(p.z, p.w), __floats2half2_rn(q.x, q.y),
                                __floats2half2_rn(q.z, q.w)};
                *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<uint4*>(h);
            } else {
                cp_async_16(dst, reinterpret_cast<const __half*>(a_src[u]) + k0, a_bytes[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < S::B_PIECES; ++u)
            cp_async_16(sb + (piece_row + MP_PIECE_ROWS * u) * MP_LD + piece_col, b_src[u] + k0, b_bytes[u]);
    };

    const int steps = K / MP_BK;
#pragma unroll
    for (int s = 0; s < MP_STAGES - 1; ++s) {
        if (s < steps) {
            fetch_a(s * MP_BK);
            put_stage(s, s * MP_BK);
        }
        cp_async_commit();  // one group per step, empty past the end: wait_group counts stay uniform
    }
    if (MP_STAGES - 1 < steps) fetch_a((MP_STAGES - 1) * MP_BK);

    for (int s = 0; s < steps; ++s) {
        cp_async_wait<MP_STAGES - 2>();  // step s's group has landed (this thread's pieces) ...
        __syncthreads();                 // ... and everyone's; and step s - 1's slot is read by all
        const int next = s + MP_STAGES - 1;
        if (next < steps) put_stage(next % MP_STAGES, next * MP_BK);
        cp_async_commit();
        if (next + 1 < steps) fetch_a((next + 1) * MP_BK);  // in flight under this step's mma

        const __half* sa = smem + (s % MP_STAGES) * S::STAGE;
        const __half* sb = sa + S::BM * MP_LD;
#pragma unroll
        for (int kk = 0; kk < MP_BK; kk += 16) {
            unsigned a[S::I][4];  // rows 16 i + (0..7 | 8..15), K kk + (0..7 | 8..15): the mma's a0..a3
#pragma unroll
            for (int i = 0; i < S::I; ++i)
                ldsm_x4(a[i], sa + (wm + 16 * i + (lm & 1) * 8 + lr) * MP_LD + kk + (lm >> 1) * 8);
#pragma unroll
            for (int m = 0; m < S::NB; ++m)
#pragma unroll
                for (int j = 0; j < S::J; j += 2) {
                    unsigned b[4];  // columns 8 j.. and 8 (j + 1).., K kk.. and kk + 8..
                    ldsm_x4(b, sb + (m * S::BN + wn + 8 * (j + (lm >> 1)) + lr) * MP_LD + kk + (lm & 1) * 8);
#pragma unroll
                    for (int i = 0; i < S::I; ++i) {
                        mma_16816(acc[m][i][j], a[i], b[0], b[1]);
                        mma_16816(acc[m][i][j + 1], a[i], b[2], b[3]);
                    }
                }
        }
    }
    cp_async_wait<0>();  // only empty groups remain; nothing in flight at exit
}

// Calls store(r, n, i, j, e) for each (row, column pair) this thread accumulated inside [r0, r_end) x
// [n0, N): columns n and n + 1 of row r are acc[..][i][j][e] and acc[..][i][j][e + 1].
template <class S, class Store>
__device__ __forceinline__ void for_each_pair(int r0, int r_end, int n0, int N, Store store) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp / S::WARPS_N) * S::WM, wn = (warp % S::WARPS_N) * S::WN;
#pragma unroll
    for (int i = 0; i < S::I; ++i)
#pragma unroll
        for (int j = 0; j < S::J; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = r0 + wm + 16 * i + g + 8 * half, n = n0 + wn + 8 * j + 2 * t;
                if (r < r_end && n < N) store(r, n, i, j, 2 * half);
            }
}

// h[r - base, n] = fp16(silu(x_r . gate[n]) * (x_r . up[n])) for the tile's rows, silu(g) = g / (1 + exp(-g)).
// grid (tiles * ceil(N / GATE_UP_BN)), the column tile fastest (a tile's x rows stay in L2 across its
// columns); tiles[3 i ..] = (slot, first sorted row, that expert's end row); GateUpTile::SHARED_BYTES
// of dynamic shared memory. N is even.
extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_gate_up(const float* __restrict__ x, const int* __restrict__ order, int k, const int* __restrict__ tiles,
                const __half* __restrict__ gate, const __half* __restrict__ up, int N, int K, int base,
                __half* __restrict__ h) {
    using S = GateUpTile;
    const int n_cols = (N + S::BN - 1) / S::BN;
    const int* tile = tiles + 3 * (blockIdx.x / n_cols);
    const int slot = tile[0], r0 = tile[1], r_end = tile[2], n0 = (blockIdx.x % n_cols) * S::BN;
    const __half* const w[2] = {gate + (size_t)slot * N * K, up + (size_t)slot * N * K};
    float acc[2][S::I][S::J][4];
    tile_products<S>(GatheredRows{x, order, k, K}, w, r0, r_end, n0, N, K, acc);
    for_each_pair<S>(r0, r_end, n0, N, [&](int r, int n, int i, int j, int e0) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float gv = acc[0][i][j][e0 + e], uv = acc[1][i][j][e0 + e];
            v[e] = gv / (1.0f + expf(-gv)) * uv;
        }
        *reinterpret_cast<__half2*>(h + (size_t)(r - base) * N + n) = __floats2half2_rn(v[0], v[1]);
    });
}

// y[r - base, n] = h_r . down[n] (float32) for the tile's rows. grid (tiles * ceil(N / DOWN_BN)), the
// column tile fastest; DownTile::SHARED_BYTES of dynamic shared memory. N is even.
extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_down(const __half* __restrict__ h, const int* __restrict__ tiles, const __half* __restrict__ down, int N,
             int K, int base, float* __restrict__ y) {
    using S = DownTile;
    const int n_cols = (N + S::BN - 1) / S::BN;
    const int* tile = tiles + 3 * (blockIdx.x / n_cols);
    const int slot = tile[0], r0 = tile[1], r_end = tile[2], n0 = (blockIdx.x % n_cols) * S::BN;
    const __half* const w[1] = {down + (size_t)slot * N * K};
    float acc[1][S::I][S::J][4];
    tile_products<S>(PairRows{h, base, K}, w, r0, r_end, n0, N, K, acc);
    for_each_pair<S>(r0, r_end, n0, N, [&](int r, int n, int i, int j, int e) {
        *reinterpret_cast<float2*>(y + (size_t)(r - base) * N + n) = make_float2(acc[0][i][j][e], acc[0][i][j][e + 1]);
    });
}

// out[t, n] = x_t . w[n] (float32) for a dense [T, K] x [N, K]^T product, the same per-element order as
// the experts' products, so a prompt's dense projections are row-invariant too (and either tile size
// gives the same bits). grid (ceil(T / BM) * ceil(N / LINEAR_BN)), the column tile fastest.
template <class S>
__device__ __forceinline__ void linear_tile(const float* __restrict__ x, const __half* __restrict__ w16, int T, int N,
                                            int K, float* __restrict__ out) {
    const int n_cols = (N + S::BN - 1) / S::BN;
    const int r0 = (blockIdx.x / n_cols) * S::BM, n0 = (blockIdx.x % n_cols) * S::BN;
    const __half* const w[1] = {w16};
    float acc[1][S::I][S::J][4];
    tile_products<S>(DenseRows{x, K}, w, r0, T, n0, N, K, acc);
    for_each_pair<S>(r0, T, n0, N, [&](int r, int n, int i, int j, int e) {
        if (n + 1 < N && (N & 1) == 0)  // float2 stores need an even row stride
            *reinterpret_cast<float2*>(out + (size_t)r * N + n) = make_float2(acc[0][i][j][e], acc[0][i][j][e + 1]);
        else
            for (int d = 0; d < 2 && n + d < N; ++d) out[(size_t)r * N + n + d] = acc[0][i][j][e + d];
    });
}

// LinearTile::SHARED_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    linear_rows(const float* __restrict__ x, const __half* __restrict__ w16, int T, int N, int K,
                float* __restrict__ out) {
    linear_tile<LinearTile>(x, w16, T, N, K, out);
}

// LinearTile64::SHARED_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    linear_rows_64(const float* __restrict__ x, const __half* __restrict__ w16, int T, int N, int K,
                   float* __restrict__ out) {
    linear_tile<LinearTile64>(x, w16, T, N, K, out);
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
