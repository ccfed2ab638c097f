// The gated delta rule over a prompt in chunks of DNC_CHUNK tokens, on tensor cores: the chunked form of
// delta_net.cu's scan (twin: gated_delta_net_chunked in runner/backends/numpy/delta_net.py; llama.cpp's
// build_delta_net_chunking and flash-linear-attention's chunk_gated_delta_rule compute the same). Per value
// head h and chunk, with G the running sum of g over the chunk, D[i, j] = exp(G_i - G_j) for j <= i:
//   A = strict_lower(beta_i (k_i . k_j) D[i, j]);  [U | W] = (I + A)^-1 [beta v | beta k exp(G)]
//   V' = U - W S^T;  o = exp(G) (q / sqrt(S)) S^T + ((q / sqrt(S)) k^T * D) V';
//   S <- exp(G_last) S + V'^T (k exp(G_last - G)).
// Two kernels. gated_delta_net_chunk_prep_f32, one block per (chunk, head), all chunks at once: k k^T and
// q k^T on tensor cores, the triangular solve by forward substitution in float32 (a column of [U | W] per
// thread, in registers), U, W, the masked q k^T * D (call it P) and G into scratch. Then
// gated_delta_net_chunk_state_f32, one block per (slab of DNC_SLAB state rows, head), walks the chunks in
// order: row j of the state changes only through V'[:, j] and o[:, j], so slabs run apart. The slab lives in
// the registers of the mma accumulators (float32) for the whole prompt; per chunk V', o and the new slab are
// three tensor-core products. Every mma takes tf32 operands (10 mantissa bits, float32's range: no
// overflow or underflow that float32 would not have) and accumulates in float32; exponents, the decay
// products and the solve are float32 on CUDA cores.
// Fragments: lane (g = lane / 4, t = lane % 4) reads its k-step pair (t, t + 4) from columns 2t, 2t + 1 of
// each 8-column step (one float2), A and B alike; a product's sum over k does not depend on that order.
// State sizes: a multiple of 8 up to DNC_DIM (the wrapper keeps the scan for others).
#include "tensor_core.cuh"

#define DNC_CHUNK 64                 // tokens per chunk
#define DNC_DIM 128                  // the largest state size
#define DNC_PREP_THREADS (2 * DNC_DIM)  // the solve: a column of [U | W] per thread
#define DNC_SLAB 16                  // state rows per block of the state kernel (one m16 tile)
#define DNC_STATE_THREADS 128        // 4 warps: 16 rows of the chunk's tokens each; 32 state columns each
#define DNC_LDA (DNC_CHUNK + 4)      // A rows: float4 reads in the solve
#define DNC_LDS (DNC_DIM + 8)        // = 8 mod 32: float2 reads of (row g, column 2t) hit distinct banks
#define DNC_LDV (DNC_CHUNK + 8)      // as DNC_LDS

__device__ __forceinline__ float2 dnc_pair(const float* p, bool valid) {
    return valid ? *reinterpret_cast<const float2*>(p) : make_float2(0.0f, 0.0f);
}

// An A fragment from the float2 pairs of its two rows (g and g + 8).
__device__ __forceinline__ void dnc_a_frag(unsigned (&a)[4], float2 row_g, float2 row_g8) {
    a[0] = to_tf32(row_g.x);
    a[1] = to_tf32(row_g8.x);
    a[2] = to_tf32(row_g.y);
    a[3] = to_tf32(row_g8.y);
}

