// Recipe validation against the files it names (stages 4b and 5a, and the vocabulary and adapter
// checks of 5c; recipe.cpp has the list): model.from's config.json (sizes taken from it, recipe
// values that disagree refused, weights in safetensors), paths that must exist, the vocabulary of
// the shards and the tokenizer against model.vocab_size, and adapter.from's adapter_config.json
// against the adapter section.
//
// Invariants: what `ft train` would refuse about these files, `ft validate` refuses too
// (DESIGN.md §5); a file's own errors become issues at the key naming it, never exceptions; only
// headers and attributes are read (config.json, the first shard's attributes, the tokenizer),
// never weights or tokens.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "adapt/peft.h"
#include "ckpt/hf.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "model/arch.h"
#include "recipe/loader.h"
#include "recipe/schema.h"

namespace ft::recipe_internal {

// Stage 4b: with model.from, the HF config provides the size keys; explicit recipe values
// must agree with it (DESIGN.md §5: a disagreement is an error, not a silent override).
void Loader::take_model_from() {
  if (r_.model.from.empty() || !usable("model.from")) return;
  if (!std::filesystem::is_directory(r_.model.from)) return;  // reported by check_paths
  HfConfigRead hf;
  try {
    hf = read_hf_config_located(r_.model.from);
  } catch (const Error& e) {
    issue(locate("model.from"), "model.from", e.what(),
          "point model.from at a Hugging Face model folder of a family ft trains (" +
              implemented_archs(&ArchSpec::label) + ": config.json and *.safetensors)");
    return;
  }
  const std::string config = (std::filesystem::path(r_.model.from) / "config.json").string();
  for (const std::string& u : hf.unsupported) {
    issue(locate("model.from"), "model.from", config + ": " + u,
          "ft cannot train this model as transformers would; use a checkpoint without it");
  }
  warnings_.insert(warnings_.end(), hf.warnings.begin(), hf.warnings.end());
  check_weight_files();
  Recipe from_hf = r_;
  from_hf.model = hf.model;
  for (const KeySpec& k : schema()) {
    if (k.hf_name.empty()) continue;
    const Value theirs = k.get(from_hf);
    // head_dim: 0 and the quotient dim / n_heads say the same.
    const bool same_head_dim =
        k.path == "model.head_dim" && std::get<int64_t>(k.get(r_)) == head_dim_of(hf.model);
    if (is_set(k.path) && usable(k.path) && k.get(r_) != theirs && !same_head_dim) {
      issue(locate(k.path), k.path,
            k.path + " = " + format_value(k.get(r_)) + " but " + config + " " +
                hf_says(k, hf,
                        k.path == "model.head_dim" ? std::to_string(head_dim_of(hf.model))
                                                   : format_value(theirs)),
            "remove " + k.path + " or make it match");
    }
    k.set(r_, theirs);
  }
}

// ft reads safetensors only (ckpt/hf.cpp). Only their presence is checked here, so that
// validate refuses what train would: the headers are read when the weights load. The issue is
// marked (RecipeIssue::weight_files): ft plan answers from config.json alone.
void Loader::check_weight_files() {
  namespace fs = std::filesystem;
  const fs::path dir = r_.model.from;
  std::error_code ec;
  if (fs::is_regular_file(dir / "model.safetensors", ec) ||
      fs::is_regular_file(dir / "model.safetensors.index.json", ec))
    return;
  std::string others;  // weights in formats ft does not read
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".bin" || ext == ".pth" || ext == ".pt" || ext == ".safetensors" ||
        e.path().filename() == "pytorch_model.bin.index.json")
      others += (others.empty() ? "" : ", ") + e.path().filename().string();
  }
  issue(locate("model.from"), "model.from",
        r_.model.from + " has no model.safetensors or model.safetensors.index.json" +
            (others.empty() ? "" : " (it holds " + others + ")"),
        others.empty() ? "point model.from at the folder that holds the weights"
                       : "ft reads safetensors only: convert the weights, e.g. in Python "
                         "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT)");
  issues_.back().weight_files = true;
}

