// Self-tests of the CUDA emulation (a test tool, tests/cuda_emu/cuda_emu.h): it runs correct
// kernels correctly under every seed, the seed changes the order threads run in, and it reports
// the misuse it promises to report. Kernels here are CUDA code compiled by g++ with FT_CUDA_EMU.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

// The emulation before common.cuh, as the emulated build force-includes it.
#include "tests/cuda_emu/cuda_emu.h"

#include "core/asan.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/warp_matrix.cuh"
#include "tests/cuda_emu/emu_test_util.h"

namespace ft::kernels::cuda {
namespace {

using ft::emu::test::DeviceBuffer;
using ft::emu::test::SeedScope;

// ---- kernels --------------------------------------------------------------------------------

// Per block: shared-memory tree down to one warp, then shuffles (the classic reduction).
__global__ void tree_sum_kernel(float* out, const float* x, int n) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  const int i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride >= 32; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t < 32) {
    float v = s[t];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (t == 0) out[blockIdx.x] = v;
  }
}

// common.cuh's block_sum, on a 2-D block (threads numbered x fastest, as CUDA's).
__global__ void block_sum_kernel(float* out, const float* x, int n) {
  const int t = threadIdx.x + blockDim.x * threadIdx.y;
  const int i = blockIdx.x * 128 + t;
  // block_sum assumes a 1-D block; a (32, 4) block has the same warps as a 128-wide one.
  float v = i < n ? x[i] : 0.0f;
  v = warp_sum(v);
  __shared__ float w[4];
  if (t % 32 == 0) w[t / 32] = v;
  __syncthreads();
  if (t == 0) out[blockIdx.x] = w[0] + w[1] + w[2] + w[3];
}

__global__ void block_sum_1d_kernel(float* out, const float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = block_sum(i < n ? x[i] : 0.0f);
  const float m = block_max(i < n ? x[i] : -1e30f);
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = v;
    out[2 * blockIdx.x + 1] = m;
  }
}

