// lib/ckpt/checkpoint: pieces written by CheckpointWriter (sync and async, several "ranks" in
// one process) read back exactly — under the tensor-parallel size they were saved with and under
// another one, whole groups and ranges that straddle pieces; damage (a flipped byte, a
// truncated or missing shard, no COMPLETE) found by verify and by read_range naming the file;
// keep_last; a save that cannot create its folder. The multi-process behaviour (resume, kill,
// resharding with real training) is tests/cli/test_checkpoint.sh and test_ckpt_crash.sh.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "model/layout.h"
#include "optim/loss_scaler.h"
#include "parallel/partition.h"
#include "parallel/tensor_parallel.h"
#include "recipe/recipe.h"
#include "runtime/device.h"
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
    ft::slice_for_tensor_rank(layout.groups(), src, lay.groups(), dst, t);
    return out;
  }
};

nlohmann::json manifest_for(const ft::ModelConfig& c, int D, int T, int64_t step) {
  nlohmann::json j;
  j["layout"] = {{"world", D * T}, {"data", D}, {"tensor", T}, {"pipeline", 1}, {"zero_stage", 0}};
  j["model"] = {{"arch", c.arch},
                {"dim", c.dim},
                {"n_layers", c.n_layers},
                {"n_heads", c.n_heads},
                {"n_kv_heads", c.n_kv_heads},
                {"ffn_dim", c.ffn_dim},
                {"vocab_size", c.vocab_size},
                {"max_seq_len", c.max_seq_len},
                {"rope_theta", c.rope_theta},
                {"norm_eps", c.norm_eps},
                {"tie_embeddings", c.tie_embeddings}};
  j["optimizer"] = {{"step", step * 10}};
  // The tensor table the trainer writes (lib/train/train_state.cpp), which readers check
  // against the model.
  const ft::ParamLayout whole(c, 1);
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t g = 0; g < whole.groups().size(); ++g)
    for (const auto& e : whole.groups()[g].entries)
      tensors.push_back({{"name", e.name},
                         {"shape", e.global_shape},
                         {"dtype", "f32"},
                         {"group", g},
                         {"group_name", whole.groups()[g].name},
                         {"split", e.split == ft::TensorSplit::kRows   ? "rows"
                                   : e.split == ft::TensorSplit::kCols ? "cols"
                                                                       : "replicated"}});
  j["tensors"] = tensors;
  j["data"] = {{"next_step", step}, {"tokens", step * 96}};
  return j;
}

// Saves step `step` of `ws` as data D × tensor T ranks would (world rank = d·T + t), each rank
// with its own CheckpointWriter. Sync: the other ranks first, rank 0 (which commits once every
// rank_*.json is there) last. Async: rank 0 first, so its worker must wait for the others.
// Returns what rank 0 reported.
// `extra`: keys added to (or replacing those of) the manifest, e.g. the fp16 loss scaler's.
ft::ckpt::CheckpointWriter::Committed save(const WholeState& ws, const std::string& dir, int D,
                                           int T, int64_t step, bool async, int keep_last = 3,
                                           const nlohmann::json& extra = nlohmann::json::object()) {
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
        // The range data rank d of D saves (lib/train/train_state.cpp: the ZeRO cut).
        const auto [b, e] = ft::zero_shard(buf.size(), D, d);
        if (b == e) continue;
        pieces[size_t(rank)].push_back({kStates[s], int(g), b, e, buf.data() + b});
      }
  }
  nlohmann::json m = manifest_for(ws.cfg, D, T, step);
  m.update(extra);
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
  for (int r = 0; r < 4; ++r)
    bytes += fs::file_size(folder + "/rank_0000" + std::to_string(r) + ".bin");
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
    // A whole group is allocated only once its files are known to hold it.
    const std::string short_file =
        "rank_00001.bin: " + std::to_string(good.size() - 4) + " bytes, the manifest needs";
    CHECK_THROWS_WITH_AS(ft::ckpt::read_global_group(m, last->state, last->group),
                         doctest::Contains(short_file.c_str()), ft::Error);
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

