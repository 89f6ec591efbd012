// lib/ckpt/checkpoint: pieces written by CheckpointWriter (sync and async, several "ranks" in
// one process) read back exactly — under the tensor-parallel size they were saved with and under
// another one, whole groups and ranges that straddle pieces; damage (a flipped byte, a
// truncated or missing shard, no COMPLETE) found by verify and by read_range naming the file;
// keep_last; a save that cannot create its folder. The multi-process behaviour (resume, kill,
// resharding with real training) is tests/cli/test_checkpoint.sh and test_ckpt_crash.sh.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "model/layout.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using ft::ckpt::State;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Small enough to read, but every kind of split at tensor 2: q/k/v/gate/up and the vocabulary
// rows, o/down columns, replicated norms; odd-ish sizes so data shards do not fall on tensor
// boundaries (group sizes are not multiples of 2 × 2 pieces).
ft::ModelConfig tiny_config() {
  ft::ModelConfig c;
  c.dim = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.ffn_dim = 6;
  c.vocab_size = 10;
  return c;
}

constexpr State kStates[3] = {State::kParam, State::kExpAvg, State::kExpAvgSq};

// The whole (tensor size 1) training state of the model: [state][group] → flat buffer.
struct WholeState {
  ft::ModelConfig cfg;
  ft::ParamLayout layout;
  std::vector<std::vector<float>> buf[3];
  explicit WholeState(const ft::ModelConfig& c, uint32_t seed) : cfg(c), layout(c, 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& s : buf)
      for (const auto& g : layout.groups()) {
        s.emplace_back(g.numel);
        for (float& v : s.back()) v = dist(rng);
      }
  }
  // Tensor rank t's slices at tensor size T, of every group of one state.
  std::vector<std::vector<float>> local(int state, int T, int t) const {
    const ft::ParamLayout lay(cfg, T);
    std::vector<std::vector<float>> out;
    std::vector<const float*> src;
    std::vector<float*> dst;
    for (const auto& g : lay.groups()) out.emplace_back(g.numel);
    for (size_t g = 0; g < out.size(); ++g) {
      src.push_back(buf[state][g].data());
      dst.push_back(out[g].data());
    }
    ft::slice_for_tensor_rank(layout, src, lay, dst, t);
    return out;
  }
};

// The range data rank d of D saves (the ZeRO shard cut of lib/train/train_state.cpp).
std::pair<uint64_t, uint64_t> data_shard(uint64_t n, int D, int d) {
  const uint64_t s = (n + uint64_t(D) - 1) / uint64_t(D);
  const uint64_t b = std::min(n, uint64_t(d) * s);
  return {b, std::min(n, b + s)};
}

nlohmann::json manifest_for(const ft::ModelConfig& c, int D, int T, int64_t step) {
  nlohmann::json j;
  j["layout"] = {{"world", D * T}, {"data", D}, {"tensor", T}, {"pipeline", 1}, {"zero_stage", 0}};
  j["model"] = {{"arch", c.arch},           {"dim", c.dim},
                {"n_layers", c.n_layers},   {"n_heads", c.n_heads},
                {"n_kv_heads", c.n_kv_heads}, {"ffn_dim", c.ffn_dim},
                {"vocab_size", c.vocab_size}, {"max_seq_len", c.max_seq_len},
                {"rope_theta", c.rope_theta}, {"norm_eps", c.norm_eps},
                {"tie_embeddings", c.tie_embeddings}};
  j["optimizer"] = {{"step", step * 10}};
  return j;
}

