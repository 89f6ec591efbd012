// dropout_scale (kernels/cpu/dropout.cpp, the mask of kernels/philox.h): the mask's statistics
// (the kept fraction, overall and per Philox word, against a binomial bound), the kept values'
// bits, keys (the same key the same mask, another key another), the bits' independence of the
// thread count and of how the columns are cut among calls, the backward as the same call, and
// the ops' refusals. (That the CUDA kernel gives the same bits: tests/ops/.)
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "kernels/philox.h"
#include "runtime/cpu_ops.h"

namespace k = ft::kernels;
namespace px = ft::kernels::philox;
using ft::bf16;
using ft::f16;

namespace {

// n values with |x| in [0.5, 2) and either sign, rounded to T: never 0, so y ≠ 0 is "kept".
template <typename T>
std::vector<T> nonzero_values(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> mag(0.5f, 2.0f);
  std::vector<T> v(n);
  for (T& x : v) x = ft::from_f32<T>(g() % 2 ? mag(g) : -mag(g));
  return v;
}

template <typename T>
std::vector<T> dropout(const std::vector<T>& x, size_t rows, size_t cols, size_t col0, float p,
                       float f, uint64_t key) {
  std::vector<T> y(x.size());
  k::dropout_scale(y.data(), x.data(), rows, cols, col0, p, f, key);
  return y;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// |kept / n − (1 − p)| ≤ 6 standard deviations of a Binomial(n, 1 − p) fraction: the inputs are
// fixed, so the check is deterministic, and a true Bernoulli mask fails it with probability
// 2e-9. Over the 2.1M elements below at p = 0.1 that is 1.3e-3: a threshold 2% off p, or one
// word of the four never dropping (a lane's fraction 1), is beyond it.
void check_fraction(size_t kept, size_t n, double p, const char* what) {
  const double frac = double(kept) / double(n), sd = std::sqrt(p * (1 - p) / double(n));
  INFO(what, ": kept ", kept, " of ", n, " (", frac, "), want ", 1 - p, " ± 6 · ", sd);
  CHECK(std::fabs(frac - (1 - p)) <= 6 * sd);
}

}  // namespace

TEST_CASE_TEMPLATE("dropout_scale: the kept fraction is Binomial(1 − p); kept values are x·s", T,
                   float, bf16, f16) {
  // 2.1M elements: the fraction's standard deviation is 2.1e-4 at p = 0.1. Odd columns, so the
  // rows start at every phase of a Philox block.
  const size_t rows = 513, cols = 4099, n = rows * cols;
  const float p = 0.1f, f = 2.0f;
  const uint64_t key = 0x0123456789abcdefull;
  const auto x = nonzero_values<T>(n, 1);
  const auto y = dropout(x, rows, cols, 0, p, f, key);
  // s: f / (1 − p) rounded to fp32 once (within half an ulp of the exact quotient).
  const float s = px::dropout_factor(p, f);
  const double exact = double(f) / (1.0 - double(p));
  CHECK(std::fabs(double(s) - exact) <= std::ldexp(std::fabs(exact), -24));
  size_t kept = 0, bad = 0;
  size_t lane_kept[4] = {}, lane_n[4] = {};
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) {
      const size_t e = i * cols + j;
      const float yv = ft::to_f32(y[e]);
      const bool is_kept = yv != 0.0f;
      kept += is_kept;
      lane_kept[j % 4] += is_kept;
      ++lane_n[j % 4];
      // Kept: x · s in fp32, rounded to T once; dropped: +0 (its bits, not −0).
      const T want = is_kept ? ft::from_f32<T>(ft::to_f32(x[e]) * s) : ft::from_f32<T>(0.0f);
      bad += std::memcmp(&y[e], &want, sizeof(T)) != 0;
      // And the mask is philox.h's word for (row i, column j) against the threshold.
      const bool drawn = px::dropout_block(i, j / 4, key).w[j % 4] >= px::dropout_threshold(p);
      bad += drawn != is_kept;
    }
  CHECK(bad == 0);
  check_fraction(kept, n, p, "all elements");
  for (int q = 0; q < 4; ++q) check_fraction(lane_kept[q], lane_n[q], p, "one Philox word");
  // p = 0.5 as well: the threshold's other end of the range that matters.
  const auto y5 = dropout(x, rows, cols, 0, 0.5f, 1.0f, key);
  size_t kept5 = 0;
  for (const T& v : y5) kept5 += ft::to_f32(v) != 0.0f;
  check_fraction(kept5, n, 0.5, "p = 0.5");
}

TEST_CASE("dropout_scale: the same key gives the same mask, another key (either half) another") {
  const size_t rows = 256, cols = 1000, n = rows * cols;
  const float p = 0.1f;
  const uint64_t key = 0x5eed0000000000a1ull;
  const auto x = nonzero_values<float>(n, 2);
  const auto a = dropout(x, rows, cols, 0, p, 1.0f, key);
  CHECK(same_bits(a, dropout(x, rows, cols, 0, p, 1.0f, key)));
  // Independent masks differ at a fraction 2p(1 − p) = 0.18 of the elements (sd 7.7e-4 here):
  // a key whose low or high word alone differs, and two rows of one mask (the row is in the
  // counter, not only the column).
  auto differing = [&](const std::vector<float>& b, size_t from, size_t count) {
    size_t d = 0;
    for (size_t e = 0; e < count; ++e) d += (a[from + e] != 0) != (b[e] != 0);
    return d;
  };
  const double want = 2 * p * (1 - p);
  for (uint64_t other : {key ^ 1, key ^ (uint64_t(1) << 40)}) {
    const auto b = dropout(x, rows, cols, 0, p, 1.0f, other);
    const double frac = double(differing(b, 0, n)) / double(n);
    INFO("key ", other, ": masks differ at ", frac);
    CHECK(std::fabs(frac - want) <= 6 * std::sqrt(want * (1 - want) / double(n)));
  }
  // Row 1's mask against row 0's, both over the whole 1000 columns: 180 ± 73 (6 sd) differ.
  const std::vector<float> row1(a.begin() + cols, a.begin() + 2 * cols);
  const double d01 = double(differing(row1, 0, cols));
  CHECK(std::fabs(d01 - want * cols) <= 6 * std::sqrt(want * (1 - want) * cols));
}

