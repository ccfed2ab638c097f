// Host harness for tests/test_quant_blocks_host.py: decodes GGUF blocks with cuda/blocks.cuh on the CPU.
// Usage: quant_blocks_host TYPE < blocks > values (whole blocks of raw bytes in, float32 out, both
// little-endian). Built by g++ as C++ or by nvcc as CUDA (its host pass), always with -ffp-contract=off.
#include <cstdio>
#include <cstring>
#include <vector>

#include "blocks.cuh"

template <class Block>
static int decode_all() {
    std::vector<u8> block(Block::TYPE_SIZE);
    float values[Block::BLOCK];
    while (std::fread(block.data(), 1, Block::TYPE_SIZE, stdin) == (size_t)Block::TYPE_SIZE) {
        for (int g = 0; g < Block::BLOCK / 8; ++g) Block::group(block.data(), g, values + 8 * g);
        std::fwrite(values, sizeof(float), Block::BLOCK, stdout);
    }
    return 0;
}

#define TYPES(X)                                                                                     \
    X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_NL)        \
    X(IQ4_XS) X(MXFP4) X(IQ1_S) X(IQ1_M) X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) X(IQ3_XXS) X(IQ3_S) X(TQ1_0) \
    X(TQ2_0)

int main(int argc, char** argv) {
    if (argc != 2) return 2;
#define DECODE_IF(name) \
    if (!std::strcmp(argv[1], #name)) return decode_all<Block##name>();
    TYPES(DECODE_IF)
    std::fprintf(stderr, "unknown type %s\n", argv[1]);
    return 2;
}
