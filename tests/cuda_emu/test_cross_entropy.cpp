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
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/half.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/cuda_emu.h"

namespace k = ft::kernels;
namespace cu = ft::kernels::cuda;

namespace {

// The emulator's schedule seed for one scope (0: threads and blocks in index order; any other
// seed: a seeded shuffle of both).
struct SeedScope {
  uint64_t saved = ft::emu::seed();
  explicit SeedScope(uint64_t s) { ft::emu::set_seed(s); }
  ~SeedScope() { ft::emu::set_seed(saved); }
};

constexpr uint64_t kSeeds[2] = {0, 12345};

template <typename E>
std::vector<E> random_logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);  // a peaked softmax, as a trained model's
  std::vector<E> v(n);
  for (auto& x : v) x = k::from_f32<E>(d(g));
  return v;
}

template <typename E>
bool same_bits(const std::vector<E>& a, const std::vector<E>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(E) * a.size()) == 0;
}

// dlogits tolerances (rtol, atol). fp32: exp(x − max)·scale/Σ on both sides; the sums run in
// different orders (and in fp32 here, double on the CPU), a few ulp apart. bf16 / f16: those
// fp32 values rounded once, so one ulp of the type (2^-8, 2^-11 relative), doubled for margin.
// atol: the gradient of a row is at most scale = 1/19 in magnitude; below 1e-9 nothing matters.
template <typename E>
constexpr double kRtol = std::is_same_v<E, float>    ? 1e-5
                         : std::is_same_v<E, k::bf16> ? 1.0 / 128
                                                      : 1.0 / 1024;
constexpr double kAtol = 1e-9;

template <typename E>
void expect_close(const std::string& what, const std::vector<E>& got, const std::vector<E>& ref,
                  double rtol, double atol) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = k::to_f32(got[i]), r = k::to_f32(ref[i]);
    const double ratio = std::fabs(g - r) / (atol + rtol * std::fabs(r));
    if (!(ratio <= 1.0)) ++bad;  // NaN counts as bad
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  INFO(what << ": " << bad << " of " << ref.size() << " elements out of tolerance; worst ["
            << worst << "] got " << k::to_f32(got[worst]) << " want " << k::to_f32(ref[worst])
            << " (error / tolerance " << worst_ratio << ")");
  CHECK(bad == 0);
}

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

template <typename E>
void check_whole_row(int N, int V) {
  const std::string where = "N=" + std::to_string(N) + " V=" + std::to_string(V) + " ";
  const auto logits = random_logits<E>(size_t(N) * V, uint32_t(N * 7919 + V));
  const Rows rows = make_rows(N, V, uint32_t(V));
  const float scale = 1.0f / 19.0f;
  std::vector<E> dref(logits.size());
  const double loss_ref = k::cross_entropy_forward_backward<E>(
      dref.data(), logits.data(), rows.targets.data(), rows.mask.data(), N, V, scale);

  std::vector<double> scratch((cu::cross_entropy_scratch_bytes(N, V) + 7) / 8);
  std::vector<E> dl[2], inplace[2];
  for (int s = 0; s < 2; ++s) {
    SeedScope scope(kSeeds[s]);
    // Separate dlogits, NaN bits first (masked rows must be zeroed); the loss adds onto 0.5.
    dl[s].assign(logits.size(), E{});
    std::memset(dl[s].data(), 0xff, sizeof(E) * dl[s].size());
    double loss = 0.5;
    cu::cross_entropy<E>(dl[s].data(), logits.data(), rows.targets.data(), rows.mask.data(), N, V,
                         scale, &loss, scratch.data(), nullptr);
    expect_loss(where + "loss", loss - 0.5, loss_ref);
    expect_close<E>(where + "dlogits", dl[s], dref, kRtol<E>, kAtol);
    // dlogits aliasing the logits (how the model calls it): the same result.
    inplace[s] = logits;
    double loss2 = 0.0;
    cu::cross_entropy<E>(inplace[s].data(), inplace[s].data(), rows.targets.data(),
                         rows.mask.data(), N, V, scale, &loss2, scratch.data(), nullptr);
    CHECK_MESSAGE(loss2 + 0.5 == loss, where << "in place: loss " << loss2);
    CHECK_MESSAGE(same_bits(inplace[s], dl[s]), where << "in place: other dlogits");
  }
  CHECK_MESSAGE(same_bits(dl[0], dl[1]), where << "dlogits differ between schedule seeds");

  // Loss only (dlogits null), as eval calls it.
  double loss = 0.0;
  cu::cross_entropy<E>(nullptr, logits.data(), rows.targets.data(), rows.mask.data(), N, V, scale,
                       &loss, scratch.data(), nullptr);
  expect_loss(where + "loss without dlogits", loss, loss_ref);
}

