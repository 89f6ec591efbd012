// kernels/cuda/reduce.cu on the CUDA emulation (a test tool) against the CPU kernels
// (kernels/cpu/reduce.cpp), under two schedule seeds. add_inplace and scale_inplace are one
// fp32 operation and one rounding per element, so their bits must match; sum_squares adds in a
// different order than the CPU's threads, so it matches within a bound, and must give the same
// bits under every seed (determinism: no float atomics, a fixed order).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/emu_test_util.h"

namespace ft::kernels {
namespace {

using ft::emu::test::DeviceBuffer;
using ft::emu::test::SeedScope;
using ft::emu::test::test_seeds;

const size_t kSizes[] = {0, 1, 19, 111, 4099, 300007};

template <typename T>
std::vector<T> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<T> v(n);
  for (T& x : v) x = from_f32<T>(dist(rng));
  return v;
}

template <typename T>
std::vector<uint32_t> bits_of(const std::vector<T>& v) {
  std::vector<uint32_t> b(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(&b[i], &v[i], sizeof(T));
  return b;
}

template <typename T>
void check_add() {
  for (size_t n : kSizes) {
    CAPTURE(n);
    const std::vector<T> y0 = random_values<T>(n, 1, 3.0f), x = random_values<T>(n, 2, 0.01f);
    std::vector<T> want = y0;
    add_inplace(want.data(), x.data(), n);
    for (uint64_t seed : test_seeds()) {
      CAPTURE(seed);
      SeedScope scope(seed);
      DeviceBuffer<T> dy(y0), dx(x);
      cuda::add_inplace(dy.get(), dx.get(), n, nullptr);
      CHECK(bits_of(dy.to_host()) == bits_of(want));
    }
  }
}

TEST_CASE("cuda_emu reduce: add_inplace fp32 has the CPU's bits") { check_add<float>(); }
TEST_CASE("cuda_emu reduce: add_inplace bf16 has the CPU's bits") { check_add<bf16>(); }
TEST_CASE("cuda_emu reduce: add_inplace f16 has the CPU's bits") { check_add<f16>(); }

TEST_CASE("cuda_emu reduce: scale_inplace has the CPU's bits") {
  for (size_t n : kSizes) {
    CAPTURE(n);
    const std::vector<float> y0 = random_values<float>(n, 3, 2.0f);
    std::vector<float> want = y0;
    scale_inplace(want.data(), 0.37f, n);
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      DeviceBuffer<float> dy(y0);
      cuda::scale_inplace(dy.get(), 0.37f, n, nullptr);
      CHECK(bits_of(dy.to_host()) == bits_of(want));
    }
  }
}

TEST_CASE("cuda_emu reduce: sum_squares matches the CPU and is bit-identical across seeds") {
  for (size_t n : kSizes) {
    CAPTURE(n);
    std::vector<float> x = random_values<float>(n, 4, 1.0f);
    if (n > 19) x[n / 2] = 3e30f;  // x² overflows fp32: the sum must be in double
    const double start = 1.5, divisor = 7.0;
    const double want = start + sum_squares(x.data(), n) / divisor;
    const size_t scratch_bytes = cuda::sum_squares_scratch_bytes(n);
    CHECK(scratch_bytes <= 8192);  // at most 1024 partials
    // At offset 1 the data is not 16-byte aligned: the scalar path instead of float4 packs.
    for (size_t off : {size_t(0), size_t(1)}) {
      CAPTURE(off);
      std::vector<float> xo(off, 1e20f);  // never read
      xo.insert(xo.end(), x.begin(), x.end());
      std::vector<uint64_t> runs;
      for (uint64_t seed : test_seeds()) {
        for (int repeat = 0; repeat < 2; ++repeat) {
          CAPTURE(seed);
          SeedScope scope(seed);
          DeviceBuffer<float> dx(xo);
          DeviceBuffer<double> acc(std::vector<double>{start});
          DeviceBuffer<char> scratch(scratch_bytes);
          cuda::sum_squares(acc.get(), dx.get() + off, n, divisor, scratch.get(), nullptr);
          const double got = acc.to_host()[0];
          // Both sides add n non-negative doubles, in different orders: each is within
          // (n - 1)·u·Σ of the exact sum (u = DBL_EPSILON / 2), so they differ by at most twice
          // that. The division by the divisor and the add to `start` round once more each.
          const double bound = (2.0 * double(n) + 4.0) * (DBL_EPSILON / 2) * std::fabs(want);
          CHECK(std::fabs(got - want) <= bound);
          uint64_t b;
          std::memcpy(&b, &got, 8);
          runs.push_back(b);
        }
      }
      for (uint64_t b : runs) CHECK(b == runs.front());
    }
  }
}

TEST_CASE("cuda_emu reduce: sum_squares carries inf and NaN (the non-finite gradient check)") {
  const size_t n = 5000;
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<float> x = random_values<float>(n, 5, 1.0f);
    x[4321] = bad;
    const double want = sum_squares(x.data(), n);
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      DeviceBuffer<float> dx(x);
      DeviceBuffer<double> acc(std::vector<double>{0.0});
      DeviceBuffer<char> scratch(cuda::sum_squares_scratch_bytes(n));
      cuda::sum_squares(acc.get(), dx.get(), n, 1.0, scratch.get(), nullptr);
      const double got = acc.to_host()[0];
      CHECK(std::isnan(got) == std::isnan(want));
      CHECK(std::isinf(got) == std::isinf(want));
      CHECK(std::isfinite(got) == false);
    }
  }
}

TEST_CASE("cuda_emu reduce: sum_squares with n = 0 adds nothing and needs no scratch") {
  CHECK(cuda::sum_squares_scratch_bytes(0) == 0);
  DeviceBuffer<double> acc(std::vector<double>{-0.0});
  cuda::sum_squares(acc.get(), nullptr, 0, 1.0, nullptr, nullptr);
  const double got = acc.to_host()[0];
  CHECK(std::signbit(got));  // untouched, not even -0 + 0
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace
}  // namespace ft::kernels
