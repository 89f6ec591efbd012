// Parameter layout: the fixed order in which parameters sit in flat buffers (the groups of
// parallel/flat_params.h). Gradients and AdamW moments mirror it exactly. ZeRO shards these
// buffers, checkpoints slice them, and HF import/export maps names through it — so this order is
// part of the checkpoint format.
//
// Groups (one flat f32 buffer each), the model's own first; adapters' groups follow the head
// (model/converter.h):
//   group 0        "embed"     model.embed_tokens.weight            (V, C)
//   group 1 + i    "layers.i"  in order:
//       model.layers.i.input_layernorm.weight            (C)
//       model.layers.i.self_attn.q_proj.weight           (H*D, C)
//       model.layers.i.self_attn.q_proj.bias             (H*D)     qwen2 only
//       model.layers.i.self_attn.k_proj.weight           (KV*D, C)
//       model.layers.i.self_attn.k_proj.bias             (KV*D)    qwen2 only
//       model.layers.i.self_attn.v_proj.weight           (KV*D, C)
//       model.layers.i.self_attn.v_proj.bias             (KV*D)    qwen2 only
//       model.layers.i.self_attn.o_proj.weight           (C, H*D)
//       model.layers.i.self_attn.q_norm.weight           (D)       qwen3 only
//       model.layers.i.self_attn.k_norm.weight           (D)       qwen3 only
//       model.layers.i.post_attention_layernorm.weight   (C)
//       model.layers.i.mlp.gate_proj.weight              (F, C)
//       model.layers.i.mlp.up_proj.weight                (F, C)
//       model.layers.i.mlp.down_proj.weight              (C, F)
//   group 1 + L    "head"      model.norm.weight (C), then lm_head.weight (V, C) unless tied
// A converter may move a tensor of the model into a group of its own, appended after the model's
// (split_off): LoRA training lm_head whole leaves the final norm, frozen, in group 2 + L "norm".
// So the head's tensors are found by name (final_norm(), output_weight()), not by position.
// Names are the Hugging Face LlamaForCausalLM names (Qwen2ForCausalLM, Qwen3ForCausalLM and
// MistralForCausalLM use the same ones, plus the biases and q/k norms above); matrices are
// (out, in) row-major, so a linear layer computes y = x · Wᵀ. A bias is split with its
// weight's rows under tensor parallelism; the q/k norm weights (over one head) are replicated.
// A llama or mistral block has exactly the nine tensors, so their checkpoints are unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/converter.h"
#include "parallel/flat_params.h"

namespace ft {

// Offsets of the tensors inside one transformer block's flat buffer (elements).
// The biases and q/k norms of architectures without them are at kAbsent.
// Where a tensor sits: its group and its offset in the group's flat buffer (elements).
struct TensorAt {
  int group = -1;
  size_t offset = 0;
};

struct BlockOffsets {
  static constexpr size_t kAbsent = SIZE_MAX;
  size_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down, total;
  size_t bq = kAbsent, bk = kAbsent, bv = kAbsent, q_norm = kAbsent, k_norm = kAbsent;
};

class ParamLayout {
 public:
  // tensor: the tensor-parallel size; shapes are then one tensor rank's slices.
  explicit ParamLayout(const ModelConfig& cfg, int tensor = 1);
  int tensor() const { return tensor_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const ParamGroup& embed() const { return groups_.front(); }
  const ParamGroup& block(int i) const { return groups_[1 + i]; }
  const ParamGroup& head() const { return groups_[size_t(n_layers_) + 1]; }
  int n_layers() const { return n_layers_; }
  // The head's tensors: model.norm.weight (C), and the output layer's weight (V, C):
  // lm_head.weight, or with tied embeddings the embedding's table (group 0).
  const TensorAt& final_norm() const { return final_norm_; }
  const TensorAt& output_weight() const { return output_weight_; }
  const BlockOffsets& block_offsets() const { return block_offsets_; }
  size_t total_numel() const;
  // Finds a tensor by HF name; returns false if absent.
  bool find(const std::string& name, int* group, const ParamEntry** entry) const;
  int head_dim() const { return head_dim_; }
  // For model converters (model/converter.h): whether group g's tensors train (every tensor of
  // a group alike, ParamGroup::trains).
  void set_trainable(int group, bool trainable);
  // For QLoRA (adapt/lora.h): group g's matrices (its tensors of two or more dimensions) are
  // held in NF4 (ParamEntry::nf4, FlatParams::quantized). The group must be frozen.
  void set_nf4(int group);
  // For adapters: appends a group after the model's own (their indices never move); its
  // attached_to, if set, must name a block. Returns its index.
  int add_group(ParamGroup group);
  // The group attached to group g (ParamGroup::attached_to), or -1. One at most.
  int attached_group(int g) const;
  // For model converters, before adapters add their groups: moves the model's tensor `name` out
  // of its group into a new group `group_name` of its own, appended (the other groups' indices
  // never move; the tensors left behind keep their order at new offsets), so that the two can
  // train apart (a group trains whole or not at all). It keeps its trainable flag. Returns the
  // new group's index.
  int split_off(const std::string& name, const std::string& group_name);

 private:
  void locate_head();  // sets final_norm_ and output_weight_ from the groups
  std::vector<ParamGroup> groups_;
  BlockOffsets block_offsets_{};
  int head_dim_ = 0;
  int tensor_ = 1;
  int n_layers_ = 0;
  bool tied_ = false;  // tie_embeddings: the output layer is the embedding's table
  TensorAt final_norm_, output_weight_;
  std::vector<int> attached_;  // attached_[g]: the group attached to g, or -1
};

// Appends a tensor to group g at its end: name, its whole shape, and how it is split over
// `tensor` ranks (the entry's shape is then one rank's). Weight decay for two or more
// dimensions; trainable.
void add_param(ParamGroup& g, const std::string& name, std::vector<int64_t> shape, int tensor = 1,
               TensorSplit split = TensorSplit::kReplicated);

// The model's layout at this tensor size with every converter's layout half applied, in order
// (model/converter.h; null or empty: the plain layout).
ParamLayout converted_layout(const ModelConfig& cfg, int tensor, const ModelConverters* converters);

}  // namespace ft
