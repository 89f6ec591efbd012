// RMSNorm forward and backward on the GPU: the contract of kernels/kernels.h, tested against
// kernels/cpu/rmsnorm.cpp. fp32 statistics and math, one rounding on store.
//
// Forward: one warp per row; Σx² is a fixed-order warp reduction, then the row is read again for
// the output (the second read hits L1: the warp just loaded it). No block barrier (one block per
// row, as before, took two for a 4 KiB row at C = 2048, and one block launch a row).
//
// Backward: a fixed grid of G = min(N, kBackwardBlocks) blocks, block b taking rows b, b + G, ...
// Each row needs the block-wide dot Σ w·dy·x for dx. dw is summed without atomics: each thread
// owns the same columns in every row, so it adds its rows' dy·x·r into a per-block partial row
// (shared memory when C fits, else the block's row of scratch) with no barrier; a second kernel
// then adds the G partial rows to dw column by column, in a fixed order (column_sum_kernel). The
// bits depend on the inputs, (N, C) and the pack width (the pointers' alignment), never on the
// schedule.
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

// out (N, C) = w ∘ x · r, rstd (N) = r = 1 / sqrt(mean(x²) + eps); one warp per row,
// kForwardRows rows a block. No block barrier: Σx² is the warp's butterfly of its lanes' sums
// (lane l adds packs l, l + 32, ... in order), and a warp past the last row simply returns.
constexpr int kForwardRows = 8;
template <typename D, int W>
__global__ void rmsnorm_forward_kernel(D* out, float* rstd, const D* x, const D* w, int N, int C,
                                       float eps) {
  const int lane = int(threadIdx.x) % 32;
  const int row = int(blockIdx.x) * kForwardRows + int(threadIdx.x) / 32;
  if (row >= N) return;
  const D* xr = x + size_t(row) * C;
  D* o = out + size_t(row) * C;
  constexpr int kStep = 32 * W;
  float ss = 0.f;
#pragma unroll 4
  for (int c = lane * W; c < C; c += kStep) {
    const Pack<D, W> xp = load_pack<W>(xr + c);
    for (int j = 0; j < W; ++j) {
      const float v = to_float(xp.v[j]);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  // 1 / sqrt (both correctly rounded), not rsqrtf: the CPU reference's expression.
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  if (lane == 0) rstd[row] = r;
#pragma unroll 4
  for (int c = lane * W; c < C; c += kStep) {  // the row again: from L1, just read
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

// dw (C) += Σ_b partial[b] (C). A block takes 32 columns (one per lane) and its kSumWarps warps
// split the G partial rows: warp w adds rows w, w + kSumWarps, ... in order (each row a coalesced
// 128-byte read across the warp), then lane c's kSumWarps sums are added in warp order. The
// order is fixed by (G, C) alone. (One thread per column adding all G rows in turn, as before,
// left 2048 threads on the whole GPU each waiting on G dependent loads at C = 2048.)
constexpr int kSumWarps = 8;
__global__ void column_sum_kernel(float* dw, const float* partial, int G, int C) {
  __shared__ float sums[kSumWarps][32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int c = int(blockIdx.x) * 32 + lane;
  float s = 0.f;
  if (c < C) {
#pragma unroll 8
    for (int b = warp; b < G; b += kSumWarps) s += partial[size_t(b) * C + c];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp != 0 || c >= C) return;
  float t = sums[0][lane];
  for (int w = 1; w < kSumWarps; ++w) t += sums[w][lane];
  dw[c] += t;
}

template <typename D, int W>
void launch_forward(D* out, float* rstd, const D* x, const D* w, int N, int C, float eps,
                    void* stream) {
  FT_LAUNCH((rmsnorm_forward_kernel<D, W>), unsigned((N + kForwardRows - 1) / kForwardRows),
            32 * kForwardRows, 0, stream)
  (out, rstd, x, w, N, C, eps);
}

template <typename D, int W>
void launch_backward(D* dx, float* dw, const D* dout, const D* x, const D* w, const float* rstd,
                     int N, int C, bool accumulate_dx, float* partial, void* stream) {
  const int G = N < kBackwardBlocks ? N : kBackwardBlocks;
  const bool shared_acc = C <= kSharedCols;
  FT_LAUNCH((rmsnorm_backward_kernel<D, W>), unsigned(G), row_threads(C, W),
            shared_acc ? sizeof(float) * size_t(C) : 0, stream)
  (dx, partial, dout, x, w, rstd, N, C, accumulate_dx, shared_acc);
  if (dw == nullptr) return;  // a frozen weight: the partial sums go unused
  FT_LAUNCH(column_sum_kernel, unsigned((C + 31) / 32), 32 * kSumWarps, 0, stream)
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
