#include "parallel/partition.h"

#include <algorithm>

#include "core/error.h"

namespace ft {

LayerRange stage_layers(int L, int p, int P) {
  FT_CHECK(L >= 0 && P > 0 && p >= 0 && p < P, "pipeline stage ", p, " of ", P, " over ", L,
           " layers");
  const int base = L / P, extra = L % P;
  LayerRange r;
  r.first = p * base + std::min(p, extra);
  r.last = r.first + base + (p < extra ? 1 : 0);
  return r;
}

size_t zero_shard_size(size_t n, int D) {
  FT_CHECK(D > 0, "ZeRO over ", D, " data ranks");
  return (n + size_t(D) - 1) / size_t(D);
}

ShardRange zero_shard(size_t n, int D, int d) {
  FT_CHECK(d >= 0 && d < D, "ZeRO shard of data rank ", d, " of ", D);
  const size_t s = zero_shard_size(n, D);
  const size_t begin = std::min(n, size_t(d) * s);
  return {begin, std::min(n, begin + s)};
}

StageSpec pipeline_stage(int L, int p, int P) {
  const LayerRange layers = stage_layers(L, p, P);
  StageSpec s;
  s.first_layer = layers.first;
  s.last_layer = layers.last;
  s.embed = p == 0;
  s.head = p == P - 1;
  return s;
}

}  // namespace ft
