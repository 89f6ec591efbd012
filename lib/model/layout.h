// Parameter layout: the fixed order in which parameters sit in flat buffers. Gradients and
// AdamW moments mirror it exactly. ZeRO shards these buffers, checkpoints slice them, and HF
// import/export maps names through it — so this order is part of the checkpoint format.
//
// Groups (one flat f32 buffer each):
//   group 0        "embed"     model.embed_tokens.weight            (V, C)
//   group 1 + i    "layers.i"  in order:
//       model.layers.i.input_layernorm.weight            (C)
//       model.layers.i.self_attn.q_proj.weight           (H*D, C)
//       model.layers.i.self_attn.k_proj.weight           (KV*D, C)
//       model.layers.i.self_attn.v_proj.weight           (KV*D, C)
//       model.layers.i.self_attn.o_proj.weight           (C, H*D)
//       model.layers.i.post_attention_layernorm.weight   (C)
//       model.layers.i.mlp.gate_proj.weight              (F, C)
//       model.layers.i.mlp.up_proj.weight                (F, C)
//       model.layers.i.mlp.down_proj.weight              (C, F)
//   group 1 + L    "head"      model.norm.weight (C), then lm_head.weight (V, C) unless tied
// Names are the Hugging Face LlamaForCausalLM names; matrices are (out, in) row-major, so a
// linear layer computes y = x · Wᵀ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace ft {

// How a tensor is divided over the tensor-parallel ranks (Megatron-LM, Shoeybi et al. 2019):
// column-parallel layers (q, k, v, gate, up) and the vocabulary-parallel embedding and lm_head
// split their output rows; row-parallel layers (o, down) split their input columns; norm weights
// are replicated.
enum class TensorSplit { kReplicated, kRows, kCols };

struct ParamEntry {
  std::string name;            // Hugging Face name
  std::vector<int64_t> shape;  // this rank's shape, (out, in) for matrices
  std::vector<int64_t> global_shape;  // the whole tensor's shape
  TensorSplit split = TensorSplit::kReplicated;
  size_t offset = 0;           // in elements, within the group's flat buffer
  size_t numel = 0;
  bool weight_decay = false;   // true for tensors of two or more dimensions
};

struct ParamGroup {
  std::string name;  // "embed", "layers.3", "head"
  std::vector<ParamEntry> entries;
  size_t numel = 0;
};

// Offsets of the tensors inside one transformer block's flat buffer (elements).
struct BlockOffsets {
  size_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down, total;
};

class ParamLayout {
 public:
  // tensor: the tensor-parallel size; shapes are then one tensor rank's slices.
  explicit ParamLayout(const ModelConfig& cfg, int tensor = 1);
  int tensor() const { return tensor_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const ParamGroup& embed() const { return groups_.front(); }
  const ParamGroup& block(int i) const { return groups_[1 + i]; }
  const ParamGroup& head() const { return groups_.back(); }
  const BlockOffsets& block_offsets() const { return block_offsets_; }
  size_t total_numel() const;
  // Finds a tensor by HF name; returns false if absent.
  bool find(const std::string& name, int* group, const ParamEntry** entry) const;
  int head_dim() const { return head_dim_; }

 private:
  std::vector<ParamGroup> groups_;
  BlockOffsets block_offsets_{};
  int head_dim_ = 0;
  int tensor_ = 1;
};

// Copies tensor rank t's slices of a whole model (params laid out by `global`, tensor 1) into
// the flat buffers of `local` (the same model at tensor size T).
void slice_for_tensor_rank(const ParamLayout& global, const std::vector<const float*>& global_params,
                           const ParamLayout& local, const std::vector<float*>& local_params, int t);

}  // namespace ft
