#include "model/arch.h"

#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace ft {
namespace {

using SW = SlidingWindowKeys;
// One row per family (ArchSpec has the columns). Mistral is Llama's math with its own config keys.
constexpr ArchSpec kArchs[] = {
    // name, class, label, implemented, qkv_bias, qk_norm, default_head_dim,
    // attention_bias_key, mlp_bias_key, sliding_window
    {"llama", "LlamaForCausalLM", "Llama", true, false, false, 0, true, true, SW::kNone},
    {"qwen2", "Qwen2ForCausalLM", "Qwen2", true, true, false, 0, false, false, SW::kSwitch},
    {"qwen3", "Qwen3ForCausalLM", "Qwen3", true, false, true, 128, true, false, SW::kSwitch},
    {"mistral", "MistralForCausalLM", "Mistral", true, false, false, 0, false, false, SW::kWindow},
    {"gpt2", "GPT2LMHeadModel", "GPT-2", false, false, false, 0, false, false, SW::kNone},
};

}  // namespace

std::span<const ArchSpec> arch_table() { return kArchs; }

const ArchSpec* find_arch(std::string_view name) {
  for (const ArchSpec& a : kArchs)
    if (name == a.name) return &a;
  return nullptr;
}

const ArchSpec* find_arch_by_class(std::string_view hf_class) {
  for (const ArchSpec& a : kArchs)
    if (hf_class == a.hf_class) return &a;
  return nullptr;
}

bool is_implemented_arch(std::string_view name) {
  const ArchSpec* a = find_arch(name);
  return a != nullptr && a->implemented;
}

const ArchSpec& arch_of(const ModelConfig& c) {
  const ArchSpec* a = find_arch(c.arch);
  FT_CHECK(a != nullptr && a->implemented, "model.arch ", c.arch, " is not implemented");
  return *a;
}

std::string implemented_archs(const char* ArchSpec::*column, bool ArchSpec::*has, bool yes) {
  std::vector<const char*> items;
  for (const ArchSpec& a : kArchs)
    if (a.implemented && (has == nullptr || a.*has == yes)) items.push_back(a.*column);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

std::string implemented_arch_classes() {
  std::string out;
  for (const ArchSpec& a : kArchs)
    if (a.implemented)
      out += (out.empty() ? "" : ", ") + std::string(a.hf_class) + " (" + a.name + ")";
  return out;
}

}  // namespace ft