// Saves step `step` of `ws` as data D × tensor T ranks would (world rank = d·T + t), each rank
// with its own CheckpointWriter. Sync: the other ranks first, rank 0 (which commits once every
// rank_*.json is there) last. Async: rank 0 first, so its worker must wait for the others.
// Returns what rank 0 reported.
ft::ckpt::CheckpointWriter::Committed save(const WholeState& ws, const std::string& dir, int D,
                                           int T, int64_t step, bool async, int keep_last = 3) {
  const int world = D * T;
  std::vector<std::unique_ptr<ft::ckpt::CheckpointWriter>> writers;
  std::vector<std::vector<std::vector<float>>> locals(size_t(world) * 3);  // kept alive
  std::vector<std::vector<ft::ckpt::PieceSource>> pieces(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    const int d = rank / T, t = rank % T;
    ft::ckpt::CheckpointWriter::Options o;
    o.dir = dir;
    o.rank = rank;
    o.world = world;
    o.tensor_rank = t;
    o.async = async;
    o.keep_last = keep_last;
    writers.push_back(std::make_unique<ft::ckpt::CheckpointWriter>(o));
    for (int s = 0; s < 3; ++s) locals[size_t(rank) * 3 + size_t(s)] = ws.local(s, T, t);
    const size_t groups = ws.layout.groups().size();
    for (size_t g = 0; g < groups; ++g)
      for (int s = 0; s < 3; ++s) {
        const auto& buf = locals[size_t(rank) * 3 + size_t(s)][g];
        const auto [b, e] = data_shard(buf.size(), D, d);
        if (b == e) continue;
        pieces[size_t(rank)].push_back({kStates[s], int(g), b, e, buf.data() + b});
      }
  }
  const nlohmann::json m = manifest_for(ws.cfg, D, T, step);
  std::vector<int> order;
  if (async) {
    for (int r = 0; r < world; ++r) order.push_back(r);
  } else {
    for (int r = world - 1; r >= 0; --r) order.push_back(r);
  }
  for (int r : order) writers[size_t(r)]->save(step, pieces[size_t(r)], m);
  for (int r : order) writers[size_t(r)]->wait();
  auto c = writers[0]->poll();
  REQUIRE(c.has_value());
  for (int r = 1; r < world; ++r) CHECK_FALSE(writers[size_t(r)]->poll().has_value());
  return *c;
}

// Every value of every state and group, read back at tensor size T, equals ws's slices.
void check_reads_back(const ft::ckpt::Manifest& m, const WholeState& ws, int T) {
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < T; ++t) {
      const auto want = ws.local(s, T, t);
      for (size_t g = 0; g < want.size(); ++g) {
        CAPTURE(s);
        CAPTURE(t);
        CAPTURE(g);
        std::vector<float> got(want[g].size(), -1.0f);
        ft::ckpt::read_range(m, kStates[s], int(g), T, t, 0, got.size(), got.data());
        CHECK(got == want[g]);
        // A range that straddles piece boundaries (pieces are data-rank halves here).
        const uint64_t b = got.size() / 3, e = got.size() - 1;
        std::vector<float> part(e - b, -1.0f);
        ft::ckpt::read_range(m, kStates[s], int(g), T, t, b, e, part.data());
        CHECK(std::equal(part.begin(), part.end(), want[g].begin() + int64_t(b)));
      }
    }
}

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(std::streamoff(at));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x40);
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
  REQUIRE(f.good());
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("checkpoint: step folder names") {
  CHECK(ft::ckpt::step_folder_name(100) == "step_00000100");
  CHECK(ft::ckpt::step_folder_name(0) == "step_00000000");
}

TEST_CASE("checkpoint: data 2 x tensor 2 pieces read back at tensor 2 and at tensor 1") {
  const WholeState ws(tiny_config(), 1);
  TempDir dir;
  const auto c = save(ws, dir.path, 2, 2, 7, /*async=*/false);
  const std::string folder = dir.file("step_00000007");
  CHECK(c.step == 7);
  CHECK(fs::path(c.folder) == fs::path(folder));
  CHECK(c.total_s >= 0);
  CHECK(c.blocking_s == c.total_s);  // synchronous: the whole save blocks
  uint64_t bytes = 0;
  for (int r = 0; r < 4; ++r) bytes += fs::file_size(folder + "/rank_0000" + std::to_string(r) + ".bin");
  CHECK(c.bytes == bytes);
  CHECK(fs::exists(folder + "/COMPLETE"));
  CHECK(fs::path(ft::ckpt::latest_checkpoint(dir.path)) == fs::path(folder));

  const ft::ckpt::Manifest m = ft::ckpt::read_manifest(folder);
  CHECK(m.step == 7);
  CHECK(m.optimizer_step == 70);
  CHECK((m.world == 4 && m.data == 2 && m.tensor == 2 && m.pipeline == 1));
  CHECK(m.shards.size() == 4);
  CHECK(ft::ckpt::verify(m).empty());
  // The same tensor size reads straight from the pieces; tensor 1 through the whole tensors.
  check_reads_back(m, ws, 2);
  check_reads_back(m, ws, 1);
  for (int s = 0; s < 3; ++s)
    for (size_t g = 0; g < ws.buf[s].size(); ++g)
      CHECK(ft::ckpt::read_global_group(m, kStates[s], int(g)) == ws.buf[s][g]);
}