// Each thread reads its neighbour's shared slot, with or without the barrier between.
__global__ void neighbour_kernel(int* out, int base, bool sync) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = base + t;
  if (sync) __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void partial_barrier_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void early_return_kernel(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void exited_lane_shuffle_kernel(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

__global__ void shuffle_mask_kernel(int* out, unsigned mask, int lane_mask) {
  if (!(mask >> (threadIdx.x % 32) & 1u)) return;
  out[threadIdx.x] = __shfl_xor_sync(mask, int(threadIdx.x), lane_mask);
}

// Lanes 0-15 shuffle with the whole warp while lanes 16-31 wait at a barrier.
__global__ void deadlock_kernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

// Every shuffle flavour with width 8, and a ballot, written per lane.
__global__ void shuffle_flavours_kernel(int* out) {
  const int t = threadIdx.x;
  out[0 * 32 + t] = __shfl_sync(0xffffffffu, t, 3, 8);
  out[1 * 32 + t] = __shfl_up_sync(0xffffffffu, t, 2, 8);
  out[2 * 32 + t] = __shfl_down_sync(0xffffffffu, t, 2, 8);
  out[3 * 32 + t] = __shfl_xor_sync(0xffffffffu, t, 5, 8);
  out[4 * 32 + t] = int(__ballot_sync(0xffffffffu, t % 3 == 0));
  out[5 * 32 + t] = __all_sync(0xffffffffu, t < 32) + 2 * __any_sync(0xffffffffu, t == 7);
  // 2- and 4-byte CUDA types move as their bits.
  const __nv_bfloat16 b = __shfl_xor_sync(0xffffffffu, __float2bfloat16_rn(float(t)), 1);
  const __half2 h = __shfl_down_sync(0xffffffffu, __floats2half2_rn(float(t), -float(t)), 1);
  const float2 hf = __half22float2(h);
  out[6 * 32 + t] = int(__bfloat162float(b)) * 1000 + int(hf.x) * 10 - int(hf.y);
}

// Barrier votes; also compiles nvcc's annotations (__launch_bounds__, #pragma unroll).
__global__ void __launch_bounds__(96) barrier_vote_kernel(int* out) {
  const int t = threadIdx.x;
  int v[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) v[i] = __ldg(out + i);
  const int count = __syncthreads_count(t % 5 == 0);
  const int all = __syncthreads_and(t < 1000);
  const int any = __syncthreads_or(t == 95);
  const int none = __syncthreads_or(0);
  __threadfence();
  if (t == 0) {
    out[0] = count + v[0];
    out[1] = all + 2 * any + 4 * none + v[1];
  }
}

__global__ void atomic_count_kernel(unsigned* count, int* max_seen) {
  atomicAdd(count, 1u);
  atomicMax(max_seen, int(blockIdx.x * blockDim.x + threadIdx.x));
}

__global__ void dynamic_shared_kernel(float* out, int n) {
  FT_DYNAMIC_SHARED(float, s);
  const int t = threadIdx.x;
  out[blockIdx.x * blockDim.x + t] = s[t];  // unwritten: the 0xff fill, a NaN
  s[t] = float(t);
  __syncthreads();
  if (t == 0) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += s[i];
    out[blockIdx.x * blockDim.x] = sum;
  }
}

__global__ void noop_kernel(int*) {}

// Thread (3, 1) of block (2, 0) waits at a barrier nobody else reaches.
__global__ void lonely_barrier_kernel(int* out) {
  if (blockIdx.x == 2 && threadIdx.x == 3 && threadIdx.y == 1) __syncthreads();
  out[0] = 1;
}

// Thread 7 throws (host code a kernel calls, say) while the others wait at the barrier.
__global__ void throwing_kernel(int* out) {
  if (threadIdx.x == 7) throw std::runtime_error("from the kernel");
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Lanes 0-9 return; the others record which lanes are still active.
__global__ void active_mask_kernel(unsigned* out) {
  if (threadIdx.x < 10) return;
  out[threadIdx.x] = __activemask();
}

// cp.async completes at the wait that covers its group, not before, and not at __syncthreads.
// Thread t: group 0 copies src[t] to s[t], group 1 src[32 + t] to s[32 + t]; it records both
// words after __syncthreads, after wait_group 1 and after wait_group 0 (out[6 t ..]).
__global__ void cp_async_stages_kernel(unsigned* out, const unsigned* src) {
  FT_DYNAMIC_SHARED(unsigned, s);
  const int t = threadIdx.x;
  cp_async_ca<4>(s + t, src + t);
  cp_async_commit();
  cp_async_ca<4>(s + 32 + t, src + 32 + t);
  cp_async_commit();
  __syncthreads();
  unsigned* o = out + 6 * t;
  o[0] = s[t];
  o[1] = s[32 + t];
  cp_async_wait<1>();
  o[2] = s[t];
  o[3] = s[32 + t];
  cp_async_wait<0>();
  o[4] = s[t];
  o[5] = s[32 + t];
}

// One misuse of mma / ldmatrix / cp.async per mode (see the test); modes 0 and 5 are correct.
__global__ void warp_matrix_misuse_kernel(float* out, const uint16_t* g, int mode) {
  FT_DYNAMIC_SHARED(uint16_t, s);  // 1024 bytes
  const int l = threadIdx.x % 32;
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0}, r[4] = {0, 0, 0, 0}, r1[1] = {0};
  float c[4] = {0, 0, 0, 0};
  alignas(16) uint16_t local[8] = {};
  switch (mode) {
    case 0:
      mma_m16n8k16<ft::bf16>(c, a, b, c);
      break;
    case 1:  // half the warp has returned
      if (l < 16) return;
      mma_m16n8k16<ft::bf16>(c, a, b, c);
      break;
    case 2:  // two instructions
      if (l < 16)
        mma_m16n8k16<ft::bf16>(c, a, b, c);
      else
        mma_m16n8k16<ft::f16>(c, a, b, c);
      break;
    case 3:  // rows 2 bytes past 16-byte alignment
      ldmatrix_x4(r, s + l * 8 + 1);
      break;
    case 4:  // rows in global memory
      ldmatrix_x4(r, g + l * 8);
      break;
    case 5:  // x1: the addresses of lanes 8-31 are not used
      ldmatrix_x1(r1, l < 8 ? static_cast<const void*>(s + l * 8) : nullptr);
      break;
    case 6:
      cp_async_ca<12>(s, g);
      break;
    case 7:  // shared destination 8 bytes past 16-byte alignment
      cp_async_ca<16>(s + 4, g);
      break;
    case 8:  // global source 2 bytes past 8-byte alignment
      cp_async_ca<8>(s, g + 1);
      break;
    case 9:
      cp_async_ca<8>(s, g, 9);
      break;
    case 10:  // committed, never waited for
      cp_async_ca<16>(s + 8 * l, g + 8 * l);
      cp_async_commit();
      break;
    case 11:  // not even committed
      cp_async_cg16(s + 8 * l, g + 8 * l);
      break;
    case 12:  // destination in global memory
      cp_async_cg16(const_cast<uint16_t*>(g) + 8 * l, g + 8 * l);
      break;
    case 13:  // source on the thread's stack
      cp_async_cg16(s + 8 * l, local);
      cp_async_wait_all();
      break;
    case 14:  // the source written between issue and completion
      cp_async_ca<16>(s + 8 * l, g + 8 * l);
      const_cast<uint16_t*>(g)[8 * l] ^= 1;  // a change whatever it held
      cp_async_wait_all();
      break;
  }
  out[threadIdx.x] = c[0] + float(r[0] + r1[0]);
}

// ---- stream order ---------------------------------------------------------------------------

__global__ void set_kernel(int* p, int v) {
  if (threadIdx.x == 0) *p = v;
}
__global__ void copy_int_kernel(int* dst, const int* src) {
  if (threadIdx.x == 0) *dst = *src;
}
// *dst = *src * 10 + v: a pointer read at run time and a value fixed at the launch.
__global__ void scale_add_kernel(int* dst, const int* src, int v) {
  if (threadIdx.x == 0) *dst = *src * 10 + v;
}

// ---- helpers --------------------------------------------------------------------------------

// Runs `launch` and returns the emulator's report (CHECKs that there is one).
template <typename F>
std::string report_of(F&& launch) {
  try {
    launch();
  } catch (const ft::emu::Error& e) {
    return e.what();
  }
  FAIL_CHECK("the emulator reported nothing");
  return "";
}

std::vector<float> iota_floats(int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = float(i % 97) - 40.0f;  // small integers: exact sums
  return v;
}

// ---- tests ----------------------------------------------------------------------------------

TEST_CASE("cuda_emu: block reductions with shared memory and shuffles, every seed") {
  for (int n : {1, 19, 256, 1000}) {
    const std::vector<float> x = iota_floats(n);
    const int blocks = (n + 255) / 256;
    std::vector<float> want(size_t(blocks), 0.0f), want_max(size_t(blocks), -1e30f);
    for (int i = 0; i < n; ++i) {
      want[size_t(i / 256)] += x[size_t(i)];
      want_max[size_t(i / 256)] = std::max(want_max[size_t(i / 256)], x[size_t(i)]);
    }
    for (uint64_t seed : {0ull, 1ull, 2ull, 99ull}) {
      SeedScope scope(seed);
      DeviceBuffer<float> dx(x), out{size_t(blocks)}, out2{size_t(2 * blocks)};
      FT_LAUNCH(tree_sum_kernel, blocks, 256, 0, nullptr)(out.get(), dx.get(), n);
      FT_CUDA_CHECK_LAUNCH();
      CHECK(out.to_host() == want);
      FT_LAUNCH(block_sum_1d_kernel, blocks, 256, 0, nullptr)(out2.get(), dx.get(), n);
      const std::vector<float> got = out2.to_host();
      for (int b = 0; b < blocks; ++b) {
        CHECK(got[size_t(2 * b)] == want[size_t(b)]);
        CHECK(got[size_t(2 * b + 1)] == want_max[size_t(b)]);
      }
    }
  }
}

TEST_CASE("cuda_emu: launches from several host threads keep their __shared__ apart") {
  // __shared__ is a static variable: per block only because launches are serialised.
  auto run = [](float offset, int* failures) {
    const int n = 1000, blocks = 4;
    std::vector<float> x = iota_floats(n);
    for (float& v : x) v += offset;
    std::vector<float> want(blocks, 0.0f);
    for (int i = 0; i < n; ++i) want[size_t(i / 256)] += x[size_t(i)];
    for (int rep = 0; rep < 10; ++rep) {
      DeviceBuffer<float> dx(x), out{size_t(blocks)};
      FT_LAUNCH(tree_sum_kernel, blocks, 256, 0, nullptr)(out.get(), dx.get(), n);
      *failures += out.to_host() != want;
    }
  };
  int failures_a = 0, failures_b = 0;
  std::thread a(run, 0.0f, &failures_a), b(run, 1000.0f, &failures_b);
  a.join();
  b.join();
  CHECK(failures_a == 0);
  CHECK(failures_b == 0);
}

TEST_CASE("cuda_emu: threads of a 2-D block are numbered x fastest, warps of 32") {
  const int n = 300;
  const std::vector<float> x = iota_floats(n);
  const int blocks = (n + 127) / 128;
  std::vector<float> want(size_t(blocks), 0.0f);
  for (int i = 0; i < n; ++i) want[size_t(i / 128)] += x[size_t(i)];
  SeedScope scope(5);
  DeviceBuffer<float> dx(x), out{size_t(blocks)};
  FT_LAUNCH(block_sum_kernel, blocks, dim3(32, 4), 0, nullptr)(out.get(), dx.get(), n);
  CHECK(out.to_host() == want);
}

TEST_CASE("cuda_emu: a missing __syncthreads gives results that depend on the seed") {
  // Without the barrier a thread may read its neighbour's slot before the neighbour wrote it
  // (then it sees the previous launch's value). Seed 0 runs threads in index order; other seeds
  // shuffle them, so the set of threads that read a fresh value changes with the seed.
  const int n = 64;
  std::set<std::vector<int>> outcomes;
  int wrong_runs = 0, base = 1000;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(n);
    base += 1000;
    FT_LAUNCH(neighbour_kernel, 1, n, 0, nullptr)(out.get(), base, false);
    const std::vector<int> got = out.to_host();
    std::vector<int> fresh(n);
    for (int t = 0; t < n; ++t) fresh[size_t(t)] = got[size_t(t)] == base + (t + 1) % n;
    outcomes.insert(fresh);
    wrong_runs += std::count(fresh.begin(), fresh.end(), 0) > 0;
  }
  CHECK(outcomes.size() > 1);  // the seed changes the order threads run in
  CHECK(wrong_runs > 0);       // and the race shows as a wrong result
  // With the barrier, every seed gives the right answer.
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(n);
    base += 1000;
    FT_LAUNCH(neighbour_kernel, 1, n, 0, nullptr)(out.get(), base, true);
    const std::vector<int> got = out.to_host();
    for (int t = 0; t < n; ++t) CHECK(got[size_t(t)] == base + (t + 1) % n);
  }
}

