// Self-tests of the CUDA emulation's Hopper instructions (tests/cuda_emu/hopper_emu.cpp): each
// misuse it promises to report is planted in a kernel and must be reported, naming the
// instruction; the same kernel without the planted error runs clean. Kernels here are CUDA code
// compiled by g++ with FT_CUDA_EMU (emulation only, as test_emu.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// The emulation before common.cuh, as the emulated build force-includes it.
#include "tests/cuda_emu/cuda_emu.h"

#include "core/half.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/warp_matrix.cuh"
#include "tests/cuda_emu/emu_test_util.h"

namespace ft::kernels::cuda {
namespace {

using ft::emu::test::DeviceBuffer;
using ft::emu::test::SeedScope;

template <typename F>
std::string report_of(F&& launch) {
  try {
    launch();
  } catch (const ft::emu::Error& e) {
    return e.what();
  }
  return "";
}

// One mbarrier misuse per mode; mode 0 is the correct use the others break. 64 threads: thread 0
// inits (count 2) and arrives with expect_tx 16, complete_tx 16 follows (a copy's bytes), thread
// 32 arrives; every thread then waits on phase 0. Each misuse is reported under every schedule.
__global__ void mbarrier_misuse_kernel(int* out, uint64_t* global_word, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* bar = reinterpret_cast<uint64_t*>(smem + 64);
  const int t = threadIdx.x;
  if (mode == 5) bar = global_word;                             // not shared memory
  if (mode == 6) bar = reinterpret_cast<uint64_t*>(smem + 68);  // not 8-byte aligned
  if (t == 0 && mode != 7) mbarrier_init(bar, 2);               // 7: never initialised
  if (t == 0 && mode == 8) mbarrier_init(bar, 2);               // initialised twice
  if (t == 0 && mode == 11) mbarrier_init(bar, 1u << 20);       // count out of range
  if (t == 0 && mode == 3) mbarrier_expect_tx(bar, 16);         // 3: bytes that hold the phase open
  if (mode != 9) __syncthreads();      // 9: init not ordered before the other threads' use
  if (t == 0 && mode == 10) *bar = 0;  // a plain store on the object
  if (t == 0) {
    mbarrier_arrive_expect_tx(bar, mode == 4 ? 8 : 16);         // 4: fewer bytes announced
    if (mode != 2 && mode != 3) mbarrier_complete_tx(bar, 16);  // 2: the bytes never complete
  }
  if (t == 32 && mode != 1) mbarrier_arrive(bar);  // 1: an arrival missing
  if (t == 33 && mode == 3) mbarrier_arrive(bar);  // 3: one arrival too many (phase held by tx)
  mbarrier_wait(bar, 0);
  out[t] = 1;
}

TEST_CASE("cuda_emu hopper: mbarrier misuse is reported, naming the instruction and the counts") {
  DeviceBuffer<int> out(64);
  DeviceBuffer<uint64_t> global_word(1);
  const auto run = [&](int mode) {
    FT_LAUNCH(mbarrier_misuse_kernel, 1, 64, 128, nullptr)(out.get(), global_word.get(), mode);
  };
  struct Case {
    int mode;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {1, {"deadlock", "mbarrier.try_wait.parity 0", "1 of 2 arrivals pending, tx-count 0"}},
      {2, {"deadlock", "mbarrier.try_wait.parity 0", "0 of 2 arrivals pending, tx-count 16"}},
      {3, {"mbarrier.arrive", "arrival count underflow", "0 of 2 arrivals pending"}},
      {4, {"tx-count went negative", "can never complete"}},
      {5, {"mbarrier.init", "is not in the block's shared memory"}},
      {6, {"mbarrier.init", "is not 8-byte aligned"}},
      {7, {"mbarrier.", "not initialised"}},
      {8, {"mbarrier.init", "already initialised"}},
      {10, {"mbarrier.arrive", "written by something other than an mbarrier"}},
      {11, {"mbarrier.init", "count 1048576 is outside"}},
  };
  for (uint64_t seed : {0ull, 3ull, 17ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    CHECK(report_of([&] { run(0); }) == "");  // the control
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode); });
      CHECK(r.find("mbarrier_misuse_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
    }
  }
  // Without the __syncthreads after init, some schedule lets thread 32 arrive first.
  int reports = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SeedScope scope(seed);
    const std::string r = report_of([&] { run(9); });
    if (!r.empty()) {
      CHECK_MESSAGE(r.find("not initialised") != std::string::npos, r);
      ++reports;
    }
  }
  CHECK(reports > 0);
}

