// Dropout and scaling on the GPU: the contract of kernels/kernels.h dropout_scale, tested bit for
// bit against kernels/cpu/dropout.cpp (tests/ops/). The mask is kernels/philox.h's integer
// operations, the factor s is computed once on the host by the same function as the CPU's, and
// each kept element is one fp32 product (nothing for nvcc to contract into an fma), rounded once:
// so the same bits.
//
// p > 0: a grid-stride loop over (row, Philox block) pairs, one Philox call for four columns,
// with scalar accesses (a row's first column may sit at any phase of a block). p = 0: the
// scaling alone over the dense rows·cols elements, in 16-byte packs when both pointers are
// aligned (as swiglu.cu), scalars otherwise.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/philox.h"

namespace ft::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

// Item t is block col0 / 4 + (t mod bpr) of row t / bpr: columns 4·cb .. 4·cb + 3, of which it
// writes those in [col0, col0 + cols). bpr = the blocks a row's columns touch, so every item
// holds at least one. x and y (rows, cols) may be the same memory (each element read, then
// written, by one thread).
template <typename D>
__global__ void dropout_kernel(D* y, const D* x, size_t cols, size_t col0, uint32_t threshold,
                               float s, const uint64_t* key_p, size_t bpr, size_t items) {
  const uint64_t key = *key_p;  // read here, so a recorded graph takes each replay's key
  for (size_t t = grid_thread_index(); t < items; t += grid_thread_count()) {
    const size_t r = t / bpr;
    const uint64_t cb = col0 / 4 + (t - r * bpr);
    const philox::Block blk = philox::dropout_block(r, cb, key);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint64_t c = 4 * cb + uint64_t(q);
      if (c < col0 || c - col0 >= cols) continue;
      const size_t e = r * cols + size_t(c - col0);
      y[e] = from_float<D>(blk.w[q] >= threshold ? to_float(x[e]) * s : 0.0f);
    }
  }
}

// y (n) = x · f, W elements a pack (the tail, n mod W elements, one a thread).
template <typename D, int W>
__global__ void dropout_scale_only_kernel(D* y, const D* x, float f, size_t n) {
  const size_t packs = n / W;
  for (size_t i = grid_thread_index(); i < packs; i += grid_thread_count()) {
    const Pack<D, W> xp = load_pack<W>(x + i * W);
    Pack<D, W> yp;
    for (int j = 0; j < W; ++j) yp.v[j] = from_float<D>(to_float(xp.v[j]) * f);
    store_pack<W>(y + i * W, yp);
  }
  const size_t e = packs * W + grid_thread_index();
  if (e < n) y[e] = from_float<D>(to_float(x[e]) * f);
}

}  // namespace

template <typename T>
void dropout_scale(T* y, const T* x, size_t rows, size_t cols, size_t col0, float p, float f,
                   const uint64_t* key, void* stream) {
  const size_t n = rows * cols;
  if (n == 0) return;
  if (p != 0.0f && !key) throw ::ft::Error("dropout_scale: p > 0 without a key (a null pointer)");
  using D = device_t<T>;
  if (p == 0.0f) {
    constexpr int W = kPack16<T>;
    if (all_aligned({y, x}, 16))
      FT_LAUNCH((dropout_scale_only_kernel<D, W>), grid_blocks(n / W + 1, kThreads, 1), kThreads, 0,
                stream)
    (dev(y), dev(x), f, n);
    else FT_LAUNCH((dropout_scale_only_kernel<D, 1>), grid_blocks(n, kThreads, 1), kThreads, 0,
                   stream)(dev(y), dev(x), f, n);
  } else {
    const size_t bpr = (col0 % 4 + cols + 3) / 4, items = rows * bpr;
    FT_LAUNCH((dropout_kernel<D>), grid_blocks(items, kThreads, 1), kThreads, 0, stream)
    (dev(y), dev(x), cols, col0, philox::dropout_threshold(p), philox::dropout_factor(p, f), key,
     bpr, items);
  }
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                                                          \
  template void dropout_scale(T*, const T*, size_t, size_t, size_t, float, float, const uint64_t*, \
                              void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
