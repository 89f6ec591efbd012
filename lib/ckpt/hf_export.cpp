// Hugging Face export (hf_export.h).
//
// Steps of export_hf_folder:
//   0. check that every shard file has the size the manifest records; merging, that the base
//      folder is there (or the seed recorded);
//   1. plan: the tensors written, in layout order: the model's (ParamLayout(model, 1)), or for a
//      PEFT folder the adapter's groups of manifest_layout(m, 1) and the model's groups it
//      trained whole (modules_to_save, under PEFT's names); each with its bytes in the
//      output dtype, assigned to shards as save_pretrained does (a new shard when the next tensor
//      would take the current one over max_shard_bytes; a tensor larger than that gets its own
//      shard); a PEFT folder has one file, as PEFT writes it;
//   2. write into DIR.tmp-<pid>: each parameter group read whole (ckpt::read_global_group, which
//      checks every piece's CRC-32; merging, a model group from the base's frozen groups and the
//      checkpoint's trained ones (AdapterBase), and its block's adapter adds s·B·A to each
//      adapted weight), converted, appended to the shard being
//      assembled; a shard is written (write_safetensors: temp name, fsync, rename) as soon as its
//      last tensor is in;
//   3. tokenizer.model when the checkpoint has one (its sha256 checked against the manifest)
//      with tokenizer.json, tokenizer_config.json, special_tokens_map.json (hf_tokenizer.h);
//      or its tokenizer.json, copied, with a tokenizer_config.json (and the model folder's chat
//      template and eos_token, which the checkpoint keeps beside it);
//      config.json and generation_config.json with the tokenizer's special ids, or for a PEFT
//      folder adapter_config.json; model.safetensors.index.json when sharded;
//   4. rename DIR.tmp-<pid> to DIR (after moving an old DIR aside with --overwrite).
#include "ckpt/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "adapt/peft.h"
#include "ckpt/hf_tokenizer.h"
#include "ckpt/io.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/chat.h"
#include "data/sha256.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "model/layout.h"
#include "model/llama.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// Writes a small text file and fsyncs it, so that the final rename publishes durable contents.
void write_text_file(const fs::path& path, const std::string& text) {
  const std::string p = path.string();
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(p + ": cannot create: " + std::strerror(errno));
  try {
    ckpt::write_all(fd, text.data(), text.size(), p);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw Error(p + ": cannot flush to disk: " + std::strerror(errno));
}

// A file of the checkpoint, checked before it is copied or read (a FIFO in its place would block
// the copy, /dev/zero never end it) or read whole, bounded. A checkpoint file that fails is a
// damaged checkpoint (Error, exit code 1, DESIGN.md §8), not a usage error.
void check_checkpoint_file(const fs::path& path, uint64_t max_bytes, const std::string& what) {
  try {
    check_regular_file(path.string(), max_bytes, what);
  } catch (const UsageError& e) {
    throw Error(std::string(e.what()) + "; the checkpoint is damaged: export an older step folder");
  }
}

std::string read_checkpoint_file(const fs::path& path, uint64_t max_bytes,
                                 const std::string& what) {
  try {
    return read_bounded_file(path.string(), max_bytes, what);
  } catch (const UsageError& e) {
    throw Error(std::string(e.what()) + "; the checkpoint is damaged: export an older step folder");
  }
}

// Best effort: the export is complete once renamed, so a folder that cannot be opened or synced
// does not fail it (fsync_path throws for those; file systems that refuse a folder's fsync it
// lets through itself).
void fsync_dir(const fs::path& dir) {
  try {
    ckpt::fsync_path(dir.string(), /*directory=*/true);
  } catch (const Error&) {
  }
}

// The output folder without a trailing separator, so that "out/" and "out" name one folder and
// the temporary sibling is "out.tmp-<pid>", not "out/.tmp-<pid>".
fs::path clean_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// Raw bytes of n floats in `dtype` (F32 copied; BF16 and F16 rounded to nearest even).
std::vector<char> convert(const float* src, size_t n, DType dtype) {
  std::vector<char> out(n * dtype_size(dtype));
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out.data(), src, n * 4);
      break;
    case DType::kBF16: {
      auto* dst = reinterpret_cast<uint16_t*>(out.data());
      for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
      break;
    }
    case DType::kF16: {
      auto* dst = reinterpret_cast<uint16_t*>(out.data());
      for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
      break;
    }
    default:
      FT_FAIL("export: unsupported output dtype ", dtype_name(dtype));
  }
  return out;
}

std::string shard_file_name(int k, int n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, n);
  return buf;
}

struct PlannedTensor {
  int group = 0;
  const ParamEntry* entry = nullptr;
  std::string name;  // in the file: the entry's, or PEFT's for a module trained whole
  uint64_t bytes = 0;
  int shard = 0;
};

bool is_checkpoint_folder(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p / "manifest.json", ec) || fs::exists(p / "latest", ec);
}

