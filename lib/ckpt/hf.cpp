// Hugging Face folders: weight import (safetensors tensors → ParamLayout's flat f32 group
// buffers) and the header-only summary behind ft inspect.
//
// Both go through the same two steps, open_weights and check_against_layout, so that inspect
// says "compatible" exactly when the import would accept the folder. The import checks
// everything before the first byte is copied (names both ways, shapes, dtypes), so a mismatched
// checkpoint fails with one message listing what is wrong instead of leaving the buffers
// half-filled. The layout's entries carry the HF names, so there is no name table here.
#include "ckpt/hf.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "adapt/peft.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "data/sha256.h"
#include "model/arch.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kAdapterFile = "adapter_model.safetensors";
constexpr size_t kMaxListed = 10;  // names shown in an error; the rest are counted
constexpr const char* kHeadName = "lm_head.weight";
constexpr const char* kEmbedName = "model.embed_tokens.weight";

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

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A file of the folder that is there in some form (a FIFO, a device, a dangling link too), so
// that a model.safetensors that is not a regular file is refused for what it is rather than
// taken for absent.
bool is_there(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

constexpr const char* kRedownload = "restore it from the model's download";

// Reads model.safetensors.index.json: {"weight_map": {tensor name: shard file name}, ...}.
// Returns shard file name → tensor names listed for it. A shard name must be a file of the
// folder itself (transformers writes plain names): "../x" or "/etc/passwd" is refused.
std::map<std::string, std::vector<std::string>> read_index(const std::string& index_path) {
  const std::string text =
      read_bounded_file(index_path, kMaxManifestBytes, "safetensors index", kRedownload);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("'" + index_path + "' is not valid JSON (" + json_error_words(e) + "); " +
                     kRedownload);
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw UsageError("'" + index_path + "' has no \"weight_map\" object (name → shard file); " +
                     kRedownload);
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    const bool plain = file.is_string() && !file.get<std::string>().empty() &&
                       file.get<std::string>().find('/') == std::string::npos &&
                       file.get<std::string>() != "." && file.get<std::string>() != "..";
    if (!plain)
      throw UsageError("'" + index_path + "': weight_map entry " + excerpt(name) +
                       " is not a file name of the folder (got " + short_dump(file) + "); " +
                       kRedownload);
    shards[file.get<std::string>()].push_back(name);
  }
  return shards;
}

// The folder's weights: its safetensors files with validated headers, and every tensor they
// offer by name. Like transformers, a single model.safetensors wins when an index exists too.
struct OpenedWeights {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, Source> tensors;
};

OpenedWeights open_weights(const std::string& dir) {
  OpenedWeights w;
  const std::string single = dir + "/" + kSingleFile;
  const std::string index = dir + "/" + kIndexFile;
  if (is_there(single)) {
    w.files.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, e] : w.files.back()->entries())
      w.tensors[name] = {w.files.back().get(), &e};
  } else if (is_there(index)) {
    for (const auto& [shard, names] : read_index(index)) {
      const std::string shard_path = dir + "/" + shard;
      if (!is_there(shard_path))
        throw UsageError("'" + index + "' lists shard '" + shard + "' (for tensor '" +
                         names.front() + "'), but '" + shard_path +
                         "' does not exist; is the download complete?");
      w.files.push_back(std::make_unique<SafetensorsFile>(shard_path));
      const SafetensorsFile& f = *w.files.back();
      for (const auto& name : names) {
        auto it = f.entries().find(name);
        if (it == f.entries().end())
          throw UsageError("'" + index + "' places tensor '" + name + "' in '" + shard_path +
                           "', but that file has no such tensor; " + kRedownload);
        w.tensors[name] = {&f, &it->second};
      }
    }
  } else {
    throw UsageError(std::string("no ") + kSingleFile + " or " + kIndexFile + " in '" + dir +
                     "': a Hugging Face model folder holds its weights in safetensors files "
                     "(convert .bin/.pth checkpoints to safetensors first)");
  }
  return w;
}

