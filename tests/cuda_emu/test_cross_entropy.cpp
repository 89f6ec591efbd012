// kernels/cuda/cross_entropy.cu, run by the CUDA emulator (a test tool: every CUDA thread a fiber
// on the CPU; nothing here says anything about GPU speed), against the CPU kernels of
// kernels/cpu/cross_entropy.cpp: vocabularies of 1, 19, 111 and 1000 columns (below, at and
// across the 256 threads of a row), rows with the mask off, fp32, bf16 and f16, dlogits separate
// from and aliasing the logits, and the vocabulary-parallel pieces over two uneven shards. Each
// dtype's inputs are rounded to it once, so both sides read the same values. The CUDA side runs
// under two schedule seeds and must give the same bits under both.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/kernel_check.h"

namespace k = ft::kernels;
namespace cu = ft::kernels::cuda;

namespace {

using ft::cuda_test::check_close;
using ft::cuda_test::same_bits;
using ft::emu::test::DeviceBuffer;
using ft::emu::test::SeedScope;

template <typename E>
std::vector<E> random_logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);  // a peaked softmax, as a trained model's
  std::vector<E> v(n);
  for (auto& x : v) x = ft::from_f32<E>(d(g));
  return v;
}

// dlogits tolerances (rtol, atol). fp32: exp(x − max)·scale/Σ on both sides; Σ runs in another
// order (and in fp32 per thread here, double on the CPU): a few ulp (1e-6 is ~8; the largest
// error seen was 1/6 of it). bf16 / f16: those fp32 values rounded once, so one ulp of the type
// (up to 2^-7 and 2^-10 of the value, twice that just below a power of two). atol: a row's
// gradient is at most scale (≥ 1/7) in magnitude; below 1e-9 nothing matters.
template <typename E>
constexpr double kRtol = std::is_same_v<E, float>      ? 1e-6
                         : std::is_same_v<E, ft::bf16> ? 2.0 / 128
                                                       : 2.0 / 1024;
constexpr double kAtol = 1e-9;

// The summed loss: fp32 statistics per row, double sums; 1e-6 relative is ~10 fp32 ulp of a
// row's logsumexp, far above the differences in summation order.
void expect_loss(const std::string& what, double got, double want) {
  INFO(what << ": loss " << got << " want " << want);
  CHECK(std::fabs(got - want) <= 1e-6 * std::max(1.0, std::fabs(want)));
}

struct Rows {
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;
};

// Targets anywhere in [0, V); every third row masked off (N = 1: the one row is on).
Rows make_rows(int N, int V, uint32_t seed) {
  std::mt19937 g(seed);
  Rows r;
  for (int n = 0; n < N; ++n) {
    r.targets.push_back(int32_t(g() % uint32_t(V)));
    r.mask.push_back(n % 3 != 1);
  }
  return r;
}

// The loss accumulator on the device: starts at `start`, read back after the kernels.
double device_loss(double start, const std::function<void(double*)>& launch) {
  DeviceBuffer<double> acc(std::vector<double>{start});
  launch(acc.get());
  return acc.to_host()[0];
}

