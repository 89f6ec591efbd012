// ft export CHECKPOINT --output DIR [--merge]: a checkpoint's parameters as a Hugging Face
// folder, or an adapter run's as a PEFT adapter folder or merged into its base (DESIGN.md §4,
// §8). The work is in lib/ckpt/hf_export.cpp; this resolves the checkpoint, checks the
// arguments and reports what was written.
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "apps/ft/checkpoint_source.h"
#include "apps/ft/commands.h"
#include "ckpt/checkpoint.h"
#include "ckpt/hf_export.h"
#include "core/error.h"
#include "train/metrics.h"

namespace ft::app {
namespace {

namespace fs = std::filesystem;

// A step folder (manifest.json), or a checkpoint dir (checkpoint_source.h).
std::string resolve_step_folder(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(path + ": no such file or folder");
  if (!fs::is_directory(path, ec))
    throw UsageError(path + ": not a folder; give a checkpoint step folder or checkpoint.dir");
  std::string note;
  const std::string step = resolve_checkpoint(path, "export", &note);
  if (!note.empty()) std::printf("ft export: %s\n", note.c_str());
  return step;
}

// main.cpp limits --dtype to these three.
DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  if (s == "f32") return DType::kF32;
  throw UsageError("--dtype '" + s + "': expected f32, bf16 or f16");
}

// "lora r 4, alpha 8 (scale 2) on q_proj, v_proj" (", and lm_head trained whole"), as ft train's
// header names the adapter.
std::string adapter_words(const AdapterConfig& a) {
  std::ostringstream w;
  w << a.type << " r " << a.r << ", alpha " << a.alpha << " (scale " << a.scaling()
    << (a.use_rslora ? ", rsLoRA" : "") << ") on ";
  const std::vector<std::string> targets = a.targets();
  for (size_t i = 0; i < targets.size(); ++i) w << (i ? ", " : "") << targets[i];
  for (size_t i = 0; i < a.modules_to_save.size(); ++i)
    w << (i ? ", " : ", and ") << a.modules_to_save[i];
  if (!a.modules_to_save.empty()) w << " trained whole";
  return w.str();
}

void report_file(const std::string& name, uint64_t bytes) {
  std::printf("  wrote %s (%s)\n", name.c_str(), Progress::human_bytes(double(bytes)).c_str());
  std::fflush(stdout);
}

}  // namespace

int cmd_export(const ExportArgs& a) {
  HfExportOptions o;
  o.dtype = parse_dtype(a.dtype);
  o.max_shard_bytes = parse_byte_size(a.max_shard_size, "--max-shard-size");
  o.overwrite = a.overwrite;
  o.merge = a.merge;
  // Refuse a wrong --output before reading a possibly large checkpoint.
  check_export_target(a.output, a.overwrite);
  const std::string step_dir = resolve_step_folder(a.checkpoint);
  // Export only what a resumed run could start from: COMPLETE is required.
  const ckpt::Manifest m = ckpt::read_manifest(step_dir);
  std::string what;
  if (m.adapter.enabled() && a.merge)
    what = ": the adapter (" + adapter_words(m.adapter) + ") merged into its base, " +
           adapter_base_description(m);
  else if (m.adapter.enabled())
    what = ": the adapter as a PEFT folder (" + adapter_words(m.adapter) + ")";
  std::printf("ft export: checkpoint %s (step %lld) → %s, %s%s\n", step_dir.c_str(),
              (long long)m.step, a.output.c_str(), dtype_name(o.dtype).c_str(), what.c_str());
  std::fflush(stdout);
  const HfExportResult r = export_hf_folder(m, a.output, o, report_file);
  uint64_t file_bytes = 0;
  for (const HfFileInfo& f : r.files) file_bytes += f.bytes;
  if (r.adapter) {
    std::printf("  wrote %s (base_model_name_or_path %s)\n", kPeftConfigFile,
                m.frozen_from.empty() ? "null" : m.frozen_from.c_str());
  } else {
    std::printf("  wrote config.json (torch_dtype %s", torch_dtype_name(o.dtype).c_str());
    if (r.ids.bos >= 0) std::printf(", bos_token_id %lld", (long long)r.ids.bos);
    if (r.ids.eos >= 0) std::printf(", eos_token_id %lld", (long long)r.ids.eos);
    if (r.ids.pad >= 0) std::printf(", pad_token_id %lld", (long long)r.ids.pad);
    std::printf(")\n");
    if (r.ids.bos >= 0 || r.ids.eos >= 0) std::printf("  wrote generation_config.json\n");
  }
  if (r.sharded) std::printf("  wrote model.safetensors.index.json\n");
  if (r.tokenizer) std::printf("  copied %s\n", r.tokenizer_file.c_str());
  if (r.hf_tokenizer && r.tokenizer_file == "tokenizer.json")
    std::printf("  wrote tokenizer_config.json\n");
  else if (r.hf_tokenizer)
    std::printf("  wrote tokenizer.json, tokenizer_config.json, special_tokens_map.json\n");
  std::printf(
      "ft export: done: %zu %stensors, %llu parameters, %s of %s tensor data in %zu "
      "safetensors file%s (%s on disk)%s in %s\n",
      r.tensors, r.adapter ? "adapter " : "", (unsigned long long)r.parameters,
      Progress::human_bytes(double(r.tensor_bytes)).c_str(), dtype_name(o.dtype).c_str(),
      r.files.size(), r.files.size() == 1 ? "" : "s",
      Progress::human_bytes(double(file_bytes)).c_str(),
      a.merge ? (", the adapter merged into " + std::to_string(r.merged) + " weights").c_str() : "",
      r.dir.c_str());
  // An adapter folder needs no tokenizer (PEFT applies it to the base, which has one).
  if (!r.tokenizer && !r.adapter)
    std::printf(
        "  note: the checkpoint has no tokenizer (the recipe named no tokenizer.path); copy "
        "the model's tokenizer files (tokenizer.json and tokenizer_config.json, or "
        "tokenizer.model) into the folder yourself\n");
  // On stderr as well as in the summary: a folder AutoTokenizer cannot read as ft does must not
  // pass unnoticed in a script that keeps only the exit code and the errors.
  if (!r.tokenizer_note.empty())
    std::fprintf(stderr, "ft export: warning: %s\n", r.tokenizer_note.c_str());
  for (const std::string& w : r.warnings)
    std::fprintf(stderr, "ft export: warning: %s\n", w.c_str());
  return 0;
}

}  // namespace ft::app
