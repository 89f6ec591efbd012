// Hugging Face weight import: safetensors tensors → ParamLayout's flat f32 group buffers.
//
// Everything is checked before the first byte is copied (names both ways, shapes, dtypes), so a
// mismatched checkpoint fails with one message listing what is wrong instead of leaving the
// buffers half-filled. The layout's entries carry the HF names, so there is no name table here.
#include "ckpt/hf.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/safetensors.h"
#include "core/error.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr size_t kMaxListed = 10;  // names shown in an error; the rest are counted

// Where one checkpoint tensor lives.
struct Source {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < kMaxListed; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kMaxListed)
    s += " (and " + std::to_string(names.size() - kMaxListed) + " more)";
  return s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool is_file(const fs::path& p) {
  std::error_code ec;  // a permission problem reads as "absent" here and is reported on open
  return fs::is_regular_file(p, ec);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads model.safetensors.index.json: {"weight_map": {tensor name: shard file name}, ...}.
// Returns shard file name → tensor names listed for it.
std::map<std::string, std::vector<std::string>> read_index(const std::string& index_path) {
  std::ifstream in(index_path);
  if (!in) FT_FAIL("cannot open '", index_path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    FT_FAIL("'", index_path, "' is not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    FT_FAIL("'", index_path, "' has no \"weight_map\" object (name → shard file)");
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().empty())
      FT_FAIL("'", index_path, "': weight_map entry '", name, "' is not a file name");
    shards[file.get<std::string>()].push_back(name);
  }
  return shards;
}

}  // namespace

void load_hf_weights(const std::string& dir, const ParamLayout& layout,
                     const std::vector<float*>& group_ptrs) {
  FT_CHECK(group_ptrs.size() == layout.groups().size(), "load_hf_weights: ", group_ptrs.size(),
           " buffers for ", layout.groups().size(), " parameter groups");

  // 1. Open the checkpoint: one file, or the shards an index names. Like transformers, a single
  //    model.safetensors wins when both exist.
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, Source> tensors;  // every tensor the checkpoint offers, by name
  const std::string single = dir + "/" + kSingleFile;
  const std::string index = dir + "/" + kIndexFile;
  if (is_file(single)) {
    files.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, e] : files.back()->entries()) tensors[name] = {files.back().get(), &e};
  } else if (is_file(index)) {
    for (const auto& [shard, names] : read_index(index)) {
      const std::string shard_path = dir + "/" + shard;
      if (!is_file(shard_path))
        FT_FAIL("'", index, "' lists shard '", shard, "' (for tensor '", names.front(), "'), but '",
                shard_path, "' does not exist; is the download complete?");
      files.push_back(std::make_unique<SafetensorsFile>(shard_path));
      const SafetensorsFile& f = *files.back();
      for (const auto& name : names) {
        auto it = f.entries().find(name);
        if (it == f.entries().end())
          FT_FAIL("'", index, "' places tensor '", name, "' in '", shard_path,
                  "', but that file has no such tensor");
        tensors[name] = {&f, &it->second};
      }
    }
  } else {
    FT_FAIL("no ", kSingleFile, " or ", kIndexFile, " in '", dir,
            "' (model.from must be a Hugging Face model folder with safetensors weights; "
            "convert .bin/.pth checkpoints to safetensors first)");
  }

  // 2. Names, both ways.
  std::set<std::string> expected;
  std::vector<std::string> missing;  // in layout order, so the first one shown is the first wanted
  for (const auto& g : layout.groups())
    for (const auto& e : g.entries) {
      expected.insert(e.name);
      if (!tensors.count(e.name)) missing.push_back(e.name);
    }
  std::vector<std::string> unexpected;
  // Older checkpoints store each layer's RoPE frequency table; ft recomputes it from rope_theta.
  for (const auto& [name, src] : tensors)
    if (!expected.count(name) && !ends_with(name, "rotary_emb.inv_freq"))
      unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty()) {
    std::ostringstream msg;
    msg << "Hugging Face checkpoint in '" << dir << "' does not match the model:";
    if (!missing.empty())
      msg << "\n  missing " << missing.size() << " tensor(s): " << join_names(missing);
    if (!unexpected.empty())
      msg << "\n  unexpected " << unexpected.size() << " tensor(s): " << join_names(unexpected);
    const bool lm_head_missing =
        std::find(missing.begin(), missing.end(), "lm_head.weight") != missing.end();
    const bool lm_head_extra =
        std::find(unexpected.begin(), unexpected.end(), "lm_head.weight") != unexpected.end();
    if (lm_head_missing)
      msg << "\n  hint: the checkpoint has no lm_head.weight, so its embeddings are probably "
             "tied; set tie_embeddings (tie_word_embeddings in config.json) to true";
    if (lm_head_extra)
      msg << "\n  hint: the checkpoint has its own lm_head.weight but tie_embeddings is on; set "
             "tie_embeddings (tie_word_embeddings in config.json) to false";
    const std::string first = missing.empty() ? std::string() : missing.front();
    if (first.rfind("model.", 0) == 0 && tensors.count(first.substr(6)))
      msg << "\n  hint: the checkpoint names tensors without the 'model.' prefix (a LlamaModel "
             "rather than a LlamaForCausalLM checkpoint?)";
    msg << "\n  hint: is this a LlamaForCausalLM checkpoint whose config.json matches the "
           "model sizes (n_layers, dim, heads, vocab)?";
    throw Error(msg.str());
  }

  // 3. Shapes and dtypes, in layout order, before anything is copied.
  struct Copy {
    const Source* src;
    float* dst;  // (numel) inside the group's flat buffer
    const ParamEntry* param;
  };
  std::vector<Copy> plan;
  for (size_t g = 0; g < layout.groups().size(); ++g) {
    const ParamGroup& group = layout.groups()[g];
    FT_CHECK(group_ptrs[g] != nullptr || group.numel == 0, "load_hf_weights: no buffer for group '",
             group.name, "'");
    for (const auto& pe : group.entries) {
      const Source& src = tensors.at(pe.name);
      if (src.entry->shape != pe.shape)
        FT_FAIL("tensor '", pe.name, "' in '", src.file->path(), "' has shape ",
                shape_str(src.entry->shape), ", expected ", shape_str(pe.shape),
                " (does config.json match the model sizes?)");
      const DType dt = src.entry->dtype;
      if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
        FT_FAIL("tensor '", pe.name, "' in '", src.file->path(), "' has dtype ", dtype_name(dt),
                "; only F32, BF16 and F16 weights can be imported");
      plan.push_back({&src, group_ptrs[g] + pe.offset, &pe});
    }
  }

  // 4. Copy, file by file in data order, so that reads on a spinning or network disk are
  //    sequential.
  std::sort(plan.begin(), plan.end(), [](const Copy& a, const Copy& b) {
    if (a.src->file != b.src->file) return a.src->file->path() < b.src->file->path();
    return a.src->entry->begin < b.src->entry->begin;
  });
  for (const Copy& c : plan) c.src->file->read_f32(c.param->name, c.dst, c.param->numel);
}

}  // namespace ft
