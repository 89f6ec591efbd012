// Hugging Face weight import: a tiny Llama (dim 8, 2 layers, 2 heads, 1 KV head, ffn 12,
// vocab 11) written as safetensors by the test in BF16, F32, F16 and mixed, single-file and
// sharded, tied and untied; then every way a checkpoint can disagree with the layout.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "model/layout.h"
#include "temp_dir.h"

namespace fs = std::filesystem;

namespace {

doctest::Contains has(const std::string& s) { return doctest::Contains(s.c_str()); }

ft::ModelConfig tiny_config(bool tie) {
  ft::ModelConfig c;
  c.dim = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn_dim = 12;
  c.vocab_size = 11;
  c.tie_embeddings = tie;
  return c;
}

// One tensor as the test writes it: f32 values, stored on disk in `dtype`.
struct TensorSpec {
  std::string name;
  ft::DType dtype = ft::DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Values with at most 7 significant bits, so BF16 and F16 hold them exactly; distinct per tensor
// (k) and position (i) so that a misplaced copy shows.
float exact_value(size_t k, size_t i) { return float(int((k * 37 + i * 11) % 255) - 127) / 16.0f; }
// Values that no 16-bit type holds exactly.
float inexact_value(size_t k, size_t i) { return std::sin(float(k * 1000 + i) * 0.37f) * 3.0f; }

// Every tensor the layout expects, in layout order.
std::vector<TensorSpec> layout_tensors(const ft::ParamLayout& layout, ft::DType dtype,
                                       bool exact = true) {
  std::vector<TensorSpec> out;
  for (const auto& g : layout.groups())
    for (const auto& e : g.entries) {
      TensorSpec t{e.name, dtype, e.shape, std::vector<float>(e.numel)};
      for (size_t i = 0; i < e.numel; ++i)
        t.values[i] = exact ? exact_value(out.size(), i) : inexact_value(out.size(), i);
      out.push_back(std::move(t));
    }
  return out;
}

// What the reader should produce for a value stored in `dtype`.
float stored(ft::DType dtype, float v) {
  if (dtype == ft::DType::kBF16) return ft::bf16_to_f32(ft::f32_to_bf16(v));
  if (dtype == ft::DType::kF16) return ft::f16_to_f32(ft::f32_to_f16(v));
  return v;
}

void write_file(const std::string& path, const std::vector<TensorSpec>& tensors) {
  std::vector<std::vector<uint8_t>> bytes;  // keeps each tensor's encoding alive until written
  std::vector<ft::SafetensorsTensorOut> outs;
  for (const auto& t : tensors) {
    std::vector<uint8_t> b(t.values.size() * ft::dtype_size(t.dtype));
    for (size_t i = 0; i < t.values.size(); ++i) {
      const float v = t.values[i];
      switch (t.dtype) {
        case ft::DType::kF32:
          std::memcpy(&b[i * 4], &v, 4);
          break;
        case ft::DType::kBF16: {
          const uint16_t h = ft::f32_to_bf16(v);
          std::memcpy(&b[i * 2], &h, 2);
          break;
        }
        case ft::DType::kF16: {
          const uint16_t h = ft::f32_to_f16(v);
          std::memcpy(&b[i * 2], &h, 2);
          break;
        }
        case ft::DType::kI32: {
          const int32_t x = int32_t(v);
          std::memcpy(&b[i * 4], &x, 4);
          break;
        }
        default:
          FAIL("test writes no " << ft::dtype_name(t.dtype));
      }
    }
    bytes.push_back(std::move(b));
    outs.push_back({t.name, t.dtype, t.shape, bytes.back().data()});
  }
  ft::write_safetensors(path, outs, {{"format", "pt"}});
}

// Group buffers filled with NaN, so a parameter that is never written shows.
struct Buffers {
  std::vector<std::vector<float>> data;
  std::vector<float*> ptrs;
  explicit Buffers(const ft::ParamLayout& layout) {
    for (const auto& g : layout.groups())
      data.emplace_back(g.numel, std::numeric_limits<float>::quiet_NaN());
    for (auto& d : data) ptrs.push_back(d.data());
  }
  bool untouched() const {
    for (const auto& d : data)
      for (float v : d)
        if (!std::isnan(v)) return false;
    return true;
  }
};

// Every layout entry in `buf` holds what `tensors` wrote (after the dtype's rounding).
void check_loaded(const ft::ParamLayout& layout, const Buffers& buf,
                  const std::vector<TensorSpec>& tensors) {
  size_t checked = 0;
  for (const auto& t : tensors) {
    int g;
    const ft::ParamEntry* e;
    if (!layout.find(t.name, &g, &e)) continue;
    const float* p = buf.data[size_t(g)].data() + e->offset;
    size_t wrong = 0;
    for (size_t i = 0; i < e->numel; ++i) wrong += p[i] != stored(t.dtype, t.values[i]);
    INFO(t.name);
    CHECK(wrong == 0);
    ++checked;
  }
  size_t params = 0;
  for (const auto& g : layout.groups()) params += g.entries.size();
  CHECK(checked == params);
  for (const auto& d : buf.data)
    for (float v : d) REQUIRE_FALSE(std::isnan(v));  // nothing left unwritten
}

// Writes `tensors` as one model.safetensors, loads that folder into `buf` and checks every value.
void load_single_file(const ft::ParamLayout& layout, const std::vector<TensorSpec>& tensors,
                      Buffers& buf) {
  TempDir dir;
  write_file(dir.file("model.safetensors"), tensors);
  ft::load_hf_weights(dir.path, layout, buf.ptrs);
  check_loaded(layout, buf, tensors);
}

void write_index(const std::string& dir,
                 const std::vector<std::pair<std::string, std::string>>& map) {
  nlohmann::json j;
  j["metadata"] = {{"total_size", 1234}};
  j["weight_map"] = nlohmann::json::object();
  for (const auto& [name, file] : map) j["weight_map"][name] = file;
  std::ofstream(dir + "/model.safetensors.index.json") << j.dump(2);
}

std::vector<TensorSpec> without(std::vector<TensorSpec> t, const std::string& name) {
  std::erase_if(t, [&](const TensorSpec& s) { return s.name == name; });
  return t;
}

void write_config(const std::string& dir, const ft::ModelConfig& c);  // with the summary tests

}  // namespace

TEST_CASE("hf import: single BF16 file, rotary inv_freq ignored") {
  const ft::ParamLayout layout(tiny_config(false));
  auto tensors = layout_tensors(layout, ft::DType::kBF16);
  REQUIRE(tensors.size() == 1 + 2 * 9 + 2);
  // Older Llama checkpoints carry the RoPE table; it is recomputed, not loaded.
  tensors.push_back(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", ft::DType::kF32, {2}, {1, 0.5f}});
  Buffers buf(layout);
  load_single_file(layout, tensors, buf);
  // A spot check in plain terms: embed row 0 starts with exact_value(0, 0).
  CHECK(buf.data[0][0] == exact_value(0, 0));
}

TEST_CASE("hf import: F32, F16 and mixed dtypes") {
  const ft::ParamLayout layout(tiny_config(false));
  SUBCASE("F32, values no 16-bit type holds") {
    const auto tensors = layout_tensors(layout, ft::DType::kF32, /*exact=*/false);
    Buffers buf(layout);
    load_single_file(layout, tensors, buf);
  }
  SUBCASE("F16") {
    const auto tensors = layout_tensors(layout, ft::DType::kF16, /*exact=*/false);
    Buffers buf(layout);
    load_single_file(layout, tensors, buf);
  }
  SUBCASE("mixed: each tensor its own dtype, rounded values") {
    auto tensors = layout_tensors(layout, ft::DType::kF32, /*exact=*/false);
    const ft::DType cycle[] = {ft::DType::kF32, ft::DType::kBF16, ft::DType::kF16};
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].dtype = cycle[i % 3];
    Buffers buf(layout);
    load_single_file(layout, tensors, buf);
  }
}

TEST_CASE("hf import: sharded checkpoint with an index") {
  TempDir dir;
  const ft::ParamLayout layout(tiny_config(false));
  const auto tensors = layout_tensors(layout, ft::DType::kBF16);
  // Three shards, tensors dealt round-robin, so every shard holds pieces of several groups.
  std::vector<std::vector<TensorSpec>> shards(3);
  std::vector<std::pair<std::string, std::string>> map;
  for (size_t i = 0; i < tensors.size(); ++i) {
    shards[i % 3].push_back(tensors[i]);
    map.emplace_back(tensors[i].name,
                     "model-0000" + std::to_string(i % 3 + 1) + "-of-00003.safetensors");
  }
  shards[1].push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", ft::DType::kF32, {1}, {1}});
  map.emplace_back("model.layers.1.self_attn.rotary_emb.inv_freq",
                   "model-00002-of-00003.safetensors");
  for (size_t s = 0; s < 3; ++s)
    write_file(dir.file("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors"), shards[s]);
  write_index(dir.path, map);

  Buffers buf(layout);
  ft::load_hf_weights(dir.path, layout, buf.ptrs);
  check_loaded(layout, buf, tensors);

  SUBCASE("index points at a missing shard") {
    fs::remove(dir.file("model-00003-of-00003.safetensors"));
    Buffers b2(layout);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, b2.ptrs),
                         has("lists shard 'model-00003-of-00003.safetensors'"), ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, b2.ptrs),
                         has("model-00003-of-00003.safetensors' does not exist"), ft::Error);
  }
  SUBCASE("index places a tensor in a shard that lacks it") {
    map[0].second = "model-00002-of-00003.safetensors";  // embed actually lives in shard 1
    write_index(dir.path, map);
    Buffers b2(layout);
    CHECK_THROWS_WITH_AS(
        ft::load_hf_weights(dir.path, layout, b2.ptrs),
        has("places tensor 'model.embed_tokens.weight' in '" +
            dir.file("model-00002-of-00003.safetensors") + "', but that file has no such tensor"),
        ft::Error);
  }
  SUBCASE("a single model.safetensors wins over the index") {
    fs::remove(dir.file("model-00003-of-00003.safetensors"));  // the index is now broken
    auto single = layout_tensors(layout, ft::DType::kF32, /*exact=*/false);
    write_file(dir.file("model.safetensors"), single);
    Buffers b2(layout);
    ft::load_hf_weights(dir.path, layout, b2.ptrs);
    check_loaded(layout, b2, single);
  }
}

