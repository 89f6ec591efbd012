// Streaming loader (see loader.h for the sample-stream contract, DESIGN.md §6 for samples).
//
// Invariants:
//   - N = sum over shards of floor((n_tokens - 1) / T); sample i lives in the shard s with
//     first_sample[s] <= i < first_sample[s+1], at token offset (i - first_sample[s]) * T.
//   - Steps come out of next() strictly in order; the prefetch thread produces steps
//     position_, position_+1, ... into a queue of at most `prefetch` entries, so memory is
//     prefetch * rank_count * T * 9 bytes (13 packed: the segment ids) plus the ShardSet's open
//     files, whatever N is.
//   - An exception in the prefetch thread is stored and rethrown by next() once the steps
//     produced before it have been handed out; the loader then stays failed until seek().
//   - Packed: N = the number of windows; window i holds pieces[first_piece[i] ..
//     first_piece[i+1]), whose lengths minus one sum to at most T (loader.h: packing).
//   - Preference: N = the pairs kept; pair i is pairs[i], whose two sequences are at most
//     T + 1 tokens each (loader.h: preference pairs); a step's rows are twice its samples.
#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "data/shard.h"

namespace ft {

// ---- sample_order ------------------------------------------------------------------------
//
// Exact algorithm (reference scripts reproduce it bit for bit; tests/unit/test_data_loader.cpp
// pins some values):
//   splitmix64(z): z += 0x9E3779B97F4A7C15;
//                  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//                  z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//                  return z ^ (z >> 31)                      (all arithmetic mod 2^64)
//   Without shuffle, or n <= 1: return index.
//   b = bit length of n - 1, at least 2; h = ceil(b / 2); mask = 2^h - 1. The Feistel network
//   permutes [0, 4^h), the smallest even-bit power of two >= n (so 4^h < 4n).
//   Round keys: base = splitmix64(splitmix64(seed) ^ epoch); key_r = splitmix64(base + r),
//   r = 0..5.
//   One pass over x: for r in 0..5: L = x >> h, R = x & mask;
//                                   x = (R << h) | (L ^ (splitmix64(R ^ key_r) & mask)).
//   Cycle walking: x = index; repeat one pass until x < n; return x.
// Each round is invertible, so a pass is a bijection of [0, 4^h); walking the cycle of that
// bijection until it re-enters [0, n) restricts it to a bijection of [0, n). Expected passes
// per index are 4^h / n < 4. Six rounds of a strong mixing function give orders that look
// random to any training run; no cryptographic strength is claimed or needed.

namespace {

constexpr int kFeistelRounds = 6;

// A run of one document's tokens that a packed window holds (loader.h: packing).
struct Piece {
  uint64_t start = 0;  // token index in the shard
  uint32_t shard = 0;
  uint32_t len = 0;  // tokens, 2 .. T + 1
};

// The greedy packing of loader.h. With `pieces` and `first_piece` null only the figures are
// made (ft inspect); otherwise the pieces and each window's first piece (windows + 1 values).
PackingStats pack_documents(ShardSet& set, int seq_len, bool split, std::vector<Piece>* pieces,
                            std::vector<uint64_t>* first_piece) {
  const uint64_t T = uint64_t(seq_len);
  PackingStats st;
  uint64_t used = T + 1;  // positions taken in the current window; > T: no window open
  auto add = [&](uint32_t shard, uint64_t start, uint64_t len) {
    if (used + (len - 1) > T) {  // the next window
      ++st.windows;
      used = 0;
      if (first_piece) first_piece->push_back(st.pieces);
    }
    used += len - 1;
    st.filled += len - 1;
    ++st.pieces;
    if (pieces) pieces->push_back(Piece{start, shard, uint32_t(len)});
  };
  for (size_t s = 0; s < set.shards().size(); ++s) {
    const std::vector<uint64_t> offsets = set.read_doc_offsets(s);
    const uint64_t n_tokens = set.shards()[s].num_tokens;
    st.documents += offsets.size();
    for (size_t d = 0; d < offsets.size(); ++d) {
      const uint64_t begin = offsets[d], end = d + 1 < offsets.size() ? offsets[d + 1] : n_tokens;
      const uint64_t n = end - begin;
      if (n < 2) {
        ++st.short_documents;
        continue;
      }
      if (n - 1 <= T) {
        add(uint32_t(s), begin, n);
        continue;
      }
      ++st.long_documents;
      if (!split) {
        st.dropped_tokens += n;
        continue;
      }
      for (uint64_t k = 0; k * T + 1 < n; ++k)
        add(uint32_t(s), begin + k * T, std::min(T + 1, n - k * T));
    }
  }
  if (first_piece) first_piece->push_back(st.pieces);
  st.positions = st.windows * T;
  return st;
}

}  // namespace

// A kept preference pair: both sequences already cut to at most T + 1 tokens.
struct Pair {
  uint64_t chosen = 0, rejected = 0;  // token index in the shard
  uint32_t shard = 0;
  uint32_t chosen_len = 0, rejected_len = 0;
};

// The pairs of loader.h's "Preference pairs" (null `pairs`: only the figures). Only a sequence
// longer than a window has its mask read (its first T targets), so opening costs the
// doc_offsets and one small read per over-long sequence, not a pass over the data.
PreferenceStats list_pairs(ShardSet& set, int seq_len, std::vector<Pair>* pairs) {
  const uint64_t T = uint64_t(seq_len);
  PreferenceStats st;
  std::vector<int32_t> tokens(T + 1);
  std::vector<uint8_t> mask(T + 1);
  for (size_t s = 0; s < set.shards().size(); ++s) {
    const std::vector<uint64_t> offsets = set.read_doc_offsets(s);
    const uint64_t end = set.shards()[s].num_tokens;
    // Sequence d's start and length, and whether it fits: cut to T + 1 tokens, with a target
    // the loss counts among them.
    auto sequence = [&](size_t d, uint64_t* start, uint32_t* len, bool* cut) {
      *start = offsets[d];
      const uint64_t n = (d + 1 < offsets.size() ? offsets[d + 1] : end) - *start;
      if (n < 2) return false;
      *cut = n - 1 > T;
      *len = uint32_t(std::min(n, T + 1));
      if (!*cut) return true;
      set.read(s, *start, T + 1, tokens.data(), mask.data());
      return std::find(mask.begin() + 1, mask.end(), uint8_t(1)) != mask.end();
    };
    for (size_t d = 0; d + 1 < offsets.size(); d += 2) {
      ++st.pairs;
      Pair p;
      p.shard = uint32_t(s);
      bool cut_c = false, cut_r = false;
      if (!sequence(d, &p.chosen, &p.chosen_len, &cut_c) ||
          !sequence(d + 1, &p.rejected, &p.rejected_len, &cut_r)) {
        ++st.dropped;
        continue;
      }
      if (cut_c || cut_r) ++st.cut;
      if (pairs) pairs->push_back(p);
    }
  }
  return st;
}

PackingStats packing_stats(ShardSet& set, int seq_len, bool split) {
  FT_CHECK(seq_len >= 1, "packing_stats: seq_len ", seq_len);
  return pack_documents(set, seq_len, split, nullptr, nullptr);
}

uint64_t sample_order(uint64_t index, uint64_t n, bool shuffle, uint64_t seed, uint64_t epoch) {
  FT_CHECK(index < n, "sample index ", index, " out of range for ", n, " samples");
  if (!shuffle || n <= 1) return index;
  int bits = 64 - __builtin_clzll(n - 1);  // n >= 2, so n - 1 >= 1
  bits = std::max(bits, 2);
  const int h = (bits + 1) / 2;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  const uint64_t base = splitmix64(splitmix64(seed) ^ epoch);
  uint64_t keys[kFeistelRounds];
  for (int r = 0; r < kFeistelRounds; ++r) keys[r] = splitmix64(base + uint64_t(r));
  uint64_t x = index;
  do {
    for (int r = 0; r < kFeistelRounds; ++r) {
      const uint64_t left = x >> h, right = x & mask;
      x = (right << h) | (left ^ (splitmix64(right ^ keys[r]) & mask));
    }
  } while (x >= n);
  return x;
}

// ---- DataLoader --------------------------------------------------------------------------

struct DataLoader::Impl {
  LoaderOptions opt;
  std::unique_ptr<ShardSet> set;
  std::vector<uint64_t> first_sample;  // (shards + 1,) prefix sums of samples per shard
  uint64_t n = 0;                      // samples per epoch
  std::vector<int32_t> window;         // (T + 1,) scratch of the prefetch thread
  std::vector<uint8_t> window_mask;    // (T + 1,)
  // Packed (loader.h): the pieces in packing order, window i's first piece (N + 1 values).
  PackingStats packing;
  std::vector<Piece> pieces;
  std::vector<uint64_t> first_piece;
  // Preference (loader.h): the kept pairs, in shard and document order.
  PreferenceStats preference;
  std::vector<Pair> pairs;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<StepSamples> ready;  // steps position .. position + ready.size() - 1
  int64_t position = 0;           // the step next() returns next
  std::exception_ptr error;       // from the prefetch thread
  bool stop = false;
  std::thread worker;