// Older checkpoints store each layer's RoPE frequency table; ft recomputes it from rope_theta.
bool is_rope_buffer(const std::string& name) { return ends_with(name, "rotary_emb.inv_freq"); }

// transformers' class of a family (model.arch), for hints.
std::string class_of(const std::string& arch) {
  const ArchSpec* a = find_arch(arch);
  return a != nullptr && a->implemented ? a->hf_class : "LlamaForCausalLM";
}

// The first implemented family with the extra tensor `has`.
const ArchSpec& first_family_with(bool ArchSpec::*has) {
  for (const ArchSpec& a : arch_table())
    if (a.implemented && a.*has) return a;
  FT_CHECK(false, "no family has this tensor");
  return arch_table().front();
}

bool any_ends_with(const std::vector<std::string>& names, const std::string& suffix) {
  for (const std::string& n : names)
    if (ends_with(n, suffix)) return true;
  return false;
}

// Names both ways, then shapes and dtypes of the tensors that are there, in layout order. `arch`
// (config.json's family, model.arch) words the hints.
HfLayoutCheck check_against_layout(const std::map<std::string, Source>& tensors,
                                   const ParamLayout& layout, const std::string& arch) {
  HfLayoutCheck c;
  std::set<std::string> expected;
  for (const auto& g : layout.groups()) {
    if (g.attached_to >= 0) continue;  // an adapter's (load_peft_adapter), not the base's
    for (const auto& pe : g.entries) {
      expected.insert(pe.name);
      auto it = tensors.find(pe.name);
      if (it == tensors.end()) {
        c.missing.push_back(pe.name);
        continue;
      }
      const Source& src = it->second;
      if (src.entry->shape != pe.global_shape)
        c.bad_tensors.push_back(detail::concat("tensor '", pe.name, "' in '", src.file->path(),
                                               "' has shape ", shape_str(src.entry->shape),
                                               ", expected ", shape_str(pe.global_shape),
                                               " (does config.json match the model sizes?)"));
      const DType dt = src.entry->dtype;
      if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
        c.bad_tensors.push_back(detail::concat("tensor '", pe.name, "' in '", src.file->path(),
                                               "' has dtype ", dtype_name(dt),
                                               "; only F32, BF16 and F16 weights can be imported"));
    }
  }
  // A tied model may still store its output matrix (transformers saves one when the checkpoint
  // was converted or saved untied and then tied): it is the embedding again, loaded once. Whether
  // it really equals the embedding needs the data; tied_head_difference checks that.
  int g = 0;
  const ParamEntry* embed = nullptr;
  const bool tied = !layout.find(kHeadName, &g, &embed);
  for (const auto& [name, src] : tensors) {
    if (expected.count(name)) continue;
    if (is_rope_buffer(name)) {
      c.ignored.push_back(name);
    } else if (tied && name == kHeadName && layout.find(kEmbedName, &g, &embed) &&
               src.entry->shape == embed->global_shape) {
      c.tied_copy = name;
    } else {
      c.unexpected.push_back(name);
    }
  }
  if (c.missing.empty() && c.unexpected.empty()) return c;

  auto listed = [](const std::vector<std::string>& v, const char* name) {
    return std::find(v.begin(), v.end(), name) != v.end();
  };
  if (listed(c.missing, "lm_head.weight"))
    c.hints.push_back(
        "the checkpoint has no lm_head.weight, so its embeddings are probably tied; set "
        "tie_embeddings (tie_word_embeddings in config.json) to true");
  if (listed(c.unexpected, "lm_head.weight"))
    c.hints.push_back(
        "the checkpoint has its own lm_head.weight (of another shape than the embedding) but "
        "tie_embeddings is on; set tie_embeddings (tie_word_embeddings in config.json) to false");
  const std::string cls = class_of(arch);
  const std::string first = c.missing.empty() ? std::string() : c.missing.front();
  if (first.rfind("model.", 0) == 0 && tensors.count(first.substr(6)))
    c.hints.push_back("the checkpoint names tensors without the 'model.' prefix (a " +
                      cls.substr(0, cls.size() - std::string("ForCausalLM").size()) +
                      "Model rather than a " + cls + " checkpoint?)");
  // The attention block's extra tensors tell the families apart (model/arch.h): q/k/v biases
  // (Qwen2), q/k norms (Qwen3).
  struct Extra {
    bool ArchSpec::*has;
    const char* tensor;  // the name's end
    const char* what;
  };
  const Extra extras[] = {{&ArchSpec::qk_norm, "q_norm.weight", "q/k norms"},
                          {&ArchSpec::qkv_bias, "q_proj.bias", "q/k/v biases"}};
  for (const Extra& x : extras) {  // the first family whose tensors the weights have
    if (!any_ends_with(c.unexpected, x.tensor)) continue;
    const ArchSpec& f = first_family_with(x.has);
    c.hints.push_back("the weights have " + std::string(x.what) + ", as " + f.label +
                      "'s have, but config.json says " + arch + " (" + cls + "); a " + f.label +
                      " checkpoint needs model_type \"" + f.name + "\" and architectures [\"" +
                      f.hf_class + "\"]");
    break;
  }
  for (const Extra& x : extras)
    if (any_ends_with(c.missing, x.tensor) && !any_ends_with(c.unexpected, x.tensor))
      c.hints.push_back("config.json says " + arch + ", whose attention has " + x.what +
                        ", but the weights have none: a " +
                        implemented_archs(&ArchSpec::label, x.has, false) +
                        " checkpoint labelled " + arch + "?");
  c.hints.push_back("is this a " + cls + " checkpoint (config.json: model_type \"" + arch +
                    "\") whose config.json matches its tensors (num_hidden_layers, hidden_size, "
                    "attention heads, vocab_size)?");
  return c;
}