TEST_CASE("cuda_emu: barriers in divergent code and early returns are reported") {
  for (uint64_t seed : {0ull, 3ull, 11ull}) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(64);
    std::string r = report_of([&] {
      FT_LAUNCH(divergent_barrier_kernel, 2, 64, 0, nullptr)
      (out.get());
    });
    CHECK(r.find("different barriers") != std::string::npos);
    CHECK(r.find("divergent_barrier_kernel") != std::string::npos);
    r = report_of([&] { FT_LAUNCH(partial_barrier_kernel, 1, 64, 0, nullptr)(out.get()); });
    CHECK(r.find("every thread of a block must reach every barrier") != std::string::npos);
    r = report_of([&] { FT_LAUNCH(early_return_kernel, 1, 64, 0, nullptr)(out.get()); });
    CHECK(r.find("every thread of a block must reach every barrier") != std::string::npos);
  }
}

TEST_CASE("cuda_emu: a report names the kernel, the block and the thread") {
  // Seed 0: threads in index order, so (0, 0) .. (2, 1) have exited when (3, 1) arrives.
  SeedScope scope(0);
  DeviceBuffer<int> out(1);
  try {
    FT_LAUNCH(lonely_barrier_kernel, 4, dim3(8, 2), 0, nullptr)(out.get());
    FAIL_CHECK("the emulator reported nothing");
  } catch (const ft::emu::Error& e) {
    CHECK(e.kernel() == "lonely_barrier_kernel");
    CHECK(e.block().x == 2);
    CHECK(e.thread().x == 3);
    CHECK(e.thread().y == 1);
    CHECK(e.problem().find("reached after thread (0,0,0) of the block exited") !=
          std::string::npos);
  }
}