TEST_CASE("dropout_scale: the bits do not depend on the threads or on the column slices") {
  const size_t rows = 37, cols = 9001;  // rows longer than an OpenMP chunk (4096 columns)
  const float p = 0.25f, f = 0.5f;
  const uint64_t key = 42;
  const auto x = nonzero_values<bf16>(rows * cols, 3);
  const auto whole = dropout(x, rows, cols, 0, p, f, key);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one_thread = dropout(x, rows, cols, 0, p, f, key);
  omp_set_num_threads(threads);
  CHECK(same_bits(whole, one_thread));
  // Three tensor-parallel ranks' uneven column slices, each its own call at its col0.
  for (const size_t cut : {size_t(1), size_t(4097)}) {
    const size_t bounds[] = {0, cut, cut + 3001, cols};
    for (int r = 0; r < 3; ++r) {
      const size_t c0 = bounds[r], w = bounds[r + 1] - c0;
      std::vector<bf16> xs(rows * w), want(rows * w);
      for (size_t i = 0; i < rows; ++i) {
        std::memcpy(&xs[i * w], &x[i * cols + c0], w * sizeof(bf16));
        std::memcpy(&want[i * w], &whole[i * cols + c0], w * sizeof(bf16));
      }
      INFO("slice [", c0, ", ", c0 + w, ")");
      CHECK(same_bits(dropout(xs, rows, w, c0, p, f, key), want));
    }
  }
}

TEST_CASE("dropout_scale: p = 0 is f·x; in place; the backward is the same call on the gradient") {
  const size_t rows = 19, cols = 111, n = rows * cols;
  const auto x = nonzero_values<f16>(n, 4);
  const auto y0 = dropout(x, rows, cols, 5, 0.0f, 0.37f, 7);
  bool exact = true;
  for (size_t e = 0; e < n; ++e) {
    const f16 want = ft::from_f32<f16>(ft::to_f32(x[e]) * 0.37f);
    exact &= std::memcmp(&y0[e], &want, sizeof(f16)) == 0;
  }
  CHECK(exact);
  // In place gives the out-of-place bits, with and without a mask.
  for (float p : {0.0f, 0.3f}) {
    std::vector<f16> inplace = x;
    k::dropout_scale(inplace.data(), inplace.data(), rows, cols, 5, p, 0.37f, 7);
    CHECK(same_bits(inplace, dropout(x, rows, cols, 5, p, 0.37f, 7)));
  }
  // Backward: dx = dy ∘ m · s is the same call on dy, so ⟨D x, dy⟩ = ⟨x, D dy⟩ (D is diagonal)
  // and dx is zero exactly where y is.
  const auto xf = nonzero_values<float>(n, 5), dy = nonzero_values<float>(n, 6);
  const auto y = dropout(xf, rows, cols, 5, 0.3f, 2.0f, 7);
  const auto dx = dropout(dy, rows, cols, 5, 0.3f, 2.0f, 7);
  double lhs = 0, rhs = 0;
  bool same_zeros = true;
  for (size_t e = 0; e < n; ++e) {
    lhs += double(y[e]) * dy[e];
    rhs += double(xf[e]) * dx[e];
    same_zeros &= (y[e] == 0) == (dx[e] == 0);
  }
  CHECK(same_zeros);
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-6));
}

TEST_CASE("dropout_scale through the ops: p outside [0, 1) and a partial overlap are refused") {
  auto ops = ft::make_cpu_ops();
  std::vector<float> buf(40, 1.0f);
  float* x = buf.data();
  const uint64_t one = 1, *key = &one;  // the key in device memory: host memory on the CPU
  for (float p : {1.0f, -0.1f, 1.5f, std::nanf("")})
    CHECK_THROWS_WITH(ops->dropout_scale({}, x + 20, x, 4, 5, 0, p, 1.0f, key),
                      doctest::Contains("is outside [0, 1)"));
  CHECK_THROWS_WITH(ops->dropout_scale({}, x + 1, x, 4, 5, 0, 0.1f, 1.0f, key),
                    doctest::Contains("y overlaps x without being x"));
  CHECK_NOTHROW(ops->dropout_scale({}, x, x, 4, 5, 0, 0.1f, 1.0f, key));       // in place
  CHECK_NOTHROW(ops->dropout_scale({}, x + 20, x, 4, 5, 0, 0.1f, 1.0f, key));  // adjacent
  CHECK_THROWS_WITH(ops->dropout_scale({}, x + 20, x, 4, 5, 0, 0.1f, 1.0f, nullptr),
                    doctest::Contains("without a key"));
  CHECK_NOTHROW(ops->dropout_scale({}, x + 20, x, 4, 5, 0, 0.0f, 1.0f, nullptr));  // p = 0
  CHECK_THROWS_WITH(
      ops->dropout_scale({}, ft::Ref(x + 20, ft::DType::kBF16), x, 4, 5, 0, 0.1f, 1.0f, key),
      doctest::Contains("different element types"));
}