// Refuses non-finite weights as they are read (UsageError: the folder is bad input), naming the
// tensor, the file and where: v holds elements [first, first + n) of tensor `name` of `file` in
// row-major order. A NaN or an infinity in a downloaded model means a damaged file or a model
// saved after it diverged; trained from, it would show only as a NaN loss at step 1, which
// reads as a learning-rate problem. One vectorisable pass over memory just read.
void check_finite(const SafetensorsFile& file, const std::string& name, const float* v, size_t n,
                  size_t first) {
  bool bad = false;
  for (size_t i = 0; i < n; ++i) bad |= !(std::fabs(v[i]) <= std::numeric_limits<float>::max());
  if (!bad) return;
  size_t at = 0, count = 0;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]) && count++ == 0) at = i;
  // The element's index in the tensor's shape: [row, column] for a matrix.
  const std::vector<int64_t>& shape = file.entries().at(name).shape;
  std::vector<int64_t> index(shape.size());
  uint64_t rest = first + at;
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t extent = uint64_t(std::max<int64_t>(1, shape[d]));
    index[d] = int64_t(rest % extent);
    rest /= extent;
  }
  throw UsageError(detail::concat(
      "tensor '", name, "' in '", file.path(), "' holds ", std::isnan(v[at]) ? "NaN" : "infinity",
      " at ", shape_str(index), " (", count, " non-finite value", count == 1 ? "" : "s",
      " among the ", n,
      " read there); ft does not load non-finite weights: the file is "
      "damaged or the model had diverged when it was saved. Download it again, or use another "
      "checkpoint of the model"));
}