// A TMA copy of a 16 x 64 bf16 box (2048 bytes) into shared memory that held 0x11 bytes: out[0]
// gets a byte read before the wait, out[1] the same byte after it. Modes plant one misuse each;
// mode 0 is correct.
__global__ void tma_misuse_kernel(unsigned char* out, const __grid_constant__ TensorMap map,
                                  uint16_t* src, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* box = smem + 1024 + (mode == 1 ? 64 : 0);  // 1: not 128-byte aligned
  if (mode == 2) box = smem + 3072;                         // 2: runs past shared memory
  const int t = threadIdx.x;
  for (int i = t; i < 2048; i += blockDim.x) smem[1024 + i] = 0x11;
  if (t == 0) mbarrier_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    const unsigned bytes = mode == 3 ? 1024 : mode == 4 ? 4096 : 2048;  // 3, 4: wrong bytes
    mbarrier_arrive_expect_tx(bar, bytes);
    if (mode == 7)
      tma_load_3d(box, map, 0, 0, 0, bar);  // a 3-D copy with a 2-D map
    else
      tma_load_2d(box, map, 0, 0, bar);
    if (mode == 5) src[3] = 7;  // 5: the source changes while the copy is in flight
  }
  if (t == 0) out[0] = box[5];
  if (mode == 6) return;  // 6: the copy is never waited for
  mbarrier_wait(bar, 0);
  if (t == 0) out[1] = box[5];
}

TEST_CASE("cuda_emu hopper: TMA data is the 0xff fill until the phase completes; misuse reported") {
  std::vector<uint16_t> host(16 * 64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x0100 + i);
  DeviceBuffer<uint16_t> src(host);
  DeviceBuffer<unsigned char> out(2);
  const uint64_t dims[2] = {64, 16}, strides[1] = {128};
  const uint32_t box[2] = {64, 16};
  const TensorMap map =
      encode_tensor_map(TmaType::kBf16, 2, src.get(), dims, strides, box, TmaSwizzle::k128B);
  const auto run = [&](int mode) {
    FT_LAUNCH(tma_misuse_kernel, 1, 64, 4096, nullptr)(out.get(), map, src.get(), mode);
  };
  struct Case {
    int mode;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {1, {"cp.async.bulk.tensor.2d", "is not 128-byte aligned"}},
      {2, {"cp.async.bulk.tensor.2d", "is not in the block's shared memory"}},
      {3, {"tx-count went negative", "can never complete"}},
      {4, {"deadlock", "mbarrier.try_wait.parity 0", "tx-count 2048"}},
      {5, {"cp.async.bulk.tensor.2d", "global source changed before the copy completed"}},
      {6, {"TMA copy(ies) into shared memory never waited for"}},
      {7, {"cp.async.bulk.tensor.3d", "the tensor map has 2 dimensions"}},
  };
  for (uint64_t seed : {0ull, 5ull, 21ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] { run(0); }) == "");
    const auto o = out.to_host();
    CHECK(o[0] == 0xff);  // before the wait: the fill, not the 0x11 that was there
    // After: byte 5 of the box, swizzled: row 0 keeps its chunks in place.
    CHECK(o[1] == reinterpret_cast<const unsigned char*>(host.data())[5]);
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode); });
      CHECK(r.find("tma_misuse_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
      src.get()[3] = host[3];  // mode 5 changed it (device memory is host memory here)
    }
  }
}

// Correct use in which a copy completes from the scheduler rather than in a wait: thread 0 issues
// it and exits without waiting; thread 32 alone waits, and where it went to sleep before the
// issue no thread is left to run while the copy is in flight (as a TMA producer warp's lane
// does). out[0]: byte 5 of the box once the phase completed.
__global__ void tma_issuer_exits_kernel(unsigned char* out, const __grid_constant__ TensorMap map) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  const int t = threadIdx.x;
  if (t == 0) mbarrier_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    mbarrier_arrive_expect_tx(bar, 2048);
    tma_load_2d(smem + 1024, map, 0, 0, bar);
  } else if (t == 32) {
    mbarrier_wait(bar, 0);
    out[0] = smem[1024 + 5];
  }
}

TEST_CASE("cuda_emu hopper: a copy whose issuer exited completes when no thread can run") {
  std::vector<uint16_t> host(16 * 64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x0100 + i);
  DeviceBuffer<uint16_t> src(host);
  DeviceBuffer<unsigned char> out(1);
  const uint64_t dims[2] = {64, 16}, strides[1] = {128};
  const uint32_t box[2] = {64, 16};
  const TensorMap map =
      encode_tensor_map(TmaType::kBf16, 2, src.get(), dims, strides, box, TmaSwizzle::k128B);
  // Several schedules: in some thread 32 waits before thread 0 issues.
  for (uint64_t seed = 0; seed < 8; ++seed) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] {
              FT_LAUNCH(tma_issuer_exits_kernel, 1, 64, 4096, nullptr)(out.get(), map);
            }) == "");
    CHECK(out.to_host()[0] == reinterpret_cast<const unsigned char*>(host.data())[5]);
  }
}

