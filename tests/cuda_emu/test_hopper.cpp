// kernels/cuda/hopper.cuh (mbarrier, TMA, wgmma) through the test kernels of hopper_kernels.cu:
// results against hand-computed values and CPU references, on the CUDA emulation
// (ft_cuda_emu_tests) and on a GPU of compute capability 9.0 (ft_cuda_kernel_tests; skipped on
// older ones). The emulator's reports of misuse are in test_emu_hopper.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "tests/cuda_emu/emu_test_util.h"
#include "tests/cuda_emu/hopper_kernels.h"

namespace ft::kernels::cuda::test {
namespace {

using ft::emu::test::DeviceBuffer;
using ft::emu::test::SeedScope;
using ft::emu::test::test_seeds;

// The kernels need sm_90: on an older GPU the native run skips (the emulation is sm_90).
bool hopper_available() {
#if defined(FT_CUDA_EMU)
  return true;
#else
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess)
    return false;
  if (major != 9) MESSAGE("skipped: the Hopper kernels need compute capability 9.0");
  return major == 9;
#endif
}

TEST_CASE("hopper: an mbarrier ring passes every round's data from producer to consumers") {
  if (!hopper_available()) return;
  for (int rounds : {1, 2, 7}) {
    CAPTURE(rounds);
    DeviceBuffer<int> out(96), probe(1);
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      mbarrier_ring(out.get(), probe.get(), rounds);
      const auto o = out.to_host();
      int bad = 0;
      for (int i = 0; i < 96; ++i) {
        int want = 0;
        for (int r = 0; r < rounds; ++r) want += r * 1000 + i;
        bad += o[size_t(i)] != want;
      }
      CHECK(bad == 0);
      CHECK(probe.to_host()[0] == 1);
    }
  }
}

// A 2-D tensor of 16-bit elements with distinct bits: element (row, col) = row * 256 + col.
std::vector<uint16_t> distinct_tile(int rows, int cols) {
  std::vector<uint16_t> v(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) v[size_t(r) * cols + c] = uint16_t(r * 256 + c);
  return v;
}

TEST_CASE("hopper: a TMA 2-D box lands row-major, zero outside the tensor, swizzled per mode") {
  if (!hopper_available()) return;
  const int rows = 100, cols = 96;  // row stride 192 bytes
  const auto src = distinct_tile(rows, cols);
  DeviceBuffer<uint16_t> dsrc(src);
  const uint64_t dims[2] = {uint64_t(cols), uint64_t(rows)}, strides[1] = {cols * 2};
  const int coords[2] = {40, 90};  // columns 40.., rows 90..105: both run past the tensor
  for (int swizzle : {0, 1, 2, 3}) {
    CAPTURE(swizzle);
    const int box_cols = swizzle == 0 ? 64 : (16 << swizzle) / 2;  // a row = the swizzle span
    const uint32_t box[2] = {uint32_t(box_cols), 16};
    const int bytes = box_cols * 16 * 2;
    // The box as logical rows: element (r, c) of the box, 0 outside the tensor.
    std::vector<uint16_t> want(size_t(box_cols) * 16);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < box_cols; ++c) {
        const int gr = coords[1] + r, gc = coords[0] + c;
        want[size_t(r) * box_cols + c] = gr < rows && gc < cols ? src[size_t(gr) * cols + gc] : 0;
      }
    DeviceBuffer<unsigned char> out{size_t(bytes)};
    for (uint64_t seed : test_seeds()) {
      SeedScope scope(seed);
      // Read back through tma_swizzle: the box itself.
      tma_box(out.get(), dsrc.get(), 0, 2, dims, strides, box, swizzle, coords, 1);
      auto o = out.to_host();
      CHECK(std::memcmp(o.data(), want.data(), size_t(bytes)) == 0);
      // As it lies: 16-byte chunk k of row r (row = span bytes) at chunk k ^ f(r), where the
      // 128-byte swizzle's f(r) = r % 8, the 64-byte one's (r / 2) % 4, the 32-byte one's
      // (r / 4) % 2 (the bits 7.. of the row's address), none's 0.
      tma_box(out.get(), dsrc.get(), 0, 2, dims, strides, box, swizzle, coords, 0);
      o = out.to_host();
      const int row_bytes = box_cols * 2;
      int bad = 0;
      for (int r = 0; r < 16; ++r) {
        const int f = swizzle == 3   ? r % 8
                      : swizzle == 2 ? (r / 2) % 4
                      : swizzle == 1 ? (r / 4) % 2
                                     : 0;
        for (int b = 0; b < row_bytes; ++b) {
          const int at = r * row_bytes + (((b / 16) ^ f) * 16) + b % 16;
          bad += o[size_t(at)] !=
                 reinterpret_cast<const unsigned char*>(want.data())[r * row_bytes + b];
        }
      }
      CHECK(bad == 0);
      if (swizzle == 3) {  // two elements by hand: (1, 0) at byte 144, (3, 8) at byte 416
        uint16_t e10, e38;
        std::memcpy(&e10, o.data() + 144, 2);
        std::memcpy(&e38, o.data() + 416, 2);
        CHECK(e10 == src[size_t(91) * cols + 40]);
        CHECK(e38 == src[size_t(93) * cols + 48]);
      }
    }
    // Planted error: reading a swizzled box as if it were not swizzled.
    tma_box(out.get(), dsrc.get(), 0, 2, dims, strides, box, swizzle, coords, 2);
    const auto o = out.to_host();
    CHECK((std::memcmp(o.data(), want.data(), size_t(bytes)) == 0) == (swizzle == 0));
  }
}

