// Packing (data.pack, DESIGN.md §6; loader.h): windows of whole documents with segment ids,
// split and dropped over-long documents, padding, the figures ft inspect prints, and resume.
// The model side (attention and RoPE per document, loss equal to the unpacked run's) is
// tests/cli/test_packing.sh.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "kernels/kernels.h"
#include "temp_dir.h"

using namespace ft;

namespace {

// Document d's token i: distinct everywhere, so a window shows where each value came from.
int32_t tok(int d, int i) { return 100 * (d + 1) + i; }
uint8_t msk(int d, int i) { return uint8_t((d + i) % 4 != 0); }

// One shard per entry of `shards`, each a list of document lengths; documents are numbered
// across shards in order.
void write_docs(const TempDir& dir, const std::vector<std::vector<int>>& shards) {
  int d = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    ShardAttributes a;
    a.vocab_size = 5000;
    a.tokenizer_sha256 = "ab";
    ShardWriter::Options opt;
    opt.loss_mask = true;
    opt.chunk_tokens = 8;
    ShardWriter w(dir.file("shard_" + std::to_string(s) + ".h5"), a, opt);
    for (int len : shards[s]) {
      std::vector<int32_t> t;
      std::vector<uint8_t> m;
      for (int i = 0; i < len; ++i) t.push_back(tok(d, i)), m.push_back(msk(d, i));
      w.add_document(t, &m);
      ++d;
    }
    w.close();
  }
}

LoaderOptions packed(const std::string& dir, int T, int64_t G, bool split = true) {
  LoaderOptions o;
  o.dir = dir;
  o.seq_len = T;
  o.shuffle = false;
  o.global_batch = G;
  o.rank_count = G;
  o.prefetch = 0;
  o.pack = true;
  o.pack_split = split;
  return o;
}

// Checks that row r of `b` holds, from position `at`, the (input, target) pairs of document d's
// tokens [from, from + n) with segment id `seg`.
void check_piece(const StepSamples& b, int r, int at, int d, int from, int n, int seg) {
  const int T = b.seq_len;
  for (int i = 0; i + 1 < n; ++i) {
    const size_t p = size_t(r) * T + at + i;
    INFO("row " << r << " position " << at + i << " document " << d);
    CHECK(b.inputs[p] == tok(d, from + i));
    CHECK(b.targets[p] == tok(d, from + i + 1));
    CHECK(b.mask[p] == msk(d, from + i + 1));
    CHECK(b.seg[p] == seg);
  }
}

void check_padding(const StepSamples& b, int r, int from, int seg) {
  for (int t = from; t < b.seq_len; ++t) {
    const size_t p = size_t(r) * b.seq_len + t;
    INFO("row " << r << " padding position " << t);
    CHECK(b.mask[p] == 0);
    CHECK(b.inputs[p] == 0);
    CHECK(b.seg[p] == seg);
  }
}

}  // namespace

TEST_CASE("data/pack: whole documents fill windows greedily, in order, with segment ids") {
  TempDir dir;
  // T = 8. Documents (pairs = length - 1): d0 4 tokens (3), d1 6 (5), d2 1 (none: skipped),
  // d3 9 (8: a window alone), d4 3 (2), d5 0; second shard: d6 5 (4), d7 2 (1).
  write_docs(dir, {{4, 6, 1, 9, 3, 0}, {5, 2}});
  DataLoader loader(packed(dir.path, 8, 4));
  const PackingStats* st = loader.packing();
  REQUIRE(st != nullptr);
  CHECK(st->documents == 8);
  CHECK(st->short_documents == 2);
  CHECK(st->long_documents == 0);
  // Windows: [d0 d1] (8 pairs), [d3] (8), [d4 d6 d7] (2 + 4 + 1 = 7).
  CHECK(loader.samples_per_epoch() == 3);
  CHECK(st->windows == 3);
  CHECK(st->filled == 23);
  CHECK(st->positions == 24);
  CHECK(st->efficiency() == doctest::Approx(23.0 / 24.0));
  const StepSamples b = loader.next();
  REQUIRE(b.seg.size() == 4 * 8u);
  check_piece(b, 0, 0, 0, 0, 4, 0);
  check_piece(b, 0, 3, 1, 0, 6, 1);
  check_piece(b, 1, 0, 3, 0, 9, 0);
  check_piece(b, 2, 0, 4, 0, 3, 0);
  check_piece(b, 2, 2, 6, 0, 5, 1);
  check_piece(b, 2, 6, 7, 0, 2, 2);
  check_padding(b, 2, 7, 3);
  check_piece(b, 3, 0, 0, 0, 4, 0);  // the next epoch starts over
  // The same packing whatever the window count per step and the rank slice.
  LoaderOptions o = packed(dir.path, 8, 2);
  o.rank_offset = 1;
  o.rank_count = 1;
  DataLoader slice(o);
  check_piece(slice.next(), 0, 0, 3, 0, 9, 0);
  check_piece(slice.next(), 0, 0, 0, 0, 4, 0);  // step 1: positions 2, 3 → windows 2, 0
}

