// kernels/cuda/hopper.cuh (mbarrier, TMA, wgmma) through the test kernels of hopper_kernels.cu:
// results against hand-computed values and CPU references, on the CUDA emulation
// (ft_cuda_emu_tests) and on a GPU of compute capability 9.0 (ft_cuda_kernel_tests; skipped on
// older ones). The emulator's reports of misuse are in test_emu_hopper.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

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

}  // namespace
}  // namespace ft::kernels::cuda::test
