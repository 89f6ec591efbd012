// Cross-entropy over the vocabulary on the GPU, whole-row (cross_entropy) and vocabulary-parallel
// (row_max / ce_partial / ce_finish), with the contracts of kernels/kernels.h.
//
// One block per row of logits (N, V): the block's threads stride over the row's columns, keep an
// fp32 partial each, and combine the partials with a fixed-order tree (common.cuh's block
// reductions), so every row's statistics are the same bits on every run and any schedule.
// cross_entropy keeps an online (max, sum) pair per thread, so the row is read once for the
// statistics and once for dlogits:
//   x > m: s = s·exp(m − x) + 1, m = x;   else: s += exp(x − m);
// pairs combine as m = max(m1, m2), s = s1·exp(m1 − m) + s2·exp(m2 − m).
// Losses: each row's loss (double) goes into the caller's scratch (N doubles), then one block
// sums them in a fixed order into *loss_acc: no float atomics anywhere.
// dlogits = scale·(softmax − onehot) on masked rows, 0 elsewhere, rounded once to T (scale read
// from device memory by the kernel, so that a captured graph uses each replay's); it may alias
// logits (each thread reads an element before it writes that same element, and the target
// logit is read before the first barrier, hence before any write).
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace ft::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // per row: enough to stream a 32k-128k vocabulary row
constexpr int kWarps = kThreads / kWarpSize;

// Online softmax statistics: (m, s) absorbs (m2, s2). Both empty (-inf, 0) stays empty.
// Symmetric to the bit, so both lanes of a butterfly step agree: the two terms are added as
// min + max (a plain a·x + b·y could be contracted into fma(a, x, b·y), whose bits depend on
// which term is fused).
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  const float a = s * expf(m - mx), b = s2 * expf(m2 - mx);
  s = fminf(a, b) + fmaxf(a, b);
  m = mx;
}

// The block's (max, Σ exp(x − max)) over its threads' pairs, the same bits in every thread, in a
// fixed order: warp 0's lane l absorbs the pairs of threads l + 32·w in order of w, then a
// butterfly over warp 0. Through shared memory rather than a butterfly in every warp: on the GPU
// it is the same few hundred cycles per row, and the emulator switches fibers far less often.
__device__ __forceinline__ void block_softmax_stats(float& m, float& s) {
  __shared__ float m_s[kThreads], s_s[kThreads];
  m_s[threadIdx.x] = m;
  s_s[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    for (int w = 1; w < kWarps; ++w)
      combine(m, s, m_s[threadIdx.x + kWarpSize * w], s_s[threadIdx.x + kWarpSize * w]);
    for (int o = kWarpSize / 2; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(kFullMask, m, o), s2 = __shfl_xor_sync(kFullMask, s, o);
      combine(m, s, m2, s2);
    }
  }
  if (threadIdx.x == 0) {  // slot 0: read by no one since the barrier
    m_s[0] = m;
    s_s[0] = s;
  }
  __syncthreads();
  m = m_s[0];
  s = s_s[0];
}

template <typename T>
__device__ __forceinline__ void zero_row(T* drow, int V) {
  if (drow)
    for (int j = threadIdx.x; j < V; j += kThreads) drow[j] = from_float<T>(0.0f);
}

// One block per row n: row_loss[n] (0 on unmasked rows) and, if dlogits, the row's gradient.
template <typename T>
__global__ void cross_entropy_kernel(T* dlogits, const T* logits, const int32_t* targets,
                                     const uint8_t* mask, int V, const float* scale_p,
                                     double* row_loss) {
  const int n = blockIdx.x;
  const T* row = logits + size_t(n) * V;
  T* drow = dlogits ? dlogits + size_t(n) * V : nullptr;
  if (!mask[n]) {  // the whole block returns: no barrier follows
    zero_row(drow, V);
    if (threadIdx.x == 0) row_loss[n] = 0.0;
    return;
  }
  const int t = targets[n];
  const float lt = to_float(row[t]);  // before the barrier in block_softmax_stats: before writes
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < V; j += kThreads) {
    const float x = to_float(row[j]);
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  block_softmax_stats(m, s);
  if (threadIdx.x == 0) row_loss[n] = double(m) + log(double(s)) - double(lt);
  if (drow) {
    const float scale = *scale_p;
    const float k = float(double(scale) / double(s));
    for (int j = threadIdx.x; j < V; j += kThreads) {
      const float d = expf(to_float(row[j]) - m) * k;
      drow[j] = from_float<T>(j == t ? d - scale : d);
    }
  }
}

// *loss_acc += Σ row_loss[0, N), one warp, in a fixed order (a step has a few thousand rows: one
// warp streams them in microseconds).
__global__ void sum_losses_kernel(double* loss_acc, const double* row_loss, int N) {
  double s = 0.0;
  for (int n = threadIdx.x; n < N; n += kWarpSize) s += row_loss[n];
  s = warp_sum(s);
  if (threadIdx.x == 0) *loss_acc += s;
}

template <typename T>
__global__ void row_max_kernel(float* out, const T* x, int V) {
  const T* row = x + size_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += kThreads) m = fmaxf(m, to_float(row[j]));
  m = block_max(m);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <typename T>
