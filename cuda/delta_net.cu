// The hybrid families' ops (qwen35moe, qwen3next) on float32: sigmoid, per-head L2 norm, multi-section
// rotary, the DeltaNet gates, the causal short conv, the gated delta rule, and a row-times-vector dot
// (the shared expert's 1-D gate). Each mirrors its twin in runner/backends/numpy/delta_net.py: double
// where the twin uses float64, __f*_rn intrinsics for float32 steps the twin rounds one at a time.

#define DN_ROW_THREADS 256
#define DN_WARPS 4         // state rows per block of the delta rule kernel
#define DN_NARROW_DIM 128  // the delta rule keeps a state row in registers: dim / 32 floats a lane, rounded
#define DN_MAX_DIM 256     // up to DN_NARROW_DIM / 32 or DN_MAX_DIM / 32 (two kernels)
// 8 blocks of DN_WARPS warps an SM (at most 64 registers a thread): a 132-SM H200 then holds all
// 32 x 128 = 4096 row warps of qwen35-35b-a3b's layer in one wave (at 72 registers it took two).
#define DN_MIN_BLOCKS 8

__device__ __forceinline__ double dn_block_sum(double v, double* warp_sums) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < DN_ROW_THREADS / 32; ++w) total += warp_sums[w];  // every thread, same order
    return total;
}

__device__ __forceinline__ float dn_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float dn_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// out = 1 / (1 + exp(-x)), elementwise over n floats.
extern "C" __global__ void
sigmoid_f32(const float* __restrict__ x, float* __restrict__ out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = dn_sigmoid(x[i]);
}

// x, out [rows, n]: x * (float)(1 / sqrt(mean(x^2) + eps / n)) * (float)(1 / sqrt(n)), the twin's
// two float32 multiplies in its order. One block of DN_ROW_THREADS per row.
extern "C" __global__ void __launch_bounds__(DN_ROW_THREADS)
l2_norm_f32(const float* __restrict__ x, float* __restrict__ out, int n, double eps) {
    __shared__ double warp_sums[DN_ROW_THREADS / 32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* outr = out + (size_t)blockIdx.x * n;
    double sum_sq = 0.0;
    for (int i = threadIdx.x; i < n; i += DN_ROW_THREADS) {
        const double v = (double)xr[i];
        sum_sq += v * v;
    }
    sum_sq = dn_block_sum(sum_sq, warp_sums);
    const float scale = (float)(1.0 / sqrt(sum_sq / (double)n + eps / (double)n));
    const float inv_sqrt_n = (float)(1.0 / sqrt((double)n));
    for (int i = threadIdx.x; i < n; i += DN_ROW_THREADS)
        outr[i] = __fmul_rn(__fmul_rn(xr[i], scale), inv_sqrt_n);
}

// x, out [tokens, heads, head_dim]; positions [tokens]. NEOX pairs (d, d + n_rot/2) of the first n_rot
// dims; pair d rotates by the token's position when its sector d % section_sum falls in the t, h or w
// section (llama.cpp's interleaved IMROPE for text), else by 0. One thread per element, as rope_neox_f32.
extern "C" __global__ void
rope_multi_f32(const float* __restrict__ x, const int* __restrict__ positions, float* __restrict__ out,
               long long total, int heads, int head_dim, int n_rot, double base, int s_t, int s_h, int s_w,
               int section_sum) {
    const int half = n_rot / 2;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int d = (int)(idx % head_dim);
        if (d >= n_rot) {
            out[idx] = x[idx];
            continue;
        }
        if (d >= half) continue;
        const int sector = d % section_sum;
        const bool text = (sector % 3 == 0 && sector < 3 * s_t) || (sector % 3 == 1 && sector < 3 * s_h) ||
                          (sector % 3 == 2 && sector < 3 * s_w);
        const long long token = idx / head_dim / heads;
        const double inv_freq = pow(base, (-(double)d * 2.0) / (double)n_rot);
        const double theta = (text ? (double)positions[token] : 0.0) * inv_freq;
        double sin_d, cos_d;
        sincos(theta, &sin_d, &cos_d);
        const float c = (float)cos_d, s = (float)sin_d;
        const float x0 = x[idx], x1 = x[idx + half];
        out[idx] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        out[idx + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}

// alpha, beta, g, write [tokens, heads]; dt_bias, a [heads]. g = softplus(alpha + dt_bias) * a
// (softplus taken as x past 20, as ggml does), write = sigmoid(beta).
extern "C" __global__ void
delta_net_gates_f32(const float* __restrict__ alpha, const float* __restrict__ beta,
                    const float* __restrict__ dt_bias, const float* __restrict__ a, float* __restrict__ g,
                    float* __restrict__ write, long long total, int heads) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int h = (int)(i % heads);
        const float x = __fadd_rn(alpha[i], dt_bias[h]);
        const float softplus = x > 20.0f ? x : log1pf(expf(fminf(x, 20.0f)));
        g[i] = __fmul_rn(softplus, a[h]);
        write[i] = dn_sigmoid(beta[i]);
    }
}

