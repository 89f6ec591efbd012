// Helpers of the CUDA kernel tests of rmsnorm, swiglu, embedding, rope, adamw and cross_entropy
// (tests/cuda_emu/test_<op>.cpp), on top of emu_test_util.h: device buffers at a chosen
// misalignment, inputs rounded to the element type so the CPU reference and the CUDA kernel read
// the same values, closeness checks with per-op bounds, and runs under two schedule seeds that
// must give the same bits.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "tests/cuda_emu/emu_test_util.h"

namespace ft::cuda_test {

using ft::bf16;
using ft::f16;

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>)
    return "float";
  else if constexpr (std::is_same_v<T, bf16>)
    return "bf16";
  else
    return "f16";
}

// A device copy of a host vector (emu_test_util.h's DeviceBuffer) with `offset` elements of
// slack in front, so a test can hand the kernel a pointer that is not 16-byte aligned (the
// scalar paths); download() waits for the kernels and brings it back.
template <typename T>
class DeviceBuf {
 public:
  explicit DeviceBuf(const std::vector<T>& host, size_t offset = 0)
      : buf_(host.size() + offset), offset_(offset), n_(host.size()) {
    upload(host);
  }
  T* get() const { return buf_.get() + offset_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ > 0)
      REQUIRE(cudaMemcpy(get(), host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice) ==
              cudaSuccess);
  }
  std::vector<T> download() const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<T> out(n_);
    if (n_ > 0)
      REQUIRE(cudaMemcpy(out.data(), get(), sizeof(T) * n_, cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }

 private:
  ft::emu::test::DeviceBuffer<T> buf_;
  size_t offset_, n_;
};

// n values uniform in [lo, hi), rounded to T (the values both sides then read exactly).
template <typename T>
std::vector<T> random_values(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = ft::from_f32<T>(dist(gen));
  return v;
}

template <typename T>
uint32_t bits_of(T x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0);
}

// Distance in units in the last place of a 16-bit type: the number of representable values
// between a and b (signed-magnitude bits mapped to a monotonic integer line).
template <typename T>
int ulps_apart(T a, T b) {
  static_assert(sizeof(T) == 2);
  auto line = [](uint32_t bits) { return (bits & 0x8000u) ? -int(bits & 0x7fffu) : int(bits); };
  return std::abs(line(bits_of(a)) - line(bits_of(b)));
}

// 16-bit outputs: the kernels' contract is fp32 math rounded once on store, and the CUDA
// kernel's fp32 value may differ from the CPU's in its last bits (another summation order,
// FMA contraction, the device's expf), which can move the rounding by one step at most.
template <typename T>
void check_within_one_ulp(const std::vector<T>& got, const std::vector<T>& want,
                          const std::string& what) {
  REQUIRE(got.size() == want.size());
  int worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int d = ulps_apart(got[i], want[i]);
    if (d > worst) worst = d, at = i;
  }
  INFO(what << ": worst at " << at << ", got " << ft::to_f32(got[at]) << ", want "
            << ft::to_f32(want[at]));
  CHECK(worst <= 1);
}

// |got − want| ≤ rel · |want| + abs · scale[i] (scale: the size of the terms that produced
// want[i], for values that arise from cancellation; empty: 1). For fp32 outputs; for 16-bit ones
// where a test bounds them relative to the value rather than in ulps (check_output).
template <typename T>
void check_close(const std::vector<T>& got, const std::vector<T>& want, double rel, double abs,
                 const std::vector<float>& scale, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  size_t at = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = ft::to_f32(got[i]), w = ft::to_f32(want[i]);
    const double s = scale.empty() ? 1.0 : double(scale[i]);
    const double bound = rel * std::fabs(w) + abs * s;
    const double excess = std::fabs(g - w) / (bound > 0 ? bound : 1e-30);
    if (!(excess <= 1.0)) ++bad;
    if (!(excess <= worst)) worst = excess, at = i;  // NaN counts as worst
  }
  if (got.empty()) return;
  INFO(what << ": " << bad << " of " << got.size() << " beyond the bound; worst at " << at
            << ", got " << ft::to_f32(got[at]) << ", want " << ft::to_f32(want[at])
            << " (error / bound = " << worst << ")");
  CHECK(worst <= 1.0);
}

// The spacing of T's values at |x| (the ulp): the gap to the next value away from zero.
template <typename T>
double ulp_of(T x) {
  T next;
  const uint32_t b = bits_of(x) & 0x7fffu;  // |x|
  const uint16_t nb = uint16_t(b + 1);
  std::memcpy(&next, &nb, 2);
  T mag;
  const uint16_t mb = uint16_t(b);
  std::memcpy(&mag, &mb, 2);
  return double(ft::to_f32(next)) - double(ft::to_f32(mag));
}

// Outputs in T against the CPU's: fp32 with check_close's bound. 16-bit within one ulp, or,
// where the fp32 value comes from cancellation (abs · scale > 0), within that fp32 bound plus
// one ulp of T (each side's fp32 value is off by up to the bound, then rounded once).
template <typename T>
void check_output(const std::vector<T>& got, const std::vector<T>& want, float rel, float abs,
                  const std::vector<float>& scale, const std::string& what) {
  if constexpr (std::is_same_v<T, float>) {
    check_close(got, want, rel, abs, scale, what);
  } else {
    REQUIRE(got.size() == want.size());
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (ulps_apart(got[i], want[i]) <= 1) continue;
      const double g = ft::to_f32(got[i]), w = ft::to_f32(want[i]);
      const double s = scale.empty() ? 1.0 : double(scale[i]);
      const double bound = double(abs) * s + ulp_of(want[i]);
      if (std::fabs(g - w) <= bound) continue;
      if (bad++ == 0) at = i;
    }
    INFO(what << ": " << bad << " beyond the bound, first at " << at << ", got "
              << ft::to_f32(got[at]) << ", want " << ft::to_f32(want[at]));
    CHECK(bad == 0);
  }
}

// Runs `run` (which launches the kernels on fresh inputs and returns their outputs, as bytes)
// under each of emu_test_util.h's test_seeds() (two schedules per process; ctest runs the binary
// under two FT_CUDA_EMU_SEED values); returns the first run's outputs and checks the other run
// gave the same bits (determinism: no result may depend on the order threads run in).
inline std::vector<std::vector<uint8_t>> run_all_seeds(
    const std::function<std::vector<std::vector<uint8_t>>()>& run) {
  std::vector<std::vector<uint8_t>> first;
  const std::vector<uint64_t> seeds = ft::emu::test::test_seeds();
  for (uint64_t seed : seeds) {
    std::vector<std::vector<uint8_t>> out;
    {
      ft::emu::test::SeedScope scope(seed);
      out = run();
    }
    if (first.empty()) {
      first = std::move(out);
      continue;
    }
    INFO("schedule seed " << seed << " against seed " << seeds[0]);
    REQUIRE(out.size() == first.size());
    for (size_t i = 0; i < out.size(); ++i) {
      INFO("output " << i);
      CHECK(out[i] == first[i]);
    }
  }
  return first;
}

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(sizeof(T) * v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <typename T>
std::vector<T> from_bytes(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

}  // namespace ft::cuda_test