TEST_CASE("hf import: malformed index and missing folder contents") {
  TempDir dir;
  const ft::ParamLayout layout(tiny_config(false));
  Buffers buf(layout);
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                       has("no model.safetensors or model.safetensors.index.json "
                           "in '" +
                           dir.path + "'"),
                       ft::Error);
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.file("nope"), layout, buf.ptrs),
                       has("in '" + dir.file("nope") + "'"), ft::Error);

  const std::string index = dir.file("model.safetensors.index.json");
  std::ofstream(index) << "{\"weight_map\": {";
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                       has(index + "' is not valid JSON"), ft::Error);
  std::ofstream(index) << "{\"metadata\": {}}";
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                       has(index + "' has no \"weight_map\""), ft::Error);
  std::ofstream(index) << "{\"weight_map\": {\"model.norm.weight\": 3}}";
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                       has("weight_map entry \"model.norm.weight\" is not a file name"), ft::Error);
  std::ofstream(index) << "{\"weight_map\": {\"model.norm.weight\": \"../elsewhere.safetensors\"}}";
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                       has("is not a file name of the folder (got \"../elsewhere.safetensors\")"),
                       ft::UsageError);

  // A corrupt model.safetensors: the safetensors reader's error, naming the file, comes through.
  fs::remove(index);
  std::ofstream(dir.file("model.safetensors")) << "garbage";
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                       has("model.safetensors': file is 7 bytes"), ft::Error);
  CHECK(buf.untouched());

  std::vector<float*> too_few(buf.ptrs.begin(), buf.ptrs.end() - 1);
  CHECK_THROWS_AS(ft::load_hf_weights(dir.path, layout, too_few), ft::Error);
}