// The special token ids of a model folder's generation_config.json kept in a checkpoint (an
// object; {} without the file or with one ft cannot read, which then says so on stderr: the
// ids are a courtesy to transformers, not worth failing an export for).
nlohmann::json read_generation_ids(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(
        read_bounded_file(path.string(), kMaxConfigBytes, "the checkpoint's generation config"));
    if (j.is_object()) return j;
    std::fprintf(stderr, "ft export: warning: %s: not a JSON object; its token ids are ignored\n",
                 path.c_str());
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "ft export: warning: %s: not valid JSON (%s); its token ids are ignored\n",
                 path.c_str(), json_error_words(e).c_str());
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ft export: warning: %s; its token ids are ignored\n", e.what());
  }
  return nlohmann::json::object();
}

// Beside a copied tokenizer.json (in `tmp`): tokenizer_config.json naming PreTrainedTokenizerFast
// (which runs tokenizer.json as it is, post-processor included, so AutoTokenizer gives ft
// tokenize's ids) and the BOS/EOS the file's template defines, and those ids for config.json.
void write_bpe_tokenizer_config(const fs::path& file, const fs::path& tmp, int64_t max_seq_len,
                                HfExportResult* res) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_bpe_tokenizer(file.string());
  } catch (const Error& e) {
    res->tokenizer_note =
        std::string("copied the checkpoint's tokenizer.json, which ft cannot read (") + e.what() +
        "); wrote no tokenizer_config.json and no special token ids";
    return;
  }
  nlohmann::ordered_json j;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  auto token = [&](int32_t id) {
    return id >= 0 ? nlohmann::ordered_json(tok->decode({id})) : nlohmann::ordered_json(nullptr);
  };
  // The model folder's tokenizer_config.json and chat_template.jinja, which the checkpoint keeps
  // beside its tokenizer.json (checkpoint.h): its chat template, and its eos_token where the
  // tokenizer.json has no EOS of its own (Qwen2's <|im_end|>, the end of an assistant's turn) and
  // the token is one special token, as ft tokenize ends text documents with it.
  const fs::path dir = file.parent_path();
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir / "tokenizer_config.json", ec)))
    check_checkpoint_file(dir / "tokenizer_config.json", kMaxConfigBytes,
                          "the checkpoint's tokenizer config");
  const jinja::Json special = load_special_tokens(file.string());
  // A special token of tokenizer_config.json that is one special token of the tokenizer: its id.
  auto special_id = [&](const char* key) -> int32_t {
    if (!special.contains(key)) return -1;
    const std::vector<int32_t> ids = tok->encode(special[key].get<std::string>());
    return ids.size() == 1 && tok->is_special(ids[0]) ? ids[0] : -1;
  };
  int32_t eos = tok->eos_id();
  if (eos < 0) eos = special_id("eos_token");
  // The model folder's generation_config.json, which the checkpoint keeps beside its tokenizer
  // too (checkpoint.h): its bos_token_id and pad_token_id where the tokenizer files name none,
  // so that config.json says what the original's did (Qwen2's bos_token_id is <|endoftext|>
  // although its tokenizer adds no BOS; its pad token is in tokenizer_config.json).
  const nlohmann::json generation = read_generation_ids(dir / "generation_config.json");
  auto generation_id = [&](const char* key) -> int32_t {
    if (!generation.contains(key) || !generation[key].is_number_integer()) return -1;
    const int64_t id = generation[key].get<int64_t>();
    return id >= 0 && id < tok->vocab_size() ? int32_t(id) : -1;
  };
  int32_t bos = tok->bos_id();
  if (bos < 0) bos = generation_id("bos_token_id");
  int32_t pad = special_id("pad_token");
  if (pad < 0) pad = generation_id("pad_token_id");
  nlohmann::ordered_json chat_template;  // null: none to write
  const fs::path jinja_file = dir / "chat_template.jinja";
  if (fs::exists(fs::symlink_status(jinja_file, ec))) {
    check_checkpoint_file(jinja_file, kMaxTemplateBytes, "the checkpoint's chat template");
    fs::copy_file(jinja_file, tmp / "chat_template.jinja", fs::copy_options::overwrite_existing,
                  ec);
    if (ec) throw Error(jinja_file.string() + ": cannot copy to the output: " + ec.message());
  } else if (fs::exists(fs::symlink_status(dir / "tokenizer_config.json", ec))) {
    // load_special_tokens above has parsed it.
    const nlohmann::ordered_json config = nlohmann::ordered_json::parse(
        read_checkpoint_file(dir / "tokenizer_config.json", kMaxConfigBytes,
                             "the checkpoint's tokenizer config"),
        nullptr, /*allow_exceptions=*/false);
    if (config.is_object() && config.contains("chat_template"))
      chat_template = config["chat_template"];
  }
  // bos_token stays the tokenizer's own (null when its template adds none, as the original's
  // tokenizer_config.json says for Qwen2): PreTrainedTokenizerFast would otherwise add it.
  j["bos_token"] = token(tok->bos_id());
  j["eos_token"] = token(eos);
  if (pad >= 0) j["pad_token"] = token(pad);
  // What the template does (and ft tokenize with it); stated so that a reader that rebuilds
  // the post-processor from these flags rebuilds the same one.
  j["add_bos_token"] = tok->bos_id() >= 0;
  j["add_eos_token"] = tok->eos_id() >= 0;
  j["clean_up_tokenization_spaces"] = false;
  j["model_max_length"] = max_seq_len;
  j["model_input_names"] = {"input_ids", "attention_mask"};
  if (!chat_template.is_null()) j["chat_template"] = chat_template;
  write_text_file(tmp / "tokenizer_config.json", j.dump(2) + "\n");
  res->ids = {bos, eos, pad};
  res->hf_tokenizer = true;
}

