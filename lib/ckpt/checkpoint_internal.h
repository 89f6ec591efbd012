// What the checkpoint sources (folders.cpp, manifest.cpp, reshard.cpp, writer.cpp) share beyond
// the public checkpoint.h and the file primitives of io.h: the size limits a manifest is held
// to, and the listing of step folders. Internal to lib/ckpt.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ft::ckpt {

// Size limits of what a manifest may describe. They are far above any model ft trains on a CPU
// cluster and far below what would overflow 64-bit byte counts, so that a damaged number is
// refused before it sizes an allocation, a loop or a file offset.
constexpr int64_t kMaxStep = int64_t(1) << 40;
constexpr int64_t kMaxRanks = int64_t(1) << 20;
constexpr int64_t kMaxModelDim = int64_t(1) << 24;  // dim, ffn_dim, vocab_size, max_seq_len
constexpr int64_t kMaxLayers = 10000;
constexpr uint64_t kMaxElements = uint64_t(1) << 40;  // of the whole model (tensor size 1)
constexpr uint64_t kMaxBytes = kMaxElements * 4 * 3;  // parameters and both moments, f32

// The step folders under dir (step_N, not set-aside ones), newest first: (step, path).
std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir);

}  // namespace ft::ckpt
