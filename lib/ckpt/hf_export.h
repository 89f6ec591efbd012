// Hugging Face export: a checkpoint's parameters → a folder `transformers` loads as the class of
// model.arch's row in model/arch.h (DESIGN.md §5, §8): config.json, model.safetensors or shards
// model-0000K-of-0000N.safetensors with model.safetensors.index.json, and the checkpoint's
// tokenizer.model with the files AutoTokenizer and generate need to treat it as ft does
// (tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json).
// A checkpoint of an adapter run (it holds the adapter alone) gives a PEFT adapter folder instead:
// adapter_config.json and adapter_model.safetensors, which PeftModel.from_pretrained applies to
// the base; or, with merge, the model folder above with each adapted weight W + s·B·A, the base
// read from the manifest's frozen.from (or drawn again from its seed).
// The folder is written under a temporary name beside the output and renamed into place at the
// end, so an interrupted export never leaves a half folder behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "core/dtype.h"
#include "model/config.h"

namespace ft {

// The tokenizer's special token ids as config.json and generation_config.json carry them; -1:
// the tokenizer has none (the key is left out).
struct HfTokenIds {
  int64_t bos = -1, eos = -1, pad = -1;
};

// Writes the config.json of model.arch's class to `path` that read_hf_config reads back to the
// same model (every field of ModelConfig but from and init_std). torch_dtype: F32, BF16 or F16.
// `ids`: bos_token_id, eos_token_id and pad_token_id where the tokenizer defines them.
void write_hf_config(const ModelConfig& m, DType torch_dtype, const std::string& path,
                     const HfTokenIds& ids = {});

// "float32", "bfloat16", "float16": torch_dtype in config.json.
std::string torch_dtype_name(DType t);

// Parses a shard size as transformers' save_pretrained(max_shard_size=...) does: a plain byte
// count, or a number with KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024),
// case-insensitive ("5GB", "500MB", "1.5GiB"), from 1 byte to kMaxExportShardBytes (1000TB; no
// exponents: "1e300" is not a size). Throws UsageError naming `what` and quoting an excerpt.
constexpr uint64_t kMaxExportShardBytes = 1'000'000'000'000'000;
uint64_t parse_byte_size(const std::string& text, const std::string& what);

struct HfExportOptions {
  DType dtype = DType::kF32;                 // F32, BF16 or F16 (round to nearest even)
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default, "5GB"
  bool overwrite = false;                    // replace an existing non-empty output folder
  // An adapter checkpoint: the model with the adapter merged into its weights, not the adapter.
  // Refused (UsageError) for a checkpoint without an adapter.
  bool merge = false;
  // A progress line on stderr while the tensors are written (core/progress.h).
  bool progress = true;
};

// The file names of a PEFT adapter folder, as PEFT's save_pretrained writes them.
constexpr const char* kPeftConfigFile = "adapter_config.json";
constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

struct HfExportResult {
  std::string dir;
  std::vector<HfFileInfo> files;  // safetensors files in write order (config and tokenizer aside)
  size_t tensors = 0;
  uint64_t parameters = 0;     // elements
  uint64_t tensor_bytes = 0;   // data bytes in the output dtype (the index's total_size)
  bool sharded = false;        // wrote model.safetensors.index.json
  bool tokenizer = false;      // copied the checkpoint's tokenizer file, named tokenizer_file
  std::string tokenizer_file;  // tokenizer.model or tokenizer.json
  // Wrote tokenizer.json, tokenizer_config.json and special_tokens_map.json (hf_tokenizer.h),
  // or, for a tokenizer.json tokenizer, tokenizer_config.json beside the copy; false with a
  // tokenizer means tokenizer_note says why not.
  bool hf_tokenizer = false;
  std::string tokenizer_note;
  HfTokenIds ids;  // in config.json and generation_config.json
  // An adapter checkpoint without merge: wrote a PEFT folder (kPeftConfigFile and
  // kPeftWeightsFile, `files`), no config.json or generation_config.json.
  bool adapter = false;
  size_t merged = 0;  // with merge: the weights W that took an adapter's s·B·A
  // What the folder's users should know, one line each (the command prints them on stderr): an
  // adapter whose base was a seeded initialisation (base_model_name_or_path null), an rsLoRA
  // adapter that llama.cpp scales differently.
  std::vector<std::string> warnings;
};

// The adapter's base as an adapter checkpoint's manifest records it (frozen.from, or the seeded
// initialisation): "Qwen2.5-0.5B" or "the seeded initialisation (run.seed 7, model.init_std
// 0.02)", for messages.
std::string adapter_base_description(const ckpt::Manifest& m);

// Checks, before anything is read, that an adapter checkpoint's base can be had as the run
// trained on it: frozen.from is a folder holding the same weights (hf_weights_fingerprint
// against frozen.from_fingerprint, when the manifest records one), or the seed is recorded.
// `use` names what needs the base, for messages ("--merge", "ft generate"). Throws UsageError
// (Error for a manifest without either).
void check_adapter_base(const ckpt::Manifest& m, const std::string& use);

// The model groups of an adapter checkpoint (whole tensors) as the run has them, one group at a
// time. A frozen group comes from its source: the manifest's frozen.from folder (opened and
// checked once, as model.from is: names, shapes and finiteness, HfWeightReader), or the seeded
// initialisation drawn again (init_random_group: the same bits); a trained one (modules_to_save)
// from the checkpoint. check_adapter_base first.
class AdapterBase {
 public:
  // full: the checkpoint's layout, ckpt::manifest_layout(m, 1), which must outlive it.
  AdapterBase(const ckpt::Manifest& m, const ParamLayout& full);
  ~AdapterBase();
  // Group g of `full` (a model group, not an adapter's).
  std::vector<float> group(int g);
  // Group g of the model's own layout `model` (ParamLayout(m.model, 1)), tensor by tensor from
  // full's groups: a converter may have split one (the final norm apart from a trained lm_head).
  std::vector<float> model_group(const ParamLayout& model, int g);

 private:
  const ckpt::Manifest& m_;
  const ParamLayout& full_;
  std::unique_ptr<HfWeightReader> reader_;  // frozen.from, opened on first use
};

// Checks that `dir` may be written (absent, an empty folder, or overwrite). Throws UsageError
// with a hint otherwise. export_hf_folder calls it too; the command calls it first so that a
// wrong --output is refused before any checkpoint is read.
void check_export_target(const std::string& dir, bool overwrite);

// Writes the Hugging Face folder `dir` from the parameters of checkpoint `m`, one parameter
// group in memory at a time (plus the safetensors file being assembled). Tensor names are
// ParamLayout's (so a tied model has no lm_head.weight). Errors reading the checkpoint
// (missing, short or corrupt shards) are ft::Error naming the file; nothing is left at `dir`.
// on_file(file, bytes) is called after each safetensors file is written.
// An adapter checkpoint gives a PEFT folder (DESIGN.md §8): adapter_model.safetensors holds the
// adapter's A (r, in) and B (out, r) under PEFT's names in o.dtype, one file whatever
// max_shard_bytes; adapter_config.json is LoraConfig's for those; the tokenizer files as above.
// With o.merge the model folder instead, each adapted W + s·B·A summed in fp32 (one sgemm) before
// the conversion to o.dtype; the base group by group from frozen.from (load_hf_weights) or drawn
// again from the seed (init_random_group), so the memory is a group's, as without an adapter.
HfExportResult export_hf_folder(const ckpt::Manifest& m, const std::string& dir,
                                const HfExportOptions& o,
                                void (*on_file)(const std::string&, uint64_t) = nullptr);

}  // namespace ft
