// Greedy decoding's choice on the device: the index of a logits row's largest value (the first of equals, as
// np.argmax) and whether every value is finite, so the host downloads two ints instead of the row
// (151552 floats a token at the seed shape). Twin: NumpyOps.greedy_token.

#include "pdl.cuh"

#define GREEDY_THREADS 1024

// out[0] = argmax of x[0..n), out[1] = 1 if every x is finite else 0; with token_out (not null), out[0] also there
// as an int64: a decode graph's token buffer, so the next step reads its input where this one chose it. One block
// of GREEDY_THREADS: thread t keeps the best of x[t], x[t + GREEDY_THREADS], ... (ties to the lower index), then a
// tree in shared memory.
extern "C" __global__ void __launch_bounds__(GREEDY_THREADS)
greedy_f32(const float* __restrict__ x, int n, int* __restrict__ out, long long* __restrict__ token_out) {
    PDL_ENTRY();
    __shared__ float best_v[GREEDY_THREADS];
    __shared__ int best_i[GREEDY_THREADS];
    __shared__ int all_finite;
    const int t = threadIdx.x;
    if (t == 0) all_finite = 1;
    __syncthreads();
    float v = __int_as_float(0xff800000);  // -inf: any finite value beats it
    int i = n;  // past the end: loses every tie
    bool finite = true;
    for (int k = t; k < n; k += GREEDY_THREADS) {
        const float xk = x[k];
        finite = finite && (__float_as_uint(xk) & 0x7f800000u) != 0x7f800000u;  // exponent all ones: inf, NaN
        if (xk > v) {  // strictly: the first of equals stays (k grows)
            v = xk;
            i = k;
        }
    }
    if (!finite) all_finite = 0;  // a benign race: every writer writes 0
    best_v[t] = v;
    best_i[t] = i;
    __syncthreads();
    for (int half = GREEDY_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) {
            const float w = best_v[t + half];
            const int j = best_i[t + half];
            if (w > best_v[t] || (w == best_v[t] && j < best_i[t])) {
                best_v[t] = w;
                best_i[t] = j;
            }
        }
        __syncthreads();
    }
    if (t == 0) {
        out[0] = best_i[0] < n ? best_i[0] : 0;  // every value -inf: np.argmax gives 0 (and the row is not finite)
        out[1] = all_finite;
        if (token_out != nullptr) *token_out = out[0];
    }
}
