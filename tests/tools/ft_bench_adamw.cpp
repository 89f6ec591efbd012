// Host AdamW benchmark (issue 29, parallel.offload_optimizer): the CPU kernel that the offloaded
// update runs (kernels/cpu/adamw.cpp, the copy of the instruction set chosen at run time) on one
// flat fp32 range, as an offloaded group is: read p, g, m, v, write p, m, v and, with a 16-bit
// compute dtype, the rounded p that goes back to the device. Not a test; run by
// scripts/bench_host_adamw.sh, which sets PyTorch's CPU AdamW beside it.
//
//   ft_bench_adamw [ELEMENTS=16777216] [THREADS=1] [COMPUTE=bf16|f32|none] [REPEATS=5]
//
// Prints one line of JSON: the ISA, the threads, elements, the best seconds per update of REPEATS
// timings (each at least 0.2 s of updates: the best, because other processes on a shared machine
// only slow a run down), elements per second, per thread, and the bytes moved per second.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/kernels.h"

namespace k = ft::kernels;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? size_t(std::strtoull(argv[1], nullptr, 10)) : size_t(16) << 20;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const std::string compute = argc > 3 ? argv[3] : "bf16";
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 5;
  if (n == 0 || threads < 1 || repeats < 1 ||
      (compute != "bf16" && compute != "f32" && compute != "none")) {
    std::fprintf(stderr,
                 "usage: ft_bench_adamw [ELEMENTS>0] [THREADS>=1] [bf16|f32|none] [REPEATS>=1]\n");
    return 2;
  }
  omp_set_num_threads(threads);
  std::vector<float> p(n), g(n), m(n), v(n), pf(compute == "f32" ? n : 0);
  std::vector<ft::bf16> pb(compute == "bf16" ? n : 0);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 1.f);
  for (size_t i = 0; i < n; ++i) p[i] = d(rng), g[i] = 1e-3f * d(rng);
  int64_t t = 0;
  auto step = [&] {
    ++t;
    if (compute == "bf16")
      k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.01f,
                      t, pb.data(), 0.5f);
    else if (compute == "f32")
      k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.01f,
                      t, pf.data(), 0.5f);
    else
      k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.01f,
                      t, 0.5f);
  };
  step();  // page faults, thread start
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    int calls = 0;
    const auto t0 = Clock::now();
    double s = 0;
    do {
      step();
      ++calls;
      s = seconds_since(t0);
    } while (s < 0.2);
    best = std::min(best, s / calls);
  }
  // Per element: p, g, m, v read (16 bytes), p, m, v written (12), the compute copy (2 or 4).
  const double bytes = 28.0 + (compute == "bf16" ? 2 : compute == "f32" ? 4 : 0);
  std::printf(
      "{\"impl\": \"ft\", \"isa\": \"%s\", \"threads\": %d, \"elements\": %zu, \"compute\": "
      "\"%s\", \"seconds\": %.6g, \"elems_per_s\": %.6g, \"elems_per_s_per_thread\": %.6g, "
      "\"gb_per_s\": %.4g}\n",
      k::cpu_isa_name(k::cpu_isa()), threads, n, compute.c_str(), best, double(n) / best,
      double(n) / best / threads, bytes * double(n) / best / 1e9);
  return 0;
}
