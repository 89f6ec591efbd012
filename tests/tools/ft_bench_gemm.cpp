// GEMM benchmark: the linear layers of the bench model in fp32 (OpenBLAS), bf16 and f16 (on the
// path kernels.h's gemm16_path names for this CPU; FT_GEMM16=onednn|packed|widen and FT_CPU_ISA
// choose another). Not a test; run by hand.
//
//   ft_bench_gemm [THREADS=2] [REPEATS=5] [N=1024]
//
// First one core's peak of 512-bit FMAs and of VDPBF16PS on registers (AVX-512 CPUs), the
// ceiling of fp32 and of bf16 dot-product GEMMs on this CPU.
// Per shape (in → out) and op (forward y = x·Wᵀ, dx = dy·W, dW += dyᵀ·x) it prints the
// best GFLOP/s of REPEATS timings (each ≥ 0.1 s of calls): the best, because other processes on
// a shared machine only ever slow a run down. Then the cost of a first call (which creates the
// oneDNN primitive) against a cached one, on a tiny shape where creation dominates.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/intrinsics.h"
#include "kernels/kernels.h"

namespace k = ft::kernels;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best seconds per call of fn over `repeats` timings of at least 0.1 s each.
double best_seconds(const std::function<void()>& fn, int repeats) {
  fn();  // warm-up: primitive creation, page faults
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    int calls = 0;
    const auto t0 = Clock::now();
    double t = 0;
    do {
      fn();
      ++calls;
      t = seconds_since(t0);
    } while (t < 0.1);
    best = std::min(best, t / calls);
  }
  return best;
}

template <typename T>
std::vector<T> random_vec(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<T> v(n);
  for (auto& x : v) x = ft::from_f32<T>(d(g));
  return v;
}

// GFLOP/s of forward, dx and dW for one type and shape.
template <typename T>
void bench_shape(int N, int in, int out, int repeats, double gflop[3]) {
  auto x = random_vec<T>(size_t(N) * in, 1), W = random_vec<T>(size_t(out) * in, 2);
  auto dy = random_vec<T>(size_t(N) * out, 3);
  std::vector<T> y(size_t(N) * out), dx(size_t(N) * in);
  std::vector<float> dW(size_t(out) * in, 0.0f);
  const double flop = 2.0 * N * in * out;
  gflop[0] =
      flop / 1e9 /
      best_seconds([&] { k::linear_forward(y.data(), x.data(), W.data(), N, in, out); }, repeats);
  gflop[1] =
      flop / 1e9 /
      best_seconds(
          [&] {
            k::linear_backward<T>(dx.data(), nullptr, dy.data(), x.data(), W.data(), N, in, out);
          },
          repeats);
  gflop[2] =
      flop / 1e9 /
      best_seconds(
          [&] {
            k::linear_backward<T>(nullptr, dW.data(), dy.data(), x.data(), W.data(), N, in, out);
          },
          repeats);
}

// Milliseconds of the first call of a new shape (primitive creation included) and the best of
// the following calls (cached primitive), for y (n, out) = x (n, in) · Wᵀ.
template <typename T>
void bench_first_call(int n, int in, int out, double* first_ms, double* cached_ms) {
  auto x = random_vec<T>(size_t(n) * in, 4), W = random_vec<T>(size_t(out) * in, 5);
  std::vector<T> y(size_t(n) * out);
  auto t0 = Clock::now();
  k::linear_forward(y.data(), x.data(), W.data(), n, in, out);
  *first_ms = seconds_since(t0) * 1e3;
  *cached_ms = 1e30;
  for (int i = 0; i < 200; ++i) {
    t0 = Clock::now();
    k::linear_forward(y.data(), x.data(), W.data(), n, in, out);
    *cached_ms = std::min(*cached_ms, seconds_since(t0) * 1e3);
  }
}

// CPU time (user + system, clock ticks) of each thread of this process, from /proc.
std::map<std::string, long> thread_ticks() {
  std::map<std::string, long> ticks;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string f;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
      if (i == 14) utime = std::atol(f.c_str());
      if (i == 15) stime = std::atol(f.c_str());
    }
    ticks[e.path().filename().string()] = utime + stime;
  }
  return ticks;
}

// How many threads did a share of the work in ~1 s of bf16 forward calls: THREADS when
// oneDNN's OpenMP team is ft's. Counted per thread from /proc, so a machine shared with other
// work (which only slows threads down) does not change the count.
int bf16_threads_used(int N, int in, int out) {
  auto x = random_vec<ft::bf16>(size_t(N) * in, 6), W = random_vec<ft::bf16>(size_t(out) * in, 7);
  std::vector<ft::bf16> y(size_t(N) * out);
  k::linear_forward(y.data(), x.data(), W.data(), N, in, out);
  const auto before = thread_ticks();
  const auto t0 = Clock::now();
  while (seconds_since(t0) < 1.0) k::linear_forward(y.data(), x.data(), W.data(), N, in, out);
  const auto after = thread_ticks();
  long total = 0;
  std::vector<long> used;
  for (const auto& [tid, t] : after) {
    const auto it = before.find(tid);
    used.push_back(t - (it == before.end() ? 0 : it->second));
    total += used.back();
  }
  int n = 0;
  for (long u : used) n += u * 5 >= total && u > 0;  // at least a fifth of the work
  return n;
}

