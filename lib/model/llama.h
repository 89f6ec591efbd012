// Llama-family decoder (HF LlamaForCausalLM math) with hand-written forward and backward on
// flat parameter buffers (see layout.h for the order). One micro-batch at a time; gradients
// accumulate across micro-batches until zero_grads().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/layout.h"
#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing = false);
  ~LlamaModel();

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  // Flat parameter and gradient buffers, one per layout group. (numel of group g)
  std::vector<Buffer<float>>& params() { return params_; }
  std::vector<Buffer<float>>& grads() { return grads_; }
  std::vector<float*> param_ptrs();
  size_t num_params() const { return layout_.total_numel(); }

  // Seeded initialisation: matrices ~ N(0, std²), norm weights = 1 (as HF's _init_weights).
  void init_random(uint64_t seed, double std);
  void zero_grads();

  // Forward and backward on one micro-batch. inputs/targets/mask: (B, T). dlogits are scaled by
  // loss_scale (1 / trained tokens of the whole global batch gives the token-weighted mean).
  // Returns the SUM of per-token losses over masked targets. Gradients accumulate.
  double forward_backward(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                          int B, int T, float loss_scale);
  // Forward only (evaluation): returns the summed loss over masked targets.
  double forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                      int T);

 private:
  struct Acts;
  void ensure_acts(int B, int T, bool need_backward);
  double forward(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                 int T, float loss_scale, bool backward);
  void layer_forward(int l, int B, int T);
  void layer_backward(int l, int B, int T);

  ModelConfig cfg_;
  Device* dev_;
  bool ckpt_;
  ParamLayout layout_;
  std::vector<Buffer<float>> params_, grads_;
  std::unique_ptr<Acts> acts_;
};

}  // namespace ft