// Beside the copied tokenizer.model (in `tmp`): the Hugging Face tokenizer files, and the special
// ids for config.json. A file SentencePiece cannot load, or a model whose tokenization the
// export cannot reproduce, gets no tokenizer files and a note instead (the weights are still
// worth exporting; the report says what is missing).
// `model`: the checkpoint's tokenizer copy (errors name it, not the temporary output folder).
void write_tokenizer_files(const fs::path& model, const fs::path& tmp, int64_t max_seq_len,
                           HfExportResult* res) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_sentencepiece_tokenizer(model.string());
  } catch (const Error& e) {
    res->tokenizer_note = std::string("the checkpoint's tokenizer is not a SentencePiece model (") +
                          e.what() + "); wrote no tokenizer files and no special token ids";
    return;
  }
  const std::string bytes =
      read_checkpoint_file(model, kMaxTokenizerBytes, "the checkpoint's tokenizer");
  const SpModelInfo sp = parse_sp_model(bytes, model.string());
  // ft tokenize frames documents with the library's ids (tokenize.cpp); the ids written here
  // come from the same file by another reader, so they must agree.
  if (sp.bos_id != tok->bos_id() || sp.eos_id != tok->eos_id() ||
      int64_t(sp.pieces.size()) != tok->vocab_size())
    throw Error(model.string() + ": read as bos " + std::to_string(sp.bos_id) + ", eos " +
                std::to_string(sp.eos_id) + ", " + std::to_string(sp.pieces.size()) +
                " pieces, but SentencePiece says bos " + std::to_string(tok->bos_id()) + ", eos " +
                std::to_string(tok->eos_id()) + ", " + std::to_string(tok->vocab_size()) +
                " pieces; please report this model file");
  res->ids = {sp.bos_id, sp.eos_id, sp.pad_id};
  const std::string unsupported = unsupported_sp_settings(sp);
  if (!unsupported.empty()) {
    res->tokenizer_note =
        "the tokenizer uses SentencePiece settings the export cannot reproduce "
        "for transformers (" +
        unsupported +
        "); wrote no tokenizer.json or tokenizer_config.json: load it with "
        "sentencepiece, not AutoTokenizer";
    return;
  }
  write_text_file(tmp / "tokenizer.json", hf_tokenizer_json(sp));
  write_text_file(tmp / "tokenizer_config.json", hf_tokenizer_config_json(sp, max_seq_len));
  write_text_file(tmp / "special_tokens_map.json", hf_special_tokens_map_json(sp));
  res->hf_tokenizer = true;
}

// adapter_config.json of a PEFT folder: the LoraConfig of the checkpoint's adapter. Beside its
// own values, the keys a loader checks for what ft has not built are stated at PEFT's defaults
// (no bias, no DoRA, no per-layer patterns); the keys left out take PEFT's defaults when it loads
// the file (PEFT 0.13 knows every key written here, and refuses keys it does not know; so
// ensure_weight_tying, which it lacks, is written only where it is needed: modules trained whole
// on tied embeddings, which then take a PEFT that has the key, as 0.21 has). nlohmann::json sorts
// the keys, as PEFT's save_pretrained does.
void write_adapter_config(const ckpt::Manifest& m, const fs::path& path) {
  const AdapterConfig& a = m.adapter;
  json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  // The base as the run named it (model.from); null for a seeded initialisation, which no
  // loader can find (export_hf_folder warns).
  j["base_model_name_or_path"] = m.frozen_from.empty() ? json(nullptr) : json(m.frozen_from);
  j["revision"] = nullptr;
  j["r"] = a.r;
  // An integral alpha as an integer, as PEFT users write it (8, not 8.0).
  if (a.alpha == std::floor(a.alpha) && std::fabs(a.alpha) < 1e15)
    j["lora_alpha"] = int64_t(a.alpha);
  else
    j["lora_alpha"] = a.alpha;
  j["lora_dropout"] = a.dropout;
  j["use_rslora"] = a.use_rslora;
  j["target_modules"] = a.targets();
  // How A was initialised: PEFT's name for ft's adapter.init (true: Kaiming-uniform).
  j["init_lora_weights"] = a.init == "gaussian" ? json("gaussian") : json(true);
  j["bias"] = "none";
  j["use_dora"] = false;
  j["fan_in_fan_out"] = false;
  // Modules trained whole: the recipe's list; with tied embeddings the shared table, which PEFT
  // trains as both names only with ensure_weight_tying (else it unties a copy).
  const bool tied = m.model.tie_embeddings && !a.modules_to_save.empty();
  if (a.modules_to_save.empty())
    j["modules_to_save"] = nullptr;
  else if (tied)
    j["modules_to_save"] = {"embed_tokens", "lm_head"};
  else
    j["modules_to_save"] = a.modules_to_save;
  if (tied) j["ensure_weight_tying"] = true;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = json::object();
  j["alpha_pattern"] = json::object();
  j["inference_mode"] = true;
  write_text_file(path, j.dump(2) + "\n");
}

