// kernels/cuda/warp_matrix.cuh (mma.sync m16n8k16, ldmatrix, cp.async) through the test kernels
// of warp_matrix_kernels.cu: every lane's fragment against a scalar reference, a wrong lane
// mapping caught, cp.async's zero-fill, and a tiled GEMM against the CPU. On the CUDA emulation
// (ft_cuda_emu_tests) and on a GPU (ft_cuda_kernel_tests). The emulator's own checks (misuse
// reports, data stale before the wait) are in test_emu.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ios>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "tests/cuda_emu/emu_test_util.h"
#include "tests/cuda_emu/warp_matrix_kernels.h"

namespace ft::kernels::cuda::test {
namespace {

using ft::emu::test::DeviceBuffer;
using ft::emu::test::SeedScope;
using ft::emu::test::test_seeds;

uint16_t to_bits(bool bf16, float x) { return bf16 ? to_bf16(x).bits : to_f16(x).bits; }
float from_bits(bool bf16, uint16_t b) { return bf16 ? to_f32(ft::bf16{b}) : to_f32(ft::f16{b}); }

// n random 16-bit elements in [-1, 1).
std::vector<uint16_t> random_elements(bool bf16, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bits(bf16, dist(gen));
  return v;
}

// Largest |got - want| / (scale of the sum), where want = c + a·b in double and the scale is
// sum |a_k b_k| + |c| + 1e-3: a relative error of the dot products. a is m x k row-major, b
// k x n row-major, c m x n (or empty).
double gemm_error(bool bf16, const std::vector<float>& got, const std::vector<uint16_t>& a,
                  const std::vector<uint16_t>& b, const std::vector<float>& c, int m, int n,
                  int k) {
  double worst = 0.0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = c.empty() ? 0.0 : c[size_t(i) * n + j];
      double scale = std::fabs(want) + 1e-3;
      for (int p = 0; p < k; ++p) {
        const double prod = double(from_bits(bf16, a[size_t(i) * k + p])) *
                            double(from_bits(bf16, b[size_t(p) * n + j]));
        want += prod;
        scale += std::fabs(prod);
      }
      const double err = std::fabs(double(got[size_t(i) * n + j]) - want) / scale;
      worst = std::isnan(err) ? 1e30 : std::max(worst, err);
    }
  }
  return worst;
}

// The emulator sums the exact products in fp32 (measured: at most 1.8e-7 here). A GPU's tensor
// cores accumulate in fp32 in their own order and, per Fasi et al., "Numerical behavior of NVIDIA
// tensor cores" (PeerJ CS 2021), may truncate rather than round inside the instruction: 1e-4
// leaves room for that. A misplaced element gives about 1 (measured 0.97 to 1.19).
#if defined(FT_CUDA_EMU)
constexpr double kTol = 1e-5;
#else
constexpr double kTol = 1e-4;
#endif
constexpr double kWrong = 0.1;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

TEST_CASE("warp_matrix: mma m16n8k16 from hand-packed fragments matches A·B + C, bf16 and f16") {
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const auto a = random_elements(bf16, 16 * 16, 1), b = random_elements(bf16, 16 * 8, 2);
    const auto c = random_floats(16 * 8, 3);
    DeviceBuffer<uint16_t> da(a), db(b);
    DeviceBuffer<float> dc(c), dd(16 * 8);
    std::vector<float> first;
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      mma_packed(bf16, dd.get(), da.get(), db.get(), dc.get(), AMapping::kIsa);
      const auto d = dd.to_host();
      CHECK(gemm_error(bf16, d, a, b, c, 16, 8, 16) < kTol);
      if (first.empty()) first = d;
      CHECK(d == first);  // the same bits under every schedule
    }
    // A wrong lane mapping of A (transposed, or its two column halves exchanged) gives a product
    // the check rejects: the fragment layout matters and the test can see it.
    for (AMapping wrong : {AMapping::kTransposed, AMapping::kHalvesSwapped}) {
      CAPTURE(int(wrong));
      mma_packed(bf16, dd.get(), da.get(), db.get(), dc.get(), wrong);
      CHECK(gemm_error(bf16, dd.to_host(), a, b, c, 16, 8, 16) > kWrong);
    }
  }
}

TEST_CASE("warp_matrix: mma from ldmatrix-loaded tiles, B by .x2.trans ([k][n]) and .x2 ([n][k])") {
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const auto a = random_elements(bf16, 16 * 16, 4), b = random_elements(bf16, 16 * 8, 5);
    std::vector<uint16_t> b_nk(8 * 16);
    for (int kk = 0; kk < 16; ++kk)
      for (int nn = 0; nn < 8; ++nn) b_nk[nn * 16 + kk] = b[kk * 8 + nn];
    const auto c = random_floats(16 * 8, 6);
    DeviceBuffer<uint16_t> da(a), db(b), db_nk(b_nk);
    DeviceBuffer<float> dc(c), dd(16 * 8);
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      for (bool nk : {false, true}) {
        CAPTURE(nk);
        mma_ldmatrix(bf16, dd.get(), da.get(), db.get(), nk ? db_nk.get() : nullptr, dc.get());
        CHECK(gemm_error(bf16, dd.to_host(), a, b, c, 16, 8, 16) < kTol);
      }
    }
  }
}