TEST_CASE("hf import: tied embeddings") {
  const ft::ParamLayout tied(tiny_config(true));
  const ft::ParamLayout untied(tiny_config(false));
  REQUIRE(tied.head().entries.size() == 1);  // model.norm.weight only
  const auto with_head = layout_tensors(untied, ft::DType::kBF16);
  const auto no_head = without(with_head, "lm_head.weight");

  SUBCASE("tied layout, checkpoint without lm_head: loads") {
    TempDir dir;
    write_file(dir.file("model.safetensors"), no_head);
    Buffers buf(tied);
    ft::load_hf_weights(dir.path, tied, buf.ptrs);
    check_loaded(tied, buf, no_head);
  }
  SUBCASE("tied layout, checkpoint with an lm_head equal to the embedding: loads") {
    // As transformers saves a tied model converted from an untied one: the same matrix twice,
    // here in another dtype (F32 head, BF16 embedding: equal after conversion).
    auto same = no_head;
    for (const auto& t : no_head) {
      if (t.name != "model.embed_tokens.weight") continue;
      auto head = t;
      head.name = "lm_head.weight";
      head.dtype = ft::DType::kF32;
      for (float& v : head.values) v = stored(ft::DType::kBF16, v);
      same.push_back(head);
    }
    REQUIRE(same.size() == no_head.size() + 1);
    TempDir dir;
    write_file(dir.file("model.safetensors"), same);
    Buffers buf(tied);
    ft::load_hf_weights(dir.path, tied, buf.ptrs);
    check_loaded(tied, buf, no_head);
    write_config(dir.path, tiny_config(true));
    const ft::HfFolderSummary s = ft::summarize_hf_folder(dir.path);
    CHECK(s.check.tied_copy == "lm_head.weight");
    CHECK(s.compatible());
    size_t expected = 0;
    for (const auto& t : no_head) expected += t.values.size();
    CHECK(s.parameters == expected);  // the copy is not counted twice
  }
  SUBCASE("tied layout, checkpoint with its own, different lm_head: refused, max difference") {
    TempDir dir;
    write_file(dir.file("model.safetensors"), with_head);
    Buffers buf(tied);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, tied, buf.ptrs),
                         has("tensor 'lm_head.weight' in '" + dir.file("model.safetensors") +
                             "' differs from 'model.embed_tokens.weight' in "),
                         ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, tied, buf.ptrs), has("max |difference| "),
                         ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, tied, buf.ptrs),
                         has("set tie_word_embeddings to false"), ft::Error);
    CHECK(buf.untouched());
    write_config(dir.path, tiny_config(true));
    const ft::HfFolderSummary s = ft::summarize_hf_folder(dir.path);  // ft inspect agrees
    CHECK_FALSE(s.compatible());
    REQUIRE(s.check.bad_tensors.size() == 1);
    CHECK(s.check.bad_tensors[0].find("differs from 'model.embed_tokens.weight'") !=
          std::string::npos);
  }
  SUBCASE("tied layout, lm_head of another shape: unexpected, with a hint") {
    auto other = no_head;
    other.push_back({"lm_head.weight", ft::DType::kF32, {3, 8}, std::vector<float>(24, 0.5f)});
    TempDir dir;
    write_file(dir.file("model.safetensors"), other);
    Buffers buf(tied);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, tied, buf.ptrs),
                         has("unexpected 1 tensor(s): lm_head.weight"), ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, tied, buf.ptrs),
                         has("tie_embeddings is on; set tie_embeddings "
                             "(tie_word_embeddings in config.json) to false"),
                         ft::Error);
    CHECK(buf.untouched());
  }
  SUBCASE("untied layout, checkpoint without lm_head: error with a hint") {
    TempDir dir;
    write_file(dir.file("model.safetensors"), no_head);
    Buffers buf(untied);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, untied, buf.ptrs),
                         has("missing 1 tensor(s): lm_head.weight"), ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, untied, buf.ptrs),
                         has("embeddings are probably tied"), ft::Error);
    CHECK(buf.untouched());
  }
}