TEST_CASE("cuda_emu: an exception in a kernel and device calls from the host are reported") {
  for (uint64_t seed : {0ull, 13ull}) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(32);
    const std::string r = report_of([&] {
      FT_LAUNCH(throwing_kernel, 2, 32, 0, nullptr)
      (out.get());
    });
    CHECK(r.find("the kernel threw: from the kernel") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(__syncthreads(), doctest::Contains("outside a kernel launch"),
                       ft::emu::Error);
  CHECK_THROWS_AS(__shfl_xor_sync(0xffffffffu, 1, 1), ft::emu::Error);
}

TEST_CASE("cuda_emu: __activemask names the lanes that have not exited") {
  SeedScope scope(0);
  DeviceBuffer<unsigned> out(48);
  FT_LAUNCH(active_mask_kernel, 1, 48, 0, nullptr)(out.get());
  const std::vector<unsigned> got = out.to_host();
  // Seed 0 runs threads in order: lanes 0-9 have exited when the others ask, and so have the
  // lanes before the caller (a GPU would run them together; the emulator cannot know).
  for (int t = 10; t < 32; ++t) CHECK(got[size_t(t)] == (0xffffffffu << t));
  for (int t = 32; t < 48; ++t) CHECK(got[size_t(t)] == (0x0000ffffu << (t - 32) & 0xffffu));
}

TEST_CASE("cuda_emu: shuffles naming an exited, missing or non-participating lane are reported") {
  for (uint64_t seed : {0ull, 4ull, 12ull}) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(64);
    std::string r = report_of([&] {
      FT_LAUNCH(exited_lane_shuffle_kernel, 1, 32, 0, nullptr)
      (out.get());
    });
    CHECK(r.find("exited") != std::string::npos);
    CHECK(r.find("__shfl_xor_sync") != std::string::npos);
    // A full mask in a 16-thread block names 16 lanes that do not exist.
    r = report_of([&] {
      FT_LAUNCH(shuffle_mask_kernel, 1, 16, 0, nullptr)(out.get(), 0xffffffffu, 1);
    });
    CHECK(r.find("does not exist") != std::string::npos);
    // Half-warp mask, xor 16 reads the other half.
    r = report_of([&] {
      FT_LAUNCH(shuffle_mask_kernel, 1, 32, 0, nullptr)(out.get(), 0x0000ffffu, 16);
    });
    CHECK(r.find("not in the mask") != std::string::npos);
    // Half-warp masks with partners inside: fine.
    FT_LAUNCH(shuffle_mask_kernel, 1, 32, 0, nullptr)(out.get(), 0x0000ffffu, 1);
    const std::vector<int> got = out.to_host();
    for (int t = 0; t < 16; ++t) CHECK(got[size_t(t)] == (t ^ 1));
  }
}

TEST_CASE("cuda_emu: a deadlock is reported") {
  for (uint64_t seed : {0ull, 6ull}) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(32);
    const std::string r = report_of([&] {
      FT_LAUNCH(deadlock_kernel, 1, 32, 0, nullptr)
      (out.get());
    });
    CHECK(r.find("deadlock") != std::string::npos);
    CHECK(r.find("__syncthreads") != std::string::npos);
  }
  // The emulator is usable after a report (its fibers unwound).
  DeviceBuffer<int> out(32);
  FT_LAUNCH(noop_kernel, 4, 32, 0, nullptr)(out.get());
}

TEST_CASE("cuda_emu: shuffle flavours, widths and votes follow CUDA's definitions") {
  SeedScope scope(8);
  DeviceBuffer<int> out(7 * 32);
  FT_LAUNCH(shuffle_flavours_kernel, 1, 32, 0, nullptr)(out.get());
  const std::vector<int> got = out.to_host();
  unsigned ballot = 0;
  for (int t = 0; t < 32; ++t) ballot |= unsigned(t % 3 == 0) << t;
  for (int t = 0; t < 32; ++t) {
    const int seg = t & ~7, l = t & 7;
    CHECK(got[size_t(t)] == seg + 3);
    CHECK(got[size_t(32 + t)] == (l >= 2 ? t - 2 : t));  // out of range: own value
    CHECK(got[size_t(64 + t)] == (l + 2 < 8 ? t + 2 : t));
    CHECK(got[size_t(96 + t)] == (t ^ 5));
    CHECK(unsigned(got[size_t(128 + t)]) == ballot);
    CHECK(got[size_t(160 + t)] == 3);
    const int down = t + 1 < 32 ? t + 1 : t;
    CHECK(got[size_t(192 + t)] == (t ^ 1) * 1000 + down * 11);
  }
}

TEST_CASE("cuda_emu: __syncthreads_count, _and, _or") {
  for (uint64_t seed : {0ull, 10ull}) {
    SeedScope scope(seed);
    DeviceBuffer<int> out(std::vector<int>{100, 200, 0});
    FT_LAUNCH(barrier_vote_kernel, 1, 96, 0, nullptr)(out.get());
    const std::vector<int> got = out.to_host();
    CHECK(got[0] == 100 + 20);  // t = 0, 5, ..., 95
    CHECK(got[1] == 200 + 1 + 2);
  }
}

TEST_CASE("cuda_emu: integer atomics and dynamic shared memory") {
  for (uint64_t seed : {0ull, 9ull}) {
    SeedScope scope(seed);
    DeviceBuffer<unsigned> count(std::vector<unsigned>{0u});
    DeviceBuffer<int> max_seen(std::vector<int>{-1});
    FT_LAUNCH(atomic_count_kernel, 7, 96, 0, nullptr)(count.get(), max_seen.get());
    CHECK(count.to_host()[0] == 7u * 96u);
    CHECK(max_seen.to_host()[0] == 7 * 96 - 1);

    const int threads = 64, blocks = 3;
    DeviceBuffer<float> out(threads * blocks);
    FT_LAUNCH(dynamic_shared_kernel, blocks, threads, threads * sizeof(float), nullptr)
    (out.get(), threads);
    const std::vector<float> got = out.to_host();
    for (int b = 0; b < blocks; ++b) {
      CHECK(got[size_t(b * threads)] == float(threads * (threads - 1) / 2));
      for (int t = 1; t < threads; ++t) CHECK(std::isnan(got[size_t(b * threads + t)]));
    }
  }
}

