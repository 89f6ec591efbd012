// Helpers of the CUDA kernel tests (tests/cuda_emu/test_<op>.cpp): device buffers through the
// CUDA runtime API (the emulator's on the CPU, the real one on a GPU), inputs rounded to the
// element type so the CPU reference and the CUDA kernel read the same values, closeness checks,
// and runs under several emulator schedule seeds that must give the same bits.
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

#include "kernels/half.h"

#if defined(FT_CUDA_EMU)
#include "tests/cuda_emu/cuda_emu.h"
#endif

namespace ft::cuda_test {

using ft::kernels::bf16;
using ft::kernels::f16;

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "f16";
}

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(e));
}

// A device copy of a host vector; download() brings it back. `offset` elements of slack in
// front let a test hand the kernel a pointer that is not 16-byte aligned (the scalar paths).
template <typename T>
class DeviceBuf {
 public:
  explicit DeviceBuf(const std::vector<T>& host, size_t offset = 0) : n_(host.size()) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&base_), sizeof(T) * (n_ + offset + 1)),
            "cudaMalloc");
    ptr_ = base_ + offset;
    upload(host);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  ~DeviceBuf() { cudaFree(base_); }
  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ > 0)
      cuda_ok(cudaMemcpy(ptr_, host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    cuda_ok(cudaDeviceSynchronize(), "kernel");
    std::vector<T> out(n_);
    if (n_ > 0)
      cuda_ok(cudaMemcpy(out.data(), ptr_, sizeof(T) * n_, cudaMemcpyDeviceToHost), "download");
    return out;
  }

 private:
  T* base_ = nullptr;
  T* ptr_ = nullptr;
  size_t n_;
};

// n values uniform in [lo, hi), rounded to T (the values both sides then read exactly).
template <typename T>
std::vector<T> random_values(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = ft::kernels::from_f32<T>(dist(gen));
  return v;
}

template <typename T>
std::vector<float> as_f32(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ft::kernels::to_f32(v[i]);
  return out;
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
  INFO(what << ": worst at " << at << ", got " << ft::kernels::to_f32(got[at]) << ", want "
            << ft::kernels::to_f32(want[at]));
  CHECK(worst <= 1);
}

// fp32 outputs: |got − want| ≤ rel · |want| + abs · scale[i] (scale: the size of the terms
// that produced want[i], for values that arise from cancellation; empty: 1).
inline void check_close(const std::vector<float>& got, const std::vector<float>& want,
                        float rel, float abs, const std::vector<float>& scale,
                        const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double s = scale.empty() ? 1.0 : double(scale[i]);
    const double bound = double(rel) * std::fabs(double(want[i])) + double(abs) * s;
    const double excess = std::fabs(double(got[i]) - double(want[i])) / (bound > 0 ? bound : 1e-30);
    if (!(excess <= worst)) worst = excess, at = i;  // NaN counts as worst
  }
  INFO(what << ": worst at " << at << ", got " << got[at] << ", want " << want[at]
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
  return double(ft::kernels::to_f32(next)) - double(ft::kernels::to_f32(mag));
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
      const double g = ft::kernels::to_f32(got[i]), w = ft::kernels::to_f32(want[i]);
      const double s = scale.empty() ? 1.0 : double(scale[i]);
      const double bound = double(abs) * s + ulp_of(want[i]);
      if (std::fabs(g - w) <= bound) continue;
      if (bad++ == 0) at = i;
    }
    INFO(what << ": " << bad << " beyond the bound, first at " << at << ", got "
              << ft::kernels::to_f32(got[at]) << ", want " << ft::kernels::to_f32(want[at]));
    CHECK(bad == 0);
  }
}

// The schedule seeds each CUDA kernel runs under. Seed 0 is the emulator's in-order schedule;
// 1 and 2 shuffle the order of threads and blocks. On a GPU the "seeds" are plain reruns.
inline const std::vector<uint64_t>& schedule_seeds() {
  static const std::vector<uint64_t> seeds = {0, 1, 2};
  return seeds;
}

inline void set_schedule_seed(uint64_t seed) {
#if defined(FT_CUDA_EMU)
  ft::emu::set_seed(seed);
#else
  (void)seed;
#endif
}

// Runs `run` (which launches the kernel on fresh inputs and returns its outputs, as bytes)
// under every schedule seed; returns the first run's outputs and checks every other run gave
// the same bits (determinism: no result may depend on the order threads run in).
inline std::vector<std::vector<uint8_t>> run_all_seeds(
    const std::function<std::vector<std::vector<uint8_t>>()>& run) {
  std::vector<std::vector<uint8_t>> first;
  for (uint64_t seed : schedule_seeds()) {
    set_schedule_seed(seed);
    std::vector<std::vector<uint8_t>> out = run();
    if (first.empty()) {
      first = std::move(out);
      continue;
    }
    INFO("schedule seed " << seed << " against seed " << schedule_seeds()[0]);
    REQUIRE(out.size() == first.size());
    for (size_t i = 0; i < out.size(); ++i) {
      INFO("output " << i);
      CHECK(out[i] == first[i]);
    }
  }
  set_schedule_seed(0);
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