TEST_CASE("hf import: checkpoint and layout disagree") {
  TempDir dir;
  const ft::ParamLayout layout(tiny_config(false));
  const auto tensors = layout_tensors(layout, ft::DType::kBF16);
  const std::string file = dir.file("model.safetensors");
  Buffers buf(layout);

  SUBCASE("missing tensor") {
    write_file(file, without(tensors, "model.layers.1.mlp.up_proj.weight"));
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("Hugging Face checkpoint in '" + dir.path +
                             "' does not match the model:\n  missing 1 tensor(s): "
                             "model.layers.1.mlp.up_proj.weight"),
                         ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("is this a LlamaForCausalLM checkpoint"), ft::Error);
  }
  SUBCASE("many missing tensors: the list is cut at 10") {
    write_file(file, tensors);
    ft::ModelConfig deeper = tiny_config(false);
    deeper.n_layers = 4;  // the checkpoint has 2 layers; layers 2 and 3 (18 tensors) are missing
    const ft::ParamLayout deep(deeper);
    Buffers b4(deep);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, deep, b4.ptrs),
                         has("missing 18 tensor(s): model.layers.2.input_layernorm."
                             "weight, "),
                         ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, deep, b4.ptrs), has("(and 8 more)"),
                         ft::Error);
  }
  SUBCASE("missing and unexpected together, names without the model. prefix") {
    auto bare = tensors;
    for (auto& t : bare)
      if (t.name.rfind("model.", 0) == 0) t.name = t.name.substr(6);
    write_file(file, bare);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("unexpected 20 tensor(s): embed_tokens.weight, "), ft::Error);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("without the 'model.' prefix"), ft::Error);
  }
  SUBCASE("unexpected tensor") {
    auto extra = tensors;
    extra.push_back(
        {"model.layers.0.self_attn.q_proj.bias", ft::DType::kBF16, {8}, std::vector<float>(8)});
    write_file(file, extra);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("unexpected 1 tensor(s): "
                             "model.layers.0.self_attn.q_proj.bias"),
                         ft::Error);
  }
  SUBCASE("wrong shape") {
    auto bad = tensors;
    for (auto& t : bad)
      if (t.name == "model.layers.0.self_attn.k_proj.weight") {
        t.shape = {8, 8};  // an MHA checkpoint where the recipe says one KV head
        t.values.assign(64, 0.5f);
      }
    write_file(file, bad);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("tensor 'model.layers.0.self_attn.k_proj.weight' in '" + file +
                             "' has shape [8, 8], expected [4, 8]"),
                         ft::Error);
  }
  SUBCASE("same element count, transposed shape") {
    auto bad = tensors;
    for (auto& t : bad)
      if (t.name == "model.layers.1.mlp.down_proj.weight") t.shape = {12, 8};
    write_file(file, bad);
    CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir.path, layout, buf.ptrs),
                         has("has shape [12, 8], expected [8, 12]"), ft::Error);
  }
  SUBCASE("integer dtype") {
    auto bad = tensors;
    for (auto& t : bad)
      if (t.name == "model.norm.weight") t.dtype = ft::DType::kI32;
    write_file(file, bad);
    CHECK_THROWS_WITH_AS(
        ft::load_hf_weights(dir.path, layout, buf.ptrs),
        has("tensor 'model.norm.weight' in '" + file + "' has dtype I32; only F32, BF16 and F16"),
        ft::Error);
  }
  // Every check runs before the first copy: a rejected checkpoint leaves the buffers alone.
  CHECK(buf.untouched());
}

// ---- summarize_hf_folder (ft inspect) --------------------------------------------------------

namespace {

void write_config(const std::string& dir, const ft::ModelConfig& c) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", c.dim},
                      {"num_hidden_layers", c.n_layers},
                      {"num_attention_heads", c.n_heads},
                      {"num_key_value_heads", c.n_kv_heads},
                      {"intermediate_size", c.ffn_dim},
                      {"vocab_size", c.vocab_size},
                      {"max_position_embeddings", c.max_seq_len},
                      {"rms_norm_eps", c.norm_eps},
                      {"tie_word_embeddings", c.tie_embeddings}};
  std::ofstream(dir + "/config.json") << j.dump(2);
}

