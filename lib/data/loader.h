// Streaming data loader over a shard folder (DESIGN.md §6).
//
// The sample stream: position j is sample perm_e[j mod N] of epoch e = j div N, N samples per
// epoch. Step s trains on positions [s*G, (s+1)*G). This rank reads only its own slice
// [s*G + rank_offset, s*G + rank_offset + rank_count) of each step, in a background thread that
// keeps `prefetch` steps ready, so memory is bounded by the prefetch depth, never the data size.
// The loader's whole position is the next step index: a checkpoint saves that one number.
//
// Samples are windows of T (input, target) pairs. Unpacked, sample k of a shard is its tokens
// [k*T, k*T + T + 1), across document boundaries. Packed (LoaderOptions::pack, DESIGN.md §6),
// a sample is a run of whole documents: see pack_documents below.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ft {

class ShardSet;  // lib/data/shard.h

struct StepSamples {
  int64_t step = 0;
  // The run-wide index of row 0: step · global batch + this rank's offset in it. Row r is sample
  // first_sample + r on every layout (per-sample randomness, LoRA's dropout, is keyed by it).
  uint64_t first_sample = 0;
  int count = 0;                 // samples (rows)
  int seq_len = 0;               // T
  std::vector<int32_t> inputs;   // (count, T)
  std::vector<int32_t> targets;  // (count, T)
  std::vector<uint8_t> mask;     // (count, T): 1 = this target is trained on
  // (count, T) with data.pack: the segment id of each position (non-decreasing along a row;
  // one id per packed sample, another for the padding after them); empty otherwise.
  std::vector<int32_t> seg;
  // With LoaderOptions::preference: the data set's index of each pair of this rank (count / 2
  // values); its rows are 2p (chosen) and 2p + 1 (rejected). Empty otherwise.
  std::vector<uint64_t> pair_index;
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
  bool pack = false;                      // data.pack: whole documents per window, with seg
  bool pack_split = true;                 // data.pack_overflow: split (true) or drop (false)
  // training.objective dpo: the shards hold preference pairs (format ft-preference) and a sample
  // is a pair, two rows (see "Preference pairs" below). global_batch, rank_offset and rank_count
  // then count pairs.
  bool preference = false;
};

// Preference pairs (DESIGN.md §6). Pair k of a shard is its documents 2k (chosen) and 2k + 1
// (rejected); each becomes one row of T (input, target) pairs: a sequence of n tokens fills n - 1
// positions, padding (input 0, target 0, mask 0) the rest. A sequence with n - 1 > T is cut to
// its first T + 1 tokens (its completion loses its end); a pair where either sequence is cut with
// no trained target among its first T (the prompt alone fills the window), or has fewer than 2
// tokens, is dropped. (An uncut sequence's mask is not read here: one with no trained target,
// which ft tokenize never writes, keeps its row.) Pairs keep shard order, then document order; the
// host keeps 32 bytes per pair.
struct PreferenceStats {
  uint64_t pairs = 0;    // in the shards
  uint64_t cut = 0;      // kept, with at least one sequence cut to T + 1 tokens
  uint64_t dropped = 0;  // left out: a prompt that does not fit, or an empty sequence
  uint64_t kept() const { return pairs - dropped; }
};
// What a preference loader at window length seq_len makes of a folder (ft inspect).
PreferenceStats preference_stats(ShardSet& set, int seq_len);

// Packing. A document of n tokens gives n - 1 (input, target) pairs, so it fills n - 1 positions
// of a window of T. Documents are taken in shard order, then document order; one with n < 2
// has no target and is skipped; one with n - 1 > T is split (pieces of tokens [k*T, k*T + T + 1)
// of the document, each a document of its own, the last one shorter; a last piece of one token
// is no piece) or dropped. Pieces fill windows greedily in that order: a window takes the next
// piece while it fits, else the next window starts. Positions after the last piece are padding
// (input 0, target 0, mask 0). Segment ids number the pieces of a window 0, 1, ...; the padding
// gets the next id. The host keeps 16 bytes per piece and 8 per window, so a folder of many
// million documents costs tens of MiB, read (doc_offsets only) when the loader opens.
struct PackingStats {
  uint64_t documents = 0;        // documents in the shards
  uint64_t short_documents = 0;  // of fewer than 2 tokens: nothing to train on, skipped
  uint64_t long_documents = 0;   // longer than a window: split or dropped
  uint64_t dropped_tokens = 0;   // tokens of the dropped documents
  uint64_t pieces = 0;           // what the windows hold: documents, or parts of split ones
  uint64_t windows = 0;          // samples per epoch
  uint64_t positions = 0;        // windows * T
  uint64_t filled = 0;           // positions that hold a piece's (input, target) pair
  double efficiency() const { return positions ? double(filled) / double(positions) : 0.0; }
};
// The packing of a shard folder at window length seq_len (what a packed loader trains on).
PackingStats packing_stats(ShardSet& set, int seq_len, bool split);

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
  // With LoaderOptions::pack: how the documents were packed; null otherwise.
  const PackingStats* packing() const;
  // With LoaderOptions::preference: the pairs kept, cut and dropped; null otherwise.
  const PreferenceStats* preference() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The epoch permutation of [0, n): identity without shuffle; otherwise a bijection seeded by
// (seed, epoch), computed per index in O(1) memory. Exposed for tests and reference scripts.
uint64_t sample_order(uint64_t index, uint64_t n, bool shuffle, uint64_t seed, uint64_t epoch);

}  // namespace ft
