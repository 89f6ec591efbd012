// Hugging Face folders: config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json. This is the one place HF names meet ft's layout (via
// ParamLayout, whose entries carry the HF names).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/layout.h"

namespace ft {

// Reads config.json of a LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or
// MistralForCausalLM folder into a ModelConfig (arch from architectures and model_type,
// dim=hidden_size, n_layers=num_hidden_layers, n_heads=num_attention_heads,
// n_kv_heads=num_key_value_heads (default n_heads), head_dim (0 when hidden_size / heads),
// ffn_dim=intermediate_size, vocab_size, max_seq_len=max_position_embeddings,
// norm_eps=rms_norm_eps, tie_embeddings=tie_word_embeddings (default false)). RoPE comes from
// transformers 5's rope_parameters {rope_type, rope_theta, factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings} or 4's top-level rope_theta (default
// 10000) and rope_scaling {rope_type or type, ...}; a file with both must agree, and a rope type
// other than default, linear and llama3 is refused by name. Throws ft::UsageError naming the
// file and listing every problem on a missing, malformed or unsupported config.
ModelConfig read_hf_config(const std::string& dir);

// Recipe key path ("model.rope_theta") → the config.json key it was read from
// ("rope_parameters.rope_theta"); an empty string when the file has no such key and
// transformers' default applies. Only for keys whose place in the file varies (the RoPE ones)
// or whose absence means a default (head_dim).
using HfConfigOrigins = std::map<std::string, std::string>;

struct HfConfigRead {
  ModelConfig model;
  HfConfigOrigins origins;
  // Fields ft accepts but does not honour exactly, one line each (attention_dropout > 0: ft
  // trains without dropout). Shown by ft validate, ft train and ft inspect.
  std::vector<std::string> warnings;
  // Well-formed values ft does not implement (a rope type such as yarn), one line each, without
  // the file name. read_hf_config throws on them; ft inspect lists them as config problems.
  std::vector<std::string> unsupported;
};

// read_hf_config with where each RoPE value came from, the warnings and the unsupported
// features (not thrown); throws only on a missing or malformed file.
HfConfigRead read_hf_config_located(const std::string& dir);

// Loads every parameter of `layout` from the folder's safetensors into the flat f32 group
// buffers (group_ptrs[g] points at group g's buffer; null: a group this rank does not hold,
// another pipeline stage's, which is not read). A layout for T tensor ranks (layout.tensor())
// gets tensor rank `tensor_rank`'s slice of each tensor, read from the file without the whole
// tensor: a rank reads what it keeps. Checks (of the whole tensors) that every expected name is
// present with the right shape, that dtypes are F32/BF16/F16, and reports unexpected tensors
// (rotary inv_freq buffers are ignored; so is a tied model's lm_head.weight when it equals the
// embedding after conversion to f32, and one that differs is refused with the largest
// difference). Errors name the file and the tensor.
void load_hf_weights(const std::string& dir, const ParamLayout& layout,
                     const std::vector<float*>& group_ptrs, int tensor_rank = 0);

// load_hf_weights in two steps, for a caller that reads one group at a time (the rank setup,
// which holds one group on the host, not its whole stage; ft export --merge): the folder is
// opened and checked once, as load_hf_weights checks it, then read group by group. `layout`
// must outlive the reader.
class HfWeightReader {
 public:
  HfWeightReader(const std::string& dir, const ParamLayout& layout);
  ~HfWeightReader();
  // As load_hf_weights: the groups whose pointers are set, this tensor rank's slices.
  void read(const std::vector<float*>& group_ptrs, int tensor_rank = 0) const;
  // Group g into dst (the group's numel), this tensor rank's slices.
  void read_group(int g, float* dst, int tensor_rank = 0) const;