TEST_CASE("checkpoint: data 2 x tensor 1 pieces read back at tensor 2") {
  const WholeState ws(tiny_config(), 2);
  TempDir dir;
  save(ws, dir.path, 2, 1, 3, /*async=*/false);
  const ft::ckpt::Manifest m = ft::ckpt::read_manifest(dir.file("step_00000003"));
  CHECK(ft::ckpt::verify(m).empty());
  check_reads_back(m, ws, 1);
  check_reads_back(m, ws, 2);
}

TEST_CASE("checkpoint: async saves write the same bytes as sync ones") {
  const WholeState ws(tiny_config(), 3);
  TempDir sync_dir, async_dir;
  save(ws, sync_dir.path, 2, 2, 5, /*async=*/false);
  const auto c = save(ws, async_dir.path, 2, 2, 5, /*async=*/true);
  CHECK(c.blocking_s <= c.total_s);
  for (int r = 0; r < 4; ++r) {
    const std::string name = "step_00000005/rank_0000" + std::to_string(r);
    CHECK(read_bytes(sync_dir.file(name + ".bin")) == read_bytes(async_dir.file(name + ".bin")));
  }
  const auto a = ft::ckpt::read_manifest(sync_dir.file("step_00000005"));
  const auto b = ft::ckpt::read_manifest(async_dir.file("step_00000005"));
  CHECK(a.json.at("pieces") == b.json.at("pieces"));
  CHECK(a.json.at("shards") == b.json.at("shards"));
  check_reads_back(b, ws, 2);

  // A second async save reuses the staging buffer after the first is written.
  const WholeState ws2(tiny_config(), 4);
  save(ws2, async_dir.path, 2, 2, 6, /*async=*/true);
  check_reads_back(ft::ckpt::read_manifest(async_dir.file("step_00000006")), ws2, 2);
  check_reads_back(ft::ckpt::read_manifest(async_dir.file("step_00000005")), ws, 2);
}

TEST_CASE("checkpoint: damage is found by verify and by read_range, naming the file") {
  const WholeState ws(tiny_config(), 5);
  TempDir dir;
  save(ws, dir.path, 2, 2, 1, /*async=*/false);
  const std::string folder = dir.file("step_00000001");
  const std::string bin1 = folder + "/rank_00001.bin";  // data rank 0, tensor rank 1
  const std::string good = read_bytes(bin1);

  SUBCASE("a flipped byte") {
    const ft::ckpt::Manifest m = ft::ckpt::read_manifest(folder);
    // The byte in the middle of the first piece of rank 1's file (param of group 0).
    const ft::ckpt::PieceRecord* first = nullptr;
    for (const auto& p : m.pieces)
      if (p.file == "rank_00001.bin" && p.offset == 0) first = &p;
    REQUIRE(first != nullptr);
    CHECK(first->state == State::kParam);
    CHECK(first->group == 0);
    CHECK(first->tensor_rank == 1);
    flip_byte(bin1, (first->end - first->begin) * 2);
    const auto problems = ft::ckpt::verify(m);
    REQUIRE(problems.size() == 1);
    CHECK(contains(problems[0], "rank_00001.bin"));
    CHECK(contains(problems[0], "checksum"));
    std::vector<float> out(ws.local(0, 2, 1)[0].size());
    try {
      ft::ckpt::read_range(m, State::kParam, 0, 2, 1, 0, out.size(), out.data());
      FAIL("read_range read a corrupted piece");
    } catch (const ft::Error& e) {
      CHECK(contains(e.what(), bin1));
      CHECK(contains(e.what(), "checksum"));
    }
    // Through the whole tensors (another tensor size) too.
    CHECK_THROWS_WITH_AS(ft::ckpt::read_global_group(m, State::kParam, 0),
                         doctest::Contains("rank_00001.bin"), ft::Error);
    // What does not touch the damaged piece still reads: tensor rank 0, the other data rank's
    // half of the same buffer, and the moments.
    const auto t0 = ws.local(0, 2, 0)[0];
    ft::ckpt::read_range(m, State::kParam, 0, 2, 0, 0, t0.size(), out.data());
    CHECK(out == t0);
    const auto t1 = ws.local(0, 2, 1)[0];
    ft::ckpt::read_range(m, State::kParam, 0, 2, 1, first->end, t1.size(), out.data());
    CHECK(std::equal(t1.begin() + int64_t(first->end), t1.end(), out.begin()));
    const auto m1 = ws.local(1, 2, 1)[0];
    ft::ckpt::read_range(m, State::kExpAvg, 0, 2, 1, 0, m1.size(), out.data());
    CHECK(out == m1);
  }
  SUBCASE("a truncated shard") {
    fs::resize_file(bin1, good.size() - 4);
    const ft::ckpt::Manifest m = ft::ckpt::read_manifest(folder);
    const auto problems = ft::ckpt::verify(m);
    REQUIRE(problems.size() == 1);
    CHECK(contains(problems[0], bin1));
    CHECK(contains(problems[0], "truncated"));
    // The last piece of the file is the one cut short.
    const ft::ckpt::PieceRecord* last = nullptr;
    for (const auto& p : m.pieces)
      if (p.file == "rank_00001.bin" && (!last || p.offset > last->offset)) last = &p;
    REQUIRE(last != nullptr);
    std::vector<float> out(last->end - last->begin);
    CHECK_THROWS_WITH_AS(ft::ckpt::read_range(m, last->state, last->group, 2, last->tensor_rank,
                                              last->begin, last->end, out.data()),
                         doctest::Contains(bin1.c_str()), ft::Error);
  }
  SUBCASE("a missing shard") {
    fs::remove(bin1);
    const auto problems = ft::ckpt::verify(ft::ckpt::read_manifest(folder));
    REQUIRE(problems.size() == 1);
    CHECK(contains(problems[0], bin1));
    CHECK(contains(problems[0], "missing"));
  }
  SUBCASE("no COMPLETE: never a checkpoint to resume from") {
    fs::remove(folder + "/COMPLETE");
    CHECK_THROWS_WITH_AS(ft::ckpt::read_manifest(folder), doctest::Contains("COMPLETE"), ft::Error);
    CHECK(ft::ckpt::complete_checkpoints(dir.path).empty());
    CHECK(ft::ckpt::has_checkpoints(dir.path));
    // Inspection may still look at it.
    CHECK(ft::ckpt::verify(ft::ckpt::read_manifest(folder, /*allow_incomplete=*/true)).empty());
  }
  SUBCASE("not a checkpoint") {
    CHECK_THROWS_WITH_AS(ft::ckpt::read_manifest(dir.path), doctest::Contains("manifest.json"),
                         ft::Error);
  }
}