// When a tied folder also stores lm_head.weight (check.tied_copy): an error message naming both
// tensors and the largest difference after conversion to f32, or "" when it equals the
// embedding bit for bit (as transformers, which loads such a folder by tying the two, would then
// compute the same model). Reads both tensors; `embedding` may be the already read embedding.
std::string tied_head_difference(const OpenedWeights& w, const HfLayoutCheck& check,
                                 const std::vector<float>* embedding = nullptr) {
  if (check.tied_copy.empty()) return "";
  const Source& head = w.tensors.at(kHeadName);
  const Source& emb = w.tensors.at(kEmbedName);
  size_t numel = 1;
  for (int64_t d : head.entry->shape) numel *= size_t(d);
  std::vector<float> e_read;
  if (!embedding) {
    e_read.resize(numel);
    emb.file->read_f32(kEmbedName, e_read.data(), numel);
    check_finite(*emb.file, kEmbedName, e_read.data(), numel, 0);
    embedding = &e_read;
  }
  std::vector<float> h(numel);
  head.file->read_f32(kHeadName, h.data(), numel);
  check_finite(*head.file, kHeadName, h.data(), numel, 0);
  double worst = 0;
  size_t where = 0, differing = 0;
  for (size_t i = 0; i < numel; ++i) {
    const float a = h[i], b = (*embedding)[i];
    if (std::memcmp(&a, &b, sizeof a) == 0) continue;
    ++differing;
    const double d = std::fabs(double(a) - double(b));
    if (differing == 1 || d > worst || std::isnan(d)) {
      worst = d;
      where = i;
    }
  }
  if (differing == 0) return "";
  const size_t cols = size_t(head.entry->shape.back());
  return detail::concat(
      "tensor '", kHeadName, "' in '", head.file->path(), "' differs from '", kEmbedName, "' in ",
      differing, " of ", numel, " values (max |difference| ", worst, " at [", where / cols, ", ",
      where % cols,
      "]) but tie_word_embeddings is true, so ft would train one matrix for "
      "both; set tie_word_embeddings to false in config.json if the two are meant to differ");
}

// N for "model.layers.N.<rest>", else -1.
int layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t i = prefix.size();
  long long n = 0;
  // Nine digits at most, so that n fits in an int; a longer number is no layer of ours.
  for (; i < name.size() && i < prefix.size() + 9 && std::isdigit((unsigned char)name[i]); ++i)
    n = n * 10 + (name[i] - '0');
  return i > prefix.size() && i < name.size() && name[i] == '.' ? int(n) : -1;
}

// The family of the folder `dir` for hints: config.json's, or, when that cannot be read, what
// the layout's attention tensors say (Qwen2's biases, Qwen3's norms; else llama).
std::string folder_arch(const std::string& dir, const ParamLayout& layout) {
  try {
    return read_hf_config_located(dir).model.arch;
  } catch (const Error&) {
  }
  int g = 0;
  const ParamEntry* e = nullptr;
  if (layout.find("model.layers.0.self_attn.q_norm.weight", &g, &e))
    return first_family_with(&ArchSpec::qk_norm).name;
  if (layout.find("model.layers.0.self_attn.q_proj.bias", &g, &e))
    return first_family_with(&ArchSpec::qkv_bias).name;
  return "llama";
}

// Reads tensor rank t's slice of `pe` (its whole tensor when replicated) into dst (pe.numel).
// A row split is one contiguous range of the file's tensor; a column split is read a few rows
// at a time (kSliceChunk elements at most, or one row) and this rank's columns taken from each
// row, so the host never holds more than that chunk beyond the slice itself.
constexpr size_t kSliceChunk = size_t(4) << 20;
void read_slice(const SafetensorsFile& file, const ParamEntry& pe, int t, float* dst) {
  if (pe.split != TensorSplit::kCols) {
    for_each_slice_run(pe, t, [&](size_t whole, size_t local, size_t n) {
      file.read_f32_range(pe.name, dst + local, whole, n);
      check_finite(file, pe.name, dst + local, n, whole);
    });
    return;
  }
  const size_t rows = size_t(pe.shape[0]), cols = size_t(pe.shape[1]);
  const size_t whole_cols = size_t(pe.global_shape[1]);
  const size_t chunk_rows = std::max<size_t>(1, kSliceChunk / std::max<size_t>(1, whole_cols));
  std::vector<float> buf(std::min(rows, chunk_rows) * whole_cols);
  for (size_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const size_t k = std::min(chunk_rows, rows - r0);
    file.read_f32_range(pe.name, buf.data(), r0 * whole_cols, k * whole_cols);
    check_finite(file, pe.name, buf.data(), k * whole_cols, r0 * whole_cols);
    for (size_t r = 0; r < k; ++r) {
      const float* src = buf.data() + r * whole_cols + size_t(t) * cols;
      std::copy(src, src + cols, dst + (r0 + r) * cols);
    }
  }
}

}  // namespace