  // Fills rank slice of step `step`. Reads happen on the calling thread.
  StepSamples produce(int64_t step) {
    const int T = opt.seq_len;
    StepSamples out;
    out.step = step;
    out.first_sample = uint64_t(step) * uint64_t(opt.global_batch) + uint64_t(opt.rank_offset);
    out.count = int(opt.rank_count);
    if (opt.preference) return produce_pairs(std::move(out));
    out.seq_len = T;
    out.inputs.resize(size_t(opt.rank_count) * T);
    out.targets.resize(size_t(opt.rank_count) * T);
    out.mask.resize(size_t(opt.rank_count) * T);
    if (opt.pack) out.seg.resize(size_t(opt.rank_count) * T);
    for (int64_t r = 0; r < opt.rank_count; ++r) {
      const uint64_t j =
          uint64_t(step) * uint64_t(opt.global_batch) + uint64_t(opt.rank_offset + r);
      const uint64_t epoch = j / n, entry = j % n;
      const uint64_t sample = sample_order(entry, n, opt.shuffle, opt.seed, epoch);
      if (opt.pack) {
        fill_packed(sample, out, size_t(r) * T);
        continue;
      }
      // The shard holding `sample`: the last s with first_sample[s] <= sample.
      const auto after = std::upper_bound(first_sample.begin(), first_sample.end(), sample);
      const size_t s = size_t(after - first_sample.begin()) - 1;
      const uint64_t start = (sample - first_sample[s]) * uint64_t(T);
      set->read(s, start, uint64_t(T) + 1, window.data(), window_mask.data());
      const size_t row = size_t(r) * T;
      std::copy(window.begin(), window.begin() + T, out.inputs.begin() + row);
      std::copy(window.begin() + 1, window.end(), out.targets.begin() + row);
      // Target i is token start+1+i; its mask is loss_mask at that position.
      std::copy(window_mask.begin() + 1, window_mask.end(), out.mask.begin() + row);
    }
    return out;
  }