template <typename E>
void check_whole_row(int N, int V) {
  const std::string where = "N=" + std::to_string(N) + " V=" + std::to_string(V) + " ";
  const auto logits = random_logits<E>(size_t(N) * V, uint32_t(N * 7919 + V));
  const Rows rows = make_rows(N, V, uint32_t(V));
  const float scale = 1.0f / 7.0f;
  std::vector<E> dref(logits.size());
  const double loss_ref = k::cross_entropy_forward_backward<E>(
      dref.data(), logits.data(), rows.targets.data(), rows.mask.data(), N, V, scale);

  const DeviceBuffer<E> logits_d(logits);
  const DeviceBuffer<int32_t> targets_d(rows.targets);
  const DeviceBuffer<uint8_t> mask_d(rows.mask);
  const DeviceBuffer<float> scale_d(std::vector<float>{scale});  // read by the kernels
  DeviceBuffer<unsigned char> scratch_d(cu::cross_entropy_scratch_bytes(N, V));
  const std::vector<uint64_t> seeds = ft::emu::test::test_seeds();
  std::vector<E> dl[2];
  for (int s = 0; s < 2; ++s) {
    SeedScope scope(seeds[s]);
    // Separate dlogits, NaN bits first (masked rows must be zeroed); the loss adds onto 0.5.
    DeviceBuffer<E> d(logits.size());
    REQUIRE(cudaMemset(d.get(), 0xff, sizeof(E) * d.size()) == cudaSuccess);
    const double loss = device_loss(0.5, [&](double* acc) {
      cu::cross_entropy<E>(d.get(), logits_d.get(), targets_d.get(), mask_d.get(), N, V,
                           scale_d.get(), acc, scratch_d.get(), nullptr);
    });
    expect_loss(where + "loss", loss - 0.5, loss_ref);
    dl[s] = d.to_host();
    check_close(dl[s], dref, kRtol<E>, kAtol, {}, where + "dlogits");
    // dlogits aliasing the logits (how the model calls it): the same result.
    DeviceBuffer<E> inplace(logits);
    const double loss2 = device_loss(0.0, [&](double* acc) {
      cu::cross_entropy<E>(inplace.get(), inplace.get(), targets_d.get(), mask_d.get(), N, V,
                           scale_d.get(), acc, scratch_d.get(), nullptr);
    });
    CHECK_MESSAGE(loss2 + 0.5 == loss, where << "in place: loss " << loss2);
    CHECK_MESSAGE(same_bits(inplace.to_host(), dl[s]), where << "in place: other dlogits");
  }
  CHECK_MESSAGE(same_bits(dl[0], dl[1]), where << "dlogits differ between schedule seeds");

  // Loss only (dlogits null, no scale), as eval calls it.
  const double loss = device_loss(0.0, [&](double* acc) {
    cu::cross_entropy<E>(nullptr, logits_d.get(), targets_d.get(), mask_d.get(), N, V, nullptr, acc,
                         scratch_d.get(), nullptr);
  });
  expect_loss(where + "loss without dlogits", loss, loss_ref);
}

