// Embedding, RMSNorm, RoPE, SwiGLU, cross-entropy, reductions and AdamW on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"

namespace ft::kernels {

void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                       int v_begin, int v_count) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const int row = ids[n] - v_begin;
    if (v_count < 0 || (row >= 0 && row < v_count))
      std::memcpy(out + size_t(n) * C, table + size_t(row) * C, sizeof(float) * C);
    else
      std::memset(out + size_t(n) * C, 0, sizeof(float) * C);
  }
}

void embedding_backward(float* dtable, const int32_t* ids, const float* dout, int N, int C,
                        int v_begin, int v_count) {
  // Parallel over columns: each thread owns a column range, rows stay in order, so duplicate
  // ids accumulate in the same order every time.
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 64) {
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int n = 0; n < N; ++n) {
      const int row = ids[n] - v_begin;
      if (v_count >= 0 && (row < 0 || row >= v_count)) continue;
      float* dst = dtable + size_t(row) * C;
      const float* src = dout + size_t(n) * C;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* xr = x + size_t(n) * C;
    float* o = out + size_t(n) * C;
    float ss = 0.f;
    for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
    float r = 1.0f / std::sqrt(ss / float(C) + eps);
    rstd[n] = r;
    // HF: weight * (x * rstd)
    for (int c = 0; c < C; ++c) o[c] = w[c] * (xr[c] * r);
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int N, int C) {
  // y = w ∘ x r, r = (mean(x²)+eps)^(-1/2)
  // dx = r (w∘dy) − x r³/C Σ_c (w∘dy∘x);  dw += Σ_n dy ∘ x r
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* xr = x + size_t(n) * C;
    const float* dy = dout + size_t(n) * C;
    float* d = dx + size_t(n) * C;
    float r = rstd[n];
    float dot = 0.f;
    for (int c = 0; c < C; ++c) dot += w[c] * dy[c] * xr[c];
    float k = dot * r * r * r / float(C);
    for (int c = 0; c < C; ++c) d[c] = r * w[c] * dy[c] - k * xr[c];
  }
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 64) {
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int n = 0; n < N; ++n) {
      const float* xr = x + size_t(n) * C;
      const float* dy = dout + size_t(n) * C;
      float r = rstd[n];
      for (int c = c0; c < c1; ++c) dw[c] += dy[c] * xr[c] * r;
    }
  }
}

namespace {
// cos/sin tables (T, D/2), computed in float the way HF's rotary embedding does:
// angle = float(t) · inv_freq_i in fp32, then cos and sin of that float.
void rope_tables(std::vector<float>& cosv, std::vector<float>& sinv, const float* inv_freq, int T,
                 int D) {
  int half = D / 2;
  cosv.resize(size_t(T) * half);
  sinv.resize(size_t(T) * half);
  for (int i = 0; i < half; ++i) {
    for (int t = 0; t < T; ++t) {
      float a = float(t) * inv_freq[i];
      cosv[size_t(t) * half + i] = std::cos(a);
      sinv[size_t(t) * half + i] = std::sin(a);
    }
  }
}

void rope_apply(float* x, const float* inv_freq, int B, int T, int nh, int D, float sign) {
  // The tables depend only on (T, inv_freq), which stay fixed through a run, so the last ones are
  // kept (per thread: kernels may be called from several threads later). The key is the table's
  // contents, not its address: D/2 floats compare in nanoseconds, and a caller's table may be
  // freed and another allocated at the same address.
  thread_local std::vector<float> cosv, sinv, cached_inv;
  thread_local int cached_T = -1;
  const int half = D / 2;
  if (T != cached_T || cached_inv.size() != size_t(half) ||
      std::memcmp(cached_inv.data(), inv_freq, sizeof(float) * half) != 0) {
    rope_tables(cosv, sinv, inv_freq, T, D);
    cached_T = T;
    cached_inv.assign(inv_freq, inv_freq + half);
  }
  // Plain pointers for the OpenMP threads: inside the loop `cosv` would name *their* copies.
  const float* cos_table = cosv.data();
  const float* sin_table = sinv.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* cs = cos_table + size_t(t) * half;
      const float* sn = sin_table + size_t(t) * half;
      for (int h = 0; h < nh; ++h) {
        float* v = x + ((size_t(b) * T + t) * nh + h) * D;
        for (int i = 0; i < half; ++i) {
          // forward: (x1, x2) → (x1 c − x2 s, x2 c + x1 s); backward: the transpose (s → −s)
          float x1 = v[i], x2 = v[i + half];
          float s = sign * sn[i];
          v[i] = x1 * cs[i] - x2 * s;
          v[i + half] = x2 * cs[i] + x1 * s;
        }
      }
    }
}
}  // namespace