// Merging: adds s·B·A to each weight W (out, in) of model group g (`w`, whole tensors) that the
// adapter group attached to it adapts (PEFT's merge: W + s·(B·A), here one fp32 sgemm whose
// beta is 1). Returns how many weights took a term.
size_t add_adapter_terms(const ckpt::Manifest& m, const ParamLayout& model, const ParamLayout& full,
                         int g, std::vector<float>& w) {
  const int ag = full.attached_group(g);
  if (ag < 0) return 0;
  const std::vector<float> ad = ckpt::read_global_group(m, ckpt::State::kParam, ag);
  const float s = float(m.adapter.scaling());
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight";
  const std::vector<ParamEntry>& entries = full.groups()[size_t(ag)].entries;
  size_t merged = 0;
  // The group holds A then B of each adapted projection (adapt/lora.h).
  for (size_t i = 0; i + 1 < entries.size(); i += 2) {
    const ParamEntry& A = entries[i];
    const ParamEntry& B = entries[i + 1];
    FT_CHECK(A.name.size() > prefix.size() + a_suffix.size() &&
                 A.name.compare(0, prefix.size(), prefix) == 0 &&
                 A.name.compare(A.name.size() - a_suffix.size(), a_suffix.size(), a_suffix) == 0,
             "merge: unexpected adapter tensor ", A.name);
    const std::string module =
        A.name.substr(prefix.size(), A.name.size() - prefix.size() - a_suffix.size());
    FT_CHECK(B.name == prefix + module + ".lora_B.weight", "merge: ", B.name, " after ", A.name);
    int wg = -1;
    const ParamEntry* W = nullptr;
    FT_CHECK(model.find(module + ".weight", &wg, &W) && wg == g, "merge: ", module,
             ".weight is not in group ", g);
    const int64_t out = W->global_shape[0], in = W->global_shape[1], r = A.global_shape[0];
    FT_CHECK(A.global_shape == std::vector<int64_t>({r, in}) &&
                 B.global_shape == std::vector<int64_t>({out, r}),
             "merge: the shapes of ", A.name, " and ", B.name, " do not fit ", W->name);
    // W (out, in) += s · B (out, r) · A (r, in)
    kernels::gemm_f32(false, false, int(out), int(in), int(r), s, ad.data() + B.offset, int(r),
                      ad.data() + A.offset, int(in), 1.0f, w.data() + W->offset, int(in));
    ++merged;
  }
  return merged;
}

// generate's defaults: it stops at eos_token_id and pads finished rows with pad_token_id (eos
// when the tokenizer has no pad).
void write_generation_config(const fs::path& path, const HfTokenIds& ids) {
  ordered_json j = ordered_json::object();
  if (ids.bos >= 0) j["bos_token_id"] = ids.bos;
  if (ids.eos >= 0) j["eos_token_id"] = ids.eos;
  if (ids.pad >= 0) j["pad_token_id"] = ids.pad;
  write_text_file(path, j.dump(2) + "\n");
}

}  // namespace

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      FT_FAIL("no torch_dtype for ", dtype_name(t));
  }
}

std::string adapter_base_description(const ckpt::Manifest& m) {
  if (!m.frozen_from.empty()) return m.frozen_from;
  return detail::concat("the seeded initialisation (run.seed ", m.frozen_seed, ", model.init_std ",
                        m.frozen_init_std, ")");
}