namespace {

// Every file under dir (relative path → bytes), to show that nothing was changed or removed.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file())
      out[fs::relative(e.path(), dir).string()] = read_bytes(e.path().string());
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

TEST_CASE("checkpoint: every number of a manifest is a checked integer, named by its key path") {
  const WholeState ws(tiny_config(), 11);
  TempDir dir;
  save(ws, dir.path, 2, 2, 10, /*async=*/false);
  const std::string folder = dir.file("step_00000010");
  const std::string text = read_bytes(folder + "/manifest.json");
  const nlohmann::json good = nlohmann::json::parse(text);
  CHECK_NOTHROW(ft::ckpt::parse_manifest(text, folder));
  CHECK(ft::ckpt::parse_manifest(text, folder).tokens == 960);

  // (mutation of the manifest, the key path the error must name)
  using J = nlohmann::json;
  const uint64_t group1 = ft::ParamLayout(ws.cfg, 2).groups()[1].numel;
  struct Case {
    const char* what;
    std::function<void(J&)> edit;
    std::string key;
  };
  size_t last_piece_of_rank0 = 0;
  for (size_t i = 0; i < good["pieces"].size(); ++i)
    if (good["pieces"][i]["file"] == "rank_00000.bin") last_piece_of_rank0 = i;
  const std::vector<Case> cases = {
      {"step -7", [](J& j) { j["step"] = -7; }, "step"},
      {"step 1e30", [](J& j) { j["step"] = 1e30; }, "step"},
      {"step 12.5", [](J& j) { j["step"] = 12.5; }, "step"},
      {"step 10.0 (a float, even if whole)", [](J& j) { j["step"] = 10.0; }, "step"},
      {"step \"10\"", [](J& j) { j["step"] = "10"; }, "step"},
      {"step true", [](J& j) { j["step"] = true; }, "step"},
      {"step 2^64", [](J& j) { j["step"] = J::parse("18446744073709551616"); }, "step"},
      {"another step than the folder's", [](J& j) { j["step"] = 11; }, "step"},
      {"no step", [](J& j) { j.erase("step"); }, "step"},
      {"world 1e30", [](J& j) { j["layout"]["world"] = 1e30; }, "layout.world"},
      {"world 0", [](J& j) { j["layout"]["world"] = 0; }, "layout.world"},
      {"world not data x tensor", [](J& j) { j["layout"]["world"] = 5; }, "layout"},
      {"zero_stage 4", [](J& j) { j["layout"]["zero_stage"] = 4; }, "layout.zero_stage"},
      {"tensor -2", [](J& j) { j["layout"]["tensor"] = -2; }, "layout.tensor"},
      {"dim 0", [](J& j) { j["model"]["dim"] = 0; }, "model.dim"},
      {"dim 2^31", [](J& j) { j["model"]["dim"] = int64_t(1) << 31; }, "model.dim"},
      {"2^48 parameters",
       [](J& j) {
         j["model"]["dim"] = 1 << 24;
         j["model"]["vocab_size"] = 1 << 24;
       },
       "model"},
      {"n_layers 1e9", [](J& j) { j["model"]["n_layers"] = 1000000000; }, "model.n_layers"},
      {"n_heads not dividing dim", [](J& j) { j["model"]["n_heads"] = 3; }, "model.n_heads"},
      {"rope_theta NaN-ish string", [](J& j) { j["model"]["rope_theta"] = "nan"; },
       "model.rope_theta"},
      {"tie_embeddings 1", [](J& j) { j["model"]["tie_embeddings"] = 1; }, "model.tie_embeddings"},
      {"optimizer step 1e30", [](J& j) { j["optimizer"]["step"] = 1e30; }, "optimizer.step"},
      {"data.tokens -1", [](J& j) { j["data"]["tokens"] = -1; }, "data.tokens"},
      {"data.next_step another step", [](J& j) { j["data"]["next_step"] = 9; }, "data.next_step"},
      {"a shape of 0 elements", [](J& j) { j["tensors"][1]["shape"][0] = 0; },
       "tensors[1].shape[0]"},
      {"a shape of 2^62 elements",
       [](J& j) {
         j["tensors"][1]["shape"] = {int64_t(1) << 31, int64_t(1) << 31};
       },
       "tensors[1].shape"},
      {"a dtype enum", [](J& j) { j["tensors"][0]["dtype"] = "f64"; }, "tensors[0].dtype"},
      {"a shard of another rank", [](J& j) { j["shards"][1]["rank"] = 3; }, "shards[1].rank"},
      {"shard bytes 1e30", [](J& j) { j["shards"][0]["bytes"] = 1e30; }, "shards[0].bytes"},
      {"a shard outside the folder", [](J& j) { j["shards"][0]["file"] = "../x.bin"; },
       "shards[0].file"},
      {"crc32 2^32", [](J& j) { j["pieces"][0]["crc32"] = uint64_t(1) << 32; }, "pieces[0].crc32"},
      {"a piece past the tensor end",
       [&](J& j) {
         for (auto& p : j["pieces"])
           if (p["group"] == 1) p["end"] = group1 + 1;
       },
       "pieces["},
      {"a piece past its file's end",
       [&](J& j) { j["pieces"][last_piece_of_rank0]["offset"] = 1 << 20; },
       "pieces[" + std::to_string(last_piece_of_rank0) + "].offset"},
      {"a piece of 2^40 elements", [](J& j) { j["pieces"][0]["end"] = uint64_t(1) << 40; },
       "pieces[0].end"},
      {"a reversed piece", [](J& j) { j["pieces"][0]["begin"] = j["pieces"][0]["end"]; },
       "pieces[0]"},
      {"a missing piece (a gap)", [](J& j) { j["pieces"].erase(j["pieces"].begin()); }, "pieces"},
      {"a duplicated piece (an overlap)", [](J& j) { j["pieces"].push_back(j["pieces"][0]); },
       "pieces["},
      {"a piece group 1e30", [](J& j) { j["pieces"][0]["group"] = 1e30; }, "pieces[0].group"},
      {"a piece state enum", [](J& j) { j["pieces"][0]["state"] = "momentum"; }, "pieces[0].state"},
      {"tensor_rank past the layout", [](J& j) { j["pieces"][0]["tensor_rank"] = 2; },
       "pieces[0].tensor_rank"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    J j = good;
    k.edit(j);
    try {
      ft::ckpt::parse_manifest(j.dump(), folder);
      FAIL("accepted: ", k.what);
    } catch (const ft::Error& e) {
      CHECK(contains(e.what(), folder + "/manifest.json: " + k.key));
    }
  }
  // Through the file, as resume and inspect read it; the good files stay as they are.
  J j = good;
  j["step"] = -7;
  write_text(folder + "/manifest.json", j.dump());
  CHECK_THROWS_WITH_AS(ft::ckpt::read_manifest(folder),
                       doctest::Contains("step: expected an "
                                         "integer from 0"),
                       ft::Error);
  write_text(folder + "/manifest.json", "{\"format\": \"ft-checkpoint\", \"version\": 1, [");
  CHECK_THROWS_WITH_AS(ft::ckpt::read_manifest(folder), doctest::Contains("not valid JSON"),
                       ft::Error);
  // A manifest copied into another step's folder.
  write_text(folder + "/manifest.json", text);
  fs::rename(folder, dir.file("step_00000011"));
  CHECK_THROWS_WITH_AS(ft::ckpt::read_manifest(dir.file("step_00000011")),
                       doctest::Contains("the folder's name says step 11"), ft::Error);
  // A folder the user named otherwise (--resume PATH of a copy) is read by its manifest; one set
  // aside as damaged keeps its number.
  fs::rename(dir.file("step_00000011"), dir.file("best"));
  CHECK(ft::ckpt::read_manifest(dir.file("best")).step == 10);
  fs::rename(dir.file("best"), dir.file("step_00000010.damaged.2"));
  CHECK(ft::ckpt::read_manifest(dir.file("step_00000010.damaged.2")).step == 10);
}

TEST_CASE("checkpoint: the fp16 loss scaler's state rides in the manifest; older ones lack it") {
  const WholeState ws(tiny_config(), 5);
  TempDir dir;
  // Six steps at the defaults (2^16, hysteresis 2): x forgiven, x → 2^15, two clean, x → 2^14,
  // x → 2^13. Two steps applied, so the schedule (which skipped steps do not advance) is at 2.
  ft::LossScaler scaler(ft::loss_scaler_config(ft::TrainingConfig{}));
  for (bool inf : {true, true, false, false, true, true}) scaler.update(inf);
  REQUIRE(scaler.scale() == 8192.0f);
  const nlohmann::json extra = {{"loss_scaler", scaler.to_json()}, {"scheduler", {{"step", 2}}}};
  save(ws, dir.path, 1, 1, 6, /*async=*/false, 3, extra);  // rank 0 commits only what parses
  const ft::ckpt::Manifest m = ft::ckpt::read_manifest(dir.file("step_00000006"));
  REQUIRE(m.loss_scaler.has_value());
  CHECK(*m.loss_scaler == scaler.state());
  CHECK(m.loss_scaler->consecutive_skipped == 2);
  CHECK(m.loss_scaler->total_skipped == 4);
  ft::LossScaler resumed(ft::loss_scaler_config(ft::TrainingConfig{}));
  resumed.restore(*m.loss_scaler);
  CHECK(resumed.state() == scaler.state());

  // A manifest without the key (fp32, bf16, or written before fp16 existed): no state, so the
  // scaler of a run resumed in fp16 starts from the recipe's settings.
  save(ws, dir.path, 1, 1, 7, /*async=*/false);
  CHECK_FALSE(ft::ckpt::read_manifest(dir.file("step_00000007")).loss_scaler.has_value());

  // The state is checked like every other number of a manifest; the schedule may lag the step
  // count (skipped steps), never lead it.
  const std::string folder = dir.file("step_00000006");
  const nlohmann::json good = nlohmann::json::parse(read_bytes(folder + "/manifest.json"));
  nlohmann::json bad = good;
  bad["loss_scaler"]["total_skipped"] = 1.5;
  CHECK_THROWS_WITH_AS(ft::ckpt::parse_manifest(bad.dump(), folder),
                       doctest::Contains("manifest.json: loss_scaler.total_skipped: expected an "
                                         "integer"),
                       ft::Error);
  bad = good;
  bad["loss_scaler"]["scale"] = -1.0;
  CHECK_THROWS_WITH_AS(ft::ckpt::parse_manifest(bad.dump(), folder),
                       doctest::Contains("loss_scaler.scale: expected a finite number > 0"),
                       ft::Error);
  bad = good;
  bad["scheduler"]["step"] = 7;
  CHECK_THROWS_WITH_AS(ft::ckpt::parse_manifest(bad.dump(), folder),
                       doctest::Contains("scheduler.step: 7, past the step 6"), ft::Error);
  bad["scheduler"]["step"] = 6;
  CHECK_NOTHROW(ft::ckpt::parse_manifest(bad.dump(), folder));
}

TEST_CASE("checkpoint: rank records are checked integers too") {
  const std::string path = "/x/step_00000001/rank_00001.json";
  const std::string ok = R"({"rank":1,"attempt":77,"file":"rank_00001.bin","bytes":8,)"
                         R"("crc32":5,"pieces":[{"file":"rank_00001.bin","state":"param",)"
                         R"("group":0,"tensor_rank":0,"begin":0,"end":2,"offset":0,"crc32":5}]})";
  const auto r = ft::ckpt::parse_rank_json(ok, path);
  CHECK(r.rank == 1);
  CHECK(r.attempt == 77);
  CHECK(r.bytes == 8);
  for (const auto& [from, to, key] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"("attempt":77)", R"("attempt":1e30)", "attempt"},
           {R"("attempt":77)", R"("attempt":-1)", "attempt"},
           {R"("rank":1)", R"("rank":1.5)", "rank"},
           {R"("bytes":8)", R"("bytes":4)", "pieces[0]"},
           {R"("end":2)", R"("end":0)", "pieces[0].end"},
           {R"("offset":0)", R"("offset":4)", "pieces[0].offset"},
           {R"("file":"rank_00001.bin","state")", R"("file":"rank_00002.bin","state")",
            "pieces[0].file"}}) {
    std::string bad = ok;
    bad.replace(bad.find(from), from.size(), to);
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(ft::ckpt::parse_rank_json(bad, path),
                         doctest::Contains((path + ": " + key).c_str()), ft::Error);
  }
  CHECK_THROWS_AS(ft::ckpt::parse_rank_json("[", path), ft::Error);
  CHECK_THROWS_AS(ft::ckpt::parse_rank_json("[1]", path), ft::Error);
}