// What config.json says about key k, quoting the place it was read from: "has hidden_size
// 256", "has rope_parameters.rope_theta = 500000", "has no rope_theta (transformers' default
// 10000)". For a RoPE factor the file's rope type does not have: "uses rope type X, which
// has no factor".
std::string Loader::hf_says(const KeySpec& k, const HfConfigRead& hf, const std::string& value) {
  const auto it = hf.origins.find(k.path);
  if (it == hf.origins.end()) {
    if (k.path.rfind("model.rope_", 0) == 0)
      return "uses rope type " + hf.model.rope_type + ", which has no " + k.hf_name;
    return "has " + k.hf_name + " " + value;
  }
  if (it->second.empty()) return "has no " + k.hf_name + " (transformers' default " + value + ")";
  return "has " + it->second + " = " + value;
}

// Stage 5a: paths that must exist now. Relative paths are resolved against the current
// working directory (where ft runs), not the recipe's folder, the same way every other
// command-line tool treats paths; they are kept as written in the Recipe.
void Loader::check_paths() {
  for (const KeySpec& k : schema()) {
    if (k.kind != Kind::kDir && k.kind != Kind::kFile && k.kind != Kind::kTokenizer) continue;
    if (!usable(k.path)) continue;
    const std::string p = std::get<std::string>(k.get(r_));
    if (p.empty()) continue;
    std::error_code dir_ec;
    if (k.kind == Kind::kTokenizer && std::filesystem::is_directory(p, dir_ec)) {
      try {
        resolve_tokenizer_file(p);
      } catch (const Error& e) {
        issue(locate(k.path), k.path, e.what(),
              "give a tokenizer file, or a Hugging Face folder that holds one");
      }
      continue;
    }
    const bool want_dir = k.kind == Kind::kDir;
    std::error_code ec;
    const auto status = std::filesystem::status(p, ec);
    const bool exists = std::filesystem::exists(status);
    if (want_dir ? std::filesystem::is_directory(status)
                 : std::filesystem::is_regular_file(status)) {
      continue;
    }
    std::string message = !exists    ? "\"" + p + "\" does not exist"
                          : want_dir ? "\"" + p + "\" is not a directory"
                                     : "\"" + p + "\" is not a regular file";
    std::string hint = want_dir ? "give the path of a directory" : "give the path of a file";
    if (p.rfind("~/", 0) == 0)
      hint = "~ is not expanded in recipes; write the full path";
    else if (std::filesystem::path(p).is_relative()) {
      hint += "; relative paths are resolved against the current directory, " +
              std::filesystem::current_path(ec).string();
    }
    issue(locate(k.path), k.path, message, hint);
  }
}

