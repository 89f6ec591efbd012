// PEFT's adapter_config.json (the LoraConfig save_pretrained writes beside
// adapter_model.safetensors) against ft's LoRA (adapt/lora.h): what ft reads from it and what it
// refuses by name rather than drop. Shared by the recipe's adapter.from check
// (recipe/validate_inputs.cpp, which reports each problem as a recipe issue) and ft generate
// --adapter (which throws).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "adapt/config.h"

namespace ft {

// A key of the file that asks for more than a plain LoRA on every layer's target modules: a key
// of PEFT's LoraConfig away from its default (null, false, empty, bias "none"), and why ft cannot
// honour it.
struct PeftBeyond {
  std::string key;
  nlohmann::json value;
  std::string why;
};
std::vector<PeftBeyond> peft_config_beyond(const nlohmann::json& file);

// target_modules as the projections it expands to (AdapterConfig::targets(): q_proj ... down_proj
// in layer order). PEFT saves a set (in any order), and all-linear as the list of what it stood
// for: short names (peft 0.13) or the modules' whole paths ("model.layers.0.mlp.up_proj", peft
// 0.21), each matching a module whose name ends with it at a dot; the projection is the last
// part. nullopt: not a string or a list of strings naming block projections (or all-linear), or
// empty. (Paths naming only some layers pass here; the weights' check refuses them.)
std::optional<std::vector<std::string>> peft_target_modules(const nlohmann::json& targets);

// modules_to_save as ft's names, each once, in the file's order: embed_tokens, lm_head. PEFT
// saves names or module paths ("model.embed_tokens"; with ensure_weight_tying, the list PEFT
// rewrote: the embedding's path added, lm_head removed), each matching the module whose name ends
// with it; null: none. nullopt: not null or a list of strings naming those two.
std::optional<std::vector<std::string>> peft_modules_to_save(const nlohmann::json& modules);

// Whether two modules_to_save lists train the same tensors: with tied embeddings any non-empty
// list trains the one shared table (AdapterConfig::modules_to_save).
bool same_modules_to_save(const std::vector<std::string>& a, const std::vector<std::string>& b,
                          bool tied);

// Why ft cannot continue the file's modules_to_save on a model whose embeddings are tied (or
// not: ""). PEFT trains a copy of each module listed apart from the shared table unless
// ensure_weight_tying is true; ft trains the shared table, so it takes only that case.
std::string peft_tying_problem(const nlohmann::json& file, bool tied);

// A model tensor trained whole (modules_to_save) under its name in PEFT's
// adapter_model.safetensors: "base_model.model." + its Hugging Face name
// (base_model.model.lm_head.weight), as PEFT saves a ModulesToSaveWrapper's module.
std::string peft_saved_name(const std::string& name);

// The adapter of the PEFT folder `dir` from its adapter_config.json: type lora, r, lora_alpha,
// target_modules, use_rslora (absent: false, as PEFT before rsLoRA), lora_dropout,
// modules_to_save; `from` is dir. `tied`: the base model's embeddings are tied. Throws UsageError
// naming the file and the key (with `hint`) when the file is missing or not JSON, its peft_type
// is not LORA, it asks for what peft_config_beyond lists, or its r (1 to kMaxAdapterRank),
// lora_alpha, target_modules or modules_to_save are not usable (peft_tying_problem too).
AdapterConfig read_peft_adapter_config(const std::string& dir, bool tied, const std::string& hint);

}  // namespace ft
