// CUDA RMSNorm (kernels/cuda/rmsnorm.cu) against the CPU reference (kernels/cpu/rmsnorm.cpp)
// under the emulator's schedule seeds: rows of 1, 19, 111 and whole 16-byte packs, a misaligned
// pointer (the scalar path), more rows than backward blocks (several rows per block), a row
// too wide for the shared-memory dw partials (the global-scratch path), each dtype; dx both
// written and accumulated into (accumulate_dx: the residual gradient the norm's branch adds to).
#include <doctest/doctest.h>

#include <cmath>
#include <utility>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/kernel_check.h"

namespace {

using namespace ft::cuda_test;
namespace k = ft::kernels;

template <typename T>
void check_rmsnorm(int N, int C, size_t offset) {
  INFO(std::string(type_name<T>()) << " N=" << N << " C=" << C << " offset=" << offset);
  const size_t nc = size_t(N) * C;
  const uint32_t s = uint32_t(N * 1000 + C);
  const auto x = random_values<T>(nc, -2.f, 2.f, s);
  const auto w = random_values<T>(size_t(C), 0.5f, 1.5f, s + 1);
  const auto dy = random_values<T>(nc, -1.f, 1.f, s + 2);
  const auto dw0 = random_values<float>(size_t(C), -1.f, 1.f, s + 3);  // dw accumulates
  const auto dx0 = random_values<T>(nc, -1.f, 1.f, s + 4);  // what accumulate_dx adds into
  const float eps = 1e-5f;

  std::vector<T> out_ref(nc), dx_ref(nc), dx_acc_ref = dx0;
  std::vector<float> rstd_ref(N), dw_ref = dw0, dw_acc_ref = dw0;
  k::rmsnorm_forward(out_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, eps);
  k::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(), rstd_ref.data(),
                      N, C);
  k::rmsnorm_backward(dx_acc_ref.data(), dw_acc_ref.data(), dy.data(), x.data(), w.data(),
                      rstd_ref.data(), N, C, /*accumulate_dx=*/true);

  const size_t scratch_floats = k::cuda::rmsnorm_backward_scratch_bytes(N, C) / sizeof(float);
  const auto out = run_all_seeds([&] {
    DeviceBuf<T> dx_in(x, offset), dw_in(w), ddy(dy, offset);
    DeviceBuf<T> dout(std::vector<T>(nc), offset), ddx(std::vector<T>(nc), offset);
    DeviceBuf<float> drstd{std::vector<float>(N)}, ddw(dw0);
    // Filled with NaN: the kernels must write every partial they read.
    DeviceBuf<float> scratch(std::vector<float>(scratch_floats, std::nanf("")));
    k::cuda::rmsnorm_forward(dout.get(), drstd.get(), dx_in.get(), dw_in.get(), N, C, eps, nullptr);
    // Backward from the CPU's rstd, so dx and dw are checked on their own.
    DeviceBuf<float> rstd_in(rstd_ref);
    k::cuda::rmsnorm_backward(ddx.get(), ddw.get(), ddy.get(), dx_in.get(), dw_in.get(),
                              rstd_in.get(), N, C, false, scratch.get(), nullptr);
    DeviceBuf<T> ddx_acc(dx0, offset);
    DeviceBuf<float> ddw_acc(dw0);
    k::cuda::rmsnorm_backward(ddx_acc.get(), ddw_acc.get(), ddy.get(), dx_in.get(), dw_in.get(),
                              rstd_in.get(), N, C, true, scratch.get(), nullptr);
    return std::vector<std::vector<uint8_t>>{
        to_bytes(dout.download()), to_bytes(drstd.download()),   to_bytes(ddx.download()),
        to_bytes(ddw.download()),  to_bytes(ddx_acc.download()), to_bytes(ddw_acc.download())};
  });

