// Causal grouped-query attention with the score matrix materialised per (batch, head):
//   S = Q Kᵀ / sqrt(D), P = softmax(S + causal mask), O = P V.
// Backward (P saved):  dP = dO Vᵀ,  dS = P ∘ (dP − rowsum(dP ∘ P)),
//   dQ = dS K / sqrt(D),  dK = Σ_heads dSᵀ Q / sqrt(D),  dV = Σ_heads Pᵀ dO.
// Work is split over (batch, kv head) so the heads that share a kv head accumulate dK, dV in a
// fixed order without races. The small per-head GEMMs run single-threaded inside the OpenMP loop.
#include <cmath>
#include <limits>

#include "kernels/kernels.h"

namespace ft::kernels {
namespace {
struct BlasSingleThread {
  int saved;
  BlasSingleThread() : saved(blas_threads()) { set_blas_threads(1); }
  ~BlasSingleThread() { set_blas_threads(saved); }
};
}  // namespace

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       int B, int T, int H, int K, int D) {
  const int group = H / K;
  const float scale = 1.0f / std::sqrt(float(D));
  const int ldq = H * D, ldk = K * D;
  BlasSingleThread single;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int kh = 0; kh < K; ++kh) {
      const float* kb = k + size_t(b) * T * ldk + size_t(kh) * D;
      const float* vb = v + size_t(b) * T * ldk + size_t(kh) * D;
      for (int g = 0; g < group; ++g) {
        int h = kh * group + g;
        const float* qb = q + size_t(b) * T * ldq + size_t(h) * D;
        float* P = probs + (size_t(b) * H + h) * T * T;
        gemm_f32(false, true, T, T, D, scale, qb, ldq, kb, ldk, 0.0f, P, T);
        for (int i = 0; i < T; ++i) {
          float* row = P + size_t(i) * T;
          float mx = -std::numeric_limits<float>::infinity();
          for (int j = 0; j <= i; ++j) mx = row[j] > mx ? row[j] : mx;
          float sum = 0.f;
          for (int j = 0; j <= i; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          float inv = 1.0f / sum;
          for (int j = 0; j <= i; ++j) row[j] *= inv;
          for (int j = i + 1; j < T; ++j) row[j] = 0.f;
        }
        float* ob = out + size_t(b) * T * ldq + size_t(h) * D;
        gemm_f32(false, false, T, D, T, 1.0f, P, T, vb, ldk, 0.0f, ob, ldq);
      }
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                        const float* q, const float* k, const float* v, float* scratch, int B,
                        int T, int H, int K, int D) {
  const int group = H / K;
  const float scale = 1.0f / std::sqrt(float(D));
  const int ldq = H * D, ldk = K * D;
  BlasSingleThread single;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int kh = 0; kh < K; ++kh) {
      const float* kb = k + size_t(b) * T * ldk + size_t(kh) * D;
      const float* vb = v + size_t(b) * T * ldk + size_t(kh) * D;
      float* dkb = dk + size_t(b) * T * ldk + size_t(kh) * D;
      float* dvb = dv + size_t(b) * T * ldk + size_t(kh) * D;
      for (int g = 0; g < group; ++g) {
        int h = kh * group + g;
        const float* qb = q + size_t(b) * T * ldq + size_t(h) * D;
        const float* dob = dout + size_t(b) * T * ldq + size_t(h) * D;
        float* dqb = dq + size_t(b) * T * ldq + size_t(h) * D;
        const float* P = probs + (size_t(b) * H + h) * T * T;
        float* dS = scratch + (size_t(b) * H + h) * T * T;
        float beta = g == 0 ? 0.0f : 1.0f;  // first head of the group overwrites dK, dV
        // dV (T, D) (+)= Pᵀ (T, T) · dO (T, D)
        gemm_f32(true, false, T, D, T, 1.0f, P, T, dob, ldq, beta, dvb, ldk);
        // dP (T, T) = dO (T, D) · Vᵀ (D, T)
        gemm_f32(false, true, T, T, D, 1.0f, dob, ldq, vb, ldk, 0.0f, dS, T);
        for (int i = 0; i < T; ++i) {
          const float* pr = P + size_t(i) * T;
          float* dr = dS + size_t(i) * T;
          float dot = 0.f;
          for (int j = 0; j <= i; ++j) dot += pr[j] * dr[j];
          for (int j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
          for (int j = i + 1; j < T; ++j) dr[j] = 0.f;
        }
        // dQ (T, D) = dS (T, T) · K (T, D) · scale
        gemm_f32(false, false, T, D, T, scale, dS, T, kb, ldk, 0.0f, dqb, ldq);
        // dK (T, D) (+)= dSᵀ (T, T) · Q (T, D) · scale
        gemm_f32(true, false, T, D, T, scale, dS, T, qb, ldq, beta, dkb, ldk);
      }
    }
}

}  // namespace ft::kernels
