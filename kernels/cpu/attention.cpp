// Causal grouped-query attention, FlashAttention-2 (Dao 2023) on the CPU: nothing of size
// (B, H, T, T) is ever stored.
//
// Forward, per (batch, head, query tile Q_i): for each key tile j on or below the diagonal,
//   S = Q_i K_jᵀ / sqrt(D) (causal mask inside the diagonal tile),
//   m' = max(m, rowmax S), P = exp(S − m'), l = l·exp(m − m') + rowsum P,
//   O_i = O_i·exp(m − m') + P V_j;
// then O_i /= l and lse_i = m + log l, the only statistic kept for backward. Key tiles entirely
// above the diagonal are never visited.
//
// Backward, per (batch, kv head): Δ = rowsum(dO ∘ O) per query row; for each key tile j, for
// each query head of the group and each query tile i that reaches it, recompute
//   P = exp(S − lse), dV_j += Pᵀ dO_i, dP = dO_i V_jᵀ, dS = P ∘ (dP − Δ),
//   dK_j += dSᵀ Q_i / sqrt(D), dQ_i += dS K_j / sqrt(D).
// One thread owns a kv head and every query head that shares it, so dK, dV and dQ accumulate
// in one fixed order without races or atomics: the results are the same bits run to run and
// for any thread count.
//
// Element type E in {float, bf16, f16}: tiles are converted to fp32 scratch and all math is
// fp32 (lse, Δ, the running max and sum included); each output element is rounded once. The
// float instantiation reads its inputs in place. Per-thread tile scratch (a few tiles of
// kAttnTile × max(D, kAttnTile) floats) lives for one parallel region; what grows with T (Δ,
// and for a 16-bit type the fp32 dQ accumulator) is in the caller's scratch
// (attention_backward_scratch_elems), so every large buffer comes from the Device.
//
// The tile GEMMs run single-threaded through the BLAS inside the OpenMP loop.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {
namespace {
struct BlasSingleThread {
  int saved;
  BlasSingleThread() : saved(blas_threads()) { set_blas_threads(1); }
  ~BlasSingleThread() { set_blas_threads(saved); }
};

constexpr int kTile = kAttnTile;  // query rows and keys per tile

// A (rows, D) tile at src (row stride ld) as fp32: in place for float, else converted into buf
// (row stride D). Returns the pointer and sets ld_out.
template <typename E>
const float* tile_f32(const E* src, int rows, int D, int ld, float* buf, int& ld_out) {
  if constexpr (std::is_same_v<E, float>) {
    ld_out = ld;
    return src;
  } else {
    for (int r = 0; r < rows; ++r) cpu::load_f32(buf + size_t(r) * D, src + size_t(r) * ld, D);
    ld_out = D;
    return buf;
  }
}
}  // namespace

// The first position of the document holding position t of one sample's ids: the start of the
// run of equal ids through t (documents are runs, kernels.h).
inline int document_start(const int32_t* seg, int t) {
  int s = t;
  while (s > 0 && seg[s - 1] == seg[t]) --s;
  return s;
}