std::vector<std::string> names_of(const ft::HfFolderSummary& s) {
  std::vector<std::string> n;
  for (const auto& t : s.tensors) n.push_back(t.name);
  return n;
}

}  // namespace

TEST_CASE("hf summary: sharded folder in layout order, counts, files, RoPE buffer") {
  TempDir dir;
  const ft::ModelConfig cfg = tiny_config(false);
  const ft::ParamLayout layout(cfg);
  auto tensors = layout_tensors(layout, ft::DType::kBF16);
  const ft::DType cycle[] = {ft::DType::kF32, ft::DType::kBF16, ft::DType::kF16};
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].dtype = cycle[i % 3];
  tensors.push_back(
      {"model.layers.1.self_attn.rotary_emb.inv_freq", ft::DType::kF32, {2}, {1, 0.5f}});
  // Two shards, dealt round-robin, so that the files' order says nothing about layout order.
  std::vector<std::vector<TensorSpec>> shards(2);
  std::vector<std::pair<std::string, std::string>> map;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string file = "model-0000" + std::to_string(2 - i % 2) + "-of-00002.safetensors";
    shards[1 - i % 2].push_back(tensors[i]);
    map.emplace_back(tensors[i].name, file);
  }
  write_file(dir.file("model-00001-of-00002.safetensors"), shards[0]);
  write_file(dir.file("model-00002-of-00002.safetensors"), shards[1]);
  write_index(dir.path, map);
  write_config(dir.path, cfg);

  const ft::HfFolderSummary s = ft::summarize_hf_folder(dir.path);
  CHECK(s.config.dim == 8);
  CHECK(s.config.n_kv_heads == 1);
  REQUIRE(s.files.size() == 2);
  CHECK(s.files[0].name == "model-00001-of-00002.safetensors");
  CHECK(s.files[0].tensors == shards[0].size());
  CHECK(s.files[1].tensors == shards[1].size());
  CHECK(s.files[1].bytes == fs::file_size(dir.file("model-00002-of-00002.safetensors")));

  // Layout order, the RoPE buffer after its layer's expected tensors.
  std::vector<std::string> want;
  for (const auto& g : layout.groups()) {
    for (const auto& e : g.entries) want.push_back(e.name);
    if (g.name == "layers.1") want.push_back("model.layers.1.self_attn.rotary_emb.inv_freq");
  }
  CHECK(names_of(s) == want);
  CHECK(s.tensors[1].layer == 0);
  CHECK(s.tensors.front().layer == -1);
  CHECK(s.tensors.back().layer == -1);

  // Parameters: the layout's, not counting the RoPE buffer; bytes: each dtype's size.
  CHECK(s.parameters == layout.total_numel());
  uint64_t bytes = 0;
  std::map<ft::DType, size_t> dtypes;
  for (const auto& t : tensors) {
    bytes += t.values.size() * ft::dtype_size(t.dtype);
    ++dtypes[t.dtype];
  }
  CHECK(s.tensor_bytes == bytes);
  CHECK(s.dtypes == dtypes);
  for (const auto& t : s.tensors)
    if (t.name == "model.norm.weight") {
      CHECK(t.file == map[map.size() - 3].second);  // norm is third from last (RoPE appended)
      CHECK(t.shape == std::vector<int64_t>{8});
      CHECK(t.numel == 8);
    }
  CHECK(s.check.ignored ==
        std::vector<std::string>{"model.layers.1.self_attn.rotary_emb.inv_freq"});
  CHECK(s.config_problems.empty());
  CHECK(s.compatible());
}