void write_hf_config(const ModelConfig& m, DType torch_dtype, const std::string& path,
                     const HfTokenIds& ids) {
  // The keys LlamaConfig (Qwen2Config, Qwen3Config, MistralConfig) reads, in the order
  // save_pretrained writes the common ones. head_dim is written explicitly because transformers
  // ≥ 4.45 reads it (and Qwen3Config's default is 128).
  const ArchSpec& arch = arch_of(m);
  ordered_json j;
  j["architectures"] = {arch.hf_class};
  j["model_type"] = arch.name;
  j["hidden_size"] = m.dim;
  j["intermediate_size"] = m.ffn_dim;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_kv_heads;
  j["head_dim"] = head_dim_of(m);
  j["vocab_size"] = m.vocab_size;
  j["max_position_embeddings"] = m.max_seq_len;
  // RoPE in both formats, saying the same: transformers 4 reads rope_theta and rope_scaling, 5
  // reads rope_parameters (and read_hf_config refuses a file where they differ).
  j["rope_theta"] = m.rope_theta;
  ordered_json rope = {{"rope_type", m.rope_type}};
  if (m.rope_type != "default") rope["factor"] = m.rope_factor;
  if (m.rope_type == "llama3") {
    rope["low_freq_factor"] = m.rope_low_freq_factor;
    rope["high_freq_factor"] = m.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = m.rope_original_max_seq_len;
  }
  j["rope_scaling"] = m.rope_type == "default" ? ordered_json(nullptr) : rope;
  rope["rope_theta"] = m.rope_theta;
  j["rope_parameters"] = rope;
  j["rms_norm_eps"] = m.norm_eps;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["hidden_act"] = "silu";
  if (arch.attention_bias_key) j["attention_bias"] = false;
  if (arch.mlp_bias_key) j["mlp_bias"] = false;
  // No sliding window: Mistral's null turns it off (absent would mean 4096); Qwen's switch.
  if (arch.sliding_window == SlidingWindowKeys::kWindow) j["sliding_window"] = nullptr;
  if (arch.sliding_window == SlidingWindowKeys::kSwitch) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = torch_dtype_name(torch_dtype);
  j["use_cache"] = true;
  // Without eos_token_id, generate never stops at the end of a document.
  if (ids.bos >= 0) j["bos_token_id"] = ids.bos;
  if (ids.eos >= 0) j["eos_token_id"] = ids.eos;
  if (ids.pad >= 0) j["pad_token_id"] = ids.pad;
  write_text_file(path, j.dump(2) + "\n");
}

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  const std::string form =
      "give a byte count, or a number with KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB "
      "(powers of 1024), from 1 byte to 1000TB, e.g. 5GB";
  size_t i = 0;
  while (i < text.size() && (std::isdigit((unsigned char)text[i]) || text[i] == '.')) ++i;
  double value = 0;
  bool number = i > 0;
  if (number) {
    try {
      size_t used = 0;
      value = std::stod(text.substr(0, i), &used);
      number = used == i;
    } catch (const std::logic_error&) {
      number = false;
    }
  }
  if (!number) throw UsageError(what + " " + excerpt(text, 30) + ": not a size; " + form);
  std::string unit;
  for (size_t k = i; k < text.size(); ++k) unit += char(std::toupper((unsigned char)text[k]));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"B", 1},
                                                       {"KB", 1e3},
                                                       {"MB", 1e6},
                                                       {"GB", 1e9},
                                                       {"TB", 1e12},
                                                       {"KIB", 1024.0},
                                                       {"MIB", 1048576.0},
                                                       {"GIB", 1073741824.0},
                                                       {"TIB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end())
    throw UsageError(what + " " + excerpt(text, 30) + ": unknown unit " +
                     excerpt(text.substr(i), 12) + "; " + form);
  const double bytes = std::floor(value * it->second);
  if (!(bytes >= 1) || bytes > double(kMaxExportShardBytes))
    throw UsageError(what + " " + excerpt(text, 30) + ": " +
                     (bytes >= 1 ? "more than 1000TB" : "less than 1 byte") + "; " + form);
  return uint64_t(bytes);
}

void check_export_target(const std::string& dir, bool overwrite) {
  if (dir.empty()) throw UsageError("--output is empty; give the Hugging Face folder to write");
  const fs::path p = clean_dir(dir);
  std::error_code ec;
  // The folder is written beside itself (DIR.tmp-<pid>, then renamed), so the folder that holds
  // it must be a folder ft may write in: found now, with why, rather than as "cannot create"
  // after the checkpoint is read.
  fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  while (!fs::exists(fs::symlink_status(parent, ec)) && parent.has_parent_path() &&
         parent.parent_path() != parent)
    parent = parent.parent_path();
  if (!fs::is_directory(parent, ec))
    throw UsageError(dir + ": cannot be created: " + parent.string() + " is " +
                     file_kind(parent.string()) + ", not a folder; choose another --output");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw UsageError(dir + ": cannot be created in " + parent.string() + " (" +
                     std::strerror(errno) + "); choose an --output in a folder you can write");
  if (!fs::exists(fs::symlink_status(p, ec))) return;
  if (!fs::is_directory(p, ec))
    throw UsageError(dir + ": exists and is " + file_kind(p.string()) +
                     ", not a folder; choose another --output (a folder to create, or an empty "
                     "one)");
  if (fs::is_empty(p, ec)) return;
  if (is_checkpoint_folder(p))
    throw UsageError(dir +
                     ": holds a checkpoint (manifest.json or latest); ft export never replaces "
                     "one, choose another --output");
  if (!overwrite)
    throw UsageError(dir +
                     ": exists and is not empty; choose another --output, or add --overwrite to "
                     "replace it");
}

