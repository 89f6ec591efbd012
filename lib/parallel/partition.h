// How work is cut among ranks: the one place each split is computed. What runs (the pipeline
// stages of lib/parallel/pipeline.cpp, the ZeRO shards of lib/parallel/zero.cpp, the pieces each
// rank writes to a checkpoint in lib/train/train_state.cpp) and what `ft plan` predicts
// (lib/train/plan.cpp) call these, so the plan describes exactly the split that runs.
// Pure arithmetic: no buffers, no communicators.
#pragma once

#include <cstddef>

namespace ft {

// Layers [first, last) of one pipeline stage.
struct LayerRange {
  int first = 0, last = 0;
  int size() const { return last - first; }
};

// Stage p of P over L layers: contiguous, as even as possible, the first L mod P stages taking
// one layer more (3 layers on 2 stages: [0, 2), [2, 3)), so that the stage that also embeds
// is never the one left short. With more stages than layers the last P − L stages are empty
// (recipe validation refuses that layout; the split itself stays defined).
LayerRange stage_layers(int n_layers, int p, int P);

// The part of the model one pipeline stage runs: layers [first_layer, last_layer), plus the
// embedding on the first stage and the final norm, head and loss on the last (DESIGN.md §3).
struct StageSpec {
  int first_layer = 0, last_layer = -1;  // -1: up to the last layer
  bool embed = true, head = true;
};
// Stage p of P over L layers: stage_layers' layers, the embedding on the first stage, the head on
// the last.
StageSpec pipeline_stage(int n_layers, int p, int P);

// Elements [begin, end) of a flat buffer.
struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// ZeRO (lib/parallel/zero.h) cuts a group of n elements into D shards of ⌈n / D⌉ elements each,
// the last one padded: every rank's shard buffer has the same length, as all-gather and
// reduce-scatter need. Checkpoints cut each group the same way at every ZeRO stage, so each
// data rank writes 1/D of the state.
size_t zero_shard_size(size_t n, int D);
// The elements data rank d of D owns: [d·s, min(n, (d+1)·s)) with s = zero_shard_size(n, D);
// empty (at n) for the ranks past the end when D does not divide n, or when D > n.
ShardRange zero_shard(size_t n, int D, int d);

}  // namespace ft
