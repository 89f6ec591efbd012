// Streaming data loader over a shard folder (DESIGN.md §6).
//
// The sample stream: position j is sample perm_e[j mod N] of epoch e = j div N, N samples per
// epoch. Step s trains on positions [s*G, (s+1)*G). This rank reads only its own slice
// [s*G + rank_offset, s*G + rank_offset + rank_count) of each step, in a background thread that
// keeps `prefetch` steps ready, so memory is bounded by the prefetch depth, never the data size.
// The loader's whole position is the next step index: a checkpoint saves that one number.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ft {

class ShardSet;  // lib/data/shard.h

struct StepSamples {
  int64_t step = 0;
  int count = 0;                 // samples (rows)
  int seq_len = 0;               // T
  std::vector<int32_t> inputs;   // (count, T)
  std::vector<int32_t> targets;  // (count, T)
  std::vector<uint8_t> mask;     // (count, T): 1 = this target is trained on
};

struct LoaderOptions {
  std::string dir;  // shard folder
  int seq_len = 0;  // T
  bool shuffle = true;
  uint64_t seed = 0;           // run.seed
  int64_t global_batch = 1;    // G
  int64_t rank_offset = 0;     // this rank's first sample within each global batch
  int64_t rank_count = 1;      // samples this rank takes per step
  int prefetch = 4;            // steps kept ready by the background thread (0: next() reads)
  int64_t expected_vocab = 0;  // 0: not checked; else shards' vocab_size must be <= this
  std::string expected_tokenizer_sha256;  // empty: not checked
};

class DataLoader {
 public:
  explicit DataLoader(
      const LoaderOptions& opt);  // opens and validates every shard (errors name the file)
  ~DataLoader();
  uint64_t samples_per_epoch() const;
  // Positions the stream so that the next call to next() returns step `step`.
  void seek(int64_t step);
  // The samples of the next step for this rank (blocks until the prefetcher has them).
  StepSamples next();
  int64_t position() const;  // the next step index next() will return

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The epoch permutation of [0, n): identity without shuffle; otherwise a bijection seeded by
// (seed, epoch), computed per index in O(1) memory. Exposed for tests and reference scripts.
uint64_t sample_order(uint64_t index, uint64_t n, bool shuffle, uint64_t seed, uint64_t epoch);

}  // namespace ft
