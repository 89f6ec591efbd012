// fp32 GEMMs go through OpenBLAS; never a hand-written GEMM in the training path. The bf16/f16
// linear layers are in gemm_onednn.cpp; the residual form of every type is here.
#include <cblas.h>

#include <cstring>

#include "kernels/kernels.h"

namespace ft::kernels {

void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void linear_forward<float>(float* y, const float* x, const float* W, int N, int in, int out,
                           bool accumulate) {
  // y (N, out) = x (N, in) · Wᵀ (in, out)
  gemm_f32(false, true, N, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
}

template <typename T>
void linear_forward_residual(T* y, const T* r, const T* x, const T* W, int N, int in, int out) {
  if (y != r && N > 0 && out > 0) std::memcpy(y, r, size_t(N) * size_t(out) * sizeof(T));
  linear_forward<T>(y, x, W, N, in, out, /*accumulate=*/true);
}

template void linear_forward_residual<float>(float*, const float*, const float*, const float*, int,
                                             int, int);
template void linear_forward_residual<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int,
                                            int);
template void linear_forward_residual<f16>(f16*, const f16*, const f16*, const f16*, int, int, int);

template <>
void linear_backward<float>(float* dx, float* dW, const float* dy, const float* x, const float* W,
                            int N, int in, int out, bool accumulate_dx) {
  // dx (N, in) = dy (N, out) · W (out, in)
  if (dx)
    gemm_f32(false, false, N, in, out, 1.0f, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  // dW (out, in) += dyᵀ (out, N) · x (N, in)
  if (dW) gemm_f32(true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

const char* blas_kernel_name() { return openblas_get_corename(); }

const char* blas_better_coretype() {
  // OpenBLAS picks its kernels from the CPU model number. Releases older than the CPU (Debian 12
  // ships 0.3.21; Sapphire/Emerald Rapids came later) do not know the model and fall back to the
  // SSE3 "Prescott" kernels, about 5x slower than the AVX-512 ones on the same machine (measured:
  // 20 vs 95 GFLOP/s for a 1024x1408x512 sgemm on 2 cores). Only that fallback is corrected.
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

int blas_threads() { return openblas_get_num_threads(); }
void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace ft::kernels