TEST_CASE("hf summary: mismatches are listed, not thrown, with load_hf_weights' messages") {
  TempDir dir;
  const ft::ModelConfig cfg = tiny_config(true);
  const ft::ParamLayout layout(cfg);
  // An untied checkpoint (lm_head.weight) under a tied config, a missing tensor, a wrong shape,
  // an integer dtype, an extra per-layer tensor and an extra top-level one.
  auto tensors = without(layout_tensors(ft::ParamLayout(tiny_config(false)), ft::DType::kBF16),
                         "model.layers.1.mlp.up_proj.weight");
  for (auto& t : tensors) {
    if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {2, 16};
    if (t.name == "model.layers.1.input_layernorm.weight") t.dtype = ft::DType::kI32;
  }
  tensors.push_back(
      {"model.layers.0.self_attn.q_proj.bias", ft::DType::kBF16, {8}, std::vector<float>(8)});
  tensors.push_back({"model.layers.7", ft::DType::kBF16, {1}, {1}});  // no layer: no '.' after
  write_file(dir.file("model.safetensors"), tensors);
  write_config(dir.path, cfg);

  const ft::HfFolderSummary s = ft::summarize_hf_folder(dir.path);
  CHECK_FALSE(s.compatible());
  CHECK(s.check.missing == std::vector<std::string>{"model.layers.1.mlp.up_proj.weight"});
  // lm_head.weight has the embedding's shape: a tied copy, refused because its values differ.
  CHECK(s.check.unexpected ==
        std::vector<std::string>{"model.layers.0.self_attn.q_proj.bias", "model.layers.7"});
  CHECK(s.check.tied_copy == "lm_head.weight");
  REQUIRE(s.check.bad_tensors.size() == 3);
  CHECK(doctest::String(s.check.bad_tensors[2].c_str()) ==
        has("tensor 'lm_head.weight' in '" + dir.file("model.safetensors") +
            "' differs from 'model.embed_tokens.weight'"));
  CHECK(s.check.bad_tensors[0] == "tensor 'model.layers.0.self_attn.k_proj.weight' in '" +
                                      dir.file("model.safetensors") +
                                      "' has shape [2, 16], expected [4, 8] (does config.json "
                                      "match the model sizes?)");
  CHECK(doctest::String(s.check.bad_tensors[1].c_str()) ==
        has("'model.layers.1.input_layernorm.weight'"));
  CHECK(doctest::String(s.check.bad_tensors[1].c_str()) == has("has dtype I32"));
  // The hints speak of the folder's family; the unexpected q_proj.bias is Qwen2's.
  CHECK(doctest::String(s.check.hints.back().c_str()) ==
        has("is this a LlamaForCausalLM checkpoint (config.json: model_type \"llama\")"));
  CHECK(doctest::String(s.check.hints.front().c_str()) ==
        has("the weights have q/k/v biases, as Qwen2's have, but config.json says llama"));
  // The extra layer-0 tensor sits after layer 0's expected ones; the unplaceable one at the end.
  const auto names = names_of(s);
  const auto at = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) - names.begin();
  };
  CHECK(at("model.layers.0.self_attn.q_proj.bias") ==
        at("model.layers.0.mlp.down_proj.weight") + 1);
  CHECK(names.back() == "model.layers.7");
  // The parameter count is what the folder holds, whether or not ft can use it.
  uint64_t numel = 0;
  for (const auto& t : tensors) numel += t.values.size();
  CHECK(s.parameters == numel);

  // With the names right, the import refuses the folder with the summary's first tensor problem.
  TempDir dir2;
  const ft::ParamLayout untied(tiny_config(false));
  auto shape_only = layout_tensors(untied, ft::DType::kBF16);
  for (auto& t : shape_only)
    if (t.name == "model.layers.1.mlp.down_proj.weight") t.shape = {12, 8};
  write_file(dir2.file("model.safetensors"), shape_only);
  write_config(dir2.path, tiny_config(false));
  const ft::HfFolderSummary s2 = ft::summarize_hf_folder(dir2.path);
  REQUIRE(s2.check.missing.empty());
  REQUIRE(s2.check.unexpected.empty());
  REQUIRE(s2.check.bad_tensors.size() == 1);
  Buffers buf(untied);
  CHECK_THROWS_WITH_AS(ft::load_hf_weights(dir2.path, untied, buf.ptrs),
                       s2.check.bad_tensors[0].c_str(), ft::Error);
}

TEST_CASE("hf summary: sizes ft cannot run are config problems") {
  TempDir dir;
  ft::ModelConfig cfg = tiny_config(false);
  const ft::ParamLayout layout(cfg);
  write_file(dir.file("model.safetensors"), layout_tensors(layout, ft::DType::kBF16));
  SUBCASE("query heads not a multiple of KV heads") {
    cfg.n_heads = 2;
    cfg.n_kv_heads = 3;
    write_config(dir.path, cfg);
    const auto s = ft::summarize_hf_folder(dir.path);
    CHECK(s.config_problems ==
          std::vector<std::string>{
              "num_attention_heads 2 is not divisible by num_key_value_heads 3"});
    CHECK_FALSE(s.compatible());
  }
  SUBCASE("hidden size not a multiple of the heads: no layout, no tensor check") {
    cfg.n_heads = 3;
    cfg.n_kv_heads = 3;
    write_config(dir.path, cfg);
    const auto s = ft::summarize_hf_folder(dir.path);
    CHECK(s.config_problems ==
          std::vector<std::string>{"hidden_size 8 is not divisible by num_attention_heads 3"});
    CHECK(s.check.missing.empty());
    CHECK(s.tensors.size() == layout_tensors(layout, ft::DType::kBF16).size());
    CHECK_FALSE(s.compatible());
  }
  SUBCASE("odd head_dim") {
    cfg.n_heads = 8;
    cfg.n_kv_heads = 8;
    write_config(dir.path, cfg);
    const auto s = ft::summarize_hf_folder(dir.path);
    REQUIRE(s.config_problems.size() == 1);
    CHECK(doctest::String(s.config_problems[0].c_str()) ==
          has("head_dim = hidden_size / num_attention_heads = 1 is odd"));
  }
}