void rope_forward(float* x, const float* inv_freq, int B, int T, int nh, int D) {
  rope_apply(x, inv_freq, B, T, nh, D, 1.0f);
}
void rope_backward(float* dx, const float* inv_freq, int B, int T, int nh, int D) {
  rope_apply(dx, inv_freq, B, T, nh, D, -1.0f);
}

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float s = 1.0f / (1.0f + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float s = 1.0f / (1.0f + std::exp(-g[i]));
    float silu = g[i] * s;
    du[i] = dh[i] * silu;
    dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                      const uint8_t* mask, int N, int V, float scale) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; ++n) {
    const float* l = logits + size_t(n) * V;
    float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
    if (!mask[n]) {
      if (d) std::memset(d, 0, sizeof(float) * V);
      continue;
    }
    const int t = targets[n];
    const float lt = l[t];  // read before d (which may alias l) is written
    float mx = l[0];
    for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
    // exp in float (vectorised), the sum in double: the sum of V terms is where precision is lost.
    double se = 0.0;
    if (d) {
      for (int j = 0; j < V; ++j) d[j] = std::exp(l[j] - mx);  // d may alias l: l[j] is read first
      for (int j = 0; j < V; ++j) se += d[j];
    } else {
      for (int j = 0; j < V; ++j) se += std::exp(l[j] - mx);
    }
    total += double(mx) + std::log(se) - double(lt);
    if (d) {
      const float s = float(double(scale) / se);
      for (int j = 0; j < V; ++j) d[j] *= s;
      d[t] -= scale;
    }
  }
  return total;
}

void row_max(float* out, const float* x, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* l = x + size_t(n) * V;
    float mx = l[0];
    for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
    out[n] = mx;
  }
}

void ce_partial(double* sumexp, double* target_logit, const float* logits, const int32_t* targets,
                const uint8_t* mask, const float* rmax, int N, int V, int v_begin) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    sumexp[n] = 0.0;
    target_logit[n] = 0.0;
    if (!mask[n]) continue;
    const float* l = logits + size_t(n) * V;
    double se = 0.0;
    for (int j = 0; j < V; ++j) se += std::exp(l[j] - rmax[n]);
    sumexp[n] = se;
    const int t = targets[n] - v_begin;
    if (t >= 0 && t < V) target_logit[n] = l[t];
  }
}

double ce_finish(float* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                 const float* rmax, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, float scale) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; ++n) {
    const float* l = logits + size_t(n) * V;
    float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
    if (!mask[n]) {
      if (d) std::memset(d, 0, sizeof(float) * V);
      continue;
    }
    total += double(rmax[n]) + std::log(sumexp[n]) - target_logit[n];
    if (d) {
      const float s = float(double(scale) / sumexp[n]);
      for (int j = 0; j < V; ++j) d[j] = std::exp(l[j] - rmax[n]) * s;
      const int t = targets[n] - v_begin;
      if (t >= 0 && t < V) d[t] -= scale;
    }
  }
  return total;
}

void add_inplace(float* y, const float* x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

double sum_squares(const float* x, size_t n) {
  double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s)
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t) {
  // Mirrors torch.optim.AdamW (single-tensor path): step_size and the bias corrections are
  // computed in double on the host, the element math in float.
  const double bc1 = 1.0 - std::pow(double(beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(beta2), double(t));
  const float step_size = float(double(lr) / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i] * decay;
    float mi = m[i] * beta1 + (1.0f - beta1) * g[i];
    float vi = v[i] * beta2 + (1.0f - beta2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
  }
}

}  // namespace ft::kernels