 private:
  struct Opened;
  const ParamLayout& layout_;
  std::unique_ptr<Opened> opened_;
};

// A fingerprint of a Hugging Face folder's model: the SHA-256 (hex) of its config.json and, for
// each weight file (by name), its name, size, first MiB (the header and the first tensors) and
// 64 KiB at 18 points through it to its end. It reads a few MiB, not the whole model (which every
// start of an adapter run would otherwise read twice): another model, or another fine-tune of the
// same one, differs in it; the same files copied elsewhere do not. Errors name the file.
std::string hf_weights_fingerprint(const std::string& dir);

// Loads the adapter groups of `layout` (ParamGroup::attached_to) from a PEFT adapter folder's
// adapter_model.safetensors, by PEFT's names (adapt/lora.h), and the model's trained groups
// (modules_to_save: adapt/peft.h peft_saved_name), this tensor rank's slices, into the groups
// whose group_ptrs are set (others: not read). Every such tensor must be there with its shape
// and no other tensor (but lm_head's name beside a tied table's): errors name the file and list
// the names.
void load_peft_adapter(const std::string& dir, const ParamLayout& layout,
                       const std::vector<float*>& group_ptrs, int tensor_rank = 0);

// Rows `rows` of the 2-D tensor `name` of the Hugging Face folder `dir` (model.safetensors or its
// shards), in fp32, one after another: rows.size() × the tensor's columns, which *cols gets.
// Reads those rows only (a few of a large embedding). Throws UsageError naming the folder when
// it has no such 2-D tensor, ft::Error for a malformed file; a row out of range is a bug.
std::vector<float> read_hf_rows(const std::string& dir, const std::string& name,
                                const std::vector<int64_t>& rows, int64_t* cols);

// How a folder's tensors compare with the ParamLayout of its config; load_hf_weights refuses a
// folder unless compatible(), and ft inspect prints the lists.
struct HfLayoutCheck {
  std::vector<std::string> missing;     // layout names the folder lacks, in layout order
  std::vector<std::string> unexpected;  // folder names the layout lacks, in name order
  std::vector<std::string> ignored;     // rotary_emb.inv_freq buffers: ft recomputes them
  // "lm_head.weight" when a tied layout's folder stores one of the embedding's shape: loaded
  // only if it equals the embedding bit for bit (else reported in bad_tensors), then ignored.
  std::string tied_copy;
  std::vector<std::string> bad_tensors;  // one message per wrong shape or dtype, layout order
  std::vector<std::string> hints;        // likely causes of the missing/unexpected names
  bool compatible() const { return missing.empty() && unexpected.empty() && bad_tensors.empty(); }
};

struct HfFileInfo {
  std::string name;  // relative to the folder
  uint64_t bytes = 0;
  size_t tensors = 0;
};

struct HfTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string file;  // relative to the folder
  uint64_t numel = 0;
  uint64_t bytes = 0;
  int layer = -1;  // N for model.layers.N.*, else -1
};

struct HfFolderSummary {
  ModelConfig config;
  std::vector<std::string> config_warnings;  // HfConfigRead::warnings
  std::vector<HfFileInfo> files;             // in name order
  // Layout order (embeddings, layer 0, layer 1, ..., head); a tensor the layout lacks sits after
  // its layer's expected ones (or after the head when it belongs to no layer), in name order.
  std::vector<HfTensorInfo> tensors;
  uint64_t parameters = 0;         // elements of every tensor except the ignored RoPE buffers
  uint64_t tensor_bytes = 0;       // data bytes of every tensor
  std::map<DType, size_t> dtypes;  // dtype → number of tensors stored in it
  // Sizes that read_hf_config accepts but ft's model cannot run (head_dim not a whole even
  // number, query heads not a multiple of KV heads); recipe validation refuses them too.
  std::vector<std::string> config_problems;
  HfLayoutCheck check;  // empty when hidden_size does not split into heads: there is no layout
  bool compatible() const { return config_problems.empty() && check.compatible(); }
};

// Reads a folder's config.json and the headers of its safetensors (no tensor data) and compares
// the tensors with the layout of that config. A mismatch is reported in `check`, not thrown. An
// unreadable or malformed config.json, index or safetensors file throws ft::Error (exit code 1:
// here the folder is the input under examination, not the user's configuration) naming the file.
HfFolderSummary summarize_hf_folder(const std::string& dir);

// summarize_hf_folder for a folder about to be loaded (ft generate), before anything of the
// config's size is allocated: throws UsageError (exit code 2) for a malformed file or, listing
// every problem, when the folder is not compatible().
HfFolderSummary check_hf_folder(const std::string& dir);

}  // namespace ft