TEST_CASE("cuda_emu: bad launch configurations set the last error, as the runtime does") {
  DeviceBuffer<int> out(32);
  FT_LAUNCH(noop_kernel, 0, 32, 0, nullptr)(out.get());  // empty grid
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
  CHECK_THROWS_WITH_AS(FT_CUDA_CHECK_LAUNCH(), doctest::Contains("invalid configuration"),
                       ft::Error);
  CHECK(cudaGetLastError() == cudaSuccess);  // cleared by the check
  FT_LAUNCH(noop_kernel, 1, 1025, 0, nullptr)(out.get());
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  // Above 48 KiB of dynamic shared memory only after opting in, up to 227 KiB.
  FT_LAUNCH(noop_kernel, 1, 32, 64 << 10, nullptr)(out.get());
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaFuncSetAttribute(reinterpret_cast<const void*>(noop_kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               64 << 10) == cudaSuccess);
  FT_LAUNCH(noop_kernel, 1, 32, 64 << 10, nullptr)(out.get());
  CHECK(cudaGetLastError() == cudaSuccess);
  // A destroyed stream is not a stream.
  cudaStream_t s;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  FT_LAUNCH(noop_kernel, 1, 32, 0, s)(out.get());
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  FT_LAUNCH(noop_kernel, 1, 32, 0, s)(out.get());
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("cuda_emu: a host pointer passed to a kernel is reported") {
  std::vector<int> host(32);
  const std::string r = report_of([&] { FT_LAUNCH(noop_kernel, 1, 32, 0, nullptr)(host.data()); });
  CHECK(r.find("argument 1") != std::string::npos);
  CHECK(r.find("noop_kernel") != std::string::npos);
  // Null, one past the end of an allocation, and pinned host memory are fine.
  DeviceBuffer<int> out(8);
  FT_LAUNCH(noop_kernel, 1, 32, 0, nullptr)(nullptr);
  FT_LAUNCH(noop_kernel, 1, 32, 0, nullptr)(out.get() + 8);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 64) == cudaSuccess);
  FT_LAUNCH(noop_kernel, 1, 32, 0, nullptr)(static_cast<int*>(pinned));
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  int* past = reinterpret_cast<int*>(reinterpret_cast<uintptr_t>(out.get()) + 9 * sizeof(int));
  CHECK(report_of([&] { FT_LAUNCH(noop_kernel, 1, 32, 0, nullptr)(past); }) != "");
}

TEST_CASE("cuda_emu: the runtime API checks where copies point and counts device memory") {
  size_t free0 = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free0, &total) == cudaSuccess);
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, 1000) == cudaSuccess);
  CHECK(reinterpret_cast<uintptr_t>(d) % 256 == 0);
  size_t free1 = 0;
  REQUIRE(cudaMemGetInfo(&free1, &total) == cudaSuccess);
  CHECK(free0 - free1 == 1000);
  std::vector<char> h(1000, 7), back(1000, 0);
  CHECK(cudaMemcpy(d, h.data(), 1000, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemset(static_cast<char*>(d) + 10, 3, 5) == cudaSuccess);
  CHECK(cudaMemcpyAsync(back.data(), d, 1000, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
  CHECK(back[9] == 7);
  CHECK(back[10] == 3);
  CHECK(back[15] == 7);
  // Wrong kinds, a range past the allocation, memset on host memory: invalid value.
  CHECK(cudaMemcpy(h.data(), back.data(), 10, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h.data(), 10, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h.data(), 1001, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemset(h.data(), 0, 10) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h.data(), 10, cudaMemcpyDefault) == cudaSuccess);
  void* too_big = nullptr;
  CHECK(cudaMalloc(&too_big, total + 1) == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);  // twice
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);

  void* pinned = nullptr;
  CHECK(cudaMallocHost(&pinned, 64) == cudaSuccess);
  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, static_cast<char*>(pinned) + 63) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaPointerGetAttributes(&attr, h.data()) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeUnregistered);
  CHECK(cudaHostRegister(h.data(), h.size(), cudaHostRegisterDefault) == cudaSuccess);
  CHECK(cudaPointerGetAttributes(&attr, h.data()) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  CHECK(cudaHostUnregister(h.data()) == cudaSuccess);
  CHECK(cudaHostUnregister(h.data()) == cudaErrorHostMemoryNotRegistered);
  cudaGetLastError();
  int ran = 0;
  CHECK(cudaLaunchHostFunc(
            nullptr, [](void* p) { ++*static_cast<int*>(p); }, &ran) == cudaSuccess);
  CHECK(ran == 1);

  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(std::string(prop.name) == "CUDA emulation (test tool)");
  CHECK(prop.warpSize == 32);
  int count = 0, device = -1, version = 0;
  CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count >= 1);
  CHECK(cudaSetDevice(count) == cudaErrorInvalidDevice);
  CHECK(cudaGetErrorString(cudaGetLastError()) == std::string("invalid device ordinal"));
  CHECK(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 0);
  CHECK(cudaRuntimeGetVersion(&version) == cudaSuccess);
  CHECK(version == CUDART_VERSION);

  cudaEvent_t a, b;
  REQUIRE(cudaEventCreate(&a) == cudaSuccess);
  REQUIRE(cudaEventCreate(&b) == cudaSuccess);
  float ms = -1.0f;
  // Not recorded yet: an invalid handle for timing, as the runtime documents; synchronizing
  // or querying it is fine (nothing to wait for).
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventSynchronize(a) == cudaSuccess);
  CHECK(cudaEventQuery(a) == cudaSuccess);
  cudaGetLastError();
  CHECK(cudaEventRecord(a, nullptr) == cudaSuccess);
  CHECK(cudaEventRecord(b, nullptr) == cudaSuccess);
  CHECK(cudaEventSynchronize(b) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  CHECK(ms >= 0.0f);
  // Events without timing (what the device uses to order streams) are waited on, not timed.
  cudaEvent_t plain;
  REQUIRE(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventRecord(plain, nullptr) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(nullptr, plain, 0) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, a, plain) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  CHECK(cudaEventDestroy(plain) == cudaSuccess);
  CHECK(cudaEventDestroy(a) == cudaSuccess);
  CHECK(cudaEventDestroy(b) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cudaGetLastError();
}

#if FT_ASAN
__global__ void shared_overflow_kernel(float* out) {
  __shared__ float s[32];
  float* p = s;
  asm volatile("" : "+r"(p));  // hides the array's size from UBSan's checks: this is ASan's job
  p[threadIdx.x] = 1.0f;       // launched with 33 threads: thread 32 writes past the array
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x % 32];
}

// Runs `body` in a forked child with its output captured; returns that output if the child
// died (ASan aborts on the first error), "" if it exited normally.
template <typename F>
std::string child_death(F&& body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    body();
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool died = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return died ? (out.empty() ? "died silently" : out) : "";
}