void check_adapter_base(const ckpt::Manifest& m, const std::string& use) {
  if (m.frozen_groups.empty()) return;
  if (!m.frozen_from.empty()) {
    std::error_code from_ec;
    if (!fs::is_directory(m.frozen_from, from_ec))
      throw UsageError(m.dir + "/manifest.json: the adapter's base, frozen.from '" + m.frozen_from +
                       "' (the run's model.from), is " + file_kind(m.frozen_from) +
                       ", not a Hugging Face folder; " + use +
                       " reads the base from there (a relative path is taken from the folder ft "
                       "runs in): run it where the training ran, or put the base model back at "
                       "that path");
    if (!m.frozen_from_fingerprint.empty() &&
        hf_weights_fingerprint(m.frozen_from) != m.frozen_from_fingerprint)
      throw UsageError(m.dir + "/manifest.json: the adapter's base, frozen.from '" + m.frozen_from +
                       "', holds other weights than the run trained on (its fingerprint differs "
                       "from frozen.from_fingerprint): " +
                       use +
                       " would add the adapter to another model; put the run's base model back "
                       "at that path");
  } else {
    const json f = m.json.value("frozen", json::object());
    if (!f.contains("seed") || !f.contains("init_std"))
      throw Error(m.dir +
                  "/manifest.json: frozen has no from, seed and init_std, so the adapter's base "
                  "cannot be drawn again; the checkpoint is damaged");
  }
}

AdapterBase::AdapterBase(const ckpt::Manifest& m, const ParamLayout& full) : m_(m), full_(full) {}

AdapterBase::~AdapterBase() = default;

std::vector<float> AdapterBase::group(int g) {
  const auto& frozen = m_.frozen_groups;
  if (std::find(frozen.begin(), frozen.end(), g) == frozen.end())
    return ckpt::read_global_group(m_, ckpt::State::kParam, g);
  std::vector<float> w(full_.groups()[size_t(g)].numel);
  if (m_.frozen_from.empty()) {
    init_random_group(full_, g, m_.frozen_seed, m_.frozen_init_std, w.data());
    return w;
  }
  try {
    if (!reader_) reader_ = std::make_unique<HfWeightReader>(m_.frozen_from, full_);
    reader_->read_group(g, w.data());
  } catch (const UsageError& e) {
    throw UsageError(std::string("the adapter's base, frozen.from in ") + m_.dir +
                     "/manifest.json: " + e.what());
  }
  return w;
}

std::vector<float> AdapterBase::model_group(const ParamLayout& model, int g) {
  const ParamGroup& group = model.groups()[size_t(g)];
  std::vector<float> w(group.numel);
  int have = -1;  // the checkpoint layout's group in `values`
  std::vector<float> values;
  for (const ParamEntry& e : group.entries) {
    int fg = -1;
    const ParamEntry* fe = nullptr;
    FT_CHECK(full_.find(e.name, &fg, &fe) && fe->numel == e.numel,
             "the checkpoint's layout has no ", e.name, " of ", e.numel, " elements");
    if (fg != have) {
      values = this->group(fg);
      have = fg;
    }
    std::copy_n(values.data() + fe->offset, e.numel, w.data() + e.offset);
  }
  return w;
}