// The vocabulary-parallel pieces on two shards [0, V0) and [V0, V) of each row, with the host
// doing the all-reduces (max of row_max, sums of sumexp and target_logit): each piece against
// the CPU's on the same inputs, and the assembled loss against the whole-row kernel.
template <typename E>
void check_vocab_parallel(int N, int V) {
  const std::string where = "N=" + std::to_string(N) + " V=" + std::to_string(V) + " parallel ";
  const int V0 = V / 3, Vs[2] = {V0, V - V0}, begin[2] = {0, V0};
  const auto logits = random_logits<E>(size_t(N) * V, uint32_t(N * 31 + V));
  const Rows rows = make_rows(N, V, uint32_t(V + 1));
  const float scale = 0.25f;
  std::vector<E> shard[2];  // (N, Vs[i]) each
  for (int i = 0; i < 2; ++i)
    for (int n = 0; n < N; ++n)
      shard[i].insert(shard[i].end(), logits.begin() + size_t(n) * V + begin[i],
                      logits.begin() + size_t(n) * V + begin[i] + Vs[i]);
  std::vector<E> whole_d(logits.size());
  const double whole_loss = k::cross_entropy_forward_backward<E>(
      whole_d.data(), logits.data(), rows.targets.data(), rows.mask.data(), N, V, scale);

  const DeviceBuffer<int32_t> targets_d(rows.targets);
  const DeviceBuffer<uint8_t> mask_d(rows.mask);
  const DeviceBuffer<float> scale_d(std::vector<float>{scale});  // read by the kernels
  DeviceBuffer<unsigned char> scratch_d(cu::cross_entropy_scratch_bytes(N, V));
  const std::vector<uint64_t> seeds = ft::emu::test::test_seeds();
  std::vector<E> d_shard0[2];
  for (int s = 0; s < 2; ++s) {
    SeedScope scope(seeds[s]);
    std::vector<float> rmax(N, -INFINITY);
    for (int i = 0; i < 2; ++i) {
      const DeviceBuffer<E> x(shard[i]);
      DeviceBuffer<float> m(N);
      cu::row_max<E>(m.get(), x.get(), N, Vs[i], nullptr);
      std::vector<float> mref(N);
      k::row_max<E>(mref.data(), shard[i].data(), N, Vs[i]);
      CHECK_MESSAGE(same_bits(m.to_host(), mref), where << "row_max of shard " << i);  // exact
      for (int n = 0; n < N; ++n) rmax[n] = std::max(rmax[n], mref[n]);
    }
    const DeviceBuffer<float> rmax_d(rmax);
    std::vector<double> sumexp(N, 0.0), target(N, 0.0);
    for (int i = 0; i < 2; ++i) {
      const DeviceBuffer<E> x(shard[i]);
      DeviceBuffer<double> se_d(std::vector<double>(N, -1.0)), tl_d(std::vector<double>(N, -1.0));
      cu::ce_partial<E>(se_d.get(), tl_d.get(), x.get(), targets_d.get(), mask_d.get(),
                        rmax_d.get(), N, Vs[i], begin[i], nullptr);
      std::vector<double> se_ref(N), tl_ref(N);
      k::ce_partial<E>(se_ref.data(), tl_ref.data(), shard[i].data(), rows.targets.data(),
                       rows.mask.data(), rmax.data(), N, Vs[i], begin[i]);
      const std::vector<double> se = se_d.to_host(), tl = tl_d.to_host();
      for (int n = 0; n < N; ++n) {
        // Σ exp in fp32 per thread, double across: a few fp32 ulp of the sum.
        CHECK_MESSAGE(std::fabs(se[n] - se_ref[n]) <= 1e-6 * se_ref[n],
                      where << "sumexp row " << n << " shard " << i << ": " << se[n] << " want "
                            << se_ref[n]);
        CHECK_MESSAGE(tl[n] == tl_ref[n], where << "target_logit row " << n);  // a copy
        sumexp[n] += se_ref[n];
        target[n] += tl_ref[n];
      }
    }
    // ce_finish on the CPU's all-reduced statistics, so both sides start from the same values.
    const DeviceBuffer<double> sumexp_d(sumexp), target_d(target);
    for (int i = 0; i < 2; ++i) {
      const DeviceBuffer<E> x(shard[i]);
      DeviceBuffer<E> d(shard[i].size());
      REQUIRE(cudaMemset(d.get(), 0xff, sizeof(E) * d.size()) == cudaSuccess);
      const double loss = device_loss(0.0, [&](double* acc) {
        cu::ce_finish<E>(d.get(), x.get(), targets_d.get(), mask_d.get(), rmax_d.get(),
                         sumexp_d.get(), target_d.get(), N, Vs[i], begin[i], scale_d.get(), acc,
                         scratch_d.get(), nullptr);
      });
      std::vector<E> dref(shard[i].size());
      const double loss_ref =
          k::ce_finish<E>(dref.data(), shard[i].data(), rows.targets.data(), rows.mask.data(),
                          rmax.data(), sumexp.data(), target.data(), N, Vs[i], begin[i], scale);
      expect_loss(where + "ce_finish loss", loss, loss_ref);
      expect_loss(where + "ce_finish loss against the whole row", loss, whole_loss);
      const std::vector<E> dh = d.to_host();
      check_close(dh, dref, kRtol<E>, kAtol, {}, where + "ce_finish dlogits");
      if (i == 0) d_shard0[s] = dh;
    }
  }
  CHECK_MESSAGE(same_bits(d_shard0[0], d_shard0[1]),
                where << "dlogits differ between schedule seeds");
}