TEST_CASE("hf summary: malformed files throw ft::Error naming the file, exit code 1") {
  TempDir dir;
  const ft::ModelConfig cfg = tiny_config(false);
  const ft::ParamLayout layout(cfg);
  write_file(dir.file("model.safetensors"), layout_tensors(layout, ft::DType::kBF16));

  // read_hf_config's usage error becomes a runtime one: here config.json is the input.
  std::ofstream(dir.file("config.json")) << "{\"hidden_size\": 8,";
  try {
    ft::summarize_hf_folder(dir.path);
    FAIL("no error for a malformed config.json");
  } catch (const ft::Error& e) {
    CHECK(doctest::String(e.what()) == has(dir.file("config.json") + ": not valid JSON"));
    CHECK(e.code() == ft::ExitCode::kRuntime);
  }

  write_config(dir.path, cfg);
  std::ofstream(dir.file("model.safetensors")) << "garbage";
  try {
    ft::summarize_hf_folder(dir.path);
    FAIL("no error for a corrupt model.safetensors");
  } catch (const ft::Error& e) {
    CHECK(doctest::String(e.what()) == has(dir.file("model.safetensors") + "': file is 7 bytes"));
    CHECK(e.code() == ft::ExitCode::kRuntime);
  }
}

TEST_CASE("hf import: qwen2 biases and qwen3 q/k norms in the layout, tensor-parallel slices") {
  ft::ModelConfig q2 = tiny_config(false);
  q2.arch = "qwen2";
  q2.n_kv_heads = 2;  // divisible by 2 tensor ranks
  q2.vocab_size = 12;
  const ft::ParamLayout layout(q2);
  std::vector<std::string> names;
  for (const auto& e : layout.block(1).entries) names.push_back(e.name);
  const std::string p = "model.layers.1.self_attn.";
  CHECK(names[1] == p + "q_proj.weight");
  CHECK(names[2] == p + "q_proj.bias");
  CHECK(names[4] == p + "k_proj.bias");
  CHECK(names[6] == p + "v_proj.bias");
  CHECK(names[7] == p + "o_proj.weight");
  CHECK(names.size() == 12);
  // q, k and v: 2 heads x 4; the offsets the model uses point at them
  const ft::BlockOffsets& o = layout.block_offsets();
  CHECK(o.bq == o.wq + 8 * 8);
  CHECK(o.wk == o.bq + 8);
  CHECK(o.bk == o.wk + 8 * 8);
  CHECK(o.q_norm == ft::BlockOffsets::kAbsent);
  // A bias is split with its weight's rows; the load fills it like any tensor.
  const ft::ParamLayout tp(q2, 2);
  int g = 0;
  const ft::ParamEntry* e = nullptr;
  REQUIRE(tp.find("model.layers.0.self_attn.k_proj.bias", &g, &e));
  CHECK(e->split == ft::TensorSplit::kRows);
  CHECK(e->shape == std::vector<int64_t>{4});
  CHECK(e->global_shape == std::vector<int64_t>{8});
  CHECK_FALSE(e->weight_decay);
  auto tensors = layout_tensors(layout, ft::DType::kF32);
  Buffers buf(layout);
  load_single_file(layout, tensors, buf);  // checks every element landed where the layout says

  ft::ModelConfig q3 = q2;
  q3.arch = "qwen3";
  const ft::ParamLayout l3(q3, 2);
  REQUIRE(l3.find("model.layers.0.self_attn.k_norm.weight", &g, &e));
  CHECK(e->split == ft::TensorSplit::kReplicated);
  CHECK(e->shape == std::vector<int64_t>{4});  // head_dim, whole on every tensor rank
  CHECK(l3.block_offsets().k_norm == l3.block_offsets().q_norm + 4);
  CHECK(l3.block_offsets().bq == ft::BlockOffsets::kAbsent);
  ft::ModelConfig mistral = tiny_config(false);
  mistral.arch = "mistral";
  CHECK(ft::ParamLayout(mistral).total_numel() ==
        ft::ParamLayout(tiny_config(false)).total_numel());
}