TEST_CASE("checkpoint: step folder names parse strictly; damaged folders are set aside") {
  using ft::ckpt::parse_step_folder_name;
  CHECK(parse_step_folder_name("step_00000100") == 100);
  CHECK(parse_step_folder_name("step_123456789") == 123456789);
  CHECK(parse_step_folder_name("step_") == -1);
  CHECK(parse_step_folder_name("step_0000001x") == -1);
  CHECK(parse_step_folder_name("step_-0000007") == -1);
  CHECK(parse_step_folder_name("step_99999999999999999999999") == -1);  // no overflow
  CHECK(parse_step_folder_name("step_00000100.damaged") == -1);
  CHECK(parse_step_folder_name("step_00000100.damaged", true) == 100);
  CHECK(parse_step_folder_name("step_00000100.damaged.3", true) == 100);
  CHECK(parse_step_folder_name("step_00000100.damaged.", true) == -1);
  CHECK(parse_step_folder_name("step_00000100.damaged.x", true) == -1);
  CHECK(parse_step_folder_name("step_00000100.old", true) == -1);

  TempDir dir;
  for (int i = 0; i < 3; ++i) {
    fs::create_directories(dir.file("step_00000020"));
    write_text(dir.file("step_00000020/manifest.json"), "copy " + std::to_string(i));
    const std::string aside = ft::ckpt::set_aside_damaged(dir.file("step_00000020"));
    CHECK(fs::path(aside).filename() ==
          (i == 0 ? "step_00000020.damaged" : "step_00000020.damaged." + std::to_string(i)));
    CHECK(read_bytes(aside + "/manifest.json") == "copy " + std::to_string(i));
  }
  CHECK_FALSE(fs::exists(dir.file("step_00000020")));
  // Set-aside folders are no checkpoints to resume from nor to count.
  CHECK(ft::ckpt::complete_checkpoints(dir.path).empty());
  CHECK_FALSE(ft::ckpt::has_checkpoints(dir.path));
}

