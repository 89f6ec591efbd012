// Hugging Face folders: config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json. This is the one place HF names meet ft's layout (via
// ParamLayout, whose entries carry the HF names).
#pragma once

#include <string>
#include <vector>

#include "model/layout.h"
#include "recipe/recipe.h"

namespace ft {

// Reads config.json of a LlamaForCausalLM folder into a ModelConfig (dim=hidden_size,
// n_layers=num_hidden_layers, n_heads=num_attention_heads, n_kv_heads=num_key_value_heads
// (default n_heads), ffn_dim=intermediate_size, vocab_size, max_seq_len=max_position_embeddings,
// rope_theta (default 10000), norm_eps=rms_norm_eps, tie_embeddings=tie_word_embeddings
// (default false)). Throws ft::Error naming the file on a missing or malformed config.
ModelConfig read_hf_config(const std::string& dir);

// Loads every parameter of `layout` from the folder's safetensors into the flat f32 group
// buffers (group_ptrs[g] points at group g's buffer). Checks that every expected name is present
// with the right shape, that dtypes are F32/BF16/F16, and reports unexpected tensors
// (rotary inv_freq buffers are ignored). Errors name the file and the tensor.
void load_hf_weights(const std::string& dir, const ParamLayout& layout,
                     const std::vector<float*>& group_ptrs);

}  // namespace ft