template <typename E>
void check_all() {
  // V: one column, below a warp, across warps, and across the 256 threads of a row (1000);
  // N = 19 rows has masked ones (every third), N = 1 is a single unmasked row.
  const int shapes[][2] = {{1, 1}, {19, 1}, {19, 19}, {1, 111}, {19, 111}, {1, 1000}, {19, 1000}};
  for (const auto& [N, V] : shapes) check_whole_row<E>(N, V);
  check_vocab_parallel<E>(19, 19);
  check_vocab_parallel<E>(19, 1000);
}

}  // namespace

TEST_CASE("cuda_emu cross_entropy fp32 against the CPU kernels") { check_all<float>(); }
TEST_CASE("cuda_emu cross_entropy bf16 against the CPU kernels") { check_all<ft::bf16>(); }
TEST_CASE("cuda_emu cross_entropy f16 against the CPU kernels") { check_all<ft::f16>(); }

// The gradient scale is read from device memory when the kernel runs, so a captured graph
// replayed after the scale changes uses the new one (what lets a training step be captured once
// while its token weight changes every step). Both ops, fp32, the scale written by a copy
// outside the graph between replays.
TEST_CASE("cuda_emu cross_entropy: a captured graph reads each replay's scale") {
  const int N = 19, V = 111;
  const auto logits = random_logits<float>(size_t(N) * V, 5);
  const Rows rows = make_rows(N, V, 6);
  const DeviceBuffer<float> logits_d(logits);
  const DeviceBuffer<int32_t> targets_d(rows.targets);
  const DeviceBuffer<uint8_t> mask_d(rows.mask);
  std::vector<float> rmax(N), zero(N, 0.0f);
  std::vector<double> sumexp(N), target(N);
  k::row_max(rmax.data(), logits.data(), N, V);
  k::ce_partial(sumexp.data(), target.data(), logits.data(), rows.targets.data(), rows.mask.data(),
                rmax.data(), N, V, 0);
  const DeviceBuffer<float> rmax_d(rmax);
  const DeviceBuffer<double> sumexp_d(sumexp), target_d(target);
  DeviceBuffer<float> scale_d(std::vector<float>{1.0f});
  DeviceBuffer<float> d_whole(logits.size()), d_shard(logits.size());
  DeviceBuffer<double> acc(std::vector<double>{0.0});
  DeviceBuffer<unsigned char> scratch_a(cu::cross_entropy_scratch_bytes(N, V)),
      scratch_b(cu::cross_entropy_scratch_bytes(N, V));
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cu::cross_entropy<float>(d_whole.get(), logits_d.get(), targets_d.get(), mask_d.get(), N, V,
                           scale_d.get(), acc.get(), scratch_a.get(), s);
  cu::ce_finish<float>(d_shard.get(), logits_d.get(), targets_d.get(), mask_d.get(), rmax_d.get(),
                       sumexp_d.get(), target_d.get(), N, V, 0, scale_d.get(), acc.get(),
                       scratch_b.get(), s);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  for (const float scale : {0.25f, -3.0f}) {
    REQUIRE(cudaMemcpyAsync(scale_d.get(), &scale, sizeof(float), cudaMemcpyHostToDevice, s) ==
            cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    std::vector<float> want(logits.size()), want_shard(logits.size());
    k::cross_entropy_forward_backward<float>(want.data(), logits.data(), rows.targets.data(),
                                             rows.mask.data(), N, V, scale);
    k::ce_finish<float>(want_shard.data(), logits.data(), rows.targets.data(), rows.mask.data(),
                        rmax.data(), sumexp.data(), target.data(), N, V, 0, scale);
    const std::string where = "scale " + std::to_string(scale) + " ";
    check_close(d_whole.to_host(), want, kRtol<float>, kAtol, {}, where + "cross_entropy");
    check_close(d_shard.to_host(), want_shard, kRtol<float>, kAtol, {}, where + "ce_finish");
  }
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}