TEST_CASE("hopper: a TMA 3-D fp32 box with padded strides, out of bounds in every dimension") {
  if (!hopper_available()) return;
  const int n0 = 20, n1 = 7, n2 = 5, pitch = 24;  // rows padded to 24 floats (96 bytes)
  std::vector<float> src(size_t(pitch) * n1 * n2, -1.0f);
  for (int k = 0; k < n2; ++k)
    for (int j = 0; j < n1; ++j)
      for (int i = 0; i < n0; ++i)
        src[(size_t(k) * n1 + j) * pitch + i] = float(k * 10000 + j * 100 + i);
  DeviceBuffer<float> dsrc(src);
  const uint64_t dims[3] = {uint64_t(n0), uint64_t(n1), uint64_t(n2)};
  const uint64_t strides[2] = {pitch * 4, uint64_t(pitch) * n1 * 4};
  const uint32_t box[3] = {8, 4, 3};
  const int coords[3] = {16, -2, 3};
  DeviceBuffer<unsigned char> out(8 * 4 * 3 * 4);
  tma_box(out.get(), dsrc.get(), 2, 3, dims, strides, box, 0, coords, 0);
  const auto o = out.to_host();
  int bad = 0;
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 8; ++i) {
        const int gi = coords[0] + i, gj = coords[1] + j, gk = coords[2] + k;
        const bool inside = gi < n0 && gj >= 0 && gj < n1 && gk < n2;
        const float want = inside ? src[(size_t(gk) * n1 + gj) * pitch + gi] : 0.0f;
        float got;
        std::memcpy(&got, o.data() + 4 * ((k * 4 + j) * 8 + i), 4);
        bad += got != want;
      }
  CHECK(bad == 0);
}

TEST_CASE("hopper: a TMA store writes the box's elements inside the tensor and no others") {
  if (!hopper_available()) return;
  const int rows = 100, cols = 96;
  const uint16_t kUntouched = 0xabcd;
  const uint64_t dims[2] = {uint64_t(cols), uint64_t(rows)}, strides[1] = {cols * 2};
  // Past the end in both dimensions, and before the start in both.
  for (const auto& coords : {std::vector<int>{40, 90}, std::vector<int>{-8, -3}}) {
    for (int swizzle : {0, 1, 2, 3}) {
      CAPTURE(swizzle);
      CAPTURE(coords[0]);
      const int box_cols = swizzle == 0 ? 64 : (16 << swizzle) / 2;
      const uint32_t box[2] = {uint32_t(box_cols), 16};
      std::vector<uint16_t> in(size_t(box_cols) * 16);  // element (r, c) = 0x4000 + 256 r + c
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < box_cols; ++c)
          in[size_t(r) * box_cols + c] = uint16_t(0x4000 + 256 * r + c);
      std::vector<unsigned char> in_bytes(in.size() * 2);
      std::memcpy(in_bytes.data(), in.data(), in_bytes.size());
      DeviceBuffer<unsigned char> din(in_bytes);
      for (uint64_t seed : test_seeds()) {
        SeedScope scope(seed);
        DeviceBuffer<uint16_t> dst(std::vector<uint16_t>(size_t(rows) * cols, kUntouched));
        tma_store_box(dst.get(), din.get(), 0, 2, dims, strides, box, swizzle, coords.data());
        const auto o = dst.to_host();
        int bad = 0;
        for (int gr = 0; gr < rows; ++gr)
          for (int gc = 0; gc < cols; ++gc) {
            const int r = gr - coords[1], c = gc - coords[0];
            const bool in_box = r >= 0 && r < 16 && c >= 0 && c < box_cols;
            const uint16_t want = in_box ? in[size_t(r) * box_cols + c] : kUntouched;
            bad += o[size_t(gr) * cols + gc] != want;
          }
        CHECK(bad == 0);
        if (coords[0] == 40)  // by hand: box element (1, 0) at row 91, column 40
          CHECK(o[size_t(91) * cols + 40] == 0x4100);
      }
    }
  }
}