// q, k [tokens, H_k, dim]; v [tokens, H_v, dim]; g, beta [tokens, H_v]. Writes, for head h and chunk c
// (hc = h * chunks + c): u, w [hc][DNC_CHUNK][dim], p [hc][DNC_CHUNK][DNC_CHUNK] (scaled q k^T * D, zero
// above the diagonal and on rows past the prompt), g_cum [hc][DNC_CHUNK] (G; rows past the prompt hold
// G_last). Rows past the prompt of u and w are zeros. Grid (chunks, H_v).
extern "C" __global__ void __launch_bounds__(DNC_PREP_THREADS, 2)
gated_delta_net_chunk_prep_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                               const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ u,
                               float* __restrict__ w, float* __restrict__ p, float* __restrict__ g_cum, int tokens,
                               int n_k_heads, int n_v_heads, int dim, int grouped) {
    __shared__ __align__(16) float s_a[DNC_CHUNK * DNC_LDA];
    __shared__ float s_g[DNC_CHUNK], s_eg[DNC_CHUNK], s_beta[DNC_CHUNK];
    const int chunk = blockIdx.x, h = blockIdx.y, c0 = chunk * DNC_CHUNK, tid = threadIdx.x;
    const int n = min(DNC_CHUNK, tokens - c0);
    const int kh = grouped ? h / (n_v_heads / n_k_heads) : h % n_k_heads;
    const size_t hc = (size_t)h * gridDim.x + chunk;
    const size_t key_stride = (size_t)n_k_heads * dim;
    const float* kc = k + ((size_t)c0 * n_k_heads + kh) * dim;  // token r of the chunk at r * key_stride
    const float* qc = q + ((size_t)c0 * n_k_heads + kh) * dim;
    const float scale = (float)(1.0 / sqrt((double)dim));

    if (tid < DNC_CHUNK) {
        s_g[tid] = tid < n ? g[(size_t)(c0 + tid) * n_v_heads + h] : 0.0f;
        s_beta[tid] = tid < n ? beta[(size_t)(c0 + tid) * n_v_heads + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) {  // in token order, as numpy's float32 cumsum
        float run = 0.0f;
        for (int r = 0; r < DNC_CHUNK; ++r) {
            run = __fadd_rn(run, s_g[r]);  // rows past n add 0: they keep G_last
            s_g[r] = run;
        }
    }
    __syncthreads();
    if (tid < DNC_CHUNK) {
        s_eg[tid] = expf(s_g[tid]);
        g_cum[hc * DNC_CHUNK + tid] = s_g[tid];
    }

    // k k^T and q k^T [64, 64]: warp (m, n) = (warp % 4, warp / 4) owns rows 16m.. and columns 32n.. of both.
    const int warp = tid >> 5, lane = tid & 31, gr = lane >> 2, tc = lane & 3;
    const int r0 = 16 * (warp & 3) + gr, r1 = r0 + 8, col0 = 32 * (warp >> 2);
    float acc_kk[4][4] = {}, acc_qk[4][4] = {};
    for (int d0 = 0; d0 < dim; d0 += 8) {
        const int d = d0 + 2 * tc;
        unsigned ak[4], aq[4];
        dnc_a_frag(ak, dnc_pair(kc + r0 * key_stride + d, r0 < n), dnc_pair(kc + r1 * key_stride + d, r1 < n));
        dnc_a_frag(aq, dnc_pair(qc + r0 * key_stride + d, r0 < n), dnc_pair(qc + r1 * key_stride + d, r1 < n));
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const int j = col0 + 8 * nt + gr;
            const float2 b = dnc_pair(kc + j * key_stride + d, j < n);
            const unsigned b0 = to_tf32(b.x), b1 = to_tf32(b.y);
            mma_1688_tf32(acc_kk[nt], ak, b0, b1);
            mma_1688_tf32(acc_qk[nt], aq, b0, b1);
        }
    }
    __syncthreads();  // s_g, s_eg, s_beta complete
    float* pc = p + hc * DNC_CHUNK * DNC_CHUNK;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int i = half ? r1 : r0, j = col0 + 8 * nt + 2 * tc;
            float pij[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float kk = acc_kk[nt][2 * half + e], qk = acc_qk[nt][2 * half + e];
                const float decay = j + e <= i ? expf(__fsub_rn(s_g[i], s_g[j + e])) : 0.0f;  // <= 1: g <= 0
                s_a[i * DNC_LDA + j + e] = j + e < i ? __fmul_rn(__fmul_rn(kk, s_beta[i]), decay) : 0.0f;
                pij[e] = j + e <= i && i < n ? __fmul_rn(__fmul_rn(qk, scale), decay) : 0.0f;
            }
            *reinterpret_cast<float2*>(pc + i * DNC_CHUNK + j) = make_float2(pij[0], pij[1]);
        }
    }
    __syncthreads();

    // (I + A) x = b by forward substitution, one column per thread: u's column d (tid < DNC_DIM) from
    // beta v, or w's (tid - DNC_DIM) from beta k exp(G). Rows past n: b = 0 and A's row = 0, so x = 0.
    const bool is_u = tid < DNC_DIM;
    const int d = is_u ? tid : tid - DNC_DIM;
    if (d >= dim) return;
    float x[DNC_CHUNK];
#pragma unroll
    for (int r = 0; r < DNC_CHUNK; ++r) {
        x[r] = 0.0f;
        if (r < n)
            x[r] = is_u ? __fmul_rn(v[((size_t)(c0 + r) * n_v_heads + h) * dim + d], s_beta[r])
                        : __fmul_rn(__fmul_rn(kc[r * key_stride + d], s_beta[r]), s_eg[r]);
    }
