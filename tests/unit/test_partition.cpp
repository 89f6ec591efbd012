// The two splits of lib/parallel/partition.h, which the pipeline, ZeRO, the checkpoint pieces and
// `ft plan` all call: pipeline stages over layers and ZeRO shards over elements. Worked cases
// (even, uneven, one rank, more ranks than layers or elements, empty), then sweeps over odd
// sizes that check the invariants every user relies on: the parts tile [0, n) in rank order,
// and their sizes differ by at most one (stages) or are ⌈n/D⌉ but for the tail (shards).
#include <doctest/doctest.h>

#include <vector>

#include "core/error.h"
#include "parallel/partition.h"

using ft::LayerRange;
using ft::ShardRange;
using ft::stage_layers;
using ft::zero_shard;
using ft::zero_shard_size;

namespace {

std::vector<std::pair<int, int>> stages(int L, int P) {
  std::vector<std::pair<int, int>> out;
  for (int p = 0; p < P; ++p) {
    const LayerRange r = stage_layers(L, p, P);
    out.emplace_back(r.first, r.last);
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> shards(size_t n, int D) {
  std::vector<std::pair<size_t, size_t>> out;
  for (int d = 0; d < D; ++d) {
    const ShardRange r = zero_shard(n, D, d);
    out.emplace_back(r.begin, r.end);
  }
  return out;
}

using Stages = std::vector<std::pair<int, int>>;
using Shards = std::vector<std::pair<size_t, size_t>>;

}  // namespace

TEST_CASE("partition: pipeline stages, worked cases") {
  CHECK(stages(4, 1) == Stages{{0, 4}});                  // one stage holds everything
  CHECK(stages(4, 2) == Stages{{0, 2}, {2, 4}});          // even
  CHECK(stages(3, 2) == Stages{{0, 2}, {2, 3}});          // the first stage takes the extra one
  CHECK(stages(4, 3) == Stages{{0, 2}, {2, 3}, {3, 4}});  // test_layouts' pipeline 3: 2+1+1
  CHECK(stages(5, 3) == Stages{{0, 2}, {2, 4}, {4, 5}});
  CHECK(stages(19, 4) == Stages{{0, 5}, {5, 10}, {10, 15}, {15, 19}});
  CHECK(stages(3, 3) == Stages{{0, 1}, {1, 2}, {2, 3}});  // one layer each
  // More stages than layers (validation refuses it, the split stays defined): the first L
  // stages take one layer each, the rest none, and no range runs past L.
  CHECK(stages(2, 4) == Stages{{0, 1}, {1, 2}, {2, 2}, {2, 2}});
  CHECK(stages(0, 2) == Stages{{0, 0}, {0, 0}});
  CHECK(stage_layers(3, 1, 2).size() == 1);
  CHECK_THROWS_AS(stage_layers(4, 2, 2), ft::Error);  // no stage 2 of 2
  CHECK_THROWS_AS(stage_layers(4, 0, 0), ft::Error);
}

TEST_CASE("partition: pipeline stages tile the layers, sizes differ by at most one") {
  for (int L : {1, 2, 7, 19, 111})
    for (int P : {1, 2, 3, 5, 8, 19}) {
      CAPTURE(L);
      CAPTURE(P);
      int at = 0, prev = L + 1;
      for (int p = 0; p < P; ++p) {
        const LayerRange r = stage_layers(L, p, P);
        CHECK(r.first == at);
        CHECK(r.size() >= 0);
        CHECK(r.size() <= prev);  // never a longer stage after a shorter one
        CHECK(r.size() >= L / P);
        CHECK(r.size() <= L / P + 1);
        at = r.last;
        prev = r.size();
      }
      CHECK(at == L);
    }
}

TEST_CASE("partition: ZeRO shards, worked cases") {
  CHECK(zero_shard_size(10, 1) == 10);
  CHECK(shards(10, 1) == Shards{{0, 10}});                          // one rank owns everything
  CHECK(shards(12, 4) == Shards{{0, 3}, {3, 6}, {6, 9}, {9, 12}});  // even
  // Uneven: ⌈10/4⌉ = 3 each, the last shard short (its buffer padded to 3).
  CHECK(zero_shard_size(10, 4) == 3);
  CHECK(shards(10, 4) == Shards{{0, 3}, {3, 6}, {6, 9}, {9, 10}});
  // ⌈9/4⌉ = 3 leaves the last rank nothing: an empty range at n, not past it.
  CHECK(shards(9, 4) == Shards{{0, 3}, {3, 6}, {6, 9}, {9, 9}});
  // More ranks than elements: one element each, then empty ranges.
  CHECK(zero_shard_size(3, 5) == 1);
  CHECK(shards(3, 5) == Shards{{0, 1}, {1, 2}, {2, 3}, {3, 3}, {3, 3}});
  // An empty group (another pipeline stage's): every shard empty.
  CHECK(zero_shard_size(0, 3) == 0);
  CHECK(shards(0, 3) == Shards{{0, 0}, {0, 0}, {0, 0}});
  CHECK(zero_shard(10, 4, 3).size() == 1);
  CHECK_THROWS_AS(zero_shard(10, 4, 4), ft::Error);  // no data rank 4 of 4
  CHECK_THROWS_AS(zero_shard_size(10, 0), ft::Error);
}

TEST_CASE("partition: ZeRO shards tile the group in rank order, each within ⌈n/D⌉") {
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(496), size_t(1) << 33})
    for (int D : {1, 2, 3, 4, 7, 19, 128}) {
      CAPTURE(n);
      CAPTURE(D);
      const size_t s = zero_shard_size(n, D);
      CHECK(s * size_t(D) >= n);  // D buffers of s hold the group (the all-gather's size)
      CHECK(s * size_t(D) < n + size_t(D));  // ... with less than one element per rank padding
      size_t at = 0;
      for (int d = 0; d < D; ++d) {
        const ShardRange r = zero_shard(n, D, d);
        CHECK(r.begin == at);
        CHECK(r.size() <= s);
        // Only the shards at the tail may be short: every shard before them is full.
        if (r.end < n) CHECK(r.size() == s);
        at = r.end;
      }
      CHECK(at == n);
    }
}
