// CUDA AdamW (kernels/cuda/adamw.cu) against the CPU reference (kernels/cpu/adamw.cpp) under
// the emulator's schedule seeds: odd lengths (the tail after the 4-float packs), a misaligned
// pointer (the scalar path), with and without the compute-dtype copy, grad_scale ≠ 1, the
// first step and a late one (t = 10^6, bias corrections ≈ 1), each compute dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/kernel_check.h"

namespace {

using namespace ft::cuda_test;
namespace k = ft::kernels;

template <typename T>
void check_adamw(size_t n, size_t offset, int64_t t, float grad_scale, bool with_copy) {
  INFO(std::string(type_name<T>()) << " n=" << n << " offset=" << offset << " t=" << t
                                   << " grad_scale=" << grad_scale << " copy=" << with_copy);
  const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const uint32_t s = uint32_t(n * 7 + offset);
  const auto p0 = random_values<float>(n, -1.f, 1.f, s);
  const auto g = random_values<float>(n, -2.f, 2.f, s + 1);
  auto m0 = random_values<float>(n, -0.1f, 0.1f, s + 2);
  auto v0 = random_values<float>(n, 0.f, 0.01f, s + 3);
  if (t == 1) std::fill(m0.begin(), m0.end(), 0.f), std::fill(v0.begin(), v0.end(), 0.f);

  std::vector<float> p_ref = p0, m_ref = m0, v_ref = v0;
  std::vector<T> pc_ref(n);
  k::adamw_update(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, lr, beta1, beta2, eps, wd,
                  t, pc_ref.data(), grad_scale);

  const auto out = run_all_seeds([&] {
    DeviceBuf<float> dp(p0, offset), dg(g, offset), dm(m0, offset), dv(v0, offset);
    DeviceBuf<T> dpc(std::vector<T>(n, ft::from_f32<T>(7.f)), offset);
    DeviceBuf<k::AdamwArgs> args(
        std::vector<k::AdamwArgs>{{k::adamw_step(lr, beta1, beta2, eps, wd, t), grad_scale}});
    k::cuda::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), n, args.get(),
                          with_copy ? dpc.get() : static_cast<T*>(nullptr), nullptr);
    return std::vector<std::vector<uint8_t>>{to_bytes(dp.download()), to_bytes(dm.download()),
                                             to_bytes(dv.download()), to_bytes(dpc.download())};
  });
  const auto p = from_bytes<float>(out[0]);
  // m = β1 m + (1 − β1) g cancels when the terms have opposite signs: bounded against their
  // size; a fused multiply-add on the GPU changes the last bit of either term (1e-6 ≈ 8 ulp).
  std::vector<float> m_scale(n), v_scale(n);
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m_scale[i] = std::fabs(beta1 * m0[i]) + std::fabs((1 - beta1) * gi);
    v_scale[i] = beta2 * v0[i] + (1 - beta2) * gi * gi;
  }
  check_close(from_bytes<float>(out[1]), m_ref, 0.f, 1e-6f, m_scale, "m");
  check_close(from_bytes<float>(out[2]), v_ref, 0.f, 1e-6f, v_scale, "v");
  // p = p(1 − lr wd) − step · m / (√v / bc2 + eps): the update is lr-sized against p ~ 1, and
  // m's cancellation error passes into it scaled by step / denominator; 1e-6 of |p| + lr.
  std::vector<float> p_scale(n);
  for (size_t i = 0; i < n; ++i) p_scale[i] = std::fabs(p_ref[i]) + lr;
  check_close(p, p_ref, 0.f, 1e-6f, p_scale, "p");
  const auto pc = from_bytes<T>(out[3]);
  if (with_copy) {
    // The copy is the kernel's own p rounded once: exact against p, one ulp against the CPU.
    std::vector<T> pc_of_p(n);
    for (size_t i = 0; i < n; ++i) pc_of_p[i] = ft::from_f32<T>(p[i]);
    CHECK(same_bits(pc, pc_of_p));
    if constexpr (!std::is_same_v<T, float>) check_within_one_ulp(pc, pc_ref, "p_compute");
  } else {
    CHECK(same_bits(pc, std::vector<T>(n, ft::from_f32<T>(7.f))));  // untouched
  }
}

template <typename T>
void check_adamw_cases() {
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(1003)})
    for (bool copy : {false, true}) {
      check_adamw<T>(n, 0, 1, 1.0f, copy);
      check_adamw<T>(n, 0, 1000000, 0.37f, copy);
    }
  check_adamw<T>(111, 1, 7, 0.37f, true);  // misaligned: the scalar path
  check_adamw<T>(111, 2, 7, 2.5f, true);   // 8-byte aligned: packs need 16
}

}  // namespace

TEST_CASE("cuda_emu adamw: fused update against the CPU, every seed bit-identical") {
  check_adamw_cases<float>();
  check_adamw_cases<bf16>();
  check_adamw_cases<f16>();
}

TEST_CASE("cuda_emu adamw: n = 0 launches nothing") {
  // An empty grid is a launch error; the launcher must return before it.
  CHECK_NOTHROW(k::cuda::adamw_update<bf16>(nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr,
                                            nullptr));
  CHECK(cudaGetLastError() == cudaSuccess);
}