struct HfWeightReader::Opened {
  OpenedWeights w;
};

HfWeightReader::HfWeightReader(const std::string& dir, const ParamLayout& layout)
    : layout_(layout), opened_(std::make_unique<Opened>()) {
  // 1. Open the checkpoint: one file, or the shards an index names.
  opened_->w = open_weights(dir);
  const OpenedWeights& w = opened_->w;

  // 2. Names both ways, then shapes and dtypes: all before anything is copied. Name problems are
  //    reported together; of the shape and dtype problems only the first in layout order, which
  //    keeps the message short when a wrong size in config.json makes every layer disagree.
  HfLayoutCheck check = check_against_layout(w.tensors, layout, "llama");
  if (!check.missing.empty() || !check.unexpected.empty()) {
    // Hints in the words of the folder's own family (config.json; the layout's when unreadable).
    check = check_against_layout(w.tensors, layout, folder_arch(dir, layout));
    std::ostringstream msg;
    msg << "Hugging Face checkpoint in '" << dir << "' does not match the model:";
    if (!check.missing.empty())
      msg << "\n  missing " << check.missing.size() << " tensor(s): " << join_names(check.missing);
    if (!check.unexpected.empty())
      msg << "\n  unexpected " << check.unexpected.size()
          << " tensor(s): " << join_names(check.unexpected);
    for (const auto& h : check.hints) msg << "\n  hint: " << h;
    throw UsageError(msg.str());
  }
  if (!check.bad_tensors.empty()) throw UsageError(check.bad_tensors.front());
  if (std::string diff = tied_head_difference(w, check); !diff.empty()) throw UsageError(diff);
}

HfWeightReader::~HfWeightReader() = default;

void HfWeightReader::read(const std::vector<float*>& group_ptrs, int tensor_rank) const {
  FT_CHECK(group_ptrs.size() == layout_.groups().size(), "load_hf_weights: ", group_ptrs.size(),
           " buffers for ", layout_.groups().size(), " parameter groups");
  FT_CHECK(tensor_rank >= 0 && tensor_rank < layout_.tensor(), "load_hf_weights: tensor rank ",
           tensor_rank, " of ", layout_.tensor());
  // 3. Plan the copies: the tensors of the groups asked for (a pipeline stage's), each this
  //    tensor rank's slice of it (the whole tensor with one tensor rank).
  struct Copy {
    const Source* src;
    float* dst;  // (numel) inside the group's flat buffer
    const ParamEntry* param;
  };
  std::vector<Copy> plan;
  for (size_t g = 0; g < layout_.groups().size(); ++g)
    if (group_ptrs[g] && layout_.groups()[g].attached_to < 0)
      for (const auto& pe : layout_.groups()[g].entries)
        plan.push_back({&opened_->w.tensors.at(pe.name), group_ptrs[g] + pe.offset, &pe});

  // 4. Copy, file by file in data order, so that reads on a spinning or network disk are
  //    sequential.
  std::sort(plan.begin(), plan.end(), [](const Copy& a, const Copy& b) {
    if (a.src->file != b.src->file) return a.src->file->path() < b.src->file->path();
    return a.src->entry->begin < b.src->entry->begin;
  });
  for (const Copy& c : plan) read_slice(*c.src->file, *c.param, tensor_rank, c.dst);
}

void HfWeightReader::read_group(int g, float* dst, int tensor_rank) const {
  FT_CHECK(g >= 0 && size_t(g) < layout_.groups().size(), "HfWeightReader: no group ", g);
  std::vector<float*> ptrs(layout_.groups().size(), nullptr);
  ptrs[size_t(g)] = dst;
  read(ptrs, tensor_rank);
}

void load_hf_weights(const std::string& dir, const ParamLayout& layout,
                     const std::vector<float*>& group_ptrs, int tensor_rank) {
  HfWeightReader(dir, layout).read(group_ptrs, tensor_rank);
}