TEST_CASE("checkpoint: keep_last never counts or removes folders set aside as damaged") {
  const WholeState ws(tiny_config(), 12);
  TempDir dir;
  save(ws, dir.path, 1, 1, 1, /*async=*/false);
  ft::ckpt::set_aside_damaged(dir.file("step_00000001"));
  const auto before = snapshot(dir.file("step_00000001.damaged"));
  REQUIRE(before.count("COMPLETE") == 1);
  for (int64_t step : {2, 3, 4}) save(ws, dir.path, 1, 1, step, false, /*keep_last=*/1);
  CHECK(snapshot(dir.file("step_00000001.damaged")) == before);
  CHECK(fs::exists(dir.file("step_00000004/COMPLETE")));
  CHECK_FALSE(fs::exists(dir.file("step_00000003")));
}

TEST_CASE("checkpoint: a piece holding NaN or infinity is never committed") {
  WholeState ws(tiny_config(), 13);
  for (const bool async : {false, true}) {
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      CAPTURE(async);
      CAPTURE(bad);
      TempDir dir;
      save(ws, dir.path, 1, 2, 8, async);
      const auto before = snapshot(dir.path);
      // One value of exp_avg (state 1) of layers.0 (group 1), at element 3 of the group: its
      // input_layernorm.weight.
      std::vector<float> g1 = ws.buf[1][1];
      g1[3] = bad;
      ft::ckpt::CheckpointWriter::Options o;
      o.dir = dir.path;
      o.async = async;
      ft::ckpt::CheckpointWriter w(o);
      std::vector<ft::ckpt::PieceSource> pieces;
      for (size_t g = 0; g < ws.buf[0].size(); ++g)
        for (int s = 0; s < 3; ++s) {
          const float* data = s == 1 && g == 1 ? g1.data() : ws.buf[s][g].data();
          pieces.push_back({kStates[s], int(g), 0, ws.buf[s][g].size(), data});
        }
      std::string err;
      try {
        w.save(9, pieces, manifest_for(ws.cfg, 1, 1, 9));
        w.wait();
      } catch (const ft::Error& e) {
        err = e.what();
      }
      CHECK(contains(err,
                     "rank 0: refusing to save step 9: exp_avg of "
                     "model.layers.0.input_layernorm.weight (group 1, layers.0) holds "));
      CHECK(contains(err, "at element 3 of the group"));
      CHECK(contains(
          err, "the previous complete checkpoint is untouched: " + dir.file("step_00000008")));
      // Nothing of step 9 is committed or left behind but an empty folder; step 8 as it was.
      CHECK_FALSE(fs::exists(dir.file("step_00000009/COMPLETE")));
      CHECK_FALSE(fs::exists(dir.file("step_00000009/manifest.json")));
      CHECK_FALSE(fs::exists(dir.file("step_00000009/rank_00000.bin")));
      CHECK(snapshot(dir.path) == before);
    }
  }
}

