// The model's architecture and sizes: what lib/model builds, checkpoints record (manifest
// `model`) and Hugging Face config.json maps to (lib/ckpt/hf.h). The recipe's `model:` section
// resolves into it (lib/recipe), but it lives here so that the model, the checkpoint code and the
// HF import depend on the model alone, not on the recipe that names it.
#pragma once

#include <string>

namespace ft {

struct ModelConfig {
  std::string arch = "llama";  // llama | gpt2 (gpt2 not yet implemented: refused by validation)
  std::string from;            // optional Hugging Face folder
  int dim = 256;
  int n_layers = 4;
  int n_heads = 4;
  int n_kv_heads = 4;
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

}  // namespace ft
