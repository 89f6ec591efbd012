// Bias add and its gradient on the GPU: the contract of kernels/kernels.h, tested against
// kernels/cpu/bias.cpp (tests/ops/). fp32 math, one rounding on store.
//
// bias_add: rows over a grid-stride loop of blocks, the row's columns over the block's
// threads, in 16-byte packs when every row start is aligned (scalars otherwise).
//
// bias_grad: no atomics. The rows are cut into G chunks (G depends only on N); block (x, g)
// sums the rows of chunk g, in row order, for 256 columns (one column a thread: a warp reads
// a row's consecutive elements), into partial row g of the scratch; a second kernel adds the G
// partial rows to db column by column, in chunk order. The bits depend on the inputs and
// (N, C), never on the schedule; with one chunk (N <= kBiasRowsPerChunk) the additions are the
// CPU's, so are the bits.
#include <initializer_list>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxRowBlocks = 1024;

// Threads for a row of C elements in packs of W: whole warps, one pack each, at most kThreads.
int row_threads(int C, int W) {
  const int packs = (C + W - 1) / W;
  const int t = (packs + 31) / 32 * 32;
  return t < kThreads ? t : kThreads;
}

// y (N, C) += b (C), each sum in fp32 rounded once.
template <typename D, int W>
__global__ void bias_add_kernel(D* y, const D* b, int N, int C) {
  const int step = int(blockDim.x) * W;
  for (size_t row = blockIdx.x; row < size_t(N); row += gridDim.x) {
    D* yr = y + row * size_t(C);
    for (int c = int(threadIdx.x) * W; c < C; c += step) {
      Pack<D, W> yp = load_pack<W>(yr + c);
      const Pack<D, W> bp = load_pack<W>(b + c);
      for (int j = 0; j < W; ++j) yp.v[j] = from_float<D>(to_float(yp.v[j]) + to_float(bp.v[j]));
      store_pack<W>(yr + c, yp);
    }
  }
}

// bias_grad's chunks (kernels_cuda.h bias_grad_chunks, which sizes the scratch too): with 256
// columns a block, C = 4096 and N = 8192 that is 16 x 256 blocks, several per SM.
int grad_chunks(int N) { return bias_grad_chunks(N); }

// partial (G, C): row g = Σ dy over chunk g's rows [g·R, min((g + 1)·R, N)), in row order.
template <typename D>
__global__ void bias_grad_partial_kernel(float* partial, const D* dy, int N, int C, int R) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int r0 = int(blockIdx.y) * R, r1 = r0 + R < N ? r0 + R : N;
  float s = 0.f;
  for (int r = r0; r < r1; ++r) s += to_float(dy[size_t(r) * C + c]);
  partial[size_t(blockIdx.y) * C + c] = s;
}

// db (C) += Σ_g partial[g] (C), g = 0, 1, ..., G − 1 in order; one thread per column.
__global__ void bias_grad_column_kernel(float* db, const float* partial, int G, int C) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float s = 0.f;
  for (int g = 0; g < G; ++g) s += partial[size_t(g) * C + c];
  db[c] += s;
}

template <typename D, int W>
void launch_bias_add(D* y, const D* b, int N, int C, void* stream) {
  const unsigned blocks = unsigned(N) < kMaxRowBlocks ? unsigned(N) : kMaxRowBlocks;
  FT_LAUNCH((bias_add_kernel<D, W>), blocks, row_threads(C, W), 0, stream)(y, b, N, C);
}

}  // namespace

template <typename T>
void bias_add(T* y, const T* b, int N, int C, void* stream) {
  if (N <= 0 || C <= 0) return;
  if (C % kPack16<T> == 0 && all_aligned({y, b}, 16))
    launch_bias_add<device_t<T>, kPack16<T>>(dev(y), dev(b), N, C, stream);
  else
    launch_bias_add<device_t<T>, 1>(dev(y), dev(b), N, C, stream);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void bias_grad(float* db, const T* dy, int N, int C, void* scratch, void* stream) {
  if (N <= 0 || C <= 0) return;
  const int G = grad_chunks(N), R = (N + G - 1) / G;
  float* partial = static_cast<float*>(scratch);  // (G, C)
  const unsigned column_blocks = unsigned((C + kThreads - 1) / kThreads);
  FT_LAUNCH(bias_grad_partial_kernel<device_t<T>>, dim3(column_blocks, unsigned(G)), kThreads, 0,
            stream)
  (partial, dev(dy), N, C, R);
  FT_CUDA_CHECK_LAUNCH();
  FT_LAUNCH(bias_grad_column_kernel, column_blocks, kThreads, 0, stream)(db, partial, G, C);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                \
  template void bias_add(T*, const T*, int, int, void*); \
  template void bias_grad(float*, const T*, int, int, void*, void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
