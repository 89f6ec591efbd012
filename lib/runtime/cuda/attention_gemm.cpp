// Attention on tensor cores: see attention_gemm.h. Every GEMM is a GemmCall (lt_layout.h) in
// row-major terms; the loops below only place the chunks.
#include "runtime/cuda/attention_gemm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"

namespace ft::cuda {
namespace kc = kernels::cuda;
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Calls f with a value of the C++ element type of t.
template <typename F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(kernels::bf16{}); return;
    case DType::kF16: f(kernels::f16{}); return;
    default: FT_FAIL("attention on tensor cores: no kernel for element type ", dtype_name(t));
  }
}

void check_shape(const char* what, int B, int T, int H, int K, int D,
                 const AttentionGemmPlan& plan) {
  FT_CHECK(B >= 0 && T >= 0 && K >= 1 && H >= K && H % K == 0 && D >= 1, what,
           ": unsupported shape B=", B, " T=", T, " H=", H, " K=", K, " D=", D,
           " (needs H a multiple of K)");
  FT_CHECK(plan.rows >= 1 && plan.kv_heads >= 1 && plan.kv_heads <= 65535, what,
           ": bad chunking rows=", plan.rows, " kv_heads=", plan.kv_heads);
}

// Element offsets into the (B, T, heads, D) tensors, and the geometry of one chunk: batch row
// b, query head j of each group, kv heads [g0, g0 + n), query rows [t0, t0 + rows).
struct Chunk {
  int b, j, g0, n, t0, rows;
  int cols() const { return t0 + rows; }  // the keys these queries can see
};

struct Geometry {
  int T, H, K, D, G;
  size_t eb;  // bytes per element of q, k, v, out and their gradients
  // q / out / dq / dout of query head g0·G + j, row t0, batch row b.
  size_t q_off(const Chunk& c) const {
    return ((size_t(c.b) * T + c.t0) * H + size_t(c.g0) * G + c.j) * D;
  }
  // k / v (and the fp32 dK, dV accumulators) of kv head g0, row 0.
  size_t kv_off(const Chunk& c) const { return (size_t(c.b) * T * K + c.g0) * D; }
  // lse / Δ of query head g0·G + j, row 0.
  size_t row_stat_off(const Chunk& c) const {
    return (size_t(c.b) * H + size_t(c.g0) * G + c.j) * T;
  }
};

const void* at(const void* base, size_t elems, size_t eb) {
  return static_cast<const char*>(base) + elems * eb;
}
void* at(void* base, size_t elems, size_t eb) { return static_cast<char*>(base) + elems * eb; }

// The GemmCalls of one chunk, all batched over its n kv heads.
struct ChunkGemms {
  const Geometry& g;
  const Chunk& c;
  DType dt;
  int ld;  // row stride of the score chunk buffers