#pragma unroll
    for (int i = 1; i < DNC_CHUNK; ++i) {
        float acc = x[i];
#pragma unroll
        for (int j = 0; j < i; j += 4) {
            const float4 a = *reinterpret_cast<const float4*>(s_a + i * DNC_LDA + j);
            acc = fmaf(-a.x, x[j], acc);
            if (j + 1 < i) acc = fmaf(-a.y, x[j + 1], acc);
            if (j + 2 < i) acc = fmaf(-a.z, x[j + 2], acc);
            if (j + 3 < i) acc = fmaf(-a.w, x[j + 3], acc);
        }
        x[i] = acc;
    }
    float* xc = (is_u ? u : w) + hc * DNC_CHUNK * dim + d;
#pragma unroll
    for (int r = 0; r < DNC_CHUNK; ++r) xc[(size_t)r * dim] = x[r];
}

// From the prep kernel's scratch and state [H_v, dim, dim] ([head, value j, key i]; not written): out
// [tokens, H_v, dim] and the state after the last token, state_out [H_v, dim, dim]. Grid
// (ceil(dim / DNC_SLAB), H_v); block b owns state rows j0 = DNC_SLAB b .. j0 + 15 of head h.
// Warp m: V' and o of the chunk's tokens 16m .. 16m + 15 (value rows the slab's 16), and columns 32m ..
// 32m + 31 of the slab's new state. Lane (g, t) holds slab rows g, g + 8, columns 32m + 8nt + 2t (+1).
extern "C" __global__ void __launch_bounds__(DNC_STATE_THREADS)
gated_delta_net_chunk_state_f32(const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ u, const float* __restrict__ w,
                                const float* __restrict__ p, const float* __restrict__ g_cum,
                                const float* __restrict__ state, float* __restrict__ out,
                                float* __restrict__ state_out, int tokens, int n_k_heads, int n_v_heads, int dim,
                                int grouped) {
    __shared__ __align__(16) float s_s[DNC_SLAB * DNC_LDS];  // the slab entering the chunk [j][i]
    __shared__ __align__(16) float s_v[DNC_SLAB * DNC_LDV];  // the chunk's V' transposed [j][token]
    __shared__ float s_qs[DNC_CHUNK], s_dk[DNC_CHUNK], s_end[1];
    const int h = blockIdx.y, j0 = blockIdx.x * DNC_SLAB, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, gr = lane >> 2, tc = lane & 3;
    const int kh = grouped ? h / (n_v_heads / n_k_heads) : h % n_k_heads;
    const int chunks = (tokens + DNC_CHUNK - 1) / DNC_CHUNK;
    const size_t key_stride = (size_t)n_k_heads * dim;
    const float scale = (float)(1.0 / sqrt((double)dim));
    const int r0 = 16 * warp + gr, r1 = r0 + 8;  // this lane's tokens of the chunk in V' and o

    float acc_s[4][4];  // [nt][e]: row gr + 8 (e / 2), column 32 warp + 8 nt + 2 tc + e % 2
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = j0 + gr + 8 * (e >> 1), i = 32 * warp + 8 * nt + 2 * tc + (e & 1);
            acc_s[nt][e] = j < dim && i < dim ? state[((size_t)h * dim + j) * dim + i] : 0.0f;
        }

    for (int chunk = 0; chunk < chunks; ++chunk) {
        const int c0 = chunk * DNC_CHUNK, n = min(DNC_CHUNK, tokens - c0);
        const size_t hc = (size_t)h * chunks + chunk;
        const float* qc = q + ((size_t)c0 * n_k_heads + kh) * dim;
        const float* kc = k + ((size_t)c0 * n_k_heads + kh) * dim;
        if (tid < DNC_CHUNK) {
            const float* gc = g_cum + hc * DNC_CHUNK;
            const float g_i = gc[tid], g_last = gc[DNC_CHUNK - 1];
            s_qs[tid] = __fmul_rn(expf(g_i), scale);
            s_dk[tid] = tid < n ? expf(__fsub_rn(g_last, g_i)) : 0.0f;
            if (tid == 0) s_end[0] = expf(g_last);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const int i = 32 * warp + 8 * nt + 2 * tc;
            *reinterpret_cast<float2*>(s_s + gr * DNC_LDS + i) = make_float2(acc_s[nt][0], acc_s[nt][1]);
            *reinterpret_cast<float2*>(s_s + (gr + 8) * DNC_LDS + i) = make_float2(acc_s[nt][2], acc_s[nt][3]);
        }
        __syncthreads();

        // W S^T and q S^T over the keys: [16 tokens, 16 slab rows] a warp. Loops of fixed length (keys past dim
        // and tokens past n read as zeros, the slab is zero past dim) so the loads can all go out ahead.
        const float* wc = w + hc * DNC_CHUNK * dim;
        float acc_v[2][4] = {}, acc_o[2][4] = {};
#pragma unroll
        for (int d0 = 0; d0 < DNC_DIM; d0 += 8) {
            const int d = d0 + 2 * tc;
            unsigned aw[4], aq[4];
            dnc_a_frag(aw, dnc_pair(wc + r0 * dim + d, d < dim), dnc_pair(wc + r1 * dim + d, d < dim));
            dnc_a_frag(aq, dnc_pair(qc + r0 * key_stride + d, r0 < n && d < dim),
                       dnc_pair(qc + r1 * key_stride + d, r1 < n && d < dim));
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const float2 b = *reinterpret_cast<const float2*>(s_s + (8 * nt + gr) * DNC_LDS + d);
                const unsigned b0 = to_tf32(b.x), b1 = to_tf32(b.y);
                mma_1688_tf32(acc_v[nt], aw, b0, b1);
                mma_1688_tf32(acc_o[nt], aq, b0, b1);
            }
        }
        // V' = U - W S^T into s_v; the state's share of o scaled by exp(G) / sqrt(dim).
        const float* uc = u + hc * DNC_CHUNK * dim;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e < 2 ? r0 : r1, j = 8 * nt + 2 * tc + (e & 1);
                s_v[j * DNC_LDV + r] = j0 + j < dim ? __fsub_rn(uc[r * dim + j0 + j], acc_v[nt][e]) : 0.0f;
                acc_o[nt][e] = __fmul_rn(acc_o[nt][e], s_qs[r]);
            }
        __syncthreads();

        // o += P V' over the chunk's tokens (P is zero past each row's own: exact zeros added).
        const float* pc = p + hc * DNC_CHUNK * DNC_CHUNK;