namespace {

// The CPU device with its host staging counted: what an async save asks of Device::alloc_host
// (page-locked memory on CUDA).
class StagingCountingDevice final : public ft::Device {
 public:
  ft::DeviceKind kind() const override { return in_->kind(); }
  std::string name() const override { return "staging-counting " + in_->name(); }
  void* alloc(size_t b) override { return in_->alloc(b); }
  void free(void* p, size_t b) override { in_->free(p, b); }
  void memset_zero(void* p, size_t b) override { in_->memset_zero(p, b); }
  void copy_to_host(void* d, const void* s, size_t b) override { in_->copy_to_host(d, s, b); }
  void copy_from_host(void* d, const void* s, size_t b) override { in_->copy_from_host(d, s, b); }
  void copy(ft::Stream s, void* d, const void* src, size_t b) override { in_->copy(s, d, src, b); }
  void synchronize() override { in_->synchronize(); }
  ft::AllocatorStats stats() const override { return in_->stats(); }
  ft::Ops& ops() override { return in_->ops(); }
  void* alloc_host(size_t b) override {
    ++allocs;
    bytes = b;
    return live = in_->alloc_host(b);
  }
  void free_host(void* p, size_t b) override {
    CHECK(p == live);
    CHECK(b == bytes);
    ++frees;
    in_->free_host(p, b);
  }
  int allocs = 0, frees = 0;
  size_t bytes = 0;
  void* live = nullptr;