TEST_CASE("warp_matrix: ldmatrix x1/x2/x4, plain and .trans, give every lane its PTX fragment") {
  // 32 stored rows of 8 distinct values; lane l points at row (7 l + 3) % 32, so the test also
  // sees that rows come from the lanes' addresses, not from one base.
  std::vector<uint16_t> src(32 * 8);
  for (int i = 0; i < 32 * 8; ++i) src[i] = uint16_t(1000 + i);
  std::vector<int> row_of_lane(32);
  for (int l = 0; l < 32; ++l) row_of_lane[l] = (7 * l + 3) % 32;
  DeviceBuffer<uint16_t> dsrc(src);
  DeviceBuffer<int> drows(row_of_lane);
  DeviceBuffer<uint32_t> dout(32 * 4);
  for (uint64_t seed : test_seeds()) {
    SeedScope scope(seed);
    for (int num : {1, 2, 4}) {
      for (bool trans : {false, true}) {
        CAPTURE(num);
        CAPTURE(trans);
        ldmatrix_lanes(dout.get(), dsrc.get(), drows.get(), num, trans);
        const auto out = dout.to_host();
        // M_i[r][c]: element c of the row that lane 8i + r addressed.
        const auto m = [&](int i, int r, int c) {
          return uint32_t(src[size_t(row_of_lane[8 * i + r]) * 8 + c]);
        };
        int bad = 0;
        for (int l = 0; l < 32; ++l) {
          const int g = l >> 2, q = l & 3;
          for (int i = 0; i < 4; ++i) {
            uint32_t want = 0;
            if (i < num)
              want = trans ? m(i, 2 * q, g) | m(i, 2 * q + 1, g) << 16
                           : m(i, g, 2 * q) | m(i, g, 2 * q + 1) << 16;
            if (out[4 * l + i] != want && bad++ < 4)
              FAIL_CHECK("lane " << l << " register " << i << ": got 0x" << std::hex
                                 << out[4 * l + i] << ", want 0x" << want);
          }
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("warp_matrix: pack2_rn (one cvt per pair) rounds as core/half.h, halves in order") {
  // Ties to even, the subnormals of both types, the overflow of f16, infinities, signed zeros,
  // NaNs, and random values over many binades; then the lower element of a pair must land in
  // bits 0..15 (cvt.rn.*x2.f32 puts its first source in the upper half).
  std::vector<float> in = {1.0f,          -2.5f,    1.00390625f, 1.01171875f,   1.0009765625f,
                           1.0029296875f, 1e-40f,   -3e-39f,     5.9604645e-8f, 2.9802322e-8f,
                           8.9406967e-8f, 65504.0f, 65520.0f,    1e6f,          -1e30f,
                           3.4e38f,       INFINITY, -INFINITY,   0.0f,          -0.0f,
                           NAN,           1.0f,     -NAN,        7.0f};
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-140, 40);
  for (int i = 0; i < 2000; ++i)
    in.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(mant(gen), ex(gen)));
  const int pairs = int(in.size() / 2);
  DeviceBuffer<float> din(in);
  DeviceBuffer<uint32_t> drn{size_t(pairs)}, dkeep{size_t(pairs)};
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    pack_pairs(bf16, drn.get(), dkeep.get(), din.get(), pairs);
    const auto rn = drn.to_host(), keep = dkeep.to_host();
    int bad = 0, nans = 0;
    for (int i = 0; i < pairs; ++i) {
      for (int h = 0; h < 2; ++h) {
        const float x = in[size_t(2 * i + h)];
        const uint32_t got = rn[size_t(i)] >> (16 * h) & 0xffffu;
        if (std::isnan(x)) {
          ++nans;
          bad += got != 0x7fffu;  // the canonical NaN
          continue;
        }
        const uint32_t want = to_bits(bf16, x);
        if (got != want || (keep[size_t(i)] >> (16 * h) & 0xffffu) != want) {
          if (++bad <= 5)
            MESSAGE("pair " << i << " half " << h << " x " << x << ": got 0x" << std::hex << got
                            << " want 0x" << want);
        }
      }
    }
    CHECK(nans == 2);
    CHECK(bad == 0);
  }
}

TEST_CASE("warp_matrix: cp.async copies src-size bytes and zero-fills the rest") {
  std::vector<unsigned char> src(28 * 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(0x80 | (i * 7));
  DeviceBuffer<unsigned char> dsrc(src), dout(28 * 64);
  for (uint64_t seed : test_seeds()) {
    SeedScope scope(seed);
    cp_async_zero_fill(dout.get(), dsrc.get());
    const auto out = dout.to_host();
    int bad = 0;
    for (int t = 0; t < 64; ++t) {
      for (int i = 0; i < 28; ++i) {
        size_t from;
        int valid;
        if (i < 16) {
          from = 16 * size_t(t) + size_t(i);
          valid = t % 17;
        } else if (i < 24) {
          from = 16 * 64 + 8 * size_t(t) + size_t(i - 16);
          valid = (t % 3) * 4;
        } else {
          from = 24 * 64 + 4 * size_t(t) + size_t(i - 24);
          valid = t % 2 * 4;
        }
        const int offset = i < 16 ? i : (i < 24 ? i - 16 : i - 24);
        const unsigned char want = offset < valid ? src[from] : 0;
        if (out[28 * size_t(t) + size_t(i)] != want) ++bad;
      }
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("warp_matrix: a tiled GEMM through cp.async, ldmatrix and mma matches the CPU") {
  const int m = 128, n = 128, k = 96;  // 2x2 blocks, 3 k-chunks through the two stages
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const auto a = random_elements(bf16, size_t(m) * k, 7);
    const auto b = random_elements(bf16, size_t(k) * n, 8);
    DeviceBuffer<uint16_t> da(a), db(b);
    DeviceBuffer<float> dc(size_t(m) * n);
    std::vector<float> first;
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      tiled_gemm(bf16, dc.get(), da.get(), db.get(), m, n, k);
      const auto c = dc.to_host();
      CHECK(gemm_error(bf16, c, a, b, {}, m, n, k) < kTol);
      if (first.empty()) first = c;
      CHECK(c == first);
    }
  }
}

}  // namespace
}  // namespace ft::kernels::cuda::test