TEST_CASE("cuda_emu hopper: the emulated cuTensorMapEncodeTiled checks the driver's rules") {
  DeviceBuffer<uint16_t> src(64 * 64);
  const uint64_t dims[2] = {64, 64}, strides[1] = {128}, odd_stride[1] = {120};
  const uint32_t box[2] = {64, 8}, big_box[2] = {64, 257}, short_box[2] = {32, 8};
  const auto encode = [&](const void* base, const uint64_t* s, const uint32_t* b, TmaSwizzle z) {
    return encode_tensor_map(TmaType::kBf16, 2, base, dims, s, b, z);
  };
  CHECK_NOTHROW(encode(src.get(), strides, box, TmaSwizzle::k128B));
  CHECK_THROWS_WITH(encode(src.get() + 1, strides, box, TmaSwizzle::kNone),
                    doctest::Contains("is not 16-byte aligned"));
  CHECK_THROWS_WITH(encode(src.get(), odd_stride, box, TmaSwizzle::kNone),
                    doctest::Contains("is not a multiple of 16"));
  CHECK_THROWS_WITH(encode(src.get(), strides, big_box, TmaSwizzle::kNone),
                    doctest::Contains("boxDim[1] 257 is not 1 to 256"));
  CHECK_THROWS_WITH(encode(src.get(), strides, box, TmaSwizzle::k64B),
                    doctest::Contains("exceeds the swizzle's 64 bytes"));
  CHECK_THROWS_WITH(encode(src.get(), strides, short_box, TmaSwizzle::k128B),
                    doctest::Contains("the emulator models"));
}

// One wgmma misuse per mode (mode 0 and 5 run to the end). A warpgroup multiplies zero tiles
// (64 x 16 and 64 x 16, K-major, no swizzle: 2048 bytes each from shared offset 0 and 2048),
// written by the threads' stores and fenced for the async proxy.
__global__ void wgmma_misuse_kernel(float* out, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  const int t = threadIdx.x;
  for (int i = t; i < 4096; i += blockDim.x) smem[i] = 0;
  if (mode != 13) fence_proxy_async_shared();  // 13: the generic writes not fenced
  __syncthreads();
  if (mode == 3 && t >= 96) return;  // 3: a warp of the warpgroup skips the wgmma
  const unsigned char* a = smem + (mode == 4 && t == 5 ? 16 : 0);  // 4: one thread's A differs
  const uint32_t sbo = mode == 8 ? 4096 : 256;                     // 8: B's rows run past smem
  const uint64_t da = wgmma_descriptor(a, 128, 256, WgmmaSwizzle::kNone);
  const uint64_t db =
      wgmma_descriptor(smem + 2048 + (mode == 11 ? 8 : 0), 128, sbo, WgmmaSwizzle::kNone);
  float d[32];
  for (float& x : d) x = 1.0f;
  if (mode != 1) wgmma_fence();  // 1: no fence before the first wgmma
  if (mode == 12 && t < 64)
    wgmma_m64k16<::ft::bf16, 64>(d, da, db, true);  // 12: two call sites
  else
    wgmma_m64k16<::ft::bf16, 64>(d, da, db, true);
  wgmma_commit_group();
  if (mode == 5) out[t] = d[0];  // 5: read before the wait (no report: the NaN shows)
  if (mode == 6) d[3] = 2.0f;    // 6: written before the wait
  if (mode == 7) return;         // 7: never waited for
  if (mode == 9 && t == 0) smem[2048 + 40] = 1;  // 9: B changes under the pending wgmma
  wgmma_wait_group<0>();
  if (mode == 10) {  // 10: the accumulator written, then a wgmma on it without a fence
    d[0] = 0.0f;
    wgmma_m64k16<::ft::bf16, 64>(d, da, db, true);
    wgmma_commit_group();
    wgmma_wait_group<0>();
  }
  if (mode == 0) out[t] = d[0];
}

