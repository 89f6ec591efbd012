// CUDA RoPE (kernels/cuda/rope.cu) against the CPU reference (kernels/cpu/rope.cpp) under the
// emulator's schedule seeds: sequence lengths 1, 19, 111, several heads, head sizes from 2 up,
// Llama's frequencies and large angles (up to ~1e5 radians, where the range reduction of sin
// and cos matters), forward then backward (the inverse rotation), each dtype; and with per-token
// positions (packed samples: positions restart where a sample starts).
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/kernel_check.h"

namespace {

using namespace ft::cuda_test;
namespace k = ft::kernels;

template <typename T>
void check_rope(int B, int T_, int nh, int D, float freq_scale, bool with_pos = false) {
  INFO(std::string(type_name<T>()) << " B=" << B << " T=" << T_ << " nh=" << nh << " D=" << D
                                   << " freq_scale=" << freq_scale << " positions=" << with_pos);
  // Positions restarting every 5 + b tokens in row b, when asked for.
  std::vector<int32_t> pos;
  if (with_pos)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T_; ++t) pos.push_back(t % (5 + b));
  const int32_t* host_pos = with_pos ? pos.data() : nullptr;
  const int half = D / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = freq_scale * float(std::pow(10000.0, -2.0 * i / D));
  const size_t n = size_t(B) * T_ * nh * D;
  const auto x = random_values<T>(n, -2.f, 2.f, uint32_t(T_ * 100 + nh * 10 + D));
  std::vector<T> fwd_ref = x, bwd_ref = x;
  k::rope_forward(fwd_ref.data(), inv_freq.data(), B, T_, nh, D, host_pos);
  k::rope_backward(bwd_ref.data(), inv_freq.data(), B, T_, nh, D, host_pos);

  const auto out = run_all_seeds([&] {
    DeviceBuf<float> dfreq(inv_freq);
    DeviceBuf<T> fwd(x), bwd(x);
    DeviceBuf<int32_t> dpos(with_pos ? pos : std::vector<int32_t>{0});
    const int32_t* device_pos = with_pos ? dpos.get() : nullptr;
    k::cuda::rope_forward(fwd.get(), dfreq.get(), B, T_, nh, D, nullptr, device_pos);
    k::cuda::rope_backward(bwd.get(), dfreq.get(), B, T_, nh, D, nullptr, device_pos);
    return std::vector<std::vector<uint8_t>>{to_bytes(fwd.download()), to_bytes(bwd.download())};
  });
  // fp32: cos and sin agree with the CPU's to about one rounding (the kernel evaluates them in
  // double), and x1 c − x2 s can cancel, so the error is bounded against |x1| + |x2| of the
  // pair: 1e-6 of it is ~8 ulp of the larger term (a fused multiply-add on the GPU moves one).
  std::vector<float> scale(n);
  for (size_t h = 0; h < n / D; ++h)
    for (int i = 0; i < half; ++i) {
      const float m =
          std::fabs(ft::to_f32(x[h * D + i])) + std::fabs(ft::to_f32(x[h * D + i + half]));
      scale[h * D + i] = scale[h * D + i + half] = m;
    }
  check_output(from_bytes<T>(out[0]), fwd_ref, 0.f, 1e-6f, scale, "forward");
  check_output(from_bytes<T>(out[1]), bwd_ref, 0.f, 1e-6f, scale, "backward");
}

template <typename T>
void check_rope_shapes() {
  // Sequence lengths 1, 19, 111 with one and several heads, head sizes 2 (one pair), 6 (pairs
  // that do not fill a warp) and 64.
  const int shapes[][3] = {{1, 1, 2},   {1, 3, 64},  {19, 3, 6},
                           {19, 1, 64}, {111, 3, 2}, {111, 2, 64}};
  for (const auto& s : shapes) check_rope<T>(2, s[0], s[1], s[2], 1.0f);
  check_rope<T>(1, 111, 2, 128, 1.0f);
  // inv_freq up to 1000: angles up to 1.1e5 radians, many turns of range reduction.
  check_rope<T>(1, 111, 1, 16, 1000.0f);
  check_rope<T>(2, 19, 3, 64, 1.0f, /*with_pos=*/true);
}

}  // namespace

TEST_CASE("cuda_emu rope: forward and backward against the CPU, every seed bit-identical") {
  check_rope_shapes<float>();
  check_rope_shapes<bf16>();
  check_rope_shapes<f16>();
}

TEST_CASE("cuda_emu rope: no tokens launch nothing") {
  // An empty grid is a launch error; the launchers must return before it.
  CHECK_NOTHROW(k::cuda::rope_forward<bf16>(nullptr, nullptr, 0, 19, 2, 64, nullptr));
  CHECK_NOTHROW(k::cuda::rope_backward<bf16>(nullptr, nullptr, 2, 0, 2, 64, nullptr));
  CHECK(cudaGetLastError() == cudaSuccess);
}
