// RMSNorm forward and backward on the GPU: the contract of kernels/kernels.h, tested against
// kernels/cpu/rmsnorm.cpp. fp32 statistics and math, one rounding on store.
//
// Forward: one block per row (a row of C ≤ a few thousand elements is one block's worth of
// packs); Σx² is a fixed-order block reduction, then the row is read again for the output (the
// second read hits L1/L2: the row was just loaded).
//
// Backward: a fixed grid of G = min(N, kBackwardBlocks) blocks, block b taking rows b, b + G, ...
// Each row needs the block-wide dot Σ w·dy·x for dx. dw is summed without atomics: each thread
// owns the same columns in every row, so it adds its rows' dy·x·r into a per-block partial row
// (shared memory when C fits, else the block's row of scratch) with no barrier; a second kernel
// then adds the G partial rows to dw column by column, in block order. The bits depend on the
// inputs, (N, C) and the pack width (the pointers' alignment), never on the schedule.
#include <initializer_list>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr int kThreads = 256;
// Blocks of the backward pass (kernels_cuda.h, which sizes the scratch): ~4 per SM on an H100,
// enough to fill it with rows in flight; each adds one partial row (C floats) that the column
// sum reads back.
constexpr int kBackwardBlocks = kRmsnormBackwardBlocks;
// Partial rows up to this many columns live in shared memory (32 KiB: several blocks per SM).
constexpr int kSharedCols = 8192;

// Threads for a row of C elements in packs of W: a multiple of 32 (whole warps for the
// shuffles), enough for one pack per thread, at most kThreads.
int row_threads(int C, int W) {
  const int packs = (C + W - 1) / W;
  const int t = (packs + 31) / 32 * 32;
  return t < kThreads ? t : kThreads;
}

// Pack width for rows of C elements at these pointers: 16 bytes when every row start is aligned.
template <typename T>
int row_pack(int C, std::initializer_list<const void*> ptrs) {
  return C % kPack16<T> == 0 && all_aligned(ptrs, 16) ? kPack16<T> : 1;
}

// out (N, C) = w ∘ x · r, rstd (N) = r = 1 / sqrt(mean(x²) + eps); one block per row.
template <typename D, int W>
__global__ void rmsnorm_forward_kernel(D* out, float* rstd, const D* x, const D* w, int C,
                                       float eps) {
  const size_t row = blockIdx.x;
  const D* xr = x + row * size_t(C);
  D* o = out + row * size_t(C);
  const int step = int(blockDim.x) * W;
  float ss = 0.f;
  for (int c = int(threadIdx.x) * W; c < C; c += step) {
    const Pack<D, W> xp = load_pack<W>(xr + c);
    for (int j = 0; j < W; ++j) {
      const float v = to_float(xp.v[j]);
      ss += v * v;
    }
  }
  ss = block_sum(ss);
  // 1 / sqrt (both correctly rounded), not rsqrtf: the CPU reference's expression.
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int c = int(threadIdx.x) * W; c < C; c += step) {
    const Pack<D, W> xp = load_pack<W>(xr + c), wp = load_pack<W>(w + c);
    Pack<D, W> op;
    // HF: weight * (x * rstd)
    for (int j = 0; j < W; ++j)
      op.v[j] = from_float<D>(to_float(wp.v[j]) * (to_float(xp.v[j]) * r));
    store_pack<W>(o + c, op);
  }
}