HfExportResult export_hf_folder(const ckpt::Manifest& m, const std::string& dir,
                                const HfExportOptions& o,
                                void (*on_file)(const std::string&, uint64_t)) {
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16 && o.dtype != DType::kF16)
    throw UsageError("export dtype must be f32, bf16 or f16, got " + dtype_name(o.dtype));
  FT_CHECK(o.max_shard_bytes > 0, "max_shard_bytes must be positive");
  if (o.merge && !m.adapter.enabled())
    throw UsageError(m.dir +
                     ": --merge merges an adapter into its base, and this checkpoint is of a run "
                     "that trained no adapter (it holds the whole model); export it without "
                     "--merge");
  check_export_target(dir, o.overwrite);
  const fs::path out = clean_dir(dir);
  {
    // An output inside the checkpoint (or the checkpoint inside the output) would have the
    // rename at the end move or delete what is being read.
    std::error_code ec;
    const fs::path a = fs::weakly_canonical(out, ec), b = fs::weakly_canonical(m.dir, ec);
    auto inside = [](const fs::path& x, const fs::path& y) {  // x == y or x under y
      auto [xi, yi] = std::mismatch(x.begin(), x.end(), y.begin(), y.end());
      return yi == y.end();
    };
    if (!ec && (inside(a, b) || inside(b, a)))
      throw UsageError(dir + ": the output folder and the checkpoint " + m.dir +
                       " overlap; choose an --output outside the checkpoint");
  }

  // A shard of the wrong size means a damaged checkpoint even where the parameters read back
  // intact (the optimizer state sits after them): say so now rather than export it quietly.
  // Cheap: sizes only; the parameters' CRC-32s are checked as they are read.
  for (const ckpt::ShardRecord& s : m.shards) {
    std::error_code size_ec;
    const fs::path f = fs::path(m.dir) / s.file;
    const uint64_t size = fs::file_size(f, size_ec);
    if (size_ec)
      throw Error(f.string() + ": cannot read it (" + size_ec.message() +
                  "); the checkpoint is incomplete or damaged, export an older step folder");
    if (size != s.bytes)
      throw Error(f.string() + ": " + std::to_string(size) + " bytes, the manifest says " +
                  std::to_string(s.bytes) +
                  "; the checkpoint is damaged (truncated?), export an older step folder");
  }
  // Merging: the base must be where the run read it (or its seed recorded), found now rather
  // than after part of the folder is written.
  if (o.merge) check_adapter_base(m, "--merge");

  // 1. Plan. `full` has the adapter's groups after the model's (the model's indices are the
  //    same in both); a PEFT folder holds those, a model folder the model's.
  const bool peft = m.adapter.enabled() && !o.merge;
  const ParamLayout model(m.model, 1);
  const ParamLayout full = ckpt::manifest_layout(m, 1);
  const ParamLayout& layout = peft ? full : model;
  // A PEFT folder: the adapter's groups, and the model's groups trained whole (modules_to_save)
  // under PEFT's names; with tied embeddings the shared table under both, as PEFT saves it.
  auto written = [&](size_t g) {
    return !peft || layout.groups()[g].attached_to >= 0 || layout.groups()[g].trains();
  };
  std::vector<PlannedTensor> plan;
  for (size_t g = 0; g < layout.groups().size(); ++g)
    if (written(g))
      for (const ParamEntry& e : layout.groups()[g].entries) {
        const uint64_t bytes = uint64_t(e.numel) * dtype_size(o.dtype);
        const bool whole = peft && layout.groups()[g].attached_to < 0;
        plan.push_back({int(g), &e, whole ? peft_saved_name(e.name) : e.name, bytes, 0});
        if (whole && m.model.tie_embeddings && g == 0)
          plan.push_back({int(g), &e, peft_saved_name("lm_head.weight"), bytes, 0});
      }
  int shards = 1;
  uint64_t in_shard = 0;
  bool shard_empty = true;
  for (PlannedTensor& t : plan) {
    if (!peft && !shard_empty && in_shard + t.bytes > o.max_shard_bytes) {
      ++shards;
      in_shard = 0;
    }
    t.shard = shards - 1;
    in_shard += t.bytes;
    shard_empty = false;
  }

  HfExportResult res;
  res.dir = dir;
  res.sharded = shards > 1;
  res.adapter = peft;
  if (peft && m.frozen_from.empty())
    res.warnings.push_back(
        "the adapter's base is " + adapter_base_description(m) +
        ", not a Hugging Face folder: adapter_config.json's base_model_name_or_path is null, and "
        "PEFT, vLLM and llama.cpp need the base to apply the adapter to; ft export --merge "
        "writes the adapted model whole instead");
  if (peft && !m.adapter.modules_to_save.empty())
    res.warnings.push_back(
        "the adapter trains modules whole (modules_to_save: the PEFT folder holds them as "
        "base_model.model.<module>.weight): PEFT applies it, but vLLM refuses modules_to_save "
        "and llama.cpp's convert_lora_to_gguf.py any tensor but lora_A and lora_B; for those, "
        "serve or convert the ft export --merge folder" +
        std::string(m.model.tie_embeddings
                        ? "; and with tied embeddings adapter_config.json says "
                          "ensure_weight_tying: true, which PEFT before it had the key (0.13 "
                          "among them) refuses"
                        : ""));
  if (peft && m.adapter.use_rslora) {
    const double root = std::sqrt(double(m.adapter.r));
    res.warnings.push_back(detail::concat(
        "the adapter is rsLoRA (use_rslora: scale lora_alpha / sqrt(r) = ", m.adapter.scaling(),
        "); llama.cpp's convert_lora_to_gguf.py ignores use_rslora and scales it by ",
        "lora_alpha / r, ", root,
        " times too weakly: in llama.cpp load it with --lora-scaled FILE ", root,
        ", or convert the ft export --merge folder instead (PEFT and vLLM read use_rslora)"));
  }

  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path(), ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw Error("cannot create the output folder " + out.string() + " (written as " +
                tmp.filename().string() +
                " first, then renamed): " + (ec ? ec.message() : "it exists"));
  try {
    // 2. Tensors, group by group; a shard is written once its last tensor is converted.
    struct Pending {
      const ParamEntry* entry;
      std::string name;
      std::vector<char> bytes;
    };
    std::vector<Pending> pending;
    int current = 0;
    json weight_map = json::object();
    auto flush = [&] {
      if (pending.empty()) return;
      const std::string name = peft ? kPeftWeightsFile : shard_file_name(current, shards);
      std::vector<SafetensorsTensorOut> tensors;
      uint64_t bytes = 0;
      for (const Pending& p : pending) {
        tensors.push_back({p.name, o.dtype, p.entry->global_shape, p.bytes.data()});
        bytes += p.bytes.size();
        weight_map[p.name] = name;
      }
      // "format": "pt" is what transformers checks in the metadata before loading a file.
      write_safetensors((tmp / name).string(), tensors, {{"format", "pt"}});
      std::error_code size_ec;
      const uint64_t file_bytes = fs::file_size(tmp / name, size_ec);
      res.files.push_back({name, size_ec ? bytes : file_bytes, tensors.size()});
      if (on_file) {
        clear_live_line();  // on_file prints on stdout
        on_file(name, res.files.back().bytes);
      }
      pending.clear();
    };
    size_t next = 0;  // into plan
    AdapterBase base(m, full);
    // Progress (core/progress.h): the tensor bytes written, a group at a time.
    double total = 0, done = 0;
    for (const PlannedTensor& t : plan) total += double(t.bytes);
    WorkProgress progress("export", total, WorkProgress::Unit::kBytes, "", o.progress);
    for (size_t g = 0; g < layout.groups().size(); ++g) {
      if (!written(g)) continue;
      const ParamGroup& group = layout.groups()[g];
      std::vector<float> values;
      if (o.merge) {
        values = base.model_group(model, int(g));
        res.merged += add_adapter_terms(m, model, full, int(g), values);
      } else {
        values = ckpt::read_global_group(m, ckpt::State::kParam, int(g));
      }
      if (values.size() != group.numel)
        FT_FAIL(m.dir, ": group ", group.name, " read back ", values.size(),
                " values, the layout of the manifest's model has ", group.numel);
      for (; next < plan.size() && plan[next].group == int(g); ++next) {
        const PlannedTensor& t = plan[next];
        if (t.shard != current) {
          flush();
          current = t.shard;
        }
        pending.push_back(
            {t.entry, t.name, convert(values.data() + t.entry->offset, t.entry->numel, o.dtype)});
        res.tensors += 1;
        res.parameters += t.entry->numel;
        res.tensor_bytes += t.bytes;
        done += double(t.bytes);
      }
      progress.update(done, group.name);
    }
    flush();
    progress.close();  // the caller reports the files and the totals

    // 3. The tokenizer, config.json, generation_config.json, the index.
    const json tok = m.json.value("tokenizer", json());
    if (tok.is_object() && tok.contains("file")) {
      const fs::path src = fs::path(m.dir) / tok["file"].get<std::string>();
      if (!fs::exists(fs::symlink_status(src, ec)))
        throw Error(src.string() +
                    ": missing; the manifest names this tokenizer copy but the checkpoint "
                    "lacks it");
      // Before copying: a FIFO or device in its place would block the copy or never end.
      check_checkpoint_file(src, kMaxTokenizerBytes, "the checkpoint's tokenizer");
      const bool bpe_json = src.extension() == ".json";
      fs::copy_file(src, tmp / (bpe_json ? "tokenizer.json" : "tokenizer.model"),
                    fs::copy_options::overwrite_existing, ec);
      if (ec) throw Error(src.string() + ": cannot copy to the output: " + ec.message());
      if (tok.contains("sha256") && tok["sha256"].is_string() &&
          sha256_file_hex(src.string()) != tok["sha256"].get<std::string>())
        throw Error(src.string() +
                    ": sha256 differs from the manifest's; the checkpoint's tokenizer copy is "
                    "corrupt");
      res.tokenizer = true;
      res.tokenizer_file = bpe_json ? "tokenizer.json" : "tokenizer.model";
      if (bpe_json)
        write_bpe_tokenizer_config(src, tmp, m.model.max_seq_len, &res);
      else
        write_tokenizer_files(src, tmp, m.model.max_seq_len, &res);
    }
    if (peft) {
      write_adapter_config(m, tmp / kPeftConfigFile);
    } else {
      write_hf_config(m.model, o.dtype, (tmp / "config.json").string(), res.ids);
      if (res.ids.bos >= 0 || res.ids.eos >= 0)
        write_generation_config(tmp / "generation_config.json", res.ids);
    }
    if (res.sharded) {
      json index = {{"metadata", {{"total_size", res.tensor_bytes}}}, {"weight_map", weight_map}};
      write_text_file(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
    }
    fsync_dir(tmp);

    // 4. Into place.
    fs::path old;
    if (fs::exists(out, ec) && !fs::is_empty(out, ec)) {
      old = out.string() + ".old-" + std::to_string(::getpid());
      fs::remove_all(old, ec);
      fs::rename(out, old, ec);
      if (ec) throw Error(out.string() + ": cannot move the old folder aside: " + ec.message());
    } else if (fs::exists(out, ec)) {
      fs::remove(out, ec);  // an empty folder
    }
    fs::rename(tmp, out, ec);
    if (ec) {
      if (!old.empty()) fs::rename(old, out, ec);
      throw Error(out.string() + ": cannot rename " + tmp.string() +
                  " into place: " + ec.message());
    }
    if (!out.parent_path().empty()) fsync_dir(out.parent_path());
    if (!old.empty()) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return res;
}

}  // namespace ft