TEST_CASE("cuda_emu hopper: wgmma misuse is reported; a read before wait_group sees the NaN") {
  DeviceBuffer<float> out(128);
  const auto run = [&](int mode, int threads) {
    FT_LAUNCH(wgmma_misuse_kernel, 1, threads, 4096, nullptr)(out.get(), mode);
  };
  struct Case {
    int mode, threads;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {1, 128, {"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "no wgmma.fence"}},
      {0, 96, {"do not make a warpgroup"}},
      {3, 128, {"m64n64k16", "warpgroup"}},
      {4, 128, {"descriptors differ"}},
      {6, 128, {"accumulator register 3 was written before wgmma.wait_group"}},
      {7, 128, {"wgmma.mma_async never waited for"}},
      {8, 128, {"matrix B", "outside the block's 4096 bytes"}},
      {9, 128, {"shared memory operand (offset 2088) changed before wgmma.wait_group"}},
      {10, 128, {"without a wgmma.fence"}},
      {11, 128, {"wgmma_descriptor", "must be 16-byte aligned"}},
      {12, 128, {"every thread of the warpgroup must execute the same wgmma"}},
      {13, 128, {"operand at offset 0 was written by a thread's store", "fence.proxy.async"}},
  };
  for (uint64_t seed : {0ull, 7ull, 19ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] { run(0, 128); }) == "");
    for (float x : out.to_host()) CHECK(x == 1.0f);  // 1 + 0·0: the accumulator after the wait
    REQUIRE(report_of([&] { run(5, 128); }) == "");
    for (float x : out.to_host()) CHECK(std::isnan(x));  // before the wait: the pending NaN
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode, k.threads); });
      CHECK(r.find("wgmma_misuse_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
    }
  }
}

// A one-stage TMA ring feeding a warpgroup's wgmma, three rounds: thread 128 (the producer) waits
// for the stage to be empty, then loads A and B (64 x 64 bf16 boxes, 128-byte swizzle) on the
// full barrier; the warpgroup waits for it, multiplies, and releases the stage (arrives on the
// empty barrier, count 128). Mode 1 releases it before wgmma.wait_group, so that the next
// round's copy may overwrite operands the wgmma still reads: on a GPU a race, here reported
// where the scheduler lets the producer run in between (the seeded preemption points of
// mbarrier.arrive and wgmma.wait_group).
__global__ void stage_release_kernel(float* out, const __grid_constant__ TensorMap map, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* full = reinterpret_cast<uint64_t*>(smem);
  auto* empty = full + 1;
  unsigned char* a = smem + 1024;
  unsigned char* b = smem + 1024 + 8192;
  const int t = threadIdx.x;
  constexpr int kRounds = 3;
  if (t == 0) {
    mbarrier_init(full, 1);
    mbarrier_init(empty, 128);
  }
  __syncthreads();
  if (t == 128) {
    for (int r = 0; r < kRounds; ++r) {
      mbarrier_wait(empty, (r & 1) ^ 1);
      mbarrier_arrive_expect_tx(full, 2 * 8192);
      tma_load_2d(a, map, 0, 0, full);
      tma_load_2d(b, map, 0, 0, full);
    }
  }
  if (t >= 128) return;
  float d[32], sum = 0.0f;
  for (int r = 0; r < kRounds; ++r) {
    mbarrier_wait(full, r & 1);
    wgmma_fence();
    wgmma_m64k16<::ft::bf16, 64>(d, wgmma_descriptor(a, 16, 1024, WgmmaSwizzle::k128B),
                                 wgmma_descriptor(b, 16, 1024, WgmmaSwizzle::k128B), false);
    wgmma_commit_group();
    if (mode == 1) mbarrier_arrive(empty);  // 1: released while the wgmma may still read it
    wgmma_wait_group<0>();
    if (mode == 0) mbarrier_arrive(empty);
    sum += d[0];
  }
  out[t] = sum;
}