TEST_CASE("hf import: a NaN or infinity is refused as it is read, naming tensor, file and index") {
  ft::ModelConfig c = tiny_config(false);
  c.n_kv_heads = 2;  // q, k, v split over 2 tensor ranks
  c.vocab_size = 12;
  const ft::ParamLayout whole(c), tp(c, 2);
  int g = 0;
  const ft::ParamEntry* e = nullptr;
  const std::string q = "model.layers.1.self_attn.q_proj.weight";  // (8, 8), rows split
  const std::string o = "model.layers.1.self_attn.o_proj.weight";  // (8, 8), columns split
  REQUIRE(tp.find(q, &g, &e));
  REQUIRE(e->split == ft::TensorSplit::kRows);
  REQUIRE(tp.find(o, &g, &e));
  REQUIRE(e->split == ft::TensorSplit::kCols);
  auto set = [](std::vector<TensorSpec>& t, const std::string& name, size_t at, float v) {
    for (auto& s : t)
      if (s.name == name) s.values[at] = v;
  };
  auto refusal = [](const std::string& dir, const ft::ParamLayout& layout, int rank) {
    Buffers buf(layout);
    try {
      ft::load_hf_weights(dir, layout, buf.ptrs, rank);
    } catch (const ft::Error& err) {
      CHECK(err.code() == ft::ExitCode::kUsage);  // bad input, before step 1
      return std::string(err.what());
    }
    return std::string();
  };
  TempDir dir;
  const std::string file = dir.file("model.safetensors");

  SUBCASE("NaN in a BF16 row-split tensor: the rank that reads its row refuses") {
    auto tensors = layout_tensors(whole, ft::DType::kBF16);
    set(tensors, q, 5 * 8 + 3, std::numeric_limits<float>::quiet_NaN());  // [5, 3]
    write_file(file, tensors);
    const std::string want = "tensor '" + q + "' in '" + file + "' holds NaN at [5, 3]";
    CHECK(doctest::String(refusal(dir.path, whole, 0).c_str()) == has(want));
    CHECK(doctest::String(refusal(dir.path, whole, 0).c_str()) ==
          has("(1 non-finite value among the 64 read there)"));
    // Tensor rank 1 holds rows 4-7 and reads row 5; rank 0 (rows 0-3) never reads it.
    CHECK(doctest::String(refusal(dir.path, tp, 1).c_str()) == has(want));
    CHECK(refusal(dir.path, tp, 0).empty());
  }
  SUBCASE("infinities in an F16 column-split tensor, read a row at a time") {
    auto tensors = layout_tensors(whole, ft::DType::kF16);
    set(tensors, o, 2 * 8 + 6, std::numeric_limits<float>::infinity());   // [2, 6]
    set(tensors, o, 7 * 8 + 0, -std::numeric_limits<float>::infinity());  // [7, 0]
    write_file(file, tensors);
    const std::string want = "tensor '" + o + "' in '" + file + "' holds infinity at [2, 6]";
    CHECK(doctest::String(refusal(dir.path, whole, 0).c_str()) == has(want));
    CHECK(doctest::String(refusal(dir.path, whole, 0).c_str()) ==
          has("(2 non-finite values among"));
    CHECK(doctest::String(refusal(dir.path, tp, 1).c_str()) == has("holds infinity at [2, 6]"));
  }
  SUBCASE("a 1-D tensor and the last element; a finite folder still loads") {
    auto tensors = layout_tensors(whole, ft::DType::kF32);
    write_file(file, tensors);
    CHECK(refusal(dir.path, whole, 0).empty());
    set(tensors, "model.norm.weight", 7, std::numeric_limits<float>::quiet_NaN());
    write_file(file, tensors);
    CHECK(doctest::String(refusal(dir.path, whole, 0).c_str()) ==
          has("tensor 'model.norm.weight' in '" + file + "' holds NaN at [7]"));
  }
  SUBCASE("a tied folder's stored lm_head.weight is read, and checked, too") {
    ft::ModelConfig t = c;
    t.tie_embeddings = true;
    const ft::ParamLayout tied(t);
    auto tensors = layout_tensors(tied, ft::DType::kF32);
    auto head = tensors.front();  // the embedding, again
    head.name = "lm_head.weight";
    head.values[3] = std::numeric_limits<float>::quiet_NaN();
    tensors.push_back(head);
    write_file(file, tensors);
    CHECK(doctest::String(refusal(dir.path, tied, 0).c_str()) ==
          has("tensor 'lm_head.weight' in '" + file + "' holds NaN at [0, 3]"));
  }
}

TEST_CASE("hf check: a config.json of more layers than the weights is refused before any layout") {
  TempDir dir;
  const ft::ModelConfig cfg = tiny_config(false);
  write_file(dir.file("model.safetensors"), layout_tensors(ft::ParamLayout(cfg), ft::DType::kBF16));
  write_config(dir.path, cfg);
  CHECK(ft::check_hf_folder(dir.path).compatible());
  // 10^8 layers: a layout of 10^9 entries, were one built; refused from the tensor names.
  ft::ModelConfig huge = cfg;
  huge.n_layers = 100000000;
  write_config(dir.path, huge);
  const ft::HfFolderSummary s = ft::summarize_hf_folder(dir.path);
  REQUIRE(s.config_problems.size() == 1);
  CHECK(s.config_problems[0] ==
        "num_hidden_layers is 100000000, but the weights hold layers 0 to 1 only (a config.json "
        "of another model?)");
  CHECK(s.check.missing.empty());  // no layout was built to compare with
  try {
    ft::check_hf_folder(dir.path);
    FAIL("no error");
  } catch (const ft::Error& e) {
    CHECK(e.code() == ft::ExitCode::kUsage);  // ft generate: bad input
    CHECK(doctest::String(e.what()) == has("config.json: num_hidden_layers is 100000000"));
  }
  // A malformed file: exit code 2 here, 1 from summarize_hf_folder (ft inspect's verdict).
  std::ofstream(dir.file("config.json")) << "{";
  CHECK_THROWS_AS(ft::check_hf_folder(dir.path), ft::UsageError);
}
