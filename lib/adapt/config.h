// What a recipe's `adapter:` section resolves into (DESIGN.md §5): the adapter trained on a
// frozen base, as PEFT's LoraConfig names it. It lives here, with the adapters, so that the
// checkpoint code (which records it in the manifest) and the recipe both depend on the adapters
// alone.
#pragma once

#include <string>
#include <vector>

namespace ft {

constexpr int kMaxAdapterRank = 4096;  // adapter.r's bound (recipe and checkpoint alike)

// Whether a name may be listed in adapter.target_modules: a block's linear layer (q_proj ...
// down_proj) or "all-linear".
bool is_lora_target(const std::string& name);

struct AdapterConfig {
  // none: every parameter trains (no adapter); lora: LoRA (Hu et al. 2021) on a frozen base;
  // qlora: LoRA on a base whose blocks' matrices are held in NF4 (Dettmers et al. 2023).
  std::string type = "none";
  int r = 8;           // the rank
  double alpha = 8;    // lora_alpha: the update is scaled by alpha / r (alpha / √r: rsLoRA)
  double dropout = 0;  // lora_dropout: on the adapter's input only, in training
  // Hugging Face module names of the linear layers adapted (q_proj, k_proj, v_proj, o_proj,
  // gate_proj, up_proj, down_proj), in the order given; or the one name "all-linear" (every
  // linear layer but lm_head, as PEFT's). PEFT's default for Llama and Qwen: q_proj, v_proj.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  bool use_rslora = false;
  // kaiming: A Kaiming-uniform (bound 1/√in, PEFT's default), B zero; gaussian: A normal with std
  // 1/r, B zero (PEFT's init_lora_weights="gaussian").
  std::string init = "kaiming";
  std::string from;  // a PEFT adapter folder to start from (adapter_config.json and weights)
  // PEFT's modules_to_save: embed_tokens, lm_head, trained whole beside the adapter (each tensor
  // of the module; lm_head without the final norm). With tied embeddings both names are the one
  // table, which trains when either is listed (PEFT's ensure_weight_tying: true).
  std::vector<std::string> modules_to_save;

  bool enabled() const { return type != "none"; }
  // The factor of the update: alpha / r, or alpha / √r with use_rslora.
  double scaling() const;
  // The projections adapted, with "all-linear" expanded: q_proj ... down_proj in layer order.
  std::vector<std::string> targets() const;
  // Whether modules_to_save lists `module` (embed_tokens or lm_head).
  bool saves(const std::string& module) const;
};

}  // namespace ft
