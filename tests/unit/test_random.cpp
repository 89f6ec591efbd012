// Parameter init's generator (kernels/philox.h, kernels/cpu/random.cpp): Philox-4x32-10
// against Random123's published known answers, the hand-written ln and sin/cos against the
// math library, the normals' moments and tails, and the bits' independence of how a tensor is
// cut into calls and threads. (That the CUDA kernel gives the same bits: tests/ops/.)
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/philox.h"

namespace k = ft::kernels;
namespace px = ft::kernels::philox;

TEST_CASE("Philox-4x32-10 gives Random123's known answers (its tests/kat_vectors)") {
  struct Kat {
    uint32_t c[4], k[2], want[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& t : kats) {
    const px::Block b = px::philox4x32_10(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1]);
    for (int i = 0; i < 4; ++i) CHECK(b.w[i] == t.want[i]);
  }
}

TEST_CASE("the exactly rounded ln and sin/cos agree with the math library") {
  // Both within a few double ulps of the true values: 1e-14 absolute is ~50 ulp of ln 2^-32
  // and the normals are rounded to fp32 (6e-8 relative) afterwards.
  double worst_ln = 0, worst_trig = 0;
  for (uint64_t v = 1; v <= (uint64_t(1) << 32); v = v * 5 / 4 + 1)
    worst_ln = std::max(worst_ln, std::fabs(px::log_scaled(v) - std::log(double(v) * 0x1p-32)));
  CHECK(px::log_scaled(uint64_t(1) << 32) == 0.0);
  CHECK(std::fabs(px::log_scaled(1) - std::log(0x1p-32)) < 1e-14);
  for (uint64_t w = 0; w < (uint64_t(1) << 32); w += 40009) {
    double c, s;
    px::sincos_turn(uint32_t(w), &c, &s);
    const double t = 2 * M_PI * double(w) * 0x1p-32;
    worst_trig = std::max({worst_trig, std::fabs(c - std::cos(t)), std::fabs(s - std::sin(t))});
  }
  // The quadrant edges: exactly 0, ±1.
  double c, s;
  px::sincos_turn(1u << 30, &c, &s);
  CHECK((c == 0.0 && s == 1.0));
  px::sincos_turn(3u << 30, &c, &s);
  CHECK((c == 0.0 && s == -1.0));
  INFO("worst ln error ", worst_ln, ", worst sin/cos error ", worst_trig);
  CHECK(worst_ln < 1e-14);
  CHECK(worst_trig < 1e-15);
}

TEST_CASE("random_normal: N(0, std²) moments and tails") {
  const size_t n = size_t(1) << 22;
  const double std = 0.02;
  std::vector<float> x(n);
  k::random_normal(x.data(), n, 0x5eed, 0, std);
  double m1 = 0, m2 = 0, m4 = 0;
  size_t beyond1 = 0, beyond3 = 0;
  for (float v : x) {
    const double z = v / std;
    m1 += z, m2 += z * z, m4 += z * z * z * z;
    beyond1 += std::fabs(z) > 1;
    beyond3 += std::fabs(z) > 3;
  }
  m1 /= double(n), m2 /= double(n), m4 /= double(n);
  // Standard errors at n = 2^22: mean 1/sqrt(n) = 4.9e-4, variance sqrt(2/n) = 6.9e-4, fourth
  // moment sqrt(96/n) = 4.8e-3, P(|z| > 1) 2.3e-4, P(|z| > 3) 2.5e-5; bounds at ~5 of them, so
  // a wrong scale, a missing sign or a biased angle fails and chance does not.
  CHECK(std::fabs(m1) < 2.5e-3);
  CHECK(std::fabs(m2 - 1) < 3.5e-3);
  CHECK(std::fabs(m4 - 3) < 2.5e-2);
  CHECK(std::fabs(double(beyond1) / double(n) - 0.3173105) < 1.2e-3);
  CHECK(std::fabs(double(beyond3) / double(n) - 0.0026998) < 1.3e-4);
  // Neighbours are uncorrelated (the four lanes of a block, and across blocks).
  for (size_t lag : {1, 2, 3, 4, 5}) {
    double c = 0;
    for (size_t i = 0; i + lag < n; ++i) c += double(x[i]) * x[i + lag];
    CHECK(std::fabs(c / double(n - lag) / (std * std)) < 2.5e-3);
  }
  // Another key is another stream.
  std::vector<float> y(n);
  k::random_normal(y.data(), n, 0x5eee, 0, std);
  double cxy = 0;
  for (size_t i = 0; i < n; ++i) cxy += double(x[i]) * y[i];
  CHECK(std::fabs(cxy / double(n) / (std * std)) < 2.5e-3);
}

TEST_CASE("random_normal: the bits depend on (key, element index) only") {
  const size_t n = 100003;  // odd: partial blocks and chunks at the end
  const uint64_t key = 0x0123456789abcdefull;
  std::vector<float> whole(n);
  omp_set_num_threads(1);
  k::random_normal(whole.data(), n, key, 0, 0.02);
  // The one-block path (what the CUDA kernel runs) against the CPU's batched one.
  std::vector<float> scalar(n);
  px::fill_normal(scalar.data(), 0, n, key, 0, 0.02);
  CHECK(std::memcmp(whole.data(), scalar.data(), n * sizeof(float)) == 0);
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> again(n);
    k::random_normal(again.data(), n, key, 0, 0.02);
    CHECK_MESSAGE(std::memcmp(whole.data(), again.data(), n * sizeof(float)) == 0, threads,
                  " threads");
  }
  omp_set_num_threads(omp_get_num_procs());
  // Any cut into calls: slices drawn alone, starting off block boundaries.
  for (size_t cut : {size_t(1), size_t(3), size_t(4), size_t(4097), size_t(65539)}) {
    std::vector<float> parts(n);
    for (size_t at = 0; at < n; at += cut) {
      const size_t len = std::min(cut, n - at);
      k::random_normal(parts.data() + at, len, key, at, 0.02);
    }
    CHECK_MESSAGE(std::memcmp(whole.data(), parts.data(), n * sizeof(float)) == 0, "cut ", cut);
  }
  // The 2-D form: a column block (rows ld apart, rows and columns off block boundaries) has the
  // whole tensor's bits, at every thread count and on each CPU path (short rows split among
  // threads, rows longer than a chunk each split).
  for (size_t cols : {size_t(1), size_t(7), size_t(130), size_t(20000)})
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      const size_t ld = 2 * cols + 3, rows = (n - 5) / ld, col = cols / 2 + 1;
      std::vector<float> block(rows * cols);
      k::random_normal(block.data(), rows, cols, ld, key, col + 5, 0.02);
      bool same = true;
      for (size_t r = 0; r < rows; ++r)
        same = same &&
               std::memcmp(&block[r * cols], &whole[5 + r * ld + col], cols * sizeof(float)) == 0;
      CHECK_MESSAGE(same, "cols ", cols, ", ", threads, " threads");
    }
  omp_set_num_threads(omp_get_num_procs());
  // std scales the same normals (a power of two: exactly).
  std::vector<float> doubled(n);
  k::random_normal(doubled.data(), n, key, 0, 0.04);
  bool scaled = true;
  for (size_t i = 0; i < n; ++i) scaled = scaled && doubled[i] == 2 * whole[i];
  CHECK(scaled);
}