TEST_CASE("hopper: wgmma's accumulator fragment puts D(m, n) where the PTX ISA's figure says") {
  if (!hopper_available()) return;
  // (n, m, k, col) and, by hand from Figure 149 (warp m / 16, lane 4 (m % 8) + (col % 8) / 2,
  // register 4 (col / 8) + 2 ((m % 16) / 8) + col % 2), the thread and register with the 1.
  struct Case {
    int n, m, k, col, thread, reg;
  };
  const Case cases[] = {
      {64, 0, 0, 0, 0, 0},        {64, 9, 3, 3, 5, 3},        {64, 37, 15, 62, 87, 28},
      {128, 37, 8, 70, 87, 32},   {128, 63, 7, 127, 127, 63}, {256, 16, 11, 255, 35, 125},
      {256, 50, 1, 129, 104, 65},
  };
  for (bool bf16 : {true, false}) {
    for (const Case& c : cases) {
      CAPTURE(bf16);
      CAPTURE(c.n);
      CAPTURE(c.m);
      CAPTURE(c.col);
      DeviceBuffer<float> out(size_t(128) * c.n / 2);
      wgmma_onehot(bf16, out.get(), c.n, c.m, c.k, c.col);
      const auto o = out.to_host();
      int ones = 0, others = 0;
      for (size_t i = 0; i < o.size(); ++i) {
        if (o[i] == 1.0f && int(i) == c.thread * c.n / 2 + c.reg)
          ++ones;
        else if (o[i] != 0.0f)
          ++others;
      }
      CHECK(ones == 1);
      CHECK(others == 0);
    }
  }
}

// Largest |got - want| / (sum |a_k b_k| + 1e-3) over c = a · bt^T (a m x k, bt n x k).
double gemm_error(bool bf16, const std::vector<float>& got, const std::vector<uint16_t>& a,
                  const std::vector<uint16_t>& bt, int m, int n, int k) {
  const auto f = [bf16](uint16_t b) { return bf16 ? to_f32(ft::bf16{b}) : to_f32(ft::f16{b}); };
  double worst = 0.0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double want = 0.0, scale = 1e-3;
      for (int p = 0; p < k; ++p) {
        const double prod = double(f(a[size_t(i) * k + p])) * double(f(bt[size_t(j) * k + p]));
        want += prod;
        scale += std::fabs(prod);
      }
      const double err = std::fabs(double(got[size_t(i) * n + j]) - want) / scale;
      worst = std::isnan(err) ? 1e30 : std::max(worst, err);
    }
  return worst;
}

TEST_CASE("hopper: a TMA -> shared -> wgmma GEMM tile matches the CPU, every feed and N") {
  if (!hopper_available()) return;
    // As test_warp_matrix.cpp: the emulator sums exact products in fp32 (1e-5); a GPU's tensor
    // cores may truncate inside the instruction (1e-4). A misplaced element gives about 1.
#if defined(FT_CUDA_EMU)
  const double tol = 1e-5;
#else
  const double tol = 1e-4;
#endif
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (bool bf16 : {true, false}) {
    for (int n : {64, 128, 256}) {
      for (int k : {64, 128}) {
        CAPTURE(bf16);
        CAPTURE(n);
        CAPTURE(k);
        std::vector<uint16_t> a(size_t(64) * k), bt(size_t(n) * k), b(size_t(k) * n);
        const auto bits = [&](float x) { return bf16 ? to_bf16(x).bits : to_f16(x).bits; };
        for (auto& x : a) x = bits(dist(gen));
        for (auto& x : bt) x = bits(dist(gen));
        for (int j = 0; j < n; ++j)
          for (int p = 0; p < k; ++p) b[size_t(p) * n + j] = bt[size_t(j) * k + p];
        DeviceBuffer<uint16_t> da(a), dbt(bt), db(b);
        DeviceBuffer<float> dc(size_t(64) * n);
        std::vector<float> first;
        for (uint64_t seed : test_seeds()) {
          SeedScope scope(seed);
          for (WgmmaFeed feed : {WgmmaFeed::kShared, WgmmaFeed::kRegisterA, WgmmaFeed::kNMajorB}) {
            CAPTURE(int(feed));
            const uint16_t* b_arg = feed == WgmmaFeed::kNMajorB ? db.get() : dbt.get();
            wgmma_gemm(bf16, dc.get(), da.get(), b_arg, n, k, feed);
            const auto c = dc.to_host();
            CHECK(gemm_error(bf16, c, a, bt, 64, n, k) < tol);
            if (first.empty()) first = c;
            CHECK(c == first);  // the same bits for every feed and schedule
          }
        }
        // Planted error: the swizzled tiles read through no-swizzle descriptors.
        wgmma_gemm(bf16, dc.get(), da.get(), dbt.get(), n, k, WgmmaFeed::kWrongSwizzle);
        CHECK(gemm_error(bf16, dc.to_host(), a, bt, 64, n, k) > 0.1);
      }
    }
  }
}

}  // namespace
}  // namespace ft::kernels::cuda::test
