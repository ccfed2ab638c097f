// GGUF block decoders shared by the CUDA kernels (dequant.cu, gemv.cu): raw little-endian bytes of
// one block in, float32 values out. Products and sums use __f*_rn so the compiler cannot fuse them
// into FMAs: each value is the same float32 operations, in the same order, as gguf.quants.dequantize.
#pragma once
#include <cuda_fp16.h>

typedef unsigned char u8;

__device__ __forceinline__ float fp16_at(const u8* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ unsigned u32_at(const u8* p) {
    return (unsigned)p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24);
}

// 16-entry int8 tables packed little-endian into two words: ALU only, no divergent memory lookups.
__device__ __forceinline__ int iq4nl_value(int index) {  // kvalues_iq4nl
    const unsigned long long half = index < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
    return (signed char)((half >> (8 * (index & 7))) & 0xFF);
}

__device__ __forceinline__ int mxfp4_value(int index) {  // kvalues_mxfp4: e2m1 doubled, bit 3 the sign
    const int magnitude = (int)((0x0C08060403020100ull >> (8 * (index & 7))) & 0xFF);
    return index & 8 ? -magnitude : magnitude;  // integer negation keeps index 8 at +0
}

__device__ __forceinline__ float e8m0_to_fp32_half(unsigned e) {  // ggml_e8m0_to_fp32_half
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
__device__ __forceinline__ void k_scale_min(const u8* s, int j, int& scale, int& min) {
    if (j < 4) {
        scale = s[j] & 63;
        min = s[j + 4] & 63;
    } else {
        scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Each Block* holds one format: BLOCK outputs in TYPE_SIZE bytes (ggml-common.h), and group(b, g, v)
// writes outputs 8g..8g+7 of the block at b to v.

struct BlockQ4_0 {  // d, qs[16]: low nibbles are outputs 0..15, high nibbles 16..31
    static constexpr int BLOCK = 32, TYPE_SIZE = 18;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const u8* qs = b + 2 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(d, (float)(((qs[k] >> shift) & 0xF) - 8));
    }
};

struct BlockQ4_1 {  // d, m, qs[16]
    static constexpr int BLOCK = 32, TYPE_SIZE = 20;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
        const u8* qs = b + 4 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(__fmul_rn(d, (float)((qs[k] >> shift) & 0xF)), m);
    }
};

struct BlockQ5_0 {  // d, qh (bit i is output i's fifth bit), qs[16]
    static constexpr int BLOCK = 32, TYPE_SIZE = 22;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const unsigned qh = u32_at(b + 2) >> (8 * g);
        const u8* qs = b + 6 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 0xF) | (((qh >> k) & 1) << 4);
            v[k] = __fmul_rn(d, (float)(q - 16));
        }
    }
};

struct BlockQ5_1 {  // d, m, qh, qs[16]
    static constexpr int BLOCK = 32, TYPE_SIZE = 24;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
        const unsigned qh = u32_at(b + 4) >> (8 * g);
        const u8* qs = b + 8 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 0xF) | (((qh >> k) & 1) << 4);
            v[k] = __fadd_rn(__fmul_rn(d, (float)q), m);
        }
    }
};

struct BlockQ8_0 {  // d, qs[32] int8
    static constexpr int BLOCK = 32, TYPE_SIZE = 34;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const u8* qs = b + 2 + g * 8;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn((float)(signed char)qs[k], d);
    }
};

struct BlockQ2_K {  // scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    static constexpr int BLOCK = 256, TYPE_SIZE = 84;
    __device__ static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8;  // output i: byte qs[32 * (i / 128) + i % 32], bits 2 * ((i / 32) % 4)
        const int sc = b[i0 >> 4];
        const float dl = __fmul_rn(fp16_at(b + 80), (float)(sc & 0xF));
        const float ml = __fmul_rn(fp16_at(b + 82), (float)(sc >> 4));
        const u8* qs = b + 16 + (i0 >> 7) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 3) * 2;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fsub_rn(__fmul_rn(dl, (float)((qs[k] >> shift) & 3)), ml);
    }
};

struct BlockQ3_K {  // hmask[32], qs[64], scales[12] (16 6-bit scales), d
    static constexpr int BLOCK = 256, TYPE_SIZE = 110;
    __device__ static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8, j = i0 >> 4;
        const u8* sc = b + 96;
        const int low = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
        const int high = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        const float dl = __fmul_rn(fp16_at(b + 108), (float)((low | (high << 4)) - 32));
        const u8* hmask = b + (i0 & 31);  // output i: bit i / 32 of hmask[i % 32]
        const u8* qs = b + 32 + (i0 >> 7) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 3) * 2, hbit = i0 >> 5;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 3) - ((hmask[k] >> hbit) & 1 ? 0 : 4);
            v[k] = __fmul_rn(dl, (float)q);
        }
    }
};