 private:
  std::unique_ptr<ft::Device> in_ = ft::make_cpu_device();
};

}  // namespace

TEST_CASE("checkpoint: an async save stages in the device's alloc_host memory, freed once") {
  const WholeState ws(tiny_config(), 13);
  TempDir dir;
  StagingCountingDevice dev;
  {
    ft::ckpt::CheckpointWriter::Options o;
    o.dir = dir.path;
    o.async = true;
    o.staging_device = &dev;
    ft::ckpt::CheckpointWriter w(o);
    std::vector<ft::ckpt::PieceSource> pieces;
    uint64_t total = 0;
    for (int s = 0; s < 3; ++s)
      for (size_t g = 0; g < ws.buf[size_t(s)].size(); ++g) {
        const auto& b = ws.buf[size_t(s)][g];
        pieces.push_back({kStates[s], int(g), 0, b.size(), b.data()});
        total += b.size() * sizeof(float);
      }
    w.save(4, pieces, manifest_for(ws.cfg, 1, 1, 4));
    w.save(5, pieces, manifest_for(ws.cfg, 1, 1, 5));  // the same buffer again
    w.wait();
    CHECK(dev.allocs == 1);
    CHECK(dev.bytes == total);
    CHECK(dev.frees == 0);  // held for the next save
  }
  CHECK(dev.frees == 1);  // the writer gave it back to the device
  CHECK(ft::ckpt::verify(ft::ckpt::read_manifest(dir.file("step_00000005"))).empty());
}

