// Helpers for the CUDA kernel tests: device buffers through the CUDA runtime API, and the
// schedule seeds every test runs under. On the CUDA emulation (a test tool, FT_CUDA_EMU) the
// seed changes the order threads run in; built against the real runtime (a GPU check), the same
// tests run the kernels natively and SeedScope does nothing, and test_seeds() still gives two
// runs whose bits must agree.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#if defined(FT_CUDA_EMU)
#include "tests/cuda_emu/cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif

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

#if defined(FT_CUDA_EMU)
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
#else
class SeedScope {  // a GPU's schedule is its own
 public:
  explicit SeedScope(uint64_t) {}
};
inline std::vector<uint64_t> test_seeds() { return {0, 1}; }
#endif

}  // namespace ft::emu::test