// The vocabulary-parallel pieces on two shards [0, V0) and [V0, V) of each row, with the host
// doing the all-reduces (max of row_max, sums of sumexp and target_logit): each piece against
// the CPU's on the same inputs, and the assembled loss and dlogits against the whole-row kernel.
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

  std::vector<double> scratch((cu::cross_entropy_scratch_bytes(N, V) + 7) / 8);
  std::vector<E> d_first[2];
  for (int s = 0; s < 2; ++s) {
    SeedScope scope(kSeeds[s]);
    std::vector<float> rmax(N, -INFINITY);
    for (int i = 0; i < 2; ++i) {
      if (Vs[i] == 0) continue;
      std::vector<float> m(N), mref(N);
      cu::row_max<E>(m.data(), shard[i].data(), N, Vs[i], nullptr);
      k::row_max<E>(mref.data(), shard[i].data(), N, Vs[i]);
      CHECK_MESSAGE(same_bits(m, mref), where << "row_max of shard " << i);  // max is exact
      for (int n = 0; n < N; ++n) rmax[n] = std::max(rmax[n], m[n]);
    }
    std::vector<double> sumexp(N, 0.0), target(N, 0.0);
    for (int i = 0; i < 2; ++i) {
      if (Vs[i] == 0) continue;
      std::vector<double> se(N, -1.0), tl(N, -1.0), se_ref(N), tl_ref(N);
      cu::ce_partial<E>(se.data(), tl.data(), shard[i].data(), rows.targets.data(),
                        rows.mask.data(), rmax.data(), N, Vs[i], begin[i], nullptr);
      k::ce_partial<E>(se_ref.data(), tl_ref.data(), shard[i].data(), rows.targets.data(),
                       rows.mask.data(), rmax.data(), N, Vs[i], begin[i]);
      for (int n = 0; n < N; ++n) {
        // Σ exp in fp32 per thread, double across: a few fp32 ulp of the sum.
        CHECK_MESSAGE(std::fabs(se[n] - se_ref[n]) <= 1e-6 * se_ref[n],
                      where << "sumexp row " << n << " shard " << i << ": " << se[n] << " want "
                            << se_ref[n]);
        CHECK_MESSAGE(tl[n] == tl_ref[n], where << "target_logit row " << n);  // a copy
        sumexp[n] += se[n];
        target[n] += tl[n];
      }
    }
    double loss = 0.0;
    for (int i = 0; i < 2; ++i) {
      if (Vs[i] == 0) continue;
      std::vector<E> d(shard[i].size()), dref(shard[i].size());
      std::memset(d.data(), 0xff, sizeof(E) * d.size());
      double part = 0.0;
      cu::ce_finish<E>(d.data(), shard[i].data(), rows.targets.data(), rows.mask.data(),
                       rmax.data(), sumexp.data(), target.data(), N, Vs[i], begin[i], scale,
                       &part, scratch.data(), nullptr);
      const double part_ref = k::ce_finish<E>(dref.data(), shard[i].data(), rows.targets.data(),
                                              rows.mask.data(), rmax.data(), sumexp.data(),
                                              target.data(), N, Vs[i], begin[i], scale);
      expect_loss(where + "ce_finish loss", part, part_ref);
      expect_close<E>(where + "ce_finish dlogits", d, dref, kRtol<E>, kAtol);
      loss = part;  // every shard reports the whole loss
      if (i == 0) {
        if (s == 0) d_first[0] = d;
        else d_first[1] = d;
      }
    }
    expect_loss(where + "assembled loss", loss, whole_loss);
  }
  CHECK_MESSAGE(same_bits(d_first[0], d_first[1]), where << "differs between schedule seeds");
}

template <typename E>
void check_all() {
  // V: one column, below a warp, across warps, and across the 256 threads of a row (1000).
  for (int V : {1, 19, 111, 1000})
    for (int N : {1, 19}) check_whole_row<E>(N, V);
  for (int V : {19, 1000}) check_vocab_parallel<E>(19, V);
}

}  // namespace

TEST_CASE("cuda_emu cross_entropy fp32 against the CPU kernels") { check_all<float>(); }
TEST_CASE("cuda_emu cross_entropy bf16 against the CPU kernels") { check_all<k::bf16>(); }
TEST_CASE("cuda_emu cross_entropy f16 against the CPU kernels") { check_all<k::f16>(); }
