// Helpers for tests on the CUDA emulation (a test tool): device buffers through the emulated
// runtime API, and the schedule seeds every kernel test runs under.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tests/cuda_emu/cuda_emu.h"

namespace ft::emu::test {

// n elements of device memory (cudaMalloc), optionally filled from the host.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) == cudaSuccess);
    if (n) REQUIRE(cudaMemset(p_, 0, n * sizeof(T)) == cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (n_)
      REQUIRE(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    if (n_)
      REQUIRE(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Sets the schedule seed for a scope, restores the previous one after.
class SeedScope {
 public:
  explicit SeedScope(uint64_t seed) : previous_(ft::emu::seed()) { ft::emu::set_seed(seed); }
  ~SeedScope() { ft::emu::set_seed(previous_); }
  SeedScope(const SeedScope&) = delete;
  SeedScope& operator=(const SeedScope&) = delete;

 private:
  uint64_t previous_;
};

// The seeds a kernel test runs under: the process's seed (FT_CUDA_EMU_SEED; ctest runs the
// binary under two) and one derived from it, so every run compares two schedules.
inline std::vector<uint64_t> test_seeds() {
  const uint64_t base = ft::emu::seed();
  return {base, base * 6364136223846793005ull + 1442695040888963407ull};
}

}  // namespace ft::emu::test
