// Normal init on the GPU: the contract of kernels/kernels.h random_normal, tested bit for bit
// against kernels/cpu/random.cpp (tests/ops/). Each thread draws one Philox block at a time
// (four elements, aligned to multiples of 4 of the element index) through kernels/philox.h,
// the same integer and IEEE-rounded double operations as the CPU, so the same bits; the 2-D
// form (a column slice of a tensor) runs one launch over every row's blocks. nvcc
// contracts a product and a sum into an fma where it can (-fmad=true), g++ where -march allows:
// philox.h leaves neither anything to contract (every such pair is an explicit fma).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/philox.h"

namespace ft::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

// Thread-block-stride loop over (row, Philox block) pairs, rows · bpr of them: row r is the
// elements [start, start + cols) of the whole tensor, start = first + r·ld, and its item b is
// block start / 4 + b, past the row's end for some b when bpr counts a phase (start % 4) the
// row does not have. Each writes the elements of its four that are in the row (the lanes
// unrolled, so z stays in registers).
__global__ void random_normal_kernel(float* out, size_t cols, size_t ld, uint64_t key,
                                     uint64_t first, double std, size_t bpr, size_t items) {
  const uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (size_t t = grid_thread_index(); t < items; t += grid_thread_count()) {
    const size_t r = t / bpr;
    const uint64_t start = first + r * ld;
    const uint64_t block = start / 4 + (t - r * bpr);
    if (4 * block >= start + cols) continue;
    double z[4];
    philox::normals4(block, k0, k1, z);
    float* row = out + r * cols;  // (cols)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint64_t i = 4 * block + uint64_t(q);
      if (i >= start && i - start < cols) row[i - start] = float(std * z[q]);
    }
  }
}

}  // namespace

void random_normal(float* out, size_t rows, size_t cols, size_t ld, uint64_t key, uint64_t first,
                   double std, void* stream) {
  if (rows == 0 || cols == 0) return;
  // Blocks a row touches: at most (cols + phase + 3) / 4, phase = start % 4, the same for every
  // row when there is one or ld is a multiple of 4, else up to 3.
  const size_t phase = rows == 1 || ld % 4 == 0 ? size_t(first % 4) : 3;
  const size_t bpr = (cols + phase + 3) / 4, items = rows * bpr;
  FT_LAUNCH(random_normal_kernel, grid_blocks(items, kThreads, 1), kThreads, 0, stream)
  (out, cols, ld, key, first, std, bpr, items);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::kernels::cuda