template <typename E>
void attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, int B, int T, int H,
                       int K, int D, const int32_t* seg) {
  const int group = H / K;
  const float scale = 1.0f / std::sqrt(float(D));
  const int ldq = H * D, ldk = K * D;
  const int tiles = (T + kTile - 1) / kTile;
  const size_t tD = size_t(kTile) * D;
  BlasSingleThread single;
#pragma omp parallel
  {
    // Q, K, V tiles (16-bit only), the output accumulator, S/P, running max and sum.
    std::vector<float> buf(4 * tD + size_t(kTile) * kTile + 2 * kTile);
    float *qbuf = buf.data(), *kbuf = qbuf + tD, *vbuf = kbuf + tD, *acc = vbuf + tD;
    float *S = acc + tD, *m = S + size_t(kTile) * kTile, *l = m + kTile;
    int first[kTile];  // with segments: each row's document start
    // Query tile qi costs qi + 1 key tiles: the last tiles go first so a dynamic schedule ends
    // evenly. Each work item writes its own rows of out and lse, so the order cannot matter.
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int rev = 0; rev < tiles; ++rev) {
          const int qi = tiles - 1 - rev, i0 = qi * kTile, rows = std::min(kTile, T - i0);
          const int kh = h / group;
          const int32_t* sb = seg ? seg + size_t(b) * T : nullptr;
          if (sb)
            for (int r = 0; r < rows; ++r)
              first[r] = r == 0                         ? document_start(sb, i0)
                         : sb[i0 + r] == sb[i0 + r - 1] ? first[r - 1]
                                                        : i0 + r;
          int ldQ, ldK, ldV;
          const float* Q =
              tile_f32(q + (size_t(b) * T + i0) * ldq + size_t(h) * D, rows, D, ldq, qbuf, ldQ);
          std::fill(acc, acc + size_t(rows) * D, 0.0f);
          std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
          std::fill(l, l + rows, 0.0f);
          // Key tiles before the first row's document are masked for every row: skipped.
          for (int j0 = sb ? first[0] / kTile * kTile : 0; j0 < i0 + rows; j0 += kTile) {
            const int cols = std::min(kTile, i0 + rows - j0);  // keys past the last row: masked
            const size_t koff = (size_t(b) * T + j0) * ldk + size_t(kh) * D;
            const float* Kt = tile_f32(k + koff, cols, D, ldk, kbuf, ldK);
            const float* Vt = tile_f32(v + koff, cols, D, ldk, vbuf, ldV);
            // S (rows, cols) = Q (rows, D) · Ktᵀ (D, cols) / sqrt(D)
            gemm_f32(false, true, rows, cols, D, scale, Q, ldQ, Kt, ldK, 0.0f, S, kTile);
            for (int r = 0; r < rows; ++r) {
              float* s = S + size_t(r) * kTile;
              const int n = std::min(cols, i0 + r - j0 + 1);  // keys j ≤ query i
              // Keys [c0, n) of the tile: c0 > 0 where the row's document starts inside it.
              const int c0 = sb ? std::max(0, first[r] - j0) : 0;
              if (n <= c0) {  // this row sees no key of the tile (above the diagonal)
                std::fill(s, s + cols, 0.0f);
                continue;
              }
              const float mx = cpu::lane_max(s + c0, n - c0, m[r]);
              const float alpha = std::exp(m[r] - mx);  // exp(−inf) = 0 on the first tile
              const float sum = cpu::exp_shifted_sum(s + c0, n - c0, mx);
              std::fill(s, s + c0, 0.0f);
              std::fill(s + n, s + cols, 0.0f);
              l[r] = l[r] * alpha + sum;
              m[r] = mx;
              if (alpha != 1.0f) {
                float* a = acc + size_t(r) * D;
                for (int e = 0; e < D; ++e) a[e] *= alpha;
              }
            }
            // acc (rows, D) += P (rows, cols) · Vt (cols, D)
            gemm_f32(false, false, rows, D, cols, 1.0f, S, kTile, Vt, ldV, 1.0f, acc, D);
          }
          for (int r = 0; r < rows; ++r) {
            const float inv = 1.0f / l[r];
            E* o = out + (size_t(b) * T + i0 + r) * ldq + size_t(h) * D;
            float* a = acc + size_t(r) * D;
            if constexpr (std::is_same_v<E, float>) {
              for (int e = 0; e < D; ++e) o[e] = a[e] * inv;
            } else {
              for (int e = 0; e < D; ++e) a[e] *= inv;
              cpu::store_f32(o, a, size_t(D));
            }
            lse[(size_t(b) * H + h) * T + i0 + r] = m[r] + std::log(l[r]);
          }
        }
  }
}

template <typename E>
size_t attention_backward_scratch_elems(int B, int T, int H, int D) {
  // Δ (B, H, T); then, for 16-bit types, the dQ accumulator (B, T, H, D): dQ accumulates over
  // key tiles and a 16-bit dq cannot hold the partial sums.
  return size_t(B) * H * T + (std::is_same_v<E, float> ? 0 : size_t(B) * T * H * D);
}

