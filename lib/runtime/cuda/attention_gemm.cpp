// Attention on tensor cores: see attention_gemm.h. Every GEMM is a GemmCall (lt_layout.h) in
// row-major terms over head-major slabs; the loops below only place the chunks.
#include "runtime/cuda/attention_gemm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/cuda/attention_plan.h"
#include "runtime/dtype_dispatch.h"

namespace ft::cuda {
namespace kc = kernels::cuda;
namespace {

void check_shape(const char* what, int B, int T, int H, int K, int D,
                 const AttentionGemmPlan& plan) {
  FT_CHECK(B >= 0 && T >= 0 && K >= 1 && H >= K && H % K == 0 && D >= 1, what,
           ": unsupported shape B=", B, " T=", T, " H=", H, " K=", K, " D=", D,
           " (needs H a multiple of K)");
  FT_CHECK(plan.rows >= 1 && plan.slabs >= 1 && plan.slabs <= 65535, what,
           ": bad chunking rows=", plan.rows, " slabs=", plan.slabs);
}

// Slabs [z0, z0 + n) of B·K, query positions [t0, t0 + rows).
struct Chunk {
  int z0, n, t0, rows;
  int cols() const { return t0 + rows; }  // the keys these queries can see
};

// The GemmCalls of one chunk, batched over its slabs. Head-major operands: Q-like (q, out, dO,
// dQ) are (B·K, T, G, D), K-like (k, v, dK, dV) (B·K, T, D); scores (n, rows·G, ld).
struct ChunkGemms {
  const Chunk& c;
  DType dt;
  int T, G, D, ld;