struct BlockQ4_K {  // d, dmin, scales[12] (8 6-bit scale/min pairs), qs[128]
    static constexpr int BLOCK = 256, TYPE_SIZE = 144;
    __device__ static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8;  // output i: qs[32 * (i / 64) + i % 32], nibble (i / 32) % 2
        int scale, min;
        k_scale_min(b + 4, i0 >> 5, scale, min);
        const float dl = __fmul_rn(fp16_at(b), (float)scale);
        const float ml = __fmul_rn(fp16_at(b + 2), (float)min);
        const u8* qs = b + 16 + (i0 >> 6) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fsub_rn(__fmul_rn(dl, (float)((qs[k] >> shift) & 0xF)), ml);
    }
};

struct BlockQ5_K {  // d, dmin, scales[12], qh[32] (bit i / 32 of qh[i % 32]), qs[128]
    static constexpr int BLOCK = 256, TYPE_SIZE = 176;
    __device__ static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8;
        int scale, min;
        k_scale_min(b + 4, i0 >> 5, scale, min);
        const float dl = __fmul_rn(fp16_at(b), (float)scale);
        const float ml = __fmul_rn(fp16_at(b + 2), (float)min);
        const u8* qh = b + 16 + (i0 & 31);
        const u8* qs = b + 48 + (i0 >> 6) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 1) * 4, hbit = i0 >> 5;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 0xF) | (((qh[k] >> hbit) & 1) << 4);
            v[k] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    }
};

struct BlockQ6_K {  // ql[128], qh[64], scales[16] int8, d
    static constexpr int BLOCK = 256, TYPE_SIZE = 210;
    __device__ static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8, half = i0 >> 7;
        const float dl = __fmul_rn(fp16_at(b + 208), (float)(signed char)b[192 + (i0 >> 4)]);
        const u8* ql = b + half * 64 + (i0 & 63);         // nibble (i % 128) / 64
        const u8* qh = b + 128 + half * 32 + (i0 & 31);   // bits 2 * ((i / 32) % 4)
        const int lshift = ((i0 >> 6) & 1) * 4, hshift = ((i0 >> 5) & 3) * 2;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = (((ql[k] >> lshift) & 0xF) | (((qh[k] >> hshift) & 3) << 4)) - 32;
            v[k] = __fmul_rn(dl, (float)q);
        }
    }
};

struct BlockIQ4_NL {  // d, qs[16] indices into kvalues_iq4nl
    static constexpr int BLOCK = 32, TYPE_SIZE = 18;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const u8* qs = b + 2 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(d, (float)iq4nl_value((qs[k] >> shift) & 0xF));
    }
};

struct BlockIQ4_XS {  // d, scales_h (2 bits each), scales_l[4] (nibbles), qs[128]: 8 sub-blocks of 32
    static constexpr int BLOCK = 256, TYPE_SIZE = 136;
    __device__ static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8, j = i0 >> 5;
        const unsigned scales_h = b[2] | (b[3] << 8);
        const int low = (b[4 + (j >> 1)] >> (4 * (j & 1))) & 0xF;
        const int high = (scales_h >> (2 * j)) & 3;
        const float dl = __fmul_rn(fp16_at(b), (float)((low | (high << 4)) - 32));
        const u8* qs = b + 8 + j * 16 + (i0 & 15);  // output i: nibble (i / 16) % 2
        const int shift = ((i0 >> 4) & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(dl, (float)iq4nl_value((qs[k] >> shift) & 0xF));
    }
};

struct BlockMXFP4 {  // e (E8M0 exponent), qs[16] indices into kvalues_mxfp4
    static constexpr int BLOCK = 32, TYPE_SIZE = 17;
    __device__ static void group(const u8* b, int g, float* v) {
        const float d = e8m0_to_fp32_half(b[0]);
        const u8* qs = b + 1 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(d, (float)mxfp4_value((qs[k] >> shift) & 0xF));
    }
};

// F16 / BF16 values from their raw bits.
__device__ __forceinline__ float f16_value(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ float bf16_value(unsigned short bits) { return __uint_as_float((unsigned)bits << 16); }