template <typename E>
void attention_backward(E* dq, E* dk, E* dv, const E* dout, const E* out, const float* lse,
                        const E* q, const E* k, const E* v, float* scratch, int B, int T, int H,
                        int K, int D, const int32_t* seg) {
  const int group = H / K;
  const float scale = 1.0f / std::sqrt(float(D));
  const int ldq = H * D, ldk = K * D;
  const int tiles = (T + kTile - 1) / kTile;
  const size_t tD = size_t(kTile) * D, tt = size_t(kTile) * kTile;
  // Δ (B, H, T) and the dQ accumulator (B, T, H, D) fp32, which is dq itself for float.
  float* const delta = scratch;
  float* dqa;
  if constexpr (std::is_same_v<E, float>)
    dqa = dq;
  else
    dqa = scratch + size_t(B) * H * T;
  BlasSingleThread single;
#pragma omp parallel
  {
    // Q, dO, K, V tiles (16-bit only), dK and dV accumulators, P, dS.
    std::vector<float> buf(6 * tD + 2 * tt);
    float *qbuf = buf.data(), *dobuf = qbuf + tD, *kbuf = dobuf + tD, *vbuf = kbuf + tD;
    float *dKa = vbuf + tD, *dVa = dKa + tD, *P = dVa + tD, *dS = P + tt;
    std::vector<int> first(seg ? T : 0);  // with segments: each position's document start
    // A row of dO and of O in fp32 (unused for float, but never empty: rowbuf.data() + D must
    // not offset a null pointer).
    std::vector<float> rowbuf(2 * size_t(D));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int kh = 0; kh < K; ++kh) {
        const int32_t* sb = seg ? seg + size_t(b) * T : nullptr;
        if (sb)
          for (int t = 0; t < T; ++t) first[t] = t > 0 && sb[t] == sb[t - 1] ? first[t - 1] : t;
        // Δ = rowsum(dO ∘ O) of this group's heads; zero their rows of the dQ accumulator.
        for (int g = 0; g < group; ++g) {
          const int h = kh * group + g;
          for (int t = 0; t < T; ++t) {
            const size_t off = (size_t(b) * T + t) * ldq + size_t(h) * D;
            const float* dO = cpu::in_f32(dout + off, size_t(D), rowbuf.data());
            const float* O = cpu::in_f32(out + off, size_t(D), rowbuf.data() + D);
            float s = 0.0f;
            for (int e = 0; e < D; ++e) s += dO[e] * O[e];
            delta[(size_t(b) * H + h) * T + t] = s;
            std::fill(dqa + off, dqa + off + D, 0.0f);
          }
        }
        for (int kj = 0; kj < tiles; ++kj) {
          const int j0 = kj * kTile, cols = std::min(kTile, T - j0);
          const size_t koff = (size_t(b) * T + j0) * ldk + size_t(kh) * D;
          int ldK, ldV, ldQ, ldO;
          const float* Kt = tile_f32(k + koff, cols, D, ldk, kbuf, ldK);
          const float* Vt = tile_f32(v + koff, cols, D, ldk, vbuf, ldV);
          std::fill(dKa, dKa + size_t(cols) * D, 0.0f);
          std::fill(dVa, dVa + size_t(cols) * D, 0.0f);
          for (int g = 0; g < group; ++g) {
            const int h = kh * group + g;
            const float* lse_h = lse + (size_t(b) * H + h) * T;
            const float* delta_h = delta + (size_t(b) * H + h) * T;
            // Query tiles from the one holding row j0 on: the tiles above see no key of this one.
            for (int i0 = (j0 / kTile) * kTile; i0 < T; i0 += kTile) {
              const int rows = std::min(kTile, T - i0);
              // Document starts never decrease: once a tile's first row starts after the last
              // key, so does every later row.
              if (sb && first[i0] >= j0 + cols) break;
              const size_t qoff = (size_t(b) * T + i0) * ldq + size_t(h) * D;
              const float* Q = tile_f32(q + qoff, rows, D, ldq, qbuf, ldQ);
              const float* dO = tile_f32(dout + qoff, rows, D, ldq, dobuf, ldO);
              // P (rows, cols) = exp(Q Ktᵀ / sqrt(D) − lse), 0 above the diagonal
              gemm_f32(false, true, rows, cols, D, scale, Q, ldQ, Kt, ldK, 0.0f, P, kTile);
              for (int r = 0; r < rows; ++r) {
                float* p = P + size_t(r) * kTile;
                const int n = std::clamp(i0 + r - j0 + 1, 0, cols);
                const int c0 = sb ? std::clamp(first[i0 + r] - j0, 0, n) : 0;  // document start
                const float m = lse_h[i0 + r];
                std::fill(p, p + c0, 0.0f);
                for (int c = c0; c < n; ++c) p[c] = cpu::exp_nonpositive(p[c] - m);
                std::fill(p + n, p + cols, 0.0f);
              }
              // dVa (cols, D) += Pᵀ (cols, rows) · dO (rows, D)
              gemm_f32(true, false, cols, D, rows, 1.0f, P, kTile, dO, ldO, 1.0f, dVa, D);
              // dP (rows, cols) = dO (rows, D) · Vtᵀ (D, cols); dS = P ∘ (dP − Δ)
              gemm_f32(false, true, rows, cols, D, 1.0f, dO, ldO, Vt, ldV, 0.0f, dS, kTile);
              for (int r = 0; r < rows; ++r) {
                const float* p = P + size_t(r) * kTile;
                float* ds = dS + size_t(r) * kTile;
                const float dl = delta_h[i0 + r];
                for (int c = 0; c < cols; ++c) ds[c] = p[c] * (ds[c] - dl);
              }
              // Position 0 sees one key: its softmax is the constant 1 and its gradient exactly
              // 0 (as PyTorch's math path gives). dP − Δ would leave the rounding difference of
              // two dot products ordered differently, which for T = 1 is the whole gradient.
              // With segments, the first position of every document likewise.
              if (sb) {
                for (int r = 0; r < rows; ++r)
                  if (first[i0 + r] == i0 + r)
                    std::fill(dS + size_t(r) * kTile, dS + size_t(r) * kTile + cols, 0.0f);
              } else if (i0 == 0) {
                std::fill(dS, dS + cols, 0.0f);
              }
              // dKa (cols, D) += dSᵀ (cols, rows) · Q (rows, D) / sqrt(D)
              gemm_f32(true, false, cols, D, rows, scale, dS, kTile, Q, ldQ, 1.0f, dKa, D);
              // dQ (rows, D) += dS (rows, cols) · Kt (cols, D) / sqrt(D)
              gemm_f32(false, false, rows, D, cols, scale, dS, kTile, Kt, ldK, 1.0f, dqa + qoff,
                       ldq);
            }
          }
          for (int c = 0; c < cols; ++c) {
            if constexpr (std::is_same_v<E, float>) {
              std::copy_n(dKa + size_t(c) * D, D, dk + koff + size_t(c) * ldk);
              std::copy_n(dVa + size_t(c) * D, D, dv + koff + size_t(c) * ldk);
            } else {
              cpu::store_f32(dk + koff + size_t(c) * ldk, dKa + size_t(c) * D, size_t(D));
              cpu::store_f32(dv + koff + size_t(c) * ldk, dVa + size_t(c) * D, size_t(D));
            }
          }
        }
        if constexpr (!std::is_same_v<E, float>)
          for (int g = 0; g < group; ++g)
            for (int t = 0; t < T; ++t) {
              const size_t off = (size_t(b) * T + t) * ldq + size_t(kh * group + g) * D;
              cpu::store_f32(dq + off, dqa + off, size_t(D));
            }
      }
  }
}

#define FT_ATTENTION_INSTANTIATE(E)                                                                \
  template void attention_forward<E>(E*, float*, const E*, const E*, const E*, int, int, int, int, \
                                     int, const int32_t*);                                         \
  template size_t attention_backward_scratch_elems<E>(int, int, int, int);                         \
  template void attention_backward<E>(E*, E*, E*, const E*, const E*, const float*, const E*,      \
                                      const E*, const E*, float*, int, int, int, int, int,         \
                                      const int32_t*);
FT_ATTENTION_INSTANTIATE(float)
FT_ATTENTION_INSTANTIATE(bf16)
FT_ATTENTION_INSTANTIATE(f16)
#undef FT_ATTENTION_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