TEST_CASE("cuda_emu hopper: a stage released before wgmma.wait_group and refilled is reported") {
  std::vector<uint16_t> host(64 * 64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = ft::to_bf16(float(i % 7) - 3.0f).bits;
  DeviceBuffer<uint16_t> src(host);
  DeviceBuffer<float> out(128);
  const uint64_t dims[2] = {64, 64}, strides[1] = {128};
  const uint32_t box[2] = {64, 64};
  const TensorMap map =
      encode_tensor_map(TmaType::kBf16, 2, src.get(), dims, strides, box, TmaSwizzle::k128B);
  const auto run = [&](int mode) {
    FT_LAUNCH(stage_release_kernel, 1, 160, 1024 + 2 * 8192, nullptr)(out.get(), map, mode);
  };
  int reports = 0;
  for (uint64_t seed = 0; seed <= 16; ++seed) {
    SeedScope scope(seed);
    CAPTURE(seed);
    CHECK(report_of([&] { run(0); }) == "");  // the control
    const std::string r = report_of([&] { run(1); });
    if (!r.empty()) {
      CHECK_MESSAGE(r.find("changed before wgmma.wait_group") != std::string::npos, r);
      ++reports;
    }
  }
  CHECK(reports > 0);
}

// A TMA copy of A and B (64 x 64 bf16 boxes, 128-byte swizzle) on one mbarrier, then a wgmma on
// them. The PTX ISA makes the copy's writes visible to the threads that observe the phase's
// completion (mbarrier.try_wait), and through them to threads a barrier orders after: mode 0,
// every thread waits; mode 1 (the misuse), warp 0 only; mode 2, thread 0 waits, then a
// __syncthreads; mode 3, thread 0 waits, then arrives on a second mbarrier the others wait on
// (arrive releases, try_wait acquires). Modes 0, 2 and 3 are correct.
__global__ void tma_visibility_kernel(float* out, const __grid_constant__ TensorMap map, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* full = reinterpret_cast<uint64_t*>(smem);
  auto* go = full + 1;
  unsigned char* a = smem + 1024;
  unsigned char* b = smem + 1024 + 8192;
  const int t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(full, 1);
    mbarrier_init(go, 1);
  }
  __syncthreads();
  if (t == 0) {
    mbarrier_arrive_expect_tx(full, 2 * 8192);
    tma_load_2d(a, map, 0, 0, full);
    tma_load_2d(b, map, 0, 0, full);
  }
  if (mode == 0 || (mode == 1 && t < 32) || (mode >= 2 && t == 0)) mbarrier_wait(full, 0);
  if (mode == 2) __syncthreads();
  if (mode == 3 && t == 0) mbarrier_arrive(go);
  if (mode == 3) mbarrier_wait(go, 0);
  float d[32];
  wgmma_fence();
  wgmma_m64k16<::ft::bf16, 64>(d, wgmma_descriptor(a, 16, 1024, WgmmaSwizzle::k128B),
                               wgmma_descriptor(b, 16, 1024, WgmmaSwizzle::k128B), false);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  out[t] = d[0];
}