  // A step's pairs: each sample two rows, chosen then rejected, as the packed path fills a row
  // (targets shifted by one, padding after the sequence).
  StepSamples produce_pairs(StepSamples out) {
    const int T = opt.seq_len;
    const uint64_t first_pair = out.first_sample;
    out.first_sample = 2 * first_pair;  // rows: every row keys its own randomness
    out.count = 2 * int(opt.rank_count);
    out.seq_len = T;
    const size_t cells = size_t(out.count) * size_t(T);
    out.inputs.resize(cells);
    out.targets.resize(cells);
    out.mask.resize(cells);
    out.pair_index.resize(size_t(opt.rank_count));
    auto fill = [&](uint32_t shard, uint64_t start, uint32_t len, size_t row) {
      set->read(shard, start, len, window.data(), window_mask.data());
      const size_t m = len - 1, at = row * size_t(T), end = at + size_t(T);
      std::copy(window.begin(), window.begin() + m, out.inputs.begin() + at);
      std::copy(window.begin() + 1, window.begin() + m + 1, out.targets.begin() + at);
      std::copy(window_mask.begin() + 1, window_mask.begin() + m + 1, out.mask.begin() + at);
      std::fill(out.inputs.begin() + at + m, out.inputs.begin() + end, 0);
      std::fill(out.targets.begin() + at + m, out.targets.begin() + end, 0);
      std::fill(out.mask.begin() + at + m, out.mask.begin() + end, uint8_t(0));
    };
    for (int64_t r = 0; r < opt.rank_count; ++r) {
      const uint64_t j = first_pair + uint64_t(r);
      const uint64_t i = sample_order(j % n, n, opt.shuffle, opt.seed, j / n);
      const Pair& p = pairs[i];
      out.pair_index[size_t(r)] = i;
      fill(p.shard, p.chosen, p.chosen_len, size_t(2 * r));
      fill(p.shard, p.rejected, p.rejected_len, size_t(2 * r + 1));
    }
    return out;
  }

