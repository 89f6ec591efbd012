// Elementwise accumulate/scale and the squared-norm reduction on the GPU, as kernels/cpu/
// reduce.cpp: fp32 math, one rounding on store. sum_squares is deterministic: per-block partial
// sums in double go to caller scratch, then one block adds them in index order; the grid size
// depends only on n, so the same input gives the same bits on every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;  // a multiple of 32: block_sum's requirement
constexpr unsigned kItemsPerThread = 4;
static_assert(kThreads == kSumSquaresThreads, "sum_squares' grid is kernels_cuda.h's");

template <typename T>
__global__ void add_kernel(T* y, const T* x, size_t n) {
  for (size_t i = grid_thread_index(); i < n; i += grid_thread_count())
    y[i] = from_float<T>(to_float(y[i]) + to_float(x[i]));
}

__global__ void scale_kernel(float* y, float s, size_t n) {
  for (size_t i = grid_thread_index(); i < n; i += grid_thread_count()) y[i] *= s;
}

// partials (gridDim.x) = Σ x² over this block's grid-stride share, in double. Vec: x is 16-byte
// aligned, and the first n − n mod 4 elements are read as float4 packs (thread t adds packs t,
// t + threads, ...; each pack's squares in element order), the rest one element a thread.
template <bool Vec>
__global__ void sum_squares_partial_kernel(double* partials, const float* x, size_t n) {
  double s = 0.0;
  size_t done = 0;
  if constexpr (Vec) {
    const size_t packs = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (size_t i = grid_thread_index(); i < packs; i += grid_thread_count()) {
      const float4 p = x4[i];
      // exact squares (24-bit mantissas), so nvcc's FMA contraction changes nothing
      s += double(p.x) * double(p.x);
      s += double(p.y) * double(p.y);
      s += double(p.z) * double(p.z);
      s += double(p.w) * double(p.w);
    }
    done = packs * 4;
  }
  for (size_t i = done + grid_thread_index(); i < n; i += grid_thread_count()) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// *acc += Σ partials (count) / divisor: one block, thread t adds partials t, t + blockDim.x, ...
__global__ void sum_squares_final_kernel(double* acc, const double* partials, unsigned count,
                                         double divisor) {
  double s = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *acc += s / divisor;
}

}  // namespace

template <typename T>
void add_inplace(T* y, const T* x, size_t n, void* stream) {
  if (n == 0) return;
  FT_LAUNCH(add_kernel<device_t<T>>, grid_blocks(n, kThreads, kItemsPerThread), kThreads, 0, stream)
  (dev(y), dev(x), n);
  FT_CUDA_CHECK_LAUNCH();
}

void scale_inplace(float* y, float s, size_t n, void* stream) {
  if (n == 0) return;
  FT_LAUNCH(scale_kernel, grid_blocks(n, kThreads, kItemsPerThread), kThreads, 0, stream)(y, s, n);
  FT_CUDA_CHECK_LAUNCH();
}

void sum_squares(double* acc, const float* x, size_t n, double divisor, void* scratch,
                 void* stream) {
  if (n == 0) return;  // adds nothing
  const unsigned blocks = sum_squares_blocks(n);
  double* partials = static_cast<double*>(scratch);  // (blocks)
  if (all_aligned({x}, 16))
    FT_LAUNCH(sum_squares_partial_kernel<true>, blocks, kThreads, 0, stream)(partials, x, n);
  else
    FT_LAUNCH(sum_squares_partial_kernel<false>, blocks, kThreads, 0, stream)(partials, x, n);
  FT_CUDA_CHECK_LAUNCH();
  FT_LAUNCH(sum_squares_final_kernel, 1, kThreads, 0, stream)(acc, partials, blocks, divisor);
  FT_CUDA_CHECK_LAUNCH();
}

template void add_inplace(float*, const float*, size_t, void*);
template void add_inplace(bf16*, const bf16*, size_t, void*);
template void add_inplace(f16*, const f16*, size_t, void*);

}  // namespace ft::kernels::cuda
