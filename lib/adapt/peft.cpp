#include "adapt/peft.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"

namespace ft {

std::vector<PeftBeyond> peft_config_beyond(const nlohmann::json& file) {
  struct Beyond {
    const char* key;
    const char* why;
  };
  std::vector<PeftBeyond> out;
  for (const Beyond& b : {
           Beyond{"use_dora", "DoRA is not built in this ft"},
           Beyond{"bias", "ft's LoRA trains no biases"},
           Beyond{"lora_bias", "ft's LoRA has no bias on B"},
           Beyond{"trainable_token_indices", "ft does not train single embedding rows"},
           Beyond{"rank_pattern", "ft's LoRA has one r for every module"},
           Beyond{"alpha_pattern", "ft's LoRA has one alpha for every module"},
           Beyond{"layers_to_transform", "ft's LoRA adapts every layer"},
           Beyond{"exclude_modules", "ft's LoRA adapts target_modules in every layer"},
           Beyond{"layer_replication", "ft does not replicate layers"},
       }) {
    if (!file.is_object() || !file.contains(b.key)) continue;
    const nlohmann::json& v = file[b.key];
    if (v.is_null() || v == false || (v.is_structured() && v.empty()) || v == "none") continue;
    out.push_back({b.key, v, b.why});
  }
  return out;
}

std::optional<std::vector<std::string>> peft_modules_to_save(const nlohmann::json& modules) {
  std::vector<std::string> out;
  if (modules.is_null()) return out;
  if (!modules.is_array()) return std::nullopt;
  for (const nlohmann::json& e : modules) {
    if (!e.is_string()) return std::nullopt;
    const std::string& path = e.get_ref<const std::string&>();
    const size_t dot = path.rfind('.');
    const std::string name = path.substr(dot == std::string::npos ? 0 : dot + 1);
    if (name != "embed_tokens" && name != "lm_head") return std::nullopt;
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

bool same_modules_to_save(const std::vector<std::string>& a, const std::vector<std::string>& b,
                          bool tied) {
  if (tied) return a.empty() == b.empty();
  auto has = [](const std::vector<std::string>& v, const char* m) {
    return std::find(v.begin(), v.end(), m) != v.end();
  };
  return has(a, "embed_tokens") == has(b, "embed_tokens") && has(a, "lm_head") == has(b, "lm_head");
}

std::string peft_tying_problem(const nlohmann::json& file, bool tied) {
  if (!tied || !file.is_object() || !file.contains("modules_to_save")) return "";
  const std::optional<std::vector<std::string>> saved =
      peft_modules_to_save(file["modules_to_save"]);
  if (!saved || saved->empty()) return "";
  if (file.contains("ensure_weight_tying") && file["ensure_weight_tying"] == true) return "";
  return "modules_to_save is " + short_dump(file["modules_to_save"]) +
         " on a model with tied embeddings, without ensure_weight_tying: true, so PEFT trained a "
         "copy of the module apart from the table the model shares; ft trains the shared table "
         "(PEFT's ensure_weight_tying: true), and cannot continue an adapter that untied it";
}

std::string peft_saved_name(const std::string& name) { return "base_model.model." + name; }

std::optional<std::vector<std::string>> peft_target_modules(const nlohmann::json& targets) {
  AdapterConfig c;
  c.target_modules.clear();
  for (const nlohmann::json& e : targets.is_array() ? targets : nlohmann::json::array({targets})) {
    if (!e.is_string()) return std::nullopt;
    const std::string& path = e.get_ref<const std::string&>();
    const size_t dot = path.rfind('.');
    const std::string name = path.substr(dot == std::string::npos ? 0 : dot + 1);
    if (!is_lora_target(name)) return std::nullopt;
    c.target_modules.push_back(name);
  }
  if (c.target_modules.empty()) return std::nullopt;
  return c.targets();
}

AdapterConfig read_peft_adapter_config(const std::string& dir, bool tied, const std::string& hint) {
  const std::string config = (std::filesystem::path(dir) / "adapter_config.json").string();
  const std::string text = read_bounded_file(config, kMaxConfigBytes, "adapter config", hint);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(config + ": not valid JSON (" + json_error_words(e) + "); " + hint);
  }
  if (!j.is_object())
    throw UsageError(config + ": expected a JSON object at the top level, found " +
                     describe_json_value(j) + "; " + hint);
  const nlohmann::json none;  // what a key the file does not have reads as
  auto at = [&](const char* key) -> const nlohmann::json& {
    return j.contains(key) ? j[key] : none;
  };
  if (at("peft_type") != "LORA")
    throw UsageError(config + ": peft_type is " + short_dump(at("peft_type")) +
                     "; ft applies LORA adapters only; " + hint);
  for (const PeftBeyond& b : peft_config_beyond(j))
    throw UsageError(config + ": " + b.key + " is " + short_dump(b.value) + "; " + b.why +
                     "; use an adapter saved without " + b.key + " (PEFT's default)");
  AdapterConfig a;
  a.type = "lora";
  a.from = dir;
  const nlohmann::json& r = at("r");
  if (!r.is_number_integer() || r.get<int64_t>() < 1 || r.get<int64_t>() > kMaxAdapterRank)
    throw UsageError(config + ": r is " + short_dump(r) + "; expected an integer from 1 to " +
                     std::to_string(kMaxAdapterRank) + "; " + hint);
  a.r = int(r.get<int64_t>());
  const nlohmann::json& alpha = at("lora_alpha");
  if (!alpha.is_number() || !std::isfinite(alpha.get<double>()))
    throw UsageError(config + ": lora_alpha is " + short_dump(alpha) + "; expected a number; " +
                     hint);
  a.alpha = alpha.get<double>();
  const std::optional<std::vector<std::string>> targets = peft_target_modules(at("target_modules"));
  if (!targets)
    throw UsageError(config + ": target_modules is " + short_dump(at("target_modules")) +
                     "; expected a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                     "down_proj (or their module paths), or all-linear; " +
                     hint);
  a.target_modules = *targets;
  const std::optional<std::vector<std::string>> saved = peft_modules_to_save(at("modules_to_save"));
  if (!saved)
    throw UsageError(config + ": modules_to_save is " + short_dump(at("modules_to_save")) +
                     "; ft trains embed_tokens and lm_head whole (their names or module paths), "
                     "nothing else; " +
                     hint);
  a.modules_to_save = *saved;
  if (const std::string why = peft_tying_problem(j, tied); !why.empty())
    throw UsageError(config + ": " + why + "; " + hint);
  const nlohmann::json& rslora = at("use_rslora");
  if (!rslora.is_null() && !rslora.is_boolean())
    throw UsageError(config + ": use_rslora is " + short_dump(rslora) +
                     "; expected true or false; " + hint);
  a.use_rslora = rslora == true;
  const nlohmann::json& dropout = at("lora_dropout");
  if (dropout.is_number() && dropout.get<double>() >= 0 && dropout.get<double>() < 1)
    a.dropout = dropout.get<double>();  // in training only: generation does not drop
  return a;
}

}  // namespace ft