std::string hf_weights_fingerprint(const std::string& dir) {
  Sha256 h;
  const std::string config =
      read_bounded_file(dir + "/config.json", kMaxConfigBytes, "Hugging Face config");
  h.update(config.data(), config.size());
  const OpenedWeights w = open_weights(dir);
  std::vector<std::string> paths;
  for (const auto& f : w.files) paths.push_back(f->path());
  std::sort(paths.begin(), paths.end());
  constexpr uint64_t kHead = uint64_t(1) << 20, kSample = uint64_t(64) << 10;
  constexpr int kPoints = 17;
  std::vector<char> buf(kHead);
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (!in || ec) throw Error("cannot read '" + path + "' to fingerprint the base model");
    const std::string name = fs::path(path).filename().string() + ":" + std::to_string(size);
    h.update(name.data(), name.size() + 1);
    auto take = [&](uint64_t at, uint64_t n) {
      n = std::min(n, size - std::min(size, at));
      in.seekg(std::streamoff(at));
      in.read(buf.data(), std::streamsize(n));
      if (uint64_t(in.gcount()) != n) throw Error("cannot read '" + path + "' (truncated?)");
      h.update(buf.data(), n);
    };
    take(0, kHead);  // the header, and the first tensors
    for (int k = 1; k <= kPoints; ++k) take(size / (kPoints + 1) * uint64_t(k), kSample);
    take(size - std::min(size, kSample), kSample);
  }
  return h.finish_hex();
}

void load_peft_adapter(const std::string& dir, const ParamLayout& layout,
                       const std::vector<float*>& group_ptrs, int tensor_rank) {
  FT_CHECK(group_ptrs.size() == layout.groups().size(), "load_peft_adapter: ", group_ptrs.size(),
           " buffers for ", layout.groups().size(), " parameter groups");
  const std::string path = dir + "/" + kAdapterFile;
  if (!is_there(path))
    throw UsageError("no " + std::string(kAdapterFile) + " in '" + dir +
                     "': a PEFT adapter folder holds its weights there (with adapter_config.json)");
  const SafetensorsFile file(path);
  // What the folder holds for each tensor read: the adapter's under their own names (PEFT saves
  // them without the adapter's name, "default", as ft's entries carry them); a model tensor
  // trained whole (modules_to_save: a trained group of the model) under PEFT's name for it
  // (base_model.model.lm_head.weight). With tied embeddings PEFT saves the shared table under
  // both names (ensure_weight_tying): the embedding's is read, lm_head's allowed beside it.
  struct Read {
    const ParamEntry* entry;
    std::string name;  // in the file
    size_t group;
  };
  std::vector<Read> reads;
  std::set<std::string> allowed;
  for (size_t g = 0; g < layout.groups().size(); ++g) {
    const ParamGroup& group = layout.groups()[g];
    const bool whole = group.attached_to < 0 && group.trains();
    if (group.attached_to < 0 && !whole) continue;
    for (const ParamEntry& pe : group.entries) {
      reads.push_back({&pe, whole ? peft_saved_name(pe.name) : pe.name, g});
      allowed.insert(reads.back().name);
      if (whole && layout.output_weight().group == int(g))  // tied: the table is lm_head's too
        allowed.insert(peft_saved_name("lm_head.weight"));
    }
  }
  std::vector<std::string> missing, unexpected;
  for (const Read& r : reads) {
    const auto it = file.entries().find(r.name);
    if (it == file.entries().end()) {
      missing.push_back(r.name);
      continue;
    }
    if (it->second.shape != r.entry->global_shape)
      throw UsageError(detail::concat(
          "tensor '", r.name, "' in '", path, "' has shape ", shape_str(it->second.shape),
          ", expected ", shape_str(r.entry->global_shape),
          " (does adapter.r match the adapter's r, and model.from its base model?)"));
    const DType dt = it->second.dtype;
    if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
      throw UsageError(detail::concat("tensor '", r.name, "' in '", path, "' has dtype ",
                                      dtype_name(dt), "; only F32, BF16 and F16 can be read"));
  }
  for (const auto& [name, e] : file.entries())
    if (!allowed.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty()) {
    std::ostringstream msg;
    msg << "the PEFT adapter in '" << dir << "' does not match adapter.target_modules, "
        << "adapter.modules_to_save and the model:";
    if (!missing.empty())
      msg << "\n  missing " << missing.size() << " tensor(s): " << join_names(missing);
    if (!unexpected.empty())
      msg << "\n  unexpected " << unexpected.size() << " tensor(s): " << join_names(unexpected);
    msg << "\n  hint: adapter.target_modules and adapter.modules_to_save must list the modules "
        << "the adapter was trained on";
    throw UsageError(msg.str());
  }
  for (const Read& r : reads)
    if (group_ptrs[r.group]) {
      ParamEntry named = *r.entry;  // read_slice reads the tensor of the entry's name
      named.name = r.name;
      read_slice(file, named, tensor_rank, group_ptrs[r.group] + r.entry->offset);
    }
}