  // Row `row` (element offset) of `out` from packed window `w`.
  void fill_packed(uint64_t w, StepSamples& out, size_t row) {
    const int T = opt.seq_len;
    size_t at = row;
    int32_t seg = 0;
    for (uint64_t k = first_piece[w]; k < first_piece[w + 1]; ++k, ++seg) {
      const Piece& p = pieces[k];
      set->read(p.shard, p.start, p.len, window.data(), window_mask.data());
      const size_t m = p.len - 1;  // its (input, target) pairs
      std::copy(window.begin(), window.begin() + m, out.inputs.begin() + at);
      std::copy(window.begin() + 1, window.begin() + m + 1, out.targets.begin() + at);
      std::copy(window_mask.begin() + 1, window_mask.begin() + m + 1, out.mask.begin() + at);
      std::fill(out.seg.begin() + at, out.seg.begin() + at + m, seg);
      at += m;
    }
    const size_t end = row + size_t(T);  // padding: never a target, a segment of its own
    std::fill(out.inputs.begin() + at, out.inputs.begin() + end, 0);
    std::fill(out.targets.begin() + at, out.targets.begin() + end, 0);
    std::fill(out.mask.begin() + at, out.mask.begin() + end, uint8_t(0));
    std::fill(out.seg.begin() + at, out.seg.begin() + end, seg);
  }

  void run(int64_t from) {
    int64_t step = from;
    try {
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || int(ready.size()) < opt.prefetch; });
          if (stop) return;
        }
        StepSamples s = produce(step);
        std::lock_guard<std::mutex> lock(mu);
        if (stop) return;
        ready.push_back(std::move(s));
        ++step;
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
      cv.notify_all();
    }
  }

  void start() {
    stop = false;
    const int64_t from = position + int64_t(ready.size());
    worker = std::thread([this, from] { run(from); });
  }

  void halt() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }
};

