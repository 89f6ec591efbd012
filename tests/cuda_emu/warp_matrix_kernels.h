// Test kernels for kernels/cuda/warp_matrix.cuh (mma.sync, ldmatrix, cp.async): built by nvcc
// into ft_cuda_kernel_tests (a GPU) and by g++ against the CUDA emulation into ft_cuda_emu_tests,
// so test_warp_matrix.cpp checks the same kernels on both. Pointers are device memory; 16-bit
// elements travel as their bits (uint16_t), `bf16` picks bf16 over f16 for the mma.
#pragma once

#include <cstdint>

namespace ft::kernels::cuda::test {

// How mma_packed packs its A operand: as the PTX ISA's fragment layout says, or two wrong ways.
enum class AMapping { kIsa = 0, kTransposed = 1, kHalvesSwapped = 2 };

// One warp: d (16x8 f32, row-major) = a (16x16, row-major) · b (16x8, [k][n]) + c (16x8), the
// fragments packed by hand from global memory.
void mma_packed(bool bf16, float* d, const uint16_t* a, const uint16_t* b, const float* c,
                AMapping mapping);
// The same product with the tiles brought to shared memory by cp.async and loaded by ldmatrix:
// A by .x4, B by .x2 .trans from b (16x8, [k][n]) or, when b_nk is not null, by .x2 from b_nk
// (8x16, [n][k]).
void mma_ldmatrix(bool bf16, float* d, const uint16_t* a, const uint16_t* b, const uint16_t* b_nk,
                  const float* c);
// One warp: src (32 rows of 8 16-bit values) stored to shared memory, lane l gives the address of
// row row_of_lane[l], ldmatrix .x{num}{.trans}; out[4 l + i] = the lane's register i.
void ldmatrix_lanes(uint32_t* out, const uint16_t* src, const int* row_of_lane, int num,
                    bool trans);
// 64 threads: thread t copies 16 bytes of src + 16 t to shared memory with src-size t % 17 (the
// rest zero-filled; .cg for even t, .ca for odd), 8 bytes with cp-size 8 and 4 bytes with cp-size
// 4 (src-size (t % 3) * 4 and t % 2 * 4), waits and writes its 28 shared bytes to out + 28 t.
void cp_async_zero_fill(unsigned char* out, const unsigned char* src);
// c (m x n f32) = a (m x k, row-major) · b (k x n, row-major): 64x64 tiles per block of 4 warps,
// k in chunks of 32 through a two-stage cp.async pipeline, ldmatrix (A plain, B .trans) and mma.
// m, n multiples of 64, k a multiple of 32.
void tiled_gemm(bool bf16, float* c, const uint16_t* a, const uint16_t* b, int m, int n, int k);

// One thread per pair: rn[i] = pack2_rn(in[2i], in[2i + 1]) (one cvt.rn.{bf16,f16}x2.f32),
// keep[i] = pack2 of the same (core/half.h's rule), for i < pairs.
void pack_pairs(bool bf16, uint32_t* rn, uint32_t* keep, const float* in, int pairs);

}  // namespace ft::kernels::cuda::test