std::vector<float> read_hf_rows(const std::string& dir, const std::string& name,
                                const std::vector<int64_t>& rows, int64_t* cols) {
  const OpenedWeights w = open_weights(dir);
  const auto it = w.tensors.find(name);
  if (it == w.tensors.end() || it->second.entry->shape.size() != 2)
    throw UsageError("'" + dir + "' has no 2-D tensor " + name);
  const std::vector<int64_t>& shape = it->second.entry->shape;
  *cols = shape[1];
  std::vector<float> out(rows.size() * size_t(shape[1]));
  for (size_t i = 0; i < rows.size(); ++i) {
    FT_CHECK(rows[i] >= 0 && rows[i] < shape[0], "read_hf_rows: row ", rows[i], " of ", name, " (",
             shape[0], " rows)");
    it->second.file->read_f32_range(name, out.data() + i * size_t(shape[1]),
                                    size_t(rows[i]) * size_t(shape[1]), size_t(shape[1]));
  }
  return out;
}

namespace {

HfFolderSummary summarize(const std::string& dir) {
  HfFolderSummary s;
  HfConfigRead read = read_hf_config_located(dir);
  s.config = std::move(read.model);
  s.config_warnings = std::move(read.warnings);
  s.config_problems = std::move(read.unsupported);
  const ModelConfig& m = s.config;
  const OpenedWeights w = open_weights(dir);

  // The same size rules recipe validation applies to model.* keys, so that "compatible" here
  // means `model.from: DIR` validates too.
  const bool heads_split = heads_whole(m);
  if (!heads_split)
    s.config_problems.push_back(detail::concat(
        "hidden_size ", m.dim, " is not divisible by num_attention_heads ", m.n_heads));
  else if (head_dim_of(m) % 2 != 0)
    s.config_problems.push_back(
        detail::concat("head_dim = hidden_size / num_attention_heads = ", head_dim_of(m),
                       " is odd; RoPE rotates pairs of channels"));
  if (m.n_heads % m.n_kv_heads != 0)
    s.config_problems.push_back(detail::concat("num_attention_heads ", m.n_heads,
                                               " is not divisible by num_key_value_heads ",
                                               m.n_kv_heads));

  // More layers than the weights hold: a config.json of another model, or a hostile one (10^8
  // layers would build a layout of 10^9 entries before any check could list them).
  int top_layer = -1;
  for (const auto& [name, src] : w.tensors) top_layer = std::max(top_layer, layer_of(name));
  const bool layers_there = m.n_layers <= top_layer + 1;
  if (!layers_there)
    s.config_problems.push_back(
        top_layer < 0 ? detail::concat("num_hidden_layers is ", m.n_layers,
                                       ", but the weights hold no model.layers.* tensors")
                      : detail::concat("num_hidden_layers is ", m.n_layers,
                                       ", but the weights hold layers 0 to ", top_layer,
                                       " only (a config.json of another model?)"));

  // Where each expected name sits in the layout, for the display order promised in hf.h.
  std::map<std::string, std::pair<size_t, size_t>> position;  // name → (group, entry)
  std::string duplicate;  // a tied copy of the embedding: stored twice, one parameter
  // Without whole heads there is no layout (ParamLayout refuses it); config_problems says why.
  if (heads_split && layers_there) {
    const ParamLayout layout(m);
    s.check = check_against_layout(w.tensors, layout, m.arch);
    // The one data read of the summary: only for a tied folder that stores lm_head.weight, so
    // that "compatible" still means what load_hf_weights accepts.
    if (std::string diff = tied_head_difference(w, s.check); !diff.empty())
      s.check.bad_tensors.push_back(diff);
    else
      duplicate = s.check.tied_copy;
    for (size_t g = 0; g < layout.groups().size(); ++g)
      for (size_t e = 0; e < layout.groups()[g].entries.size(); ++e)
        position[layout.groups()[g].entries[e].name] = {g, e};
  }

  // File paths were built as dir + "/" + name by open_weights.
  auto relative = [&](const std::string& path) { return path.substr(dir.size() + 1); };
  for (const auto& f : w.files) {
    std::error_code ec;
    const uint64_t bytes = fs::file_size(f->path(), ec);
    if (ec) throw Error("cannot read the size of '" + f->path() + "': " + ec.message());
    s.files.push_back({relative(f->path()), bytes, 0});
  }
  std::map<std::string, size_t> tensors_in;  // file name → tensor count
  for (const auto& [name, src] : w.tensors) {
    HfTensorInfo t;
    t.name = name;
    t.dtype = src.entry->dtype;
    t.shape = src.entry->shape;
    t.file = relative(src.file->path());
    t.numel = 1;
    for (int64_t d : t.shape) t.numel *= uint64_t(d);  // the reader checked it fits in 64 bits
    t.bytes = src.entry->end - src.entry->begin;
    t.layer = layer_of(name);
    if (!is_rope_buffer(name) && name != duplicate) s.parameters += t.numel;
    s.tensor_bytes += t.bytes;
    ++s.dtypes[t.dtype];
    ++tensors_in[t.file];
    s.tensors.push_back(std::move(t));
  }

  for (auto& f : s.files) f.tensors = tensors_in[f.name];
  std::sort(s.files.begin(), s.files.end(),
            [](const HfFileInfo& a, const HfFileInfo& b) { return a.name < b.name; });

  // Display order: embeddings, then layer by layer, then the head and anything else; within a
  // part, layout order first and unknown names after them by name.
  auto key = [&](const HfTensorInfo& t) {
    auto it = position.find(t.name);
    const size_t entry = it == position.end() ? SIZE_MAX : it->second.second;
    int part;
    if (t.layer >= 0)
      part = 1;
    else if (it != position.end() && it->second.first == 0)
      part = 0;  // the embedding group
    else
      part = 2;
    return std::make_tuple(part, t.layer, entry, std::cref(t.name));
  };
  std::stable_sort(s.tensors.begin(), s.tensors.end(),
                   [&](const HfTensorInfo& a, const HfTensorInfo& b) { return key(a) < key(b); });
  return s;
}

}  // namespace

