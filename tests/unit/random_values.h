// Random inputs for the unit tests of the kernels: the same values for the same seed on every
// machine (std::mt19937 is specified bit for bit; the distribution is libstdc++'s, which every
// build here uses).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace ft::unit_test {

// n values from N(0, scale²).
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace ft::unit_test