namespace {

// A device whose copy stream is really asynchronous: copy_to_host_async on it only queues the
// copy, which runs when an event recorded after it is synchronized or waited for by the compute
// stream (as on a GPU, where it would run at some time in between). Its memory is host memory.
// Logs every record and stream wait, to check the order the writer issues them in.
class DeferredCopyDevice final : public ft::Device {
 public:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    bool done = false;
  };
  struct Ev {
    int id;
    size_t copies_before = 0;  // copy-stream copies queued before its record
  };
  std::vector<std::string> log;
  std::vector<Copy> copies;
  std::mutex mu;
  std::condition_variable released;
  bool hold = false;

  void set_hold(bool h) {
    {
      std::lock_guard<std::mutex> lk(mu);
      hold = h;
    }
    released.notify_all();
  }
  ft::DeviceKind kind() const override { return ft::DeviceKind::kCpu; }
  std::string name() const override { return "deferred-copy test device"; }
  void* alloc(size_t bytes) override { return std::malloc(bytes ? bytes : 1); }
  void free(void* p, size_t) override { std::free(p); }
  void memset_zero(void* p, size_t n) override { std::memset(p, 0, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy(ft::Stream, void* d, const void* s, size_t n) override { std::memmove(d, s, n); }
  void synchronize() override { run_copies(copies.size()); }
  ft::AllocatorStats stats() const override { return {}; }
  ft::Ops& ops() override { throw ft::Error("no ops on the deferred-copy test device"); }
  ft::Stream stream() override { return ft::Stream{&compute_}; }
  ft::Stream copy_stream() override { return ft::Stream{&copy_}; }
  void copy_to_host_async(ft::Stream s, void* d, const void* src, size_t n) override {
    std::lock_guard<std::mutex> lk(mu);
    REQUIRE(s.handle == &copy_);
    copies.push_back({d, src, n});
  }

 protected:
  void* event_create(bool) override { return new Ev{next_id_++}; }
  void event_destroy(void* e) override { delete static_cast<Ev*>(e); }
  void event_record(void* e, ft::Stream s) override {
    std::lock_guard<std::mutex> lk(mu);
    auto* ev = static_cast<Ev*>(e);
    ev->copies_before = copies.size();
    log.push_back(ft::detail::concat("record ", which(s), " ", ev->id));
  }
  // While `hold` is set, a synchronize (the writer's thread) waits: the test decides whether
  // the copies run before or after the "optimizer" writes the state.
  void event_synchronize(void* e) override {
    {
      std::unique_lock<std::mutex> lk(mu);
      released.wait(lk, [&] { return !hold; });
    }
    run_copies(static_cast<Ev*>(e)->copies_before);
  }
  bool event_query(void* e) override {
    std::lock_guard<std::mutex> lk(mu);
    const size_t n = static_cast<Ev*>(e)->copies_before;
    for (size_t i = 0; i < n; ++i)
      if (!copies[i].done) return false;
    return true;
  }
  float event_elapsed_ms(void*, void*) override { return 0; }
  void stream_wait_event(ft::Stream s, void* e) override {
    auto* ev = static_cast<Ev*>(e);
    {
      std::lock_guard<std::mutex> lk(mu);
      log.push_back(ft::detail::concat("wait ", which(s), " ", ev->id));
    }
    // The compute stream's later work runs after the copies: model it by running them now.
    if (s.handle == &compute_) run_copies(ev->copies_before);
  }

 private:
  const char* which(ft::Stream s) const { return s.handle == &copy_ ? "copy" : "compute"; }
  void run_copies(size_t n) {
    std::lock_guard<std::mutex> lk(mu);
    for (size_t i = 0; i < n && i < copies.size(); ++i)
      if (!copies[i].done) {
        std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
        copies[i].done = true;
      }
  }
  int compute_ = 0, copy_ = 0;  // their addresses are the streams' handles
  int next_id_ = 1;
};

}  // namespace

TEST_CASE("checkpoint: async saves through a device's copy stream, ordered by events") {
  // One rank; its state in "device" memory (host memory of the test device above).
  const WholeState ws(tiny_config(), 7);
  TempDir dir;
  DeferredCopyDevice dev;
  ft::ckpt::CheckpointWriter::Options o;
  o.dir = dir.path;
  o.async = true;
  o.staging_device = &dev;
  ft::ckpt::CheckpointWriter writer(o);
  std::vector<std::vector<float>> live[3];
  std::vector<ft::ckpt::PieceSource> pieces;
  for (int s = 0; s < 3; ++s) {
    live[s] = ws.local(s, 1, 0);
    for (size_t g = 0; g < live[s].size(); ++g)
      pieces.push_back({kStates[s], int(g), 0, live[s][g].size(), live[s][g].data(), &dev});
  }
  const nlohmann::json m = manifest_for(ws.cfg, 1, 1, 5);

  // 1. The copies queue behind an event of the compute stream; the writer's thread waits for
  // the copy stream's event before it reads the staging buffer (nothing else runs the copies
  // here: without that wait the shard would hold whatever the staging buffer held).
  writer.save(5, pieces, m);
  writer.wait();
  CHECK(dev.log == std::vector<std::string>{"record compute 1", "wait copy 1", "record copy 2"});
  CHECK(dev.copies.size() == pieces.size());
  check_reads_back(ft::ckpt::read_manifest(dir.file("step_00000005")), ws, 1);

  // 2. The optimizer may write the state once the compute stream waits for the copies (the
  // fence); a second fence without a save adds nothing. The writer's thread is held until the
  // state has changed, so only the fence can have run the copies: the step holds the old values.
  writer.fence_staging_copies();
  CHECK(dev.log.back() == "wait compute 2");
  const WholeState ws6(tiny_config(), 8);
  dev.set_hold(true);
  writer.save(6, pieces, manifest_for(ws.cfg, 1, 1, 6));
  writer.fence_staging_copies();
  CHECK(dev.log.back() == "wait compute 2");  // the same event, recorded again
  const size_t logged = dev.log.size();
  writer.fence_staging_copies();
  CHECK(dev.log.size() == logged);
  for (int s = 0; s < 3; ++s) {  // "AdamW", in place
    const auto next = ws6.local(s, 1, 0);
    for (size_t g = 0; g < next.size(); ++g)
      std::copy(next[g].begin(), next[g].end(), live[s][g].begin());
  }
  dev.set_hold(false);
  writer.wait();
  check_reads_back(ft::ckpt::read_manifest(dir.file("step_00000006")), ws, 1);
}
