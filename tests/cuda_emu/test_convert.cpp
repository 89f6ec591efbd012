// kernels/cuda/convert.cu on the CUDA emulation (a test tool) against the CPU kernels
// (kernels/cpu/convert.cpp): the same bits for every input, NaN payloads, infinities and
// subnormals included, under two schedule seeds. Conversions are exact functions of their input,
// so there is no tolerance: any differing bit fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
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

const size_t kSizes[] = {0, 1, 19, 111, 65536 + 7, 300007};

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T>
std::vector<uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
  return b;
}
std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), 4 * v.size());
  return b;
}

// fp32 inputs: the awkward values first (so every size but 0 meets some), then random bit
// patterns (every exponent, NaNs included) and random values near f16's range.
std::vector<float> float_inputs(size_t n) {
  const uint32_t special[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,   // ±0, ±inf
      0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu,   // NaNs: quiet, signalling, payloads
      0x7f812345u, 0xff9fe001u, 0x00000001u, 0x807fffffu,   // fp32 subnormals
      0x7f7fffffu, 0x477fe000u, 0x477ff000u, 0x477fefffu,   // max float; f16 max, 65520, below
      0x33000000u, 0x33000001u, 0x32ffffffu, 0x33800000u,   // 2^-25, 2^-24: f16 subnormals
      0x387fc000u, 0x387fe000u, 0x38800000u, 0x387ff000u,   // f16's subnormal/normal boundary
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,   // bf16 ties to even and around them
      0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u,   // f16 ties to even and around them
      0x7f7f8000u, 0x7f7f7fffu, 0xc0490fdbu, 0x3eaaaaabu};  // bf16 overflow tie; -pi; 1/3
  std::vector<float> v;
  v.reserve(n);
  for (uint32_t u : special)
    if (v.size() < n) v.push_back(from_bits(u));
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  while (v.size() < n) {
    const uint32_t u = rng();
    const float scaled = near(rng) * from_bits(0x3f800000u + (u & 0x007fffffu));
    v.push_back(v.size() % 2 ? from_bits(u) : scaled);
  }
  return v;
}

// 16-bit inputs: every bit pattern, in order, repeated up to n.
template <typename T>
std::vector<T> all_patterns(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i].bits = uint16_t(i * 40503u + (i >> 16));  // a permutation
  return v;
}

template <typename T>
void check_narrowing() {
  for (size_t n : kSizes) {
    CAPTURE(n);
    const std::vector<float> x = float_inputs(n);
    std::vector<T> want(n);
    convert(want.data(), x.data(), n);
    for (uint64_t seed : test_seeds()) {
      CAPTURE(seed);
      SeedScope scope(seed);
      DeviceBuffer<float> dx(x);
      DeviceBuffer<T> dy(n);
      cuda::convert(dy.get(), dx.get(), n, nullptr);
      const std::vector<T> got = dy.to_host();
      const std::vector<uint16_t> gb = bits_of(got), wb = bits_of(want);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        if (gb[i] != wb[i] && bad++ < 5) {
          uint32_t u;
          std::memcpy(&u, &x[i], 4);
          char msg[96];
          std::snprintf(msg, sizeof msg, "input 0x%08x: got 0x%04x, want 0x%04x", unsigned(u),
                        unsigned(gb[i]), unsigned(wb[i]));
          FAIL_CHECK(msg);
        }
      }
      CHECK(bad == 0);
    }
  }
}

template <typename T>
void check_widening() {
  for (size_t n : kSizes) {
    CAPTURE(n);
    const std::vector<T> x = all_patterns<T>(n);
    std::vector<float> want(n);
    convert(want.data(), x.data(), n);
    for (uint64_t seed : test_seeds()) {
      CAPTURE(seed);
      SeedScope scope(seed);
      DeviceBuffer<T> dx(x);
      DeviceBuffer<float> dy(n);
      cuda::convert(dy.get(), dx.get(), n, nullptr);
      CHECK(bits_of(dy.to_host()) == bits_of(want));
    }
  }
}

TEST_CASE("cuda_emu convert: fp32 -> bf16 has the CPU's bits") { check_narrowing<bf16>(); }
TEST_CASE("cuda_emu convert: fp32 -> f16 has the CPU's bits") { check_narrowing<f16>(); }
TEST_CASE("cuda_emu convert: bf16 -> fp32, every pattern") { check_widening<bf16>(); }
TEST_CASE("cuda_emu convert: f16 -> fp32, every pattern") { check_widening<f16>(); }

TEST_CASE("cuda_emu convert: the inputs cover every 16-bit pattern and the awkward floats") {
  // Guards the test itself: all_patterns must be a permutation on the first 65536 indices.
  std::vector<bool> seen(65536, false);
  for (const bf16& b : all_patterns<bf16>(65536)) seen[b.bits] = true;
  CHECK(std::count(seen.begin(), seen.end(), true) == 65536);
  // Both roundings and both overflows occur among the fp32 inputs.
  const std::vector<float> x = float_inputs(64);
  CHECK(to_f16(x[14]).bits == 0x7c00u);   // 65520 rounds to inf
  CHECK(to_f16(x[13]).bits == 0x7bffu);   // f16 max
  CHECK(to_bf16(x[32]).bits == 0x7f80u);  // bf16 overflow tie rounds to inf
}

TEST_CASE("cuda_emu convert: fp32 -> fp32 is a copy") {
  for (size_t n : kSizes) {
    const std::vector<float> x = float_inputs(n);
    DeviceBuffer<float> dx(x), dy(n);
    cuda::convert(dy.get(), dx.get(), n, nullptr);
    CHECK(bits_of(dy.to_host()) == bits_of(x));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace
}  // namespace ft::kernels