  GemmCall base(const char* what, DType out) const {
    GemmCall call;
    call.in = dt;
    call.out = out;
    call.batch = c.n;
    call.what = what;
    return call;
  }
  // S (rows, cols) = scale · Q[t0 : t0 + rows] · K[0 : cols]ᵀ, fp32.
  GemmCall scores(float* S, const void* q, const void* k, float scale) const {
    GemmCall s = base("attention scores Q·Kᵀ", DType::kF32);
    s.M = c.rows, s.N = c.cols(), s.K = g.D;
    s.a = at(q, g.q_off(c), g.eb), s.lda = int64_t(g.H) * g.D, s.stride_a = int64_t(g.G) * g.D;
    s.b = at(k, g.kv_off(c), g.eb), s.ldb = int64_t(g.K) * g.D, s.stride_b = g.D;
    s.trans_b = true;
    s.c = S, s.ldc = ld, s.stride_c = int64_t(c.rows) * ld;
    s.alpha = scale;
    return s;
  }
  // Y (rows, D) = Z (rows, cols) · V[0 : cols], Y laid out as q (out, dq).
  GemmCall rows_times_kv(const char* what, void* y, const void* z, const void* kv) const {
    GemmCall o = base(what, dt);
    o.M = c.rows, o.N = g.D, o.K = c.cols();
    o.a = z, o.lda = ld, o.stride_a = int64_t(c.rows) * ld;
    o.b = at(kv, g.kv_off(c), g.eb), o.ldb = int64_t(g.K) * g.D, o.stride_b = g.D;
    o.c = at(y, g.q_off(c), g.eb), o.ldc = int64_t(g.H) * g.D, o.stride_c = int64_t(g.G) * g.D;
    return o;
  }
  // acc[0 : cols] (cols, D) += Zᵀ (cols, rows) · Y[t0 : t0 + rows], Y laid out as q; acc as k.
  GemmCall kv_grad(const char* what, void* acc, DType acc_type, const void* z,
                   const void* y) const {
    GemmCall a = base(what, acc_type);
    a.M = c.cols(), a.N = g.D, a.K = c.rows;
    a.a = z, a.lda = ld, a.stride_a = int64_t(c.rows) * ld, a.trans_a = true;
    a.b = at(y, g.q_off(c), g.eb), a.ldb = int64_t(g.H) * g.D, a.stride_b = int64_t(g.G) * g.D;
    a.c = at(acc, g.kv_off(c), dtype_size(acc_type)), a.ldc = int64_t(g.K) * g.D,
    a.stride_c = g.D;
    a.beta = 1.0f;
    return a;
  }
  // dP (rows, cols) = dO[t0 : t0 + rows] · V[0 : cols]ᵀ, fp32.
  GemmCall dprobs(float* dP, const void* dout, const void* v) const {
    GemmCall d = scores(dP, dout, v, 1.0f);
    d.what = "attention dP = dO·Vᵀ";
    return d;
  }
};

// Calls body(chunk) for every chunk, in the one fixed order both passes use.
template <typename F>
void for_each_chunk(int B, int T, int K, int G, const AttentionGemmPlan& plan, F&& body) {
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < G; ++j)
      for (int g0 = 0; g0 < K; g0 += plan.kv_heads)
        for (int t0 = 0; t0 < T; t0 += plan.rows)
          body(Chunk{b, j, g0, std::min(plan.kv_heads, K - g0), t0, std::min(plan.rows, T - t0)});
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    FT_FAIL("attention on tensor cores: ", what, " failed: ", cudaGetErrorString(e));
}

}  // namespace

void attention_gemm_forward(LtGemm& lt, DType dtype, void* out, float* lse, const void* q,
                            const void* k, const void* v, int B, int T, int H, int K, int D,
                            const AttentionGemmPlan& plan, void* scratch, void* stream) {
  check_shape("attention_gemm_forward", B, T, H, K, D, plan);
  if (B == 0 || T == 0) return;
  const Geometry geo{T, H, K, D, H / K, dtype_size(dtype)};
  const float scale = 1.0f / std::sqrt(float(D));
  const int ld = attention_gemm_ld(T);
  auto* S = static_cast<float*>(scratch);
  // P beside S (16-bit), or over S (fp32: the kernel reads each score before writing it).
  void* P = dtype == DType::kF32
                ? scratch
                : static_cast<char*>(scratch) +
                      round_up(sizeof(float) * size_t(plan.kv_heads) * plan.rows * ld, 256);
  dispatch(dtype, [&](auto tag) {
    using E = decltype(tag);
    for_each_chunk(B, T, K, geo.G, plan, [&](const Chunk& c) {
      const ChunkGemms gm{geo, c, dtype, ld};
      lt.gemm(gm.scores(S, q, k, scale), stream);
      kc::attention_probs(static_cast<E*>(P), lse + geo.row_stat_off(c), S, c.n, c.rows, c.cols(),
                          ld, c.t0, int64_t(geo.G) * T, /*compute_lse=*/true, stream);
      lt.gemm(gm.rows_times_kv("attention O = P·V", out, P, v), stream);
    });
  });
}

