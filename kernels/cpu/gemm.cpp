// GEMMs go through OpenBLAS; never a hand-written GEMM in the training path.
#include <cblas.h>

#include "kernels/kernels.h"

namespace ft::kernels {

void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
              int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void linear_forward(float* y, const float* x, const float* W, int N, int in, int out,
                    bool accumulate) {
  // y (N, out) = x (N, in) · Wᵀ (in, out)
  gemm_f32(false, true, N, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
}

void linear_backward(float* dx, float* dW, const float* dy, const float* x, const float* W,
                     int N, int in, int out, bool accumulate_dx) {
  // dx (N, in) = dy (N, out) · W (out, in)
  if (dx) gemm_f32(false, false, N, in, out, 1.0f, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  // dW (out, in) += dyᵀ (out, N) · x (N, in)
  if (dW) gemm_f32(true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

int blas_threads() { return openblas_get_num_threads(); }
void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace ft::kernels