  // rstd: Σx² summed in another order (a block tree, not the CPU's running sum). The running
  // sum of C squares carries ~√C · u relative error (a random walk of roundings, u = 2^-24):
  // 2e-7 · √C is ~3√C u, over a floor of 1e-6 (8 u) for the division and square root.
  const float sum_rel = 1e-6f + 2e-7f * std::sqrt(float(C));
  check_close(from_bytes<float>(out[1]), rstd_ref, sum_rel, 0.f, {}, "rstd");
  // out = w · (x · r): r's error plus two roundings.
  check_output(from_bytes<T>(out[0]), out_ref, sum_rel + 1e-6f, 0.f, {}, "out");
  // dx = r w dy − k x cancels: the error is bounded against the terms' size r (|w dy| + |k x|),
  // which the test bounds by r · (|w dy| + |x| · mean |w dy x| r²) ≈ r · (|w dy| + |x|).
  std::vector<float> dx_scale(nc), dw_scale(C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(n) * C + c;
      const float xv = ft::to_f32(x[i]), dyv = ft::to_f32(dy[i]);
      dx_scale[i] = rstd_ref[n] * (std::fabs(ft::to_f32(w[c]) * dyv) + std::fabs(xv));
      dw_scale[c] += std::fabs(dyv * xv * rstd_ref[n]);
    }
  // The dot Σ w dy x is another sum of C terms: the same √C allowance.
  check_output(from_bytes<T>(out[2]), dx_ref, 0.f, sum_rel + 1e-6f, dx_scale, "dx");
  // dw: N terms summed per block and then across blocks instead of row by row: the error of a
  // sum of mixed signs is ~√N u · Σ|terms| (the term sizes, plus the initial dw).
  for (int c = 0; c < C; ++c) dw_scale[c] += std::fabs(dw0[c]);
  const float rows_rel = 1e-6f + 2e-7f * std::sqrt(float(N));
  check_close(from_bytes<float>(out[3]), dw_ref, 0.f, rows_rel, dw_scale, "dw");

  // dx += : the dx bound above plus the sum's own rounding on each side (fp32: 1e-6 relative,
  // a few units roundoff; 16-bit: the one ulp check_output allows).
  check_output(from_bytes<T>(out[4]), dx_acc_ref, 1e-6f, sum_rel + 1e-6f, dx_scale, "dx +=");
  CHECK(out[5] == out[3]);  // dw: the same sums whether dx is written or accumulated
}

template <typename T>
void check_rmsnorm_shapes() {
  // Rows 1, 19, 111 each with an odd width and with whole packs (64): 1 and 19 columns leave
  // most of a warp idle, 111 fills four warps with a ragged end.
  for (auto [N, C] : {std::pair{1, 1}, {1, 64}, {19, 19}, {19, 64}, {111, 111}, {111, 64}})
    check_rmsnorm<T>(N, C, 0);
  check_rmsnorm<T>(19, 64, 1);   // whole packs, but misaligned: the scalar path
  check_rmsnorm<T>(600, 24, 0);  // more rows than backward blocks
  check_rmsnorm<T>(3, 8200, 0);  // dw partials too wide for shared memory
}

}  // namespace

TEST_CASE("cuda_emu rmsnorm: forward and backward against the CPU, every seed bit-identical") {
  check_rmsnorm_shapes<float>();
  check_rmsnorm_shapes<bf16>();
  check_rmsnorm_shapes<f16>();
}

TEST_CASE("cuda_emu rmsnorm: no rows or no columns launch nothing") {
  // An empty grid is a launch error; the launchers must return before it.
  CHECK(k::cuda::rmsnorm_backward_scratch_bytes(0, 64) == 0);
  CHECK_NOTHROW(
      k::cuda::rmsnorm_forward<bf16>(nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, nullptr));
  CHECK_NOTHROW(k::cuda::rmsnorm_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                nullptr, 0, 64, true, nullptr, nullptr));
  CHECK_NOTHROW(
      k::cuda::rmsnorm_forward<float>(nullptr, nullptr, nullptr, nullptr, 3, 0, 1e-5f, nullptr));
  CHECK(cudaGetLastError() == cudaSuccess);
}
