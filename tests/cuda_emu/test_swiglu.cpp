// CUDA swiglu (kernels/cuda/swiglu.cu) against the CPU reference (kernels/cpu/swiglu.cpp) under
// the emulator's schedule seeds: odd sizes (the scalar tail after the 16-byte packs), a
// misaligned pointer (the scalar path), each dtype.
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/kernel_check.h"

namespace {

using namespace ft::cuda_test;
namespace k = ft::kernels;

template <typename T>
void check_swiglu(size_t n, size_t offset) {
  INFO(std::string(type_name<T>()) << " n=" << n << " offset=" << offset);
  // g in [-8, 8]: both saturated ends of the sigmoid and the cancellation in
  // 1 + g(1 − s) near g ≈ −1.28.
  const auto g = random_values<T>(n, -8.f, 8.f, 1 + uint32_t(n));
  const auto u = random_values<T>(n, -2.f, 2.f, 2 + uint32_t(n));
  const auto dh = random_values<T>(n, -2.f, 2.f, 3 + uint32_t(n));
  std::vector<T> h_ref(n), dg_ref(n), du_ref(n);
  k::swiglu_forward(h_ref.data(), g.data(), u.data(), n);
  k::swiglu_backward(dg_ref.data(), du_ref.data(), dh.data(), g.data(), u.data(), n);

  const auto out = run_all_seeds([&] {
    DeviceBuf<T> dg_(g, offset), du_(u, offset), ddh(dh, offset);
    DeviceBuf<T> dout(std::vector<T>(n), offset), dgo(std::vector<T>(n), offset),
        duo(std::vector<T>(n), offset);
    k::cuda::swiglu_forward(dout.get(), dg_.get(), du_.get(), n, nullptr);
    k::cuda::swiglu_backward(dgo.get(), duo.get(), ddh.get(), dg_.get(), du_.get(), n, nullptr);
    return std::vector<std::vector<uint8_t>>{to_bytes(dout.download()), to_bytes(dgo.download()),
                                             to_bytes(duo.download())};
  });
  // fp32: the device's expf is within 2 ulp of the CPU's and nvcc may fuse multiply-adds, a few
  // ulp on the product (rel 1e-6 ≈ 8 ulp); dg's factor 1 + g(1 − s) cancels near g ≈ −1.28, so
  // its error is bounded against |dh · u| (the size of the terms), not the small result.
  std::vector<float> dg_scale(n);
  for (size_t i = 0; i < n; ++i) dg_scale[i] = std::fabs(ft::to_f32(dh[i]) * ft::to_f32(u[i]));
  check_output(from_bytes<T>(out[0]), h_ref, 1e-6f, 0.f, {}, "h");
  check_output(from_bytes<T>(out[1]), dg_ref, 1e-6f, 1e-6f, dg_scale, "dg");
  check_output(from_bytes<T>(out[2]), du_ref, 1e-6f, 0.f, {}, "du");
}

template <typename T>
void check_swiglu_sizes() {
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(1003), size_t(4096)})
    for (size_t offset : {size_t(0), size_t(1)}) check_swiglu<T>(n, offset);
}

}  // namespace

TEST_CASE("cuda_emu swiglu: forward and backward against the CPU, every seed bit-identical") {
  check_swiglu_sizes<float>();
  check_swiglu_sizes<bf16>();
  check_swiglu_sizes<f16>();
}

TEST_CASE("cuda_emu swiglu: n = 0 launches nothing") {
  // An empty grid is a launch error; the launchers must return before it.
  CHECK_NOTHROW(k::cuda::swiglu_forward<f16>(nullptr, nullptr, nullptr, 0, nullptr));
  CHECK_NOTHROW(
      k::cuda::swiglu_backward<f16>(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr));
  CHECK(cudaGetLastError() == cudaSuccess);
}