TEST_CASE("cuda_emu hopper: a thread's wgmma on TMA data it has not waited for is reported") {
  std::vector<uint16_t> host(64 * 64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = ft::to_bf16(float(i % 5) - 2.0f).bits;
  DeviceBuffer<uint16_t> src(host);
  DeviceBuffer<float> out(128);
  const uint64_t dims[2] = {64, 64}, strides[1] = {128};
  const uint32_t box[2] = {64, 64};
  const TensorMap map =
      encode_tensor_map(TmaType::kBf16, 2, src.get(), dims, strides, box, TmaSwizzle::k128B);
  const auto run = [&](int mode) {
    FT_LAUNCH(tma_visibility_kernel, 1, 128, 1024 + 2 * 8192, nullptr)(out.get(), map, mode);
  };
  for (uint64_t seed : {0ull, 5ull, 23ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    CHECK(report_of([&] { run(0); }) == "");  // the controls
    CHECK(report_of([&] { run(2); }) == "");
    CHECK(report_of([&] { run(3); }) == "");
    const std::string r = report_of([&] { run(1); });
    CHECK(r.find("tma_visibility_kernel") != std::string::npos);
    CHECK_MESSAGE(r.find("has not observed the completion of phase 0 of the mbarrier at shared "
                         "offset 0") != std::string::npos,
                  r);
  }
}

// The same rule for a generic read the emulator sees, ldmatrix: an 8 x 8 bf16 box by TMA, then
// one warp's ldmatrix.x1 of it. Mode 0, every lane waits; mode 1 (the misuse), lane 0 only;
// mode 2, lane 0 waits, then a __syncthreads.
__global__ void tma_ldmatrix_kernel(uint32_t* out, const __grid_constant__ TensorMap map,
                                    int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* full = reinterpret_cast<uint64_t*>(smem);
  unsigned char* box = smem + 128;
  const int t = threadIdx.x;
  if (t == 0) mbarrier_init(full, 1);
  __syncthreads();
  if (t == 0) {
    mbarrier_arrive_expect_tx(full, 128);
    tma_load_2d(box, map, 0, 0, full);
  }
  if (mode == 0 || t == 0) mbarrier_wait(full, 0);
  if (mode == 2) __syncthreads();
  uint32_t r[1];
  ldmatrix_x1(r, box + 16 * (t % 8));
  out[t] = r[0];
}

TEST_CASE("cuda_emu hopper: an ldmatrix of TMA data the lane has not waited for is reported") {
  std::vector<uint16_t> host(64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(i);
  DeviceBuffer<uint16_t> src(host);
  DeviceBuffer<uint32_t> out(32);
  const uint64_t dims[2] = {8, 8}, strides[1] = {16};
  const uint32_t box[2] = {8, 8};
  const TensorMap map =
      encode_tensor_map(TmaType::kBf16, 2, src.get(), dims, strides, box, TmaSwizzle::kNone);
  const auto run = [&](int mode) {
    FT_LAUNCH(tma_ldmatrix_kernel, 1, 32, 256, nullptr)(out.get(), map, mode);
  };
  for (uint64_t seed : {0ull, 5ull, 23ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    CHECK(report_of([&] { run(0); }) == "");  // the controls
    CHECK(out.to_host()[5] ==
          (uint32_t(8 + 3) << 16 | uint32_t(8 + 2)));  // lane 5: row 1, cols 2, 3
    CHECK(report_of([&] { run(2); }) == "");
    const std::string r = report_of([&] { run(1); });
    CHECK(r.find("ldmatrix.sync.aligned.m8n8.x1") != std::string::npos);
    CHECK_MESSAGE(r.find("has not observed the completion of phase 0 of the mbarrier at shared "
                         "offset 0") != std::string::npos,
                  r);
  }
}

// A TMA store of a 16 x 64 bf16 box (2048 bytes) that the block's 64 threads write into shared
// memory (byte i = i % 251): out[0] gets the destination's byte 5 read after the reads are waited
// for (still the old 0x22: the writes are not), out[1] the same after wait_group 0. Modes plant
// one misuse each; mode 0 is correct.
__global__ void tma_store_misuse_kernel(unsigned char* out, const __grid_constant__ TensorMap map,
                                        const unsigned char* dst, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  unsigned char* box = smem + 1024 + (mode == 6 ? 64 : 0);  // 6: not 128-byte aligned
  const int t = threadIdx.x;
  for (int i = t; i < 2048; i += blockDim.x) box[i] = static_cast<unsigned char>(i % 251);
  if (mode != 1) fence_proxy_async_shared();  // 1: the async proxy may not see the stores
  __syncthreads();
  if (t != 0) return;
  if (mode == 7)
    tma_store_3d(map, 0, 0, 0, box);  // a 3-D store with a 2-D map
  else
    tma_store_2d(map, 0, 0, box);
  if (mode == 4) return;  // 4: never committed
  bulk_commit_group();
  if (mode == 2) box[7] = 0;  // 2: the source rewritten while the copy may still read it
  if (mode == 3) return;      // 3: exits without waiting for the reads
  bulk_wait_group_read<0>();
  out[0] = dst[5];
  if (mode == 5) return;  // 5 (correct): the writes complete with the kernel
  bulk_wait_group<0>();
  out[1] = dst[5];
}

TEST_CASE("cuda_emu hopper: a TMA store writes at wait_group; its misuse is reported") {
  DeviceBuffer<unsigned char> dst(2048), out(2);
  const uint64_t dims[2] = {64, 16}, strides[1] = {128};
  const uint32_t box[2] = {64, 16};
  const TensorMap map =
      encode_tensor_map(TmaType::kBf16, 2, dst.get(), dims, strides, box, TmaSwizzle::k128B);
  const auto run = [&](int mode) {
    std::memset(dst.get(), 0x22, 2048);  // device memory is host memory here
    FT_LAUNCH(tma_store_misuse_kernel, 1, 64, 4096, nullptr)(out.get(), map, dst.get(), mode);
  };
  struct Case {
    int mode;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {1, {"cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group", "no fence.proxy.async"}},
      {2, {"shared source (offset 1031) changed before cp.async.bulk.wait_group.read"}},
      {3, {"TMA store(s) whose reads of shared memory it never waited for"}},
      {4, {"TMA store(s) never committed"}},
      {6, {"cp.async.bulk.tensor.2d.global", "is not 128-byte aligned"}},
      {7, {"cp.async.bulk.tensor.3d.global", "the tensor map has 2 dimensions"}},
  };
  for (uint64_t seed : {0ull, 5ull, 21ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] { run(0); }) == "");
    auto o = out.to_host();
    CHECK(o[0] == 0x22);  // after wait_group.read: the reads are done, not the writes
    CHECK(o[1] == 5);     // byte 5 of row 0 (the swizzle keeps row 0 in place): 5 % 251
    // Row 1's first element lands where the swizzle put it: shared chunk 0 ^ 1 of row 1.
    CHECK(dst.get()[128] == (128 + 16) % 251);
    REQUIRE(report_of([&] { run(5); }) == "");
    CHECK(dst.get()[5] == 5);  // written by the kernel's end
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode); });
      CHECK(r.find("tma_store_misuse_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
    }
  }
}

