// Normal init on the GPU: the contract of kernels/kernels.h random_normal, tested bit for bit
// against kernels/cpu/random.cpp (tests/ops/). Each thread draws one Philox block at a time
// (four elements, aligned to multiples of 4 of the element index) through kernels/philox.h,
// the same integer and IEEE-rounded double operations as the CPU, so the same bits. nvcc
// contracts a product and a sum into an fma where it can (-fmad=true), g++ where -march allows:
// philox.h leaves neither anything to contract (every such pair is an explicit fma).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/philox.h"

namespace ft::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

// Thread-block-stride loop over the Philox blocks that [first, first + n) touches, block
// first / 4 + b for b in [0, blocks); each writes the elements of its four that are in range
// (the lanes unrolled, so z stays in registers).
__global__ void random_normal_kernel(float* out, size_t n, uint64_t key, uint64_t first, double std,
                                     size_t blocks) {
  const uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (size_t b = grid_thread_index(); b < blocks; b += grid_thread_count()) {
    const uint64_t block = first / 4 + b;
    double z[4];
    philox::normals4(block, k0, k1, z);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint64_t i = 4 * block + uint64_t(q);
      if (i >= first && i - first < n) out[i - first] = float(std * z[q]);
    }
  }
}

}  // namespace

void random_normal(float* out, size_t n, uint64_t key, uint64_t first, double std, void* stream) {
  if (n == 0) return;
  const size_t blocks = (n + size_t(first % 4) + 3) / 4;
  FT_LAUNCH(random_normal_kernel, grid_blocks(blocks, kThreads, 1), kThreads, 0, stream)
  (out, n, key, first, std, blocks);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::kernels::cuda