HfFolderSummary check_hf_folder(const std::string& dir) {
  HfFolderSummary s = summarize(dir);
  if (s.compatible()) return s;
  std::ostringstream msg;
  msg << "the Hugging Face folder '" << dir << "' is not usable by ft:";
  for (const std::string& p : s.config_problems) msg << "\n  config.json: " << p;
  if (!s.check.missing.empty())
    msg << "\n  missing " << s.check.missing.size()
        << " tensor(s): " << join_names(s.check.missing);
  if (!s.check.unexpected.empty())
    msg << "\n  unexpected " << s.check.unexpected.size()
        << " tensor(s): " << join_names(s.check.unexpected);
  if (!s.check.bad_tensors.empty()) msg << "\n  " << s.check.bad_tensors.front();
  for (const std::string& h : s.check.hints) msg << "\n  hint: " << h;
  msg << "\n  (ft inspect " << dir << " shows the folder)";
  throw UsageError(msg.str());
}

HfFolderSummary summarize_hf_folder(const std::string& dir) {
  try {
    return summarize(dir);
  } catch (const UsageError& e) {
    // See hf.h: what model.from refuses as bad input (exit code 2) is, to ft inspect, the verdict
    // on the folder under examination (exit code 1).
    throw Error(e.what());
  }
}

}  // namespace ft