  int64_t q_stride() const { return int64_t(T) * G * D; }
  int64_t kv_stride() const { return int64_t(T) * D; }
  const void* q_at(const void* base, size_t eb) const {  // row (t0, j = 0) of slab z0
    return static_cast<const char*>(base) + ((size_t(c.z0) * T + c.t0) * G) * size_t(D) * eb;
  }
  const void* kv_at(const void* base, size_t eb) const {  // row 0 of slab z0
    return static_cast<const char*>(base) + size_t(c.z0) * T * size_t(D) * eb;
  }
  GemmCall base(const char* what, DType out) const {
    GemmCall call;
    call.in = dt;
    call.out = out;
    call.batch = c.n;
    call.what = what;
    return call;
  }
  // S (rows·G, cols) = scale · Q-like[t0 : t1] · K-like[0 : cols]ᵀ, fp32.
  GemmCall scores(const char* what, float* S, const void* qlike, const void* klike,
                  float scale) const {
    const size_t eb = dtype_size(dt);
    GemmCall s = base(what, DType::kF32);
    s.M = int64_t(c.rows) * G, s.N = c.cols(), s.K = D;
    s.a = q_at(qlike, eb), s.lda = D, s.stride_a = q_stride();
    s.b = kv_at(klike, eb), s.ldb = D, s.stride_b = kv_stride(), s.trans_b = true;
    s.c = S, s.ldc = ld, s.stride_c = int64_t(c.rows) * G * ld;
    s.alpha = scale;
    return s;
  }
  // Q-like[t0 : t1] (rows·G, D) = Z (rows·G, cols) · K-like[0 : cols].
  GemmCall rows_times_kv(const char* what, void* y, const void* z, const void* klike) const {
    const size_t eb = dtype_size(dt);
    GemmCall o = base(what, dt);
    o.M = int64_t(c.rows) * G, o.N = D, o.K = c.cols();
    o.a = z, o.lda = ld, o.stride_a = int64_t(c.rows) * G * ld;
    o.b = kv_at(klike, eb), o.ldb = D, o.stride_b = kv_stride();
    o.c = const_cast<void*>(q_at(y, eb)), o.ldc = D, o.stride_c = q_stride();
    return o;
  }
  // acc[0 : cols] (cols, D) += Zᵀ (cols, rows·G) · Q-like[t0 : t1], acc fp32 K-like.
  GemmCall kv_grad(const char* what, float* acc, const void* z, const void* qlike) const {
    GemmCall a = base(what, DType::kF32);
    a.M = c.cols(), a.N = D, a.K = int64_t(c.rows) * G;
    a.a = z, a.lda = ld, a.stride_a = int64_t(c.rows) * G * ld, a.trans_a = true;
    a.b = q_at(qlike, dtype_size(dt)), a.ldb = D, a.stride_b = q_stride();
    a.c = const_cast<void*>(kv_at(acc, sizeof(float))), a.ldc = D, a.stride_c = kv_stride();
    a.beta = 1.0f;
    return a;
  }
};

// Calls body(chunk) for every chunk, in the one fixed order both passes use.
template <typename F>
void for_each_chunk(int Z, int T, const AttentionGemmPlan& plan, F&& body) {
  for (int z0 = 0; z0 < Z; z0 += plan.slabs)
    for (int t0 = 0; t0 < T; t0 += plan.rows)
      body(Chunk{z0, std::min(plan.slabs, Z - z0), t0, std::min(plan.rows, T - t0)});
}

template <typename E>
E* at(void* scratch, size_t offset) {
  return reinterpret_cast<E*>(static_cast<char*>(scratch) + offset);
}

// q (B, T, K, G·D) -> (B, K, T, G·D); k and v likewise with D in place of G·D.
template <typename E>
void to_head_major(E* qh, E* kh, E* vh, const void* q, const void* k, const void* v, int B, int T,
                   int K, int G, int D, void* stream) {
  kc::swap_axes12(qh, static_cast<const E*>(q), B, T, K, G * D, stream);
  kc::swap_axes12(kh, static_cast<const E*>(k), B, T, K, D, stream);
  kc::swap_axes12(vh, static_cast<const E*>(v), B, T, K, D, stream);
}

}  // namespace

void attention_gemm_forward(LtGemm& lt, DType dtype, void* out, float* lse, const void* q,
                            const void* k, const void* v, int B, int T, int H, int K, int D,
                            const AttentionGemmPlan& plan, void* scratch, void* stream) {
  check_shape("attention_gemm_forward", B, T, H, K, D, plan);
  if (B == 0 || T == 0) return;
  const int G = H / K, Z = B * K, ld = attention_gemm_ld(T);
  const float scale = 1.0f / std::sqrt(float(D));
  const AttentionScratch sc(B, T, H, K, D, dtype, plan, false);
  dispatch(dtype, "attention on tensor cores", [&](auto tag) {
    using E = decltype(tag);
    E* qh = at<E>(scratch, sc.q);
    E* kh = at<E>(scratch, sc.k);
    E* vh = at<E>(scratch, sc.v);
    E* oh = at<E>(scratch, sc.o_or_do);
    float* S = at<float>(scratch, sc.s);
    // P beside S (16-bit), or over S (fp32: the kernel reads each score before writing it).
    E* P = dtype == DType::kF32 ? reinterpret_cast<E*>(S) : at<E>(scratch, sc.second);
    to_head_major(qh, kh, vh, q, k, v, B, T, K, G, D, stream);
    for_each_chunk(Z, T, plan, [&](const Chunk& c) {
      const ChunkGemms gm{c, dtype, T, G, D, ld};
      lt.gemm(gm.scores("attention S = Q·Kᵀ", S, qh, kh, scale), stream);
      kc::attention_probs(P, lse + size_t(c.z0) * G * T, S, c.n, c.rows, G, c.cols(), ld, c.t0, T,
                          /*compute_lse=*/true, stream);
      lt.gemm(gm.rows_times_kv("attention O = P·V", oh, P, vh), stream);
    });
    kc::swap_axes12(static_cast<E*>(out), oh, B, K, T, G * D, stream);
  });
}

void attention_gemm_backward(LtGemm& lt, DType dtype, void* dq, void* dk, void* dv,
                             const void* dout, const void* out, const float* lse, const void* q,
                             const void* k, const void* v, float* delta, int B, int T, int H, int K,
                             int D, const AttentionGemmPlan& plan, void* scratch, void* stream) {
  check_shape("attention_gemm_backward", B, T, H, K, D, plan);
  if (B == 0 || T == 0) return;
  const int G = H / K, Z = B * K, ld = attention_gemm_ld(T);
  const float scale = 1.0f / std::sqrt(float(D));
  const bool f32 = dtype == DType::kF32;
  const AttentionScratch sc(B, T, H, K, D, dtype, plan, true);
  const size_t nkv = size_t(B) * T * K * D;
  float* dk_sum = at<float>(scratch, sc.dk);
  float* dv_sum = at<float>(scratch, sc.dv);
  auto* st = static_cast<cudaStream_t>(stream);
  for (float* sum : {dk_sum, dv_sum}) {
    const cudaError_t e = cudaMemsetAsync(sum, 0, sizeof(float) * nkv, st);
    if (e != cudaSuccess)
      FT_FAIL("attention on tensor cores: zeroing dK/dV failed: ", cudaGetErrorString(e));
  }
  dispatch(dtype, "attention on tensor cores", [&](auto tag) {
    using E = decltype(tag);
    E* qh = at<E>(scratch, sc.q);
    E* kh = at<E>(scratch, sc.k);
    E* vh = at<E>(scratch, sc.v);
    E* doh = at<E>(scratch, sc.o_or_do);
    E* dqh = at<E>(scratch, sc.dq);
    float* S = at<float>(scratch, sc.s);
    // fp32: P over S, dP in the second buffer. 16-bit: P in the second buffer, dP over S.
    E* P = f32 ? reinterpret_cast<E*>(S) : at<E>(scratch, sc.second);
    float* dP = f32 ? at<float>(scratch, sc.second) : S;
    kc::attention_delta(delta, static_cast<const E*>(dout), static_cast<const E*>(out), B, T, H, D,
                        stream);
    to_head_major(qh, kh, vh, q, k, v, B, T, K, G, D, stream);
    kc::swap_axes12(doh, static_cast<const E*>(dout), B, T, K, G * D, stream);
    for_each_chunk(Z, T, plan, [&](const Chunk& c) {
      const ChunkGemms gm{c, dtype, T, G, D, ld};
      const size_t stat = size_t(c.z0) * G * T;
      lt.gemm(gm.scores("attention S = Q·Kᵀ", S, qh, kh, scale), stream);
      kc::attention_probs(P, const_cast<float*>(lse) + stat, S, c.n, c.rows, G, c.cols(), ld, c.t0,
                          T, /*compute_lse=*/false, stream);
      lt.gemm(gm.kv_grad("attention dV += Pᵀ·dO", dv_sum, P, doh), stream);
      lt.gemm(gm.scores("attention dP = dO·Vᵀ", dP, doh, vh, 1.0f), stream);
      kc::attention_dscores(P, dP, delta + stat, c.n, c.rows, G, c.cols(), ld, c.t0, T, scale,
                            stream);
      lt.gemm(gm.rows_times_kv("attention dQ = dS·K", dqh, P, kh), stream);
      lt.gemm(gm.kv_grad("attention dK += dSᵀ·Q", dk_sum, P, qh), stream);
    });
    kc::swap_axes12(static_cast<E*>(dq), dqh, B, K, T, G * D, stream);
    kc::swap_axes12(static_cast<E*>(dk), dk_sum, B, K, T, D, stream);
    kc::swap_axes12(static_cast<E*>(dv), dv_sum, B, K, T, D, stream);
  });
}

}  // namespace ft::cuda
