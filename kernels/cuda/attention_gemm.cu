// The elementwise kernels of attention on tensor cores: lib/runtime/cuda/attention_gemm.cpp
// computes the score and value products as cuBLASLt GEMMs over chunks of query rows, and these
// two kernels sit between them (kernels_cuda.h states the contract):
//   forward:  S = QKᵀ·scale (GEMM) → attention_probs (lse, P) → O = P·V (GEMM)
//   backward: S again → attention_probs (P from the saved lse) → dV += Pᵀ·dO, dP = dO·Vᵀ (GEMMs)
//             → attention_dscores (dS) → dQ = dS·K, dK += dSᵀ·Q (GEMMs)
// One block per (query row, head) of a chunk: a row is up to T keys, read by the block's threads
// in strides, its max and sum taken by the fixed-order block reductions of common.cuh, so the
// bits do not depend on the schedule. attention.cu (SIMT FlashAttention) is the plain twin of
// the whole path, the one the emulator's kernel tests and the GPU check compare against.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace ft::kernels::cuda {
namespace {

constexpr int kRowThreads = 128;

template <typename T, bool kComputeLse>
__global__ void attention_probs_kernel(T* P, float* lse, const float* S, int rows, int cols,
                                       int ld, int t0, int64_t head_stride) {
  const int r = blockIdx.x, head = blockIdx.y, t = t0 + r;
  const int visible = cols < t + 1 ? cols : t + 1;
  const size_t row = (size_t(head) * rows + r) * ld;
  const float* s = S + row;
  T* p = P + row;
  float* lse_t = lse + head * head_stride + t;
  float shift;
  if (kComputeLse) {
    float m = -__int_as_float(0x7f800000);
    for (int c = threadIdx.x; c < visible; c += blockDim.x) m = fmaxf(m, s[c]);
    m = block_max(m);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < visible; c += blockDim.x) sum += expf(s[c] - m);
    sum = block_sum(sum);  // its barriers also end every thread's reads of S before P is written
    shift = m + logf(sum);
    if (threadIdx.x == 0) *lse_t = shift;
  } else {
    shift = *lse_t;
  }
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    p[c] = from_float<T>(c < visible ? expf(s[c] - shift) : 0.0f);
}

template <typename T>
__global__ void attention_dscores_kernel(T* P_dS, const float* dP, const float* delta, int rows,
                                         int cols, int ld, int t0, int64_t head_stride,
                                         float scale) {
  const int r = blockIdx.x, head = blockIdx.y, t = t0 + r;
  const size_t row = (size_t(head) * rows + r) * ld;
  T* p = P_dS + row;
  const float* dp = dP + row;
  const float d = delta[head * head_stride + t];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = (c <= t && t > 0) ? to_float(p[c]) * (dp[c] - d) * scale : 0.0f;
    p[c] = from_float<T>(v);
  }
}

void check_chunk(const char* what, int heads, int rows, int cols, int ld, int t0) {
  if (heads < 0 || heads > 65535 || rows < 0 || cols < 0 || ld < cols || t0 < 0 ||
      cols > t0 + rows)
    throw ::ft::Error(std::string(what) + ": bad chunk heads=" + std::to_string(heads) +
                      " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                      " ld=" + std::to_string(ld) + " t0=" + std::to_string(t0) +
                      " (needs heads <= 65535, ld >= cols, cols <= t0 + rows)");
}

}  // namespace

template <typename T>
void attention_probs(T* P, float* lse, const float* S, int heads, int rows, int cols, int ld,
                     int t0, int64_t head_stride, bool compute_lse, void* stream) {
  check_chunk("attention_probs", heads, rows, cols, ld, t0);
  if (heads == 0 || rows == 0) return;
  using E = device_t<T>;
  const dim3 grid{unsigned(rows), unsigned(heads)};
  if (compute_lse)
    FT_LAUNCH((attention_probs_kernel<E, true>), grid, kRowThreads, 0, stream)
    (dev(P), lse, S, rows, cols, ld, t0, head_stride);
  else
    FT_LAUNCH((attention_probs_kernel<E, false>), grid, kRowThreads, 0, stream)
    (dev(P), lse, S, rows, cols, ld, t0, head_stride);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_dscores(T* P_dS, const float* dP, const float* delta, int heads, int rows,
                       int cols, int ld, int t0, int64_t head_stride, float scale, void* stream) {
  check_chunk("attention_dscores", heads, rows, cols, ld, t0);
  if (heads == 0 || rows == 0) return;
  FT_LAUNCH((attention_dscores_kernel<device_t<T>>), dim3(unsigned(rows), unsigned(heads)),
            kRowThreads, 0, stream)
  (dev(P_dS), dP, delta, rows, cols, ld, t0, head_stride, scale);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_ATTENTION_GEMM_INSTANTIATE(T)                                                       \
  template void attention_probs<T>(T*, float*, const float*, int, int, int, int, int, int64_t, \
                                   bool, void*);                                               \
  template void attention_dscores<T>(T*, const float*, const float*, int, int, int, int, int,  \
                                     int64_t, float, void*);
FT_ATTENTION_GEMM_INSTANTIATE(float)
FT_ATTENTION_GEMM_INSTANTIATE(bf16)
FT_ATTENTION_GEMM_INSTANTIATE(f16)
#undef FT_ATTENTION_GEMM_INSTANTIATE

}  // namespace ft::kernels::cuda
