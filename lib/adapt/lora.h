// LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) as a model
// converter (model/converter.h): the base model is frozen, and each adapted linear layer
// y = x·Wᵀ gains a trained low-rank term
//     y = x·Wᵀ + s · (dropout(x)·Aᵀ)·Bᵀ,   A (r, in), B (out, r), s = alpha / r (rsLoRA: / √r),
// PEFT's LoraLayer forward. The converter's layout half freezes every group of the model but
// those of config.modules_to_save, trained whole (lm_head's after the final norm is split off
// into a frozen group of its own; tied embeddings: the table, group 0), and adds one group per
// block, "lora.layers.N", attached to it (ParamGroup::attached_to), holding
// for each adapted projection, in layer order, A then B under PEFT's names:
//     base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight   (r, in)
//     base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight   (out, r)
// Under tensor parallelism A and B split with their base layer: a column-parallel layer (q, k,
// v, gate, up) keeps A whole and splits B's rows as W's; a row-parallel one (o, down) splits A's
// columns as W's and keeps B whole. Its model half initialises them (A Kaiming-uniform or
// Gaussian, B zero, as PEFT) and installs the hooks that compute the term.
// QLoRA (Dettmers et al. 2023, type qlora) is the same adapter on a base whose blocks' matrices
// are held in NF4 (ParamLayout::set_nf4; FlatParams quantizes them as they are loaded and
// dequantizes a block's when it runs).
#pragma once

#include <cstdint>
#include <memory>

#include "adapt/config.h"
#include "model/converter.h"
#include "model/linear.h"

namespace ft {

class LoraHooks;

// The key of the dropout mask (the dropout_scale op's, runtime/op_list.h) on the rows of sample
// `sample` (its run-wide index, StepSamples::first_sample) at layer `layer`'s projection `proj`
// in a run seeded `seed`: the same in the forward, its recomputation and the backward, and in
// every layout (data, tensor and pipeline ranks alike), so dropout keeps layouts equal.
uint64_t lora_dropout_key(uint64_t seed, uint64_t sample, int layer, Proj proj);

class LoraConverter final : public ModelConverter {
 public:
  explicit LoraConverter(AdapterConfig config);
  ~LoraConverter() override;
  std::string name() const override { return config_.type; }  // lora or qlora
  void convert_layout(ParamLayout& layout) const override;
  // Initialises A and B (unless config.from names an adapter to load: the caller reads it into
  // the adapter groups, ckpt/hf.h load_peft_adapter) and installs the hooks on the model; they
  // live as long as this converter.
  void convert_model(LlamaModel& model, uint64_t seed) const override;

 private:
  AdapterConfig config_;
  mutable std::unique_ptr<LoraHooks> hooks_;
};

}  // namespace ft
