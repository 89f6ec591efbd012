// The elementwise kernels of attention on tensor cores: lib/runtime/cuda/attention_gemm.cpp
// computes the score and value products as cuBLASLt GEMMs over chunks of query rows, and these
// kernels sit between them (kernels_cuda.h states the contract):
//   swap_axes12: q, k, v (and dO) to head-major slabs; the gradients and out back
//   forward:  S = QKᵀ·scale (GEMM) → attention_probs (lse, P) → O = P·V (GEMM)
//   backward: S again → attention_probs (P from the saved lse) → dV += Pᵀ·dO, dP = dO·Vᵀ (GEMMs)
//             → attention_dscores (dS) → dQ = dS·K, dK += dSᵀ·Q (GEMMs)
// The row kernels run one block per (row, slab) of a chunk: a row is up to T keys, read by the
// block's threads in strides, its max and sum taken by the fixed-order block reductions of
// common.cuh, so the bits do not depend on the schedule. attention.cu (SIMT FlashAttention) is
// the plain twin of the whole path, the one the kernel tests and the GPU check compare with.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {
namespace {

constexpr int kRowThreads = 128;

// Row blockIdx.x of slab blockIdx.y: its query position t, and where its lse / Δ lives.
struct RowOf {
  int t;
  size_t stat;
  __device__ RowOf(int G, int t0, int T_) {
    const int r = blockIdx.x, j = r % G;
    t = t0 + r / G;
    stat = (size_t(blockIdx.y) * G + j) * T_ + t;
  }
};

template <typename T, bool kComputeLse>
__global__ void attention_probs_kernel(T* P, float* lse, const float* S, int rows_x_g, int G,
                                       int cols, int ld, int t0, int T_) {
  const RowOf row(G, t0, T_);
  const int visible = cols < row.t + 1 ? cols : row.t + 1;
  const size_t at = (size_t(blockIdx.y) * rows_x_g + blockIdx.x) * ld;
  const float* s = S + at;
  T* p = P + at;
  float shift;
  if (kComputeLse) {
    float m = -__int_as_float(0x7f800000);
    for (int c = threadIdx.x; c < visible; c += blockDim.x) m = fmaxf(m, s[c]);
    m = block_max(m);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < visible; c += blockDim.x) sum += expf(s[c] - m);
    sum = block_sum(sum);  // its barriers also end every thread's reads of S before P is written
    shift = m + logf(sum);
    if (threadIdx.x == 0) lse[row.stat] = shift;
  } else {
    shift = lse[row.stat];
  }
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    p[c] = from_float<T>(c < visible ? expf(s[c] - shift) : 0.0f);
}

template <typename T>
__global__ void attention_dscores_kernel(T* P_dS, const float* dP, const float* delta, int rows_x_g,
                                         int G, int cols, int ld, int t0, int T_, float scale) {
  const RowOf row(G, t0, T_);
  const size_t at = (size_t(blockIdx.y) * rows_x_g + blockIdx.x) * ld;
  T* p = P_dS + at;
  const float* dp = dP + at;
  const float d = delta[row.stat];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = (c <= row.t && row.t > 0) ? to_float(p[c]) * (dp[c] - d) * scale : 0.0f;
    p[c] = from_float<T>(v);
  }
}

// In units of W elements (inner a multiple of W; W = 1 is the scalar form): a pack of W
// consecutive elements of one row moves as one load and one store.
template <typename Dst, typename Src, int W>
__global__ void swap_axes12_kernel(Dst* dst, const Src* src, int B1, int B2, int inner, size_t n) {
  const size_t inner_p = size_t(inner) / W, packs = n / W;
  for (size_t e = grid_thread_index(); e < packs; e += grid_thread_count()) {
    // e indexes dst (A, B2, B1, inner / W).
    const size_t i = e % inner_p, rest = e / inner_p;
    const size_t b1 = rest % B1, rest2 = rest / B1;
    const size_t b2 = rest2 % B2, a = rest2 / B2;
    const Pack<Src, W> in = load_pack<W>(src + (((a * B1 + b1) * B2 + b2) * inner_p + i) * W);
    Pack<Dst, W> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = from_float<Dst>(to_float(in.v[j]));
    store_pack<W>(dst + e * W, out);
  }
}