// Named barriers between two warps, three rounds: warp 0 writes a round's values to shared memory
// and arrives on barrier 1 (bar.arrive), warp 1 waits there (bar.sync), adds them up and arrives
// on barrier 2, which warp 0 waits on before the next round. Mode 1 leaves out barrier 1 (one
// round only: a schedule shows the old values); the other modes are misuse the emulator reports.
__global__ void named_barrier_kernel(int* out, int mode) {
  FT_DYNAMIC_SHARED(int, data);
  const int t = threadIdx.x, lane = t % 32;
  if (t < 32) data[lane] = -1;
  __syncthreads();
  int sum = 0;
  for (int round = 0; round < (mode == 1 ? 1 : 3); ++round) {
    if (t < 32) {
      data[lane] = round * 100 + lane;
      if (mode == 2)
        named_barrier_arrive(0, 64);  // 2: barrier 0 is __syncthreads's
      else if (mode == 3)
        named_barrier_arrive(1, 48);  // 3: not whole warps
      else if (mode == 4)
        named_barrier_arrive(1, 96);  // 4: more threads than the block has
      else if (mode == 5)
        named_barrier_arrive(1, lane < 16 ? 64 : 32);  // 5: counts differ within one use
      else if (mode != 1 && mode != 6)                 // 6: never arrives: warp 1 waits forever
        named_barrier_arrive(1, 64);
      named_barrier_sync(2, 64);
    } else {
      if (mode != 1) named_barrier_sync(1, 64);
      sum += data[lane];
      named_barrier_arrive(2, 64);
    }
  }
  if (t >= 32) out[lane] = sum;
}

TEST_CASE("cuda_emu hopper: named barriers order warps; their misuse is reported") {
  DeviceBuffer<int> out(32);
  const auto run = [&](int mode) {
    FT_LAUNCH(named_barrier_kernel, 1, 64, 256, nullptr)(out.get(), mode);
  };
  struct Case {
    int mode;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {2, {"bar.arrive 0, 64", "is not one of 1 .. 15"}},
      {3, {"bar.arrive 1, 48", "multiple of the warp size"}},
      {4, {"bar.arrive 1, 96", "at most the block's 64 threads"}},
      {5, {"arrived at barrier 1 for this use with a count of", "the same count"}},
      {6, {"deadlock", "at bar.sync 1, 64", "32 of 64 threads arrived"}},
  };
  for (uint64_t seed : {0ull, 5ull, 21ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] { run(0); }) == "");
    const auto o = out.to_host();
    for (int lane = 0; lane < 32; ++lane) CHECK(o[size_t(lane)] == 300 + 3 * lane);
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode); });
      CHECK(r.find("named_barrier_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
    }
  }
  // Without barrier 1, some schedule lets warp 1 read before warp 0 wrote (-1, not 7).
  int wrong = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SeedScope scope(seed);
    REQUIRE(report_of([&] { run(1); }) == "");
    wrong += out.to_host()[7] != 7;
  }
  CHECK(wrong > 0);
}

// Named barriers count whole warps on a GPU: warp 1 waits on barrier 1 (64 threads); mode 0: warp 0
// arrives with all its lanes; mode 1: warps 0 and 2 with lanes 0 .. 15 each (64 threads, but two
// half warps: reported).
__global__ void named_barrier_partial_kernel(int* out, int mode) {
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  if (warp == 1)
    named_barrier_sync(1, 64);
  else if ((mode == 0 && warp == 0) || (mode == 1 && lane < 16))
    named_barrier_arrive(1, 64);
  out[t] = 1;
}

TEST_CASE("cuda_emu hopper: a named barrier completed by part of a warp is reported") {
  DeviceBuffer<int> out(96);
  const auto run = [&](int mode) {
    FT_LAUNCH(named_barrier_partial_kernel, 1, 96, 0, nullptr)(out.get(), mode);
  };
  for (uint64_t seed : {0ull, 5ull, 21ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] { run(0); }) == "");
    const std::string r = report_of([&] { run(1); });
    CHECK_MESSAGE(r.find("bar.") != std::string::npos, r);
    CHECK_MESSAGE(r.find("lanes 0x0000ffff of warp 0") != std::string::npos, r);
    CHECK_MESSAGE(r.find("every live lane of a warp") != std::string::npos, r);
  }
}

// A named barrier passes on what its arrivals observed: warp 1 waits for a TMA load's phase, then
// arrives on barrier 1; thread 0 (warp 0, which never waited on the mbarrier) passes bar.sync 1
// and stores the loaded box by TMA (an async-proxy read of TMA data). Mode 1 arrives before the
// wait: the barrier still orders the store after the load's issue, but thread 0 has not observed
// the phase (reported).
__global__ void named_barrier_observed_kernel(const __grid_constant__ TensorMap load,
                                              const __grid_constant__ TensorMap store, int mode) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* full = reinterpret_cast<uint64_t*>(smem);
  unsigned char* box = smem + 1024;
  const int t = threadIdx.x;
  if (t == 0) mbarrier_init(full, 1);
  __syncthreads();
  if (t == 32) {
    mbarrier_arrive_expect_tx(full, 2048);
    tma_load_2d(box, load, 0, 0, full);
  }
  if (t >= 32) {
    if (mode == 1) named_barrier_arrive(1, 64);
    mbarrier_wait(full, 0);
    if (mode != 1) named_barrier_arrive(1, 64);
    return;
  }
  named_barrier_sync(1, 64);
  if (t == 0) {
    tma_store_2d(store, 0, 0, box);
    bulk_commit_group();
    bulk_wait_group<0>();
  }
}