// x, y [tokens, channels]; state [K-1, channels]; w [channels, K]; window [K-1+tokens, channels].
// window = state then x; y[t, c] = SiLU(sum over k in order of window[t + k, c] * w[c, k]).
// One thread per window element; those at rows >= K-1 also compute their token's output.
extern "C" __global__ void
ssm_conv_f32(const float* __restrict__ x, const float* __restrict__ state, const float* __restrict__ w,
             float* __restrict__ y, float* __restrict__ window, int tokens, int channels, int kernel) {
    const long long total = (long long)(kernel - 1 + tokens) * channels;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(idx % channels);
        const int row = (int)(idx / channels);
        window[idx] = row < kernel - 1 ? state[idx] : x[idx - (long long)(kernel - 1) * channels];
        if (row < kernel - 1) continue;
        const int t = row - (kernel - 1);
        float acc = 0.0f;
        for (int k = 0; k < kernel; ++k) {
            const int r = t + k;  // window row
            const float in = r < kernel - 1 ? state[(long long)r * channels + c]
                                            : x[(long long)(r - (kernel - 1)) * channels + c];
            acc = __fadd_rn(acc, __fmul_rn(in, w[(long long)c * kernel + k]));
        }
        y[(long long)t * channels + c] = __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
    }
}

// One token's inputs to a state row of the delta rule: its key head's k and q (lane's share), v[j], g, beta.
template <int PER_LANE>
struct DnToken {
    float k[PER_LANE], q[PER_LANE];
    float v, g, beta;
};

template <int PER_LANE>
__device__ __forceinline__ void dn_load_token(DnToken<PER_LANE>& in, const float* __restrict__ q,
                                              const float* __restrict__ k, const float* __restrict__ v,
                                              const float* __restrict__ g, const float* __restrict__ beta, int t,
                                              int n_k_heads, int n_v_heads, int dim, int h, int kh, int j,
                                              int lane) {
    const float* kt = k + ((size_t)t * n_k_heads + kh) * dim;
    const float* qt = q + ((size_t)t * n_k_heads + kh) * dim;
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m) {
        const int i = lane + 32 * m;
        in.k[m] = i < dim ? kt[i] : 0.0f;
        in.q[m] = i < dim ? qt[i] : 0.0f;
    }
    in.v = v[((size_t)t * n_v_heads + h) * dim + j];
    in.g = g[(size_t)t * n_v_heads + h];
    in.beta = beta[(size_t)t * n_v_heads + h];
}

