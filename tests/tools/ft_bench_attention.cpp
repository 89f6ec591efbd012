// Attention benchmark (not a test): forward + backward time of the FlashAttention-2 kernel
// (kernels/cpu/attention.cpp) against the materialising kernel it replaced, which lives on here
// only as the baseline. Old and new run interleaved, REPS pairs; the median of each is printed.
//
//   ft_bench_attention [B T H K D [REPS [THREADS]]]     (default: 4 256 8 8 64, 5 reps, 2 threads)
//
// Run with OMP_WAIT_POLICY=passive as ft does (it re-executes itself with it, see
// apps/ft/main.cpp); this tool does the same.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace k = ft::kernels;

namespace {
using Clock = std::chrono::steady_clock;

struct BlasSingleThread {
  int saved;
  BlasSingleThread() : saved(k::blas_threads()) { k::set_blas_threads(1); }
  ~BlasSingleThread() { k::set_blas_threads(saved); }
};

// The kernel before FlashAttention-2 (ft up to commit 439e8f2), unchanged: probabilities
// (B, H, T, T) saved by the forward, a (B, H, T, T) scratch in the backward.
void materialised_forward(float* out, float* probs, const float* q, const float* k, const float* v,
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
        k::gemm_f32(false, true, T, T, D, scale, qb, ldq, kb, ldk, 0.0f, P, T);
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
        k::gemm_f32(false, false, T, D, T, 1.0f, P, T, vb, ldk, 0.0f, ob, ldq);
      }
    }
}

void materialised_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
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
        float beta = g == 0 ? 0.0f : 1.0f;
        k::gemm_f32(true, false, T, D, T, 1.0f, P, T, dob, ldq, beta, dvb, ldk);
        k::gemm_f32(false, true, T, T, D, 1.0f, dob, ldq, vb, ldk, 0.0f, dS, T);
        for (int i = 0; i < T; ++i) {
          const float* pr = P + size_t(i) * T;
          float* dr = dS + size_t(i) * T;
          float dot = 0.f;
          for (int j = 0; j <= i; ++j) dot += pr[j] * dr[j];
          for (int j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
          for (int j = i + 1; j < T; ++j) dr[j] = 0.f;
        }
        k::gemm_f32(false, false, T, D, T, scale, dS, T, kb, ldk, 0.0f, dqb, ldq);
        k::gemm_f32(true, false, T, D, T, scale, dS, T, qb, ldq, beta, dkb, ldk);
      }
    }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  if (!std::getenv("FT_NO_REEXEC")) {  // the thread environment ft itself runs with
    setenv("FT_NO_REEXEC", "1", 1);
    if (!std::getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "passive", 1);
    if (const char* core = k::blas_better_coretype()) setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);
  }
  int B = 4, T = 256, H = 8, K = 8, D = 64, reps = 5, threads = 2;
  if (argc >= 6) {
    B = std::atoi(argv[1]);
    T = std::atoi(argv[2]);
    H = std::atoi(argv[3]);
    K = std::atoi(argv[4]);
    D = std::atoi(argv[5]);
  }
  if (argc >= 7) reps = std::atoi(argv[6]);
  if (argc >= 8) threads = std::atoi(argv[7]);
  if (B < 1 || T < 1 || H < 1 || K < 1 || D < 1 || H % K != 0 || reps < 1 || threads < 1) {
    std::fprintf(stderr,
                 "usage: ft_bench_attention [B T H K D [REPS [THREADS]]], H a multiple "
                 "of K, all positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const size_t nq = size_t(B) * T * H * D, nk = size_t(B) * T * K * D;
  const size_t np = size_t(B) * H * T * T;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto randn = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = nd(gen);
    return x;
  };
  auto q = randn(nq), kk = randn(nk), v = randn(nk), dout = randn(nq);
  std::vector<float> out(nq), dq(nq), dk(nk), dv(nk), lse(size_t(B) * H * T);
  std::vector<float> probs(np), scratch(np);
  std::vector<float> delta(k::attention_backward_scratch_elems<float>(B, T, H, D));
  std::vector<double> old_f, old_b, new_f, new_b;
  float diff = 0;
  for (int r = 0; r < reps + 1; ++r) {  // the first pair warms up and is not counted
    auto t0 = Clock::now();
    materialised_forward(out.data(), probs.data(), q.data(), kk.data(), v.data(), B, T, H, K, D);
    const double f0 = seconds_since(t0);
    t0 = Clock::now();
    materialised_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(),
                          kk.data(), v.data(), scratch.data(), B, T, H, K, D);
    const double b0 = seconds_since(t0);
    const std::vector<float> ref_dq = dq;
    t0 = Clock::now();
    k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), B, T, H, K, D);
    const double f1 = seconds_since(t0);
    t0 = Clock::now();
    k::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), kk.data(), v.data(), delta.data(), B, T, H, K, D);
    const double b1 = seconds_since(t0);
    for (size_t i = 0; i < nq; ++i) diff = std::max(diff, std::abs(dq[i] - ref_dq[i]));
    if (r == 0) continue;
    old_f.push_back(f0);
    old_b.push_back(b0);
    new_f.push_back(f1);
    new_b.push_back(b1);
  }
  const double of = median(old_f), ob = median(old_b), nf = median(new_f), nb = median(new_b);
  std::printf("attention B %d T %d H %d K %d D %d, %d threads, median of %d interleaved pairs\n", B,
              T, H, K, D, threads, reps);
  std::printf(
      "  materialised (B,H,T,T): fwd %8.2f ms  bwd %8.2f ms  fwd+bwd %8.2f ms  "
      "(P + dS buffers %.1f MiB)\n",
      1e3 * of, 1e3 * ob, 1e3 * (of + ob), 2.0 * np * 4 / (1 << 20));
  std::printf(
      "  flash (tiles of %d):     fwd %8.2f ms  bwd %8.2f ms  fwd+bwd %8.2f ms  "
      "(lse + backward scratch %.3f MiB)\n",
      k::kAttnTile, 1e3 * nf, 1e3 * nb, 1e3 * (nf + nb),
      double(lse.size() + delta.size()) * 4 / (1 << 20));
  std::printf("  speedup fwd+bwd: %.2fx   max |dq_flash - dq_materialised| = %.2g\n",
              (of + ob) / (nf + nb), double(diff));
  return 0;
}