// Token ids must be rows of the embedding. ft train refuses shards whose vocab_size attribute
// exceeds model.vocab_size (every id of a shard is below its attribute, data/shard_read.cpp), so
// validate checks the same here from the first shard's attributes, without reading tokens;
// and a tokenizer with more pieces than the model has rows would produce such ids.
void Loader::check_vocabulary() {
  if (!usable("model.vocab_size")) return;
  const int64_t V = r_.model.vocab_size;
  const std::string source =
      r_.model.from.empty() ? std::string() : " (vocab_size in " + r_.model.from + "/config.json)";
  for (const char* key : {"data.train", "data.valid"}) {
    const KeySpec& k = *find_key(key);
    const std::string dir = std::get<std::string>(k.get(r_));
    std::error_code ec;
    if (dir.empty() || !usable(key) || !std::filesystem::is_directory(dir, ec)) continue;
    std::vector<std::string> files;
    try {
      files = list_shard_files(dir);
    } catch (const Error&) {
      continue;  // no shards yet: the loader names the folder when training starts
    }
    ShardInfo info;
    try {
      info = read_shard_info(files.front());
    } catch (const Error& e) {
      issue(locate(key), key, e.what(), "re-create the shards with ft tokenize");
      continue;
    }
    if (info.attrs.vocab_size > V) {
      issue(locate("model.vocab_size"), "model.vocab_size",
            "model.vocab_size " + std::to_string(V) + source + " is smaller than vocab_size " +
                std::to_string(info.attrs.vocab_size) + " of the shards in " + dir + " (" +
                files.front() + ")",
            "tokenize " + std::string(key) +
                " with the model's tokenizer, or use a model "
                "whose vocabulary covers it");
    }
  }
  // tokenizer.path is also used as opaque bytes (its hash must match the shards'), so a file
  // SentencePiece cannot load is left to that check.
  if (!r_.tokenizer.path.empty() && usable("tokenizer.path")) {
    std::error_code ec;
    if (!std::filesystem::exists(r_.tokenizer.path, ec)) return;
    int64_t pieces = 0;
    try {
      pieces = load_tokenizer(r_.tokenizer.path)->vocab_size();
    } catch (const Error&) {
      return;
    }
    if (pieces > V) {
      issue(locate("model.vocab_size"), "model.vocab_size",
            "model.vocab_size " + std::to_string(V) + source + " is smaller than the " +
                std::to_string(pieces) + " pieces of tokenizer " + r_.tokenizer.path,
            "use the model's own tokenizer, or a model whose vocabulary covers it");
    }
  }
}