DataLoader::DataLoader(const LoaderOptions& opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = opt;
  if (opt.seq_len < 1)
    throw UsageError(detail::concat("data.seq_len must be >= 1, got ", opt.seq_len));
  if (opt.global_batch < 1)
    throw UsageError(detail::concat("global batch size must be >= 1, got ", opt.global_batch));
  if (opt.rank_count < 1 || opt.rank_offset < 0 ||
      opt.rank_offset + opt.rank_count > opt.global_batch)
    throw UsageError(detail::concat("rank slice [", opt.rank_offset, ", ",
                                    opt.rank_offset + opt.rank_count,
                                    ") does not fit in the global batch of ", opt.global_batch));
  m.opt.prefetch = std::max(0, opt.prefetch);
  m.set = std::make_unique<ShardSet>(opt.dir);
  const ShardAttributes& a = m.set->attrs();
  const std::string& first = m.set->shards().front().path;
  if (a.preference && !opt.preference)
    throw UsageError(detail::concat(
        first,
        ": the shards hold preference pairs (chosen, rejected), which only "
        "training.objective: dpo trains on; for supervised fine-tuning tokenize the data "
        "with --format text or chat"));
  if (!a.preference && opt.preference)
    throw UsageError(
        detail::concat(first,
                       ": training.objective dpo trains on preference pairs, but these shards hold "
                       "token documents; tokenize prompt/chosen/rejected records with `ft tokenize "
                       "--format preference`"));
  if (opt.preference && opt.pack)
    throw UsageError(
        "data.pack does not apply to preference pairs (each sequence is a row of "
        "its own); set data.pack: false");
  if (opt.expected_vocab > 0 && a.vocab_size > opt.expected_vocab)
    FT_FAIL(first, ": shards have vocab_size ", a.vocab_size, " but the model's vocab_size is ",
            opt.expected_vocab, "; tokenize with the model's tokenizer or raise model.vocab_size");
  if (!opt.expected_tokenizer_sha256.empty() && a.tokenizer_sha256 != opt.expected_tokenizer_sha256)
    FT_FAIL(first, ": tokenizer_sha256 ", a.tokenizer_sha256,
            " differs from the sha256 of the recipe's tokenizer (", opt.expected_tokenizer_sha256,
            "); the shards were written with another tokenizer: re-run `ft tokenize` with it");

  const uint64_t T = uint64_t(opt.seq_len);
  m.window.resize(T + 1);
  m.window_mask.resize(T + 1);
  if (opt.preference) {
    m.preference = list_pairs(*m.set, opt.seq_len, &m.pairs);
    m.n = m.pairs.size();
    if (m.n == 0)
      FT_FAIL(opt.dir, ": no preference pairs fit data.seq_len = ", T, " (", m.preference.pairs,
              " pairs, every one with a prompt of ", T,
              " tokens or more); raise data.seq_len or shorten the prompts");
    return;
  }
  if (opt.pack) {
    m.packing = pack_documents(*m.set, opt.seq_len, opt.pack_split, &m.pieces, &m.first_piece);
    m.n = m.packing.windows;
    if (m.n == 0)
      FT_FAIL(opt.dir, ": no samples to pack: ", m.packing.documents, " documents, ",
              m.packing.short_documents, " of them shorter than 2 tokens",
              opt.pack_split ? "" : " and the others longer than data.seq_len + 1 (dropped)",
              "; add data", opt.pack_split ? "" : " or set data.pack_overflow: split");
    return;
  }
  m.first_sample.push_back(0);
  int short_shards = 0;
  constexpr int kMaxShortWarnings = 3;  // a folder of many tiny shards should not flood the log
  for (const ShardInfo& s : m.set->shards()) {
    const uint64_t k = s.num_tokens >= T + 1 ? (s.num_tokens - 1) / T : 0;
    if (k == 0 && ++short_shards <= kMaxShortWarnings)
      log_warn(s.path, ": ", s.num_tokens, " tokens is fewer than seq_len + 1 = ", T + 1,
               "; this shard contributes no samples");
    m.first_sample.push_back(m.first_sample.back() + k);
  }
  if (short_shards > kMaxShortWarnings)
    log_warn(opt.dir, ": ", short_shards, " shards in all are shorter than seq_len + 1 = ", T + 1,
             " tokens and contribute no samples");
  m.n = m.first_sample.back();
  if (m.n == 0)
    FT_FAIL(opt.dir, ": no samples at seq_len ", T, ": every shard is shorter than ", T + 1,
            " tokens (", m.set->total_tokens(), " tokens in all); lower data.seq_len or add data");
}

DataLoader::~DataLoader() { impl_->halt(); }

uint64_t DataLoader::samples_per_epoch() const { return impl_->n; }

void DataLoader::seek(int64_t step) {
  FT_CHECK(step >= 0, "cannot seek the loader to step ", step);
  Impl& m = *impl_;
  m.halt();
  m.ready.clear();
  m.error = nullptr;
  m.position = step;
}

StepSamples DataLoader::next() {
  Impl& m = *impl_;
  if (m.opt.prefetch == 0) return m.produce(m.position++);  // synchronous: no thread at all
  if (!m.worker.joinable()) m.start();
  std::unique_lock<std::mutex> lock(m.mu);
  m.cv.wait(lock, [&] { return !m.ready.empty() || m.error; });
  if (m.ready.empty()) std::rethrow_exception(m.error);
  StepSamples s = std::move(m.ready.front());
  m.ready.pop_front();
  ++m.position;
  m.cv.notify_all();
  return s;
}

const PackingStats* DataLoader::packing() const {
  return impl_->opt.pack ? &impl_->packing : nullptr;
}

const PreferenceStats* DataLoader::preference() const {
  return impl_->opt.preference ? &impl_->preference : nullptr;
}

PreferenceStats preference_stats(ShardSet& set, int seq_len) {
  FT_CHECK(seq_len >= 1, "preference_stats: seq_len ", seq_len);
  return list_pairs(set, seq_len, nullptr);
}

int64_t DataLoader::position() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->position;
}

}  // namespace ft