TEST_CASE("data/pack: a document longer than a window is split, or dropped") {
  TempDir dir;
  // T = 4: d0 has 11 tokens (10 pairs): pieces [0, 5), [4, 9), [8, 11); d1 3 tokens.
  write_docs(dir, {{11, 3}});
  SUBCASE("split") {
    DataLoader loader(packed(dir.path, 4, 3));
    CHECK(loader.packing()->long_documents == 1);
    CHECK(loader.packing()->pieces == 4);
    // Windows: [d0 0..4], [d0 4..8], [d0 8..10, d1].
    REQUIRE(loader.samples_per_epoch() == 3);
    const StepSamples b = loader.next();
    check_piece(b, 0, 0, 0, 0, 5, 0);
    check_piece(b, 1, 0, 0, 4, 5, 0);
    check_piece(b, 2, 0, 0, 8, 3, 0);
    check_piece(b, 2, 2, 1, 0, 3, 1);
    CHECK(loader.packing()->filled == 12);
  }
  SUBCASE("drop") {
    DataLoader loader(packed(dir.path, 4, 1, false));
    CHECK(loader.packing()->long_documents == 1);
    CHECK(loader.packing()->dropped_tokens == 11);
    REQUIRE(loader.samples_per_epoch() == 1);
    const StepSamples b = loader.next();
    check_piece(b, 0, 0, 1, 0, 3, 0);
    check_padding(b, 0, 2, 1);
  }
  SUBCASE("nothing left to pack is an error naming the folder") {
    TempDir only_long;
    write_docs(only_long, {{11, 1}});
    CHECK_THROWS_WITH(DataLoader(packed(only_long.path, 4, 1, false)),
                      doctest::Contains("no samples to pack"));
  }
  SUBCASE("packing_stats gives the loader's figures without a loader") {
    ShardSet set(dir.path);
    const PackingStats st = packing_stats(set, 4, true);
    CHECK(st.windows == 3);
    CHECK(st.filled == 12);
    CHECK(st.positions == 12);
    CHECK(packing_stats(set, 4, false).windows == 1);
  }
}

TEST_CASE("data/pack: shuffled windows; seek(s) then next() equals the unbroken stream") {
  TempDir dir;
  std::vector<int> lens;
  for (int d = 0; d < 40; ++d) lens.push_back(2 + (d * 7) % 11);
  write_docs(dir, {lens});
  LoaderOptions o = packed(dir.path, 12, 3);
  o.shuffle = true;
  o.seed = 9;
  o.prefetch = 2;
  DataLoader a(o), b(o);
  std::vector<StepSamples> unbroken;
  for (int s = 0; s < 7; ++s) unbroken.push_back(a.next());
  b.seek(4);
  for (int s = 4; s < 7; ++s) {
    const StepSamples x = b.next();
    CHECK(x.inputs == unbroken[size_t(s)].inputs);
    CHECK(x.targets == unbroken[size_t(s)].targets);
    CHECK(x.mask == unbroken[size_t(s)].mask);
    CHECK(x.seg == unbroken[size_t(s)].seg);
  }
  // Unpacked loaders have no segments.
  o.pack = false;
  DataLoader plain(o);
  CHECK(plain.next().seg.empty());
  CHECK(plain.packing() == nullptr);
}

TEST_CASE("rope: with positions, each packed sample turns as if it started the sequence") {
  // Row of T = 7 holding samples of 3 and 4 tokens: positions 0 1 2 0 1 2 3. The rotation of
  // the second sample must equal that of the same vectors at the start of a sequence.
  const int T = 7, nh = 2, D = 8;
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = 1.0f / std::pow(100.f, float(2 * i) / D);
  std::vector<float> x(size_t(T) * nh * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i) + 0.1f);
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 2, 3};
  std::vector<float> packed_x = x;
  kernels::rope_forward(packed_x.data(), inv_freq.data(), 1, T, nh, D, pos.data());
  std::vector<float> second(x.begin() + 3 * nh * D, x.end());
  kernels::rope_forward(second.data(), inv_freq.data(), 1, 4, nh, D);
  std::vector<float> first(x.begin(), x.begin() + 3 * nh * D);
  kernels::rope_forward(first.data(), inv_freq.data(), 1, 3, nh, D);
  for (size_t i = 0; i < first.size(); ++i) CHECK(packed_x[i] == first[i]);
  for (size_t i = 0; i < second.size(); ++i) CHECK(packed_x[3 * nh * D + i] == second[i]);
  // Not the rotation of positions 3..6 (what no restart would give).
  std::vector<float> whole = x;
  kernels::rope_forward(whole.data(), inv_freq.data(), 1, T, nh, D);
  CHECK(whole[3 * nh * D + 1] != packed_x[3 * nh * D + 1]);
  // Backward with the same positions inverts it.
  kernels::rope_backward(packed_x.data(), inv_freq.data(), 1, T, nh, D, pos.data());
  for (size_t i = 0; i < x.size(); ++i) CHECK(packed_x[i] == doctest::Approx(x[i]).epsilon(1e-6));
}