void attention_gemm_backward(LtGemm& lt, DType dtype, void* dq, void* dk, void* dv,
                             const void* dout, const void* out, const float* lse, const void* q,
                             const void* k, const void* v, float* delta, int B, int T, int H,
                             int K, int D, const AttentionGemmPlan& plan, void* scratch,
                             void* stream) {
  check_shape("attention_gemm_backward", B, T, H, K, D, plan);
  if (B == 0 || T == 0) return;
  const Geometry geo{T, H, K, D, H / K, dtype_size(dtype)};
  const float scale = 1.0f / std::sqrt(float(D));
  const int ld = attention_gemm_ld(T);
  const bool f32 = dtype == DType::kF32;
  const size_t cells = size_t(plan.kv_heads) * plan.rows * ld;
  char* cursor = static_cast<char*>(scratch);
  auto* S = reinterpret_cast<float*>(cursor);
  cursor += round_up(sizeof(float) * cells, 256);
  // fp32: P over S, dP in the second buffer. 16-bit: P in the second buffer, dP over S.
  void* second = cursor;
  cursor += round_up((f32 ? sizeof(float) : geo.eb) * cells, 256);
  void* P = f32 ? static_cast<void*>(S) : second;
  float* dP = f32 ? static_cast<float*>(second) : S;
  // dK and dV sum over chunks and over the query heads of each group: in fp32, then rounded
  // once (16-bit), or straight into dk and dv (fp32).
  const size_t nkv = size_t(B) * T * K * D;
  void* dk_acc = dk;
  void* dv_acc = dv;
  if (!f32) {
    dk_acc = cursor;
    cursor += round_up(sizeof(float) * nkv, 256);
    dv_acc = cursor;
  }
  auto* st = static_cast<cudaStream_t>(stream);
  check_cuda(cudaMemsetAsync(dk_acc, 0, sizeof(float) * nkv, st), "zeroing dK");
  check_cuda(cudaMemsetAsync(dv_acc, 0, sizeof(float) * nkv, st), "zeroing dV");

  dispatch(dtype, [&](auto tag) {
    using E = decltype(tag);
    kc::attention_delta(delta, static_cast<const E*>(dout), static_cast<const E*>(out), B, T, H, D,
                        stream);
    for_each_chunk(B, T, K, geo.G, plan, [&](const Chunk& c) {
      const ChunkGemms gm{geo, c, dtype, ld};
      const int64_t stat_stride = int64_t(geo.G) * T;
      lt.gemm(gm.scores(S, q, k, scale), stream);
      kc::attention_probs(static_cast<E*>(P), const_cast<float*>(lse) + geo.row_stat_off(c), S,
                          c.n, c.rows, c.cols(), ld, c.t0, stat_stride, /*compute_lse=*/false,
                          stream);
      lt.gemm(gm.kv_grad("attention dV += Pᵀ·dO", dv_acc, DType::kF32, P, dout), stream);
      lt.gemm(gm.dprobs(dP, dout, v), stream);
      kc::attention_dscores(static_cast<E*>(P), dP, delta + geo.row_stat_off(c), c.n, c.rows,
                            c.cols(), ld, c.t0, stat_stride, scale, stream);
      lt.gemm(gm.rows_times_kv("attention dQ = dS·K", dq, P, k), stream);
      lt.gemm(gm.kv_grad("attention dK += dSᵀ·Q", dk_acc, DType::kF32, P, q), stream);
    });
    if (!f32) {
      kc::convert(static_cast<E*>(dk), static_cast<const float*>(dk_acc), nkv, stream);
      kc::convert(static_cast<E*>(dv), static_cast<const float*>(dv_acc), nkv, stream);
    }
  });
}

}  // namespace ft::cuda
