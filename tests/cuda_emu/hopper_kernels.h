// Test kernels for kernels/cuda/hopper.cuh (mbarrier, TMA, wgmma): built by nvcc into
// ft_cuda_kernel_tests (a GPU of compute capability 9.0; sm_90a) and by g++ against the CUDA
// emulation into ft_cuda_emu_tests, so test_hopper.cpp checks the same kernels on both. Pointers
// are device memory.
#pragma once

#include <cstdint>

namespace ft::kernels::cuda::test {

// 128 threads, `rounds` phases of a one-slot producer/consumer ring: thread 0 fills 96 ints with
// round r's values (r * 1000 + i), announces their bytes with arrive.expect_tx on the full
// barrier and takes them off with complete_tx (as a TMA copy does); threads 32..127 wait on the
// full barrier's parity r & 1, add their value to out[t - 32] and arrive on the empty barrier
// (count 96), which thread 0 waits on (parity (r & 1) ^ 1) before the next round. out: 96 ints,
// each the sum over rounds of its value. probe[0] = 1 when a wait on parity 1 right after init
// returned (the phase before phase 0 counts as complete).
void mbarrier_ring(int* out, int* probe, int rounds);

// One TMA copy through a tensor map made here (encode_tensor_map): type 0 bf16, 1 f16, 2 f32;
// swizzle 0 none, 1 32B, 2 64B, 3 128B; dims and box have `rank` (2 or 3) entries, strides
// rank - 1 (bytes); coords the box's corner. Thread 0 copies the box to shared memory (1024-byte
// aligned) completing on an mbarrier, every thread waits, then out (the box's bytes) gets
// mode 0: the shared bytes as they lie; mode 1: the box row-major, read back through
// tma_swizzle; mode 2: the same read without tma_swizzle (wrong for a swizzled box).
void tma_box(unsigned char* out, const void* src, int type, int rank, const uint64_t* dims,
             const uint64_t* strides, const uint32_t* box, int swizzle, const int* coords,
             int mode);

// One TMA store (tma_store_{2,3}d) through a tensor map over dst made here, arguments as
// tma_box's: `in` (device memory) holds the box row-major; the kernel lays it out in shared
// memory swizzled as a load would land it, then stores it to the tensor at coords (elements
// outside the tensor are not written) and waits for the writes.
void tma_store_box(void* dst, const unsigned char* in, int type, int rank, const uint64_t* dims,
                   const uint64_t* strides, const uint32_t* box, int swizzle, const int* coords);

// One warpgroup, one wgmma m64nNk16 (n 64, 128 or 256) on one-hot operands: A (64 x 16) has a 1
// at (m, k), B (16 x n) a 1 at (k, col), both K-major without swizzle in shared memory (core
// matrices of 8 rows x 16 bytes, LBO 128, SBO 256). out[t * n / 2 + i] = register i of thread t.
void wgmma_onehot(bool bf16, float* out, int n, int m, int k, int col);

// How wgmma_gemm feeds the wgmma.
enum class WgmmaFeed {
  kShared = 0,        // A and B by TMA, 128-byte swizzle, K-major descriptors
  kWrongSwizzle = 1,  // the same tiles read through descriptors that say "no swizzle"
  kRegisterA = 2,     // A from registers (the .rs form), B as kShared
  kNMajorB = 3,       // B given k x n (n contiguous), N-major descriptors (trans-b)
};
// One warpgroup: c (64 x n f32, row-major) = a (64 x k, row-major) · B, where b is B transposed
// (n x k, row-major), or B itself (k x n) for kNMajorB. n 64, 128 or 256, k 64 or 128: each
// 64-wide k block a TMA box completing on its own mbarrier, four wgmmas of k 16 each.
void wgmma_gemm(bool bf16, float* c, const uint16_t* a, const uint16_t* b, int n, int k,
                WgmmaFeed feed);

}  // namespace ft::kernels::cuda::test
