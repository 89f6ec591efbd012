// CUDA embedding (kernels/cuda/embedding.cu) against the CPU reference
// (kernels/cpu/embedding.cpp) under the emulator's schedule seeds: ids with duplicates (the
// backward's order-dependent sums) and ids outside the vocabulary shard, the whole table
// (v_count < 0), odd widths, whole packs, a misaligned pointer, more columns than one backward
// block covers, each dtype.
//
// Tolerance: none. The forward is a copy; the backward adds each row's tokens in token order
// onto dtable, the CPU's very additions, so dtable must match bit for bit.
#include <doctest/doctest.h>

#include <random>
#include <utility>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/kernel_check.h"

namespace {

using namespace ft::cuda_test;
namespace k = ft::kernels;

template <typename T>
void check_embedding(int N, int C, int v_begin, int v_count, size_t offset) {
  INFO(std::string(type_name<T>()) << " N=" << N << " C=" << C << " shard=[" << v_begin << ", +"
                                   << v_count << ") offset=" << offset);
  const int V = 37;  // the full vocabulary; the shard's table has v_count (or V) rows
  const int rows = v_count < 0 ? V : v_count;
  const uint32_t s = uint32_t(N * 100 + C);
  // ids over [0, V): with N ≥ 19 many repeat; a few are forced to one id (a long run of
  // duplicates, e.g. padding) and to ids outside the shard.
  std::vector<int32_t> ids(N);
  std::mt19937 gen(s);
  for (int n = 0; n < N; ++n) ids[n] = int32_t(gen() % V);
  for (int n = 0; n < N; n += 3) ids[n] = 5;
  if (N > 4) ids[N - 1] = V - 1, ids[1] = 0;
  const auto table = random_values<T>(size_t(rows) * C, -1.f, 1.f, s + 1);
  const auto dout = random_values<T>(size_t(N) * C, -1.f, 1.f, s + 2);
  const auto dtable0 = random_values<float>(size_t(rows) * C, -1.f, 1.f, s + 3);

  std::vector<T> out_ref(size_t(N) * C);
  std::vector<float> dtable_ref = dtable0;
  k::embedding_forward(out_ref.data(), ids.data(), table.data(), N, C, v_begin, v_count);
  k::embedding_backward(dtable_ref.data(), ids.data(), dout.data(), N, C, v_begin, v_count);

  const auto out = run_all_seeds([&] {
    DeviceBuf<int32_t> dids(ids);
    DeviceBuf<T> dtab(table, offset), ddout(dout, offset);
    // out starts as 7s: the zero rows of ids outside the shard must be written, not left.
    DeviceBuf<T> dout_(std::vector<T>(size_t(N) * C, ft::from_f32<T>(7.f)), offset);
    DeviceBuf<float> ddt(dtable0, offset);
    k::cuda::embedding_forward(dout_.get(), dids.get(), dtab.get(), N, C, v_begin, v_count,
                               nullptr);
    k::cuda::embedding_backward(ddt.get(), dids.get(), ddout.get(), N, C, v_begin, v_count,
                                nullptr);
    return std::vector<std::vector<uint8_t>>{to_bytes(dout_.download()), to_bytes(ddt.download())};
  });
  CHECK(same_bits(from_bytes<T>(out[0]), out_ref));
  const auto dtable = from_bytes<float>(out[1]);
  CHECK(same_bits(dtable, dtable_ref));
}

template <typename T>
void check_embedding_shapes() {
  for (auto [N, C] : {std::pair{1, 19}, {19, 1}, {19, 64}, {111, 111}, {111, 64}}) {
    check_embedding<T>(N, C, 0, -1, 0);   // the whole table
    check_embedding<T>(N, C, 10, 20, 0);  // a shard: ids below 10 and from 30 are skipped
  }
  check_embedding<T>(19, 64, 3, 30, 1);   // whole packs, misaligned: the scalar paths
  check_embedding<T>(19, 600, 0, -1, 0);  // two column chunks of the backward
}

}  // namespace

TEST_CASE("cuda_emu embedding: forward and backward against the CPU, every seed bit-identical") {
  check_embedding_shapes<float>();
  check_embedding_shapes<bf16>();
  check_embedding_shapes<f16>();
}

TEST_CASE("cuda_emu embedding: no tokens launch nothing") {
  // An empty grid is a launch error; the launchers must return before it.
  CHECK_NOTHROW(k::cuda::embedding_forward<bf16>(nullptr, nullptr, nullptr, 0, 64, 0, -1, nullptr));
  CHECK_NOTHROW(
      k::cuda::embedding_backward<bf16>(nullptr, nullptr, nullptr, 0, 64, 0, -1, nullptr));
  CHECK(cudaGetLastError() == cudaSuccess);
}