// One core's peak GFLOP/s of register-only loops of 512-bit FMAs (32 FLOP each) and of
// VDPBF16PS (64 FLOP each: 16 lanes, two products and two adds): whether a CPU's bf16 dot
// products can beat fp32 at all. oneDNN's bf16 GEMM kernels on AVX512-BF16 CPUs are built on the
// second (DESIGN.md §2). 24 independent accumulators hide either instruction's latency.
__attribute__((target("avx512f"))) double fma_peak_gflops() {
  __m512 c[24];
  for (auto& v : c) v = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0x1p-20f);
  const long iters = 2000000;
  const auto t0 = Clock::now();
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (auto& v : c) v = _mm512_fmadd_ps(a, b, v);
    __asm__ volatile("" : "+v"(a));
  }
  const double s = seconds_since(t0);
  float sum = 0;
  for (const auto& v : c) sum += _mm512_reduce_add_ps(v);
  __asm__ volatile("" : : "x"(sum));
  return double(iters) * 24 * 32 / s / 1e9;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_peak_gflops() {
  __m512 c[24];
  for (auto& v : c) v = _mm512_setzero_ps();
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x35803580);
  const long iters = 2000000;
  const auto t0 = Clock::now();
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (auto& v : c) v = _mm512_dpbf16_ps(v, a, b);
    __asm__ volatile("" : "+v"(a));
  }
  const double s = seconds_since(t0);
  float sum = 0;
  for (const auto& v : c) sum += _mm512_reduce_add_ps(v);
  __asm__ volatile("" : : "x"(sum));
  return double(iters) * 24 * 64 / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int N = argc > 3 ? std::atoi(argv[3]) : 1024;
  if (threads < 1 || repeats < 1 || N < 1) {
    std::fprintf(stderr, "usage: ft_bench_gemm [THREADS=2] [REPEATS=5] [N=1024]\n");
    return 2;
  }
  omp_set_num_threads(threads);  // as the trainer does with runtime.threads
  k::set_blas_threads(threads);
  std::printf("ft_bench_gemm: N %d rows, %d threads, best of %d; BLAS kernels %s, oneDNN ISA %s\n",
              N, threads, repeats, k::blas_kernel_name(), k::gemm_isa());
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    double fma = 0, dp = 0;
    const bool bf16 = __builtin_cpu_supports("avx512bf16");
    for (int r = 0; r < 3; ++r) {  // the best of three: other work only slows a loop down
      fma = std::max(fma, fma_peak_gflops());
      if (bf16) dp = std::max(dp, dpbf16_peak_gflops());
    }
    if (bf16)
      std::printf("one core's peak: 512-bit FMA %.1f GFLOP/s, VDPBF16PS %.1f GFLOP/s (%.2fx)\n",
                  fma, dp, dp / fma);
    else
      std::printf("one core's peak: 512-bit FMA %.1f GFLOP/s (no AVX512-BF16)\n", fma);
  }
  // First, before any fp32 call, so that no OpenBLAS thread is spinning meanwhile.
  std::printf("bf16 forward %dx512x1408: %d threads did the work\n", N,
              bf16_threads_used(N, 512, 1408));
  std::printf("%-12s %-8s %10s %10s %10s   (GFLOP/s)\n", "in -> out", "type", "forward", "dx",
              "dW");
  const int shapes[][2] = {{512, 512}, {512, 1408}, {1408, 512}, {512, 32000}};
  for (const auto& s : shapes) {
    const char* names[] = {"fp32", "bf16", "f16"};
    double g[3][3];
    bench_shape<float>(N, s[0], s[1], repeats, g[0]);
    bench_shape<ft::bf16>(N, s[0], s[1], repeats, g[1]);
    bench_shape<ft::f16>(N, s[0], s[1], repeats, g[2]);
    for (int t = 0; t < 3; ++t) {
      char shape[32];
      std::snprintf(shape, sizeof shape, "%d -> %d", s[0], s[1]);
      std::printf("%-12s %-8s %10.1f %10.1f %10.1f\n", t == 0 ? shape : "", names[t], g[t][0],
                  g[t][1], g[t][2]);
    }
  }
  // Shapes not used above, so that the first call creates the primitive.
  const int first_shapes[][3] = {{7, 7, 7}, {N, 384, 1152}};
  for (const auto& f : first_shapes) {
    double first, cached;
    bench_first_call<ft::bf16>(f[0], f[1], f[2], &first, &cached);
    std::printf("bf16 %dx%dx%d: first call %.3f ms (creates the primitive), cached %.4f ms\n", f[0],
                f[1], f[2], first, cached);
  }
  return 0;
}
