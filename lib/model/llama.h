// Llama-family decoder (HF LlamaForCausalLM math) with hand-written forward and backward on
// flat parameter buffers (see layout.h for the order). One micro-batch at a time; gradients
// accumulate across micro-batches until zero_grads().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layout.h"
#include "model/config.h"
#include "runtime/device.h"

namespace ft {

// Where a group's parameters and gradients live while the model runs. Without hooks, in the
// model's own full flat buffers. ZeRO stages 2 and 3 (lib/parallel/zero.h) supply hooks: the
// parameters of a group are gathered just before the group runs and released after; a group's
// gradient accumulates in a working buffer that is reduce-scattered as soon as the group's
// backward for the micro-batch is complete.
class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  virtual const float* acquire_params(int group) = 0;  // full parameters of the group
  virtual void release_params(int group) = 0;
  virtual float* grads(int group) = 0;                 // full-size, accumulate into it
  virtual void grads_ready(int group) = 0;             // this micro-batch's gradient is complete
};

// The part of the model one pipeline stage runs: layers [first_layer, last_layer), plus the
// embedding on the first stage and the final norm, head and loss on the last (DESIGN.md §3).
struct StageSpec {
  int first_layer = 0, last_layer = -1;  // -1: up to the last layer
  bool embed = true, head = true;
};

class LlamaModel {
 public:
  // tensor_comm: the tensor-parallel group (Megatron layers, DESIGN.md §3); null = no tensor
  // parallelism. Parameters are then this tensor rank's slices (layout().tensor() > 1).
  // stage: the layers (and ends) this rank holds; parameter groups it does not hold are empty.
  LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing = false,
             Communicator* tensor_comm = nullptr, StageSpec stage = {});
  ~LlamaModel();

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  // Flat parameter and gradient buffers, one per layout group. (numel of group g)
  std::vector<Buffer<float>>& params() { return params_; }
  // Full gradient buffers (allocated on first use: ZeRO-2/3 runs never need them).
  std::vector<Buffer<float>>& grads();
  void set_hooks(GroupHooks* hooks) { hooks_ = hooks; }
  // Frees the full parameter buffers once ZeRO-3 hooks own the parameters.
  void drop_params() { params_.clear(); }
  std::vector<float*> param_ptrs();
  size_t num_params() const { return layout_.total_numel(); }

  // Seeded initialisation: matrices ~ N(0, std²), norm weights = 1 (as HF's _init_weights).
  void init_random(uint64_t seed, double std);
  void zero_grads();

  // Forward and backward on one micro-batch. inputs/targets/mask: (B, T). dlogits are scaled by
  // token_weight (1 / trained tokens of the whole global batch gives the token-weighted mean).
  // Returns the SUM of per-token losses over masked targets. Gradients accumulate.
  double forward_backward(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                          int B, int T, float token_weight);
  // Forward only (evaluation): returns the summed loss over masked targets.
  double forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                      int T);

  // Pipeline stages run a micro-batch in two halves, and keep several micro-batches in flight,
  // each in its own activation slot.
  // forward_part: the first stage embeds `inputs`; others start from x_in (B·T, C). The last
  // stage returns the summed loss (and, with backward, keeps dlogits for backward_part); others
  // return 0 and leave their output at stage_output(slot).
  double forward_part(int slot, const int32_t* inputs, const float* x_in, const int32_t* targets,
                      const uint8_t* mask, int B, int T, float token_weight, bool backward);
  // backward_part: the last stage starts from its loss; others from dy_in (B·T, C), the gradient
  // of their output. Leaves the gradient of the stage's input at input_grad() (not on the first).
  void backward_part(int slot, const float* dy_in);
  const float* stage_output(int slot) const;
  const float* input_grad() const;
  const StageSpec& stage() const { return stage_; }
  bool owns_group(int g) const;
 private:
  struct Acts;
  void ensure_acts(int slot, int B, int T, bool need_backward);
  void layer_forward(int l, int B, int T);
  void row_parallel_forward(float* y, const float* x, const float* W, int N, int in, int out);
  void layer_backward(int l, int B, int T);

  // Megatron's f and g: identity one way, all-reduce over the tensor group the other.
  void tensor_all_reduce(float* x, size_t n) { if (tp_ > 1) tp_comm_->all_reduce_sum(x, n); }

  ModelConfig cfg_;
  Device* dev_;
  bool ckpt_;
  Communicator* tp_comm_;
  int tp_ = 1, tp_rank_ = 0;
  int H_, K_, F_, V_;  // this tensor rank's query heads, kv heads, ffn columns, vocabulary rows
  int v_begin_ = 0;    // first vocabulary row of this rank's shard
  ParamLayout layout_;
  // (D/2) RoPE inverse frequencies of cfg_'s rope type (model/rope.h); a host table, read by the
  // kernels when they build their cos/sin tables.
  std::vector<float> rope_inv_freq_;
  std::vector<Buffer<float>> params_, grads_;
  StageSpec stage_;
  std::vector<std::unique_ptr<Acts>> slots_;
  Acts* acts_ = nullptr;  // the slot in use
  GroupHooks* hooks_ = nullptr;
  const float* P(int g) { return hooks_ ? hooks_->acquire_params(g) : params_[g].data(); }
  void release(int g) { if (hooks_) hooks_->release_params(g); }
  float* G(int g) { return hooks_ ? hooks_->grads(g) : grads()[g].data(); }
  void grads_ready(int g) { if (hooks_) hooks_->grads_ready(g); }
};

}  // namespace ft