// The gated delta rule, token by token, from state [H_v, dim, dim] ([head, value j, key i]; not written):
//   S <- exp(g) S;  S <- S + beta (v - S k) k^T;  o = S q / sqrt(dim).
// q, k [tokens, H_k, dim]; v, out [tokens, H_v, dim]; g, beta [tokens, H_v]; value head h reads key head
// h / (H_v / H_k) when grouped, else h % H_k. states: the state after every token [tokens, H_v, dim, dim]
// when keep_states, else after the last [1, H_v, dim, dim].
// Row j of a head's state changes only through its own v[j] and o[j]: one warp owns a row, holding it in
// registers (lane l has keys l, l+32, ..., PER_LANE of them: dim <= 32 PER_LANE), and walks the tokens in
// order, loading the next token's inputs while it computes this one's. Grid (ceil(dim / DN_WARPS), H_v).
// A row's arithmetic does not depend on how many tokens the launch has, so a verify batch gives a decode
// step's bits (and keys past dim add exact zeros, so either width gives the same bits).
template <int PER_LANE>
__device__ __forceinline__ void
dn_delta_rule(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
              const float* __restrict__ g, const float* __restrict__ beta, const float* __restrict__ state,
              float* __restrict__ out, float* __restrict__ states, int tokens, int n_k_heads, int n_v_heads, int dim,
              int grouped, int keep_states) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * DN_WARPS + (threadIdx.x >> 5);
    const int h = blockIdx.y;
    if (j >= dim || tokens < 1) return;
    const int kh = grouped ? h / (n_v_heads / n_k_heads) : h % n_k_heads;
    const float scale = (float)(1.0 / sqrt((double)dim));
    const size_t head_state = (size_t)dim * dim;

    float s[PER_LANE];
    const float* row0 = state + h * head_state + (size_t)j * dim;
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m) {
        const int i = lane + 32 * m;
        s[m] = i < dim ? row0[i] : 0.0f;
    }
    DnToken<PER_LANE> next;
    dn_load_token<PER_LANE>(next, q, k, v, g, beta, 0, n_k_heads, n_v_heads, dim, h, kh, j, lane);
    for (int t = 0; t < tokens; ++t) {
        const DnToken<PER_LANE> in = next;
        if (t + 1 < tokens)
            dn_load_token<PER_LANE>(next, q, k, v, g, beta, t + 1, n_k_heads, n_v_heads, dim, h, kh, j, lane);
        const float decay = expf(in.g);
        float sk = 0.0f;
#pragma unroll
        for (int m = 0; m < PER_LANE; ++m) {
            s[m] = __fmul_rn(s[m], decay);
            sk += s[m] * in.k[m];
        }
        sk = dn_warp_sum(sk);
        const float delta = __fmul_rn(__fsub_rn(in.v, sk), in.beta);
        float o = 0.0f;
#pragma unroll
        for (int m = 0; m < PER_LANE; ++m) {
            s[m] = __fadd_rn(s[m], __fmul_rn(delta, in.k[m]));
            o += s[m] * in.q[m];
        }
        o = dn_warp_sum(o);
        if (lane == 0) out[((size_t)t * n_v_heads + h) * dim + j] = __fmul_rn(o, scale);
        if (keep_states) {
            float* row = states + ((size_t)t * n_v_heads + h) * head_state + (size_t)j * dim;
#pragma unroll
            for (int m = 0; m < PER_LANE; ++m)
                if (lane + 32 * m < dim) row[lane + 32 * m] = s[m];
        }
    }
    if (!keep_states) {
        float* row = states + h * head_state + (size_t)j * dim;
#pragma unroll
        for (int m = 0; m < PER_LANE; ++m)
            if (lane + 32 * m < dim) row[lane + 32 * m] = s[m];
    }
}

// dim <= 128 (every published hybrid: 128): 4 keys a lane.
extern "C" __global__ void __launch_bounds__(DN_WARPS * 32, DN_MIN_BLOCKS)
gated_delta_net_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const float* __restrict__ g, const float* __restrict__ beta, const float* __restrict__ state,
                    float* __restrict__ out, float* __restrict__ states, int tokens, int n_k_heads, int n_v_heads,
                    int dim, int grouped, int keep_states) {
    dn_delta_rule<DN_NARROW_DIM / 32>(q, k, v, g, beta, state, out, states, tokens, n_k_heads, n_v_heads, dim,
                                      grouped, keep_states);
}

// DN_NARROW_DIM < dim <= DN_MAX_DIM: 8 keys a lane.
extern "C" __global__ void __launch_bounds__(DN_WARPS * 32, DN_MIN_BLOCKS)
gated_delta_net_wide_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ g, const float* __restrict__ beta, const float* __restrict__ state,
                         float* __restrict__ out, float* __restrict__ states, int tokens, int n_k_heads,
                         int n_v_heads, int dim, int grouped, int keep_states) {
    dn_delta_rule<DN_MAX_DIM / 32>(q, k, v, g, beta, state, out, states, tokens, n_k_heads, n_v_heads, dim,
                                   grouped, keep_states);
}

// x [rows, n], w [n] -> out [rows]: one dot product per row (a 1-D weight such as ffn_gate_inp_shexp),
// in double, one block per row; a row's sum does not depend on the other rows.
extern "C" __global__ void __launch_bounds__(DN_ROW_THREADS)
row_dot_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int n) {
    __shared__ double warp_sums[DN_ROW_THREADS / 32];
    const float* xr = x + (size_t)blockIdx.x * n;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += DN_ROW_THREADS) sum += (double)xr[i] * (double)w[i];
    sum = dn_block_sum(sum, warp_sums);
    if (threadIdx.x == 0) out[blockIdx.x] = (float)sum;
}