__global__ void ce_partial_kernel(double* sumexp, double* target_logit, const T* logits,
                                  const int32_t* targets, const uint8_t* mask, const float* rmax,
                                  int V, int v_begin) {
  const int n = blockIdx.x;
  if (!mask[n]) {
    if (threadIdx.x == 0) sumexp[n] = target_logit[n] = 0.0;
    return;
  }
  const T* row = logits + size_t(n) * V;
  const float mx = rmax[n];
  // fp32 per thread (a few hundred terms at most for a real vocabulary shard), double across.
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += kThreads) s += expf(to_float(row[j]) - mx);
  const double total = block_sum(double(s));
  if (threadIdx.x == 0) {
    sumexp[n] = total;
    const int t = targets[n] - v_begin;
    target_logit[n] = t >= 0 && t < V ? double(to_float(row[t])) : 0.0;
  }
}

template <typename T>
__global__ void ce_finish_kernel(T* dlogits, const T* logits, const int32_t* targets,
                                 const uint8_t* mask, const float* rmax, const double* sumexp,
                                 const double* target_logit, int V, int v_begin,
                                 const float* scale_p, double* row_loss) {
  const int n = blockIdx.x;
  T* drow = dlogits ? dlogits + size_t(n) * V : nullptr;
  if (!mask[n]) {
    zero_row(drow, V);
    if (threadIdx.x == 0) row_loss[n] = 0.0;
    return;
  }
  if (threadIdx.x == 0) row_loss[n] = double(rmax[n]) + log(sumexp[n]) - target_logit[n];
  if (drow) {
    const T* row = logits + size_t(n) * V;
    const float scale = *scale_p;
    const float mx = rmax[n], k = float(double(scale) / sumexp[n]);
    const int t = targets[n] - v_begin;  // off this shard: matches no column
    for (int j = threadIdx.x; j < V; j += kThreads) {
      const float d = expf(to_float(row[j]) - mx) * k;
      drow[j] = from_float<T>(j == t ? d - scale : d);
    }
  }
}

void check_rows(const char* what, int N, int V, const void* dlogits, const float* scale) {
  if (N < 0 || V <= 0)
    throw ::ft::Error(std::string(what) + ": bad shape N=" + std::to_string(N) +
                      " V=" + std::to_string(V) + " (rows must be >= 0, vocabulary >= 1)");
  if (dlogits && !scale)
    throw ::ft::Error(std::string(what) + ": dlogits asked for without a scale (a null pointer)");
}

void sum_losses(double* loss_acc, const double* row_loss, int N, void* stream) {
  FT_LAUNCH(sum_losses_kernel, 1, kWarpSize, 0, stream)(loss_acc, row_loss, N);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void cross_entropy(T* dlogits, const T* logits, const int32_t* targets, const uint8_t* mask, int N,
                   int V, const float* scale, double* loss_acc, void* scratch, void* stream) {
  check_rows("cross_entropy", N, V, dlogits, scale);
  if (N == 0) return;
  auto* row_loss = static_cast<double*>(scratch);
  FT_LAUNCH((cross_entropy_kernel<device_t<T>>), N, kThreads, 0, stream)
  (dev(dlogits), dev(logits), targets, mask, V, scale, row_loss);
  FT_CUDA_CHECK_LAUNCH();
  sum_losses(loss_acc, row_loss, N, stream);
}

template <typename T>
void row_max(float* out, const T* x, int N, int V, void* stream) {
  check_rows("row_max", N, V, nullptr, nullptr);
  if (N == 0) return;
  FT_LAUNCH((row_max_kernel<device_t<T>>), N, kThreads, 0, stream)(out, dev(x), V);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void ce_partial(double* sumexp, double* target_logit, const T* logits, const int32_t* targets,
                const uint8_t* mask, const float* rmax, int N, int V, int v_begin, void* stream) {
  check_rows("ce_partial", N, V, nullptr, nullptr);
  if (N == 0) return;
  FT_LAUNCH((ce_partial_kernel<device_t<T>>), N, kThreads, 0, stream)
  (sumexp, target_logit, dev(logits), targets, mask, rmax, V, v_begin);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void ce_finish(T* dlogits, const T* logits, const int32_t* targets, const uint8_t* mask,
               const float* rmax, const double* sumexp, const double* target_logit, int N, int V,
               int v_begin, const float* scale, double* loss_acc, void* scratch, void* stream) {
  check_rows("ce_finish", N, V, dlogits, scale);
  if (N == 0) return;
  auto* row_loss = static_cast<double*>(scratch);
  FT_LAUNCH((ce_finish_kernel<device_t<T>>), N, kThreads, 0, stream)
  (dev(dlogits), dev(logits), targets, mask, rmax, sumexp, target_logit, V, v_begin, scale,
   row_loss);
  FT_CUDA_CHECK_LAUNCH();
  sum_losses(loss_acc, row_loss, N, stream);
}

#define FT_CROSS_ENTROPY_INSTANTIATE(T)                                                          \
  template void cross_entropy<T>(T*, const T*, const int32_t*, const uint8_t*, int, int,         \
                                 const float*, double*, void*, void*);                           \
  template void row_max<T>(float*, const T*, int, int, void*);                                   \
  template void ce_partial<T>(double*, double*, const T*, const int32_t*, const uint8_t*,        \
                              const float*, int, int, int, void*);                               \
  template void ce_finish<T>(T*, const T*, const int32_t*, const uint8_t*, const float*,         \
                             const double*, const double*, int, int, int, const float*, double*, \
                             void*, void*);
FT_CROSS_ENTROPY_INSTANTIATE(float)
FT_CROSS_ENTROPY_INSTANTIATE(bf16)
FT_CROSS_ENTROPY_INSTANTIATE(f16)
#undef FT_CROSS_ENTROPY_INSTANTIATE

}  // namespace ft::kernels::cuda