// adapter.from: a folder PEFT's save_pretrained wrote (adapter_config.json and
// adapter_model.safetensors), whose adapter training continues. The adapter's shape is the
// file's, so the recipe must say the same (r, lora_alpha, target_modules, use_rslora: a
// disagreement is an issue naming both values, as with model.from), and what the file asks for
// beyond a plain LoRA on the recipe's modules is refused by name rather than dropped. Only the
// config is read here; the weights when training starts.
void Loader::check_adapter_from() {
  namespace fs = std::filesystem;
  const AdapterConfig& a = r_.adapter;
  std::error_code ec;
  if (a.from.empty() || !usable("adapter.from") || !fs::is_directory(a.from, ec)) return;
  const Origin from_at = locate("adapter.from");
  const std::string config = (fs::path(a.from) / "adapter_config.json").string();
  const std::string weights = (fs::path(a.from) / "adapter_model.safetensors").string();
  const std::string peft_hint = "point adapter.from at a folder PEFT's save_pretrained wrote";
  std::vector<std::string> missing;
  for (const std::string& f : {config, weights})
    if (file_kind(f) == "missing") missing.push_back(fs::path(f).filename().string());
  if (!missing.empty()) {
    const bool bin = fs::exists(fs::path(a.from) / "adapter_model.bin", ec);
    issue(from_at, "adapter.from", a.from + " has no " + join(missing, " or "),
          bin && missing.back() == "adapter_model.safetensors"
              ? "ft reads safetensors only; PEFT writes them by default (save_pretrained's "
                "safe_serialization=True)"
              : peft_hint);
    return;
  }
  // The weights are read when training starts; here only that they are a file.
  if (const std::string kind = file_kind(weights); kind != "a regular file") {
    issue(from_at, "adapter.from", weights + " is " + kind + ", not a regular file", peft_hint);
    return;
  }
  nlohmann::json j;
  try {
    const std::string text = read_bounded_file(config, kMaxConfigBytes, "adapter config");
    j = nlohmann::json::parse(text);
  } catch (const Error& e) {
    issue(from_at, "adapter.from", e.what(), peft_hint);
    return;
  } catch (const nlohmann::json::exception& e) {
    issue(from_at, "adapter.from", config + ": not valid JSON (" + json_error_words(e) + ")",
          peft_hint);
    return;
  }
  if (!j.is_object()) {
    issue(from_at, "adapter.from",
          config + ": expected a JSON object at the top level, found " + describe_json_value(j),
          peft_hint);
    return;
  }
  const nlohmann::json& file = j;
  const nlohmann::json none;  // what a key the file does not have reads as
  auto at = [&](const char* key) -> const nlohmann::json& {
    return file.contains(key) ? file[key] : none;
  };
  if (at("peft_type") != "LORA")
    issue(from_at, "adapter.from",
          config + ": peft_type is " + short_dump(at("peft_type")) +
              "; ft continues LORA adapters only",
          peft_hint);
  // What the file asks for beyond a plain LoRA: refused by name (adapt/peft.h).
  for (const PeftBeyond& b : peft_config_beyond(file))
    issue(from_at, "adapter.from",
          config + ": " + b.key + " is " + short_dump(b.value) + "; " + b.why,
          "continue an adapter saved without " + b.key + " (PEFT's default)");
  // Modules trained whole: embed_tokens and lm_head only, and on tied embeddings the shared table
  // (PEFT's ensure_weight_tying), which is what ft trains.
  const std::optional<std::vector<std::string>> saved = peft_modules_to_save(at("modules_to_save"));
  const bool tied = r_.model.tie_embeddings && usable("model.tie_embeddings");
  if (!saved)
    issue(from_at, "adapter.from",
          config + ": modules_to_save is " + short_dump(at("modules_to_save")) +
              "; ft trains embed_tokens and lm_head whole, nothing else",
          "continue an adapter whose modules_to_save names those (or none)");
  else if (const std::string why = peft_tying_problem(file, tied); !why.empty())
    issue(from_at, "adapter.from", config + ": " + why,
          "continue an adapter saved with ensure_weight_tying: true, or none trained whole");

  // The shape, each key under its PEFT name; target_modules compared as the set of projections it
  // expands to (adapt/peft.h peft_target_modules).
  const nlohmann::json& targets = at("target_modules");
  const nlohmann::json& r = at("r");
  const nlohmann::json& alpha = at("lora_alpha");
  const nlohmann::json& rslora = at("use_rslora");
  struct Same {
    const char* path;
    const char* peft_name;
    bool same;
    std::string ours, theirs;  // as written in the recipe and in the file
  };
  for (const Same& c : {
           Same{"adapter.r", "r", r.is_number_integer() && r.get<int64_t>() == a.r,
                std::to_string(a.r), short_dump(r)},
           Same{"adapter.alpha", "lora_alpha", alpha.is_number() && alpha.get<double>() == a.alpha,
                format_double(a.alpha), short_dump(alpha)},
           Same{"adapter.target_modules", "target_modules",
                peft_target_modules(targets) == a.targets(), format_value(a.target_modules),
                short_dump(targets)},
           // Absent from the files of PEFT before rsLoRA, which read it as false.
           Same{"adapter.use_rslora", "use_rslora",
                rslora == a.use_rslora || (rslora.is_null() && !a.use_rslora),
                a.use_rslora ? "true" : "false", short_dump(rslora)},
           // Compared as what trains (adapt/peft.h same_modules_to_save): on tied embeddings
           // every list names the one table.
           Same{"adapter.modules_to_save", "modules_to_save",
                !saved || same_modules_to_save(*saved, a.modules_to_save, tied),
                format_value(a.modules_to_save), short_dump(at("modules_to_save"))},
       }) {
    if (c.same || !usable(c.path)) continue;
    const bool written = is_set(c.path);
    issue(written ? locate(c.path) : from_at, c.path,
          std::string(c.path) + " = " + c.ours + (written ? "" : " (its default)") + " but " +
              config +
              (c.theirs == "null" ? " has no " + std::string(c.peft_name)
                                  : " has " + std::string(c.peft_name) + " " + c.theirs),
          "make " + std::string(c.path) + " match the adapter it continues");
  }
}

}  // namespace ft::recipe_internal
