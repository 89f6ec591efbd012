// The model families ft knows, as one table: what each is called in a recipe, a manifest and a
// Hugging Face config.json, the tensors its attention block adds to Llama's, and how its
// config.json is read and written. Everything that tells families apart asks this table
// (DESIGN.md §5 "model.arch"): a family whose math is Llama's plus flags already here is one row.
// The row is data only; the HF import (lib/ckpt/hf_config.cpp) and export (hf_export.cpp) act on
// its flags, so the model layer never sees a config reader.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ft {

struct ModelConfig;

// How config.json turns sliding-window attention on (ft has none and refuses a window that binds).
enum class SlidingWindowKeys {
  kNone,    // the family has no such key
  kWindow,  // `sliding_window` on every layer unless null (absent: 4096, MistralConfig's default)
  kSwitch,  // `use_sliding_window: true` with `sliding_window`, and `layer_types` (Qwen2, Qwen3)
};

struct ArchSpec {
  const char* name;      // model.arch, the manifest's model.arch and config.json's model_type
  const char* hf_class;  // config.json's architectures[0], transformers' class
  const char* label;     // the family in messages ("Qwen2")
  bool implemented;      // false: a recipe choice refused by validation (gpt2)

  // Tensors the attention block adds (model/layout.h has where they sit).
  bool qkv_bias;  // biases on q_proj, k_proj and v_proj, split with their rows
  bool qk_norm;   // an RMSNorm over each head of q and of k before RoPE (q_norm, k_norm: head_dim)

  // config.json, read (ckpt/hf_config.cpp) and written (ckpt/hf_export.cpp).
  // Import refuses `attention_bias` or `mlp_bias` true, except attention_bias with qkv_bias.
  int default_head_dim;     // head_dim when the key is absent; 0: hidden_size / heads
  bool attention_bias_key;  // its config class has `attention_bias` (export writes false)
  bool mlp_bias_key;        // its config class has `mlp_bias` (export writes false)
  SlidingWindowKeys sliding_window;
};

// Every row, implemented or not, in the order messages list them.
std::span<const ArchSpec> arch_table();
// The row of model.arch / model_type `name`, or nullptr.
const ArchSpec* find_arch(std::string_view name);
// The row whose transformers class is `hf_class`, or nullptr.
const ArchSpec* find_arch_by_class(std::string_view hf_class);
// The row of c.arch, which must be implemented (validation and the manifest reader refuse others).
const ArchSpec& arch_of(const ModelConfig& c);
// A column of the implemented rows for messages, "a, b, c or d": implemented_archs(&ArchSpec::name)
// is "llama, qwen2, qwen3 or mistral". `has`, when given, keeps the rows where that flag is `yes`.
std::string implemented_archs(const char* ArchSpec::*column, bool ArchSpec::*has = nullptr,
                              bool yes = true);
// The implemented classes with their names: "LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2),
// ...".
std::string implemented_arch_classes();
// Whether model.arch `name` is implemented.
bool is_implemented_arch(std::string_view name);

}  // namespace ft