TEST_CASE("cuda_emu hopper: a named barrier passes an observed mbarrier phase on") {
  std::vector<uint16_t> host(16 * 64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(0x0100 + i);
  DeviceBuffer<uint16_t> src(host), dst(16 * 64);
  const uint64_t dims[2] = {64, 16}, strides[1] = {128};
  const uint32_t box[2] = {64, 16};
  const TensorMap load =
      encode_tensor_map(TmaType::kBf16, 2, src.get(), dims, strides, box, TmaSwizzle::k128B);
  const TensorMap store =
      encode_tensor_map(TmaType::kBf16, 2, dst.get(), dims, strides, box, TmaSwizzle::k128B);
  for (uint64_t seed : {0ull, 5ull, 21ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    REQUIRE(report_of([&] {
              FT_LAUNCH(named_barrier_observed_kernel, 1, 64, 4096, nullptr)(load, store, 0);
            }) == "");
    CHECK(dst.to_host() == host);  // a swizzled load then store: the same tensor
    const std::string r = report_of([&] {
      FT_LAUNCH(named_barrier_observed_kernel, 1, 64, 4096, nullptr)(load, store, 1);
    });
    CHECK_MESSAGE(r.find("has not observed the completion of phase 0 of the mbarrier at shared "
                         "offset 0") != std::string::npos,
                  r);
  }
}

// setmaxnreg in a warp-specialised block of three warpgroups (384 threads: 168 registers each at
// entry): warpgroup 2 (the producer) gives registers back with .dec 24, warpgroups 0 and 1 take
// them with .inc 240 (2 x 128 x 72 = 128 x 144 registers: exactly what .dec freed). Each thread
// then writes out[t] = 1. Modes plant one misuse each.
__global__ void setmaxnreg_kernel(int* out, int mode) {
  const int t = threadIdx.x, group = t / 128;
  if (group == 2) {
    if (mode == 3 && t % 128 >= 32)
      setmaxnreg_dec<32>();  // 3: the warpgroup's warps at different instructions
    else if (mode == 5)
      setmaxnreg_dec<200>();  // 5: .dec above the current 168
    else if (mode == 7 && t % 128 >= 96)
      return;  // 7: a warp of the producer leaves before the others' setmaxnreg
    else
      setmaxnreg_dec<24>();
  } else {
    if (mode == 2)
      setmaxnreg_inc<20>();  // 2: below 24 (the emulated wrapper takes it)
    else if (mode == 4)
      setmaxnreg_inc<160>();  // 4: .inc below the current 168
    else if (mode == 6)
      setmaxnreg_inc<248>();  // 6: 2 x 128 x 80 registers; the pool gets 128 x 144
    else
      setmaxnreg_inc<240>();
  }
  out[t] = 1;
}

TEST_CASE("cuda_emu hopper: setmaxnreg moves registers through the block's pool; misuse reported") {
  DeviceBuffer<int> out(384);
  const auto run = [&](int mode, int threads) {
    FT_LAUNCH(setmaxnreg_kernel, 1, threads, 0, nullptr)(out.get(), mode);
  };
  struct Case {
    int mode, threads;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {0, 352, {"setmaxnreg", "352 threads are not whole warpgroups"}},
      {2, 384, {"setmaxnreg.inc.sync.aligned.u32 20", "multiple of 8 in 24 .. 256"}},
      {3, 384, {"setmaxnreg.dec.sync.aligned.u32", "every warp of the warpgroup"}},
      {4, 384, {"setmaxnreg.inc.sync.aligned.u32 160", "current 168"}},
      {5, 384, {"setmaxnreg.dec.sync.aligned.u32 200", "current 168"}},
      {6, 384, {"deadlock", "setmaxnreg.inc.sync.aligned.u32 248", "needs 10240 registers"}},
      // Reported at the warp's exit or, where it left first, as the others' deadlock.
      {7, 384, {"setmaxnreg.dec.sync.aligned.u32 24"}},
  };
  for (uint64_t seed : {0ull, 5ull, 21ull}) {
    SeedScope scope(seed);
    CAPTURE(seed);
    std::memset(out.get(), 0, 384 * sizeof(int));  // device memory is host memory here
    REQUIRE(report_of([&] { run(0, 384); }) == "");
    const auto o = out.to_host();
    CHECK(std::count(o.begin(), o.end(), 1) == 384);
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode, k.threads); });
      CHECK(r.find("setmaxnreg_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
    }
  }
}

}  // namespace
}  // namespace ft::kernels::cuda