TEST_CASE("checkpoint: keep_last keeps the newest complete ones and `latest` names the newest") {
  const WholeState ws(tiny_config(), 6);
  TempDir dir;
  // Leftover of a save that crashed before step 3: removed once a newer one is complete.
  fs::create_directories(dir.file("step_00000002"));
  std::ofstream(dir.file("step_00000002/rank_00000.bin")) << "partial";
  for (int64_t step : {1, 3, 4, 5}) save(ws, dir.path, 1, 2, step, step % 2 == 0, /*keep_last=*/2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step_00000004", "step_00000005"});
  CHECK(read_bytes(dir.file("latest")) == "step_00000005\n");
  const auto complete = ft::ckpt::complete_checkpoints(dir.path);
  REQUIRE(complete.size() == 2);
  CHECK(fs::path(complete[0]).filename() == "step_00000005");
  CHECK(fs::path(complete[1]).filename() == "step_00000004");
  for (const auto& c : complete) CHECK(ft::ckpt::verify(ft::ckpt::read_manifest(c)).empty());
  // No temp files left behind by the atomic replacements.
  for (const auto& e : fs::recursive_directory_iterator(dir.path))
    CHECK(e.path().extension() != ".tmp");
}

TEST_CASE("checkpoint: a save that cannot create its folder fails naming it") {
  const WholeState ws(tiny_config(), 7);
  TempDir dir;
  std::ofstream(dir.file("step_00000009")) << "in the way";
  ft::ckpt::CheckpointWriter::Options o;
  o.dir = dir.path;
  ft::ckpt::CheckpointWriter w(o);
  const auto& g = ws.buf[0][0];
  const std::vector<ft::ckpt::PieceSource> pieces = {{State::kParam, 0, 0, g.size(), g.data()}};
  CHECK_THROWS_WITH_AS(w.save(9, pieces, manifest_for(ws.cfg, 1, 1, 9)),
                       doctest::Contains("step_00000009"), ft::Error);
  CHECK_FALSE(fs::exists(dir.file("latest")));
}