#pragma unroll
        for (int s0 = 0; s0 < DNC_CHUNK; s0 += 8) {
            const int s = s0 + 2 * tc;
            unsigned ap[4];
            dnc_a_frag(ap, dnc_pair(pc + r0 * DNC_CHUNK + s, true), dnc_pair(pc + r1 * DNC_CHUNK + s, true));
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const float2 b = *reinterpret_cast<const float2*>(s_v + (8 * nt + gr) * DNC_LDV + s);
                mma_1688_tf32(acc_o[nt], ap, to_tf32(b.x), to_tf32(b.y));
            }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int j = j0 + 8 * nt + 2 * tc;
            if (j >= dim) continue;
            if (r0 < n)
                *reinterpret_cast<float2*>(out + ((size_t)(c0 + r0) * n_v_heads + h) * dim + j) =
                    make_float2(acc_o[nt][0], acc_o[nt][1]);
            if (r1 < n)
                *reinterpret_cast<float2*>(out + ((size_t)(c0 + r1) * n_v_heads + h) * dim + j) =
                    make_float2(acc_o[nt][2], acc_o[nt][3]);
        }

        // S <- exp(G_last) S + V'^T (k exp(G_last - G)): [16 slab rows, 32 columns] a warp, over the tokens.
        const float s_end_chunk = s_end[0];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[nt][e] = __fmul_rn(acc_s[nt][e], s_end_chunk);
#pragma unroll
        for (int s0 = 0; s0 < DNC_CHUNK; s0 += 8) {  // V' and the factors are zero past n
            const int s = s0 + 2 * tc;
            unsigned av[4];
            dnc_a_frag(av, *reinterpret_cast<const float2*>(s_v + gr * DNC_LDV + s),
                       *reinterpret_cast<const float2*>(s_v + (gr + 8) * DNC_LDV + s));
            const float dk0 = s_dk[s], dk1 = s_dk[s + 1];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                if (32 * warp + 8 * nt >= dim) continue;  // warp-uniform: columns past dim stay zero
                const int i = 32 * warp + 8 * nt + gr;
                const float k0 = s < n ? kc[s * key_stride + i] : 0.0f;
                const float k1 = s + 1 < n ? kc[(s + 1) * key_stride + i] : 0.0f;
                mma_1688_tf32(acc_s[nt], av, to_tf32(__fmul_rn(k0, dk0)), to_tf32(__fmul_rn(k1, dk1)));
            }
        }
        __syncthreads();  // s_s, s_v and the chunk's factors are rewritten next
    }

#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = j0 + gr + 8 * (e >> 1), i = 32 * warp + 8 * nt + 2 * tc + (e & 1);
            if (j < dim && i < dim) state_out[((size_t)h * dim + j) * dim + i] = acc_s[nt][e];
        }
}
