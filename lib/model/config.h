// The model's architecture and sizes: what lib/model builds, checkpoints record (manifest
// `model`) and Hugging Face config.json maps to (lib/ckpt/hf.h). The recipe's `model:` section
// resolves into it (lib/recipe), but it lives here so that the model, the checkpoint code and the
// HF import depend on the model alone, not on the recipe that names it.
#pragma once

#include <string>

namespace ft {

struct ModelConfig {
  // A row of model/arch.h's table: llama | qwen2 | qwen3 | mistral | gpt2 (gpt2 not yet
  // implemented: refused by validation). The families differ from Llama only in the attention
  // block: qwen2 adds biases to the q, k and v projections, qwen3 an RMSNorm over each head of q
  // and k (before RoPE); mistral is Llama's math (a sliding window is refused at import).
  std::string arch = "llama";
  std::string from;  // optional Hugging Face folder
  int dim = 256;
  int n_layers = 4;
  int n_heads = 4;
  int n_kv_heads = 4;
  // Channels of one attention head; 0: dim / n_heads. Set where a model's heads are not dim
  // wide together (Qwen3-0.6B: dim 1024, 16 heads of 128; Mistral Nemo: 5120, 32 of 128): q, k
  // and v are then n_heads·head_dim (n_kv_heads·head_dim) wide, and o_proj maps that back to dim.
  int head_dim = 0;
  int ffn_dim = 688;
  int vocab_size = 32000;
  int max_seq_len = 2048;
  double rope_theta = 10000.0;
  // RoPE frequency scaling, as transformers' rope_parameters / rope_scaling: "default" (none),
  // "linear" (every inverse frequency / rope_factor) or "llama3" (Llama 3.1: long wavelengths /
  // rope_factor, short ones kept, a smooth blend between; see model/rope.h). The factors are
  // only read by the types that use them; the defaults below are neutral (linear with factor 1
  // is no scaling) so that a resolved recipe written with them reads back unchanged.
  std::string rope_type = "default";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int rope_original_max_seq_len = 8192;  // HF: original_max_position_embeddings
  double norm_eps = 1e-5;
  bool tie_embeddings = false;
  double init_std = 0.02;  // std of the seeded random initialisation (without model.from)
};

// The channels of one head: head_dim, or dim / n_heads when it is 0.
inline int head_dim_of(const ModelConfig& c) {
  return c.head_dim > 0 ? c.head_dim : c.n_heads > 0 ? c.dim / c.n_heads : 0;
}
// The head dim with the keys it comes from, for messages: "model.head_dim 64", or
// "head dim 64 (model.dim 2048 / model.n_heads 32)".
inline std::string head_dim_keys(const ModelConfig& c) {
  const std::string d = std::to_string(head_dim_of(c));
  if (c.head_dim > 0) return "model.head_dim " + d;
  return "head dim " + d + " (model.dim " + std::to_string(c.dim) + " / model.n_heads " +
         std::to_string(c.n_heads) + ")";
}
// Whether the heads are whole: an explicit head_dim, or n_heads dividing dim.
inline bool heads_whole(const ModelConfig& c) {
  return c.n_heads > 0 && (c.head_dim > 0 || c.dim % c.n_heads == 0);
}

}  // namespace ft