void check_chunk(const char* what, int slabs, int rows, int G, int cols, int ld, int t0, int T_) {
  if (slabs < 0 || slabs > 65535 || rows < 0 || G < 1 || cols < 0 || ld < cols || t0 < 0 ||
      cols > t0 + rows || t0 + rows > T_ || size_t(rows) * G > 0x7fffffffu)
    throw ::ft::Error(std::string(what) + ": bad chunk slabs=" + std::to_string(slabs) +
                      " rows=" + std::to_string(rows) + " G=" + std::to_string(G) +
                      " cols=" + std::to_string(cols) + " ld=" + std::to_string(ld) +
                      " t0=" + std::to_string(t0) + " T=" + std::to_string(T_) +
                      " (needs slabs <= 65535, ld >= cols, cols <= t0 + rows <= T)");
}

}  // namespace

template <typename T>
void attention_probs(T* P, float* lse, const float* S, int slabs, int rows, int G, int cols, int ld,
                     int t0, int T_, bool compute_lse, void* stream) {
  check_chunk("attention_probs", slabs, rows, G, cols, ld, t0, T_);
  if (slabs == 0 || rows == 0) return;
  using E = device_t<T>;
  const dim3 grid{unsigned(rows * G), unsigned(slabs)};
  if (compute_lse) FT_LAUNCH((attention_probs_kernel<E, true>), grid, kRowThreads, 0, stream)
  (dev(P), lse, S, rows * G, G, cols, ld, t0, T_);
  else FT_LAUNCH((attention_probs_kernel<E, false>), grid, kRowThreads, 0, stream)(
      dev(P), lse, S, rows * G, G, cols, ld, t0, T_);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_dscores(T* P_dS, const float* dP, const float* delta, int slabs, int rows, int G,
                       int cols, int ld, int t0, int T_, float scale, void* stream) {
  check_chunk("attention_dscores", slabs, rows, G, cols, ld, t0, T_);
  if (slabs == 0 || rows == 0) return;
  FT_LAUNCH((attention_dscores_kernel<device_t<T>>), dim3(unsigned(rows * G), unsigned(slabs)),
            kRowThreads, 0, stream)
  (dev(P_dS), dP, delta, rows * G, G, cols, ld, t0, T_, scale);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename Dst, typename Src>
void swap_axes12(Dst* dst, const Src* src, int A, int B1, int B2, int inner, void* stream) {
  if (A < 0 || B1 < 0 || B2 < 0 || inner < 0)
    throw ::ft::Error("swap_axes12: negative size A=" + std::to_string(A) +
                      " B1=" + std::to_string(B1) + " B2=" + std::to_string(B2) +
                      " inner=" + std::to_string(inner));
  const size_t n = size_t(A) * B1 * B2 * inner;
  if (n == 0) return;
  // 16 bytes of the wider type per access where rows are whole packs and both sides aligned.
  constexpr int W = int(16 / (sizeof(Dst) > sizeof(Src) ? sizeof(Dst) : sizeof(Src)));
  using DD = device_t<Dst>;
  using DS = device_t<Src>;
  if (inner % W == 0 && aligned_to(dst, W * sizeof(Dst)) && aligned_to(src, W * sizeof(Src)))
    FT_LAUNCH((swap_axes12_kernel<DD, DS, W>), grid_blocks(n / W, 256, 4), 256, 0, stream)
  (dev(dst), dev(src), B1, B2, inner, n);
  else FT_LAUNCH((swap_axes12_kernel<DD, DS, 1>), grid_blocks(n, 256, 4), 256, 0, stream)(
      dev(dst), dev(src), B1, B2, inner, n);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_ATTENTION_GEMM_INSTANTIATE(T)                                                           \
  template void attention_probs<T>(T*, float*, const float*, int, int, int, int, int, int, int,    \
                                   bool, void*);                                                   \
  template void attention_dscores<T>(T*, const float*, const float*, int, int, int, int, int, int, \
                                     int, float, void*);                                           \
  template void swap_axes12<T, T>(T*, const T*, int, int, int, int, void*);
FT_ATTENTION_GEMM_INSTANTIATE(float)
FT_ATTENTION_GEMM_INSTANTIATE(bf16)
FT_ATTENTION_GEMM_INSTANTIATE(f16)
#undef FT_ATTENTION_GEMM_INSTANTIATE
template void swap_axes12<bf16, float>(bf16*, const float*, int, int, int, int, void*);
template void swap_axes12<f16, float>(f16*, const float*, int, int, int, int, void*);

}  // namespace ft::kernels::cuda
