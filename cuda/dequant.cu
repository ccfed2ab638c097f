// Dequantize rows of GGUF blocks (raw little-endian bytes, rows back to back) to float32 or float16.
// Each quant kernel gives one thread 8 consecutive outputs of one block: every block size here is a
// multiple of 8 and no 8-run crosses a sub-block, so a thread reads one scale, a few adjacent bytes,
// and writes 32 (float32) or 16 (float16) contiguous bytes. Rows need no index math: contiguous
// rows of whole blocks are one flat run of blocks.
// The block decoders live in blocks.cuh (shared with gemv.cu).
// The *_gather entries read experts scattered in memory (slots, staging buffers): ptrs[c] is the
// address of expert c's [rows, row_bytes] matrix, and the output is the experts' values back to back.
#include "blocks.cuh"

#define DEQUANT_THREADS 256

__device__ __forceinline__ void store8(float* out, const float* v) {
    float4* o = reinterpret_cast<float4*>(out);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ void store8(__half* out, const float* v) {
    unsigned packed[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
        packed[k] = (unsigned)__half_as_ushort(__float2half_rn(v[2 * k])) |
                    ((unsigned)__half_as_ushort(__float2half_rn(v[2 * k + 1])) << 16);
    *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// raw: n_groups / (BLOCK / 8) blocks back to back; out: n_groups * 8 values (16-byte aligned).
template <class Block, class Out>
__device__ __forceinline__ void dequant_groups(const u8* __restrict__ raw, Out* __restrict__ out,
                                               long long n_groups) {
    constexpr int GROUPS = Block::BLOCK / 8;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n_groups;
         t += (long long)gridDim.x * blockDim.x) {
        float v[8];
        Block::group(raw + (t / GROUPS) * Block::TYPE_SIZE, (int)(t % GROUPS), v);
        store8(out + t * 8, v);
    }
}

// Expert c's groups are groups_per_expert consecutive groups of the output.
template <class Block, class Out>
__device__ __forceinline__ void dequant_groups_gather(const u8* const* __restrict__ ptrs, Out* __restrict__ out,
                                                      long long groups_per_expert, long long n_groups) {
    constexpr int GROUPS = Block::BLOCK / 8;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n_groups;
         t += (long long)gridDim.x * blockDim.x) {
        const long long c = t / groups_per_expert, g = t - c * groups_per_expert;
        float v[8];
        Block::group(ptrs[c] + (g / GROUPS) * Block::TYPE_SIZE, (int)(g % GROUPS), v);
        store8(out + t * 8, v);
    }
}

#define DEQUANT_ENTRIES(name, Block)                                                                  \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                     \
    dequant_##name##_f32(const u8* __restrict__ raw, float* __restrict__ out, long long n_groups) {   \
        dequant_groups<Block>(raw, out, n_groups);                                                    \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                     \
    dequant_##name##_f16(const u8* __restrict__ raw, __half* __restrict__ out, long long n_groups) {  \
        dequant_groups<Block>(raw, out, n_groups);                                                    \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                     \
    dequant_##name##_f16_gather(const u8* const* __restrict__ ptrs, __half* __restrict__ out,         \
                                long long groups_per_expert, long long n_groups) {                    \
        dequant_groups_gather<Block>(ptrs, out, groups_per_expert, n_groups);                         \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                     \
    dequant_##name##_f32_gather(const u8* const* __restrict__ ptrs, float* __restrict__ out,          \
                                long long groups_per_expert, long long n_groups) {                    \
        dequant_groups_gather<Block>(ptrs, out, groups_per_expert, n_groups);                         \
    }

DEQUANT_ENTRIES(q4_0, BlockQ4_0)
DEQUANT_ENTRIES(q4_1, BlockQ4_1)
DEQUANT_ENTRIES(q5_0, BlockQ5_0)
DEQUANT_ENTRIES(q5_1, BlockQ5_1)
DEQUANT_ENTRIES(q8_0, BlockQ8_0)
DEQUANT_ENTRIES(q2_k, BlockQ2_K)
DEQUANT_ENTRIES(q3_k, BlockQ3_K)
DEQUANT_ENTRIES(q4_k, BlockQ4_K)
DEQUANT_ENTRIES(q5_k, BlockQ5_K)
DEQUANT_ENTRIES(q6_k, BlockQ6_K)
DEQUANT_ENTRIES(iq4_nl, BlockIQ4_NL)
DEQUANT_ENTRIES(iq4_xs, BlockIQ4_XS)
DEQUANT_ENTRIES(mxfp4, BlockMXFP4)
DEQUANT_ENTRIES(iq1_s, BlockIQ1_S)
DEQUANT_ENTRIES(iq1_m, BlockIQ1_M)
DEQUANT_ENTRIES(iq2_xxs, BlockIQ2_XXS)
DEQUANT_ENTRIES(iq2_xs, BlockIQ2_XS)
DEQUANT_ENTRIES(iq2_s, BlockIQ2_S)
DEQUANT_ENTRIES(iq3_xxs, BlockIQ3_XXS)
DEQUANT_ENTRIES(iq3_s, BlockIQ3_S)
DEQUANT_ENTRIES(tq1_0, BlockTQ1_0)
DEQUANT_ENTRIES(tq2_0, BlockTQ2_0)

// F16 / BF16: one thread per value, n values (raw 2-byte aligned).
__device__ __forceinline__ void store1(float* out, float v) { *out = v; }
__device__ __forceinline__ void store1(__half* out, float v) { *out = __float2half_rn(v); }

#define FLOAT_ENTRY(name, value_of, Out)                                                              \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                     \
    dequant_##name(const unsigned short* __restrict__ raw, Out* __restrict__ out, long long n) {     \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;                  \
             i += (long long)gridDim.x * blockDim.x)                                                  \
            store1(out + i, value_of(raw[i]));                                                        \
    }

FLOAT_ENTRY(f16_f32, f16_value, float)
FLOAT_ENTRY(f16_f16, f16_value, __half)
FLOAT_ENTRY(bf16_f32, bf16_value, float)
FLOAT_ENTRY(bf16_f16, bf16_value, __half)

// F32 / F16 / BF16 experts scattered in memory: one thread per value, per_expert values each.
__device__ __forceinline__ float f32_value(float v) { return v; }

#define FLOAT_GATHER_ENTRY(name, In, value_of, Out)                                                   \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS)                                     \
    dequant_##name##_gather(const In* const* __restrict__ ptrs, Out* __restrict__ out,                \
                            long long per_expert, long long n) {                                      \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;                  \
             i += (long long)gridDim.x * blockDim.x) {                                                \
            const long long c = i / per_expert;                                                       \
            store1(out + i, value_of(ptrs[c][i - c * per_expert]));                                   \
        }                                                                                             \
    }

FLOAT_GATHER_ENTRY(f32_f32, float, f32_value, float)
FLOAT_GATHER_ENTRY(f32_f16, float, f32_value, __half)
FLOAT_GATHER_ENTRY(f16_f32, unsigned short, f16_value, float)
FLOAT_GATHER_ENTRY(f16_f16, unsigned short, f16_value, __half)
FLOAT_GATHER_ENTRY(bf16_f32, unsigned short, bf16_value, float)
FLOAT_GATHER_ENTRY(bf16_f16, unsigned short, bf16_value, __half)