TEST_CASE("cuda_emu: an out-of-bounds __shared__ write is caught by ASan") {
  // The control: the same launch within bounds survives.
  CHECK(child_death([] {
          DeviceBuffer<float> out(33);
          FT_LAUNCH(shared_overflow_kernel, 1, 32, 0, nullptr)(out.get());
        }) == "");
  const std::string static_shared = child_death([] {
    DeviceBuffer<float> out(33);
    FT_LAUNCH(shared_overflow_kernel, 1, 33, 0, nullptr)(out.get());
  });
  CHECK(static_shared.find("AddressSanitizer: global-buffer-overflow") != std::string::npos);
  CHECK(static_shared.find("shared_overflow_kernel") != std::string::npos);
  // Dynamic shared memory: reading one float past shared_bytes.
  const std::string dynamic_shared = child_death([] {
    DeviceBuffer<float> out(64);
    FT_LAUNCH(dynamic_shared_kernel, 1, 32, 31 * sizeof(float), nullptr)(out.get(), 31);
  });
  CHECK(dynamic_shared.find("AddressSanitizer: heap-buffer-overflow") != std::string::npos);
}
#endif

TEST_CASE("cuda_emu: cp.async data is stale until the wait_group that covers it") {
  std::vector<unsigned> src(64);
  for (unsigned i = 0; i < 64; ++i) src[i] = 0x1000u + i;
  DeviceBuffer<unsigned> dsrc(src), out(6 * 32);
  for (uint64_t seed : {0ull, 9ull}) {
    SeedScope scope(seed);
    FT_LAUNCH(cp_async_stages_kernel, 2, 32, 64 * sizeof(unsigned), nullptr)(out.get(), dsrc.get());
    const std::vector<unsigned> o = out.to_host();
    int bad = 0;
    for (int t = 0; t < 32; ++t) {
      const unsigned* w = o.data() + 6 * t;
      const unsigned stale = 0xffffffffu;  // dynamic shared memory's fill
      const unsigned want[6] = {stale, stale, src[t], stale, src[t], src[32 + t]};
      for (int i = 0; i < 6; ++i) bad += w[i] != want[i];
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("cuda_emu: misuse of mma, ldmatrix and cp.async is reported, naming the instruction") {
  DeviceBuffer<uint16_t> g(512);
  DeviceBuffer<float> out(64);
  const auto run = [&](int mode, int threads = 32) {
    FT_LAUNCH(warp_matrix_misuse_kernel, 1, threads, 1024, nullptr)(out.get(), g.get(), mode);
  };
  for (uint64_t seed : {0ull, 5ull, 14ull}) {
    SeedScope scope(seed);
    run(0);  // correct uses
    run(5);
    struct Case {
      int mode, threads;
      std::vector<std::string> says;
    };
    const Case cases[] = {
        {0, 16, {"mma.sync.aligned.m16n8k16", "names lane 16, which does not exist"}},
        {1, 32, {"mma.sync.aligned.m16n8k16", "exited"}},
        {2,
         32,
         {"execute different instructions", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"}},
        {3, 32, {"ldmatrix.sync.aligned.m8n8.x4.shared.b16", "is not 16-byte aligned"}},
        {4,
         32,
         {"ldmatrix.sync.aligned.m8n8.x4.shared.b16", "is not in the block's shared memory"}},
        {6, 32, {"cp.async.ca.shared.global", "cp-size 12 is not one of 4, 8, 16"}},
        {7,
         32,
         {"cp.async.ca.shared.global", "shared address", "is not aligned to the cp-size 16"}},
        {8, 32, {"cp.async.ca.shared.global", "global address", "is not aligned to the cp-size 8"}},
        {9, 32, {"cp.async.ca.shared.global", "src-size 9 is outside [0, cp-size 8]"}},
        {10, 32, {"cp.async copy(ies) never waited for", "test_emu.cpp"}},
        {11, 32, {"never waited for", "not even committed"}},
        {12, 32, {"cp.async.cg.shared.global", "is not in the block's shared memory"}},
        {13, 32, {"cp.async.cg.shared.global", "is not inside a cudaMalloc"}},
        {14, 32, {"its global source changed before the copy completed", "cp.async.wait"}},
    };
    for (const Case& k : cases) {
      CAPTURE(k.mode);
      const std::string r = report_of([&] { run(k.mode, k.threads); });
      CHECK(r.find("warp_matrix_misuse_kernel") != std::string::npos);
      for (const std::string& s : k.says) {
        CAPTURE(s);
        CHECK_MESSAGE(r.find(s) != std::string::npos, r);
      }
    }
  }
}

// Deferred streams (cuda_emu.cpp "stream order", the default): a stream's work runs when something
// waits for it. The test peeks at device memory from the host (the emulation's device memory is
// host memory) to see what has run.
TEST_CASE("cuda_emu: deferred streams run work only when something waits for it") {
  if (const char* v = std::getenv("FT_CUDA_EMU_STREAMS"); v && std::string(v) == "eager") return;
  cudaStream_t a, b, blocking;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  cudaEvent_t e, t0, t1;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreate(&t0) == cudaSuccess);
  REQUIRE(cudaEventCreate(&t1) == cudaSuccess);
  DeviceBuffer<int> x(1), y(1);
  int* const px = x.get();
  int* const py = y.get();

  // Queued, not run.
  FT_LAUNCH(set_kernel, 1, 32, 0, a)(px, 7);
  CHECK(*px == 0);
  // b reads x without waiting for a: run first, it reads the old bytes (the missing wait shows).
  FT_LAUNCH(copy_int_kernel, 1, 32, 0, b)(py, px);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(*py == 0);
  CHECK(*px == 0);
  // With the wait, b's copy runs after a's write.
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  FT_LAUNCH(copy_int_kernel, 1, 32, 0, b)(py, px);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(*py == 7);
  // A wait is for the event's record as of the wait, not for a's later work.
  FT_LAUNCH(set_kernel, 1, 32, 0, a)(px, 9);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  FT_LAUNCH(copy_int_kernel, 1, 32, 0, b)(py, px);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(*py == 7);
  CHECK(*px == 7);
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  CHECK(*px == 9);

  // Timing events whose work has not run are not ready; synchronised, they are.
  REQUIRE(cudaEventRecord(t0, a) == cudaSuccess);
  FT_LAUNCH(set_kernel, 1, 32, 0, a)(px, 10);
  REQUIRE(cudaEventRecord(t1, a) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaErrorNotReady);
  cudaGetLastError();
  REQUIRE(cudaEventSynchronize(t1) == cudaSuccess);
  CHECK(*px == 10);
  CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess);
  CHECK(ms >= 0);

  // A copy into pageable memory has completed when the call returns; into page-locked memory
  // when the stream runs it; from pageable memory it takes the bytes as they were at the call.
  FT_LAUNCH(set_kernel, 1, 32, 0, a)(px, 11);
  int pageable = 0;
  REQUIRE(cudaMemcpyAsync(&pageable, px, sizeof(int), cudaMemcpyDeviceToHost, a) == cudaSuccess);
  CHECK(pageable == 11);
  int* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)) == cudaSuccess);
  *pinned = 0;
  FT_LAUNCH(set_kernel, 1, 32, 0, a)(px, 12);
  REQUIRE(cudaMemcpyAsync(pinned, px, sizeof(int), cudaMemcpyDeviceToHost, a) == cudaSuccess);
  CHECK(*pinned == 0);
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  CHECK(*pinned == 12);
  int source = 5;
  REQUIRE(cudaMemcpyAsync(py, &source, sizeof(int), cudaMemcpyHostToDevice, a) == cudaSuccess);
  source = 6;
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  CHECK(*py == 5);

  // The legacy stream (a synchronous cudaMemcpy) runs after the blocking streams' work, not
  // after the non-blocking ones'; an implicit device synchronisation runs everything.
  FT_LAUNCH(set_kernel, 1, 32, 0, blocking)(px, 20);
  FT_LAUNCH(set_kernel, 1, 32, 0, a)(py, 21);
  int h = 0;
  REQUIRE(cudaMemcpy(&h, px, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h == 20);
  CHECK(*py == 5);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(*py == 21);

  // A deferred kernel's report comes from the call that runs it.
  DeviceBuffer<int> wide(32);  // one int a thread
  FT_LAUNCH(partial_barrier_kernel, 1, 32, 0, a)(wide.get());
  const std::string r = report_of([&] { cudaStreamSynchronize(a); });
  CHECK(r.find("partial_barrier_kernel") != std::string::npos);

  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  for (cudaEvent_t ev : {e, t0, t1}) REQUIRE(cudaEventDestroy(ev) == cudaSuccess);
  for (cudaStream_t st : {a, b, blocking}) REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("cuda_emu: stream capture records a graph; replays keep captured arguments; rules") {
  // Work on the streams must not mix with the other cases': fresh streams and buffers.
  const char* streams = std::getenv("FT_CUDA_EMU_STREAMS");
  const bool deferred = !streams || std::string(streams) != "eager";
  cudaStream_t s, side;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t fork, join;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  DeviceBuffer<int> x(1), y(1), z(1);
  int* const px = x.get();
  int* const py = y.get();
  int* const pz = z.get();
  int* host = nullptr;  // pinned staging, as a step's inputs would be
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&host), sizeof(int)) == cudaSuccess);

  // The graph: x = *host (a pinned copy), fork to `side`: y = x * 10 + v, join; z = y * 10 + 1.
  int v = 3;
  cudaStreamCaptureStatus status;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  REQUIRE(cudaMemcpyAsync(px, host, sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(side, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);  // joined the capture by the wait
  FT_LAUNCH(scale_add_kernel, 1, 32, 0, side)(py, px, v);
  REQUIRE(cudaEventRecord(join, side) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);
  FT_LAUNCH(scale_add_kernel, 1, 32, 0, s)(pz, py, 1);
  CHECK(cudaEventSynchronize(join) == cudaErrorCapturedEvent);  // recorded in the capture
  cudaGetLastError();
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  REQUIRE(cudaStreamIsCapturing(side, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);
  CHECK(*pz == 0);  // recorded, nothing ran
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);  // the executable keeps its nodes

  // Each replay reads *host as it is then; v stays the 3 it was captured with.
  for (int step : {1, 2}) {
    *host = step;
    v = 100;
    const int before = *pz;
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    if (deferred) CHECK(*pz == before);  // queued on s
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(*py == step * 10 + 3);
    CHECK(*pz == (step * 10 + 3) * 10 + 1);
  }
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);

  // A fork never joined: cudaStreamEndCapture answers cudaErrorStreamCaptureUnjoined.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);
  FT_LAUNCH(set_kernel, 1, 32, 0, side)(py, 5);
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureUnjoined);
  CHECK(graph == nullptr);
  cudaGetLastError();

  // Calls a capture forbids: each answers its error and invalidates the capture, whose later
  // work then answers cudaErrorStreamCaptureInvalidated and whose end gives no graph.
  cudaStream_t blocking;  // synchronises with the legacy stream
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  struct Forbidden {
    const char* what;
    cudaStream_t on;
    cudaError_t want;
    std::function<cudaError_t()> call;
  };
  int pageable = 0;
  void* scratch = nullptr;
  cudaEvent_t before;  // recorded outside every capture
  REQUIRE(cudaEventCreate(&before) == cudaSuccess);
  REQUIRE(cudaEventRecord(before, side) == cudaSuccess);
  auto on_another_thread = [](const std::function<cudaError_t()>& call) {
    cudaError_t r = cudaSuccess;
    std::thread([&] {
      r = call();
      cudaGetLastError();
    }).join();
    return r;
  };
  const Forbidden forbidden[] = {
      {"another thread's event query in global mode", s, cudaErrorStreamCaptureUnsupported,
       [&] { return on_another_thread([&] { return cudaEventQuery(before); }); }},
      {"an event synchronisation in global mode", s, cudaErrorStreamCaptureUnsupported,
       [&] { return cudaEventSynchronize(before); }},
      {"a synchronisation of the capturing stream", s, cudaErrorStreamCaptureUnsupported,
       [&] { return cudaStreamSynchronize(s); }},
      {"a device synchronisation", s, cudaErrorStreamCaptureUnsupported,
       [] { return cudaDeviceSynchronize(); }},
      {"cudaMalloc in global mode", s, cudaErrorStreamCaptureUnsupported,
       [&] { return cudaMalloc(&scratch, 64); }},
      {"a copy from pageable memory", s, cudaErrorStreamCaptureUnsupported,
       [&] { return cudaMemcpyAsync(px, &pageable, sizeof(int), cudaMemcpyHostToDevice, s); }},
      {"work on the legacy stream", blocking, cudaErrorStreamCaptureImplicit,
       [&] { return cudaMemsetAsync(py, 0, sizeof(int), nullptr); }},
  };
  for (const Forbidden& f : forbidden) {
    CAPTURE(f.what);
    REQUIRE(cudaStreamBeginCapture(f.on, cudaStreamCaptureModeGlobal) == cudaSuccess);
    FT_LAUNCH(set_kernel, 1, 32, 0, f.on)(px, 11);
    CHECK(f.call() == f.want);
    cudaGetLastError();
    REQUIRE(cudaStreamIsCapturing(f.on, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaMemsetAsync(px, 0, sizeof(int), f.on) == cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    CHECK(cudaStreamEndCapture(f.on, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    cudaGetLastError();
  }
  CHECK(scratch == nullptr);
  // Asking about the legacy stream beside a blocking capture: refused, the capture still valid;
  // ending a global capture from another thread: refused too.
  REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamIsCapturing(nullptr, &status) == cudaErrorStreamCaptureImplicit);
  cudaGetLastError();
  cudaError_t other_thread = cudaSuccess;
  std::thread([&] {
    other_thread = cudaStreamEndCapture(blocking, &graph);
    cudaGetLastError();
  }).join();
  CHECK(other_thread == cudaErrorStreamCaptureWrongThread);
  REQUIRE(cudaStreamIsCapturing(blocking, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  REQUIRE(cudaStreamEndCapture(blocking, &graph) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  // The legacy stream beside a non-blocking capture is no implicit synchronisation.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaMemsetAsync(py, 0, sizeof(int), nullptr) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  // Relaxed mode allows cudaMalloc meanwhile.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(cudaMalloc(&scratch, 64) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaFree(scratch) == cudaSuccess);
  // Thread-local mode: another thread may query and wait on events meanwhile; the capturing
  // thread may not.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(on_another_thread([&] { return cudaEventQuery(before); }) == cudaSuccess);
  CHECK(on_another_thread([&] { return cudaEventSynchronize(before); }) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  CHECK(cudaEventQuery(before) == cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusInvalidated);
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  REQUIRE(cudaEventDestroy(before) == cudaSuccess);
  CHECK(*px == 2);  // no node of an invalidated capture ran

  REQUIRE(cudaFreeHost(host) == cudaSuccess);
  REQUIRE(cudaEventDestroy(fork) == cudaSuccess);
  REQUIRE(cudaEventDestroy(join) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(blocking) == cudaSuccess);
}

// A deferred kernel's failure is sticky (cuda_emu.cpp "stream order"): whichever thread or call
// runs the work, the main thread's next synchronising call raises it, with the kernel's own
// report, once; another thread's synchronisation and a destructor's cudaFree raise nothing.
TEST_CASE("cuda_emu: a deferred kernel's failure is raised by the main thread's next sync") {
  if (const char* v = std::getenv("FT_CUDA_EMU_STREAMS"); v && std::string(v) == "eager") return;
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  DeviceBuffer<int> wide(32), x(1);  // one int a thread
  // The report names the threads that met the fault, which depend on the schedule: seed 0 runs
  // them in index order, so every run of the kernel gives the same report.
  SeedScope scope(0);

  // The report when the main thread's synchronisation runs the kernel.
  FT_LAUNCH(partial_barrier_kernel, 1, 32, 0, a)(wide.get());
  const std::string direct = report_of([&] { cudaStreamSynchronize(a); });
  CHECK(direct.find("partial_barrier_kernel") != std::string::npos);

  // Run by another thread's synchronisation (as a checkpoint writer's): it returns cudaSuccess.
  FT_LAUNCH(partial_barrier_kernel, 1, 32, 0, a)(wide.get());
  cudaError_t worker_rc = cudaErrorUnknown;
  std::string worker_threw;
  std::thread worker([&] {
    try {
      worker_rc = cudaStreamSynchronize(a);
    } catch (const std::exception& e) {
      worker_threw = e.what();
    }
  });
  worker.join();
  CHECK_MESSAGE(worker_threw.empty(), worker_threw);
  CHECK(worker_rc == cudaSuccess);
  // A call that does not synchronise leaves it (a launch on a deferred stream); the next
  // synchronisation, of another stream, raises it with the same report; then nothing is left.
  FT_LAUNCH(set_kernel, 1, 32, 0, b)(x.get(), 3);
  CHECK(report_of([&] { cudaStreamSynchronize(b); }) == direct);
  CHECK(x.to_host() == std::vector<int>{3});  // b's work ran before the raise
  CHECK(cudaDeviceSynchronize() == cudaSuccess);

  // Run by a destructor's cudaFree: no throw there; the next synchronisation raises it.
  {
    DeviceBuffer<int> scratch(32);
    FT_LAUNCH(partial_barrier_kernel, 1, 32, 0, a)(scratch.get());
  }
  CHECK(report_of([&] { cudaDeviceSynchronize(); }) == direct);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);

  for (cudaStream_t st : {a, b}) REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
}

}  // namespace
}  // namespace ft::kernels::cuda