// y = w ∘ x r  ⇒  dx (+)= r (w ∘ dy) − x r³/C Σ_c (w ∘ dy ∘ x);  partial[b] (C) = Σ_rows dy ∘ x r
template <typename D, int W>
__global__ void rmsnorm_backward_kernel(D* dx, float* partial, const D* dout, const D* x,
                                        const D* w, const float* rstd, int N, int C,
                                        bool accumulate_dx, bool shared_acc) {
  FT_DYNAMIC_SHARED(float, dw_shared);
  float* acc = shared_acc ? dw_shared : partial + size_t(blockIdx.x) * C;
  const int step = int(blockDim.x) * W;
  const int c_begin = int(threadIdx.x) * W;
  // Each thread reads and writes only its own columns of acc: no barrier between rows.
  for (int c = c_begin; c < C; c += step)
    for (int j = 0; j < W; ++j) acc[c + j] = 0.f;
  for (int row = int(blockIdx.x); row < N; row += int(gridDim.x)) {
    const size_t off = size_t(row) * C;
    const float r = rstd[row];
    float dot = 0.f;
    for (int c = c_begin; c < C; c += step) {
      const Pack<D, W> dyp = load_pack<W>(dout + off + c), xp = load_pack<W>(x + off + c),
                       wp = load_pack<W>(w + c);
      for (int j = 0; j < W; ++j) dot += to_float(wp.v[j]) * to_float(dyp.v[j]) * to_float(xp.v[j]);
    }
    dot = block_sum(dot);
    const float k = dot * r * r * r / float(C);
    for (int c = c_begin; c < C; c += step) {
      const Pack<D, W> dyp = load_pack<W>(dout + off + c), xp = load_pack<W>(x + off + c),
                       wp = load_pack<W>(w + c);
      // accumulate_dx: old + norm's dx in fp32, rounded once (the CPU reference's sum).
      Pack<D, W> dp;
      if (accumulate_dx) dp = load_pack<W>(dx + off + c);
      for (int j = 0; j < W; ++j) {
        const float dy = to_float(dyp.v[j]), xv = to_float(xp.v[j]);
        const float d = r * to_float(wp.v[j]) * dy - k * xv;
        dp.v[j] = from_float<D>(accumulate_dx ? to_float(dp.v[j]) + d : d);
        acc[c + j] += dy * xv * r;
      }
      store_pack<W>(dx + off + c, dp);
    }
  }
  if (shared_acc) {
    float* dst = partial + size_t(blockIdx.x) * C;
    for (int c = c_begin; c < C; c += step)
      for (int j = 0; j < W; ++j) dst[c + j] = acc[c + j];
  }
}

// dw (C) += Σ_b partial[b] (C), b = 0, 1, ..., G − 1 in order; one thread per column.
__global__ void column_sum_kernel(float* dw, const float* partial, int G, int C) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float s = 0.f;
  for (int b = 0; b < G; ++b) s += partial[size_t(b) * C + c];
  dw[c] += s;
}

template <typename D, int W>
void launch_forward(D* out, float* rstd, const D* x, const D* w, int N, int C, float eps,
                    void* stream) {
  FT_LAUNCH((rmsnorm_forward_kernel<D, W>), unsigned(N), row_threads(C, W), 0, stream)
  (out, rstd, x, w, C, eps);
}

template <typename D, int W>
void launch_backward(D* dx, float* dw, const D* dout, const D* x, const D* w, const float* rstd,
                     int N, int C, bool accumulate_dx, float* partial, void* stream) {
  const int G = N < kBackwardBlocks ? N : kBackwardBlocks;
  const bool shared_acc = C <= kSharedCols;
  FT_LAUNCH((rmsnorm_backward_kernel<D, W>), unsigned(G), row_threads(C, W),
            shared_acc ? sizeof(float) * size_t(C) : 0, stream)
  (dx, partial, dout, x, w, rstd, N, C, accumulate_dx, shared_acc);
  FT_LAUNCH(column_sum_kernel, grid_blocks(size_t(C), kThreads, 1), kThreads, 0, stream)
  (dw, partial, G, C);
}

}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps,
                     void* stream) {
  if (N <= 0 || C <= 0) return;
  if (row_pack<T>(C, {out, x, w}) > 1)
    launch_forward<device_t<T>, kPack16<T>>(dev(out), rstd, dev(x), dev(w), N, C, eps, stream);
  else
    launch_forward<device_t<T>, 1>(dev(out), rstd, dev(x), dev(w), N, C, eps, stream);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, bool accumulate_dx, void* scratch, void* stream) {
  if (N <= 0 || C <= 0) return;
  float* partial = static_cast<float*>(scratch);
  if (row_pack<T>(C, {dx, dout, x, w}) > 1)
    launch_backward<device_t<T>, kPack16<T>>(dev(dx), dw, dev(dout), dev(x), dev(w), rstd, N, C,
                                             accumulate_dx, partial, stream);
  else
    launch_backward<device_t<T>, 1>(dev(dx), dw, dev(dout), dev(x), dev(w), rstd, N, C,
                                    accumulate_dx, partial, stream);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                                                          \
  template void rmsnorm_forward(T*, float*, const T*, const T*, int, int, float, void*);           \
  template void rmsnorm_backward(T*, float*, const T*, const T*, const T*, const float*, int, int, \
                                 bool, void*, void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
